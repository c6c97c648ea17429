/* schedule.h: the learning-rate schedule of cifar-train (llm.c's schedulers.h, Caffe's
 * GetLearningRate): a linear warm-up from 0, then constant, step (x0.1 at 50% and
 * x0.01 at 75% of the epochs) or cosine (from the peak to 0 over the epochs after the
 * warm-up). A pure function of the epoch position, so a resumed run gets the same
 * rates as a straight one. */
#ifndef CIFAR_TRAIN_SCHEDULE_H
#define CIFAR_TRAIN_SCHEDULE_H

typedef enum { SCHEDULE_CONST, SCHEDULE_STEP, SCHEDULE_COSINE } Schedule;
#define SCHEDULE_COUNT 3

/* The option values and snapshot names, by Schedule. */
extern const char *const schedule_names[SCHEDULE_COUNT];

typedef struct {
    Schedule kind;
    double lr;            /* the peak rate */
    double warmup_epochs; /* 0: none */
    int epochs;           /* the run's length */
} LrSchedule;

/* The rate at a (fractional) epoch position. */
double lr_schedule_at(const LrSchedule *s, double epoch_pos);

#endif
