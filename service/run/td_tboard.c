/* TensorBoard event files (td_tboard.h): Events serialized by libprotobuf-c, framed as TFRecords
 * with CRC32C from Intel ISA-L.
 *
 * A TFRecord, as TensorFlow's record writer lays it out (tensorflow/core/lib/io/record_writer.cc
 * and the format notes in tensorflow/python/lib/io/python_io.py):
 *
 *     uint64 length                       little-endian
 *     uint32 masked CRC32C of length      of those 8 bytes
 *     byte   data[length]                 one serialized Event
 *     uint32 masked CRC32C of data
 *
 * all integers little-endian, with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8, a
 * rotation plus a constant (TensorFlow's crc32c.h, after LevelDB) so that a CRC stored in data
 * that is checksummed again does not make that second CRC degenerate. */
#define _POSIX_C_SOURCE 200809L /* O_CLOEXEC, O_NOFOLLOW, pread, ftruncate, fdatasync */
#include "service/run/td_tboard.h"

#include "base/td_strv.h"
#include "td_tboard.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* the current version, as upstream's event.proto names it; every record after is an Event */
#define FILE_VERSION "brain.Event:2"
#define HEADER       12 /* length and its CRC */
#define FOOTER       4  /* the data's CRC */

struct td_tboard {
    int fd;
    char *path;
    off_t size;         /* where the last whole record ends: the file's size but after a failure */
    bool torn;          /* a failed write may have left part of a record past size */
    unsigned char *buf; /* one framed record, kept for the next */
    size_t cap;
};

/* The standard CRC-32C (Castagnoli, iSCSI) of p[0..n), the one TFRecords use: check value
 * crc32c("123456789") = 0xE3069283. ISA-L's crc32_iscsi only runs the CRC register: it neither
 * presets it to all ones nor inverts the result, as the standard CRC-32C does, so both are done
 * here: init ~0, result ^ ~0. With an init of 0 and no inversion it gives 0x58E3FA20 for the check
 * string, with only one of the two 0x1CF96D7C or 0xA71C05DF: plausible numbers that no reader
 * would accept. */
static uint32_t crc32c(const unsigned char *p, size_t n) {
    /* its length is an int and its buffer not const (it only reads it); callers keep n small */
    return crc32_iscsi((unsigned char *)p, (int)n, 0xFFFFFFFFu) ^ 0xFFFFFFFFu;
}

static uint32_t masked_crc32c(const unsigned char *p, size_t n) {
    uint32_t crc = crc32c(p, n);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_le32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint64_t get_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int write_all(int fd, const unsigned char *p, size_t n) {
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) { /* no progress and no error: do not spin */
            errno = EIO;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int pread_all(int fd, unsigned char *p, size_t n, off_t at) {
    while (n) {
        ssize_t k = pread(fd, p, n, at);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -1;
        if (k == 0) { /* shorter than fstat said: someone else cut it */
            errno = EIO;
            return -1;
        }
        p += k;
        n -= (size_t)k;
        at += k;
    }
    return 0;
}

/* Where the last whole record of a file of `size` bytes ends. Only the headers are read, a pread
 * per record: a torn tail shows as a record that runs past the end, and checking every data CRC
 * would read the whole file at each restart. A bad length CRC is not what a write cut short
 * leaves (that is a record running past the end), so such a file is refused rather than cut off
 * there with all that follows. */
static int whole_records_end(int fd, const char *path, off_t size, off_t *end, td_err *err) {
    off_t at = 0;
    while (size - at >= HEADER) {
        unsigned char h[HEADER];
        if (pread_all(fd, h, sizeof h, at) != 0)
            return td_fail(err, "cannot read %s: %s", path, strerror(errno));
        bool zeros = true;
        for (size_t i = 0; i < sizeof h; i++) zeros &= h[i] == 0;
        /* blocks a crash left allocated but never written read as zeros: a torn end too */
        if (zeros) break;
        if (masked_crc32c(h, 8) != get_le32(h + 8))
            return td_fail(err,
                           "%s is not a TensorBoard event file: bad record length at offset %lld",
                           path, (long long)at);
        uint64_t len = get_le64(h);
        if (size - at - HEADER < FOOTER || len > (uint64_t)(size - at - HEADER - FOOTER)) break;
        at += HEADER + (off_t)len + FOOTER;
    }
    *end = at;
    return 0;
}

/* Frames the packed Event and appends it. On failure the file is cut back to its last whole
 * record, now or at the next call, so that what follows can still be read. */
static int write_event(td_tboard *w, const Tdtb__Event *ev, td_err *err) {
    size_t n = tdtb__event__get_packed_size(ev);
    /* crc32_iscsi takes an int length; an Event of one scalar is tens of bytes */
    if (n > (size_t)INT_MAX - HEADER - FOOTER)
        return td_fail(err, "%s: an event of %zu bytes is too large", w->path, n);
    if (w->cap < HEADER + n + FOOTER) {
        w->cap = HEADER + n + FOOTER;
        w->buf = td_realloc(w->buf, w->cap);
    }
    unsigned char *r = w->buf;
    size_t packed = tdtb__event__pack(ev, r + HEADER);
    TD_ASSERT(packed == n, "protobuf-c packed a different size than it measured");
    put_le64(r, (uint64_t)n);
    put_le32(r + 8, masked_crc32c(r, 8));
    put_le32(r + HEADER + n, masked_crc32c(r + HEADER, n));

    if (w->torn) {
        if (ftruncate(w->fd, w->size) != 0)
            return td_fail(err, "cannot cut the partial record off %s: %s", w->path,
                           strerror(errno));
        w->torn = false;
    }
    if (write_all(w->fd, r, HEADER + n + FOOTER) != 0) {
        int e = errno;
        /* part of the record may be in the file (a full disk, a signal mid-write): readers stop
         * at it, so it goes, and if that fails too, the next write tries again first */
        w->torn = ftruncate(w->fd, w->size) != 0;
        return td_fail(err, "cannot write to %s: %s", w->path, strerror(e));
    }
    w->size += (off_t)(HEADER + n + FOOTER);
    return 0;
}

int td_tboard_open(td_tboard **out, const char *dir, const char *host, double wall_time,
                   td_err *err) {
    *out = NULL;
    if (!host[0] || strchr(host, '/'))
        return td_fail(err, "\"%s\" cannot be the host part of an event file's name", host);
    /* the file is named after the whole seconds; also keeps the cast below defined */
    if (!(wall_time >= 0 && wall_time < 1e11))
        return td_fail(err, "%g is not a time in seconds since the epoch", wall_time);
    if (mkdir(dir, 0750) != 0 && errno != EEXIST)
        return td_fail(err, "cannot create %s: %s", dir, strerror(errno));

    const char *fmt = "%s/events.out.tfevents.%lld.%s";
    long long secs = (long long)wall_time;
    size_t len = (size_t)snprintf(NULL, 0, fmt, dir, secs, host) + 1;
    char *path = td_malloc(len);
    snprintf(path, len, fmt, dir, secs, host);

    /* O_RDWR for reading the headers back; O_NOFOLLOW because a job may write into its
     * directory, and a link planted there must not aim the daemon's appends elsewhere */
    int fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0640);
    if (fd < 0) {
        td_fail(err, "cannot open %s: %s", path, strerror(errno));
        free(path);
        return -1;
    }
    struct stat st;
    off_t end = 0;
    int rc = 0;
    if (fstat(fd, &st) != 0)
        rc = td_fail(err, "cannot stat %s: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = td_fail(err, "%s is not a regular file", path);
    else
        rc = whole_records_end(fd, path, st.st_size, &end, err);
    if (rc == 0 && end < st.st_size && ftruncate(fd, end) != 0)
        rc = td_fail(err, "cannot cut the partial record off the end of %s: %s", path,
                     strerror(errno));
    if (rc != 0) {
        close(fd);
        free(path);
        return -1;
    }

    td_tboard *w = td_calloc(1, sizeof *w);
    w->fd = fd;
    w->path = path;
    w->size = end;
    if (end == 0) {
        /* readers take a file's first record for its version; a reopened file has it already */
        Tdtb__Event ev = TDTB__EVENT__INIT;
        ev.wall_time = wall_time;
        ev.what_case = TDTB__EVENT__WHAT_FILE_VERSION;
        ev.file_version = FILE_VERSION;
        if (write_event(w, &ev, err) != 0) {
            td_tboard_close(w);
            return -1;
        }
    }
    *out = w;
    return 0;
}

int td_tboard_scalar(td_tboard *w, const char *tag, long step, double wall_time, double value,
                     td_err *err) {
    if (!tag[0]) return td_fail(err, "%s: a scalar needs a tag", w->path);
    /* a proto3 string must be UTF-8: readers refuse the whole Event otherwise, so a stray byte
     * becomes '?' and the value is kept */
    char *utf8 = td_str_dup(tag);
    td_str_utf8_repair(utf8);

    Tdtb__Summary__Value v = TDTB__SUMMARY__VALUE__INIT;
    v.tag = utf8;
    v.value_case = TDTB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v.simple_value = (float)value;
    Tdtb__Summary__Value *values[1] = {&v};
    Tdtb__Summary summary = TDTB__SUMMARY__INIT;
    summary.n_value = 1;
    summary.value = values;
    Tdtb__Event ev = TDTB__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.step = (int64_t)step;
    ev.what_case = TDTB__EVENT__WHAT_SUMMARY;
    ev.summary = &summary;

    int rc = write_event(w, &ev, err);
    free(utf8);
    return rc;
}

void td_tboard_close(td_tboard *w) {
    if (!w) return;
    close(w->fd); /* nothing is buffered: every record was written whole or cut off */
    free(w->path);
    free(w->buf);
    free(w);
}

enum { MAX_READ_RECORD = 1 << 20 };

/* Hands each scalar of one packed Event to scalar(). */
static int event_scalars(const unsigned char *data, size_t n, td_tboard_scalar_fn *scalar,
                         void *arg, td_err *err) {
    Tdtb__Event *ev = tdtb__event__unpack(NULL, n, data);
    if (!ev) return td_fail(err, "a record that is not an Event");
    if (ev->what_case == TDTB__EVENT__WHAT_SUMMARY && ev->summary)
        for (size_t i = 0; i < ev->summary->n_value; i++) {
            const Tdtb__Summary__Value *v = ev->summary->value[i];
            if (v->value_case == TDTB__SUMMARY__VALUE__VALUE_SIMPLE_VALUE && v->tag && v->tag[0])
                scalar(arg, v->tag, (long)ev->step, (double)v->simple_value);
        }
    tdtb__event__free_unpacked(ev, NULL);
    return 0;
}

int td_tboard_read_scalars(int fd, long long *offset, long long max_bytes,
                           td_tboard_scalar_fn *scalar, void *arg, td_err *err) {
    struct stat st;
    if (fstat(fd, &st) != 0) return td_fail(err, "fstat: %s", strerror(errno));
    long long end = (long long)st.st_size, at = *offset, budget = max_bytes;
    unsigned char *data = NULL;
    int rc = 0;
    while (rc == 0 && end - at >= HEADER + FOOTER && budget > 0) {
        unsigned char h[HEADER];
        if (pread_all(fd, h, sizeof h, (off_t)at) != 0) {
            rc = td_fail(err, "read: %s", strerror(errno));
            break;
        }
        if (masked_crc32c(h, 8) != get_le32(h + 8)) {
            rc = td_fail(err, "not a TensorBoard event file: bad record length at offset %lld", at);
            break;
        }
        uint64_t len = get_le64(h);
        if (len > (uint64_t)(end - at - HEADER - FOOTER)) break; /* still being written */
        if (len <= MAX_READ_RECORD) {
            unsigned char *p = td_realloc(data, (size_t)len + FOOTER + 1);
            data = p;
            if (pread_all(fd, data, (size_t)len + FOOTER, (off_t)(at + HEADER)) != 0)
                rc = td_fail(err, "read: %s", strerror(errno));
            else if (masked_crc32c(data, (size_t)len) != get_le32(data + len))
                rc = td_fail(err, "a bad record CRC at offset %lld", at);
            else
                rc = event_scalars(data, (size_t)len, scalar, arg, err);
            if (rc != 0) break;
        }
        at += HEADER + (long long)len + FOOTER;
        budget -= HEADER + (long long)len + FOOTER;
    }
    free(data);
    *offset = at;
    return rc;
}
