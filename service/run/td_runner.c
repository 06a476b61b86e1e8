/* The node's slots and GPUs, and the cgroups of attempts that ended: what every attempt that
 * runs here holds, whichever way it was asked for (td_runner.h). */
#define _GNU_SOURCE /* O_PATH */
#include "service/run/td_runner.h"

#include "base/td_buf.h"
#include "base/td_clock.h"
#include "base/td_strv.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

void td_runner_init(td_runner *n, const td_runner_config *cfg) {
    *n = (td_runner){.cfg = cfg};
    n->gpu_used = td_calloc(cfg->gpus > 0 ? (size_t)cfg->gpus : 1, sizeof *n->gpu_used);
}

void td_runner_free(td_runner *n) {
    free(n->gpu_used);
    for (int i = 0; i < n->n_cg_ended; i++) free(n->cg_ended[i]);
    free(n->cg_ended);
    *n = (td_runner){0};
}

char **td_runner_devices_strv(const td_runner *n, const int *devices, int n_slots, int procs,
                              bool all) {
    char **out = td_strv_new(procs);
    int each = all ? n_slots : procs > 0 ? n_slots / procs : 0;
    for (int p = 0; p < procs; p++) {
        td_buf b = {0};
        for (int i = 0; i < each; i++)
            td_buf_printf(&b, "%s%d", i ? "," : "",
                          td_runner_gpu_id(n, devices[all ? i : p * each + i]));
        out[p] = td_str_dup(b.data ? b.data : "");
        td_buf_free(&b);
    }
    return out;
}

int *td_runner_take_gpus(td_runner *n, int count) {
    int *devices = td_calloc(count > 0 ? (size_t)count : 1, sizeof *devices);
    int k = 0;
    for (int i = 0; i < n->cfg->gpus && k < count; i++)
        if (!n->gpu_used[i]) n->gpu_used[i] = true, devices[k++] = i;
    if (k == count) return devices;
    for (int r = 0; r < k; r++) n->gpu_used[devices[r]] = false;
    free(devices);
    return NULL;
}

int *td_runner_hold_gpus(td_runner *n, json_t *slots, int count) {
    if (n->cfg->gpus <= 0 || !json_is_array(slots)) return NULL;
    int *devices = td_calloc((size_t)count, sizeof(int));
    for (int i = 0; i < count; i++) {
        int d = (int)json_integer_value(json_array_get(slots, (size_t)i));
        devices[i] = d >= 0 && d < n->cfg->gpus ? d : 0;
        if (d >= 0 && d < n->cfg->gpus) n->gpu_used[d] = true;
    }
    return devices;
}

void td_runner_give_back_gpus(td_runner *n, const int *devices, int count) {
    for (int i = 0; devices && i < count; i++) n->gpu_used[devices[i]] = false;
}

int td_runner_gpus_free(const td_runner *n) {
    int k = 0;
    for (int i = 0; i < n->cfg->gpus; i++) k += !n->gpu_used[i];
    return k;
}

void td_runner_cgroup_ended(td_runner *n, const char *path) {
    if (!path || !path[0]) return;
    char ranks[PATH_MAX + 16];
    snprintf(ranks, sizeof ranks, "%s/ranks", path);
    int fd = open(ranks, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) { /* nothing of the attempt survives it (setsid, a double fork) */
        td_cgroup_kill(fd);
        close(fd);
    }
    if (td_cgroups_remove(path)) return;
    n->cg_ended = td_realloc(n->cg_ended, (size_t)(n->n_cg_ended + 1) * sizeof *n->cg_ended);
    n->cg_ended[n->n_cg_ended++] = td_strdup(path);
}

void td_runner_cgroups_tidy(td_runner *n) {
    double now = td_clock_now();
    if (n->n_cg_ended == 0 || now - n->cg_tried < 1.0) return;
    n->cg_tried = now;
    int kept = 0;
    for (int i = 0; i < n->n_cg_ended; i++) {
        if (td_cgroups_remove(n->cg_ended[i]))
            free(n->cg_ended[i]);
        else
            n->cg_ended[kept++] = n->cg_ended[i];
    }
    n->n_cg_ended = kept;
}
