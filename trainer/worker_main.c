/* traind-worker: trains the job a spec file describes. Metrics on stdout (JSON lines), progress
 * and errors on stderr, exit status 0 on success, 1 on a training or data error, 2 on usage. */
#include "td_blas.h"
#include "td_spec.h"
#include "td_train.h"

#include <stdio.h>
#include <string.h>

#ifndef TRAIND_VERSION
#define TRAIND_VERSION "0.0.0"
#endif

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: traind-worker [--check] JOB.json\n"
        "\n"
        "Trains the job described by JOB.json and prints one JSON object per line on\n"
        "stdout: {\"event\":\"train\",...} every log.every_steps steps, {\"event\":\"eval\",...}\n"
        "after each epoch when data.val is given, and {\"event\":\"done\",...} at the end.\n"
        "Progress and errors go to stderr.\n"
        "\n"
        "  --check     validate the spec and exit (0: valid)\n"
        "  --blas-core print the OpenBLAS kernel set in use and exit\n"
        "  --help      this text\n"
        "  --version   print the version\n"
        "\n"
        "Environment: OPENBLAS_NUM_THREADS is overridden by train.threads.\n"
        "See README.md for the spec's fields.\n");
}

int main(int argc, char **argv) {
    td_blas_fix_kernel(argv);
    const char *path = NULL;
    bool check_only = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("traind-worker %s\n", TRAIND_VERSION);
            return 0;
        } else if (strcmp(argv[i], "--blas-core") == 0) {
            printf("%s\n", td_blas_describe());
            return 0;
        } else if (strcmp(argv[i], "--check") == 0) {
            check_only = true;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "traind-worker: unknown option %s\n", argv[i]);
            usage(stderr);
            return 2;
        } else if (path) {
            fprintf(stderr, "traind-worker: one spec file expected, got %s and %s\n", path,
                    argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    td_err err = {{0}};
    td_job job;
    if (td_job_load_file(&job, path, &err) != 0) {
        fprintf(stderr, "traind-worker: error: %s\n", err.msg);
        return 1;
    }
    if (check_only) {
        fprintf(stderr, "traind-worker: %s: valid\n", path);
        td_job_free(&job);
        return 0;
    }
    td_train_result res;
    int rc = td_train_run(&job, stdout, stderr, &res, &err);
    td_job_free(&job);
    if (rc != 0) {
        fprintf(stderr, "traind-worker: error: %s\n", err.msg);
        return 1;
    }
    if (res.has_val)
        fprintf(stderr, "[traind] finished: %ld steps, val_acc %.4f\n", res.steps, res.val_acc);
    return 0;
}
