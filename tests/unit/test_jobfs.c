/* service/run/td_jobfs.h, the one way into a job's files: nothing below a job's directory is
 * reached through a symbolic link, above its start, or by opening a FIFO; what a job names outside
 * its directory is opened with the job's rights only; trees of any depth are removed without
 * following a link. Each case runs with openat2 and again one component at a time (the
 * fallback for kernels without it). The cases that act as another user need root. */
#define _GNU_SOURCE
#include "test_util.h"

#include "service/run/td_jobfs.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const uid_t JOB_UID = 1879048250;

/* A fresh directory under the test's temporary one. */
static const char *fresh(const char *name) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
    mkdir(path, 0755);
    return path;
}

static void write_text(const char *path, const char *text, mode_t mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* The two ways: openat2, and a component at a time. */
static void both(void (*body)(const char *tag)) {
    td_jobfs_force_fallback(false);
    body("openat2");
    td_jobfs_force_fallback(true);
    body("fallback");
    td_jobfs_force_fallback(false);
}

static void beneath_case(const char *tag) {
    char dir[4096], p[4200];
    snprintf(dir, sizeof dir, "%s", fresh(tag));
    snprintf(p, sizeof p, "%s/work", dir);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/work/weights", dir);
    write_text(p, "w", 0600);
    snprintf(p, sizeof p, "%s/secret", test_tmpdir());
    write_text(p, "root's", 0600);
    char link[4200];
    snprintf(link, sizeof link, "%s/work/link", dir);
    cr_assert_eq(symlink(p, link), 0);
    snprintf(link, sizeof link, "%s/work/up", dir);
    cr_assert_eq(symlink(test_tmpdir(), link), 0);
    snprintf(p, sizeof p, "%s/work/fifo", dir);
    cr_assert_eq(mkfifo(p, 0600), 0);

    int root = open(dir, O_PATH | O_DIRECTORY);
    td_err err = {{0}};
    int fd = td_jobfs_openat(NULL, root, "work/weights", O_RDONLY, 0, &err);
    cr_assert(fd >= 0, "%s: %s", tag, err.msg);
    char got[8] = "";
    cr_assert_eq(read(fd, got, sizeof got), 1);
    cr_assert_eq(td_jobfs_check(fd, "weights", false, getuid(), 0, NULL, &err), 0, "%s", err.msg);
    close(fd);
    /* a link at the end, a link on the way, "..", an absolute path */
    cr_assert_eq(td_jobfs_openat(NULL, root, "work/link", O_RDONLY, 0, &err), -1, "%s", tag);
    cr_assert(strstr(err.msg, "link") || strstr(err.msg, "directory"), "%s: %s", tag, err.msg);
    cr_assert_eq(td_jobfs_openat(NULL, root, "work/up/secret", O_RDONLY, 0, &err), -1, "%s", tag);
    cr_assert_eq(td_jobfs_openat(NULL, root, "work/../../secret", O_RDONLY, 0, &err), -1);
    cr_assert_eq(td_jobfs_openat(NULL, root, "/etc/passwd", O_RDONLY, 0, &err), -1);
    cr_assert_eq(td_jobfs_openat(NULL, root, "work//weights", O_RDONLY, 0, &err), -1);
    /* a FIFO: refused at once, never opened (an open of it for reading would block) */
    cr_assert_eq(td_jobfs_openat(NULL, root, "work/fifo", O_RDONLY, 0, &err), -1, "%s", tag);
    cr_assert(strstr(err.msg, "FIFO"), "%s: %s", tag, err.msg);
    /* a directory, and a file made beneath */
    fd = td_jobfs_openat(NULL, root, "work", O_RDONLY | O_DIRECTORY, 0, &err);
    cr_assert(fd >= 0, "%s: %s", tag, err.msg);
    close(fd);
    fd = td_jobfs_openat(NULL, root, "work/new", O_WRONLY | O_CREAT | O_EXCL, 0600, &err);
    cr_assert(fd >= 0, "%s: %s", tag, err.msg);
    close(fd);
    cr_assert_eq(td_jobfs_openat(NULL, root, "work/link", O_WRONLY | O_CREAT, 0600, &err), -1,
                 "creating through a link");
    close(root);
    char buf[32] = "";
    int sfd = open(p, O_RDONLY | O_NONBLOCK);
    close(sfd);
    snprintf(p, sizeof p, "%s/secret", test_tmpdir());
    sfd = open(p, O_RDONLY);
    cr_assert_eq(read(sfd, buf, sizeof buf), 6, "the link's target is untouched");
    close(sfd);
}

Test(jobfs, nothing_beneath_is_reached_through_a_link_or_opened_as_a_fifo) {
    both(beneath_case);
}

static void mkdirs_case(const char *tag) {
    char dir[4096], p[4200];
    snprintf(dir, sizeof dir, "%s/mk-%s", test_tmpdir(), tag);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/elsewhere", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/a", dir);
    mkdir(p, 0755);
    char link[4200];
    snprintf(link, sizeof link, "%s/a/b", dir);
    snprintf(p, sizeof p, "%s/elsewhere", dir);
    cr_assert_eq(symlink(p, link), 0);
    int root = open(dir, O_PATH | O_DIRECTORY);
    td_err err = {{0}};
    int fd = td_jobfs_mkdirs(NULL, root, "a/c/d", 0750, &err);
    cr_assert(fd >= 0, "%s: %s", tag, err.msg);
    close(fd);
    cr_assert_eq(td_jobfs_mkdirs(NULL, root, "a/b/e", 0750, &err), -1, "%s: through a link", tag);
    snprintf(p, sizeof p, "%s/elsewhere/e", dir);
    struct stat st;
    cr_assert_neq(stat(p, &st), 0, "%s: nothing made where the link points", tag);
    close(root);
}

Test(jobfs, directories_are_made_beneath_and_never_through_a_link) {
    both(mkdirs_case);
}

Test(jobfs, a_tree_of_any_depth_is_removed_and_links_in_it_are_not_followed) {
    char dir[4096], p[8192];
    snprintf(dir, sizeof dir, "%s", fresh("rm"));
    snprintf(p, sizeof p, "%s/keep", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/keep/precious", dir);
    write_text(p, "x", 0644);
    snprintf(p, sizeof p, "%s/doomed", dir);
    mkdir(p, 0755);
    int fd = open(p, O_PATH | O_DIRECTORY);
    /* 300 levels, deeper than the remover descends at once */
    for (int i = 0; i < 300; i++) {
        cr_assert_eq(mkdirat(fd, "d", 0755), 0);
        int next = openat(fd, "d", O_PATH | O_DIRECTORY);
        int f = openat(next, "f", O_WRONLY | O_CREAT, 0644);
        close(f);
        close(fd);
        fd = next;
    }
    char target[4200];
    snprintf(target, sizeof target, "%s/keep", dir);
    cr_assert_eq(symlinkat(target, fd, "link"), 0);
    close(fd);
    int root = open(dir, O_RDONLY | O_DIRECTORY);
    td_err err = {{0}};
    cr_assert_eq(td_jobfs_remove(root, "doomed", &err), 0, "%s", err.msg);
    close(root);
    struct stat st;
    snprintf(p, sizeof p, "%s/doomed", dir);
    cr_assert_neq(stat(p, &st), 0, "removed");
    snprintf(p, sizeof p, "%s/keep/precious", dir);
    cr_assert_eq(stat(p, &st), 0, "what a link in it pointed to is untouched");
}

Test(jobfs, paths_are_normalized_without_the_file_system) {
    char out[256];
    cr_assert(td_jobfs_normalize("/s/jobs/3/work", "ck/../step-1//x/./", out, sizeof out));
    cr_assert_str_eq(out, "/s/jobs/3/work/step-1/x");
    cr_assert(td_jobfs_normalize("/w", "/../../etc", out, sizeof out));
    cr_assert_str_eq(out, "/etc");
    cr_assert(td_jobfs_normalize("/w", "..", out, sizeof out));
    cr_assert_str_eq(out, "/");
    const char *rel;
    cr_assert(td_jobfs_below("/s/jobs/3/checkpoints/a", "/s/jobs/3", &rel));
    cr_assert_str_eq(rel, "checkpoints/a");
    cr_assert_not(td_jobfs_below("/s/jobs/30/x", "/s/jobs/3", &rel));
}

/* ---- as the job (root only) ------------------------------------------------------------------ */

static td_identity job(void) {
    return td_identity_of_job(7, JOB_UID, NULL, 0);
}

Test(jobfs, outside_its_directory_a_job_reaches_only_what_it_could_itself) {
    if (geteuid() != 0) cr_skip_test("acting as a job needs root");
    char p[4200], q[8400];
    snprintf(p, sizeof p, "%s", fresh("asjob"));
    chmod(p, 0755);
    snprintf(q, sizeof q, "%s/root-only", p);
    write_text(q, "secret", 0600);
    snprintf(q, sizeof q, "%s/public", p);
    write_text(q, "public", 0644);
    chmod(test_tmpdir(), 0755);
    td_identity who = job();
    td_err err = {{0}};
    snprintf(q, sizeof q, "%s/root-only", p);
    cr_assert_eq(td_jobfs_open_path(&who, "/nowhere", q, O_RDONLY, &err), -1);
    cr_assert(strstr(err.msg, "Permission denied"), "%s", err.msg);
    snprintf(q, sizeof q, "%s/public", p);
    int fd = td_jobfs_open_path(&who, "/nowhere", q, O_RDONLY, &err);
    cr_assert(fd >= 0, "%s", err.msg);
    cr_assert_neq(td_jobfs_check(fd, "public", false, JOB_UID, 0, NULL, &err), 0,
                  "root's file is not the job's");
    cr_assert(strstr(err.msg, "belongs to uid 0"), "%s", err.msg);
    close(fd);
    /* and the thread is itself again: the root-only file opens as the daemon */
    snprintf(q, sizeof q, "%s/root-only", p);
    fd = open(q, O_RDONLY);
    cr_assert(fd >= 0, "%s", strerror(errno));
    close(fd);
}

Test(jobfs, files_made_as_the_job_are_the_jobs) {
    if (geteuid() != 0) cr_skip_test("acting as a job needs root");
    char p[4200];
    snprintf(p, sizeof p, "%s", fresh("made"));
    chmod(test_tmpdir(), 0755);
    cr_assert_eq(chown(p, JOB_UID, JOB_UID), 0);
    chmod(p, 0700);
    td_identity who = job();
    int root = open(p, O_PATH | O_DIRECTORY);
    td_err err = {{0}};
    int d = td_jobfs_mkdirs(&who, root, "step-1", 0700, &err);
    cr_assert(d >= 0, "%s", err.msg);
    int fd = td_jobfs_openat(&who, d, "model", O_WRONLY | O_CREAT | O_EXCL, 0600, &err);
    cr_assert(fd >= 0, "%s", err.msg);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    cr_assert_eq(st.st_uid, JOB_UID);
    close(fd);
    /* reading it as the job works, through the look-first reopen */
    fd = td_jobfs_openat(&who, d, "model", O_RDONLY, 0, &err);
    cr_assert(fd >= 0, "%s", err.msg);
    close(fd);
    close(d);
    close(root);
}
