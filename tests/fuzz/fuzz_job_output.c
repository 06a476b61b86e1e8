/* Feeds: what a job writes that traind reads back, every byte the job's choice: a TensorBoard
 * event file its SummaryWriter grows (td_tboard_read_scalars, read in pieces as a growing file
 * is), the error file PyTorch's @record leaves for a failed rank (td_rank_error_read, then
 * torchrun's summary made from it), and its text lines against metric patterns
 * (td_metric_patterns_match). The first byte chooses which. Why: the shepherd runs them as root
 * on a hostile job's files and output; a crash there loses the job's status, a hang stalls its
 * supervision. */
#include "fuzz_util.h"

#include "service/run/td_launch.h"
#include "service/run/td_metric_patterns.h"
#include "service/run/td_tboard.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void count(void *arg, const char *tag, long step, double value) {
    (void)step, (void)value;
    FUZZ_CHECK(tag && tag[0], "an empty tag was handed out");
    ++*(long *)arg;
}

static void event_file(fuzz_file *f, const uint8_t *data, size_t n) {
    long long offset = 0, last = -1;
    long scalars = 0;
    td_err err = {{0}};
    /* as a file that grows: each call sees a longer prefix */
    for (size_t shown = n < 64 ? n : 64;; shown = shown * 2 < n ? shown * 2 : n) {
        fuzz_file_set(f, data, shown);
        if (td_tboard_read_scalars(f->fd, &offset, 1 << 20, count, &scalars, &err) != 0) break;
        FUZZ_CHECK(offset >= last && offset <= (long long)shown, "offset %lld of %zu", offset,
                   shown);
        last = offset;
        if (shown == n) break;
    }
}

static void error_file(fuzz_file *f, const uint8_t *data, size_t n) {
    fuzz_file_set(f, data, n);
    if (lseek(f->fd, 0, SEEK_SET) != 0) abort(); /* read from the start, as a file just opened */
    td_rank_error e;
    td_err err = {{0}};
    if (td_rank_error_read(f->fd, &e, &err) != 0) return;
    td_group g = {.failed_rank = 1, .failed_local = 1, .first_failure = 1, .failed_pid = 42};
    char *text = td_launch_root_cause("script.py", &g, "/x/error.json", &e);
    json_t *s = json_string(text);
    FUZZ_CHECK(s != NULL, "a summary that is not UTF-8");
    json_decref(s);
    free(text);
    td_rank_error_free(&e);
}

static td_metric_patterns *patterns(void) {
    static td_metric_patterns *p;
    if (p) return p;
    json_t *list = json_pack("[s, {s:s, s:s}, s]", "Epoch (?<epoch>\\d+) .* loss (?<loss>\\S+)",
                             "regex", "^val (?<step>\\d+) (?<val_acc>[0-9.e+-]+)", "event", "eval",
                             "^(?<slow>(a|aa)+)$");
    int bad;
    td_err err = {{0}};
    p = td_metric_patterns_new(list, &bad, &err);
    json_decref(list);
    FUZZ_CHECK(p != NULL, "the harness's patterns: %s", err.msg);
    return p;
}

static void text_lines(const uint8_t *data, size_t n) {
    const char *p = (const char *)data, *end = p + n;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        char *line = td_metric_patterns_match(patterns(), p, len);
        if (line) {
            json_error_t je;
            json_t *o = json_loads(line, 0, &je);
            FUZZ_CHECK(o && json_is_object(o), "not a JSON object: %s", line);
            json_decref(o);
            free(line);
        }
        p += len + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static fuzz_file f;
    if (!f.path[0]) fuzz_file_open(&f, "job-output");
    if (size < 1) return 0;
    switch (data[0] % 3) {
    case 0:
        event_file(&f, data + 1, size - 1);
        break;
    case 1:
        error_file(&f, data + 1, size - 1);
        break;
    default:
        text_lines(data + 1, size - 1);
        break;
    }
    return 0;
}
