/* The master's node registry (service/td_cluster.h): joining, the secret, refusals, heartbeats,
 * losses and the listing, with times passed in instead of waited for. */
#include "service/td_cluster.h"

#include "test_util.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

static const char SECRET[] = "0123456789abcdef0123";

static td_cluster *open_master_db(const char *secret, td_db *db) {
    td_cluster_config cfg = {.db = db,
                             .name = "m0",
                             .address = "10.0.0.1",
                             .slots = 4,
                             .version = "9.9",
                             .secret = secret,
                             .heartbeat_s = 2,
                             .timeout_s = 10};
    td_cluster *c = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_cluster_open(&c, &cfg, &err), 0, "%s", err.msg);
    return c;
}

static td_cluster *open_master(const char *secret) {
    return open_master_db(secret, NULL);
}

static char *reg_body(const char *name, const char *id, int protocol) {
    static char b[512];
    snprintf(b, sizeof b,
             "{\"protocol\":%d,\"name\":\"%s\",\"node_id\":\"%s\",\"address\":\"10.0.0.2\","
             "\"slots\":2,\"gpus\":1,\"version\":\"9.9\"}",
             protocol, name, id);
    return b;
}

static int do_register(td_cluster *c, const char *name, const char *id, double now,
                       td_reply_error *e) {
    td_buf out = {0};
    const char *b = reg_body(name, id, TD_CLUSTER_PROTOCOL);
    int rc = td_cluster_register(c, b, strlen(b), now, &out, e);
    td_buf_free(&out);
    return rc;
}

static int do_heartbeat(td_cluster *c, const char *name, const char *id, double now,
                        td_reply_error *e) {
    char b[256];
    snprintf(b, sizeof b, "{\"name\":\"%s\",\"node_id\":\"%s\",\"slots_used\":1}", name, id);
    td_buf out = {0};
    int rc = td_cluster_heartbeat(c, b, strlen(b), now, &out, e);
    td_buf_free(&out);
    return rc;
}

/* The listing's state of node `name`, or "" when it is not listed. */
static const char *state_of(td_cluster *c, const char *name, double now) {
    static char state[16];
    td_buf out = {0};
    td_cluster_list(c, now, 0, &out);
    json_t *o = json_loads(out.data, 0, NULL);
    td_buf_free(&out);
    state[0] = 0;
    json_t *n;
    size_t i;
    json_array_foreach(json_object_get(o, "nodes"), i, n) {
        if (strcmp(json_string_value(json_object_get(n, "name")), name) == 0)
            snprintf(state, sizeof state, "%s", json_string_value(json_object_get(n, "state")));
    }
    json_decref(o);
    return state;
}

Test(cluster, the_secret_is_checked_and_a_master_without_one_takes_no_agent) {
    td_cluster *c = open_master(SECRET);
    td_reply_error e;
    char good[64];
    snprintf(good, sizeof good, "Cluster %s", SECRET);
    cr_expect(td_cluster_authorized(c, good, "10.0.0.2", &e));
    cr_expect(!td_cluster_authorized(c, "Cluster 0123456789abcdef0124", "10.0.0.2", &e));
    cr_expect_eq(e.status, 401);
    cr_expect(strstr(e.message, "wrong cluster secret"), "%s", e.message);
    cr_expect(!td_cluster_authorized(c, "Cluster 0123456789abcdef012", "10.0.0.2", &e),
              "a prefix of the secret is not the secret");
    cr_expect(!td_cluster_authorized(c, NULL, "10.0.0.2", &e));
    cr_expect(strstr(e.message, "missing"), "%s", e.message);
    cr_expect(!td_cluster_authorized(c, SECRET, "10.0.0.2", &e), "the scheme word is required");
    td_cluster_close(c);

    c = open_master(NULL);
    cr_expect(!td_cluster_authorized(c, good, "10.0.0.2", &e));
    cr_expect_eq(e.status, 403);
    cr_expect(strstr(e.message, "--cluster-secret-file"), "%s", e.message);
    td_cluster_close(c);
}

Test(cluster, nodes_join_and_are_listed_after_the_master) {
    td_cluster *c = open_master(SECRET);
    td_reply_error e;
    cr_expect_str_eq(state_of(c, "m0", 100), "ready", "a master alone lists itself");
    cr_assert_eq(do_register(c, "n2", "aaaaaaaa01", 100, &e), 0, "%s", e.message);
    cr_assert_eq(do_register(c, "n1", "bbbbbbbb01", 100, &e), 0, "%s", e.message);
    td_buf out = {0};
    td_cluster_list(c, 101, 3, &out);
    json_t *o = json_loads(out.data, 0, NULL);
    td_buf_free(&out);
    json_t *nodes = json_object_get(o, "nodes");
    cr_assert_eq(json_array_size(nodes), 3);
    const char *want[] = {"m0", "n1", "n2"};
    for (size_t i = 0; i < 3; i++)
        cr_expect_str_eq(json_string_value(json_object_get(json_array_get(nodes, i), "name")),
                         want[i]);
    json_t *m = json_array_get(nodes, 0), *n1 = json_array_get(nodes, 1);
    cr_expect_str_eq(json_string_value(json_object_get(m, "role")), "master");
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(m, "slots"), "used")), 3);
    cr_expect_str_eq(json_string_value(json_object_get(n1, "role")), "agent");
    cr_expect_str_eq(json_string_value(json_object_get(n1, "address")), "10.0.0.2");
    cr_expect_str_eq(json_string_value(json_object_get(n1, "state")), "ready");
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(n1, "slots"), "total")), 2);
    cr_expect_eq(json_array_size(json_object_get(n1, "gpus")), 1);
    json_decref(o);
    td_cluster_close(c);
}

Test(cluster, refusals_name_the_problem) {
    td_cluster *c = open_master(SECRET);
    td_reply_error e;
    td_buf out = {0};
    const char *b = reg_body("n1", "aaaaaaaa01", TD_CLUSTER_PROTOCOL + 1);
    cr_expect_neq(td_cluster_register(c, b, strlen(b), 0, &out, &e), 0);
    cr_expect_eq(e.status, 400);
    cr_expect_str_eq(e.code, "protocol_version");
    cr_expect_neq(do_register(c, "m0", "aaaaaaaa01", 0, &e), 0, "the master's own name");
    cr_expect_eq(e.status, 409);
    cr_expect_eq(do_register(c, "n1", "aaaaaaaa01", 0, &e), 0);
    cr_expect_neq(do_register(c, "n1", "cccccccc01", 1, &e), 0, "another node, the same name");
    cr_expect_eq(e.status, 409);
    cr_expect(strstr(e.message, "--node-name"), "%s", e.message);
    cr_expect_eq(do_register(c, "n1", "aaaaaaaa01", 2, &e), 0, "the same node again is fine");
    cr_expect_neq(do_register(c, "bad name", "aaaaaaaa02", 2, &e), 0);
    cr_expect_str_eq(e.field, "name");
    const char *junk = "{\"protocol\":1,\"name\":\"n3\"";
    cr_expect_neq(td_cluster_register(c, junk, strlen(junk), 0, &out, &e), 0);
    cr_expect_eq(e.status, 400);
    const char *addr = "{\"protocol\":1,\"name\":\"n3\",\"node_id\":\"dddddddd01\",\"address\":"
                       "\"nowhere\",\"slots\":1,\"version\":\"9.9\"}";
    cr_expect_neq(td_cluster_register(c, addr, strlen(addr), 0, &out, &e), 0);
    cr_expect_str_eq(e.field, "address");
    td_buf_free(&out);
    td_cluster_close(c);
}

Test(cluster, a_silent_node_is_lost_after_the_timeout_and_registers_again) {
    td_cluster *c = open_master(SECRET); /* timeout 10 s */
    td_reply_error e;
    cr_assert_eq(do_register(c, "n1", "aaaaaaaa01", 100, &e), 0);
    cr_expect_eq(do_heartbeat(c, "n1", "aaaaaaaa01", 108, &e), 0);
    cr_expect_eq(td_cluster_sweep(c, 117.9), 0, "9.9 s after its heartbeat it is not lost");
    cr_expect_str_eq(state_of(c, "n1", 117.9), "ready");
    cr_expect_eq(td_cluster_sweep(c, 118.0), 1, "10 s after it is");
    cr_expect_str_eq(state_of(c, "n1", 118), "lost");
    cr_expect_eq(td_cluster_sweep(c, 200), 0, "lost once");
    cr_expect_neq(do_heartbeat(c, "n1", "aaaaaaaa01", 201, &e), 0);
    cr_expect_eq(e.status, 404, "a lost node's heartbeat tells it to register again");
    cr_expect_eq(do_register(c, "n2", "cccccccc01", 201, &e), 0);
    cr_expect_eq(do_register(c, "n1", "bbbbbbbb01", 202, &e), 0,
                 "a lost node's name may be taken by another node");
    cr_expect_str_eq(state_of(c, "n1", 202), "ready");
    cr_expect_neq(do_heartbeat(c, "n1", "aaaaaaaa01", 203, &e), 0, "the old node id is not it");
    cr_expect_neq(do_heartbeat(c, "n9", "aaaaaaaa01", 203, &e), 0);
    cr_expect_eq(e.status, 404);
    td_cluster_close(c);
}

static int drain(td_cluster *c, const char *name, bool on, td_reply_error *e) {
    td_buf out = {0};
    int rc = td_cluster_drain(c, name, on, 0, 0, &out, e);
    td_buf_free(&out);
    return rc;
}

Test(cluster, draining_is_shown_kept_in_the_database_and_undone) {
    char path[4096];
    snprintf(path, sizeof path, "%s/state.db", test_tmpdir());
    td_db *db = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_db_open(&db, path, &err), 0, "%s", err.msg);
    td_cluster *c = open_master_db(SECRET, db);
    td_reply_error e;
    cr_assert_eq(do_register(c, "n1", "aaaaaaaa01", 0, &e), 0);
    cr_expect_neq(drain(c, "n9", true, &e), 0);
    cr_expect_eq(e.status, 404);
    cr_expect_eq(drain(c, "n1", true, &e), 0, "%s", e.message);
    cr_expect_eq(drain(c, "m0", true, &e), 0, "%s", e.message);
    cr_expect_eq(drain(c, "m0", true, &e), 0, "draining twice is draining");
    cr_expect_str_eq(state_of(c, "n1", 1), "draining");
    cr_expect_str_eq(state_of(c, "m0", 1), "draining");
    cr_expect(td_cluster_drained(c, "m0"));
    cr_expect_eq(td_cluster_sweep(c, 100), 1);
    cr_expect_str_eq(state_of(c, "n1", 100), "lost", "lost shows over draining");
    td_cluster_close(c);

    /* a restarted master: both still drained, n1 drained as soon as it is back */
    c = open_master_db(SECRET, db);
    cr_expect(td_cluster_drained(c, "m0"));
    cr_expect(td_cluster_drained(c, "n1"));
    cr_assert_eq(do_register(c, "n1", "aaaaaaaa01", 200, &e), 0);
    cr_expect_str_eq(state_of(c, "n1", 200), "draining");
    cr_expect_eq(drain(c, "n1", false, &e), 0);
    cr_expect_str_eq(state_of(c, "n1", 200), "ready");
    td_cluster_close(c);
    c = open_master_db(SECRET, db);
    cr_expect(!td_cluster_drained(c, "n1"), "undrained is kept too");
    cr_expect(td_cluster_drained(c, "m0"));
    td_cluster_close(c);
    td_db_close(db);
}
