/* The valid data files of fuzz_data_files.h, built byte by byte so that their layout is plain to
 * see next to the formats' loaders (trainer/data). */
#include "fuzz_data_files.h"

#include "fuzz_util.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static void put_be32(unsigned char *p, unsigned v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static void write_in(const char *dir, const char *name, const void *data, size_t n) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    fuzz_write_file(path, data, n);
}

static void write_gz(const char *dir, const char *name, const void *data, size_t n) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    gzFile f = gzopen(path, "wb");
    if (!f || gzwrite(f, data, (unsigned)n) != (int)n || gzclose(f) != Z_OK) {
        fprintf(stderr, "fuzz: cannot write %s\n", path);
        exit(1);
    }
}

/* A .npy file of format 1.0 with the header dict given (padded as NumPy pads it). */
static void write_npy(const char *dir, const char *name, const char *dict, const void *data,
                      size_t n) {
    unsigned char buf[512];
    size_t dl = strlen(dict), total = 10 + dl + 1;
    size_t pad = (64 - total % 64) % 64;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    size_t hlen = dl + pad + 1;
    buf[8] = (unsigned char)hlen, buf[9] = (unsigned char)(hlen >> 8);
    memcpy(buf + 10, dict, dl);
    memset(buf + 10 + dl, ' ', pad);
    buf[10 + dl + pad] = '\n';
    memcpy(buf + 10 + hlen, data, n);
    write_in(dir, name, buf, 10 + hlen + n);
}

void fuzz_data_files(const char *dir) {
    unsigned char images[16 + 3 * 16], labels[8 + 3];
    put_be32(images, 0x803), put_be32(images + 4, 3), put_be32(images + 8, 4);
    put_be32(images + 12, 4);
    for (int i = 0; i < 48; i++) images[16 + i] = (unsigned char)(i * 5);
    put_be32(labels, 0x801), put_be32(labels + 4, 3);
    labels[8] = 0, labels[9] = 1, labels[10] = 2;
    write_in(dir, "images.idx", images, sizeof images);
    write_in(dir, "labels.idx", labels, sizeof labels);
    write_gz(dir, "images.idx.gz", images, sizeof images);
    write_gz(dir, "labels.idx.gz", labels, sizeof labels);

    long long y[3] = {2, 0, 1}; /* little-endian on every machine this runs on (x86-64) */
    write_npy(dir, "images.npy", "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4, 4), }",
              images + 16, 48);
    write_npy(dir, "labels.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }", y,
              sizeof y);

    static const char csv[] = "label,a,b\n0,0.5,1.5\n1,2,-3\n2,1e3,0\n";
    write_in(dir, "data.csv", csv, sizeof csv - 1);

    static unsigned char cifar[2 * 3073];
    for (size_t i = 0; i < sizeof cifar; i++) cifar[i] = (unsigned char)(i * 7);
    cifar[0] = 3, cifar[3073] = 9;
    write_in(dir, "cifar.bin", cifar, sizeof cifar);
}
