/* TensorBoard event files for a job's scalars (loss, learning rate, throughput), so that
 * `tensorboard --logdir` pointed at a job's directory draws them with no exporter in between.
 *
 * A file is a sequence of TFRecords, each one serialized Event (td_tboard.proto, upstream's field
 * numbers): the first says the format version, every later one holds one scalar. It is named
 * events.out.tfevents.<seconds>.<host>, as TensorFlow's own writer names its files, because
 * TensorBoard only reads files whose name contains "tfevents".
 *
 * Each record goes to the file with write(2) as soon as it is made, with no buffer in between, so
 * that a running TensorBoard sees a step at once and a daemon that dies loses nothing already
 * written. A handle belongs to one thread at a time (the daemon has one per job); handles share
 * nothing, so threads with handles of their own need no lock. */
#ifndef TD_TBOARD_H
#define TD_TBOARD_H

#include "base/td_error.h"

typedef struct td_tboard td_tboard;

/* Opens dir/events.out.tfevents.<wall_time in whole seconds>.<host> for appending, creating dir
 * (mode 0750; its parent must exist) and the file (0640) when missing. A new or empty file gets
 * the version record first. A file that exists, as after a daemon restart that reopens its job's
 * file, is appended to: a record cut short at its end (the daemon killed inside a write, a full
 * disk) is cut off first, since anything appended after it could not be read; a file that is not
 * a sequence of records up to there is refused. host must be non-empty and hold no '/'. */
int td_tboard_open(td_tboard **out, const char *dir, const char *host, double wall_time,
                   td_err *err);

/* Appends one Event: at step and wall_time (seconds since the epoch), the scalar `tag` (UTF-8,
 * non-empty) = value, stored as a float as TensorBoard's simple_value is. After an error the
 * file still ends with a whole record, and the handle can be used again. */
int td_tboard_scalar(td_tboard *w, const char *tag, long step, double wall_time, double value,
                     td_err *err);

/* Closes the file; w may be NULL. */
void td_tboard_close(td_tboard *w);

/* Reading a file another program writes (a script's SummaryWriter): the whole records of the
 * event file open at fd from *offset on, at most max_bytes of them per call, each scalar summary
 * (simple_value) handed to scalar(arg, tag, step, value); *offset moves past what was read. A
 * record still being written (cut short at the end) waits for the next call; one over 1 MiB (an
 * image, a histogram) is skipped unread. -1 with err when the file is not an event file (a bad
 * CRC, an Event protobuf-c cannot decode): the caller reads no more of it. */
typedef void td_tboard_scalar_fn(void *arg, const char *tag, long step, double value);
int td_tboard_read_scalars(int fd, long long *offset, long long max_bytes,
                           td_tboard_scalar_fn *scalar, void *arg, td_err *err);

#endif
