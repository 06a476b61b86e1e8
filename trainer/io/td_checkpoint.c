#include "io/td_checkpoint.h"

#include "core/td_fault.h"
#include "io/td_safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATE_FORMAT  "traind-checkpoint"
#define STATE_VERSION 1

static const char *const FILES[3] = {TD_CHECKPOINT_MODEL, TD_CHECKPOINT_OPTIMIZER,
                                     TD_CHECKPOINT_STATE};

static int mkdir_p(const char *path, td_err *err) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return td_fail(err, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return td_fail(err, "%s: cannot create directory: %s", buf, strerror(errno));
    return 0;
}

static int fsync_dir(const char *path, td_err *err) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return td_fail(err, "%s: cannot open directory: %s", path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0) return td_fail(err, "%s: fsync failed: %s", path, strerror(errno));
    return 0;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static bool is_complete(const char *dir) {
    char path[4096];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, FILES[i]);
        if (access(path, R_OK) != 0) return false;
    }
    return true;
}

/* Checkpoint directories under root, sorted by step; returns their count. */
static int list_steps(const char *root, long **steps_out) {
    DIR *d = opendir(root);
    *steps_out = NULL;
    if (!d) return 0;
    long *steps = NULL;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long step;
        char tail;
        if (sscanf(e->d_name, "step-%ld%c", &step, &tail) != 1) continue;
        steps = td_realloc(steps, (size_t)(n + 1) * sizeof *steps);
        steps[n++] = step;
    }
    closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of entries */
        for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            long t = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = t;
        }
    *steps_out = steps;
    return n;
}

static void remove_stale(const char *root, int keep) {
    DIR *d = opendir(root);
    if (d) {
        struct dirent *e;
        char path[4096];
        while ((e = readdir(d))) /* temporaries of saves that never finished */
            if (strncmp(e->d_name, ".tmp-", 5) == 0) {
                snprintf(path, sizeof path, "%s/%s", root, e->d_name);
                remove_tree(path);
            }
        closedir(d);
    }
    if (keep <= 0) return;
    long *steps;
    int n = list_steps(root, &steps);
    for (int i = 0; i + keep < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/step-%08ld", root, steps[i]);
        remove_tree(path);
    }
    free(steps);
}

int td_checkpoint_save_weights(const char *path, const td_model *m, const char *metadata,
                               td_err *err) {
    int n = m->n_params + m->n_buffers;
    td_st_out *out = td_calloc((size_t)(n + m->n_aliases), sizeof *out);
    for (int i = 0; i < n; i++) {
        const td_param *p = i < m->n_params ? &m->params[i] : &m->buffers[i - m->n_params];
        out[i] = (td_st_out){p->name, p->dtype == TD_I64 ? TD_ST_I64 : TD_ST_F32, p->ndim, p->dims,
                             p->data};
    }
    /* a tied weight under its second name too, as PyTorch's state_dict holds both */
    for (int i = 0; i < m->n_aliases; i++) {
        const td_param *p = &m->params[m->aliases[i].param];
        out[n++] = (td_st_out){m->aliases[i].name, TD_ST_F32, p->ndim, p->dims, p->data};
    }
    int rc = td_safetensors_write(path, out, n, metadata ? metadata : "{\"format\":\"pt\"}", err);
    free(out);
    return rc;
}

static const char *const SUFFIX_SGD[1] = {"momentum_buffer"};
static const char *const SUFFIX_ADAM[2] = {"exp_avg", "exp_avg_sq"};

static int optim_slots(const td_optim *o, const char *const **suffixes) {
    if (o->cfg.kind == TD_OPTIM_SGD) {
        *suffixes = SUFFIX_SGD;
        return o->m ? 1 : 0;
    }
    *suffixes = SUFFIX_ADAM;
    return 2;
}

static int write_optim(const char *path, const td_model *m, const td_optim *o, td_err *err) {
    const char *const *suffix;
    int slots = optim_slots(o, &suffix);
    int n = m->n_params * slots;
    td_st_out *out = td_calloc((size_t)(n ? n : 1), sizeof *out);
    char(*names)[TD_NAME_MAX + 64] = td_calloc((size_t)(n ? n : 1), sizeof *names);
    for (int i = 0; i < m->n_params; i++)
        for (int s = 0; s < slots; s++) {
            const td_param *p = &m->params[i];
            int k = i * slots + s;
            snprintf(names[k], sizeof names[k], "%s.%s", p->name, suffix[s]);
            const float *base = s == 0 ? o->m : o->v;
            out[k] = (td_st_out){names[k], TD_ST_F32, p->ndim, p->dims, base + p->offset};
        }
    char meta[128];
    snprintf(meta, sizeof meta, "{\"optimizer\":\"%s\",\"steps\":\"%ld\"}",
             o->cfg.kind == TD_OPTIM_SGD    ? "sgd"
             : o->cfg.kind == TD_OPTIM_ADAM ? "adam"
                                            : "adamw",
             o->steps);
    int rc = td_safetensors_write(path, out, n, meta, err);
    free(out);
    free(names);
    return rc;
}

static int write_state(const char *path, const td_train_state *s, const td_optim *o, td_err *err) {
    char rng[4][24], loss[48], seed[24];
    for (int i = 0; i < 4; i++) snprintf(rng[i], sizeof rng[i], "%016" PRIx64, s->dropout_rng.s[i]);
    snprintf(seed, sizeof seed, "%016" PRIx64, s->seed);
    snprintf(loss, sizeof loss, "%a", s->interval_loss); /* hex float: exact */
    json_t *j =
        json_pack("{s:s, s:i, s:I, s:i, s:i, s:s, s:{s:[s,s,s,s]}, s:{s:I}, s:{s:s, s:I}}",
                  "format", STATE_FORMAT, "version", STATE_VERSION, "step", (json_int_t)s->step,
                  "epoch", s->epoch, "batch", s->batch, "seed_hex", seed, "rng", "dropout", rng[0],
                  rng[1], rng[2], rng[3], "optimizer", "steps", (json_int_t)o->steps, "interval",
                  "loss_sum", loss, "steps", (json_int_t)s->interval_steps);
    TD_CHECK_ALLOC(j, "encoding a checkpoint's state");
    /* fp16's GradScaler, where there is one; the scale is a power of two, exact as a double */
    if (o->scaler.scale > 0.0f) {
        json_t *scaler =
            json_pack("{s:f, s:i, s:I}", "scale", (double)o->scaler.scale, "growth_tracker",
                      o->scaler.growth_tracker, "skipped_steps", (json_int_t)o->scaler.skipped);
        TD_CHECK_ALLOC(scaler, "encoding a checkpoint's state");
        json_object_set_new(j, "grad_scaler", scaler);
    }
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    TD_CHECK_ALLOC(text, "encoding a checkpoint's state");
    json_decref(j);
    FILE *f = fopen(path, "w");
    if (!f) {
        free(text);
        return td_fail(err, "%s: cannot create: %s", path, strerror(errno));
    }
    bool bad =
        fputs(text, f) == EOF || fputc('\n', f) == EOF || fflush(f) != 0 || fsync(fileno(f)) != 0;
    bad = fclose(f) != 0 || bad;
    free(text);
    if (bad) return td_fail(err, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

int td_checkpoint_save(const char *root, const td_model *model, const td_optim *optim,
                       const td_train_state *state, int keep, const char *metadata, char *out,
                       size_t out_len, td_err *err) {
    if (mkdir_p(root, err) != 0) return td_fail_prefix(err, "checkpoint.dir");
    char tmp[4096], path[4200], final[4096];
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-%08ld-XXXXXX", root, state->step);
    if (!mkdtemp(tmp)) return td_fail(err, "%s: cannot create: %s", tmp, strerror(errno));
    snprintf(path, sizeof path, "%s/%s", tmp, FILES[0]);
    if (td_checkpoint_save_weights(path, model, metadata, err) != 0) goto fail;
    /* tests: a writer killed with the save half done (core/td_fault.h) */
    td_fault_at(TD_FAULT_CHECKPOINT);
    snprintf(path, sizeof path, "%s/%s", tmp, FILES[1]);
    if (write_optim(path, model, optim, err) != 0) goto fail;
    snprintf(path, sizeof path, "%s/%s", tmp, FILES[2]);
    if (write_state(path, state, optim, err) != 0) goto fail;
    if (fsync_dir(tmp, err) != 0) goto fail;
    snprintf(final, sizeof final, "%s/step-%08ld", root, state->step);
    if (access(final, F_OK) == 0) {
        /* the same step saved again (a resumed run): the new save replaces the old */
        char old[4200];
        snprintf(old, sizeof old, "%s/.tmp-old-%08ld", root, state->step);
        remove_tree(old);
        if (rename(final, old) != 0) {
            td_fail(err, "%s: cannot replace: %s", final, strerror(errno));
            goto fail;
        }
        remove_tree(old);
    }
    if (rename(tmp, final) != 0) {
        td_fail(err, "%s: cannot rename into place: %s", final, strerror(errno));
        goto fail;
    }
    if (fsync_dir(root, err) != 0) return -1;
    remove_stale(root, keep);
    snprintf(out, out_len, "%s", final);
    return 0;
fail:
    remove_tree(tmp);
    return -1;
}

int td_checkpoint_resolve(const char *resume_from, const char *root, char *dir, size_t len,
                          td_err *err) {
    if (strcmp(resume_from, "latest") == 0) {
        if (!root || !*root)
            return td_fail(err, "resume_from: \"latest\" needs checkpoint.dir to look in");
        long *steps;
        int n = list_steps(root, &steps);
        for (int i = n - 1; i >= 0; i--) {
            snprintf(dir, len, "%s/step-%08ld", root, steps[i]);
            if (is_complete(dir)) {
                free(steps);
                return 0;
            }
        }
        free(steps);
        return td_fail(err, "resume_from: no complete checkpoint in %s", root);
    }
    snprintf(dir, len, "%s", resume_from);
    if (!is_complete(dir))
        return td_fail(err,
                       "resume_from: %s is not a checkpoint directory (expected %s, %s and "
                       "%s in it)",
                       dir, FILES[0], FILES[1], FILES[2]);
    return 0;
}

/* Appends "name" to a comma-separated list, eliding past a length. */
static void list_add(char *list, size_t len, int *count, const char *item) {
    size_t used = strlen(list);
    if (++*count <= 12 && used + strlen(item) + 3 < len)
        snprintf(list + used, len - used, "%s%s", used ? ", " : "", item);
    else if (*count == 13 && used + 6 < len)
        snprintf(list + used, len - used, ", ...");
}

static bool same_shape(const td_st_tensor *t, const td_param *p) {
    if (t->ndim != p->ndim) return false;
    for (int i = 0; i < p->ndim; i++)
        if (t->dims[i] != p->dims[i]) return false;
    return true;
}

static void shape_text(char *buf, size_t len, int ndim, const int64_t *dims) {
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%" PRId64, i ? ", " : "", dims[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
}

int td_checkpoint_load_weights(const char *path, td_model *model, bool strict, FILE *log,
                               td_err *err) {
    td_safetensors st;
    if (td_safetensors_read(&st, path, err) != 0) return -1;
    char missing[600] = "", unexpected[600] = "", mismatched[800] = "";
    int n_missing = 0, n_unexpected = 0, n_mismatched = 0;
    int total = model->n_params + model->n_buffers;
    for (int i = 0; i < total; i++) {
        td_param *p =
            i < model->n_params ? &model->params[i] : &model->buffers[i - model->n_params];
        const td_st_tensor *t = td_safetensors_find(&st, p->name);
        if (!t) {
            list_add(missing, sizeof missing, &n_missing, p->name);
        } else if (!same_shape(t, p)) {
            char item[400], theirs[96];
            int64_t ours[TD_MAX_DIMS];
            for (int d = 0; d < p->ndim; d++) ours[d] = p->dims[d];
            char mine[96];
            shape_text(theirs, sizeof theirs, t->ndim, t->dims);
            shape_text(mine, sizeof mine, p->ndim, ours);
            snprintf(item, sizeof item, "%s (file %s, model %s)", p->name, theirs, mine);
            list_add(mismatched, sizeof mismatched, &n_mismatched, item);
        }
    }
    for (int i = 0; i < st.n; i++)
        if (!td_model_find_param(model, st.tensors[i].name))
            list_add(unexpected, sizeof unexpected, &n_unexpected, st.tensors[i].name);
    if (strict && (n_missing || n_unexpected || n_mismatched)) {
        td_fail(err,
                "%s: does not match the model:%s%s%s%s%s%s%s%s%s (set model.strict to false to "
                "load the names that match)",
                path, n_missing ? " missing: " : "", missing, n_missing ? ";" : "",
                n_unexpected ? " unexpected: " : "", unexpected, n_unexpected ? ";" : "",
                n_mismatched ? " shape mismatch: " : "", mismatched, n_mismatched ? ";" : "");
        td_safetensors_free(&st);
        return -1;
    }
    int loaded = 0;
    for (int i = 0; i < total; i++) {
        td_param *p =
            i < model->n_params ? &model->params[i] : &model->buffers[i - model->n_params];
        const td_st_tensor *t = td_safetensors_find(&st, p->name);
        if (t && same_shape(t, p)) {
            td_safetensors_to_float(t, p->data);
            loaded++;
        }
    }
    if (log && (n_missing || n_unexpected || n_mismatched))
        fprintf(log,
                "[traind] %s: loaded %d of %d tensors; missing %d, unexpected %d, shape "
                "mismatch %d\n",
                path, loaded, total, n_missing, n_unexpected, n_mismatched);
    td_safetensors_free(&st);
    return 0;
}

static int load_optim(const char *path, const td_model *m, td_optim *o, td_err *err) {
    td_safetensors st;
    if (td_safetensors_read(&st, path, err) != 0) return -1;
    const char *const *suffix;
    int slots = optim_slots(o, &suffix);
    for (int i = 0; i < m->n_params; i++)
        for (int s = 0; s < slots; s++) {
            const td_param *p = &m->params[i];
            char name[TD_NAME_MAX + 64];
            snprintf(name, sizeof name, "%s.%s", p->name, suffix[s]);
            const td_st_tensor *t = td_safetensors_find(&st, name);
            if (!t || t->count != p->size || t->dtype != TD_ST_F32) {
                td_safetensors_free(&st);
                return td_fail(err,
                               "%s: %s %s; was the checkpoint written with another "
                               "optimizer or model?",
                               path, name, t ? "has the wrong size or type" : "is missing");
            }
            td_safetensors_to_float(t, (s == 0 ? o->m : o->v) + p->offset);
        }
    td_safetensors_free(&st);
    return 0;
}

/* state.json's object j (a reference taken) into s and o's step count and scaler. */
static int state_from_json(json_t *j, const char *path, td_train_state *s, td_optim *o,
                           td_err *err) {
    json_error_t jerr;
    const char *format = NULL, *seed = NULL, *r[4] = {0}, *loss = NULL;
    json_int_t version = 0, step = 0, epoch = 0, batch = 0, osteps = 0, isteps = 0;
    int rc = json_unpack_ex(
        j, &jerr, 0, "{s:s, s:I, s:I, s:I, s:I, s:s, s:{s:[ssss]}, s:{s:I}, s:{s:s, s:I}}",
        "format", &format, "version", &version, "step", &step, "epoch", &epoch, "batch", &batch,
        "seed_hex", &seed, "rng", "dropout", &r[0], &r[1], &r[2], &r[3], "optimizer", "steps",
        &osteps, "interval", "loss_sum", &loss, "steps", &isteps);
    if (rc != 0 || strcmp(format, STATE_FORMAT) != 0 || version != STATE_VERSION) {
        td_fail(err, "%s: not a traind checkpoint state (version %d): %s", path, STATE_VERSION,
                rc != 0 ? jerr.text : "wrong format or version");
        json_decref(j);
        return -1;
    }
    /* the loop resumes at (epoch, batch) and counts on from these: a negative or wrapped count
     * would index outside the epoch's batches (found by fuzzing: negative counts were taken) */
    if (step < 0 || epoch < 0 || epoch > INT_MAX || batch < 0 || batch > INT_MAX || osteps < 0 ||
        isteps < 0) {
        td_fail(err,
                "%s: step %lld, epoch %lld, batch %lld, optimizer steps %lld, interval steps "
                "%lld: expected counts >= 0 (epoch and batch below 2^31)",
                path, (long long)step, (long long)epoch, (long long)batch, (long long)osteps,
                (long long)isteps);
        json_decref(j);
        return -1;
    }
    s->step = (long)step;
    s->epoch = (int)epoch;
    s->batch = (int)batch;
    s->seed = strtoull(seed, NULL, 16);
    for (int i = 0; i < 4; i++) s->dropout_rng.s[i] = strtoull(r[i], NULL, 16);
    s->interval_loss = strtod(loss, NULL);
    s->interval_steps = (long)isteps;
    o->steps = (long)osteps;
    o->scaler = (td_grad_scaler){0.0f, 0, 0};
    json_t *scaler = json_object_get(j, "grad_scaler");
    double scale = 0;
    json_int_t tracker = 0, skipped = 0;
    if (scaler &&
        (json_unpack_ex(scaler, &jerr, 0, "{s:F, s:I, s:I}", "scale", &scale, "growth_tracker",
                        &tracker, "skipped_steps", &skipped) != 0 ||
         !(scale > 0) || !(scale <= FLT_MAX) || tracker < 0 || tracker > INT_MAX || skipped < 0)) {
        td_fail(err,
                "%s: grad_scaler: expected {\"scale\": > 0 (a finite float), "
                "\"growth_tracker\": >= 0, \"skipped_steps\": >= 0}%s%s",
                path, jerr.text[0] ? ": " : "", jerr.text);
        json_decref(j);
        return -1;
    }
    if (scaler) o->scaler = (td_grad_scaler){(float)scale, (int)tracker, (long)skipped};
    json_decref(j);
    return 0;
}

static int load_state(const char *path, td_train_state *s, td_optim *o, td_err *err) {
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) return td_fail(err, "%s:%d: %s", path, jerr.line, jerr.text);
    return state_from_json(j, path, s, o, err);
}

int td_checkpoint_parse_state(const char *text, size_t len, const char *name, td_train_state *s,
                              td_optim *o, td_err *err) {
    json_error_t jerr;
    json_t *j = json_loadb(text, len, 0, &jerr);
    if (!j) return td_fail(err, "%s:%d: %s", name, jerr.line, jerr.text);
    return state_from_json(j, name, s, o, err);
}

int td_checkpoint_load(const char *dir, td_model *model, td_optim *optim, td_train_state *state,
                       td_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, FILES[0]);
    if (td_checkpoint_load_weights(path, model, true, NULL, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/%s", dir, FILES[1]);
    if (load_optim(path, model, optim, err) != 0) return -1;
    snprintf(path, sizeof path, "%s/%s", dir, FILES[2]);
    return load_state(path, state, optim, err);
}
