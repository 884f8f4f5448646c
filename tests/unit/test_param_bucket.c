/* test_param_bucket.c — the client's ParamBucket decoder over gRPC-like
 * receive segments (client/param_bucket.c) against protobuf-c's own
 * decoding of the same bytes in one piece.
 *
 * Messages are laid out as the daemon sends them (fields, then data) and as
 * any other encoder may (data first, data twice — the last counts —,
 * unknown fields of every wire type), then cut into segments of 1, 2, 3,
 * 7, 64 bytes and whole, so that keys, varints and data fall across
 * segment boundaries.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"

#include "param_bucket.h"

#define DATA_LEN 1000

static uint8_t data_a[DATA_LEN], data_b[DATA_LEN / 2];
static int64_t shape0[2] = { 10, 20 }, shape1[1] = { 7 };

/* Fill the slices of a bucket (no data). */
static void fill_slices(Engined__V1__ParamBucket *m, Engined__V1__TensorSlice *s,
			Engined__V1__TensorSlice **p)
{
	for (int i = 0; i < 3; i++) {
		engined__v1__tensor_slice__init(&s[i]);
		p[i] = &s[i];
	}
	s[0].name = "model.layers.0.mlp.up_proj.weight";
	s[0].dtype = ENGINED__V1__DTYPE__BFLOAT16;
	s[0].n_shape = 2;
	s[0].shape = shape0;
	s[0].tensor_bytes = 400;
	s[0].tensor_offset = 0;
	s[0].data_offset = 0;
	s[0].length = 400;
	s[1].name = "model.norm.weight";
	s[1].dtype = ENGINED__V1__DTYPE__BFLOAT16;
	s[1].n_shape = 1;
	s[1].shape = shape1;
	s[1].tensor_bytes = 14;
	s[1].data_offset = 400;
	s[1].length = 14;
	s[2].name = "lm_head.weight";
	s[2].dtype = ENGINED__V1__DTYPE__BFLOAT16;
	s[2].n_shape = 1;
	s[2].shape = shape1;
	s[2].tensor_bytes = 100000;
	s[2].tensor_offset = 5000;
	s[2].data_offset = 414;
	s[2].length = 486;
	m->n_slices = 3;
	m->slices = p;
	m->last = true;
}

/* Append the packed message m to buf at *len. */
static void append(uint8_t *buf, size_t *len, const Engined__V1__ParamBucket *m)
{
	*len += engined__v1__param_bucket__pack(m, buf + *len);
}

enum layout {
	FIELDS_THEN_DATA,   /* the daemon's order */
	DATA_THEN_FIELDS,
	DATA_TWICE,         /* data_b, then fields, then data_a: data_a counts */
	UNKNOWN_FIELDS,     /* unknown fields of wire types 0, 1, 2, 5 around data */
	NO_DATA,
	EMPTY,
};

static size_t build(uint8_t *buf, enum layout l)
{
	Engined__V1__ParamBucket f = ENGINED__V1__PARAM_BUCKET__INIT;
	Engined__V1__ParamBucket d = ENGINED__V1__PARAM_BUCKET__INIT;
	Engined__V1__ParamBucket d2 = ENGINED__V1__PARAM_BUCKET__INIT;
	Engined__V1__TensorSlice s[3], *p[3];
	/* Fields 11..14 (one-byte keys) of wire types 0, 1, 2, 5. */
	static const uint8_t unknown[] = {
		11 << 3 | 0, 0xff, 0xff, 0x03,                       /* varint */
		12 << 3 | 1, 1, 2, 3, 4, 5, 6, 7, 8,                 /* fixed64 */
		13 << 3 | 2, 3, 'a', 'b', 'c',                       /* bytes */
		14 << 3 | 5, 9, 9, 9, 9,                             /* fixed32 */
	};
	size_t len = 0;

	fill_slices(&f, s, p);
	d.data.data = data_a;
	d.data.len = sizeof(data_a);
	d2.data.data = data_b;
	d2.data.len = sizeof(data_b);
	switch (l) {
	case FIELDS_THEN_DATA:
		append(buf, &len, &f);
		append(buf, &len, &d);
		break;
	case DATA_THEN_FIELDS:
		append(buf, &len, &d);
		append(buf, &len, &f);
		break;
	case DATA_TWICE:
		append(buf, &len, &d2);
		append(buf, &len, &f);
		append(buf, &len, &d);
		break;
	case UNKNOWN_FIELDS:
		memcpy(buf + len, unknown, sizeof(unknown));
		len += sizeof(unknown);
		append(buf, &len, &f);
		memcpy(buf + len, unknown, 13);  /* the varint and fixed64 ones */
		len += 13;
		append(buf, &len, &d);
		memcpy(buf + len, unknown + 13, sizeof(unknown) - 13);
		len += sizeof(unknown) - 13;
		break;
	case NO_DATA:
		append(buf, &len, &f);
		break;
	case EMPTY:
		break;
	}
	return len;
}

/* Cut buf into segments of `size` bytes (0: one segment). */
static size_t segment(struct ect_seg *segs, const uint8_t *buf, size_t len, size_t size)
{
	size_t n = 0;

	if (!size)
		size = len ? len : 1;
	for (size_t off = 0; off < len; off += size) {
		segs[n].data = buf + off;
		segs[n++].len = len - off < size ? len - off : size;
	}
	return n;
}

static void check_against_reference(const uint8_t *buf, size_t len, size_t seg_size)
{
	Engined__V1__ParamBucket *ref = engined__v1__param_bucket__unpack(NULL, len, buf);
	struct ect_seg *segs = malloc((len + 1) * sizeof(*segs));
	struct ecb_bucket b;
	uint8_t out[DATA_LEN];
	size_t n = segment(segs, buf, len, seg_size);

	ck_assert_ptr_nonnull(ref);
	memset(&b, 0, sizeof(b));
	ck_assert_int_eq(ecb_parse(&b, segs, n, len), 0);
	ck_assert_ptr_nonnull(b.msg);
	ck_assert_uint_eq(b.msg->data.len, 0);
	ck_assert_uint_eq(b.data_len, ref->data.len);
	ck_assert_int_eq(b.msg->last, ref->last);
	ck_assert_uint_eq(b.msg->n_slices, ref->n_slices);
	for (size_t i = 0; i < ref->n_slices; i++) {
		const Engined__V1__TensorSlice *x = b.msg->slices[i], *y = ref->slices[i];

		ck_assert_str_eq(x->name, y->name);
		ck_assert_int_eq(x->dtype, y->dtype);
		ck_assert_uint_eq(x->n_shape, y->n_shape);
		for (size_t k = 0; k < y->n_shape; k++)
			ck_assert_int_eq(x->shape[k], y->shape[k]);
		ck_assert_int_eq(x->tensor_bytes, y->tensor_bytes);
		ck_assert_int_eq(x->tensor_offset, y->tensor_offset);
		ck_assert_int_eq(x->data_offset, y->data_offset);
		ck_assert_int_eq(x->length, y->length);
	}
	/* Every slice's bytes, forwards then backwards (the cursor restarts),
	 * then the whole data at once. */
	for (int pass = 0; pass < 2 && ref->data.len; pass++) {
		for (size_t j = 0; j < ref->n_slices; j++) {
			size_t i = pass ? ref->n_slices - 1 - j : j;
			const Engined__V1__TensorSlice *y = ref->slices[i];

			memset(out, 0xee, sizeof(out));
			ck_assert_int_eq(ecb_copy(&b, (size_t)y->data_offset, out,
						  (size_t)y->length), 0);
			ck_assert(memcmp(out, ref->data.data + y->data_offset,
					 (size_t)y->length) == 0);
		}
	}
	ck_assert_int_eq(ecb_copy(&b, 0, out, b.data_len), 0);
	ck_assert(!ref->data.len || memcmp(out, ref->data.data, ref->data.len) == 0);
	/* Past the end of the data. */
	ck_assert_int_eq(ecb_copy(&b, b.data_len, out, 1), -ERANGE);
	ck_assert_int_eq(ecb_copy(&b, 1, out, b.data_len), -ERANGE);
	ck_assert_int_eq(ecb_copy(&b, b.data_len, out, 0), 0);
	ecb_free(&b);
	engined__v1__param_bucket__free_unpacked(ref, NULL);
	free(segs);
}

static void setup(void)
{
	for (int i = 0; i < DATA_LEN; i++)
		data_a[i] = (uint8_t)(i * 37 + 11);
	for (int i = 0; i < DATA_LEN / 2; i++)
		data_b[i] = (uint8_t)(255 - i);
}

static const size_t seg_sizes[] = { 1, 2, 3, 7, 64, 0 };

START_TEST(test_layouts)
{
	static uint8_t buf[4 * DATA_LEN];
	size_t len = build(buf, (enum layout)_i);

	for (size_t k = 0; k < sizeof(seg_sizes) / sizeof(seg_sizes[0]); k++)
		check_against_reference(buf, len, seg_sizes[k]);
}
END_TEST

START_TEST(test_data_twice_last_counts)
{
	static uint8_t buf[4 * DATA_LEN];
	size_t len = build(buf, DATA_TWICE);
	struct ect_seg segs[1] = { { buf, len } };
	struct ecb_bucket b;
	uint8_t out[DATA_LEN];

	memset(&b, 0, sizeof(b));
	ck_assert_int_eq(ecb_parse(&b, segs, 1, len), 0);
	ck_assert_uint_eq(b.data_len, DATA_LEN);
	ck_assert_int_eq(ecb_copy(&b, 0, out, DATA_LEN), 0);
	ck_assert(memcmp(out, data_a, DATA_LEN) == 0);
	ecb_free(&b);
}
END_TEST

/* Every proper prefix of a message that ends inside a field is refused
 * (and never read past); prefixes that end between fields are valid,
 * shorter messages. */
START_TEST(test_truncated)
{
	static uint8_t buf[4 * DATA_LEN];
	size_t len = build(buf, FIELDS_THEN_DATA);
	struct ect_seg *segs = malloc(len * sizeof(*segs));
	struct ecb_bucket b;
	int bad = 0;

	memset(&b, 0, sizeof(b));
	for (size_t cut = 1; cut < len; cut++) {
		Engined__V1__ParamBucket *ref = engined__v1__param_bucket__unpack(NULL, cut, buf);
		size_t n = segment(segs, buf, cut, 3);
		int r = ecb_parse(&b, segs, n, cut);

		ck_assert_int_eq(r == 0, ref != NULL);
		if (r) {
			ck_assert_int_eq(r, -EBADMSG);
			ck_assert_ptr_null(b.msg);
			bad++;
		}
		if (ref)
			engined__v1__param_bucket__free_unpacked(ref, NULL);
	}
	ck_assert_int_gt(bad, (int)len / 2);
	ecb_free(&b);
	free(segs);
}
END_TEST

START_TEST(test_bad_wire_types)
{
	/* A group (wire type 3) and an over-long varint. */
	static const uint8_t group[] = { 9 << 3 | 3, 9 << 3 | 4 };
	static const uint8_t varint[] = { 15 << 3 | 0, 0x80, 0x80, 0x80, 0x80, 0x80,
					  0x80, 0x80, 0x80, 0x80, 0x80, 0x01 };
	struct ect_seg s1[1] = { { group, sizeof(group) } };
	struct ect_seg s2[1] = { { varint, sizeof(varint) } };
	struct ecb_bucket b;

	memset(&b, 0, sizeof(b));
	ck_assert_int_eq(ecb_parse(&b, s1, 1, sizeof(group)), -EBADMSG);
	ck_assert_int_eq(ecb_parse(&b, s2, 1, sizeof(varint)), -EBADMSG);
	ck_assert_int_eq(ecb_copy(&b, 0, NULL, 0), -ERANGE);
	ecb_free(&b);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("param_bucket");
	TCase *tc = tcase_create("decode");

	tcase_add_unchecked_fixture(tc, setup, NULL);
	tcase_add_loop_test(tc, test_layouts, FIELDS_THEN_DATA, EMPTY + 1);
	tcase_add_test(tc, test_data_twice_last_counts);
	tcase_add_test(tc, test_truncated);
	tcase_add_test(tc, test_bad_wire_types);
	suite_add_tcase(s, tc);
	return check_run(s);
}
