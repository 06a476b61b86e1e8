/* Feeds: a conversation of agents with a master's node registry (service/cluster/td_cluster.c):
 * messages separated by NUL bytes, each one letter then its body: R{json}  POST
 * /v1/cluster/register      H{json}  POST /v1/cluster/heartbeat A text   an Authorization header D
 * name / U name  drain / undrain a node S digits the sweeper, that many seconds later Every message
 * moves the clock half a second; the registry's listing (GET /v1/nodes) closes the conversation.
 * Why: any host that reaches the master's port can send these, before the secret is even checked by
 * the route (td_cluster_authorized is fuzzed with the rest), and what a registration stores is
 * rendered later for every user. The registry is opened in-process, times passed in, without a
 * database, one per input. */
#include "fuzz_util.h"

#include "service/cluster/td_cluster.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static td_log *lg; /* every line formatted, then dropped */

static void run(td_cluster *c, char op, const char *body, size_t len, double *now) {
    td_buf out = {0};
    td_reply_error e = {0};
    int rc = 0;
    *now += 0.5;
    switch (op) {
    case 'R':
        rc = td_cluster_register(c, body, len, *now, "192.0.2.1", &out, &e);
        break;
    case 'H':
        rc = td_cluster_heartbeat(c, "n1", body, len, *now, &out, &e);
        break;
    case 'A':
        rc = td_cluster_authorized(c, body, "192.0.2.1", &e) ? 0 : -1;
        break;
    case 'N': {
        char node[64];
        rc = td_cluster_node_authorized(c, body, "192.0.2.1", node, &e) ? 0 : -1;
        break;
    }
    case 'D':
    case 'U':
        rc = td_cluster_drain(c, body, op == 'D', *now, 0, &out, &e);
        break;
    case 'S':
        td_cluster_sweep(c, *now + strtod(body, NULL));
        break;
    default:
        break;
    }
    if (rc != 0)
        FUZZ_CHECK(e.status >= 400 && e.message[0], "a refusal without a status or message");
    else if (op == 'R' || op == 'H') /* (jansson wrote it: an object, unless it failed to) */
        FUZZ_CHECK(out.len > 2 && out.data[0] == '{' && strcmp(out.data, "{}\n") != 0,
                   "no reply object: %.200s", out.data ? out.data : "");
    td_buf_free(&out);
}

/* The listing must be JSON and name every node the registry holds: a node stored with text
 * that cannot be rendered would vanish from GET /v1/nodes while placement still uses it. */
static void check_listing(td_cluster *c, double now) {
    td_cluster_node *nodes;
    int n = td_cluster_snapshot(c, &nodes);
    free(nodes);
    td_buf out = {0};
    td_cluster_list(c, now, 0, NULL, &out);
    json_error_t je;
    json_t *o = json_loadb(out.data, out.len, 0, &je);
    FUZZ_CHECK(o, "the listing is not JSON (%s): %.200s", je.text, out.data);
    size_t listed = json_array_size(json_object_get(o, "nodes"));
    FUZZ_CHECK(listed == (size_t)n, "%zu nodes listed of %d registered: %.300s", listed, n,
               out.data);
    json_decref(o);
    td_buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!lg) {
        FILE *null = fopen("/dev/null", "w");
        if (!null || !(lg = td_log_open(null, false, TD_LOG_DEBUG))) abort();
    }
    td_node_gpu gpu[2] = {{0, "Fuzz GPU", 1ull << 34}, {1, "", 0}};
    td_cluster_config cfg = {.name = "m0",
                             .address = "10.0.0.1",
                             .slots = 2,
                             .gpus = 2,
                             .gpu = gpu,
                             .version = "0.1.0",
                             .secret = "0123456789abcdef0123",
                             .heartbeat_s = 2,
                             .timeout_s = 10,
                             .log = lg};
    td_cluster *c;
    td_err err = {{0}};
    if (td_cluster_open(&c, &cfg, &err) != 0) abort();
    char *text = fuzz_text(data, size);
    double now = 1000;
    for (size_t at = 0; at < size;) {
        size_t n = strlen(text + at); /* one message: up to the next NUL */
        if (n > 0) run(c, text[at], text + at + 1, n - 1, &now);
        at += n + 1;
    }
    check_listing(c, now);
    free(text);
    td_cluster_close(c);
    return 0;
}
