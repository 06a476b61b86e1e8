/* A node's GPU inventory (td_gpus.h). */
#include "service/run/td_gpus.h"

#include "base/td_json.h"
#include "base/td_parse.h"

#include <stdio.h>
#include <string.h>

static int add(td_node_gpu *out, int *n, long index, const char *where, td_err *err) {
    if (*n == TD_GPUS_MAX)
        return td_fail(err, "%s: at most %d GPUs on one node", where, TD_GPUS_MAX);
    for (int i = 0; i < *n; i++)
        if (out[i].index == index) return td_fail(err, "%s: GPU %ld is listed twice", where, index);
    out[(*n)++] = (td_node_gpu){.index = (int)index};
    return 0;
}

int td_gpus_parse_list(const char *text, td_node_gpu *out, int *n, td_err *err) {
    *n = 0;
    const char *p = text;
    do {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[32];
        long index;
        if (len == 0 || len >= sizeof item)
            return td_fail(err,
                           "--gpus \"%s\": expected device ordinals separated by commas, e.g. "
                           "0,1,2,3",
                           text);
        memcpy(item, p, len);
        item[len] = 0;
        if (!td_parse_long(item, 0, 1023, &index))
            return td_fail(err, "--gpus \"%s\": \"%s\" is not a device ordinal in [0, 1023]", text,
                           item);
        if (add(out, n, index, "--gpus", err) != 0) return -1;
        p = end ? end + 1 : NULL;
    } while (p);
    return 0;
}

int td_gpus_parse_json(const json_t *a, const char *path, td_node_gpu *out, int *n, td_err *err) {
    static const char *const KEYS[] = {"index", "name", "memory_gib", NULL};
    *n = 0;
    if (!json_is_array(a) || json_array_size(a) == 0)
        return td_json_fail_found(err, path,
                                  "a non-empty array of device ordinals or of {\"index\", "
                                  "\"name\", \"memory_gib\"}",
                                  a);
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        char where[TD_JSON_PATH_MAX];
        snprintf(where, sizeof where, "%s[%zu]", path, i);
        long index = 0;
        double gib = 0;
        if (json_is_integer(v)) {
            index = (long)json_integer_value(v);
            if (index < 0 || index > 1023)
                return td_json_fail_found(err, where, "a device ordinal in [0, 1023]", v);
        } else if (!json_is_object(v)) {
            return td_json_fail_found(err, where, "a device ordinal or an object", v);
        } else if (td_json_check_keys(v, where, KEYS, err) != 0 ||
                   td_json_int(v, where, "index", true, 0, 0, 1023, &index, err) != 0 ||
                   td_json_number(v, where, "memory_gib", false, 0, 0, 1 << 20, &gib, err) != 0) {
            return -1;
        }
        if (add(out, n, index, where, err) != 0) return -1;
        td_node_gpu *g = &out[*n - 1];
        if (json_is_object(v) &&
            td_json_string(v, where, "name", false, "", g->name, sizeof g->name, err) != 0)
            return -1;
        g->memory_bytes = (uint64_t)(gib * 1073741824.0);
    }
    return 0;
}

int td_gpus_resolve(const td_node_gpu *declared, int n_declared, const td_node_gpu *found,
                    int n_found, td_node_gpu *out, int *n, td_err *err) {
    if (n_declared == 0) {
        *n = n_found < TD_GPUS_MAX ? n_found : TD_GPUS_MAX;
        memcpy(out, found, (size_t)*n * sizeof *out);
        return 0;
    }
    *n = 0;
    for (int i = 0; i < n_declared; i++) {
        td_node_gpu g = declared[i];
        if (n_found > 0) {
            if (g.index >= n_found)
                return td_fail(err,
                               "GPU %d is declared, but the driver finds %d GPU%s here "
                               "(ordinals 0 to %d)",
                               g.index, n_found, n_found == 1 ? "" : "s", n_found - 1);
            if (!g.name[0]) snprintf(g.name, sizeof g.name, "%s", found[g.index].name);
            if (!g.memory_bytes) g.memory_bytes = found[g.index].memory_bytes;
        }
        out[(*n)++] = g;
    }
    return 0;
}

json_t *td_gpus_json(const td_node_gpu *g, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(
            a, json_pack("{s:i, s:o, s:o}", "index", g[i].index, "name",
                         g[i].name[0] ? json_string(g[i].name) : json_null(), "memory_bytes",
                         g[i].memory_bytes ? json_integer((json_int_t)g[i].memory_bytes)
                                           : json_null()));
    return a;
}

int td_gpus_from_json(const json_t *a, const char *path, td_node_gpu *out, int *n, td_err *err) {
    static const char *const KEYS[] = {"index", "name", "memory_bytes", NULL};
    *n = 0;
    if (!a) return 0;
    if (!json_is_array(a)) return td_json_fail_found(err, path, "an array of GPUs", a);
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        char where[TD_JSON_PATH_MAX];
        snprintf(where, sizeof where, "%s[%zu]", path, i);
        long index;
        if (!json_is_object(v)) return td_json_fail_found(err, where, "an object", v);
        if (td_json_check_keys(v, where, KEYS, err) != 0 ||
            td_json_int(v, where, "index", true, 0, 0, 1023, &index, err) != 0 ||
            add(out, n, index, where, err) != 0)
            return -1;
        td_node_gpu *g = &out[*n - 1];
        json_t *name = json_object_get(v, "name"), *mem = json_object_get(v, "memory_bytes");
        if (name && !json_is_null(name) &&
            td_json_string(v, where, "name", true, "", g->name, sizeof g->name, err) != 0)
            return -1;
        if (mem && !json_is_null(mem)) {
            if (!json_is_integer(mem) || json_integer_value(mem) < 0)
                return td_json_fail_found(err, where, "memory_bytes: a byte count or null", mem);
            g->memory_bytes = (uint64_t)json_integer_value(mem);
        }
    }
    return 0;
}

void td_gpus_describe(const td_node_gpu *g, int n, char *buf, size_t len) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < n && used + 1 < len; i++) {
        int w = snprintf(buf + used, len - used, "%s%d",
                         i       ? ","
                         : n > 1 ? "GPUs "
                                 : "GPU ",
                         g[i].index);
        used += w > 0 ? (size_t)w : 0;
    }
    bool same = n > 0 && g[0].name[0];
    for (int i = 1; same && i < n; i++)
        same = strcmp(g[i].name, g[0].name) == 0 && g[i].memory_bytes == g[0].memory_bytes;
    if (same && used + 1 < len) {
        if (g[0].memory_bytes)
            snprintf(buf + used, len - used, " (%s, %.1f GiB%s)", g[0].name,
                     (double)g[0].memory_bytes / 1073741824.0, n > 1 ? " each" : "");
        else
            snprintf(buf + used, len - used, " (%s)", g[0].name);
    }
}
