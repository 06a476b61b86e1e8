#include "data/td_data.h"

#include "core/td_rng.h"

#include <stdlib.h>
#include <string.h>

void td_dataset_synthetic(td_dataset *ds, td_shape shape, int num_classes, int size,
                          uint64_t seed) {
    memset(ds, 0, sizeof *ds);
    ds->n = size;
    ds->shape = shape;
    ds->num_classes = num_classes;
    ds->synthetic_seed = seed;
}

void td_dataset_free(td_dataset *ds) {
    free(ds->pixels);
    free(ds->values);
    free(ds->labels);
    free(ds->tokens);
    memset(ds, 0, sizeof *ds);
}

/* The per-channel constants of a normalisation, repeated over NORM_PERIOD values from a given
 * channel phase: loops over PERIOD-long runs then need no modulo per element and vectorise (a
 * modulo per element made a 3x224x224 sample cost 4 ns per value). 24 is a multiple of 1..4
 * channels and of an 8-float vector. */
#define NORM_PERIOD 24
typedef struct norm_run {
    float scale[NORM_PERIOD], shift[NORM_PERIOD];
} norm_run;

static void norm_run_at(norm_run *r, size_t first, int c, const float *scale, const float *shift) {
    for (int t = 0; t < NORM_PERIOD; t++) {
        int k = (int)((first + (size_t)t) % (size_t)c);
        r->scale[t] = scale[k];
        r->shift[t] = shift[k];
    }
}

/* dst[j] = p[j] · scale + shift of channel (first + j) mod c: uint8 pixels to normalised floats */
static void convert_pixels(const uint8_t *p, size_t n, size_t first, int c, const float *scale,
                           const float *shift, float *dst) {
    norm_run r;
    norm_run_at(&r, first, c, scale, shift);
    size_t j = 0;
    for (; j + NORM_PERIOD <= n; j += NORM_PERIOD)
        for (int t = 0; t < NORM_PERIOD; t++)
            dst[j + t] = (float)p[j + t] * r.scale[t] + r.shift[t];
    for (int t = 0; j < n; j++, t++) dst[j] = (float)p[j] * r.scale[t] + r.shift[t];
}

/* The same for float values (npy, csv) */
static void convert_values(const float *v, size_t n, int c, const float *scale, const float *shift,
                           float *dst) {
    norm_run r;
    norm_run_at(&r, 0, c, scale, shift);
    size_t j = 0;
    for (; j + NORM_PERIOD <= n; j += NORM_PERIOD)
        for (int t = 0; t < NORM_PERIOD; t++) dst[j + t] = v[j + t] * r.scale[t] + r.shift[t];
    for (int t = 0; j < n; j++, t++) dst[j] = v[j] * r.scale[t] + r.shift[t];
}

int td_dataset_sample(const td_dataset *ds, int i, const td_normalize *norm, float *dst) {
    size_t size = td_shape_size(ds->shape);
    int c = ds->shape.spatial ? ds->shape.c : 1;
    float scale[4], shift[4];
    /* per channel: (x·k - mean) / std as one multiply-add; k = 1/255 for uint8 data */
    float k = ds->values ? 1.0f : 1.0f / 255.0f;
    for (int j = 0; j < c; j++) {
        int q = norm->channels == 1 ? 0 : j;
        scale[j] = k / norm->std[q];
        shift[j] = -norm->mean[q] / norm->std[q];
    }
    if (ds->values) {
        convert_values(ds->values + (size_t)i * size, size, c, scale, shift, dst);
        return ds->labels[i];
    }
    if (ds->pixels) {
        convert_pixels(ds->pixels + (size_t)i * size, size, 0, c, scale, shift, dst);
        return ds->labels[i];
    }
    /* Synthetic: noise, plus a brighter band whose position depends on the label, so a model
     * can learn it and a benchmark exercises a real training signal. */
    uint64_t h = td_mix64(ds->synthetic_seed ^ td_mix64((uint64_t)i));
    int label = (int)(h % (uint64_t)ds->num_classes);
    size_t row = (size_t)ds->shape.w * ds->shape.c;
    size_t band = (size_t)(label * ds->shape.h / ds->num_classes) * row, band_end = band + row;
    /* bytes first, then the same conversion as real pixels: the loader thread shares the cores
     * with the ranks' training, so its cost per sample matters */
    enum { CHUNK = 4096 }; /* a multiple of 8: each td_mix64 gives 8 pixels */
    uint8_t px[CHUNK];
    for (size_t j0 = 0; j0 < size; j0 += CHUNK) {
        size_t m = size - j0 < CHUNK ? size - j0 : CHUNK;
        size_t j = 0;
        /* byte b of (r >> 1) & 0x7f.. is (uint8_t)(r >> 8b) >> 1: eight 7-bit pixels at once */
        for (; j + 8 <= m; j += 8) {
            uint64_t r = (td_mix64(h + j0 + j) >> 1) & 0x7f7f7f7f7f7f7f7full;
            for (int b = 0; b < 8; b++) px[j + (size_t)b] = (uint8_t)(r >> (8 * b));
        }
        if (j < m) {
            uint64_t r = (td_mix64(h + j0 + j) >> 1) & 0x7f7f7f7f7f7f7f7full;
            for (int b = 0; j + (size_t)b < m; b++) px[j + (size_t)b] = (uint8_t)(r >> (8 * b));
        }
        size_t lo = band > j0 ? band : j0, hi = band_end < j0 + m ? band_end : j0 + m;
        for (size_t j = lo; j < hi; j++) px[j - j0] |= 0x80;
        convert_pixels(px, m, j0, c, scale, shift, dst + j0);
    }
    return label;
}

int td_dataset_max_label(const td_dataset *ds) {
    if (!ds->labels) return ds->num_classes - 1;
    int max = 0;
    for (int i = 0; i < ds->n; i++)
        if (ds->labels[i] > max) max = ds->labels[i];
    return max;
}

int td_sampler_count(int n, int world, bool drop_last) {
    return drop_last ? n / world : (n + world - 1) / world;
}

void td_sampler_indices(int n, bool shuffle, uint64_t seed, int epoch, int rank, int world,
                        bool drop_last, int *out) {
    int *perm = td_malloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) perm[i] = i;
    if (shuffle) {
        td_rng rng;
        td_rng_seed_for(&rng, seed + (uint64_t)epoch, "sampler", 0);
        for (int i = n - 1; i > 0; i--) {
            int j = (int)td_rng_below(&rng, (uint64_t)i + 1);
            int t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
    }
    int per_rank = td_sampler_count(n, world, drop_last);
    for (int k = 0; k < per_rank; k++) {
        /* position in the padded sequence; padding repeats the permutation from its head */
        long pos = (long)k * world + rank;
        out[k] = perm[pos % n];
    }
    free(perm);
}
