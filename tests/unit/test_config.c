/* test_config.c — Hugging Face config.json parsing, serialization and RoPE
 * frequencies (engines/model/config.c), and the head a config names
 * (model_config_set_head: a value model's *ForTokenClassification).
 *
 * The configs below are the real config.json files of the named models
 * (trimmed of keys the engine ignores only where noted). The RoPE
 * references were produced offline with torch 1.13 (/usr/bin/python3) by
 * this transcription of transformers' _compute_default_rope_parameters and
 * _compute_llama3_parameters, printing the fp32 bit patterns:
 *
 *   def default(base, dim):
 *       return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
 *   def llama3(base, dim, factor, low_freq_factor, high_freq_factor, old_context_len):
 *       inv_freq = default(base, dim)
 *       low_freq_wavelen = old_context_len / low_freq_factor
 *       high_freq_wavelen = old_context_len / high_freq_factor
 *       wavelen = 2 * math.pi / inv_freq
 *       inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
 *       smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
 *       smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
 *       is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
 *       return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
 *   llama3(500000.0, 64, 32.0, 1.0, 4.0, 8192)    # Llama-3.2-1B
 *   default(1000000.0, 64)                       # Qwen2.5-0.5B
 *   llama3(500000.0, 128, 8.0, 1.0, 4.0, 8192)   # Llama-3.1-8B
 */
#include "check_run.h"
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "model/config.h"
#include "model/params.h"

static const char qwen25_05b[] =
	"{\n"
	"  \"architectures\": [\"Qwen2ForCausalLM\"],\n"
	"  \"attention_dropout\": 0.0,\n"
	"  \"bos_token_id\": 151643,\n"
	"  \"eos_token_id\": 151643,\n"
	"  \"hidden_act\": \"silu\",\n"
	"  \"hidden_size\": 896,\n"
	"  \"initializer_range\": 0.02,\n"
	"  \"intermediate_size\": 4864,\n"
	"  \"max_position_embeddings\": 32768,\n"
	"  \"max_window_layers\": 24,\n"
	"  \"model_type\": \"qwen2\",\n"
	"  \"num_attention_heads\": 14,\n"
	"  \"num_hidden_layers\": 24,\n"
	"  \"num_key_value_heads\": 2,\n"
	"  \"rms_norm_eps\": 1e-06,\n"
	"  \"rope_theta\": 1000000.0,\n"
	"  \"sliding_window\": 32768,\n"
	"  \"tie_word_embeddings\": true,\n"
	"  \"torch_dtype\": \"bfloat16\",\n"
	"  \"transformers_version\": \"4.43.1\",\n"
	"  \"use_cache\": true,\n"
	"  \"use_sliding_window\": false,\n"
	"  \"vocab_size\": 151936\n"
	"}\n";

static const char llama32_1b[] =
	"{\n"
	"  \"architectures\": [\"LlamaForCausalLM\"],\n"
	"  \"attention_bias\": false,\n"
	"  \"attention_dropout\": 0.0,\n"
	"  \"bos_token_id\": 128000,\n"
	"  \"eos_token_id\": 128001,\n"
	"  \"head_dim\": 64,\n"
	"  \"hidden_act\": \"silu\",\n"
	"  \"hidden_size\": 2048,\n"
	"  \"initializer_range\": 0.02,\n"
	"  \"intermediate_size\": 8192,\n"
	"  \"max_position_embeddings\": 131072,\n"
	"  \"mlp_bias\": false,\n"
	"  \"model_type\": \"llama\",\n"
	"  \"num_attention_heads\": 32,\n"
	"  \"num_hidden_layers\": 16,\n"
	"  \"num_key_value_heads\": 8,\n"
	"  \"pretraining_tp\": 1,\n"
	"  \"rms_norm_eps\": 1e-05,\n"
	"  \"rope_scaling\": {\n"
	"    \"factor\": 32.0,\n"
	"    \"high_freq_factor\": 4.0,\n"
	"    \"low_freq_factor\": 1.0,\n"
	"    \"original_max_position_embeddings\": 8192,\n"
	"    \"rope_type\": \"llama3\"\n"
	"  },\n"
	"  \"rope_theta\": 500000.0,\n"
	"  \"tie_word_embeddings\": true,\n"
	"  \"torch_dtype\": \"bfloat16\",\n"
	"  \"transformers_version\": \"4.45.0.dev0\",\n"
	"  \"use_cache\": true,\n"
	"  \"vocab_size\": 128256\n"
	"}\n";

static const char qwen3_06b[] =
	"{\n"
	"  \"architectures\": [\"Qwen3ForCausalLM\"],\n"
	"  \"attention_bias\": false,\n"
	"  \"attention_dropout\": 0.0,\n"
	"  \"bos_token_id\": 151643,\n"
	"  \"eos_token_id\": 151645,\n"
	"  \"head_dim\": 128,\n"
	"  \"hidden_act\": \"silu\",\n"
	"  \"hidden_size\": 1024,\n"
	"  \"initializer_range\": 0.02,\n"
	"  \"intermediate_size\": 3072,\n"
	"  \"max_position_embeddings\": 40960,\n"
	"  \"max_window_layers\": 28,\n"
	"  \"model_type\": \"qwen3\",\n"
	"  \"num_attention_heads\": 16,\n"
	"  \"num_hidden_layers\": 28,\n"
	"  \"num_key_value_heads\": 8,\n"
	"  \"rms_norm_eps\": 1e-06,\n"
	"  \"rope_scaling\": null,\n"
	"  \"rope_theta\": 1000000,\n"
	"  \"sliding_window\": null,\n"
	"  \"tie_word_embeddings\": true,\n"
	"  \"torch_dtype\": \"bfloat16\",\n"
	"  \"transformers_version\": \"4.51.0\",\n"
	"  \"use_cache\": true,\n"
	"  \"use_sliding_window\": false,\n"
	"  \"vocab_size\": 151936\n"
	"}\n";

static const char mistral_7b_v03[] =
	"{\n"
	"  \"architectures\": [\"MistralForCausalLM\"],\n"
	"  \"attention_dropout\": 0.0,\n"
	"  \"bos_token_id\": 1,\n"
	"  \"eos_token_id\": 2,\n"
	"  \"hidden_act\": \"silu\",\n"
	"  \"hidden_size\": 4096,\n"
	"  \"initializer_range\": 0.02,\n"
	"  \"intermediate_size\": 14336,\n"
	"  \"max_position_embeddings\": 32768,\n"
	"  \"model_type\": \"mistral\",\n"
	"  \"num_attention_heads\": 32,\n"
	"  \"num_hidden_layers\": 32,\n"
	"  \"num_key_value_heads\": 8,\n"
	"  \"rms_norm_eps\": 1e-05,\n"
	"  \"rope_theta\": 1000000.0,\n"
	"  \"sliding_window\": null,\n"
	"  \"tie_word_embeddings\": false,\n"
	"  \"torch_dtype\": \"bfloat16\",\n"
	"  \"transformers_version\": \"4.42.0.dev0\",\n"
	"  \"use_cache\": true,\n"
	"  \"vocab_size\": 32768\n"
	"}\n";

/* Mistral-7B-v0.1: a 4096-token sliding window over 32768 positions. */
static const char mistral_7b_v01[] =
	"{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, "
	"\"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 4096, "
	"\"initializer_range\": 0.02, \"intermediate_size\": 14336, "
	"\"max_position_embeddings\": 32768, \"model_type\": \"mistral\", "
	"\"num_attention_heads\": 32, \"num_hidden_layers\": 32, "
	"\"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, "
	"\"sliding_window\": 4096, \"tie_word_embeddings\": false, "
	"\"torch_dtype\": \"bfloat16\", \"vocab_size\": 32000}";

/* TinyLlama-1.1B-Chat-v1.0: no head_dim, rope_scaling null. */
static const char tinyllama[] =
	"{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
	"\"bos_token_id\": 1, \"eos_token_id\": 2, \"hidden_act\": \"silu\", "
	"\"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 5632, "
	"\"max_position_embeddings\": 2048, \"model_type\": \"llama\", "
	"\"num_attention_heads\": 32, \"num_hidden_layers\": 22, \"num_key_value_heads\": 4, "
	"\"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": null, "
	"\"rope_theta\": 10000.0, \"tie_word_embeddings\": false, "
	"\"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"vocab_size\": 32000}";

/* fp32 bit patterns from torch, see the file comment. */
static const uint32_t ref_llama32_1b[32] = {
	0x3f800000, 0x3f29e1c6, 0x3ee177bc, 0x3e959ee3,
	0x3e4693b0, 0x3e03c6a0, 0x3daee4ad, 0x3d681e67,
	0x3d1a08c8, 0x3ccc6f49, 0x3c87a9c3, 0x3c340d6d,
	0x3beef74f, 0x3b9e9402, 0x3b527720, 0x3aa9279b,
	0x39e13620, 0x38cb98f7, 0x37a3418d, 0x3758ac81,
	0x370fc8f8, 0x36bed4f4, 0x367d45c3, 0x3628126b,
	0x35df10c4, 0x359406cb, 0x35447610, 0x35025f34,
	0x34ad07a7, 0x3465a54d, 0x341864a7, 0x33ca41b0,
};
static const uint32_t ref_qwen25_05b[32] = {
	0x3f800000, 0x3f263de0, 0x3ed7e89b, 0x3e8c3504,
	0x3e361887, 0x3dec7fd6, 0x3d99940d, 0x3d47763f,
	0x3d0186e3, 0x3ca8398b, 0x3c5a7bf2, 0x3c0de12d,
	0x3bb8449c, 0x3b6f520e, 0x3b1b690d, 0x3ac9d75c,
	0x3a83126f, 0x3a2a3b44, 0x39dd1725, 0x398f9272,
	0x393a7753, 0x38f22ce2, 0x389d43a4, 0x384c3fbe,
	0x3804a2b2, 0x37ac431d, 0x375fba4f, 0x371148e3,
	0x36bcb0c1, 0x36751070, 0x361f23e4, 0x35ceaf79,
};
static const uint32_t ref_llama31_8b[64] = {
	0x3f800000, 0x3f508ac1, 0x3f29e1c6, 0x3f0a6384,
	0x3ee177bc, 0x3eb7ab7d, 0x3e959ee3, 0x3e73c461,
	0x3e4693b0, 0x3e21c3a0, 0x3e03c6a0, 0x3dd6b19c,
	0x3daee4ad, 0x3d8e7898, 0x3d681e67, 0x3d3d1684,
	0x3d1a08c8, 0x3cfaf53f, 0x3ccc6f49, 0x3ca68939,
	0x3c87a9c3, 0x3c5d06ec, 0x3c340d6d, 0x3c12ac7f,
	0x3beef74f, 0x3bc2aa76, 0x3b9e9402, 0x3b812e35,
	0x3b527720, 0x3b0dfd06, 0x3ab3d11d, 0x3a60979e,
	0x3a0995d2, 0x39a3f108, 0x393b2dd2, 0x38c86886,
	0x38a3418d, 0x3884fdbf, 0x3858ac81, 0x38308199,
	0x380fc8f8, 0x37ea426f, 0x37bed4f4, 0x379b7475,
	0x377d45c3, 0x374e51f5, 0x3728126b, 0x3708ea0f,
	0x36df10c4, 0x36b5b687, 0x369406cb, 0x36712b80,
	0x36447610, 0x36200a69, 0x36025f34, 0x35d46808,
	0x35ad07a7, 0x358cf400, 0x3565a54d, 0x353b12c7,
	0x351864a7, 0x34f848c2, 0x34ca41b0, 0x34a4c2ff,
};

static struct model_config parse_ok(const char *text)
{
	struct model_config c;
	struct eng_error err = { 0 };

	memset(&c, 0xa5, sizeof(c));
	ck_assert_msg(model_config_parse(text, &c, &err) == 0, "%s", err.msg);
	return c;
}

/* Parse must fail with -EINVAL and a message containing `key`. */
static void parse_bad(const char *text, const char *key)
{
	struct model_config c, before;
	struct eng_error err = { 0 };

	memset(&c, 0x5a, sizeof(c));
	before = c;
	ck_assert_int_eq(model_config_parse(text, &c, &err), -EINVAL);
	ck_assert_int_eq(err.code, -EINVAL);
	ck_assert_msg(strstr(err.msg, key), "expected '%s' in '%s'", key, err.msg);
	ck_assert_int_eq(memcmp(&c, &before, sizeof(c)), 0);   /* untouched */
}

/* A minimal config of `model_type` with one key set to `val` (raw JSON)
 * or removed (val NULL). */
static char *minimal(const char *model_type, const char *key, const char *val)
{
	json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "model_type", model_type,
			      "vocab_size", 1000, "hidden_size", 64, "intermediate_size", 128,
			      "num_hidden_layers", 2, "num_attention_heads", 4);
	char *s;

	ck_assert_ptr_nonnull(o);
	if (key && val)
		json_object_set_new(o, key, json_loads(val, JSON_DECODE_ANY, NULL));
	else if (key)
		json_object_del(o, key);
	s = json_dumps(o, 0);
	json_decref(o);
	return s;
}

static void assert_same(const struct model_config *a, const struct model_config *b)
{
	ck_assert_int_eq(a->arch, b->arch);
	ck_assert_str_eq(a->model_type, b->model_type);
	ck_assert_int_eq(a->vocab_size, b->vocab_size);
	ck_assert_int_eq(a->hidden_size, b->hidden_size);
	ck_assert_int_eq(a->intermediate_size, b->intermediate_size);
	ck_assert_int_eq(a->num_layers, b->num_layers);
	ck_assert_int_eq(a->num_heads, b->num_heads);
	ck_assert_int_eq(a->num_kv_heads, b->num_kv_heads);
	ck_assert_int_eq(a->head_dim, b->head_dim);
	ck_assert_int_eq(a->max_position_embeddings, b->max_position_embeddings);
	ck_assert(a->rms_norm_eps == b->rms_norm_eps);
	ck_assert(a->rope_theta == b->rope_theta);
	ck_assert_int_eq(a->tie_word_embeddings, b->tie_word_embeddings);
	ck_assert_int_eq(a->attention_bias, b->attention_bias);
	ck_assert_int_eq(a->o_proj_bias, b->o_proj_bias);
	ck_assert_int_eq(a->qk_norm, b->qk_norm);
	ck_assert_int_eq(a->rope_llama3, b->rope_llama3);
	ck_assert(a->rope_factor == b->rope_factor);
	ck_assert(a->rope_low_freq_factor == b->rope_low_freq_factor);
	ck_assert(a->rope_high_freq_factor == b->rope_high_freq_factor);
	ck_assert_int_eq(a->rope_original_max_pos, b->rope_original_max_pos);
	ck_assert(a->initializer_range == b->initializer_range);
	ck_assert_int_eq(a->head, b->head);
	ck_assert_int_eq(a->num_labels, b->num_labels);
}

START_TEST(real_configs)
{
	struct model_config c;

	c = parse_ok(qwen25_05b);
	ck_assert_int_eq(c.arch, ARCH_QWEN2);
	ck_assert_str_eq(c.model_type, "qwen2");
	ck_assert_int_eq(c.vocab_size, 151936);
	ck_assert_int_eq(c.hidden_size, 896);
	ck_assert_int_eq(c.intermediate_size, 4864);
	ck_assert_int_eq(c.num_layers, 24);
	ck_assert_int_eq(c.num_heads, 14);
	ck_assert_int_eq(c.num_kv_heads, 2);
	ck_assert_int_eq(c.head_dim, 64);
	ck_assert_int_eq(c.max_position_embeddings, 32768);
	ck_assert(c.rms_norm_eps == 1e-6);
	ck_assert(c.rope_theta == 1e6);
	ck_assert(c.tie_word_embeddings);
	ck_assert(c.attention_bias && !c.o_proj_bias && !c.qk_norm && !c.rope_llama3);
	ck_assert(c.initializer_range == 0.02);

	c = parse_ok(llama32_1b);
	ck_assert_int_eq(c.arch, ARCH_LLAMA);
	ck_assert_int_eq(c.vocab_size, 128256);
	ck_assert_int_eq(c.num_layers, 16);
	ck_assert_int_eq(c.num_heads, 32);
	ck_assert_int_eq(c.num_kv_heads, 8);
	ck_assert_int_eq(c.head_dim, 64);
	ck_assert_int_eq(c.max_position_embeddings, 131072);
	ck_assert(c.rms_norm_eps == 1e-5);
	ck_assert(c.rope_theta == 500000.0);
	ck_assert(c.tie_word_embeddings && !c.attention_bias && !c.o_proj_bias && !c.qk_norm);
	ck_assert(c.rope_llama3);
	ck_assert(c.rope_factor == 32.0 && c.rope_low_freq_factor == 1.0 &&
		  c.rope_high_freq_factor == 4.0);
	ck_assert_int_eq(c.rope_original_max_pos, 8192);

	c = parse_ok(qwen3_06b);
	ck_assert_int_eq(c.arch, ARCH_QWEN3);
	ck_assert_int_eq(c.hidden_size, 1024);
	ck_assert_int_eq(c.num_heads, 16);
	ck_assert_int_eq(c.head_dim, 128);   /* H * D = 2048 != C */
	ck_assert_int_eq(c.max_position_embeddings, 40960);
	ck_assert(c.rope_theta == 1e6);      /* an integer in the JSON */
	ck_assert(c.qk_norm && !c.attention_bias && !c.o_proj_bias && !c.rope_llama3);

	c = parse_ok(mistral_7b_v03);
	ck_assert_int_eq(c.arch, ARCH_MISTRAL);
	ck_assert_int_eq(c.head_dim, 128);
	ck_assert_int_eq(c.num_kv_heads, 8);
	ck_assert(!c.tie_word_embeddings && !c.attention_bias && !c.qk_norm);

	c = parse_ok(tinyllama);
	ck_assert_int_eq(c.head_dim, 64);    /* 2048 / 32 */
	ck_assert_int_eq(c.num_kv_heads, 4);
	ck_assert(!c.rope_llama3);

	parse_bad(mistral_7b_v01, "sliding_window");
}
END_TEST

START_TEST(defaults)
{
	struct model_config c;
	char *s;

	s = minimal("llama", NULL, NULL);
	c = parse_ok(s);
	free(s);
	ck_assert_int_eq(c.num_kv_heads, 4);
	ck_assert_int_eq(c.head_dim, 16);
	ck_assert_int_eq(c.max_position_embeddings, 2048);
	ck_assert(c.rms_norm_eps == 1e-6);
	ck_assert(c.rope_theta == 10000.0);
	ck_assert(!c.tie_word_embeddings && !c.attention_bias && !c.o_proj_bias);
	ck_assert(!c.qk_norm && !c.rope_llama3);
	ck_assert(c.initializer_range == 0.02);
	ck_assert(c.rope_factor == 0 && c.rope_original_max_pos == 0);

	s = minimal("qwen2", NULL, NULL);
	c = parse_ok(s);
	free(s);
	ck_assert(c.attention_bias && !c.o_proj_bias);
	ck_assert_int_eq(c.max_position_embeddings, 32768);

	/* Qwen3Config's default head_dim is 128, not hidden_size / heads. */
	s = minimal("qwen3", NULL, NULL);
	c = parse_ok(s);
	free(s);
	ck_assert(c.qk_norm && !c.attention_bias);
	ck_assert_int_eq(c.head_dim, 128);

	s = minimal("mistral", NULL, NULL);
	c = parse_ok(s);
	free(s);
	ck_assert_int_eq(c.max_position_embeddings, 131072);

	/* Nulls count as absent. */
	s = minimal("llama", "num_key_value_heads", "null");
	c = parse_ok(s);
	free(s);
	ck_assert_int_eq(c.num_kv_heads, 4);

	/* llama / qwen3 attention_bias: q/k/v and o_proj. */
	s = minimal("llama", "attention_bias", "true");
	c = parse_ok(s);
	free(s);
	ck_assert(c.attention_bias && c.o_proj_bias);
	s = minimal("qwen3", "attention_bias", "true");
	c = parse_ok(s);
	free(s);
	ck_assert(c.attention_bias && c.o_proj_bias);
	s = minimal("mistral", "attention_bias", "true");
	c = parse_ok(s);
	free(s);
	ck_assert(!c.attention_bias && !c.o_proj_bias);

	/* rope_scaling variants that are accepted. */
	s = minimal("llama", "rope_scaling", "{\"type\": \"default\"}");
	c = parse_ok(s);
	free(s);
	ck_assert(!c.rope_llama3);
	s = minimal("llama", "rope_scaling", "{\"type\": \"llama3\", \"factor\": 8, "
		    "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
		    "\"original_max_position_embeddings\": 8192}");
	c = parse_ok(s);
	free(s);
	ck_assert(c.rope_llama3 && c.rope_factor == 8.0);
	/* transformers 5 layout: rope_parameters holds the theta too. */
	s = minimal("llama", "rope_parameters", "{\"rope_type\": \"default\", "
		    "\"rope_theta\": 250000.0}");
	c = parse_ok(s);
	free(s);
	ck_assert(c.rope_theta == 250000.0 && !c.rope_llama3);
	/* A window that never masks anything is accepted. */
	s = minimal("mistral", "sliding_window", "131072");
	c = parse_ok(s);
	free(s);
	s = minimal("qwen2", "sliding_window", "4096");   /* use_sliding_window false */
	c = parse_ok(s);
	free(s);
}
END_TEST

START_TEST(errors)
{
	static const char *const required[] = {
		"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
		"num_attention_heads",
	};
	static const struct { const char *key, *val, *expect; } bad[] = {
		{ "hidden_size", "0", "hidden_size" },
		{ "vocab_size", "-5", "vocab_size" },
		{ "intermediate_size", "\"4864\"", "intermediate_size" },
		{ "num_hidden_layers", "2.5", "num_hidden_layers" },
		{ "num_key_value_heads", "3", "num_key_value_heads" },   /* 4 % 3 */
		{ "num_key_value_heads", "0", "num_key_value_heads" },
		{ "head_dim", "15", "head_dim" },                        /* odd */
		{ "hidden_size", "66", "hidden_size" },                  /* 66 % 4, no head_dim */
		/* head_dim's default 5312 / 4 = 1328 > MODEL_MAX_HEAD_DIM, as an
		 * explicit head_dim would be (tests/fuzz/fuzz_model_config found
		 * the config accepted, and refused once written back) */
		{ "hidden_size", "5312", "head_dim: not given, and its default 1328" },
		{ "rms_norm_eps", "0", "rms_norm_eps" },
		{ "rope_theta", "-1", "rope_theta" },
		{ "tie_word_embeddings", "1", "tie_word_embeddings" },
		{ "hidden_act", "\"gelu\"", "hidden_act" },
		{ "mlp_bias", "true", "mlp_bias" },
		{ "max_position_embeddings", "0", "max_position_embeddings" },
		{ "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 2.0}",
		  "rope_scaling.rope_type: 'linear'" },
		{ "rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0}", "rope_scaling.type: 'yarn'" },
		{ "rope_scaling", "{\"factor\": 4.0}", "rope_scaling.type" },
		{ "rope_scaling", "[1]", "rope_scaling" },
		{ "rope_scaling", "{\"rope_type\": \"llama3\", \"low_freq_factor\": 1, "
		  "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}",
		  "rope_scaling.factor" },
		{ "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8, "
		  "\"low_freq_factor\": 1, \"high_freq_factor\": 4}",
		  "rope_scaling.original_max_position_embeddings" },
		{ "rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8, "
		  "\"low_freq_factor\": 4, \"high_freq_factor\": 4, "
		  "\"original_max_position_embeddings\": 8192}", "rope_scaling.high_freq_factor" },
		{ "sliding_window", "\"x\"", "sliding_window" },
	};
	struct model_config c;
	struct eng_error err = { 0 };
	char *s;
	size_t i;

	for (i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
		s = minimal("llama", required[i], NULL);
		parse_bad(s, required[i]);
		free(s);
	}
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		s = minimal("llama", bad[i].key, bad[i].val);
		parse_bad(s, bad[i].expect);
		free(s);
	}
	s = minimal("qwen2", "use_sliding_window", "true");   /* window 4096 < 32768 */
	{
		json_t *o = json_loads(s, 0, NULL);

		free(s);
		json_object_set_new(o, "sliding_window", json_integer(4096));
		s = json_dumps(o, 0);
		json_decref(o);
	}
	parse_bad(s, "sliding_window");
	free(s);
	s = minimal("gpt2", NULL, NULL);
	parse_bad(s, "model_type: 'gpt2' is not supported (supported: llama, qwen2, qwen3, "
		  "mistral, qwen3_moe, qwen2_moe, mixtral, olmoe)");
	free(s);
	s = minimal("llama", "model_type", NULL);
	parse_bad(s, "model_type");
	free(s);
	parse_bad("{\"model_type\": \"llama\",", "config.json");
	parse_bad("[]", "config.json");
	ck_assert_int_eq(model_config_parse("{}", &c, NULL), -EINVAL);
	ck_assert_int_eq(model_config_parse("{}", &c, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "model_type"));
}
END_TEST

START_TEST(json_round_trip)
{
	const char *const configs[] = {
		qwen25_05b, llama32_1b, qwen3_06b, mistral_7b_v03, tinyllama,
	};
	const char *const arch[] = {
		"Qwen2ForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM",
		"MistralForCausalLM", "LlamaForCausalLM",
	};
	size_t i;

	for (i = 0; i < sizeof(configs) / sizeof(configs[0]); i++) {
		struct model_config a = parse_ok(configs[i]), b;
		char *text = model_config_to_json(&a);
		json_t *o;

		ck_assert_ptr_nonnull(text);
		b = parse_ok(text);
		assert_same(&a, &b);
		o = json_loads(text, 0, NULL);
		ck_assert_ptr_nonnull(o);
		ck_assert_str_eq(json_string_value(json_array_get(json_object_get(o,
				 "architectures"), 0)), arch[i]);
		ck_assert_str_eq(json_string_value(json_object_get(o, "torch_dtype")), "float32");
		ck_assert_int_eq(json_integer_value(json_object_get(o, "num_key_value_heads")),
				 a.num_kv_heads);
		ck_assert_int_eq(json_integer_value(json_object_get(o, "head_dim")), a.head_dim);
		ck_assert(json_is_boolean(json_object_get(o, "tie_word_embeddings")));
		if (a.rope_llama3)
			ck_assert_str_eq(json_string_value(json_object_get(json_object_get(o,
					 "rope_scaling"), "rope_type")), "llama3");
		else
			ck_assert(json_is_null(json_object_get(o, "rope_scaling")));
		json_decref(o);
		/* Shortest round-tripping form of the reals. */
		ck_assert_msg(strstr(text, "\"rms_norm_eps\": 1e-") && !strstr(text, "9999"),
			      "%s", text);
		ck_assert_ptr_nonnull(strstr(text, "\"initializer_range\": 0.02,"));
		free(text);
	}
}
END_TEST

/* What transformers 5.10.4 writes for a value model's head: the
 * config.json of save_pretrained on
 *   AutoModelForTokenClassification.from_config(LlamaConfig(vocab_size=64,
 *       hidden_size=16, intermediate_size=32, num_hidden_layers=1,
 *       num_attention_heads=2, num_labels=1))
 * (build/venv-verl's python), whole. */
static const char hf_llama_token_cls[] =
	"{\"architectures\": [\"LlamaForTokenClassification\"], \"attention_bias\": false,"
	" \"attention_dropout\": 0.0, \"bos_token_id\": 1, \"dtype\": \"float32\","
	" \"eos_token_id\": 2, \"head_dim\": 8, \"hidden_act\": \"silu\", \"hidden_size\": 16,"
	" \"id2label\": {\"0\": \"LABEL_0\"}, \"initializer_range\": 0.02,"
	" \"intermediate_size\": 32, \"label2id\": {\"LABEL_0\": 0},"
	" \"max_position_embeddings\": 2048, \"mlp_bias\": false, \"model_type\": \"llama\","
	" \"num_attention_heads\": 2, \"num_hidden_layers\": 1, \"num_key_value_heads\": 2,"
	" \"pad_token_id\": null, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-06,"
	" \"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"},"
	" \"tie_word_embeddings\": false, \"transformers_version\": \"5.10.4\","
	" \"use_cache\": true, \"vocab_size\": 64}";

/* model_config_set_head must refuse with -EINVAL, a message containing
 * `want`, and leave the config as it was. */
static void head_bad(const char *text, bool value_model, const char *want)
{
	struct model_config c = parse_ok(text), before = c;
	struct eng_error err = { 0 };

	ck_assert_int_eq(model_config_set_head(&c, value_model, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, want), "expected '%s' in '%s'", want, err.msg);
	ck_assert_int_eq(memcmp(&c, &before, sizeof(c)), 0);
}

/* A minimal config of `model_type` naming class `arch` (NULL: no
 * architectures), with `key` set to raw JSON `val` (key NULL: none). */
static char *with_arch(const char *model_type, const char *arch, const char *key,
		       const char *val)
{
	char *s = minimal(model_type, key, val), *out;
	json_t *o = json_loads(s, 0, NULL);

	free(s);
	ck_assert_ptr_nonnull(o);
	if (arch)
		json_object_set_new(o, "architectures", json_pack("[s]", arch));
	out = json_dumps(o, 0);
	json_decref(o);
	return out;
}

START_TEST(value_head)
{
	static const char *const fam[][3] = {
		{ "llama", "LlamaForCausalLM", "LlamaForTokenClassification" },
		{ "mistral", "MistralForCausalLM", "MistralForTokenClassification" },
		{ "qwen2", "Qwen2ForCausalLM", "Qwen2ForTokenClassification" },
		{ "qwen3", "Qwen3ForCausalLM", "Qwen3ForTokenClassification" },
	};
	json_t *hf = json_loads(hf_llama_token_cls, 0, NULL);
	struct eng_error err = { 0 };
	struct model_config c;
	size_t i;
	char *s;

	ck_assert_ptr_nonnull(hf);
	/* transformers' own value-model config: one label, reloads as a value
	 * model and is refused as a language model. */
	c = parse_ok(hf_llama_token_cls);
	ck_assert_int_eq(c.head, MODEL_HEAD_TOKEN_CLS);
	ck_assert_int_eq(c.num_labels, 1);
	ck_assert(c.rope_theta == 10000.0 && c.head_dim == 8);
	head_bad(hf_llama_token_cls, false, "architectures[0]: LlamaForTokenClassification is a "
		 "value model's class (a score head, no lm_head); initialize it with "
		 "model_type value_model");
	ck_assert_int_eq(model_config_set_head(&c, true, &err), 0);

	for (i = 0; i < sizeof(fam) / sizeof(fam[0]); i++) {
		/* Each family, from a config naming no head and one naming the
		 * causal LM (verl's critic built from the actor's directory). */
		for (int from = 0; from < 2; from++) {
			struct model_config v, lm, back;
			json_t *o;
			char *text;

			s = with_arch(fam[i][0], from ? fam[i][1] : NULL, NULL, NULL);
			v = lm = parse_ok(s);
			free(s);
			ck_assert_int_eq(v.head, from ? MODEL_HEAD_CAUSAL_LM : MODEL_HEAD_UNSTATED);
			ck_assert_int_eq(model_config_set_head(&v, true, &err), 0);
			ck_assert_int_eq(model_config_set_head(&lm, false, &err), 0);

			/* Value model: transformers' class and label fields, as
			 * it writes them (hf_llama_token_cls). */
			text = model_config_to_json(&v);
			ck_assert_ptr_nonnull(text);
			o = json_loads(text, 0, NULL);
			ck_assert_ptr_nonnull(o);
			ck_assert_int_eq(json_array_size(json_object_get(o, "architectures")), 1);
			ck_assert_str_eq(json_string_value(json_array_get(json_object_get(o,
					 "architectures"), 0)), fam[i][2]);
			ck_assert(json_equal(json_object_get(o, "id2label"),
					     json_object_get(hf, "id2label")));
			ck_assert(json_equal(json_object_get(o, "label2id"),
					     json_object_get(hf, "label2id")));
			json_decref(o);
			/* ... which engined reads back as a value model. */
			back = parse_ok(text);
			free(text);
			ck_assert_int_eq(back.head, MODEL_HEAD_TOKEN_CLS);
			ck_assert_int_eq(back.num_labels, 1);
			ck_assert_int_eq(model_config_set_head(&back, true, &err), 0);
			assert_same(&v, &back);

			/* Language model: the causal LM's class, no labels. */
			text = model_config_to_json(&lm);
			ck_assert_ptr_nonnull(text);
			o = json_loads(text, 0, NULL);
			ck_assert_str_eq(json_string_value(json_array_get(json_object_get(o,
					 "architectures"), 0)), fam[i][1]);
			ck_assert_ptr_null(json_object_get(o, "id2label"));
			ck_assert_ptr_null(json_object_get(o, "label2id"));
			json_decref(o);
			back = parse_ok(text);
			free(text);
			ck_assert_int_eq(back.head, MODEL_HEAD_CAUSAL_LM);
			ck_assert_int_eq(model_config_set_head(&back, false, &err), 0);
			assert_same(&lm, &back);
		}
	}

	/* Labels as transformers counts them: id2label's entries first, then
	 * num_labels, else 2. */
	s = with_arch("qwen2", "Qwen2ForTokenClassification", "num_labels", "1");
	c = parse_ok(s);
	ck_assert_int_eq(c.num_labels, 1);
	ck_assert_int_eq(model_config_set_head(&c, true, &err), 0);
	free(s);
	s = with_arch("qwen2", "Qwen2ForTokenClassification", "id2label",
		      "{\"0\": \"a\", \"1\": \"b\", \"2\": \"c\"}");
	head_bad(s, true, "id2label: 3 labels (Qwen2ForTokenClassification); engined's value "
		 "head has one output (num_labels 1)");
	free(s);
	s = with_arch("qwen3", "Qwen3ForTokenClassification", "num_labels", "2");
	head_bad(s, true, "num_labels: 2 labels (Qwen3ForTokenClassification)");
	free(s);
	s = with_arch("mistral", "MistralForTokenClassification", NULL, NULL);
	head_bad(s, true, "id2label: absent (and no num_labels), so MistralForTokenClassification "
		 "has transformers' default of 2 labels; engined's value head has one output");
	free(s);
	s = with_arch("llama", "LlamaForTokenClassification", "num_labels", "1");
	head_bad(s, false, "architectures[0]: LlamaForTokenClassification is a value model's "
		 "class");
	free(s);
	/* A class engined does not name states no head; labels are read only
	 * for *ForTokenClassification. */
	s = with_arch("llama", "LlamaForSequenceClassification", "id2label", "{\"0\": \"a\", "
		      "\"1\": \"b\"}");
	c = parse_ok(s);
	ck_assert_int_eq(c.head, MODEL_HEAD_UNSTATED);
	ck_assert_int_eq(c.num_labels, 0);
	free(s);
	s = with_arch("llama", "LlamaForCausalLM", "id2label", "7");
	c = parse_ok(s);
	ck_assert_int_eq(model_config_set_head(&c, true, &err), 0);
	free(s);

	/* What parse refuses (the key named, nothing written). */
	s = minimal("llama", "architectures", "\"LlamaForCausalLM\"");
	parse_bad(s, "architectures: must be an array of strings or null");
	free(s);
	s = minimal("llama", "architectures", "[\"LlamaForCausalLM\", 3]");
	parse_bad(s, "architectures[1]: must be a string");
	free(s);
	s = with_arch("llama", "Qwen2ForTokenClassification", "num_labels", "1");
	parse_bad(s, "architectures[0]: 'Qwen2ForTokenClassification' is a qwen2 class, "
		  "model_type is 'llama' (LlamaForCausalLM or LlamaForTokenClassification)");
	free(s);
	static const struct { const char *key, *val, *expect; } labels_bad[] = {
		{ "id2label", "[\"LABEL_0\"]", "id2label: must be an object of 1 to 1024 labels" },
		{ "id2label", "{}", "id2label: must be an object of 1 to 1024 labels" },
		{ "num_labels", "0", "num_labels: 0, must be in [1, 1024]" },
		{ "num_labels", "1025", "num_labels: 1025, must be in [1, 1024]" },
		{ "num_labels", "\"1\"", "num_labels: must be an integer" },
	};
	for (i = 0; i < sizeof(labels_bad) / sizeof(labels_bad[0]); i++) {
		s = with_arch("llama", "LlamaForTokenClassification", labels_bad[i].key,
			      labels_bad[i].val);
		parse_bad(s, labels_bad[i].expect);
		free(s);
	}
	json_decref(hf);
}
END_TEST

/* engine_init_config_check holds an hf_config_json's head against the
 * init config's model_type, as the engine does for a model directory. */
START_TEST(init_check_head)
{
	struct engine_init_config ic;
	struct eng_error err = { 0 };

	engine_init_config_defaults(&ic);
	ic.hf_config_json = hf_llama_token_cls;
	ic.model_type = "language_model";
	ck_assert_int_eq(engine_init_config_check(&ic, &err), -EINVAL);
	ck_assert_msg(strstr(err.msg, "hf_config_json: architectures[0]: "
			     "LlamaForTokenClassification is a value model's class"), "%s", err.msg);
	ic.model_type = "value_model";
	eng_error_clear(&err);
	ck_assert_msg(engine_init_config_check(&ic, &err) == 0, "%s", err.msg);
}
END_TEST

static void check_inv_freq(const char *text, const uint32_t *ref, int n)
{
	struct model_config c = parse_ok(text);
	float got[64];
	int i, exact = 0;

	ck_assert_int_eq(c.head_dim / 2, n);
	model_config_rope_inv_freq(&c, got);
	for (i = 0; i < n; i++) {
		float want;
		int32_t gb, wb;

		memcpy(&want, &ref[i], 4);
		memcpy(&gb, &got[i], 4);
		memcpy(&wb, &want, 4);
		/* torch's float pow (Sleef, 1 ulp) and ours (double pow rounded
		 * once) may differ by an ulp; the llama3 arithmetic that follows
		 * can carry that to 2. */
		ck_assert_msg(abs(gb - wb) <= 2, "inv_freq[%d] = %a, torch %a", i, got[i], want);
		exact += gb == wb;
	}
	ck_assert_int_ge(exact, n * 3 / 4);
}

START_TEST(rope_inv_freq)
{
	char *s;

	check_inv_freq(llama32_1b, ref_llama32_1b, 32);
	check_inv_freq(qwen25_05b, ref_qwen25_05b, 32);
	s = strdup(llama32_1b);   /* Llama-3.1-8B: factor 8, head_dim 128 */
	memcpy(strstr(s, "\"factor\": 32.0"), "\"factor\":  8.0", 14);
	memcpy(strstr(s, "\"head_dim\": 64,"), "\"head_dim\":128,", 15);
	check_inv_freq(s, ref_llama31_8b, 64);
	free(s);
}
END_TEST

/* The parameter table of real models: their parameter counts as the
 * published checkpoints have them (summed here by hand from the shapes:
 * Qwen2.5-0.5B 151936 x 896 embedding + 24 x 14,912,384 + 896 =
 * 494,032,768; Qwen3-0.6B 151936 x 1024 + 28 x 15,730,944 + 1024 =
 * 596,049,920), every tensor trainable and held whole, each after the
 * last. */
static void table_total(const char *json, int64_t want_total, int64_t want_count)
{
	struct model_config c = parse_ok(json);
	struct param_table t;
	struct eng_error err = {0};
	int64_t off = 0;

	ck_assert_int_eq(param_table_build(&c, false, &t, &err), 0);
	ck_assert_int_eq(t.total, want_total);
	ck_assert_int_eq(t.count, want_count);
	for (int64_t i = 0; i < t.count; i++) {
		const struct param_entry *e = &t.entries[i];

		ck_assert_int_eq(e->offset, off);
		ck_assert_int_eq(e->role, PARAM_TRAINABLE);
		ck_assert_int_eq(e->held_start, 0);
		ck_assert_int_eq(e->held_numel, e->numel);
		off += e->numel;
	}
	ck_assert_int_eq(param_table_find(&t, "model.layers.23.mlp.down_proj.weight") >= 0, 1);
	ck_assert_int_eq(param_table_find(&t, "lm_head.weight"), -1);  /* tied */
	param_table_free(&t);
}

/* Qwen/Qwen3-30B-A3B's config.json (trimmed of bos/eos/use_cache and
 * torch_dtype), and mistralai/Mixtral-8x7B-v0.1's. */
static const char qwen3_30b_a3b[] =
	"{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false,"
	" \"attention_dropout\": 0.0, \"decoder_sparse_step\": 1, \"head_dim\": 128,"
	" \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02,"
	" \"intermediate_size\": 6144, \"max_position_embeddings\": 40960,"
	" \"max_window_layers\": 48, \"mlp_only_layers\": [], \"model_type\": \"qwen3_moe\","
	" \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"
	" \"num_attention_heads\": 32, \"num_experts\": 128, \"num_experts_per_tok\": 8,"
	" \"num_hidden_layers\": 48, \"num_key_value_heads\": 4,"
	" \"output_router_logits\": false, \"rms_norm_eps\": 1e-06, \"rope_scaling\": null,"
	" \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001,"
	" \"sliding_window\": null, \"tie_word_embeddings\": false,"
	" \"use_sliding_window\": false, \"vocab_size\": 151936}";
static const char mixtral_8x7b[] =
	"{\"architectures\": [\"MixtralForCausalLM\"], \"attention_dropout\": 0.0,"
	" \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
	" \"intermediate_size\": 14336, \"max_position_embeddings\": 32768,"
	" \"model_type\": \"mixtral\", \"num_attention_heads\": 32,"
	" \"num_experts_per_tok\": 2, \"num_hidden_layers\": 32,"
	" \"num_key_value_heads\": 8, \"num_local_experts\": 8,"
	" \"output_router_logits\": false, \"rms_norm_eps\": 1e-05,"
	" \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.02,"
	" \"sliding_window\": null, \"tie_word_embeddings\": false, \"vocab_size\": 32000}";

/* Qwen/Qwen1.5-MoE-A2.7B's config.json and allenai/OLMoE-1B-7B-0924's
 * (trimmed of bos/eos/use_cache and torch_dtype). */
static const char qwen15_moe_a27b[] =
	"{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"attention_dropout\": 0.0,"
	" \"decoder_sparse_step\": 1, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"
	" \"initializer_range\": 0.02, \"intermediate_size\": 5632,"
	" \"max_position_embeddings\": 8192, \"max_window_layers\": 21,"
	" \"model_type\": \"qwen2_moe\", \"moe_intermediate_size\": 1408,"
	" \"norm_topk_prob\": false, \"num_attention_heads\": 16, \"num_experts\": 60,"
	" \"num_experts_per_tok\": 4, \"num_hidden_layers\": 24, \"num_key_value_heads\": 16,"
	" \"output_router_logits\": false, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
	" \"router_aux_loss_coef\": 0.001, \"shared_expert_intermediate_size\": 5632,"
	" \"sliding_window\": 32768, \"tie_word_embeddings\": false,"
	" \"use_sliding_window\": false, \"vocab_size\": 151936}";
static const char olmoe_1b_7b[] =
	"{\"architectures\": [\"OlmoeForCausalLM\"], \"attention_bias\": false,"
	" \"attention_dropout\": 0.0, \"clip_qkv\": null, \"hidden_act\": \"silu\","
	" \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 1024,"
	" \"max_position_embeddings\": 4096, \"model_type\": \"olmoe\", \"norm_topk_prob\": false,"
	" \"num_attention_heads\": 16, \"num_experts\": 64, \"num_experts_per_tok\": 8,"
	" \"num_hidden_layers\": 16, \"num_key_value_heads\": 16,"
	" \"output_router_logits\": false, \"pad_token_id\": 1, \"rms_norm_eps\": 1e-05,"
	" \"rope_scaling\": null, \"rope_theta\": 10000.0, \"router_aux_loss_coef\": 0.01,"
	" \"tie_word_embeddings\": false, \"vocab_size\": 50304}";

/* key: value replaced in (or added to) a config's text. */
static char *with_key(const char *json, const char *key, const char *val)
{
	json_t *o = json_loads(json, 0, NULL), *v = json_loads(val, JSON_DECODE_ANY, NULL);
	char *text;

	ck_assert(o && v);
	json_object_set_new(o, key, v);
	text = json_dumps(o, 0);
	json_decref(o);
	return text;
}

/* Mixture-of-experts configs: the experts read with transformers'
 * defaults, the layers' kinds, the table's size (30.5B and 46.7B, the
 * models' published counts), written back to what parses the same; the
 * refusals name the key. */
START_TEST(experts)
{
	struct model_config q = parse_ok(qwen3_30b_a3b), m = parse_ok(mixtral_8x7b), back;
	static const struct { const char *key, *val, *expect; } bad[] = {
		{ "num_experts_per_tok", "65", "num_experts_per_tok: 65, must be in [1, 64]" },
		{ "num_experts", "4", "num_experts_per_tok: 8, more than num_experts 4" },
		{ "num_experts_per_tok", "0", "num_experts_per_tok" },
		{ "num_experts", "0", "num_experts" },
		{ "router_aux_loss_coef", "-0.1", "router_aux_loss_coef" },
		{ "mlp_only_layers", "[48]", "mlp_only_layers[0]" },
		{ "mlp_only_layers", "3", "mlp_only_layers" },
		{ "decoder_sparse_step", "0", "decoder_sparse_step" },
		{ "scoring_func", "\"sigmoid\"", "scoring_func" },
		{ "topk_group", "4", "topk_group" },
	};
	char *text, *t2;

	ck_assert_int_eq(q.arch, ARCH_QWEN3_MOE);
	ck_assert(q.qk_norm && q.norm_topk_prob && q.mlp == MODEL_MLP_MOE);
	ck_assert_int_eq(q.num_experts, 128);
	ck_assert_int_eq(q.experts_per_tok, 8);
	ck_assert_int_eq(q.moe_intermediate_size, 768);
	ck_assert(model_has_experts(&q) && !model_has_dense(&q));
	ck_assert_int_eq(m.arch, ARCH_MIXTRAL);
	ck_assert(m.norm_topk_prob && !m.attention_bias);
	ck_assert_int_eq(m.num_experts, 8);
	ck_assert_int_eq(m.moe_intermediate_size, 14336);
	ck_assert(m.router_aux_loss_coef == 0.02);
	for (int k = 0; k < 2; k++) {
		struct param_table t;
		struct eng_error err = {0};

		ck_assert_int_eq(param_table_build(k ? &m : &q, false, &t, &err), 0);
		ck_assert_int_eq(t.total, k ? INT64_C(46702792704) : INT64_C(30532122624));
		ck_assert_int_eq(t.count, k ? 3 + 32 * (7 + 3 * 8) : 3 + 48 * (9 + 3 * 128));
		ck_assert(param_table_find(&t, k ? "model.layers.31.block_sparse_moe.gate.weight"
					       : "model.layers.47.mlp.gate.weight") >= 0);
		ck_assert(param_table_find(&t, k ? "model.layers.0.block_sparse_moe.experts.7.w2.weight"
					       : "model.layers.0.mlp.experts.127.down_proj.weight") >= 0);
		ck_assert_int_eq(param_table_find(&t, "model.layers.0.mlp.down_proj.weight"), -1);
		param_table_free(&t);
	}
	for (int k = 0; k < 2; k++) {
		text = model_config_to_json(k ? &m : &q);
		ck_assert_ptr_nonnull(text);
		back = parse_ok(text);
		ck_assert_int_eq(back.num_experts, k ? 8 : 128);
		ck_assert_int_eq(back.experts_per_tok, k ? 2 : 8);
		ck_assert_int_eq(back.moe_intermediate_size, k ? 14336 : 768);
		ck_assert(back.norm_topk_prob && back.router_aux_loss_coef ==
			  (k ? 0.02 : 0.001) && !back.output_router_logits);
		free(text);
	}
	/* a dense layer among sparse ones: listed, or off the step */
	text = with_key(qwen3_30b_a3b, "mlp_only_layers", "[0, 47]");
	t2 = with_key(text, "decoder_sparse_step", "2");
	q = parse_ok(t2);
	ck_assert_int_eq(model_layer_mlp(&q, 0), MODEL_MLP_DENSE);
	ck_assert_int_eq(model_layer_mlp(&q, 1), MODEL_MLP_MOE);
	ck_assert_int_eq(model_layer_mlp(&q, 2), MODEL_MLP_DENSE);
	ck_assert_int_eq(model_layer_mlp(&q, 47), MODEL_MLP_DENSE);
	ck_assert_int_eq(model_layer_mlp(&q, 45), MODEL_MLP_MOE);
	free(t2);
	t2 = model_config_to_json(&q);
	back = parse_ok(t2);
	ck_assert(!memcmp(back.dense_layers, q.dense_layers, sizeof(q.dense_layers)));
	ck_assert_int_eq(back.decoder_sparse_step, 2);
	free(t2);
	free(text);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		text = with_key(qwen3_30b_a3b, bad[i].key, bad[i].val);
		parse_bad(text, bad[i].expect);
		free(text);
	}
	/* the routers' auxiliary loss asked for: read and written back */
	text = with_key(qwen3_30b_a3b, "output_router_logits", "true");
	q = parse_ok(text);
	free(text);
	ck_assert(q.output_router_logits);
	text = model_config_to_json(&q);
	ck_assert(parse_ok(text).output_router_logits);
	free(text);
	text = with_key(mixtral_8x7b, "router_jitter_noise", "0.01");
	parse_bad(text, "router_jitter_noise");
	free(text);
	text = with_key(mixtral_8x7b, "sliding_window", "4096");
	parse_bad(text, "sliding_window");
	free(text);
}
END_TEST

/* qwen2_moe's shared expert and olmoe's whole-projection q/k norms: the
 * tables' sizes the models' published counts (14.3B, 6.92B), the keys
 * written back, the refusals (clip_qkv, a head_dim olmoe's norms do not
 * span, a value model of a family transformers gives no such class). */
START_TEST(experts_families)
{
	struct model_config q = parse_ok(qwen15_moe_a27b), o = parse_ok(olmoe_1b_7b), back;
	struct param_table t;
	struct eng_error err = {0};
	char *text;

	ck_assert_int_eq(q.arch, ARCH_QWEN2_MOE);
	ck_assert(q.attention_bias && !q.o_proj_bias && !q.qk_norm && !q.norm_topk_prob);
	ck_assert_int_eq(q.shared_expert_size, 5632);
	ck_assert_int_eq(q.moe_intermediate_size, 1408);
	ck_assert_int_eq(o.arch, ARCH_OLMOE);
	ck_assert_int_eq(o.qk_norm, MODEL_QK_NORM_PROJ);
	ck_assert(!o.attention_bias && !o.norm_topk_prob && o.shared_expert_size == 0);
	ck_assert_int_eq(o.moe_intermediate_size, 1024);
	ck_assert(o.router_aux_loss_coef == 0.01);
	ck_assert_int_eq(param_table_build(&o, false, &t, &err), 0);
	ck_assert_int_eq(t.total, INT64_C(6919161856));
	ck_assert_int_eq(t.count, 3 + 16 * (9 + 3 * 64));
	ck_assert_int_eq(t.entries[param_table_find(&t, "model.layers.0.self_attn.q_norm.weight")]
			 .numel, 2048);
	param_table_free(&t);
	ck_assert_int_eq(param_table_build(&q, false, &t, &err), 0);
	ck_assert_int_eq(t.total, INT64_C(14315784192));
	ck_assert_int_eq(t.count, 3 + 24 * (14 + 3 * 60));
	ck_assert_int_eq(t.entries[param_table_find(&t, "model.layers.23.mlp.shared_expert_gate"
						     ".weight")].numel, 2048);
	ck_assert(param_table_find(&t, "model.layers.0.mlp.shared_expert.down_proj.weight") >= 0);
	param_table_free(&t);
	for (int k = 0; k < 2; k++) {
		text = model_config_to_json(k ? &o : &q);
		back = parse_ok(text);
		ck_assert_int_eq(back.arch, k ? ARCH_OLMOE : ARCH_QWEN2_MOE);
		ck_assert_int_eq(back.shared_expert_size, k ? 0 : 5632);
		ck_assert_int_eq(back.qk_norm, k ? MODEL_QK_NORM_PROJ : MODEL_QK_NORM_NONE);
		ck_assert(back.attention_bias == !k && !back.norm_topk_prob);
		ck_assert_int_eq(back.num_experts, k ? 64 : 60);
		ck_assert_int_eq(back.pad_token_id, k ? 1 : -1);
		free(text);
	}
	text = with_key(qwen15_moe_a27b, "qkv_bias", "false");
	ck_assert(!parse_ok(text).attention_bias);
	free(text);
	/* pad_token_id: torch's padding_idx, negative from the end */
	ck_assert_int_eq(o.pad_token_id, 1);
	ck_assert_int_eq(q.pad_token_id, -1);
	text = with_key(olmoe_1b_7b, "pad_token_id", "-2");
	ck_assert_int_eq(parse_ok(text).pad_token_id, 50302);
	free(text);
	text = with_key(olmoe_1b_7b, "pad_token_id", "50304");
	parse_bad(text, "pad_token_id: must be null or a token id in [-50304, 50304)");
	free(text);
	text = with_key(olmoe_1b_7b, "pad_token_id", "null");
	ck_assert_int_eq(parse_ok(text).pad_token_id, -1);
	free(text);
	text = with_key(olmoe_1b_7b, "clip_qkv", "8.0");
	parse_bad(text, "clip_qkv");
	free(text);
	text = with_key(olmoe_1b_7b, "head_dim", "64");
	parse_bad(text, "head_dim: 64; olmoe's q_norm spans hidden_size 2048");
	free(text);
	ck_assert_int_eq(model_config_set_head(&o, true, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "no token-classification class for olmoe"));
	ck_assert_int_eq(model_config_set_head(&q, true, &err), 0);
}
END_TEST

START_TEST(param_table_of_real_models)
{
	struct model_config c = parse_ok(qwen25_05b);

	ck_assert_int_eq(model_layer_mlp(&c, 0), MODEL_MLP_DENSE);
	table_total(qwen25_05b, INT64_C(494032768), 2 + 24 * 12);
	table_total(qwen3_06b, INT64_C(596049920), 2 + 28 * 11);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, real_configs);
	tcase_add_test(tc, defaults);
	tcase_add_test(tc, errors);
	tcase_add_test(tc, json_round_trip);
	tcase_add_test(tc, value_head);
	tcase_add_test(tc, init_check_head);
	tcase_add_test(tc, rope_inv_freq);
	tcase_add_test(tc, param_table_of_real_models);
	tcase_add_test(tc, experts);
	tcase_add_test(tc, experts_families);
	suite_add_tcase(s, tc);
	return check_run(s);
}
