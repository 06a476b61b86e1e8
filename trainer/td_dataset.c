#include "td_data.h"

#include "td_rng.h"

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
    free(ds->labels);
    memset(ds, 0, sizeof *ds);
}

int td_dataset_sample(const td_dataset *ds, int i, uint8_t *dst) {
    size_t size = td_shape_size(ds->shape);
    if (ds->pixels) {
        memcpy(dst, ds->pixels + (size_t)i * size, size);
        return ds->labels[i];
    }
    /* Synthetic: noise, plus a brighter band whose position depends on the label, so a model
     * can learn it and a benchmark exercises a real training signal. */
    uint64_t h = td_mix64(ds->synthetic_seed ^ td_mix64((uint64_t)i));
    int label = (int)(h % (uint64_t)ds->num_classes);
    for (size_t j = 0; j < size; j += 8) {
        uint64_t r = td_mix64(h + j);
        for (size_t k = 0; k < 8 && j + k < size; k++) dst[j + k] = (uint8_t)(r >> (8 * k)) >> 1;
    }
    size_t row = (size_t)ds->shape.w * ds->shape.c;
    int band = label * ds->shape.h / ds->num_classes;
    for (size_t k = 0; k < row; k++) dst[(size_t)band * row + k] |= 0x80;
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
