/* Data-parallel training with ranks as threads over loopback: world 2 with batch B trains the
 * same model as one process with batch 2B (DistributedSampler shards + averaged gradients),
 * only rank 0 reports, and a rank that leaves makes the other fail with an error naming it. */
#include "io/td_checkpoint.h"
#include "io/td_safetensors.h"
#include "test_util.h"
#include "dist/td_comm.h"
#include "dist/td_reducer.h"

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rank_run {
    const char *spec;
    td_dist dist;
    td_train_options opt;
    char *metrics;
    int rc;
    char error[TD_ERR_MAX];
} rank_run;

static void *run_rank(void *p) {
    rank_run *r = p;
    td_job job;
    td_err err = {{0}};
    r->rc = td_job_load_string(&job, r->spec, &err);
    if (r->rc == 0) {
        size_t len = 0;
        FILE *metrics = open_memstream(&r->metrics, &len);
        FILE *devnull = fopen("/dev/null", "w");
        r->rc = td_train_run(&job, &r->opt, metrics, devnull, NULL, &err);
        fclose(metrics);
        fclose(devnull);
        td_job_free(&job);
    }
    snprintf(r->error, sizeof r->error, "%s", err.msg);
    return NULL;
}

/* Runs `world` ranks of the given specs (one per rank) and waits for all of them. */
static void run_ranks(int world, const char *const *specs, rank_run *runs, long *stop_after) {
    td_err err = {{0}};
    td_store *server;
    cr_assert_eq(td_store_open(&server, "127.0.0.1", 0, true, "ddp-test/attempt-0", 20, &err), 0,
                 "%s", err.msg);
    pthread_t th[4];
    for (int r = 0; r < world; r++) {
        runs[r] = (rank_run){.spec = specs[r]};
        runs[r].dist = (td_dist){.rank = r,
                                 .world = world,
                                 .local_world = world,
                                 .master_port = td_store_port(server),
                                 .timeout_s = 20};
        strcpy(runs[r].dist.master_addr, "127.0.0.1");
        strcpy(runs[r].dist.host, "127.0.0.1");
        strcpy(runs[r].dist.namespace_, "ddp-test/attempt-0");
        runs[r].opt = (td_train_options){.dist = &runs[r].dist,
                                         .store = r == 0 ? server : NULL,
                                         .stop_after_steps = stop_after ? stop_after[r] : 0};
        cr_assert_eq(pthread_create(&th[r], NULL, run_rank, &runs[r]), 0);
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    td_store_close(server);
}

static const char *MLP = "{\"preset\": \"mlp\", \"hidden\": [24], \"num_classes\": 10}";
static const char *CONV_BN =
    "{\"nodes\": [{\"name\": \"conv\", \"op\": \"conv2d\", \"out_channels\": 4, "
    "\"kernel_size\": 3}, {\"name\": \"bn\", \"op\": \"batchnorm2d\"}, {\"name\": \"relu\", "
    "\"op\": \"relu\"}, {\"name\": \"flat\", \"op\": \"flatten\"}, {\"name\": \"fc\", "
    "\"op\": \"linear\", \"out_features\": 10}], \"num_classes\": 10}";

/* extra: more top-level members, each followed by a comma ("" for none); train_extra: more
 * members of train, each preceded by one */
static char *spec_full(const char *model, int batch, int accum, const char *ckdir, bool sync_bn,
                       const char *extra, const char *train_extra) {
    char *s = malloc(4096);
    snprintf(s, 4096,
             "{%s \"model\": %s,"
             " \"data\": {\"format\": \"synthetic\", \"shape\": [1, 6, 6], \"num_classes\": 10,"
             "   \"size\": 256, \"val_size\": 77},"
             " \"train\": {\"epochs\": 2, \"batch_size\": %d, \"grad_accum\": %d, \"seed\": 3,"
             "   \"sync_bn\": %s,"
             "   \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1, \"momentum\": 0.9}%s},"
             " \"checkpoint\": {\"dir\": \"%s\"}, \"log\": {\"every_steps\": 2}}",
             extra, model, batch, accum, sync_bn ? "true" : "false", train_extra, ckdir);
    return s;
}

static char *spec_accum(const char *model, int batch, int accum, const char *ckdir, bool sync_bn) {
    return spec_full(model, batch, accum, ckdir, sync_bn, "", "");
}

static char *spec_for(int batch, const char *ckdir) {
    return spec_accum(MLP, batch, 1, ckdir, false);
}

/* Every tensor of two checkpoints of step `step` agrees within `tol` relative to its largest
 * value. */
static void expect_same_weights_at(const char *dir_a, const char *dir_b, int step, double tol) {
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/step-%08d/model.safetensors", dir_a, step);
    snprintf(pb, sizeof pb, "%s/step-%08d/model.safetensors", dir_b, step);
    td_safetensors sa, sb;
    td_err err = {{0}};
    cr_assert_eq(td_safetensors_read(&sa, pa, &err), 0, "%s", err.msg);
    cr_assert_eq(td_safetensors_read(&sb, pb, &err), 0, "%s", err.msg);
    for (int i = 0; i < sa.n; i++) {
        const td_st_tensor *ta = &sa.tensors[i], *tb = td_safetensors_find(&sb, ta->name);
        cr_assert(tb && tb->count == ta->count);
        float *va = malloc(ta->count * sizeof(float)), *vb = malloc(ta->count * sizeof(float));
        td_safetensors_to_float(ta, va);
        td_safetensors_to_float(tb, vb);
        double diff = 0, scale = 0;
        for (size_t k = 0; k < ta->count; k++) {
            diff = fmax(diff, fabs((double)va[k] - vb[k]));
            scale = fmax(scale, fabs((double)va[k]));
        }
        cr_expect(diff <= tol * scale, "%s differs by %.3g (relative %.3g)", ta->name, diff,
                  scale > 0 ? diff / scale : diff);
        free(va);
        free(vb);
    }
    td_safetensors_free(&sa);
    td_safetensors_free(&sb);
}

/* The final checkpoints of the 16-step runs below. */
static void expect_same_weights(const char *dir_a, const char *dir_b, double tol) {
    expect_same_weights_at(dir_a, dir_b, 16, tol);
}

/* Every number in the metrics lines, in order. */
/* World 2 with batch 16 per rank (ddp_extra, ddp_train_extra: more spec members, as spec_full
 * takes them) ends with the weights of one process with batch 32. tag names the checkpoint
 * directories. */
static void expect_ddp_matches_one_process(const char *tag, const char *model, bool sync_bn,
                                           const char *ddp_extra, const char *ddp_train_extra) {
    char one_dir[512], two_dir[512];
    snprintf(one_dir, sizeof one_dir, "%s/%s-one", test_tmpdir(), tag);
    snprintf(two_dir, sizeof two_dir, "%s/%s-two", test_tmpdir(), tag);
    char *single_spec = spec_full(model, 32, 1, one_dir, false, "", "");
    char *ddp_spec = spec_full(model, 16, 1, two_dir, sync_bn, ddp_extra, ddp_train_extra);
    free(test_run_job(single_spec, NULL, NULL));
    const char *specs[2] = {ddp_spec, ddp_spec};
    rank_run runs[2];
    run_ranks(2, specs, runs, NULL);
    for (int r = 0; r < 2; r++) cr_assert_eq(runs[r].rc, 0, "rank %d: %s", r, runs[r].error);
    expect_same_weights(one_dir, two_dir, 1e-5);
    free(single_spec);
    free(ddp_spec);
    for (int r = 0; r < 2; r++) free(runs[r].metrics);
}

static int numbers(const char *text, double *out, int max) {
    int n = 0;
    for (const char *p = text; *p && n < max; p++) {
        if (*p != ':') continue;
        char *end;
        double v = strtod(p + 1, &end);
        if (end != p + 1) out[n++] = v;
    }
    return n;
}

Test(ddp, world_2_equals_one_process_with_the_global_batch, .timeout = 120) {
    char one_dir[512], two_dir[512];
    snprintf(one_dir, sizeof one_dir, "%s/ddp-one", test_tmpdir());
    snprintf(two_dir, sizeof two_dir, "%s/ddp-two", test_tmpdir());
    char *single_spec = spec_for(32, one_dir), *ddp_spec = spec_for(16, two_dir);
    char *single = test_run_job(single_spec, NULL, NULL);
    const char *specs[2] = {ddp_spec, ddp_spec};
    rank_run runs[2];
    run_ranks(2, specs, runs, NULL);
    for (int r = 0; r < 2; r++) cr_assert_eq(runs[r].rc, 0, "rank %d: %s", r, runs[r].error);
    cr_expect_str_eq(runs[1].metrics, "", "only rank 0 reports");
    test_strip_timings(single);
    test_strip_timings(runs[0].metrics);
    double a[512], b[512];
    int na = numbers(single, a, 512), nb = numbers(runs[0].metrics, b, 512);
    cr_assert_eq(na, nb, "the same lines:\n%s\n---\n%s", single, runs[0].metrics);
    for (int i = 0; i < na; i++)
        cr_expect(fabs(a[i] - b[i]) <= 1e-4 * fmax(1.0, fabs(a[i])),
                  "value %d: one process %.9g, two ranks %.9g", i, a[i], b[i]);
    /* and the same weights at the end */
    expect_same_weights(one_dir, two_dir, 1e-5);
    free(single);
    free(single_spec);
    free(ddp_spec);
    for (int r = 0; r < 2; r++) free(runs[r].metrics);
}

/* Buckets of about 1 KiB: the MLP's gradients go out in two all-reduces while backward runs,
 * and with SyncBatchNorm its backward's sums queue up between the buckets. Still the model of
 * one process with the global batch. */
static const char *SMALL_BUCKETS = "\"distributed\": {\"bucket_cap_mb\": 0.001},";

Test(ddp, small_buckets_equal_one_process_with_the_global_batch, .timeout = 120) {
    expect_ddp_matches_one_process("buckets", MLP, false, SMALL_BUCKETS, "");
}

Test(ddp, small_buckets_with_sync_batchnorm, .timeout = 120) {
    expect_ddp_matches_one_process("buckets-bn", CONV_BN, true, SMALL_BUCKETS, "");
}

/* The bucket plan: reverse parameter order, closed once a bucket reaches the cap. The MLP
 * 36-24-10 has fc2.bias (10 floats), fc2.weight (240), fc1.bias (24), fc1.weight (864): with a
 * 1000-byte cap, [fc2.bias, fc2.weight, fc1.bias] then [fc1.weight]. In a world of one the
 * reducer leaves gradients and loss as they are. */
Test(reducer, buckets_in_reverse_order_up_to_the_cap) {
    td_model m;
    test_build_model(&m,
                     "[{\"name\":\"fc1\",\"op\":\"linear\",\"out_features\":24},"
                     " {\"name\":\"fc2\",\"op\":\"linear\",\"out_features\":10}]",
                     td_shape_flat(36), 4, 1);
    td_comm *comm;
    td_err err = {{0}};
    cr_assert_eq(td_comm_init(&comm, NULL, 0, 1, "127.0.0.1", NULL, 5.0, &err), 0, "%s", err.msg);
    td_reducer *r;
    cr_assert_eq(td_reducer_start(&r, comm, &m, 1000.0 / (1024 * 1024), &err), 0, "%s", err.msg);
    cr_expect_eq(td_reducer_buckets(r), 2);
    float x[4 * 36], dy[4 * 10];
    for (int i = 0; i < 4 * 36; i++) x[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < 4 * 10; i++) dy[i] = (float)(i % 5) - 2.0f;
    td_run run = {.n = 4, .training = true};
    td_model_forward(&m, x, &run);
    td_model_backward(&m, dy, &run);
    float *plain = malloc(m.param_floats * sizeof(float));
    memcpy(plain, m.grad_block, m.param_floats * sizeof(float));
    td_reducer_begin(r, 2.5f, &run);
    td_model_backward(&m, dy, &run);
    float loss = 0;
    cr_assert_eq(td_reducer_finish(r, &loss, &err), 0, "%s", err.msg);
    cr_expect_eq(loss, 2.5f);
    cr_expect(memcmp(plain, m.grad_block, m.param_floats * sizeof(float)) == 0,
              "a world of one changed the gradients");
    td_reducer_stop(r, &m);
    cr_expect(memcmp(plain, m.grad_block, m.param_floats * sizeof(float)) == 0,
              "stopping lost the gradients");
    free(plain);
    td_comm_close(comm);
    td_model_free(&m);
}

Test(ddp, a_rank_that_leaves_fails_the_others_naming_it, .timeout = 120) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ddp-leave", test_tmpdir());
    char *spec = spec_for(16, dir);
    const char *specs[2] = {spec, spec};
    rank_run runs[2];
    long stop[2] = {0, 3}; /* rank 1 stops after step 3: its final checkpoint barrier meets
                            * rank 0's next all-reduce */
    run_ranks(2, specs, runs, stop);
    cr_expect_neq(runs[0].rc, 0, "rank 0 must not carry on alone");
    cr_expect(strstr(runs[0].error, "rank 1"), "rank 0's error names rank 1: %s", runs[0].error);
    /* and neither waits out its timeout: the mismatch is seen, and rank 0's failure ends rank
     * 1's barrier, which must not pass as if rank 0 had joined it */
    cr_expect(!strstr(runs[0].error, "timed out"), "rank 0 noticed at once: %s", runs[0].error);
    cr_expect_neq(runs[1].rc, 0, "rank 1's barrier cannot have succeeded without rank 0");
    cr_expect(strstr(runs[1].error, "rank 0") && !strstr(runs[1].error, "timed out"),
              "rank 1's error names rank 0, at once: %s", runs[1].error);
    free(spec);
    for (int r = 0; r < 2; r++) free(runs[r].metrics);
}

/* Activation checkpointing under DDP: buckets fire as backward reaches them, between segment
 * recomputations, and a recomputing SyncBatchNorm reuses its global statistics instead of
 * exchanging them again. Still the model of one process that keeps every activation. */
Test(ddp, activation_checkpointing_with_sync_batchnorm_and_small_buckets, .timeout = 120) {
    expect_ddp_matches_one_process("recompute", CONV_BN, true, SMALL_BUCKETS,
                                   ", \"activation_checkpointing\": [{\"first\": \"conv\","
                                   " \"last\": \"relu\"}, \"fc\"]");
}

Test(ddp, sync_batchnorm_world_2_equals_one_process_with_the_global_batch, .timeout = 120) {
    /* with SyncBatchNorm the batch statistics span both ranks: the same model, running
     * statistics included, as one process with the global batch */
    expect_ddp_matches_one_process("syncbn", CONV_BN, true, "", "");
}

Test(ddp, gradient_accumulation_equals_the_larger_batch, .timeout = 120) {
    /* 2 batches of 16 per step is one batch of 32; and 2 ranks x 2 batches of 8 (gradients
     * synchronised on the second only, PyTorch's no_sync) is that too */
    char one_dir[512], accum_dir[512], ddp_dir[512];
    snprintf(one_dir, sizeof one_dir, "%s/accum-one", test_tmpdir());
    snprintf(accum_dir, sizeof accum_dir, "%s/accum-two", test_tmpdir());
    snprintf(ddp_dir, sizeof ddp_dir, "%s/accum-ddp", test_tmpdir());
    char *big = spec_accum(MLP, 32, 1, one_dir, false);
    char *accum = spec_accum(MLP, 16, 2, accum_dir, false);
    char *ddp = spec_accum(MLP, 8, 2, ddp_dir, false);
    char *a = test_run_job(big, NULL, NULL), *b = test_run_job(accum, NULL, NULL);
    expect_same_weights(one_dir, accum_dir, 1e-5);
    const char *specs[2] = {ddp, ddp};
    rank_run runs[2];
    run_ranks(2, specs, runs, NULL);
    for (int r = 0; r < 2; r++) cr_assert_eq(runs[r].rc, 0, "rank %d: %s", r, runs[r].error);
    expect_same_weights(one_dir, ddp_dir, 1e-5);
    free(a);
    free(b);
    free(big);
    free(accum);
    free(ddp);
    for (int r = 0; r < 2; r++) free(runs[r].metrics);
}

/* A one-block GPT on text (a loss at every position, windows drawn by DistributedSampler), its
 * head tied to its embedding: two ranks of 4 windows (the reducer sends the tied weight once its
 * second use is in) end with the weights of one process of 8 (whose optimizer steps each node's
 * parameters inside backward, the tied one after its last use), and report the same losses. SGD,
 * not Adam: the key projection's bias has a zero gradient (softmax ignores a shift shared by a
 * row's scores), and Adam divides that gradient's float noise by its own size, so the bias
 * wanders by the learning rate whatever the reduction order, in PyTorch as here. */
static char *gpt_spec(const char *text, int batch, const char *ckdir) {
    char *s = malloc(4096);
    snprintf(s, 4096,
             "{\"distributed\": {\"bucket_cap_mb\": 0.001},"
             " \"model\": {\"nodes\": ["
             "{\"name\": \"wte\", \"op\": \"embedding\", \"num_embeddings\": 12, "
             "\"embedding_dim\": 16},"
             "{\"name\": \"wpe\", \"op\": \"position_embedding\", \"block_size\": 8},"
             "{\"name\": \"ln_1\", \"op\": \"layernorm\"},"
             "{\"name\": \"c_attn\", \"op\": \"linear\", \"out_features\": 48},"
             "{\"name\": \"attn\", \"op\": \"causal_attention\", \"n_head\": 2},"
             "{\"name\": \"c_proj\", \"op\": \"linear\", \"out_features\": 16},"
             "{\"name\": \"res\", \"op\": \"add\", \"inputs\": [\"c_proj\", \"wpe\"]},"
             "{\"name\": \"ln_f\", \"op\": \"layernorm\"},"
             "{\"name\": \"lm_head\", \"op\": \"linear\", \"out_features\": 12, "
             "\"bias\": false, \"weight_from\": \"wte\"}]},"
             " \"data\": {\"format\": \"text\", \"train\": {\"path\": \"%s\"}, "
             "\"block_size\": 8},"
             " \"train\": {\"max_steps\": 6, \"batch_size\": %d, \"seed\": 5,"
             "   \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.3, \"momentum\": 0.9}},"
             " \"checkpoint\": {\"dir\": \"%s\"}, \"log\": {\"every_steps\": 2}}",
             text, batch, ckdir);
    return s;
}

Test(ddp, gpt_on_text_world_2_equals_one_process_with_the_global_batch, .timeout = 120) {
    char text[600];
    for (int i = 0; i < 599; i++) text[i] = "abcdefghij \n"[(i * 7 + i / 13) % 12];
    text[599] = 0;
    const char *path = test_write_file("gpt.txt", text, strlen(text));
    char one_dir[512], two_dir[512];
    snprintf(one_dir, sizeof one_dir, "%s/gpt-one", test_tmpdir());
    snprintf(two_dir, sizeof two_dir, "%s/gpt-two", test_tmpdir());
    char *single_spec = gpt_spec(path, 8, one_dir), *ddp_spec = gpt_spec(path, 4, two_dir);
    char *single = test_run_job(single_spec, NULL, NULL);
    const char *specs[2] = {ddp_spec, ddp_spec};
    rank_run runs[2];
    run_ranks(2, specs, runs, NULL);
    for (int r = 0; r < 2; r++) cr_assert_eq(runs[r].rc, 0, "rank %d: %s", r, runs[r].error);
    test_strip_timings(single);
    test_strip_timings(runs[0].metrics);
    double a[256], b[256];
    int na = numbers(single, a, 256), nb = numbers(runs[0].metrics, b, 256);
    cr_assert_eq(na, nb, "the same lines:\n%s\n---\n%s", single, runs[0].metrics);
    cr_assert(strstr(single, "\"val_loss\""), "the text's last 10%% validates: %s", single);
    for (int i = 0; i < na; i++)
        cr_expect(fabs(a[i] - b[i]) <= 1e-4 * fmax(1.0, fabs(a[i])),
                  "value %d: one process %.9g, two ranks %.9g", i, a[i], b[i]);
    expect_same_weights_at(one_dir, two_dir, 6, 1e-5);
    /* the tied weight under both names, as nanoGPT's state_dict has it */
    char model_path[600];
    snprintf(model_path, sizeof model_path, "%s/step-00000006/model.safetensors", one_dir);
    td_safetensors st;
    td_err err = {{0}};
    cr_assert_eq(td_safetensors_read(&st, model_path, &err), 0, "%s", err.msg);
    const td_st_tensor *wte = td_safetensors_find(&st, "wte.weight");
    const td_st_tensor *head = td_safetensors_find(&st, "lm_head.weight");
    cr_assert(wte && head && wte->count == head->count, "both names are in the checkpoint");
    float *va = malloc(wte->count * sizeof(float)), *vb = malloc(head->count * sizeof(float));
    td_safetensors_to_float(wte, va);
    td_safetensors_to_float(head, vb);
    cr_expect(memcmp(va, vb, wte->count * sizeof(float)) == 0, "one tensor under two names");
    free(va);
    free(vb);
    td_safetensors_free(&st);
    free(single);
    free(single_spec);
    free(ddp_spec);
    for (int r = 0; r < 2; r++) free(runs[r].metrics);
}
