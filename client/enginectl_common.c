/* enginectl_common.c — what enginectl's commands share (see enginectl.h):
 * option parsing with getopt_long from a command's table, checked numbers,
 * usage errors and help, the connection made from the global options. */
#include "enginectl.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_OPTS 32

const char *ctl_addr = "127.0.0.1:50051";
double ctl_timeout_s;
int ctl_retries;
struct ec_options ctl_sec;
const struct ctl_command *ctl_cur;

/* --- usage errors and help ------------------------------------------------ */

void ctl_usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "enginectl: ");
	if (ctl_cur)
		fprintf(stderr, "%s: ", ctl_cur->name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (ctl_cur)
		fprintf(stderr, "\nTry 'enginectl help %s' for its usage.\n", ctl_cur->name);
	else
		fprintf(stderr, "\nTry 'enginectl help' for the commands and global options.\n");
	exit(2);
}

/* "  --name ARG   help", the help in column 30. */
static void print_opt(FILE *f, const char *name, const char *arg, const char *help)
{
	int w = fprintf(f, "  %s%s%s", name, arg ? " " : "", arg ? arg : "");

	fprintf(f, "%*s%s\n", w < 29 ? 29 - w : 1, "", help);
}

void ctl_print_opts(FILE *f, const struct ctl_opt *opts)
{
	char name[80];

	for (const struct ctl_opt *o = opts; o && o->name; o++) {
		snprintf(name, sizeof(name), "--%s", o->name);
		print_opt(f, name, o->arg, o->help);
	}
	print_opt(f, "-h, --help", NULL, "show this help");
}

void ctl_command_help(FILE *f, const struct ctl_command *cmd)
{
	fprintf(f, "usage: enginectl [global options] %s%s%s [options]\n", cmd->name,
		cmd->args[0] ? " " : "", cmd->args);
	fprintf(f, "%s\n", cmd->summary);
	if (cmd->detail)
		fprintf(f, "%s", cmd->detail);
	fprintf(f, "options:\n");
	ctl_print_opts(f, cmd->opts);
}

/* --- getopt_long over a table --------------------------------------------- */

static const struct ctl_opt *find_val(const struct ctl_opt *opts, int val)
{
	for (const struct ctl_opt *o = opts; o && o->name; o++)
		if (o->val == val)
			return o;
	return NULL;
}

/* An option getopt_long refused (ret '?' or ':'): say why. glibc sets optopt
 * to 0 for an unknown or ambiguous long option, else to the option's val
 * (a long one given "=ARG" it does not take, or one missing its argument)
 * or to an unknown short option's character; a long option's element is
 * argv[optind - 1]. */
static void bad_option(const struct ctl_opt *opts, int ret, const char *arg)
{
	const struct ctl_opt *o = find_val(opts, optopt);
	size_t len = strncmp(arg, "--", 2) ? 0 : strcspn(arg + 2, "=");
	char names[256] = "";
	int n = 0;

	if (ret == ':' && o)
		ctl_usage_error("--%s needs an argument (%s)", o->name, o->arg);
	if (optopt) {
		if (o && len && arg[2 + len] == '=' && !strncmp(o->name, arg + 2, len))
			ctl_usage_error("--%s takes no argument", o->name);
		ctl_usage_error("unknown option '-%c'", optopt);
	}
	for (o = opts; len && o && o->name; o++) {
		if (strncmp(o->name, arg + 2, len))
			continue;
		snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s--%s",
			 n++ ? ", " : "", o->name);
	}
	if (n > 1)
		ctl_usage_error("ambiguous option '%s' (%s)", arg, names);
	ctl_usage_error("unknown option '%s'", arg);
}

int ctl_getopt_opts(int argc, char **argv, const struct ctl_opt *opts, bool in_order)
{
	static struct option lo[MAX_OPTS + 2];
	static const struct ctl_opt *built;
	static char **built_argv;
	int n = 0, r;

	if (built != opts || built_argv != argv) {
		for (const struct ctl_opt *o = opts; o && o->name; o++) {
			if (n == MAX_OPTS || o->val == 'h')
				abort();        /* a bad table: a programming error */
			lo[n++] = (struct option){ o->name, o->has_arg, NULL, o->val };
		}
		lo[n++] = (struct option){ "help", no_argument, NULL, 'h' };
		lo[n] = (struct option){ NULL, 0, NULL, 0 };
		built = opts;
		built_argv = argv;
		optind = 0;             /* glibc: start a new scan */
	}
	opterr = 0;
	r = getopt_long(argc, argv, in_order ? "+:h" : ":h", lo, NULL);
	if (r == '?' || r == ':')
		bad_option(opts, r, argv[optind - 1]);
	if (r == 'h' && ctl_cur) {
		ctl_command_help(stdout, ctl_cur);
		exit(0);
	}
	return r;
}

int ctl_getopt(int argc, char **argv)
{
	return ctl_getopt_opts(argc, argv, ctl_cur->opts, false);
}

int ctl_positionals(int argc, char **argv, int min, int max, const char *what)
{
	int n = argc - optind;

	if (n < min)
		ctl_usage_error("missing %s", what);
	if (n > max)
		ctl_usage_error("unexpected argument '%s'", argv[optind + max]);
	return n;
}

/* --- numbers -------------------------------------------------------------- */

int64_t ctl_int_arg(const char *opt, const char *s, int64_t min, int64_t max)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (end == s || *end || isspace((unsigned char)s[0]))
		ctl_usage_error("--%s: '%s' is not an integer", opt, s);
	if (errno == ERANGE || v < min || v > max)
		ctl_usage_error("--%s: '%s' is out of range (%lld to %lld)", opt, s,
				(long long)min, (long long)max);
	return v;
}

uint64_t ctl_uint64_arg(const char *opt, const char *s)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (end == s || *end || isspace((unsigned char)s[0]))
		ctl_usage_error("--%s: '%s' is not an integer", opt, s);
	if (errno == ERANGE || s[0] == '-')     /* strtoull negates "-1" */
		ctl_usage_error("--%s: '%s' is out of range (0 to %llu)", opt, s,
				(unsigned long long)UINT64_MAX);
	return v;
}

double ctl_double_arg(const char *opt, const char *s, double min, double max)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || *end || isspace((unsigned char)s[0]))
		ctl_usage_error("--%s: '%s' is not a number", opt, s);
	if (!isfinite(v) && errno != ERANGE)
		ctl_usage_error("--%s: '%s' is not a finite number", opt, s);
	if (errno == ERANGE)
		ctl_usage_error("--%s: '%s' is out of a double's range", opt, s);
	if (v < min || v > max)
		ctl_usage_error("--%s: '%s' is out of range (%g to %g)", opt, s, min, max);
	return v;
}

/* --- the connection ------------------------------------------------------- */

double ctl_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int ctl_fail(const char *what, const struct ec_status *st)
{
	fprintf(stderr, "enginectl: %s: %s: %s\n", what, ec_code_name(st->code), st->message);
	return 1;
}

struct ec_client *ctl_connect(void)
{
	struct ec_client *c = NULL;
	struct ec_status st;

	ctl_sec.token = getenv("ENGINED_TOKEN");
	if (ctl_sec.token && !ctl_sec.token[0])
		ctl_sec.token = NULL;
	if (ec_connect_opts(ctl_addr, &ctl_sec, &c, &st)) {
		ctl_fail("connect", &st);
		exit(1);
	}
	if (ctl_timeout_s > 0)
		ec_set_timeout_ms(c, (int64_t)(ctl_timeout_s * 1000));
	ec_set_retries(c, ctl_retries, 200);
	return c;
}
