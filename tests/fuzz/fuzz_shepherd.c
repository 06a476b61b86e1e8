/* Feeds: what a restarted daemon reads back about an attempt that a traind-shepherd runs
 * (service/run/td_shepherd.c): the attempt file BASE.json (its token, boot id and the daemon's own
 * notes), the status file BASE.status, and the shepherd's lines on its socket ("pid", "out",
 * "failed", "over"). The input is the three, in that order, separated by "\n--status--\n" and
 * "\n--lines--\n". Why: a daemon that comes back after a crash, a kill -9 or a reboot finds these
 * as they were left, possibly cut short mid-write, and must refuse or read them without crashing.
 * BASE lies in the scratch directory; no shepherd runs, so attaching finds no socket. */
#include "fuzz_util.h"

#include "service/run/td_shepherd.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static char base[PATH_MAX - 64];

static void put(const char *suffix, const uint8_t *data, size_t n) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.%s", base, suffix);
    fuzz_write_file(path, data, n);
}

/* The shepherd's side of the connection sends bytes; the daemon's side reads them as it does. */
static void read_lines(const uint8_t *data, size_t n) {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) abort();
    td_shepherd s = {.fd = pair[0]};
    fcntl(pair[0], F_SETFL, O_NONBLOCK);
    /* in pieces, read between them, so that no write blocks on a full socket buffer */
    for (size_t done = 0; done < n;) {
        size_t k = n - done < 4096 ? n - done : 4096;
        if (write(pair[1], data + done, k) != (ssize_t)k) abort();
        done += k;
        td_shepherd_read(&s);
        FUZZ_CHECK(s.in_len < sizeof s.in, "%zu bytes kept of a partial line", s.in_len);
    }
    close(pair[1]);
    td_shepherd_read(&s);
    FUZZ_CHECK(s.fd == -1, "the connection's end was not seen");
    FUZZ_CHECK(s.out_size >= 0 && s.live >= 0, "out %lld live %d", s.out_size, s.live);
    /* the daemon signals -pgid: 0 or 1 there would be its own group or every process it may
     * signal */
    FUZZ_CHECK(s.pgid == 0 || s.pgid > 1, "process group %d", (int)s.pgid);
    FUZZ_CHECK(!s.failed || memchr(s.failed_reason, 0, sizeof s.failed_reason),
               "unterminated failure reason");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!base[0]) td_shepherd_base(base, sizeof base, fuzz_dir(), 1, 0);
    const uint8_t *spec, *rest, *status, *lines;
    size_t n_spec, n_rest, n_status, n_lines;
    fuzz_split(data, size, "\n--status--\n", &spec, &n_spec, &rest, &n_rest);
    fuzz_split(rest, n_rest, "\n--lines--\n", &status, &n_status, &lines, &n_lines);
    put("json", spec, n_spec);
    put("status", status, n_status);

    json_t *notes = td_shepherd_notes(base);
    json_decref(notes);
    (void)td_shepherd_other_boot(base);
    td_shepherd sh;
    td_err err = {{0}};
    int rc = td_shepherd_attach(&sh, base, &err);
    FUZZ_CHECK(rc == 1 || (rc == -1 && err.msg[0]), "attached to no shepherd: %d", rc);
    td_shepherd_end end;
    err.msg[0] = 0;
    rc = td_shepherd_end_read(base, &end, &err);
    FUZZ_CHECK(rc == 1 || (rc == -1 && err.msg[0]), "the status file: %d", rc);
    if (rc == 1)
        FUZZ_CHECK(memchr(end.reason, 0, sizeof end.reason) &&
                       memchr(end.stopped_by, 0, sizeof end.stopped_by) &&
                       memchr(end.stop_reason, 0, sizeof end.stop_reason) &&
                       memchr(end.grace_note, 0, sizeof end.grace_note),
                   "unterminated text");
    read_lines(lines, n_lines);
    return 0;
}
