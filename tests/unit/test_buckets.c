/* DDP's bucket plan (dist/td_buckets.h), shared by the CPU reducer and the NCCL path: PyTorch's
 * reverse parameter order, a first bucket of 1 MiB (or the cap, if smaller), the others up to
 * bucket_cap_mb, each one range of the gradient block. */
#include "dist/td_buckets.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>

#define MIB (1024 * 1024 / 4) /* floats in a MiB */

/* n parameters of the given sizes in floats, placed in registration order at multiples of 8
 * floats as td_model places them (so with gaps between some). */
static void place(td_param *p, const size_t *sizes, int n) {
    size_t floats = 0;
    for (int i = 0; i < n; i++) {
        p[i] = (td_param){0};
        snprintf(p[i].name, sizeof p[i].name, "p%d", i);
        p[i].size = sizes[i];
        p[i].offset = (floats + 7) / 8 * 8;
        floats = p[i].offset + p[i].size;
    }
}

/* Bucket b holds parameters [first, last] (registration order, first <= last) and exactly their
 * range of the block. */
static void expect_bucket(const td_buckets *plan, const td_param *p, int b, int first, int last) {
    cr_assert_lt(b, plan->n);
    const td_bucket *k = &plan->bucket[b];
    cr_expect_eq(k->params, last - first + 1, "bucket %d holds %d parameters", b, k->params);
    cr_expect_eq(k->lo, p[first].offset, "bucket %d starts at %zu", b, k->lo);
    cr_expect_eq(k->hi, p[last].offset + p[last].size, "bucket %d ends at %zu", b, k->hi);
    for (int i = first; i <= last; i++)
        cr_expect_eq(plan->bucket_of[i], b, "p%d is in bucket %d, not %d", i, plan->bucket_of[i],
                     b);
}

Test(buckets, a_model_without_parameters_has_none) {
    td_buckets plan;
    td_err err = {{0}};
    cr_assert_eq(td_buckets_plan(&plan, NULL, 0, 25.0, &err), 0, "%s", err.msg);
    cr_expect_eq(plan.n, 0);
    td_buckets_free(&plan);
}

/* Backward's last parameters first: 0.75 MiB stays open under the first bucket's 1 MiB, 0.5 MiB
 * more closes it; the 3 MiB before them go into a bucket of the 25 MiB cap, which the end of the
 * parameters closes. */
Test(buckets, the_first_bucket_closes_at_one_mib) {
    td_param p[3];
    place(p, (size_t[]){3 * MIB, MIB / 2, 3 * MIB / 4}, 3);
    td_buckets plan;
    td_err err = {{0}};
    cr_assert_eq(td_buckets_plan(&plan, p, 3, 25.0, &err), 0, "%s", err.msg);
    cr_expect_eq(plan.n, 2);
    expect_bucket(&plan, p, 0, 1, 2);
    expect_bucket(&plan, p, 1, 0, 0);
    td_buckets_free(&plan);
}

/* After the first bucket, the cap (2 MiB here): 1.5 + 1 MiB close a bucket, and a parameter
 * larger than the cap has one of its own. */
Test(buckets, later_buckets_close_at_the_cap) {
    td_param p[5];
    place(p, (size_t[]){MIB / 4, 3 * MIB, MIB, 3 * MIB / 2, MIB}, 5);
    td_buckets plan;
    td_err err = {{0}};
    cr_assert_eq(td_buckets_plan(&plan, p, 5, 2.0, &err), 0, "%s", err.msg);
    cr_expect_eq(plan.n, 4);
    expect_bucket(&plan, p, 0, 4, 4); /* 1 MiB: the first bucket is full */
    expect_bucket(&plan, p, 1, 2, 3); /* 1.5 MiB, then 1 MiB reaches the 2 MiB cap */
    expect_bucket(&plan, p, 2, 1, 1); /* 3 MiB on its own */
    expect_bucket(&plan, p, 3, 0, 0); /* what is left */
    td_buckets_free(&plan);
}

/* A cap below 1 MiB is the first bucket's size too. */
Test(buckets, a_cap_below_one_mib_bounds_the_first_bucket) {
    td_param p[3];
    place(p, (size_t[]){MIB / 8, MIB / 8, MIB / 8}, 3);
    td_buckets plan;
    td_err err = {{0}};
    cr_assert_eq(td_buckets_plan(&plan, p, 3, 0.25, &err), 0, "%s", err.msg);
    cr_expect_eq(plan.n, 2);
    expect_bucket(&plan, p, 0, 1, 2);
    expect_bucket(&plan, p, 1, 0, 0);
    td_buckets_free(&plan);
}

Test(buckets, a_zero_cap_gives_each_parameter_its_own) {
    td_param p[3];
    place(p, (size_t[]){10, 20, 30}, 3);
    td_buckets plan;
    td_err err = {{0}};
    cr_assert_eq(td_buckets_plan(&plan, p, 3, 0.0, &err), 0, "%s", err.msg);
    cr_expect_eq(plan.n, 3);
    for (int b = 0; b < 3; b++) expect_bucket(&plan, p, b, 2 - b, 2 - b);
    td_buckets_free(&plan);
}

/* A model's parameters start 8-float aligned: conv1.weight (6x1x5x5, 150 floats) ends 2 floats
 * before conv1.bias starts. The gap rides inside the bucket (a copy of the plan that wanted each
 * parameter to end where the next begins refused every such model). */
Test(buckets, alignment_gaps_ride_inside_a_bucket) {
    td_model m;
    test_build_model(&m,
                     "[{\"name\":\"conv1\",\"op\":\"conv2d\",\"out_channels\":6,"
                     "\"kernel_size\":5}, {\"name\":\"flatten\",\"op\":\"flatten\"},"
                     " {\"name\":\"fc\",\"op\":\"linear\",\"out_features\":10}]",
                     td_shape_image(1, 8, 8), 2, 1);
    cr_assert_eq(m.params[0].size, 150);
    cr_assert_gt(m.params[1].offset, m.params[0].offset + m.params[0].size, "no gap to test");
    td_buckets plan;
    td_err err = {{0}};
    cr_assert_eq(td_buckets_plan(&plan, m.params, m.n_params, 25.0, &err), 0, "%s", err.msg);
    cr_expect_eq(plan.n, 1);
    expect_bucket(&plan, m.params, 0, 0, m.n_params - 1);
    cr_expect_eq(plan.bucket[0].hi, m.param_floats);
    td_buckets_free(&plan);
    td_model_free(&m);
}

/* Floats in two buckets would be averaged twice: parameters that overlap (or run backwards) in
 * the block are refused, naming both. */
Test(buckets, overlapping_parameters_are_refused) {
    td_param p[2];
    place(p, (size_t[]){16, 16}, 2);
    p[1].offset = 8;
    td_buckets plan;
    td_err err = {{0}};
    cr_assert_eq(td_buckets_plan(&plan, p, 2, 25.0, &err), -1);
    cr_expect(strstr(err.msg, "parameter p0 ends at float 16") && strstr(err.msg, "p1"), "%s",
              err.msg);
    cr_expect_eq(plan.n, 0);
    cr_expect_null(plan.bucket);
}
