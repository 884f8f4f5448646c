/* test_hold.c — the ENGINED_TEST_HOLD_FILE hook (see test_hold.h). */
#include "test_hold.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static const char *hold_file, *safe_point_file;

static const char *env_path(const char *name)
{
	const char *p = getenv(name);

	if (!p || !p[0])
		return NULL;
	log_msg(LOG_LVL_WARN, "test hook: %s=%s (never set it in production)", name, p);
	return p;
}

void test_hold_init(void)
{
	hold_file = env_path("ENGINED_TEST_HOLD_FILE");
	safe_point_file = env_path("ENGINED_TEST_SAFE_POINT_FILE");
}

/* Wait while `file` exists (and, with gone, until gone(ctx)). */
static void wait_while(const char *file, const char *what, bool (*gone)(void *), void *ctx)
{
	const struct timespec tick = { 0, 1000000 };  /* 1 ms */
	long waited = 0;

	if (!file || access(file, F_OK) != 0 || (gone && gone(ctx)))
		return;
	log_msg(LOG_LVL_INFO, "test hook: %s held until %s is removed", what, file);
	while (access(file, F_OK) == 0 && !(gone && gone(ctx)) &&
	       waited < TEST_HOLD_MAX_S * 1000L) {
		nanosleep(&tick, NULL);
		waited++;
	}
	log_msg(LOG_LVL_INFO, "test hook: %s released", what);
}

void test_hold_wait(const char *job)
{
	wait_while(hold_file, job, NULL, NULL);
}

/* The count the safe-point file holds (empty or unreadable: 0). */
static long file_count(const char *file)
{
	FILE *f = fopen(file, "r");
	long n = 0;

	if (!f)
		return 0;
	if (fscanf(f, "%ld", &n) != 1 || n < 0)
		n = 0;
	fclose(f);
	return n;
}

void test_hold_safe_point(bool (*gone)(void *ctx), void *ctx)
{
	static long passed;  /* engine thread only: safe points let by */

	if (!safe_point_file)
		return;
	if (access(safe_point_file, F_OK) != 0) {
		passed = 0;
		return;
	}
	if (passed < file_count(safe_point_file)) {
		passed++;
		return;
	}
	wait_while(safe_point_file, "safe point", gone, ctx);
	passed = 0;
}
