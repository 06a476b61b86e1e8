/* The data files a dataset is read from: IDX (plain and gzipped, and every way such a file goes
 * wrong), .npy, CIFAR-10's binary records and CSV. Apart from test_data.c's sampler, loader and
 * augmentation: these are the parsers, one format each; both run as the ctest `data`. */
#include "data/td_data.h"
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
    float px[4];
    td_normalize raw = {1, {0}, {1}};
    cr_expect_eq(td_dataset_sample(&ds, 2, &raw, px), 2);
    cr_expect(fabsf(px[0] - 32 / 255.0f) < 1e-7f && fabsf(px[3] - 35 / 255.0f) < 1e-7f,
              "x/255 with mean 0, std 1");
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

/* ---- .npy ---------------------------------------------------------------------------- */

/* A .npy v1 file with the given dict and payload. */
static const char *npy_file(const char *name, const char *dict, const void *data, size_t len) {
    char header[256];
    int hl = snprintf(header, sizeof header, "%s", dict);
    int total = 10 + hl + 1;
    int pad = (64 - total % 64) % 64;
    size_t size = (size_t)total + (size_t)pad + len;
    unsigned char *buf = malloc(size);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)((hl + pad + 1) & 0xFF);
    buf[9] = (unsigned char)((hl + pad + 1) >> 8);
    memcpy(buf + 10, header, (size_t)hl);
    memset(buf + 10 + hl, ' ', (size_t)pad);
    buf[10 + hl + pad] = '\n';
    memcpy(buf + total + pad, data, len);
    const char *path = test_write_file(name, buf, size);
    free(buf);
    return path;
}

static char x_path[512], y_path[512];

static void npy_pair(const char *xdict, const void *x, size_t xl, const char *ydict, const void *y,
                     size_t yl) {
    strcpy(x_path, npy_file("x.npy", xdict, x, xl));
    strcpy(y_path, npy_file("y.npy", ydict, y, yl));
}

static void expect_npy_error(bool nhwc, const char *fragment) {
    td_dataset ds;
    td_err err = {{0}};
    cr_assert_neq(td_dataset_load_npy(&ds, x_path, y_path, nhwc, &err), 0);
    cr_expect(strstr(err.msg, fragment), "message \"%s\" lacks \"%s\"", err.msg, fragment);
}

Test(npy, uint8_nchw_is_transposed_to_channels_last) {
    /* 2 images, 3 channels, 1x2: x[n, c, 0, w] = 100n + 10c + w */
    uint8_t x[12];
    for (int n = 0; n < 2; n++)
        for (int c = 0; c < 3; c++)
            for (int w = 0; w < 2; w++) x[n * 6 + c * 2 + w] = (uint8_t)(100 * n + 10 * c + w);
    int64_t y[2] = {3, 1};
    npy_pair("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3, 1, 2), }", x, sizeof x,
             "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }", y, sizeof y);
    td_dataset ds;
    td_err err = {{0}};
    cr_assert_eq(td_dataset_load_npy(&ds, x_path, y_path, false, &err), 0, "%s", err.msg);
    cr_expect(ds.n == 2 && ds.shape.c == 3 && ds.shape.h == 1 && ds.shape.w == 2);
    /* channels last: image 1, pixel w=1, channel 2 = 100 + 20 + 1 */
    cr_expect_eq(ds.pixels[6 + 1 * 3 + 2], 121);
    cr_expect_eq(ds.labels[0], 3);
    cr_expect_eq(ds.num_classes, 4);
    td_dataset_free(&ds);
}

Test(npy, float32_nhwc_and_flat) {
    float x[8] = {0.5f, -1, 2, 3, 4, 5, 6, 7};
    int32_t y[2] = {0, 1};
    npy_pair("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 1, 2), }", x, sizeof x,
             "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", y, sizeof y);
    td_dataset ds;
    td_err err = {{0}};
    cr_assert_eq(td_dataset_load_npy(&ds, x_path, y_path, true, &err), 0, "%s", err.msg);
    cr_expect(ds.values && ds.shape.c == 2 && ds.shape.h == 2 && ds.shape.w == 1);
    cr_expect_eq(ds.values[1], -1.0f, "NHWC is already channels last");
    td_dataset_free(&ds);
    npy_pair("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }", x, sizeof x,
             "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", y, sizeof y);
    cr_assert_eq(td_dataset_load_npy(&ds, x_path, y_path, false, &err), 0, "%s", err.msg);
    cr_expect(!ds.shape.spatial && ds.shape.c == 4, "[N, F] gives flat features");
    td_dataset_free(&ds);
}

Test(npy, malformed) {
    uint8_t x[8] = {0};
    int64_t y[2] = {0, 1};
    const char *yd = "{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }";
    npy_pair("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 2), }", x, 6, yd, y,
             sizeof y);
    expect_npy_error(false, "file is truncated: the array needs 8 bytes but only 6");
    npy_pair("{'descr': '|u1', 'fortran_order': True, 'shape': (2, 2, 2), }", x, 8, yd, y,
             sizeof y);
    expect_npy_error(false, "Fortran-ordered");
    npy_pair("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 1), }", x, 8, yd, y, sizeof y);
    expect_npy_error(false, "dtype '<f8' is not supported");
    npy_pair("{'descr': '|u1', 'fortran_order': False, 'shape': (4, 2), }", x, 8, yd, y, sizeof y);
    expect_npy_error(false, "has 2 labels");
    npy_pair("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 4), }", x, 8,
             "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", y, 8);
    expect_npy_error(false, "labels must be a 1-D integer array");
    strcpy(x_path, test_write_file("bad.npy", "NUMPY\x01\x00", 7));
    expect_npy_error(false, "not a .npy file");
}

/* ---- CIFAR-10 -------------------------------------------------------------------------- */

Test(cifar10, records_and_errors) {
    static uint8_t rec[2 * 3073];
    for (int r = 0; r < 2; r++) {
        rec[r * 3073] = (uint8_t)(7 + r);
        for (int c = 0; c < 3; c++)
            for (int p = 0; p < 1024; p++)
                rec[r * 3073 + 1 + c * 1024 + p] = (uint8_t)(c * 50 + p % 7);
    }
    const char *files[2];
    char a[512], b[512];
    strcpy(a, test_write_file("c1.bin", rec, 3073));
    strcpy(b, test_write_file("c2.bin", rec + 3073, 3073));
    files[0] = a, files[1] = b;
    td_dataset ds;
    td_err err = {{0}};
    cr_assert_eq(td_dataset_load_cifar10(&ds, files, 2, &err), 0, "%s", err.msg);
    cr_expect(ds.n == 2 && ds.shape.c == 3 && ds.shape.h == 32 && ds.labels[1] == 8);
    /* pixel 9 of image 0, green: 50 + 9 % 7 */
    cr_expect_eq(ds.pixels[9 * 3 + 1], 52);
    td_dataset_free(&ds);
    strcpy(a, test_write_file("short.bin", rec, 3000));
    files[0] = a;
    cr_assert_neq(td_dataset_load_cifar10(&ds, files, 1, &err), 0);
    cr_expect(strstr(err.msg, "3000 bytes is not a whole number of CIFAR-10 records"), "%s",
              err.msg);
    rec[0] = 12;
    strcpy(a, test_write_file("label.bin", rec, 3073));
    cr_assert_neq(td_dataset_load_cifar10(&ds, files, 1, &err), 0);
    cr_expect(strstr(err.msg, "record 0 has label 12"), "%s", err.msg);
}

/* ---- CSV ----------------------------------------------------------------------------- */

static void expect_csv(const char *text, bool header, int label_column, const char *fragment) {
    const char *path = test_write_file("d.csv", text, strlen(text));
    td_dataset ds;
    td_err err = {{0}};
    int rc = td_dataset_load_csv(&ds, path, label_column, header, &err);
    if (!fragment) {
        cr_assert_eq(rc, 0, "%s", err.msg);
        td_dataset_free(&ds);
        return;
    }
    cr_assert_neq(rc, 0, "accepted: %s", text);
    cr_expect(strstr(err.msg, fragment), "message \"%s\" lacks \"%s\"", err.msg, fragment);
}

Test(csv, parses_and_reports_lines) {
    const char *ok = "label,a,b\n1,0.5,2\n0,-1e-3,3\r\n\n2,4,5\n";
    const char *path = test_write_file("ok.csv", ok, strlen(ok));
    td_dataset ds;
    td_err err = {{0}};
    cr_assert_eq(td_dataset_load_csv(&ds, path, 0, true, &err), 0, "%s", err.msg);
    cr_expect(ds.n == 3 && !ds.shape.spatial && ds.shape.c == 2 && ds.num_classes == 3);
    cr_expect(ds.values[2] == -1e-3f && ds.labels[2] == 2);
    td_dataset_free(&ds);
    expect_csv("a,b,label\n1,2,0\n", true, 2, NULL);
    expect_csv("1,2,3\n0,1\n", false, 0, "d.csv:2: 2 columns, but the first row has 3");
    expect_csv("1,2,3\n0,x1,2\n", false, 0, "d.csv:2: column 2: \"x1\" is not a number");
    expect_csv("1.5,2,3\n", false, 0, "d.csv:1: label \"1.5\" in column 1 is not a class index");
    expect_csv("", false, 0, "no data rows");
    expect_csv("1,2\n", false, 5, "expected a label column (5)");
}
