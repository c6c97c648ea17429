/* inference_options.c: see inference_options.h. */
#include "model/inference_options.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/options.h"
#include "core/version.h"

static const char *const weights_names[] = {"ema", "raw"};

void inference_options_init(InferenceOptions *o, int default_batch) {
    memset(o, 0, sizeof *o);
    o->device = DEVICE_AUTO;
    o->batch = default_batch;
}

int inference_option(InferenceOptions *o, int c, const char *arg, const char *usage,
                     const char *program) {
    switch (c) {
    case 'D': o->device = (DeviceChoice)option_choice("device", arg, device_choice_names, 3); return 1;
    case 'b': o->batch = (int)option_int("batch-size", arg, 1, 1000000); return 1;
    case 't': o->threads = (int)option_int("threads", arg, 1, 1024); return 1;
    case 'q': o->quiet = 1; return 1;
    case 'w': o->raw_weights = option_choice("weights", arg, weights_names, 2); return 1;
    case 'h': fputs(usage, stdout); exit(0);
    case 'V': version_print_and_exit();
    case '?': fprintf(stderr, "see `%s --help`\n", program); exit(2);
    default: return 0;
    }
}
