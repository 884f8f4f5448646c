/* test_daemon_paths.c — the daemon's path confinement (daemon/paths.c):
 * pins beneath a root, refusals of escapes through ".." and symlinks, and
 * the result of a save whose pinned directory is removed while in use. */
#include "check_run.h"
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "paths.h"

static char root[256], outside[256];

static void make_roots(void)
{
	char *r;
	struct eng_error err = {0};

	snprintf(root, sizeof(root), "/tmp/engined-paths-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
	snprintf(outside, sizeof(outside), "/tmp/engined-paths-out-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(outside));
	ck_assert_int_eq(paths_prepare_root(root, &r, &err), 0);
	snprintf(root, sizeof(root), "%s", r);
	free(r);
}

static void join(char *out, size_t n, const char *a, const char *b)
{
	ck_assert_int_lt(snprintf(out, n, "%s/%s", a, b), (int)n);
}

START_TEST(pin_parent_creates_beneath_the_root)
{
	struct paths_pin pin = { .fd = -1 };
	struct eng_error err = {0};
	char p[512];
	struct stat st;

	make_roots();
	ck_assert_int_eq(paths_pin(root, "a/b/ck", "path", PIN_PARENT_CREATE, &pin, &err), 0);
	ck_assert_str_eq(pin.shown, "a/b");
	join(p, sizeof(p), root, "a/b");
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert(S_ISDIR(st.st_mode));
	ck_assert_ptr_nonnull(strstr(pin.path, "/ck"));
	paths_unpin(&pin);
	ck_assert_int_eq(pin.fd, -1);
}
END_TEST

START_TEST(escapes_are_refused)
{
	struct paths_pin pin = { .fd = -1 };
	struct eng_error err = {0};
	char link[512];

	make_roots();
	join(link, sizeof(link), root, "out");
	ck_assert_int_eq(symlink(outside, link), 0);
	ck_assert_int_eq(paths_pin(root, "../x", "path", PIN_PARENT_CREATE, &pin, &err), -EPERM);
	eng_error_clear(&err);
	ck_assert_int_eq(paths_pin(root, "/etc", "path", PIN_DIR, &pin, &err), -EPERM);
	eng_error_clear(&err);
	ck_assert_int_eq(paths_pin(root, "out/x", "path", PIN_PARENT_CREATE, &pin, &err), -EPERM);
	ck_assert_ptr_nonnull(strstr(err.msg, "path: "));
	eng_error_clear(&err);
	ck_assert_int_eq(paths_pin(root, "out", "path", PIN_DIR, &pin, &err), -EPERM);
	eng_error_clear(&err);
	ck_assert_int_eq(paths_pin(root, "none", "path", PIN_DIR, &pin, &err), -ENOENT);
	ck_assert_int_eq(pin.fd, -1);
}
END_TEST

/* A directory removed between the pin and its use (a rename replaced it):
 * the result is NOT_FOUND naming the directory, whatever the inner code
 * said; other failures keep their code with the descriptor path replaced. */
START_TEST(vanished_directory_is_not_found)
{
	struct paths_pin pin = { .fd = -1 };
	struct eng_error err = {0};
	char dir[512], msg[600];

	make_roots();
	ck_assert_int_eq(paths_pin(root, "run/ck", "path", PIN_PARENT_CREATE, &pin, &err), 0);
	snprintf(msg, sizeof(msg), "%s: open: Permission denied", pin.path);
	eng_fail(&err, -EACCES, "%s", msg);
	ck_assert_int_eq(paths_pin_result(&pin, -EACCES, &err), -EACCES);
	ck_assert_str_eq(err.msg, "<root>/run/ck: open: Permission denied");
	eng_error_clear(&err);
	ck_assert_int_eq(paths_pin_result(&pin, 0, &err), 0);

	join(dir, sizeof(dir), root, "run");
	ck_assert_int_eq(rmdir(dir), 0);
	eng_fail(&err, -ENOENT, "%s/.ck.tmp: mkdir: No such file or directory", pin.path);
	ck_assert_int_eq(paths_pin_result(&pin, -ENOENT, &err), -ENOENT);
	ck_assert_str_eq(err.msg, "path: the directory 'run' was removed or replaced while in "
			 "use; nothing was written outside the root");
	paths_unpin(&pin);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("daemon_paths");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, pin_parent_creates_beneath_the_root);
	tcase_add_test(tc, escapes_are_refused);
	tcase_add_test(tc, vanished_directory_is_not_found);
	suite_add_tcase(s, tc);
	return check_run(s);
}
