/* Inside the spec reader (td_spec.h), shared by its files:
 *   td_spec.c        the whole spec: top-level keys, checkpoint and log sections, loading
 *   td_spec_model.c  the model section (nodes and presets)
 *   td_spec_data.c   the data section
 *   td_spec_train.c  the train section
 *   td_preset.c      the presets, expanded into nodes
 * Each section parser reads its part of root into job; errors name the JSON path. */
#ifndef TD_SPEC_PRIVATE_H
#define TD_SPEC_PRIVATE_H

#include "spec/td_spec.h"

#include <jansson.h>

int td_spec_parse_model(const json_t *root, td_job *job, td_err *err);
int td_spec_parse_data(const json_t *root, td_job *job, td_err *err);
int td_spec_parse_train(const json_t *root, td_job *job, td_err *err);

#endif
