/* main.c — engined: command line, signals, lifetime.
 *
 *   engined [--listen ADDR] [--checkpoint-root DIR] [--model-root DIR]
 *           [--threads N] [--log-level L] [--max-request-bytes N]
 *           [--pollers N] [--port-file PATH]
 *
 * SIGINT/SIGTERM are blocked before any thread exists (gRPC's threads
 * inherit the mask) and handled by the libuv loop of the main thread; on
 * either the daemon refuses new calls, lets the running job finish, and
 * exits 0.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "daemon.h"
#include "log.h"
#include "paths.h"

#ifndef ENGINED_VERSION
#define ENGINED_VERSION "unknown"
#endif

static void usage(FILE *f)
{
	fprintf(f,
		"usage: engined [options]\n"
		"  --listen ADDR           address to serve on (default 127.0.0.1:50051;\n"
		"                          unix:/path for a unix socket; port 0 picks one)\n"
		"  --checkpoint-root DIR   checkpoints live under DIR (default ./var/checkpoints)\n"
		"  --model-root DIR        model_path of Initialize is under DIR (default ./var/models)\n"
		"  --threads N             engine compute threads (default: all cores)\n"
		"  --log-level L           error, warn, info (default) or debug\n"
		"  --max-request-bytes N   request size limit (default 536870912)\n"
		"  --pollers N             gRPC completion-queue threads (default 1)\n"
		"  --port-file PATH        write the bound TCP port to PATH once serving\n"
		"  --version, --help\n");
}

static int parse_i64(const char *s, int64_t min, int64_t *ret)
{
	char *end;
	long long v;

	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || end == s || *end || v < min)
		return -EINVAL;
	*ret = v;
	return 0;
}

static void on_signal(uv_signal_t *h, int signum)
{
	log_msg(LOG_LVL_INFO, "received %s: finishing the running job, then exiting",
		signum == SIGINT ? "SIGINT" : "SIGTERM");
	uv_stop(h->loop);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "listen", required_argument, NULL, 'l' },
		{ "checkpoint-root", required_argument, NULL, 'c' },
		{ "model-root", required_argument, NULL, 'm' },
		{ "threads", required_argument, NULL, 't' },
		{ "log-level", required_argument, NULL, 'L' },
		{ "max-request-bytes", required_argument, NULL, 'R' },
		{ "pollers", required_argument, NULL, 'P' },
		{ "port-file", required_argument, NULL, 'p' },
		{ "version", no_argument, NULL, 'V' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct daemon_config cfg;
	static struct daemon d;
	const char *ckpt_root = "./var/checkpoints", *model_root = "./var/models";
	const char *port_file = NULL;
	char *ckpt_real = NULL, *model_real = NULL;
	char errbuf[512];
	struct eng_error err;
	sigset_t mask;
	uv_loop_t loop;
	uv_signal_t sig_int, sig_term;
	enum log_level lvl;
	int64_t v;
	int c, r;

	memset(&cfg, 0, sizeof(cfg));
	cfg.listen = "127.0.0.1:50051";
	cfg.pollers = 1;
	cfg.max_request_bytes = 512LL << 20;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'l': cfg.listen = optarg; break;
		case 'c': ckpt_root = optarg; break;
		case 'm': model_root = optarg; break;
		case 'p': port_file = optarg; break;
		case 't':
			if (parse_i64(optarg, 0, &v) < 0 || v > 1024)
				goto bad;
			cfg.threads = (int)v;
			break;
		case 'P':
			if (parse_i64(optarg, 1, &v) < 0 || v > 8)
				goto bad;
			cfg.pollers = (int)v;
			break;
		case 'R':
			if (parse_i64(optarg, 1024, &v) < 0 || v > INT32_MAX)
				goto bad;
			cfg.max_request_bytes = v;
			break;
		case 'L':
			if (log_parse_level(optarg, &lvl) < 0)
				goto bad;
			log_set_level(lvl);
			break;
		case 'V':
			printf("engined %s\n", ENGINED_VERSION);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "engined: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	/* Replies and streams are at most a bucket plus headers, or a request's
	 * worth of per-token outputs. */
	cfg.max_send_bytes = cfg.max_request_bytes > (64LL << 20) ?
			     cfg.max_request_bytes : (64LL << 20);

	eng_error_clear(&err);
	if (paths_prepare_root(ckpt_root, &ckpt_real, &err) < 0 ||
	    paths_prepare_root(model_root, &model_real, &err) < 0) {
		fprintf(stderr, "engined: %s\n", err.msg);
		return 1;
	}
	cfg.checkpoint_root = ckpt_real;
	cfg.model_root = model_real;
	(void)engine_registry_keys();  /* fill its static table before threads */

	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);

	daemon_init(&d, &cfg, errbuf, sizeof(errbuf));
	r = daemon_start(&d, errbuf, sizeof(errbuf));
	if (r < 0) {
		fprintf(stderr, "engined: %s\n", errbuf);
		daemon_fini(&d);
		return 1;
	}
	log_msg(LOG_LVL_INFO,
		"engined %s serving on %s (port %d); checkpoints under %s, models under %s; engines: %s",
		ENGINED_VERSION, cfg.listen, rpc_server_port(d.rpc), ckpt_real, model_real,
		engine_registry_keys());
	if (port_file) {
		FILE *f = fopen(port_file, "w");

		if (f) {
			fprintf(f, "%d\n", rpc_server_port(d.rpc));
			fclose(f);
		} else {
			log_msg(LOG_LVL_WARN, "cannot write %s: %s", port_file, strerror(errno));
		}
	}

	uv_loop_init(&loop);
	uv_signal_init(&loop, &sig_int);
	uv_signal_init(&loop, &sig_term);
	uv_signal_start(&sig_int, on_signal, SIGINT);
	uv_signal_start(&sig_term, on_signal, SIGTERM);
	/* Only this thread takes the signals (libuv forwards them to the loop). */
	pthread_sigmask(SIG_UNBLOCK, &mask, NULL);
	uv_run(&loop, UV_RUN_DEFAULT);
	pthread_sigmask(SIG_BLOCK, &mask, NULL);

	daemon_stop(&d);
	uv_close((uv_handle_t *)&sig_int, NULL);
	uv_close((uv_handle_t *)&sig_term, NULL);
	uv_run(&loop, UV_RUN_DEFAULT);
	uv_loop_close(&loop);
	daemon_fini(&d);
	free(ckpt_real);
	free(model_real);
	log_msg(LOG_LVL_INFO, "engined stopped");
	return 0;

bad:
	fprintf(stderr, "engined: bad option value '%s'\n", optarg);
	usage(stderr);
	return 2;
}
