/* NumPy .npy files (format versions 1-3): a magic string, a header length, a Python dict
 * literal {'descr': '<f4', 'fortran_order': False, 'shape': (N, C, H, W), } and the raw array.
 * The dict is parsed by hand: it is a fixed, tiny grammar and no Debian C library reads .npy. */
#include "data/td_data.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct npy_array {
    char descr[16];
    int ndim;
    long dims[8];
    size_t count, item;
    uint8_t *data; /* owned */
} npy_array;

/* The value text after 'key': in the header dict, or NULL. */
static const char *dict_value(const char *header, const char *key) {
    char quoted[32];
    snprintf(quoted, sizeof quoted, "'%s'", key);
    const char *p = strstr(header, quoted);
    if (!p) return NULL;
    p += strlen(quoted);
    while (*p == ' ' || *p == ':') p++;
    return p;
}

/* The magic, the format version's header length and the header's text (*header: the caller's
 * to free, also when this fails). */
static int npy_read_header(FILE *f, const char *path, char **header, td_err *err) {
    uint8_t pre[12];
    if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0)
        return td_fail(err, "%s: not a .npy file (no \\x93NUMPY magic)", path);
    size_t hlen;
    if (pre[6] == 1) {
        if (fread(pre + 8, 1, 2, f) != 2) goto truncated;
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
    } else if (pre[6] == 2 || pre[6] == 3) {
        if (fread(pre + 8, 1, 4, f) != 4) goto truncated;
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
    } else {
        return td_fail(err, "%s: .npy format version %d.%d is not supported (1, 2 or 3 expected)",
                       path, pre[6], pre[7]);
    }
    if (hlen > (1u << 20))
        return td_fail(err, "%s: .npy header of %zu bytes is implausible", path, hlen);
    *header = td_malloc(hlen + 1);
    if (fread(*header, 1, hlen, f) != hlen) goto truncated;
    (*header)[hlen] = 0;
    return 0;
truncated:
    return td_fail(err, "%s: file is truncated inside the .npy header", path);
}

/* The header dict's descr, fortran_order and shape into a (its count and item size). */
static int npy_parse_header(const char *header, const char *path, npy_array *a, td_err *err) {
    const char *d = dict_value(header, "descr"), *fo = dict_value(header, "fortran_order"),
               *sh = dict_value(header, "shape");
    if (!d || !fo || !sh || *d != '\'' || *sh != '(') {
        td_fail(err, "%s: .npy header lacks descr, fortran_order or shape: %.80s", path, header);
        return -1;
    }
    size_t dl = strcspn(d + 1, "'");
    snprintf(a->descr, sizeof a->descr, "%.*s", (int)(dl < 15 ? dl : 15), d + 1);
    if (strncmp(fo, "False", 5) != 0) {
        td_fail(err,
                "%s: Fortran-ordered arrays are not supported; save with "
                "numpy.ascontiguousarray",
                path);
        return -1;
    }
    const char *p = sh + 1;
    a->count = 1;
    while (*p && *p != ')') {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') break;
        char *end;
        long v = strtol(p, &end, 10);
        /* sizes become ints (td_shape) and their product a byte count: bounded so that neither
         * wraps (fuzzing found a shape whose product wrapped into a 2^64-byte allocation) */
        if (end == p || v < 0 || v > INT_MAX || a->ndim == 8 ||
            (v && a->count > ((size_t)1 << 40) / (size_t)v)) {
            td_fail(err, "%s: .npy shape is not a tuple of sizes: %.60s", path, sh);
            return -1;
        }
        a->dims[a->ndim++] = v;
        a->count *= (size_t)v;
        p = end;
    }
    static const struct {
        const char *descr;
        size_t item;
    } known[] = {{"|u1", 1}, {"<f4", 4}, {"<i8", 8}, {"<i4", 4}, {"|i1", 1}, {"<u2", 2}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(a->descr, known[i].descr) == 0) a->item = known[i].item;
    if (!a->item) {
        td_fail(err,
                "%s: .npy dtype '%s' is not supported (expected uint8 '|u1' or float32 "
                "'<f4' images, integer labels)",
                path, a->descr);
        return -1;
    }
    return 0;
}

/* The file's size against what the header declares, the file at the array's start. */
static int npy_check_size(FILE *f, const char *path, const npy_array *a, td_err *err) {
    /* the file's size against the header's before anything is allocated: a header over a
     * short file is a truncated file, not an allocation of what it claims */
    long at = ftell(f);
    struct stat st;
    if (at < 0 || fstat(fileno(f), &st) != 0) {
        td_fail(err, "%s: %s", path, strerror(errno));
        return -1;
    }
    long long want = (long long)at + (long long)(a->count * a->item);
    if (S_ISREG(st.st_mode) && (long long)st.st_size < want) {
        td_fail(err, "%s: file is truncated: the array needs %zu bytes but only %lld are there",
                path, a->count * a->item, (long long)st.st_size - at);
        return -1;
    }
    if (S_ISREG(st.st_mode) && (long long)st.st_size > want) {
        td_fail(err,
                "%s: has data after the array its header declares (%zu bytes; the file has "
                "%lld after its header)",
                path, a->count * a->item, (long long)st.st_size - at);
        return -1;
    }
    return 0;
}

/* The header, and the array too unless header_only (then only the file's size is checked). */
static int npy_read(const char *path, npy_array *a, bool header_only, td_err *err) {
    memset(a, 0, sizeof *a);
    FILE *f = fopen(path, "rb");
    if (!f) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    int rc = -1;
    char *header = NULL;
    if (npy_read_header(f, path, &header, err) != 0 ||
        npy_parse_header(header, path, a, err) != 0 || npy_check_size(f, path, a, err) != 0)
        goto out;
    if (header_only) {
        rc = 0;
        goto out;
    }
    a->data = td_malloc(a->count * a->item + 1);
    size_t got = fread(a->data, 1, a->count * a->item, f);
    if (got != a->count * a->item) {
        td_fail(err, "%s: file is truncated: the array needs %zu bytes but only %zu are there",
                path, a->count * a->item, got);
        goto out;
    }
    if (fgetc(f) != EOF) {
        td_fail(err, "%s: has data after the array its header declares", path);
        goto out;
    }
    rc = 0;
    goto out;
out:
    free(header);
    fclose(f);
    if (rc != 0) free(a->data);
    return rc;
}

static long npy_int(const npy_array *a, size_t i) {
    const uint8_t *p = a->data + i * a->item;
    if (strcmp(a->descr, "<i8") == 0) {
        int64_t v;
        memcpy(&v, p, 8);
        return (long)v;
    }
    if (strcmp(a->descr, "<i4") == 0) {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    if (strcmp(a->descr, "<u2") == 0) return p[0] | p[1] << 8;
    if (strcmp(a->descr, "|i1") == 0) return (int8_t)p[0];
    return p[0];
}

/* The images' type and shape against the labels' (both headers read), as the loader wants
 * them; sets ds->shape and returns the sample count, or -1. */
static int check_arrays(const char *images_path, const npy_array *x, const char *labels_path,
                        const npy_array *y, bool nhwc, td_shape *shape, td_err *err) {
    bool u8 = strcmp(x->descr, "|u1") == 0, f32 = strcmp(x->descr, "<f4") == 0;
    if (!u8 && !f32)
        return td_fail(err, "%s: images must be uint8 or float32, found '%s'", images_path,
                       x->descr);
    if (y->ndim != 1 || strcmp(y->descr, "<f4") == 0)
        return td_fail(err, "%s: labels must be a 1-D integer array, found '%s' with %d dimensions",
                       labels_path, y->descr, y->ndim);
    if (x->ndim < 2 || x->ndim > 4 || x->dims[0] != y->dims[0] || x->dims[0] == 0)
        return td_fail(err,
                       "%s: images have shape with %d dimensions and %ld samples, %s has %ld "
                       "labels; expected [N, C, H, W], [N, H, W, C], [N, H, W] or [N, F] with one "
                       "label per sample",
                       images_path, x->ndim, x->ndim ? x->dims[0] : 0, labels_path, y->dims[0]);
    if (x->ndim == 2)
        *shape = td_shape_flat((int)x->dims[1]);
    else if (x->ndim == 3)
        *shape = td_shape_image(1, (int)x->dims[1], (int)x->dims[2]);
    else if (nhwc)
        *shape = td_shape_image((int)x->dims[3], (int)x->dims[1], (int)x->dims[2]);
    else
        *shape = td_shape_image((int)x->dims[1], (int)x->dims[2], (int)x->dims[3]);
    if (td_shape_size(*shape) == 0)
        return td_fail(err, "%s: images have an empty dimension: each sample holds no values",
                       images_path);
    if (shape->spatial && shape->c > 4)
        return td_fail(err, "%s: %d channels (at most 4 are supported); is the layout %s right?",
                       images_path, shape->c, nhwc ? "NHWC" : "NCHW");
    return (int)x->dims[0];
}

/* Labels as class indices; -1 at the first that is not one. */
static int read_label_values(const char *labels_path, const npy_array *y, int32_t *out,
                             td_err *err) {
    for (size_t i = 0; i < y->count; i++) {
        long v = npy_int(y, i);
        if (v < 0 || v > (1 << 20))
            return td_fail(err, "%s: label %ld at index %zu is not a class index", labels_path, v,
                           i);
        out[i] = (int32_t)v;
    }
    return 0;
}

int td_dataset_probe_npy(const char *images_path, const char *labels_path, bool nhwc,
                         td_data_probe *p, td_err *err) {
    npy_array x, y;
    if (npy_read(images_path, &x, true, err) != 0) return -1;
    if (npy_read(labels_path, &y, false, err) != 0) return -1;
    int n = check_arrays(images_path, &x, labels_path, &y, nhwc, &p->shape, err);
    int32_t *labels = n > 0 ? td_malloc((size_t)n * sizeof(int32_t)) : NULL;
    int rc = n > 0 ? read_label_values(labels_path, &y, labels, err) : -1;
    if (rc == 0) {
        p->n = n;
        p->max_label = 0;
        for (int i = 0; i < n; i++)
            if (labels[i] > p->max_label) p->max_label = labels[i];
    }
    free(labels);
    free(y.data);
    return rc;
}

int td_dataset_load_npy(td_dataset *ds, const char *images_path, const char *labels_path, bool nhwc,
                        td_err *err) {
    memset(ds, 0, sizeof *ds);
    npy_array x, y;
    if (npy_read(images_path, &x, false, err) != 0) return -1;
    if (npy_read(labels_path, &y, false, err) != 0) {
        free(x.data);
        return -1;
    }
    int rc = -1;
    bool u8 = strcmp(x.descr, "|u1") == 0;
    int n = check_arrays(images_path, &x, labels_path, &y, nhwc, &ds->shape, err);
    if (n < 0) goto out;
    ds->n = n;
    size_t size = td_shape_size(ds->shape), hw = (size_t)ds->shape.h * ds->shape.w;
    int c = ds->shape.c;
    bool transpose = x.ndim == 4 && !nhwc && c > 1; /* NCHW on disk, channels last in memory */
    if (u8)
        ds->pixels = td_malloc((size_t)n * size);
    else
        ds->values = td_malloc((size_t)n * size * sizeof(float));
    for (int i = 0; i < n; i++)
        for (size_t j = 0; j < size; j++) {
            size_t src = transpose ? (j % (size_t)c) * hw + j / (size_t)c : j;
            const uint8_t *e = x.data + ((size_t)i * size + src) * x.item;
            if (u8)
                ds->pixels[(size_t)i * size + j] = *e;
            else
                memcpy(&ds->values[(size_t)i * size + j], e, 4);
        }
    ds->labels = td_malloc((size_t)n * sizeof(int32_t));
    if (read_label_values(labels_path, &y, ds->labels, err) != 0) goto out;
    ds->num_classes = td_dataset_max_label(ds) + 1;
    rc = 0;
out:
    free(x.data);
    free(y.data);
    if (rc != 0) td_dataset_free(ds);
    return rc;
}

int td_npy_tokens(const char *path, bool header_only, int vocab, int32_t **ids, size_t *n,
                  td_err *err) {
    npy_array a;
    if (npy_read(path, &a, header_only, err) != 0) return -1;
    bool integer = strcmp(a.descr, "<f4") != 0;
    if (a.ndim != 1 || !integer) {
        free(a.data);
        return td_fail(err,
                       "%s: expected a 1-D array of integer token ids (uint16 '<u2', int32 '<i4', "
                       "int64 '<i8'), found '%s' with %d dimensions",
                       path, a.descr, a.ndim);
    }
    *n = a.count;
    if (header_only) return 0;
    *ids = td_malloc((a.count ? a.count : 1) * sizeof **ids);
    for (size_t i = 0; i < a.count; i++) {
        long v = npy_int(&a, i);
        if (v < 0 || v >= vocab) {
            free(a.data);
            free(*ids);
            *ids = NULL;
            return td_fail(err,
                           "%s: token %zu is id %ld, past data.vocab_size %d (ids are 0 to %d)",
                           path, i, v, vocab, vocab - 1);
        }
        (*ids)[i] = (int32_t)v;
    }
    free(a.data);
    return 0;
}
