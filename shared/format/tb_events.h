/* tb_events.h: TensorBoard event files (RUN_DIR/tb/events.out.tfevents.*), the
 * scalars of a training run as TensorBoard's EventAccumulator reads them.
 *
 * Format. A file is a sequence of TFRecord records, each
 *     uint64 length (little-endian), uint32 masked_crc32c(length bytes),
 *     length bytes of data, uint32 masked_crc32c(data)
 * with masked_crc(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 over CRC-32C
 * (data/crc32c.h); the data of each record is one tensorflow.Event protobuf
 * (tb_event.proto, encoded by protobuf-c). The first event of a file is
 * file_version "brain.Event:2"; each scalar is an Event {wall_time, step,
 * summary {value {tag, simple_value}}}.
 *
 * One file per process start (events.out.tfevents.<seconds>.<host>.<pid>, created
 * with O_EXCL | O_NOFOLLOW; its seconds are later than every older file's, so the
 * files sort in the order they were written): an append-only log, one write(2) per
 * record, fsynced by tb_flush (cifar-train: after each epoch and before a
 * snapshot). A crash can leave the last record torn.
 *
 * Resume (tb_open with the step the run resumes from): every older file is read
 * record by record and each record is checked (length, both CRCs, a decodable
 * Event); a file is rewritten (through a temporary, fsynced and renamed) keeping
 * the whole records up to its first bad one whose step is at most the resume step,
 * so the events of steps the run is about to redo, and a torn record, are gone:
 * TensorBoard then sees every (tag, step) once. */
#ifndef CIFAR_TB_EVENTS_H
#define CIFAR_TB_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct TbWriter TbWriter;

/* Prepare RUN_DIR/tb (created when missing) for a run resuming at `resume_step`
 * (0: a fresh run) as above. This process's new file is created by its first
 * scalar (a rerun of a finished run adds none). NULL with a reason in err (the
 * path named). */
TbWriter *tb_open(const char *run_dir, int64_t resume_step, char *err, size_t errlen);

/* One scalar event. 0, or -1 with a reason in err. */
int tb_scalar(TbWriter *w, const char *tag, int64_t step, double value, char *err, size_t errlen);

/* fsync the file when something was written since the last time. 0, or -1 with a
 * reason in err. */
int tb_flush(TbWriter *w, char *err, size_t errlen);


void tb_close(TbWriter *w);

/* Keep the whole records of steps <= max_step of the event file at path, up to its
 * first bad record (see above), rewriting it only when something goes. *kept and
 * *dropped count records (the bad tail as one). 0, or -1 with a reason in err. */
int tb_file_truncate(const char *path, int64_t max_step, int64_t *kept, int64_t *dropped, char *err,
                     size_t errlen);

/* The masked CRC-32C of TFRecord's framing. */
uint32_t tb_masked_crc(const void *data, size_t len);

#ifdef __cplusplus
}
#endif
#endif
