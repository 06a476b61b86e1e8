/* Feeds: an IDX image file and its label file (the MNIST family's format, trainer/data/td_idx.c)
 * to the daemon's probe (td_dataset_probe_idx) and the worker's loader (td_dataset_load_idx).
 * The input is a flags byte, the images, "--labels--", the labels; flag 1 gzips the images and
 * flag 2 the labels here, so that the gzip path reads mutated contents through a valid stream
 * (a raw input starting with 1f 8b fuzzes zlib's own checks). Why: a job's data files are
 * anyone's; the header's sizes drive every allocation. The probe and the loader must agree: a
 * file the probe accepts must load (else the daemon queues a job that fails at start), and one
 * that loads must pass the probe (else a good job is refused). */
#include "fuzz_util.h"

#include "data/td_data.h"

#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static fuzz_file images, labels;

/* data as a gzip stream (allocated into *out). One compressor for the process, reset for each
 * input: setting one up costs more than compressing a small input. */
static size_t gzip(const uint8_t *data, size_t n, uint8_t **out) {
    static z_stream z;
    static bool ready;
    if (!ready && deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
    ready = true;
    if (deflateReset(&z) != Z_OK) abort();
    size_t cap = deflateBound(&z, (uLong)n);
    *out = malloc(cap ? cap : 1);
    if (!*out) abort();
    z.next_in = (Bytef *)data, z.avail_in = (uInt)n;
    z.next_out = *out, z.avail_out = (uInt)cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END) abort();
    return z.total_out;
}

static void set(fuzz_file *f, const uint8_t *data, size_t n, bool compress) {
    if (!compress) {
        fuzz_file_set(f, data, n);
        return;
    }
    uint8_t *z;
    size_t len = gzip(data, n, &z);
    fuzz_file_set(f, z, len);
    free(z);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (!images.path[0]) fuzz_file_open(&images, "images"), fuzz_file_open(&labels, "labels");
    const uint8_t *a, *b;
    size_t na, nb;
    fuzz_split(data + 1, size - 1, "--labels--", &a, &na, &b, &nb);
    bool gz_images = data[0] & 1, gz_labels = data[0] & 2;
    set(&images, a, na, gz_images);
    set(&labels, b, nb, gz_labels);
    bool plain = !gz_images && !(na >= 2 && a[0] == 0x1f && a[1] == 0x8b);

    td_data_probe p = {0};
    td_err err = {{0}};
    int probed = td_dataset_probe_idx(images.path, labels.path, &p, &err);
    FUZZ_CHECK(probed == 0 || err.msg[0], "a probe refusal without a message");
    if (probed == 0)
        FUZZ_CHECK(p.n >= 1 && p.shape.c == 1 && p.shape.h >= 1 && p.shape.w >= 1 &&
                       p.max_label >= 0 && p.max_label <= 255,
                   "probe: %d samples of %dx%d, max label %d", p.n, p.shape.h, p.shape.w,
                   p.max_label);
    td_dataset ds;
    err.msg[0] = 0;
    int loaded = td_dataset_load_idx(&ds, images.path, labels.path, &err);
    FUZZ_CHECK(loaded == 0 || err.msg[0], "a load refusal without a message");
    if (loaded == 0) {
        FUZZ_CHECK(probed == 0, "loads, but the probe refuses it: %s", err.msg);
        FUZZ_CHECK(ds.n == p.n && ds.shape.h == p.shape.h && ds.shape.w == p.shape.w,
                   "probe and load disagree on the shape");
        FUZZ_CHECK(ds.num_classes == p.max_label + 1, "%d classes, max label %d", ds.num_classes,
                   p.max_label);
        td_dataset_free(&ds);
    } else if (plain) {
        FUZZ_CHECK(probed != 0, "the probe accepts a plain file that does not load: %s", err.msg);
    }
    return 0;
}
