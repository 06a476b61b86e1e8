#include "io/td_safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A header larger than this is not a checkpoint of ours nor anything sane (the reference
 * implementation caps it at 100 MB as well). */
#define HEADER_MAX (100u << 20)

static const struct {
    const char *name;
    td_st_dtype dtype;
    size_t size;
} dtypes[] = {{"F32", TD_ST_F32, 4},   {"F64", TD_ST_F64, 8}, {"F16", TD_ST_F16, 2},
              {"BF16", TD_ST_BF16, 2}, {"I64", TD_ST_I64, 8}, {"I32", TD_ST_I32, 4}};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

static size_t dtype_size(td_st_dtype d) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dtype == d) return dtypes[i].size;
    return 0;
}

static const char *dtype_name(td_st_dtype d) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dtype == d) return dtypes[i].name;
    return "?";
}

static uint64_t le64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

static int read_all(const char *path, uint8_t **out, size_t *len, td_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return td_fail(err, "%s: cannot seek: %s", path, strerror(errno));
    }
    long size = ftell(f);
    rewind(f);
    uint8_t *buf = td_malloc(size > 0 ? (size_t)size : 1);
    if (size < 0 || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        fclose(f);
        return td_fail(err, "%s: read error", path);
    }
    fclose(f);
    *out = buf;
    *len = (size_t)size;
    return 0;
}

typedef struct span {
    size_t begin, end;
    int index;
} span;

static int by_begin(const void *a, const void *b) {
    const span *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

static int parse_entry(const char *path, const char *name, json_t *v, size_t data_len,
                       td_st_tensor *t, size_t *begin, size_t *end, td_err *err) {
    if (!json_is_object(v))
        return td_fail(err,
                       "%s: tensor \"%s\": expected an object with dtype, shape and "
                       "data_offsets",
                       path, name);
    snprintf(t->name, sizeof t->name, "%s", name);
    if (strlen(name) >= sizeof t->name)
        return td_fail(err, "%s: tensor name \"%.40s...\" is too long", path, name);
    json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return td_fail(err, "%s: tensor \"%s\": dtype missing or not a string", path, name);
    size_t k = 0;
    while (k < N_DTYPES && strcmp(dtypes[k].name, json_string_value(dt)) != 0) k++;
    if (k == N_DTYPES)
        return td_fail(err,
                       "%s: tensor \"%s\": unknown dtype \"%s\"; expected one of F32, F64, "
                       "F16, BF16, I64, I32",
                       path, name, json_string_value(dt));
    t->dtype = dtypes[k].dtype;
    json_t *shape = json_object_get(v, "shape");
    if (!json_is_array(shape) || json_array_size(shape) > TD_MAX_DIMS)
        return td_fail(err, "%s: tensor \"%s\": shape must be an array of at most %d sizes", path,
                       name, TD_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    t->count = 1;
    for (int i = 0; i < t->ndim; i++) {
        json_t *d = json_array_get(shape, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0 ||
            json_integer_value(d) > (json_int_t)1 << 40)
            return td_fail(err, "%s: tensor \"%s\": shape[%d] is not a valid size", path, name, i);
        t->dims[i] = json_integer_value(d);
        if (t->dims[i] && t->count > ((size_t)1 << 40) / (size_t)t->dims[i])
            return td_fail(err, "%s: tensor \"%s\": shape is implausibly large", path, name);
        t->count *= (size_t)t->dims[i];
    }
    json_t *offs = json_object_get(v, "data_offsets");
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)))
        return td_fail(err, "%s: tensor \"%s\": data_offsets must be [begin, end]", path, name);
    json_int_t b = json_integer_value(json_array_get(offs, 0));
    json_int_t e = json_integer_value(json_array_get(offs, 1));
    if (b < 0 || e < b || (uint64_t)e > data_len)
        return td_fail(err,
                       "%s: tensor \"%s\": data_offsets [%lld, %lld] out of range: the data "
                       "section holds %zu bytes",
                       path, name, (long long)b, (long long)e, data_len);
    size_t want = t->count * dtype_size(t->dtype);
    if ((size_t)(e - b) != want)
        return td_fail(err,
                       "%s: tensor \"%s\": data_offsets span %lld bytes but its shape and "
                       "dtype need %zu",
                       path, name, (long long)(e - b), want);
    *begin = (size_t)b;
    *end = (size_t)e;
    return 0;
}

/* The file's bytes, already in st->bytes (st->len of them), into its tensors; path names it in
 * messages. On failure st is freed. */
static int parse(td_safetensors *st, const char *path, td_err *err) {
    int rc = -1;
    json_t *header = NULL;
    span *spans = NULL;
    if (st->len < 8) {
        td_fail(err,
                "%s: truncated: %zu bytes, a safetensors file starts with an 8-byte header "
                "length",
                path, st->len);
        goto out;
    }
    uint64_t hlen = le64(st->bytes);
    if (hlen > st->len - 8 || hlen > HEADER_MAX) {
        td_fail(err,
                "%s: header length %llu runs past the end of the file (%zu bytes); the file "
                "is truncated or not safetensors",
                path, (unsigned long long)hlen, st->len);
        goto out;
    }
    json_error_t jerr;
    header = json_loadb((const char *)st->bytes + 8, (size_t)hlen, 0, &jerr);
    if (!header || !json_is_object(header)) {
        td_fail(err, "%s: header is not a JSON object%s%s", path, header ? "" : ": ",
                header ? "" : jerr.text);
        goto out;
    }
    const uint8_t *data = st->bytes + 8 + hlen;
    size_t data_len = st->len - 8 - (size_t)hlen;
    size_t n = json_object_size(header);
    st->tensors = td_calloc(n ? n : 1, sizeof *st->tensors);
    spans = td_calloc(n ? n : 1, sizeof *spans);
    const char *key;
    json_t *v;
    json_object_foreach(header, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            st->metadata_json = json_dumps(v, JSON_COMPACT);
            TD_CHECK_ALLOC(st->metadata_json, "reading safetensors metadata");
            continue;
        }
        td_st_tensor *t = &st->tensors[st->n];
        span *s = &spans[st->n];
        if (parse_entry(path, key, v, data_len, t, &s->begin, &s->end, err) != 0) goto out;
        t->data = data + s->begin;
        s->index = st->n++;
    }
    qsort(spans, (size_t)st->n, sizeof *spans, by_begin);
    for (int i = 1; i < st->n; i++)
        if (spans[i].begin < spans[i - 1].end) {
            td_fail(err, "%s: tensors \"%s\" and \"%s\" overlap in the data section", path,
                    st->tensors[spans[i - 1].index].name, st->tensors[spans[i].index].name);
            goto out;
        }
    rc = 0;
out:
    json_decref(header);
    free(spans);
    if (rc != 0) td_safetensors_free(st);
    return rc;
}

int td_safetensors_read(td_safetensors *st, const char *path, td_err *err) {
    memset(st, 0, sizeof *st);
    if (read_all(path, &st->bytes, &st->len, err) != 0) return -1;
    return parse(st, path, err);
}

int td_safetensors_parse(td_safetensors *st, const char *name, const void *bytes, size_t len,
                         td_err *err) {
    memset(st, 0, sizeof *st);
    st->bytes = td_malloc(len ? len : 1);
    if (len) memcpy(st->bytes, bytes, len);
    st->len = len;
    return parse(st, name, err);
}

void td_safetensors_free(td_safetensors *st) {
    free(st->bytes);
    free(st->tensors);
    free(st->metadata_json);
    memset(st, 0, sizeof *st);
}

const td_st_tensor *td_safetensors_find(const td_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

static float half_to_float(uint16_t h) {
    int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    float sign = (h & 0x8000) ? -1.0f : 1.0f;
    if (exp == 0) return sign * ldexpf((float)man, -24);
    if (exp == 31) return man ? NAN : sign * INFINITY;
    return sign * ldexpf((float)(man | 0x400), exp - 25);
}

void td_safetensors_to_float(const td_st_tensor *t, float *out) {
    const uint8_t *p = t->data;
    for (size_t i = 0; i < t->count; i++) {
        switch (t->dtype) {
        case TD_ST_F32: {
            uint32_t u = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                         (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
            memcpy(&out[i], &u, 4);
            break;
        }
        case TD_ST_F64: {
            uint64_t u = le64(p + 8 * i);
            double d;
            memcpy(&d, &u, 8);
            out[i] = (float)d;
            break;
        }
        case TD_ST_F16:
            out[i] = half_to_float((uint16_t)(p[2 * i] | p[2 * i + 1] << 8));
            break;
        case TD_ST_BF16: {
            uint32_t u = (uint32_t)(p[2 * i] | p[2 * i + 1] << 8) << 16;
            memcpy(&out[i], &u, 4);
            break;
        }
        case TD_ST_I64:
            out[i] = (float)(int64_t)le64(p + 8 * i);
            break;
        case TD_ST_I32: {
            uint32_t u = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                         (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
            out[i] = (float)(int32_t)u;
            break;
        }
        }
    }
}

static int write_le(FILE *f, uint64_t v, int bytes) {
    uint8_t b[8];
    for (int i = 0; i < bytes; i++) b[i] = (uint8_t)(v >> (8 * i));
    return fwrite(b, 1, (size_t)bytes, f) == (size_t)bytes ? 0 : -1;
}

int td_safetensors_write(const char *path, const td_st_out *tensors, int n,
                         const char *metadata_json, td_err *err) {
    /* Jansson reports out of memory as a NULL value or a nonzero return; a header missing an
     * entry would be a corrupt file, so each is checked (TD_CHECK_ALLOC ends the process) */
    json_t *header = json_object();
    TD_CHECK_ALLOC(header, "encoding a safetensors header");
    size_t offset = 0;
    if (metadata_json) {
        json_t *meta = json_loads(metadata_json, 0, NULL);
        TD_ASSERT(meta != NULL, "safetensors metadata must be a JSON object text");
        TD_CHECK_ALLOC(json_object_set_new(header, "__metadata__", meta) == 0,
                       "encoding a safetensors header");
    }
    for (int i = 0; i < n; i++) {
        const td_st_out *t = &tensors[i];
        size_t count = 1;
        json_t *shape = json_array();
        TD_CHECK_ALLOC(shape, "encoding a safetensors header");
        for (int d = 0; d < t->ndim; d++) {
            count *= (size_t)t->dims[d];
            TD_CHECK_ALLOC(json_array_append_new(shape, json_integer(t->dims[d])) == 0,
                           "encoding a safetensors header");
        }
        size_t bytes = count * dtype_size(t->dtype);
        json_t *entry =
            json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtype_name(t->dtype), "shape", shape,
                      "data_offsets", (json_int_t)offset, (json_int_t)(offset + bytes));
        TD_CHECK_ALLOC(entry && json_object_set_new(header, t->name, entry) == 0,
                       "encoding a safetensors header");
        offset += bytes;
    }
    char *text = json_dumps(header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    TD_CHECK_ALLOC(text, "encoding a safetensors header");
    json_decref(header);
    size_t hlen = strlen(text), padded = (hlen + 7) / 8 * 8; /* data starts 8-byte aligned */
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(text);
        return td_fail(err, "%s: cannot create: %s", path, strerror(errno));
    }
    int bad = write_le(f, padded, 8) || fwrite(text, 1, hlen, f) != hlen;
    for (size_t i = hlen; i < padded && !bad; i++) bad = fputc(' ', f) == EOF;
    free(text);
    for (int i = 0; i < n && !bad; i++) {
        const td_st_out *t = &tensors[i];
        size_t count = 1;
        for (int d = 0; d < t->ndim; d++) count *= (size_t)t->dims[d];
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (t->dtype == TD_ST_F32) {
            bad = fwrite(t->values, sizeof(float), count, f) != count;
            continue;
        }
#endif
        for (size_t j = 0; j < count && !bad; j++) {
            if (t->dtype == TD_ST_I64) {
                bad = write_le(f, (uint64_t)(int64_t)llrintf(t->values[j]), 8);
            } else {
                uint32_t u;
                memcpy(&u, &t->values[j], 4);
                bad = write_le(f, u, 4);
            }
        }
    }
    if (!bad) bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
    int close_bad = fclose(f) != 0;
    if (bad || close_bad) return td_fail(err, "%s: write failed: %s", path, strerror(errno));
    return 0;
}
