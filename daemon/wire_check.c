/* wire_check.c — string fields of a packed message checked against UTF-8
 * without NUL (see wire_check.h). Walks the wire format with the message's
 * descriptor: tags, lengths, nested messages (depth-bounded). */
#include "wire_check.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define MAX_DEPTH 32

struct rd {
	const uint8_t *p, *end;
};

static bool varint(struct rd *r, uint64_t *v)
{
	*v = 0;
	for (int s = 0; s < 64 && r->p < r->end; s += 7) {
		uint8_t b = *r->p++;

		*v |= (uint64_t)(b & 0x7f) << s;
		if (!(b & 0x80))
			return true;
	}
	return false;
}

/* Valid UTF-8 (no overlong forms, no surrogates, <= U+10FFFF) and no NUL:
 * NULL, or the reason. */
static const char *utf8_problem(const uint8_t *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		uint8_t c = s[i];
		uint32_t cp;
		int k;

		if (c == 0)
			return "contains a NUL byte";
		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			k = 1, cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			k = 2, cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			k = 3, cp = c & 0x07;
		} else {
			return "is not valid UTF-8";
		}
		if (n - i <= (size_t)k)
			return "is not valid UTF-8";
		for (int j = 1; j <= k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				return "is not valid UTF-8";
			cp = cp << 6 | (s[i + j] & 0x3f);
		}
		if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return "is not valid UTF-8";
		i += (size_t)k + 1;
	}
	return NULL;
}

static int check(const ProtobufCMessageDescriptor *d, struct rd r, const char *prefix,
		 int depth, struct eng_error *err)
{
	unsigned seen[64] = { 0 };  /* occurrences per field index (repeated fields) */

	if (depth > MAX_DEPTH)
		return 0;  /* protobuf-c refuses deeper nesting itself */
	while (r.p < r.end) {
		const ProtobufCFieldDescriptor *f;
		uint64_t key, len;
		char name[256];
		unsigned idx;

		if (!varint(&r, &key))
			return 0;
		switch (key & 7) {
		case 0:
			if (!varint(&r, &len))
				return 0;
			continue;
		case 1:
			if (r.end - r.p < 8)
				return 0;
			r.p += 8;
			continue;
		case 5:
			if (r.end - r.p < 4)
				return 0;
			r.p += 4;
			continue;
		case 2:
			break;
		default:
			return 0;
		}
		if (!varint(&r, &len) || len > (uint64_t)(r.end - r.p))
			return 0;
		f = key >> 3 <= UINT32_MAX ?
		    protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
		if (f && (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE)) {
			idx = (unsigned)(f - d->fields);
			if (f->label == PROTOBUF_C_LABEL_REPEATED)
				snprintf(name, sizeof(name), "%s%s[%u]", prefix, f->name,
					 idx < 64 ? seen[idx] : 0);
			else
				snprintf(name, sizeof(name), "%s%s", prefix, f->name);
			if (idx < 64)
				seen[idx]++;
			if (f->type == PROTOBUF_C_TYPE_STRING) {
				const char *why = utf8_problem(r.p, (size_t)len);

				if (why)
					return eng_fail(err, -EINVAL, "%s: %s", name, why);
			} else {
				struct rd sub = { r.p, r.p + len };
				char pre[260];
				int rc;

				snprintf(pre, sizeof(pre), "%s.", name);
				rc = check(f->descriptor, sub, pre, depth + 1, err);
				if (rc)
					return rc;
			}
		}
		r.p += len;
	}
	return 0;
}

int wire_check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len,
		       struct eng_error *err)
{
	struct rd r = { buf, buf + len };

	if (!desc || !buf)
		return 0;
	return check(desc, r, "", 0, err);
}
