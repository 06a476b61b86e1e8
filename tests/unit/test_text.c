/* The text format: the char and byte tokenizers (nanoGPT's sorted(set(text)) vocabulary, UTF-8
 * with the place of a bad byte), the split into windows and their next-token labels, the
 * validation part of one file, the spec's fields, and a loader's batch with a label per
 * position. */
#include "data/td_data.h"
#include "spec/td_spec.h"
#include "test_util.h"
#include "train/td_train.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int build(td_tokenizer *tk, td_tokenizer_kind kind, const char *text, td_err *err) {
    const uint8_t *texts[1] = {(const uint8_t *)text};
    size_t lens[1] = {strlen(text)};
    const char *names[1] = {"t.txt"};
    return td_tokenizer_build(tk, kind, texts, lens, names, 1, err);
}

Test(text, char_vocabulary_is_the_sorted_set_of_characters) {
    td_tokenizer tk;
    td_err err;
    /* "é" (U+00E9) sorts after every ASCII letter, as Python's sorted() orders code points */
    cr_assert_eq(build(&tk, TD_TOKENIZER_CHAR, "hello\nwörld é", &err), 0, "%s", err.msg);
    const uint32_t want[] = {'\n', ' ', 'd', 'e', 'h', 'l', 'o', 'r', 'w', 0xE9, 0xF6};
    cr_assert_eq(tk.vocab_size, 11);
    for (int i = 0; i < 11; i++)
        cr_expect_eq(tk.chars[i], want[i], "id %d: U+%04X", i, tk.chars[i]);
    int32_t *ids;
    size_t n;
    const char *s = "wörld";
    cr_assert_eq(td_tokenizer_encode(&tk, (const uint8_t *)s, strlen(s), "s", &ids, &n, &err), 0);
    cr_expect_eq(n, 5u, "five characters, six bytes");
    cr_expect_eq(ids[0], 8, "w");
    cr_expect_eq(ids[1], 10, "ö");
    char back[32];
    cr_expect_eq(td_tokenizer_decode(&tk, ids, n, back, sizeof back), strlen(s));
    cr_expect_str_eq(back, s);
    free(ids);
    /* a character the vocabulary lacks */
    cr_expect_neq(td_tokenizer_encode(&tk, (const uint8_t *)"x", 1, "val.txt", &ids, &n, &err), 0);
    cr_expect(strstr(err.msg, "val.txt") && strstr(err.msg, "U+0078"), "%s", err.msg);
    td_tokenizer_free(&tk);
}

Test(text, bad_utf8_is_placed_by_line_and_column) {
    td_tokenizer tk;
    td_err err;
    cr_assert_neq(build(&tk, TD_TOKENIZER_CHAR, "ab\ncé\xff!", &err), 0);
    cr_expect(strstr(err.msg, "t.txt: line 2, column 3") && strstr(err.msg, "0xff"), "%s", err.msg);
    cr_expect(strstr(err.msg, "byte"), "the message names the byte tokenizer: %s", err.msg);
    /* the byte tokenizer takes any bytes, and gives them back */
    cr_assert_eq(build(&tk, TD_TOKENIZER_BYTE, "ab\xff", &err), 0);
    cr_expect_eq(tk.vocab_size, 256);
    int32_t *ids;
    size_t n;
    cr_assert_eq(td_tokenizer_encode(&tk, (const uint8_t *)"a\xff", 2, "s", &ids, &n, &err), 0);
    cr_expect(n == 2 && ids[0] == 'a' && ids[1] == 0xff);
    free(ids);
    td_tokenizer_free(&tk);
}

static td_job load_spec(const char *path, const char *extra) {
    char spec[2048];
    snprintf(spec, sizeof spec,
             "{\"model\": {\"nodes\": [{\"name\": \"wte\", \"op\": \"embedding\", "
             "\"num_embeddings\": 10, \"embedding_dim\": 4}, {\"name\": \"head\", \"op\": "
             "\"linear\", \"out_features\": 10}]},"
             " \"data\": {\"format\": \"text\", \"train\": {\"path\": \"%s\"}%s},"
             " \"train\": {\"batch_size\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}}",
             path, extra);
    td_job job;
    td_err err;
    cr_assert_eq(td_job_load_string(&job, spec, &err), 0, "%s", err.msg);
    return job;
}

Test(text, windows_and_their_next_tokens_and_the_validation_tail) {
    const char *path = test_write_file("ten.txt", "abcdefghij", 10);
    td_job job = load_spec(path, ", \"block_size\": 3, \"val_fraction\": 0.5");
    cr_assert(job.data.val.present && job.data.val_from_train, "the file's tail validates");
    td_dataset train, val;
    td_err err;
    cr_assert_eq(td_data_load_split(&job.data, &job.data.train, 0, 1, &train, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(td_data_load_split(&job.data, &job.data.val, 0, 1, &val, &err), 0, "%s", err.msg);
    /* train "abcde": windows at 0 and 1 (stride 1); val "fghij": one window (stride 3) */
    cr_expect_eq(train.n, 2);
    cr_expect_eq(val.n, 1);
    cr_expect_eq(train.num_classes, 10, "ten characters in the file");
    cr_expect_eq(td_dataset_positions(&train), 3);
    float x[3];
    int32_t y[3];
    td_dataset_window(&train, 1, x, y);
    cr_expect(x[0] == 1 && x[1] == 2 && x[2] == 3, "b c d");
    cr_expect(y[0] == 2 && y[1] == 3 && y[2] == 4, "c d e");
    td_dataset_window(&val, 0, x, y);
    cr_expect(x[0] == 5 && y[2] == 8, "f.. and ..i");

    /* a loader's batch: both windows, a label per position */
    td_normalize norm = {.channels = 1, .mean = {0}, .std = {1}};
    td_loader_config cfg = {.batch_size = 2, .world = 1, .pad = true, .seed = 3};
    td_loader *ld = td_loader_create(&train, &norm, NULL, &cfg);
    td_loader_start_epoch(ld, 0, 0);
    td_batch b;
    cr_assert(td_loader_next(ld, &b));
    cr_expect_eq(b.n, 2);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++)
            cr_expect_eq(b.labels[i * 3 + k], (int32_t)b.x[i * 3 + k] + 1, "next token");
    td_loader_destroy(ld);
    td_dataset_free(&train);
    td_dataset_free(&val);
    td_job_free(&job);

    /* too short for a window and its next token: the split and the field are named */
    job = load_spec(path, ", \"block_size\": 5, \"val_fraction\": 0.5");
    cr_expect_neq(td_data_load_split(&job.data, &job.data.val, 0, 1, &val, &err), 0);
    cr_expect(strstr(err.msg, "data.val: 5 tokens") && strstr(err.msg, "block_size"), "%s",
              err.msg);
    td_job_free(&job);
}

Test(text, spec_fields_are_checked) {
    const char *path = test_write_file("one.txt", "abc", 3);
    const char *bad[][2] = {
        {"", "data.block_size"},
        {", \"block_size\": 2, \"tokenizer\": \"bpe\"", "data.tokenizer"},
        {", \"block_size\": 2, \"val_fraction\": 1", "data.val_fraction"},
        {", \"block_size\": 2, \"normalize\": {\"mean\": [0], \"std\": [1]}", "normalize"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char spec[1024];
        snprintf(spec, sizeof spec,
                 "{\"model\": {\"preset\": \"mlp\", \"num_classes\": 3},"
                 " \"data\": {\"format\": \"text\", \"train\": {\"path\": \"%s\"}%s}}",
                 path, bad[i][0]);
        td_job job;
        td_err err;
        cr_expect_neq(td_job_load_string(&job, spec, &err), 0, "%s is refused", bad[i][1]);
        cr_expect(strstr(err.msg, bad[i][1]), "%s: %s", bad[i][1], err.msg);
    }
}

/* A GPT on text with a validation pass every 2 steps (nanoGPT's eval_interval): eval lines at
 * steps 2 and 4, the loss at every position falling, and the done line's own at step 6. */
Test(text, a_gpt_trains_and_validates_every_n_steps) {
    char text[2000];
    for (int i = 0; i < 1999; i++) text[i] = "to be or not to be\n"[i % 19];
    text[1999] = 0;
    const char *path = test_write_file("be.txt", text, strlen(text));
    char spec[1024];
    snprintf(
        spec, sizeof spec,
        "{\"model\": {\"preset\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, "
        "\"block_size\": 16},"
        " \"data\": {\"format\": \"text\", \"train\": {\"path\": \"%s\"}, \"block_size\": 16},"
        " \"train\": {\"max_steps\": 6, \"eval_every_steps\": 2, \"batch_size\": 8, \"seed\": 2,"
        "   \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01, \"decay\": \"matrices\"}},"
        " \"sample\": {\"prompt\": \"to \", \"tokens\": 24, \"top_k\": 3, \"seed\": 4},"
        " \"log\": {\"every_steps\": 1}}",
        path);
    char *metrics = test_run_job(spec, NULL, NULL);
    cr_assert(metrics);
    int evals = 0;
    for (const char *p = metrics; (p = strstr(p, "\"event\":\"eval\"")); p++) evals++;
    cr_expect_eq(evals, 2, "eval lines at steps 2 and 4: %s", metrics);
    cr_expect(strstr(metrics, "\"event\":\"done\"") && strstr(metrics, "\"val_loss\""), "%s",
              metrics);
    double first = 0, last = 0;
    const char *p = strstr(metrics, "\"loss\":");
    if (p) first = strtod(p + 7, NULL);
    for (const char *q = metrics; (q = strstr(q, "\"event\":\"train\"")); q++) {
        const char *l = strstr(q, "\"loss\":");
        if (l) last = strtod(l + 7, NULL);
    }
    cr_expect(first > 0 && last < first, "the loss falls: %g then %g\n%s", first, last, metrics);
    /* a sample at each evaluation and at the end: 24 characters of the text's own */
    int samples = 0;
    for (const char *q = metrics; (q = strstr(q, "\"event\":\"sample\"")); q++) {
        samples++;
        const char *txt = strstr(q, "\"text\":\"");
        cr_assert(txt, "%s", q);
        int chars = 0;
        for (txt += 8; *txt && *txt != '"'; txt++, chars++) {
            if (*txt == '\\') txt++; /* "\n" is one character */
            cr_expect(strchr("to ben\n", *txt) || *txt == 'r', "a character of the text: %c", *txt);
        }
        cr_expect_eq(chars, 24, "24 tokens: %.80s", q);
    }
    cr_expect_eq(samples, 3, "%s", metrics);
    cr_expect(strstr(metrics, "\"prompt\":\"to \""), "%s", metrics);
    /* seeded by (seed, step): the same run writes the same text */
    char *again = test_run_job(spec, NULL, NULL);
    const char *a = strstr(metrics, "\"event\":\"sample\"");
    const char *b = strstr(again, "\"event\":\"sample\"");
    cr_expect(a && b && strncmp(a, b, 60) == 0, "%.80s\n%.80s", a, b);
    free(again);
    free(metrics);
}

/* The 40 ids i % 7 == 0 ? 300 : i % 5 in the file at path (a spec training on it written to
 * spec): the first 75% train, the rest validates, and window 7 is ids 7.. with labels 8... */
static void expect_forty_tokens(const char *path, char *spec, size_t len) {
    snprintf(spec, len,
             "{\"model\": {\"preset\": \"gpt\", \"n_layer\": 1, \"n_head\": 1, \"n_embd\": 4, "
             "\"block_size\": 4},"
             " \"data\": {\"format\": \"tokens\", \"train\": {\"path\": \"%s\"}, \"block_size\": 4,"
             " \"vocab_size\": 301, \"val_fraction\": 0.25},"
             " \"train\": {\"max_steps\": 2, \"batch_size\": 2,"
             "   \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}}",
             path);
    td_job job;
    td_err err;
    cr_assert_eq(td_job_load_string(&job, spec, &err), 0, "%s", err.msg);
    td_dataset train, val;
    cr_assert_eq(td_data_load_split(&job.data, &job.data.train, 0, 1, &train, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(td_data_load_split(&job.data, &job.data.val, 0, 1, &val, &err), 0, "%s", err.msg);
    cr_expect_eq(train.n_tokens, 30u, "the first 75%%");
    cr_expect_eq(val.n_tokens, 10u);
    cr_expect_eq(train.num_classes, 301);
    float x[4];
    int32_t y[4];
    td_dataset_window(&train, 7, x, y);
    cr_expect(x[0] == 300 && y[0] == 3 && x[1] == 3, "ids 7 and 8: 300 then 8 %% 5");
    td_dataset_free(&train);
    td_dataset_free(&val);
    td_job_free(&job);
}

/* The tokens format: nanoGPT's .bin of little-endian uint16 ids, windowed as text is; an id past
 * data.vocab_size, an odd size or a file shorter than a window is refused naming the file. */
Test(text, tokens_bin_as_nanogpt_writes_it) {
    uint8_t bin[2 * 40];
    for (int i = 0; i < 40; i++) {
        int id = i % 7 == 0 ? 300 : i % 5; /* 300: past a byte, so both halves matter */
        bin[2 * i] = (uint8_t)(id & 0xff);
        bin[2 * i + 1] = (uint8_t)(id >> 8);
    }
    const char *path = test_write_file("train.bin", bin, sizeof bin);
    char spec[1024];
    td_job job;
    td_err err;
    td_dataset train;
    expect_forty_tokens(path, spec, sizeof spec);
    char *metrics = test_run_job(spec, NULL, NULL);
    cr_expect(metrics && strstr(metrics, "\"event\":\"done\""), "%s", metrics);
    free(metrics);

    const struct {
        size_t len;
        const char *vocab, *words;
    } bad[] = {{sizeof bin, "300", "past data.vocab_size 300"},
               {sizeof bin - 1, "301", "not a whole number of uint16"},
               {8, "301", "fewer than data.block_size + 1"}};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        path = test_write_file("bad.bin", bin, bad[k].len);
        snprintf(
            spec, sizeof spec,
            "{\"model\": {\"preset\": \"gpt\", \"n_layer\": 1, \"n_head\": 1, \"n_embd\": 4},"
            " \"data\": {\"format\": \"tokens\", \"train\": {\"path\": \"%s\"}, "
            "\"block_size\": 4, \"vocab_size\": %s},"
            " \"train\": {\"batch_size\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}}",
            path, bad[k].vocab);
        cr_assert_eq(td_job_load_string(&job, spec, &err), 0, "%s", err.msg);
        cr_expect_neq(td_data_load_split(&job.data, &job.data.train, 0, 1, &train, &err), 0);
        cr_expect(strstr(err.msg, bad[k].words) && strstr(err.msg, "bad.bin"), "%zu: %s", k,
                  err.msg);
        td_job_free(&job);
    }
}

/* The tokenizer travels with each checkpoint: as JSON and back, the same ids. */
Test(text, a_tokenizer_as_json_and_back) {
    td_tokenizer tk, back;
    td_err err = {{0}};
    cr_assert_eq(build(&tk, TD_TOKENIZER_CHAR, "héllo wörld ☃\n", &err), 0, "%s", err.msg);
    char *json = td_tokenizer_to_json(&tk);
    cr_assert_eq(td_tokenizer_from_json(&back, json, "meta", &err), 0, "%s: %s", json, err.msg);
    cr_expect_eq(back.vocab_size, tk.vocab_size);
    cr_expect(memcmp(back.chars, tk.chars, (size_t)tk.vocab_size * 4) == 0, "%s", json);
    free(json);
    td_tokenizer_free(&back);
    td_tokenizer_free(&tk);
    cr_expect_eq(td_tokenizer_from_json(&back, "{\"type\":\"words\"}", "meta", &err), -1);
    cr_expect(strstr(err.msg, "meta: not a tokenizer description"), "%s", err.msg);
}

/* traind-worker sample of a run's last checkpoint, with the spec's own settings, writes the
 * prompt and the text of the run's last sample line: the spec, the tokenizer and the step come
 * from model.safetensors alone. */
Test(text, a_checkpoint_samples_what_the_run_sampled) {
    char text[2000];
    for (int i = 0; i < 1999; i++) text[i] = "to be or not to be, "[i % 20];
    text[1999] = 0;
    const char *path = test_write_file("be.txt", text, strlen(text));
    char dir[600], spec[1400];
    snprintf(dir, sizeof dir, "%s/ck", test_tmpdir());
    snprintf(spec, sizeof spec,
             "{\"model\": {\"preset\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, "
             "\"block_size\": 16},"
             " \"data\": {\"format\": \"text\", \"train\": {\"path\": \"%s\"}, \"block_size\": 16},"
             " \"train\": {\"max_steps\": 4, \"batch_size\": 8, \"seed\": 2,"
             "   \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}},"
             " \"sample\": {\"prompt\": \"to \", \"tokens\": 30, \"top_k\": 5, \"seed\": 4},"
             " \"checkpoint\": {\"dir\": \"%s\"}}",
             path, dir);
    char *metrics = test_run_job(spec, NULL, NULL);
    const char *last = NULL;
    for (const char *q = metrics; (q = strstr(q, "\"event\":\"sample\"")); q++) last = q;
    cr_assert(last, "%s", metrics);
    const char *t = strstr(last, "\"text\":\"") + 8;
    char want[64] = "to ";
    memcpy(want + 3, t, 30);
    want[33] = '\n';
    char ck[700], *got = NULL;
    size_t len = 0;
    snprintf(ck, sizeof ck, "%s/step-00000004", dir);
    FILE *out = open_memstream(&got, &len);
    td_generate_options opt = {NULL, -1, -1, -1.0, -1, 1};
    td_err err = {{0}};
    cr_assert_eq(td_train_generate(ck, &opt, out, &err), 0, "%s", err.msg);
    fclose(out);
    cr_expect_eq(len, 34, "the prompt, 30 characters and a newline: \"%s\"", got);
    cr_expect(strncmp(got, want, 34) == 0, "sample: \"%s\", the run's line: \"%.34s\"", got, want);
    free(got);
    /* other settings draw other text, still of the text's characters */
    opt.seed = 99, opt.tokens = 50, opt.prompt = "be";
    out = open_memstream(&got, &len);
    cr_assert_eq(td_train_generate(ck, &opt, out, &err), 0, "%s", err.msg);
    fclose(out);
    cr_expect_eq(len, 53, "\"%s\"", got);
    cr_expect(strncmp(got, "be", 2) == 0 && strspn(got, "tobenr, \n") == len, "\"%s\"", got);
    free(got);
    /* a prompt outside the vocabulary, and a file that is not a checkpoint of text */
    opt.prompt = "xyz";
    cr_expect_eq(td_train_generate(ck, &opt, stdout, &err), -1);
    cr_expect(strstr(err.msg, "--prompt: character U+0078 is not in the vocabulary"), "%s",
              err.msg);
    cr_expect_eq(td_train_generate(dir, &opt, stdout, &err), -1);
    cr_expect(strstr(err.msg, "model.safetensors"), "%s", err.msg);
    free(metrics);
}

/* Tokens as numpy saves them (np.save of an int32 or uint16 array): the same windows as the .bin;
 * a 2-D array, floats, and an id past the vocabulary are refused naming the file. */
static const char *write_npy(const char *name, const char *descr, const char *shape,
                             const void *data, size_t bytes) {
    char header[128];
    int len = snprintf(header, sizeof header,
                       "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    while ((10 + len + 1) % 64) header[len++] = ' '; /* numpy pads the header to 64 bytes */
    header[len++] = '\n';
    uint8_t *file = malloc(10 + (size_t)len + bytes);
    memcpy(file, "\x93NUMPY\x01\x00", 8);
    file[8] = (uint8_t)len, file[9] = 0;
    memcpy(file + 10, header, (size_t)len);
    memcpy(file + 10 + len, data, bytes);
    const char *path = test_write_file(name, file, 10 + (size_t)len + bytes);
    free(file);
    return path;
}

Test(text, tokens_npy_as_numpy_saves_it) {
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = i % 7 == 0 ? 300 : i % 5;
    const char *path = write_npy("train.npy", "<i4", "(40,)", ids, sizeof ids);
    char spec[1024];
    expect_forty_tokens(path, spec, sizeof spec);
    td_job job;
    td_err err;
    td_dataset train;

    uint16_t small[40];
    for (int i = 0; i < 40; i++) small[i] = (uint16_t)ids[i];
    float floats[40] = {0};
    ids[9] = 301;
    const struct {
        const char *descr, *shape, *words;
        const void *data;
        size_t bytes;
    } cases[] = {{"<u2", "(40,)", NULL, small, sizeof small},
                 {"<i4", "(40,)", "token 9 is id 301, past data.vocab_size 301", ids, sizeof ids},
                 {"<i4", "(4, 10)", "expected a 1-D array of integer token ids", ids, sizeof ids},
                 {"<f4", "(40,)", "found '<f4'", floats, sizeof floats},
                 {"<i4", "(3,)", "3 tokens, fewer than data.block_size + 1", ids, 12}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        path = write_npy("case.npy", cases[k].descr, cases[k].shape, cases[k].data, cases[k].bytes);
        snprintf(
            spec, sizeof spec,
            "{\"model\": {\"preset\": \"gpt\", \"n_layer\": 1, \"n_head\": 1, \"n_embd\": 4},"
            " \"data\": {\"format\": \"tokens\", \"train\": {\"path\": \"%s\"},"
            " \"block_size\": 4, \"vocab_size\": 301},"
            " \"train\": {\"batch_size\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}}",
            path);
        cr_assert_eq(td_job_load_string(&job, spec, &err), 0, "%s", err.msg);
        td_data_probe probe;
        int rc = td_data_probe_split(&job.data, &job.data.train, &probe, &err);
        if (rc == 0) rc = td_data_load_split(&job.data, &job.data.train, 0, 1, &train, &err);
        if (!cases[k].words) {
            cr_expect_eq(rc, 0, "%s %s: %s", cases[k].descr, cases[k].shape, err.msg);
            if (rc == 0) td_dataset_free(&train);
        } else {
            cr_expect_eq(rc, -1, "%s %s is refused", cases[k].descr, cases[k].shape);
            cr_expect(strstr(err.msg, cases[k].words) && strstr(err.msg, "case.npy"), "%s",
                      err.msg);
        }
        td_job_free(&job);
    }
}

/* train.eval_iters caps a validation pass at its first N batches: with batches of 2 windows, one
 * batch of a longer validation text gives the loss of those 2 windows alone. */
Test(text, eval_iters_reads_the_first_batches_of_the_validation_split) {
    char text[2000];
    for (int i = 0; i < 1999; i++) text[i] = "to be or not to be, "[i % 20];
    text[1999] = 0;
    const char *train = test_write_file("train.txt", text, strlen(text));
    char train_path[600], short_path[600]; /* copies: the next write reuses the storage */
    snprintf(train_path, sizeof train_path, "%s", train);
    /* 2 windows of 8 and the next token; the long file goes on after them */
    const char *two = "be or not to be, to";
    snprintf(short_path, sizeof short_path, "%s", test_write_file("short.txt", two, 17));
    char long_path[600];
    snprintf(long_path, sizeof long_path, "%s",
             test_write_file("long.txt", "be or not to be, to not be or be", 32));
    double val[2];
    for (int k = 0; k < 2; k++) {
        char spec[2400];
        snprintf(spec, sizeof spec,
                 "{\"model\": {\"preset\": \"gpt\", \"n_layer\": 1, \"n_head\": 1, \"n_embd\": 8,"
                 " \"block_size\": 8},"
                 " \"data\": {\"format\": \"text\", \"train\": {\"path\": \"%s\"},"
                 " \"val\": {\"path\": \"%s\"}, \"block_size\": 8},"
                 " \"train\": {\"max_steps\": 2, \"batch_size\": 4, \"eval_batch_size\": 2,"
                 " \"seed\": 3, %s \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}}}",
                 train_path, k ? long_path : short_path, k ? "\"eval_iters\": 1," : "");
        char *metrics = test_run_job(spec, NULL, NULL);
        const char *done = strstr(metrics, "\"event\":\"done\"");
        cr_assert(done && strstr(done, "\"val_loss\":"), "%s", metrics);
        val[k] = strtod(strstr(done, "\"val_loss\":") + 11, NULL);
        free(metrics);
    }
    cr_expect(fabs(val[0] - val[1]) <= 1e-6 * val[0],
              "the first batch of the long text %.9g, the short text whole %.9g", val[1], val[0]);
}

/* The eval line of a language model: the training loss estimated on eval_iters random batches of
 * training windows (nanoGPT's estimate_loss) and the perplexity exp(val_loss); the estimate's
 * windows come from a stream of their own, so the training lines are those of a run without it. */
Test(text, eval_line_estimates_the_training_loss_and_leaves_training_as_it_was) {
    char text[3000];
    for (int i = 0; i < 2999; i++) text[i] = "to be or not to be, that is the question; "[i % 42];
    text[2999] = 0;
    char train_path[600];
    snprintf(train_path, sizeof train_path, "%s", test_write_file("q.txt", text, strlen(text)));
    char *runs[2];
    for (int k = 0; k < 2; k++) {
        char spec[2400];
        snprintf(spec, sizeof spec,
                 "{\"model\": {\"preset\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 8,"
                 " \"block_size\": 8},"
                 " \"data\": {\"format\": \"text\", \"train\": {\"path\": \"%s\"},"
                 " \"val_fraction\": 0.1, \"block_size\": 8},"
                 " \"log\": {\"every_steps\": 1},"
                 " \"train\": {\"max_steps\": 7, \"batch_size\": 4, \"eval_every_steps\": 3,"
                 " \"seed\": 5, %s \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.01}}}",
                 train_path, k ? "\"eval_iters\": 3," : "");
        runs[k] = test_run_job(spec, NULL, NULL);
    }
    /* the estimate's run: eval lines with both, the perplexity exp(val_loss) */
    int evals = 0;
    double first = 0;
    for (const char *e = runs[1]; (e = strstr(e, "\"event\":\"eval\"")); e++, evals++) {
        const char *l = strstr(e, "\"loss\":"), *v = strstr(e, "\"val_loss\":"),
                   *p = strstr(e, "\"perplexity\":"), *end = strchr(e, '\n');
        cr_assert(l && v && p && p < end, "an eval line with loss and perplexity: %s", e);
        double loss = strtod(l + 7, NULL), val = strtod(v + 11, NULL), ppl = strtod(p + 13, NULL);
        cr_expect(loss > 0 && isfinite(loss), "%s", e);
        cr_expect(fabs(ppl - exp(val)) <= 1e-6 * ppl, "perplexity %.9g, val_loss %.9g", ppl, val);
        if (evals == 0)
            first = loss;
        else
            cr_expect(loss < first, "training lowers the estimate: %.6f then %.6f", first, loss);
    }
    cr_expect_eq(evals, 2, "steps 3 and 6 (the end's evaluation has no line): %s", runs[1]);
    /* without eval_iters: no estimate, still the perplexity */
    const char *e0 = strstr(runs[0], "\"event\":\"eval\"");
    cr_assert(e0, "%s", runs[0]);
    const char *e0_end = strchr(e0, '\n'), *l0 = strstr(e0, "\"loss\":");
    cr_expect(strstr(e0, "\"perplexity\":") < e0_end && l0 > e0_end, "%s", e0);
    /* the same training lines, step by step (the timings apart) */
    for (int step = 1; step <= 7; step++) {
        char key[48];
        snprintf(key, sizeof key, "\"event\":\"train\",\"step\":%d,", step);
        const char *a = strstr(runs[0], key), *b = strstr(runs[1], key);
        cr_assert(a && b, "step %d's train line", step);
        const char *la = strstr(a, "\"loss\":"), *lb = strstr(b, "\"loss\":");
        cr_expect(strtod(la + 7, NULL) == strtod(lb + 7, NULL), "step %d: %.9g and %.9g", step,
                  strtod(la + 7, NULL), strtod(lb + 7, NULL));
    }
    free(runs[0]);
    free(runs[1]);
}
