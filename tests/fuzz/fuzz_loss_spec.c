/* fuzz_loss_spec.c — libFuzzer harness: a ForwardBackward's LossSpec as the
 * daemon parses it (fb_request.c: decode_loss) — loss_spec_init on the
 * name, loss_spec_set for each option, loss_spec_validate against the
 * inputs the request carries — and then, for a spec that validated, the
 * loss itself (loss_compute) on a small batch, as the engine would run it.
 *
 * Input: byte 0: which of the request's per-token inputs are present (bit k:
 * LOSS_REQUEST_INPUTS' k-th, loss_mask first); byte 1: bit 0 a value model
 * (values instead of entropy), bit 1 one present input one element short,
 * bits 2-7 the seed of the batch's values; then text: the loss name on the
 * first line, one "key=value" option a line after it (a line without '='
 * is a key with an empty value).
 * Checks: a failed loss_spec_set leaves the spec unchanged (loss.h).
 * FUZZ_VERBOSE=1 prints each spec's validation (to check seeds).
 * Seeds: tests/fuzz/corpus/fuzz_loss_spec (tests/fuzz/make_corpus.py). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "loss/loss.h"

#define N 12
#define NSEQ 3

static uint32_t next(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

/* Uniform in [lo, hi). */
static float uni(uint32_t *s, float lo, float hi)
{
	return lo + (hi - lo) * (float)(next(s) >> 8) / 16777216.0f;
}

static void run_loss(const struct loss_spec *spec, const float *const in[LOSS_IN_REQUEST_COUNT],
		     bool value_model, uint32_t seed)
{
	static const int32_t seq_lens[NSEQ] = { 3, 5, 4 };
	float lp[N], ent[N], val[N], dlp[N], dent[N], dval[N];
	uint8_t sel[N];
	struct loss_batch b = { .n = N, .num_seqs = NSEQ, .seq_lens = seq_lens };
	struct loss_result res = { .d_log_probs = dlp, .d_entropy = dent, .d_values = dval,
				   .selected = sel };
	struct eng_error err = {0};

	for (int t = 0; t < N; t++) {
		lp[t] = uni(&seed, -12.0f, 0.0f);
		ent[t] = uni(&seed, 0.0f, 5.0f);
		val[t] = uni(&seed, -3.0f, 3.0f);
	}
	b.log_probs = lp;
	b.entropy = value_model ? NULL : ent;
	b.values = value_model ? val : NULL;
	memcpy(b.in, in, sizeof(b.in));
	b.rng_seed = seed;
	(void)loss_compute(spec, &b, &res, &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	float arrays[LOSS_IN_REQUEST_COUNT][N];
	const float *in[LOSS_IN_REQUEST_COUNT] = {0};
	struct loss_inputs_present present;
	struct loss_spec spec, before;
	struct eng_error err = {0};
	bool value_model, short_one;
	uint32_t seed;
	char *text, *line, *save = NULL;
	int r;

	if (size < 2)
		return 0;
	value_model = data[1] & 1;
	short_one = data[1] & 2;
	seed = 0x9e3779b9u ^ (uint32_t)(data[1] >> 2);
	text = fuzz_strndup(data + 2, size - 2);
	/* The name is the first line, even an empty one. */
	line = strchr(text, '\n');
	if (line)
		*line++ = '\0';
	r = loss_spec_init(&spec, text, &err);
	for (line = line ? strtok_r(line, "\n", &save) : NULL; !r && line;
	     line = strtok_r(NULL, "\n", &save)) {
		char *eq = strchr(line, '=');
		const char *value = "";

		if (eq) {
			*eq = '\0';
			value = eq + 1;
		}
		before = spec;
		eng_error_clear(&err);
		if (loss_spec_set(&spec, line, value, &err) < 0)
			FUZZ_CHECK(!memcmp(&before, &spec, sizeof(spec)),
				   "loss_spec_set(%s=%s) failed and changed the spec", line, value);
		/* The daemon stops at the first bad option; go on here to
		 * reach more of the parser. */
	}
	if (r < 0)
		goto out;

	loss_inputs_present_init(&present, N);
	for (int k = 0; k < LOSS_IN_REQUEST_COUNT; k++) {
		if (!(data[0] >> k & 1))
			continue;
		for (int t = 0; t < N; t++)
			arrays[k][t] = k == LOSS_IN_LOSS_MASK ? (float)(next(&seed) & 1)
							      : uni(&seed, -4.0f, 4.0f);
		if (k == LOSS_IN_IS_WEIGHTS || k == LOSS_IN_TOKEN_WEIGHTS)
			for (int t = 0; t < N; t++)
				arrays[k][t] = fabsf(arrays[k][t]);
		in[k] = arrays[k];
		present.len[k] = N;
		if (short_one) {
			present.len[k] = N - 1;
			short_one = false;
		}
	}
	present.len[LOSS_IN_ENTROPY] = value_model ? -1 : N;
	present.len[LOSS_IN_VALUES] = value_model ? N : -1;
	eng_error_clear(&err);
	(void)loss_spec_validate(&spec, NULL, &err);
	eng_error_clear(&err);
	r = loss_spec_validate(&spec, &present, &err);
	if (r == 0)
		run_loss(&spec, in, value_model, seed);
	if (getenv("FUZZ_VERBOSE"))
		fprintf(stderr, "%s: validate %d %s\n", text, r, err.msg);
out:
	free(text);
	return 0;
}
