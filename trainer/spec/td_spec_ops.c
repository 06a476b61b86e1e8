/* The code of each op a spec names: the worker's step from a checked spec to a model. Apart from
 * the validator (td_spec_model.c), which reads the ops' signatures alone, so that what links the
 * validator without this file (the daemon) links no kernel. */
#include "spec/td_spec.h"

#include "ops/td_ops.h"

void td_spec_resolve_ops(td_node_spec *nodes, int n) {
    for (int i = 0; i < n; i++)
        if (!nodes[i].op) nodes[i].op = td_op_of(nodes[i].sig);
}

int td_job_load_file(td_job *job, const char *path, td_err *err) {
    if (td_job_parse_file(job, path, err) != 0) return -1;
    td_spec_resolve_ops(job->model.nodes, job->model.n_nodes);
    return 0;
}

int td_job_load_string(td_job *job, const char *text, td_err *err) {
    if (td_job_parse_string(job, text, err) != 0) return -1;
    td_spec_resolve_ops(job->model.nodes, job->model.n_nodes);
    return 0;
}
