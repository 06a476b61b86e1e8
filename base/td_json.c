/* The JSON accessor kit (td_json.h). */
#include "base/td_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A short rendering of a JSON value for messages. */
void td_json_describe(const json_t *v, char *buf, size_t len) {
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!text) {
        snprintf(buf, len, "(unprintable)");
        return;
    }
    if (strlen(text) > 60)
        snprintf(buf, len, "%.57s...", text);
    else
        snprintf(buf, len, "%s", text);
    free(text);
}

int td_json_fail_found(td_err *err, const char *path, const char *expected, const json_t *v) {
    char found[80];
    td_json_describe(v, found, sizeof found);
    return td_fail(err, "%s: expected %s, found %s", path, expected, found);
}

void td_json_path(char *out, size_t len, const char *path, const char *key) {
    snprintf(out, len, "%s%s%s", path, *path ? "." : "", key);
}

/* Every key of obj must be in allowed (NULL-terminated). */
static bool key_in(const char *key, const char *const *const *lists) {
    for (int l = 0; lists[l]; l++)
        for (int i = 0; lists[l][i]; i++)
            if (strcmp(key, lists[l][i]) == 0) return true;
    return false;
}

int td_json_check_keys_in(const json_t *obj, const char *path, const char *const *const *lists,
                          const char *note, td_err *err) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        if (key_in(key, lists)) continue;
        char list[768] = "", where[TD_JSON_PATH_MAX];
        for (int l = 0; lists[l]; l++)
            for (int i = 0; lists[l][i]; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                         list[0] ? ", " : "", lists[l][i]);
        td_json_path(where, sizeof where, path, key);
        return td_fail(err, "%s: unknown key; expected one of: %s%s", where, list,
                       note ? note : "");
    }
    return 0;
}

int td_json_check_keys(const json_t *obj, const char *path, const char *const *allowed,
                       td_err *err) {
    const char *const *lists[] = {allowed, NULL};
    return td_json_check_keys_in(obj, path, lists, NULL, err);
}

int td_json_object(const json_t *obj, const char *path, const char *key, bool required,
                   json_t **out, td_err *err) {
    char where[TD_JSON_PATH_MAX];
    td_json_path(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v) return required ? td_fail(err, "%s: missing; expected an object", where) : 0;
    if (!json_is_object(v)) return td_json_fail_found(err, where, "an object", v);
    *out = v;
    return 0;
}

int td_json_number(const json_t *obj, const char *path, const char *key, bool required, double def,
                   double min, double max, double *out, td_err *err) {
    char where[TD_JSON_PATH_MAX];
    td_json_path(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required) return td_fail(err, "%s: missing; expected a number", where);
        *out = def;
        return 0;
    }
    if (!json_is_number(v)) return td_json_fail_found(err, where, "a number", v);
    double d = json_number_value(v);
    if (!(d >= min && d <= max)) {
        char expected[128];
        snprintf(expected, sizeof expected, "a number in [%g, %g]", min, max);
        return td_json_fail_found(err, where, expected, v);
    }
    *out = d;
    return 0;
}

int td_json_int(const json_t *obj, const char *path, const char *key, bool required, long def,
                long min, long max, long *out, td_err *err) {
    char where[TD_JSON_PATH_MAX];
    td_json_path(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required) return td_fail(err, "%s: missing; expected an integer", where);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v)) return td_json_fail_found(err, where, "an integer", v);
    long long d = json_integer_value(v);
    if (d < min || d > max) {
        char expected[128];
        snprintf(expected, sizeof expected, "an integer in [%ld, %ld]", min, max);
        return td_json_fail_found(err, where, expected, v);
    }
    *out = (long)d;
    return 0;
}

int td_json_bool(const json_t *obj, const char *path, const char *key, bool def, bool *out,
                 td_err *err) {
    char where[TD_JSON_PATH_MAX];
    td_json_path(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v)) return td_json_fail_found(err, where, "true or false", v);
    *out = json_is_true(v);
    return 0;
}

int td_json_string(const json_t *obj, const char *path, const char *key, bool required,
                   const char *def, char *out, size_t len, td_err *err) {
    char where[TD_JSON_PATH_MAX];
    td_json_path(where, sizeof where, path, key);
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required) return td_fail(err, "%s: missing; expected a string", where);
        snprintf(out, len, "%s", def);
        return 0;
    }
    if (!json_is_string(v)) return td_json_fail_found(err, where, "a string", v);
    if (strlen(json_string_value(v)) >= len)
        return td_fail(err, "%s: longer than %zu characters", where, len - 1);
    snprintf(out, len, "%s", json_string_value(v));
    return 0;
}

/* A string that must be one of "a|b|c"; returns its index. */
int td_json_choice(const json_t *obj, const char *path, const char *key, bool required,
                   const char *def, const char *choices, int *out, td_err *err) {
    char value[64], where[TD_JSON_PATH_MAX];
    if (td_json_string(obj, path, key, required, def, value, sizeof value, err) != 0) return -1;
    int index = 0;
    const char *p = choices;
    while (*p) {
        size_t n = strcspn(p, "|");
        if (strlen(value) == n && strncmp(p, value, n) == 0) {
            *out = index;
            return 0;
        }
        p += n + (p[n] == '|');
        index++;
    }
    td_json_path(where, sizeof where, path, key);
    char expected[256];
    snprintf(expected, sizeof expected, "one of %s", choices);
    for (char *c = expected; *c; c++)
        if (*c == '|') *c = '/';
    return td_json_fail_found(err, where, expected, json_object_get(obj, key));
}
