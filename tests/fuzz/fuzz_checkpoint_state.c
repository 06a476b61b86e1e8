/* Feeds: a checkpoint's state.json (trainer/io/td_checkpoint.c, td_checkpoint_parse_state): where
 * training stands (step, epoch, batch, RNG state, the optimizer's step count, the loss scaler).
 * Why: a resume reads it from a checkpoint directory the spec names (resume_from), which a user
 * may have copied, edited or cut short; the loop then indexes batches and epochs by it, so what
 * it accepts must be in range. */
#include "fuzz_util.h"

#include "io/td_checkpoint.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    td_train_state st = {0};
    td_optim opt = {0}; /* only its step count and scaler are read into */
    td_err err = {{0}};
    if (td_checkpoint_parse_state((const char *)data, size, "state.json", &st, &opt, &err) != 0) {
        FUZZ_CHECK(err.msg[0], "a refusal without a message");
        return 0;
    }
    FUZZ_CHECK(st.step >= 0 && st.epoch >= 0 && st.batch >= 0 && st.interval_steps >= 0,
               "step %ld epoch %d batch %d interval %ld", st.step, st.epoch, st.batch,
               st.interval_steps);
    FUZZ_CHECK(opt.steps >= 0, "optimizer steps %ld", opt.steps);
    FUZZ_CHECK(opt.scaler.scale == 0 || (opt.scaler.scale > 0 && isfinite(opt.scaler.scale)),
               "loss scale %g", (double)opt.scaler.scale);
    FUZZ_CHECK(opt.scaler.growth_tracker >= 0 && opt.scaler.skipped >= 0, "scaler %d %ld",
               opt.scaler.growth_tracker, opt.scaler.skipped);
    return 0;
}
