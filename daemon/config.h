/* config.h — every setting of engined, from an INI file (libinih) and the
 * command line.
 *
 * One table (config.c) names each key as "section.key", its type and its
 * limits; the file, `-o section.key=value` and the dedicated flags all go
 * through config_set(), so a key is validated the same way wherever it
 * comes from. Errors name the key and, for the file, the line:
 *   "/etc/engined/0.conf:12: [server] pollers: '0' is not an integer in [1, 8]".
 *
 * Strings are owned by the config (config_free). After config_validate()
 * the config is complete; main realpath's the roots into `checkpoint_root`
 * and `model_root` before the daemon starts.
 */
#ifndef ENGINED_DAEMON_CONFIG_H
#define ENGINED_DAEMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CONFIG_MAX_LISTEN 8
#define CONFIG_ERR_MAX 512
#define CONFIG_UNIX_PATH_MAX 108     /* sizeof(sockaddr_un.sun_path) */
#define CONFIG_MAX_ADAPTERS 4096     /* [lora] max_adapters' upper bound */

struct daemon_config {
	/* [server] */
	char *listen[CONFIG_MAX_LISTEN];  /* "127.0.0.1:50051", "unix:/path" */
	int n_listen;
	int pollers;                  /* completion-queue threads */
	int64_t max_request_bytes;    /* request size limit */
	int64_t max_inflight_request_bytes;  /* held requests, all calls; 0: derived */
	int64_t max_send_bytes;       /* reply / stream message limit; 0: derived */
	int max_concurrent_calls;     /* engine jobs queued + running; 0: no limit */
	int replay_entries;           /* request ids remembered */
	int64_t replay_bytes;         /* reply bytes kept for replays */
	int max_concurrent_streams;   /* HTTP/2 streams per connection */
	int64_t default_deadline_ms;  /* for calls without a deadline; 0: none */
	char *port_file;              /* bound TCP ports, one a line */
	bool insecure;                /* allow non-loopback without client auth */
	char *share_socket;           /* ShareWeights' unix socket (absolute); NULL: off */
	int64_t share_ttl_ms;         /* a share handle's lifetime */
	int max_shares;               /* shares pending at once */
	int64_t max_share_bytes;      /* their bytes; 0: derived (main.c: half the RAM) */

	/* [paths] */
	char *checkpoint_root;        /* realpath'ed by main before the start */
	char *model_root;

	/* [dist] */
	char *dist_store_root;        /* Gloo FileStore root (realpath'ed by main) */
	char *dist_host;              /* address Gloo's pairs listen on; NULL: host name */
	int64_t dist_timeout_ms;      /* collectives when DistConfig gives none */

	/* [engine] */
	int threads;                  /* engine compute threads; 0: the CPU budget (main.c) */
	char *default_device;         /* Initialize.device when empty; NULL: engine's */
	bool param_offload;           /* Initialize.offload when absent */
	bool optimizer_offload;
	int64_t default_micro_batch_tokens;  /* 0: engine default */

	/* [lora] */
	int max_adapters;             /* live LoRA adapters; 0: none */
	int64_t max_adapter_bytes;    /* their state, 16 bytes a parameter */

	/* [tls] */
	char *tls_cert;               /* PEM chain; with tls_key enables TLS */
	char *tls_key;
	char *tls_client_ca;          /* PEM roots: mutual TLS */
	bool tls_require_client_cert; /* with client_ca: refuse clients without one */

	/* [auth] */
	char *token_file;             /* bearer tokens; NULL: no token check */
	bool health_exempt;           /* grpc.health.v1 without a token */

	/* [log] */
	int log_level;                /* enum log_level */
	int64_t slow_job_ms;          /* log a job running this long (and every further); 0: never */

	/* [metrics] */
	char *metrics_listen;         /* "127.0.0.1:9400"; NULL: off */
	int metrics_idle_timeout_s;   /* close a connection idle this long */

	/* [shutdown] */
	int64_t grace_ms;             /* SIGTERM: wait this long for the running job */
	char *save_on_stop;           /* checkpoint path under the root; NULL: off */

	/* [watchdog] */
	int64_t stuck_job_ms;         /* stop WATCHDOG=1 when one job runs longer; 0: never */

	/* bookkeeping (not keys) */
	int set_line[48];             /* line of each key in the file; 0: not there */
	bool listen_from_cli;
};

/* Defaults: 127.0.0.1:50051, ./var/checkpoints, ./var/models, 1 poller,
 * 512 MiB requests, info level, grace 30 s, 64 adapters of 8 GiB in all.
 * Returns -ENOMEM. */
int config_init(struct daemon_config *c);
void config_free(struct daemon_config *c);

/* Set "section.key" from text. from_cli: a --listen from the command line
 * replaces the file's list instead of adding to it. On error writes
 * "[section] key: why" into err and returns -EINVAL (unknown key, bad
 * value) or -ENOMEM. */
int config_set(struct daemon_config *c, const char *section, const char *key,
	       const char *value, bool from_cli, char err[CONFIG_ERR_MAX]);

/* Parse an INI file. Errors: "PATH:LINE: [section] key: why" (or "PATH:
 * cannot open: ..."). Returns 0 or a negative errno. */
int config_load_file(struct daemon_config *c, const char *path, char err[CONFIG_ERR_MAX]);

/* Cross-key checks (TLS cert without key, client CA without TLS, the
 * non-loopback rule). Returns 0 or -EINVAL with the reason in err. */
int config_validate(const struct daemon_config *c, char err[CONFIG_ERR_MAX]);

/* True for loopback TCP addresses (127.0.0.0/8, ::1, localhost) and unix
 * sockets; false for anything else, including 0.0.0.0 and host names. */
bool config_addr_is_local(const char *addr);

/* Write the effective configuration as an INI file (--check-config). */
void config_dump(const struct daemon_config *c, FILE *f);

#endif
