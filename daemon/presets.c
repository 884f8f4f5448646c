/* presets.c — built-in model configs (see presets.h).
 *   tiny                ~0.9M parameters: llama, 4 layers, hidden 128, vocab 1024
 *   small               ~28M parameters:  llama, 8 layers, hidden 512, vocab 8192
 *   qwen2.5-0.5b-shape  ~494M parameters: Qwen2.5-0.5B's shapes (random init)
 */
#include "presets.h"

#include <string.h>

struct preset {
	const char *name;
	const char *json;
};

static const struct preset presets[] = {
	{ "tiny",
	  "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
	  " \"vocab_size\": 1024, \"hidden_size\": 128, \"intermediate_size\": 384,"
	  " \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
	  " \"num_key_value_heads\": 2, \"max_position_embeddings\": 2048,"
	  " \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0,"
	  " \"tie_word_embeddings\": true, \"initializer_range\": 0.02,"
	  " \"torch_dtype\": \"float32\"}" },
	{ "small",
	  "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
	  " \"vocab_size\": 8192, \"hidden_size\": 512, \"intermediate_size\": 1408,"
	  " \"num_hidden_layers\": 8, \"num_attention_heads\": 8,"
	  " \"num_key_value_heads\": 4, \"max_position_embeddings\": 4096,"
	  " \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0,"
	  " \"tie_word_embeddings\": true, \"initializer_range\": 0.02,"
	  " \"torch_dtype\": \"float32\"}" },
	{ "qwen2.5-0.5b-shape",
	  "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\","
	  " \"vocab_size\": 151936, \"hidden_size\": 896, \"intermediate_size\": 4864,"
	  " \"num_hidden_layers\": 24, \"num_attention_heads\": 14,"
	  " \"num_key_value_heads\": 2, \"max_position_embeddings\": 32768,"
	  " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
	  " \"tie_word_embeddings\": true, \"initializer_range\": 0.02,"
	  " \"torch_dtype\": \"bfloat16\"}" },
};

const char *preset_config_json(const char *name)
{
	for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
		if (strcmp(presets[i].name, name) == 0)
			return presets[i].json;
	return NULL;
}

const char *preset_names(void)
{
	return "tiny, small, qwen2.5-0.5b-shape";
}
