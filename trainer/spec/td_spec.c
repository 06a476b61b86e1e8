/* Reading the job spec, through the JSON accessor kit (core/td_json.h): every error names the
 * JSON path at fault: "train.optimizer.lr: expected a number > 0, found \"fast\"". */
#include "spec/td_spec_private.h"

#include "base/td_json.h"
#include "dist/td_buckets.h"
#include "ops/td_ops.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_checkpoint(const json_t *root, td_job *job, td_err *err) {
    if (td_json_string(root, "", "resume_from", false, "", job->checkpoint.resume_from,
                       sizeof job->checkpoint.resume_from, err) != 0)
        return -1;
    json_t *c;
    if (td_json_object(root, "", "checkpoint", false, &c, err) != 0) return -1;
    if (!c) {
        if (strcmp(job->checkpoint.resume_from, "latest") == 0)
            return td_fail(err, "resume_from: \"latest\" needs checkpoint.dir to look in");
        return 0;
    }
    static const char *const keys[] = {"dir", "every_steps", "every_epochs", "keep", NULL};
    if (td_json_check_keys(c, "checkpoint", keys, err) != 0) return -1;
    long steps, epochs, keep;
    if (td_json_string(c, "checkpoint", "dir", true, "", job->checkpoint.dir,
                       sizeof job->checkpoint.dir, err) != 0 ||
        td_json_int(c, "checkpoint", "every_steps", false, 0, 0, 1L << 40, &steps, err) != 0 ||
        td_json_int(c, "checkpoint", "every_epochs", false, 0, 0, 1 << 20, &epochs, err) != 0 ||
        td_json_int(c, "checkpoint", "keep", false, 0, 0, 1 << 20, &keep, err) != 0)
        return -1;
    job->checkpoint.every_steps = steps;
    job->checkpoint.every_epochs = (int)epochs;
    job->checkpoint.keep = (int)keep;
    return 0;
}

const char *const td_job_keys[] = {"name",       "model",  "data",        "train",       "log",
                                   "checkpoint", "sample", "resume_from", "distributed", NULL};

/* "sample": text data only (the tokenizer that reads the prompt and writes the text is its) */
static int parse_sample(const json_t *root, td_job *job, td_err *err) {
    json_t *s;
    if (td_json_object(root, "", "sample", false, &s, err) != 0) return -1;
    if (!s) return 0;
    static const char *const keys[] = {"prompt", "tokens", "temperature", "top_k", "seed", NULL};
    td_sample_spec *o = &job->sample;
    long tokens, top_k, seed;
    if (td_json_check_keys(s, "sample", keys, err) != 0 ||
        td_json_string(s, "sample", "prompt", false, "\n", o->prompt, sizeof o->prompt, err) != 0 ||
        td_json_int(s, "sample", "tokens", false, 200, 1, 100000, &tokens, err) != 0 ||
        td_json_number(s, "sample", "temperature", false, 0.8, 1e-3, 100, &o->temperature, err) !=
            0 ||
        td_json_int(s, "sample", "top_k", false, 200, 0, 1 << 24, &top_k, err) != 0 ||
        td_json_int(s, "sample", "seed", false, 1337, 0, (long)(~0ul >> 1), &seed, err) != 0)
        return -1;
    if (job->data.format != TD_DATA_TEXT)
        return td_fail(err, "sample: needs data.format \"text\" (its tokenizer reads the prompt "
                            "and writes the text)");
    o->present = true;
    o->tokens = (int)tokens, o->top_k = (int)top_k, o->seed = (uint64_t)seed;
    return 0;
}

static int parse_job(const json_t *root, td_job *job, td_err *err) {
    memset(job, 0, sizeof *job);
    if (!json_is_object(root)) return td_json_fail_found(err, "(root)", "a JSON object", root);
    if (td_json_check_keys(root, "", td_job_keys, err) != 0) return -1;
    if (td_json_string(root, "", "name", false, "job", job->name, sizeof job->name, err) != 0)
        return -1;
    if (td_spec_parse_model(root, job, err) != 0 || td_spec_parse_data(root, job, err) != 0 ||
        td_spec_parse_train(root, job, err) != 0)
        return -1;
    if (parse_checkpoint(root, job, err) != 0 || parse_sample(root, job, err) != 0) return -1;
    json_t *log;
    long l;
    if (td_json_object(root, "", "log", false, &log, err) != 0) return -1;
    job->log.every_steps = TD_LOG_EVERY_STEPS_DEFAULT;
    if (log) {
        static const char *const lkeys[] = {"every_steps", NULL};
        if (td_json_check_keys(log, "log", lkeys, err) != 0) return -1;
        /* an int: the loop takes step % every_steps, so a value past INT_MAX (it was allowed up
         * to 2^40 and truncated: 2^32 became 0, a division by zero at the first step) is refused */
        if (td_json_int(log, "log", "every_steps", false, TD_LOG_EVERY_STEPS_DEFAULT, 1, INT_MAX,
                        &l, err) != 0)
            return -1;
        job->log.every_steps = (int)l;
    }
    json_t *dist;
    if (td_json_object(root, "", "distributed", false, &dist, err) != 0) return -1;
    job->distributed.bucket_cap_mb = TD_BUCKET_CAP_MB_DEFAULT;
    if (dist) {
        static const char *const dkeys[] = {"bucket_cap_mb", "backend", NULL};
        if (td_json_check_keys(dist, "distributed", dkeys, err) != 0) return -1;
        int backend;
        if (td_json_choice(dist, "distributed", "backend", false, "auto", "auto|nccl|cpu", &backend,
                           err) != 0)
            return -1;
        job->distributed.backend = backend == 0   ? TD_BACKEND_AUTO
                                   : backend == 1 ? TD_BACKEND_NCCL
                                                  : TD_BACKEND_CPU;
        if (td_json_number(dist, "distributed", "bucket_cap_mb", false, TD_BUCKET_CAP_MB_DEFAULT,
                           1e-6, 1e6, &job->distributed.bucket_cap_mb, err) != 0)
            return -1;
    }
    return 0;
}

static int finish(json_t *root, td_job *job, td_err *err) {
    int rc = parse_job(root, job, err);
    if (rc == 0) {
        job->json = json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII);
        TD_CHECK_ALLOC(job->json, "for the spec's text");
    }
    json_decref(root);
    if (rc != 0) td_job_free(job);
    return rc;
}

int td_job_parse_file(td_job *job, const char *path, td_err *err) {
    json_error_t jerr;
    memset(job, 0, sizeof *job);
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (jerr.line <= 0) return td_fail(err, "%s: %s", path, jerr.text);
        return td_fail(err, "%s:%d:%d: invalid JSON: %s", path, jerr.line, jerr.column, jerr.text);
    }
    if (finish(root, job, err) != 0) return td_fail_prefix(err, "%s", path);
    return 0;
}

int td_job_parse_string(td_job *job, const char *text, td_err *err) {
    json_error_t jerr;
    memset(job, 0, sizeof *job);
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return td_fail(err, "spec:%d:%d: invalid JSON: %s", jerr.line, jerr.column, jerr.text);
    return finish(root, job, err);
}

void td_job_free(td_job *job) {
    free(job->json);
    job->json = NULL;
    free(job->model.nodes);
    job->model.nodes = NULL;
    job->model.n_nodes = 0;
}
