/* fuzz_safetensors.c — libFuzzer harness: safetensors files as the engine
 * reads a model directory or a checkpoint (engines/io/safetensors.c,
 * st_reader_open and the reads after it).
 *
 * Input: byte 0 even: the rest is one .safetensors file, opened by its
 * path. Byte 0 odd: a sharded model directory: bytes 1-2 (little-endian)
 * are the length L of model.safetensors.index.json, the next L bytes its
 * text, and the rest the shard "model-00001-of-00002.safetensors"; the
 * directory also holds a fixed valid shard "model-00002-of-00002.safetensors"
 * (one F32 tensor "b" [2]), and is opened as a directory.
 * For a file that opens, every tensor is looked up by name and read as
 * fp32, and a read with the wrong element count must fail. Files live in
 * the process's scratch directory, rewritten each iteration.
 * Seeds: tests/fuzz/corpus/fuzz_safetensors (files written by the PyPI
 * safetensors package, the reference writer; make_corpus.py). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "io/safetensors.h"

static char single[PATH_MAX], dir[PATH_MAX], index_path[PATH_MAX], shard1[PATH_MAX];

/* A valid second shard: {"b": F32 [2]} and 8 data bytes. */
static const char shard2_header[] =
	"{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *s = fuzz_scratch_dir();
	char p[PATH_MAX];
	uint8_t buf[256];
	uint64_t hlen = sizeof(shard2_header) - 1;
	const float data[2] = { 1.5f, -2.0f };

	(void)argc;
	(void)argv;
	fuzz_join(single, sizeof(single), s, "single.safetensors");
	fuzz_join(dir, sizeof(dir), s, "sharded");
	fuzz_mkdir(dir);
	fuzz_join(index_path, sizeof(index_path), dir, "model.safetensors.index.json");
	fuzz_join(shard1, sizeof(shard1), dir, "model-00001-of-00002.safetensors");
	fuzz_join(p, sizeof(p), dir, "model-00002-of-00002.safetensors");
	memcpy(buf, &hlen, 8);
	memcpy(buf + 8, shard2_header, hlen);
	memcpy(buf + 8 + hlen, data, sizeof(data));
	fuzz_write_file(p, buf, 8 + hlen + sizeof(data));
	return 0;
}

static void read_all(struct st_reader *r)
{
	struct eng_error err = {0};
	int n = st_reader_count(r);

	FUZZ_CHECK(n >= 0, "count %d", n);
	(void)st_reader_metadata(r, "format");
	for (int i = 0; i < n; i++) {
		const struct st_tensor_info *t = st_reader_tensor(r, i);
		uint64_t numel = 1;
		float *buf;
		int rc;

		FUZZ_CHECK(t && st_reader_find(r, t->name) == t, "tensor %d not found by name", i);
		FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ST_MAX_DIMS, "ndim %d", t->ndim);
		for (int d = 0; d < t->ndim; d++) {
			FUZZ_CHECK(t->shape[d] >= 0, "negative dimension");
			numel *= (uint64_t)t->shape[d];
		}
		/* The header was checked against the file: nbytes fits it. */
		FUZZ_CHECK(numel * st_dtype_size(t->dtype) == t->nbytes, "%s: size mismatch",
			   t->name);
		buf = malloc((size_t)numel * sizeof(float) + 4);
		FUZZ_CHECK(buf, "out of memory");
		eng_error_clear(&err);
		rc = st_reader_read_f32(r, t->name, buf, (int64_t)numel, &err);
		FUZZ_CHECK(rc == 0, "%s: read: %s", t->name, err.msg);
		eng_error_clear(&err);
		rc = st_reader_read_f32(r, t->name, buf, (int64_t)numel + 1, &err);
		FUZZ_CHECK(rc == -EINVAL, "%s: a read of the wrong size returned %d", t->name, rc);
		free(buf);
	}
	FUZZ_CHECK(!st_reader_find(r, "\x01not a tensor"), "found a name never written");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_reader *r = NULL;
	struct eng_error err = {0};
	const char *path;
	int rc;

	if (size < 1)
		return 0;
	if (data[0] & 1) {
		size_t ilen;

		if (size < 3)
			return 0;
		ilen = (size_t)data[1] | (size_t)data[2] << 8;
		if (ilen > size - 3)
			ilen = size - 3;
		fuzz_write_file(index_path, data + 3, ilen);
		fuzz_write_file(shard1, data + 3 + ilen, size - 3 - ilen);
		path = dir;
	} else {
		fuzz_write_file(single, data + 1, size - 1);
		path = single;
	}
	rc = st_reader_open(path, &r, &err);
	if (rc == 0)
		read_all(r);
	else
		FUZZ_CHECK(err.msg[0], "st_reader_open: %d without a message", rc);
	st_reader_close(r);
	return 0;
}
