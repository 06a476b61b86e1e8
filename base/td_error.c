#include "base/td_error.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int td_fail(td_err *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int td_fail_prefix(td_err *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[TD_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    char old[TD_ERR_MAX];
    memcpy(old, err->msg, sizeof old);
    /* assembled by hand: the combined text may be cut at TD_ERR_MAX, which is fine */
    size_t used = 0, cap = sizeof err->msg - 1;
    const char *parts[3] = {prefix, ": ", old};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(parts[i]);
        if (n > cap - used) n = cap - used;
        memcpy(err->msg + used, parts[i], n);
        used += n;
    }
    err->msg[used] = '\0';
    return -1;
}

void td_die(const char *file, int line, const char *what, const char *hint) {
    fprintf(stderr, "[traind] fatal error at %s:%d: %s\n", file, line, what);
    if (hint) fprintf(stderr, "[traind] HINT: %s\n", hint);
    abort();
}

void *td_malloc_checked(size_t size, const char *file, int line) {
    void *p = malloc(size ? size : 1);
    if (!p) td_die(file, line, "out of memory", "reduce train.batch_size or the model size");
    return p;
}

void *td_calloc_checked(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) td_die(file, line, "out of memory", "reduce train.batch_size or the model size");
    return p;
}

void *td_realloc_checked(void *p, size_t size, const char *file, int line) {
    void *q = realloc(p, size ? size : 1);
    if (!q) td_die(file, line, "out of memory", "reduce train.batch_size or the model size");
    return q;
}

char *td_strdup_checked(const char *s, const char *file, int line) {
    size_t n = strlen(s) + 1;
    return memcpy(td_malloc_checked(n, file, line), s, n);
}

/* A block of 2 MiB or more (a model's parameters, gradients, optimizer state, activations) is
 * aligned to 2 MiB and asked for transparent huge pages: the kernel then maps it 2 MiB at a time,
 * 512 times fewer page faults than 4 KiB pages (GPT-2 124M's 6 GB took 35 s to fault in on a VM
 * where each fault is a trap to the hypervisor; with huge pages, a few), and fewer TLB misses in
 * the GEMMs. Where THP is off (never), madvise fails and the block is ordinary memory. */
enum { HUGE_PAGE = 2 << 20 };

void *td_aligned_alloc_checked(size_t size, const char *file, int line) {
    bool huge = size >= HUGE_PAGE;
    size_t align = huge ? HUGE_PAGE : 64;
    size_t rounded = size ? (size + align - 1) / align * align : 64;
    void *p = aligned_alloc(align, rounded);
    if (!p) td_die(file, line, "out of memory", "reduce train.batch_size or the model size");
    if (huge) (void)madvise(p, rounded, MADV_HUGEPAGE); /* a hint: its failure changes nothing */
    memset(p, 0, rounded);
    return p;
}
