/* TRAIND_PROFILE's step breakdown: where each training step's time goes on this rank, so a
 * data-parallel run that scales badly shows why (a rank waiting for its peer at the all-reduce,
 * the loader not keeping up, the optimizer). Per-node times are td_model_print_profile's. */
#include "train/td_train_private.h"

#include <math.h>

#define BIN_RATIO 1.02
#define BIN_FIRST 1e-6 /* seconds: the first bin's lower edge */

void td_train_profile_step(trainer *t) {
    if (!t->profiling) return;
    double began = t->phase.t_step;
    td_train_phase(t, &t->phase.step, &t->phase.t_step);
    double own = (t->phase.t_step - began) - (t->phase.reduce_tail - t->phase.tail_before);
    t->phase.tail_before = t->phase.reduce_tail;
    int bin = own > BIN_FIRST ? (int)(log(own / BIN_FIRST) / log(BIN_RATIO)) : 0;
    t->phase.own_hist[bin < TD_PROFILE_BINS ? bin : TD_PROFILE_BINS - 1]++;
    t->phase.own_steps++;
}

/* The q-quantile of the steps' own work in ms, at its bin's middle (within 1%). */
static double own_quantile(const trainer *t, double q) {
    long want = (long)ceil(q * (double)t->phase.own_steps), seen = 0;
    int bin = 0;
    for (; bin < TD_PROFILE_BINS - 1; bin++) {
        seen += t->phase.own_hist[bin];
        if (seen >= want && seen > 0) break;
    }
    return BIN_FIRST * pow(BIN_RATIO, bin + 0.5) * 1e3;
}

void td_train_print_phases(const trainer *t, long steps) {
    if (!t->profiling || steps <= 0) return;
    double k = 1e3 / (double)steps;
    double known = t->phase.loader + t->phase.broadcast + t->phase.forward + t->phase.loss +
                   t->phase.backward + t->phase.reduce_tail + t->phase.optimizer;
    int rank = td_dist_active(t->dist) ? t->dist->rank : 0;
    fprintf(t->log,
            "[traind] rank %d step profile, ms per step over %ld steps: %.3f total = %s "
            "%.3f + buffer broadcast %.3f + forward %.3f + loss %.3f + backward %.3f + "
            "all-reduce tail %.3f + optimizer %.3f + other %.3f\n",
            rank, steps, t->phase.step * k,
            /* with no loader thread, the step makes its batch itself */
            t->train_cfg.workers ? "loader wait" : "making the batch", t->phase.loader * k,
            t->phase.broadcast * k, t->phase.forward * k, t->phase.loss * k, t->phase.backward * k,
            t->phase.reduce_tail * k, t->phase.optimizer * k, (t->phase.step - known) * k);
    if (t->phase.own_steps > 0)
        fprintf(t->log,
                "[traind] rank %d own work per step (all but the all-reduce tail), ms: p10 %.3f, "
                "median %.3f, p90 %.3f%s\n",
                rank, own_quantile(t, 0.1), own_quantile(t, 0.5), own_quantile(t, 0.9),
                t->comm ? "; each step waits for the slowest rank's, so this spread on every "
                          "rank sets the tail"
                        : "");
    if (t->comm) {
        double allreduce_s, wait_s;
        td_comm_times(t->comm, &allreduce_s, &wait_s);
        fprintf(t->log,
                "[traind] rank %d collectives, ms per step: %.3f in all-reduces (any thread), "
                "%.3f of it waiting for slower ranks of this node; the all-reduce tail is the "
                "part backward did not hide\n",
                rank, allreduce_s * k, wait_s * k);
    }
}
