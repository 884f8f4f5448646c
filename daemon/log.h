/* log.h — the daemon's log: one line per event on stderr (journald adds
 * the time and unit), filtered by level. Thread-safe. */
#ifndef ENGINED_DAEMON_LOG_H
#define ENGINED_DAEMON_LOG_H

enum log_level {
	LOG_LVL_ERROR = 0,
	LOG_LVL_WARN = 1,
	LOG_LVL_INFO = 2,
	LOG_LVL_DEBUG = 3,
};

/* Parse "error" | "warn" | "info" | "debug"; -EINVAL otherwise. */
int log_parse_level(const char *s, enum log_level *ret);
void log_set_level(enum log_level lvl);
int log_enabled(enum log_level lvl);
void log_msg(enum log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#endif
