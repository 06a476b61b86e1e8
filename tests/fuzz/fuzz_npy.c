/* Feeds: a NumPy .npy image array and its label array (trainer/data/td_npy.c, whose header dict
 * is parsed by hand) to the daemon's probe and the worker's loader. The input is a flags byte
 * (1: the images are NHWC), the images, "--labels--", the labels. Why: the header's shape drives
 * every size and allocation, and the files are anyone's. The probe and the loader must agree, as
 * for IDX (fuzz_idx.c): both read the whole header and check the file's size. */
#include "fuzz_util.h"

#include "data/td_data.h"

#include <math.h>
#include <string.h>

static fuzz_file images, labels;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (!images.path[0]) fuzz_file_open(&images, "images"), fuzz_file_open(&labels, "labels");
    const uint8_t *a, *b;
    size_t na, nb;
    fuzz_split(data + 1, size - 1, "--labels--", &a, &na, &b, &nb);
    fuzz_file_set(&images, a, na);
    fuzz_file_set(&labels, b, nb);
    bool nhwc = data[0] & 1;

    td_data_probe p = {0};
    td_err err = {{0}};
    int probed = td_dataset_probe_npy(images.path, labels.path, nhwc, &p, &err);
    FUZZ_CHECK(probed == 0 || err.msg[0], "a probe refusal without a message");
    if (probed == 0)
        FUZZ_CHECK(p.n >= 1 && td_shape_size(p.shape) >= 1 && p.max_label >= 0,
                   "probe: %d samples of %zu values, max label %d", p.n, td_shape_size(p.shape),
                   p.max_label);
    td_dataset ds;
    err.msg[0] = 0;
    int loaded = td_dataset_load_npy(&ds, images.path, labels.path, nhwc, &err);
    FUZZ_CHECK(loaded == 0 || err.msg[0], "a load refusal without a message");
    FUZZ_CHECK((loaded == 0) == (probed == 0), "probe %d, load %d: %s", probed, loaded, err.msg);
    if (loaded == 0) {
        FUZZ_CHECK(ds.n == p.n && td_shape_size(ds.shape) == td_shape_size(p.shape),
                   "probe and load disagree on the shape");
        FUZZ_CHECK(ds.num_classes == p.max_label + 1, "%d classes, max label %d", ds.num_classes,
                   p.max_label);
        /* every sample reads (a loader that sized its arrays wrong shows here under ASan) */
        size_t values = (size_t)ds.n * td_shape_size(ds.shape);
        double sum = 0;
        for (size_t i = 0; i < values; i += 97)
            sum += ds.pixels ? ds.pixels[i] : (double)ds.values[i];
        (void)sum;
        for (int i = 0; i < ds.n; i++) FUZZ_CHECK(ds.labels[i] >= 0, "label %d", ds.labels[i]);
        td_dataset_free(&ds);
    }
    return 0;
}
