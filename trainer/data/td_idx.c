/* IDX files (the MNIST family's format): a big-endian header, then raw bytes. Read through zlib,
 * which passes plain files through unchanged, so .gz and uncompressed files take one path. */
#include "data/td_data.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#define IDX_MAGIC_IMAGES 0x00000803u
#define IDX_MAGIC_LABELS 0x00000801u

static uint32_t be32(const uint8_t *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* A read that ended early: the file's fault, reported with what was missing. */
static int truncated(gzFile f, const char *path, const char *what, size_t len, size_t got,
                     td_err *err) {
    int code;
    gzerror(f, &code);
    return td_fail(err, "%s: file is truncated: %s needs %zu bytes but only %zu are there%s", path,
                   what, len, got, code == Z_BUF_ERROR ? " (the gzip stream ends early)" : "");
}

/* Reads into buf from *got up to len bytes, or to the end of the file; -1 on a read error. */
static int read_some(gzFile f, const char *path, uint8_t *buf, size_t len, size_t *got,
                     const char *what, td_err *err) {
    while (*got < len) {
        unsigned chunk = len - *got > (1u << 30) ? (1u << 30) : (unsigned)(len - *got);
        int r = gzread(f, buf + *got, chunk);
        if (r < 0) {
            int code;
            const char *msg = gzerror(f, &code);
            return td_fail(err, "%s: read error in %s: %s", path, what, msg);
        }
        if (r == 0) break;
        *got += (size_t)r;
    }
    return 0;
}

/* Reads exactly len bytes; any shortfall is the file's fault. */
static int read_exact(gzFile f, const char *path, void *buf, size_t len, const char *what,
                      td_err *err) {
    size_t got = 0;
    if (read_some(f, path, buf, len, &got, what, err) != 0) return -1;
    return got < len ? truncated(f, path, what, len, got, err) : 0;
}

/* Reads the len bytes a header declares into a buffer that grows as they arrive (*out,
 * allocated): a header that claims gigabytes over a file of a few bytes is a truncated file,
 * not gigabytes allocated up front (found by fuzzing: a 16-byte image file asked for 13 GB). */
static int read_declared(gzFile f, const char *path, size_t len, uint8_t **out, const char *what,
                         td_err *err) {
    size_t cap = len < ((size_t)1 << 24) ? len : ((size_t)1 << 24), got = 0;
    uint8_t *buf = td_malloc(cap ? cap : 1);
    int rc = 0;
    while (rc == 0 && got < len) {
        if (got == cap) {
            cap = len - cap < cap ? len : 2 * cap;
            buf = td_realloc(buf, cap);
        }
        rc = read_some(f, path, buf, cap, &got, what, err);
        if (rc == 0 && got < cap) /* the file ended: nothing more will come */
            rc = truncated(f, path, what, len, got, err);
    }
    if (rc != 0) {
        free(buf);
        return -1;
    }
    *out = buf;
    return 0;
}

/* Opens path, checks the magic and reads the dims; returns the open file at the data. */
static gzFile idx_open(const char *path, uint32_t magic, int ndim, uint32_t *dims, td_err *err) {
    gzFile f = gzopen(path, "rb");
    if (!f) {
        td_fail(err, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
        return NULL;
    }
    uint8_t head[4 + 4 * 3];
    if (read_exact(f, path, head, 4 + 4 * (size_t)ndim, "the IDX header", err) != 0) {
        gzclose(f);
        return NULL;
    }
    uint32_t found = be32(head);
    if (found != magic) {
        td_fail(err,
                "%s: not an IDX %s file: magic number is 0x%08x, expected 0x%08x (%s, %d "
                "dimensions)",
                path, ndim == 1 ? "label" : "image", found, magic, "unsigned bytes", ndim);
        gzclose(f);
        return NULL;
    }
    for (int i = 0; i < ndim; i++) dims[i] = be32(head + 4 + 4 * i);
    return f;
}

static int expect_end(gzFile f, const char *path, td_err *err) {
    char extra;
    int r = gzread(f, &extra, 1);
    if (r != 0)
        return td_fail(err,
                       "%s: has data after the %s its header declares; the header and the "
                       "data disagree",
                       path, "samples");
    return 0;
}

static int check_image_dims(const char *path, const uint32_t *d, td_err *err) {
    if (d[0] == 0 || d[1] == 0 || d[2] == 0 || d[1] > 4096 || d[2] > 4096 || d[0] > (1u << 28))
        return td_fail(err, "%s: implausible IDX dimensions %u x %u x %u", path, d[0], d[1], d[2]);
    return 0;
}

/* The labels file: its count must match the images', every label is read. */
static int read_labels(const char *labels_path, const char *images_path, uint32_t n_images,
                       uint8_t **raw, td_err *err) {
    uint32_t ldims[1];
    gzFile fl = idx_open(labels_path, IDX_MAGIC_LABELS, 1, ldims, err);
    if (!fl) return -1;
    if (ldims[0] != n_images) {
        gzclose(fl);
        return td_fail(err,
                       "%s: holds %u labels but %s holds %u images; they must match one to one",
                       labels_path, ldims[0], images_path, n_images);
    }
    int rc = read_declared(fl, labels_path, ldims[0], raw, "the labels", err);
    if (rc == 0 && expect_end(fl, labels_path, err) != 0) {
        free(*raw);
        rc = -1;
    }
    gzclose(fl);
    return rc;
}

int td_dataset_probe_idx(const char *images_path, const char *labels_path, td_data_probe *p,
                         td_err *err) {
    uint32_t d[3];
    gzFile fi = idx_open(images_path, IDX_MAGIC_IMAGES, 3, d, err);
    if (!fi) return -1;
    bool plain = gzdirect(fi);
    gzclose(fi);
    if (check_image_dims(images_path, d, err) != 0) return -1;
    /* a plain file's size must be what its header declares; a gzipped one is only known by
     * decompressing it, which waits for the run */
    struct stat st;
    unsigned long long want = 16ull + (unsigned long long)d[0] * d[1] * d[2];
    if (plain && stat(images_path, &st) == 0 && (unsigned long long)st.st_size != want)
        return td_fail(err,
                       "%s: %llu bytes, but its header declares %u images of %u x %u, %llu bytes "
                       "in all; %s",
                       images_path, (unsigned long long)st.st_size, d[0], d[1], d[2], want,
                       (unsigned long long)st.st_size < want ? "the file is truncated"
                                                             : "it has data after the images");
    uint8_t *raw;
    if (read_labels(labels_path, images_path, d[0], &raw, err) != 0) return -1;
    p->n = (int)d[0];
    p->shape = td_shape_image(1, (int)d[1], (int)d[2]);
    p->max_label = 0;
    for (uint32_t i = 0; i < d[0]; i++)
        if (raw[i] > p->max_label) p->max_label = raw[i];
    free(raw);
    return 0;
}

int td_dataset_load_idx(td_dataset *ds, const char *images_path, const char *labels_path,
                        td_err *err) {
    memset(ds, 0, sizeof *ds);
    uint32_t idims[3];
    gzFile fi = idx_open(images_path, IDX_MAGIC_IMAGES, 3, idims, err);
    if (!fi) return -1;
    if (check_image_dims(images_path, idims, err) != 0) {
        gzclose(fi);
        return -1;
    }
    size_t size = (size_t)idims[0] * idims[1] * idims[2];
    int rc = read_declared(fi, images_path, size, &ds->pixels, "the image data", err);
    if (rc == 0) rc = expect_end(fi, images_path, err);
    gzclose(fi);
    if (rc != 0) goto fail;

    uint8_t *raw;
    if (read_labels(labels_path, images_path, idims[0], &raw, err) != 0) goto fail;
    ds->labels = td_malloc((size_t)idims[0] * sizeof(int32_t));
    for (uint32_t i = 0; i < idims[0]; i++) ds->labels[i] = raw[i];
    free(raw);

    ds->n = (int)idims[0];
    ds->shape = td_shape_image(1, (int)idims[1], (int)idims[2]);
    ds->num_classes = td_dataset_max_label(ds) + 1;
    return 0;
fail:
    td_dataset_free(ds);
    return -1;
}
