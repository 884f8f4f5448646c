/* fuzz_request.c — libFuzzer harness: a request as the daemon decodes and
 * validates it on a poller thread (dispatch.c: on_call), for every row of
 * the method table (daemon/methods.c).
 *
 * Input: byte 0 selects the row (its low 7 bits, modulo the number of rows)
 * and the engine the status snapshot shows (bit 7: a value model, else a
 * language model; ForwardBackward's validation asks); the rest is the
 * request message as it comes off the wire. The message is unpacked with
 * the row's req_desc and handed to the row's validate, when it has one;
 * the client-streaming reflection rows decode and answer each message
 * (reflection_answer). Nothing runs on an engine: the daemon is
 * daemon_init'ed, never started, over a checkpoint root and a model root
 * made once in a scratch directory (with "models/tiny" and
 * "checkpoints/run/step-1" in them, so that paths can also resolve). Each
 * iteration frees what the job would (the request, the validation's prep).
 * FUZZ_VERBOSE=1 prints each input's row and outcome (to check seeds).
 * Seeds: tests/fuzz/corpus/fuzz_request (tests/fuzz/make_corpus.py). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "fuzz_util.h"
#include "log.h"
#include "methods.h"
#include "paths.h"
#include "reflection.h"

static struct daemon d;
static struct daemon_config cfg;
static bool verbose;

static char *prepared_root(const char *dir)
{
	struct eng_error err = {0};
	char *real = NULL;

	FUZZ_CHECK(paths_prepare_root(dir, &real, &err) == 0, "%s: %s", dir, err.msg);
	return real;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *s = fuzz_scratch_dir();
	char ck[PATH_MAX], models[PATH_MAX], p[PATH_MAX], errbuf[512];

	(void)argc;
	(void)argv;
	verbose = getenv("FUZZ_VERBOSE") != NULL;
	log_set_level(LOG_LVL_ERROR);
	FUZZ_CHECK(config_init(&cfg) == 0, "config_init");
	/* As main.c's parse_args derives it. */
	cfg.max_send_bytes = cfg.max_request_bytes > (64LL << 20) ? cfg.max_request_bytes
								   : (64LL << 20);
	fuzz_join(ck, sizeof(ck), s, "checkpoints");
	fuzz_join(models, sizeof(models), s, "models");
	fuzz_mkdir(ck);
	fuzz_mkdir(models);
	fuzz_join(p, sizeof(p), models, "tiny");
	fuzz_mkdir(p);
	fuzz_join(p, sizeof(p), ck, "run");
	fuzz_mkdir(p);
	fuzz_join(p, sizeof(p), ck, "run/step-1");
	fuzz_mkdir(p);
	free(cfg.checkpoint_root);
	free(cfg.model_root);
	cfg.checkpoint_root = prepared_root(ck);
	cfg.model_root = prepared_root(models);
	FUZZ_CHECK(daemon_init(&d, &cfg, errbuf, sizeof(errbuf)) == 0, "daemon_init: %s", errbuf);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct method *m;
	struct eng_error err;
	struct job j;
	int r = 0;

	if (size < 1)
		return 0;
	m = &daemon_methods[(data[0] & 0x7f) % daemon_n_methods];
	snprintf(d.snap.key, sizeof(d.snap.key), "%s",
		 data[0] & 0x80 ? "value_model/native/cpu" : "language_model/native/cpu");
	data++;
	size--;
	eng_error_clear(&err);
	if (!m->req_desc) {
		/* Client streaming (reflection): each message is answered. */
		uint8_t *out = NULL;
		size_t out_len = 0;

		r = reflection_answer(d.refl, data, size, &out, &out_len, &err);
		FUZZ_CHECK(r == 0 || r == -EINVAL, "reflection_answer: %d", r);
		if (verbose)
			fprintf(stderr, "%s: %d (%zu bytes of answer)\n", method_label(m), r, out_len);
		free(out);
		return 0;
	}
	memset(&j, 0, sizeof(j));
	j.m = m;
	j.metrics = &d.metrics;
	j.req = protobuf_c_message_unpack(m->req_desc, NULL, size, data);
	if (!j.req) {
		if (verbose)
			fprintf(stderr, "%s: not a %s\n", method_label(m), m->req_desc->name);
		return 0;
	}
	if (m->validate) {
		r = m->validate(&d, &j, &err);
		/* A refusal says why (job_finish sends err.msg), unless
		 * memory ran out. */
		FUZZ_CHECK(r <= 0, "%s: validate returned %d", m->name, r);
		FUZZ_CHECK(r == 0 || r == -ENOMEM || err.msg[0], "%s: error %d without a message",
			   m->name, r);
	}
	if (verbose)
		fprintf(stderr, "%s: %d %s\n", method_label(m), m->validate ? r : 0, err.msg);
	protobuf_c_message_free_unpacked(j.req, NULL);
	if (j.prep_free)
		j.prep_free(j.prep);
	return 0;
}
