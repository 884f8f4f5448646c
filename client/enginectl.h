/* enginectl.h — what enginectl's files share (enginectl_common.c): the
 * command and option tables, option parsing with getopt_long and checked
 * numbers, the connection made from the global options, and error output.
 *
 * Every usage error prints "enginectl: COMMAND: what" and a hint to
 * `enginectl help COMMAND` on stderr and exits with status 2; the parsing
 * functions below do that themselves, so a command never sees bad input.
 */
#ifndef ENGINED_CLIENT_ENGINECTL_H
#define ENGINED_CLIENT_ENGINECTL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engined_client.h"

/* One option of a command (or a global one): its getopt_long entry and
 * its line of help. val must not be 'h' (every command has -h, --help). */
struct ctl_opt {
	const char *name;
	int has_arg;            /* no_argument or required_argument */
	int val;
	const char *arg;        /* the argument's name in the help (NULL: none) */
	const char *help;
};

/* A command: the table in enginectl.c dispatches on name and prints the
 * help from the same entry. */
struct ctl_command {
	const char *name;
	const char *args;       /* positional arguments for the usage line, or "" */
	const char *summary;    /* one line for `enginectl help` */
	const struct ctl_opt *opts;     /* ends with a zeroed entry; NULL: none */
	int (*run)(int argc, char **argv);      /* argv[0] is the command name */
	const char *detail;     /* more lines of help ("...\n"), or NULL */
};

/* The global options, set by main before a command runs. */
extern const char *ctl_addr;
extern double ctl_timeout_s;
extern int ctl_retries;
extern struct ec_options ctl_sec;

/* The command being run (NULL while the global options are parsed):
 * messages name it. */
extern const struct ctl_command *ctl_cur;

/* Print cmd's usage and options to f. */
void ctl_command_help(FILE *f, const struct ctl_command *cmd);
/* Print a table's options and -h, --help, one a line, as the help does. */
void ctl_print_opts(FILE *f, const struct ctl_opt *opts);

/* Usage error of the current command: the message, the hint, exit(2). */
void ctl_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* getopt_long over opts and -h/--help, from argv[1] on: the next option's
 * val, or -1 when the options end (the positional arguments, permuted to
 * the end unless in_order, then start at optind; in_order stops at the
 * first one). A new argv or table starts a new scan. An unknown option or
 * a missing argument is a usage error; --help prints the current
 * command's help and exits 0 (with no current command it returns 'h'). */
int ctl_getopt_opts(int argc, char **argv, const struct ctl_opt *opts, bool in_order);
/* ctl_getopt_opts over the current command's options. */
int ctl_getopt(int argc, char **argv);

/* After ctl_getopt: between min and max positional arguments, or a usage
 * error. Returns their number; they are argv[optind...]. */
int ctl_positionals(int argc, char **argv, int min, int max, const char *what);

/* Numbers of option `opt` (its name without dashes): the whole string,
 * decimal, in [min, max], else a usage error naming the option. */
int64_t ctl_int_arg(const char *opt, const char *s, int64_t min, int64_t max);
uint64_t ctl_uint64_arg(const char *opt, const char *s);
double ctl_double_arg(const char *opt, const char *s, double min, double max);

double ctl_now(void);                   /* CLOCK_MONOTONIC, seconds */
/* Print "enginectl: what: CODE: message" on stderr; returns 1. */
int ctl_fail(const char *what, const struct ec_status *st);
/* Connect with the global options ($ENGINED_TOKEN too); exit(1) on error. */
struct ec_client *ctl_connect(void);

/* Progress of a long call on stderr (enginectl_progress.c): a bar on a
 * terminal, plain lines otherwise. start: before the call; with a method
 * name a thread polls GetStatus on c for that job's progress, with NULL the
 * caller reports through update (any thread). end: after the call (ok: it
 * succeeded, the last line says done = total); frees p. All accept NULL,
 * which start returns when --no-progress is set. */
extern bool ctl_no_progress;
struct ctl_progress;
struct ctl_progress *ctl_progress_start(struct ec_client *c, const char *label,
					const char *method);
void ctl_progress_update(struct ctl_progress *p, const char *phase, int64_t done,
			 int64_t total, const char *unit);
void ctl_progress_end(struct ctl_progress *p, bool ok);

#endif
