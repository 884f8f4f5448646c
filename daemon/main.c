/* main.c — engined: configuration, signals, systemd notification, lifetime.
 *
 *   engined [--config FILE] [options]        serve
 *   engined --check-config FILE [options]    validate, print, exit 0 / 1
 *
 * Settings come from the built-in defaults, then the INI file, then the
 * command line in order (`-o section.key=value` sets any key; the flags
 * below are shorthands). See config.c for the keys.
 *
 * Start, before any thread exists: the OpenMP wait policy (omp_policy.h:
 * one re-exec when the environment sets none), then `[engine] threads = 0`
 * resolved to the process's CPU budget (engine_cpu_budget); both logged
 * in one "engine threads:" line.
 *
 * Signals: SIGINT/SIGTERM/SIGHUP are blocked before any thread exists
 * (gRPC's threads inherit the mask) and handled by the libuv loop of the
 * main thread. SIGTERM/SIGINT: stop accepting, let the running job finish
 * (bounded by shutdown.grace_s), save_on_stop, exit 0 (1 when the grace ran
 * out). SIGHUP: re-read the token file and the TLS files.
 *
 * systemd (Type=notify): READY=1 once every address is bound and the
 * pollers run; WATCHDOG=1 from a libuv timer at half WATCHDOG_USEC, held
 * back while one job has run longer than watchdog.stuck_job_s; STATUS=
 * with the engine state and the running job's progress; STOPPING=1 on
 * shutdown. Without NOTIFY_SOCKET these are no-ops. The same timer ends
 * Health watches whose client left and logs the [log] slow_job_s lines.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>
#include <uv.h>

#include "checked.h"
#include "lifecycle.h"
#include "log.h"
#include "omp_policy.h"
#include "paths.h"
#include "test_hold.h"
#include "tls.h"

#ifndef ENGINED_VERSION
#define ENGINED_VERSION "unknown"
#endif

static void usage(FILE *f)
{
	fprintf(f,
		"usage: engined [--config FILE] [options]\n"
		"       engined --check-config FILE [options]\n"
		"  -c, --config FILE        read settings from FILE (INI; see README)\n"
		"  --check-config FILE      validate FILE (and the options), print the\n"
		"                           effective settings, exit 0 (valid) or 1\n"
		"  -o, --set SECTION.KEY=V  set any key (overrides the file)\n"
		"  --listen ADDR            server.listen; repeat for several addresses\n"
		"                           (host:port, [v6]:port, unix:/path; port 0 picks one)\n"
		"  --checkpoint-root DIR    paths.checkpoint_root (default ./var/checkpoints)\n"
		"  --model-root DIR         paths.model_root (default ./var/models)\n"
		"  --dist-store-root DIR    dist.store_root (default ./var/dist)\n"
		"  --threads N              engine.threads (default 0: the CPUs this process\n"
		"                           may use: affinity mask, cgroup CPU quota)\n"
		"  --log-level L            log.level: error, warn, info (default), debug\n"
		"  --max-request-bytes N    server.max_request_bytes (default 512M)\n"
		"  --pollers N              server.pollers (default 1)\n"
		"  --port-file PATH         server.port_file: bound TCP ports, one a line\n"
		"  --share-socket PATH      server.share_socket: ShareWeights' unix socket\n"
		"  --tls-cert FILE          tls.cert     --tls-key FILE   tls.key\n"
		"  --tls-client-ca FILE     tls.client_ca (mutual TLS)\n"
		"  --token-file FILE        auth.token_file (bearer tokens)\n"
		"  --metrics-listen ADDR    metrics.listen (Prometheus text, GET /metrics)\n"
		"  --insecure               server.insecure: allow a non-loopback address\n"
		"                           without tokens or mutual TLS\n"
		"  --version, --help\n");
}

/* Shorthand flags: option value -> "section.key". */
struct flag_key {
	int val;
	const char *section, *key;
};

enum {
	OPT_CHECK = 1000, OPT_LISTEN, OPT_CKPT, OPT_MODEL, OPT_DIST_STORE, OPT_THREADS, OPT_LEVEL,
	OPT_MAXREQ, OPT_POLLERS, OPT_PORTFILE, OPT_CERT, OPT_KEY, OPT_CA, OPT_TOKENS,
	OPT_METRICS, OPT_INSECURE, OPT_VERSION, OPT_SHARE_SOCKET,
};

static const struct flag_key flag_keys[] = {
	{ OPT_LISTEN, "server", "listen" },
	{ OPT_CKPT, "paths", "checkpoint_root" },
	{ OPT_MODEL, "paths", "model_root" },
	{ OPT_DIST_STORE, "dist", "store_root" },
	{ OPT_THREADS, "engine", "threads" },
	{ OPT_LEVEL, "log", "level" },
	{ OPT_MAXREQ, "server", "max_request_bytes" },
	{ OPT_POLLERS, "server", "pollers" },
	{ OPT_PORTFILE, "server", "port_file" },
	{ OPT_SHARE_SOCKET, "server", "share_socket" },
	{ OPT_CERT, "tls", "cert" },
	{ OPT_KEY, "tls", "key" },
	{ OPT_CA, "tls", "client_ca" },
	{ OPT_TOKENS, "auth", "token_file" },
	{ OPT_METRICS, "metrics", "listen" },
	{ OPT_INSECURE, "server", "insecure" },
};

static const struct option opts[] = {
	{ "config", required_argument, NULL, 'c' },
	{ "check-config", required_argument, NULL, OPT_CHECK },
	{ "set", required_argument, NULL, 'o' },
	{ "listen", required_argument, NULL, OPT_LISTEN },
	{ "checkpoint-root", required_argument, NULL, OPT_CKPT },
	{ "model-root", required_argument, NULL, OPT_MODEL },
	{ "dist-store-root", required_argument, NULL, OPT_DIST_STORE },
	{ "threads", required_argument, NULL, OPT_THREADS },
	{ "log-level", required_argument, NULL, OPT_LEVEL },
	{ "max-request-bytes", required_argument, NULL, OPT_MAXREQ },
	{ "pollers", required_argument, NULL, OPT_POLLERS },
	{ "port-file", required_argument, NULL, OPT_PORTFILE },
	{ "share-socket", required_argument, NULL, OPT_SHARE_SOCKET },
	{ "tls-cert", required_argument, NULL, OPT_CERT },
	{ "tls-key", required_argument, NULL, OPT_KEY },
	{ "tls-client-ca", required_argument, NULL, OPT_CA },
	{ "token-file", required_argument, NULL, OPT_TOKENS },
	{ "metrics-listen", required_argument, NULL, OPT_METRICS },
	{ "insecure", no_argument, NULL, OPT_INSECURE },
	{ "version", no_argument, NULL, OPT_VERSION },
	{ "help", no_argument, NULL, 'h' },
	{ NULL, 0, NULL, 0 },
};

/* `-o section.key=value`. */
static int set_dotted(struct daemon_config *cfg, const char *arg, char err[CONFIG_ERR_MAX])
{
	char buf[4200];
	char *dot, *eq;

	if (strlen(arg) >= sizeof(buf)) {
		snprintf(err, CONFIG_ERR_MAX, "-o: argument too long");
		return -EINVAL;
	}
	strcpy(buf, arg);
	eq = strchr(buf, '=');
	dot = strchr(buf, '.');
	if (!eq || !dot || dot > eq) {
		snprintf(err, CONFIG_ERR_MAX, "expected SECTION.KEY=VALUE");
		return -EINVAL;
	}
	*dot = '\0';
	*eq = '\0';
	return config_set(cfg, buf, dot + 1, eq + 1, true, err);
}

/* Parse the command line over the file's settings. Returns 0, 1 (config
 * error, message printed) or 2 (usage); *ret_exit_now for --help/--version. */
static int parse_args(int argc, char **argv, struct daemon_config *cfg,
		      const char **ret_check, bool *ret_exit_now)
{
	const char *file = NULL, *check = NULL;
	char err[CONFIG_ERR_MAX];
	int c, r;

	/* Pass 1: which file. */
	opterr = 1;
	while ((c = getopt_long(argc, argv, "c:o:h", opts, NULL)) != -1) {
		switch (c) {
		case 'c': file = optarg; break;
		case OPT_CHECK: check = optarg; break;
		case OPT_VERSION:
			printf("engined %s\n", ENGINED_VERSION);
			*ret_exit_now = true;
			return 0;
		case 'h':
			usage(stdout);
			*ret_exit_now = true;
			return 0;
		case '?':
			usage(stderr);
			return 2;
		default:
			break;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "engined: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (check && file && strcmp(check, file)) {
		fprintf(stderr, "engined: --config and --check-config name different files\n");
		return 2;
	}
	if (check)
		file = check;
	if (file && config_load_file(cfg, file, err) < 0) {
		fprintf(stderr, "engined: %s\n", err);
		return 1;
	}

	/* Pass 2: the command line overrides, in order. */
	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "c:o:h", opts, NULL)) != -1) {
		const struct flag_key *fk = NULL;

		if (c == 'o') {
			r = set_dotted(cfg, optarg, err);
			if (r < 0) {
				fprintf(stderr, "engined: -o %s: %s\n", optarg, err);
				return 1;
			}
			continue;
		}
		for (size_t i = 0; i < sizeof(flag_keys) / sizeof(flag_keys[0]); i++)
			if (flag_keys[i].val == c)
				fk = &flag_keys[i];
		if (!fk)
			continue;
		r = config_set(cfg, fk->section, fk->key, c == OPT_INSECURE ? "true" : optarg,
			       true, err);
		if (r < 0) {
			fprintf(stderr, "engined: %s\n", err);
			return 1;
		}
	}
	if (cfg->max_send_bytes == 0)
		cfg->max_send_bytes = cfg->max_request_bytes > (64LL << 20) ?
				      cfg->max_request_bytes : (64LL << 20);
	if (config_validate(cfg, err) < 0) {
		fprintf(stderr, "engined: %s\n", err);
		return 1;
	}
	if (cfg->max_inflight_request_bytes == 0)
		cfg->max_inflight_request_bytes = 2 * cfg->max_request_bytes;
	if (cfg->max_share_bytes == 0) {
		long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
		int64_t ram;

		cfg->max_share_bytes = pages > 0 && page > 0 &&
				       ck_mul_i64(pages, page, &ram) ? ram / 2 : (1LL << 30);
	}
	*ret_check = check;
	return 0;
}

/* --- the loop: signals, watchdog, status ---------------------------------- */

/* The longest period of the main loop's timer (ms): how late a Health
 * watch whose client left is ended at most. */
#define TICK_MS 500

struct main_ctx {
	struct daemon *d;
	uv_loop_t loop;
	uv_signal_t sig_int, sig_term, sig_hup;
	uv_timer_t tick;
	bool notify;              /* NOTIFY_SOCKET is set */
	uint64_t watchdog_usec;   /* 0: off */
	bool stuck;               /* pings held back */
	uint64_t slow_seq;        /* the job the slow-job line is about */
	double slow_next_s;       /* its next line when it has run this long */
	char last_status[512];
	char listen_desc[256];
};

static void status_line(struct main_ctx *m, char *buf, size_t len)
{
	static const char *const modes[] = { "IDLE", "TRAIN", "EVAL" };
	struct daemon *d = m->d;
	struct engine_status st;
	struct daemon_job_view jv;
	char run[160] = "idle";
	int64_t queued;

	pthread_mutex_lock(&d->lock);
	st = d->snap;
	queued = d->queued;
	pthread_mutex_unlock(&d->lock);
	daemon_job_view(d, &jv);
	if (jv.busy && jv.progress.total > 0)
		snprintf(run, sizeof(run), "running %s (%.0f s, %s %.0f%%)", jv.job, jv.seconds,
			 jv.progress.phase,
			 100.0 * (double)jv.progress.done / (double)jv.progress.total);
	else if (jv.busy)
		snprintf(run, sizeof(run), "running %s (%.0f s)", jv.job, jv.seconds);
	if (!st.initialized)
		snprintf(buf, len, "serving on %s; engine not initialized; %s", m->listen_desc,
			 run);
	else
		snprintf(buf, len, "serving on %s; %s step %lld, mode %s, %s, %lld queued",
			 m->listen_desc, st.key, (long long)st.step,
			 modes[st.mode <= ENGINE_MODE_EVAL ? st.mode : 0], run,
			 (long long)queued);
}

/* [log] slow_job_s: one line when a job has run that long, and again
 * each further slow_job_s, saying where it is. */
static void slow_job_line(struct main_ctx *m)
{
	struct daemon *d = m->d;
	struct daemon_job_view jv;
	double every = (double)d->cfg.slow_job_ms / 1e3;

	if (d->cfg.slow_job_ms <= 0)
		return;
	daemon_job_view(d, &jv);
	if (!jv.busy)
		return;
	if (jv.seq != m->slow_seq) {
		m->slow_seq = jv.seq;
		m->slow_next_s = every;
	}
	if (jv.seconds < m->slow_next_s)
		return;
	while (m->slow_next_s <= jv.seconds)
		m->slow_next_s += every;
	if (jv.progress.phase[0] || jv.progress.total)
		log_msg(LOG_LVL_INFO, "job %s running for %.1f s: %s, %lld/%lld %s", jv.job,
			jv.seconds, jv.progress.phase[0] ? jv.progress.phase : "-",
			(long long)jv.progress.done, (long long)jv.progress.total,
			jv.progress.unit);
	else
		log_msg(LOG_LVL_INFO, "job %s running for %.1f s: no progress reported", jv.job,
			jv.seconds);
}

static void on_tick(uv_timer_t *t)
{
	struct main_ctx *m = t->data;
	struct daemon *d = m->d;
	char st[512];
	double job_s;

	health_reap(&d->health);
	slow_job_line(m);

	if (m->watchdog_usec) {
		job_s = daemon_job_seconds(d);
		if (d->cfg.stuck_job_ms > 0 && job_s * 1e3 > (double)d->cfg.stuck_job_ms) {
			if (!m->stuck) {
				m->stuck = true;
				log_msg(LOG_LVL_ERROR,
					"watchdog: one job has run %.1f s (> watchdog.stuck_job_s = %.1f s); no longer pinging systemd",
					job_s, (double)d->cfg.stuck_job_ms / 1e3);
				sd_notifyf(0, "STATUS=engine stuck: one job has run %.0f s", job_s);
			}
		} else {
			if (m->stuck)
				log_msg(LOG_LVL_WARN, "watchdog: the long job ended; pinging again");
			m->stuck = false;
			sd_notify(0, "WATCHDOG=1");
		}
	}
	if (m->notify && !m->stuck) {
		status_line(m, st, sizeof(st));
		if (strcmp(st, m->last_status)) {
			sd_notifyf(0, "STATUS=%s", st);
			snprintf(m->last_status, sizeof(m->last_status), "%s", st);
		}
	}
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct main_ctx *m = h->data;

	if (signum == SIGHUP) {
		struct eng_error err;

		eng_error_clear(&err);
		log_msg(LOG_LVL_INFO, "received SIGHUP: re-reading tokens and certificates");
		sd_notify(0, "RELOADING=1");
		(void)daemon_reload(m->d, &err);
		sd_notify(0, "READY=1");
		return;
	}
	log_msg(LOG_LVL_INFO, "received %s: finishing the running job, then exiting",
		signum == SIGINT ? "SIGINT" : "SIGTERM");
	uv_stop(h->loop);
}

static int write_port_file(const struct daemon_config *cfg, struct daemon *d)
{
	char tmp[4200];
	FILE *f;

	if (!cfg->port_file)
		return 0;
	/* Written whole then renamed: a reader never sees a partial file. */
	snprintf(tmp, sizeof(tmp), "%s.tmp-%d", cfg->port_file, (int)getpid());
	f = fopen(tmp, "w");
	if (!f)
		goto fail;
	for (int i = 0; i < cfg->n_listen; i++)
		if (rpc_server_port_of(d->rpc, i) > 0)
			fprintf(f, "%d\n", rpc_server_port_of(d->rpc, i));
	if (fclose(f) != 0 || rename(tmp, cfg->port_file) < 0)
		goto fail;
	return 0;
fail:
	log_msg(LOG_LVL_WARN, "server.port_file: cannot write %s: %s", cfg->port_file,
		strerror(errno));
	unlink(tmp);
	return -errno;
}

/* The addresses with the ports actually bound ("127.0.0.1:0" -> ":41234"). */
static void describe_listen(const struct daemon_config *cfg, struct daemon *d,
			    char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (int i = 0; i < cfg->n_listen && off < len; i++) {
		const char *a = cfg->listen[i];
		const char *colon = strrchr(a, ':');
		int port = rpc_server_port_of(d->rpc, i);

		if (port > 0 && colon)
			off += (size_t)snprintf(buf + off, len - off, "%s%.*s:%d", i ? ", " : "",
						(int)(colon - a), a, port);
		else
			off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", a);
	}
}

/* [engine] threads = 0: the process's CPU budget (affinity mask, cgroup
 * quota), decided here once so that the engine, the stream workers and the
 * log agree; and the OpenMP wait policy those threads run with. */
static void resolve_threads(struct daemon_config *cfg)
{
	char desc[640], policy[256];
	int threads = engine_cpu_budget(desc, sizeof(desc));

	omp_policy_describe(policy, sizeof(policy));
	if (cfg->threads == 0) {
		cfg->threads = threads;
		log_msg(LOG_LVL_INFO, "engine threads: %s; OpenMP: %s", desc, policy);
		return;
	}
	log_msg(LOG_LVL_INFO,
		"engine threads: %d, from [engine] threads (the CPU budget: %s); OpenMP: %s",
		cfg->threads, desc, policy);
	if (cfg->threads > threads)
		log_msg(LOG_LVL_WARN,
			"[engine] threads = %d is more than this process may use at once (%d): "
			"its threads will wait for each other", cfg->threads, threads);
}

static int check_config(const struct daemon_config *cfg, const char *file)
{
	struct eng_error err;
	struct auth_tokens *t = NULL;
	struct tls_pem pem;

	eng_error_clear(&err);
	if (cfg->token_file) {
		if (auth_tokens_load(cfg->token_file, &t, &err) < 0) {
			fprintf(stderr, "engined: %s: auth.token_file: %s\n", file, err.msg);
			return 1;
		}
		fprintf(stderr, "engined: %s: %d tokens\n", cfg->token_file, auth_tokens_count(t));
		auth_tokens_free(t);
	}
	if (cfg->tls_cert) {
		if (tls_pem_load(cfg->tls_cert, cfg->tls_key, cfg->tls_client_ca, &pem, &err) < 0) {
			fprintf(stderr, "engined: %s: %s\n", file, err.msg);
			return 1;
		}
		fprintf(stderr, "engined: TLS certificate %s, valid until %s%s\n", pem.subject,
			pem.not_after, pem.client_ca ? "; client certificates verified" : "");
		tls_pem_free(&pem);
	}
	printf("; engined %s: effective configuration of %s\n", ENGINED_VERSION, file);
	config_dump(cfg, stdout);
	fprintf(stderr, "engined: %s: configuration OK\n", file);
	return 0;
}

int main(int argc, char **argv)
{
	static struct daemon_config cfg;
	static struct daemon d;
	static struct main_ctx m;
	const char *check = NULL;
	char *ckpt_real = NULL, *model_real = NULL, *dist_real = NULL;
	char errbuf[1024];
	struct eng_error err;
	struct tls_pem pem;
	bool have_pem = false, exit_now = false, failed;
	sigset_t mask;
	char **args;
	int r;

	/* getopt permutes argv: the re-exec of omp_policy_apply gets the
	 * arguments as given. */
	args = calloc((size_t)argc + 1, sizeof(*args));
	if (!args || config_init(&cfg) < 0) {
		free(args);
		fprintf(stderr, "engined: out of memory\n");
		return 1;
	}
	memcpy(args, argv, (size_t)argc * sizeof(*args));
	r = parse_args(argc, argv, &cfg, &check, &exit_now);
	if (r || exit_now) {
		free(args);
		config_free(&cfg);
		return r;
	}
	if (check) {
		free(args);
		r = check_config(&cfg, check);
		config_free(&cfg);
		return r;
	}
	log_set_level((enum log_level)cfg.log_level);
	omp_policy_apply(args);
	free(args);
	resolve_threads(&cfg);
	test_hold_init();

	eng_error_clear(&err);
	if (cfg.tls_cert) {
		if (tls_pem_load(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca, &pem, &err) < 0) {
			fprintf(stderr, "engined: %s\n", err.msg);
			config_free(&cfg);
			return 1;
		}
		have_pem = true;
	}
	if (paths_prepare_root(cfg.checkpoint_root, &ckpt_real, &err) < 0 ||
	    paths_prepare_root(cfg.model_root, &model_real, &err) < 0 ||
	    paths_prepare_root(cfg.dist_store_root, &dist_real, &err) < 0) {
		fprintf(stderr, "engined: %s\n", err.msg);
		return 1;
	}
	free(cfg.checkpoint_root);
	free(cfg.model_root);
	free(cfg.dist_store_root);
	cfg.checkpoint_root = ckpt_real;
	cfg.model_root = model_real;
	cfg.dist_store_root = dist_real;
	for (int i = 0; i < cfg.n_listen; i++) {
		if (config_addr_is_local(cfg.listen[i]))
			continue;
		if (cfg.insecure && !cfg.token_file && !(have_pem && cfg.tls_client_ca))
			log_msg(LOG_LVL_WARN,
				"%s: serving without client authentication (server.insecure): anyone who reaches this address controls the engine",
				cfg.listen[i]);
		else if (!have_pem)
			log_msg(LOG_LVL_WARN,
				"%s: bearer tokens travel in clear text without TLS; set [tls] cert and key",
				cfg.listen[i]);
	}
	(void)engine_registry_keys();  /* fill its static table before threads */

	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);

	r = daemon_init(&d, &cfg, errbuf, sizeof(errbuf));
	if (r == 0) {
		d.tls_cert = have_pem ? pem.cert : NULL;
		d.tls_key = have_pem ? pem.key : NULL;
		d.tls_client_ca = have_pem ? pem.client_ca : NULL;
		r = daemon_start(&d, errbuf, sizeof(errbuf));
	}
	if (have_pem) {
		/* gRPC has its own copy now. */
		tls_pem_free(&pem);
		d.tls_cert = d.tls_key = d.tls_client_ca = NULL;
	}
	if (r < 0) {
		fprintf(stderr, "engined: %s\n", errbuf);
		sd_notifyf(0, "STATUS=failed to start: %s\nERRNO=%d", errbuf, -r);
		daemon_fini(&d);
		config_free(&cfg);
		return 1;
	}
	describe_listen(&cfg, &d, m.listen_desc, sizeof(m.listen_desc));
	log_msg(LOG_LVL_INFO,
		"engined %s serving on %s%s%s; checkpoints under %s, models under %s; engines: %s",
		ENGINED_VERSION, m.listen_desc, have_pem ? (cfg.tls_client_ca ?
		" (mutual TLS)" : " (TLS)") : "", cfg.token_file ? " with bearer tokens" : "",
		ckpt_real, model_real, engine_registry_keys());
	if (!engine_device_built("cuda"))
		log_msg(LOG_LVL_INFO, "the CUDA device was not built into this binary (devices: %s)",
			engine_device_names());
	if (d.metrics.http_port > 0)
		log_msg(LOG_LVL_INFO,
			"metrics on http://%s/metrics (port %d; %d connections, %d per address, "
			"idle ones closed after %d s)", cfg.metrics_listen, d.metrics.http_port,
			d.metrics.max_conns, d.metrics.max_conns_per_addr,
			d.metrics.idle_timeout_s);
	if (cfg.share_socket)
		log_msg(LOG_LVL_INFO,
			"ShareWeights on %s (mode 0660): handles valid %.1f s, at most %d shares "
			"and %lld bytes pending", cfg.share_socket, (double)cfg.share_ttl_ms / 1e3,
			cfg.max_shares, (long long)cfg.max_share_bytes);
	(void)write_port_file(&cfg, &d);

	/* Every address is bound and the pollers run: calls are answered. */
	m.d = &d;
	m.notify = getenv("NOTIFY_SOCKET") != NULL;
	if (sd_watchdog_enabled(0, &m.watchdog_usec) <= 0)
		m.watchdog_usec = 0;
	status_line(&m, m.last_status, sizeof(m.last_status));
	sd_notifyf(0, "READY=1\nSTATUS=%s\nMAINPID=%d", m.last_status, (int)getpid());

	uv_loop_init(&m.loop);
	uv_signal_init(&m.loop, &m.sig_int);
	uv_signal_init(&m.loop, &m.sig_term);
	uv_signal_init(&m.loop, &m.sig_hup);
	m.sig_int.data = m.sig_term.data = m.sig_hup.data = &m;
	uv_signal_start(&m.sig_int, on_signal, SIGINT);
	uv_signal_start(&m.sig_term, on_signal, SIGTERM);
	uv_signal_start(&m.sig_hup, on_signal, SIGHUP);
	uv_timer_init(&m.loop, &m.tick);
	m.tick.data = &m;
	{
		/* Always on: it also ends Health watches whose client left and
		 * writes the slow-job lines. */
		uint64_t period = m.watchdog_usec ? m.watchdog_usec / 2000 : TICK_MS;

		if (cfg.slow_job_ms > 0 && (uint64_t)cfg.slow_job_ms < period)
			period = (uint64_t)cfg.slow_job_ms;
		if (period < 10)
			period = 10;
		if (period > TICK_MS)
			period = TICK_MS;
		if (m.watchdog_usec)
			log_msg(LOG_LVL_INFO, "watchdog: pinging systemd every %llu ms",
				(unsigned long long)period);
		uv_timer_start(&m.tick, on_tick, 0, period);
	}
	/* Only this thread takes the signals (libuv forwards them to the loop). */
	pthread_sigmask(SIG_UNBLOCK, &mask, NULL);
	uv_run(&m.loop, UV_RUN_DEFAULT);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);

	sd_notify(0, "STOPPING=1\nSTATUS=draining: finishing the running job");
	r = daemon_stop(&d);
	if (r < 0) {
		/* The engine thread still runs: nothing it uses may be freed. */
		sd_notify(0, "STATUS=shutdown grace ran out");
		log_msg(LOG_LVL_ERROR, "engined exiting with the job still running");
		_exit(1);
	}
	uv_close((uv_handle_t *)&m.sig_int, NULL);
	uv_close((uv_handle_t *)&m.sig_term, NULL);
	uv_close((uv_handle_t *)&m.sig_hup, NULL);
	uv_close((uv_handle_t *)&m.tick, NULL);
	uv_run(&m.loop, UV_RUN_DEFAULT);
	uv_loop_close(&m.loop);
	failed = d.engine_failed != NULL;
	daemon_fini(&d);
	config_free(&cfg);
	log_msg(failed ? LOG_LVL_ERROR : LOG_LVL_INFO, "engined stopped%s",
		failed ? " after a device failure (exit 1: restart me)" : "");
	return failed ? 1 : 0;
}
