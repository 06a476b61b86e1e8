/* The text format: a UTF-8 file, tokenized, cut into windows of block_size + 1 tokens (nanoGPT's
 * get_batch): sample i's input is tokens [o, o + T) and its labels the next tokens [o + 1,
 * o + T + 1), one per position, with o = i · stride.
 *
 * Training windows start at every offset (stride 1), and the sampler draws them in a random order
 * per epoch as DistributedSampler does: rank r of W takes every W-th window of one permutation,
 * so W ranks of B/W windows see exactly the windows of one process's batch B (nanoGPT draws its
 * offsets with replacement, each rank its own stream; the two differ in that alone).
 * Validation windows do not overlap (stride T): every validation token is predicted once, so the
 * validation loss is over the whole split, not an estimate from eval_iters random batches.
 *
 * The split: data.val's own file, or else the last val_fraction of the training file (nanoGPT:
 * the first 90% trains, the last 10% validates). The char tokenizer's vocabulary is built from
 * every file of the job, as prepare.py builds it from the whole text before it splits. */
#include "data/td_data.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TEXT_MAX_BYTES   ((size_t)1 << 31)  /* ICU's offsets and the windows' count are int32 */
#define TEXT_PROBE_BYTES ((size_t)64 << 20) /* what the daemon's submit check reads of a file */

static int read_text(const char *path, size_t limit, uint8_t **out, size_t *len, size_t *size,
                     td_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return td_fail(err, "%s: not a regular file", path);
    }
    *size = (size_t)st.st_size;
    if (*size >= TEXT_MAX_BYTES) {
        fclose(f);
        return td_fail(err,
                       "%s: %zu bytes; the text format reads files under 2 GiB (write token "
                       "ids to .bin files for more)",
                       path, *size);
    }
    size_t want = *size < limit ? *size : limit;
    *out = td_malloc(want ? want : 1);
    *len = fread(*out, 1, want, f);
    bool bad = ferror(f) || *len != want;
    fclose(f);
    if (bad) {
        free(*out);
        return td_fail(err, "%s: read error", path);
    }
    /* a cut in the middle of a character (the probe's limit) is not the file's fault */
    while (want<*size && * len> 0 && ((*out)[*len - 1] & 0xC0) == 0x80) --*len;
    if (want<*size && * len> 0 && (*out)[*len - 1] >= 0xC0) --*len;
    return 0;
}

/* The files whose characters make the vocabulary: the training file and data.val's, if any. */
typedef struct text_files {
    int n;
    uint8_t *data[2];
    size_t len[2];
    const char *name[2];
} text_files;

static void text_files_free(text_files *f) {
    for (int i = 0; i < f->n; i++) free(f->data[i]);
}

static int read_files(const td_data_spec *d, text_files *f, td_err *err) {
    memset(f, 0, sizeof *f);
    const td_split_spec *splits[2] = {&d->train,
                                      d->val.present && !d->val_from_train ? &d->val : NULL};
    for (int i = 0; i < 2; i++) {
        if (!splits[i]) continue;
        size_t size;
        if (read_text(splits[i]->images, TEXT_MAX_BYTES, &f->data[f->n], &f->len[f->n], &size,
                      err) != 0) {
            text_files_free(f);
            return -1;
        }
        f->name[f->n++] = splits[i]->images;
    }
    return 0;
}

int td_text_tokenizer(const td_data_spec *d, td_tokenizer *tk, td_err *err) {
    if (d->tokenizer != TD_TOKENIZER_CHAR) /* a fixed vocabulary: the text is not needed */
        return td_tokenizer_build(tk, d->tokenizer, NULL, NULL, NULL, 0, err);
    text_files f;
    if (read_files(d, &f, err) != 0) return -1;
    int rc = td_tokenizer_build(tk, d->tokenizer, (const uint8_t *const *)f.data, f.len, f.name,
                                f.n, err);
    text_files_free(&f);
    return rc;
}

/* Split sp's tokens: a file of its own, or the training file's (cut in td_dataset_windows). */
static int split_tokens(const td_data_spec *d, const td_split_spec *sp, const td_tokenizer *tk,
                        int32_t **ids, size_t *n, td_err *err) {
    text_files f;
    if (read_files(d, &f, err) != 0) return -1;
    int which = sp == &d->val && !d->val_from_train ? 1 : 0;
    int rc = td_tokenizer_encode(tk, f.data[which], f.len[which], f.name[which], ids, n, err);
    text_files_free(&f);
    return rc;
}

int td_dataset_windows(td_dataset *ds, const td_data_spec *d, const td_split_spec *sp, int32_t *ids,
                       size_t n, int vocab, td_err *err) {
    memset(ds, 0, sizeof *ds);
    bool val = sp == &d->val;
    if (d->val_from_train) { /* one file: the first 1 - val_fraction trains, the rest validates */
        size_t cut = (size_t)((double)n * (1.0 - d->val_fraction));
        if (val) memmove(ids, ids + cut, (n - cut) * sizeof *ids);
        n = val ? n - cut : cut;
    }
    const char *what = val ? "data.val" : "data.train";
    int block = d->block_size;
    if (n < (size_t)block + 1) {
        free(ids);
        return td_fail(err,
                       "%s: %zu tokens, fewer than data.block_size + 1 = %d (a window and its "
                       "next token)",
                       what, n, block + 1);
    }
    if (n - (size_t)block > (size_t)INT32_MAX) {
        free(ids);
        return td_fail(err, "%s: %zu tokens; at most 2^31 windows are supported for now", what, n);
    }
    ds->tokens = ids;
    ds->n_tokens = n;
    ds->stride = val ? block : 1;
    ds->n = (int)((n - 1 - (size_t)block) / (size_t)ds->stride + 1);
    ds->shape = td_shape_flat(block);
    ds->num_classes = vocab;
    return 0;
}

int td_dataset_load_text(td_dataset *ds, const td_data_spec *d, const td_split_spec *sp,
                         const td_tokenizer *tk, td_err *err) {
    int32_t *ids;
    size_t n;
    if (split_tokens(d, sp, tk, &ids, &n, err) != 0) return -1;
    return td_dataset_windows(ds, d, sp, ids, n, tk->vocab_size, err);
}

void td_dataset_window(const td_dataset *ds, int i, float *x, int32_t *labels) {
    const int32_t *t = ds->tokens + (size_t)i * ds->stride;
    for (int k = 0; k < ds->shape.c; k++) {
        x[k] = (float)t[k];
        labels[k] = t[k + 1];
    }
}

int td_dataset_probe_text(const td_data_spec *d, const td_split_spec *sp, td_data_probe *p,
                          td_err *err) {
    /* the split's own file, or the training file it is part of */
    const char *path = sp == &d->val && d->val_from_train ? d->train.images : sp->images;
    uint8_t *text;
    size_t len, size;
    if (read_text(path, TEXT_PROBE_BYTES, &text, &len, &size, err) != 0) return -1;
    int rc = d->tokenizer == TD_TOKENIZER_BYTE ? 0 : td_utf8_check(text, len, path, err);
    free(text);
    if (rc != 0) return -1;
    if (d->tokenizer == TD_TOKENIZER_GPT2 && !td_gpt2_files(err)) return -1;
    /* a token is a byte at least: a file this small cannot hold one window */
    if (size < (size_t)d->block_size + 1)
        return td_fail(err, "%s: %zu bytes, fewer than data.block_size + 1 = %d tokens", path, size,
                       d->block_size + 1);
    p->n = 0; /* windows: known once tokenized */
    p->shape = td_shape_flat(d->block_size);
    p->max_label = -1;
    return 0;
}
