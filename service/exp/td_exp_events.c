/* An experiment's events in this daemon's life, what GET /v1/experiments/ID/events sends: a
 * trial made or changing state ("trial"), the best trial changing ("best"), the experiment
 * ending ("state"). Bounded: a trial has a few states and the best changes at most once a trial
 * ends or a turn, so an experiment of 1000 trials holds a few thousand. They are not stored:
 * after a restart the first turn says every trial's state again, under ids above the earlier
 * life's (x->first_seq), so a client that comes back gets the whole current state. */
#include "service/exp/td_exp_private.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_EVENTS = 16384 }; /* an experiment's, at most: past it, the oldest go */

void td_exp_emit(td_experiments *x, experiment *ex, const char *type, json_t *data) {
    char *text = json_dumps(data, JSON_COMPACT | JSON_REAL_PRECISION(10));
    json_decref(data);
    if (!text) return;
    if (ex->n_events == MAX_EVENTS) { /* a stream that far behind starts from what is kept */
        free(ex->events[0].data);
        memmove(ex->events, ex->events + 1, (size_t)(ex->n_events - 1) * sizeof *ex->events);
        ex->n_events--;
    }
    if (ex->n_events == ex->cap_events) {
        ex->cap_events = ex->cap_events ? 2 * ex->cap_events : 64;
        ex->events = td_realloc(ex->events, (size_t)ex->cap_events * sizeof *ex->events);
    }
    struct td_exp_event *ev = &ex->events[ex->n_events++];
    ev->seq = ex->last_seq = ex->last_seq > 0 ? ex->last_seq + 1 : x->first_seq;
    snprintf(ev->type, sizeof ev->type, "%s", type);
    ev->data = text;
    pthread_cond_broadcast(&x->changed);
}

int td_exp_events_after(const experiment *ex, long after, int limit, td_db_event_fn fn, void *ctx) {
    int n = 0;
    for (int i = 0; i < ex->n_events && n < limit; i++)
        if (ex->events[i].seq > after) {
            fn(ctx, ex->events[i].seq, ex->events[i].type, ex->events[i].data);
            n++;
        }
    return n;
}

void td_exp_free_events(experiment *ex) {
    for (int i = 0; i < ex->n_events; i++) free(ex->events[i].data);
    free(ex->events);
    ex->events = NULL;
    ex->n_events = ex->cap_events = 0;
}
