/* schedule.h — learning-rate schedules, verl's formulas
 * (verl/utils/torch_functional.py): constant with warmup, linear
 * (get_linear_schedule_with_warmup... with min_lr_ratio), cosine
 * (get_cosine_schedule_with_warmup with min_lr_ratio and num_cycles). */
#ifndef ENGINED_OPTIM_SCHEDULE_H
#define ENGINED_OPTIM_SCHEDULE_H

#include <stdint.h>

#include "engine.h"

/* The multiplier of the peak lr after `step` scheduler steps (step 0 is the
 * first optimizer step). */
double lr_schedule_factor(const struct engine_sched_config *s, int64_t step);

/* Validate a schedule: negative steps, total_steps <= 0 for linear/cosine,
 * min_lr_ratio outside [0,1], num_cycles < 0: -EINVAL naming the field. */
int lr_schedule_validate(const struct engine_sched_config *s, struct eng_error *err);

#endif
