/* share_socket.c — ShareWeights' side socket (see share_socket.h). */
#include "share_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

/* The longest poll: how late an expired share is closed at most. */
#define SWEEP_MS 1000
#define LISTEN_BACKLOG 64

struct conn {
	int fd;
	int64_t deadline_ms;
	struct ucred peer;
};

struct share_socket {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	dev_t dev;                    /* of the socket file this process made */
	ino_t ino;
	int lfd;
	int wake;                     /* eventfd: stop */
	struct share_table *t;
	pthread_t thread;
	struct conn conns[SHARE_SOCKET_MAX_CONNS];
	int n_conns;
};

/* One answer: the status byte, the message, the descriptor when fd >= 0.
 * Never blocks (a datagram this small fits an empty socket buffer). */
static int answer(int cfd, enum share_status st, const char *msg, int fd)
{
	char buf[256];
	struct iovec iov;
	struct msghdr mh;
	union {
		struct cmsghdr h;
		char space[CMSG_SPACE(sizeof(int))];
	} ctl;
	size_t n = strlen(msg);

	if (n > sizeof(buf) - 1)
		n = sizeof(buf) - 1;
	buf[0] = (char)st;
	memcpy(buf + 1, msg, n);
	iov.iov_base = buf;
	iov.iov_len = n + 1;
	memset(&mh, 0, sizeof(mh));
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (fd >= 0) {
		struct cmsghdr *c;

		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.space;
		mh.msg_controllen = sizeof(ctl.space);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
	}
	return sendmsg(cfd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 ? -errno : 0;
}

static void conn_close(struct share_socket *s, int i)
{
	close(s->conns[i].fd);
	s->conns[i] = s->conns[--s->n_conns];
}

/* The connection's datagram has come (or its peer left). Returns true when
 * the connection is done (always, but for a spurious wake-up). */
static bool serve(struct share_socket *s, struct conn *c)
{
	uint8_t buf[SHARE_HANDLE_BYTES + 1];
	struct iovec iov = { buf, sizeof(buf) };
	struct msghdr mh;
	struct share_info info;
	char msg[160];
	ssize_t n;
	int fd, r;

	memset(&mh, 0, sizeof(mh));
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	/* No control buffer: descriptors a peer sends are discarded (closed)
	 * by the kernel, which sets MSG_CTRUNC. */
	n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_TRUNC);  /* n: the datagram's length */
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return false;
	if (n <= 0) {
		log_msg(LOG_LVL_DEBUG, "share socket: pid %d uid %d left without a request",
			(int)c->peer.pid, (int)c->peer.uid);
		return true;
	}
	if (n != SHARE_HANDLE_BYTES || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		snprintf(msg, sizeof(msg),
			 "request: expected one datagram of the %d handle bytes, got %zd bytes%s",
			 SHARE_HANDLE_BYTES, n,
			 (mh.msg_flags & MSG_CTRUNC) ? " and ancillary data" : "");
		log_msg(LOG_LVL_WARN, "share socket: pid %d uid %d gid %d: %s", (int)c->peer.pid,
			(int)c->peer.uid, (int)c->peer.gid, msg);
		(void)answer(c->fd, SHARE_MALFORMED, msg, -1);
		return true;
	}
	fd = share_table_take(s->t, buf, share_table_now_ms(), &info);
	if (fd == -ENOENT) {
		log_msg(LOG_LVL_WARN,
			"share socket: pid %d uid %d gid %d: unknown, used up or expired handle",
			(int)c->peer.pid, (int)c->peer.uid, (int)c->peer.gid);
		(void)answer(c->fd, SHARE_UNKNOWN, "handle: unknown, used up or expired", -1);
		return true;
	}
	if (fd < 0) {
		log_msg(LOG_LVL_WARN, "share socket: pid %d: out of file descriptors; asked to retry",
			(int)c->peer.pid);
		(void)answer(c->fd, SHARE_RETRY, "daemon: out of file descriptors; try again", -1);
		return true;
	}
	r = answer(c->fd, SHARE_OK, "ok", fd);
	close(fd);
	if (r < 0)
		log_msg(LOG_LVL_WARN,
			"share #%llu: could not hand it to pid %d uid %d (%s); that use is spent",
			(unsigned long long)info.id, (int)c->peer.pid, (int)c->peer.uid,
			strerror(-r));
	else
		log_msg(LOG_LVL_INFO,
			"share #%llu: %lld bytes handed to pid %d uid %d gid %d (%d of %d uses left)",
			(unsigned long long)info.id, (long long)info.bytes, (int)c->peer.pid,
			(int)c->peer.uid, (int)c->peer.gid, info.uses_left, info.uses);
	return true;
}

static void accept_some(struct share_socket *s, int64_t now)
{
	while (s->n_conns < SHARE_SOCKET_MAX_CONNS) {
		struct conn *c = &s->conns[s->n_conns];
		socklen_t len = sizeof(c->peer);
		int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_msg(LOG_LVL_WARN, "share socket: accept: %s", strerror(errno));
			return;
		}
		memset(&c->peer, 0, sizeof(c->peer));
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c->peer, &len) < 0) {
			c->peer.pid = -1;
			c->peer.uid = (uid_t)-1;
			c->peer.gid = (gid_t)-1;
		}
		c->fd = fd;
		c->deadline_ms = now + SHARE_SOCKET_TIMEOUT_MS;
		s->n_conns++;
	}
}

static void *thread_main(void *arg)
{
	struct share_socket *s = arg;
	struct pollfd p[2 + SHARE_SOCKET_MAX_CONNS];
	int conn_of[2 + SHARE_SOCKET_MAX_CONNS];

	for (;;) {
		int64_t now = share_table_now_ms(), next;
		int timeout = SWEEP_MS, np = 0;

		for (int i = s->n_conns - 1; i >= 0; i--) {
			if (now < s->conns[i].deadline_ms)
				continue;
			log_msg(LOG_LVL_WARN,
				"share socket: pid %d uid %d sent no request in %d s; closed",
				(int)s->conns[i].peer.pid, (int)s->conns[i].peer.uid,
				SHARE_SOCKET_TIMEOUT_MS / 1000);
			conn_close(s, i);
		}
		share_table_sweep(s->t, now, &next);
		if (next >= 0 && next < timeout)
			timeout = (int)next;
		for (int i = 0; i < s->n_conns; i++)
			if (s->conns[i].deadline_ms - now < timeout)
				timeout = (int)(s->conns[i].deadline_ms - now);

		p[np] = (struct pollfd){ s->wake, POLLIN, 0 };
		conn_of[np++] = -1;
		if (s->n_conns < SHARE_SOCKET_MAX_CONNS) {
			p[np] = (struct pollfd){ s->lfd, POLLIN, 0 };
			conn_of[np++] = -2;
		}
		for (int i = 0; i < s->n_conns; i++) {
			p[np] = (struct pollfd){ s->conns[i].fd, POLLIN, 0 };
			conn_of[np++] = i;
		}
		if (poll(p, (nfds_t)np, timeout) < 0 && errno != EINTR) {
			log_msg(LOG_LVL_ERROR, "share socket: poll: %s", strerror(errno));
			break;
		}
		if (p[0].revents)
			break;
		/* Connections first, from the last (closing one moves the last
		 * into its place), then new ones. */
		for (int k = np - 1; k >= 1; k--) {
			int i = conn_of[k];

			if (i >= 0 && p[k].revents && serve(s, &s->conns[i]))
				conn_close(s, i);
		}
		if (np > 1 && conn_of[1] == -2 && p[1].revents)
			accept_some(s, share_table_now_ms());
	}
	while (s->n_conns > 0)
		conn_close(s, s->n_conns - 1);
	return NULL;
}

/* A socket file already at the path: replaced when nobody listens on it
 * (a daemon that died), else refused. */
static int clear_stale(const char *path, struct eng_error *err)
{
	struct sockaddr_un a;
	struct stat st;
	int fd, r;

	if (lstat(path, &st) < 0) {
		if (errno == ENOENT)
			return 0;
		return eng_fail(err, -errno, "server.share_socket %s: %s", path, strerror(errno));
	}
	if (!S_ISSOCK(st.st_mode))
		return eng_fail(err, -EEXIST,
				"server.share_socket %s: exists and is not a socket; not replacing it",
				path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return eng_fail(err, -errno, "server.share_socket: socket: %s", strerror(errno));
	memset(&a, 0, sizeof(a));
	a.sun_family = AF_UNIX;
	memcpy(a.sun_path, path, strlen(path));
	r = connect(fd, (struct sockaddr *)&a, sizeof(a));
	close(fd);
	if (r == 0)
		return eng_fail(err, -EADDRINUSE,
				"server.share_socket %s: another process serves it (a second daemon?)",
				path);
	if (errno != ECONNREFUSED)
		return eng_fail(err, -errno, "server.share_socket %s: %s", path, strerror(errno));
	if (unlink(path) < 0 && errno != ENOENT)
		return eng_fail(err, -errno, "server.share_socket %s: cannot remove the stale socket: %s",
				path, strerror(errno));
	log_msg(LOG_LVL_INFO, "share socket: replaced the stale socket file %s", path);
	return 0;
}

int share_socket_start(const char *path, struct share_table *t, struct share_socket **ret,
		       struct eng_error *err)
{
	struct share_socket *s;
	struct sockaddr_un a;
	struct stat st;
	int r;

	if (path[0] != '/' || strlen(path) >= sizeof(a.sun_path))
		return eng_fail(err, -EINVAL,
				"server.share_socket %s: must be an absolute path under %zu bytes",
				path, sizeof(a.sun_path));
	r = clear_stale(path, err);
	if (r < 0)
		return r;
	s = calloc(1, sizeof(*s));
	if (!s)
		return eng_fail(err, -ENOMEM, "out of memory");
	s->t = t;
	s->lfd = s->wake = -1;
	snprintf(s->path, sizeof(s->path), "%s", path);
	s->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	s->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->lfd < 0 || s->wake < 0) {
		r = eng_fail(err, -errno, "server.share_socket: %s", strerror(errno));
		goto fail;
	}
	memset(&a, 0, sizeof(a));
	a.sun_family = AF_UNIX;
	memcpy(a.sun_path, path, strlen(path));
	if (bind(s->lfd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		r = eng_fail(err, -errno, "server.share_socket %s: bind: %s", path, strerror(errno));
		goto fail;
	}
	/* Not listening yet: nobody connects before the mode is set. A
	 * symlink put in its place meanwhile is not followed. */
	if (fchmodat(AT_FDCWD, path, 0660, AT_SYMLINK_NOFOLLOW) < 0 || lstat(path, &st) < 0 ||
	    !S_ISSOCK(st.st_mode)) {
		r = eng_fail(err, -EPERM, "server.share_socket %s: cannot set mode 0660 on the socket: %s",
			     path, strerror(errno ? errno : EPERM));
		goto fail_bound;
	}
	s->dev = st.st_dev;
	s->ino = st.st_ino;
	if (listen(s->lfd, LISTEN_BACKLOG) < 0) {
		r = eng_fail(err, -errno, "server.share_socket %s: listen: %s", path, strerror(errno));
		goto fail_bound;
	}
	if (pthread_create(&s->thread, NULL, thread_main, s) != 0) {
		r = eng_fail(err, -EAGAIN, "server.share_socket: cannot start its thread");
		goto fail_bound;
	}
	*ret = s;
	return 0;
fail_bound:
	unlink(path);
fail:
	if (s->lfd >= 0)
		close(s->lfd);
	if (s->wake >= 0)
		close(s->wake);
	free(s);
	return r;
}

void share_socket_stop(struct share_socket *s)
{
	uint64_t one = 1;
	struct stat st;

	if (!s)
		return;
	if (write(s->wake, &one, sizeof(one)) != sizeof(one))
		log_msg(LOG_LVL_ERROR, "share socket: cannot wake its thread: %s", strerror(errno));
	pthread_join(s->thread, NULL);
	if (lstat(s->path, &st) == 0 && st.st_dev == s->dev && st.st_ino == s->ino)
		unlink(s->path);
	close(s->lfd);
	close(s->wake);
	free(s);
}
