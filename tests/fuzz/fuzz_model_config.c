/* fuzz_model_config.c — libFuzzer harness: a Hugging Face config.json as
 * the engine reads it from Initialize.hf_config_json, a preset or a model
 * directory (engines/model/config.c, model_config_parse), and the one
 * validation of an init config that carries it (engine_init_config_check).
 *
 * Input: the text of config.json (any bytes; a NUL ends it early, as it
 * ends a C string from the wire).
 * For a config that parses, what the engine derives from it runs too: the
 * parameter table of the language and the value model (param_table_build,
 * every size of model/config.h's bounds) and the RoPE frequencies. Checks:
 * the config written back (model_config_to_json, what a checkpoint's
 * config.json holds) parses to the same config.
 * Seeds: tests/fuzz/corpus/fuzz_model_config (the presets of
 * daemon/presets.c and the test configs; tests/fuzz/make_corpus.py). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "fuzz_util.h"
#include "model/config.h"
#include "model/params.h"

static void check_same(const struct model_config *a, const struct model_config *b)
{
#define SAME(f) FUZZ_CHECK(a->f == b->f, "round trip changed " #f)
	SAME(arch);
	SAME(vocab_size);
	SAME(hidden_size);
	SAME(intermediate_size);
	SAME(num_layers);
	SAME(num_heads);
	SAME(num_kv_heads);
	SAME(head_dim);
	SAME(max_position_embeddings);
	SAME(rms_norm_eps);
	SAME(rope_theta);
	SAME(tie_word_embeddings);
	SAME(attention_bias);
	SAME(qk_norm);
	SAME(rope_llama3);
	SAME(initializer_range);
	SAME(o_proj_bias);
	if (a->rope_llama3) {
		SAME(rope_factor);
		SAME(rope_low_freq_factor);
		SAME(rope_high_freq_factor);
		SAME(rope_original_max_pos);
	}
#undef SAME
	FUZZ_CHECK(!strcmp(a->model_type, b->model_type), "round trip changed model_type");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static float inv_freq[MODEL_MAX_HEAD_DIM / 2];
	char *text = fuzz_strndup(data, size), *back_text;
	struct engine_init_config ic;
	struct model_config c, back;
	struct param_table t;
	struct eng_error err = {0};
	int r;

	r = model_config_parse(text, &c, &err);
	FUZZ_CHECK(r == 0 || (r == -EINVAL && err.msg[0]), "model_config_parse: %d", r);

	engine_init_config_defaults(&ic);
	ic.hf_config_json = text;
	eng_error_clear(&err);
	FUZZ_CHECK((engine_init_config_check(&ic, &err) == 0) == (r == 0),
		   "engine_init_config_check and model_config_parse disagree: %s", err.msg);
	if (r) {
		free(text);
		return 0;
	}

	back_text = model_config_to_json(&c);
	FUZZ_CHECK(back_text, "model_config_to_json: out of memory");
	eng_error_clear(&err);
	FUZZ_CHECK(model_config_parse(back_text, &back, &err) == 0,
		   "the config written back does not parse: %s\n%s", err.msg, back_text);
	check_same(&c, &back);
	free(back_text);

	for (int value_model = 0; value_model < 2; value_model++) {
		memset(&t, 0, sizeof(t));
		eng_error_clear(&err);
		if (param_table_build(&c, value_model, &t, &err) == 0) {
			FUZZ_CHECK(t.count > 0 && t.total > 0, "empty parameter table");
			param_table_free(&t);
		}
	}
	model_config_rope_inv_freq(&c, inv_freq);
	free(text);
	return 0;
}
