/* Reading JSON input with errors that say where: every accessor takes the JSON path of the object
 * it reads from, so a failure reads "train.optimizer.lr: expected a number in [0, 1e+06], found
 * \"fast\"" or "listen: expected a string, found 8470". The job spec, the daemon's submit check
 * and its config file all read their JSON through these, so their messages have one shape and the
 * daemon can tell the field at fault from a message's first word (its JSON path). */
#ifndef TD_JSON_H
#define TD_JSON_H

#include "base/td_error.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define TD_JSON_PATH_MAX 1024

/* A short rendering of a JSON value for messages (at most 60 characters). */
void td_json_describe(const json_t *v, char *buf, size_t len);
/* "path: expected <expected>, found <v>"; returns -1. */
int td_json_fail_found(td_err *err, const char *path, const char *expected, const json_t *v);
/* path + "." + key (just key at the top level, where path is ""). */
void td_json_path(char *out, size_t len, const char *path, const char *key);
/* Every key of obj must be in allowed (NULL-terminated): "path.key: unknown key; expected one of:
 * a, b, c". */
int td_json_check_keys(const json_t *obj, const char *path, const char *const *allowed,
                       td_err *err);
/* The same against several lists (NULL-ended), all named in the message, then `note` (or NULL). */
int td_json_check_keys_in(const json_t *obj, const char *path, const char *const *const *lists,
                          const char *note, td_err *err);

/* Member `key` of obj (at `path`): absent is an error when required, else the default (*out NULL
 * for an object); present must have the type and lie in [min, max]. */
int td_json_object(const json_t *obj, const char *path, const char *key, bool required,
                   json_t **out, td_err *err);
int td_json_number(const json_t *obj, const char *path, const char *key, bool required, double def,
                   double min, double max, double *out, td_err *err);
int td_json_int(const json_t *obj, const char *path, const char *key, bool required, long def,
                long min, long max, long *out, td_err *err);
int td_json_bool(const json_t *obj, const char *path, const char *key, bool def, bool *out,
                 td_err *err);
/* A string that fits len (with its NUL). */
int td_json_string(const json_t *obj, const char *path, const char *key, bool required,
                   const char *def, char *out, size_t len, td_err *err);
/* A string that must be one of "a|b|c"; *out is its index. */
int td_json_choice(const json_t *obj, const char *path, const char *key, bool required,
                   const char *def, const char *choices, int *out, td_err *err);

#endif
