/* metrics.c — counters and the Prometheus endpoint (see metrics.h).
 *
 * The endpoint is libmicrohttpd with one internal thread (epoll where
 * available): every callback below runs on that thread, so the list of
 * connections needs no lock. Idle connections must not keep a scraper out:
 * libmicrohttpd refuses a connection beyond its limits and its timeout
 * frees an idle one only later, and on loopback every client has the same
 * address, so a per-address limit alone would let a few local sockets that
 * never send a request blind the scraper. The endpoint therefore tracks its
 * connections and, when a new one brings its address over
 * max_conns_per_addr (or the total over max_conns), closes the connection
 * of that address (of the address holding the most) that has been idle
 * the longest, i.e. has no request being answered: a scraper's fresh
 * connection is the newest and sends its request at once, so older idle
 * ones go first, and one address's excess never closes another's
 * connections. libmicrohttpd's own limits sit HTTP_SLACK above ours (the
 * closes take effect on its next turn) and hold under a flood.
 */
#include "metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "log.h"

#define HTTP_SLACK 32          /* libmicrohttpd's limits above ours */
#define HTTP_MEMORY (16 * 1024)  /* per connection: a scraper's request fits */

/* One connection of the endpoint (its socket context). */
struct http_conn {
	struct http_conn *prev, *next;
	unsigned char addr[16];     /* IPv4 or IPv6 address bytes */
	int addr_len;
	int fd;
	bool busy;                  /* a request is being answered */
	bool closing;               /* shut down by the guard; closes soon */
	uint64_t idle_since;        /* m->conn_seq at connect or last answer */
};

/* Upper bounds of the latency buckets, seconds (the last is +Inf). */
static const double bucket_le[METRICS_BUCKETS - 1] = {
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5, 10, 60,
};

void metrics_init(struct metrics *m, const char *const *labels, int n_labels)
{
	memset(m, 0, sizeof(*m));
	pthread_mutex_init(&m->lock, NULL);
	m->labels = labels;
	m->n_labels = n_labels < METRICS_METHODS - 1 ? n_labels : METRICS_METHODS - 1;
}

void metrics_fini(struct metrics *m)
{
	if (m->http) {
		MHD_stop_daemon(m->http);
		m->http = NULL;
	}
	while (m->conns) {  /* closed ones were unlinked by on_conn */
		struct http_conn *c = m->conns;

		m->conns = c->next;
		free(c);
	}
}

void metrics_rpc(struct metrics *m, int method, int code, double seconds)
{
	int row = method >= 0 && method < METRICS_METHODS - 1 ? method : METRICS_METHODS - 1;
	int b = 0;

	if (code < 0 || code >= METRICS_CODES)
		code = 2;  /* UNKNOWN */
	while (b < METRICS_BUCKETS - 1 && seconds > bucket_le[b])
		b++;
	__atomic_add_fetch(&m->calls[row][code], 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&m->micros[row][code], (int64_t)(seconds * 1e6), __ATOMIC_RELAXED);
	__atomic_add_fetch(&m->hist[row][b], 1, __ATOMIC_RELAXED);
}

void metrics_forward_backward(struct metrics *m, int64_t tokens, double seconds)
{
	pthread_mutex_lock(&m->lock);
	m->tokens_trained += tokens;
	m->step_accum += seconds;
	pthread_mutex_unlock(&m->lock);
}

void metrics_optimizer_step(struct metrics *m, double seconds, double grad_norm)
{
	pthread_mutex_lock(&m->lock);
	m->optimizer_steps++;
	m->step_seconds = m->step_accum + seconds;
	m->step_accum = 0;
	m->grad_norm = grad_norm;
	pthread_mutex_unlock(&m->lock);
}

void metrics_checkpoint_saved(struct metrics *m)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	pthread_mutex_lock(&m->lock);
	m->checkpoints_saved++;
	m->last_checkpoint_unix = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
	pthread_mutex_unlock(&m->lock);
}

/* --- the page ------------------------------------------------------------ */

struct page {
	char *buf;
	size_t len, cap;
	bool oom;
};

static void put(struct page *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(struct page *p, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (p->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		/* The first call has no buffer yet: it measures (NULL, 0). */
		n = vsnprintf(p->buf ? p->buf + p->len : NULL, p->cap - p->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			p->oom = true;
			return;
		}
		if ((size_t)n < p->cap - p->len) {
			p->len += (size_t)n;
			return;
		}
		{
			size_t cap = (p->cap + (size_t)n + 1) * 2;
			char *nb = realloc(p->buf, cap);

			if (!nb) {
				p->oom = true;
				return;
			}
			p->buf = nb;
			p->cap = cap;
		}
	}
}

static const char *const code_label[METRICS_CODES] = {
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
	"FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
	"INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
};

static const char *row_label(const struct metrics *m, int row)
{
	return row < m->n_labels ? m->labels[row] : "unknown";
}

static int64_t ld(const int64_t *x)
{
	return __atomic_load_n(x, __ATOMIC_RELAXED);
}

static int64_t rss(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	long long pages = 0, res = 0;

	if (!f)
		return 0;
	if (fscanf(f, "%lld %lld", &pages, &res) != 2)
		res = 0;
	fclose(f);
	return res * sysconf(_SC_PAGESIZE);
}

static void render(struct metrics *m, struct page *p)
{
	struct metrics_sample smp;
	struct engine_status st;
	int64_t queued, in_flight, tokens, steps, ckpts;
	double step_s, gnorm, last_ckpt, job_s;
	bool busy;

	memset(&smp, 0, sizeof(smp));
	if (m->sample)
		m->sample(m->sample_ctx, &smp);
	st = smp.st;
	queued = smp.queued;
	in_flight = smp.in_flight;
	busy = smp.busy;
	job_s = smp.job_seconds;
	pthread_mutex_lock(&m->lock);
	tokens = m->tokens_trained;
	steps = m->optimizer_steps;
	step_s = m->step_seconds;
	gnorm = m->grad_norm;
	ckpts = m->checkpoints_saved;
	last_ckpt = m->last_checkpoint_unix;
	pthread_mutex_unlock(&m->lock);

	put(p, "# HELP engined_build_info Version of the daemon.\n# TYPE engined_build_info gauge\n"
	       "engined_build_info{version=\"%s\"} 1\n", ENGINED_VERSION);
	put(p, "# HELP engined_uptime_seconds Seconds since the daemon started.\n"
	       "# TYPE engined_uptime_seconds gauge\nengined_uptime_seconds %.3f\n",
	    smp.uptime_seconds);

	put(p, "# HELP engined_rpc_total RPCs finished, by method and status code.\n"
	       "# TYPE engined_rpc_total counter\n");
	for (int r = 0; r < METRICS_METHODS; r++)
		for (int c = 0; c < METRICS_CODES; c++)
			if (ld(&m->calls[r][c]))
				put(p, "engined_rpc_total{method=\"%s\",code=\"%s\"} %lld\n",
				    row_label(m, r), code_label[c], (long long)ld(&m->calls[r][c]));
	put(p, "# HELP engined_rpc_duration_seconds_total Time spent in RPCs, by method and status code.\n"
	       "# TYPE engined_rpc_duration_seconds_total counter\n");
	for (int r = 0; r < METRICS_METHODS; r++)
		for (int c = 0; c < METRICS_CODES; c++)
			if (ld(&m->calls[r][c]))
				put(p, "engined_rpc_duration_seconds_total{method=\"%s\",code=\"%s\"} %.6f\n",
				    row_label(m, r), code_label[c],
				    (double)ld(&m->micros[r][c]) * 1e-6);
	put(p, "# HELP engined_rpc_latency_seconds RPC latency, by method.\n"
	       "# TYPE engined_rpc_latency_seconds histogram\n");
	for (int r = 0; r < METRICS_METHODS; r++) {
		int64_t cum = 0, count = 0, micros = 0;

		for (int c = 0; c < METRICS_CODES; c++) {
			count += ld(&m->calls[r][c]);
			micros += ld(&m->micros[r][c]);
		}
		if (!count)
			continue;
		for (int b = 0; b < METRICS_BUCKETS; b++) {
			cum += ld(&m->hist[r][b]);
			if (b < METRICS_BUCKETS - 1)
				put(p, "engined_rpc_latency_seconds_bucket{method=\"%s\",le=\"%g\"} %lld\n",
				    row_label(m, r), bucket_le[b], (long long)cum);
			else
				put(p, "engined_rpc_latency_seconds_bucket{method=\"%s\",le=\"+Inf\"} %lld\n",
				    row_label(m, r), (long long)cum);
		}
		put(p, "engined_rpc_latency_seconds_sum{method=\"%s\"} %.6f\n", row_label(m, r),
		    (double)micros * 1e-6);
		put(p, "engined_rpc_latency_seconds_count{method=\"%s\"} %lld\n", row_label(m, r),
		    (long long)count);
	}
	put(p, "# HELP engined_auth_failures_total Calls refused for a missing or invalid token.\n"
	       "# TYPE engined_auth_failures_total counter\nengined_auth_failures_total %lld\n",
	    (long long)ld(&m->auth_failures));
	put(p, "# HELP engined_stream_bytes_total Bytes of stream messages sent (weights).\n"
	       "# TYPE engined_stream_bytes_total counter\nengined_stream_bytes_total %lld\n",
	    (long long)smp.bytes_streamed);
	put(p, "# HELP engined_request_bytes_in_flight Bytes of requests received and not yet answered "
	       "(bounded by server.max_inflight_request_bytes).\n"
	       "# TYPE engined_request_bytes_in_flight gauge\nengined_request_bytes_in_flight %lld\n",
	    (long long)smp.inflight_request_bytes);
	put(p, "# HELP engined_shares_pending ShareWeights handles not yet picked up (by all their uses).\n"
	       "# TYPE engined_shares_pending gauge\nengined_shares_pending %d\n",
	    smp.pending_shares);
	put(p, "# HELP engined_share_bytes_pending Bytes of shared memory those handles hold until "
	       "picked up or expired (bounded by server.max_share_bytes).\n"
	       "# TYPE engined_share_bytes_pending gauge\nengined_share_bytes_pending %lld\n",
	    (long long)smp.pending_share_bytes);

	put(p, "# HELP engined_engine_initialized 1 once Initialize succeeded.\n"
	       "# TYPE engined_engine_initialized gauge\nengined_engine_initialized %d\n",
	    st.initialized ? 1 : 0);
	put(p, "# HELP engined_engine_busy 1 while the engine thread runs a job.\n"
	       "# TYPE engined_engine_busy gauge\nengined_engine_busy %d\n", busy ? 1 : 0);
	put(p, "# HELP engined_job_running_seconds How long the running job has run (0: idle).\n"
	       "# TYPE engined_job_running_seconds gauge\nengined_job_running_seconds %.3f\n",
	    job_s);
	put(p, "# HELP engined_queue_depth Engine jobs waiting behind the running one.\n"
	       "# TYPE engined_queue_depth gauge\nengined_queue_depth %lld\n", (long long)queued);
	put(p, "# HELP engined_calls_in_flight Engine jobs queued or running.\n"
	       "# TYPE engined_calls_in_flight gauge\nengined_calls_in_flight %lld\n",
	    (long long)in_flight);
	put(p, "# HELP engined_engine_step Optimizer steps of the engine (its state, restored by LoadCheckpoint).\n"
	       "# TYPE engined_engine_step gauge\nengined_engine_step %lld\n", (long long)st.step);
	put(p, "# HELP engined_optimizer_steps_total OptimizerStep calls that succeeded.\n"
	       "# TYPE engined_optimizer_steps_total counter\nengined_optimizer_steps_total %lld\n",
	    (long long)steps);
	put(p, "# HELP engined_tokens_trained_total Tokens of training ForwardBackward calls.\n"
	       "# TYPE engined_tokens_trained_total counter\nengined_tokens_trained_total %lld\n",
	    (long long)tokens);
	put(p, "# HELP engined_step_seconds Engine time of the last step: its training ForwardBackward calls plus the OptimizerStep.\n"
	       "# TYPE engined_step_seconds gauge\nengined_step_seconds %.6f\n", step_s);
	put(p, "# HELP engined_grad_norm Gradient norm of the last OptimizerStep (before clipping).\n"
	       "# TYPE engined_grad_norm gauge\nengined_grad_norm %.9g\n", gnorm);
	put(p, "# HELP engined_lr Learning rate of the next step.\n"
	       "# TYPE engined_lr gauge\nengined_lr %.9g\n", st.lr);
	put(p, "# HELP engined_parameters Parameters of the model.\n"
	       "# TYPE engined_parameters gauge\nengined_parameters %lld\n",
	    (long long)st.num_parameters);
	put(p, "# HELP engined_memory_bytes Engine memory in use, by placement.\n"
	       "# TYPE engined_memory_bytes gauge\n"
	       "engined_memory_bytes{placement=\"device\"} %llu\n"
	       "engined_memory_bytes{placement=\"host\"} %llu\n",
	    (unsigned long long)st.device_memory, (unsigned long long)st.host_memory);
	put(p, "# HELP engined_resident_memory_bytes Resident set size of the process.\n"
	       "# TYPE engined_resident_memory_bytes gauge\nengined_resident_memory_bytes %lld\n",
	    (long long)rss());
	put(p, "# HELP engined_on_device 1 when the part is on the device (else host).\n"
	       "# TYPE engined_on_device gauge\n"
	       "engined_on_device{part=\"model\"} %d\nengined_on_device{part=\"optimizer\"} %d\n"
	       "engined_on_device{part=\"grad\"} %d\n",
	    st.placement.model ? 1 : 0, st.placement.optimizer ? 1 : 0, st.placement.grad ? 1 : 0);
	put(p, "# HELP engined_checkpoints_saved_total Checkpoints saved (SaveCheckpoint, save_on_stop).\n"
	       "# TYPE engined_checkpoints_saved_total counter\nengined_checkpoints_saved_total %lld\n",
	    (long long)ckpts);
	put(p, "# HELP engined_last_checkpoint_timestamp_seconds Unix time of the last checkpoint saved (0: none).\n"
	       "# TYPE engined_last_checkpoint_timestamp_seconds gauge\n"
	       "engined_last_checkpoint_timestamp_seconds %.3f\n", last_ckpt);
}

/* --- the endpoint's connections (the server's thread) -------------------- */

static bool same_addr(const struct http_conn *a, const struct http_conn *b)
{
	return a->addr_len == b->addr_len && !memcmp(a->addr, b->addr, (size_t)a->addr_len);
}

static int count_addr(const struct metrics *m, const struct http_conn *x)
{
	int n = 0;

	for (const struct http_conn *c = m->conns; c; c = c->next)
		n += !c->closing && same_addr(c, x);
	return n;
}

/* A new connection `nc` arrived: keep the limits by closing the longest
 * idle connection of its address, or, over the total, of the address that
 * holds the most. Nothing is closed when no such connection is idle. */
static void guard_connections(struct metrics *m, const struct http_conn *nc)
{
	struct http_conn *victim = NULL;
	int total = 0, best = 0;
	bool per_addr;

	for (const struct http_conn *c = m->conns; c; c = c->next)
		total += !c->closing;
	per_addr = count_addr(m, nc) > m->max_conns_per_addr;
	if (!per_addr && total <= m->max_conns)
		return;
	for (struct http_conn *c = m->conns; c; c = c->next) {
		int n;

		if (c == nc || c->busy || c->closing || (per_addr && !same_addr(c, nc)))
			continue;
		n = per_addr ? 1 : count_addr(m, c);
		if (!victim || n > best || (n == best && c->idle_since < victim->idle_since)) {
			victim = c;
			best = n;
		}
	}
	if (!victim)
		return;
	/* libmicrohttpd sees the end of the stream and closes it (the fd stays
	 * its own until then). */
	victim->closing = true;
	(void)shutdown(victim->fd, SHUT_RDWR);
}

static struct http_conn *conn_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

static void on_conn(void *cls, struct MHD_Connection *conn, void **socket_context,
		    enum MHD_ConnectionNotificationCode toe)
{
	struct metrics *m = cls;
	const union MHD_ConnectionInfo *ci;
	struct http_conn *c = *socket_context;

	if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
		if (!c)
			return;
		if (c->prev)
			c->prev->next = c->next;
		else
			m->conns = c->next;
		if (c->next)
			c->next->prev = c->prev;
		free(c);
		*socket_context = NULL;
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return;  /* untracked: never closed by the guard */
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	c->fd = ci ? ci->connect_fd : -1;
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET) {
		memcpy(c->addr, &((const struct sockaddr_in *)ci->client_addr)->sin_addr, 4);
		c->addr_len = 4;
	} else if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET6) {
		memcpy(c->addr, &((const struct sockaddr_in6 *)ci->client_addr)->sin6_addr, 16);
		c->addr_len = 16;
	}
	if (c->fd < 0) {
		free(c);
		return;
	}
	c->idle_since = ++m->conn_seq;
	/* Append: the list stays oldest first. */
	if (m->conns) {
		struct http_conn *t = m->conns;

		while (t->next)
			t = t->next;
		t->next = c;
		c->prev = t;
	} else {
		m->conns = c;
	}
	*socket_context = c;
	guard_connections(m, c);
}

static void on_done(void *cls, struct MHD_Connection *conn, void **con_cls,
		    enum MHD_RequestTerminationCode toe)
{
	struct metrics *m = cls;
	struct http_conn *c = conn_of(conn);

	(void)con_cls;
	(void)toe;
	if (c) {
		c->busy = false;
		c->idle_since = ++m->conn_seq;
	}
}

/* At most an eighth of the process's descriptors, 16 to 256; half of
 * them for one address. */
static void conn_limits(struct metrics *m)
{
	struct rlimit rl;
	long fds = 1024, n;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		fds = (long)rl.rlim_cur;
	n = fds / 8;
	n = n < 16 ? 16 : n > 256 ? 256 : n;
	m->max_conns = (int)n;
	m->max_conns_per_addr = (int)n / 2;
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn, const char *url,
			       const char *method, const char *version,
			       const char *upload_data, size_t *upload_data_size, void **con_cls)
{
	struct metrics *m = cls;
	struct MHD_Response *resp;
	struct page p = { NULL, 0, 0, false };
	enum MHD_Result ret;
	unsigned int status = MHD_HTTP_OK;
	static const char not_found[] = "not found: try /metrics\n";
	static const char bad_method[] = "GET only\n";
	struct http_conn *hc = conn_of(conn);

	if (hc)
		hc->busy = true;  /* until on_done */
	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		resp = MHD_create_response_from_buffer(sizeof(bad_method) - 1, (void *)bad_method,
						       MHD_RESPMEM_PERSISTENT);
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
	} else if (strcmp(url, "/metrics")) {
		resp = MHD_create_response_from_buffer(sizeof(not_found) - 1, (void *)not_found,
						       MHD_RESPMEM_PERSISTENT);
		status = MHD_HTTP_NOT_FOUND;
	} else {
		render(m, &p);
		if (p.oom) {
			free(p.buf);
			return MHD_NO;
		}
		resp = MHD_create_response_from_buffer(p.len, p.buf, MHD_RESPMEM_MUST_FREE);
	}
	if (!resp) {
		free(p.buf);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type",
				status == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8" :
				"text/plain; charset=utf-8");
	ret = MHD_queue_response(conn, status, resp);
	MHD_destroy_response(resp);
	return ret;
}

int metrics_start(struct metrics *m, const char *addr, int idle_timeout_s,
		  metrics_sample_fn sample, void *ctx, char *errbuf, size_t errlen)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[256];
	const char *colon = strrchr(addr, ':');
	const union MHD_DaemonInfo *info;
	size_t n;
	long port;
	/* One internal thread (never a pool: the callbacks share m->conns). */
	unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD;

	memset(&ss, 0, sizeof(ss));
	if (!colon || (n = (size_t)(colon - addr)) >= sizeof(host)) {
		snprintf(errbuf, errlen, "metrics.listen: '%s' is not host:port", addr);
		return -EINVAL;
	}
	memcpy(host, addr, n);
	host[n] = '\0';
	port = strtol(colon + 1, NULL, 10);
	if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

		host[n - 1] = '\0';
		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)port);
		if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1)
			goto bad_host;
		flags |= MHD_USE_IPv6;
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;

		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		if (!strcmp(host, "localhost"))
			strcpy(host, "127.0.0.1");
		if (n == 0)
			strcpy(host, "0.0.0.0");
		if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
			goto bad_host;
	}
	m->sample = sample;
	m->sample_ctx = ctx;
	conn_limits(m);
	m->idle_timeout_s = idle_timeout_s > 0 ? idle_timeout_s : 5;
	m->http = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_http, m,
				   MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
				   MHD_OPTION_CONNECTION_LIMIT, (unsigned)(m->max_conns + HTTP_SLACK),
				   MHD_OPTION_PER_IP_CONNECTION_LIMIT,
				   (unsigned)(m->max_conns_per_addr + HTTP_SLACK),
				   MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)m->idle_timeout_s,
				   MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_MEMORY,
				   MHD_OPTION_NOTIFY_CONNECTION, on_conn, m,
				   MHD_OPTION_NOTIFY_COMPLETED, on_done, m,
				   MHD_OPTION_END);
	if (!m->http) {
		snprintf(errbuf, errlen, "metrics.listen: cannot serve on %s", addr);
		return -EADDRINUSE;
	}
	info = MHD_get_daemon_info(m->http, MHD_DAEMON_INFO_LISTEN_FD);
	if (info && getsockname(info->listen_fd, (struct sockaddr *)&ss, &sl) == 0)
		m->http_port = ntohs(ss.ss_family == AF_INET6 ?
				     ((struct sockaddr_in6 *)&ss)->sin6_port :
				     ((struct sockaddr_in *)&ss)->sin_port);
	return 0;

bad_host:
	snprintf(errbuf, errlen, "metrics.listen: '%s': the host must be a numeric address or localhost",
		 addr);
	return -EINVAL;
}
