/* Feeds: a CIFAR-10 binary batch file (trainer/data/td_cifar.c: records of a label byte and
 * 3x32x32 pixels) to the daemon's probe and the worker's loader, as one file and as the same
 * file listed twice (a split of several batch files). Why: a user's file, whose size and label
 * bytes decide everything; the probe reads every label, so it and the loader must agree. */
#include "fuzz_util.h"

#include "data/td_data.h"

static fuzz_file file;

static void check(const char *const *files, int n_files) {
    td_data_probe p = {0};
    td_err err = {{0}};
    int probed = td_dataset_probe_cifar10(files, n_files, &p, &err);
    FUZZ_CHECK(probed == 0 || err.msg[0], "a probe refusal without a message");
    td_dataset ds;
    err.msg[0] = 0;
    int loaded = td_dataset_load_cifar10(&ds, files, n_files, &err);
    FUZZ_CHECK(loaded == 0 || err.msg[0], "a load refusal without a message");
    FUZZ_CHECK((loaded == 0) == (probed == 0), "probe %d, load %d: %s", probed, loaded, err.msg);
    if (loaded != 0) return;
    FUZZ_CHECK(ds.n >= 1 && ds.n == p.n, "%d records (probe: %d)", ds.n, p.n);
    for (int i = 0; i < ds.n; i++)
        FUZZ_CHECK(ds.labels[i] >= 0 && ds.labels[i] <= p.max_label && p.max_label <= 9,
                   "label %d (max %d)", ds.labels[i], p.max_label);
    td_dataset_free(&ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!file.path[0]) fuzz_file_open(&file, "batch.bin");
    fuzz_file_set(&file, data, size);
    const char *files[2] = {file.path, file.path};
    check(files, 1);
    check(files, 2);
    return 0;
}
