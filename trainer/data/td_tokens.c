/* The tokens format: token ids as nanoGPT's prepare.py and llm.c write them, a .bin file of
 * little-endian uint16 without a header (data.vocab_size says which ids may occur: GPT-2's is
 * 50257), or numpy's own .npy of a 1-D integer array (td_npy.c reads it). Windows, next-token
 * labels and the validation part are the text format's (td_dataset_windows in td_text.c); there is
 * no tokenizer, so no samples. */
#include "data/td_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The file of split sp: its own, or the training file it is the last part of. */
static const char *path_of(const td_data_spec *d, const td_split_spec *sp) {
    return sp == &d->val && d->val_from_train ? d->train.images : sp->images;
}

/* fstat's size, which must be whole uint16s and hold a window and its next token */
static int checked_size(const td_data_spec *d, const char *path, FILE *f, size_t *size,
                        td_err *err) {
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
        return td_fail(err, "%s: not a regular file", path);
    *size = (size_t)st.st_size;
    if (*size % 2)
        return td_fail(err, "%s: %zu bytes, not a whole number of uint16 token ids", path, *size);
    if (*size / 2 < (size_t)d->block_size + 1)
        return td_fail(err, "%s: %zu tokens, fewer than data.block_size + 1 = %d", path, *size / 2,
                       d->block_size + 1);
    return 0;
}

static bool is_npy(const char *path) {
    size_t len = strlen(path);
    return len >= 4 && strcmp(path + len - 4, ".npy") == 0;
}

static int load_npy(td_dataset *ds, const td_data_spec *d, const td_split_spec *sp,
                    const char *path, td_err *err) {
    int32_t *ids;
    size_t n;
    if (td_npy_tokens(path, false, d->vocab_size, &ids, &n, err) != 0) return -1;
    return td_dataset_windows(ds, d, sp, ids, n, d->vocab_size, err);
}

int td_dataset_load_tokens(td_dataset *ds, const td_data_spec *d, const td_split_spec *sp,
                           td_err *err) {
    const char *path = path_of(d, sp);
    if (is_npy(path)) return load_npy(ds, d, sp, path, err);
    FILE *f = fopen(path, "rb");
    if (!f) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    size_t size = 0;
    if (checked_size(d, path, f, &size, err) != 0) {
        fclose(f);
        return -1;
    }
    size_t n = size / 2;
    int32_t *ids = td_malloc(n * sizeof *ids);
    uint8_t buf[1 << 16];
    size_t at = 0, got;
    while (at < n && (got = fread(buf, 2, sizeof buf / 2, f)) > 0)
        for (size_t k = 0; k < got && at < n; k++, at++) {
            int32_t id = buf[2 * k] | buf[2 * k + 1] << 8; /* little-endian, as numpy's <u2 */
            if (id >= d->vocab_size) {
                fclose(f);
                free(ids);
                return td_fail(err,
                               "%s: token %zu is id %d, past data.vocab_size %d (ids are 0 to "
                               "%d)",
                               path, at, (int)id, d->vocab_size, d->vocab_size - 1);
            }
            ids[at] = id;
        }
    bool bad = ferror(f) || at != n;
    fclose(f);
    if (bad) {
        free(ids);
        return td_fail(err, "%s: read error", path);
    }
    return td_dataset_windows(ds, d, sp, ids, n, d->vocab_size, err);
}

int td_dataset_probe_tokens(const td_data_spec *d, const td_split_spec *sp, td_data_probe *p,
                            td_err *err) {
    const char *path = path_of(d, sp);
    if (is_npy(path)) {
        size_t n = 0;
        if (td_npy_tokens(path, true, d->vocab_size, NULL, &n, err) != 0) return -1;
        if (n < (size_t)d->block_size + 1)
            return td_fail(err, "%s: %zu tokens, fewer than data.block_size + 1 = %d", path, n,
                           d->block_size + 1);
    } else {
        FILE *f = fopen(path, "rb");
        if (!f) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
        size_t size = 0;
        int rc = checked_size(d, path, f, &size, err);
        fclose(f);
        if (rc != 0) return -1;
    }
    p->n = 0; /* windows: known once split */
    p->shape = td_shape_flat(d->block_size);
    p->max_label = -1; /* the ids are checked against vocab_size by the loader */
    return 0;
}
