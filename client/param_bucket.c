/* param_bucket.c — ParamBucket decoding over gRPC's receive segments (see
 * param_bucket.h). Wire format: each field is a varint key (number << 3 |
 * wire type) then a varint, 8 or 4 bytes, or a varint length and that
 * many bytes; ParamBucket's `data` is field 2, length-delimited. */
#include "param_bucket.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define DATA_FIELD 2

static int rd_skip(struct ecb_reader *r, size_t len)
{
	if (len > r->left)
		return -1;
	r->left -= len;
	while (len > 0) {
		size_t avail = r->segs[r->i].len - r->off;

		if (len < avail) {
			r->off += len;
			return 0;
		}
		len -= avail;
		r->i++;
		r->off = 0;
	}
	return 0;
}

static int rd_copy(struct ecb_reader *r, uint8_t *dst, size_t len)
{
	if (len > r->left)
		return -1;
	r->left -= len;
	while (len > 0) {
		size_t avail = r->segs[r->i].len - r->off;
		size_t take = len < avail ? len : avail;

		memcpy(dst, r->segs[r->i].data + r->off, take);
		dst += take;
		len -= take;
		r->off += take;
		if (r->off == r->segs[r->i].len) {
			r->i++;
			r->off = 0;
		}
	}
	return 0;
}

static int rd_varint(struct ecb_reader *r, uint64_t *ret)
{
	uint64_t v = 0;

	for (int shift = 0; shift < 64; shift += 7) {
		uint8_t b;

		if (rd_copy(r, &b, 1) < 0)
			return -1;
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*ret = v;
			return 0;
		}
	}
	return -1;
}

/* Skip one field's value after its key. */
static int rd_skip_value(struct ecb_reader *r, uint64_t key)
{
	uint64_t v;

	switch (key & 7) {
	case 0:
		return rd_varint(r, &v);
	case 1:
		return rd_skip(r, 8);
	case 2:
		if (rd_varint(r, &v) < 0 || v > r->left)
			return -1;
		return rd_skip(r, (size_t)v);
	case 5:
		return rd_skip(r, 4);
	default:
		return -1;  /* groups are not used by this message */
	}
}

void ecb_clear(struct ecb_bucket *b)
{
	if (b->msg)
		protobuf_c_message_free_unpacked(&b->msg->base, NULL);
	b->msg = NULL;
	b->data_len = 0;
}

void ecb_free(struct ecb_bucket *b)
{
	ecb_clear(b);
	free(b->fields);
	memset(b, 0, sizeof(*b));
}

int ecb_parse(struct ecb_bucket *b, const struct ect_seg *segs, size_t n, size_t len)
{
	struct ecb_reader r = { segs, n, 0, 0, len };
	size_t flen = 0;

	ecb_clear(b);
	b->data = (struct ecb_reader){ segs, n, 0, 0, 0 };
	while (r.left > 0) {
		struct ecb_reader field = r;
		uint64_t key, v;
		size_t fl;

		if (rd_varint(&r, &key) < 0)
			return -EBADMSG;
		if (key >> 3 == DATA_FIELD && (key & 7) == 2) {
			if (rd_varint(&r, &v) < 0 || v > r.left)
				return -EBADMSG;
			b->data = r;
			b->data.left = (size_t)v;
			(void)rd_skip(&r, (size_t)v);
			continue;
		}
		if (rd_skip_value(&r, key) < 0)
			return -EBADMSG;
		fl = field.left - r.left;
		if (flen + fl > b->fields_cap) {
			size_t cap = 2 * (flen + fl) + 256;
			uint8_t *f = realloc(b->fields, cap);

			if (!f)
				return -ENOMEM;
			b->fields = f;
			b->fields_cap = cap;
		}
		(void)rd_copy(&field, b->fields + flen, fl);
		flen += fl;
	}
	b->msg = engined__v1__param_bucket__unpack(NULL, flen,
			b->fields ? b->fields : (const uint8_t *)"");
	if (!b->msg)
		return -EBADMSG;
	b->data_len = b->data.left;
	b->cur = b->data;
	b->cur_off = 0;
	return 0;
}

int ecb_copy(struct ecb_bucket *b, size_t off, uint8_t *dst, size_t len)
{
	if (!b->msg || off > b->data_len || len > b->data_len - off)
		return -ERANGE;
	if (off < b->cur_off) {
		b->cur = b->data;
		b->cur_off = 0;
	}
	if (rd_skip(&b->cur, off - b->cur_off) < 0 || rd_copy(&b->cur, dst, len) < 0)
		return -ERANGE;
	b->cur_off = off + len;
	return 0;
}
