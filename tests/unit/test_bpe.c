/* GPT-2's BPE (data.tokenizer "gpt2"): GPT-2's published ids for a few strings, the same ids as
 * npm's gpt-3-encoder (an independent implementation, run under node) for Shakespeare and for
 * text in several scripts, decode(encode(x)) == x, a megabyte of spaces (one piece) without the
 * reference's quadratic time, and clear errors for missing or damaged files. */
#include "data/td_data.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static td_tokenizer gpt2(void) {
    td_tokenizer tk;
    td_err err = {{0}};
    cr_assert_eq(td_tokenizer_build(&tk, TD_TOKENIZER_GPT2, NULL, NULL, NULL, 0, &err), 0, "%s",
                 err.msg);
    return tk;
}

static size_t encode(const td_tokenizer *tk, const char *text, size_t len, int32_t **ids) {
    size_t n;
    td_err err = {{0}};
    cr_assert_eq(td_tokenizer_encode(tk, (const uint8_t *)text, len, "text", ids, &n, &err), 0,
                 "%s", err.msg);
    return n;
}

static void expect_ids(const td_tokenizer *tk, const char *text, const int32_t *want, size_t n) {
    int32_t *ids;
    size_t got = encode(tk, text, strlen(text), &ids);
    cr_expect_eq(got, n, "\"%s\": %zu tokens, expected %zu", text, got, n);
    for (size_t i = 0; i < n && i < got; i++)
        cr_expect_eq(ids[i], want[i], "\"%s\" token %zu: %d, expected %d", text, i, ids[i],
                     want[i]);
    free(ids);
}

Test(bpe, gpt2s_published_ids) {
    td_tokenizer tk = gpt2();
    cr_assert_eq(tk.vocab_size, 50257);
    expect_ids(&tk, "Hello world", (int32_t[]){15496, 995}, 2);
    expect_ids(&tk, " the", (int32_t[]){262}, 1);
    expect_ids(&tk, "\n\n", (int32_t[]){628}, 1);
    /* the end-of-text token is not made from its spelling */
    int32_t *ids;
    size_t n = encode(&tk, "<|endoftext|>", 13, &ids);
    cr_expect(n > 1, "<|endoftext|> is text here, several tokens");
    free(ids);
    td_tokenizer_free(&tk);
}

/* node's gpt-3-encoder's ids for the file at path, as a JSON array */
static json_t *node_ids(const char *path) {
    const char *src = getenv("TRAIND_SOURCE_DIR");
    cr_assert(src, "TRAIND_SOURCE_DIR is set by ctest");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "node -e 'const e = require(\"%s/deploy/npm/node_modules/gpt-3-encoder\");"
             "const fs = require(\"fs\");"
             "process.stdout.write(JSON.stringify(e.encode(fs.readFileSync(\"%s\", \"utf8\"))))'",
             src, path);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "node runs");
    json_error_t je;
    json_t *ids = json_loadf(p, 0, &je);
    cr_assert_eq(pclose(p), 0, "node's encoder exits 0");
    cr_assert(json_is_array(ids), "node printed an array: %s", je.text);
    return ids;
}

static void same_as_node(const char *text, size_t len) {
    const char *path = test_write_file("bpe.txt", text, len);
    json_t *want = node_ids(path);
    td_tokenizer tk = gpt2();
    int32_t *ids;
    size_t n = encode(&tk, text, len, &ids);
    cr_expect_eq(n, json_array_size(want), "%zu tokens, node's encoder %zu", n,
                 json_array_size(want));
    for (size_t i = 0; i < n && i < json_array_size(want); i++) {
        json_int_t w = json_integer_value(json_array_get(want, i));
        if (ids[i] != w) {
            cr_expect_eq(ids[i], w, "token %zu: %d, node's encoder %lld", i, ids[i], (long long)w);
            break;
        }
    }
    /* and back to the very bytes */
    char *back = malloc(len * 2 + 1);
    size_t got = td_tokenizer_decode(&tk, ids, n, back, len * 2 + 1);
    cr_expect(got == len && memcmp(back, text, len) == 0, "decode(encode(text)) is the text");
    free(back);
    free(ids);
    json_decref(want);
    td_tokenizer_free(&tk);
}

Test(bpe, shakespeare_as_gpt_3_encoder_tokenizes_it, .timeout = 60) {
    char path[1024];
    snprintf(path, sizeof path, "%s/examples/data/tinyshakespeare.txt",
             getenv("TRAIND_SOURCE_DIR"));
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s opens", path);
    /* its first 50 KB: the npm encoder slows down badly past that (2 minutes for 300 KB) */
    char *text = malloc(50000);
    size_t len = fread(text, 1, 50000, f);
    fclose(f);
    while (len && ((uint8_t)text[len - 1] & 0xC0) == 0x80) len--; /* whole characters */
    same_as_node(text, len);
    free(text);
}

Test(bpe, scripts_numbers_contractions_and_whitespace_as_gpt_3_encoder) {
    /* (no U+0085 or U+FEFF: JavaScript's \s and GPT-2's Python regex disagree on those two, and
     * traind follows the Python original) */
    static const char text[] =
        "Don't you'll WE'VE they'd I'm it's 's 'S\n"
        "Ünïcödé façade naïve — “quotes” «guillemets» 1234567 3.14159 ½ ①②\n"
        "日本語のテキスト、中文文本。한국어 텍스트 Ελληνικά Русский עברית العربية हिन्दी\n"
        "emoji 😀🎉👍🏽 and symbols @#$%^&*()_+-=[]{}|;':\",./<>?\n"
        "   leading spaces\ttabs\t\tand  double  spaces   \n\n\n  trailing   \r\n"
        "a\u00a0no-break space and\u3000ideographic space";
    same_as_node(text, sizeof text - 1);
}

Test(bpe, a_megabyte_of_spaces_is_one_piece_merged_in_n_log_n, .timeout = 60) {
    /* (the reference's loop is quadratic in a piece's length when it merges, as in the second
     * half; the heap here is not) */
    size_t len = 1 << 20;
    char *text = malloc(len + 2);
    memset(text, ' ', len);
    text[len] = 'x';
    td_tokenizer tk = gpt2();
    int32_t *ids;
    size_t n = encode(&tk, text, len + 1, &ids);
    char *back = malloc(len + 2);
    cr_expect_eq(td_tokenizer_decode(&tk, ids, n, back, len + 2), len + 1);
    cr_expect(memcmp(back, text, len + 1) == 0);
    /* GPT-2's vocabulary has no token of two spaces: each is " " (220), the last is " x" */
    cr_expect_eq(n, len, "%zu tokens", n);
    cr_expect(ids[0] == 220 && ids[n - 2] == 220, "spaces are token 220: %d", ids[0]);
    free(back);
    free(ids);
    /* a megabyte of "a" is one piece too, merged twice over: "aaaa" (24794) is GPT-2's longest
     * run of it, as the npm encoder also says of 64 of them */
    memset(text, 'a', len);
    n = encode(&tk, text, len, &ids);
    cr_expect_eq(n, len / 4, "%zu tokens", n);
    cr_expect(ids[0] == 24794 && ids[n - 1] == 24794, "\"aaaa\" is 24794: %d", ids[0]);
    back = malloc(len + 1);
    cr_expect_eq(td_tokenizer_decode(&tk, ids, n, back, len + 1), len);
    cr_expect(memcmp(back, text, len) == 0);
    free(back);
    free(ids);
    free(text);
    td_tokenizer_free(&tk);
}

static void expect_load_error(const char *encoder, const char *merges, const char *fragment) {
    test_write_file("encoder.json", encoder, strlen(encoder));
    test_write_file("vocab.bpe", merges, strlen(merges));
    const char *dir = test_tmpdir();
    td_bpe *b;
    td_err err = {{0}};
    cr_expect_eq(td_bpe_load(&b, dir, &err), -1, "loading must fail");
    cr_expect(strstr(err.msg, fragment), "message \"%s\" lacks \"%s\"", err.msg, fragment);
    td_bpe_free(b);
}

Test(bpe, damaged_files_are_named_with_what_is_wrong) {
    expect_load_error("[1, 2]", "#version: 0.2\na b\n", "expected an object");
    expect_load_error("{\"a\": 0, \"b\": 0}", "#version: 0.2\na b\n", "is not a new id");
    expect_load_error("{\"a\": 0, \"b\": 1, \"ab\": 2}", "#version: 0.2\na b\nab\n",
                      "line 3: \"ab\" is not a merge");
    expect_load_error("{\"a\": 0, \"\\u0001\": 1}", "#version: 0.2\na b\n",
                      "not in GPT-2's byte alphabet");
    expect_load_error("{\"a\": 0}", "#version: 0.2\n", "no merges");
    expect_load_error("{\"a\": ", "x y\n", "encoder.json: line 1");
}

Test(bpe, a_directory_without_the_files_says_where_it_looked) {
    setenv("TRAIND_GPT2_DIR", "/nonexistent-gpt2", 1);
    td_tokenizer tk;
    td_err err = {{0}};
    cr_expect_eq(td_tokenizer_build(&tk, TD_TOKENIZER_GPT2, NULL, NULL, NULL, 0, &err), -1);
    cr_expect(strstr(err.msg, "TRAIND_GPT2_DIR=/nonexistent-gpt2"), "%s", err.msg);
    unsetenv("TRAIND_GPT2_DIR");
}

/* A GPT on GPT-2's tokens: the vocabulary (50257) comes from the tokenizer, it trains, and its
 * sample decodes to text of whole tokens. */
Test(bpe, a_gpt_trains_on_gpt2_tokens, .timeout = 120) {
    char text[4000] = "";
    for (int i = 0; i < 60; i++) strcat(text, "The quick brown fox jumps over the lazy dog. ");
    const char *path = test_write_file("fox.txt", text, strlen(text));
    char spec[1024];
    snprintf(spec, sizeof spec,
             "{\"model\": {\"preset\": \"gpt\", \"n_layer\": 1, \"n_head\": 2, \"n_embd\": 16, "
             "\"block_size\": 8},"
             " \"data\": {\"format\": \"text\", \"train\": {\"path\": \"%s\"}, \"block_size\": 8,"
             "   \"tokenizer\": \"gpt2\"},"
             " \"train\": {\"max_steps\": 30, \"batch_size\": 8, \"seed\": 2,"
             "   \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.02}},"
             " \"sample\": {\"prompt\": \"The quick\", \"tokens\": 6, \"top_k\": 1},"
             " \"log\": {\"every_steps\": 30}}",
             path);
    char *metrics = test_run_job(spec, NULL, NULL);
    cr_assert(metrics);
    const char *loss = strstr(metrics, "\"event\":\"train\"");
    cr_assert(loss && (loss = strstr(loss, "\"loss\":")), "%s", metrics);
    cr_expect(strtod(loss + 7, NULL) < 5.0, "the loss falls from ln(50257) = 10.8: %s", metrics);
    /* greedy (top_k 1) after 30 steps on one sentence: the sentence's own words, whole */
    const char *t = strstr(metrics, "\"event\":\"sample\"");
    cr_assert(t && (t = strstr(t, "\"text\":\"")), "%s", metrics);
    char words[256];
    sscanf(t + 8, "%255[^\"]", words);
    for (char *w = strtok(words, " ."); w; w = strtok(NULL, " ."))
        cr_expect(strstr(text, w), "\"%s\" is a word of the sentence: %s", w, metrics);
    free(metrics);
}
