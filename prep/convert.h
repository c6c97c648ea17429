/* convert.h: decode one split's images in parallel and write them in order.
 *
 * Worker threads claim record indices and decode into a ring of `window` slots;
 * the calling thread takes the slots back in index order, adds each image to the
 * split's statistics and hands it to the LMDB writer. Memory is bounded by the
 * window (a few MiB for CIFAR), not by the dataset. */
#ifndef PREP_CONVERT_H
#define PREP_CONVERT_H

#include <stdint.h>

#include "annotations.h"
#include "data/dataset.h"
#include "data/image.h"

typedef struct {
    const char *split;       /* split name ("train") */
    const char *image_dir;   /* names in `ann` are relative to this folder */
    const Annotations *ann;
    ImageShape shape;        /* every image must have this shape... */
    const char *shape_from;  /* ...the one of this file (for messages) */
    int threads;
    DatasetWriter *writer;
    const char *out_path;    /* for writer error messages */
    int outside_ok;          /* --allow-outside-symlinks */
    int writeback_fd;        /* >= 0: the writer's file, opened read-only: the kernel is
                                asked to start writing it out as records arrive */
} ConvertJob;

/* Convert a split; fills result's count, mean and std (name too). On any bad
 * image or write failure: one line "cifar-prep: <file>: <reason>" and exit 1
 * (through die, so the cleanup hook removes the temporary file). */
void convert_split(const ConvertJob *job, DatasetSplit *result);

/* "<dir>/<name>" into buf; dies if it does not fit. */
void convert_image_path(const char *dir, const char *name, char *buf, size_t buflen);

#endif
