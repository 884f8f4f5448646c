/* test_hold.c — the ENGINED_TEST_HOLD_FILE hook (see test_hold.h). */
#include "test_hold.h"

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static const char *hold_file;

void test_hold_init(void)
{
	const char *p = getenv("ENGINED_TEST_HOLD_FILE");

	hold_file = p && p[0] ? p : NULL;
	if (hold_file)
		log_msg(LOG_LVL_WARN,
			"test hook: jobs wait while %s exists (ENGINED_TEST_HOLD_FILE; never set it in production)",
			hold_file);
}

void test_hold_wait(const char *job)
{
	const struct timespec tick = { 0, 1000000 };  /* 1 ms */
	long waited = 0;

	if (!hold_file || access(hold_file, F_OK) != 0)
		return;
	log_msg(LOG_LVL_INFO, "test hook: %s held until %s is removed", job, hold_file);
	while (access(hold_file, F_OK) == 0 && waited < TEST_HOLD_MAX_S * 1000L) {
		nanosleep(&tick, NULL);
		waited++;
	}
	log_msg(LOG_LVL_INFO, "test hook: %s released", job);
}
