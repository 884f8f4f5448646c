/* config.c — the settings table, the INI reader (libinih) and the checks
 * (see config.h). */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>

#include <ini.h>

#include "log.h"

enum ktype {
	K_STR,      /* char *, empty: unset */
	K_PATH,     /* char *, empty: unset */
	K_INT,      /* int in [min, max] */
	K_I64,      /* int64_t in [min, max] */
	K_SIZE,     /* int64_t bytes, K/M/G suffixes (powers of 1024) */
	K_MS,       /* int64_t ms, written as seconds (decimals allowed) */
	K_BOOL,
	K_LEVEL,    /* int: enum log_level */
	K_LISTEN,   /* the listen list */
	K_ADDR,     /* char *: host:port, empty: unset */
};

struct key {
	const char *section;
	const char *name;
	enum ktype type;
	size_t off;
	int64_t min, max;
	const char *help;
};

#define F(x) offsetof(struct daemon_config, x)

static const struct key keys[] = {
	{ "server", "listen", K_LISTEN, F(listen), 0, 0,
	  "address to serve on; repeat the key for several (host:port, [v6]:port, unix:/path)" },
	{ "server", "pollers", K_INT, F(pollers), 1, 8,
	  "gRPC completion-queue threads" },
	{ "server", "max_request_bytes", K_SIZE, F(max_request_bytes), 1024, INT32_MAX,
	  "largest request accepted (RESOURCE_EXHAUSTED above)" },
	{ "server", "max_inflight_request_bytes", K_SIZE, F(max_inflight_request_bytes), 0,
	  INT64_MAX / 2, "request bytes received and not yet answered, all calls together "
	  "(RESOURCE_EXHAUSTED above); 0: 2 x max_request_bytes" },
	{ "server", "max_send_bytes", K_SIZE, F(max_send_bytes), 0, INT32_MAX,
	  "largest reply or stream message; 0: max(max_request_bytes, 64M)" },
	{ "server", "max_concurrent_calls", K_INT, F(max_concurrent_calls), 0, 1000000,
	  "engine calls queued or running at once (RESOURCE_EXHAUSTED above); 0: no limit" },
	{ "server", "max_concurrent_streams", K_INT, F(max_concurrent_streams), 1, 100000,
	  "HTTP/2 streams per client connection" },
	{ "server", "replay_entries", K_INT, F(replay_entries), 1, 10000000,
	  "request ids whose outcome is kept (a retry older than that runs again)" },
	{ "server", "replay_bytes", K_SIZE, F(replay_bytes), 0, INT64_MAX / 2,
	  "reply bytes kept for replays; older ones answer ALREADY_EXISTS" },
	{ "server", "default_deadline_s", K_MS, F(default_deadline_ms), 0, 1000000000LL,
	  "deadline of calls that carry none: a job still queued then is answered DEADLINE_EXCEEDED; 0: none" },
	{ "server", "port_file", K_PATH, F(port_file), 0, 0,
	  "write the bound TCP ports here (one a line) once serving" },
	{ "server", "insecure", K_BOOL, F(insecure), 0, 0,
	  "allow a non-loopback address without client authentication (tokens or mutual TLS)" },
	{ "server", "share_socket", K_PATH, F(share_socket), 0, 0,
	  "ShareWeights: the unix socket (an absolute path, made with mode 0660) where consumers "
	  "on this host pick up shared weights; empty: ShareWeights is off" },
	{ "server", "share_ttl_s", K_MS, F(share_ttl_ms), 1, 86400000LL,
	  "ShareWeights: how long a share's handle stays valid (its memory is freed then)" },
	{ "server", "max_shares", K_INT, F(max_shares), 1, 1024,
	  "ShareWeights: shares not yet picked up at once (RESOURCE_EXHAUSTED above)" },
	{ "server", "max_share_bytes", K_SIZE, F(max_share_bytes), 0, INT64_MAX / 2,
	  "ShareWeights: bytes of shares not yet picked up (RESOURCE_EXHAUSTED above); 0: half "
	  "the host's memory" },
	{ "paths", "checkpoint_root", K_PATH, F(checkpoint_root), 0, 0,
	  "SaveCheckpoint / LoadCheckpoint paths are relative to, and confined under, this directory" },
	{ "paths", "model_root", K_PATH, F(model_root), 0, 0,
	  "Initialize.model_path is relative to, and confined under, this directory" },
	{ "dist", "store_root", K_PATH, F(dist_store_root), 0, 0,
	  "the Gloo FileStore root of data-parallel groups on the CPU: a directory every rank's daemon reaches (same host or a shared file system), mode 0700" },
	{ "dist", "host", K_STR, F(dist_host), 0, 0,
	  "the address this daemon's Gloo connections listen on (a private network); unset: the host name's" },
	{ "dist", "timeout_s", K_MS, F(dist_timeout_ms), 1, 86400000LL,
	  "joining a group and every collective, when Initialize's dist.timeout_s is unset" },
	{ "engine", "threads", K_INT, F(threads), 0, 1024,
	  "engine compute threads; 0: the CPU budget (affinity, cgroup quota)" },
	{ "engine", "default_device", K_STR, F(default_device), 0, 0,
	  "Initialize.device when a request leaves it empty (cpu, cuda)" },
	{ "engine", "param_offload", K_BOOL, F(param_offload), 0, 0,
	  "offload parameters to host when leaving TRAIN/EVAL, unless Initialize says" },
	{ "engine", "optimizer_offload", K_BOOL, F(optimizer_offload), 0, 0,
	  "offload optimizer state to host when leaving TRAIN, unless Initialize says" },
	{ "engine", "max_tokens_per_micro_batch", K_I64, F(default_micro_batch_tokens), 0,
	  1LL << 40, "micro-batch token budget when Initialize gives none; 0: engine default" },
	{ "lora", "max_adapters", K_INT, F(max_adapters), 0, CONFIG_MAX_ADAPTERS,
	  "LoRA adapters alive at once (CreateAdapter: RESOURCE_EXHAUSTED above); 0: none" },
	{ "lora", "max_adapter_bytes", K_SIZE, F(max_adapter_bytes), 0, INT64_MAX / 2,
	  "state of all live adapters together, 16 bytes per adapter parameter (weights, "
	  "gradients, two AdamW moments) (CreateAdapter: RESOURCE_EXHAUSTED above)" },
	{ "tls", "cert", K_PATH, F(tls_cert), 0, 0,
	  "server certificate chain (PEM); with key: TLS on every TCP address" },
	{ "tls", "key", K_PATH, F(tls_key), 0, 0,
	  "server private key (PEM)" },
	{ "tls", "client_ca", K_PATH, F(tls_client_ca), 0, 0,
	  "CA certificates (PEM) that sign client certificates: mutual TLS" },
	{ "tls", "require_client_cert", K_BOOL, F(tls_require_client_cert), 0, 0,
	  "with client_ca: refuse clients without a valid certificate" },
	{ "auth", "token_file", K_PATH, F(token_file), 0, 0,
	  "bearer tokens, one a line: [NAME:]TOKEN [full|read-only] [adapters=A,B]; re-read on "
	  "SIGHUP" },
	{ "auth", "health_exempt", K_BOOL, F(health_exempt), 0, 0,
	  "answer grpc.health.v1.Health without a token (for load balancers)" },
	{ "log", "level", K_LEVEL, F(log_level), 0, 0,
	  "error, warn, info or debug" },
	{ "log", "slow_job_s", K_MS, F(slow_job_ms), 0, 1000000000LL,
	  "log one INFO line (phase, done/total) when a job has run this long, again every "
	  "further this long; 0: never" },
	{ "metrics", "listen", K_ADDR, F(metrics_listen), 0, 0,
	  "Prometheus text endpoint (HTTP GET /metrics), host:port; empty: off" },
	{ "metrics", "idle_timeout_s", K_INT, F(metrics_idle_timeout_s), 1, 3600,
	  "close a metrics connection after this many seconds without a byte" },
	{ "shutdown", "grace_s", K_MS, F(grace_ms), 0, 86400000LL,
	  "SIGTERM: wait this long for the running job (and save_on_stop) before giving up" },
	{ "shutdown", "save_on_stop", K_STR, F(save_on_stop), 0, 0,
	  "SIGTERM: save a checkpoint to this path under checkpoint_root; empty: off" },
	{ "watchdog", "stuck_job_s", K_MS, F(stuck_job_ms), 0, 1000000000LL,
	  "stop the systemd watchdog pings while one job runs longer than this; 0: never" },
};

#define N_KEYS ((int)(sizeof(keys) / sizeof(keys[0])))

_Static_assert(CONFIG_UNIX_PATH_MAX == sizeof(((struct sockaddr_un *)0)->sun_path),
	       "CONFIG_UNIX_PATH_MAX is sun_path's size");

_Static_assert(sizeof(keys) / sizeof(keys[0]) <=
	       sizeof(((struct daemon_config *)0)->set_line) / sizeof(int),
	       "set_line too small for the key table");

static const char *const level_names[] = { "error", "warn", "info", "debug" };

static void errf(char err[CONFIG_ERR_MAX], const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void errf(char err[CONFIG_ERR_MAX], const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, CONFIG_ERR_MAX, fmt, ap);
	va_end(ap);
}

static char **str_field(struct daemon_config *c, const struct key *k)
{
	return (char **)((char *)c + k->off);
}

static int set_str(char **dst, const char *v)
{
	char *s = NULL;

	if (v && v[0]) {
		s = strdup(v);
		if (!s)
			return -ENOMEM;
	}
	free(*dst);
	*dst = s;
	return 0;
}

int config_init(struct daemon_config *c)
{
	memset(c, 0, sizeof(*c));
	c->listen[0] = strdup("127.0.0.1:50051");
	c->checkpoint_root = strdup("./var/checkpoints");
	c->model_root = strdup("./var/models");
	c->dist_store_root = strdup("./var/dist");
	if (!c->listen[0] || !c->checkpoint_root || !c->model_root || !c->dist_store_root) {
		config_free(c);
		return -ENOMEM;
	}
	c->n_listen = 1;
	c->pollers = 1;
	c->max_request_bytes = 512LL << 20;
	c->max_concurrent_streams = 64;
	c->replay_entries = 4096;
	c->replay_bytes = 64LL << 20;
	c->tls_require_client_cert = true;
	c->log_level = LOG_LVL_INFO;
	c->slow_job_ms = 10000;
	c->grace_ms = 30000;
	c->dist_timeout_ms = 300000;
	c->metrics_idle_timeout_s = 5;
	c->share_ttl_ms = 60000;
	c->max_shares = 16;
	c->max_adapters = 64;
	c->max_adapter_bytes = 8LL << 30;
	return 0;
}

void config_free(struct daemon_config *c)
{
	for (int i = 0; i < c->n_listen; i++)
		free(c->listen[i]);
	c->n_listen = 0;
	for (int i = 0; i < N_KEYS; i++) {
		const struct key *k = &keys[i];

		if (k->type == K_STR || k->type == K_PATH || k->type == K_ADDR) {
			free(*str_field(c, k));
			*str_field(c, k) = NULL;
		}
	}
}

static const struct key *find_key(const char *section, const char *name)
{
	for (int i = 0; i < N_KEYS; i++)
		if (!strcmp(keys[i].section, section) && !strcmp(keys[i].name, name))
			return &keys[i];
	return NULL;
}

static bool known_section(const char *section)
{
	for (int i = 0; i < N_KEYS; i++)
		if (!strcmp(keys[i].section, section))
			return true;
	return false;
}

static int parse_int(const char *v, int64_t *ret)
{
	char *end;
	long long x;

	errno = 0;
	x = strtoll(v, &end, 10);
	if (errno || end == v || *end)
		return -EINVAL;
	*ret = x;
	return 0;
}

static int parse_size(const char *v, int64_t *ret)
{
	char *end;
	long long x;
	int shift = 0;

	errno = 0;
	x = strtoll(v, &end, 10);
	if (errno || end == v || x < 0)
		return -EINVAL;
	switch (*end) {
	case '\0': break;
	case 'K': case 'k': shift = 10; end++; break;
	case 'M': case 'm': shift = 20; end++; break;
	case 'G': case 'g': shift = 30; end++; break;
	default: return -EINVAL;
	}
	if (*end || x > (INT64_MAX >> shift))
		return -EINVAL;
	*ret = x << shift;
	return 0;
}

static int parse_bool(const char *v, bool *ret)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };

	for (int i = 0; i < 4; i++) {
		if (!strcasecmp(v, yes[i])) {
			*ret = true;
			return 0;
		}
		if (!strcasecmp(v, no[i])) {
			*ret = false;
			return 0;
		}
	}
	return -EINVAL;
}

/* host:port with a numeric port in [0, 65535]; host may be [v6]. */
static bool valid_hostport(const char *v)
{
	const char *colon = strrchr(v, ':');
	int64_t port;

	if (!colon)
		return false;
	if (v[0] == '[' && colon[-1] != ']')
		return false;
	if (parse_int(colon + 1, &port) < 0 || port < 0 || port > 65535)
		return false;
	return true;
}

static bool valid_listen(const char *v)
{
	if (!strncmp(v, "unix:", 5))
		return v[5] != '\0';
	if (!strncmp(v, "unix-abstract:", 14))
		return v[14] != '\0';
	if (!strncmp(v, "ipv4:", 5) || !strncmp(v, "ipv6:", 5))
		v += 5;
	return valid_hostport(v);
}

int config_set(struct daemon_config *c, const char *section, const char *name,
	       const char *value, bool from_cli, char err[CONFIG_ERR_MAX])
{
	const struct key *k = find_key(section, name);
	int64_t x;
	bool b;

	if (!k) {
		if (!known_section(section))
			errf(err, "[%s] %s: unknown section '%s'", section, name, section);
		else
			errf(err, "[%s] %s: unknown key", section, name);
		return -EINVAL;
	}
	switch (k->type) {
	case K_STR:
	case K_PATH:
		if (strlen(value) >= 4096) {
			errf(err, "[%s] %s: value too long", section, name);
			return -EINVAL;
		}
		if (k->off == F(default_device)) {
			for (const char *p = value; *p; p++) {
				if (!islower((unsigned char)*p) && !isdigit((unsigned char)*p) &&
				    *p != '_') {
					errf(err, "[%s] %s: '%s' is not a device name (cpu, cuda)",
					     section, name, value);
					return -EINVAL;
				}
			}
		}
		if (k->off == F(share_socket) && value[0] &&
		    (value[0] != '/' || strlen(value) >= CONFIG_UNIX_PATH_MAX)) {
			errf(err, "[%s] %s: '%s' must be an absolute path shorter than %d bytes "
			     "(a unix socket's; clients connect to it by that name)",
			     section, name, value, CONFIG_UNIX_PATH_MAX);
			return -EINVAL;
		}
		if (k->off == F(save_on_stop) && value[0]) {
			if (value[0] == '/' || !strcmp(value, "..") || !strncmp(value, "../", 3) ||
			    strstr(value, "/../") ||
			    (strlen(value) >= 3 && !strcmp(value + strlen(value) - 3, "/.."))) {
				errf(err, "[%s] %s: '%s' must be a relative path without '..' (it is under checkpoint_root)",
				     section, name, value);
				return -EINVAL;
			}
		}
		return set_str(str_field(c, k), value);
	case K_ADDR:
		if (value[0] && !valid_hostport(value)) {
			errf(err, "[%s] %s: '%s' is not host:port", section, name, value);
			return -EINVAL;
		}
		return set_str(str_field(c, k), value);
	case K_INT:
	case K_I64:
		if (parse_int(value, &x) < 0 || x < k->min || x > k->max) {
			errf(err, "[%s] %s: '%s' is not an integer in [%lld, %lld]", section,
			     name, value, (long long)k->min, (long long)k->max);
			return -EINVAL;
		}
		if (k->type == K_INT)
			*(int *)((char *)c + k->off) = (int)x;
		else
			*(int64_t *)((char *)c + k->off) = x;
		return 0;
	case K_SIZE:
		if (parse_size(value, &x) < 0 || x < k->min || x > k->max) {
			errf(err, "[%s] %s: '%s' is not a size in [%lld, %lld] bytes (suffixes K, M, G)",
			     section, name, value, (long long)k->min, (long long)k->max);
			return -EINVAL;
		}
		*(int64_t *)((char *)c + k->off) = x;
		return 0;
	case K_MS: {
		char *end;
		double s;

		errno = 0;
		s = strtod(value, &end);
		if (errno || end == value || *end || !isfinite(s) || s < 0 ||
		    s * 1e3 > (double)k->max || llround(s * 1e3) < k->min) {
			errf(err, "[%s] %s: '%s' is not a number of seconds in [%g, %lld]",
			     section, name, value, (double)k->min / 1e3,
			     (long long)(k->max / 1000));
			return -EINVAL;
		}
		*(int64_t *)((char *)c + k->off) = (int64_t)llround(s * 1e3);
		return 0;
	}
	case K_BOOL:
		if (parse_bool(value, &b) < 0) {
			errf(err, "[%s] %s: '%s' is not a boolean (true/false, yes/no, on/off, 1/0)",
			     section, name, value);
			return -EINVAL;
		}
		*(bool *)((char *)c + k->off) = b;
		return 0;
	case K_LEVEL:
		for (int i = 0; i < 4; i++) {
			if (!strcmp(value, level_names[i])) {
				c->log_level = i;
				return 0;
			}
		}
		errf(err, "[%s] %s: '%s' is not one of error, warn, info, debug", section,
		     name, value);
		return -EINVAL;
	case K_LISTEN: {
		char *s;

		if (!valid_listen(value)) {
			errf(err, "[%s] %s: '%s' is not host:port, [v6]:port or unix:/path",
			     section, name, value);
			return -EINVAL;
		}
		if (from_cli && !c->listen_from_cli) {
			/* The first --listen replaces the file's addresses. */
			for (int i = 0; i < c->n_listen; i++)
				free(c->listen[i]);
			c->n_listen = 0;
			c->listen_from_cli = true;
		}
		if (c->n_listen == CONFIG_MAX_LISTEN) {
			errf(err, "[%s] %s: more than %d addresses", section, name,
			     CONFIG_MAX_LISTEN);
			return -EINVAL;
		}
		for (int i = 0; i < c->n_listen; i++) {
			if (!strcmp(c->listen[i], value)) {
				errf(err, "[%s] %s: '%s' given twice", section, name, value);
				return -EINVAL;
			}
		}
		s = strdup(value);
		if (!s)
			return -ENOMEM;
		c->listen[c->n_listen++] = s;
		return 0;
	}
	}
	return -EINVAL;
}

/* --- the file ------------------------------------------------------------ */

struct file_ctx {
	struct daemon_config *c;
	FILE *f;
	const char *path;
	int line;          /* line being parsed (counted by the reader) */
	int err_line;      /* first error (0: none) */
	bool long_line;    /* a line did not fit inih's buffer */
	char *err;
	bool file_has_listen;
};

/* inih reader: fgets that counts lines, so that the handler knows where it
 * is, and that notices lines longer than inih's buffer (inih would parse
 * the rest as another line). */
static char *reader(char *str, int num, void *stream)
{
	struct file_ctx *x = stream;
	size_t n;

	if (!fgets(str, num, x->f))
		return NULL;
	x->line++;
	n = strlen(str);
	if (n == (size_t)num - 1 && str[n - 1] != '\n' && !feof(x->f)) {
		int ch;

		/* Swallow the rest; the line is reported. */
		while ((ch = fgetc(x->f)) != EOF && ch != '\n')
			;
		if (!x->err_line) {
			x->err_line = x->line;
			errf(x->err, "%s:%d: line longer than %d characters", x->path,
			     x->line, num - 2);
		}
		str[0] = '\0';
	}
	return str;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
	struct file_ctx *x = user;
	const struct key *k = find_key(section, name);
	char msg[CONFIG_ERR_MAX];
	int r;

	if (x->err_line)
		return 1;  /* report the first error only */
	if (!section[0]) {
		x->err_line = x->line;
		errf(x->err, "%s:%d: %s: key outside a [section]", x->path, x->line, name);
		return 1;
	}
	if (k && k->type != K_LISTEN) {
		int idx = (int)(k - keys);

		if (x->c->set_line[idx]) {
			x->err_line = x->line;
			errf(x->err, "%s:%d: [%s] %s: given twice (first on line %d)", x->path,
			     x->line, section, name, x->c->set_line[idx]);
			return 1;
		}
		x->c->set_line[idx] = x->line;
	}
	if (k && k->type == K_LISTEN && !x->file_has_listen) {
		/* The file's addresses replace the built-in default. */
		for (int i = 0; i < x->c->n_listen; i++)
			free(x->c->listen[i]);
		x->c->n_listen = 0;
		x->file_has_listen = true;
	}
	r = config_set(x->c, section, name, value, false, msg);
	if (r < 0) {
		x->err_line = x->line;
		errf(x->err, "%s:%d: %s", x->path, x->line, msg);
	}
	return 1;
}

int config_load_file(struct daemon_config *c, const char *path, char err[CONFIG_ERR_MAX])
{
	struct file_ctx x;
	int r;

	memset(&x, 0, sizeof(x));
	x.c = c;
	x.path = path;
	x.err = err;
	x.f = fopen(path, "r");
	if (!x.f) {
		r = -errno;
		errf(err, "%s: cannot open: %s", path, strerror(errno));
		return r;
	}
	r = ini_parse_stream(reader, &x, handler, &x);
	fclose(x.f);
	/* The first error of the file is reported: inih's syntax error (r,
	 * its line) or the handler's (x.err_line, its message already in
	 * err), whichever comes first. */
	if (r != 0 && (!x.err_line || (r > 0 && r < x.err_line))) {
		errf(err, "%s:%d: syntax error (expected '[section]' or 'key = value')",
		     path, r > 0 ? r : x.line);
		return -EINVAL;
	}
	if (x.err_line)
		return -EINVAL;
	return 0;
}

/* --- checks -------------------------------------------------------------- */

bool config_addr_is_local(const char *addr)
{
	char host[256];
	const char *p = addr, *colon;
	size_t n;
	struct in_addr a4;
	struct in6_addr a6;

	if (!strncmp(p, "unix:", 5) || !strncmp(p, "unix-abstract:", 14))
		return true;
	if (!strncmp(p, "ipv4:", 5) || !strncmp(p, "ipv6:", 5))
		p += 5;
	colon = strrchr(p, ':');
	if (!colon)
		return false;
	n = (size_t)(colon - p);
	if (n >= 2 && p[0] == '[' && p[n - 1] == ']') {
		p++;
		n -= 2;
	}
	if (n == 0 || n >= sizeof(host))
		return false;  /* ":50051" binds every interface */
	memcpy(host, p, n);
	host[n] = '\0';
	if (!strcasecmp(host, "localhost"))
		return true;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1) {
		if (IN6_IS_ADDR_LOOPBACK(&a6))
			return true;
		return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
	}
	return false;
}

int config_validate(const struct daemon_config *c, char err[CONFIG_ERR_MAX])
{
	bool tls = c->tls_cert && c->tls_key;
	bool mtls = tls && c->tls_client_ca && c->tls_require_client_cert;

	if (c->n_listen == 0) {
		errf(err, "[server] listen: no address");
		return -EINVAL;
	}
	if (!!c->tls_cert != !!c->tls_key) {
		errf(err, "[tls] %s: missing (tls.cert and tls.key go together)",
		     c->tls_cert ? "key" : "cert");
		return -EINVAL;
	}
	if (c->tls_client_ca && !tls) {
		errf(err, "[tls] client_ca: mutual TLS needs the server's own cert and key");
		return -EINVAL;
	}
	if (c->max_inflight_request_bytes && c->max_inflight_request_bytes < c->max_request_bytes) {
		errf(err, "[server] max_inflight_request_bytes: %lld is below max_request_bytes = %lld "
		     "(a request of the largest size could never be accepted)",
		     (long long)c->max_inflight_request_bytes, (long long)c->max_request_bytes);
		return -EINVAL;
	}
	if (!c->checkpoint_root || !c->model_root) {
		errf(err, "[paths] %s: must be set", c->checkpoint_root ? "model_root" :
		     "checkpoint_root");
		return -EINVAL;
	}
	for (int i = 0; i < c->n_listen; i++) {
		if (config_addr_is_local(c->listen[i]) || c->insecure)
			continue;
		if (c->token_file || mtls)
			continue;
		errf(err,
		     "[server] listen: refusing to serve on non-loopback address '%s' without "
		     "client authentication: anyone who can reach it could run jobs, read the "
		     "weights and write checkpoints. Set [auth] token_file (bearer tokens) or "
		     "[tls] cert, key and client_ca (mutual TLS), or pass --insecure "
		     "(insecure = true) if the network itself is trusted", c->listen[i]);
		return -EINVAL;
	}
	return 0;
}

/* --- dump ---------------------------------------------------------------- */

static void dump_value(const struct daemon_config *c, const struct key *k, FILE *f)
{
	const char *s;

	switch (k->type) {
	case K_STR:
	case K_PATH:
	case K_ADDR:
		s = *(char *const *)((const char *)c + k->off);
		fprintf(f, "%s = %s\n", k->name, s ? s : "");
		return;
	case K_INT:
		fprintf(f, "%s = %d\n", k->name, *(const int *)((const char *)c + k->off));
		return;
	case K_I64:
	case K_SIZE:
		fprintf(f, "%s = %lld\n", k->name,
			(long long)*(const int64_t *)((const char *)c + k->off));
		return;
	case K_MS: {
		/* Exact: whole seconds, then the milliseconds without trailing
		 * zeros (1234567 ms -> 1234.567), so the dump reloads as is. */
		int64_t ms = *(const int64_t *)((const char *)c + k->off);
		int frac = (int)(ms % 1000), digits = 3;

		while (frac && frac % 10 == 0) {
			frac /= 10;
			digits--;
		}
		if (frac)
			fprintf(f, "%s = %lld.%0*d\n", k->name, (long long)(ms / 1000), digits, frac);
		else
			fprintf(f, "%s = %lld\n", k->name, (long long)(ms / 1000));
		return;
	}
	case K_BOOL:
		fprintf(f, "%s = %s\n", k->name,
			*(const bool *)((const char *)c + k->off) ? "true" : "false");
		return;
	case K_LEVEL:
		fprintf(f, "%s = %s\n", k->name, level_names[c->log_level]);
		return;
	case K_LISTEN:
		for (int i = 0; i < c->n_listen; i++)
			fprintf(f, "%s = %s\n", k->name, c->listen[i]);
		return;
	}
}

void config_dump(const struct daemon_config *c, FILE *f)
{
	const char *section = "";

	for (int i = 0; i < N_KEYS; i++) {
		if (strcmp(section, keys[i].section)) {
			section = keys[i].section;
			fprintf(f, "%s[%s]\n", i ? "\n" : "", section);
		}
		fprintf(f, "; %s\n", keys[i].help);
		dump_value(c, &keys[i], f);
	}
}
