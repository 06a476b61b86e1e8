#include "dist/td_buckets.h"

#include <stdint.h>
#include <stdlib.h>

int td_buckets_plan(td_buckets *plan, const td_param *params, int n_params, double cap_mb,
                    td_err *err) {
    *plan = (td_buckets){0};
    size_t cap = (size_t)(cap_mb * 1024.0 * 1024.0);
    /* at most one bucket per parameter; never a zero-sized allocation */
    plan->bucket = td_calloc((size_t)n_params + 1, sizeof *plan->bucket);
    plan->bucket_of = td_calloc((size_t)n_params + 1, sizeof *plan->bucket_of);
    td_bucket *b = NULL;
    size_t limit = cap < TD_FIRST_BUCKET_BYTES ? cap : TD_FIRST_BUCKET_BYTES;
    if (limit == 0) limit = 1;
    size_t next_lo = SIZE_MAX; /* where the parameter after this one starts */
    for (int i = n_params - 1; i >= 0; i--) {
        const td_param *p = &params[i];
        if (p->offset + p->size > next_lo) {
            td_fail(err,
                    "DDP: parameter %s ends at float %zu of the gradient block but %s, "
                    "registered after it, starts at %zu; buckets need the parameters in the "
                    "block in registration order, without overlap",
                    p->name, p->offset + p->size, params[i + 1].name, next_lo);
            td_buckets_free(plan);
            return -1;
        }
        next_lo = p->offset;
        if (!b) {
            b = &plan->bucket[plan->n++];
            b->hi = p->offset + p->size;
        }
        b->lo = p->offset;
        b->params++;
        plan->bucket_of[i] = (int)(b - plan->bucket);
        if ((b->hi - b->lo) * sizeof(float) >= limit) {
            b = NULL;
            limit = cap > 0 ? cap : 1;
        }
    }
    return 0;
}

void td_buckets_free(td_buckets *plan) {
    free(plan->bucket);
    free(plan->bucket_of);
    *plan = (td_buckets){0};
}
