/* test_daemon_config.c — the daemon's INI configuration (daemon/config.c):
 * the defaults, every kind of value through config_set (integers and their
 * ranges, sizes with K/M/G, booleans, seconds into ms fields, log levels,
 * the listen list), the file reader's errors with file, line and key,
 * config_validate's refusals, config_addr_is_local and config_dump. */
#include "check_run.h"
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "log.h"

static char dir[256];
static char path[512];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/engined-config-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[600];

	if (!d)
		return;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		unlink(p);
	}
	closedir(d);
	rmdir(dir);
}

/* Write `text` to DIR/name; the path is left in `path`. */
static const char *write_conf(const char *name, const char *text)
{
	FILE *f;

	ck_assert_int_lt(snprintf(path, sizeof(path), "%s/%s", dir, name), (int)sizeof(path));
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fputs(text, f) >= 0, 1);
	ck_assert_int_eq(fclose(f), 0);
	return path;
}

/* config_load_file of `text` into a fresh config: returns the code; the
 * error message is in err, prefixed by the file's path. */
static int load_text(struct daemon_config *c, const char *text, char err[CONFIG_ERR_MAX])
{
	ck_assert_int_eq(config_init(c), 0);
	err[0] = '\0';
	return config_load_file(c, write_conf("t.conf", text), err);
}

/* The error expected for `text`: "PATH:" + rest. */
static void expect_file_error(const char *text, const char *rest)
{
	struct daemon_config c;
	char err[CONFIG_ERR_MAX], want[CONFIG_ERR_MAX + 600];

	ck_assert_int_eq(load_text(&c, text, err), -EINVAL);
	snprintf(want, sizeof(want), "%s:%s", path, rest);
	ck_assert_str_eq(err, want);
	config_free(&c);
}

/* config_set on a fresh config expecting -EINVAL and exactly `msg`. */
static void expect_set_error(const char *section, const char *key, const char *value,
			     const char *msg)
{
	struct daemon_config c;
	char err[CONFIG_ERR_MAX] = "";

	ck_assert_int_eq(config_init(&c), 0);
	ck_assert_int_eq(config_set(&c, section, key, value, false, err), -EINVAL);
	ck_assert_str_eq(err, msg);
	config_free(&c);
}

static void set_ok(struct daemon_config *c, const char *section, const char *key,
		   const char *value)
{
	char err[CONFIG_ERR_MAX] = "";
	int r = config_set(c, section, key, value, false, err);

	ck_assert_msg(r == 0, "[%s] %s = '%s': %d %s", section, key, value, r, err);
}

START_TEST(defaults_after_init)
{
	struct daemon_config c;

	ck_assert_int_eq(config_init(&c), 0);
	ck_assert_int_eq(c.n_listen, 1);
	ck_assert_str_eq(c.listen[0], "127.0.0.1:50051");
	ck_assert_ptr_null(c.listen[1]);
	ck_assert_int_eq(c.pollers, 1);
	ck_assert_int_eq(c.max_request_bytes, 512LL << 20);
	ck_assert_int_eq(c.max_send_bytes, 0);
	ck_assert_int_eq(c.max_concurrent_calls, 0);
	ck_assert_int_eq(c.max_concurrent_streams, 64);
	ck_assert_int_eq(c.default_deadline_ms, 0);
	ck_assert_ptr_null(c.port_file);
	ck_assert(!c.insecure);
	ck_assert_ptr_null(c.share_socket);
	ck_assert_int_eq(c.share_ttl_ms, 60000);
	ck_assert_int_eq(c.max_shares, 16);
	ck_assert_int_eq(c.max_share_bytes, 0);
	ck_assert_str_eq(c.checkpoint_root, "./var/checkpoints");
	ck_assert_str_eq(c.model_root, "./var/models");
	ck_assert_int_eq(c.threads, 0);
	ck_assert_ptr_null(c.default_device);
	ck_assert(!c.param_offload);
	ck_assert(!c.optimizer_offload);
	ck_assert_int_eq(c.default_micro_batch_tokens, 0);
	ck_assert_int_eq(c.max_adapters, 64);
	ck_assert_int_eq(c.max_adapter_bytes, 8LL << 30);
	ck_assert_ptr_null(c.tls_cert);
	ck_assert_ptr_null(c.tls_key);
	ck_assert_ptr_null(c.tls_client_ca);
	ck_assert(c.tls_require_client_cert);
	ck_assert_ptr_null(c.token_file);
	ck_assert(!c.health_exempt);
	ck_assert_int_eq(c.log_level, LOG_LVL_INFO);
	ck_assert_ptr_null(c.metrics_listen);
	ck_assert_int_eq(c.grace_ms, 30000);
	ck_assert_ptr_null(c.save_on_stop);
	ck_assert_int_eq(c.stuck_job_ms, 0);
	for (int i = 0; i < 48; i++)
		ck_assert_int_eq(c.set_line[i], 0);
	ck_assert(!c.listen_from_cli);
	config_free(&c);
	ck_assert_int_eq(c.n_listen, 0);
	ck_assert_ptr_null(c.checkpoint_root);
	ck_assert_ptr_null(c.model_root);
}
END_TEST

START_TEST(integers_and_their_ranges)
{
	struct daemon_config c;

	ck_assert_int_eq(config_init(&c), 0);
	set_ok(&c, "server", "pollers", "8");
	ck_assert_int_eq(c.pollers, 8);
	set_ok(&c, "server", "pollers", "1");
	ck_assert_int_eq(c.pollers, 1);
	set_ok(&c, "server", "max_concurrent_calls", "0");
	ck_assert_int_eq(c.max_concurrent_calls, 0);
	set_ok(&c, "server", "max_concurrent_calls", "1000000");
	ck_assert_int_eq(c.max_concurrent_calls, 1000000);
	set_ok(&c, "server", "max_concurrent_streams", "100000");
	ck_assert_int_eq(c.max_concurrent_streams, 100000);
	set_ok(&c, "engine", "threads", "1024");
	ck_assert_int_eq(c.threads, 1024);
	set_ok(&c, "engine", "max_tokens_per_micro_batch", "1099511627776");
	ck_assert_int_eq(c.default_micro_batch_tokens, 1LL << 40);
	set_ok(&c, "engine", "max_tokens_per_micro_batch", "4096");
	ck_assert_int_eq(c.default_micro_batch_tokens, 4096);
	set_ok(&c, "lora", "max_adapters", "0");
	ck_assert_int_eq(c.max_adapters, 0);
	set_ok(&c, "lora", "max_adapters", "4096");
	ck_assert_int_eq(c.max_adapters, 4096);
	set_ok(&c, "lora", "max_adapter_bytes", "512M");
	ck_assert_int_eq(c.max_adapter_bytes, 512LL << 20);
	set_ok(&c, "lora", "max_adapter_bytes", "0");
	ck_assert_int_eq(c.max_adapter_bytes, 0);
	config_free(&c);
	expect_set_error("lora", "max_adapters", "4097",
			 "[lora] max_adapters: '4097' is not an integer in [0, 4096]");
	expect_set_error("lora", "max_adapter_bytes", "-1",
			 "[lora] max_adapter_bytes: '-1' is not a size in [0, 4611686018427387903] "
			 "bytes (suffixes K, M, G)");

	expect_set_error("server", "pollers", "0",
			 "[server] pollers: '0' is not an integer in [1, 8]");
	expect_set_error("server", "pollers", "9",
			 "[server] pollers: '9' is not an integer in [1, 8]");
	expect_set_error("server", "pollers", "two",
			 "[server] pollers: 'two' is not an integer in [1, 8]");
	expect_set_error("server", "pollers", "2x",
			 "[server] pollers: '2x' is not an integer in [1, 8]");
	expect_set_error("server", "pollers", "",
			 "[server] pollers: '' is not an integer in [1, 8]");
	expect_set_error("server", "pollers", "99999999999999999999",
			 "[server] pollers: '99999999999999999999' is not an integer in [1, 8]");
	expect_set_error("server", "max_concurrent_calls", "-1",
			 "[server] max_concurrent_calls: '-1' is not an integer in [0, 1000000]");
	expect_set_error("server", "max_concurrent_streams", "0",
			 "[server] max_concurrent_streams: '0' is not an integer in [1, 100000]");
	expect_set_error("engine", "threads", "1025",
			 "[engine] threads: '1025' is not an integer in [0, 1024]");
	expect_set_error("engine", "max_tokens_per_micro_batch", "1099511627777",
			 "[engine] max_tokens_per_micro_batch: '1099511627777' is not an "
			 "integer in [0, 1099511627776]");
}
END_TEST

START_TEST(sizes_with_suffixes)
{
	struct daemon_config c;

	ck_assert_int_eq(config_init(&c), 0);
	set_ok(&c, "server", "max_request_bytes", "1024");
	ck_assert_int_eq(c.max_request_bytes, 1024);
	set_ok(&c, "server", "max_request_bytes", "1K");
	ck_assert_int_eq(c.max_request_bytes, 1024);
	set_ok(&c, "server", "max_request_bytes", "3k");
	ck_assert_int_eq(c.max_request_bytes, 3 * 1024);
	set_ok(&c, "server", "max_request_bytes", "64M");
	ck_assert_int_eq(c.max_request_bytes, 64LL << 20);
	set_ok(&c, "server", "max_request_bytes", "2047m");
	ck_assert_int_eq(c.max_request_bytes, 2047LL << 20);
	set_ok(&c, "server", "max_request_bytes", "1G");
	ck_assert_int_eq(c.max_request_bytes, 1LL << 30);
	set_ok(&c, "server", "max_request_bytes", "2147483647");
	ck_assert_int_eq(c.max_request_bytes, 2147483647LL);
	set_ok(&c, "server", "max_send_bytes", "0");
	ck_assert_int_eq(c.max_send_bytes, 0);
	set_ok(&c, "server", "max_send_bytes", "1g");
	ck_assert_int_eq(c.max_send_bytes, 1LL << 30);
	config_free(&c);

#define SIZE_ERR(v) "[server] max_request_bytes: '" v "' is not a size in [1024, 2147483647] " \
	"bytes (suffixes K, M, G)"
	expect_set_error("server", "max_request_bytes", "1023", SIZE_ERR("1023"));
	expect_set_error("server", "max_request_bytes", "2G", SIZE_ERR("2G"));
	expect_set_error("server", "max_request_bytes", "2147483648", SIZE_ERR("2147483648"));
	expect_set_error("server", "max_request_bytes", "1.5M", SIZE_ERR("1.5M"));
	expect_set_error("server", "max_request_bytes", "1KB", SIZE_ERR("1KB"));
	expect_set_error("server", "max_request_bytes", "4T", SIZE_ERR("4T"));
	expect_set_error("server", "max_request_bytes", "-1K", SIZE_ERR("-1K"));
	expect_set_error("server", "max_request_bytes", "M", SIZE_ERR("M"));
	expect_set_error("server", "max_request_bytes", "99999999999G", SIZE_ERR("99999999999G"));
#undef SIZE_ERR
	expect_set_error("server", "max_send_bytes", "-1",
			 "[server] max_send_bytes: '-1' is not a size in [0, 2147483647] bytes "
			 "(suffixes K, M, G)");
}
END_TEST

START_TEST(booleans)
{
	static const char *const yes[] = { "true", "TRUE", "yes", "Yes", "on", "ON", "1" };
	static const char *const no[] = { "false", "False", "no", "NO", "off", "Off", "0" };
	struct daemon_config c;

	ck_assert_int_eq(config_init(&c), 0);
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		c.insecure = false;
		set_ok(&c, "server", "insecure", yes[i]);
		ck_assert_msg(c.insecure, "'%s' is true", yes[i]);
	}
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
		c.tls_require_client_cert = true;
		set_ok(&c, "tls", "require_client_cert", no[i]);
		ck_assert_msg(!c.tls_require_client_cert, "'%s' is false", no[i]);
	}
	set_ok(&c, "engine", "param_offload", "yes");
	set_ok(&c, "engine", "optimizer_offload", "on");
	set_ok(&c, "auth", "health_exempt", "1");
	ck_assert(c.param_offload && c.optimizer_offload && c.health_exempt);
	ck_assert(!c.tls_require_client_cert);
	config_free(&c);

	expect_set_error("server", "insecure", "maybe",
			 "[server] insecure: 'maybe' is not a boolean (true/false, yes/no, "
			 "on/off, 1/0)");
	expect_set_error("auth", "health_exempt", "2",
			 "[auth] health_exempt: '2' is not a boolean (true/false, yes/no, "
			 "on/off, 1/0)");
	expect_set_error("engine", "param_offload", "",
			 "[engine] param_offload: '' is not a boolean (true/false, yes/no, "
			 "on/off, 1/0)");
}
END_TEST

START_TEST(seconds_into_milliseconds)
{
	struct daemon_config c;

	ck_assert_int_eq(config_init(&c), 0);
	set_ok(&c, "shutdown", "grace_s", "1.5");
	ck_assert_int_eq(c.grace_ms, 1500);
	set_ok(&c, "shutdown", "grace_s", "0");
	ck_assert_int_eq(c.grace_ms, 0);
	set_ok(&c, "shutdown", "grace_s", "86400");
	ck_assert_int_eq(c.grace_ms, 86400000);
	set_ok(&c, "shutdown", "grace_s", "0.25");
	ck_assert_int_eq(c.grace_ms, 250);
	set_ok(&c, "server", "default_deadline_s", "120");
	ck_assert_int_eq(c.default_deadline_ms, 120000);
	set_ok(&c, "server", "default_deadline_s", "0.001");
	ck_assert_int_eq(c.default_deadline_ms, 1);
	set_ok(&c, "server", "default_deadline_s", "1e6");
	ck_assert_int_eq(c.default_deadline_ms, 1000000000LL);
	set_ok(&c, "watchdog", "stuck_job_s", "600");
	ck_assert_int_eq(c.stuck_job_ms, 600000);
	set_ok(&c, "watchdog", "stuck_job_s", "2.0004");  /* rounded to the ms */
	ck_assert_int_eq(c.stuck_job_ms, 2000);
	config_free(&c);

	expect_set_error("shutdown", "grace_s", "86400.5",
			 "[shutdown] grace_s: '86400.5' is not a number of seconds in [0, 86400]");
	expect_set_error("shutdown", "grace_s", "-1",
			 "[shutdown] grace_s: '-1' is not a number of seconds in [0, 86400]");
	expect_set_error("shutdown", "grace_s", "5s",
			 "[shutdown] grace_s: '5s' is not a number of seconds in [0, 86400]");
	expect_set_error("shutdown", "grace_s", "nan",
			 "[shutdown] grace_s: 'nan' is not a number of seconds in [0, 86400]");
	expect_set_error("shutdown", "grace_s", "inf",
			 "[shutdown] grace_s: 'inf' is not a number of seconds in [0, 86400]");
	expect_set_error("shutdown", "grace_s", "",
			 "[shutdown] grace_s: '' is not a number of seconds in [0, 86400]");
	expect_set_error("server", "default_deadline_s", "1000001",
			 "[server] default_deadline_s: '1000001' is not a number of seconds in "
			 "[0, 1000000]");
	expect_set_error("watchdog", "stuck_job_s", "1e7",
			 "[watchdog] stuck_job_s: '1e7' is not a number of seconds in [0, 1000000]");
	/* A key's lower bound holds too: a share's handle lives at least a
	 * millisecond, a collective waits at least one. */
	ck_assert_int_eq(config_init(&c), 0);
	set_ok(&c, "server", "share_ttl_s", "0.001");
	ck_assert_int_eq(c.share_ttl_ms, 1);
	set_ok(&c, "server", "share_ttl_s", "1.5");
	ck_assert_int_eq(c.share_ttl_ms, 1500);
	config_free(&c);
	expect_set_error("server", "share_ttl_s", "0",
			 "[server] share_ttl_s: '0' is not a number of seconds in [0.001, 86400]");
	expect_set_error("server", "share_ttl_s", "0.0004",
			 "[server] share_ttl_s: '0.0004' is not a number of seconds in "
			 "[0.001, 86400]");
	expect_set_error("dist", "timeout_s", "0",
			 "[dist] timeout_s: '0' is not a number of seconds in [0.001, 86400]");
}
END_TEST

START_TEST(log_levels)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };
	static const int levels[] = { LOG_LVL_ERROR, LOG_LVL_WARN, LOG_LVL_INFO, LOG_LVL_DEBUG };
	struct daemon_config c;

	ck_assert_int_eq(config_init(&c), 0);
	for (int i = 0; i < 4; i++) {
		set_ok(&c, "log", "level", names[i]);
		ck_assert_int_eq(c.log_level, levels[i]);
	}
	config_free(&c);
	/* Case matters (unlike the booleans). */
	expect_set_error("log", "level", "INFO",
			 "[log] level: 'INFO' is not one of error, warn, info, debug");
	expect_set_error("log", "level", "warning",
			 "[log] level: 'warning' is not one of error, warn, info, debug");
	expect_set_error("log", "level", "2",
			 "[log] level: '2' is not one of error, warn, info, debug");
}
END_TEST

START_TEST(strings_paths_and_addresses)
{
	struct daemon_config c;
	char err[CONFIG_ERR_MAX];
	char *longv;

	ck_assert_int_eq(config_init(&c), 0);
	set_ok(&c, "engine", "default_device", "cuda");
	ck_assert_str_eq(c.default_device, "cuda");
	set_ok(&c, "engine", "default_device", "cpu_2");
	ck_assert_str_eq(c.default_device, "cpu_2");
	set_ok(&c, "engine", "default_device", "");
	ck_assert_ptr_null(c.default_device);
	set_ok(&c, "paths", "checkpoint_root", "/srv/ck");
	ck_assert_str_eq(c.checkpoint_root, "/srv/ck");
	set_ok(&c, "paths", "model_root", "");  /* empty: unset */
	ck_assert_ptr_null(c.model_root);
	set_ok(&c, "server", "port_file", "/run/engined/0.ports");
	ck_assert_str_eq(c.port_file, "/run/engined/0.ports");
	set_ok(&c, "metrics", "listen", "127.0.0.1:9400");
	ck_assert_str_eq(c.metrics_listen, "127.0.0.1:9400");
	set_ok(&c, "metrics", "listen", "[::1]:9400");
	ck_assert_str_eq(c.metrics_listen, "[::1]:9400");
	set_ok(&c, "metrics", "listen", "");
	ck_assert_ptr_null(c.metrics_listen);
	set_ok(&c, "shutdown", "save_on_stop", "stop/last");
	ck_assert_str_eq(c.save_on_stop, "stop/last");
	set_ok(&c, "shutdown", "save_on_stop", "..x/y..");
	ck_assert_str_eq(c.save_on_stop, "..x/y..");
	set_ok(&c, "shutdown", "save_on_stop", "");
	ck_assert_ptr_null(c.save_on_stop);
	set_ok(&c, "server", "share_socket", "/run/engined/0/share.sock");
	ck_assert_str_eq(c.share_socket, "/run/engined/0/share.sock");
	set_ok(&c, "server", "share_socket", "");
	ck_assert_ptr_null(c.share_socket);

	longv = malloc(4097);
	ck_assert_ptr_nonnull(longv);
	memset(longv, 'a', 4096);
	longv[4096] = '\0';
	ck_assert_int_eq(config_set(&c, "server", "port_file", longv, false, err), -EINVAL);
	ck_assert_str_eq(err, "[server] port_file: value too long");
	longv[4095] = '\0';
	set_ok(&c, "server", "port_file", longv);
	ck_assert_int_eq(strlen(c.port_file), 4095);
	free(longv);
	config_free(&c);

	expect_set_error("engine", "default_device", "CUDA",
			 "[engine] default_device: 'CUDA' is not a device name (cpu, cuda)");
	expect_set_error("engine", "default_device", "cuda:0",
			 "[engine] default_device: 'cuda:0' is not a device name (cpu, cuda)");
#define STOP_ERR(v) "[shutdown] save_on_stop: '" v "' must be a relative path without '..' " \
	"(it is under checkpoint_root)"
	expect_set_error("shutdown", "save_on_stop", "/abs", STOP_ERR("/abs"));
	expect_set_error("shutdown", "save_on_stop", "..", STOP_ERR(".."));
	expect_set_error("shutdown", "save_on_stop", "../x", STOP_ERR("../x"));
	expect_set_error("shutdown", "save_on_stop", "a/../b", STOP_ERR("a/../b"));
	expect_set_error("shutdown", "save_on_stop", "a/..", STOP_ERR("a/.."));
#undef STOP_ERR
#define SOCK_ERR(v) "[server] share_socket: '" v "' must be an absolute path shorter than " \
	"108 bytes (a unix socket's; clients connect to it by that name)"
	expect_set_error("server", "share_socket", "run/share.sock", SOCK_ERR("run/share.sock"));
	{
		char p[120], want[CONFIG_ERR_MAX];

		memset(p, 'a', sizeof(p) - 1);
		p[0] = '/';
		p[108] = '\0';  /* 108 bytes: no room for sun_path's NUL */
		snprintf(want, sizeof(want), SOCK_ERR("%s"), p);
		expect_set_error("server", "share_socket", p, want);
		p[107] = '\0';
		ck_assert_int_eq(config_init(&c), 0);
		set_ok(&c, "server", "share_socket", p);
		config_free(&c);
	}
#undef SOCK_ERR
	expect_set_error("metrics", "listen", "9400",
			 "[metrics] listen: '9400' is not host:port");
	expect_set_error("metrics", "listen", "host:99999",
			 "[metrics] listen: 'host:99999' is not host:port");
	expect_set_error("metrics", "listen", "[::1:9400",
			 "[metrics] listen: '[::1:9400' is not host:port");
}
END_TEST

START_TEST(unknown_section_and_key)
{
	expect_set_error("serve", "listen", "x", "[serve] listen: unknown section 'serve'");
	expect_set_error("server", "poller", "1", "[server] poller: unknown key");
	expect_set_error("Server", "pollers", "1", "[Server] pollers: unknown section 'Server'");
	expect_set_error("log", "levels", "info", "[log] levels: unknown key");
}
END_TEST

START_TEST(listen_list)
{
	struct daemon_config c;
	char err[CONFIG_ERR_MAX] = "";
	char a[32];

	ck_assert_int_eq(config_init(&c), 0);
	/* Not from the command line: added to the list (the file's reader
	 * clears the default itself, see file_replaces_default_listen). */
	set_ok(&c, "server", "listen", "unix:/run/engined.sock");
	ck_assert_int_eq(c.n_listen, 2);
	ck_assert_str_eq(c.listen[0], "127.0.0.1:50051");
	ck_assert_str_eq(c.listen[1], "unix:/run/engined.sock");
	ck_assert_int_eq(config_set(&c, "server", "listen", "unix:/run/engined.sock", false, err),
			 -EINVAL);
	ck_assert_str_eq(err, "[server] listen: 'unix:/run/engined.sock' given twice");

	/* The first --listen replaces, the next ones add. */
	ck_assert_int_eq(config_set(&c, "server", "listen", "[::1]:7000", true, err), 0);
	ck_assert(c.listen_from_cli);
	ck_assert_int_eq(c.n_listen, 1);
	ck_assert_str_eq(c.listen[0], "[::1]:7000");
	ck_assert_int_eq(config_set(&c, "server", "listen", "ipv4:127.0.0.1:0", true, err), 0);
	ck_assert_int_eq(c.n_listen, 2);
	ck_assert_str_eq(c.listen[1], "ipv4:127.0.0.1:0");
	for (int i = 2; i < CONFIG_MAX_LISTEN; i++) {
		snprintf(a, sizeof(a), "127.0.0.1:%d", 7000 + i);
		ck_assert_int_eq(config_set(&c, "server", "listen", a, true, err), 0);
	}
	ck_assert_int_eq(c.n_listen, 8);
	ck_assert_int_eq(config_set(&c, "server", "listen", "127.0.0.1:1", true, err), -EINVAL);
	ck_assert_str_eq(err, "[server] listen: more than 8 addresses");
	ck_assert_int_eq(c.n_listen, 8);
	config_free(&c);

#define LISTEN_ERR(v) "[server] listen: '" v "' is not host:port, [v6]:port or unix:/path"
	expect_set_error("server", "listen", "localhost", LISTEN_ERR("localhost"));
	expect_set_error("server", "listen", "unix:", LISTEN_ERR("unix:"));
	expect_set_error("server", "listen", "unix-abstract:", LISTEN_ERR("unix-abstract:"));
	expect_set_error("server", "listen", "host:65536", LISTEN_ERR("host:65536"));
	expect_set_error("server", "listen", "host:-1", LISTEN_ERR("host:-1"));
	expect_set_error("server", "listen", "host:http", LISTEN_ERR("host:http"));
	expect_set_error("server", "listen", "[::1:50051", LISTEN_ERR("[::1:50051"));
	expect_set_error("server", "listen", "", LISTEN_ERR(""));
#undef LISTEN_ERR
}
END_TEST

static const char full_file[] =
	"; engined configuration\n"                        /*  1 */
	"# another comment style\n"                         /*  2 */
	"\n"                                                /*  3 */
	"[server]\n"                                        /*  4 */
	"listen = 127.0.0.1:6000\n"                         /*  5 */
	"listen = unix:/run/engined/0.sock\n"               /*  6 */
	"pollers = 4 ; inline comment\n"                    /*  7 */
	"max_request_bytes = 256M\n"                        /*  8 */
	"max_send_bytes = 1G\n"                             /*  9 */
	"max_concurrent_calls = 16\n"                       /* 10 */
	"max_concurrent_streams = 8\n"                      /* 11 */
	"default_deadline_s = 2.5\n"                        /* 12 */
	"port_file = /run/engined/0.ports\n"                /* 13 */
	"insecure = no\n"                                   /* 14 */
	"[paths]\n"                                         /* 15 */
	"checkpoint_root = /var/lib/engined/ck\n"           /* 16 */
	"model_root = /var/lib/engined/models\n"            /* 17 */
	"[engine]\n"                                        /* 18 */
	"threads = 12\n"                                    /* 19 */
	"default_device = cuda\n"                           /* 20 */
	"param_offload = true\n"                            /* 21 */
	"optimizer_offload = on\n"                          /* 22 */
	"max_tokens_per_micro_batch = 8192\n"               /* 23 */
	"[tls]\n"                                           /* 24 */
	"cert = /etc/engined/cert.pem\n"                    /* 25 */
	"key = /etc/engined/key.pem\n"                      /* 26 */
	"client_ca = /etc/engined/ca.pem\n"                 /* 27 */
	"require_client_cert = false\n"                     /* 28 */
	"[auth]\n"                                          /* 29 */
	"token_file = /etc/engined/tokens\n"                /* 30 */
	"health_exempt = yes\n"                             /* 31 */
	"[log]\n"                                           /* 32 */
	"level = debug\n"                                   /* 33 */
	"[metrics]\n"                                       /* 34 */
	"listen = 127.0.0.1:9400\n"                         /* 35 */
	"[shutdown]\n"                                      /* 36 */
	"grace_s = 45\n"                                    /* 37 */
	"save_on_stop = stop/last\n"                        /* 38 */
	"[watchdog]\n"                                      /* 39 */
	"stuck_job_s = 900\n";                              /* 40 */

START_TEST(file_with_every_key)
{
	struct daemon_config c;
	char err[CONFIG_ERR_MAX];
	int n_set = 0, last = 0;

	ck_assert_int_eq(load_text(&c, full_file, err), 0);
	ck_assert_int_eq(c.n_listen, 2);  /* the default address is gone */
	ck_assert_str_eq(c.listen[0], "127.0.0.1:6000");
	ck_assert_str_eq(c.listen[1], "unix:/run/engined/0.sock");
	ck_assert(!c.listen_from_cli);
	ck_assert_int_eq(c.pollers, 4);
	ck_assert_int_eq(c.max_request_bytes, 256LL << 20);
	ck_assert_int_eq(c.max_send_bytes, 1LL << 30);
	ck_assert_int_eq(c.max_concurrent_calls, 16);
	ck_assert_int_eq(c.max_concurrent_streams, 8);
	ck_assert_int_eq(c.default_deadline_ms, 2500);
	ck_assert_str_eq(c.port_file, "/run/engined/0.ports");
	ck_assert(!c.insecure);
	ck_assert_str_eq(c.checkpoint_root, "/var/lib/engined/ck");
	ck_assert_str_eq(c.model_root, "/var/lib/engined/models");
	ck_assert_int_eq(c.threads, 12);
	ck_assert_str_eq(c.default_device, "cuda");
	ck_assert(c.param_offload);
	ck_assert(c.optimizer_offload);
	ck_assert_int_eq(c.default_micro_batch_tokens, 8192);
	ck_assert_str_eq(c.tls_cert, "/etc/engined/cert.pem");
	ck_assert_str_eq(c.tls_key, "/etc/engined/key.pem");
	ck_assert_str_eq(c.tls_client_ca, "/etc/engined/ca.pem");
	ck_assert(!c.tls_require_client_cert);
	ck_assert_str_eq(c.token_file, "/etc/engined/tokens");
	ck_assert(c.health_exempt);
	ck_assert_int_eq(c.log_level, LOG_LVL_DEBUG);
	ck_assert_str_eq(c.metrics_listen, "127.0.0.1:9400");
	ck_assert_int_eq(c.grace_ms, 45000);
	ck_assert_str_eq(c.save_on_stop, "stop/last");
	ck_assert_int_eq(c.stuck_job_ms, 900000);
	/* set_line: the line of every key but [server] listen (which may repeat):
	 * pollers (the table's second key) is on line 7, stuck_job_s (the file's
	 * last) on 40, and no key is on a line past it. */
	ck_assert_int_eq(c.set_line[0], 0);
	ck_assert_int_eq(c.set_line[1], 7);
	for (int i = 0; i < 48; i++) {
		n_set += c.set_line[i] != 0;
		last = c.set_line[i] > last ? c.set_line[i] : last;
	}
	ck_assert_int_eq(n_set, 26);  /* the file's 27 keys less listen */
	ck_assert_int_eq(last, 40);
	config_free(&c);
}
END_TEST

START_TEST(file_replaces_default_listen)
{
	struct daemon_config c;
	char err[CONFIG_ERR_MAX];

	/* No listen in the file: the default stays. */
	ck_assert_int_eq(load_text(&c, "[server]\npollers = 2\n", err), 0);
	ck_assert_int_eq(c.n_listen, 1);
	ck_assert_str_eq(c.listen[0], "127.0.0.1:50051");
	ck_assert_int_eq(c.pollers, 2);
	/* The command line then replaces the list. */
	ck_assert_int_eq(config_set(&c, "server", "listen", "127.0.0.1:1", true, err), 0);
	ck_assert_int_eq(c.n_listen, 1);
	ck_assert_str_eq(c.listen[0], "127.0.0.1:1");
	config_free(&c);

	/* The file may name the default itself without "given twice". */
	ck_assert_int_eq(load_text(&c, "[server]\nlisten = 127.0.0.1:50051\n"
				   "listen = [::1]:50051\n", err), 0);
	ck_assert_int_eq(c.n_listen, 2);
	ck_assert_str_eq(c.listen[0], "127.0.0.1:50051");
	ck_assert_str_eq(c.listen[1], "[::1]:50051");
	/* A --listen after the file's replaces the file's addresses. */
	ck_assert_int_eq(config_set(&c, "server", "listen", "unix:/tmp/x", true, err), 0);
	ck_assert_int_eq(config_set(&c, "server", "listen", "unix:/tmp/y", true, err), 0);
	ck_assert_int_eq(c.n_listen, 2);
	ck_assert_str_eq(c.listen[0], "unix:/tmp/x");
	ck_assert_str_eq(c.listen[1], "unix:/tmp/y");
	config_free(&c);
}
END_TEST

START_TEST(file_errors_name_file_line_and_key)
{
	struct daemon_config c;
	char err[CONFIG_ERR_MAX], want[CONFIG_ERR_MAX + 600];

	expect_file_error("[server]\nlisten = 127.0.0.1:1\n\n; c\n\n\n\n\n\n\n\npollers = 0\n",
			  "12: [server] pollers: '0' is not an integer in [1, 8]");
	expect_file_error("[server]\nmax_request_bytes = 12Q\n",
			  "2: [server] max_request_bytes: '12Q' is not a size in [1024, "
			  "2147483647] bytes (suffixes K, M, G)");
	expect_file_error("[log]\nlevel = loud\n",
			  "2: [log] level: 'loud' is not one of error, warn, info, debug");
	expect_file_error("[server]\nlisten = nowhere\n",
			  "2: [server] listen: 'nowhere' is not host:port, [v6]:port or unix:/path");
	expect_file_error("[server]\nlisten = 127.0.0.1:1\nlisten = 127.0.0.1:1\n",
			  "3: [server] listen: '127.0.0.1:1' given twice");
	expect_file_error("[server]\npollers = 2\n[log]\nlevel = info\n[server]\npollers = 3\n",
			  "6: [server] pollers: given twice (first on line 2)");
	expect_file_error("[shutdown]\ngrace_s = 1\ngrace_s = 1\n",
			  "3: [shutdown] grace_s: given twice (first on line 2)");
	expect_file_error("[servr]\npollers = 2\n",
			  "2: [servr] pollers: unknown section 'servr'");
	expect_file_error("[server]\n\npoller = 2\n",
			  "3: [server] poller: unknown key");
	expect_file_error("pollers = 2\n[server]\n",
			  "1: pollers: key outside a [section]");
	expect_file_error("[server]\npollers = 2\nthis is not a key\n",
			  "3: syntax error (expected '[section]' or 'key = value')");
	expect_file_error("[server\n",
			  "1: syntax error (expected '[section]' or 'key = value')");
	expect_file_error("[server]\nnot a key\npollers = 2\n",
			  "2: syntax error (expected '[section]' or 'key = value')");
	/* Only the first error is reported, whichever kind comes first. */
	expect_file_error("[server]\npollers = 0\nthreads = 1\n[log]\nlevel = x\n",
			  "2: [server] pollers: '0' is not an integer in [1, 8]");
	expect_file_error("[server]\nbogus line\npollers = 0\n",
			  "2: syntax error (expected '[section]' or 'key = value')");
	expect_file_error("[server\npollers = 2\n",
			  "1: syntax error (expected '[section]' or 'key = value')");
	expect_file_error("[server]\npollers = 0\nbogus line\n",
			  "2: [server] pollers: '0' is not an integer in [1, 8]");

	/* A file that is not there. */
	ck_assert_int_eq(config_init(&c), 0);
	snprintf(path, sizeof(path), "%s/absent.conf", dir);
	ck_assert_int_eq(config_load_file(&c, path, err), -ENOENT);
	snprintf(want, sizeof(want), "%s: cannot open: No such file or directory", path);
	ck_assert_str_eq(err, want);
	config_free(&c);
}
END_TEST

/* inih reads lines into 200 bytes: 198 characters and the newline fit; a
 * longer line is refused with its number, not parsed in pieces. */
START_TEST(long_lines)
{
	struct daemon_config c;
	char err[CONFIG_ERR_MAX], text[1024], pad[400];
	int n;

	/* "port_file = /" + 185 'p' = 198 characters. */
	memset(pad, 'p', 185);
	pad[185] = '\0';
	n = snprintf(text, sizeof(text), "[server]\nport_file = /%s\npollers = 3\n", pad);
	ck_assert_int_lt(n, (int)sizeof(text));
	ck_assert_int_eq(load_text(&c, text, err), 0);
	ck_assert_int_eq(strlen(c.port_file), 186);
	ck_assert_int_eq(c.pollers, 3);
	config_free(&c);

	/* 199 characters. */
	pad[185] = 'p';
	pad[186] = '\0';
	snprintf(text, sizeof(text), "[server]\nport_file = /%s\npollers = 3\n", pad);
	expect_file_error(text, "2: line longer than 198 characters");

	/* A comment of 300 characters on line 3, then a good key: the rest of
	 * the long line is not read as a line of its own. */
	memset(pad, 'x', 299);
	pad[299] = '\0';
	snprintf(text, sizeof(text), "[server]\npollers = 3\n;%s\nthreads = 2\n", pad);
	expect_file_error(text, "3: line longer than 198 characters");
}
END_TEST

START_TEST(validate_refusals)
{
	struct daemon_config c;
	char err[CONFIG_ERR_MAX];
	static const char nonlocal[] =
		"[server] listen: refusing to serve on non-loopback address '0.0.0.0:50051' "
		"without client authentication: anyone who can reach it could run jobs, read "
		"the weights and write checkpoints. Set [auth] token_file (bearer tokens) or "
		"[tls] cert, key and client_ca (mutual TLS), or pass --insecure "
		"(insecure = true) if the network itself is trusted";

	ck_assert_int_eq(config_init(&c), 0);
	ck_assert_int_eq(config_validate(&c, err), 0);

	/* No address. */
	free(c.listen[0]);
	c.listen[0] = NULL;
	c.n_listen = 0;
	ck_assert_int_eq(config_validate(&c, err), -EINVAL);
	ck_assert_str_eq(err, "[server] listen: no address");
	set_ok(&c, "server", "listen", "unix:/run/e.sock");
	ck_assert_int_eq(config_validate(&c, err), 0);

	/* cert and key go together; client_ca needs both. */
	set_ok(&c, "tls", "cert", "/c.pem");
	ck_assert_int_eq(config_validate(&c, err), -EINVAL);
	ck_assert_str_eq(err, "[tls] key: missing (tls.cert and tls.key go together)");
	set_ok(&c, "tls", "cert", "");
	set_ok(&c, "tls", "key", "/k.pem");
	ck_assert_int_eq(config_validate(&c, err), -EINVAL);
	ck_assert_str_eq(err, "[tls] cert: missing (tls.cert and tls.key go together)");
	set_ok(&c, "tls", "key", "");
	set_ok(&c, "tls", "client_ca", "/ca.pem");
	ck_assert_int_eq(config_validate(&c, err), -EINVAL);
	ck_assert_str_eq(err, "[tls] client_ca: mutual TLS needs the server's own cert and key");
	set_ok(&c, "tls", "client_ca", "");

	/* Roots. */
	set_ok(&c, "paths", "checkpoint_root", "");
	ck_assert_int_eq(config_validate(&c, err), -EINVAL);
	ck_assert_str_eq(err, "[paths] checkpoint_root: must be set");
	set_ok(&c, "paths", "checkpoint_root", "/ck");
	set_ok(&c, "paths", "model_root", "");
	ck_assert_int_eq(config_validate(&c, err), -EINVAL);
	ck_assert_str_eq(err, "[paths] model_root: must be set");
	set_ok(&c, "paths", "model_root", "/models");
	ck_assert_int_eq(config_validate(&c, err), 0);

	/* A non-loopback address without client authentication. */
	set_ok(&c, "server", "listen", "0.0.0.0:50051");
	ck_assert_int_eq(config_validate(&c, err), -EINVAL);
	ck_assert_str_eq(err, nonlocal);
	/* Server-only TLS does not count. */
	set_ok(&c, "tls", "cert", "/c.pem");
	set_ok(&c, "tls", "key", "/k.pem");
	ck_assert_int_eq(config_validate(&c, err), -EINVAL);
	ck_assert_str_eq(err, nonlocal);
	/* Mutual TLS does, unless client certificates are optional. */
	set_ok(&c, "tls", "client_ca", "/ca.pem");
	ck_assert_int_eq(config_validate(&c, err), 0);
	set_ok(&c, "tls", "require_client_cert", "false");
	ck_assert_int_eq(config_validate(&c, err), -EINVAL);
	ck_assert_str_eq(err, nonlocal);
	/* Tokens do. */
	set_ok(&c, "auth", "token_file", "/etc/engined/tokens");
	ck_assert_int_eq(config_validate(&c, err), 0);
	set_ok(&c, "auth", "token_file", "");
	ck_assert_int_eq(config_validate(&c, err), -EINVAL);
	/* insecure does. */
	set_ok(&c, "server", "insecure", "true");
	ck_assert_int_eq(config_validate(&c, err), 0);
	config_free(&c);

	/* The refusal names the first non-loopback address. */
	ck_assert_int_eq(config_init(&c), 0);
	set_ok(&c, "server", "listen", "[::1]:7000");
	set_ok(&c, "server", "listen", ":7001");
	set_ok(&c, "server", "listen", "10.0.0.5:7002");
	ck_assert_int_eq(config_validate(&c, err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "non-loopback address ':7001' without"));
	config_free(&c);
}
END_TEST

START_TEST(addr_is_local)
{
	static const struct { const char *addr; bool local; } cases[] = {
		{ "127.0.0.1:50051", true },
		{ "127.3.2.1:1", true },
		{ "[::1]:50051", true },
		{ "ipv6:[::1]:50051", true },
		{ "ipv4:127.0.0.1:0", true },
		{ "[::ffff:127.0.0.1]:1", true },
		{ "localhost:50051", true },
		{ "LocalHost:50051", true },
		{ "unix:/run/engined/0.sock", true },
		{ "unix-abstract:engined", true },
		{ "0.0.0.0:50051", false },
		{ "[::]:50051", false },
		{ ":50051", false },
		{ "8.8.8.8:443", false },
		{ "192.168.1.10:50051", false },
		{ "128.0.0.1:50051", false },
		{ "[2001:db8::1]:50051", false },
		{ "[::ffff:10.0.0.1]:1", false },
		{ "engine.example.com:50051", false },
		{ "localhost.example.com:50051", false },
		{ "127.0.0.1", false },
		{ "", false },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		ck_assert_msg(config_addr_is_local(cases[i].addr) == cases[i].local,
			      "'%s' should be %s", cases[i].addr,
			      cases[i].local ? "local" : "not local");
}
END_TEST

/* The lines of `text`, one by one: true when `line` is one of them. */
static bool has_line(const char *text, const char *line)
{
	size_t n = strlen(line);

	for (const char *p = text; *p; ) {
		const char *nl = strchr(p, '\n');
		size_t len = nl ? (size_t)(nl - p) : strlen(p);

		if (len == n && !memcmp(p, line, n))
			return true;
		if (!nl)
			break;
		p = nl + 1;
	}
	return false;
}

static char *dump_to_string(const struct daemon_config *c)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	ck_assert_ptr_nonnull(f);
	config_dump(c, f);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_ptr_nonnull(buf);
	ck_assert_uint_eq(strlen(buf), len);
	return buf;
}

START_TEST(dump_shows_effective_values)
{
	struct daemon_config c;
	char err[CONFIG_ERR_MAX];
	char *out;

	ck_assert_int_eq(config_init(&c), 0);
	out = dump_to_string(&c);
	/* The defaults, one section after the other. */
	ck_assert_int_eq(strncmp(out, "[server]\n", 9), 0);
	ck_assert(has_line(out, "listen = 127.0.0.1:50051"));
	ck_assert(has_line(out, "pollers = 1"));
	ck_assert(has_line(out, "max_request_bytes = 536870912"));
	ck_assert(has_line(out, "max_send_bytes = 0"));
	ck_assert(has_line(out, "max_concurrent_streams = 64"));
	ck_assert(has_line(out, "default_deadline_s = 0"));
	ck_assert(has_line(out, "port_file = "));
	ck_assert(has_line(out, "insecure = false"));
	ck_assert(has_line(out, "checkpoint_root = ./var/checkpoints"));
	ck_assert(has_line(out, "model_root = ./var/models"));
	ck_assert(has_line(out, "require_client_cert = true"));
	ck_assert(has_line(out, "level = info"));
	ck_assert(has_line(out, "grace_s = 30"));
	ck_assert(has_line(out, "stuck_job_s = 0"));
	ck_assert(has_line(out, "slow_job_s = 10"));
	ck_assert_ptr_nonnull(strstr(out, "\n\n[log]\n; error, warn, info or debug\nlevel = info\n"
				     "; log one INFO line"));
	ck_assert_ptr_nonnull(strstr(out, "slow_job_s = 10\n\n[metrics]\n"));
	{
		static const char *const sections[] = { "[server]", "[paths]", "[engine]", "[tls]",
			"[auth]", "[log]", "[metrics]", "[shutdown]", "[watchdog]" };
		const char *prev = out;

		for (int i = 0; i < 9; i++) {
			const char *s = strstr(out, sections[i]);

			ck_assert_msg(s && s >= prev, "%s in order", sections[i]);
			prev = s;
		}
	}
	free(out);
	config_free(&c);

	/* Changed values. */
	ck_assert_int_eq(load_text(&c, full_file, err), 0);
	set_ok(&c, "log", "level", "warn");   /* after the file, as -o would */
	out = dump_to_string(&c);
	ck_assert(has_line(out, "listen = 127.0.0.1:6000"));
	ck_assert(has_line(out, "listen = unix:/run/engined/0.sock"));
	ck_assert(!has_line(out, "listen = 127.0.0.1:50051"));
	ck_assert(has_line(out, "pollers = 4"));
	ck_assert(has_line(out, "max_request_bytes = 268435456"));
	ck_assert(has_line(out, "max_send_bytes = 1073741824"));
	ck_assert(has_line(out, "default_deadline_s = 2.5"));
	ck_assert(has_line(out, "port_file = /run/engined/0.ports"));
	ck_assert(has_line(out, "threads = 12"));
	ck_assert(has_line(out, "default_device = cuda"));
	ck_assert(has_line(out, "param_offload = true"));
	ck_assert(has_line(out, "max_tokens_per_micro_batch = 8192"));
	ck_assert(has_line(out, "client_ca = /etc/engined/ca.pem"));
	ck_assert(has_line(out, "require_client_cert = false"));
	ck_assert(has_line(out, "health_exempt = true"));
	ck_assert(has_line(out, "level = warn"));
	ck_assert(has_line(out, "listen = 127.0.0.1:9400"));
	ck_assert(has_line(out, "grace_s = 45"));
	ck_assert(has_line(out, "save_on_stop = stop/last"));
	ck_assert(has_line(out, "stuck_job_s = 900"));
	ck_assert_ptr_nonnull(strstr(out, "[server]\n; address to serve on; repeat the key for "
				     "several (host:port, [v6]:port, unix:/path)\n"
				     "listen = 127.0.0.1:6000\nlisten = unix:/run/engined/0.sock\n"
				     "; gRPC completion-queue threads\npollers = 4\n"));
	ck_assert_ptr_nonnull(strstr(out, "\n[watchdog]\n; stop the systemd watchdog pings while "
				     "one job runs longer than this; 0: never\n"
				     "stuck_job_s = 900\n"));
	ck_assert_int_eq(out[strlen(out) - 1], '\n');
	config_free(&c);
	free(out);
}
END_TEST

/* --check-config's output is itself a configuration file that loads to the
 * same values. */
START_TEST(dump_reloads)
{
	struct daemon_config a, b;
	char err[CONFIG_ERR_MAX];
	char *out, *out2;

	ck_assert_int_eq(load_text(&a, full_file, err), 0);
	out = dump_to_string(&a);
	ck_assert_int_eq(config_init(&b), 0);
	ck_assert_msg(config_load_file(&b, write_conf("dump.conf", out), err) == 0, "%s", err);
	out2 = dump_to_string(&b);
	ck_assert_str_eq(out2, out);
	ck_assert_int_eq(b.n_listen, 2);
	ck_assert_int_eq(b.default_deadline_ms, 2500);
	ck_assert_int_eq(b.max_request_bytes, 256LL << 20);
	ck_assert_int_eq(b.log_level, LOG_LVL_DEBUG);
	free(out);
	free(out2);
	config_free(&a);
	config_free(&b);

	/* Milliseconds survive the dump exactly (%g once kept 6 digits). */
	ck_assert_int_eq(config_init(&a), 0);
	ck_assert_int_eq(config_set(&a, "watchdog", "stuck_job_s", "1234.567", false, err), 0);
	ck_assert_int_eq(config_set(&a, "shutdown", "grace_s", "0.05", false, err), 0);
	out = dump_to_string(&a);
	ck_assert_ptr_nonnull(strstr(out, "stuck_job_s = 1234.567\n"));
	ck_assert_ptr_nonnull(strstr(out, "grace_s = 0.05\n"));
	ck_assert_int_eq(config_init(&b), 0);
	ck_assert_msg(config_load_file(&b, write_conf("dump2.conf", out), err) == 0, "%s", err);
	ck_assert_int_eq(b.stuck_job_ms, 1234567);
	ck_assert_int_eq(b.grace_ms, 50);
	free(out);
	config_free(&a);
	config_free(&b);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("daemon_config");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, defaults_after_init);
	tcase_add_test(tc, integers_and_their_ranges);
	tcase_add_test(tc, sizes_with_suffixes);
	tcase_add_test(tc, booleans);
	tcase_add_test(tc, seconds_into_milliseconds);
	tcase_add_test(tc, log_levels);
	tcase_add_test(tc, strings_paths_and_addresses);
	tcase_add_test(tc, unknown_section_and_key);
	tcase_add_test(tc, listen_list);
	tcase_add_test(tc, file_with_every_key);
	tcase_add_test(tc, file_replaces_default_listen);
	tcase_add_test(tc, file_errors_name_file_line_and_key);
	tcase_add_test(tc, long_lines);
	tcase_add_test(tc, validate_refusals);
	tcase_add_test(tc, addr_is_local);
	tcase_add_test(tc, dump_shows_effective_values);
	tcase_add_test(tc, dump_reloads);
	suite_add_tcase(s, tc);
	return check_run(s);
}
