/* The experiments' searchers and trials without a daemon (service/exp/td_exp_private.h): the
 * body's checks and the JSON paths they name, a grid's order, a random search's draws (seeded,
 * within their ranges, each trial's own), a trial's job body, and a trial's metric read from its
 * metric lines. */
#include "service/exp/td_exp_private.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

static const char BASE[] = "\"job\": {\"name\": \"b\", \"model\": {\"preset\": \"lenet5\"},"
                           " \"train\": {\"epochs\": 1, \"optimizer\": {\"lr\": 0.1}},"
                           " \"layers\": [{\"w\": 1}, {\"w\": 2}]}";

static int parse(td_exp_spec *s, const char *rest, td_reply_error *e) {
    char body[2048];
    snprintf(body, sizeof body, "{%s, %s}", BASE, rest);
    return td_exp_spec_parse(s, body, strlen(body), e);
}

static void refused(const char *rest, const char *field) {
    td_exp_spec s;
    td_reply_error e = {0};
    cr_assert_eq(parse(&s, rest, &e), -1, "accepted: %s", rest);
    cr_assert_eq(e.status, 400);
    cr_assert_str_eq(e.field, field, "%s: %s", rest, e.message);
}

static const char GRID_SEARCH[] = "\"searcher\": {\"type\": \"grid\", \"metric\": \"loss\", "
                                  "\"mode\": \"min\"}";

Test(experiments, refusals_name_the_path) {
    char buf[1024];
    snprintf(buf, sizeof buf, "\"space\": {\"train.optimizer.lr\": {\"uniform\": [1, 0]}}, %s",
             GRID_SEARCH);
    refused(buf, "space.train.optimizer.lr.uniform");
    snprintf(buf, sizeof buf, "\"space\": {\"train.optimizer.lr\": {\"uniform\": [0, 1]}}, %s",
             GRID_SEARCH);
    refused(buf, "space.train.optimizer.lr"); /* a grid search needs grids or choices */
    snprintf(buf, sizeof buf, "\"space\": {\"a[x]\": {\"grid\": [1]}}, %s", GRID_SEARCH);
    refused(buf, "space.a[x]");
    snprintf(buf, sizeof buf, "\"space\": {\"a\": {\"int\": [1.5, 3]}}, %s", GRID_SEARCH);
    refused(buf, "space.a.int");
    refused("\"space\": {\"a\": {\"grid\": [1]}}, \"searcher\": {\"type\": \"tpe\", \"metric\": "
            "\"loss\", \"mode\": \"min\"}",
            "searcher.type");
    refused("\"space\": {\"a\": {\"grid\": [1]}}, \"searcher\": {\"type\": \"random\", "
            "\"metric\": \"loss\", \"mode\": \"min\"}",
            "searcher.max_trials");
    refused("\"space\": {\"a\": {\"grid\": [1]}}, \"searcher\": {\"type\": \"grid\", "
            "\"metric\": \"\", \"mode\": \"min\"}",
            "searcher.metric");
}

Test(experiments, a_grid_walks_its_points_last_path_fastest) {
    td_exp_spec s;
    td_reply_error e;
    char buf[1024];
    snprintf(buf, sizeof buf,
             "\"space\": {\"b\": {\"grid\": [10, 20, 30]}, \"a\": {\"choice\": "
             "[\"x\", \"y\"]}}, %s",
             GRID_SEARCH);
    cr_assert_eq(parse(&s, buf, &e), 0, "%s", e.message);
    cr_assert_eq(td_exp_trial_count(&s), 6);
    static const char *const want[] = {"{\"a\":\"x\",\"b\":10}", "{\"a\":\"x\",\"b\":20}",
                                       "{\"a\":\"x\",\"b\":30}", "{\"a\":\"y\",\"b\":10}",
                                       "{\"a\":\"y\",\"b\":20}", "{\"a\":\"y\",\"b\":30}"};
    for (int t = 0; t < 6; t++) {
        json_t *h = td_exp_hparams(&s, t);
        char *text = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
        cr_assert_str_eq(text, want[t], "trial %d", t);
        free(text);
        json_decref(h);
    }
    td_exp_spec_free(&s);
}

Test(experiments, random_draws_are_seeded_within_range_and_each_trials_own) {
    td_exp_spec s;
    td_reply_error e;
    cr_assert_eq(parse(&s,
                       "\"seed\": 11, \"space\": {\"lr\": {\"log_uniform\": [1e-4, 0.1]}, "
                       "\"n\": {\"int\": [2, 4]}}, \"searcher\": {\"type\": \"random\", "
                       "\"metric\": \"loss\", \"mode\": \"min\", \"max_trials\": 200}",
                       &e),
                 0, "%s", e.message);
    cr_assert_eq(td_exp_trial_count(&s), 200);
    bool seen[5] = {false};
    double lo = 1, hi = 0;
    for (int t = 0; t < 200; t++) {
        json_t *a = td_exp_hparams(&s, t), *b = td_exp_hparams(&s, t);
        cr_assert(json_equal(a, b), "a trial's draw is a function of the seed and its number");
        double lr = json_real_value(json_object_get(a, "lr"));
        long n = (long)json_integer_value(json_object_get(a, "n"));
        cr_assert(lr >= 1e-4 && lr <= 0.1 && n >= 2 && n <= 4);
        seen[n] = true;
        lo = fmin(lo, lr);
        hi = fmax(hi, lr);
        json_decref(a);
        json_decref(b);
    }
    cr_assert(seen[2] && seen[3] && seen[4], "an int range is inclusive");
    cr_assert(lo < 1e-3 && hi > 1e-2, "log-uniform reaches both decades' ends: %g %g", lo, hi);
    json_t *first = td_exp_hparams(&s, 0);
    s.seed = 12;
    json_t *other = td_exp_hparams(&s, 0);
    cr_assert(!json_equal(first, other), "another seed, other draws");
    json_decref(first);
    json_decref(other);
    td_exp_spec_free(&s);
}

Test(experiments, a_trials_body_sets_its_paths) {
    td_exp_spec s;
    td_reply_error e;
    char buf[1024];
    snprintf(buf, sizeof buf,
             "\"name\": \"sweep\", \"priority\": 3, \"space\": "
             "{\"train.optimizer.lr\": {\"grid\": [0.5]}, \"train.schedule.warmup\": {\"grid\": "
             "[7]}, \"layers[1].w\": {\"grid\": [9]}}, %s",
             GRID_SEARCH);
    cr_assert_eq(parse(&s, buf, &e), 0, "%s", e.message);
    json_t *h = td_exp_hparams(&s, 0);
    char *text = td_exp_trial_body(&s, 4, 0, h, &e);
    cr_assert(text, "%s", e.message);
    json_t *body = json_loads(text, 0, NULL);
    cr_assert_float_eq(json_real_value(json_object_get(
                           json_object_get(json_object_get(body, "train"), "optimizer"), "lr")),
                       0.5, 1e-12);
    cr_assert_eq(json_integer_value(json_object_get(
                     json_object_get(json_object_get(body, "train"), "schedule"), "warmup")),
                 7, "a missing object on the way is made");
    cr_assert_eq(json_integer_value(
                     json_object_get(json_array_get(json_object_get(body, "layers"), 1), "w")),
                 9);
    cr_assert_str_eq(json_string_value(json_object_get(body, "name")), "sweep-trial-0");
    cr_assert_eq(json_integer_value(json_object_get(body, "priority")), 3);
    cr_assert_null(json_object_get(body, "env"), "a train job gets no environment");
    json_decref(body);
    free(text);
    json_decref(h);
    td_exp_spec_free(&s);
    snprintf(buf, sizeof buf, "\"space\": {\"train.epochs.x\": {\"grid\": [1]}}, %s", GRID_SEARCH);
    cr_assert_eq(parse(&s, buf, &e), 0, "%s", e.message);
    h = td_exp_hparams(&s, 0);
    cr_assert_null(td_exp_trial_body(&s, 4, 0, h, &e), "a number is no object to go through");
    cr_assert_str_eq(e.field, "space.train.epochs.x");
    json_decref(h);
    td_exp_spec_free(&s);
}

Test(experiments, a_trials_metric_is_its_latest_and_best_value) {
    td_exp_trial t = {.metrics_since = -1};
    td_exp_spec loss = {.metric = "loss", .searcher = TD_SEARCH_RANDOM};
    td_exp_trial_fold(&t,
                      "[{\"event\":\"train\",\"step\":5,\"loss\":2.0},"
                      "{\"event\":\"train\",\"step\":10,\"loss\":1.0},"
                      "{\"event\":\"train\",\"step\":15,\"loss\":1.5,\"lr\":0.1}]",
                      &loss);
    cr_assert(t.has_latest && t.has_best);
    cr_assert_float_eq(t.latest, 1.5, 0);
    cr_assert_eq(t.latest_step, 15);
    cr_assert_float_eq(t.best, 1.0, 0);
    cr_assert_eq(t.best_step, 10);
    cr_assert_eq(t.metrics_since, 14, "the newest step is read again (an eval may follow)");
    td_exp_trial_fold(&t, "[{\"event\":\"eval\",\"step\":15,\"val_acc\":0.5}]", &loss);
    cr_assert_float_eq(t.latest, 1.5, 0, "a line without the metric changes nothing");
}

/* An experiment of body (after the base job) with its n trials, none made, each with its values. */
static void experiment_of(experiment *ex, int n, const char *body) {
    td_reply_error e = {0};
    memset(ex, 0, sizeof *ex);
    cr_assert_eq(parse(&ex->spec, body, &e), 0, "%s", e.message);
    ex->n_trials = td_exp_trial_count(&ex->spec);
    cr_assert_eq(ex->n_trials, n, "its trials");
    ex->trials = calloc((size_t)n, sizeof *ex->trials);
    for (int t = 0; t < n; t++)
        ex->trials[t] = (td_exp_trial){.trial = t, .hparams = td_exp_hparams(&ex->spec, t)};
}

/* ---- ASHA (td_exp_asha.c) ---- */

static void asha(experiment *ex, int n, const char *promotion) {
    char buf[1024];
    snprintf(buf, sizeof buf,
             "\"space\": {\"train.optimizer.lr\": {\"uniform\": [0.01, 0.1]}}, \"searcher\": "
             "{\"type\": \"asha\", \"metric\": \"loss\", \"mode\": \"min\", \"max_trials\": %d, "
             "\"max_steps\": 64, \"reduction_factor\": 4, \"rungs\": 3, \"promotion\": \"%s\"}",
             n, promotion);
    experiment_of(ex, n, buf);
}

/* Trial t paused at rung k with value v there. */
static void pause_at(experiment *ex, int t, int k, double v) {
    td_exp_trial *tr = &ex->trials[t];
    tr->made = true;
    tr->job = 100 + t;
    tr->rung = k;
    tr->paused = true;
    snprintf(tr->state, sizeof tr->state, "paused");
    tr->has_rung[k] = true;
    tr->rung_value[k] = v;
}

static void experiment_free(experiment *ex) {
    for (int t = 0; t < ex->n_trials; t++) json_decref(ex->trials[t].hparams);
    free(ex->trials);
    td_exp_spec_free(&ex->spec);
}

Test(experiments, asha_rungs_divide_max_steps) {
    experiment ex;
    asha(&ex, 8, "rung");
    cr_assert_eq(ex.spec.n_rungs, 3);
    cr_assert_eq(ex.spec.rung_steps[0], 4);
    cr_assert_eq(ex.spec.rung_steps[1], 16);
    cr_assert_eq(ex.spec.rung_steps[2], 64);
    cr_assert_eq(td_exp_asha_stop_at(&ex.spec, 0), 4);
    cr_assert_eq(td_exp_asha_stop_at(&ex.spec, 2), 0, "the last rung runs to the end");
    cr_assert_eq(td_exp_asha_rung(&ex.spec, 16), 1);
    cr_assert_eq(td_exp_asha_rung(&ex.spec, 0), 2);
    json_t *h = td_exp_hparams(&ex.spec, 3);
    td_reply_error e = {0};
    char *body = td_exp_trial_body(&ex.spec, 1, 3, h, &e);
    cr_assert(strstr(body, "\"max_steps\":64"), "a trial's run is max_steps long: %s", body);
    free(body);
    json_decref(h);
    experiment_free(&ex);
    refused("\"space\": {\"a\": {\"grid\": [1]}}, \"searcher\": {\"type\": \"asha\", \"metric\": "
            "\"l\", \"mode\": \"min\", \"max_trials\": 2, \"max_steps\": 15, \"rungs\": 3}",
            "searcher.rungs");
}

Test(experiments, asha_waits_for_a_complete_rung_then_keeps_its_top_quarter) {
    experiment ex;
    asha(&ex, 8, "rung");
    for (int t = 0; t < 7; t++) pause_at(&ex, t, 0, 1.0 + t); /* trial 7 not made yet */
    cr_assert_eq(td_exp_asha_next(&ex, true).what, TD_ASHA_NONE, "rung 0 is not complete");
    pause_at(&ex, 7, 0, 0.5); /* the best comes last */
    td_asha_move m = td_exp_asha_next(&ex, true);
    cr_assert_eq(m.what, TD_ASHA_PROMOTE);
    cr_assert_eq(m.trial, 7, "the best of the rung, whenever it came");
    cr_assert_eq(m.place, 1);
    cr_assert_eq(m.of, 8);
    cr_assert_eq(td_exp_asha_next(&ex, false).what, TD_ASHA_STOP, "stops need no slot");
    ex.trials[7].paused = false; /* promoted: on its way to rung 1 */
    ex.trials[7].rung = 1;
    m = td_exp_asha_next(&ex, true);
    cr_assert_eq(m.what, TD_ASHA_PROMOTE);
    cr_assert_eq(m.trial, 0, "8 / 4: the two best of rung 0 go on");
    ex.trials[0].paused = false;
    ex.trials[0].rung = 1;
    int stops = 0;
    for (m = td_exp_asha_next(&ex, true); m.what == TD_ASHA_STOP; m = td_exp_asha_next(&ex, true)) {
        cr_assert_geq(m.trial, 1);
        cr_assert_eq(m.place, m.trial + 2, "after trials 7 and 0");
        ex.trials[m.trial].paused = false; /* as the driver leaves it (td_exp_driver.c) */
        ex.trials[m.trial].final = true;
        snprintf(ex.trials[m.trial].state, sizeof ex.trials[m.trial].state, "succeeded");
        stops++;
    }
    cr_assert_eq(m.what, TD_ASHA_NONE);
    cr_assert_eq(stops, 6, "the rest of rung 0 stop there");
    experiment_free(&ex);
}

Test(experiments, asha_async_promotes_the_top_of_a_rung_so_far) {
    experiment ex;
    asha(&ex, 16, "async");
    for (int t = 0; t < 3; t++) pause_at(&ex, t, 0, 3.0 - t);
    cr_assert_eq(td_exp_asha_next(&ex, true).what, TD_ASHA_NONE, "3 / 4: none yet");
    pause_at(&ex, 3, 0, 2.5);
    td_asha_move m = td_exp_asha_next(&ex, true);
    cr_assert_eq(m.what, TD_ASHA_PROMOTE);
    cr_assert_eq(m.trial, 2, "the best of four so far");
    cr_assert_eq(td_exp_asha_next(&ex, false).what, TD_ASHA_NONE, "no slot: it waits");
    pause_at(&ex, 4, 0, NAN);
    ex.trials[4].has_rung[0] = false; /* reported nothing at its rung: never promoted */
    cr_assert_eq(td_exp_asha_next(&ex, true).trial, 2);
    experiment_free(&ex);
}

Test(experiments, asha_a_rung_is_complete_once_the_rungs_below_have_decided) {
    experiment ex;
    asha(&ex, 16, "rung");
    for (int t = 0; t < 16; t++) pause_at(&ex, t, 0, 1.0 + t);
    for (int t = 0; t < 2; t++) { /* two of four promoted (max_concurrent 2), paused at rung 1 */
        pause_at(&ex, t, 1, 5.0 - t);
        ex.trials[t].has_rung[0] = true;
    }
    /* trials 2 and 3 are in rung 0's top quarter but wait for a slot: rung 1 is not complete
     * (with the rungs below not counted, it was: its two trials judged alone, one stopped) */
    td_asha_move m = td_exp_asha_next(&ex, true);
    cr_assert_eq(m.what, TD_ASHA_PROMOTE, "%d: trial %d rung %d", m.what, m.trial, m.rung);
    cr_assert_eq(m.rung, 0);
    cr_assert_eq(m.trial, 2);
    m = td_exp_asha_next(&ex, false);
    cr_assert_eq(m.what, TD_ASHA_STOP, "rung 0's bottom three quarters stop");
    cr_assert_eq(m.rung, 0, "nothing of rung 1 is decided yet");
    experiment_free(&ex);
}

/* ---- PBT (td_exp_pbt.c) ---- */

static void pbt(experiment *ex, int n, const char *space) {
    char buf[1024];
    snprintf(buf, sizeof buf,
             "\"space\": %s, \"searcher\": {\"type\": \"pbt\", \"metric\": \"loss\", \"mode\": "
             "\"min\", \"population\": %d, \"max_steps\": 30, \"interval\": 10, "
             "\"resample_probability\": 0}",
             space, n);
    experiment_of(ex, n, buf);
}

/* Trial t paused at step `at` with v its latest loss. */
static void pbt_pause(experiment *ex, int t, long at, double v) {
    td_exp_trial *tr = &ex->trials[t];
    tr->made = true;
    tr->job = 100 + t;
    tr->paused = true;
    tr->stop_at = at;
    snprintf(tr->state, sizeof tr->state, "paused");
    tr->has_latest = true;
    tr->latest = v;
}

Test(experiments, pbt_decides_once_the_whole_population_is_at_a_generations_end) {
    experiment ex;
    pbt(&ex, 4, "{\"train.optimizer.lr\": {\"uniform\": [0.01, 0.1]}}");
    cr_assert_eq(td_exp_pbt_next_stop(&ex.spec, 0), 10);
    cr_assert_eq(td_exp_pbt_next_stop(&ex.spec, 20), 0, "the last generation runs to the end");
    for (int t = 0; t < 3; t++) pbt_pause(&ex, t, 10, 1.0 + t);
    cr_assert_eq(td_exp_pbt_boundary(&ex), 0, "trial 3 is not made");
    pbt_pause(&ex, 3, 10, 0.5);
    cr_assert_eq(td_exp_pbt_boundary(&ex), 10);
    cr_assert(!td_exp_pbt_decided(&ex, 10));
    td_pbt_exploit plan[4];
    cr_assert_eq(td_exp_pbt_plan(&ex, 10, plan), 1, "a quarter of 4");
    cr_assert_eq(plan[0].target, 2, "the worst loss");
    cr_assert_eq(plan[0].source, 3, "from the best (the top quarter: one)");
    cr_assert_eq(plan[0].place, 4, "its place");
    cr_assert_eq(plan[0].of, 4);
    double from = json_real_value(json_object_get(ex.trials[3].hparams, "train.optimizer.lr"));
    double to = json_real_value(json_object_get(plan[0].hparams, "train.optimizer.lr"));
    double lo = from * 0.8 < 0.01 ? 0.01 : from * 0.8, hi = from * 1.2 > 0.1 ? 0.1 : from * 1.2;
    cr_assert(to == lo || to == hi, "perturbed: %g from %g", to, from);
    td_pbt_exploit again[4];
    cr_assert_eq(td_exp_pbt_plan(&ex, 10, again), 1);
    cr_assert(json_equal(again[0].hparams, plan[0].hparams), "decided alike");
    json_decref(plan[0].hparams);
    json_decref(again[0].hparams);
    ex.trials[1].paused = false; /* sent on to step 20: the generation was decided */
    ex.trials[1].stop_at = 20;
    cr_assert_eq(td_exp_pbt_boundary(&ex), 0);
    cr_assert(td_exp_pbt_decided(&ex, 10), "a trial went past it");
    cr_assert(!td_exp_pbt_decided(&ex, 20));
    snprintf(ex.trials[1].state, sizeof ex.trials[1].state, "failed");
    ex.trials[1].final = true;
    cr_assert_eq(td_exp_pbt_boundary(&ex), 10, "a failed trial is out of the population");
    experiment_free(&ex);
}

Test(experiments, pbt_moves_an_integer_a_step_where_rounding_would_keep_it) {
    experiment ex;
    pbt(&ex, 2, "{\"model.width\": {\"int\": [1, 4]}}");
    json_object_set_new(ex.trials[0].hparams, "model.width", json_integer(2));
    pbt_pause(&ex, 0, 10, 0.1);
    pbt_pause(&ex, 1, 10, 0.2);
    bool up = false, down = false;
    for (long at = 10; at < 400; at += 10) {
        for (int t = 0; t < 2; t++) ex.trials[t].stop_at = at;
        td_pbt_exploit plan[2];
        cr_assert_eq(td_exp_pbt_plan(&ex, at, plan), 1);
        json_int_t w = json_integer_value(json_object_get(plan[0].hparams, "model.width"));
        cr_assert(w == 1 || w == 3, "2 x 0.8 and 2 x 1.2 both round to 2: a step, %lld",
                  (long long)w);
        up |= w == 3;
        down |= w == 1;
        json_decref(plan[0].hparams);
    }
    cr_assert(up && down, "both ways, as the draws fall");
    experiment_free(&ex);
}

Test(experiments, pbt_moves_a_choice_to_a_neighbour_and_keeps_numbers_in_range) {
    experiment ex;
    pbt(&ex, 2,
        "{\"train.optimizer.type\": {\"choice\": [\"sgd\", \"adam\", \"adamw\"]}, "
        "\"train.batch_size\": {\"int\": [16, 20]}}");
    json_object_set_new(ex.trials[0].hparams, "train.optimizer.type", json_string("adam"));
    json_object_set_new(ex.trials[0].hparams, "train.batch_size", json_integer(20));
    pbt_pause(&ex, 0, 10, 0.1);
    pbt_pause(&ex, 1, 10, 0.2);
    td_pbt_exploit plan[2];
    cr_assert_eq(td_exp_pbt_plan(&ex, 10, plan), 1, "a population of 2 still exploits");
    cr_assert_eq(plan[0].target, 1, "the worse");
    cr_assert_eq(plan[0].source, 0);
    const char *type = json_string_value(json_object_get(plan[0].hparams, "train.optimizer.type"));
    cr_assert(strcmp(type, "sgd") == 0 || strcmp(type, "adamw") == 0, "a neighbour: %s", type);
    json_int_t bs = json_integer_value(json_object_get(plan[0].hparams, "train.batch_size"));
    cr_assert(bs == 16 || bs == 20, "20 x 0.8 = 16, 20 x 1.2 kept at 20: %lld", (long long)bs);
    json_decref(plan[0].hparams);
    json_object_set_new(ex.trials[0].hparams, "train.batch_size", json_integer(18));
    for (long at = 10; at < 400; at += 10) { /* 18 x 0.8 and 18 x 1.2 round to 14 and 22: kept */
        for (int t = 0; t < 2; t++) ex.trials[t].stop_at = at;
        cr_assert_eq(td_exp_pbt_plan(&ex, at, plan), 1);
        bs = json_integer_value(json_object_get(plan[0].hparams, "train.batch_size"));
        cr_assert(bs == 16 || bs == 20, "within [16, 20]: %lld", (long long)bs);
        json_decref(plan[0].hparams);
    }
    experiment_free(&ex);
    refused("\"space\": {\"train.seed\": {\"int\": [1, 4]}}, \"searcher\": {\"type\": \"pbt\", "
            "\"metric\": \"loss\", \"mode\": \"min\", \"population\": 4, \"max_steps\": 30, "
            "\"interval\": 10}",
            "space.train.seed");
}
