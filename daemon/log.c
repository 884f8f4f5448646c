/* log.c — stderr logger (see log.h). */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static enum log_level log_level = LOG_LVL_INFO;

static const char *const level_names[] = { "error", "warn", "info", "debug" };

int log_parse_level(const char *s, enum log_level *ret)
{
	for (int i = 0; i < 4; i++) {
		if (strcmp(s, level_names[i]) == 0) {
			*ret = (enum log_level)i;
			return 0;
		}
	}
	return -EINVAL;
}

void log_set_level(enum log_level lvl)
{
	log_level = lvl;
}

int log_enabled(enum log_level lvl)
{
	return lvl <= log_level;
}

void log_msg(enum log_level lvl, const char *fmt, ...)
{
	char line[1024];
	struct timespec ts;
	struct tm tm;
	va_list ap;
	int n;

	if (!log_enabled(lvl))
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s: ",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
		     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, level_names[lvl]);
	va_start(ap, fmt);
	vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	/* One fputs per line keeps lines from different threads whole. */
	fprintf(stderr, "%s\n", line);
}
