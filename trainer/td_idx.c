/* IDX files (the MNIST family's format): a big-endian header, then raw bytes. Read through zlib,
 * which passes plain files through unchanged, so .gz and uncompressed files take one path. */
#include "td_data.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_MAGIC_IMAGES 0x00000803u
#define IDX_MAGIC_LABELS 0x00000801u

static uint32_t be32(const uint8_t *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Reads exactly len bytes; any shortfall is the file's fault, reported with what was missing. */
static int read_exact(gzFile f, const char *path, void *buf, size_t len, const char *what,
                      td_err *err) {
    size_t got = 0;
    while (got < len) {
        unsigned chunk = len - got > (1u << 30) ? (1u << 30) : (unsigned)(len - got);
        int r = gzread(f, (char *)buf + got, chunk);
        if (r < 0) {
            int code;
            const char *msg = gzerror(f, &code);
            return td_fail(err, "%s: read error in %s: %s", path, what, msg);
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    if (got < len) {
        int code;
        gzerror(f, &code);
        return td_fail(err, "%s: file is truncated: %s needs %zu bytes but only %zu are there%s",
                       path, what, len, got,
                       code == Z_BUF_ERROR ? " (the gzip stream ends early)" : "");
    }
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

int td_dataset_load_idx(td_dataset *ds, const char *images_path, const char *labels_path,
                        td_err *err) {
    memset(ds, 0, sizeof *ds);
    uint32_t idims[3], ldims[1];
    gzFile fi = idx_open(images_path, IDX_MAGIC_IMAGES, 3, idims, err);
    if (!fi) return -1;
    if (idims[0] == 0 || idims[1] == 0 || idims[2] == 0 || idims[1] > 4096 || idims[2] > 4096 ||
        idims[0] > (1u << 28)) {
        gzclose(fi);
        return td_fail(err, "%s: implausible IDX dimensions %u x %u x %u", images_path, idims[0],
                       idims[1], idims[2]);
    }
    size_t size = (size_t)idims[0] * idims[1] * idims[2];
    ds->pixels = td_malloc(size);
    int rc = read_exact(fi, images_path, ds->pixels, size, "the image data", err);
    if (rc == 0) rc = expect_end(fi, images_path, err);
    gzclose(fi);
    if (rc != 0) goto fail;

    gzFile fl = idx_open(labels_path, IDX_MAGIC_LABELS, 1, ldims, err);
    if (!fl) goto fail;
    if (ldims[0] != idims[0]) {
        gzclose(fl);
        td_fail(err, "%s: holds %u labels but %s holds %u images; they must match one to one",
                labels_path, ldims[0], images_path, idims[0]);
        goto fail;
    }
    uint8_t *raw = td_malloc(ldims[0]);
    rc = read_exact(fl, labels_path, raw, ldims[0], "the labels", err);
    if (rc == 0) rc = expect_end(fl, labels_path, err);
    ds->labels = td_malloc((size_t)ldims[0] * sizeof(int32_t));
    for (uint32_t i = 0; i < ldims[0]; i++) ds->labels[i] = raw[i];
    free(raw);
    gzclose(fl);
    if (rc != 0) goto fail;

    ds->n = (int)idims[0];
    ds->shape = td_shape_image(1, (int)idims[1], (int)idims[2]);
    ds->num_classes = td_dataset_max_label(ds) + 1;
    return 0;
fail:
    td_dataset_free(ds);
    return -1;
}
