/* The metric lines (td_metrics.h), built with Jansson and written by one function.
 *
 * Jansson builds each event: its keys in the order they are added (the order readers have
 * always seen), integers, and strings escaped as JSON wants. Reals are the one exception:
 * Jansson prints them %.17g (or JSON_REAL_PRECISION's %.Ng), adds ".0" to a whole number and
 * drops an exponent's leading zeros ("1.5e-05" becomes "1.5e-5"), and it has no fixed decimals at
 * all; the lines have always carried accuracies and timings with fixed decimals and losses as
 * printf's %.9g writes them, and they stay byte for byte what they were (runs are compared as
 * text, the daemon stores what it read). So write_line hands every value to Jansson but the
 * reals, which it prints in their key's format from REAL_FORMATS.
 *
 * JSON has no NaN or infinity (Jansson refuses them): such a value (the validation loss of a
 * model that diverged) is written null, which keeps the line readable; printf's "nan" made the
 * whole line unparsable. */
#include "train/td_metrics.h"

#include "base/td_error.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

static const struct {
    const char *key, *format;
} REAL_FORMATS[] = {
    {"loss", "%.9g"},       {"lr", "%.9g"},
    {"val_loss", "%.9g"},   {"val_acc", "%.6f"},
    {"perplexity", "%.9g"}, {"samples_per_s", "%.1f"},
    {"step_ms", "%.4f"},    {"elapsed_s", "%.3f"},
    {"gpu_mem_mb", "%.1f"}, {"gpu_mem_peak_mb", "%.1f"},
    {"loss_scale", "%g"},
};

static const char *real_format(const char *key) {
    for (size_t i = 0; i < sizeof REAL_FORMATS / sizeof REAL_FORMATS[0]; i++)
        if (strcmp(REAL_FORMATS[i].key, key) == 0) return REAL_FORMATS[i].format;
    TD_ASSERT(false, "a real-valued metric key without a format: add it to REAL_FORMATS");
    return NULL;
}

static void put(json_t *o, const char *key, json_t *value) {
    TD_CHECK_ALLOC(value, "building a metric line");
    if (json_object_set_new(o, key, value) != 0)
        td_die(__FILE__, __LINE__, "out of memory building a metric line", NULL);
}

static void put_int(json_t *o, const char *key, long v) {
    put(o, key, json_integer(v));
}

static void put_real(json_t *o, const char *key, double v) {
    put(o, key, isfinite(v) ? json_real(v) : json_null());
}

static json_t *event(const char *name) {
    json_t *o = json_object();
    TD_CHECK_ALLOC(o, "building a metric line");
    put(o, "event", json_string(name));
    return o;
}

/* One line: {"key":value,...} with no spaces, then flushed. Keys are this file's own names,
 * plain ASCII: nothing in them to escape. */
static void write_line(FILE *out, json_t *o) {
    const char *key;
    json_t *value;
    char sep = '{';
    json_object_foreach(o, key, value) {
        fprintf(out, "%c\"%s\":", sep, key);
        sep = ',';
        if (json_is_real(value))
            fprintf(out, real_format(key), json_real_value(value));
        else
            json_dumpf(value, out, JSON_ENCODE_ANY | JSON_COMPACT);
    }
    fputs("}\n", out);
    fflush(out);
    json_decref(o);
}

void td_metrics_train(FILE *out, const td_metric_train *m) {
    json_t *o = event(TD_EVENT_TRAIN);
    put_int(o, "step", m->step);
    put_int(o, "epoch", m->epoch);
    put_real(o, "loss", m->loss);
    put_real(o, "lr", m->lr);
    put_real(o, "samples_per_s", m->samples_per_s);
    put_real(o, "step_ms", m->step_ms);
    put_int(o, "total_steps", m->total_steps);
    put_int(o, "epochs", m->epochs);
    if (m->gpu) {
        put_real(o, "gpu_mem_mb", m->gpu_mem_mb);
        put_real(o, "gpu_mem_peak_mb", m->gpu_mem_peak_mb);
        if (m->fp16) {
            put_real(o, "loss_scale", m->loss_scale);
            put_int(o, "skipped_steps", m->skipped_steps);
        }
    }
    write_line(out, o);
}

void td_metrics_eval(FILE *out, const td_metric_eval *m) {
    json_t *o = event(TD_EVENT_EVAL);
    put_int(o, "epoch", m->epoch);
    put_int(o, "step", m->step);
    if (m->language_model && !isnan(m->loss)) put_real(o, "loss", m->loss);
    put_real(o, "val_loss", m->val_loss);
    put_real(o, "val_acc", m->val_acc);
    if (m->language_model) put_real(o, "perplexity", exp(m->val_loss)); /* inf: null */
    write_line(out, o);
}

void td_metrics_checkpoint(FILE *out, long step, const char *path) {
    json_t *o = event(TD_EVENT_CHECKPOINT);
    put_int(o, "step", step);
    json_t *p = json_string(path);
    /* Jansson takes UTF-8 only; a checkpoint's path is the spec's checkpoint.dir (JSON, so UTF-8)
     * and an ASCII step directory */
    if (!p) td_die(__FILE__, __LINE__, "out of memory, or a checkpoint path not in UTF-8", path);
    put(o, "path", p);
    write_line(out, o);
}

void td_metrics_sample(FILE *out, long step, const char *prompt, const char *text) {
    json_t *o = event(TD_EVENT_SAMPLE);
    put_int(o, "step", step);
    json_t *p = json_string(prompt), *t = json_string(text);
    if (!p || !t) td_die(__FILE__, __LINE__, "out of memory, or a sample not in UTF-8", text);
    put(o, "prompt", p);
    put(o, "text", t);
    write_line(out, o);
}

void td_metrics_done(FILE *out, const td_metric_done *m) {
    json_t *o = event(TD_EVENT_DONE);
    put_int(o, "step", m->step);
    put_int(o, "epoch", m->epochs);
    put_real(o, "loss", m->loss);
    if (m->has_val) {
        put_real(o, "val_loss", m->val_loss);
        put_real(o, "val_acc", m->val_acc);
    }
    put_real(o, "samples_per_s", m->samples_per_s);
    put_real(o, "elapsed_s", m->elapsed_s);
    write_line(out, o);
}
