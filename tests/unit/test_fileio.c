/* test_fileio.c — engines/include/io/fileio.h: io_read_file (regular files, empty,
 * at and over the cap, pipes that need the buffer to grow, endless
 * /dev/zero, missing files, directories), io_write_full, and the open that
 * follows no symlink (io_openat, io_open_file, io_read_file_at: symlinks
 * to files and directories, inside and outside, dangling ones with
 * O_CREAT, "..", absolute paths, FIFOs), with openat2 and with the walk
 * of older kernels; file_xxh64 against libxxhash's one-shot XXH64 of the
 * same bytes, below and above the size from which a second thread reads
 * the file's second half ahead. Linked against the io library alone (the
 * client links nothing more). */
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

#include <xxhash.h>

#include "io/fileio.h"
#include "io/safetensors.h"

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

/* A tree for the symlink tests: dir/nf/{f, sub/g, fifo, in-link -> f,
 * sub-link -> sub, out-link -> ../outside, dangling -> ../made-outside,
 * dir-out -> ..}, dir/outside, and dir/alias -> nf. */
static void make_tree(void)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd),
		 "cd '%s' && rm -rf nf outside made-outside alias && mkdir -p nf/sub && "
		 "printf inside > nf/f && printf deep > nf/sub/g && printf secret > outside && "
		 "mkfifo nf/fifo && ln -s f nf/in-link && ln -s sub nf/sub-link && "
		 "ln -s ../outside nf/out-link && ln -s ../made-outside nf/dangling && "
		 "ln -s .. nf/dir-out && ln -s nf alias", dir);
	ck_assert_int_eq(system(cmd), 0);
}

static void expect_content(int fd, const char *want)
{
	char buf[64];
	ssize_t n;

	ck_assert_int_ge(fd, 0);
	n = read(fd, buf, sizeof(buf) - 1);
	ck_assert_int_ge(n, 0);
	buf[n] = '\0';
	ck_assert_str_eq(buf, want);
	ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	ck_assert(!(fcntl(fd, F_GETFL) & O_NONBLOCK));
	close(fd);
}

START_TEST(openat_refuses_symlinks)
{
	struct stat st;
	char *buf = sentinel;
	int dfd, fd;

	io_openat_force_walk(_i == 1);   /* 0: openat2, 1: the walk */
	make_tree();
	dfd = open(path_of("nf"), O_PATH | O_DIRECTORY);
	ck_assert_int_ge(dfd, 0);

	/* Plain files and directories beneath the descriptor. */
	expect_content(io_openat(dfd, "f", O_RDONLY, 0), "inside");
	expect_content(io_openat(dfd, "sub/g", O_RDONLY, 0), "deep");
	expect_content(io_openat(dfd, "./sub//g", O_RDONLY, 0), "deep");
	fd = io_openat(dfd, "sub", O_RDONLY | O_DIRECTORY, 0);
	ck_assert_int_ge(fd, 0);
	close(fd);
	fd = io_openat(dfd, ".", O_PATH | O_DIRECTORY, 0);
	ck_assert_int_ge(fd, 0);
	close(fd);

	/* Every symlink is refused, wherever it points, whatever the flags. */
	ck_assert_int_eq(io_openat(dfd, "in-link", O_RDONLY, 0), -ELOOP);
	ck_assert_int_eq(io_openat(dfd, "out-link", O_RDONLY, 0), -ELOOP);
	ck_assert_int_eq(io_openat(dfd, "out-link", O_PATH, 0), -ELOOP);
	ck_assert_int_eq(io_openat(dfd, "out-link", O_WRONLY | O_TRUNC, 0), -ELOOP);
	ck_assert_int_eq(io_openat(dfd, "sub-link/g", O_RDONLY, 0), -ELOOP);
	ck_assert_int_eq(io_openat(dfd, "sub-link", O_RDONLY | O_DIRECTORY, 0), -ELOOP);
	ck_assert_int_eq(io_openat(dfd, "sub-link", O_PATH | O_DIRECTORY, 0), -ELOOP);
	ck_assert_int_eq(io_openat(dfd, "dir-out/outside", O_RDONLY, 0), -ELOOP);
	/* A dangling symlink: O_CREAT creates nothing at its target. */
	ck_assert_int_eq(io_openat(dfd, "dangling", O_WRONLY | O_CREAT, 0644), -ELOOP);
	ck_assert_int_lt(io_openat(dfd, "dangling", O_WRONLY | O_CREAT | O_EXCL, 0644), 0);
	ck_assert_int_eq(lstat(path_of("made-outside"), &st), -1);
	/* The outside file was not truncated through out-link. */
	ck_assert_int_eq(stat(path_of("outside"), &st), 0);
	ck_assert_int_eq(st.st_size, 6);

	/* Out of the directory by name. */
	ck_assert_int_eq(io_openat(dfd, "../outside", O_RDONLY, 0), -EXDEV);
	ck_assert_int_eq(io_openat(dfd, "sub/../f", O_RDONLY, 0), -EXDEV);
	ck_assert_int_eq(io_openat(dfd, "..", O_PATH | O_DIRECTORY, 0), -EXDEV);
	ck_assert_int_eq(io_openat(dfd, "/etc/passwd", O_RDONLY, 0), -EXDEV);
	ck_assert_int_eq(io_openat(dfd, "", O_RDONLY, 0), -ENOENT);
	ck_assert_int_eq(io_openat(dfd, "missing", O_RDONLY, 0), -ENOENT);
	ck_assert_int_eq(io_openat(dfd, "f/x", O_RDONLY, 0), -ENOTDIR);

	/* A FIFO does not block the open (nobody writes to it). */
	fd = io_openat(dfd, "fifo", O_RDONLY, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert(S_ISFIFO(st.st_mode));
	close(fd);

	/* Creating inside works; relative to AT_FDCWD too. */
	fd = io_openat(dfd, "new", O_WRONLY | O_CREAT | O_EXCL, 0600);
	ck_assert_int_ge(fd, 0);
	close(fd);
	ck_assert_int_eq(stat(path_of("nf/new"), &st), 0);
	ck_assert_int_eq(st.st_mode & 0777, 0600);
	ck_assert_int_eq(chdir(dir), 0);
	expect_content(io_openat(AT_FDCWD, "nf/f", O_RDONLY, 0), "inside");
	ck_assert_int_eq(io_openat(AT_FDCWD, "alias/f", O_RDONLY, 0), -ELOOP);

	/* io_open_file: the directory as named (through alias), the file
	 * never a symlink. */
	expect_content(io_open_file(path_of("alias/f"), O_RDONLY, 0), "inside");
	expect_content(io_open_file("nf/f", O_RDONLY, 0), "inside");
	ck_assert_int_eq(io_open_file(path_of("alias/out-link"), O_RDONLY, 0), -ELOOP);
	ck_assert_int_eq(io_open_file(path_of("nf/in-link"), O_RDONLY, 0), -ELOOP);
	ck_assert_int_eq(io_open_file(path_of("nf/none/f"), O_RDONLY, 0), -ENOENT);

	/* io_read_file_at reads files, refuses symlinks; io_read_file, for
	 * files an operator names, follows them. */
	ck_assert_int_eq(io_read_file_at(dfd, "sub/g", 100, &buf, NULL), 0);
	ck_assert_str_eq(buf, "deep");
	free(buf);
	buf = sentinel;
	ck_assert_int_eq(io_read_file_at(dfd, "out-link", 100, &buf, NULL), -ELOOP);
	ck_assert_int_eq(io_read_file_at(dfd, "../outside", 100, &buf, NULL), -EXDEV);
	ck_assert_ptr_eq(buf, sentinel);
	ck_assert_int_eq(io_read_file(path_of("nf/out-link"), 100, &buf, NULL), 0);
	ck_assert_str_eq(buf, "secret");
	free(buf);
	close(dfd);
	io_openat_force_walk(false);
}
END_TEST

/* Sizes around xxh.c's XXH_AHEAD_MIN (64 MiB), the largest not a multiple
 * of its 8 MiB reads. */
static const size_t xxh_sizes[] = { 0, 1, 3u << 20, (64u << 20) - 1, (64u << 20) + 12345 };

START_TEST(xxh64_of_whole_files)
{
	size_t n = xxh_sizes[_i];
	unsigned char *buf = malloc(n ? n : 1);
	char path[96];
	uint64_t got = 0, x = 0x9e3779b97f4a7c15ull;
	struct eng_error err = { 0 };
	int fd;

	ck_assert_ptr_nonnull(buf);
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		buf[i] = (unsigned char)x;
	}
	snprintf(path, sizeof(path), "%s/hash.bin", dir);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(io_write_full(fd, buf, n), 0);
	close(fd);
	ck_assert_int_eq(file_xxh64(path, &got, &err), 0);
	ck_assert_uint_eq(got, XXH64(buf, n, 0));
	unlink(path);
	free(buf);
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
	tcase_add_loop_test(tc, openat_refuses_symlinks, 0, 2);
	tcase_add_loop_test(tc, xxh64_of_whole_files, 0,
			    (int)(sizeof(xxh_sizes) / sizeof(xxh_sizes[0])));
	suite_add_tcase(s, tc);
	return check_run(s);
}
