/* CIFAR-10 binary batches (data_batch_1.bin ... test_batch.bin): 3073-byte records, a label byte
 * then the 32x32 red, green and blue planes; stored here channels-last like every image. */
#include "data/td_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CIFAR_SIDE   32
#define CIFAR_PIXELS (CIFAR_SIDE * CIFAR_SIDE)
#define CIFAR_RECORD (1 + 3 * CIFAR_PIXELS)

/* Every record's label byte, read where it lies (3 KB apart): cheap next to the pixels. */
int td_dataset_probe_cifar10(const char *const *files, int n_files, td_data_probe *p, td_err *err) {
    if (n_files < 1 || n_files > 64)
        return td_fail(err, "expected 1 to 64 CIFAR-10 batch files, got %d", n_files);
    p->n = 0;
    p->max_label = 0;
    p->shape = td_shape_image(3, CIFAR_SIDE, CIFAR_SIDE);
    for (int i = 0; i < n_files; i++) {
        FILE *f = fopen(files[i], "rb");
        if (!f) return td_fail(err, "%s: cannot open: %s", files[i], strerror(errno));
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        if (len <= 0 || len % CIFAR_RECORD != 0) {
            fclose(f);
            return td_fail(err,
                           "%s: %ld bytes is not a whole number of CIFAR-10 records (%d bytes "
                           "each: a label and 3x32x32 pixels); truncated or another format?",
                           files[i], len, CIFAR_RECORD);
        }
        for (long r = 0; r < len / CIFAR_RECORD; r++) {
            int label = fseek(f, r * CIFAR_RECORD, SEEK_SET) == 0 ? fgetc(f) : EOF;
            if (label == EOF || label > 9) {
                fclose(f);
                if (label == EOF) return td_fail(err, "%s: read error at record %ld", files[i], r);
                return td_fail(err,
                               "%s: record %ld has label %d; CIFAR-10 labels are 0..9 (is this a "
                               "CIFAR-100 file?)",
                               files[i], r, label);
            }
            if (label > p->max_label) p->max_label = label;
        }
        fclose(f);
        p->n += (int)(len / CIFAR_RECORD);
    }
    return 0;
}

int td_dataset_load_cifar10(td_dataset *ds, const char *const *files, int n_files, td_err *err) {
    memset(ds, 0, sizeof *ds);
    size_t total = 0, sizes[64];
    if (n_files < 1 || n_files > 64)
        return td_fail(err, "expected 1 to 64 CIFAR-10 batch files, got %d", n_files);
    for (int i = 0; i < n_files; i++) {
        FILE *f = fopen(files[i], "rb");
        if (!f) return td_fail(err, "%s: cannot open: %s", files[i], strerror(errno));
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fclose(f);
        if (len <= 0 || len % CIFAR_RECORD != 0)
            return td_fail(err,
                           "%s: %ld bytes is not a whole number of CIFAR-10 records (%d "
                           "bytes each: a label and 3x32x32 pixels); truncated or another "
                           "format?",
                           files[i], len, CIFAR_RECORD);
        sizes[i] = (size_t)len / CIFAR_RECORD;
        total += sizes[i];
    }
    ds->n = (int)total;
    ds->shape = td_shape_image(3, CIFAR_SIDE, CIFAR_SIDE);
    ds->pixels = td_malloc(total * 3 * CIFAR_PIXELS);
    ds->labels = td_malloc(total * sizeof(int32_t));
    uint8_t *rec = td_malloc(CIFAR_RECORD);
    size_t k = 0;
    for (int i = 0; i < n_files; i++) {
        FILE *f = fopen(files[i], "rb");
        if (!f) {
            free(rec);
            td_dataset_free(ds);
            return td_fail(err, "%s: cannot open: %s", files[i], strerror(errno));
        }
        for (size_t r = 0; r < sizes[i]; r++, k++) {
            if (fread(rec, 1, CIFAR_RECORD, f) != CIFAR_RECORD || rec[0] > 9) {
                bool short_read = feof(f) || ferror(f);
                int label = rec[0];
                fclose(f);
                free(rec);
                td_dataset_free(ds);
                if (short_read) return td_fail(err, "%s: read error at record %zu", files[i], r);
                return td_fail(err,
                               "%s: record %zu has label %d; CIFAR-10 labels are 0..9 (is "
                               "this a CIFAR-100 file?)",
                               files[i], r, label);
            }
            ds->labels[k] = rec[0];
            uint8_t *dst = ds->pixels + k * 3 * CIFAR_PIXELS;
            for (int p = 0; p < CIFAR_PIXELS; p++)
                for (int c = 0; c < 3; c++) dst[p * 3 + c] = rec[1 + c * CIFAR_PIXELS + p];
        }
        fclose(f);
    }
    free(rec);
    ds->num_classes = 10;
    return 0;
}
