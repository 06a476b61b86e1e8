/* A split of a spec's data section, by its format: loaded whole for training, or probed as far as
 * is cheap for the daemon's submit check. The one switch over the formats. */
#include "data/td_data.h"

int td_data_load_split(const td_data_spec *d, const td_split_spec *sp, int num_classes,
                       uint64_t seed, td_dataset *ds, td_err *err) {
    switch (d->format) {
    case TD_DATA_SYNTHETIC:
        td_dataset_synthetic(ds, d->synthetic_shape, num_classes, sp->size, seed);
        return 0;
    case TD_DATA_IDX:
        return td_dataset_load_idx(ds, sp->images, sp->labels, err);
    case TD_DATA_NPY:
        return td_dataset_load_npy(ds, sp->images, sp->labels, d->nhwc, err);
    case TD_DATA_CIFAR10: {
        const char *files[TD_MAX_FILES];
        for (int i = 0; i < sp->n_files; i++) files[i] = sp->files[i];
        return td_dataset_load_cifar10(ds, files, sp->n_files, err);
    }
    case TD_DATA_CSV:
        return td_dataset_load_csv(ds, sp->images, d->label_column, d->csv_header, err);
    case TD_DATA_TEXT: {
        (void)num_classes; /* the vocabulary's size */
        td_tokenizer tk;
        if (td_text_tokenizer(d, &tk, err) != 0) return -1;
        int rc = td_dataset_load_text(ds, d, sp, &tk, err);
        td_tokenizer_free(&tk);
        return rc;
    }
    case TD_DATA_TOKENS:
        return td_dataset_load_tokens(ds, d, sp, err);
    }
    return td_fail(err, "unknown data format");
}

int td_data_probe_split(const td_data_spec *d, const td_split_spec *sp, td_data_probe *p,
                        td_err *err) {
    switch (d->format) {
    case TD_DATA_SYNTHETIC:
        return 1;
    case TD_DATA_IDX:
        return td_dataset_probe_idx(sp->images, sp->labels, p, err);
    case TD_DATA_NPY:
        return td_dataset_probe_npy(sp->images, sp->labels, d->nhwc, p, err);
    case TD_DATA_CIFAR10: {
        const char *files[TD_MAX_FILES];
        for (int i = 0; i < sp->n_files; i++) files[i] = sp->files[i];
        return td_dataset_probe_cifar10(files, sp->n_files, p, err);
    }
    case TD_DATA_CSV:
        return td_dataset_probe_csv(sp->images, d->label_column, d->csv_header, p, err);
    case TD_DATA_TEXT:
        return td_dataset_probe_text(d, sp, p, err);
    case TD_DATA_TOKENS:
        return td_dataset_probe_tokens(d, sp, p, err);
    }
    return td_fail(err, "unknown data format");
}
