/* traind-worker: trains (or evaluates) the job a spec file describes. Metrics on stdout (JSON
 * lines), progress and errors on stderr; exit status 0 on success, 1 on a training or data
 * error, 2 on usage. */
#include "core/td_blas.h"
#include "core/td_isa.h"
#include "base/td_parse.h"
#include "io/td_checkpoint.h"
#include "spec/td_spec.h"
#include "train/td_train.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TRAIND_VERSION
#define TRAIND_VERSION "0.0.0"
#endif

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: traind-worker [options] JOB.json\n"
        "       traind-worker sample CHECKPOINT [--prompt TEXT] [--tokens N]\n"
        "                     [--temperature T] [--top-k K] [--seed S] [--threads N]\n"
        "\n"
        "Trains the job described by JOB.json and prints one JSON object per line on\n"
        "stdout: {\"event\":\"train\",...} every log.every_steps steps, {\"event\":\"eval\",...}\n"
        "after each epoch when data.val is given, {\"event\":\"checkpoint\",...} after each\n"
        "save, and {\"event\":\"done\",...} at the end. Progress and errors go to stderr.\n"
        "\n"
        "  --eval            evaluate the weights of resume_from / model.init_from on\n"
        "                    data.val, print the eval line and exit\n"
        "  --stop-after N    stop after optimizer step N as if preempted: save a checkpoint\n"
        "                    (checkpoint.dir) and exit 0; resume_from continues exactly\n"
        "                    (TRAIND_STOP_AT_STEP, which traind sets, when not given)\n"
        "  --check           validate the spec and exit (0: valid)\n"
        "  --blas-core       print the OpenBLAS kernel set in use and exit\n"
        "  --isa             print the instruction set of traind's own kernels and exit\n"
        "  --help            this text\n"
        "  --version         print the version\n"
        "\n"
        "sample: text from a checkpoint of a run on text (its directory or its\n"
        "model.safetensors, which holds the spec and the tokenizer): the prompt and N more\n"
        "tokens. Unset options are the spec's \"sample\" settings (then the text is the run's\n"
        "sample line at that step), else nanoGPT's sample.py defaults: --prompt \"\\n\"\n"
        "--tokens 500 --temperature 0.8 --top-k 200 --seed 1337; --threads 1.\n"
        "\n"
        "Environment: TRAIND_PROFILE=1 prints per-node times per step at the end.\n"
        "TRAIND_ISA=baseline|avx2|avx512 forces the kernels' instruction set (default: the\n"
        "best this CPU supports).\n"
        "OPENBLAS_NUM_THREADS is overridden by train.threads.\n"
        "See docs/job-spec.md for the spec's fields.\n");
}

/* traind-worker sample CHECKPOINT [options] */
static int sample_main(int argc, char **argv) {
    td_generate_options opt = {NULL, -1, -1, -1.0, -1, 1};
    const char *checkpoint = NULL;
    for (int i = 2; i < argc; i++) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        long number = 0;
        bool ok = true;
        if (flag[0] != '-') {
            if (checkpoint) {
                fprintf(stderr, "traind-worker sample: one checkpoint expected, got %s and %s\n",
                        checkpoint, flag);
                return 2;
            }
            checkpoint = flag;
            continue;
        }
        if (!value) {
            fprintf(stderr, "traind-worker sample: %s needs a value\n", flag);
            return 2;
        }
        if (strcmp(flag, "--prompt") == 0)
            opt.prompt = value;
        else if (strcmp(flag, "--tokens") == 0)
            ok = td_parse_long(value, 1, 1 << 20, &opt.tokens);
        else if (strcmp(flag, "--top-k") == 0)
            ok = td_parse_long(value, 0, 1 << 24, &opt.top_k);
        else if (strcmp(flag, "--seed") == 0)
            ok = td_parse_long(value, 0, LONG_MAX, &number), opt.seed = number;
        else if (strcmp(flag, "--threads") == 0)
            ok = td_parse_long(value, 1, 1024, &number), opt.threads = (int)number;
        else if (strcmp(flag, "--temperature") == 0)
            ok = td_parse_double(value, 1e-6, 100, &opt.temperature);
        else {
            fprintf(stderr, "traind-worker sample: unknown option %s\n", flag);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "traind-worker sample: %s %s: not a number in its range\n", flag,
                    value);
            return 2;
        }
        i++;
    }
    if (!checkpoint) {
        usage(stderr);
        return 2;
    }
    td_err err = {{0}};
    if (td_isa_select(NULL, &err) != 0 || td_train_generate(checkpoint, &opt, stdout, &err) != 0) {
        fprintf(stderr, "traind-worker sample: error: %s\n", err.msg);
        return 1;
    }
    return 0;
}

/* TRAIND_STOP_AT_STEP, which traind sets for a paused trial's attempt: --stop-after's value
 * when the command line gives none. Unset or empty: 0 (run to the end). */
static int stop_from_env(long *out) {
    const char *v = getenv("TRAIND_STOP_AT_STEP");
    if (!v || !v[0]) return 0;
    if (!td_parse_long(v, 1, LONG_MAX, out)) {
        fprintf(stderr, "traind-worker: TRAIND_STOP_AT_STEP=%.40s: a step count >= 1 expected\n",
                v);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    td_blas_fix_kernel(argv);
    if (argc > 1 && strcmp(argv[1], "sample") == 0) return sample_main(argc, argv);
    const char *path = NULL;
    bool check_only = false, eval_only = false;
    td_train_options opt = {0};
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
        } else if (strcmp(argv[i], "--isa") == 0) {
            td_err err = {{0}};
            if (td_isa_select(NULL, &err) != 0) {
                fprintf(stderr, "traind-worker: error: %s\n", err.msg);
                return 1;
            }
            printf("%s (%s)\n", td_isa_name(td_isa_active()), td_isa_why());
            return 0;
        } else if (strcmp(argv[i], "--check") == 0) {
            check_only = true;
        } else if (strcmp(argv[i], "--eval") == 0) {
            eval_only = true;
        } else if (strcmp(argv[i], "--stop-after") == 0) {
            if (i + 1 >= argc || !td_parse_long(argv[i + 1], 1, LONG_MAX, &opt.stop_after_steps)) {
                fprintf(stderr, "traind-worker: --stop-after needs a step count >= 1\n");
                return 2;
            }
            i++;
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
    if (!opt.stop_after_steps) {
        if (stop_from_env(&opt.stop_after_steps) != 0) return 2;
        opt.report_at_stop = opt.stop_after_steps > 0;
    }
    td_err err = {{0}};
    /* an unusable TRAIND_ISA is an error here, before any work, not a silent fallback */
    if (td_isa_select(NULL, &err) != 0) {
        fprintf(stderr, "traind-worker: error: %s\n", err.msg);
        return 1;
    }
    td_dist dist;
    if (td_dist_from_env(&dist, &err) != 0) {
        fprintf(stderr, "traind-worker: error: %s\n", err.msg);
        return 1;
    }
    opt.dist = &dist;
    td_job job;
    if (td_job_load_file(&job, path, &err) != 0) {
        fprintf(stderr, "traind-worker: error: %s\n", err.msg);
        return 1;
    }
    /* a later attempt (relaunched after a failure, or a paused trial going on): continue from
     * the newest checkpoint */
    const char *restart = getenv("TORCHELASTIC_RESTART_COUNT");
    if (restart && atoi(restart) > 0 && job.checkpoint.dir[0] && !job.checkpoint.resume_from[0]) {
        char dir[TD_PATH_MAX + 32];
        td_err none;
        if (td_checkpoint_resolve("latest", job.checkpoint.dir, dir, sizeof dir, &none) == 0) {
            snprintf(job.checkpoint.resume_from, sizeof job.checkpoint.resume_from, "latest");
            fprintf(stderr, "[traind] attempt %s: resuming from %s\n", restart, dir);
        }
    }
    if (check_only) {
        fprintf(stderr, "traind-worker: %s: valid\n", path);
        td_job_free(&job);
        return 0;
    }
    if (opt.stop_after_steps && !job.checkpoint.dir[0]) {
        fprintf(stderr, "traind-worker: error: --stop-after needs checkpoint.dir in the spec, or "
                        "the work done would be lost\n");
        td_job_free(&job);
        return 2;
    }
    td_train_result res;
    int rc = eval_only ? td_train_evaluate(&job, stdout, stderr, &res, &err)
                       : td_train_run(&job, &opt, stdout, stderr, &res, &err);
    td_job_free(&job);
    if (rc != 0) {
        fprintf(stderr, "traind-worker: error: %s\n", err.msg);
        return 1;
    }
    if (res.stopped)
        fprintf(stderr, "[traind] stopped after step %ld as asked; resume_from continues\n",
                res.steps);
    else if (res.has_val)
        fprintf(stderr, "[traind] finished: %ld steps, val_acc %.4f\n", res.steps, res.val_acc);
    return 0;
}
