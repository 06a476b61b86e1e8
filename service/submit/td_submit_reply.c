/* A refusal as the API sends it (td_reply_error: status, code, the JSON path of the field, the
 * message), and the JSON kit's errors turned into one: the bottom of the submit module, which
 * the parser of each kind of job (td_submit.c, td_submit_command.c) builds on. */
#include "service/submit/td_submit_private.h"

#include "base/td_json.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int td_reply_fail(td_reply_error *e, int status, const char *code, const char *field,
                  const char *fmt, ...) {
    e->status = status;
    e->code = code;
    e->retry_after_s = 0;
    snprintf(e->field, sizeof e->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

/* The field name at the head of a spec error ("train.batch_size: expected ..."), if any. */
static void field_of(const char *msg, char *field, size_t len) {
    size_t n = strcspn(msg, ": ");
    field[0] = 0;
    if (n == 0 || msg[n] != ':' || n >= len) return;
    for (size_t i = 0; i < n; i++)
        if (!(msg[i] == '.' || msg[i] == '_' || msg[i] == '[' || msg[i] == ']' ||
              (msg[i] >= '0' && msg[i] <= '9') || (msg[i] >= 'a' && msg[i] <= 'z') ||
              (msg[i] >= 'A' && msg[i] <= 'Z')))
            return;
    memcpy(field, msg, n);
    field[n] = 0;
}

/* A kit error (td_json.h) as a 400 whose field is the JSON path its message begins with. */
int td_submit_spec_error(td_reply_error *e, const td_err *err) {
    char field[256];
    field_of(err->msg, field, sizeof field);
    return td_reply_fail(e, 400, "invalid_spec", field, "%s", err->msg);
}

int td_submit_keys_in(json_t *obj, const char *path, const char *const *const *lists,
                      const char *note, td_reply_error *e) {
    td_err err = {{0}};
    return td_json_check_keys_in(obj, path, lists, note, &err) != 0 ? td_submit_spec_error(e, &err)
                                                                    : 0;
}
