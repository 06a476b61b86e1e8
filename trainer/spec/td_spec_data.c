/* The spec's data section: the format and its files per split, normalisation, augmentation and
 * the loader's threads. */
#include "spec/td_spec_private.h"

#include "base/td_json.h"
#include "ops/td_ops.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_split(const json_t *d, td_data_format format, const char *key, bool required,
                       td_split_spec *split, td_err *err) {
    json_t *s;
    if (td_json_object(d, "data", key, required, &s, err) != 0) return -1;
    if (!s) return 0;
    char path[32];
    snprintf(path, sizeof path, "data.%s", key);
    split->present = true;
    if (format == TD_DATA_CSV || format == TD_DATA_TEXT || format == TD_DATA_TOKENS) {
        static const char *const keys[] = {"path", NULL};
        if (td_json_check_keys(s, path, keys, err) != 0) return -1;
        return td_json_string(s, path, "path", true, "", split->images, sizeof split->images, err);
    }
    if (format == TD_DATA_CIFAR10) {
        static const char *const keys[] = {"files", NULL};
        if (td_json_check_keys(s, path, keys, err) != 0) return -1;
        json_t *files = json_object_get(s, "files");
        char where[64];
        snprintf(where, sizeof where, "%s.files", path);
        if (!json_is_array(files) || json_array_size(files) == 0 ||
            json_array_size(files) > TD_MAX_FILES)
            return td_json_fail_found(err, where, "an array of 1 to 16 batch file paths",
                                      files ? files : json_null());
        split->n_files = (int)json_array_size(files);
        for (int i = 0; i < split->n_files; i++) {
            json_t *f = json_array_get(files, (size_t)i);
            snprintf(where, sizeof where, "%s.files[%d]", path, i);
            if (!json_is_string(f) || strlen(json_string_value(f)) >= TD_PATH_MAX)
                return td_json_fail_found(err, where, "a file path", f);
            snprintf(split->files[i], TD_PATH_MAX, "%s", json_string_value(f));
        }
        return 0;
    }
    static const char *const keys[] = {"images", "labels", NULL};
    if (td_json_check_keys(s, path, keys, err) != 0) return -1;
    if (td_json_string(s, path, "images", true, "", split->images, sizeof split->images, err) !=
            0 ||
        td_json_string(s, path, "labels", true, "", split->labels, sizeof split->labels, err) != 0)
        return -1;
    return 0;
}

static int parse_augment(const json_t *d, td_job *job, td_err *err) {
    json_t *a;
    if (td_json_object(d, "data", "augment", false, &a, err) != 0) return -1;
    if (!a) return 0;
    static const char *const keys[] = {"random_crop", "horizontal_flip", NULL};
    if (td_json_check_keys(a, "data.augment", keys, err) != 0) return -1;
    json_t *crop;
    if (td_json_object(a, "data.augment", "random_crop", false, &crop, err) != 0) return -1;
    if (crop) {
        static const char *const ckeys[] = {"padding", NULL};
        long pad;
        if (td_json_check_keys(crop, "data.augment.random_crop", ckeys, err) != 0 ||
            td_json_int(crop, "data.augment.random_crop", "padding", true, 0, 1, 64, &pad, err) !=
                0)
            return -1;
        job->data.augment.crop_padding = (int)pad;
    }
    return td_json_bool(a, "data.augment", "horizontal_flip", false, &job->data.augment.hflip, err);
}

static int parse_float_list(const json_t *obj, const char *path, const char *key, int n_max,
                            float *out, int *n_out, bool positive, td_err *err) {
    char where[64];
    td_json_path(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) return td_fail(err, "%s: missing; expected an array of per-channel numbers", where);
    if (!json_is_array(v) || json_array_size(v) == 0 || (int)json_array_size(v) > n_max)
        return td_json_fail_found(err, where, "an array of 1 to 4 per-channel numbers", v);
    *n_out = (int)json_array_size(v);
    for (int i = 0; i < *n_out; i++) {
        json_t *x = json_array_get(v, (size_t)i);
        char at[80];
        snprintf(at, sizeof at, "%s[%d]", where, i);
        if (!json_is_number(x) || (positive && json_number_value(x) <= 0))
            return td_json_fail_found(err, at, positive ? "a number > 0" : "a number", x);
        out[i] = (float)json_number_value(x);
    }
    return 0;
}

/* data.format "text": the tokenizer, the window (nanoGPT's block_size) and, without data.val, the
 * training file's last part that validates (nanoGPT's 10%). */
static int parse_text(const json_t *d, td_data_spec *data, td_err *err) {
    static const char *const keys[] = {"format",     "train",        "val",         "tokenizer",
                                       "block_size", "val_fraction", "num_workers", NULL};
    /* tokens: ids already made, so no tokenizer but the vocabulary they come from */
    static const char *const tkeys[] = {"format",     "train",        "val",         "vocab_size",
                                        "block_size", "val_fraction", "num_workers", NULL};
    bool ids = data->format == TD_DATA_TOKENS;
    int tokenizer = 0;
    long block, vocab = 0;
    if (td_json_check_keys(d, "data", ids ? tkeys : keys, err) != 0 ||
        (ids ? td_json_int(d, "data", "vocab_size", true, 0, 1, 65536, &vocab, err)
             : td_json_choice(d, "data", "tokenizer", false, "char", "char|byte|gpt2", &tokenizer,
                              err)) != 0 ||
        td_json_int(d, "data", "block_size", true, 0, 1, 1 << 16, &block, err) != 0 ||
        td_json_number(d, "data", "val_fraction", false, 0.1, 0, 0.9, &data->val_fraction, err) !=
            0)
        return -1;
    /* the choices' order is the enum's */
    data->tokenizer = (td_tokenizer_kind)tokenizer;
    data->vocab_size = (int)vocab;
    data->block_size = (int)block;
    return 0;
}

/* data.num_workers: "auto" (-1) or DataLoader's num_workers: 0 loads in the training thread,
 * N in N loader threads that overlap the step. */
static int parse_num_workers(const json_t *d, int *out, td_err *err) {
    const json_t *v = json_object_get(d, "num_workers");
    *out = TD_WORKERS_AUTO;
    if (!v || (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0)) return 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 64)
        return td_json_fail_found(err, "data.num_workers", "\"auto\" or an integer in [0, 64]", v);
    *out = (int)json_integer_value(v);
    return 0;
}

int td_spec_parse_data(const json_t *root, td_job *job, td_err *err) {
    json_t *d;
    if (td_json_object(root, "", "data", true, &d, err) != 0) return -1;
    int format;
    if (td_json_choice(d, "data", "format", true, "", "idx|synthetic|npy|cifar10|csv|text|tokens",
                       &format, err) != 0)
        return -1;
    job->data.format = (td_data_format)format;
    switch (job->data.format) {
    case TD_DATA_IDX:
    case TD_DATA_CIFAR10: {
        static const char *const keys[] = {"format",  "train",       "val", "normalize",
                                           "augment", "num_workers", NULL};
        if (td_json_check_keys(d, "data", keys, err) != 0) return -1;
        break;
    }
    case TD_DATA_NPY: {
        static const char *const keys[] = {"format",    "train",   "val",         "layout",
                                           "normalize", "augment", "num_workers", NULL};
        int layout;
        if (td_json_check_keys(d, "data", keys, err) != 0 ||
            td_json_choice(d, "data", "layout", false, "NCHW", "NCHW|NHWC", &layout, err) != 0)
            return -1;
        job->data.nhwc = layout == 1;
        break;
    }
    case TD_DATA_CSV: {
        static const char *const keys[] = {"format", "train",     "val",         "label_column",
                                           "header", "normalize", "num_workers", NULL};
        long col;
        if (td_json_check_keys(d, "data", keys, err) != 0 ||
            td_json_int(d, "data", "label_column", false, 0, 0, 1 << 20, &col, err) != 0 ||
            td_json_bool(d, "data", "header", false, &job->data.csv_header, err) != 0)
            return -1;
        job->data.label_column = (int)col;
        break;
    }
    case TD_DATA_TEXT:
    case TD_DATA_TOKENS:
        if (parse_text(d, &job->data, err) != 0) return -1;
        break;
    case TD_DATA_SYNTHETIC: {
        static const char *const keys[] = {"format",  "shape",       "num_classes",
                                           "size",    "val_size",    "normalize",
                                           "augment", "num_workers", NULL};
        if (td_json_check_keys(d, "data", keys, err) != 0) return -1;
        json_t *shape = json_object_get(d, "shape");
        if (!shape || !json_is_array(shape) || json_array_size(shape) != 3)
            return td_json_fail_found(err, "data.shape", "[channels, height, width]",
                                      shape ? shape : json_null());
        int dims[3];
        for (int i = 0; i < 3; i++) {
            json_t *x = json_array_get(shape, (size_t)i);
            if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 4096)
                return td_json_fail_found(err, "data.shape", "three positive integers [C, H, W]",
                                          shape);
            dims[i] = (int)json_integer_value(x);
        }
        if (dims[0] > 4)
            return td_fail(err, "data.shape[0]: %d channels; at most 4 are supported", dims[0]);
        job->data.synthetic_shape = td_shape_image(dims[0], dims[1], dims[2]);
        long classes, size, val_size;
        if (td_json_int(d, "data", "num_classes", true, 0, 1, 1 << 20, &classes, err) != 0 ||
            td_json_int(d, "data", "size", true, 0, 1, 1 << 28, &size, err) != 0 ||
            td_json_int(d, "data", "val_size", false, 0, 0, 1 << 28, &val_size, err) != 0)
            return -1;
        if (job->model.num_classes && job->model.num_classes != classes)
            return td_fail(err,
                           "data.num_classes: %ld, but model.num_classes is %d; they must "
                           "agree",
                           classes, job->model.num_classes);
        job->model.num_classes = (int)classes;
        job->data.train.present = true;
        job->data.train.size = (int)size;
        job->data.val.present = val_size > 0;
        job->data.val.size = (int)val_size;
        break;
    }
    }
    if (parse_num_workers(d, &job->data.num_workers, err) != 0) return -1;
    if (job->data.format != TD_DATA_SYNTHETIC &&
        (parse_split(d, job->data.format, "train", true, &job->data.train, err) != 0 ||
         parse_split(d, job->data.format, "val", false, &job->data.val, err) != 0))
        return -1;
    if ((job->data.format == TD_DATA_TEXT || job->data.format == TD_DATA_TOKENS) &&
        !job->data.val.present && job->data.val_fraction > 0)
        job->data.val.present = job->data.val_from_train = true;
    if (parse_augment(d, job, err) != 0) return -1;
    json_t *norm;
    if (td_json_object(d, "data", "normalize", false, &norm, err) != 0) return -1;
    job->data.norm.channels = 0;
    if (norm) {
        static const char *const keys[] = {"mean", "std", NULL};
        if (td_json_check_keys(norm, "data.normalize", keys, err) != 0) return -1;
        int nm, ns;
        if (parse_float_list(norm, "data.normalize", "mean", 4, job->data.norm.mean, &nm, false,
                             err) != 0 ||
            parse_float_list(norm, "data.normalize", "std", 4, job->data.norm.std, &ns, true,
                             err) != 0)
            return -1;
        if (nm != ns)
            return td_fail(err,
                           "data.normalize: mean has %d values but std has %d; expected one "
                           "of each per channel",
                           nm, ns);
        job->data.norm.channels = nm;
        job->data.norm_given = true;
    }
    return 0;
}
