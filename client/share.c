/* share.c — libengined-client's same-host weights: a ShareWeights reply
 * (ec_share_weights) picked up over the daemon's share socket and mapped
 * (engined_client.h, "same-host weights"; the protocol is engine.proto's,
 * ShareWeightsRequest). The file is checked before it is mapped: sealed
 * against writes, shrinking and growing (F_GET_SEALS), of the reply's
 * size, every tensor inside it with the bytes its shape says. */
#include "engined_client.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define HANDLE_BYTES 16
#define REQUIRED_SEALS (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)

struct ec_share {
	Engined__V1__ShareWeightsResponse *idx;   /* a copy of the reply */
	uint8_t *map;
	size_t size;
};

static int fail(struct ec_status *st, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int fail(struct ec_status *st, int code, const char *fmt, ...)
{
	va_list ap;

	if (st) {
		st->code = code;
		va_start(ap, fmt);
		vsnprintf(st->message, sizeof(st->message), fmt, ap);
		va_end(ap);
	}
	return code;
}

/* The share's descriptor for `handle` (one use of it), or a status. */
static int receive_fd(const char *path, const uint8_t *handle, int *ret_fd,
		      struct ec_status *st)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct timeval tv = { 5, 0 };
	char buf[512];
	struct iovec iov = { buf, sizeof(buf) };
	union {
		struct cmsghdr h;
		char space[CMSG_SPACE(4 * sizeof(int))];
	} ctl;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.space,
			     .msg_controllen = sizeof(ctl.space) };
	struct cmsghdr *c;
	int s, fds[4], n_fds = 0, r;
	ssize_t n;

	if (strlen(path) >= sizeof(a.sun_path))
		return fail(st, EC_INVALID_ARGUMENT, "share socket %s: path too long", path);
	memcpy(a.sun_path, path, strlen(path));
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return fail(st, EC_UNAVAILABLE, "share socket: %s", strerror(errno));
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(s, (struct sockaddr *)&a, sizeof(a)) < 0) {
		r = errno == EACCES ? EC_PERMISSION_DENIED : EC_UNAVAILABLE;
		fail(st, r, "share socket %s: %s%s", path, strerror(errno),
		     errno == EACCES ? " (the socket is mode 0660: this user must be in its group)"
				     : "");
		close(s);
		return r;
	}
	if (send(s, handle, HANDLE_BYTES, MSG_NOSIGNAL) != HANDLE_BYTES) {
		fail(st, EC_UNAVAILABLE, "share socket %s: %s", path, strerror(errno));
		close(s);
		return EC_UNAVAILABLE;
	}
	memset(&ctl, 0, sizeof(ctl));
	n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
	close(s);
	for (c = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
			for (size_t k = 0; k < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int) &&
			     n_fds < 4; k++)
				memcpy(&fds[n_fds++], CMSG_DATA(c) + k * sizeof(int), sizeof(int));
	if (n > 0 && buf[0] == 0 && n_fds == 1) {
		*ret_fd = fds[0];
		return 0;
	}
	for (int k = 0; k < n_fds; k++)
		close(fds[k]);
	if (n <= 0)
		return fail(st, EC_UNAVAILABLE, "share socket %s: %s", path,
			    n < 0 ? strerror(errno) : "closed without an answer");
	r = buf[0] == 1 ? EC_NOT_FOUND : buf[0] == 2 ? EC_INVALID_ARGUMENT :
	    buf[0] == 3 ? EC_UNAVAILABLE : EC_INTERNAL;
	return fail(st, r, "share socket: %.*s", (int)(n - 1),
		    buf[0] ? buf + 1 : "no descriptor attached");
}

/* Every tensor inside the file with its shape's bytes. */
static int check_index(const Engined__V1__ShareWeightsResponse *r, size_t size,
		       struct ec_status *st)
{
	for (size_t i = 0; i < r->n_tensors; i++) {
		const Engined__V1__SharedTensor *t = r->tensors[i];
		uint64_t numel = 1, esz = t->dtype == ENGINED__V1__DTYPE__FLOAT32 ? 4 : 2;
		bool bad = t->n_shape > 8 || t->offset < 0 || t->bytes < 0 ||
			   (uint64_t)t->offset > size || (uint64_t)t->bytes > size - t->offset;

		for (size_t k = 0; k < t->n_shape && !bad; k++)
			bad = t->shape[k] < 0 ||
			      __builtin_mul_overflow(numel, (uint64_t)t->shape[k], &numel);
		if (bad || __builtin_mul_overflow(numel, esz, &numel) ||
		    numel != (uint64_t)t->bytes)
			return fail(st, EC_DATA_LOSS,
				    "share: %s: %lld bytes at %lld do not fit its shape in %zu bytes",
				    t->name, (long long)t->bytes, (long long)t->offset, size);
	}
	return 0;
}

int ec_share_open(const Engined__V1__ShareWeightsResponse *reply, struct ec_share **ret,
		  struct ec_status *st)
{
	struct ec_share *s;
	size_t len = protobuf_c_message_get_packed_size(&reply->base);
	uint8_t *buf;
	struct stat sb;
	int fd = -1, r, seals;

	if (reply->handle.len != HANDLE_BYTES)
		return fail(st, EC_INVALID_ARGUMENT, "share: handle of %zu bytes, not %d",
			    reply->handle.len, HANDLE_BYTES);
	s = calloc(1, sizeof(*s));
	buf = malloc(len ? len : 1);
	if (!s || !buf) {
		free(s);
		free(buf);
		return fail(st, EC_RESOURCE_EXHAUSTED, "out of memory");
	}
	/* A copy of the index: the caller's reply may go before the share. */
	protobuf_c_message_pack(&reply->base, buf);
	s->idx = engined__v1__share_weights_response__unpack(NULL, len, buf);
	free(buf);
	if (!s->idx) {
		free(s);
		return fail(st, EC_RESOURCE_EXHAUSTED, "out of memory");
	}
	r = receive_fd(reply->socket_path, reply->handle.data, &fd, st);
	if (r)
		goto out;
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || (seals & REQUIRED_SEALS) != REQUIRED_SEALS) {
		r = fail(st, EC_FAILED_PRECONDITION,
			 "share: the file is not sealed against writes and resizing (seals 0x%x); "
			 "refusing to use it", seals < 0 ? 0 : seals);
		goto out;
	}
	if (fstat(fd, &sb) < 0 || sb.st_size != reply->total_bytes || sb.st_size < 0) {
		r = fail(st, EC_DATA_LOSS, "share: the file has %lld bytes, the index says %lld",
			 (long long)sb.st_size, (long long)reply->total_bytes);
		goto out;
	}
	s->size = (size_t)sb.st_size;
	r = check_index(s->idx, s->size, st);
	if (r)
		goto out;
	if (s->size) {
		s->map = mmap(NULL, s->size, PROT_READ, MAP_SHARED, fd, 0);
		if (s->map == MAP_FAILED) {
			s->map = NULL;
			r = fail(st, EC_RESOURCE_EXHAUSTED, "share: mmap of %zu bytes: %s", s->size,
				 strerror(errno));
			goto out;
		}
	}
	close(fd);
	*ret = s;
	return fail(st, EC_OK, "%s", "");
out:
	if (fd >= 0)
		close(fd);
	ec_share_close(s);
	return r;
}

int ec_share_weights_open(struct ec_client *c, const Engined__V1__ShareWeightsRequest *req,
			  struct ec_share **ret, struct ec_status *st)
{
	Engined__V1__ShareWeightsResponse *reply = NULL;
	int r = ec_share_weights(c, req, &reply, st);

	if (r)
		return r;
	r = ec_share_open(reply, ret, st);
	ec_free(reply);
	return r;
}

size_t ec_share_count(const struct ec_share *s)
{
	return s->idx->n_tensors;
}

int64_t ec_share_step(const struct ec_share *s)
{
	return s->idx->step;
}

int ec_share_tensor(const struct ec_share *s, size_t i, struct ec_tensor *ret)
{
	const Engined__V1__SharedTensor *t;

	if (i >= s->idx->n_tensors)
		return -ERANGE;
	t = s->idx->tensors[i];
	memset(ret, 0, sizeof(*ret));
	ret->name = t->name;
	ret->dtype = t->dtype;
	ret->ndim = (int)t->n_shape;
	for (size_t k = 0; k < t->n_shape; k++)
		ret->shape[k] = t->shape[k];
	ret->data = s->map ? s->map + t->offset : NULL;
	ret->nbytes = (size_t)t->bytes;
	return 0;
}

void ec_share_close(struct ec_share *s)
{
	if (!s)
		return;
	if (s->map)
		munmap(s->map, s->size);
	if (s->idx)
		engined__v1__share_weights_response__free_unpacked(s->idx, NULL);
	free(s);
}
