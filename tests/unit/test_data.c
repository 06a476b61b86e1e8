/* The sampler's DistributedSampler semantics, the background loader's batches, the datasets'
 * normalisation and augmentation. The file formats' parsers are test_data_files.c's (the same
 * program, the ctest `data`). */
#include "data/td_data.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

Test(sampler, permutation_per_epoch) {
    int a[100], b[100], c[100];
    td_sampler_indices(100, true, 5, 0, 0, 1, false, a);
    td_sampler_indices(100, true, 5, 0, 0, 1, false, b);
    td_sampler_indices(100, true, 5, 1, 0, 1, false, c);
    int seen[100] = {0};
    for (int i = 0; i < 100; i++) seen[a[i]]++;
    for (int i = 0; i < 100; i++) cr_expect_eq(seen[i], 1, "index %d appears %d times", i, seen[i]);
    cr_expect(memcmp(a, b, sizeof a) == 0, "same seed and epoch give the same order");
    cr_expect(memcmp(a, c, sizeof a) != 0, "another epoch gives another order");
    td_sampler_indices(10, false, 5, 3, 0, 1, false, a);
    for (int i = 0; i < 10; i++) cr_expect_eq(a[i], i, "without shuffle: identity");
}

Test(sampler, padding_and_strided_ranks) {
    /* n = 10, world = 3: 4 per rank; the padded sequence is perm + perm[0:2];
     * rank r takes positions r, r+3, r+6, r+9 */
    int perm[10], r[3][4];
    td_sampler_indices(10, true, 9, 2, 0, 1, false, perm);
    cr_assert_eq(td_sampler_count(10, 3, false), 4);
    for (int k = 0; k < 3; k++) td_sampler_indices(10, true, 9, 2, k, 3, false, r[k]);
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 4; j++) {
            int pos = j * 3 + k;
            cr_expect_eq(r[k][j], perm[pos % 10], "rank %d item %d", k, j);
        }
    cr_expect_eq(td_sampler_count(10, 3, true), 3, "drop_last truncates to 9");
    int d[3];
    td_sampler_indices(10, true, 9, 2, 2, 3, true, d);
    for (int j = 0; j < 3; j++) cr_expect_eq(d[j], perm[j * 3 + 2]);
}

Test(loader, every_sample_once_normalised) {
    td_dataset ds;
    td_dataset_synthetic(&ds, td_shape_image(1, 2, 2), 3, 10, 77);
    td_normalize norm = {1, {0.5f}, {0.25f}};
    td_loader_config cfg = {
        .batch_size = 4, .shuffle = true, .seed = 3, .world = 1, .pad = true, .workers = 1};
    td_loader *ld = td_loader_create(&ds, &norm, NULL, &cfg);
    for (int epoch = 0; epoch < 2; epoch++) {
        int order[10];
        td_sampler_indices(10, true, 3, epoch, 0, 1, false, order);
        cr_assert_eq(td_loader_start_epoch(ld, epoch, 0), 3);
        td_batch b;
        int k = 0, sizes[3], nb = 0;
        while (td_loader_next(ld, &b)) {
            sizes[nb++] = b.n;
            for (int i = 0; i < b.n; i++, k++) {
                float px[4];
                int label = td_dataset_sample(&ds, order[k], &norm, px);
                cr_expect_eq(b.labels[i], label);
                for (int j = 0; j < 4; j++)
                    cr_expect(b.x[i * 4 + j] == px[j], "pixel %d of sample %d", j, k);
            }
        }
        cr_expect_eq(k, 10);
        cr_expect(nb == 3 && sizes[0] == 4 && sizes[1] == 4 && sizes[2] == 2);
    }
    /* resume inside an epoch: batch 2 of epoch 1 comes first */
    cr_assert_eq(td_loader_start_epoch(ld, 1, 2), 3);
    td_batch b;
    cr_assert(td_loader_next(ld, &b));
    cr_expect_eq(b.n, 2);
    cr_expect(!td_loader_next(ld, &b));
    /* abandoning an epoch half-way and starting another is safe */
    td_loader_start_epoch(ld, 0, 0);
    cr_assert(td_loader_next(ld, &b));
    td_loader_destroy(ld);
    td_dataset_free(&ds);
}

/* Several producer threads (num_workers) give exactly the batches one gives, and so does the
 * caller's own thread (num_workers 0), in order: across epochs, with augmentation, after a resume
 * inside an epoch and after an epoch abandoned while producers were mid-fill. */
Test(loader, workers_give_the_batches_one_thread_gives) {
    td_dataset ds;
    td_dataset_synthetic(&ds, td_shape_image(3, 9, 7), 5, 203, 13);
    td_normalize norm = {3, {0.5f, 0.25f, 0.75f}, {0.5f, 2.0f, 0.125f}};
    td_augment aug = {.crop_padding = 2, .hflip = true};
    size_t size = td_shape_size(ds.shape);
    td_loader_config one = {
        .batch_size = 6, .shuffle = true, .seed = 9, .world = 1, .pad = true, .workers = 1};
    td_loader_config many = one, none = one;
    many.workers = 5;
    none.workers = 0;
    td_loader *a = td_loader_create(&ds, &norm, &aug, &one);
    td_loader *b = td_loader_create(&ds, &norm, &aug, &many);
    td_loader *c = td_loader_create(&ds, &norm, &aug, &none);
    cr_assert(td_loader_threads(a) == 1 && td_loader_threads(b) == 5 && td_loader_threads(c) == 0);
    /* epoch, first batch, batches to take (-1: all) */
    static const int plan[][3] = {{0, 0, -1}, {1, 0, 3}, {1, 7, -1}, {2, 0, 1}, {2, 0, -1}};
    for (size_t p = 0; p < sizeof plan / sizeof plan[0]; p++) {
        int na = td_loader_start_epoch(a, plan[p][0], plan[p][1]);
        cr_assert_eq(td_loader_start_epoch(b, plan[p][0], plan[p][1]), na);
        cr_assert_eq(td_loader_start_epoch(c, plan[p][0], plan[p][1]), na);
        td_batch x, y, z;
        int taken = 0;
        while ((plan[p][2] < 0 || taken < plan[p][2]) && td_loader_next(a, &x)) {
            cr_assert(td_loader_next(b, &y), "step %zu: batch %d missing", p, taken);
            cr_assert(td_loader_next(c, &z), "step %zu: batch %d missing inline", p, taken);
            cr_assert(x.n == y.n && x.n == z.n);
            cr_expect(memcmp(x.labels, y.labels, (size_t)x.n * sizeof(int32_t)) == 0 &&
                          memcmp(x.labels, z.labels, (size_t)x.n * sizeof(int32_t)) == 0,
                      "step %zu batch %d: labels", p, taken);
            cr_expect(memcmp(x.x, y.x, (size_t)x.n * size * sizeof(float)) == 0 &&
                          memcmp(x.x, z.x, (size_t)x.n * size * sizeof(float)) == 0,
                      "step %zu batch %d: samples", p, taken);
            taken++;
        }
        if (plan[p][2] < 0) {
            cr_expect_eq(taken, na - plan[p][1], "step %zu", p);
            cr_expect(!td_loader_next(b, &y), "step %zu: an extra batch", p);
            cr_expect(!td_loader_next(c, &z), "step %zu: an extra batch inline", p);
        }
    }
    td_loader_destroy(a);
    td_loader_destroy(b);
    td_loader_destroy(c);
    td_dataset_free(&ds);
}

/* Per-channel normalisation of a 3-channel sample larger than the generator's 4096-value chunk
 * (a chunk boundary falls mid-pixel): undoing each value's normalisation with its own channel's
 * constants must give a whole pixel value, 128 and up in the label's bright row and below it
 * elsewhere. A value normalised with a neighbouring channel's constants gives a fraction. */
Test(dataset, synthetic_pixels_take_their_own_channels_normalisation) {
    td_dataset ds;
    int h = 40, w = 80;
    td_dataset_synthetic(&ds, td_shape_image(3, h, w), 7, 20, 3);
    td_normalize norm = {3, {0.1f, 0.5f, 0.9f}, {0.3f, 0.7f, 0.11f}};
    size_t size = td_shape_size(ds.shape);
    cr_assert_gt(size, 8192);
    float *x = malloc(size * sizeof(float));
    for (int i = 0; i < 4; i++) {
        int label = td_dataset_sample(&ds, i, &norm, x);
        int band = label * h / 7, bad = 0;
        for (size_t j = 0; j < size && bad < 5; j++) {
            int k = (int)(j % 3);
            float p = (x[j] * norm.std[k] + norm.mean[k]) * 255.0f;
            bool bright = (int)(j / ((size_t)w * 3)) == band;
            bool whole = fabsf(p - roundf(p)) < 0.02f;
            bool range = bright ? p > 127.5f && p < 255.5f : p > -0.5f && p < 127.5f;
            if (!whole || !range) {
                bad++;
                cr_expect(false, "sample %d value %zu (channel %d): pixel %.3f%s", i, j, k,
                          (double)p, bright ? " in the bright row" : "");
            }
        }
    }
    free(x);
    td_dataset_free(&ds);
}

/* Float data (npy, csv) is normalised per channel as well: (x - mean[c]) / std[c]. */
Test(dataset, float_values_take_their_own_channels_normalisation) {
    td_dataset ds = {0};
    ds.n = 1;
    ds.shape = td_shape_image(3, 5, 7); /* 105 values: whole 24-value runs and a tail */
    ds.values = malloc(105 * sizeof(float));
    ds.labels = calloc(1, sizeof(int32_t));
    for (int j = 0; j < 105; j++) ds.values[j] = (float)j * 0.25f - 3.0f;
    td_normalize norm = {3, {0.1f, 0.5f, 0.9f}, {0.3f, 0.7f, 0.11f}};
    float x[105];
    td_dataset_sample(&ds, 0, &norm, x);
    for (int j = 0; j < 105; j++) {
        int k = j % 3;
        float want = (ds.values[j] - norm.mean[k]) / norm.std[k];
        cr_expect(fabsf(x[j] - want) <= 1e-5f * fmaxf(1.0f, fabsf(want)), "value %d: %g, want %g",
                  j, (double)x[j], (double)want);
    }
    td_dataset_free(&ds);
}

/* ---- augmentation --------------------------------------------------------------------- */

Test(augment, crops_and_flips_are_shifts_and_mirrors) {
    td_dataset ds;
    td_dataset_synthetic(&ds, td_shape_image(1, 6, 6), 3, 8, 21);
    td_normalize norm = {1, {0.25f}, {0.5f}};
    td_augment aug = {.crop_padding = 2, .hflip = true};
    td_loader_config cfg = {.batch_size = 8, .seed = 4, .world = 1, .pad = true};
    td_loader *ld = td_loader_create(&ds, &norm, &aug, &cfg);
    td_loader *again = td_loader_create(&ds, &norm, &aug, &cfg);
    td_loader_start_epoch(ld, 0, 0);
    td_loader_start_epoch(again, 0, 0);
    td_batch b, c;
    cr_assert(td_loader_next(ld, &b) && td_loader_next(again, &c));
    cr_expect(memcmp(b.x, c.x, 8 * 36 * sizeof(float)) == 0, "same seed, same augmentation");
    float zero = -0.25f / 0.5f; /* a padded (0) pixel after normalisation */
    int changed = 0;
    for (int i = 0; i < 8; i++) {
        float src[36];
        td_dataset_sample(&ds, i, &norm, src);
        bool found = false;
        for (int flip = 0; flip < 2 && !found; flip++)
            for (int dy = -2; dy <= 2 && !found; dy++)
                for (int dx = -2; dx <= 2 && !found; dx++) {
                    bool same = true;
                    for (int y = 0; y < 6 && same; y++)
                        for (int x = 0; x < 6 && same; x++) {
                            int sy = y + dy, sx = (flip ? 5 - x : x) + dx;
                            float want =
                                sy < 0 || sy > 5 || sx < 0 || sx > 5 ? zero : src[sy * 6 + sx];
                            same = b.x[i * 36 + y * 6 + x] == want;
                        }
                    found = same;
                    if (found && (flip || dy || dx)) changed++;
                }
        cr_expect(found, "sample %d is a padded crop and/or mirror of the original", i);
    }
    cr_expect(changed >= 4, "most of 8 samples are moved or flipped (%d were)", changed);
    td_loader_destroy(ld);
    td_loader_destroy(again);
    td_dataset_free(&ds);
}

Test(loader, ranks_share_an_epoch_like_distributed_sampler) {
    /* 10 samples, world 3, batch 2: training pads to 4 per rank (12 = 10 + the first 2 of the
     * permutation again); evaluation gives 4, 3, 3 and covers each sample exactly once */
    td_dataset ds;
    td_dataset_synthetic(&ds, td_shape_flat(1), 10, 10, 5);
    td_normalize norm = {1, {0}, {1}};
    int seen[10] = {0}, total = 0;
    for (int r = 0; r < 3; r++) {
        td_loader_config cfg = {
            .batch_size = 2, .shuffle = true, .seed = 8, .rank = r, .world = 3, .pad = true};
        cr_expect_eq(td_loader_batches(&ds, &cfg), 2);
        td_loader_config eval = cfg;
        eval.pad = false;
        eval.shuffle = false;
        td_loader *ld = td_loader_create(&ds, &norm, NULL, &eval);
        td_loader_start_epoch(ld, 0, 0);
        td_batch b;
        while (td_loader_next(ld, &b))
            for (int i = 0; i < b.n; i++) {
                /* synthetic labels identify the sample here: find it by its label and value */
                total++;
                for (int k = 0; k < 10; k++) {
                    float x;
                    if (td_dataset_sample(&ds, k, &norm, &x) == b.labels[i] && x == b.x[i]) {
                        seen[k]++;
                        break;
                    }
                }
            }
        td_loader_destroy(ld);
    }
    cr_expect_eq(total, 10, "evaluation covers 10 samples in all");
    for (int k = 0; k < 10; k++) cr_expect_eq(seen[k], 1, "sample %d seen %d times", k, seen[k]);
    td_dataset_free(&ds);
}

/* PyTorch's DistributedSampler, written out independently of td_sampler_indices: the epoch's
 * permutation, then with drop_last the first floor(N/W)·W of it, otherwise padded to ceil(N/W)·W
 * by repeating it from its head, then every W-th from rank r. */
static int reference_partition(const int *perm, int n, int world, int rank, bool drop_last,
                               int *out) {
    int per = drop_last && n % world ? (n - world + world - 1) / world : (n + world - 1) / world;
    int total = per * world, padded[64], k = 0;
    for (int i = 0; i < total; i++) padded[i] = perm[i % n];
    for (int i = rank; i < total; i += world) out[k++] = padded[i];
    return k;
}

Test(sampler, partitions_match_distributed_sampler) {
    for (int n = 10; n <= 12; n++)
        for (int world = 1; world <= 4; world++)
            for (int drop = 0; drop <= 1; drop++) {
                int perm[16];
                td_sampler_indices(n, true, 77, 3, 0, 1, false, perm);
                int covered[16] = {0};
                for (int r = 0; r < world; r++) {
                    int want[16], got[16];
                    int count = reference_partition(perm, n, world, r, drop, want);
                    cr_assert_eq(td_sampler_count(n, world, drop), count,
                                 "N=%d world=%d drop_last=%d: count", n, world, drop);
                    td_sampler_indices(n, true, 77, 3, r, world, drop, got);
                    for (int k = 0; k < count; k++) {
                        cr_expect_eq(got[k], want[k], "N=%d world=%d drop_last=%d rank %d item %d",
                                     n, world, drop, r, k);
                        covered[got[k]]++;
                    }
                }
                /* every index appears; with padding a few twice, with drop_last a few never */
                int seen = 0;
                for (int i = 0; i < n; i++) seen += covered[i] > 0;
                cr_expect_eq(seen, drop ? (n / world) * world : n);
            }
}

Test(loader, evaluation_split_covers_each_index_once) {
    td_normalize norm = {1, {0}, {1}};
    for (int n = 10; n <= 12; n++)
        for (int world = 1; world <= 4; world++) {
            td_dataset ds;
            td_dataset_synthetic(&ds, td_shape_flat(1), 2, n, 1);
            int total = 0;
            for (int r = 0; r < world; r++) {
                td_loader_config cfg = {.batch_size = 3, .rank = r, .world = world, .pad = false};
                td_loader *ld = td_loader_create(&ds, &norm, NULL, &cfg);
                td_loader_start_epoch(ld, 0, 0);
                td_batch b;
                while (td_loader_next(ld, &b)) total += b.n;
                td_loader_destroy(ld);
            }
            cr_expect_eq(total, n, "N=%d world=%d: evaluation saw %d samples", n, world, total);
            td_dataset_free(&ds);
        }
}
