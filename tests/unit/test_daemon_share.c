/* test_daemon_share.c — ShareWeights' table and side socket
 * (daemon/share_table.c, share_socket.c): one-time and counted handles,
 * expiry on the time passed in, the two bounds and their messages, the
 * descriptor's ownership on every path (a failed add closes it, free closes
 * the pending ones), and the socket's protocol, mode and file at start and
 * stop. Descriptors are memfds, told apart by inode. */
#include "check_run.h"
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "share_socket.h"
#include "share_table.h"

static int memfd(void)
{
	int fd = memfd_create("test-share", MFD_CLOEXEC);

	ck_assert_int_ge(fd, 0);
	return fd;
}

static bool is_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

static ino_t ino(int fd)
{
	struct stat st;

	ck_assert_int_eq(fstat(fd, &st), 0);
	return st.st_ino;
}

static struct share_table *table(int max_shares, int64_t max_bytes, int64_t ttl_ms)
{
	struct share_limits l = { max_shares, max_bytes, ttl_ms };
	struct share_table *t = NULL;

	ck_assert_int_eq(share_table_new(&l, &t), 0);
	return t;
}

START_TEST(one_use)
{
	struct share_table *t = table(4, 1 << 20, 1000);
	uint8_t h[SHARE_HANDLE_BYTES], h2[SHARE_HANDLE_BYTES];
	struct share_info info;
	struct eng_error err = {0};
	uint64_t id = 0, id2 = 0;
	int fd = memfd(), fd2 = memfd(), got, n;
	int64_t bytes;
	ino_t want = ino(fd);

	ck_assert_int_eq(share_table_add(t, fd, 100, 1, 0, h, &id, &err), 0);
	ck_assert_int_eq(share_table_add(t, fd2, 50, 1, 0, h2, &id2, &err), 0);
	ck_assert_uint_eq(id, 1);
	ck_assert_uint_eq(id2, 2);
	ck_assert_mem_ne(h, h2, SHARE_HANDLE_BYTES);   /* fresh random handles */
	share_table_counts(t, &n, &bytes);
	ck_assert_int_eq(n, 2);
	ck_assert_int_eq(bytes, 150);
	/* A guess one bit off finds nothing and spends nothing. */
	h[15] ^= 1;
	ck_assert_int_eq(share_table_take(t, h, 1, &info), -ENOENT);
	h[15] ^= 1;
	got = share_table_take(t, h, 1, &info);
	ck_assert_int_eq(got, fd);                      /* the table's own, at the last use */
	ck_assert(ino(got) == want);
	ck_assert_uint_eq(info.id, 1);
	ck_assert_int_eq(info.bytes, 100);
	ck_assert_int_eq(info.uses_left, 0);
	close(got);
	ck_assert_int_eq(share_table_take(t, h, 2, &info), -ENOENT);
	share_table_counts(t, &n, &bytes);
	ck_assert_int_eq(n, 1);
	ck_assert_int_eq(bytes, 50);
	share_table_free(t);                            /* closes the pending one */
	ck_assert(!is_open(fd2));
}
END_TEST

START_TEST(counted_uses)
{
	struct share_table *t = table(4, 1 << 20, 1000);
	uint8_t h[SHARE_HANDLE_BYTES];
	struct share_info info;
	struct eng_error err = {0};
	uint64_t id;
	int fd = memfd(), got[3];
	ino_t want = ino(fd);

	ck_assert_int_eq(share_table_add(t, fd, 10, 3, 0, h, &id, &err), 0);
	for (int i = 0; i < 3; i++) {
		got[i] = share_table_take(t, h, 1, &info);
		ck_assert_int_ge(got[i], 0);
		ck_assert(ino(got[i]) == want);         /* one file for every use */
		ck_assert_int_eq(info.uses, 3);
		ck_assert_int_eq(info.uses_left, 2 - i);
	}
	ck_assert_int_ne(got[0], fd);                   /* duplicates before the last */
	ck_assert_int_eq(got[2], fd);
	ck_assert_int_eq(share_table_take(t, h, 1, &info), -ENOENT);
	for (int i = 0; i < 3; i++)
		close(got[i]);
	/* uses outside [1, SHARE_MAX_USES]: refused, the descriptor closed. */
	fd = memfd();
	ck_assert_int_eq(share_table_add(t, fd, 10, 0, 0, h, &id, &err), -EINVAL);
	ck_assert(!is_open(fd));
	share_table_free(t);
}
END_TEST

START_TEST(expiry)
{
	struct share_table *t = table(4, 1 << 20, 100);
	uint8_t h[SHARE_HANDLE_BYTES], h2[SHARE_HANDLE_BYTES];
	struct share_info info;
	struct eng_error err = {0};
	uint64_t id;
	int fd = memfd(), fd2 = memfd(), n;
	int64_t next, bytes;

	ck_assert_int_eq(share_table_add(t, fd, 10, 1, 1000, h, &id, &err), 0);
	ck_assert_int_eq(share_table_add(t, fd2, 20, 1, 1050, h2, &id, &err), 0);
	ck_assert_int_eq(share_table_sweep(t, 1099, &next), 0);
	ck_assert_int_eq(next, 1);
	/* At its expiry a handle is refused, and the entry goes. */
	ck_assert_int_eq(share_table_take(t, h, 1100, &info), -ENOENT);
	ck_assert(!is_open(fd));
	share_table_counts(t, &n, &bytes);
	ck_assert_int_eq(n, 1);
	ck_assert_int_eq(share_table_sweep(t, 1120, &next), 0);
	ck_assert_int_eq(next, 30);
	ck_assert_int_eq(share_table_sweep(t, 1150, &next), 1);
	ck_assert_int_eq(next, -1);
	ck_assert(!is_open(fd2));
	share_table_counts(t, &n, &bytes);
	ck_assert_int_eq(n, 0);
	ck_assert_int_eq(bytes, 0);
	share_table_free(t);
}
END_TEST

START_TEST(bounds)
{
	struct share_table *t = table(2, 1000, 100);
	uint8_t h[SHARE_HANDLE_BYTES];
	struct share_info info;
	struct eng_error err = {0};
	uint64_t id;
	int fd;

	ck_assert_int_eq(share_table_admit(t, 1001, 0, &err), -E2BIG);
	ck_assert_str_eq(err.msg, "share: 1001 bytes with 0 bytes of shares waiting to be "
			 "picked up would pass server.max_share_bytes = 1000");
	eng_error_clear(&err);
	ck_assert_int_eq(share_table_add(t, memfd(), 600, 1, 0, h, &id, &err), 0);
	fd = memfd();
	ck_assert_int_eq(share_table_add(t, fd, 401, 1, 0, h, &id, &err), -E2BIG);
	ck_assert(!is_open(fd));                        /* owned, so closed */
	ck_assert_ptr_nonnull(strstr(err.msg, "with 600 bytes of shares waiting"));
	eng_error_clear(&err);
	ck_assert_int_eq(share_table_add(t, memfd(), 400, 1, 0, h, &id, &err), 0);
	ck_assert_int_eq(share_table_admit(t, 0, 0, &err), -E2BIG);
	ck_assert_str_eq(err.msg, "share: 2 shares are waiting to be picked up "
			 "(server.max_shares = 2); pick them up or let them expire "
			 "(server.share_ttl_s = 0.1 s)");
	/* A pick-up makes room; so does an expiry (swept by the admission). */
	fd = share_table_take(t, h, 0, &info);
	ck_assert_int_ge(fd, 0);
	close(fd);
	eng_error_clear(&err);
	ck_assert_int_eq(share_table_admit(t, 400, 0, &err), 0);
	ck_assert_int_eq(share_table_admit(t, 401, 0, &err), -E2BIG);
	eng_error_clear(&err);
	ck_assert_int_eq(share_table_admit(t, 1000, 100, &err), 0);
	share_table_free(t);
}
END_TEST

/* --- the socket ------------------------------------------------------------- */

static char dir[64], sock_path[96];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/engined-share-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(sock_path, sizeof(sock_path), "%s/s.sock", dir);
}

static void teardown(void)
{
	unlink(sock_path);
	rmdir(dir);
}

/* Send `len` bytes of `data`; the answer's status (-1: closed without
 * one) and its descriptor in *ret_fd (-1: none). */
static int ask(const void *data, size_t len, int *ret_fd)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	char buf[256];
	struct iovec iov = { buf, sizeof(buf) };
	union {
		struct cmsghdr h;
		char space[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space,
			     .msg_controllen = sizeof(ctl.space) };
	struct cmsghdr *c;
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	ssize_t n;

	*ret_fd = -1;
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock_path);
	ck_assert_int_eq(connect(s, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(send(s, data, len, 0), (ssize_t)len);
	n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
	close(s);
	if (n <= 0)
		return -1;
	c = CMSG_FIRSTHDR(&mh);
	if (c && c->cmsg_type == SCM_RIGHTS)
		memcpy(ret_fd, CMSG_DATA(c), sizeof(int));
	return (uint8_t)buf[0];
}

START_TEST(socket_protocol)
{
	struct share_table *t = table(4, 1 << 20, 60000);
	struct share_socket *s = NULL;
	struct eng_error err = {0};
	uint8_t h[SHARE_HANDLE_BYTES];
	struct stat st;
	uint64_t id;
	int fd = memfd(), got;
	ino_t want = ino(fd);

	ck_assert_int_eq(share_socket_start(sock_path, t, &s, &err), 0);
	ck_assert_int_eq(lstat(sock_path, &st), 0);
	ck_assert(S_ISSOCK(st.st_mode));
	ck_assert_int_eq(st.st_mode & 07777, 0660);
	ck_assert_int_eq(share_table_add(t, fd, 4096, 1, share_table_now_ms(), h, &id, &err), 0);
	ck_assert_int_eq(ask(h, 5, &got), SHARE_MALFORMED);
	ck_assert_int_eq(got, -1);
	ck_assert_int_eq(ask("0123456789abcdef", 16, &got), SHARE_UNKNOWN);
	ck_assert_int_eq(ask(h, sizeof(h), &got), SHARE_OK);
	ck_assert_int_ge(got, 0);
	ck_assert(ino(got) == want);
	close(got);
	ck_assert_int_eq(ask(h, sizeof(h), &got), SHARE_UNKNOWN);     /* used */
	/* A second socket on the same live path is refused. */
	{
		struct share_socket *s2 = NULL;

		eng_error_clear(&err);
		ck_assert_int_eq(share_socket_start(sock_path, t, &s2, &err), -EADDRINUSE);
		ck_assert_ptr_nonnull(strstr(err.msg, "another process serves it"));
	}
	share_socket_stop(s);
	ck_assert_int_eq(lstat(sock_path, &st), -1);                   /* removed */
	share_table_free(t);
}
END_TEST

START_TEST(socket_paths)
{
	struct share_table *t = table(4, 1 << 20, 60000);
	struct share_socket *s = NULL;
	struct eng_error err = {0};
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	char longp[200];
	int fd;

	ck_assert_int_eq(share_socket_start("rel.sock", t, &s, &err), -EINVAL);
	memset(longp, 'a', sizeof(longp) - 1);
	longp[0] = '/';
	longp[sizeof(longp) - 1] = '\0';
	eng_error_clear(&err);
	ck_assert_int_eq(share_socket_start(longp, t, &s, &err), -EINVAL);
	/* A regular file is left alone. */
	fd = open(sock_path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	ck_assert_int_ge(fd, 0);
	close(fd);
	eng_error_clear(&err);
	ck_assert_int_eq(share_socket_start(sock_path, t, &s, &err), -EEXIST);
	ck_assert_ptr_nonnull(strstr(err.msg, "exists and is not a socket"));
	unlink(sock_path);
	/* A socket nobody listens on (a dead daemon's) is replaced. */
	fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock_path);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	close(fd);
	eng_error_clear(&err);
	ck_assert_int_eq(share_socket_start(sock_path, t, &s, &err), 0);
	share_socket_stop(s);
	share_table_free(t);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("daemon_share");
	TCase *tc = tcase_create("table");
	TCase *ts = tcase_create("socket");

	log_set_level(LOG_LVL_ERROR);
	tcase_add_test(tc, one_use);
	tcase_add_test(tc, counted_uses);
	tcase_add_test(tc, expiry);
	tcase_add_test(tc, bounds);
	suite_add_tcase(s, tc);
	tcase_add_checked_fixture(ts, setup, teardown);
	tcase_add_test(ts, socket_protocol);
	tcase_add_test(ts, socket_paths);
	suite_add_tcase(s, ts);
	return check_run(s);
}
