/* ckpt_state.c — the seal of engine_state.json (see checkpoint.h): the
 * library's members (format_version, files, state_xxh64), the XXH64 over
 * the canonical form that state_xxh64 carries, and their validation when
 * the file is read. The engine's own members are checked by the engine
 * (engines/native/native_state.c).
 *
 * Canonical form: the object without state_xxh64, as jansson writes it
 * with JSON_COMPACT | JSON_SORT_KEYS (no whitespace, keys in byte order,
 * integers in decimal, reals with 17 significant digits, strings in UTF-8
 * with the escapes JSON requires). Parsing the file and writing it again
 * gives the same text whatever its whitespace, so the checksum covers the
 * values, not the layout.
 */
#include "checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define SEAL_KEY "state_xxh64"

bool ckpt_reserved_key(const char *key)
{
	return !strcmp(key, "format_version") || !strcmp(key, "files") ||
	       !strcmp(key, SEAL_KEY);
}

/* 16 lowercase hexadecimal digits, as the writer puts them. */
bool ckpt_hex64(const char *s, uint64_t *ret)
{
	uint64_t v = 0;
	int i;

	if (!s || strlen(s) != 16)
		return false;
	for (i = 0; i < 16; i++) {
		char c = s[i];

		if (c >= '0' && c <= '9')
			v = v << 4 | (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v = v << 4 | (uint64_t)(c - 'a' + 10);
		else
			return false;
	}
	if (ret)
		*ret = v;
	return true;
}

/* XXH64 of the canonical form of `state` (without its seal). */
static int canonical_xxh64(json_t *state, uint64_t *ret)
{
	json_t *c = json_copy(state);   /* shallow: the members are shared */
	char *text;

	if (!c)
		return -ENOMEM;
	json_object_del(c, SEAL_KEY);
	text = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(c);
	if (!text)
		return -ENOMEM;
	*ret = XXH64(text, strlen(text), 0);
	free(text);
	return 0;
}

int ckpt_state_seal(json_t *state, struct eng_error *err)
{
	char hex[17];
	uint64_t h;

	if (json_object_set_new(state, "format_version", json_integer(CKPT_FORMAT_VERSION)) ||
	    canonical_xxh64(state, &h))
		return eng_fail(err, -ENOMEM, "engine state: no memory");
	snprintf(hex, sizeof(hex), "%016" PRIx64, h);
	if (json_object_set_new(state, SEAL_KEY, json_string(hex)))
		return eng_fail(err, -ENOMEM, "engine state: no memory");
	return 0;
}

/* One "files" entry: exactly {"bytes": integer >= 0, "xxh64": hex}. */
static int check_entry(const char *shown, const char *name, json_t *info,
		       struct eng_error *err)
{
	json_t *b = json_object_get(info, "bytes");
	const char *k;
	json_t *v;

	if (!name[0] || name[0] == '.' || strchr(name, '/') || strlen(name) > NAME_MAX ||
	    !strcmp(name, "engine_state.json"))
		return eng_fail(err, -EBADMSG, "%s: files: '%s' is not a checkpoint file name",
				shown, name);
	if (!json_is_object(info))
		return eng_fail(err, -EBADMSG, "%s: files.%s: not an object", shown, name);
	if (!json_is_integer(b) || json_integer_value(b) < 0)
		return eng_fail(err, -EBADMSG, "%s: files.%s.bytes: missing or not an integer "
				">= 0", shown, name);
	if (!ckpt_hex64(json_string_value(json_object_get(info, "xxh64")), NULL))
		return eng_fail(err, -EBADMSG, "%s: files.%s.xxh64: missing or not 16 lowercase "
				"hex digits", shown, name);
	json_object_foreach(info, k, v) {
		if (strcmp(k, "bytes") && strcmp(k, "xxh64"))
			return eng_fail(err, -EBADMSG, "%s: files.%s: unknown key '%s'", shown,
					name, k);
	}
	return 0;
}

int ckpt_state_parse(const char *text, size_t len, const char *shown, json_t **ret,
		     struct eng_error *err)
{
	json_t *state, *seal, *ver, *files, *info;
	json_error_t jerr;
	const char *name;
	uint64_t want, got;
	int rc = 0;

	state = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!state)
		return eng_fail(err, -EBADMSG, "%s: invalid JSON at line %d: %s", shown,
				jerr.line, jerr.text);
	if (!json_is_object(state)) {
		rc = eng_fail(err, -EBADMSG, "%s: not a JSON object", shown);
		goto out;
	}
	seal = json_object_get(state, SEAL_KEY);
	ver = json_object_get(state, "format_version");
	if (!seal && json_is_integer(ver) && json_integer_value(ver) < CKPT_FORMAT_VERSION) {
		rc = eng_fail(err, -EINVAL, "%s: format_version %lld (without a checksum) is "
			      "not loaded by this engined, which reads format_version %d; the "
			      "checkpoint's config.json and model.safetensors still load as an "
			      "Initialize model_path", shown, (long long)json_integer_value(ver),
			      CKPT_FORMAT_VERSION);
		goto out;
	}
	if (!seal) {
		rc = eng_fail(err, -EBADMSG, "%s: key '%s' is missing", shown, SEAL_KEY);
		goto out;
	}
	if (!ckpt_hex64(json_string_value(seal), &want)) {
		rc = eng_fail(err, -EBADMSG, "%s: %s: not 16 lowercase hex digits", shown,
			      SEAL_KEY);
		goto out;
	}
	if (canonical_xxh64(state, &got)) {
		rc = eng_fail(err, -ENOMEM, "%s: no memory", shown);
		goto out;
	}
	if (got != want) {
		rc = eng_fail(err, -EBADMSG, "%s: the contents' XXH64 %016" PRIx64 " does not "
			      "match %s %016" PRIx64 " (the file is damaged)", shown, got,
			      SEAL_KEY, want);
		goto out;
	}
	/* Intact from here: what follows is what the writer wrote. */
	if (!json_is_integer(ver)) {
		rc = eng_fail(err, -EBADMSG, "%s: key 'format_version' is missing or not an "
			      "integer", shown);
		goto out;
	}
	if (json_integer_value(ver) != CKPT_FORMAT_VERSION) {
		rc = eng_fail(err, -EINVAL, "%s: format_version %lld; this engined reads %d",
			      shown, (long long)json_integer_value(ver), CKPT_FORMAT_VERSION);
		goto out;
	}
	files = json_object_get(state, "files");
	if (!json_is_object(files)) {
		rc = eng_fail(err, -EBADMSG, "%s: key 'files' is missing or not an object",
			      shown);
		goto out;
	}
	json_object_foreach(files, name, info) {
		rc = check_entry(shown, name, info, err);
		if (rc)
			goto out;
	}
out:
	if (rc) {
		json_decref(state);
		return rc;
	}
	*ret = state;
	return 0;
}
