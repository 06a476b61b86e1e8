/* TRAIND_PROFILE's step breakdown: where each training step's time goes on this rank, so a
 * data-parallel run that scales badly shows why (a rank waiting for its peer at the all-reduce,
 * the loader not keeping up, the optimizer). Per-node times are td_model_print_profile's. */
#include "train/td_train_private.h"

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
