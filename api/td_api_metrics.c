/* GET /metrics: the service in Prometheus's text exposition format (version 0.0.4), for a
 * scraper holding the API token. It holds the HTTP figures only this module sees (requests by
 * route and status, their latency, open event streams) and asks the jobs and the cluster for
 * theirs. Written by hand: the format is a few lines of text per series, and Debian packages no
 * C client library for it. */
#include "api/td_api_private.h"

#include "base/td_clock.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Latency buckets (seconds): from a cached JSON reply to a long download. */
static const double BUCKETS[TD_API_BUCKETS] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                               0.25,  0.5,   1,    2.5,   5,    10};

void td_api_stats_init(td_api_stats *s) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
}

void td_api_stats_free(td_api_stats *s) {
    free(s->series);
    pthread_mutex_destroy(&s->mu);
}

void td_api_stats_request(td_api_stats *s, const char *route, const char *method, unsigned status,
                          double seconds) {
    pthread_mutex_lock(&s->mu);
    td_api_series *x = NULL;
    for (int i = 0; i < s->n && !x; i++)
        if (s->series[i].route == route && strcmp(s->series[i].method, method) == 0 &&
            s->series[i].status == status)
            x = &s->series[i];
    if (!x && s->n < TD_API_SERIES_MAX) {
        if (s->n == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 32;
            s->series = td_realloc(s->series, (size_t)s->cap * sizeof *s->series);
        }
        x = &s->series[s->n++];
        memset(x, 0, sizeof *x);
        x->route = route;
        snprintf(x->method, sizeof x->method, "%s", method);
        x->status = status;
    }
    if (x) { /* past the limit (methods a client made up): not counted */
        x->count++;
        x->sum += seconds;
        for (int b = 0; b < TD_API_BUCKETS; b++)
            if (seconds <= BUCKETS[b]) x->buckets[b]++;
    }
    pthread_mutex_unlock(&s->mu);
}

static void http_metrics(td_api_stats *s, td_buf *out) {
    td_buf_puts(out, "# HELP traind_http_requests_total HTTP requests answered, by route, method "
                     "and status.\n# TYPE traind_http_requests_total counter\n");
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++) {
        const td_api_series *x = &s->series[i];
        td_buf_printf(out, "traind_http_requests_total{route=\"%s\",method=\"", x->route);
        td_buf_label_value(out, x->method);
        td_buf_printf(out, "\",code=\"%u\"} %llu\n", x->status, x->count);
    }
    td_buf_puts(out, "# HELP traind_http_request_duration_seconds From a request's headers to its "
                     "last byte sent (an event stream: its whole life).\n"
                     "# TYPE traind_http_request_duration_seconds histogram\n");
    /* one histogram per route and method: the series of each status summed */
    for (int i = 0; i < s->n; i++) {
        const td_api_series *x = &s->series[i];
        bool first = true;
        for (int k = 0; k < i && first; k++)
            first =
                !(s->series[k].route == x->route && strcmp(s->series[k].method, x->method) == 0);
        if (!first) continue;
        unsigned long long buckets[TD_API_BUCKETS] = {0}, count = 0;
        double sum = 0;
        for (int k = i; k < s->n; k++) {
            const td_api_series *y = &s->series[k];
            if (y->route != x->route || strcmp(y->method, x->method) != 0) continue;
            for (int b = 0; b < TD_API_BUCKETS; b++) buckets[b] += y->buckets[b];
            count += y->count;
            sum += y->sum;
        }
        td_buf lab = {0};
        td_buf_printf(&lab, "route=\"%s\",method=\"", x->route);
        td_buf_label_value(&lab, x->method);
        td_buf_puts(&lab, "\"");
        for (int b = 0; b < TD_API_BUCKETS; b++)
            td_buf_printf(out, "traind_http_request_duration_seconds_bucket{%s,le=\"%g\"} %llu\n",
                          lab.data, BUCKETS[b], buckets[b]);
        td_buf_printf(out,
                      "traind_http_request_duration_seconds_bucket{%s,le=\"+Inf\"} %llu\n"
                      "traind_http_request_duration_seconds_sum{%s} %.6f\n"
                      "traind_http_request_duration_seconds_count{%s} %llu\n",
                      lab.data, count, lab.data, sum, lab.data, count);
        td_buf_free(&lab);
    }
    pthread_mutex_unlock(&s->mu);
    td_buf_printf(out,
                  "# HELP traind_sse_clients Event streams open now.\n"
                  "# TYPE traind_sse_clients gauge\ntraind_sse_clients %ld\n",
                  atomic_load(&s->sse_clients));
}

/* The nodes as GET /v1/nodes lists them: slots, GPUs and state of each. */
static void node_metrics(td_api *api, td_buf *out) {
    if (!api->cfg.cluster) return;
    td_buf list = {0};
    td_cluster_list(api->cfg.cluster, td_clock_now(), td_jobs_slots_used(api->jobs), NULL, &list);
    json_t *o = json_loads(list.data ? list.data : "{}", 0, NULL);
    td_buf_free(&list);
    json_t *nodes = json_object_get(o, "nodes"), *n;
    size_t i;
    static const char *const STATES[] = {"ready", "draining", "lost"};
    /* GET /v1/nodes's slots.total and slots.used */
    static const char *const SLOTS[][3] = {
        {"traind_node_slots", "total", "A node's slots (GPUs, or CPU slots)."},
        {"traind_node_slots_used", "used", "The slots a node's jobs hold."}};
    for (int m = 0; m < 2; m++) {
        td_buf_printf(out, "# HELP %s %s\n# TYPE %s gauge\n", SLOTS[m][0], SLOTS[m][2],
                      SLOTS[m][0]);
        json_array_foreach(nodes, i, n) {
            const char *name = json_string_value(json_object_get(n, "name"));
            td_buf_printf(out, "%s{node=\"%s\"} %lld\n", SLOTS[m][0], name ? name : "",
                          (long long)json_integer_value(
                              json_object_get(json_object_get(n, "slots"), SLOTS[m][1])));
        }
    }
    td_buf_puts(out, "# HELP traind_node_gpus A node's GPUs.\n# TYPE traind_node_gpus gauge\n");
    json_array_foreach(nodes, i, n) {
        const char *name = json_string_value(json_object_get(n, "name"));
        td_buf_printf(out, "traind_node_gpus{node=\"%s\"} %zu\n", name ? name : "",
                      json_array_size(json_object_get(n, "gpus")));
    }
    td_buf_puts(out, "# HELP traind_node_state 1 for the state a node is in (ready, draining, "
                     "lost), 0 for the others.\n# TYPE traind_node_state gauge\n");
    json_array_foreach(nodes, i, n) {
        const char *name = json_string_value(json_object_get(n, "name"));
        const char *state = json_string_value(json_object_get(n, "state"));
        for (int s = 0; s < 3; s++)
            td_buf_printf(out, "traind_node_state{node=\"%s\",state=\"%s\"} %d\n", name ? name : "",
                          STATES[s], state && strcmp(state, STATES[s]) == 0);
    }
    json_decref(o);
}

/* The database file and its write-ahead log. */
static void database_metrics(td_api *api, td_buf *out) {
    if (!api->cfg.state_dir) return;
    long long bytes = 0;
    static const char *const FILES[] = {"state.db", "state.db-wal"};
    for (int i = 0; i < 2; i++) {
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", api->cfg.state_dir, FILES[i]);
        if (stat(path, &st) == 0) bytes += (long long)st.st_size;
    }
    td_buf_printf(out,
                  "# HELP traind_database_bytes The state database and its write-ahead log.\n"
                  "# TYPE traind_database_bytes gauge\ntraind_database_bytes %lld\n",
                  bytes);
}

enum MHD_Result td_api_metrics(td_api *api, struct MHD_Connection *c) {
    td_buf out = {0};
    td_buf_printf(&out,
                  "# HELP traind_build_info The daemon's version.\n"
                  "# TYPE traind_build_info gauge\ntraind_build_info{version=\"%s\"} 1\n",
                  api->cfg.version ? api->cfg.version : "");
    td_jobs_prometheus(api->jobs, td_clock_wall(), &out);
    if (api->cfg.experiments) td_experiments_prometheus(api->cfg.experiments, &out);
    node_metrics(api, &out);
    database_metrics(api, &out);
    http_metrics(&api->stats, &out);
    size_t len = out.len;
    char *data = td_buf_take(&out);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!r) free(data);
    return td_api_respond(c, MHD_HTTP_OK, r, "text/plain; version=0.0.4; charset=utf-8", NULL);
}
