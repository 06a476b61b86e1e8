/* CSV datasets: one sample per line, an integer class label in one column and numeric features
 * in the others, an optional header line. Read with strtof: every malformed cell is reported
 * with its line and column. */
#include "data/td_data.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int count_fields(const char *line) {
    int n = 1;
    for (const char *p = line; *p; p++) n += *p == ',';
    return n;
}

int td_dataset_load_csv(td_dataset *ds, const char *path, int label_column, bool header,
                        td_err *err) {
    memset(ds, 0, sizeof *ds);
    FILE *f = fopen(path, "r");
    if (!f) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, columns = 0, rc = -1;
    size_t n = 0, alloc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue; /* blank lines, e.g. a trailing one */
        if (header && lineno == 1) continue;
        int fields = count_fields(line);
        if (!columns) {
            columns = fields;
            if (columns < 2 || label_column >= columns) {
                td_fail(err,
                        "%s:%d: %d columns; expected a label column (%d) and at least one "
                        "feature",
                        path, lineno, columns, label_column);
                goto out;
            }
        } else if (fields != columns) {
            td_fail(err, "%s:%d: %d columns, but the first row has %d", path, lineno, fields,
                    columns);
            goto out;
        }
        if (n == alloc) {
            alloc = alloc ? 2 * alloc : 1024;
            ds->values = td_realloc(ds->values, alloc * (size_t)(columns - 1) * sizeof(float));
            ds->labels = td_realloc(ds->labels, alloc * sizeof(int32_t));
        }
        char *p = line;
        int feature = 0;
        for (int col = 0; col < columns; col++) {
            char *end;
            errno = 0;
            float v = strtof(p, &end);
            while (*end == ' ') end++;
            if (end == p || (*end != ',' && *end != 0) || errno == ERANGE || !isfinite(v)) {
                size_t cell = strcspn(p, ",");
                td_fail(err, "%s:%d: column %d: \"%.*s\" is not a number", path, lineno, col + 1,
                        (int)(cell < 40 ? cell : 40), p);
                goto out;
            }
            if (col == label_column) {
                if (v != floorf(v) || v < 0 || v > (1 << 20)) {
                    td_fail(err,
                            "%s:%d: label \"%g\" in column %d is not a class index (an "
                            "integer >= 0)",
                            path, lineno, v, col + 1);
                    goto out;
                }
                ds->labels[n] = (int32_t)v;
            } else {
                ds->values[n * (size_t)(columns - 1) + feature++] = v;
            }
            p = *end ? end + 1 : end;
        }
        n++;
    }
    if (n == 0) {
        td_fail(err, "%s: no data rows", path);
        goto out;
    }
    ds->n = (int)n;
    ds->shape = td_shape_flat(columns - 1);
    ds->num_classes = td_dataset_max_label(ds) + 1;
    rc = 0;
out:
    free(line);
    fclose(f);
    if (rc != 0) td_dataset_free(ds);
    return rc;
}

/* A CSV up to this size is read whole at submit time (well under a second); a larger one is only
 * checked to be readable, and the rest waits for the run. */
#define CSV_PROBE_FULL (16 << 20)

int td_dataset_probe_csv(const char *path, int label_column, bool header, td_data_probe *p,
                         td_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    td_dataset ds;
    if (st.st_size <= CSV_PROBE_FULL) {
        if (td_dataset_load_csv(&ds, path, label_column, header, err) != 0) return -1;
        p->n = ds.n;
        p->shape = ds.shape;
        p->max_label = td_dataset_max_label(&ds);
        td_dataset_free(&ds);
        return 0;
    }
    FILE *f = fopen(path, "r");
    if (!f) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    fclose(f);
    p->n = 0;
    p->shape = td_shape_flat(0);
    p->max_label = -1;
    return 0;
}
