/* fuzz_model_config.c — libFuzzer harness: a Hugging Face config.json as
 * the engine reads it from Initialize.hf_config_json, a preset or a model
 * directory (engines/model/config.c, model_config_parse), and the one
 * validation of an init config that carries it (engine_init_config_check).
 *
 * Input: the text of config.json (any bytes; a NUL ends it early, as it
 * ends a C string from the wire).
 * For a config that parses, what the engine derives from it runs too, for
 * a language and a value model: the head held against the kind
 * (model_config_set_head, as engine_init_config_check does), the parameter
 * table (param_table_build, every size of model/config.h's bounds), and the
 * RoPE frequencies. Checks: the config written back for that kind
 * (model_config_to_json, what a checkpoint's config.json holds) parses to
 * the same config, which the same kind accepts.
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
	SAME(pad_token_id);
	SAME(attention_bias);
	SAME(qk_norm);
	SAME(rope_llama3);
	SAME(initializer_range);
	SAME(o_proj_bias);
	SAME(head);
	SAME(num_labels);
	SAME(mlp);
	if (a->mlp == MODEL_MLP_MOE) {
		SAME(num_experts);
		SAME(experts_per_tok);
		SAME(moe_intermediate_size);
		SAME(decoder_sparse_step);
		SAME(norm_topk_prob);
		SAME(shared_expert_size);
		SAME(router_aux_loss_coef);
		SAME(output_router_logits);
		FUZZ_CHECK(!memcmp(a->dense_layers, b->dense_layers, sizeof(a->dense_layers)),
			   "round trip changed mlp_only_layers");
	}
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

	for (int value_model = 0; value_model < 2; value_model++) {
		struct model_config h = c;
		int hr = r;

		eng_error_clear(&err);
		if (hr == 0)
			hr = model_config_set_head(&h, value_model, &err);
		FUZZ_CHECK(hr == 0 || (hr == -EINVAL && (r || err.msg[0])),
			   "model_config_set_head: %d", hr);
		engine_init_config_defaults(&ic);
		ic.hf_config_json = text;
		ic.model_type = value_model ? "value_model" : "language_model";
		eng_error_clear(&err);
		FUZZ_CHECK((engine_init_config_check(&ic, &err) == 0) == (hr == 0),
			   "engine_init_config_check and model_config_parse/set_head disagree: %s",
			   err.msg);
		if (hr)
			continue;

		back_text = model_config_to_json(&h);
		FUZZ_CHECK(back_text, "model_config_to_json: out of memory");
		eng_error_clear(&err);
		FUZZ_CHECK(model_config_parse(back_text, &back, &err) == 0,
			   "the config written back does not parse: %s\n%s", err.msg, back_text);
		check_same(&h, &back);
		FUZZ_CHECK(model_config_set_head(&back, value_model, &err) == 0,
			   "the config written back is refused: %s\n%s", err.msg, back_text);
		free(back_text);

		memset(&t, 0, sizeof(t));
		eng_error_clear(&err);
		if (param_table_build(&h, value_model, &t, &err) == 0) {
			FUZZ_CHECK(t.count > 0 && t.total > 0, "empty parameter table");
			param_table_free(&t);
		}
	}
	if (r == 0)
		model_config_rope_inv_freq(&c, inv_freq);
	free(text);
	return 0;
}
