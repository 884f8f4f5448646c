/* clock.h — seconds of CLOCK_MONOTONIC as a double, the one clock the
 * engines time their own work with (collective deadlines, the reduction's
 * statistics). */
#ifndef ENGINED_CLOCK_H
#define ENGINED_CLOCK_H

#include <time.h>

static inline double eng_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
