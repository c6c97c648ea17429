/* schedule.c: the learning-rate schedule (schedule.h). */
#include <math.h>

#include "schedule.h"

const char *const schedule_names[SCHEDULE_COUNT] = {"const", "step", "cosine"};

double lr_schedule_at(const LrSchedule *s, double pos) {
    if (s->warmup_epochs > 0 && pos < s->warmup_epochs) return s->lr * pos / s->warmup_epochs;
    switch (s->kind) {
    case SCHEDULE_STEP:
        if (pos >= 0.75 * s->epochs) return s->lr * 0.01;
        if (pos >= 0.5 * s->epochs) return s->lr * 0.1;
        return s->lr;
    case SCHEDULE_COSINE: {
        double span = s->epochs - s->warmup_epochs;
        double t = span > 0 ? (pos - s->warmup_epochs) / span : 1.0;
        if (t > 1) t = 1;
        return 0.5 * s->lr * (1.0 + cos(M_PI * t));
    }
    case SCHEDULE_CONST:
    default: return s->lr;
    }
}
