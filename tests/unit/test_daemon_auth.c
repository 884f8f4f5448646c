/* test_daemon_auth.c — the daemon's bearer tokens (daemon/auth.c): the
 * token file (names, line-N names, scopes, comments), its refusals with
 * file:line, the mode check, auth_check of the authorization header, tokens
 * off (no file) and auth_reload keeping the old tokens on a bad file. */
#include "check_run.h"
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"

static char dir[256];
static char path[512];

#define TOK_A "0123456789abcdef0123456789abcdef"    /* 32 characters */
#define TOK_B "ffffffffffffffffffffffffffffffff"
#define TOK_C "cccccccccccccccccccc"                /* 20 */
#define TOK_D "dddddddddddddddd"                    /* 16: the shortest */
#define TOK_E "E-e_e.e!e~e%e+e=e/e"                 /* punctuation is allowed */

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/engined-auth-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[600];

	if (!d)
		return;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		if (unlink(p) < 0)
			rmdir(p);
	}
	closedir(d);
	rmdir(dir);
}

/* Write DIR/name with `mode` (set explicitly, whatever the umask); the path
 * is left in `path`. Rewriting an existing file keeps nothing of it. */
static const char *write_tokens(const char *name, const char *text, mode_t mode)
{
	int fd;
	size_t n = strlen(text);

	ck_assert_int_lt(snprintf(path, sizeof(path), "%s/%s", dir, name), (int)sizeof(path));
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, n), (ssize_t)n);
	ck_assert_int_eq(fchmod(fd, mode), 0);
	ck_assert_int_eq(close(fd), 0);
	return path;
}

/* auth_tokens_load of `text` expecting `code` and "PATH" + rest. */
static void expect_load_error(const char *text, mode_t mode, int code, const char *rest)
{
	struct auth_tokens *t = NULL;
	struct eng_error err = {0};
	char want[ENG_ERROR_MSG_MAX + 600];

	write_tokens("bad", text, mode);
	ck_assert_int_eq(auth_tokens_load(path, &t, &err), code);
	ck_assert_ptr_null(t);
	ck_assert_int_eq(err.code, code);
	snprintf(want, sizeof(want), "%s%s", path, rest);
	ck_assert_str_eq(err.msg, want);
}

static void expect_level(struct auth *a, const char *header, enum auth_level level,
			 const char *name)
{
	char got[AUTH_NAME_MAX];

	memcpy(got, "junk", 5);
	ck_assert_msg(auth_check(a, header, got) == level, "'%s': level %d expected",
		      header ? header : "(null)", (int)level);
	ck_assert_str_eq(got, name);
}

static const char good_file[] =
	"# engined tokens\n"                                  /* 1 */
	"   # an indented comment\n"                          /* 2 */
	"\n"                                                  /* 3 */
	"alice:" TOK_A "\n"                                   /* 4 */
	TOK_B "\n"                                            /* 5: line-5 */
	"ci.bot-1_x:" TOK_C " read-only\n"                    /* 6 */
	"  \t \n"                                             /* 7 */
	"\t" TOK_D "\tread-only\r\n"                          /* 8: line-8, CRLF */
	"ops:" TOK_E "   full\n";                             /* 9 */

START_TEST(load_a_valid_file)
{
	struct auth_tokens *t = NULL;
	struct eng_error err = {0};
	struct auth a;

	write_tokens("tokens", good_file, 0600);
	ck_assert_int_eq(auth_tokens_load(path, &t, &err), 0);
	ck_assert_int_eq(err.code, 0);
	ck_assert_int_eq(auth_tokens_count(t), 5);
	auth_tokens_free(t);
	ck_assert_int_eq(auth_tokens_count(NULL), 0);
	auth_tokens_free(NULL);

	/* Group-readable is allowed; only others are refused. */
	write_tokens("tokens", good_file, 0640);
	ck_assert_int_eq(auth_init(&a, path, &err), 0);
	ck_assert(auth_enabled(&a));
	expect_level(&a, "Bearer " TOK_A, AUTH_FULL, "alice");
	expect_level(&a, "Bearer " TOK_B, AUTH_FULL, "line-5");
	expect_level(&a, "Bearer " TOK_C, AUTH_READ, "ci.bot-1_x");
	expect_level(&a, "Bearer " TOK_D, AUTH_READ, "line-8");
	expect_level(&a, "Bearer " TOK_E, AUTH_FULL, "ops");
	auth_fini(&a);
	ck_assert(!auth_enabled(&a));
}
END_TEST

START_TEST(load_refusals_name_file_and_line)
{
	char name64[AUTH_NAME_MAX + 1], longtok[1100], text[2400];

	expect_load_error("alice:" TOK_A "\nbob:0123456789abcde\n", 0600, -EINVAL,
			  ":2: token of 15 characters (16 to 1024 required; e.g. openssl rand "
			  "-hex 32)");
	expect_load_error("0123456789abcde read-only\n", 0600, -EINVAL,
			  ":1: token of 15 characters (16 to 1024 required; e.g. openssl rand "
			  "-hex 32)");
	expect_load_error("bob:\n", 0600, -EINVAL,
			  ":1: token of 0 characters (16 to 1024 required; e.g. openssl rand "
			  "-hex 32)");
	memset(longtok, 'z', 1025);
	longtok[1025] = '\0';
	snprintf(text, sizeof(text), "# long\n%s\n", longtok);
	expect_load_error(text, 0600, -EINVAL,
			  ":2: token of 1025 characters (16 to 1024 required; e.g. openssl rand "
			  "-hex 32)");
	memset(text, 'z', 2300);
	text[2300] = '\0';
	expect_load_error(text, 0600, -EINVAL, ":1: line too long");

	expect_load_error("b@d:" TOK_A "\n", 0600, -EINVAL,
			  ":1: token name must be 1-63 characters of [A-Za-z0-9_.-]");
	expect_load_error("# c\n:" TOK_A "\n", 0600, -EINVAL,
			  ":2: token name must be 1-63 characters of [A-Za-z0-9_.-]");
	memset(name64, 'n', 64);
	name64[64] = '\0';
	snprintf(text, sizeof(text), "%s:%s\n", name64, TOK_A);
	expect_load_error(text, 0600, -EINVAL,
			  ":1: token name must be 1-63 characters of [A-Za-z0-9_.-]");

	expect_load_error(TOK_A " readonly\n", 0600, -EINVAL,
			  ":1: scope 'readonly' is not full or read-only");
	expect_load_error("x:" TOK_A " FULL\n", 0600, -EINVAL,
			  ":1: scope 'FULL' is not full or read-only");
	expect_load_error("x:" TOK_A " read-only # note\n", 0600, -EINVAL,
			  ":1: too many fields (expected [NAME:]TOKEN [full|read-only] "
			  "[adapters=A,B])");
	/* A third field once made the scope be skipped: a read-only token
	 * with anything after its scope loaded as a full one. */
	expect_load_error("ro:" TOK_A " read-only extra\n", 0600, -EINVAL,
			  ":1: too many fields (expected [NAME:]TOKEN [full|read-only] "
			  "[adapters=A,B])");
	expect_load_error("x:" TOK_A " bogus-scope x\n", 0600, -EINVAL,
			  ":1: too many fields (expected [NAME:]TOKEN [full|read-only] "
			  "[adapters=A,B])");
	expect_load_error("x:y:" TOK_A "\n", 0600, -EINVAL,
			  ":1: token has a space, ':' or a control character");
	expect_load_error("x:" TOK_A "\x01\n", 0600, -EINVAL,
			  ":1: token has a space, ':' or a control character");
	expect_load_error("alice:" TOK_A "\n" TOK_B "\nbob:" TOK_A " read-only\n", 0600, -EINVAL,
			  ":3: same token as 'alice'");

	expect_load_error("", 0600, -EINVAL,
			  ": no token (an empty file would refuse every call)");
	expect_load_error("# only comments\n\n  \n", 0600, -EINVAL,
			  ": no token (an empty file would refuse every call)");

	/* Others may not read (or write) it. */
	expect_load_error("alice:" TOK_A "\n", 0644, -EPERM,
			  ": readable or writable by others (mode 644); chmod o-rwx it");
	expect_load_error("alice:" TOK_A "\n", 0602, -EPERM,
			  ": readable or writable by others (mode 602); chmod o-rwx it");
}
END_TEST

START_TEST(load_missing_and_not_regular)
{
	struct auth_tokens *t = NULL;
	struct eng_error err = {0};
	char p[600], want[ENG_ERROR_MSG_MAX + 700];

	snprintf(p, sizeof(p), "%s/absent", dir);
	ck_assert_int_eq(auth_tokens_load(p, &t, &err), -ENOENT);
	snprintf(want, sizeof(want), "%s: cannot open: No such file or directory", p);
	ck_assert_str_eq(err.msg, want);
	ck_assert_ptr_null(t);
	eng_error_clear(&err);

	snprintf(p, sizeof(p), "%s/sub", dir);
	ck_assert_int_eq(mkdir(p, 0700), 0);
	ck_assert_int_eq(auth_tokens_load(p, &t, &err), -EINVAL);
	snprintf(want, sizeof(want), "%s: not a regular file", p);
	ck_assert_str_eq(err.msg, want);
	ck_assert_ptr_null(t);
}
END_TEST

START_TEST(check_the_header)
{
	struct auth a;
	struct eng_error err = {0};

	write_tokens("tokens", "alice:" TOK_A "\nro:" TOK_C " read-only\n", 0600);
	ck_assert_int_eq(auth_init(&a, path, &err), 0);
	expect_level(&a, "Bearer " TOK_A, AUTH_FULL, "alice");
	expect_level(&a, "bearer " TOK_A, AUTH_FULL, "alice");   /* the scheme's case */
	expect_level(&a, "BEARER   " TOK_A, AUTH_FULL, "alice"); /* spaces before */
	expect_level(&a, "Bearer " TOK_C, AUTH_READ, "ro");

	expect_level(&a, "Bearer " TOK_B, AUTH_NONE, "");        /* unknown */
	expect_level(&a, "Bearer 0123456789abcdef0123456789abcdeF", AUTH_NONE, "");
	expect_level(&a, "Bearer 0123456789abcdef0123456789abcde", AUTH_NONE, "");   /* prefix */
	expect_level(&a, "Bearer " TOK_A "0", AUTH_NONE, "");    /* longer */
	expect_level(&a, "Bearer " TOK_A " ", AUTH_NONE, "");    /* a trailing space */
	expect_level(&a, "Bearer alice:" TOK_A, AUTH_NONE, "");  /* the name is not sent */
	expect_level(&a, NULL, AUTH_NONE, "");                   /* no header */
	expect_level(&a, "", AUTH_NONE, "");
	expect_level(&a, TOK_A, AUTH_NONE, "");                  /* no scheme */
	expect_level(&a, "Basic " TOK_A, AUTH_NONE, "");
	expect_level(&a, "Bearer" TOK_A, AUTH_NONE, "");
	expect_level(&a, "Bearer\t" TOK_A, AUTH_NONE, "");
	expect_level(&a, "Bearer ", AUTH_NONE, "");
	expect_level(&a, "Bearer     ", AUTH_NONE, "");
	auth_fini(&a);
}
END_TEST

/* Tokens limited to adapters: the list as auth_check_tenant hands it out,
 * what auth_adapter_allowed makes of it, and the file's refusals. */
START_TEST(tokens_limited_to_adapters)
{
	struct auth a;
	struct eng_error err = {0};
	char name[AUTH_NAME_MAX], list[AUTH_ADAPTERS_MAX], text[AUTH_ADAPTERS_MAX + 200];

	write_tokens("tokens",
		     "alice:" TOK_A " adapters=a\n"
		     "bob:" TOK_B " read-only adapters=b,b-2.x,B_3\n"
		     "carol:" TOK_C " adapters=c full\n"
		     "ops:" TOK_D "\n", 0600);
	ck_assert_int_eq(auth_init(&a, path, &err), 0);
	memcpy(list, "junk", 5);
	ck_assert_int_eq(auth_check_tenant(&a, "Bearer " TOK_A, name, list), AUTH_FULL);
	ck_assert_str_eq(name, "alice");
	ck_assert_str_eq(list, "a");
	ck_assert_int_eq(auth_check_tenant(&a, "Bearer " TOK_B, name, list), AUTH_READ);
	ck_assert_str_eq(list, "b,b-2.x,B_3");
	ck_assert_int_eq(auth_check_tenant(&a, "Bearer " TOK_C, name, list), AUTH_FULL);
	ck_assert_str_eq(list, "c");
	ck_assert_int_eq(auth_check_tenant(&a, "Bearer " TOK_D, name, list), AUTH_FULL);
	ck_assert_str_eq(list, "");
	memcpy(list, "junk", 5);
	ck_assert_int_eq(auth_check_tenant(&a, "Bearer " TOK_E, name, list), AUTH_NONE);
	ck_assert_str_eq(list, "");
	expect_level(&a, "Bearer " TOK_B, AUTH_READ, "bob");
	auth_fini(&a);

	ck_assert(auth_adapter_allowed("", "anything"));
	ck_assert(auth_adapter_allowed("b,b-2.x,B_3", "b"));
	ck_assert(auth_adapter_allowed("b,b-2.x,B_3", "b-2.x"));
	ck_assert(auth_adapter_allowed("b,b-2.x,B_3", "B_3"));
	ck_assert(!auth_adapter_allowed("b,b-2.x,B_3", "b-2"));
	ck_assert(!auth_adapter_allowed("b,b-2.x,B_3", "B"));
	ck_assert(!auth_adapter_allowed("b,b-2.x,B_3", "b,b-2.x"));
	ck_assert(!auth_adapter_allowed("a", ""));
	ck_assert(!auth_adapter_allowed("ab", "a"));
	ck_assert(!auth_adapter_allowed("a", "ab"));

	expect_load_error("x:" TOK_A " adapters=\n", 0600, -EINVAL,
			  ":1: adapters= takes 1 to 1023 characters");
	expect_load_error("x:" TOK_A " adapters=a,,b\n", 0600, -EINVAL,
			  ":1: adapters=: '' is not an adapter name (1-64 characters of "
			  "[A-Za-z0-9_.-], not starting with '.')");
	expect_load_error("x:" TOK_A " adapters=a,.b\n", 0600, -EINVAL,
			  ":1: adapters=: '.b' is not an adapter name (1-64 characters of "
			  "[A-Za-z0-9_.-], not starting with '.')");
	expect_load_error("x:" TOK_A " adapters=a/b\n", 0600, -EINVAL,
			  ":1: adapters=: 'a/b' is not an adapter name (1-64 characters of "
			  "[A-Za-z0-9_.-], not starting with '.')");
	expect_load_error("x:" TOK_A " adapters=a,\n", 0600, -EINVAL,
			  ":1: adapters=: ends with ','");
	expect_load_error("x:" TOK_A " adapters=a adapters=b\n", 0600, -EINVAL,
			  ":1: adapters= given twice");
	expect_load_error("x:" TOK_A " full read-only\n", 0600, -EINVAL,
			  ":1: too many fields (expected [NAME:]TOKEN [full|read-only] "
			  "[adapters=A,B])");
	expect_load_error("x:" TOK_A " adapters=a readonly\n", 0600, -EINVAL,
			  ":1: scope 'readonly' is not full or read-only");
	snprintf(text, sizeof(text), "x:" TOK_A " adapters=%065d\n", 0);
	expect_load_error(text, 0600, -EINVAL,
			  ":1: adapters=: "
			  "'00000000000000000000000000000000000000000000000000000000000000000' "
			  "is not an adapter name (1-64 characters of [A-Za-z0-9_.-], not "
			  "starting with '.')");
}
END_TEST

START_TEST(no_token_file_allows_everything)
{
	struct auth a;
	struct eng_error err = {0};

	ck_assert_int_eq(auth_init(&a, NULL, &err), 0);
	ck_assert(!auth_enabled(&a));
	expect_level(&a, NULL, AUTH_FULL, "");
	expect_level(&a, "Bearer " TOK_A, AUTH_FULL, "");
	expect_level(&a, "garbage", AUTH_FULL, "");
	ck_assert_int_eq(auth_reload(&a, &err), 0);
	expect_level(&a, NULL, AUTH_FULL, "");
	auth_fini(&a);
}
END_TEST

/* A file that does not load at start: the error, and nothing is let in
 * meanwhile (the daemon refuses to start on it). */
START_TEST(bad_file_at_init_refuses_all)
{
	struct auth a;
	struct eng_error err = {0};
	char want[ENG_ERROR_MSG_MAX + 600];

	write_tokens("tokens", "alice:" TOK_A "\n", 0604);
	ck_assert_int_eq(auth_init(&a, path, &err), -EPERM);
	snprintf(want, sizeof(want), "%s: readable or writable by others (mode 604); chmod o-rwx it",
		 path);
	ck_assert_str_eq(err.msg, want);
	ck_assert(auth_enabled(&a));
	expect_level(&a, "Bearer " TOK_A, AUTH_NONE, "");
	expect_level(&a, NULL, AUTH_NONE, "");
	auth_fini(&a);
}
END_TEST

START_TEST(reload_keeps_old_tokens_on_a_bad_file)
{
	struct auth a;
	struct eng_error err = {0};
	char want[ENG_ERROR_MSG_MAX + 600];

	write_tokens("tokens", "alice:" TOK_A "\n", 0600);
	ck_assert_int_eq(auth_init(&a, path, &err), 0);
	expect_level(&a, "Bearer " TOK_A, AUTH_FULL, "alice");

	/* A bad line: refused, alice stays. */
	write_tokens("tokens", "alice:" TOK_A "\nbob:short\n", 0600);
	ck_assert_int_eq(auth_reload(&a, &err), -EINVAL);
	snprintf(want, sizeof(want), "%s:2: token of 5 characters (16 to 1024 required; e.g. "
		 "openssl rand -hex 32)", path);
	ck_assert_str_eq(err.msg, want);
	expect_level(&a, "Bearer " TOK_A, AUTH_FULL, "alice");
	eng_error_clear(&err);

	/* Readable by others: refused, alice stays. */
	write_tokens("tokens", "bob:" TOK_B "\n", 0644);
	ck_assert_int_eq(auth_reload(&a, &err), -EPERM);
	expect_level(&a, "Bearer " TOK_A, AUTH_FULL, "alice");
	expect_level(&a, "Bearer " TOK_B, AUTH_NONE, "");
	eng_error_clear(&err);

	/* Gone: refused, alice stays. */
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(auth_reload(&a, &err), -ENOENT);
	expect_level(&a, "Bearer " TOK_A, AUTH_FULL, "alice");
	eng_error_clear(&err);

	/* Good: the new set replaces the old one whole; the count comes back. */
	write_tokens("tokens", "bob:" TOK_B "\nalice:" TOK_C " read-only\n", 0600);
	ck_assert_int_eq(auth_reload(&a, &err), 2);
	expect_level(&a, "Bearer " TOK_A, AUTH_NONE, "");
	expect_level(&a, "Bearer " TOK_B, AUTH_FULL, "bob");
	expect_level(&a, "Bearer " TOK_C, AUTH_READ, "alice");
	auth_fini(&a);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("daemon_auth");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, load_a_valid_file);
	tcase_add_test(tc, load_refusals_name_file_and_line);
	tcase_add_test(tc, load_missing_and_not_regular);
	tcase_add_test(tc, check_the_header);
	tcase_add_test(tc, tokens_limited_to_adapters);
	tcase_add_test(tc, no_token_file_allows_everything);
	tcase_add_test(tc, bad_file_at_init_refuses_all);
	tcase_add_test(tc, reload_keeps_old_tokens_on_a_bad_file);
	suite_add_tcase(s, tc);
	return check_run(s);
}
