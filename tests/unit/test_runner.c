/* The runner (service/run/td_runner.h) without a shepherd: GPU slots taken all or none and given
 * back, each process's CUDA_VISIBLE_DEVICES, the notes an attempt's file carries, an attempt
 * found again from its notes, in this traind's words and in an older one's (a daemon upgraded
 * under running jobs re-attaches to what the old one started), rank 0's output read by whole
 * lines, and a failed rank's own words from its log. */
#include "service/run/td_runner.h"

#include "base/td_buf.h"
#include "base/td_strv.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static td_runner_config four_gpus = {.state_dir = "/nonexistent", .slots = 4, .gpus = 4};

Test(runner, gpus_are_taken_all_or_none_and_given_back) {
    td_runner n;
    td_runner_init(&n, &four_gpus);
    int *a = td_runner_take_gpus(&n, 3);
    cr_assert(a);
    cr_assert_eq(a[0] + a[1] + a[2], 0 + 1 + 2);
    cr_assert_eq(td_runner_gpus_free(&n), 1);
    cr_assert_null(td_runner_take_gpus(&n, 2), "two asked for, one free: none taken");
    cr_assert_eq(td_runner_gpus_free(&n), 1, "a refused take holds nothing");
    td_runner_give_back_gpus(&n, a, 3);
    cr_assert_eq(td_runner_gpus_free(&n), 4);
    free(a);
    td_runner_free(&n);
}

Test(runner, devices_are_shared_out_by_process_or_all_to_each) {
    int ids[] = {7, 5, 3, 1};
    td_runner_config cfg = four_gpus;
    cfg.gpu_ids = ids;
    td_runner n;
    td_runner_init(&n, &cfg);
    int slots[] = {0, 1, 2, 3};
    char **each = td_runner_devices_strv(&n, slots, 4, 2, false);
    cr_assert_str_eq(each[0], "7,5");
    cr_assert_str_eq(each[1], "3,1");
    cr_assert_null(each[2]);
    char **all = td_runner_devices_strv(&n, slots, 4, 2, true);
    cr_assert_str_eq(all[0], "7,5,3,1");
    cr_assert_str_eq(all[1], "7,5,3,1");
    td_strv_free(each);
    td_strv_free(all);
    td_runner_free(&n);
}

/* The notes the runner writes for a part of 2 processes with GPU slots 2 and 3, read back. */
Test(runner, notes_found_again) {
    td_runner n;
    td_runner_init(&n, &four_gpus);
    int slots[] = {2, 3};
    long long starts[] = {10, 20};
    td_runner_attempt r = {.job = 9,
                           .uid = 61000,
                           .kind = "command",
                           .attempt = 1,
                           .node_rank = 1,
                           .nnodes = 2,
                           .nproc = 2,
                           .procs = 2,
                           .dir = "/nonexistent/jobs/9",
                           .slots = slots,
                           .n_slots = 2};
    json_t *notes = json_pack("{s:b}", "part", 1);
    td_runner_notes(&r, "/sys/fs/cgroup/traind/job-9", starts, notes);
    cr_assert(td_runner_notes_of_part(notes));
    cr_assert_eq(td_runner_notes_n_slots(notes, -1), 2);
    int *devices = NULL;
    long long found[2] = {0};
    char cgroup[256];
    td_shepherd sh;
    td_err err = {{0}};
    int rc = td_runner_attach(&n, "/nonexistent/jobs/9/attempt-1.node-1", notes, 2, 2, &devices,
                              found, cgroup, sizeof cgroup, &sh, &err);
    cr_assert_eq(rc, -1, "no attempt file: %s", err.msg);
    cr_assert(devices);
    cr_assert_eq(devices[0], 2);
    cr_assert_eq(devices[1], 3);
    cr_assert_eq(n.used_slots, 2);
    cr_assert_eq(td_runner_gpus_free(&n), 2, "the very GPUs are held again");
    cr_assert_eq(found[0], 10);
    cr_assert_eq(found[1], 20);
    cr_assert_str_eq(cgroup, "/sys/fs/cgroup/traind/job-9");
    free(devices);
    json_decref(notes);
    td_runner_free(&n);
}

/* An older traind's notes: a part said "guest", its slot count "slots" and its GPUs "devices"; a
 * job's own attempt listed its GPUs in "slots". */
Test(runner, an_older_traind_s_notes_are_read) {
    td_runner n;
    td_runner_init(&n, &four_gpus);
    json_t *part = json_loads("{\"guest\": true, \"slots\": 2, \"devices\": [1, 3], "
                              "\"log_start\": [5, 6], \"cgroup\": \"\"}",
                              0, NULL);
    cr_assert(td_runner_notes_of_part(part));
    cr_assert_eq(td_runner_notes_n_slots(part, -1), 2);
    int *devices = NULL;
    long long found[2] = {0};
    char cgroup[64];
    td_shepherd sh;
    td_err err = {{0}};
    td_runner_attach(&n, "/nonexistent/a", part, 2, 2, &devices, found, cgroup, sizeof cgroup, &sh,
                     &err);
    cr_assert(devices);
    cr_assert_eq(devices[0], 1);
    cr_assert_eq(devices[1], 3);
    cr_assert_eq(found[1], 6);
    free(devices);
    json_t *own = json_loads("{\"slots\": [0], \"log_start\": [0]}", 0, NULL);
    cr_assert_not(td_runner_notes_of_part(own));
    cr_assert_eq(td_runner_notes_n_slots(own, 1), 1, "a list is not a count");
    td_runner_attach(&n, "/nonexistent/b", own, 1, 1, &devices, found, cgroup, sizeof cgroup, &sh,
                     &err);
    cr_assert(devices);
    cr_assert_eq(devices[0], 0);
    cr_assert_eq(td_runner_gpus_free(&n), 1);
    free(devices);
    json_decref(part);
    json_decref(own);
    td_runner_free(&n);
}

typedef struct seen {
    char lines[8][32];
    long long ends[8];
    int n, stop_after; /* fn says stop after this many (0: never) */
} seen;

static bool take(void *ctx, char *line, size_t n, long long end) {
    seen *s = ctx;
    snprintf(s->lines[s->n], sizeof s->lines[s->n], "%.*s", (int)n, line);
    s->ends[s->n++] = end;
    return !(s->stop_after && s->n == s->stop_after);
}

static int temp_file(const char *text) {
    char path[] = "/tmp/test_runner.XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    unlink(path);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    return fd;
}

/* Whole lines with the offset after each; a stop keeps the rest for the next call; the last
 * partial line only when final. */
Test(runner, output_is_read_by_whole_lines) {
    int fd = temp_file("a\nbb\nccc\ntail");
    long long at = 0;
    td_buf line = {0};
    seen s = {.stop_after = 2};
    cr_assert(td_runner_read_lines(fd, &at, 13, false, 0, &line, take, &s), "stopped: more left");
    cr_assert_eq(s.n, 2);
    cr_assert_str_eq(s.lines[1], "bb");
    cr_assert_eq(s.ends[1], 5);
    s.stop_after = 0;
    cr_assert_not(td_runner_read_lines(fd, &at, 13, false, 0, &line, take, &s));
    cr_assert_eq(s.n, 3, "\"tail\" has no newline yet");
    cr_assert_str_eq(s.lines[2], "ccc");
    cr_assert_eq(s.ends[2], 9);
    cr_assert_not(td_runner_read_lines(fd, &at, -1, true, 0, &line, take, &s));
    cr_assert_eq(s.n, 4);
    cr_assert_str_eq(s.lines[3], "tail");
    cr_assert_eq(s.ends[3], 13);
    td_buf_free(&line);
    close(fd);
}

/* A failed rank's words: traind-worker's error line, else a command's last line that is not a
 * metric; only what this attempt wrote (from its offset). */
Test(runner, a_failed_rank_s_own_words) {
    char dir[] = "/tmp/test_runner_dir.XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/rank-1.log", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("old: ignore me\ntraind-worker: error: data.train.path: no such file\n"
          "Traceback\nValueError: bad lr\n{\"event\": \"train\"}\n",
          f);
    fclose(f);
    char out[128];
    td_runner_rank_message(dir, 1, 0, false, out, sizeof out);
    cr_assert_str_eq(out, "data.train.path: no such file");
    td_runner_rank_message(dir, 1, 67, true, out, sizeof out);
    cr_assert_str_eq(out, "ValueError: bad lr");
    td_runner_rank_message(dir, 1, 67, false, out, sizeof out);
    cr_assert_str_eq(out, "", "a worker without its error line says nothing");
    td_runner_rank_message(dir, 0, 0, true, out, sizeof out);
    cr_assert_str_eq(out, "", "no log");
    unlink(path);
    rmdir(dir);
}

/* A trial's hyperparameters file, DIR/hparams.json, where a job of the daemon's own identity could
 * have planted the name first: a FIFO is not waited on (the start would hang), a link is not
 * followed (its target is not written); the start fails saying so. A regular file is written. */
static int start_with_hparams(const char *dir, td_err *err) {
    static const td_runner_config self = {.state_dir = "/nonexistent",
                                          .shepherd = "/nonexistent",
                                          .slots = 1,
                                          .run_as = TD_RUN_AS_SELF};
    td_runner n;
    td_runner_init(&n, &self);
    char *argv[] = {"true", NULL}, *env[] = {"TRAIND_HPARAMS={\"lr\":0.1}", NULL};
    td_runner_attempt r = {.job = 1,
                           .kind = "command",
                           .nnodes = 1,
                           .nproc = 1,
                           .procs = 1,
                           .dir = dir,
                           .argv = argv,
                           .env = env,
                           .master_addr = "127.0.0.1"};
    long long starts[1] = {0};
    char *logs[] = {"/dev/null", NULL}, cgroup[256];
    td_shepherd sh = {.fd = -1};
    json_t *notes = json_object();
    int rc = td_runner_start(&n, &r, starts, logs, notes, &sh, cgroup, sizeof cgroup, err);
    json_decref(notes);
    td_runner_free(&n);
    return rc;
}

Test(runner, a_planted_hparams_file_is_neither_waited_on_nor_followed, .timeout = 20) {
    char dir[] = "/tmp/traind-runner-XXXXXX", path[64], target[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/hparams.json", dir);
    snprintf(target, sizeof target, "%s/target", dir);
    td_err err = {{0}};
    cr_assert_eq(mkfifo(path, 0600), 0);
    cr_assert_eq(start_with_hparams(dir, &err), -1, "a FIFO taken for the file");
    cr_assert(strstr(err.msg, "hparams.json"), "%s", err.msg);
    unlink(path);
    FILE *f = fopen(target, "w");
    cr_assert(f);
    fputs("kept", f);
    fclose(f);
    cr_assert_eq(symlink(target, path), 0);
    cr_assert_eq(start_with_hparams(dir, &err), -1, "a link followed");
    char got[16] = "";
    f = fopen(target, "r");
    cr_assert(f && fgets(got, sizeof got, f));
    fclose(f);
    cr_assert_str_eq(got, "kept", "the link's target untouched");
    unlink(path);
    start_with_hparams(dir, &err); /* (the shepherd is not there: it fails after the file) */
    f = fopen(path, "r");
    cr_assert(f && fgets(got, sizeof got, f), "a regular file written");
    fclose(f);
    cr_assert_str_eq(got, "{\"lr\":0.1}\n");
    unlink(path);
    unlink(target);
    rmdir(dir);
}
