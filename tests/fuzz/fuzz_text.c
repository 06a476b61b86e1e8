/* Feeds: a text dataset (trainer/data/td_text.c, td_tokenizer.c) to the daemon's probe and the
 * worker's loader. The input is a flags byte (bit 0: the byte tokenizer; bits 1-3: block_size
 * 1..8; bit 4: no validation part; bit 5: GPT-2's BPE instead, td_bpe.c) and the file. With
 * GPT-2's BPE, the text's ids must lie in its vocabulary and decode to the very bytes. Why: a
 * user's file, decoded as UTF-8 by ICU; a bad byte must be an error naming its line and column, the
 * probe must not accept what the loader refuses as not UTF-8, and what loads must be windows whose
 * every id and label lies in the vocabulary, whose labels are the next token, and whose ids decode
 * back to the text. */
#include "fuzz_util.h"

#include "data/td_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static fuzz_file file;

/* GPT-2's tokenizer, loaded once (its tables take a good part of a second) */
static int gpt2(const uint8_t *text, size_t len) {
    static td_tokenizer tk;
    td_err err = {{0}};
    if (!tk.bpe && td_tokenizer_build(&tk, TD_TOKENIZER_GPT2, NULL, NULL, NULL, 0, &err) != 0) {
        fprintf(stderr, "fuzz_text: %s\n", err.msg);
        abort();
    }
    int32_t *ids;
    size_t n;
    if (td_tokenizer_encode(&tk, text, len, "input", &ids, &n, &err) != 0) {
        FUZZ_CHECK(strstr(err.msg, "UTF-8"), "refused other than as not UTF-8: %s", err.msg);
        return 0;
    }
    size_t cap = n * (size_t)td_tokenizer_max_bytes(&tk) + 1;
    char *back = malloc(cap);
    for (size_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && ids[i] < 50257, "id %d", ids[i]);
    size_t got = td_tokenizer_decode(&tk, ids, n, back, cap);
    FUZZ_CHECK(got == len && memcmp(back, text, len) == 0, "GPT-2's ids decode to other text");
    free(back);
    free(ids);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (data[0] & 32) return gpt2(data + 1, size - 1);
    if (!file.path[0]) fuzz_file_open(&file, "input.txt");
    fuzz_file_set(&file, data + 1, size - 1);
    td_data_spec d = {.format = TD_DATA_TEXT,
                      .tokenizer = data[0] & 1 ? TD_TOKENIZER_BYTE : TD_TOKENIZER_CHAR,
                      .block_size = 1 + ((data[0] >> 1) & 7),
                      .val_fraction = data[0] & 16 ? 0 : 0.25};
    d.train.present = true;
    snprintf(d.train.images, sizeof d.train.images, "%s", file.path);
    d.val.present = d.val_from_train = d.val_fraction > 0;

    td_data_probe p = {0};
    td_err err = {{0}};
    int probed = td_dataset_probe_text(&d, &d.train, &p, &err);
    FUZZ_CHECK(probed == 0 || err.msg[0], "a probe refusal without a message");
    td_tokenizer tk;
    err.msg[0] = 0;
    if (td_text_tokenizer(&d, &tk, &err) != 0) {
        FUZZ_CHECK(err.msg[0], "a tokenizer refusal without a message");
        FUZZ_CHECK(probed != 0 || !strstr(err.msg, "UTF-8"), "the probe took what is not UTF-8");
        return 0;
    }
    td_dataset ds;
    err.msg[0] = 0;
    if (td_dataset_load_text(&ds, &d, &d.train, &tk, &err) != 0) {
        FUZZ_CHECK(err.msg[0] && strstr(err.msg, "block_size"), "refused: %s", err.msg);
        td_tokenizer_free(&tk);
        return 0;
    }
    FUZZ_CHECK(ds.n >= 1 && ds.num_classes == tk.vocab_size && ds.shape.c == d.block_size,
               "%d windows, %d classes", ds.n, ds.num_classes);
    float x[8];
    int32_t y[8];
    for (int i = 0; i < ds.n; i++) {
        td_dataset_window(&ds, i, x, y);
        for (int k = 0; k < d.block_size; k++) {
            FUZZ_CHECK(x[k] >= 0 && x[k] < (float)tk.vocab_size, "id %g", (double)x[k]);
            FUZZ_CHECK(y[k] >= 0 && y[k] < tk.vocab_size, "label %d", y[k]);
            FUZZ_CHECK(k + 1 == d.block_size || (float)y[k] == x[k + 1], "not the next token");
        }
    }
    /* the training part decodes to the file's start, byte for byte */
    char *back = malloc(4 * ds.n_tokens + 1);
    size_t n = td_tokenizer_decode(&tk, ds.tokens, ds.n_tokens, back, 4 * ds.n_tokens + 1);
    FUZZ_CHECK(n <= size - 1 && memcmp(back, data + 1, n) == 0, "decoding differs from the text");
    free(back);
    td_dataset_free(&ds);
    td_tokenizer_free(&tk);
    return 0;
}
