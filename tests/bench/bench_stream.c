/* bench_stream.c — the daemon's transport against its limits, in one run:
 *
 *  1. raw TCP loopback: 1 GiB in 4 MiB writes, read into a 4 MiB buffer
 *     (the peer of 2), with the threads where the scheduler puts them;
 *     also (--pinned 1, the default) with both on one CPU and on two: on
 *     these 2-core machines the figure is bimodal with the placement (one
 *     core keeps both copies in its caches), and the best is reported too.
 *     These writes send one 4 MiB buffer again and again (calloc'd: the
 *     kernel's zero page, in L1), so their copy into the socket never
 *     touches DRAM, while the stream's data leaves the engine's memory.
 *     "raw TCP from memory" is that peer too: the 1 GiB written from a 1 GiB
 *     buffer of data (written once before, no page faults while timed);
 *  2. GetPerTensorParam of the engine's weights (BFLOAT16 by default: ~1 GiB
 *     for the qwen2.5-0.5b-shape preset), read message by message through
 *     the client transport without copying out of gRPC's buffers (the
 *     equivalent of 1's reads: the kernel-to-user copy is gRPC's own);
 *  3. the same stream through the client's weight iterator
 *     (ec_weights_next), which reassembles whole tensors: one more copy,
 *     what a rollout worker pays;
 *  4. GetStatus round trips (p50 / p99) next to the bare C-core floor: a
 *     call to an unknown method, which the daemon answers UNIMPLEMENTED
 *     without decoding a request or reaching the engine.
 * docs/PERF.md asks for 2 >= 90% of 1 and GetStatus p50 <= 1.3x the floor.
 *
 *   bench_stream ENGINED_BIN [--preset NAME] [--reps N] [--dtype f32|bf16]
 *                [--matmul f32|bf16] [--bucket BYTES] [--latency CALLS]
 *                [--iter 0|1] [--raw 0|1] [--pinned 0|1]
 *                [--addr ADDR [--daemon-pid PID]]
 *
 * --matmul bf16 initializes the engine with bf16 matmuls and runs one
 * training step (in TRAIN mode) before the runs: the engine then keeps its
 * weights rounded to bf16, and a bf16 stream sends that copy in place, as
 * after every optimizer step of a bf16 RL loop. An fp32 engine makes the
 * same copy at its first bf16 pull of all its weights (the first rep: one
 * rounding pass before the first byte goes out) and sends it in place
 * from then on (README, "bf16 matmuls").
 *
 * Starts its own daemon on a kernel-chosen loopback port (or uses the one at
 * --addr, already initialized; its CPU time is counted when --daemon-pid
 * names it). --raw 0 skips 1 (to profile the stream alone; the ratios are
 * then meaningless). The runs of 1, 2 and 3 are interleaved and
 * each rep's ratio is taken within the rep; medians of --reps (default 5)
 * are reported, since these machines are shared and noisy. Next to the
 * rates, the CPU time spent per GB (client + daemon, all threads) says
 * where the time goes even when other work competes for the cores.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engined_client.h"
#include "transport.h"
#include "bench_util.h"

#define CHUNK (4 << 20)
#define RAW_BYTES (1LL << 30)
#define MAX_REPS 15

struct result {
	double gbps;          /* payload GB/s, wall clock */
	double cpu_per_gb;    /* CPU seconds (client + daemon) per GB */
	double daemon_share;  /* of that CPU time, the daemon's */
};

static pid_t daemon_pid;  /* 0: its CPU time is not counted (--addr) */

/* CPU seconds of this process, all threads (exited ones included). */
static double self_cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds of the daemon, all threads: its process CPU clock, which
 * (unlike a sum over /proc/PID/task) keeps the time of threads that have
 * exited, such as a stream's conversion workers, joined before the stream
 * ends. */
static double daemon_cpu_s(void)
{
	struct timespec ts;
	clockid_t id;

	if (!daemon_pid || clock_getcpuclockid(daemon_pid, &id) != 0 ||
	    clock_gettime(id, &ts) != 0)
		return 0;
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct meter {
	double t, self, dmn;
};

static void meter_start(struct meter *m)
{
	m->dmn = daemon_cpu_s();
	m->self = self_cpu_s();
	m->t = now_s();
}

static struct result meter_stop(const struct meter *m, int64_t bytes)
{
	double t = now_s() - m->t, self = self_cpu_s() - m->self;
	double dmn = daemon_cpu_s() - m->dmn, gb = (double)bytes / 1e9;
	struct result r;

	r.gbps = gb / t;
	r.cpu_per_gb = (self + dmn) / gb;
	r.daemon_share = self + dmn > 0 ? dmn / (self + dmn) : 0;
	return r;
}

/* The median of v[n], v left as it is. */
static double median_of(const double *v, int n)
{
	double s[MAX_REPS];

	memcpy(s, v, sizeof(double) * (size_t)n);
	return median(s, n);
}

/* --- 1. raw TCP -------------------------------------------------------- */

struct raw_peer {
	int fd;
	int cpu;                        /* < 0: not pinned */
	const char *src;                /* RAW_BYTES to send; NULL: one chunk again and again */
};

static void pin(pthread_t th, int cpu)
{
	cpu_set_t set;

	if (cpu < 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	(void)pthread_setaffinity_np(th, sizeof(set), &set);
}

static void *raw_sender(void *arg)
{
	struct raw_peer *p = arg;
	char *buf = calloc(1, CHUNK);
	long long sent = 0;

	pin(pthread_self(), p->cpu);
	while (buf && sent < RAW_BYTES) {
		ssize_t n = write(p->fd, p->src ? p->src + sent : buf, CHUNK);

		if (n <= 0)
			break;
		sent += n;
	}
	free(buf);
	close(p->fd);
	return NULL;
}

/* Sender and receiver threads on CPUs cpu_send / cpu_recv (< 0: where the
 * scheduler puts them). On loopback the placement decides the figure: on
 * one core both copies stay in its caches. */
static int raw_tcp(struct result *ret, int cpu_send, int cpu_recv, const char *src)
{
	struct sockaddr_in a;
	socklen_t alen = sizeof(a);
	int ls = socket(AF_INET, SOCK_STREAM, 0), cs;
	char *buf = malloc(CHUNK);
	long long got = 0;
	struct raw_peer peer = { -1, cpu_send, src };
	cpu_set_t saved;
	struct meter m;
	pthread_t th;

	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (!buf || ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0 ||
	    listen(ls, 1) < 0 || getsockname(ls, (struct sockaddr *)&a, &alen) < 0)
		return -1;
	cs = socket(AF_INET, SOCK_STREAM, 0);
	if (cs < 0 || connect(cs, (struct sockaddr *)&a, sizeof(a)) < 0)
		return -1;
	peer.fd = accept(ls, NULL, NULL);
	if (peer.fd < 0)
		return -1;
	(void)pthread_getaffinity_np(pthread_self(), sizeof(saved), &saved);
	pin(pthread_self(), cpu_recv);
	meter_start(&m);
	if (pthread_create(&th, NULL, raw_sender, &peer) != 0)
		return -1;
	for (;;) {
		ssize_t n = read(cs, buf, CHUNK);

		if (n <= 0)
			break;
		got += n;
	}
	pthread_join(th, NULL);
	*ret = meter_stop(&m, got);
	(void)pthread_setaffinity_np(pthread_self(), sizeof(saved), &saved);
	close(cs);
	close(ls);
	free(buf);
	return got == RAW_BYTES ? 0 : -1;
}

/* --- 2. stream, transport level ----------------------------------------- */

static Engined__V1__DType stream_dtype = ENGINED__V1__DTYPE__BFLOAT16;
static int64_t bucket_bytes = CHUNK;

static int stream_transport(struct ect_channel *ch, struct result *ret, int64_t *ret_bytes)
{
	Engined__V1__GetPerTensorParamRequest req = ENGINED__V1__GET_PER_TENSOR_PARAM_REQUEST__INIT;
	const struct ect_seg *segs;
	uint8_t buf[64];
	size_t len, n, mlen;
	char msg[ECT_MSG_MAX];
	struct ect_stream *s;
	int64_t bytes = 0;
	struct meter m;
	int r;

	req.dtype = stream_dtype;
	req.bucket_bytes = bucket_bytes;
	len = engined__v1__get_per_tensor_param_request__pack(&req, buf);
	meter_start(&m);
	r = ect_stream_open(ch, "/engined.v1.TrainingEngine/GetPerTensorParam", buf, len, 0,
			    &s, msg);
	if (r) {
		fprintf(stderr, "stream open failed: %d %s\n", r, msg);
		return -1;
	}
	while ((r = ect_stream_next_segs(s, &segs, &n, &mlen, msg)) == 1)
		bytes += (int64_t)mlen;
	ect_stream_close(s);
	*ret = meter_stop(&m, bytes);
	if (r) {
		fprintf(stderr, "stream failed: %d %s\n", r, msg);
		return -1;
	}
	*ret_bytes = bytes;
	return 0;
}

/* --- 3. stream, whole tensors --------------------------------------------- */

static int stream_iter(struct ec_client *c, struct result *ret)
{
	Engined__V1__GetPerTensorParamRequest req = ENGINED__V1__GET_PER_TENSOR_PARAM_REQUEST__INIT;
	struct ec_weights *w = NULL;
	struct ec_tensor t;
	struct ec_status st;
	int64_t bytes = 0;
	struct meter m;
	int done = 0;

	req.dtype = stream_dtype;
	req.bucket_bytes = bucket_bytes;
	meter_start(&m);
	if (ec_weights_open(c, &req, &w, &st)) {
		fprintf(stderr, "weights open failed: %s\n", st.message);
		return -1;
	}
	while (ec_weights_next(w, &t, &done, &st) == 0 && !done)
		bytes += (int64_t)t.nbytes;
	ec_weights_close(w);
	*ret = meter_stop(&m, bytes);
	if (st.code) {
		fprintf(stderr, "weights failed: %d %s\n", st.code, st.message);
		return -1;
	}
	return 0;
}

/* --- 4. unary latency ---------------------------------------------------- */

static void latency(struct ect_channel *ch, const char *method, int n, double *p50,
		    double *p99)
{
	double *t = malloc(sizeof(double) * (size_t)n);
	char msg[ECT_MSG_MAX];

	if (!t) {
		*p50 = *p99 = 0;
		return;
	}
	for (int i = 0; i < n; i++) {
		uint8_t *resp = NULL;
		size_t rl = 0;
		double t0 = now_s();

		(void)ect_unary(ch, method, "", 0, 0, NULL, &resp, &rl, msg);
		t[i] = now_s() - t0;
		free(resp);
	}
	qsort(t, (size_t)n, sizeof(double), cmp_double);
	*p50 = t[n / 2] * 1e6;
	*p99 = t[n * 99 / 100] * 1e6;
	free(t);
}

static pid_t start_daemon(const char *bin, char *addr, size_t addr_len)
{
	char dir[] = "/tmp/engined-bench-XXXXXX", port_file[128], ck[128], mr[128];
	int port = 0;
	pid_t pid;
	FILE *f;

	if (!mkdtemp(dir))
		return -1;
	snprintf(port_file, sizeof(port_file), "%s/port", dir);
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	snprintf(mr, sizeof(mr), "%s/models", dir);
	pid = fork();
	if (pid == 0) {
		execl(bin, bin, "--listen", "127.0.0.1:0", "--port-file", port_file,
		      "--checkpoint-root", ck, "--model-root", mr, "--log-level", "warn",
		      (char *)NULL);
		_exit(127);
	}
	if (pid < 0)
		return -1;
	for (int i = 0; i < 400 && !port; i++) {
		if ((f = fopen(port_file, "r"))) {
			if (fscanf(f, "%d", &port) != 1)
				port = 0;
			fclose(f);
		}
		if (!port)
			usleep(25000);
	}
	if (!port) {
		fprintf(stderr, "daemon did not start\n");
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return -1;
	}
	snprintf(addr, addr_len, "127.0.0.1:%d", port);
	return pid;
}

/* TRAIN mode, one SFT forward_backward of 2 x 16 tokens, an optimizer
 * step: with bf16 matmuls, the engine's bf16 copy is then current. */
static int train_step(struct ec_client *c, struct ec_status *st)
{
	Engined__V1__SetModeRequest mr = ENGINED__V1__SET_MODE_REQUEST__INIT;
	Engined__V1__SetModeResponse *mres = NULL;
	Engined__V1__ForwardBackwardRequest fb = ENGINED__V1__FORWARD_BACKWARD_REQUEST__INIT;
	Engined__V1__ForwardBackwardResponse *fres = NULL;
	Engined__V1__OptimizerStepResponse *ores = NULL;
	Engined__V1__LossSpec loss = ENGINED__V1__LOSS_SPEC__INIT;
	Engined__V1__Tensor t_ids = ENGINED__V1__TENSOR__INIT;
	int32_t ids[32], lens[2] = { 16, 16 };
	int64_t n = 32;
	int r;

	for (int i = 0; i < 32; i++)
		ids[i] = (i * 37 + 11) % 1000;
	mr.mode = ENGINED__V1__MODE__MODE_TRAIN;
	if ((r = ec_set_mode(c, &mr, &mres, st)) != 0)
		return r;
	ec_free(mres);
	ec_tensor_1d(&t_ids, ENGINED__V1__DTYPE__INT32, &n, ids, sizeof(ids));
	loss.name = "sft";
	fb.input_ids = &t_ids;
	fb.n_seq_lens = 2;
	fb.seq_lens = lens;
	fb.loss = &loss;
	if ((r = ec_forward_backward(c, &fb, &fres, st)) != 0)
		return r;
	ec_free(fres);
	if ((r = ec_optimizer_step(c, &ores, st)) != 0)
		return r;
	ec_free(ores);
	return 0;
}

static void print_result(const char *what, const struct result *r)
{
	printf("  %-30s %6.2f GB/s  %5.3f CPU-s/GB (daemon %2.0f%%)\n", what, r->gbps,
	       r->cpu_per_gb, 100 * r->daemon_share);
}

int main(int argc, char **argv)
{
	const char *bin = argc > 1 ? argv[1] : "daemon/engined", *preset = "qwen2.5-0.5b-shape";
	double raw[MAX_REPS], strm[MAX_REPS], iter[MAX_REPS], rs[MAX_REPS], ri[MAX_REPS];
	double best[MAX_REPS], rb[MAX_REPS];
	double raw_cpu[MAX_REPS], strm_cpu[MAX_REPS], iter_cpu[MAX_REPS];
	double mem[MAX_REPS], mem_cpu[MAX_REPS], rm[MAX_REPS], rmc[MAX_REPS], rim[MAX_REPS];
	char *raw_src = NULL;
	double sp50[MAX_REPS], sp99[MAX_REPS], ep50[MAX_REPS], ep99[MAX_REPS];
	int reps = 5, lat_calls = 2000, do_iter = 1, do_raw = 1, do_pinned = 1, failed = 0;
	int bf16_matmul = 0;
	int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
	const char *ext_addr = NULL;
	pid_t ext_pid = 0;
	char addr[64], msg[ECT_MSG_MAX];
	struct ec_client *c;
	struct ect_channel *ch;
	struct ec_status st;
	Engined__V1__InitializeRequest ir = ENGINED__V1__INITIALIZE_REQUEST__INIT;
	Engined__V1__InitializeResponse *ires = NULL;
	int64_t bytes = 0;
	int status;

	for (int i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--preset"))
			preset = argv[i + 1];
		else if (!strcmp(argv[i], "--reps"))
			reps = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--dtype"))
			stream_dtype = strcmp(argv[i + 1], "f32") ? ENGINED__V1__DTYPE__BFLOAT16 :
				       ENGINED__V1__DTYPE__FLOAT32;
		else if (!strcmp(argv[i], "--matmul"))
			bf16_matmul = !strcmp(argv[i + 1], "bf16");
		else if (!strcmp(argv[i], "--bucket"))
			bucket_bytes = atoll(argv[i + 1]);
		else if (!strcmp(argv[i], "--latency"))
			lat_calls = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--iter"))
			do_iter = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--raw"))
			do_raw = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--pinned"))
			do_pinned = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--addr"))
			ext_addr = argv[i + 1];
		else if (!strcmp(argv[i], "--daemon-pid"))
			ext_pid = atoi(argv[i + 1]);
	}
	if (reps < 1 || reps > MAX_REPS)
		reps = 5;
	if (ext_addr) {
		snprintf(addr, sizeof(addr), "%s", ext_addr);
		daemon_pid = ext_pid;
	} else {
		daemon_pid = start_daemon(bin, addr, sizeof(addr));
		if (daemon_pid < 0)
			return 1;
	}
	if (ec_connect(addr, &c, &st) || ect_open(addr, 1LL << 30, &ch, msg))
		return 1;
	if (!ext_addr) {
		ir.preset = (char *)preset;
		ir.replace = 1;
		ir.bf16_matmul = bf16_matmul;
		printf("initializing preset %s%s ...\n", preset, bf16_matmul ? ", bf16 matmuls" : "");
		if (ec_initialize(c, &ir, &ires, &st) || (bf16_matmul && train_step(c, &st))) {
			fprintf(stderr, "Initialize / training step: %s\n", st.message);
			kill(daemon_pid, SIGTERM);
			return 1;
		}
		printf("%lld parameters (%.2f GiB in bf16)\n", (long long)ires->num_parameters,
		       (double)ires->num_parameters * 2 / (1 << 30));
		ec_free(ires);
	}
	printf("bucket_bytes %lld, dtype %s\n", (long long)bucket_bytes,
	       stream_dtype == ENGINED__V1__DTYPE__FLOAT32 ? "f32" : "bf16");

	/* The source of "raw TCP from memory", written once (no page faults
	 * while timed), with data rather than zeroes. */
	if (do_raw) {
		raw_src = malloc(RAW_BYTES);
		if (!raw_src)
			return 1;
		for (int64_t k = 0; k < RAW_BYTES; k++)
			raw_src[k] = (char)(k * 131 + (k >> 12));
	}
	for (int r = 0; r < reps; r++) {
		struct result a = { 1, 0, 0 }, a1 = { 0, 0, 0 }, a2 = { 0, 0, 0 }, b;
		struct result am = { 1, 1, 0 };
		struct result i = { 0, 0, 0 };

		if ((do_raw && raw_tcp(&a, -1, -1, NULL) < 0) ||
		    (do_raw && do_pinned && raw_tcp(&a1, 0, 0, NULL) < 0) ||
		    (do_raw && do_pinned && ncpu > 1 && raw_tcp(&a2, 0, 1, NULL) < 0) ||
		    (do_raw && raw_tcp(&am, -1, -1, raw_src) < 0) ||
		    stream_transport(ch, &b, &bytes) < 0 ||
		    (do_iter && stream_iter(c, &i) < 0)) {
			failed = 1;
			break;
		}
		best[r] = a.gbps > a1.gbps ? a.gbps : a1.gbps;
		best[r] = best[r] > a2.gbps ? best[r] : a2.gbps;
		rb[r] = b.gbps / best[r];
		raw[r] = a.gbps;
		raw_cpu[r] = a.cpu_per_gb;
		strm[r] = b.gbps;
		strm_cpu[r] = b.cpu_per_gb;
		iter[r] = i.gbps;
		iter_cpu[r] = i.cpu_per_gb;
		rs[r] = b.gbps / a.gbps;
		ri[r] = i.gbps / a.gbps;
		mem[r] = am.gbps;
		mem_cpu[r] = am.cpu_per_gb;
		rm[r] = b.gbps / am.gbps;
		rmc[r] = b.cpu_per_gb / am.cpu_per_gb;
		rim[r] = i.gbps / am.gbps;
		printf("run %d: stream %.2f GiB, %.0f%% of raw TCP%s", r + 1,
		       (double)bytes / (1 << 30), 100 * rs[r], do_iter ? "" : "\n");
		if (do_iter)
			printf(", iterator %.0f%%\n", 100 * ri[r]);
		print_result("raw TCP", &a);
		if (do_raw && do_pinned) {
			print_result("raw TCP, both ends on CPU 0", &a1);
			if (ncpu > 1)
				print_result("raw TCP, on CPUs 0 and 1", &a2);
		}
		if (do_raw)
			print_result("raw TCP from memory", &am);
		print_result("stream (transport, no copy)", &b);
		if (do_iter)
			print_result("stream (ec_weights_next)", &i);
		if (lat_calls > 0) {
			latency(ch, "/engined.v1.TrainingEngine/GetStatus", lat_calls, &sp50[r],
				&sp99[r]);
			latency(ch, "/engined.v1.Bench/Echo", lat_calls, &ep50[r], &ep99[r]);
			printf("  GetStatus p50 %.1f us p99 %.1f us, floor p50 %.1f us p99 %.1f us\n",
			       sp50[r], sp99[r], ep50[r], ep99[r]);
		}
	}
	if (!failed) {
		printf("median of %d: raw TCP %.2f GB/s (%.3f CPU-s/GB); GetPerTensorParam %s"
		       " %.2f GB/s (%.3f CPU-s/GB)\n", reps, median_of(raw, reps),
		       median_of(raw_cpu, reps),
		       stream_dtype == ENGINED__V1__DTYPE__FLOAT32 ? "f32" : "bf16",
		       median_of(strm, reps), median_of(strm_cpu, reps));
		printf("median: GetPerTensorParam = %.0f%% of raw TCP in the same run (goal >= 90%%)\n",
		       100 * median_of(rs, reps));
		if (do_raw && do_pinned)
			printf("median: = %.0f%% of raw TCP's best pinned placement (%.2f GB/s)\n",
			       100 * median_of(rb, reps), median_of(best, reps));
		if (do_iter)
			printf("median: through ec_weights_next %.2f GB/s (%.3f CPU-s/GB) = %.0f%% of"
			       " raw TCP\n", median_of(iter, reps), median_of(iter_cpu, reps),
			       100 * median_of(ri, reps));
		if (do_raw) {
			printf("median: raw TCP from memory %.2f GB/s (%.3f CPU-s/GB); the stream ="
			       " %.0f%% of it, %.2fx its CPU per GB (goals >= 90%%, <= 1.2x)\n",
			       median_of(mem, reps), median_of(mem_cpu, reps), 100 * median_of(rm, reps),
			       median_of(rmc, reps));
			if (do_iter)
				printf("median: ec_weights_next = %.0f%% of raw TCP from memory"
				       " (goal >= 70%%)\n", 100 * median_of(rim, reps));
		}
		if (lat_calls > 0)
			printf("median: GetStatus p50 %.1f us, p99 %.1f us = %.2fx the C-core floor"
			       " p50 %.1f us (goal <= 1.3x)\n", median_of(sp50, reps), median_of(sp99, reps),
			       median_of(sp50, reps) / median_of(ep50, reps), median_of(ep50, reps));
	}
	free(raw_src);
	ect_close(ch);
	ec_close(c);
	if (!ext_addr) {
		kill(daemon_pid, SIGTERM);
		waitpid(daemon_pid, &status, 0);
	}
	return failed;
}
