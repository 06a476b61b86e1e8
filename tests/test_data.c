/* IDX parsing (plain and gzipped, and every way such a file goes wrong), the sampler's
 * DistributedSampler semantics, and the background loader's batches. */
#include "td_data.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* An IDX image file of n images h x w with pixel value (i*16 + j) and a label file. */
static size_t make_images(uint8_t *buf, uint32_t magic, uint32_t n, uint32_t h, uint32_t w,
                          uint32_t data_images) {
    uint32_t head[4] = {magic, n, h, w};
    for (int i = 0; i < 4; i++) {
        buf[4 * i] = (uint8_t)(head[i] >> 24);
        buf[4 * i + 1] = (uint8_t)(head[i] >> 16);
        buf[4 * i + 2] = (uint8_t)(head[i] >> 8);
        buf[4 * i + 3] = (uint8_t)head[i];
    }
    size_t len = 16;
    for (uint32_t i = 0; i < data_images; i++)
        for (uint32_t j = 0; j < h * w; j++) buf[len++] = (uint8_t)(i * 16 + j);
    return len;
}

static size_t make_labels(uint8_t *buf, uint32_t n, uint32_t data_labels) {
    uint8_t head[8] = {
        0, 0, 8, 1, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
    memcpy(buf, head, 8);
    for (uint32_t i = 0; i < data_labels; i++) buf[8 + i] = (uint8_t)(i % 3);
    return 8 + data_labels;
}

static char images_path[512], labels_path[512];

static void write_pair(size_t ilen, const uint8_t *ibuf, size_t llen, const uint8_t *lbuf,
                       bool gz) {
    strcpy(images_path,
           gz ? test_write_gz("img.gz", ibuf, ilen) : test_write_file("img.idx", ibuf, ilen));
    strcpy(labels_path,
           gz ? test_write_gz("lab.gz", lbuf, llen) : test_write_file("lab.idx", lbuf, llen));
}

static void expect_load_error(const char *fragment) {
    td_dataset ds;
    td_err err = {{0}};
    cr_assert_neq(td_dataset_load_idx(&ds, images_path, labels_path, &err), 0);
    cr_expect(strstr(err.msg, fragment), "message \"%s\" lacks \"%s\"", err.msg, fragment);
}

static void check_valid(bool gz) {
    uint8_t ib[256], lb[64];
    size_t il = make_images(ib, 0x803, 3, 2, 2, 3), ll = make_labels(lb, 3, 3);
    write_pair(il, ib, ll, lb, gz);
    td_dataset ds;
    td_err err = {{0}};
    cr_assert_eq(td_dataset_load_idx(&ds, images_path, labels_path, &err), 0, "%s", err.msg);
    cr_expect_eq(ds.n, 3);
    cr_expect(ds.shape.c == 1 && ds.shape.h == 2 && ds.shape.w == 2);
    uint8_t px[4];
    cr_expect_eq(td_dataset_sample(&ds, 2, px), 2);
    cr_expect(px[0] == 32 && px[3] == 35);
    td_dataset_free(&ds);
}

Test(idx, loads_plain) {
    check_valid(false);
}
Test(idx, loads_gzip) {
    check_valid(true);
}

Test(idx, wrong_magic) {
    uint8_t ib[256], lb[64];
    size_t il = make_images(ib, 0x801, 3, 2, 2, 3), ll = make_labels(lb, 3, 3);
    write_pair(il, ib, ll, lb, true);
    expect_load_error("not an IDX image file: magic number is 0x00000801, expected 0x00000803");
}

Test(idx, truncated_data) {
    uint8_t ib[256], lb[64];
    size_t il = make_images(ib, 0x803, 3, 2, 2, 2), ll = make_labels(lb, 3, 3);
    write_pair(il, ib, ll, lb, false);
    expect_load_error("file is truncated: the image data needs 12 bytes but only 8 are there");
}

Test(idx, truncated_gzip_stream) {
    uint8_t ib[4096], lb[64];
    size_t il = make_images(ib, 0x803, 200, 4, 4, 200), ll = make_labels(lb, 3, 3);
    write_pair(il, ib, ll, lb, true);
    /* cut the compressed file in half */
    char *whole = test_read_file(images_path);
    FILE *f = fopen(images_path, "rb");
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fclose(f);
    strcpy(images_path, test_write_file("cut.gz", whole, (size_t)len / 2));
    free(whole);
    expect_load_error("truncated");
}

Test(idx, truncated_header) {
    uint8_t ib[256], lb[64];
    make_images(ib, 0x803, 3, 2, 2, 3);
    size_t ll = make_labels(lb, 3, 3);
    write_pair(10, ib, ll, lb, false);
    expect_load_error("the IDX header needs 16 bytes but only 10 are there");
}

Test(idx, label_count_mismatch) {
    uint8_t ib[256], lb[64];
    size_t il = make_images(ib, 0x803, 3, 2, 2, 3), ll = make_labels(lb, 4, 4);
    write_pair(il, ib, ll, lb, true);
    expect_load_error("holds 4 labels but");
}

Test(idx, trailing_bytes) {
    uint8_t ib[256], lb[64];
    size_t il = make_images(ib, 0x803, 2, 2, 2, 3), ll = make_labels(lb, 2, 2);
    write_pair(il, ib, ll, lb, false);
    expect_load_error("has data after the samples its header declares");
}

Test(idx, missing_file) {
    strcpy(images_path, "/nonexistent/images.idx");
    strcpy(labels_path, "/nonexistent/labels.idx");
    expect_load_error("/nonexistent/images.idx: cannot open: No such file or directory");
}

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
    td_loader *ld = td_loader_create(&ds, &norm, 4, true, false, 3);
    for (int epoch = 0; epoch < 2; epoch++) {
        int order[10];
        td_sampler_indices(10, true, 3, epoch, 0, 1, false, order);
        cr_assert_eq(td_loader_start_epoch(ld, epoch, 0), 3);
        td_batch b;
        int k = 0, sizes[3], nb = 0;
        while (td_loader_next(ld, &b)) {
            sizes[nb++] = b.n;
            for (int i = 0; i < b.n; i++, k++) {
                uint8_t px[4];
                int label = td_dataset_sample(&ds, order[k], px);
                cr_expect_eq(b.labels[i], label);
                for (int j = 0; j < 4; j++) {
                    float want = ((float)px[j] / 255.0f - 0.5f) / 0.25f;
                    cr_expect(fabsf(b.x[i * 4 + j] - want) < 1e-5f, "pixel %d of sample %d", j, k);
                }
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
