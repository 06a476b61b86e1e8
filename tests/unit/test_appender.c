/* td_appender (service/run/td_appender.h) over a FIFO whose reader the test controls: a full pipe
 * refuses writes as a full disk does (EAGAIN there, ENOSPC here: the appender treats any failed
 * write alike), and reading it makes room. What waits goes in first and in order, nothing is
 * lost below the limit, and past it one gap is left with a note where it is. */
#define _GNU_SOURCE
#include "service/run/td_appender.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct fifo {
    char path[PATH_MAX];
    int reader;
    size_t capacity;
} fifo;

/* A FIFO read by the test, opened for the appender without blocking. */
static void fifo_open(fifo *f, td_appender *a, size_t wait_max, bool note) {
    char dir[] = "/tmp/test-appender.XXXXXX";
    cr_assert(mkdtemp(dir));
    snprintf(f->path, sizeof f->path, "%s/fifo", dir);
    cr_assert_eq(mkfifo(f->path, 0600), 0);
    f->reader = open(f->path, O_RDONLY | O_NONBLOCK);
    cr_assert(f->reader >= 0);
    td_err err = {{0}};
    cr_assert_eq(td_appender_open(a, f->path, wait_max, note, &err), 0, "%s", err.msg);
    cr_assert_eq(fcntl(a->fd, F_SETFL, O_NONBLOCK | O_APPEND), 0);
    f->capacity = (size_t)fcntl(a->fd, F_GETPIPE_SZ);
}

/* Everything the FIFO holds now. */
static char *fifo_read(fifo *f, size_t *len) {
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while ((k = read(f->reader, buf + n, cap - n)) > 0) {
        n += (size_t)k;
        if (n == cap) buf = realloc(buf, cap *= 2);
    }
    *len = n;
    return buf;
}

static void fifo_close(fifo *f, td_appender *a) {
    td_appender_close(a);
    close(f->reader);
    unlink(f->path);
    *strrchr(f->path, '/') = 0;
    rmdir(f->path);
}

/* Line i of a numbered stream: "line NNNNNN xxx...x\n", 100 bytes. */
static void line(char out[101], int i) {
    char num[16];
    snprintf(num, sizeof num, "%06u", (unsigned)i % 1000000u);
    memset(out, 'x', 99);
    memcpy(out, "line ", 5);
    memcpy(out + 5, num, 6);
    out[11] = ' ';
    out[99] = '\n';
    out[100] = 0;
}

Test(appender, what_a_full_file_refuses_waits_and_goes_in_in_order) {
    fifo f;
    td_appender a;
    fifo_open(&f, &a, 1 << 20, true);
    /* more than the pipe takes: the rest waits */
    int lines = (int)(f.capacity / 100) * 2;
    char l[101];
    bool nothing_waits = true;
    for (int i = 0; i < lines; i++) {
        line(l, i);
        nothing_waits = td_appender_write(&a, l, 100);
    }
    cr_expect(!nothing_waits, "the pipe (%zu bytes) cannot take %d lines", f.capacity, lines);
    cr_expect(td_appender_pending(&a));
    cr_expect_eq(a.size + (long long)a.wait.len, (long long)lines * 100,
                 "what went in (%lld) and what waits (%zu) are all of it", a.size, a.wait.len);
    /* room, a little at a time, until everything is in */
    size_t total = 0, got_len;
    char *all = malloc((size_t)lines * 100 + 1);
    for (int round = 0; round < 100 && (round == 0 || td_appender_pending(&a)); round++) {
        char *got = fifo_read(&f, &got_len);
        memcpy(all + total, got, got_len);
        total += got_len;
        free(got);
        td_appender_flush(&a);
    }
    char *rest = fifo_read(&f, &got_len);
    memcpy(all + total, rest, got_len);
    total += got_len;
    free(rest);
    cr_assert_eq(total, (size_t)lines * 100, "every byte once");
    for (int i = 0; i < lines; i++) {
        line(l, i);
        cr_assert(memcmp(all + (size_t)i * 100, l, 100) == 0, "line %d in its place", i);
    }
    cr_expect_eq(a.dropped_total, 0);
    cr_expect(!td_appender_pending(&a));
    free(all);
    fifo_close(&f, &a);
}

Test(appender, past_the_limit_one_gap_with_a_note_where_it_is) {
    fifo f;
    td_appender a;
    size_t wait_max = 4096;
    fifo_open(&f, &a, wait_max, true);
    char l[101];
    int i = 0;
    while (!td_appender_pending(&a)) { /* fill the pipe */
        line(l, i++);
        td_appender_write(&a, l, 100);
    }
    int first_waiting = i - 1; /* partly in, partly waiting */
    while (a.dropped_total == 0) {
        line(l, i++);
        td_appender_write(&a, l, 100);
    }
    int first_dropped = i - 1;
    /* a shorter one that would fit is dropped too: the gap stays one */
    cr_assert_leq(a.wait.len + 50, wait_max, "50 bytes would fit");
    char shorter[50];
    memset(shorter, 's', 49);
    shorter[49] = '\n';
    td_appender_write(&a, shorter, 50);
    cr_expect_eq(a.dropped_total, 150, "both dropped (%lld)", a.dropped_total);
    size_t n;
    char *before = fifo_read(&f, &n); /* room */
    free(before);
    td_appender_flush(&a);
    cr_expect(!td_appender_pending(&a));
    char *after = fifo_read(&f, &n);
    after = realloc(after, n + 1);
    after[n] = 0;
    /* what waited (the end of line first_waiting up to line first_dropped - 1), then the note */
    line(l, first_dropped - 1);
    char *last_kept = strstr(after, l);
    cr_assert(last_kept, "line %d (the last that waited) is in", first_dropped - 1);
    const char *note = last_kept + 100;
    cr_expect(strncmp(note, "\n[traind-shepherd: 150 bytes of this output were dropped here", 61) ==
                  0,
              "the note follows the last line kept: %.120s", note);
    line(l, first_dropped);
    cr_expect(!strstr(after, l), "the first dropped line is not there");
    cr_expect(!strstr(after, "sssss"), "nor the one after it");
    cr_expect(first_waiting < first_dropped);
    /* and writing goes on after the gap */
    line(l, i);
    cr_expect(td_appender_write(&a, l, 100));
    free(after);
    after = fifo_read(&f, &n);
    cr_expect(n == 100 && memcmp(after, l, 100) == 0);
    free(after);
    fifo_close(&f, &a);
}

Test(appender, data_files_get_no_note) {
    fifo f;
    td_appender a;
    fifo_open(&f, &a, 4096, false);
    char l[101];
    int i = 0;
    while (a.dropped_total == 0) {
        line(l, i++);
        td_appender_write(&a, l, 100);
    }
    size_t n;
    free(fifo_read(&f, &n));
    td_appender_flush(&a);
    char *after = fifo_read(&f, &n);
    after = realloc(after, n + 1);
    after[n] = 0;
    cr_expect(!strstr(after, "traind-shepherd"), "no note in rank 0's output file");
    cr_expect_eq(a.dropped, 0, "the drop was said and counted once");
    free(after);
    fifo_close(&f, &a);
}
