/* The daemon's parts below its HTTP API, without a daemon: the submit validator (keys, ranges,
 * the environment a command job gets, data files checked before a job is accepted), the state
 * database (events, metrics in the order they happened, deletion, an older database's schema
 * brought up to date) and a process group's record of how its processes ended. */
#include "test_util.h"

#include "service/store/td_db.h"
#include "service/run/td_launch.h"
#include "service/submit/td_submit.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* ---- submit -------------------------------------------------------------------------------- */

static td_submit_rules rules(void) {
    static const char *roots[1];
    roots[0] = test_tmpdir();
    return (td_submit_rules){
        .data_roots = roots, .n_roots = 1, .slots = 4, .state_dir = test_tmpdir()};
}

static const char *const TRAIN =
    "{\"model\": {\"preset\": \"lenet5\", \"num_classes\": 10},"
    " \"data\": {\"format\": \"synthetic\", \"shape\": [1, 28, 28], \"num_classes\": 10,"
    " \"size\": 64}, \"train\": {\"epochs\": 1, \"batch_size\": 8,"
    " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}%s}";

/* Parses TRAIN with `extra` members added; the reply error in *e. */
static int parse_train(const char *extra, td_submission *s, td_reply_error *e) {
    char body[2048];
    snprintf(body, sizeof body, TRAIN, extra);
    td_submit_rules r = rules();
    return td_submission_parse(s, body, strlen(body), &r, e);
}

Test(submit, service_members_are_read_and_removed_from_the_worker_spec) {
    td_submission s;
    td_reply_error e;
    cr_assert_eq(parse_train(", \"resources\": {\"nproc\": 2, \"time_limit_s\": 90}, "
                             "\"restart\": {\"max_restarts\": 3}, \"priority\": -5",
                             &s, &e),
                 0, "%s", e.message);
    cr_assert_eq(s.nproc, 2);
    cr_assert_eq(s.max_restarts, 3);
    cr_assert_eq(s.priority, -5);
    cr_assert_float_eq(s.time_limit_s, 90.0, 1e-9);
    cr_assert_null(json_object_get(s.spec, "resources"));
    cr_assert_null(json_object_get(s.spec, "priority"));
    td_submission_free(&s);
}

Test(submit, an_unknown_key_lists_every_allowed_one) {
    td_submission s;
    td_reply_error e;
    cr_assert_neq(parse_train(", \"bogus\": 1", &s, &e), 0);
    cr_assert_eq(e.status, 400);
    cr_assert_str_eq(e.field, "bogus");
    const char *keys[] = {"model",   "data",     "train",   "checkpoint", "resources",
                          "restart", "priority", "command", "env"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_assert(strstr(e.message, keys[i]), "%s lacks %s", e.message, keys[i]);
}

Test(submit, ranges_name_their_field) {
    struct {
        const char *extra, *field;
    } cases[] = {
        {", \"resources\": {\"nproc\": 5}", "resources.nproc"}, /* 4 slots */
        {", \"resources\": {\"time_limit_s\": 0}", "resources.time_limit_s"},
        {", \"priority\": 1.5", "priority"},
        {", \"priority\": 2000000", "priority"},
        {", \"restart\": {\"max_restarts\": -1}", "restart.max_restarts"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        td_submission s;
        td_reply_error e;
        cr_assert_neq(parse_train(cases[i].extra, &s, &e), 0, "%s was accepted", cases[i].extra);
        cr_assert_str_eq(e.field, cases[i].field, "%s: %s", cases[i].extra, e.message);
    }
}

static bool has_env(char **env, const char *entry) {
    for (; *env; env++)
        if (strcmp(*env, entry) == 0) return true;
    return false;
}

Test(submit, a_command_gets_unbuffered_python_unless_its_env_says_otherwise) {
    td_submit_rules r = rules();
    td_submission s;
    td_reply_error e;
    const char *plain = "{\"command\": [\"/usr/bin/python3\", \"x.py\"], \"env\": {\"A\": \"1\"}}";
    cr_assert_eq(td_submission_parse(&s, plain, strlen(plain), &r, &e), 0, "%s", e.message);
    cr_assert(has_env(s.env, "PYTHONUNBUFFERED=1"));
    cr_assert(has_env(s.env, "A=1"));
    cr_assert_str_eq(s.name, "x.py");
    td_submission_free(&s);
    const char *own = "{\"command\": [\"/bin/true\"], \"env\": {\"PYTHONUNBUFFERED\": \"\"}}";
    cr_assert_eq(td_submission_parse(&s, own, strlen(own), &r, &e), 0, "%s", e.message);
    cr_assert(has_env(s.env, "PYTHONUNBUFFERED="));
    cr_assert(!has_env(s.env, "PYTHONUNBUFFERED=1"));
    td_submission_free(&s);
}

Test(submit, idx_labels_beyond_num_classes_are_invalid_data) {
    unsigned char images[16 + 4 * 28 * 28] = {0, 0, 8, 3, 0, 0, 0, 4, 0, 0, 0, 28, 0, 0, 0, 28};
    unsigned char labels[8 + 4] = {0, 0, 8, 1, 0, 0, 0, 4, 1, 2, 3, 11};
    char ipath[512], lpath[512];
    snprintf(ipath, sizeof ipath, "%s", test_write_file("images.idx", images, sizeof images));
    snprintf(lpath, sizeof lpath, "%s", test_write_file("labels.idx", labels, sizeof labels));
    char body[2048];
    snprintf(body, sizeof body,
             "{\"model\": {\"preset\": \"lenet5\", \"num_classes\": 10}, \"data\": {\"format\": "
             "\"idx\", \"train\": {\"images\": \"%s\", \"labels\": \"%s\"}}, \"train\": "
             "{\"epochs\": 1, \"batch_size\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}}",
             ipath, lpath);
    td_submit_rules r = rules();
    td_submission s;
    td_reply_error e;
    cr_assert_neq(td_submission_parse(&s, body, strlen(body), &r, &e), 0);
    cr_assert_str_eq(e.code, "invalid_data");
    cr_assert_str_eq(e.field, "data.train.labels");
    cr_assert(strstr(e.message, "label 11"), "%s", e.message);
    labels[11] = 9; /* the same files within the classes: accepted */
    snprintf(lpath, sizeof lpath, "%s", test_write_file("labels.idx", labels, sizeof labels));
    cr_assert_eq(td_submission_parse(&s, body, strlen(body), &r, &e), 0, "%s", e.message);
    td_submission_free(&s);
}

/* ---- the state database ---------------------------------------------------------------------- */

static td_db *fresh_db(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
    remove(path);
    td_db *db = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_db_open(&db, path, &err), 0, "%s", err.msg);
    return db;
}

static long insert_job(td_db *db) {
    td_db_job row = {.nproc = 1, .exit_code = -1, .priority = 3, .time_limit_s = 60};
    snprintf(row.name, sizeof row.name, "j");
    snprintf(row.kind, sizeof row.kind, "train");
    snprintf(row.state, sizeof row.state, "queued");
    row.spec = (char *)"{}";
    td_err err = {{0}};
    cr_assert_eq(td_db_insert_job(db, &row, &err), 0, "%s", err.msg);
    return row.id;
}

static void add_metric(td_db *db, long job, long seq, const char *type, long step) {
    char data[128];
    snprintf(data, sizeof data, "{\"event\":\"%s\",\"step\":%ld}", type, step);
    td_db_event ev = {job, seq, type, data, step, true, NULL, 0};
    td_err err = {{0}};
    cr_assert_eq(td_db_add_event(db, &ev, NULL, &err), 0, "%s", err.msg);
}

static void collect(void *ctx, const char *data) {
    strcat(ctx, data);
    strcat(ctx, "|");
}

Test(db, metrics_of_one_step_keep_the_order_they_happened_in) {
    td_db *db = fresh_db("order.db");
    long job = insert_job(db);
    add_metric(db, job, 1, "train", 5);
    add_metric(db, job, 2, "eval", 5);
    add_metric(db, job, 3, "done", 5);
    add_metric(db, job, 4, "train", 3); /* an earlier step, later: ordered by step first */
    char out[1024] = "";
    td_err err = {{0}};
    cr_assert_eq(td_db_metrics(db, job, -1, collect, out, &err), 0);
    cr_assert_str_eq(out, "{\"event\":\"train\",\"step\":3}|{\"event\":\"train\",\"step\":5}|"
                          "{\"event\":\"eval\",\"step\":5}|{\"event\":\"done\",\"step\":5}|");
    td_db_close(db);
}

static void count_event(void *ctx, long seq, const char *type, const char *data) {
    (void)seq, (void)type, (void)data;
    ++*(int *)ctx;
}

static void load_none(void *ctx, const td_db_job *row, const td_db_attempt *a, int n) {
    (void)a, (void)n;
    free(row->spec); /* the callback's to keep or free */
    ++*(int *)ctx;
}

Test(db, deleting_a_job_removes_everything_recorded_of_it) {
    td_db *db = fresh_db("delete.db");
    long a = insert_job(db), b = insert_job(db);
    add_metric(db, a, 1, "train", 1);
    add_metric(db, b, 1, "train", 1);
    td_err err = {{0}};
    cr_assert_eq(td_db_delete_jobs(db, &a, 1, &err), 0, "%s", err.msg);
    int events = 0, jobs = 0;
    cr_assert_eq(td_db_events(db, a, 0, 100, count_event, &events, &err), 0);
    cr_assert_eq(events, 0);
    cr_assert_eq(td_db_events(db, b, 0, 100, count_event, &events, &err), 0);
    cr_assert_eq(events, 1, "the other job's events stay");
    cr_assert_eq(td_db_load_jobs(db, load_none, &jobs, &err), 0);
    cr_assert_eq(jobs, 1);
    cr_assert_gt(insert_job(db), b, "ids are never reused");
    td_db_close(db);
}

static void read_priority(void *ctx, const td_db_job *row, const td_db_attempt *a, int n) {
    (void)a, (void)n;
    free(row->spec);
    *(int *)ctx = row->priority;
}

Test(db, an_older_database_gets_the_new_columns) {
    char path[1024];
    snprintf(path, sizeof path, "%s/old.db", test_tmpdir());
    remove(path);
    sqlite3 *raw;
    cr_assert_eq(sqlite3_open(path, &raw), SQLITE_OK);
    /* the first release's schema: no priority, time_limit or metrics.seq */
    const char *old =
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, kind TEXT "
        "NOT NULL, spec TEXT NOT NULL, nproc INTEGER NOT NULL, max_restarts INTEGER NOT NULL, "
        "restarts INTEGER NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL, started_at "
        "REAL, finished_at REAL, exit_code INTEGER, reason TEXT, pgid INTEGER NOT NULL DEFAULT 0, "
        "last_seq INTEGER NOT NULL DEFAULT 0);"
        "CREATE TABLE metrics (job_id INTEGER NOT NULL REFERENCES jobs(id), event TEXT NOT NULL, "
        "step INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (job_id, event, step));"
        "INSERT INTO jobs (name, kind, spec, nproc, max_restarts, restarts, state, created_at) "
        "VALUES ('old', 'train', '{}', 1, 0, 0, 'succeeded', 1);";
    cr_assert_eq(sqlite3_exec(raw, old, NULL, NULL, NULL), SQLITE_OK, "%s", sqlite3_errmsg(raw));
    sqlite3_close(raw);
    td_db *db = NULL;
    td_err err = {{0}};
    cr_assert_eq(td_db_open(&db, path, &err), 0, "%s", err.msg);
    int priority = -1;
    cr_assert_eq(td_db_load_jobs(db, read_priority, &priority, &err), 0, "%s", err.msg);
    cr_assert_eq(priority, 0, "the old job gets the default priority");
    add_metric(db, 1, 1, "train", 1); /* writes metrics.seq */
    td_db_close(db);
}

/* ---- a process group's record ------------------------------------------------------------- */

static td_group two_ranks(void) {
    td_group g = {.n = 2, .alive = 2, .failed_rank = -1};
    g.pids = calloc(2, sizeof(pid_t));
    g.pids[0] = 1001;
    g.pids[1] = 1002;
    return g; /* pgid 0: terminating signals nobody */
}

Test(group, the_first_failure_is_the_groups_and_later_exits_are_not_failures) {
    td_group g = two_ranks();
    cr_assert(td_group_reaped(&g, 1002, 3 << 8, 10.0)); /* exit(3) */
    cr_assert_eq(g.first_failure, 3);
    cr_assert_eq(g.failed_rank, 1);
    cr_assert(g.terminating, "the others are told to stop");
    cr_assert(td_group_reaped(&g, 1001, SIGTERM, 10.0)); /* killed by the SIGTERM */
    cr_assert_eq(g.first_failure, 3, "the cascade does not replace the cause");
    cr_assert_eq(g.stop_status, 128 + SIGTERM);
    cr_assert_eq(g.alive, 0);
    cr_assert_str_eq(g.grace_note, "");
    td_group_free(&g);
}

Test(group, a_process_killed_after_the_grace_period_is_named_with_137) {
    td_group g = two_ranks();
    td_group_terminate(&g, SIGTERM, 0.0); /* a cancel, with no grace at all */
    td_group_tick(&g);                    /* the grace period is over: SIGKILL */
    cr_assert(g.grace_expired);
    cr_assert(td_group_reaped(&g, 1001, 0, 0.0)); /* rank 0 stopped cleanly */
    cr_assert(td_group_reaped(&g, 1002, SIGKILL, 0.0));
    cr_assert_eq(g.first_failure, 0, "stopping on request is not a failure");
    cr_assert_eq(g.stop_status, 137);
    cr_assert(strstr(g.grace_note, "rank 1 (pid 1002)"), "%s", g.grace_note);
    cr_assert(strstr(g.grace_note, "grace period"), "%s", g.grace_note);
    td_group_free(&g);
}
