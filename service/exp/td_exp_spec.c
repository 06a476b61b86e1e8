/* An experiment's body read and checked before anything is made: its name, the base job (an
 * object: the jobs module checks it as a job), the space (each path's values), the searcher and
 * the limits. Every refusal is a 400 naming the JSON path at fault. */
#include "service/exp/td_exp_private.h"

#include "base/td_json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const td_exp_searcher_names[] = {"grid", "random", "asha", "pbt"};

#define fail(e, field, ...) td_reply_fail(e, 400, "invalid_spec", field, __VA_ARGS__)

/* A path into the job: segments of [A-Za-z0-9_-], separated by '.', each with any number of
 * [N] indexes after it ("model.layers[2].width"). */
static bool path_ok(const char *p) {
    if (!*p || strlen(p) >= TD_EXP_PATH_MAX) return false;
    bool need_name = true;
    for (const char *c = p; *c;) {
        if (need_name) {
            size_t n =
                strspn(c, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-");
            if (n == 0) return false;
            c += n;
            need_name = false;
        } else if (*c == '[') {
            size_t n = strspn(c + 1, "0123456789");
            if (n == 0 || n > 6 || c[1 + n] != ']') return false;
            c += n + 2;
        } else if (*c == '.') {
            c++;
            need_name = true;
        } else {
            return false;
        }
    }
    return !need_name;
}

/* Two numbers [lo, hi] of a range: lo < hi (an int's lo <= hi, both integers), lo > 0 for a
 * log_uniform. */
static int read_range(td_exp_dim *d, json_t *v, const char *field, td_reply_error *e) {
    const char *what = d->kind == TD_DIM_INT           ? "two integers [low, high], low <= high"
                       : d->kind == TD_DIM_LOG_UNIFORM ? "two numbers [low, high], 0 < low < high"
                                                       : "two numbers [low, high], low < high";
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_number(json_array_get(v, 0)) ||
        !json_is_number(json_array_get(v, 1)))
        return fail(e, field, "%s: expected %s", field, what);
    d->lo = json_number_value(json_array_get(v, 0));
    d->hi = json_number_value(json_array_get(v, 1));
    bool ok = isfinite(d->lo) && isfinite(d->hi) && fabs(d->lo) < 1e15 && fabs(d->hi) < 1e15;
    if (d->kind == TD_DIM_INT)
        ok = ok && json_is_integer(json_array_get(v, 0)) && json_is_integer(json_array_get(v, 1)) &&
             d->lo <= d->hi;
    else
        ok = ok && d->lo < d->hi && (d->kind != TD_DIM_LOG_UNIFORM || d->lo > 0);
    return ok ? 0 : fail(e, field, "%s: expected %s", field, what);
}

/* One path's values: {"grid": [...]}, {"choice": [...]}, {"uniform": [lo, hi]},
 * {"log_uniform": [lo, hi]} or {"int": [lo, hi]}. */
static int read_dim(td_exp_dim *d, const char *path, json_t *spec, td_reply_error *e) {
    static const char *const kinds[] = {"grid", "choice", "uniform", "log_uniform", "int"};
    char field[TD_EXP_PATH_MAX + 64];
    snprintf(field, sizeof field, "space.%s", path);
    if (!path_ok(path))
        return fail(e, field,
                    "%s: a path into the job is names of letters, digits, '_' and '-' joined by "
                    "'.', with [N] after a name for an array's item",
                    field);
    snprintf(d->path, sizeof d->path, "%s", path);
    if (!json_is_object(spec) || json_object_size(spec) != 1)
        return fail(e, field,
                    "%s: expected one of {\"grid\": [...]}, {\"choice\": [...]}, {\"uniform\": "
                    "[low, high]}, {\"log_uniform\": [low, high]}, {\"int\": [low, high]}",
                    field);
    const char *kind = json_object_iter_key(json_object_iter(spec));
    json_t *v = json_object_iter_value(json_object_iter(spec));
    int k = 0;
    while (k < 5 && strcmp(kinds[k], kind) != 0) k++;
    snprintf(field + strlen(field), sizeof field - strlen(field), ".%s", kind);
    if (k == 5)
        return fail(e, field,
                    "%s: unknown kind \"%s\"; expected grid, choice, uniform, "
                    "log_uniform or int",
                    field, kind);
    d->kind = (td_dim)k;
    if (d->kind == TD_DIM_GRID || d->kind == TD_DIM_CHOICE) {
        if (!json_is_array(v) || json_array_size(v) < 1 || json_array_size(v) > TD_EXP_MAX_VALUES)
            return fail(e, field, "%s: expected an array of 1 to 1000 values", field);
        d->values = json_incref(v);
        return 0;
    }
    return read_range(d, v, field, e);
}

static int by_path(const void *a, const void *b) {
    return strcmp(((const td_exp_dim *)a)->path, ((const td_exp_dim *)b)->path);
}

/* Whether path a leads into path b ("train" into "train.lr", "l" into "l[0]"): one would set
 * what the other changes inside it. */
static bool leads_into(const char *a, const char *b) {
    size_t n = strlen(a);
    return strncmp(a, b, n) == 0 && (b[n] == '.' || b[n] == '[');
}

/* The space as a whole: no path inside another, none that is a command's whole environment,
 * and values small enough for a process's environment (each, and a trial's together). */
static int check_space(const td_exp_spec *s, td_reply_error *e) {
    size_t total = 0;
    for (int i = 0; i < s->n_dims; i++) {
        const td_exp_dim *d = &s->dims[i];
        char field[TD_EXP_PATH_MAX + 16];
        snprintf(field, sizeof field, "space.%s", d->path);
        if (strcmp(d->path, "env") == 0)
            return fail(e, field, "%s: set a command's variables one by one (env.NAME)", field);
        for (int k = 0; k < s->n_dims; k++)
            if (k != i && leads_into(d->path, s->dims[k].path))
                return fail(e, field, "%s: another searched path, %s, is inside it", field,
                            s->dims[k].path);
        size_t widest = 24; /* a number drawn from a range */
        for (size_t v = 0; d->values && v < json_array_size(d->values); v++) {
            char *text = json_dumps(json_array_get(d->values, v), JSON_ENCODE_ANY | JSON_COMPACT);
            size_t n = text ? strlen(text) : 0;
            free(text);
            if (n > TD_EXP_VALUE_MAX)
                return fail(e, field, "%s: a value of %zu bytes; at most %d", field, n,
                            TD_EXP_VALUE_MAX);
            if (n > widest) widest = n;
        }
        total += widest + strlen(d->path) + 4;
    }
    if (total > TD_EXP_HPARAMS_MAX)
        return fail(e, "space",
                    "space: a trial's values could take %zu bytes in all; at most %d (they go in "
                    "its environment)",
                    total, TD_EXP_HPARAMS_MAX);
    return 0;
}

static int read_space(td_exp_spec *s, json_t *space, td_reply_error *e) {
    if (!json_is_object(space) || json_object_size(space) < 1 ||
        json_object_size(space) > TD_EXP_MAX_DIMS)
        return fail(e, "space",
                    "space: expected an object of 1 to 32 paths into the job, each with its "
                    "values (\"train.optimizer.lr\": {\"log_uniform\": [1e-4, 0.1]})");
    s->dims = td_calloc(json_object_size(space), sizeof *s->dims);
    const char *path;
    json_t *v;
    json_object_foreach(space, path, v) {
        if (read_dim(&s->dims[s->n_dims++], path, v, e) != 0) return -1;
    }
    qsort(s->dims, (size_t)s->n_dims, sizeof *s->dims, by_path);
    return 0;
}

/* ASHA's rungs: max_steps, reduction_factor (4, as Determined's adaptive ASHA divides by
 * default) and rungs (3), the first rung at step 1 or later. */
static int read_asha(td_exp_spec *s, json_t *o, td_reply_error *e) {
    td_err err = {{0}};
    long max_steps, eta, rungs;
    int promotion;
    if (td_json_int(o, "searcher", "max_steps", true, 0, 1, 1000000000000L, &max_steps, &err) !=
            0 ||
        td_json_int(o, "searcher", "reduction_factor", false, 4, 2, 100, &eta, &err) != 0 ||
        td_json_int(o, "searcher", "rungs", false, 3, 1, TD_EXP_MAX_RUNGS, &rungs, &err) != 0 ||
        td_json_choice(o, "searcher", "promotion", false, "async", "async|rung", &promotion,
                       &err) != 0)
        return td_submit_spec_error(e, &err);
    s->max_steps = max_steps;
    s->reduction_factor = (int)eta;
    s->n_rungs = (int)rungs;
    s->promote_async = promotion == 0;
    long step = max_steps;
    for (int k = s->n_rungs - 1; k >= 0; k--, step /= eta) s->rung_steps[k] = step;
    if (s->rung_steps[0] < 1) /* (each rung is then past the one below: eta >= 2) */
        return fail(e, "searcher.rungs",
                    "searcher.rungs: %d rungs dividing by %d from max_steps %ld put the first "
                    "rung before step 1; give fewer rungs, a smaller reduction_factor or more "
                    "max_steps",
                    s->n_rungs, s->reduction_factor, max_steps);
    return 0;
}

/* PBT's generations: max_steps, interval (the steps of one), and how a generation's end
 * exploits and explores (Ray Tune's PBT defaults: quantile 0.25, factors 0.8 and 1.2,
 * resample_probability 0.25). */
static int read_pbt(td_exp_spec *s, json_t *o, td_reply_error *e) {
    td_err err = {{0}};
    long max_steps, interval;
    json_t *perturb = json_object_get(o, "perturb");
    if (td_json_int(o, "searcher", "max_steps", true, 0, 2, 1000000000000L, &max_steps, &err) !=
            0 ||
        td_json_int(o, "searcher", "interval", true, 0, 1, max_steps - 1, &interval, &err) != 0 ||
        td_json_number(o, "searcher", "quantile", false, 0.25, 0.01, 0.5, &s->quantile, &err) !=
            0 ||
        td_json_number(o, "searcher", "resample_probability", false, 0.25, 0, 1,
                       &s->resample_probability, &err) != 0)
        return td_submit_spec_error(e, &err);
    s->max_steps = max_steps;
    s->interval = interval;
    s->perturb_lo = 0.8;
    s->perturb_hi = 1.2;
    if (perturb) {
        double lo = json_number_value(json_array_get(perturb, 0));
        double hi = json_number_value(json_array_get(perturb, 1));
        if (!json_is_array(perturb) || json_array_size(perturb) != 2 ||
            !json_is_number(json_array_get(perturb, 0)) ||
            !json_is_number(json_array_get(perturb, 1)) || !(lo > 0) || !(hi > 0) || lo > 100 ||
            hi > 100)
            return fail(e, "searcher.perturb",
                        "searcher.perturb: expected the two factors a number is multiplied by, "
                        "one chosen at each exploit ([0.8, 1.2]), each above 0 and at most 100");
        s->perturb_lo = lo;
        s->perturb_hi = hi;
    }
    if (s->max_trials < 2 || s->max_trials > TD_EXP_MAX_CONCURRENT)
        return fail(e, "searcher.population",
                    "searcher.population: expected how many trials train together, 2 to %d",
                    TD_EXP_MAX_CONCURRENT);
    return 0;
}

/* The members only some searchers take, refused for another (they would do nothing). */
static int refuse_members(json_t *o, td_search searcher, td_reply_error *e) {
    enum { GRID = 1 << TD_SEARCH_GRID, RANDOM = 1 << TD_SEARCH_RANDOM };
    enum { ASHA = 1 << TD_SEARCH_ASHA, PBT = 1 << TD_SEARCH_PBT };
    static const struct {
        const char *name, *takers;
        unsigned mask;
    } members[] = {
        {"max_trials", "grid, random and asha", GRID | RANDOM | ASHA},
        {"max_steps", "asha and pbt", ASHA | PBT},
        {"reduction_factor", "asha", ASHA},
        {"rungs", "asha", ASHA},
        {"promotion", "asha", ASHA},
        {"population", "pbt", PBT},
        {"interval", "pbt", PBT},
        {"quantile", "pbt", PBT},
        {"perturb", "pbt", PBT},
        {"resample_probability", "pbt", PBT},
    };
    for (size_t i = 0; i < sizeof members / sizeof *members; i++) {
        if (!json_object_get(o, members[i].name) || members[i].mask & (1u << searcher)) continue;
        char field[48];
        snprintf(field, sizeof field, "searcher.%s", members[i].name);
        return fail(e, field, "%s: only the %s searcher%s take%s it%s", field, members[i].takers,
                    strchr(members[i].takers, ' ') ? "s" : "",
                    strchr(members[i].takers, ' ') ? "" : "s",
                    searcher == TD_SEARCH_PBT ? " (pbt's population says how many trials)" : "");
    }
    return 0;
}

/* The searcher: its type, metric and mode, and its trials (max_trials). */
static int read_searcher(td_exp_spec *s, json_t *root, td_reply_error *e) {
    static const char *const keys[] = {"type",
                                       "metric",
                                       "mode",
                                       "max_trials",
                                       "max_steps",
                                       "reduction_factor",
                                       "rungs",
                                       "promotion",
                                       "population",
                                       "interval",
                                       "quantile",
                                       "perturb",
                                       "resample_probability",
                                       NULL};
    td_err err = {{0}};
    json_t *o;
    char type[16];
    int mode;
    long max_trials, population;
    if (td_json_object(root, "", "searcher", true, &o, &err) != 0 ||
        td_json_check_keys(o, "searcher", keys, &err) != 0 ||
        td_json_string(o, "searcher", "type", true, "", type, sizeof type, &err) != 0 ||
        td_json_string(o, "searcher", "metric", true, "", s->metric, sizeof s->metric, &err) != 0 ||
        td_json_choice(o, "searcher", "mode", true, "", "min|max", &mode, &err) != 0 ||
        td_json_int(o, "searcher", "max_trials", false, 0, 1, TD_EXP_MAX_TRIALS, &max_trials,
                    &err) != 0 ||
        td_json_int(o, "searcher", "population", false, 0, 2, TD_EXP_MAX_CONCURRENT, &population,
                    &err) != 0)
        return td_submit_spec_error(e, &err);
    if (!s->metric[0])
        return fail(e, "searcher.metric",
                    "searcher.metric: expected the name of a member of the trials' metric lines "
                    "(loss, val_acc, or a command's own)");
    s->maximize = mode == 1;
    s->max_trials = (int)max_trials;
    if (strcmp(type, "grid") == 0) {
        s->searcher = TD_SEARCH_GRID;
    } else if (strcmp(type, "random") == 0 || strcmp(type, "asha") == 0) {
        s->searcher = type[0] == 'r' ? TD_SEARCH_RANDOM : TD_SEARCH_ASHA;
        if (!s->max_trials)
            return fail(e, "searcher.max_trials",
                        "searcher.max_trials: a%s %s search needs how many trials to draw (1 to "
                        "1000)",
                        type[0] == 'r' ? "" : "n", type);
    } else if (strcmp(type, "pbt") == 0) {
        s->searcher = TD_SEARCH_PBT;
        s->max_trials = (int)population;
    } else {
        return fail(e, "searcher.type",
                    "searcher.type: \"%s\" is not a searcher this traind has; expected grid, "
                    "random, asha or pbt",
                    type);
    }
    if (refuse_members(o, s->searcher, e) != 0) return -1;
    if (s->searcher == TD_SEARCH_ASHA) return read_asha(s, o, e);
    return s->searcher == TD_SEARCH_PBT ? read_pbt(s, o, e) : 0;
}

/* What PBT must not change between generations: the seed (a checkpoint of another seed is
 * refused: its data order would differ), the resources its slots were taken for (its time limit
 * among them), where its checkpoints go, its restarts, priority and name (a job keeps those
 * from its submission). */
static int check_pbt(const td_exp_spec *s, td_reply_error *e) {
    static const char *const fixed[] = {"train.seed", "resources", "checkpoint", "restart",
                                        "priority",   "name",      NULL};
    for (int i = 0; i < s->n_dims; i++)
        for (int k = 0; fixed[k]; k++) {
            const char *p = s->dims[i].path;
            if (strcmp(p, fixed[k]) != 0 && !leads_into(fixed[k], p)) continue;
            char field[TD_EXP_PATH_MAX + 16];
            snprintf(field, sizeof field, "space.%s", p);
            return fail(e, field,
                        "%s: a pbt search cannot change it between generations (a trial takes "
                        "another's checkpoint: its seed, resources, checkpoint place, restarts, "
                        "priority and name stay)",
                        field);
        }
    return 0;
}

/* A grid search walks grids and choices only, and at most TD_EXP_MAX_TRIALS points. */
static int check_grid(const td_exp_spec *s, td_reply_error *e) {
    double points = 1;
    for (int i = 0; i < s->n_dims; i++) {
        char field[TD_EXP_PATH_MAX + 16];
        snprintf(field, sizeof field, "space.%s", s->dims[i].path);
        if (s->dims[i].kind != TD_DIM_GRID && s->dims[i].kind != TD_DIM_CHOICE)
            return fail(e, field,
                        "%s: a grid search needs a grid or a choice at every path (use the "
                        "random searcher to draw from a range)",
                        field);
        points *= (double)json_array_size(s->dims[i].values);
    }
    if (points > TD_EXP_MAX_TRIALS && !s->max_trials)
        return fail(e, "space",
                    "space: the grid has more than 1000 points; make it smaller or give "
                    "searcher.max_trials");
    return 0;
}

static int read_members(td_exp_spec *s, json_t *root, td_reply_error *e) {
    static const char *const keys[] = {"name",           "job",  "space",    "searcher",
                                       "max_concurrent", "seed", "priority", NULL};
    td_err err = {{0}};
    long max_concurrent, priority;
    double seed;
    if (td_json_check_keys(root, "", keys, &err) != 0 ||
        td_json_string(root, "", "name", false, "experiment", s->name, sizeof s->name, &err) != 0 ||
        td_json_int(root, "", "max_concurrent", false, 8, 1, TD_EXP_MAX_CONCURRENT, &max_concurrent,
                    &err) != 0 ||
        td_json_number(root, "", "seed", false, 0, 0, 9007199254740991.0, &seed, &err) != 0)
        return td_submit_spec_error(e, &err);
    if (json_is_number(json_object_get(root, "seed")) &&
        !json_is_integer(json_object_get(root, "seed")))
        return fail(e, "seed", "seed: expected an integer");
    json_t *job = json_object_get(root, "job");
    if (!json_is_object(job))
        return fail(e, "job",
                    "job: expected the base job, an object as POST /v1/jobs takes (a train spec "
                    "or a command job, with its resources)");
    long job_priority;
    if (td_json_int(job, "job", "priority", false, 0, -1000000, 1000000, &job_priority, &err) !=
            0 ||
        td_json_int(root, "", "priority", false, job_priority, -1000000, 1000000, &priority,
                    &err) != 0)
        return td_submit_spec_error(e, &err);
    s->job = json_incref(job);
    s->max_concurrent = (int)max_concurrent;
    s->seed = (uint64_t)seed;
    s->priority = (int)priority;
    return 0;
}

int td_exp_spec_parse(td_exp_spec *s, const char *body, size_t len, td_reply_error *e) {
    memset(s, 0, sizeof *s);
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char line[32];
        snprintf(line, sizeof line, "%d", jerr.line);
        return td_reply_fail(e, 400, "invalid_json", NULL, "the body is not JSON: line %s: %s",
                             line, jerr.text);
    }
    int rc = json_is_object(root) ? 0 : fail(e, NULL, "the body: expected an experiment object");
    if (rc == 0) rc = read_members(s, root, e);
    if (rc == 0) rc = read_searcher(s, root, e);
    if (rc == 0) rc = read_space(s, json_object_get(root, "space"), e);
    if (rc == 0) rc = check_space(s, e);
    if (rc == 0 && s->searcher == TD_SEARCH_GRID) rc = check_grid(s, e);
    if (rc == 0 && s->searcher == TD_SEARCH_PBT) rc = check_pbt(s, e);
    json_decref(root);
    if (rc != 0) td_exp_spec_free(s);
    return rc;
}

void td_exp_spec_free(td_exp_spec *s) {
    for (int i = 0; i < s->n_dims; i++) json_decref(s->dims[i].values);
    free(s->dims);
    json_decref(s->job);
    memset(s, 0, sizeof *s);
}
