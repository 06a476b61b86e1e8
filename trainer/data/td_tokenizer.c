/* Tokenizers of the text format: `char`, the sorted set of the text's characters (Unicode code
 * points), as nanoGPT's shakespeare_char/prepare.py builds its vocabulary with sorted(set(data));
 * `byte`, the 256 byte values; and `gpt2`, GPT-2's byte-level BPE (td_bpe.c). UTF-8 is decoded with
 * ICU's U8_NEXT (libicu-dev's header; nothing to link), which also finds the first invalid sequence
 * for the error message. */
#include "data/td_data.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/utf8.h>

#define TD_TOKENIZER_CHAR_MAX 65536 /* distinct characters a char vocabulary may hold */

/* Line and column (1-based, in characters) of byte offset `at`, for error messages. */
static void line_column(const uint8_t *text, size_t at, long *line, long *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < at; i++) {
        if (text[i] == '\n') {
            ++*line;
            *col = 1;
        } else if ((text[i] & 0xC0) != 0x80) {
            ++*col;
        }
    }
}

/* Calls fn(ctx, code point) for every character; -1 with the place of the first byte that is
 * not UTF-8. len < 2^31: ICU's offsets are int32_t (the loader refuses larger files). */
static int each_char(const uint8_t *text, size_t len, const char *what,
                     int (*fn)(void *ctx, uint32_t c), void *ctx, td_err *err) {
    int32_t n = (int32_t)len, i = 0;
    while (i < n) {
        int32_t at = i;
        UChar32 c;
        U8_NEXT(text, i, n, c);
        if (c < 0) {
            long line, col;
            line_column(text, (size_t)at, &line, &col);
            return td_fail(err,
                           "%s: line %ld, column %ld (byte %ld): byte 0x%02x is not UTF-8; the "
                           "text format reads UTF-8 (or use \"tokenizer\": \"byte\")",
                           what, line, col, (long)at, text[at]);
        }
        if (fn && fn(ctx, (uint32_t)c) != 0)
            return td_fail(err, "%s: more than %d distinct characters for the char tokenizer", what,
                           TD_TOKENIZER_CHAR_MAX);
    }
    return 0;
}

int td_utf8_check(const uint8_t *text, size_t len, const char *what, td_err *err) {
    return each_char(text, len, what, NULL, NULL, err);
}

typedef struct char_set {
    uint8_t *seen; /* a bit per code point below 0x110000 */
    int count;
} char_set;

static int mark(void *ctx, uint32_t c) {
    char_set *s = ctx;
    if (s->seen[c >> 3] & (1u << (c & 7))) return 0;
    if (++s->count > TD_TOKENIZER_CHAR_MAX) return -1;
    s->seen[c >> 3] |= (uint8_t)(1u << (c & 7));
    return 0;
}

int td_tokenizer_build(td_tokenizer *tk, td_tokenizer_kind kind, const uint8_t *const *texts,
                       const size_t *lens, const char *const *names, int n_texts, td_err *err) {
    memset(tk, 0, sizeof *tk);
    tk->kind = kind;
    if (kind == TD_TOKENIZER_BYTE) {
        tk->vocab_size = 256;
        return 0;
    }
    if (kind == TD_TOKENIZER_GPT2) {
        const char *dir = td_gpt2_files(err);
        if (!dir || td_bpe_load(&tk->bpe, dir, err) != 0) return -1;
        tk->vocab_size = td_bpe_vocab_size(tk->bpe);
        return 0;
    }
    char_set set = {td_calloc(0x110000 / 8, 1), 0};
    for (int t = 0; t < n_texts; t++) {
        if (each_char(texts[t], lens[t], names[t], mark, &set, err) != 0) {
            free(set.seen);
            return -1;
        }
    }
    if (set.count == 0) {
        free(set.seen);
        return td_fail(err, "%s: empty; the char tokenizer needs text", names[0]);
    }
    /* ids in code point order: sorted(set(text)) */
    tk->chars = td_malloc((size_t)set.count * sizeof *tk->chars);
    for (uint32_t byte = 0; byte < 0x110000 / 8; byte++) /* a byte at a time: most are 0 */
        for (uint32_t bit = 0; set.seen[byte] && bit < 8; bit++)
            if (set.seen[byte] & (1u << bit)) tk->chars[tk->vocab_size++] = byte * 8 + bit;
    free(set.seen);
    return 0;
}

/* The id of code point c: binary search of the sorted characters; -1 when absent. */
static int32_t char_id(const td_tokenizer *tk, uint32_t c) {
    int lo = 0, hi = tk->vocab_size - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (tk->chars[mid] == c) return mid;
        if (tk->chars[mid] < c)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

typedef struct encoding {
    const td_tokenizer *tk;
    int32_t *ids;
    size_t n;
    uint32_t missing; /* a character outside the vocabulary */
    bool failed;
} encoding;

static int put_char(void *ctx, uint32_t c) {
    encoding *e = ctx;
    int32_t id = char_id(e->tk, c);
    if (id < 0 && !e->failed) {
        e->failed = true;
        e->missing = c;
    }
    e->ids[e->n++] = id < 0 ? 0 : id;
    return 0;
}

int td_tokenizer_encode(const td_tokenizer *tk, const uint8_t *text, size_t len, const char *what,
                        int32_t **ids, size_t *n, td_err *err) {
    *ids = td_malloc((len ? len : 1) * sizeof **ids); /* at most a token per byte */
    *n = 0;
    if (tk->kind == TD_TOKENIZER_BYTE) {
        for (size_t i = 0; i < len; i++) (*ids)[i] = text[i];
        *n = len;
        return 0;
    }
    if (tk->kind == TD_TOKENIZER_GPT2) {
        if (each_char(text, len, what, NULL, NULL, err) != 0) goto fail;
        if (td_bpe_encode(tk->bpe, text, len, *ids, n, err) != 0) {
            td_fail_prefix(err, "%s", what);
            goto fail;
        }
        return 0;
    }
    encoding e = {tk, *ids, 0, 0, false};
    if (each_char(text, len, what, put_char, &e, err) != 0) goto fail;
    if (e.failed) {
        td_fail(err, "%s: character U+%04X is not in the vocabulary", what, (unsigned)e.missing);
        goto fail;
    }
    *n = e.n;
    return 0;
fail:
    free(*ids);
    *ids = NULL;
    return -1;
}

size_t td_tokenizer_decode(const td_tokenizer *tk, const int32_t *ids, size_t n, char *out,
                           size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t buf[4];
        int32_t len = 0;
        if (tk->kind == TD_TOKENIZER_GPT2) {
            int bytes;
            const uint8_t *token = td_bpe_token_bytes(tk->bpe, ids[i], &bytes);
            if (w + (size_t)bytes + 1 > cap) break;
            memcpy(out + w, token, (size_t)bytes);
            w += (size_t)bytes;
            continue;
        }
        if (tk->kind == TD_TOKENIZER_BYTE) {
            buf[len++] = (uint8_t)ids[i];
        } else if (ids[i] >= 0 && ids[i] < tk->vocab_size) {
            U8_APPEND_UNSAFE(buf, len, tk->chars[ids[i]]);
        }
        if (w + (size_t)len + 1 > cap) break;
        memcpy(out + w, buf, (size_t)len);
        w += (size_t)len;
    }
    if (cap) out[w] = 0;
    return w;
}

int td_tokenizer_max_bytes(const td_tokenizer *tk) {
    return tk->kind == TD_TOKENIZER_GPT2   ? td_bpe_max_token_bytes(tk->bpe)
           : tk->kind == TD_TOKENIZER_BYTE ? 1
                                           : 4;
}

void td_tokenizer_free(td_tokenizer *tk) {
    free(tk->chars);
    td_bpe_free(tk->bpe);
    memset(tk, 0, sizeof *tk);
}

size_t td_utf8_repair(const char *in, size_t n, char *out, size_t cap) {
    const uint8_t *s = (const uint8_t *)in;
    int32_t len = n < (size_t)INT32_MAX ? (int32_t)n : INT32_MAX, i = 0;
    size_t w = 0;
    while (i < len) {
        int32_t at = i;
        UChar32 c;
        U8_NEXT(s, i, len, c);
        const uint8_t *src = s + at;
        int32_t bytes = i - at;
        uint8_t sub[3] = {0xEF, 0xBF, 0xBD}; /* U+FFFD */
        if (c < 0) src = sub, bytes = 3;
        if (w + (size_t)bytes + 1 > cap) break;
        memcpy(out + w, src, (size_t)bytes);
        w += (size_t)bytes;
    }
    if (cap) out[w] = 0;
    return w;
}

char *td_tokenizer_to_json(const td_tokenizer *tk) {
    static const char *const TYPES[] = {"char", "byte", "gpt2"};
    json_t *o = json_pack("{ss}", "type", TYPES[tk->kind]);
    TD_CHECK_ALLOC(o, "for the tokenizer's description");
    if (tk->kind == TD_TOKENIZER_CHAR) { /* the characters in id order, one UTF-8 string */
        uint8_t *utf8 = td_malloc((size_t)tk->vocab_size * 4 + 1);
        int32_t len = 0;
        for (int i = 0; i < tk->vocab_size; i++) U8_APPEND_UNSAFE(utf8, len, tk->chars[i]);
        json_t *chars = json_stringn_nocheck((const char *)utf8, (size_t)len);
        TD_CHECK_ALLOC(chars, "for the tokenizer's characters");
        json_object_set_new(o, "characters", chars);
        free(utf8);
    }
    char *text = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    TD_CHECK_ALLOC(text, "for the tokenizer's description");
    json_decref(o);
    return text;
}

int td_tokenizer_from_json(td_tokenizer *tk, const char *text, const char *what, td_err *err) {
    memset(tk, 0, sizeof *tk);
    json_error_t je;
    json_t *o = json_loads(text, JSON_ALLOW_NUL, &je);
    const char *type = json_string_value(json_object_get(o, "type"));
    int kind = !type                       ? -1
               : strcmp(type, "char") == 0 ? TD_TOKENIZER_CHAR
               : strcmp(type, "byte") == 0 ? TD_TOKENIZER_BYTE
               : strcmp(type, "gpt2") == 0 ? TD_TOKENIZER_GPT2
                                           : -1;
    json_t *chars = json_object_get(o, "characters");
    int rc;
    if (kind < 0 || (kind == TD_TOKENIZER_CHAR && !json_is_string(chars))) {
        rc = td_fail(err,
                     "%s: not a tokenizer description (expected {\"type\": "
                     "\"char\"|\"byte\"|\"gpt2\"}, with \"characters\" for char)",
                     what);
    } else {
        /* a char vocabulary is the sorted set of its characters: built again from them */
        const uint8_t *texts[1] = {(const uint8_t *)json_string_value(chars)};
        size_t lens[1] = {json_string_length(chars)};
        const char *names[1] = {what};
        rc = td_tokenizer_build(tk, (td_tokenizer_kind)kind, texts, lens, names, 1, err);
    }
    json_decref(o);
    return rc;
}
