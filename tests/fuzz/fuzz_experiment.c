/* Feeds: a POST /v1/experiments body to td_exp_spec_parse (service/exp/td_exp_spec.c), then for
 * an accepted one, the trial count, a few trials' hyperparameters and their job bodies
 * (td_exp_trial_body: JSON paths set into a copy of the base job). Why: it is any submit token's
 * bytes, and a trial's body is built from them by path; a value shared or grown there is memory
 * the daemon keeps for every trial.
 *
 * Checks besides the sanitizers: a refusal is a 400 naming a field or none; an accepted body has
 * 1 to 1000 trials; a trial's hyperparameters are the same on a second draw (they are a function
 * of the body and the trial's number alone); its job body is JSON, or a 400 naming the path; and
 * building a trial never changes the parsed base job. */
#include "fuzz_util.h"

#include "service/exp/td_exp_private.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    td_exp_spec s;
    td_reply_error e = {0};
    if (td_exp_spec_parse(&s, (const char *)data, size, &e) != 0) {
        FUZZ_CHECK(e.status == 400, "a refusal with status %d: %s", e.status, e.message);
        if (fuzz_debug()) fprintf(stderr, "refused: %s (%s)\n", e.message, e.field);
        return 0;
    }
    int n = td_exp_trial_count(&s);
    FUZZ_CHECK(n >= 1 && n <= TD_EXP_MAX_TRIALS, "%d trials", n);
    char *before = json_dumps(s.job, JSON_COMPACT | JSON_SORT_KEYS);
    int picks[] = {0, n / 2, n - 1};
    for (int k = 0; k < 3; k++) {
        json_t *h = td_exp_hparams(&s, picks[k]), *again = td_exp_hparams(&s, picks[k]);
        FUZZ_CHECK(json_equal(h, again), "trial %d drawn twice differs", picks[k]);
        td_reply_error te = {0};
        char *body = td_exp_trial_body(&s, 7, picks[k], h, &te);
        if (body) {
            json_t *parsed = json_loads(body, 0, NULL);
            FUZZ_CHECK(json_is_object(parsed), "trial %d's body is no JSON object", picks[k]);
            json_decref(parsed);
        } else {
            FUZZ_CHECK(te.status == 400 && strncmp(te.field, "space", 5) == 0,
                       "a trial's body refused with %d at %s", te.status, te.field);
        }
        free(body);
        json_decref(h);
        json_decref(again);
    }
    char *after = json_dumps(s.job, JSON_COMPACT | JSON_SORT_KEYS);
    FUZZ_CHECK(before && after && strcmp(before, after) == 0, "building trials changed the job");
    free(before);
    free(after);
    td_exp_spec_free(&s);
    return 0;
}
