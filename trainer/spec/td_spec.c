/* Reading the job spec. Every accessor takes the JSON path of what it reads, so each error can
 * say exactly where the problem is: "train.optimizer.lr: expected a number > 0, found \"fast\"". */
#include "spec/td_spec.h"
#include "ops/td_ops.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A short rendering of a JSON value for messages. */
static void describe(const json_t *v, char *buf, size_t len) {
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!text) {
        snprintf(buf, len, "(unprintable)");
        return;
    }
    if (strlen(text) > 60)
        snprintf(buf, len, "%.57s...", text);
    else
        snprintf(buf, len, "%s", text);
    free(text);
}

static int fail_found(td_err *err, const char *path, const char *expected, const json_t *v) {
    char found[80];
    describe(v, found, sizeof found);
    return td_fail(err, "%s: expected %s, found %s", path, expected, found);
}

static void join(char *out, size_t len, const char *path, const char *key) {
    snprintf(out, len, "%s%s%s", path, *path ? "." : "", key);
}

/* Every key of obj must be in allowed (NULL-terminated). */
static int check_keys(const json_t *obj, const char *path, const char *const *allowed,
                      td_err *err) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        bool ok = false;
        for (int i = 0; allowed[i]; i++) ok = ok || strcmp(key, allowed[i]) == 0;
        if (!ok) {
            char list[512] = "";
            size_t used = 0;
            for (int i = 0; allowed[i] && used < sizeof list; i++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                         allowed[i]);
            char where[TD_PATH_MAX];
            join(where, sizeof where, path, key);
            return td_fail(err, "%s: unknown key; expected one of: %s", where, list);
        }
    }
    return 0;
}

static int get_object(const json_t *obj, const char *path, const char *key, bool required,
                      json_t **out, td_err *err) {
    char where[TD_PATH_MAX];
    join(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v) return required ? td_fail(err, "%s: missing; expected an object", where) : 0;
    if (!json_is_object(v)) return fail_found(err, where, "an object", v);
    *out = v;
    return 0;
}

static int get_number(const json_t *obj, const char *path, const char *key, bool required,
                      double def, double min, double max, double *out, td_err *err) {
    char where[TD_PATH_MAX];
    join(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required) return td_fail(err, "%s: missing; expected a number", where);
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return fail_found(err, where, "a number", v);
    double d = json_number_value(v);
    if (!(d >= min && d <= max)) {
        char expected[128];
        snprintf(expected, sizeof expected, "a number in [%g, %g]", min, max);
        return fail_found(err, where, expected, v);
    }
    *out = d;
    return 0;
}

static int get_int(const json_t *obj, const char *path, const char *key, bool required, long def,
                   long min, long max, long *out, td_err *err) {
    char where[TD_PATH_MAX];
    join(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required) return td_fail(err, "%s: missing; expected an integer", where);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v)) return fail_found(err, where, "an integer", v);
    long long d = json_integer_value(v);
    if (d < min || d > max) {
        char expected[128];
        snprintf(expected, sizeof expected, "an integer in [%ld, %ld]", min, max);
        return fail_found(err, where, expected, v);
    }
    *out = (long)d;
    return 0;
}

static int get_bool(const json_t *obj, const char *path, const char *key, bool def, bool *out,
                    td_err *err) {
    char where[TD_PATH_MAX];
    join(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return fail_found(err, where, "true or false", v);
    *out = json_is_true(v);
    return 0;
}

static int get_string(const json_t *obj, const char *path, const char *key, bool required,
                      const char *def, char *out, size_t len, td_err *err) {
    char where[TD_PATH_MAX];
    join(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required) return td_fail(err, "%s: missing; expected a string", where);
        snprintf(out, len, "%s", def);
        return 0;
    }
    if (!json_is_string(v)) return fail_found(err, where, "a string", v);
    if (strlen(json_string_value(v)) >= len)
        return td_fail(err, "%s: longer than %zu characters", where, len - 1);
    snprintf(out, len, "%s", json_string_value(v));
    return 0;
}

/* A string that must be one of "a|b|c"; returns its index. */
static int get_choice(const json_t *obj, const char *path, const char *key, bool required,
                      const char *def, const char *choices, int *out, td_err *err) {
    char value[64], where[TD_PATH_MAX];
    if (get_string(obj, path, key, required, def, value, sizeof value, err) != 0) return -1;
    int index = 0;
    const char *p = choices;
    while (*p) {
        size_t n = strcspn(p, "|");
        if (strlen(value) == n && strncmp(p, value, n) == 0) {
            *out = index;
            return 0;
        }
        p += n + (p[n] == '|');
        index++;
    }
    join(where, sizeof where, path, key);
    char expected[256];
    snprintf(expected, sizeof expected, "one of %s", choices);
    for (char *c = expected; *c; c++)
        if (*c == '|') *c = '/';
    return fail_found(err, where, expected, json_object_get(obj, key));
}

/* ---- model ---------------------------------------------------------------------------- */

static int parse_node(const json_t *v, int index, td_node_spec *s, td_err *err) {
    char path[64];
    snprintf(path, sizeof path, "model.nodes[%d]", index);
    if (!json_is_object(v)) return fail_found(err, path, "an object {\"name\", \"op\", ...}", v);
    memset(s, 0, sizeof *s);
    char op_name[64];
    if (get_string(v, path, "name", true, "", s->name, sizeof s->name, err) != 0) return -1;
    if (get_string(v, path, "op", true, "", op_name, sizeof op_name, err) != 0) return -1;
    s->op = td_op_find(op_name);
    if (!s->op)
        return td_fail(err, "%s.op: unknown op \"%s\"; expected one of: %s", path, op_name,
                       td_op_names());
    const char *allowed[TD_MAX_OP_ARGS + 4] = {"name", "op", "inputs"};
    int n_allowed = 3;
    for (int i = 0; s->op->args[i].name; i++) allowed[n_allowed++] = s->op->args[i].name;
    allowed[n_allowed] = NULL;
    if (check_keys(v, path, allowed, err) != 0) return -1;
    for (int i = 0; s->op->args[i].name; i++) {
        const td_op_arg *a = &s->op->args[i];
        long l = 0;
        bool b = false;
        int c = 0;
        switch (a->type) {
        case TD_ARG_INT:
            if (get_int(v, path, a->name, a->required, (long)a->def, (long)a->min, (long)a->max, &l,
                        err) != 0)
                return -1;
            s->args[i] = (double)l;
            break;
        case TD_ARG_FLOAT:
            if (get_number(v, path, a->name, a->required, a->def, a->min, a->max, &s->args[i],
                           err) != 0)
                return -1;
            break;
        case TD_ARG_BOOL:
            if (get_bool(v, path, a->name, a->def != 0, &b, err) != 0) return -1;
            s->args[i] = b;
            break;
        case TD_ARG_CHOICE: {
            char def[32];
            size_t n = strcspn(a->choices, "|");
            snprintf(def, sizeof def, "%.*s", (int)n, a->choices);
            if (get_choice(v, path, a->name, a->required, def, a->choices, &c, err) != 0) return -1;
            s->args[i] = c;
            break;
        }
        }
    }
    json_t *inputs = json_object_get(v, "inputs");
    if (inputs) {
        char where[96];
        snprintf(where, sizeof where, "%s.inputs", path);
        if (!json_is_array(inputs) || json_array_size(inputs) == 0 ||
            json_array_size(inputs) > TD_MAX_INPUTS)
            return fail_found(err, where, "an array of 1 to 4 node names", inputs);
        s->n_inputs = (int)json_array_size(inputs);
        for (int j = 0; j < s->n_inputs; j++) {
            json_t *name = json_array_get(inputs, (size_t)j);
            snprintf(where, sizeof where, "%s.inputs[%d]", path, j);
            if (!json_is_string(name)) return fail_found(err, where, "a node name", name);
            snprintf(s->inputs[j], sizeof s->inputs[j], "%s", json_string_value(name));
        }
    }
    return 0;
}

static int parse_model(const json_t *root, td_job *job, td_err *err) {
    json_t *m;
    if (get_object(root, "", "model", true, &m, err) != 0) return -1;
    json_t *nodes = json_object_get(m, "nodes");
    json_t *preset = json_object_get(m, "preset");
    if (nodes && preset)
        return td_fail(err, "model: has both \"preset\" and \"nodes\"; expected one of them");
    if (get_string(m, "model", "init_from", false, "", job->init_from, sizeof job->init_from,
                   err) != 0 ||
        get_bool(m, "model", "strict", true, &job->init_strict, err) != 0)
        return -1;
    long classes;
    if (get_int(m, "model", "num_classes", preset != NULL, 0, 1, 1 << 20, &classes, err) != 0)
        return -1;
    job->num_classes = (int)classes;
    if (nodes) {
        static const char *const keys[] = {"nodes", "num_classes", "init_from", "strict", NULL};
        if (check_keys(m, "model", keys, err) != 0) return -1;
        if (!json_is_array(nodes) || json_array_size(nodes) == 0)
            return fail_found(err, "model.nodes", "a non-empty array of nodes", nodes);
        job->n_nodes = (int)json_array_size(nodes);
        job->nodes = td_calloc((size_t)job->n_nodes, sizeof *job->nodes);
        for (int i = 0; i < job->n_nodes; i++)
            if (parse_node(json_array_get(nodes, (size_t)i), i, &job->nodes[i], err) != 0)
                return -1;
        return 0;
    }
    if (!preset) return td_fail(err, "model: missing; expected \"preset\" or \"nodes\"");
    int which;
    if (get_choice(m, "model", "preset", true, "",
                   "lenet5|mlp|cifar_net|resnet18|resnet34|resnet50", &which, err) != 0)
        return -1;
    if (which == 0 || which == 2) {
        static const char *const keys[] = {"preset", "num_classes", "init_from", "strict", NULL};
        if (check_keys(m, "model", keys, err) != 0) return -1;
        return which == 0 ? td_preset_lenet5(job->num_classes, &job->nodes, &job->n_nodes)
                          : td_preset_cifar_net(job->num_classes, &job->nodes, &job->n_nodes);
    }
    if (which >= 3) {
        static const char *const keys[] = {"preset",    "num_classes", "stem", "zero_init_residual",
                                           "init_from", "strict",      NULL};
        if (check_keys(m, "model", keys, err) != 0) return -1;
        int stem;
        bool zero_init;
        if (get_choice(m, "model", "stem", false, "imagenet", "imagenet|cifar", &stem, err) != 0 ||
            get_bool(m, "model", "zero_init_residual", false, &zero_init, err) != 0)
            return -1;
        static const int depths[] = {18, 34, 50};
        return td_preset_resnet(depths[which - 3], job->num_classes,
                                stem ? TD_STEM_CIFAR : TD_STEM_IMAGENET, zero_init, &job->nodes,
                                &job->n_nodes);
    }
    static const char *const keys[] = {"preset",  "num_classes", "hidden", "activation",
                                       "dropout", "init_from",   "strict", NULL};
    if (check_keys(m, "model", keys, err) != 0) return -1;
    td_mlp_options opt = {.n_hidden = 2, .hidden = {512, 512}};
    json_t *hidden = json_object_get(m, "hidden");
    if (hidden) {
        if (!json_is_array(hidden) || json_array_size(hidden) > 16)
            return fail_found(err, "model.hidden", "an array of up to 16 layer widths", hidden);
        opt.n_hidden = (int)json_array_size(hidden);
        for (int i = 0; i < opt.n_hidden; i++) {
            json_t *h = json_array_get(hidden, (size_t)i);
            char where[64];
            snprintf(where, sizeof where, "model.hidden[%d]", i);
            if (!json_is_integer(h) || json_integer_value(h) < 1 ||
                json_integer_value(h) > (1 << 20))
                return fail_found(err, where, "a positive integer width", h);
            opt.hidden[i] = (int)json_integer_value(h);
        }
    }
    int act;
    if (get_choice(m, "model", "activation", false, "relu", "relu|gelu", &act, err) != 0) return -1;
    opt.activation = act == 0 ? &td_op_relu : &td_op_gelu;
    double dropout;
    if (get_number(m, "model", "dropout", false, 0, 0, 0.999, &dropout, err) != 0) return -1;
    opt.dropout = (float)dropout;
    return td_preset_mlp(&opt, job->num_classes, &job->nodes, &job->n_nodes);
}

/* ---- data ----------------------------------------------------------------------------- */

static int parse_split(const json_t *d, td_data_format format, const char *key, bool required,
                       td_split_spec *split, td_err *err) {
    json_t *s;
    if (get_object(d, "data", key, required, &s, err) != 0) return -1;
    if (!s) return 0;
    char path[32];
    snprintf(path, sizeof path, "data.%s", key);
    split->present = true;
    if (format == TD_DATA_CSV) {
        static const char *const keys[] = {"path", NULL};
        if (check_keys(s, path, keys, err) != 0) return -1;
        return get_string(s, path, "path", true, "", split->images, sizeof split->images, err);
    }
    if (format == TD_DATA_CIFAR10) {
        static const char *const keys[] = {"files", NULL};
        if (check_keys(s, path, keys, err) != 0) return -1;
        json_t *files = json_object_get(s, "files");
        char where[64];
        snprintf(where, sizeof where, "%s.files", path);
        if (!json_is_array(files) || json_array_size(files) == 0 ||
            json_array_size(files) > TD_MAX_FILES)
            return fail_found(err, where, "an array of 1 to 16 batch file paths",
                              files ? files : json_null());
        split->n_files = (int)json_array_size(files);
        for (int i = 0; i < split->n_files; i++) {
            json_t *f = json_array_get(files, (size_t)i);
            snprintf(where, sizeof where, "%s.files[%d]", path, i);
            if (!json_is_string(f) || strlen(json_string_value(f)) >= TD_PATH_MAX)
                return fail_found(err, where, "a file path", f);
            snprintf(split->files[i], TD_PATH_MAX, "%s", json_string_value(f));
        }
        return 0;
    }
    static const char *const keys[] = {"images", "labels", NULL};
    if (check_keys(s, path, keys, err) != 0) return -1;
    if (get_string(s, path, "images", true, "", split->images, sizeof split->images, err) != 0 ||
        get_string(s, path, "labels", true, "", split->labels, sizeof split->labels, err) != 0)
        return -1;
    return 0;
}

static int parse_augment(const json_t *d, td_job *job, td_err *err) {
    json_t *a;
    if (get_object(d, "data", "augment", false, &a, err) != 0) return -1;
    if (!a) return 0;
    static const char *const keys[] = {"random_crop", "horizontal_flip", NULL};
    if (check_keys(a, "data.augment", keys, err) != 0) return -1;
    json_t *crop;
    if (get_object(a, "data.augment", "random_crop", false, &crop, err) != 0) return -1;
    if (crop) {
        static const char *const ckeys[] = {"padding", NULL};
        long pad;
        if (check_keys(crop, "data.augment.random_crop", ckeys, err) != 0 ||
            get_int(crop, "data.augment.random_crop", "padding", true, 0, 1, 64, &pad, err) != 0)
            return -1;
        job->augment.crop_padding = (int)pad;
    }
    return get_bool(a, "data.augment", "horizontal_flip", false, &job->augment.hflip, err);
}

static int parse_float_list(const json_t *obj, const char *path, const char *key, int n_max,
                            float *out, int *n_out, bool positive, td_err *err) {
    char where[64];
    join(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) return td_fail(err, "%s: missing; expected an array of per-channel numbers", where);
    if (!json_is_array(v) || json_array_size(v) == 0 || (int)json_array_size(v) > n_max)
        return fail_found(err, where, "an array of 1 to 4 per-channel numbers", v);
    *n_out = (int)json_array_size(v);
    for (int i = 0; i < *n_out; i++) {
        json_t *x = json_array_get(v, (size_t)i);
        char at[80];
        snprintf(at, sizeof at, "%s[%d]", where, i);
        if (!json_is_number(x) || (positive && json_number_value(x) <= 0))
            return fail_found(err, at, positive ? "a number > 0" : "a number", x);
        out[i] = (float)json_number_value(x);
    }
    return 0;
}

/* data.num_workers: "auto" (0) or a count of loader threads, DataLoader's num_workers (which
 * loads in the training process at 0; here a loader thread always overlaps the step). */
static int parse_num_workers(const json_t *d, int *out, td_err *err) {
    const json_t *v = json_object_get(d, "num_workers");
    *out = 0;
    if (!v || (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 64)
        return fail_found(err, "data.num_workers", "\"auto\" or an integer in [1, 64]", v);
    *out = (int)json_integer_value(v);
    return 0;
}

static int parse_data(const json_t *root, td_job *job, td_err *err) {
    json_t *d;
    if (get_object(root, "", "data", true, &d, err) != 0) return -1;
    int format;
    if (get_choice(d, "data", "format", true, "", "idx|synthetic|npy|cifar10|csv", &format, err) !=
        0)
        return -1;
    job->format = (td_data_format)format;
    switch (job->format) {
    case TD_DATA_IDX:
    case TD_DATA_CIFAR10: {
        static const char *const keys[] = {"format",  "train",       "val", "normalize",
                                           "augment", "num_workers", NULL};
        if (check_keys(d, "data", keys, err) != 0) return -1;
        break;
    }
    case TD_DATA_NPY: {
        static const char *const keys[] = {"format",    "train",   "val",         "layout",
                                           "normalize", "augment", "num_workers", NULL};
        int layout;
        if (check_keys(d, "data", keys, err) != 0 ||
            get_choice(d, "data", "layout", false, "NCHW", "NCHW|NHWC", &layout, err) != 0)
            return -1;
        job->nhwc = layout == 1;
        break;
    }
    case TD_DATA_CSV: {
        static const char *const keys[] = {"format", "train",     "val",         "label_column",
                                           "header", "normalize", "num_workers", NULL};
        long col;
        if (check_keys(d, "data", keys, err) != 0 ||
            get_int(d, "data", "label_column", false, 0, 0, 1 << 20, &col, err) != 0 ||
            get_bool(d, "data", "header", false, &job->csv_header, err) != 0)
            return -1;
        job->label_column = (int)col;
        break;
    }
    case TD_DATA_SYNTHETIC: {
        static const char *const keys[] = {"format",  "shape",       "num_classes",
                                           "size",    "val_size",    "normalize",
                                           "augment", "num_workers", NULL};
        if (check_keys(d, "data", keys, err) != 0) return -1;
        json_t *shape = json_object_get(d, "shape");
        if (!shape || !json_is_array(shape) || json_array_size(shape) != 3)
            return fail_found(err, "data.shape", "[channels, height, width]",
                              shape ? shape : json_null());
        int dims[3];
        for (int i = 0; i < 3; i++) {
            json_t *x = json_array_get(shape, (size_t)i);
            if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 4096)
                return fail_found(err, "data.shape", "three positive integers [C, H, W]", shape);
            dims[i] = (int)json_integer_value(x);
        }
        if (dims[0] > 4)
            return td_fail(err, "data.shape[0]: %d channels; at most 4 are supported", dims[0]);
        job->synthetic_shape = td_shape_image(dims[0], dims[1], dims[2]);
        long classes, size, val_size;
        if (get_int(d, "data", "num_classes", true, 0, 1, 1 << 20, &classes, err) != 0 ||
            get_int(d, "data", "size", true, 0, 1, 1 << 28, &size, err) != 0 ||
            get_int(d, "data", "val_size", false, 0, 0, 1 << 28, &val_size, err) != 0)
            return -1;
        if (job->num_classes && job->num_classes != classes)
            return td_fail(err,
                           "data.num_classes: %ld, but model.num_classes is %d; they must "
                           "agree",
                           classes, job->num_classes);
        job->num_classes = (int)classes;
        job->train.present = true;
        job->train.size = (int)size;
        job->val.present = val_size > 0;
        job->val.size = (int)val_size;
        break;
    }
    }
    if (parse_num_workers(d, &job->num_workers, err) != 0) return -1;
    if (job->format != TD_DATA_SYNTHETIC &&
        (parse_split(d, job->format, "train", true, &job->train, err) != 0 ||
         parse_split(d, job->format, "val", false, &job->val, err) != 0))
        return -1;
    if (parse_augment(d, job, err) != 0) return -1;
    json_t *norm;
    if (get_object(d, "data", "normalize", false, &norm, err) != 0) return -1;
    job->norm.channels = 0;
    if (norm) {
        static const char *const keys[] = {"mean", "std", NULL};
        if (check_keys(norm, "data.normalize", keys, err) != 0) return -1;
        int nm, ns;
        if (parse_float_list(norm, "data.normalize", "mean", 4, job->norm.mean, &nm, false, err) !=
                0 ||
            parse_float_list(norm, "data.normalize", "std", 4, job->norm.std, &ns, true, err) != 0)
            return -1;
        if (nm != ns)
            return td_fail(err,
                           "data.normalize: mean has %d values but std has %d; expected one "
                           "of each per channel",
                           nm, ns);
        job->norm.channels = nm;
        job->norm_given = true;
    }
    return 0;
}

/* ---- train ---------------------------------------------------------------------------- */

static int parse_optimizer(const json_t *t, td_job *job, td_err *err) {
    json_t *o;
    if (get_object(t, "train", "optimizer", true, &o, err) != 0) return -1;
    const char *p = "train.optimizer";
    int kind;
    if (get_choice(o, p, "type", true, "", "sgd|adam|adamw", &kind, err) != 0) return -1;
    td_optim_config *c = &job->optim;
    c->kind = kind == 0 ? TD_OPTIM_SGD : kind == 1 ? TD_OPTIM_ADAM : TD_OPTIM_ADAMW;
    double lr, wd, v;
    if (get_number(o, p, "lr", true, 0, 1e-12, 1e6, &lr, err) != 0) return -1;
    c->lr = (float)lr;
    /* PyTorch's defaults: AdamW decays by 0.01, the others not at all */
    if (get_number(o, p, "weight_decay", false, c->kind == TD_OPTIM_ADAMW ? 0.01 : 0.0, 0, 10, &wd,
                   err) != 0)
        return -1;
    c->weight_decay = (float)wd;
    if (c->kind == TD_OPTIM_SGD) {
        static const char *const keys[] = {
            "type", "lr", "weight_decay", "momentum", "dampening", "nesterov", NULL};
        if (check_keys(o, p, keys, err) != 0) return -1;
        if (get_number(o, p, "momentum", false, 0, 0, 1, &v, err) != 0) return -1;
        c->momentum = (float)v;
        if (get_number(o, p, "dampening", false, 0, 0, 1, &v, err) != 0) return -1;
        c->dampening = (float)v;
        if (get_bool(o, p, "nesterov", false, &c->nesterov, err) != 0) return -1;
        if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
            return td_fail(err, "train.optimizer.nesterov: needs momentum > 0 and dampening 0 "
                                "(as in PyTorch)");
        return 0;
    }
    static const char *const keys[] = {"type", "lr", "weight_decay", "betas", "eps", NULL};
    if (check_keys(o, p, keys, err) != 0) return -1;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    json_t *betas = json_object_get(o, "betas");
    if (betas) {
        if (!json_is_array(betas) || json_array_size(betas) != 2 ||
            !json_is_number(json_array_get(betas, 0)) || !json_is_number(json_array_get(betas, 1)))
            return fail_found(err, "train.optimizer.betas", "[beta1, beta2]", betas);
        double b1 = json_number_value(json_array_get(betas, 0));
        double b2 = json_number_value(json_array_get(betas, 1));
        if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1))
            return fail_found(err, "train.optimizer.betas", "two numbers in [0, 1)", betas);
        c->beta1 = (float)b1;
        c->beta2 = (float)b2;
    }
    if (get_number(o, p, "eps", false, 1e-8, 0, 1, &v, err) != 0) return -1;
    c->eps = (float)v;
    return 0;
}

static int parse_schedule(const json_t *t, td_job *job, td_err *err) {
    json_t *s;
    td_schedule *sc = &job->schedule;
    memset(sc, 0, sizeof *sc);
    sc->kind = TD_SCHED_CONSTANT;
    if (get_object(t, "train", "schedule", false, &s, err) != 0) return -1;
    if (!s) return 0;
    const char *p = "train.schedule";
    static const char *const keys[] = {"type",       "warmup_steps", "step_size",  "gamma",
                                       "milestones", "min_lr",       "end_factor", NULL};
    if (check_keys(s, p, keys, err) != 0) return -1;
    int kind;
    if (get_choice(s, p, "type", false, "constant", "constant|step|multistep|cosine|linear", &kind,
                   err) != 0)
        return -1;
    sc->kind = (td_schedule_kind)kind;
    long l;
    double v;
    if (get_int(s, p, "warmup_steps", false, 0, 0, 1L << 40, &l, err) != 0) return -1;
    sc->warmup_steps = l;
    if (get_number(s, p, "gamma", false, 0.1, 0, 10, &v, err) != 0) return -1;
    sc->gamma = (float)v;
    if (get_int(s, p, "step_size", sc->kind == TD_SCHED_STEP, 1, 1, 1L << 40, &l, err) != 0)
        return -1;
    sc->step_size = l;
    if (get_number(s, p, "min_lr", false, 0, 0, 1e6, &v, err) != 0) return -1;
    sc->min_lr = (float)v;
    if (get_number(s, p, "end_factor", false, 0, 0, 1e6, &v, err) != 0) return -1;
    sc->end_factor = (float)v;
    json_t *ms = json_object_get(s, "milestones");
    if (sc->kind == TD_SCHED_MULTISTEP && !ms)
        return td_fail(err, "train.schedule.milestones: missing; expected an increasing array of "
                            "step counts");
    if (ms) {
        if (!json_is_array(ms) || json_array_size(ms) > TD_MAX_MILESTONES)
            return fail_found(err, "train.schedule.milestones",
                              "an increasing array of up to 32 step counts", ms);
        sc->n_milestones = (int)json_array_size(ms);
        for (int i = 0; i < sc->n_milestones; i++) {
            json_t *x = json_array_get(ms, (size_t)i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                (i > 0 && json_integer_value(x) <= sc->milestones[i - 1]))
                return fail_found(err, "train.schedule.milestones",
                                  "an increasing array of non-negative step counts", ms);
            sc->milestones[i] = (long)json_integer_value(x);
        }
    }
    return 0;
}

/* train.activation_checkpointing: segments named by module prefix ("layer1.0") or by
 * {"first": node, "last": node}, marked on the model's nodes. */
static int parse_recompute(const json_t *t, td_job *job, td_err *err) {
    const char *path = "train.activation_checkpointing";
    json_t *list = json_object_get(t, "activation_checkpointing");
    if (!list) return 0;
    const char *expected = "an array of segments, each a module prefix such as \"layer1.0\" or "
                           "{\"first\": node name, \"last\": node name}";
    if (!json_is_array(list)) return fail_found(err, path, expected, list);
    int n = (int)json_array_size(list);
    td_segment_name *names = td_calloc(n ? (size_t)n : 1, sizeof *names);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        json_t *e = json_array_get(list, (size_t)i);
        char where[TD_PATH_MAX];
        snprintf(where, sizeof where, "%s[%d]", path, i);
        if (json_is_string(e)) {
            rc = strlen(json_string_value(e)) >= TD_NAME_MAX
                     ? td_fail(err, "%s: longer than %d characters", where, TD_NAME_MAX - 1)
                     : 0;
            snprintf(names[i].first, sizeof names[i].first, "%s", json_string_value(e));
            continue;
        }
        static const char *const keys[] = {"first", "last", NULL};
        if (!json_is_object(e))
            rc = fail_found(err, where, "a module prefix or {\"first\": ..., \"last\": ...}", e);
        else if (check_keys(e, where, keys, err) != 0 ||
                 get_string(e, where, "first", true, "", names[i].first, sizeof names[i].first,
                            err) != 0 ||
                 get_string(e, where, "last", true, "", names[i].last, sizeof names[i].last, err) !=
                     0)
            rc = -1;
        else if (!names[i].last[0])
            rc = td_fail(err, "%s.last: empty; expected a node name", where);
    }
    if (rc == 0 && td_segments_assign(job->nodes, job->n_nodes, names, n, err) != 0) {
        char msg[TD_ERR_MAX]; /* "[2]: ..." joins the path without the usual ": " */
        memcpy(msg, err->msg, sizeof msg);
        rc = td_fail(err, "%s%s", path, msg);
    }
    job->n_segments = n;
    free(names);
    return rc;
}

static int parse_train(const json_t *root, td_job *job, td_err *err) {
    json_t *t;
    if (get_object(root, "", "train", true, &t, err) != 0) return -1;
    static const char *const keys[] = {
        "epochs",          "max_steps",     "batch_size",
        "eval_batch_size", "seed",          "threads",
        "shuffle",         "drop_last",     "optimizer",
        "schedule",        "loss",          "clip_grad_norm",
        "sync_bn",         "grad_accum",    "device",
        "precision",       "cuda_graph",    "activation_checkpointing",
        "cudnn_benchmark", "deterministic", NULL};
    if (check_keys(t, "train", keys, err) != 0) return -1;
    int choice;
    if (get_choice(t, "train", "device", false, "auto", "auto|cpu|cuda", &choice, err) != 0)
        return -1;
    job->device = choice == 0 ? TD_DEVICE_AUTO : choice == 1 ? TD_DEVICE_CPU : TD_DEVICE_CUDA;
    if (get_choice(t, "train", "precision", false, "fp32", "fp32|bf16|fp16", &choice, err) != 0)
        return -1;
    job->precision = choice == 0 ? TD_PREC_FP32 : choice == 1 ? TD_PREC_BF16 : TD_PREC_FP16;
    if (get_bool(t, "train", "cuda_graph", true, &job->cuda_graph, err) != 0 ||
        get_bool(t, "train", "cudnn_benchmark", false, &job->cudnn_benchmark, err) != 0 ||
        get_bool(t, "train", "deterministic", true, &job->deterministic, err) != 0)
        return -1;
    if (parse_recompute(t, job, err) != 0) return -1;
    long l;
    if (get_int(t, "train", "epochs", false, 1, 1, 1000000, &l, err) != 0) return -1;
    job->epochs = (int)l;
    if (get_int(t, "train", "max_steps", false, 0, 0, 1L << 40, &l, err) != 0) return -1;
    job->max_steps = l;
    if (get_int(t, "train", "batch_size", true, 0, 1, 1 << 20, &l, err) != 0) return -1;
    job->batch_size = (int)l;
    if (get_int(t, "train", "eval_batch_size", false, job->batch_size, 1, 1 << 20, &l, err) != 0)
        return -1;
    job->eval_batch_size = (int)l;
    if (get_int(t, "train", "seed", false, 0, 0, (long)(~0ul >> 1), &l, err) != 0) return -1;
    job->seed = (uint64_t)l;
    if (get_int(t, "train", "threads", false, 1, 1, 1024, &l, err) != 0) return -1;
    job->threads = (int)l;
    if (get_bool(t, "train", "sync_bn", false, &job->sync_bn, err) != 0) return -1;
    if (get_int(t, "train", "grad_accum", false, 1, 1, 1 << 16, &l, err) != 0) return -1;
    job->grad_accum = (int)l;
    if (get_bool(t, "train", "shuffle", true, &job->shuffle, err) != 0 ||
        get_bool(t, "train", "drop_last", false, &job->drop_last, err) != 0)
        return -1;
    double v;
    if (get_number(t, "train", "clip_grad_norm", false, 0, 0, 1e12, &v, err) != 0) return -1;
    job->clip_grad_norm = (float)v;
    if (parse_optimizer(t, job, err) != 0 || parse_schedule(t, job, err) != 0) return -1;
    json_t *loss;
    if (get_object(t, "train", "loss", false, &loss, err) != 0) return -1;
    job->loss.kind = TD_LOSS_CROSS_ENTROPY;
    if (loss) {
        static const char *const lkeys[] = {"type", "label_smoothing", NULL};
        if (check_keys(loss, "train.loss", lkeys, err) != 0) return -1;
        int kind;
        if (get_choice(loss, "train.loss", "type", false, "cross_entropy", "cross_entropy|mse",
                       &kind, err) != 0)
            return -1;
        job->loss.kind = kind == 0 ? TD_LOSS_CROSS_ENTROPY : TD_LOSS_MSE;
        if (get_number(loss, "train.loss", "label_smoothing", false, 0, 0, 1, &v, err) != 0)
            return -1;
        job->loss.label_smoothing = (float)v;
        if (job->loss.kind == TD_LOSS_MSE && v != 0)
            return td_fail(err, "train.loss.label_smoothing: only applies to cross_entropy");
    }
    return 0;
}

static int parse_checkpoint(const json_t *root, td_job *job, td_err *err) {
    if (get_string(root, "", "resume_from", false, "", job->resume_from, sizeof job->resume_from,
                   err) != 0)
        return -1;
    json_t *c;
    if (get_object(root, "", "checkpoint", false, &c, err) != 0) return -1;
    if (!c) {
        if (strcmp(job->resume_from, "latest") == 0)
            return td_fail(err, "resume_from: \"latest\" needs checkpoint.dir to look in");
        return 0;
    }
    static const char *const keys[] = {"dir", "every_steps", "every_epochs", "keep", NULL};
    if (check_keys(c, "checkpoint", keys, err) != 0) return -1;
    long steps, epochs, keep;
    if (get_string(c, "checkpoint", "dir", true, "", job->checkpoint_dir,
                   sizeof job->checkpoint_dir, err) != 0 ||
        get_int(c, "checkpoint", "every_steps", false, 0, 0, 1L << 40, &steps, err) != 0 ||
        get_int(c, "checkpoint", "every_epochs", false, 0, 0, 1 << 20, &epochs, err) != 0 ||
        get_int(c, "checkpoint", "keep", false, 0, 0, 1 << 20, &keep, err) != 0)
        return -1;
    job->checkpoint_every_steps = steps;
    job->checkpoint_every_epochs = (int)epochs;
    job->checkpoint_keep = (int)keep;
    return 0;
}

const char *const td_job_keys[] = {"name",       "model",       "data",        "train", "log",
                                   "checkpoint", "resume_from", "distributed", NULL};

static int parse_job(const json_t *root, td_job *job, td_err *err) {
    memset(job, 0, sizeof *job);
    if (!json_is_object(root)) return fail_found(err, "(root)", "a JSON object", root);
    if (check_keys(root, "", td_job_keys, err) != 0) return -1;
    if (get_string(root, "", "name", false, "job", job->name, sizeof job->name, err) != 0)
        return -1;
    if (parse_model(root, job, err) != 0 || parse_data(root, job, err) != 0 ||
        parse_train(root, job, err) != 0)
        return -1;
    if (parse_checkpoint(root, job, err) != 0) return -1;
    json_t *log;
    long l;
    if (get_object(root, "", "log", false, &log, err) != 0) return -1;
    job->log_every = 100;
    if (log) {
        static const char *const lkeys[] = {"every_steps", NULL};
        if (check_keys(log, "log", lkeys, err) != 0) return -1;
        if (get_int(log, "log", "every_steps", false, 100, 1, 1L << 40, &l, err) != 0) return -1;
        job->log_every = (int)l;
    }
    json_t *dist;
    if (get_object(root, "", "distributed", false, &dist, err) != 0) return -1;
    job->bucket_cap_mb = 25.0; /* DDP's default */
    if (dist) {
        static const char *const dkeys[] = {"bucket_cap_mb", "backend", NULL};
        if (check_keys(dist, "distributed", dkeys, err) != 0) return -1;
        int backend;
        if (get_choice(dist, "distributed", "backend", false, "auto", "auto|nccl|cpu", &backend,
                       err) != 0)
            return -1;
        job->backend = backend == 0   ? TD_BACKEND_AUTO
                       : backend == 1 ? TD_BACKEND_NCCL
                                      : TD_BACKEND_CPU;
        if (get_number(dist, "distributed", "bucket_cap_mb", false, 25.0, 1e-6, 1e6,
                       &job->bucket_cap_mb, err) != 0)
            return -1;
    }
    return 0;
}

static int finish(json_t *root, td_job *job, td_err *err) {
    int rc = parse_job(root, job, err);
    json_decref(root);
    if (rc != 0) td_job_free(job);
    return rc;
}

int td_job_load_file(td_job *job, const char *path, td_err *err) {
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

int td_job_load_string(td_job *job, const char *text, td_err *err) {
    json_error_t jerr;
    memset(job, 0, sizeof *job);
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return td_fail(err, "spec:%d:%d: invalid JSON: %s", jerr.line, jerr.column, jerr.text);
    return finish(root, job, err);
}

void td_job_free(td_job *job) {
    free(job->nodes);
    job->nodes = NULL;
    job->n_nodes = 0;
}
