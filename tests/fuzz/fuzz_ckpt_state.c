/* fuzz_ckpt_state.c — libFuzzer harness: a checkpoint's engine_state.json
 * and `latest` as LoadCheckpoint reads them: ckpt_open
 * (engines/checkpoint/checkpoint.c: the JSON, its "files" entries checked
 * against the files, `latest` followed) and then the native engine's use
 * of the state (engines/native/native_ckpt.c, native_load_checkpoint:
 * engine key, contents, steps, RNG state, tensors).
 *
 * Set-up, once: a tiny native engine (llama, 1 layer, CPU, 1 thread) saves
 * a real checkpoint "ck" under a scratch parent; its engine_state.json is
 * kept. Input: byte 0: bits 0-2 the contents to load (0: all, as an empty
 * LoadCheckpointRequest.contents); bit 3 clear: the rest is ck's
 * engine_state.json and ck is loaded; bit 3 set: the rest is the parent's
 * `latest` (ck's state file restored) and the parent is loaded; bit 4
 * set (with bit 3 clear): the state text, when it parses as a JSON object,
 * is sealed first (ckpt_state_seal: format_version and state_xxh64 set, as
 * a save writes them), so that the schema checks behind the seal are
 * reached by mutated states, not only the seal check. Each
 * iteration loads into the same engine (a load changes only its weights
 * and steps, never what the next parse depends on).
 * FUZZ_VERBOSE=1 prints each load's outcome (to check seeds).
 * Seeds: tests/fuzz/corpus/fuzz_ckpt_state (the saved state file, edited
 * copies, `latest` files; tests/fuzz/make_corpus.py). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "checkpoint/checkpoint.h"
#include "engine.h"
#include "fuzz_util.h"

static const char micro_config[] =
	"{\"model_type\": \"llama\", \"vocab_size\": 16, \"hidden_size\": 8,"
	" \"intermediate_size\": 16, \"num_hidden_layers\": 1,"
	" \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
	" \"max_position_embeddings\": 64, \"tie_word_embeddings\": false}";

static struct engine *eng;
static char parent[PATH_MAX], ck[PATH_MAX], state_path[PATH_MAX], latest_path[PATH_MAX];
static char *saved_state;
static size_t saved_len;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct engine_init_config cfg;
	struct eng_error err = {0};
	size_t bytes = 0;
	FILE *f;
	long n;

	(void)argc;
	(void)argv;
	fuzz_join(parent, sizeof(parent), fuzz_scratch_dir(), "ckpts");
	fuzz_mkdir(parent);
	fuzz_join(ck, sizeof(ck), parent, "ck");
	fuzz_join(state_path, sizeof(state_path), ck, "engine_state.json");
	fuzz_join(latest_path, sizeof(latest_path), parent, "latest");
	engine_init_config_defaults(&cfg);
	cfg.hf_config_json = micro_config;
	cfg.seed = 5;
	cfg.threads = 1;
	FUZZ_CHECK(engine_create(&cfg, &eng, &err) == 0, "engine_create: %s", err.msg);
	FUZZ_CHECK(engine_save_checkpoint(eng, ck, 7, 0, CKPT_ALL, &bytes, &err) == 0,
		   "save: %s", err.msg);
	f = fopen(state_path, "rb");
	FUZZ_CHECK(f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0, "%s", state_path);
	saved_len = (size_t)n;
	saved_state = malloc(saved_len);
	rewind(f);
	FUZZ_CHECK(saved_state && fread(saved_state, 1, saved_len, f) == saved_len, "read");
	fclose(f);
	if (getenv("FUZZ_CKPT_PRINT_STATE"))   /* for make_corpus.py */
		fwrite(saved_state, 1, saved_len, stdout);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct eng_error err = {0};
	unsigned contents;
	int64_t step = -1;
	const char *dir;
	int rc;

	if (size < 1)
		return 0;
	contents = data[0] & 7;
	if (data[0] & 8) {
		fuzz_write_file(state_path, saved_state, saved_len);
		fuzz_write_file(latest_path, data + 1, size - 1);
		dir = parent;
	} else {
		json_t *j = (data[0] & 16) ? json_loadb((const char *)data + 1, size - 1, 0, NULL)
					   : NULL;
		char *text = NULL;

		if (json_is_object(j) && ckpt_state_seal(j, &err) == 0)
			text = json_dumps(j, JSON_COMPACT);
		if (text)
			fuzz_write_file(state_path, text, strlen(text));
		else
			fuzz_write_file(state_path, data + 1, size - 1);
		free(text);
		json_decref(j);
		eng_error_clear(&err);
		dir = ck;
	}
	rc = engine_load_checkpoint(eng, dir, contents, &step, &err);
	FUZZ_CHECK(rc <= 0, "engine_load_checkpoint returned %d", rc);
	FUZZ_CHECK(rc == 0 || rc == -ENOMEM || err.msg[0], "load: %d without a message", rc);
	if (getenv("FUZZ_VERBOSE"))
		fprintf(stderr, "load %s contents %u: %d step %lld %s\n", dir, contents, rc,
			(long long)step, err.msg);
	return 0;
}
