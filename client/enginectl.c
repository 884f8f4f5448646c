/* enginectl — command-line client of engined.
 *
 *   enginectl [--addr ADDR] [--timeout SEC] [--tls-ca PEM [--tls-cert PEM
 *              --tls-key PEM] [--tls-server-name NAME]] [--token-file FILE]
 *             COMMAND [options]
 *   (the token may also come from $ENGINED_TOKEN)
 *     status
 *     init [--preset NAME | --config model.json | --model-path DIR]
 *          [--model-type T] [--device D] [--seed N] [--lr X] [--bf16-matmul]
 *     set-mode idle|train|eval [--no-auto-offload]
 *     to-device cpu|cuda [--model] [--optimizer] [--grad]   (none given: all)
 *     save PATH [--step N] [--keep K]
 *     load PATH
 *     pull-weights --out FILE.safetensors [--dtype f32|bf16|f16] [--names a,b]
 *     demo [--preset NAME] [--sft-steps N] [--ppo-steps N] [--checkpoint-root DIR]
 *
 * Exit status: 0 on success, 1 when the daemon answered an error (printed
 * as CODE: message), 2 on bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engined_client.h"
#include "io/fileio.h"
#include "io/safetensors.h"

static const char *addr = "127.0.0.1:50051";
static double timeout_s = 0;
static struct ec_options sec;   /* TLS files, token file (global options) */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: enginectl [--addr ADDR] [--timeout SEC] [security] COMMAND [options]\n"
		"security: --tls-ca PEM (TLS) [--tls-cert PEM --tls-key PEM] (mutual TLS)\n"
		"          [--tls-server-name NAME] [--token-file FILE] ($ENGINED_TOKEN)\n"
		"  status\n"
		"  init [--preset NAME | --config model.json | --model-path DIR]\n"
		"       [--model-type language_model|value_model] [--device cpu|cuda]\n"
		"       [--seed N] [--lr X] [--bf16-matmul]\n"
		"  set-mode idle|train|eval [--no-auto-offload]\n"
		"  to-device cpu|cuda [--model] [--optimizer] [--grad]\n"
		"  save PATH [--step N] [--keep K]\n"
		"  load PATH\n"
		"  pull-weights --out FILE.safetensors [--dtype f32|bf16|f16] [--names a,b,...]\n"
		"  demo [--preset NAME] [--sft-steps N] [--ppo-steps N] [--checkpoint-root DIR]\n"
		"ADDR defaults to 127.0.0.1:50051 (unix:/path for a socket).\n");
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int fail(const char *what, const struct ec_status *st)
{
	fprintf(stderr, "enginectl: %s: %s: %s\n", what, ec_code_name(st->code), st->message);
	return 1;
}

static struct ec_client *connect_or_die(void)
{
	struct ec_client *c = NULL;
	struct ec_status st;

	sec.token = getenv("ENGINED_TOKEN");
	if (sec.token && !sec.token[0])
		sec.token = NULL;
	if (ec_connect_opts(addr, &sec, &c, &st)) {
		fail("connect", &st);
		exit(1);
	}
	if (timeout_s > 0)
		ec_set_timeout_ms(c, (int64_t)(timeout_s * 1000));
	return c;
}

static const char *mode_name(Engined__V1__Mode m)
{
	switch (m) {
	case ENGINED__V1__MODE__MODE_IDLE: return "idle";
	case ENGINED__V1__MODE__MODE_TRAIN: return "train";
	case ENGINED__V1__MODE__MODE_EVAL: return "eval";
	default: return "unspecified";
	}
}

static void print_placement(const char *label, const Engined__V1__Placement *p)
{
	printf("%s model=%s optimizer=%s grad=%s\n", label,
	       p && p->model ? "device" : "host", p && p->optimizer ? "device" : "host",
	       p && p->grad ? "device" : "host");
}

/* --- status / init / set-mode / to-device / save / load ------------------ */

static int cmd_status(int argc, char **argv)
{
	struct ec_client *c = connect_or_die();
	Engined__V1__GetStatusResponse *s = NULL;
	struct ec_status st;
	int serving = 0;

	if (ec_get_status(c, &s, &st))
		return fail("GetStatus", &st);
	if (ec_health_check(c, "", &serving, &st))
		serving = 0;
	printf("daemon      engined %s at %s, up %.1f s, health %s\n", s->version, addr,
	       s->uptime, serving == 1 ? "SERVING" : "NOT_SERVING");
	if (!s->initialized) {
		printf("engine      not initialized\n");
	} else {
		printf("engine      %s, %lld parameters\n", s->engine_key,
		       (long long)s->num_parameters);
		printf("mode        %s\n", mode_name(s->mode));
		print_placement("placement  ", s->placement);
		printf("step        %lld optimizer steps, %lld scheduler steps, lr %.6g\n",
		       (long long)s->step, (long long)s->sched_step, s->lr);
	}
	if (s->memory)
		printf("memory      device %.1f MiB, host %.1f MiB, rss %.1f MiB\n",
		       (double)s->memory->device_bytes / 1048576.0,
		       (double)s->memory->host_bytes / 1048576.0,
		       (double)s->memory->rss_bytes / 1048576.0);
	printf("busy        %s%s%s, %lld queued\n", s->busy ? "yes" : "no",
	       s->busy ? " running " : "", s->busy ? s->current_job : "",
	       (long long)s->queued_jobs);
	ec_free(s);
	ec_close(c);
	return 0;
}

static char *read_file(const char *path)
{
	/* An HF config.json: under 64 MiB, as the engine's own reader takes.
	 * NULL with errno set on failure (EFBIG when larger). */
	char *buf = NULL;
	int r = io_read_file(path, (64u << 20) - 1, &buf, NULL);

	if (r < 0) {
		errno = -r;
		return NULL;
	}
	return buf;
}

static int cmd_init(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "preset", required_argument, NULL, 'p' },
		{ "config", required_argument, NULL, 'c' },
		{ "model-path", required_argument, NULL, 'm' },
		{ "model-type", required_argument, NULL, 't' },
		{ "device", required_argument, NULL, 'd' },
		{ "seed", required_argument, NULL, 's' },
		{ "lr", required_argument, NULL, 'l' },
		{ "bf16-matmul", no_argument, NULL, 'b' },
		{ NULL, 0, NULL, 0 },
	};
	Engined__V1__InitializeRequest req = ENGINED__V1__INITIALIZE_REQUEST__INIT;
	Engined__V1__OptimizerConfig opt = ENGINED__V1__OPTIMIZER_CONFIG__INIT;
	Engined__V1__InitializeResponse *resp = NULL;
	struct ec_client *c;
	struct ec_status st;
	char *config = NULL;
	int o;

	optind = 1;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'p': req.preset = optarg; break;
		case 'c':
			config = read_file(optarg);
			if (!config) {
				fprintf(stderr, "enginectl: cannot read %s: %s\n", optarg,
					strerror(errno));
				return 1;
			}
			req.hf_config_json = config;
			break;
		case 'm': req.model_path = optarg; break;
		case 't': req.model_type = optarg; break;
		case 'd': req.device = optarg; break;
		case 's': req.seed = strtoull(optarg, NULL, 10); break;
		case 'l': opt.lr = atof(optarg); req.optimizer = &opt; break;
		case 'b': req.bf16_matmul = true; break;
		default: usage(stderr); return 2;
		}
	}
	if (!req.preset[0] && !req.hf_config_json[0] && !req.model_path[0])
		req.preset = "tiny";
	c = connect_or_die();
	if (ec_initialize(c, &req, &resp, &st)) {
		free(config);
		return fail("Initialize", &st);
	}
	printf("initialized %s: %lld parameters in %lld tensors\n", resp->engine_key,
	       (long long)resp->num_parameters, (long long)resp->num_tensors);
	ec_free(resp);
	ec_close(c);
	free(config);
	return 0;
}

static int cmd_set_mode(int argc, char **argv)
{
	Engined__V1__SetModeRequest req = ENGINED__V1__SET_MODE_REQUEST__INIT;
	Engined__V1__SetModeResponse *resp = NULL;
	struct ec_client *c;
	struct ec_status st;

	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "idle"))
		req.mode = ENGINED__V1__MODE__MODE_IDLE;
	else if (!strcmp(argv[1], "train"))
		req.mode = ENGINED__V1__MODE__MODE_TRAIN;
	else if (!strcmp(argv[1], "eval"))
		req.mode = ENGINED__V1__MODE__MODE_EVAL;
	else {
		usage(stderr);
		return 2;
	}
	req.disable_auto_offload = argc > 2 && !strcmp(argv[2], "--no-auto-offload");
	c = connect_or_die();
	if (ec_set_mode(c, &req, &resp, &st))
		return fail("SetMode", &st);
	printf("mode %s\n", mode_name(resp->mode));
	print_placement("placement", resp->placement);
	ec_free(resp);
	ec_close(c);
	return 0;
}

static int cmd_to_device(int argc, char **argv)
{
	Engined__V1__ToDeviceRequest req = ENGINED__V1__TO_DEVICE_REQUEST__INIT;
	Engined__V1__ToDeviceResponse *resp = NULL;
	struct ec_client *c;
	struct ec_status st;
	bool any = false;

	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	req.device = argv[1];
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--model"))
			req.model = any = true;
		else if (!strcmp(argv[i], "--optimizer"))
			req.optimizer = any = true;
		else if (!strcmp(argv[i], "--grad"))
			req.grad = any = true;
		else {
			usage(stderr);
			return 2;
		}
	}
	if (!any)
		req.model = req.optimizer = req.grad = true;
	c = connect_or_die();
	if (ec_to_device(c, &req, &resp, &st))
		return fail("ToDevice", &st);
	print_placement("placement", resp->placement);
	ec_free(resp);
	ec_close(c);
	return 0;
}

static int cmd_save(int argc, char **argv)
{
	Engined__V1__SaveCheckpointRequest req = ENGINED__V1__SAVE_CHECKPOINT_REQUEST__INIT;
	Engined__V1__SaveCheckpointResponse *resp = NULL;
	struct ec_client *c;
	struct ec_status st;

	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	req.path = argv[1];
	for (int i = 2; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--step"))
			req.global_step = atoll(argv[i + 1]);
		else if (!strcmp(argv[i], "--keep"))
			req.max_to_keep = atoi(argv[i + 1]);
		else {
			usage(stderr);
			return 2;
		}
	}
	c = connect_or_die();
	if (ec_save_checkpoint(c, &req, &resp, &st))
		return fail("SaveCheckpoint", &st);
	printf("saved %s (%.1f MiB)\n", resp->path, (double)resp->bytes / 1048576.0);
	ec_free(resp);
	ec_close(c);
	return 0;
}

static int cmd_load(int argc, char **argv)
{
	Engined__V1__LoadCheckpointRequest req = ENGINED__V1__LOAD_CHECKPOINT_REQUEST__INIT;
	Engined__V1__LoadCheckpointResponse *resp = NULL;
	struct ec_client *c;
	struct ec_status st;

	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	req.path = argv[1];
	c = connect_or_die();
	if (ec_load_checkpoint(c, &req, &resp, &st))
		return fail("LoadCheckpoint", &st);
	printf("loaded %s at global step %lld\n", argv[1], (long long)resp->global_step);
	ec_free(resp);
	ec_close(c);
	return 0;
}

/* --- pull-weights -------------------------------------------------------- */

/* One tensor as received (owned copies: the stream's buffers do not last). */
struct pulled_tensor {
	char *name;
	enum st_dtype dtype;
	int ndim;
	int64_t shape[8];
	uint8_t *data;
	size_t nbytes;
};

static enum st_dtype pulled_dtype(Engined__V1__DType d)
{
	return d == ENGINED__V1__DTYPE__BFLOAT16 ? ST_BF16 :
	       d == ENGINED__V1__DTYPE__FLOAT16 ? ST_F16 : ST_F32;
}

/* Write the tensors with engines/io's safetensors writer, their bytes as
 * received (no conversion). 0 or -errno, with err saying what failed; no
 * file is left behind on failure. */
static int write_safetensors(const char *path, const struct pulled_tensor *t, size_t n,
			     struct eng_error *err)
{
	struct st_writer *w = NULL;
	int r = st_writer_new(path, &w, err);

	for (size_t i = 0; !r && i < n; i++)
		r = st_writer_add_raw(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape,
				      t[i].data, t[i].nbytes, err);
	if (r) {
		st_writer_abort(w);
		return r;
	}
	return st_writer_finish(w, NULL, NULL, err);
}

static void progress(int64_t done, int64_t total, double t0, bool final)
{
	double el = now_s() - t0, rate = el > 0 ? (double)done / el : 0;
	double frac = total > 0 ? (double)done / (double)total : 0;
	char bar[31];
	int fill = (int)(frac * 30);

	if (frac > 1)
		frac = 1, fill = 30;
	for (int i = 0; i < 30; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[30] = '\0';
	fprintf(stderr, "\r[%s] %5.1f%% %8.1f MiB %7.1f MiB/s ETA %4.0fs%s", bar,
		frac * 100, (double)done / 1048576.0, rate / 1048576.0,
		rate > 0 && total > done ? (double)(total - done) / rate : 0.0,
		final ? "\n" : "");
}

static int cmd_pull(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "out", required_argument, NULL, 'o' },
		{ "dtype", required_argument, NULL, 'd' },
		{ "names", required_argument, NULL, 'n' },
		{ "bucket-bytes", required_argument, NULL, 'b' },
		{ NULL, 0, NULL, 0 },
	};
	Engined__V1__GetPerTensorParamRequest req = ENGINED__V1__GET_PER_TENSOR_PARAM_REQUEST__INIT;
	Engined__V1__GetStatusResponse *s = NULL;
	const char *out = NULL;
	char *names_buf = NULL, *names[4096];
	struct pulled_tensor *ts = NULL;
	size_t nt = 0, cap = 0;
	struct ec_weights *w = NULL;
	struct ec_client *c;
	struct ec_status st;
	struct ec_tensor t;
	struct eng_error werr = { 0 };
	bool tty = isatty(2);
	int64_t total = 0;
	double t0, last = 0;
	int o, done = 0, r;

	optind = 1;
	req.dtype = ENGINED__V1__DTYPE__FLOAT32;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'o': out = optarg; break;
		case 'd':
			if (!strcmp(optarg, "f32"))
				req.dtype = ENGINED__V1__DTYPE__FLOAT32;
			else if (!strcmp(optarg, "bf16"))
				req.dtype = ENGINED__V1__DTYPE__BFLOAT16;
			else if (!strcmp(optarg, "f16"))
				req.dtype = ENGINED__V1__DTYPE__FLOAT16;
			else {
				usage(stderr);
				return 2;
			}
			break;
		case 'n':
			names_buf = strdup(optarg);
			for (char *p = strtok(names_buf, ","); p && req.n_names < 4096;
			     p = strtok(NULL, ","))
				names[req.n_names++] = p;
			req.names = names;
			break;
		case 'b': req.bucket_bytes = atoll(optarg); break;
		default: usage(stderr); return 2;
		}
	}
	if (!out) {
		usage(stderr);
		return 2;
	}
	c = connect_or_die();
	if (!req.n_names && ec_get_status(c, &s, &st) == 0) {
		total = s->num_parameters * (req.dtype == ENGINED__V1__DTYPE__FLOAT32 ? 4 : 2);
		ec_free(s);
	}
	t0 = now_s();
	if (ec_weights_open(c, &req, &w, &st))
		return fail("GetPerTensorParam", &st);
	for (;;) {
		r = ec_weights_next(w, &t, &done, &st);
		if (r || done)
			break;
		if (nt == cap) {
			struct pulled_tensor *n2;

			cap = cap ? cap * 2 : 64;
			n2 = realloc(ts, cap * sizeof(*ts));
			if (!n2) {
				fprintf(stderr, "enginectl: out of memory\n");
				return 1;
			}
			ts = n2;
		}
		ts[nt].name = strdup(t.name);
		ts[nt].dtype = pulled_dtype(t.dtype);
		ts[nt].ndim = t.ndim;
		memcpy(ts[nt].shape, t.shape, sizeof(t.shape));
		ts[nt].data = malloc(t.nbytes ? t.nbytes : 1);
		if (!ts[nt].name || !ts[nt].data) {
			fprintf(stderr, "enginectl: out of memory\n");
			return 1;
		}
		memcpy(ts[nt].data, t.data, t.nbytes);
		ts[nt].nbytes = t.nbytes;
		nt++;
		if (tty && now_s() - last > 0.1) {
			last = now_s();
			progress(ec_weights_bytes(w), total, t0, false);
		}
	}
	if (tty)
		progress(ec_weights_bytes(w), total ? total : ec_weights_bytes(w), t0, true);
	if (r) {
		ec_weights_close(w);
		return fail("GetPerTensorParam", &st);
	}
	printf("received %zu tensors, %.1f MiB in %lld messages, %.2f s\n", nt,
	       (double)ec_weights_bytes(w) / 1048576.0, (long long)ec_weights_messages(w),
	       now_s() - t0);
	ec_weights_close(w);
	ec_close(c);
	r = write_safetensors(out, ts, nt, &werr);
	if (r < 0) {
		fprintf(stderr, "enginectl: %s\n", werr.msg);   /* names the file */
		return 1;
	}
	printf("wrote %s\n", out);
	for (size_t i = 0; i < nt; i++) {
		free(ts[i].name);
		free(ts[i].data);
	}
	free(ts);
	free(names_buf);
	return 0;
}

/* --- demo ---------------------------------------------------------------- */

/* A synthetic next-token task: each sequence counts up by a fixed stride
 * from a random start, modulo 64. `corrupt` replaces the second half with
 * random tokens (a "bad" sample for the PPO part). */
static void make_batch(int32_t *ids, int32_t *seq_lens, int nseq, int len,
		       unsigned *seed, const bool *corrupt)
{
	for (int s = 0; s < nseq; s++) {
		int32_t start = (int32_t)(rand_r(seed) % 64);

		seq_lens[s] = len;
		for (int t = 0; t < len; t++) {
			int32_t v = (start + 3 * t) % 64;

			if (corrupt && corrupt[s] && t >= len / 2)
				v = (int32_t)(rand_r(seed) % 64);
			ids[s * len + t] = v;
		}
	}
}

static Engined__V1__LossSpec__OptionsEntry opt_entry(const char *k, const char *v)
{
	Engined__V1__LossSpec__OptionsEntry e = ENGINED__V1__LOSS_SPEC__OPTIONS_ENTRY__INIT;

	e.key = (char *)k;
	e.value = (char *)v;
	return e;
}

static double metric(const Engined__V1__ForwardBackwardResponse *r, const char *k)
{
	for (size_t i = 0; i < r->n_metrics; i++)
		if (!strcmp(r->metrics[i]->key, k))
			return r->metrics[i]->value;
	return NAN;
}

struct weights_copy {
	size_t n;
	char **names;
	uint8_t **data;
	size_t *len;
};

static int pull_all(struct ec_client *c, struct weights_copy *wc, struct ec_status *st)
{
	Engined__V1__GetPerTensorParamRequest req = ENGINED__V1__GET_PER_TENSOR_PARAM_REQUEST__INIT;
	struct ec_weights *w = NULL;
	struct ec_tensor t;
	size_t cap = 0;
	int done = 0, r;

	memset(wc, 0, sizeof(*wc));
	req.dtype = ENGINED__V1__DTYPE__FLOAT32;
	r = ec_weights_open(c, &req, &w, st);
	if (r)
		return r;
	while (!(r = ec_weights_next(w, &t, &done, st)) && !done) {
		if (wc->n == cap) {
			cap = cap ? cap * 2 : 64;
			wc->names = realloc(wc->names, cap * sizeof(char *));
			wc->data = realloc(wc->data, cap * sizeof(uint8_t *));
			wc->len = realloc(wc->len, cap * sizeof(size_t));
			if (!wc->names || !wc->data || !wc->len) {
				ec_weights_close(w);
				return EC_RESOURCE_EXHAUSTED;
			}
		}
		wc->names[wc->n] = strdup(t.name);
		wc->data[wc->n] = malloc(t.nbytes ? t.nbytes : 1);
		memcpy(wc->data[wc->n], t.data, t.nbytes);
		wc->len[wc->n] = t.nbytes;
		wc->n++;
	}
	ec_weights_close(w);
	return r;
}

static void weights_free(struct weights_copy *wc)
{
	for (size_t i = 0; i < wc->n; i++) {
		free(wc->names[i]);
		free(wc->data[i]);
	}
	free(wc->names);
	free(wc->data);
	free(wc->len);
}

static double mean_f32(const float *v, int n)
{
	double m = 0;

	for (int i = 0; i < n; i++)
		m += v[i];
	return n ? m / n : 0;
}

static int cmd_demo(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "preset", required_argument, NULL, 'p' },
		{ "sft-steps", required_argument, NULL, 's' },
		{ "ppo-steps", required_argument, NULL, 'P' },
		{ "checkpoint-root", required_argument, NULL, 'c' },
		{ NULL, 0, NULL, 0 },
	};
	enum { NSEQ = 8, LEN = 32, N = NSEQ * LEN };
	const char *preset = "tiny", *ckpt_root = "./var/checkpoints";
	int sft_steps = 40, ppo_steps = 4, o, serving = 0;
	Engined__V1__InitializeRequest ireq = ENGINED__V1__INITIALIZE_REQUEST__INIT;
	Engined__V1__OptimizerConfig opt = ENGINED__V1__OPTIMIZER_CONFIG__INIT;
	Engined__V1__InitializeResponse *iresp = NULL;
	Engined__V1__ForwardBackwardRequest fb = ENGINED__V1__FORWARD_BACKWARD_REQUEST__INIT;
	Engined__V1__ForwardBackwardResponse *fr = NULL, *old = NULL;
	Engined__V1__OptimizerStepResponse *sr = NULL;
	Engined__V1__LrSchedulerStepResponse *lr = NULL;
	Engined__V1__SaveCheckpointRequest sreq = ENGINED__V1__SAVE_CHECKPOINT_REQUEST__INIT;
	Engined__V1__SaveCheckpointResponse *sresp = NULL;
	Engined__V1__LoadCheckpointRequest lreq = ENGINED__V1__LOAD_CHECKPOINT_REQUEST__INIT;
	Engined__V1__LoadCheckpointResponse *lresp = NULL;
	Engined__V1__LossSpec loss = ENGINED__V1__LOSS_SPEC__INIT;
	Engined__V1__LossSpec__OptionsEntry oe[3], *oep[3];
	Engined__V1__Tensor t_ids, t_adv, t_old;
	struct weights_copy w1, w2;
	struct ec_client *c;
	struct ec_status st;
	int32_t ids[N], seq_lens[NSEQ];
	float adv[N];
	int64_t n = N;
	unsigned seed = 1234;
	bool corrupt[NSEQ];
	double first = 0, lastl = 0, t0;
	char ckpt_rel[64], file[4200];
	int mismatches = 0, checked = 0;

	optind = 1;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 'p': preset = optarg; break;
		case 's': sft_steps = atoi(optarg); break;
		case 'P': ppo_steps = atoi(optarg); break;
		case 'c': ckpt_root = optarg; break;
		default: usage(stderr); return 2;
		}
	}
	c = connect_or_die();
	if (ec_health_check(c, "", &serving, &st))
		return fail("Health", &st);
	printf("== engined at %s: %s\n", addr, serving == 1 ? "SERVING" : "NOT_SERVING");

	ireq.preset = (char *)preset;
	ireq.seed = 42;
	opt.lr = 3e-3;
	opt.weight_decay = 1e-4;
	ireq.optimizer = &opt;
	t0 = now_s();
	if (ec_initialize(c, &ireq, &iresp, &st))
		return fail("Initialize", &st);
	printf("== Initialize preset %s: %s, %lld parameters (%.2f s)\n", preset,
	       iresp->engine_key, (long long)iresp->num_parameters, now_s() - t0);
	ec_free(iresp);

	/* SFT on the counting task. */
	printf("== SFT: %d steps of %d sequences x %d tokens (next token = +3 mod 64)\n",
	       sft_steps, NSEQ, LEN);
	loss.name = "sft";
	fb.loss = &loss;
	fb.n_seq_lens = NSEQ;
	fb.seq_lens = seq_lens;
	for (int step = 1; step <= sft_steps; step++) {
		make_batch(ids, seq_lens, NSEQ, LEN, &seed, NULL);
		ec_tensor_1d(&t_ids, ENGINED__V1__DTYPE__INT32, &n, ids, sizeof(ids));
		fb.input_ids = &t_ids;
		t0 = now_s();
		if (ec_forward_backward(c, &fb, &fr, &st))
			return fail("ForwardBackward", &st);
		if (ec_optimizer_step(c, &sr, &st))
			return fail("OptimizerStep", &st);
		if (ec_lr_scheduler_step(c, &lr, &st))
			return fail("LrSchedulerStep", &st);
		if (step == 1)
			first = fr->loss;
		lastl = fr->loss;
		if (step == 1 || step % 5 == 0 || step == sft_steps)
			printf("  step %3d  loss %7.4f  grad_norm %7.4f  lr %.2e  %5.0f ms\n", step,
			       fr->loss, sr->grad_norm, sr->lr, (now_s() - t0) * 1e3);
		ec_free(fr);
		ec_free(sr);
		ec_free(lr);
	}
	printf("  loss %.4f -> %.4f %s\n", first, lastl,
	       lastl < 0.5 * first ? "(learned)" : "(did not fall by half)");

	/* RL: old log-probs at temperature 0.7, then PPO on made-up advantages:
	 * +1 for clean sequences, -1 for corrupted ones. */
	for (int s = 0; s < NSEQ; s++)
		corrupt[s] = s % 2;
	make_batch(ids, seq_lens, NSEQ, LEN, &seed, corrupt);
	for (int s = 0; s < NSEQ; s++)
		for (int t = 0; t < LEN; t++)
			adv[s * LEN + t] = corrupt[s] ? -1.0f : 1.0f;
	ec_tensor_1d(&t_ids, ENGINED__V1__DTYPE__INT32, &n, ids, sizeof(ids));
	fb.input_ids = &t_ids;
	fb.forward_only = true;
	fb.loss = NULL;
	fb.return_log_probs = true;
	fb.temperature = 0.7f;
	if (ec_forward_backward(c, &fb, &old, &st))
		return fail("ForwardBackward(forward_only)", &st);
	printf("== forward-only log-probs at temperature 0.7: mean %.4f over %d tokens\n",
	       mean_f32((const float *)old->log_probs->data.data, N), N);
	ec_tensor_1d(&t_old, ENGINED__V1__DTYPE__FLOAT32, &n, old->log_probs->data.data,
		     old->log_probs->data.len);
	ec_tensor_1d(&t_adv, ENGINED__V1__DTYPE__FLOAT32, &n, adv, sizeof(adv));
	oe[0] = opt_entry("policy_loss", "vanilla");
	oe[1] = opt_entry("clip_ratio", "0.2");
	oe[2] = opt_entry("loss_agg_mode", "token-mean");
	for (int i = 0; i < 3; i++)
		oep[i] = &oe[i];
	loss.name = "ppo";
	loss.n_options = 3;
	loss.options = oep;
	fb.loss = &loss;
	fb.forward_only = false;
	fb.return_log_probs = false;
	fb.old_log_probs = &t_old;
	fb.advantages = &t_adv;
	printf("== PPO: %d steps (+1 advantage for clean sequences, -1 for corrupted)\n",
	       ppo_steps);
	for (int step = 1; step <= ppo_steps; step++) {
		if (ec_forward_backward(c, &fb, &fr, &st))
			return fail("ForwardBackward(ppo)", &st);
		if (ec_optimizer_step(c, &sr, &st))
			return fail("OptimizerStep", &st);
		printf("  step %d  loss %8.4f  pg_clipfrac %.3f  ppo_kl %8.5f  grad_norm %.4f\n",
		       step, fr->loss, metric(fr, "pg_clipfrac"), metric(fr, "ppo_kl"),
		       sr->grad_norm);
		ec_free(fr);
		ec_free(sr);
	}
	ec_free(old);

	/* Weights: stream, save a checkpoint, compare with its model.safetensors. */
	t0 = now_s();
	if (pull_all(c, &w1, &st))
		return fail("GetPerTensorParam", &st);
	printf("== streamed %zu tensors (FLOAT32) in %.3f s\n", w1.n, now_s() - t0);
	snprintf(ckpt_rel, sizeof(ckpt_rel), "demo/step_%d", sft_steps + ppo_steps);
	sreq.path = ckpt_rel;
	sreq.global_step = sft_steps + ppo_steps;
	sreq.max_to_keep = 2;
	if (ec_save_checkpoint(c, &sreq, &sresp, &st))
		return fail("SaveCheckpoint", &st);
	printf("== saved checkpoint %s (%.1f MiB)\n", sresp->path, (double)sresp->bytes / 1048576.0);
	ec_free(sresp);
	snprintf(file, sizeof(file), "%s/%s/model.safetensors", ckpt_root, ckpt_rel);
	{
		struct st_reader *sf = NULL;
		int r = st_reader_open(file, &sf, NULL);

		if (r < 0) {
			printf("   (cannot read %s: %s; weight check skipped)\n", file, strerror(-r));
		} else {
			for (size_t i = 0; i < w1.n; i++) {
				const struct st_tensor_info *ti = st_reader_find(sf, w1.names[i]);
				float *data = malloc(w1.len[i] ? w1.len[i] : 1);

				/* An F32 tensor is read as its bytes (no conversion). */
				if (!ti || ti->dtype != ST_F32 || ti->nbytes != w1.len[i] || !data ||
				    st_reader_read_f32(sf, w1.names[i], data,
						       (int64_t)(w1.len[i] / 4), NULL) < 0 ||
				    memcmp(data, w1.data[i], w1.len[i]))
					mismatches++;
				checked++;
				free(data);
			}
			st_reader_close(sf);
			printf("   streamed weights vs %s: %d/%d tensors identical\n", file,
			       checked - mismatches, checked);
		}
	}
	lreq.path = ckpt_rel;
	if (ec_load_checkpoint(c, &lreq, &lresp, &st))
		return fail("LoadCheckpoint", &st);
	printf("== reloaded %s at global step %lld\n", ckpt_rel, (long long)lresp->global_step);
	ec_free(lresp);
	if (pull_all(c, &w2, &st))
		return fail("GetPerTensorParam", &st);
	for (size_t i = 0; i < w1.n && i < w2.n; i++)
		if (w1.len[i] != w2.len[i] || memcmp(w1.data[i], w2.data[i], w1.len[i]))
			mismatches++;
	if (w1.n != w2.n)
		mismatches++;
	printf("   weights after reload %s\n", mismatches ? "DIFFER" : "are bit-identical");
	weights_free(&w1);
	weights_free(&w2);
	ec_close(c);
	if (mismatches || !(lastl < first)) {
		printf("== demo FAILED\n");
		return 1;
	}
	printf("== demo OK\n");
	return 0;
}

int main(int argc, char **argv)
{
	int i = 1;

	while (i < argc && argv[i][0] == '-') {
		if (!strcmp(argv[i], "--addr") && i + 1 < argc) {
			addr = argv[i + 1];
			i += 2;
		} else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
			timeout_s = atof(argv[i + 1]);
			i += 2;
		} else if (!strcmp(argv[i], "--tls-ca") && i + 1 < argc) {
			sec.tls_ca_file = argv[i + 1];
			i += 2;
		} else if (!strcmp(argv[i], "--tls-cert") && i + 1 < argc) {
			sec.tls_cert_file = argv[i + 1];
			i += 2;
		} else if (!strcmp(argv[i], "--tls-key") && i + 1 < argc) {
			sec.tls_key_file = argv[i + 1];
			i += 2;
		} else if (!strcmp(argv[i], "--tls-server-name") && i + 1 < argc) {
			sec.tls_server_name = argv[i + 1];
			i += 2;
		} else if (!strcmp(argv[i], "--token-file") && i + 1 < argc) {
			sec.token_file = argv[i + 1];
			i += 2;
		} else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (i >= argc) {
		usage(stderr);
		return 2;
	}
	argc -= i;
	argv += i;
	if (!strcmp(argv[0], "status"))
		return cmd_status(argc, argv);
	if (!strcmp(argv[0], "init"))
		return cmd_init(argc, argv);
	if (!strcmp(argv[0], "set-mode"))
		return cmd_set_mode(argc, argv);
	if (!strcmp(argv[0], "to-device"))
		return cmd_to_device(argc, argv);
	if (!strcmp(argv[0], "save"))
		return cmd_save(argc, argv);
	if (!strcmp(argv[0], "load"))
		return cmd_load(argc, argv);
	if (!strcmp(argv[0], "pull-weights"))
		return cmd_pull(argc, argv);
	if (!strcmp(argv[0], "demo"))
		return cmd_demo(argc, argv);
	fprintf(stderr, "enginectl: unknown command '%s'\n", argv[0]);
	usage(stderr);
	return 2;
}
