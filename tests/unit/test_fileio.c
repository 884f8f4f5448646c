/* test_fileio.c — engines/io/fileio.h: io_read_file (regular files, empty,
 * at and over the cap, pipes that need the buffer to grow, endless
 * /dev/zero, missing files, directories) and io_write_full. Linked against
 * the io library alone (the client links nothing more). */
#include "check_run.h"
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/fileio.h"

static char dir[64];
static char *const sentinel = (char *)"untouched";

static void make_dir(void)
{
	strcpy(dir, "/tmp/test_fileio.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_dir(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

static const char *path_of(const char *name)
{
	static char buf[2][128];
	static int k;

	k ^= 1;
	snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
	return buf[k];
}

/* Write n bytes of p to dir/name with io_write_full. */
static const char *make_file(const char *name, const void *p, size_t n)
{
	const char *path = path_of(name);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(io_write_full(fd, p, n), 0);
	ck_assert_int_eq(close(fd), 0);
	return path;
}

START_TEST(regular_file)
{
	static const char text[] = "{\"a\": 1}\n\0binary\xff tail";   /* a NUL inside */
	const size_t n = sizeof(text) - 1;
	const char *path = make_file("config.json", text, n);
	char *buf = NULL;
	size_t len = 12345;

	ck_assert_int_eq(io_read_file(path, 1 << 20, &buf, &len), 0);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(len, n);
	ck_assert_uint_eq(len, 22);
	ck_assert_int_eq(memcmp(buf, text, n), 0);
	ck_assert_int_eq(buf[len], '\0');
	ck_assert_str_eq(buf, "{\"a\": 1}\n");          /* up to the inner NUL */
	free(buf);

	/* ret_len may be NULL. */
	buf = NULL;
	ck_assert_int_eq(io_read_file(path, 1 << 20, &buf, NULL), 0);
	ck_assert_int_eq(memcmp(buf, text, n), 0);
	free(buf);
}
END_TEST

START_TEST(empty_file)
{
	const char *path = make_file("empty", "", 0);
	char *buf = NULL;
	size_t len = 99;

	ck_assert_int_eq(io_read_file(path, 16, &buf, &len), 0);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(len, 0);
	ck_assert_int_eq(buf[0], '\0');
	free(buf);
	/* Even with a cap of 0 bytes. */
	buf = NULL;
	ck_assert_int_eq(io_read_file(path, 0, &buf, &len), 0);
	ck_assert_uint_eq(len, 0);
	ck_assert_str_eq(buf, "");
	free(buf);
}
END_TEST

START_TEST(cap)
{
	char data[1000];
	const char *path;
	char *buf = sentinel;
	size_t len = 7, i;

	for (i = 0; i < sizeof(data); i++)
		data[i] = (char)('a' + i % 26);
	path = make_file("thousand", data, sizeof(data));
	/* Exactly at the cap: read. */
	ck_assert_int_eq(io_read_file(path, 1000, &buf, &len), 0);
	ck_assert_uint_eq(len, 1000);
	ck_assert_int_eq(memcmp(buf, data, 1000), 0);
	ck_assert_int_eq(buf[1000], '\0');
	free(buf);
	/* One byte over: refused, outputs untouched. */
	buf = sentinel;
	len = 7;
	ck_assert_int_eq(io_read_file(path, 999, &buf, &len), -EFBIG);
	ck_assert_ptr_eq(buf, sentinel);
	ck_assert_uint_eq(len, 7);
	ck_assert_int_eq(io_read_file(path, 0, &buf, &len), -EFBIG);
	ck_assert_ptr_eq(buf, sentinel);
	/* An endless source: stops after cap + 1 bytes. */
	ck_assert_int_eq(io_read_file("/dev/zero", 1 << 20, &buf, &len), -EFBIG);
	ck_assert_ptr_eq(buf, sentinel);
	ck_assert_uint_eq(len, 7);
}
END_TEST

/* A pipe (no size known): the buffer grows from 4 KiB; over the cap after
 * reading cap + 1 bytes. */
START_TEST(pipe_source)
{
	char data[20000], name[32];
	int fds[2];
	char *buf = sentinel;
	size_t len = 0, i;

	for (i = 0; i < sizeof(data); i++)
		data[i] = (char)(i * 7 + 1);
	ck_assert_int_eq(pipe(fds), 0);
	ck_assert_int_eq(io_write_full(fds[1], data, sizeof(data)), 0);   /* < 64 KiB */
	ck_assert_int_eq(close(fds[1]), 0);
	snprintf(name, sizeof(name), "/dev/fd/%d", fds[0]);
	ck_assert_int_eq(io_read_file(name, 1 << 20, &buf, &len), 0);
	ck_assert_uint_eq(len, sizeof(data));
	ck_assert_int_eq(memcmp(buf, data, sizeof(data)), 0);
	ck_assert_int_eq(buf[len], '\0');
	free(buf);
	ck_assert_int_eq(close(fds[0]), 0);

	ck_assert_int_eq(pipe(fds), 0);
	ck_assert_int_eq(io_write_full(fds[1], data, sizeof(data)), 0);
	ck_assert_int_eq(close(fds[1]), 0);
	snprintf(name, sizeof(name), "/dev/fd/%d", fds[0]);
	buf = sentinel;
	ck_assert_int_eq(io_read_file(name, 10000, &buf, &len), -EFBIG);
	ck_assert_ptr_eq(buf, sentinel);
	ck_assert_int_eq(close(fds[0]), 0);
}
END_TEST

START_TEST(missing_and_directory)
{
	char *buf = sentinel;
	size_t len = 5;

	ck_assert_int_eq(io_read_file(path_of("no-such-file"), 100, &buf, &len), -ENOENT);
	ck_assert_int_eq(io_read_file(path_of("no-such-dir/file"), 100, &buf, &len), -ENOENT);
	ck_assert_int_eq(io_read_file(dir, 100, &buf, &len), -EISDIR);
	ck_assert_ptr_eq(buf, sentinel);
	ck_assert_uint_eq(len, 5);
	/* Unreadable (not for root, who reads anything). */
	if (geteuid() != 0) {
		const char *path = make_file("secret", "x", 1);

		ck_assert_int_eq(chmod(path, 0), 0);
		ck_assert_int_eq(io_read_file(path, 100, &buf, &len), -EACCES);
		ck_assert_ptr_eq(buf, sentinel);
	}
}
END_TEST

START_TEST(write_full_errors)
{
	int fds[2];

	ck_assert_int_eq(io_write_full(-1, "x", 1), -EBADF);
	ck_assert_int_eq(pipe(fds), 0);
	ck_assert_int_eq(close(fds[0]), 0);
	signal(SIGPIPE, SIG_IGN);
	ck_assert_int_eq(io_write_full(fds[1], "x", 1), -EPIPE);
	ck_assert_int_eq(close(fds[1]), 0);
	ck_assert_int_eq(io_write_full(-1, NULL, 0), 0);         /* nothing to write */
}
END_TEST

int main(void)
{
	Suite *s = suite_create("fileio");
	TCase *tc = tcase_create("core");

	tcase_add_unchecked_fixture(tc, make_dir, remove_dir);
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, regular_file);
	tcase_add_test(tc, empty_file);
	tcase_add_test(tc, cap);
	tcase_add_test(tc, pipe_source);
	tcase_add_test(tc, missing_and_directory);
	tcase_add_test(tc, write_full_errors);
	suite_add_tcase(s, tc);
	return check_run(s);
}
