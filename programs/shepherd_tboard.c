/* A job's SummaryWriter files, read as they grow (shepherd_tboard.h). */
#define _GNU_SOURCE /* O_PATH, fdopendir */
#include "programs/shepherd_tboard.h"

#include "service/run/td_jobfs.h"
#include "base/td_strv.h"
#include "service/run/td_tboard.h"

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Bounds on what a job's files cost the shepherd each poll: files watched, directory depth and
 * entries looked at, bytes read (all files together), steps kept, tags a step and a tag's
 * length. */
enum {
    MAX_FILES = 256,
    MAX_DEPTH = 4,
    MAX_ENTRIES = 4096,
    READ_PER_POLL = 4 << 20,
    RECENT_STEPS = 64,
    MAX_TAGS = 256,
    MAX_TAG_LEN = 128
};

typedef struct watched {
    char *rel; /* below the working directory */
    dev_t dev; /* the file itself: a hard link to one already read is not read twice */
    ino_t ino;
    long long offset;
    bool refused; /* not an event file (or a second name of one): not read again */
} watched;

/* The scalars of one step so far: the daemon keeps one train line a step (a later one replaces
 * it), and SummaryWriter writes one Event per scalar, so a step's line holds all of them. */
typedef struct step_line {
    long step;
    json_t *fields;
    bool dirty; /* gained a scalar since it was last written */
} step_line;

struct shepherd_tboard {
    const td_identity *who;
    uid_t owner;
    int cwd_fd;
    char dir[256];
    watched files[MAX_FILES];
    int n;
    bool warned_full;
    step_line recent[RECENT_STEPS]; /* the latest steps seen, by step */
    int n_recent;
    td_appender *out; /* during a poll */
    long long budget; /* bytes this poll may still read, all files together */
    int entries;      /* directory entries this poll has looked at */
    bool warned_tags;
};

static watched *find(shepherd_tboard *t, const char *rel) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->files[i].rel, rel) == 0) return &t->files[i];
    return NULL;
}

static void write_line(shepherd_tboard *t, step_line *l) {
    json_t *o = json_pack("{s:s, s:I}", "event", "train", "step", (json_int_t)l->step);
    if (!o) return;
    json_object_update(o, l->fields);
    char *text = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    l->dirty = false;
    if (!text) return;
    td_appender_write(t->out, text, strlen(text));
    td_appender_write(t->out, "\n", 1);
    free(text);
}

/* A scalar into its step's line (the oldest step making room, written first if it must be). */
static void add_scalar(void *arg, const char *tag, long step, double value) {
    shepherd_tboard *t = arg;
    if (!isfinite(value) || strlen(tag) > MAX_TAG_LEN) return;         /* JSON has no NaN */
    if (strcmp(tag, "event") == 0 || strcmp(tag, "step") == 0) return; /* the line's own */
    int i = 0;
    while (i < t->n_recent && t->recent[i].step != step) i++;
    if (i == t->n_recent) {
        if (t->n_recent == RECENT_STEPS) {
            int oldest = 0;
            for (int k = 1; k < t->n_recent; k++)
                if (t->recent[k].step < t->recent[oldest].step) oldest = k;
            if (t->recent[oldest].dirty) write_line(t, &t->recent[oldest]);
            json_decref(t->recent[oldest].fields);
            t->recent[oldest] = t->recent[--t->n_recent];
        }
        i = t->n_recent++;
        t->recent[i] = (step_line){.step = step, .fields = json_object()};
    }
    json_t *fields = t->recent[i].fields;
    if (json_object_size(fields) >= MAX_TAGS && !json_object_get(fields, tag)) {
        if (!t->warned_tags)
            fprintf(stderr,
                    "traind-shepherd: more than %d tags at one step below %s: the "
                    "others are not read\n",
                    MAX_TAGS, t->dir);
        t->warned_tags = true;
        return;
    }
    /* (a tag that is not UTF-8 is refused as a key: nothing to write) */
    if (json_object_set_new(fields, tag, json_real(value)) == 0) t->recent[i].dirty = true;
}

/* The steps that gained scalars, in step order. */
static void write_dirty(shepherd_tboard *t) {
    for (;;) {
        step_line *first = NULL;
        for (int i = 0; i < t->n_recent; i++)
            if (t->recent[i].dirty && (!first || t->recent[i].step < first->step))
                first = &t->recent[i];
        if (!first) return;
        write_line(t, first);
    }
}

/* One event file: from where it was left (or its end, at the first sight with baseline). */
static void read_file(shepherd_tboard *t, int dirfd, const char *name, const char *rel,
                      bool baseline) {
    watched *w = find(t, rel);
    if (w && w->refused) return;
    if (!w) {
        if (t->n == MAX_FILES) {
            if (!t->warned_full)
                fprintf(stderr,
                        "traind-shepherd: more than %d event files below %s: the "
                        "others are not read\n",
                        MAX_FILES, t->dir);
            t->warned_full = true;
            return;
        }
        w = &t->files[t->n++];
        *w = (watched){.rel = td_str_dup(rel)};
    }
    td_err err = {{0}};
    int fd = td_jobfs_openat(t->who, dirfd, name, O_RDONLY, 0, &err);
    struct stat st;
    if (fd < 0 || td_jobfs_check(fd, rel, false, t->owner, 0, &st, &err) != 0) {
        if (fd >= 0) close(fd);
        return; /* gone, or not a file of the job's: nothing to read */
    }
    if (w->ino == 0) { /* first seen: a second name of a file already watched is not read */
        w->dev = st.st_dev, w->ino = st.st_ino;
        for (int k = 0; k < t->n; k++)
            if (&t->files[k] != w && t->files[k].ino == st.st_ino && t->files[k].dev == st.st_dev)
                w->refused = true;
    }
    long long before = w->offset;
    if (w->refused) {
        /* (a link to one already read) */
    } else if (baseline) {
        w->offset = (long long)st.st_size;
    } else if (t->budget > 0 &&
               td_tboard_read_scalars(fd, &w->offset, t->budget, add_scalar, t, &err) != 0) {
        fprintf(stderr, "traind-shepherd: %s: %s; not read further\n", rel, err.msg);
        w->refused = true;
    }
    if (!baseline && w->offset > before) t->budget -= w->offset - before;
    close(fd);
}

static void walk(shepherd_tboard *t, int dirfd, const char *rel, int depth, bool baseline) {
    int copy = dup(dirfd);
    DIR *d = copy >= 0 ? fdopendir(copy) : NULL;
    if (!d) {
        if (copy >= 0) close(copy);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) && t->entries++ < MAX_ENTRIES) {
        if (e->d_name[0] == '.') continue;
        char child[4096];
        snprintf(child, sizeof child, "%s/%s", rel, e->d_name);
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0) {
            read_file(t, dirfd, e->d_name, child, baseline);
        } else if (depth < MAX_DEPTH && (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN)) {
            td_err err = {{0}};
            int sub = td_jobfs_openat(t->who, dirfd, e->d_name, O_RDONLY | O_DIRECTORY, 0, &err);
            if (sub < 0) continue;
            walk(t, sub, child, depth + 1, baseline);
            close(sub);
        }
    }
    closedir(d);
}

static void scan(shepherd_tboard *t, bool baseline) {
    td_err err = {{0}};
    int fd = td_jobfs_openat(t->who, t->cwd_fd, t->dir, O_RDONLY | O_DIRECTORY, 0, &err);
    if (fd < 0) return; /* not made yet */
    walk(t, fd, t->dir, 1, baseline);
    close(fd);
}

shepherd_tboard *shepherd_tboard_new(const td_launch_config *c, const char *dir) {
    if (!dir[0] || !c->cwd) return NULL;
    /* the directory the workers start in: as they entered it */
    int cwd_fd = c->cwd_fd ? fcntl(*c->cwd_fd, F_DUPFD_CLOEXEC, 3)
                           : open(c->cwd, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (cwd_fd < 0) return NULL;
    shepherd_tboard *t = td_calloc(1, sizeof *t);
    t->who = c->user && c->user->drop ? c->user : NULL;
    t->owner = t->who ? t->who->uid : TD_JOBFS_ANY_OWNER;
    t->cwd_fd = cwd_fd;
    snprintf(t->dir, sizeof t->dir, "%s", dir);
    t->entries = 0;
    scan(t, true);
    return t;
}

void shepherd_tboard_poll(shepherd_tboard *t, td_appender *out) {
    if (!t) return;
    t->out = out;
    t->budget = READ_PER_POLL;
    t->entries = 0;
    scan(t, false);
    write_dirty(t);
}

void shepherd_tboard_free(shepherd_tboard *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) free(t->files[i].rel);
    for (int i = 0; i < t->n_recent; i++) json_decref(t->recent[i].fields);
    close(t->cwd_fd);
    free(t);
}
