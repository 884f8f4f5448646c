/* test_client_c.c — integration test: the real engined driven through
 * libengined-client (client/engined_client.h).
 *
 * main() starts one daemon ($ENGINED_BIN, or argv[1]) on a kernel-chosen
 * loopback port with temporary roots; the Check cases run in this process
 * (CK_NOFORK: gRPC does not survive fork) against it, in order.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engined_client.h"
#include "io/safetensors.h"

static char addr[64];
static char ckpt_root[300];
static pid_t daemon_pid;

static struct ec_client *client(void)
{
	struct ec_client *c = NULL;
	struct ec_status st;

	ck_assert_int_eq(ec_connect(addr, &c, &st), 0);
	ec_set_timeout_ms(c, 120000);
	return c;
}

static void fill_batch(int32_t *ids, int32_t *lens, int nseq, int len, unsigned seed)
{
	for (int s = 0; s < nseq; s++) {
		lens[s] = len;
		for (int t = 0; t < len; t++)
			ids[s * len + t] = (int32_t)(rand_r(&seed) % 1024);
	}
}

START_TEST(test_before_init)
{
	struct ec_client *c = client();
	Engined__V1__GetStatusResponse *s = NULL;
	Engined__V1__OptimizerStepResponse *o = NULL;
	struct ec_status st;
	uint8_t *resp = NULL;
	size_t len = 0;
	int serving = 0;

	ck_assert_int_eq(ec_health_check(c, "", &serving, &st), 0);
	ck_assert_int_eq(serving, 1);
	ck_assert_int_eq(ec_get_status(c, &s, &st), 0);
	ck_assert(!s->initialized);
	ck_assert_str_eq(s->version, "0.1.0");
	ec_free(s);
	ck_assert_int_eq(ec_optimizer_step(c, &o, &st), EC_FAILED_PRECONDITION);
	ck_assert_ptr_null(o);
	ck_assert_ptr_nonnull(strstr(st.message, "Initialize"));
	ck_assert_int_eq(ec_call_raw(c, "/engined.v1.TrainingEngine/Nope", "", 0, &resp, &len,
				     &st), EC_UNIMPLEMENTED);
	ck_assert_int_eq(ec_call_raw(c, "/engined.v1.TrainingEngine/SetMode", "\xff\xff\xff", 3,
				     &resp, &len, &st), EC_INVALID_ARGUMENT);
	ec_close(c);
}
END_TEST

START_TEST(test_full_cycle)
{
	enum { NSEQ = 4, LEN = 16, N = NSEQ * LEN };
	struct ec_client *c = client();
	Engined__V1__InitializeRequest ir = ENGINED__V1__INITIALIZE_REQUEST__INIT;
	Engined__V1__InitializeResponse *ires = NULL;
	Engined__V1__SetModeRequest mr = ENGINED__V1__SET_MODE_REQUEST__INIT;
	Engined__V1__SetModeResponse *mres = NULL;
	Engined__V1__ForwardBackwardRequest fb = ENGINED__V1__FORWARD_BACKWARD_REQUEST__INIT;
	Engined__V1__ForwardBackwardResponse *fres = NULL;
	Engined__V1__LossSpec loss = ENGINED__V1__LOSS_SPEC__INIT;
	Engined__V1__OptimizerStepResponse *ores = NULL;
	Engined__V1__LrSchedulerStepResponse *lres = NULL;
	Engined__V1__ToDeviceRequest tr = ENGINED__V1__TO_DEVICE_REQUEST__INIT;
	Engined__V1__ToDeviceResponse *tres = NULL;
	Engined__V1__SaveCheckpointRequest sr = ENGINED__V1__SAVE_CHECKPOINT_REQUEST__INIT;
	Engined__V1__SaveCheckpointResponse *sres = NULL;
	Engined__V1__LoadCheckpointRequest lr = ENGINED__V1__LOAD_CHECKPOINT_REQUEST__INIT;
	Engined__V1__LoadCheckpointResponse *ldres = NULL;
	Engined__V1__GetPerTensorParamRequest gr = ENGINED__V1__GET_PER_TENSOR_PARAM_REQUEST__INIT;
	Engined__V1__Tensor t_ids;
	struct ec_weights *w = NULL;
	struct ec_tensor t;
	struct ec_status st;
	struct st_reader *rd = NULL;
	struct eng_error err;
	int32_t ids[N], lens[NSEQ];
	int64_t n = N, total = 0, num_parameters;
	double sum = 0;
	int done = 0, count = 0, masked = 0;
	char dir[400];

	ir.preset = "tiny";
	ir.seed = 11;
	ck_assert_int_eq(ec_initialize(c, &ir, &ires, &st), 0);
	ck_assert_str_eq(ires->engine_key, "language_model/native/cpu");
	ck_assert_int_gt(ires->num_parameters, 800000);
	num_parameters = ires->num_parameters;
	ec_free(ires);

	mr.mode = ENGINED__V1__MODE__MODE_TRAIN;
	ck_assert_int_eq(ec_set_mode(c, &mr, &mres, &st), 0);
	ck_assert_int_eq(mres->mode, ENGINED__V1__MODE__MODE_TRAIN);
	ck_assert(mres->placement->model && mres->placement->optimizer);
	ec_free(mres);

	fill_batch(ids, lens, NSEQ, LEN, 3);
	ec_tensor_1d(&t_ids, ENGINED__V1__DTYPE__INT32, &n, ids, sizeof(ids));
	loss.name = "sft";
	fb.input_ids = &t_ids;
	fb.n_seq_lens = NSEQ;
	fb.seq_lens = lens;
	fb.loss = &loss;
	fb.return_log_probs = true;
	ck_assert_int_eq(ec_forward_backward(c, &fb, &fres, &st), 0);
	ck_assert_uint_eq(fres->log_probs->data.len, N * 4);
	for (int i = 0; i < N; i++) {
		float lp = ((const float *)fres->log_probs->data.data)[i];

		if (i % LEN == 0) {
			ck_assert(lp == 0.0f);
			continue;
		}
		ck_assert(lp < 0.0f);
		sum += lp;
		masked++;
	}
	/* sft, token-mean: loss = -mean of the masked log-probs. */
	ck_assert_double_eq_tol(fres->loss, -sum / masked, 1e-4 * fabs(fres->loss));
	ec_free(fres);

	/* A token outside the vocabulary: INVALID_ARGUMENT naming input_ids. */
	ids[7] = 4096;
	ck_assert_int_eq(ec_forward_backward(c, &fb, &fres, &st), EC_INVALID_ARGUMENT);
	ck_assert_ptr_nonnull(strstr(st.message, "input_ids[7]"));
	ids[7] = 5;

	ck_assert_int_eq(ec_optimizer_step(c, &ores, &st), 0);
	ck_assert(ores->grad_norm > 0 && !ores->skipped && ores->step == 1);
	ec_free(ores);
	ck_assert_int_eq(ec_lr_scheduler_step(c, &lres, &st), 0);
	ck_assert(lres->lr > 0);
	ec_free(lres);

	mr.mode = ENGINED__V1__MODE__MODE_IDLE;
	ck_assert_int_eq(ec_set_mode(c, &mr, &mres, &st), 0);
	ec_free(mres);
	tr.device = "cpu";
	tr.model = tr.optimizer = tr.grad = true;
	ck_assert_int_eq(ec_to_device(c, &tr, &tres, &st), 0);
	ck_assert(!tres->placement->model);
	ec_free(tres);
	tr.model = false;
	ck_assert_int_eq(ec_to_device(c, &tr, &tres, &st), EC_INVALID_ARGUMENT);

	sr.path = "c/ck1";
	sr.global_step = 5;
	ck_assert_int_eq(ec_save_checkpoint(c, &sr, &sres, &st), 0);
	ck_assert_str_eq(sres->path, "c/ck1");
	ec_free(sres);
	sr.path = "../../escape";
	ck_assert_int_eq(ec_save_checkpoint(c, &sr, &sres, &st), EC_PERMISSION_DENIED);
	ck_assert_ptr_nonnull(strstr(st.message, "path"));

	/* Weights through the iterator equal the checkpoint's (FLOAT32 bit for
	 * bit; BFLOAT16 = the reference rounding of the checkpoint's fp32). */
	snprintf(dir, sizeof(dir), "%s/c/ck1/model.safetensors", ckpt_root);
	eng_error_clear(&err);
	ck_assert_msg(st_reader_open(dir, &rd, &err) == 0, "%s", err.msg);
	for (int pass = 0; pass < 2; pass++) {
		gr.dtype = pass ? ENGINED__V1__DTYPE__BFLOAT16 : ENGINED__V1__DTYPE__FLOAT32;
		gr.bucket_bytes = pass ? 65536 : 0;
		ck_assert_int_eq(ec_weights_open(c, &gr, &w, &st), 0);
		count = 0;
		total = 0;
		while (ec_weights_next(w, &t, &done, &st) == 0 && !done) {
			const struct st_tensor_info *info = st_reader_find(rd, t.name);
			int64_t numel = 1;
			float *ref;

			ck_assert_msg(info != NULL, "%s not in the checkpoint", t.name);
			for (int k = 0; k < t.ndim; k++)
				numel *= t.shape[k];
			ref = malloc((size_t)numel * 4);
			ck_assert_int_eq(st_reader_read_f32(rd, t.name, ref, numel, &err), 0);
			if (!pass) {
				ck_assert_uint_eq(t.nbytes, (size_t)numel * 4);
				ck_assert_msg(memcmp(ref, t.data, t.nbytes) == 0, "%s differs", t.name);
			} else {
				const uint16_t *h = (const uint16_t *)t.data;

				ck_assert_uint_eq(t.nbytes, (size_t)numel * 2);
				for (int64_t i = 0; i < numel; i++)
					ck_assert_uint_eq(h[i], f32_to_bf16(ref[i]));
			}
			free(ref);
			count++;
			total += numel;
		}
		ck_assert_msg(st.code == 0, "%s", st.message);
		ck_assert_int_eq(count, st_reader_count(rd));
		ck_assert_int_eq(total, num_parameters);
		ec_weights_close(w);
	}
	st_reader_close(rd);

	lr.path = "c/ck1";
	ck_assert_int_eq(ec_load_checkpoint(c, &lr, &ldres, &st), 0);
	ck_assert_int_eq(ldres->global_step, 5);
	ec_free(ldres);
	lr.path = "c/none";
	ck_assert_int_eq(ec_load_checkpoint(c, &lr, &ldres, &st), EC_NOT_FOUND);
	ec_close(c);
}
END_TEST

/* FNV-1a of a tensor's bytes. */
static uint64_t fnv(const uint8_t *p, size_t n)
{
	uint64_t h = 1469598103934665603ULL;

	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 1099511628211ULL;
	return h;
}

/* Two weight streams of one client at once (the reassembly buffer a
 * closed stream leaves is taken by one stream at a time), then a third
 * that reuses it: each yields the same tensors, in the same order. */
START_TEST(test_streams_share_the_client)
{
	struct ec_client *c = client();
	Engined__V1__GetPerTensorParamRequest gr = ENGINED__V1__GET_PER_TENSOR_PARAM_REQUEST__INIT;
	struct ec_weights *w[2] = {NULL, NULL};
	struct ec_tensor t[2];
	struct ec_status st;
	uint64_t seen[64];
	int done[2] = {0, 0}, n = 0, m = 0;

	gr.bucket_bytes = 4096;
	ck_assert_int_eq(ec_weights_open(c, &gr, &w[0], &st), 0);
	ck_assert_int_eq(ec_weights_open(c, &gr, &w[1], &st), 0);
	for (;;) {
		ck_assert_int_eq(ec_weights_next(w[0], &t[0], &done[0], &st), 0);
		ck_assert_int_eq(ec_weights_next(w[1], &t[1], &done[1], &st), 0);
		ck_assert_int_eq(done[0], done[1]);
		if (done[0])
			break;
		ck_assert_str_eq(t[0].name, t[1].name);
		ck_assert_uint_eq(t[0].nbytes, t[1].nbytes);
		ck_assert(memcmp(t[0].data, t[1].data, t[0].nbytes) == 0);
		ck_assert_int_lt(n, 64);
		seen[n++] = fnv(t[0].data, t[0].nbytes);
	}
	ec_weights_close(w[0]);
	ec_weights_close(w[1]);
	ck_assert_int_eq(ec_weights_open(c, &gr, &w[0], &st), 0);
	while (ec_weights_next(w[0], &t[0], &done[0], &st) == 0 && !done[0]) {
		ck_assert_int_lt(m, n);
		ck_assert(fnv(t[0].data, t[0].nbytes) == seen[m++]);
	}
	ck_assert_msg(st.code == 0, "%s", st.message);
	ck_assert_int_eq(m, n);
	ck_assert_int_gt(n, 2);
	ec_weights_close(w[0]);
	ec_close(c);
}
END_TEST

START_TEST(test_stream_cancel)
{
	struct ec_client *c = client();
	Engined__V1__GetPerTensorParamRequest gr = ENGINED__V1__GET_PER_TENSOR_PARAM_REQUEST__INIT;
	Engined__V1__GetStatusResponse *s = NULL;
	struct ec_weights *w = NULL;
	struct ec_tensor t;
	struct ec_status st;
	int done = 0, busy = 1;

	gr.bucket_bytes = 1024;
	ck_assert_int_eq(ec_weights_open(c, &gr, &w, &st), 0);
	ck_assert_int_eq(ec_weights_next(w, &t, &done, &st), 0);
	ck_assert(!done);
	ec_weights_close(w);  /* cancels mid-stream */
	for (int i = 0; i < 500 && busy; i++) {
		ck_assert_int_eq(ec_get_status(c, &s, &st), 0);
		busy = s->busy;
		ec_free(s);
		if (busy)
			usleep(10000);
	}
	ck_assert_msg(!busy, "engine still busy 5 s after the stream was cancelled");
	ec_close(c);
}
END_TEST

/* The same-host weights (ShareWeights): the mapped share holds, tensor by
 * tensor and in order, the bytes the stream sends; a handle serves once. */
START_TEST(test_share)
{
	struct ec_client *c = client();
	Engined__V1__ShareWeightsRequest q = ENGINED__V1__SHARE_WEIGHTS_REQUEST__INIT;
	Engined__V1__GetPerTensorParamRequest gr = ENGINED__V1__GET_PER_TENSOR_PARAM_REQUEST__INIT;
	Engined__V1__ShareWeightsResponse *reply = NULL;
	struct ec_share *s = NULL, *s2 = NULL;
	struct ec_weights *w = NULL;
	struct ec_tensor t, u;
	struct ec_status st;
	size_t i;
	int done = 0;

	for (int pass = 0; pass < 2; pass++) {
		q.dtype = gr.dtype = pass ? ENGINED__V1__DTYPE__BFLOAT16 : ENGINED__V1__DTYPE__FLOAT32;
		ck_assert_msg(ec_share_weights_open(c, &q, &s, &st) == 0, "%s", st.message);
		ck_assert_int_eq(ec_weights_open(c, &gr, &w, &st), 0);
		i = 0;
		while (ec_weights_next(w, &t, &done, &st) == 0 && !done) {
			ck_assert_int_eq(ec_share_tensor(s, i++, &u), 0);
			ck_assert_str_eq(u.name, t.name);
			ck_assert_int_eq(u.dtype, q.dtype);
			ck_assert_int_eq(u.ndim, t.ndim);
			for (int k = 0; k < t.ndim; k++)
				ck_assert_int_eq(u.shape[k], t.shape[k]);
			ck_assert_uint_eq(u.nbytes, t.nbytes);
			ck_assert_msg(memcmp(u.data, t.data, t.nbytes) == 0, "%s differs", t.name);
		}
		ck_assert_msg(st.code == 0, "%s", st.message);
		ck_assert_uint_eq(i, ec_share_count(s));
		ck_assert_int_eq(ec_share_tensor(s, i, &u), -ERANGE);
		ec_weights_close(w);
		ec_share_close(s);
	}
	ck_assert_int_eq(ec_share_weights(c, &q, &reply, &st), 0);
	ck_assert_uint_eq(reply->handle.len, 16);
	ck_assert_int_eq(ec_share_open(reply, &s, &st), 0);
	ck_assert_int_eq(ec_share_open(reply, &s2, &st), EC_NOT_FOUND);
	ck_assert_ptr_nonnull(strstr(st.message, "unknown, used up or expired"));
	ec_share_close(s);
	ec_free(reply);
	ec_close(c);
}
END_TEST

static int start_daemon(const char *bin)
{
	char tmpl[] = "/tmp/engined-ct-XXXXXX", port_file[300], port_arg[32];
	char *dir = mkdtemp(tmpl), model_root[300], share_sock[300];
	FILE *f;
	int port = 0;

	if (!dir)
		return -errno;
	snprintf(ckpt_root, sizeof(ckpt_root), "%s/checkpoints", dir);
	snprintf(model_root, sizeof(model_root), "%s/models", dir);
	snprintf(port_file, sizeof(port_file), "%s/port", dir);
	snprintf(share_sock, sizeof(share_sock), "%s/share.sock", dir);
	daemon_pid = fork();
	if (daemon_pid == 0) {
		execl(bin, bin, "--listen", "127.0.0.1:0", "--port-file", port_file,
		      "--checkpoint-root", ckpt_root, "--model-root", model_root,
		      "--share-socket", share_sock, "--log-level", "warn", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 400 && port == 0; i++) {
		f = fopen(port_file, "r");
		if (f) {
			if (fscanf(f, "%d", &port) != 1)
				port = 0;
			fclose(f);
		}
		if (!port)
			usleep(25000);
	}
	(void)port_arg;
	if (!port)
		return -ETIMEDOUT;
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	return 0;
}

/* Request ids from the C client: a repeat of an id gets the first call's
 * reply and does not run again; fresh ids are 32 hex digits, distinct. */
START_TEST(test_request_ids)
{
	struct ec_client *c = client();
	Engined__V1__InitializeRequest ir = ENGINED__V1__INITIALIZE_REQUEST__INIT;
	Engined__V1__InitializeResponse *ires = NULL;
	Engined__V1__OptimizerStepRequest q = ENGINED__V1__OPTIMIZER_STEP_REQUEST__INIT;
	Engined__V1__OptimizerStepResponse *a, *b;
	Engined__V1__GetStatusResponse *s = NULL;
	char id1[EC_REQUEST_ID_LEN], id2[EC_REQUEST_ID_LEN];
	const char *path = "/engined.v1.TrainingEngine/OptimizerStep";
	uint8_t req[8], *r1 = NULL, *r2 = NULL;
	size_t len, l1 = 0, l2 = 0;
	struct ec_status st;

	ir.preset = "tiny";
	ir.replace = true;
	ck_assert_int_eq(ec_initialize(c, &ir, &ires, &st), 0);
	ec_free(ires);
	ck_assert_int_eq(ec_new_request_id(id1), 0);
	ck_assert_int_eq(ec_new_request_id(id2), 0);
	ck_assert_int_eq((int)strlen(id1), 32);
	ck_assert_int_eq((int)strspn(id1, "0123456789abcdef"), 32);
	ck_assert_str_ne(id1, id2);
	len = protobuf_c_message_pack(&q.base, req);
	ec_set_retries(c, 2, 10);
	ck_assert_int_eq(ec_call_raw_id(c, path, req, len, id1, &r1, &l1, &st), 0);
	ck_assert_int_eq(ec_call_raw_id(c, path, req, len, id1, &r2, &l2, &st), 0);
	a = engined__v1__optimizer_step_response__unpack(NULL, l1, r1);
	b = engined__v1__optimizer_step_response__unpack(NULL, l2, r2);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_int_eq(a->step, 1);
	ck_assert_int_eq(b->step, 1);  /* replayed, not run again */
	ck_assert_int_eq(ec_get_status(c, &s, &st), 0);
	ck_assert_int_eq(s->step, 1);
	ck_assert_str_eq(s->last_request_id, id1);
	ec_free(s);
	ec_free(a);
	ec_free(b);
	free(r1);
	free(r2);
	ec_close(c);
}
END_TEST

/* A LoRA adapter through the C API: created over a frozen base, trained
 * by name, its own status, deleted. */
START_TEST(test_adapter)
{
	static char q_proj[] = "q_proj";
	struct ec_client *c = client();
	Engined__V1__InitializeRequest ir = ENGINED__V1__INITIALIZE_REQUEST__INIT;
	Engined__V1__InitializeResponse *ires = NULL;
	Engined__V1__CreateAdapterRequest cr = ENGINED__V1__CREATE_ADAPTER_REQUEST__INIT;
	Engined__V1__CreateAdapterResponse *cres = NULL;
	Engined__V1__ForwardBackwardRequest fb = ENGINED__V1__FORWARD_BACKWARD_REQUEST__INIT;
	Engined__V1__ForwardBackwardResponse *fres = NULL;
	Engined__V1__OptimizerStepResponse *ores = NULL;
	Engined__V1__LrSchedulerStepResponse *lres = NULL;
	Engined__V1__GetStatusResponse *s = NULL;
	Engined__V1__LossSpec loss = ENGINED__V1__LOSS_SPEC__INIT;
	Engined__V1__Tensor ids_t = ENGINED__V1__TENSOR__INIT;
	char *targets[] = { q_proj };
	int32_t ids[32], lens[2];
	int64_t shape_n = 32;
	struct ec_status st;

	ir.preset = "tiny";
	ir.replace = true;
	ir.frozen_base = true;
	ck_assert_int_eq(ec_initialize(c, &ir, &ires, &st), 0);
	ec_free(ires);
	cr.name = "c-api";
	cr.rank = 4;
	cr.n_target_modules = 1;
	cr.target_modules = targets;
	ck_assert_int_eq(ec_create_adapter(c, &cr, &cres, &st), 0);
	ck_assert_int_eq(cres->num_parameters, 4 * 4 * (128 + 128));
	ck_assert_int_eq(cres->num_tensors, 8);
	ck_assert_int_eq((int)cres->n_target_modules, 1);
	ck_assert_str_eq(cres->target_modules[0], "q_proj");
	ec_free(cres);
	cres = NULL;
	ck_assert_int_eq(ec_create_adapter(c, &cr, &cres, &st), EC_ALREADY_EXISTS);
	ck_assert_ptr_null(cres);

	fill_batch(ids, lens, 2, 16, 5);
	ec_tensor_1d(&ids_t, ENGINED__V1__DTYPE__INT32, &shape_n, ids, sizeof(ids));
	fb.input_ids = &ids_t;
	fb.n_seq_lens = 2;
	fb.seq_lens = lens;
	loss.name = "sft";
	fb.loss = &loss;
	fb.adapter = "c-api";
	ck_assert_int_eq(ec_forward_backward(c, &fb, &fres, &st), 0);
	ec_free(fres);
	fb.adapter = "";   /* the frozen base trains nothing itself */
	ck_assert_int_eq(ec_forward_backward(c, &fb, &fres, &st), EC_FAILED_PRECONDITION);
	ck_assert_int_eq(ec_optimizer_step_adapter(c, "c-api", &ores, &st), 0);
	ck_assert_int_eq(ores->step, 1);
	ec_free(ores);
	ck_assert_int_eq(ec_lr_scheduler_step_adapter(c, "c-api", &lres, &st), 0);
	ec_free(lres);
	ck_assert_int_eq(ec_zero_grad_adapter(c, "c-api", &st), 0);
	ck_assert_int_eq(ec_zero_grad_adapter(c, "other", &st), EC_NOT_FOUND);
	ck_assert_ptr_nonnull(strstr(st.message, "adapter: no adapter named 'other'"));
	ck_assert_int_eq(ec_get_status_adapter(c, "c-api", &s, &st), 0);
	ck_assert_int_eq(s->step, 1);
	ck_assert_int_eq(s->sched_step, 1);
	ck_assert_int_eq(s->num_parameters, 4 * 4 * (128 + 128));
	ck_assert_int_eq((int)s->n_adapters, 1);
	ck_assert_str_eq(s->adapters[0], "c-api");
	ec_free(s);
	ck_assert_int_eq(ec_get_status(c, &s, &st), 0);
	ck_assert_int_eq(s->step, 0);
	ec_free(s);
	ck_assert_int_eq(ec_delete_adapter(c, "c-api", &st), 0);
	ck_assert_int_eq(ec_delete_adapter(c, "c-api", &st), EC_NOT_FOUND);
	ck_assert_int_eq(ec_get_status(c, &s, &st), 0);
	ck_assert_int_eq((int)s->n_adapters, 0);
	ec_free(s);
	ec_close(c);
}
END_TEST

int main(int argc, char **argv)
{
	const char *bin = argc > 1 ? argv[1] : getenv("ENGINED_BIN");
	Suite *s = suite_create("integration_c");
	TCase *tc = tcase_create("daemon");
	SRunner *sr;
	int failed, status = 0;

	if (!bin)
		bin = "daemon/engined";
	if (start_daemon(bin) < 0) {
		fprintf(stderr, "cannot start %s\n", bin);
		if (daemon_pid > 0)
			kill(daemon_pid, SIGKILL);
		return 1;
	}
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_before_init);
	tcase_add_test(tc, test_full_cycle);
	tcase_add_test(tc, test_streams_share_the_client);
	tcase_add_test(tc, test_stream_cancel);
	tcase_add_test(tc, test_share);
	tcase_add_test(tc, test_request_ids);
	tcase_add_test(tc, test_adapter);
	suite_add_tcase(s, tc);
	sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	kill(daemon_pid, SIGTERM);
	waitpid(daemon_pid, &status, 0);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "engined did not exit 0 after SIGTERM (status %d)\n", status);
		failed++;
	}
	return failed ? 1 : 0;
}
