/* Feeds: a CSV dataset (trainer/data/td_csv.c) to the daemon's probe and the worker's loader. The
 * input is a flags byte (bit 0: a header line; bits 1-2: the label's column) and the file. Why:
 * a user's file, read with strtof cell by cell; every malformed cell must be an error naming its
 * line and column, and what loads must be finite features and class-index labels. The probe
 * reads a file this small whole, so it and the loader must agree. */
#include "fuzz_util.h"

#include "data/td_data.h"

#include <math.h>

static fuzz_file file;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    if (!file.path[0]) fuzz_file_open(&file, "data.csv");
    fuzz_file_set(&file, data + 1, size - 1);
    bool header = data[0] & 1;
    int column = (data[0] >> 1) & 3;

    td_data_probe p = {0};
    td_err err = {{0}};
    int probed = td_dataset_probe_csv(file.path, column, header, &p, &err);
    FUZZ_CHECK(probed == 0 || err.msg[0], "a probe refusal without a message");
    td_dataset ds;
    err.msg[0] = 0;
    int loaded = td_dataset_load_csv(&ds, file.path, column, header, &err);
    FUZZ_CHECK(loaded == 0 || err.msg[0], "a load refusal without a message");
    FUZZ_CHECK((loaded == 0) == (probed == 0), "probe %d, load %d: %s", probed, loaded, err.msg);
    if (loaded != 0) return 0;
    FUZZ_CHECK(ds.n >= 1 && ds.n == p.n && !ds.shape.spatial && ds.shape.c >= 1,
               "%d rows of %d features (probe: %d)", ds.n, ds.shape.c, p.n);
    FUZZ_CHECK(ds.num_classes == p.max_label + 1, "%d classes, max label %d", ds.num_classes,
               p.max_label);
    for (int i = 0; i < ds.n; i++) {
        FUZZ_CHECK(ds.labels[i] >= 0 && ds.labels[i] <= (1 << 20), "label %d", ds.labels[i]);
        for (int k = 0; k < ds.shape.c; k++)
            FUZZ_CHECK(isfinite(ds.values[(size_t)i * (size_t)ds.shape.c + (size_t)k]),
                       "row %d feature %d is not finite", i, k);
    }
    td_dataset_free(&ds);
    return 0;
}
