/* The safetensors format, read and written by our own code: an 8-byte little-endian header
 * length, a JSON header {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]},
 * "__metadata__": {...}}, then the raw little-endian tensor bytes. Every way a file can lie
 * (truncated, header beyond the file, offsets out of range or overlapping, sizes that disagree
 * with the shape, unknown dtypes, a header that is not JSON) is an error naming the file and
 * the tensor. */
#ifndef TD_SAFETENSORS_H
#define TD_SAFETENSORS_H

#include "base/td_error.h"
#include "core/td_tensor.h"

#include <stddef.h>
#include <stdint.h>

/* Element types read and converted to float32: F32, F64, F16, BF16, I64, I32 (and written: F32,
 * I64). */
typedef enum td_st_dtype {
    TD_ST_F32,
    TD_ST_F64,
    TD_ST_F16,
    TD_ST_BF16,
    TD_ST_I64,
    TD_ST_I32
} td_st_dtype;

typedef struct td_st_tensor {
    char name[TD_NAME_MAX + 32];
    td_st_dtype dtype;
    int ndim;
    int64_t dims[TD_MAX_DIMS];
    size_t count;        /* elements */
    const uint8_t *data; /* into the file's bytes (read) or the caller's floats (write) */
} td_st_tensor;

typedef struct td_safetensors {
    uint8_t *bytes; /* the whole file */
    size_t len;
    int n;
    td_st_tensor *tensors;
    char *metadata_json; /* "__metadata__" as compact JSON, or NULL */
} td_safetensors;

int td_safetensors_read(td_safetensors *st, const char *path, td_err *err);
/* The same from len bytes in memory (copied), named `name` in messages: a file's contents that
 * arrived some other way, and the fuzzer's input (tests/fuzz). */
int td_safetensors_parse(td_safetensors *st, const char *name, const void *bytes, size_t len,
                         td_err *err);
void td_safetensors_free(td_safetensors *st);
const td_st_tensor *td_safetensors_find(const td_safetensors *st, const char *name);
/* Converts a tensor's elements to float32 into out (count floats). */
void td_safetensors_to_float(const td_st_tensor *t, float *out);

/* A tensor to write: float32 values in memory, stored as dtype (TD_ST_F32 or TD_ST_I64). */
typedef struct td_st_out {
    const char *name;
    td_st_dtype dtype;
    int ndim;
    const int *dims;
    const float *values;
} td_st_out;

/* Writes the tensors (and optional metadata, a JSON object text) to path and fsyncs it. */
int td_safetensors_write(const char *path, const td_st_out *tensors, int n,
                         const char *metadata_json, td_err *err);

#endif
