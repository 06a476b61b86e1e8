/* What the harnesses share (not a harness itself): the fuzzer's entry point, a scratch directory
 * private to the process, and in-memory files for the loaders that only take a path.
 *
 * The scratch directory is made once per process under $TMPDIR (else /dev/shm, else /tmp) and
 * removed at exit; nothing a harness writes lands anywhere else. In-memory files are memfds, opened
 * by the loaders through /proc/self/fd/N: no disk, and a crash leaves nothing behind. */
#ifndef FUZZ_UTIL_H
#define FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* libFuzzer calls this with each input; 0 always (-1 would keep it out of the corpus). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Ends the run as a crash the fuzzer records, saying what invariant broke: a parser that
 * accepted what it promises to refuse is a finding even without a sanitizer report. */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                            \
    } while (0)
__attribute__((noreturn, format(printf, 4, 5))) void
fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...);

/* Whether $FUZZ_DEBUG is set: harnesses then say why each input was refused, to check what a
 * seed reaches (./fuzz_submit corpus/submit/seed-idx with FUZZ_DEBUG=1). */
bool fuzz_debug(void);

/* The process's scratch directory (made on first use). */
const char *fuzz_dir(void);
/* path = fuzz_dir()/name */
void fuzz_path(char *path, size_t len, const char *name);
/* Writes n bytes to path (created or truncated); the run ends if it cannot. */
void fuzz_write_file(const char *path, const void *data, size_t n);

/* An in-memory file whose contents each input replaces. */
typedef struct fuzz_file {
    int fd;
    char path[48]; /* "/proc/self/fd/N": what the loader opens */
} fuzz_file;
void fuzz_file_open(fuzz_file *f, const char *name);
void fuzz_file_set(fuzz_file *f, const void *data, size_t n);

/* A NUL-terminated copy of the input (free it). */
char *fuzz_text(const uint8_t *data, size_t size);

/* Splits the input at the first `sep` (not included in either part): *a is what comes before,
 * *b what follows; without one, all of it is *a and *b is empty. Lets one input carry two files
 * (images and labels) in a form the fuzzer's mutations keep. */
void fuzz_split(const uint8_t *data, size_t size, const char *sep, const uint8_t **a, size_t *na,
                const uint8_t **b, size_t *nb);

#endif
