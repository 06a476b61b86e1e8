/* Error reporting for the traind engine.
 *
 * Recoverable errors (bad spec, bad data, missing file) travel back to the caller in a td_err that
 * the caller owns: the library keeps no global error state, so two models in one process never
 * clobber each other's message. Programming errors and out-of-memory stop the process at once with
 * file:line and a hint, the way llm.c's check macros do: there is nothing sensible to continue
 * with.
 */
#ifndef TD_ERROR_H
#define TD_ERROR_H

#include <stddef.h>

#define TD_ERR_MAX 1024

typedef struct td_err {
    char msg[TD_ERR_MAX];
} td_err;

/* Formats the message into err (if err is not NULL) and returns -1, so that callers can write
 * `return td_fail(err, "...")`. */
int td_fail(td_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepends "prefix: " to an error already set, to add context as it travels up. */
int td_fail_prefix(td_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

__attribute__((noreturn)) void td_die(const char *file, int line, const char *what,
                                      const char *hint);

/* Allocation that cannot fail quietly: training without its buffers is not an option. One policy
 * everywhere, engine and daemon alike: out of memory ends the process at once with file:line
 * (td_die), through these or, for what a library allocated (jansson, libarchive), through
 * TD_CHECK_ALLOC. Nothing calls malloc, realloc or strdup unchecked, or abort() by itself. */
void *td_malloc_checked(size_t size, const char *file, int line);
void *td_calloc_checked(size_t n, size_t size, const char *file, int line);
void *td_realloc_checked(void *p, size_t size, const char *file, int line);
char *td_strdup_checked(const char *s, const char *file, int line);
void *td_aligned_alloc_checked(size_t size, const char *file, int line);

#define td_malloc(size)     td_malloc_checked((size), __FILE__, __LINE__)
#define td_calloc(n, size)  td_calloc_checked((n), (size), __FILE__, __LINE__)
#define td_realloc(p, size) td_realloc_checked((p), (size), __FILE__, __LINE__)
#define td_strdup(s)        td_strdup_checked((s), __FILE__, __LINE__)
#define TD_CHECK_ALLOC(p, what)                                                                    \
    do {                                                                                           \
        if (!(p)) td_die(__FILE__, __LINE__, "out of memory " what, NULL);                         \
    } while (0)
/* 64-byte aligned, zeroed: one cache line, and what AVX-512 loads like best. */
#define td_aligned_alloc(size) td_aligned_alloc_checked((size), __FILE__, __LINE__)

#define TD_ASSERT(cond, hint)                                                                      \
    do {                                                                                           \
        if (!(cond)) td_die(__FILE__, __LINE__, "assertion failed: " #cond, (hint));               \
    } while (0)

#endif
