/* test_wire_check.c — string fields checked on the wire (daemon/
 * wire_check.c): NUL and invalid UTF-8 are refused naming the field, in
 * nested messages, repeated fields and map entries; valid UTF-8 passes. */
#include "check_run.h"
#include <check.h>
#include <errno.h>
#include <string.h>

#include "engined/v1/engine.pb-c.h"
#include "wire_check.h"

/* Append a length-delimited field (number num) holding n bytes. */
static size_t put(uint8_t *out, size_t at, unsigned num, const void *data, size_t n)
{
	out[at++] = (uint8_t)(num << 3 | 2);
	out[at++] = (uint8_t)n;  /* < 128 in these tests */
	memcpy(out + at, data, n);
	return at + n;
}

static int check(const ProtobufCMessageDescriptor *d, const uint8_t *buf, size_t n,
		 struct eng_error *err)
{
	eng_error_clear(err);
	return wire_check_strings(d, buf, n, err);
}

START_TEST(top_level_and_repeated)
{
	const ProtobufCMessageDescriptor *d = &engined__v1__save_checkpoint_request__descriptor;
	struct eng_error err;
	uint8_t buf[256];
	size_t n;

	n = put(buf, 0, 1, "nul\0/../../evil", 15);
	ck_assert_int_eq(check(d, buf, n, &err), -EINVAL);
	ck_assert_str_eq(err.msg, "path: contains a NUL byte");
	n = put(buf, 0, 1, "run/\xff", 5);
	ck_assert_int_eq(check(d, buf, n, &err), -EINVAL);
	ck_assert_str_eq(err.msg, "path: is not valid UTF-8");
	/* Overlong '/', a surrogate, beyond U+10FFFF, a cut sequence. */
	n = put(buf, 0, 1, "\xc0\xaf", 2);
	ck_assert_int_eq(check(d, buf, n, &err), -EINVAL);
	n = put(buf, 0, 1, "\xed\xa0\x80", 3);
	ck_assert_int_eq(check(d, buf, n, &err), -EINVAL);
	n = put(buf, 0, 1, "\xf4\x90\x80\x80", 4);
	ck_assert_int_eq(check(d, buf, n, &err), -EINVAL);
	n = put(buf, 0, 1, "ab\xe2\x82", 4);
	ck_assert_int_eq(check(d, buf, n, &err), -EINVAL);
	/* Valid: ASCII, 2-, 3- and 4-byte sequences. */
	n = put(buf, 0, 1, "run/\xc3\xa9t\xc3\xa9-\xe2\x82\xac-\xf0\x9f\x98\x80", 18);
	ck_assert_int_eq(check(d, buf, n, &err), 0);
	/* The second `contents` entry is named with its index. */
	n = put(buf, 0, 1, "ok", 2);
	n = put(buf, n, 4, "model", 5);
	n = put(buf, n, 4, "opt\0", 4);
	ck_assert_int_eq(check(d, buf, n, &err), -EINVAL);
	ck_assert_str_eq(err.msg, "contents[1]: contains a NUL byte");
}
END_TEST

START_TEST(nested_and_maps)
{
	const ProtobufCMessageDescriptor *d = &engined__v1__forward_backward_request__descriptor;
	const ProtobufCFieldDescriptor *loss = protobuf_c_message_descriptor_get_field_by_name(d, "loss");
	const ProtobufCMessageDescriptor *ld = loss->descriptor;
	const ProtobufCFieldDescriptor *opts = protobuf_c_message_descriptor_get_field_by_name(ld, "options");
	struct eng_error err;
	uint8_t inner[128], entry[64], buf[256];
	size_t ni, ne, n;

	ni = put(inner, 0, protobuf_c_message_descriptor_get_field_by_name(ld, "name")->id,
		 "pp\xc3", 3);
	n = put(buf, 0, loss->id, inner, ni);
	ck_assert_int_eq(check(d, buf, n, &err), -EINVAL);
	ck_assert_str_eq(err.msg, "loss.name: is not valid UTF-8");
	/* A map<string, string> entry: key 1, value 2. */
	ne = put(entry, 0, 1, "clip_ratio", 10);
	ne = put(entry, ne, 2, "0.2\0", 4);
	ni = put(inner, 0, protobuf_c_message_descriptor_get_field_by_name(ld, "name")->id,
		 "ppo", 3);
	ni = put(inner, ni, opts->id, entry, ne);
	n = put(buf, 0, loss->id, inner, ni);
	ck_assert_int_eq(check(d, buf, n, &err), -EINVAL);
	ck_assert_ptr_nonnull(strstr(err.msg, "loss.options[0]."));
	ck_assert_ptr_nonnull(strstr(err.msg, ": contains a NUL byte"));
	/* Bytes fields are not strings: a tensor's data may hold anything. */
	ne = put(entry, 0, protobuf_c_message_descriptor_get_field_by_name(
			 &engined__v1__tensor__descriptor, "data")->id, "\0\xff\xfe", 3);
	n = put(buf, 0, protobuf_c_message_descriptor_get_field_by_name(d, "input_ids")->id,
		entry, ne);
	ck_assert_int_eq(check(d, buf, n, &err), 0);
	/* Malformed wire data is left to protobuf-c (a length past the end). */
	buf[0] = (uint8_t)(loss->id << 3 | 2);
	buf[1] = 100;
	ck_assert_int_eq(check(d, buf, 2, &err), 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("wire_check");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, top_level_and_repeated);
	tcase_add_test(tc, nested_and_maps);
	suite_add_tcase(s, tc);
	return check_run(s);
}
