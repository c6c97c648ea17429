/* inference_options.h: the options cifar-eval and cifar-predict share (--device,
 * --batch-size, --threads, --quiet, --weights, --help, --version), parsed by one
 * function so that both commands spell and check them alike. */
#ifndef CIFAR_INFERENCE_OPTIONS_H
#define CIFAR_INFERENCE_OPTIONS_H

#include <getopt.h>

#include "model/device.h"

typedef struct {
    DeviceChoice device;
    int batch, threads, quiet;
    int raw_weights; /* --weights raw */
} InferenceOptions;

/* Their entries of a getopt_long table (the other options must use other letters). */
#define INFERENCE_LONG_OPTIONS                                                             \
    {"device", required_argument, 0, 'D'}, {"batch-size", required_argument, 0, 'b'},     \
    {"threads", required_argument, 0, 't'}, {"quiet", no_argument, 0, 'q'},              \
    {"weights", required_argument, 0, 'w'}, {"help", no_argument, 0, 'h'},               \
    {"version", no_argument, 0, 'V'}

/* The defaults: device auto, every thread, the trained average when there is one. */
void inference_options_init(InferenceOptions *o, int default_batch);

/* One getopt_long result `c` with its argument: 1 when it is one of the shared options
 * (--help prints `usage` and exits 0, --version exits 0), 0 when it is the command's
 * own. An unknown option ('?') exits 2 pointing at `PROGRAM --help`. */
int inference_option(InferenceOptions *o, int c, const char *arg, const char *usage,
                     const char *program);

#endif
