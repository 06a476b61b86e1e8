/* The batch loader: producer threads (DataLoader's num_workers) fill a small ring of batch slots
 * while the trainer consumes them, so gathering and normalising the next batches overlaps the
 * current step. With no producer (num_workers 0), td_loader_next makes each batch itself, in
 * the trainer's thread: where no core is free for a producer (a data-parallel rank pinned to
 * its core), one would only preempt the step it was meant to overlap. Each producer fills whole
 * batches; several work on consecutive batches at once, which a GPU step needs when one thread
 * cannot make a batch per step (a 3x224x224 batch of 256 is ~20 ms of one core).
 *
 * Invariants, all under `lock`: a slot is FREE (a producer may claim it), FILLING (one producer
 * writes it, unlocked) or FULL (the consumer may read it). Producers claim batches in order,
 * batch b in slot b mod n_slots, for the epoch generation `gen`, and drop a batch finished for an
 * older generation; the consumer takes batches in order, so batch b's slot is free exactly when
 * batch b - n_slots has been released. A batch's contents depend on its index alone, never on
 * which producer made it. start_epoch waits until no producer is mid-fill, so no slot is written
 * while it is being reset.
 */
#include "data/td_data.h"
#include "core/td_rng.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Slots beyond the producers' own: the one the consumer holds and one ready ahead of it */
#define SPARE_SLOTS 2

typedef enum slot_state { SLOT_FREE, SLOT_FILLING, SLOT_FULL } slot_state;

typedef struct slot {
    td_batch batch;
    float *raw; /* one sample before augmentation */
    slot_state state;
} slot;

struct td_loader {
    const td_dataset *ds;
    td_normalize norm;
    td_augment augment;
    int epoch;
    td_loader_config cfg;
    int *order; /* this epoch's sample indices */
    int n_order;

    int n_threads;
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n_slots;
    slot *slots;
    bool stop;
    int busy; /* producers mid-fill */
    unsigned gen;
    int n_batches; /* in this epoch */
    int produced;  /* next batch index the producer fills */
    int consumed;  /* next batch index the consumer takes */
    int holding;   /* slot the consumer holds, -1 if none */
};

/* RandomCrop(padding) with zero fill and RandomHorizontalFlip(0.5) on one normalised [H, W, C]
 * sample; "zero" is the normalised value of a 0 pixel, as torchvision pads before Normalize. */
static void augment_sample(const td_loader *ld, int sample, const float *src, float *dst) {
    const td_dataset *ds = ld->ds;
    int h = ds->shape.h, w = ds->shape.w, c = ds->shape.c, pad = ld->augment.crop_padding;
    td_rng rng;
    td_rng_seed_for(&rng, ld->cfg.seed, "augment", (uint64_t)ld->epoch * (uint64_t)ds->n + sample);
    int dy = pad ? (int)td_rng_below(&rng, 2 * (uint64_t)pad + 1) - pad : 0;
    int dx = pad ? (int)td_rng_below(&rng, 2 * (uint64_t)pad + 1) - pad : 0;
    bool flip = ld->augment.hflip && td_rng_uniform(&rng) < 0.5f;
    float zero[4];
    for (int k = 0; k < c; k++) {
        int q = ld->norm.channels == 1 ? 0 : k;
        zero[k] = -ld->norm.mean[q] / ld->norm.std[q];
    }
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int sy = y + dy, sx = (flip ? w - 1 - x : x) + dx;
            float *d = dst + ((size_t)y * w + x) * c;
            if (sy < 0 || sy >= h || sx < 0 || sx >= w)
                for (int k = 0; k < c; k++) d[k] = zero[k];
            else
                for (int k = 0; k < c; k++) d[k] = src[((size_t)sy * w + sx) * c + k];
        }
}

static void fill(td_loader *ld, int batch_index, slot *s) {
    const td_dataset *ds = ld->ds;
    size_t size = td_shape_size(ds->shape);
    bool augment = ds->shape.spatial && (ld->augment.crop_padding > 0 || ld->augment.hflip);
    int first = batch_index * ld->cfg.batch_size;
    int n = ld->n_order - first < ld->cfg.batch_size ? ld->n_order - first : ld->cfg.batch_size;
    int positions = td_dataset_positions(ds);
    for (int i = 0; i < n; i++) {
        int idx = ld->order[first + i];
        float *x = s->batch.x + (size_t)i * size;
        if (ds->tokens) {
            td_dataset_window(ds, idx, x, s->batch.labels + (size_t)i * positions);
            continue;
        }
        if (!augment) {
            s->batch.labels[i] = td_dataset_sample(ds, idx, &ld->norm, x);
            continue;
        }
        s->batch.labels[i] = td_dataset_sample(ds, idx, &ld->norm, s->raw);
        augment_sample(ld, idx, s->raw, x);
    }
    s->batch.n = n;
}

static void *producer(void *arg) {
    td_loader *ld = arg;
    pthread_mutex_lock(&ld->lock);
    for (;;) {
        while (!ld->stop && !(ld->produced < ld->n_batches &&
                              ld->slots[ld->produced % ld->n_slots].state == SLOT_FREE))
            pthread_cond_wait(&ld->cond, &ld->lock);
        if (ld->stop) break;
        int b = ld->produced++;
        unsigned gen = ld->gen;
        slot *s = &ld->slots[b % ld->n_slots];
        s->state = SLOT_FILLING;
        ld->busy++;
        pthread_mutex_unlock(&ld->lock);
        fill(ld, b, s);
        pthread_mutex_lock(&ld->lock);
        ld->busy--;
        s->state = gen == ld->gen ? SLOT_FULL : SLOT_FREE;
        pthread_cond_broadcast(&ld->cond);
    }
    pthread_mutex_unlock(&ld->lock);
    return NULL;
}

/* This rank's samples: DistributedSampler's (padded) share, or every world-th one. */
static int rank_samples(const td_dataset *ds, const td_loader_config *cfg) {
    if (cfg->pad) return td_sampler_count(ds->n, cfg->world, false);
    return ds->n > cfg->rank ? (ds->n - cfg->rank + cfg->world - 1) / cfg->world : 0;
}

int td_loader_batches(const td_dataset *ds, const td_loader_config *cfg) {
    int n = rank_samples(ds, cfg);
    return cfg->drop_last ? n / cfg->batch_size : (n + cfg->batch_size - 1) / cfg->batch_size;
}

td_loader *td_loader_create(const td_dataset *ds, const td_normalize *norm,
                            const td_augment *augment, const td_loader_config *cfg) {
    td_loader *ld = td_calloc(1, sizeof *ld);
    ld->ds = ds;
    ld->norm = *norm;
    if (augment) ld->augment = *augment;
    ld->cfg = *cfg;
    int batch_size = cfg->batch_size;
    ld->order = td_malloc((size_t)ds->n * sizeof(int));
    ld->holding = -1;
    size_t size = td_shape_size(ds->shape);
    ld->n_threads = cfg->workers > 0 ? cfg->workers : 0;
    ld->n_slots = ld->n_threads > 0 ? ld->n_threads + SPARE_SLOTS : 1;
    ld->slots = td_calloc((size_t)ld->n_slots, sizeof *ld->slots);
    for (int i = 0; i < ld->n_slots; i++) {
        ld->slots[i].batch.x = td_aligned_alloc((size_t)batch_size * size * sizeof(float));
        ld->slots[i].batch.labels =
            td_malloc((size_t)batch_size * td_dataset_positions(ds) * sizeof(int32_t));
        ld->slots[i].raw = td_malloc(size * sizeof(float));
    }
    TD_ASSERT(pthread_mutex_init(&ld->lock, NULL) == 0, "pthread_mutex_init failed");
    TD_ASSERT(pthread_cond_init(&ld->cond, NULL) == 0, "pthread_cond_init failed");
    ld->threads = td_calloc((size_t)ld->n_threads, sizeof *ld->threads);
    for (int i = 0; i < ld->n_threads; i++)
        TD_ASSERT(pthread_create(&ld->threads[i], NULL, producer, ld) == 0, /* none for 0 */
                  "cannot start a data loader thread (process or thread limit reached? "
                  "data.num_workers sets how many)");
    return ld;
}

int td_loader_start_epoch(td_loader *ld, int epoch, int first) {
    pthread_mutex_lock(&ld->lock);
    ld->gen++;
    ld->n_batches = 0; /* nothing to produce while the order is rewritten */
    while (ld->busy > 0) pthread_cond_wait(&ld->cond, &ld->lock);
    ld->epoch = epoch;
    const td_loader_config *cfg = &ld->cfg;
    ld->n_order = rank_samples(ld->ds, cfg);
    if (cfg->pad)
        td_sampler_indices(ld->ds->n, cfg->shuffle, ld->cfg.seed, epoch, cfg->rank, cfg->world,
                           false, ld->order);
    else
        for (int k = 0; k < ld->n_order; k++) ld->order[k] = cfg->rank + k * cfg->world;
    int n_batches = td_loader_batches(ld->ds, cfg);
    if (first > n_batches) first = n_batches;
    for (int i = 0; i < ld->n_slots; i++) ld->slots[i].state = SLOT_FREE;
    ld->holding = -1;
    ld->produced = ld->consumed = first;
    ld->n_batches = n_batches;
    pthread_cond_broadcast(&ld->cond);
    pthread_mutex_unlock(&ld->lock);
    return n_batches;
}

bool td_loader_next(td_loader *ld, td_batch *batch) {
    if (ld->n_threads == 0) { /* in the caller's thread, as DataLoader(num_workers=0) */
        if (ld->consumed >= ld->n_batches) return false;
        fill(ld, ld->consumed++, &ld->slots[0]);
        *batch = ld->slots[0].batch;
        return true;
    }
    pthread_mutex_lock(&ld->lock);
    if (ld->holding >= 0) {
        ld->slots[ld->holding].state = SLOT_FREE;
        ld->holding = -1;
        pthread_cond_broadcast(&ld->cond);
    }
    if (ld->consumed >= ld->n_batches) {
        pthread_mutex_unlock(&ld->lock);
        return false;
    }
    slot *s = &ld->slots[ld->consumed % ld->n_slots];
    while (s->state != SLOT_FULL) pthread_cond_wait(&ld->cond, &ld->lock);
    ld->holding = ld->consumed % ld->n_slots;
    ld->consumed++;
    *batch = s->batch;
    pthread_mutex_unlock(&ld->lock);
    return true;
}

int td_loader_threads(const td_loader *ld) {
    return ld->n_threads;
}

void td_loader_destroy(td_loader *ld) {
    if (!ld) return;
    pthread_mutex_lock(&ld->lock);
    ld->stop = true;
    pthread_cond_broadcast(&ld->cond);
    pthread_mutex_unlock(&ld->lock);
    for (int i = 0; i < ld->n_threads; i++) pthread_join(ld->threads[i], NULL);
    free(ld->threads);
    pthread_mutex_destroy(&ld->lock);
    pthread_cond_destroy(&ld->cond);
    for (int i = 0; i < ld->n_slots; i++) {
        free(ld->slots[i].batch.x);
        free(ld->slots[i].batch.labels);
        free(ld->slots[i].raw);
    }
    free(ld->slots);
    free(ld->order);
    free(ld);
}
