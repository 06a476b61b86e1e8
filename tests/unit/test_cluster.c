/* The master's node registry (service/cluster/td_cluster.h): joining, the secret, refusals,
 * heartbeats, losses and the listing, with times passed in instead of waited for. */
#include "service/cluster/td_cluster.h"

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
             "\"slots\":2,\"gpus\":[{\"index\":0,\"name\":\"Test GPU\",\"memory_bytes\":1024},"
             "{\"index\":3,\"name\":null,\"memory_bytes\":null}],\"version\":\"9.9\"}",
             protocol, name, id);
    return b;
}

static int do_register(td_cluster *c, const char *name, const char *id, double now,
                       td_reply_error *e) {
    td_buf out = {0};
    const char *b = reg_body(name, id, TD_CLUSTER_PROTOCOL);
    int rc = td_cluster_register(c, b, strlen(b), now, "10.0.0.2", &out, e);
    td_buf_free(&out);
    return rc;
}

static int do_heartbeat(td_cluster *c, const char *name, const char *id, double now,
                        td_reply_error *e) {
    char b[256];
    snprintf(b, sizeof b, "{\"name\":\"%s\",\"node_id\":\"%s\",\"slots_used\":1}", name, id);
    td_buf out = {0};
    int rc = td_cluster_heartbeat(c, name, b, strlen(b), now, &out, e);
    td_buf_free(&out);
    return rc;
}

/* The listing's state of node `name`, or "" when it is not listed. */
static const char *state_of(td_cluster *c, const char *name, double now) {
    static char state[16];
    td_buf out = {0};
    td_cluster_list(c, now, 0, NULL, &out);
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
    td_cluster_list(c, 101, 3, NULL, &out);
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
    json_t *gpus = json_object_get(n1, "gpus");
    cr_assert_eq(json_array_size(gpus), 2);
    json_t *g0 = json_array_get(gpus, 0), *g1 = json_array_get(gpus, 1);
    cr_expect_eq(json_integer_value(json_object_get(g0, "index")), 0);
    cr_expect_str_eq(json_string_value(json_object_get(g0, "name")), "Test GPU");
    cr_expect_eq(json_integer_value(json_object_get(g0, "memory_bytes")), 1024);
    cr_expect_eq(json_integer_value(json_object_get(g1, "index")), 3, "declared ordinals stay");
    cr_expect(json_is_null(json_object_get(g1, "name")), "an unknown name is null");
    json_decref(o);
    td_cluster_close(c);
}

Test(cluster, refusals_name_the_problem) {
    td_cluster *c = open_master(SECRET);
    td_reply_error e;
    td_buf out = {0};
    const char *b = reg_body("n1", "aaaaaaaa01", TD_CLUSTER_PROTOCOL + 1);
    cr_expect_neq(td_cluster_register(c, b, strlen(b), 0, "10.0.0.2", &out, &e), 0);
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
    const char *junk = "{\"protocol\":4,\"name\":\"n3\"";
    cr_expect_neq(td_cluster_register(c, junk, strlen(junk), 0, "10.0.0.2", &out, &e), 0);
    cr_expect_eq(e.status, 400);
    const char *addr = "{\"protocol\":4,\"name\":\"n3\",\"node_id\":\"dddddddd01\",\"address\":"
                       "\"nowhere\",\"slots\":1,\"version\":\"9.9\"}";
    cr_expect_neq(td_cluster_register(c, addr, strlen(addr), 0, "10.0.0.2", &out, &e), 0);
    cr_expect_str_eq(e.field, "address");
    const char *gpus = "{\"protocol\":4,\"name\":\"n3\",\"node_id\":\"dddddddd01\",\"address\":"
                       "\"10.0.0.3\",\"slots\":2,\"gpus\":[{\"index\":0}],\"version\":\"9.9\"}";
    cr_expect_neq(td_cluster_register(c, gpus, strlen(gpus), 0, "10.0.0.2", &out, &e), 0);
    cr_expect(strstr(e.message, "one slot per GPU"), "%s", e.message);
    const char *twice = "{\"protocol\":4,\"name\":\"n3\",\"node_id\":\"dddddddd01\",\"address\":"
                        "\"10.0.0.3\",\"slots\":2,\"gpus\":[{\"index\":1},{\"index\":1}],"
                        "\"version\":\"9.9\"}";
    cr_expect_neq(td_cluster_register(c, twice, strlen(twice), 0, "10.0.0.2", &out, &e), 0);
    cr_expect(strstr(e.message, "gpus[1]: GPU 1 is listed twice"), "%s", e.message);
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

/* The inventory a node declares (--gpus, the config file's "gpus") and how it meets what the
 * driver finds. */
Test(gpus, declared_lists_parse_and_meet_the_found_devices) {
    td_node_gpu d[TD_GPUS_MAX],
        found[2] = {{0, "Real GPU", 80ull << 30}, {1, "Real GPU", 80ull << 30}}, out[TD_GPUS_MAX];
    int n = 0, m = 0;
    td_err err = {{0}};
    cr_assert_eq(td_gpus_parse_list("0,2,3", d, &n, &err), 0, "%s", err.msg);
    cr_expect_eq(n, 3);
    cr_expect_eq(d[1].index, 2);
    cr_expect_neq(td_gpus_parse_list("0,,1", d, &n, &err), 0);
    cr_expect(strstr(err.msg, "separated by commas"), "%s", err.msg);
    cr_expect_neq(td_gpus_parse_list("0,x", d, &n, &err), 0);
    cr_expect(strstr(err.msg, "\"x\" is not a device ordinal"), "%s", err.msg);
    cr_expect_neq(td_gpus_parse_list("1,1", d, &n, &err), 0);
    cr_expect(strstr(err.msg, "listed twice"), "%s", err.msg);

    json_t *a =
        json_loads("[{\"index\": 1, \"name\": \"Declared\", \"memory_gib\": 2}, 0]", 0, NULL);
    cr_assert_eq(td_gpus_parse_json(a, "gpus", d, &n, &err), 0, "%s", err.msg);
    json_decref(a);
    cr_expect_eq(n, 2);
    cr_expect_str_eq(d[0].name, "Declared");
    cr_expect_eq(d[0].memory_bytes, 2ull << 30);
    a = json_loads("[{\"index\": 1, \"memory\": 2}]", 0, NULL);
    cr_expect_neq(td_gpus_parse_json(a, "gpus", d, &n, &err), 0);
    cr_expect(strstr(err.msg, "gpus[0].memory: unknown key"), "%s", err.msg);
    json_decref(a);

    /* declared beside found ones: checked, completed; without any found: taken as they are */
    cr_assert_eq(td_gpus_parse_list("1", d, &n, &err), 0);
    cr_assert_eq(td_gpus_resolve(d, n, found, 2, out, &m, &err), 0, "%s", err.msg);
    cr_expect_eq(m, 1);
    cr_expect_eq(out[0].index, 1);
    cr_expect_str_eq(out[0].name, "Real GPU");
    cr_assert_eq(td_gpus_parse_list("0,2", d, &n, &err), 0);
    cr_expect_neq(td_gpus_resolve(d, n, found, 2, out, &m, &err), 0);
    cr_expect(strstr(err.msg, "GPU 2 is declared, but the driver finds 2 GPUs"), "%s", err.msg);
    cr_assert_eq(td_gpus_resolve(d, n, NULL, 0, out, &m, &err), 0);
    cr_expect_eq(m, 2);
    cr_expect_eq(out[1].index, 2);
    cr_assert_eq(td_gpus_resolve(NULL, 0, found, 2, out, &m, &err), 0);
    cr_expect_eq(m, 2, "nothing declared: every found one");

    char text[128];
    td_gpus_describe(found, 2, text, sizeof text);
    cr_expect_str_eq(text, "GPUs 0,1 (Real GPU, 80.0 GiB each)");
}

/* A registration answers a credential of the node's own, new each time; heartbeats carry it,
 * not the shared secret, and speak for their node only. */
Test(cluster, each_node_gets_a_credential_of_its_own) {
    td_cluster *c = open_master(SECRET);
    td_reply_error e;
    td_buf out = {0};
    const char *b = reg_body("n1", "aaaaaaaa01", TD_CLUSTER_PROTOCOL);
    cr_assert_eq(td_cluster_register(c, b, strlen(b), 0, "10.0.0.2", &out, &e), 0, "%s", e.message);
    json_t *o = json_loads(out.data, 0, NULL);
    const char *cred = json_string_value(json_object_get(o, "credential"));
    cr_assert(cred && strlen(cred) == 64, "a credential of 64 hex digits");
    char auth[128], node[64];
    snprintf(auth, sizeof auth, "Node n1:%s", cred);
    cr_expect(td_cluster_node_authorized(c, auth, "10.0.0.2", node, &e));
    cr_expect_str_eq(node, "n1");
    char secret_only[64];
    snprintf(secret_only, sizeof secret_only, "Cluster %s", SECRET);
    cr_expect_not(td_cluster_node_authorized(c, secret_only, "10.0.0.2", node, &e),
                  "the shared secret alone");
    cr_expect_str_eq(e.code, "node_credential");
    snprintf(auth, sizeof auth, "Node n2:%s", cred);
    cr_expect_not(td_cluster_node_authorized(c, auth, "10.0.0.2", node, &e), "another's name");
    cr_expect_not(td_cluster_node_authorized(c, "Node n1:0000", "10.0.0.2", node, &e), "wrong");
    /* a heartbeat speaks for its own node only */
    char hb[256];
    snprintf(hb, sizeof hb, "{\"name\":\"n1\",\"node_id\":\"aaaaaaaa01\"}");
    td_buf_free(&out);
    cr_expect_neq(td_cluster_heartbeat(c, "n2", hb, strlen(hb), 1, &out, &e), 0);
    cr_expect_eq(e.status, 403);
    /* registering again: the old credential is no longer the node's */
    char old[65];
    snprintf(old, sizeof old, "%s", cred);
    json_decref(o);
    td_buf_free(&out);
    cr_assert_eq(td_cluster_register(c, b, strlen(b), 1, "10.0.0.2", &out, &e), 0);
    snprintf(auth, sizeof auth, "Node n1:%s", old);
    cr_expect_not(td_cluster_node_authorized(c, auth, "10.0.0.2", node, &e), "a stale one");
    td_buf_free(&out);
    td_cluster_close(c);
}

/* What a rogue agent says of itself is checked: a unicast address it can be reached at,
 * printable strings. */
Test(cluster, an_agents_address_and_strings_are_checked) {
    td_cluster *c = open_master(SECRET);
    td_reply_error e;
    td_buf out = {0};
    static const char *const BAD[] = {"0.0.0.0", "255.255.255.255", "224.0.0.1", "127.0.0.1"};
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        char b[512];
        snprintf(b, sizeof b,
                 "{\"protocol\":%d,\"name\":\"n%zu\",\"node_id\":\"aaaaaaaa0%zu\","
                 "\"address\":\"%s\",\"slots\":1,\"version\":\"9.9\"}",
                 TD_CLUSTER_PROTOCOL, i, i, BAD[i]);
        cr_expect_neq(td_cluster_register(c, b, strlen(b), 0, "10.0.0.9", &out, &e), 0, "%s",
                      BAD[i]);
        cr_expect_str_eq(e.field, "address", "%s", BAD[i]);
    }
    char b[512];
    snprintf(b, sizeof b,
             "{\"protocol\":%d,\"name\":\"lo\",\"node_id\":\"aaaaaaaa09\","
             "\"address\":\"127.0.0.2\",\"slots\":1,\"version\":\"9.9\"}",
             TD_CLUSTER_PROTOCOL);
    cr_expect_eq(td_cluster_register(c, b, strlen(b), 0, "127.0.0.1", &out, &e), 0,
                 "loopback from loopback (one host): %s", e.message);
    td_buf_free(&out);
    snprintf(b, sizeof b,
             "{\"protocol\":%d,\"name\":\"v\",\"node_id\":\"aaaaaaaa10\","
             "\"address\":\"10.0.0.5\",\"slots\":1,\"version\":\"9.9\\u001b[2J\"}",
             TD_CLUSTER_PROTOCOL);
    cr_expect_neq(td_cluster_register(c, b, strlen(b), 0, "10.0.0.5", &out, &e), 0);
    cr_expect_str_eq(e.field, "version");
    td_buf_free(&out);
    td_cluster_close(c);
}
