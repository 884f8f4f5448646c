/* enginectl — command-line client of engined.
 *
 *   enginectl [global options] COMMAND [options] [arguments]
 *   enginectl help [COMMAND]     enginectl COMMAND --help     enginectl --version
 *
 * The commands (status, init, set-mode, to-device, save, load, pull-weights,
 * create-adapter, delete-adapter, sample, demo, help) are the table `commands`
 * below: it dispatches, and `help`
 * prints from it, so every command has its usage and options. Options are
 * parsed with getopt_long from each command's table (enginectl_common.c);
 * the demo is enginectl_demo.c.
 *
 * Exit status: 0 on success, 1 when the daemon answered an error (printed
 * as CODE: message), 2 on bad usage.
 */
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "enginectl.h"
#include "enginectl_demo.h"
#include "engined_client.h"
#include "pb_has.h"
#include "io/fileio.h"
#include "io/safetensors.h"

#ifndef ENGINED_VERSION
#define ENGINED_VERSION "unknown"
#endif

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

/* The --adapter option of the commands that act on one. */
#define ADAPTER_OPT { "adapter", required_argument, 'A', "NAME", \
		      "a LoRA adapter of the frozen base (default: the base model)" }

static const struct ctl_opt status_opts[] = {
	ADAPTER_OPT,
	{ NULL, 0, 0, NULL, NULL },
};

static int cmd_status(int argc, char **argv)
{
	Engined__V1__GetStatusResponse *s = NULL;
	struct ec_client *c;
	struct ec_status st;
	const char *adapter = "";
	int serving = 0, o;

	while ((o = ctl_getopt(argc, argv)) != -1) {
		switch (o) {
		case 'A': adapter = optarg; break;
		}
	}
	ctl_positionals(argc, argv, 0, 0, NULL);
	c = ctl_connect();
	if (ec_get_status_adapter(c, adapter, &s, &st))
		return ctl_fail("GetStatus", &st);
	if (ec_health_check(c, "", &serving, &st))
		serving = 0;
	printf("daemon      engined %s at %s, up %.1f s, health %s\n", s->version, ctl_addr,
	       s->uptime, serving == 1 ? "SERVING" : "NOT_SERVING");
	if (!s->initialized) {
		printf("engine      not initialized\n");
	} else {
		if (adapter[0])
			printf("adapter     %s of %s, %lld parameters\n", adapter, s->engine_key,
			       (long long)s->num_parameters);
		else
			printf("engine      %s, %lld parameters\n", s->engine_key,
			       (long long)s->num_parameters);
		printf("mode        %s\n", mode_name(s->mode));
		print_placement("placement  ", s->placement);
		printf("step        %lld optimizer steps, %lld scheduler steps, lr %.6g\n",
		       (long long)s->step, (long long)s->sched_step, s->lr);
		if (s->n_adapters) {
			printf("adapters   ");
			for (size_t i = 0; i < s->n_adapters; i++)
				printf(" %s%s", s->adapters[i], i + 1 < s->n_adapters ? "," : "");
			printf("\n");
		}
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

static const struct ctl_opt init_opts[] = {
	{ "preset", required_argument, 'p', "NAME",
	  "tiny (default), small or qwen2.5-0.5b-shape" },
	{ "config", required_argument, 'c', "FILE",
	  "random weights for a Hugging Face config.json" },
	{ "model-path", required_argument, 'm', "DIR",
	  "a model directory under the daemon's model root" },
	{ "model-type", required_argument, 't', "TYPE", "language_model (default) or value_model" },
	{ "device", required_argument, 'd', "DEV", "cpu (default) or cuda" },
	{ "seed", required_argument, 's', "N", "seed of the random initialization (0 to 2^64-1)" },
	{ "lr", required_argument, 'l', "X", "AdamW's learning rate (default: the daemon's, 1e-5)" },
	{ "bf16-matmul", no_argument, 'b', NULL, "matmul inputs in bf16, fp32 accumulate" },
	{ "replace", no_argument, 'r', NULL, "replace an engine that is already initialized" },
	{ "frozen-base", no_argument, 'f', NULL,
	  "a frozen base for LoRA adapters (create-adapter): no gradients or optimizer state" },
	{ NULL, 0, 0, NULL, NULL },
};

static int cmd_init(int argc, char **argv)
{
	Engined__V1__InitializeRequest req = ENGINED__V1__INITIALIZE_REQUEST__INIT;
	Engined__V1__OptimizerConfig opt = ENGINED__V1__OPTIMIZER_CONFIG__INIT;
	Engined__V1__InitializeResponse *resp = NULL;
	struct ctl_progress *prog;
	struct ec_client *c;
	struct ec_status st;
	char *config = NULL;
	int o, r;

	while ((o = ctl_getopt(argc, argv)) != -1) {
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
		case 's': req.seed = ctl_uint64_arg("seed", optarg); break;
		case 'l':
			PB_SET(&opt, lr, ctl_double_arg("lr", optarg, -DBL_MAX, DBL_MAX));
			req.optimizer = &opt;
			break;
		case 'b': req.bf16_matmul = true; break;
		case 'r': req.replace = true; break;
		case 'f': req.frozen_base = true; break;
		}
	}
	ctl_positionals(argc, argv, 0, 0, NULL);
	if (!req.preset[0] && !req.hf_config_json[0] && !req.model_path[0])
		req.preset = "tiny";
	c = ctl_connect();
	prog = ctl_progress_start(c, "init", "Initialize");
	r = ec_initialize(c, &req, &resp, &st);
	ctl_progress_end(prog, r == 0);
	if (r) {
		free(config);
		return ctl_fail("Initialize", &st);
	}
	printf("initialized %s: %lld parameters in %lld tensors\n", resp->engine_key,
	       (long long)resp->num_parameters, (long long)resp->num_tensors);
	ec_free(resp);
	ec_close(c);
	free(config);
	return 0;
}

static const struct ctl_opt set_mode_opts[] = {
	{ "no-auto-offload", no_argument, 'n', NULL,
	  "keep what the old mode loaded (no auto-offload)" },
	ADAPTER_OPT,
	{ NULL, 0, 0, NULL, NULL },
};

static int cmd_set_mode(int argc, char **argv)
{
	Engined__V1__SetModeRequest req = ENGINED__V1__SET_MODE_REQUEST__INIT;
	Engined__V1__SetModeResponse *resp = NULL;
	struct ec_client *c;
	struct ec_status st;
	const char *mode;
	int o;

	while ((o = ctl_getopt(argc, argv)) != -1) {
		switch (o) {
		case 'n': req.disable_auto_offload = true; break;
		case 'A': req.adapter = optarg; break;
		}
	}
	ctl_positionals(argc, argv, 1, 1, "the mode (idle, train or eval)");
	mode = argv[optind];
	if (!strcmp(mode, "idle"))
		req.mode = ENGINED__V1__MODE__MODE_IDLE;
	else if (!strcmp(mode, "train"))
		req.mode = ENGINED__V1__MODE__MODE_TRAIN;
	else if (!strcmp(mode, "eval"))
		req.mode = ENGINED__V1__MODE__MODE_EVAL;
	else
		ctl_usage_error("'%s' is not a mode (idle, train or eval)", mode);
	c = ctl_connect();
	if (ec_set_mode(c, &req, &resp, &st))
		return ctl_fail("SetMode", &st);
	printf("mode %s\n", mode_name(resp->mode));
	print_placement("placement", resp->placement);
	ec_free(resp);
	ec_close(c);
	return 0;
}

static const struct ctl_opt to_device_opts[] = {
	{ "model", no_argument, 'm', NULL, "move the model's weights" },
	{ "optimizer", no_argument, 'o', NULL, "move the optimizer's state" },
	{ "grad", no_argument, 'g', NULL, "move the gradients" },
	ADAPTER_OPT,
	{ NULL, 0, 0, NULL, NULL },
};

static int cmd_to_device(int argc, char **argv)
{
	Engined__V1__ToDeviceRequest req = ENGINED__V1__TO_DEVICE_REQUEST__INIT;
	Engined__V1__ToDeviceResponse *resp = NULL;
	struct ec_client *c;
	struct ec_status st;
	bool any = false;
	int o;

	while ((o = ctl_getopt(argc, argv)) != -1) {
		switch (o) {
		case 'm': req.model = any = true; break;
		case 'o': req.optimizer = any = true; break;
		case 'g': req.grad = any = true; break;
		case 'A': req.adapter = optarg; break;
		}
	}
	ctl_positionals(argc, argv, 1, 1, "the device (cpu or cuda)");
	req.device = argv[optind];
	if (!any)
		req.model = req.optimizer = req.grad = true;
	c = ctl_connect();
	if (ec_to_device(c, &req, &resp, &st))
		return ctl_fail("ToDevice", &st);
	print_placement("placement", resp->placement);
	ec_free(resp);
	ec_close(c);
	return 0;
}

static const struct ctl_opt save_opts[] = {
	{ "step", required_argument, 's', "N", "the global step to record (default 0)" },
	{ "keep", required_argument, 'k', "K",
	  "keep the K newest checkpoints (default 0: all)" },
	{ NULL, 0, 0, NULL, NULL },
};

static int cmd_save(int argc, char **argv)
{
	Engined__V1__SaveCheckpointRequest req = ENGINED__V1__SAVE_CHECKPOINT_REQUEST__INIT;
	Engined__V1__SaveCheckpointResponse *resp = NULL;
	struct ctl_progress *prog;
	struct ec_client *c;
	struct ec_status st;
	int o, r;

	while ((o = ctl_getopt(argc, argv)) != -1) {
		switch (o) {
		case 's': req.global_step = ctl_int_arg("step", optarg, INT64_MIN, INT64_MAX); break;
		case 'k': req.max_to_keep = (int32_t)ctl_int_arg("keep", optarg, INT32_MIN, INT32_MAX);
			break;
		}
	}
	ctl_positionals(argc, argv, 1, 1, "PATH");
	req.path = argv[optind];
	c = ctl_connect();
	prog = ctl_progress_start(c, "save", "SaveCheckpoint");
	r = ec_save_checkpoint(c, &req, &resp, &st);
	ctl_progress_end(prog, r == 0);
	if (r)
		return ctl_fail("SaveCheckpoint", &st);
	printf("saved %s (%.1f MiB)\n", resp->path, (double)resp->bytes / 1048576.0);
	ec_free(resp);
	ec_close(c);
	return 0;
}

static int cmd_load(int argc, char **argv)
{
	Engined__V1__LoadCheckpointRequest req = ENGINED__V1__LOAD_CHECKPOINT_REQUEST__INIT;
	Engined__V1__LoadCheckpointResponse *resp = NULL;
	struct ctl_progress *prog;
	struct ec_client *c;
	struct ec_status st;
	int r;

	while (ctl_getopt(argc, argv) != -1)
		;
	ctl_positionals(argc, argv, 1, 1, "PATH");
	req.path = argv[optind];
	c = ctl_connect();
	prog = ctl_progress_start(c, "load", "LoadCheckpoint");
	r = ec_load_checkpoint(c, &req, &resp, &st);
	ctl_progress_end(prog, r == 0);
	if (r)
		return ctl_fail("LoadCheckpoint", &st);
	printf("loaded %s at global step %lld\n", req.path, (long long)resp->global_step);
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

#define MAX_NAMES 4096

static const struct ctl_opt pull_opts[] = {
	{ "out", required_argument, 'o', "FILE",
	  "the safetensors file to write (required; not a symlink)" },
	{ "dtype", required_argument, 'd', "TYPE", "f32 (default), bf16 or f16" },
	{ "names", required_argument, 'n', "A,B,...", "only these tensors (at most 4096 names)" },
	{ "bucket-bytes", required_argument, 'b', "N",
	  "data bytes per message (default 0: 4 MiB)" },
	{ "adapter", required_argument, 'A', "NAME",
	  "a LoRA adapter's tensors instead of the base model's, as --view says" },
	{ "view", required_argument, 'V', "VIEW",
	  "with --adapter: adapter (its lora_A / lora_B in PEFT's names, the default), "
	  "base (the base under verl's base_layer names) or merged (W + scale B A)" },
	{ NULL, 0, 0, NULL, NULL },
};

static void pull_parse(int argc, char **argv, Engined__V1__GetPerTensorParamRequest *req,
		       const char **out, char **names, char **names_buf)
{
	int o;

	req->dtype = ENGINED__V1__DTYPE__FLOAT32;
	while ((o = ctl_getopt(argc, argv)) != -1) {
		switch (o) {
		case 'o': *out = optarg; break;
		case 'd':
			if (!strcmp(optarg, "f32"))
				req->dtype = ENGINED__V1__DTYPE__FLOAT32;
			else if (!strcmp(optarg, "bf16"))
				req->dtype = ENGINED__V1__DTYPE__BFLOAT16;
			else if (!strcmp(optarg, "f16"))
				req->dtype = ENGINED__V1__DTYPE__FLOAT16;
			else
				ctl_usage_error("--dtype: '%s' is not f32, bf16 or f16", optarg);
			break;
		case 'n':
			*names_buf = strdup(optarg);
			for (char *p = strtok(*names_buf, ","); p && req->n_names < MAX_NAMES;
			     p = strtok(NULL, ","))
				names[req->n_names++] = p;
			req->names = names;
			break;
		case 'b':
			req->bucket_bytes = ctl_int_arg("bucket-bytes", optarg, INT64_MIN, INT64_MAX);
			break;
		case 'A': req->adapter = optarg; break;
		case 'V':
			if (!strcmp(optarg, "adapter"))
				req->adapter_view = ENGINED__V1__ADAPTER_VIEW__ADAPTER_VIEW_ADAPTER;
			else if (!strcmp(optarg, "base"))
				req->adapter_view = ENGINED__V1__ADAPTER_VIEW__ADAPTER_VIEW_BASE;
			else if (!strcmp(optarg, "merged"))
				req->adapter_view = ENGINED__V1__ADAPTER_VIEW__ADAPTER_VIEW_MERGED;
			else
				ctl_usage_error("--view: '%s' is not adapter, base or merged", optarg);
			break;
		}
	}
	ctl_positionals(argc, argv, 0, 0, NULL);
	if (!*out)
		ctl_usage_error("--out FILE is required");
}

/* Append a copy of t to ts[0..*nt) (capacity *cap); -1 when out of memory. */
static int keep_tensor(struct pulled_tensor **ts, size_t *nt, size_t *cap,
		       const struct ec_tensor *t)
{
	struct pulled_tensor *p;

	if (*nt == *cap) {
		size_t c2 = *cap ? *cap * 2 : 64;

		p = realloc(*ts, c2 * sizeof(**ts));
		if (!p)
			return -1;
		*ts = p;
		*cap = c2;
	}
	p = &(*ts)[*nt];
	p->name = strdup(t->name);
	p->dtype = pulled_dtype(t->dtype);
	p->ndim = t->ndim;
	memcpy(p->shape, t->shape, sizeof(t->shape));
	p->data = malloc(t->nbytes ? t->nbytes : 1);
	if (!p->name || !p->data)
		return -1;
	memcpy(p->data, t->data, t->nbytes);
	p->nbytes = t->nbytes;
	(*nt)++;
	return 0;
}

static int cmd_pull(int argc, char **argv)
{
	Engined__V1__GetPerTensorParamRequest req = ENGINED__V1__GET_PER_TENSOR_PARAM_REQUEST__INIT;
	Engined__V1__GetStatusResponse *s = NULL;
	const char *out = NULL;
	char *names_buf = NULL, *names[MAX_NAMES];
	struct pulled_tensor *ts = NULL;
	size_t nt = 0, cap = 0;
	struct ec_weights *w = NULL;
	struct ec_client *c;
	struct ec_status st;
	struct ec_tensor t;
	struct eng_error werr = { 0 };
	struct ctl_progress *prog;
	int64_t total = 0;
	double t0;
	int done = 0, r;

	pull_parse(argc, argv, &req, &out, names, &names_buf);
	c = ctl_connect();
	if (!req.n_names && ec_get_status_adapter(c, req.adapter, &s, &st) == 0) {
		total = s->num_parameters * (req.dtype == ENGINED__V1__DTYPE__FLOAT32 ? 4 : 2);
		ec_free(s);
	}
	t0 = ctl_now();
	if (ec_weights_open(c, &req, &w, &st))
		return ctl_fail("GetPerTensorParam", &st);
	/* The stream's own count: the bytes received (of num_parameters'
	 * when every tensor is asked for). */
	prog = ctl_progress_start(c, "pull-weights", NULL);
	for (;;) {
		r = ec_weights_next(w, &t, &done, &st);
		if (r || done)
			break;
		if (keep_tensor(&ts, &nt, &cap, &t)) {
			fprintf(stderr, "enginectl: out of memory\n");
			return 1;
		}
		ctl_progress_update(prog, "receive", ec_weights_bytes(w),
				    total ? total : ec_weights_bytes(w), "bytes");
	}
	ctl_progress_update(prog, "receive", ec_weights_bytes(w), ec_weights_bytes(w), "bytes");
	ctl_progress_end(prog, r == 0);
	if (r) {
		ec_weights_close(w);
		return ctl_fail("GetPerTensorParam", &st);
	}
	printf("received %zu tensors, %.1f MiB in %lld messages, %.2f s\n", nt,
	       (double)ec_weights_bytes(w) / 1048576.0, (long long)ec_weights_messages(w),
	       ctl_now() - t0);
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

/* --- create-adapter / delete-adapter ------------------------------------- */

#define MAX_TARGETS 64

static const struct ctl_opt create_adapter_opts[] = {
	{ "rank", required_argument, 'r', "N",
	  "LoRA rank (default 8; with --peft-dir the file's)" },
	{ "alpha", required_argument, 'x', "X",
	  "LoRA alpha (default 8; with --peft-dir the file's)" },
	{ "targets", required_argument, 't', "A,B,...",
	  "q_proj ... down_proj, or all-linear (default q_proj,v_proj)" },
	{ "seed", required_argument, 's', "N", "seed of A's initialization (default 0)" },
	{ "peft-dir", required_argument, 'p', "DIR",
	  "start from a PEFT directory under the daemon's model root" },
	{ "rslora", no_argument, 'R', NULL, "scale alpha / sqrt(rank) (rsLoRA)" },
	{ "lr", required_argument, 'l', "X", "the adapter's own AdamW lr (default: the base's)" },
	{ NULL, 0, 0, NULL, NULL },
};

static int cmd_create_adapter(int argc, char **argv)
{
	static char q_proj[] = "q_proj", v_proj[] = "v_proj";
	Engined__V1__CreateAdapterRequest req = ENGINED__V1__CREATE_ADAPTER_REQUEST__INIT;
	Engined__V1__OptimizerConfig opt = ENGINED__V1__OPTIMIZER_CONFIG__INIT;
	Engined__V1__CreateAdapterResponse *resp = NULL;
	char *targets_buf = NULL, *targets[MAX_TARGETS];
	struct ec_client *c;
	struct ec_status st;
	bool rank_set = false;
	int o;

	while ((o = ctl_getopt(argc, argv)) != -1) {
		switch (o) {
		case 'r':
			req.rank = ctl_int_arg("rank", optarg, INT64_MIN, INT64_MAX);
			rank_set = true;
			break;
		case 'x': PB_SET(&req, alpha, ctl_double_arg("alpha", optarg, -DBL_MAX, DBL_MAX));
			break;
		case 't':
			free(targets_buf);
			targets_buf = strdup(optarg);
			req.n_target_modules = 0;
			for (char *p = strtok(targets_buf, ","); p; p = strtok(NULL, ",")) {
				if (req.n_target_modules == MAX_TARGETS)
					ctl_usage_error("--targets: more than %d modules",
							MAX_TARGETS);
				targets[req.n_target_modules++] = p;
			}
			req.target_modules = targets;
			break;
		case 's': req.seed = ctl_uint64_arg("seed", optarg); break;
		case 'p': req.peft_dir = optarg; break;
		case 'R': req.use_rslora = true; break;
		case 'l':
			PB_SET(&opt, lr, ctl_double_arg("lr", optarg, -DBL_MAX, DBL_MAX));
			req.optimizer = &opt;
			break;
		}
	}
	ctl_positionals(argc, argv, 1, 1, "the adapter's name");
	req.name = argv[optind];
	/* PEFT LoraConfig's defaults, as the Python client's; a PEFT
	 * directory gives its own. */
	if (!req.peft_dir[0] && !rank_set)
		req.rank = 8;
	if (!req.peft_dir[0] && !targets_buf) {
		targets[0] = q_proj;
		targets[1] = v_proj;
		req.target_modules = targets;
		req.n_target_modules = 2;
	}
	c = ctl_connect();
	if (ec_create_adapter(c, &req, &resp, &st)) {
		free(targets_buf);
		return ctl_fail("CreateAdapter", &st);
	}
	printf("created adapter %s: rank %lld, alpha %g%s, targets ", resp->name,
	       (long long)resp->rank, resp->alpha, resp->use_rslora ? " (rsLoRA)" : "");
	for (size_t i = 0; i < resp->n_target_modules; i++)
		printf("%s%s", resp->target_modules[i], i + 1 < resp->n_target_modules ? "," : "");
	printf("; %lld parameters in %lld tensors\n", (long long)resp->num_parameters,
	       (long long)resp->num_tensors);
	ec_free(resp);
	ec_close(c);
	free(targets_buf);
	return 0;
}

static int cmd_delete_adapter(int argc, char **argv)
{
	struct ec_client *c;
	struct ec_status st;

	while (ctl_getopt(argc, argv) != -1)
		;
	ctl_positionals(argc, argv, 1, 1, "the adapter's name");
	c = ctl_connect();
	if (ec_delete_adapter(c, argv[optind], &st))
		return ctl_fail("DeleteAdapter", &st);
	printf("deleted adapter %s\n", argv[optind]);
	ec_close(c);
	return 0;
}

/* --- sample --------------------------------------------------------------- */

/* A growing array of token ids; exits 1 when out of memory (a one-shot
 * program). */
struct ids {
	int32_t *v;
	size_t n, cap;
};

static void ids_push(struct ids *a, int32_t x)
{
	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 64;
		int32_t *v = realloc(a->v, cap * sizeof(*v));

		if (!v) {
			fprintf(stderr, "enginectl: out of memory\n");
			exit(1);
		}
		a->v = v;
		a->cap = cap;
	}
	a->v[a->n++] = x;
}

/* Append the comma-separated token ids of option `opt` ("1,2,3": every
 * piece an int32, none empty) to a; returns how many. */
static size_t parse_ids(const char *opt, const char *s, struct ids *a)
{
	size_t n = 0;

	for (;;) {
		size_t len = strcspn(s, ",");
		char piece[32];

		if (len >= sizeof(piece))
			ctl_usage_error("--%s: '%.*s' is not an integer", opt, (int)len, s);
		memcpy(piece, s, len);
		piece[len] = '\0';
		ids_push(a, (int32_t)ctl_int_arg(opt, piece, INT32_MIN, INT32_MAX));
		n++;
		if (!s[len])
			return n;
		s += len + 1;
	}
}

#define MAX_PROMPTS 65536
#define MAX_STOP_SEQUENCES 256

static const struct ctl_opt sample_opts[] = {
	{ "prompt", required_argument, 'p', "A,B,...",
	  "a prompt's token ids (required; repeat for more prompts)" },
	{ "max-tokens", required_argument, 'm', "N", "new tokens per completion (required)" },
	{ "num-samples", required_argument, 'n', "K", "completions per prompt (default 1)" },
	{ "temperature", required_argument, 't', "T",
	  "0: greedy; else draw from softmax(logits / T) (default 1)" },
	{ "top-k", required_argument, 'k', "K", "draw from the K likeliest tokens (default 0: off)" },
	{ "top-p", required_argument, 'P', "P",
	  "draw from the likeliest tokens up to probability P, (0, 1] (default off)" },
	{ "seed", required_argument, 's', "N", "seed of the random draws (default 0)" },
	{ "stop-token", required_argument, 'S', "ID",
	  "end a completion at this token (repeat for more)" },
	{ "stop-sequence", required_argument, 'Q', "A,B,...",
	  "end a completion at these tokens (repeat for more)" },
	{ "top-logprobs", required_argument, 'L', "K",
	  "print the K likeliest tokens per position, 0 to 20 (default 0)" },
	{ "prompt-logprobs", no_argument, 'G', NULL,
	  "print each prompt's own log-probs (on its sample 0)" },
	ADAPTER_OPT,
	{ NULL, 0, 0, NULL, NULL },
};

struct sample_args {
	Engined__V1__SampleRequest req;
	Engined__V1__Tensor input_ids;
	int64_t n_ids;                          /* input_ids' shape */
	struct ids ids, stop_ids, stop_seq_ids;
	int32_t seq_lens[MAX_PROMPTS];
	/* Each stop sequence's ids are [stop_seq_start[i], + its length) of
	 * stop_seq_ids, pointed to once all are parsed (the array moves). */
	Engined__V1__StopSequence stop_seqs[MAX_STOP_SEQUENCES];
	Engined__V1__StopSequence *stop_seq_ptrs[MAX_STOP_SEQUENCES];
	size_t stop_seq_start[MAX_STOP_SEQUENCES];
	bool max_tokens_set;
};

static void sample_parse(int argc, char **argv, struct sample_args *a)
{
	Engined__V1__SampleRequest *req = &a->req;
	int o;

	engined__v1__sample_request__init(req);
	while ((o = ctl_getopt(argc, argv)) != -1) {
		switch (o) {
		case 'p':
			if (req->n_seq_lens == MAX_PROMPTS)
				ctl_usage_error("--prompt: more than %d prompts", MAX_PROMPTS);
			a->seq_lens[req->n_seq_lens++] = (int32_t)parse_ids("prompt", optarg, &a->ids);
			break;
		case 'm':
			req->max_tokens = (int32_t)ctl_int_arg("max-tokens", optarg, INT32_MIN,
								INT32_MAX);
			a->max_tokens_set = true;
			break;
		case 'n':
			req->num_samples = (int32_t)ctl_int_arg("num-samples", optarg, INT32_MIN,
								 INT32_MAX);
			break;
		case 't':
			PB_SET(req, temperature,
			       (float)ctl_double_arg("temperature", optarg, -FLT_MAX, FLT_MAX));
			break;
		case 'k':
			req->top_k = (int32_t)ctl_int_arg("top-k", optarg, INT32_MIN, INT32_MAX);
			break;
		case 'P':
			PB_SET(req, top_p, (float)ctl_double_arg("top-p", optarg, -FLT_MAX, FLT_MAX));
			break;
		case 's': req->seed = ctl_uint64_arg("seed", optarg); break;
		case 'S':
			ids_push(&a->stop_ids, (int32_t)ctl_int_arg("stop-token", optarg, INT32_MIN,
								    INT32_MAX));
			break;
		case 'Q':
			if (req->n_stop_sequences == MAX_STOP_SEQUENCES)
				ctl_usage_error("--stop-sequence: more than %d sequences",
						MAX_STOP_SEQUENCES);
			a->stop_seq_start[req->n_stop_sequences] = a->stop_seq_ids.n;
			engined__v1__stop_sequence__init(&a->stop_seqs[req->n_stop_sequences]);
			a->stop_seqs[req->n_stop_sequences++].n_token_ids =
				parse_ids("stop-sequence", optarg, &a->stop_seq_ids);
			break;
		case 'L':
			req->top_logprobs = (int32_t)ctl_int_arg("top-logprobs", optarg, INT32_MIN,
								  INT32_MAX);
			break;
		case 'G': req->prompt_logprobs = true; break;
		case 'A': req->adapter = optarg; break;
		}
	}
	ctl_positionals(argc, argv, 0, 0, NULL);
	if (!req->n_seq_lens)
		ctl_usage_error("--prompt A,B,... is required");
	if (!a->max_tokens_set)
		ctl_usage_error("--max-tokens N is required");
	a->n_ids = (int64_t)a->ids.n;
	ec_tensor_1d(&a->input_ids, ENGINED__V1__DTYPE__INT32, &a->n_ids, a->ids.v,
		     a->ids.n * sizeof(int32_t));
	req->input_ids = &a->input_ids;
	req->seq_lens = a->seq_lens;
	req->stop_token_ids = a->stop_ids.v;
	req->n_stop_token_ids = a->stop_ids.n;
	for (size_t i = 0; i < req->n_stop_sequences; i++) {
		a->stop_seqs[i].token_ids = a->stop_seq_ids.v + a->stop_seq_start[i];
		a->stop_seq_ptrs[i] = &a->stop_seqs[i];
	}
	req->stop_sequences = a->stop_seq_ptrs;
}

static const char *finish_name(Engined__V1__FinishReason r)
{
	switch (r) {
	case ENGINED__V1__FINISH_REASON__FINISH_REASON_STOP: return "stop";
	case ENGINED__V1__FINISH_REASON__FINISH_REASON_LENGTH: return "length";
	default: return "unspecified";
	}
}

/* One completion, one line (the format in the command's help). Returns
 * 0, or -1 when its top_* fields are not k entries per new token. */
static int print_completion(const Engined__V1__Completion *c)
{
	size_t n = c->n_token_ids, k = n ? c->n_top_token_ids / n : 0;

	if (k * n != c->n_top_token_ids || c->n_top_logprobs != c->n_top_token_ids)
		return -1;
	printf("prompt %d sample %d %s:", c->prompt_index, c->sample_index,
	       finish_name(c->finish_reason));
	for (size_t i = 0; i < n; i++)
		printf(" %d", c->token_ids[i]);
	printf(" logprobs");
	for (size_t i = 0; i < c->n_logprobs; i++)
		printf(" %.6g", c->logprobs[i]);
	if (k) {
		printf(" top");
		for (size_t i = 0; i < n; i++)
			for (size_t j = 0; j < k; j++)
				printf("%c%d:%.6g", j ? ',' : ' ', c->top_token_ids[i * k + j],
				       c->top_logprobs[i * k + j]);
	}
	if (c->n_prompt_logprobs) {
		printf(" prompt-logprobs");
		for (size_t i = 0; i < c->n_prompt_logprobs; i++)
			printf(" %.6g", c->prompt_logprobs[i]);
	}
	printf("\n");
	return 0;
}

static int cmd_sample(int argc, char **argv)
{
	static struct sample_args a;    /* large: out of the stack */
	Engined__V1__SampleResponse *resp = NULL;
	struct ec_sample *s = NULL;
	struct ec_client *c;
	struct ec_status st;
	int64_t version = 0, count = 0;
	double t0;
	int done = 0, r;

	sample_parse(argc, argv, &a);
	c = ctl_connect();
	t0 = ctl_now();
	r = ec_sample_open(c, &a.req, &s, &st);
	while (!r && (r = ec_sample_next(s, &resp, &done, &st)) == 0 && !done) {
		version = resp->weights_version;
		for (size_t i = 0; i < resp->n_completions; i++, count++) {
			if (print_completion(resp->completions[i]) < 0) {
				st.code = EC_DATA_LOSS;
				snprintf(st.message, sizeof(st.message),
					 "completion %lld: top_token_ids / top_logprobs are not "
					 "k entries per token", (long long)count);
				r = st.code;
				break;
			}
		}
		fflush(stdout);         /* each line as its completion arrives */
		ec_free(resp);
		if (r)
			break;
	}
	ec_sample_close(s);
	if (r)
		ctl_fail("Sample", &st);
	else
		printf("done %lld completions, weights_version %lld, %.2f s\n", (long long)count,
		       (long long)version, ctl_now() - t0);
	ec_close(c);
	free(a.ids.v);
	free(a.stop_ids.v);
	free(a.stop_seq_ids.v);
	return r ? 1 : 0;
}

/* --- the command table, help, main --------------------------------------- */

static int cmd_help(int argc, char **argv);

static const struct ctl_command commands[] = {
	{ "status", "", "show the daemon's and the engine's state", status_opts, cmd_status,
	  NULL },
	{ "init", "", "initialize the engine (a preset, config.json or model)",
	  init_opts, cmd_init,
	  "Without --preset, --config or --model-path: --preset tiny.\n" },
	{ "set-mode", "idle|train|eval", "switch the engine to a mode", set_mode_opts,
	  cmd_set_mode, NULL },
	{ "to-device", "cpu|cuda", "move model, optimizer state or gradients to a device",
	  to_device_opts, cmd_to_device,
	  "Without --model, --optimizer or --grad all three move.\n" },
	{ "save", "PATH", "save a checkpoint", save_opts, cmd_save,
	  "PATH is relative to the daemon's checkpoint root.\n" },
	{ "load", "PATH", "load a checkpoint", NULL, cmd_load,
	  "PATH is relative to the daemon's checkpoint root.\n" },
	{ "pull-weights", "", "stream the weights into a safetensors file", pull_opts, cmd_pull,
	  NULL },
	{ "create-adapter", "NAME", "a LoRA adapter over the frozen base (init --frozen-base)",
	  create_adapter_opts, cmd_create_adapter,
	  "NAME: 1 to 64 characters of [A-Za-z0-9._-]. status, set-mode, to-device and\n"
	  "pull-weights take --adapter NAME.\n" },
	{ "delete-adapter", "NAME", "delete a LoRA adapter and free its state", NULL,
	  cmd_delete_adapter, NULL },
	{ "sample", "", "sample completions of prompts from the current weights", sample_opts,
	  cmd_sample,
	  "Prints one line per completion as it finishes (any order; log-probs to 6\n"
	  "significant digits), then a summary:\n"
	  "  prompt P sample K REASON: ID ... logprobs LP ...[ top ID:LP,... ...]"
	  "[ prompt-logprobs LP ...]\n"
	  "  done N completions, weights_version V, T s\n"
	  "REASON is stop (a stop token or sequence, printed as the last tokens) or\n"
	  "length (--max-tokens reached). With --top-logprobs K, `top` has one group\n"
	  "per new token of K comma-separated ID:LP pairs, best first. With\n"
	  "--prompt-logprobs, each prompt's sample 0 ends with the prompt's log-probs\n"
	  "(entry 0 is 0). docs/SAMPLING.md defines every option.\n" },
	{ "demo", "", "a short SFT + PPO run that checks weights and checkpoints",
	  ctl_demo_opts, ctl_demo, NULL },
	{ "help", "[COMMAND]", "list the commands, or show one's usage and options", NULL,
	  cmd_help, NULL },
};

static const struct ctl_opt global_opts[] = {
	{ "addr", required_argument, 'a', "ADDR",
	  "daemon address (default 127.0.0.1:50051; unix:PATH)" },
	{ "timeout", required_argument, 't', "SEC", "deadline of each call (default: none)" },
	{ "retries", required_argument, 'r', "N",
	  "send a call that failed UNAVAILABLE or DEADLINE_EXCEEDED again, with its request id (default 0)" },
	{ "tls-ca", required_argument, 'C', "PEM", "TLS: check the server's certificate with this CA" },
	{ "tls-cert", required_argument, 'c', "PEM", "mutual TLS: the client's certificate chain" },
	{ "tls-key", required_argument, 'k', "PEM", "mutual TLS: its private key" },
	{ "tls-server-name", required_argument, 'n', "NAME",
	  "the name to check the server's certificate against" },
	{ "token-file", required_argument, 'T', "FILE",
	  "bearer token: its first line (else $ENGINED_TOKEN)" },
	{ "no-progress", no_argument, 'P', NULL,
	  "no progress on stderr for init, save, load and pull-weights (default: a bar on a "
	  "terminal, else a line a second)" },
	{ "version", no_argument, 'V', NULL, "print the version" },
	{ NULL, 0, 0, NULL, NULL },
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static const struct ctl_command *find_command(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (!strcmp(commands[i].name, name))
			return &commands[i];
	return NULL;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: enginectl [global options] COMMAND [options]\ncommands:\n");
	for (size_t i = 0; i < NCOMMANDS; i++)
		fprintf(f, "  %-14s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "global options:\n");
	ctl_print_opts(f, global_opts);
	fprintf(f, "'enginectl help COMMAND' or 'enginectl COMMAND --help' shows a command's\n"
		"usage and options. Exit status: 0 success, 1 an error from the daemon,\n"
		"2 bad usage.\n");
}

static int cmd_help(int argc, char **argv)
{
	const struct ctl_command *cmd;

	while (ctl_getopt(argc, argv) != -1)
		;
	if (!ctl_positionals(argc, argv, 0, 1, NULL)) {
		usage(stdout);
		return 0;
	}
	cmd = find_command(argv[optind]);
	if (!cmd) {
		ctl_cur = NULL;         /* the hint: `enginectl help` */
		ctl_usage_error("unknown command '%s'", argv[optind]);
	}
	ctl_command_help(stdout, cmd);
	return 0;
}

static void parse_global(int argc, char **argv)
{
	int o;

	while ((o = ctl_getopt_opts(argc, argv, global_opts, true)) != -1) {
		switch (o) {
		case 'a': ctl_addr = optarg; break;
		case 't': ctl_timeout_s = ctl_double_arg("timeout", optarg, 0, 1e9); break;
		case 'r': ctl_retries = (int)ctl_int_arg("retries", optarg, 0, 100); break;
		case 'C': ctl_sec.tls_ca_file = optarg; break;
		case 'c': ctl_sec.tls_cert_file = optarg; break;
		case 'k': ctl_sec.tls_key_file = optarg; break;
		case 'n': ctl_sec.tls_server_name = optarg; break;
		case 'T': ctl_sec.token_file = optarg; break;
		case 'P': ctl_no_progress = true; break;
		case 'V':
			printf("enginectl %s\n", ENGINED_VERSION);
			exit(0);
		case 'h':
			usage(stdout);
			exit(0);
		}
	}
}

int main(int argc, char **argv)
{
	const struct ctl_command *cmd;

	parse_global(argc, argv);
	if (optind >= argc) {
		usage(stderr);
		return 2;
	}
	cmd = find_command(argv[optind]);
	if (!cmd)
		ctl_usage_error("unknown command '%s'", argv[optind]);
	ctl_cur = cmd;
	return cmd->run(argc - optind, argv + optind);
}
