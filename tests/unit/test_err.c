/* test_err.c — the error-recording convention of err.h, the list of codes
 * and the one errno mapping (eng_errno_code). */
#include "check_run.h"
#include <check.h>
#include <string.h>

#include "err.h"

START_TEST(first_failure_wins)
{
	struct eng_error err = {0};

	ck_assert_int_eq(eng_fail(&err, -EINVAL, "seq_lens[%d]: bad", 3), -EINVAL);
	ck_assert_int_eq(eng_fail(&err, -ENOMEM, "later"), -ENOMEM);
	ck_assert_int_eq(err.code, -EINVAL);
	ck_assert_str_eq(err.msg, "seq_lens[3]: bad");
	ck_assert_int_eq(eng_fail(NULL, -EIO, "x"), -EIO);
	eng_error_clear(&err);
	ck_assert_int_eq(err.code, 0);
	ck_assert_str_eq(err.msg, "");
	ck_assert_str_eq(eng_strerror(-EBADMSG), "EBADMSG");
}
END_TEST

/* The one list of codes: every row named, unique, with a status; anything
 * else is "E?". */
START_TEST(code_list)
{
	ck_assert_int_ge(eng_n_codes, 16);
	for (int i = 0; i < eng_n_codes; i++) {
		const struct eng_code *c = &eng_codes[i];

		ck_assert_int_lt(c->code, 0);
		ck_assert_str_eq(eng_strerror(c->code), c->name);
		ck_assert_int_gt((int)strlen(c->status), 0);
		ck_assert_int_gt((int)strlen(c->meaning), 0);
		for (int k = 0; k < i; k++) {
			ck_assert_int_ne(eng_codes[k].code, c->code);
			ck_assert_str_ne(eng_codes[k].name, c->name);
		}
	}
	ck_assert_str_eq(eng_strerror(0), "OK");
	ck_assert_str_eq(eng_strerror(-ESHUTDOWN), "ESHUTDOWN");
	ck_assert_str_eq(eng_strerror(-ECONNRESET), "ECONNRESET");
	ck_assert_str_eq(eng_strerror(-ENOTCONN), "ENOTCONN");
	ck_assert_str_eq(eng_strerror(-EXDEV), "E?");
}
END_TEST

/* eng_errno_code: the expected library code (and so the gRPC status) of
 * each file-system errno, written out here independently of err.c. */
static const struct {
	int e, code;
	const char *status;
} errno_table[] = {
	{ENOENT, -ENOENT, "NOT_FOUND"},
	{ENOMEM, -ENOMEM, "RESOURCE_EXHAUSTED"},
	{ENOSPC, -ENOSPC, "RESOURCE_EXHAUSTED"},
	{EDQUOT, -ENOSPC, "RESOURCE_EXHAUSTED"},
	{EFBIG, -ENOSPC, "RESOURCE_EXHAUSTED"},
	{EMFILE, -EMFILE, "RESOURCE_EXHAUSTED"},
	{ENFILE, -EMFILE, "RESOURCE_EXHAUSTED"},
	{EACCES, -EPERM, "PERMISSION_DENIED"},
	{EPERM, -EPERM, "PERMISSION_DENIED"},
	{ELOOP, -EPERM, "PERMISSION_DENIED"},
	{EXDEV, -EPERM, "PERMISSION_DENIED"},
	{EROFS, -EALREADY, "FAILED_PRECONDITION"},
	{ENAMETOOLONG, -EINVAL, "INVALID_ARGUMENT"},
	{ENOTDIR, -EINVAL, "INVALID_ARGUMENT"},
	{EISDIR, -EINVAL, "INVALID_ARGUMENT"},
	{EIO, -EIO, "INTERNAL"},
	{EBUSY, -EIO, "INTERNAL"},
	{ENOTEMPTY, -EIO, "INTERNAL"},
	{EINTR, -EIO, "INTERNAL"},
};

static const char *status_of(int code)
{
	for (int i = 0; i < eng_n_codes; i++)
		if (eng_codes[i].code == code)
			return eng_codes[i].status;
	return "INTERNAL";   /* what the daemon answers for a code not listed */
}

START_TEST(errno_mapping)
{
	for (size_t i = 0; i < sizeof(errno_table) / sizeof(errno_table[0]); i++) {
		int got = eng_errno_code(errno_table[i].e);

		ck_assert_msg(got == errno_table[i].code, "%s -> %s, expected %s",
			      strerror(errno_table[i].e), eng_strerror(got),
			      eng_strerror(errno_table[i].code));
		ck_assert_str_eq(status_of(got), errno_table[i].status);
	}
	/* Every errno lands on a listed code: nothing the file system says
	 * reaches the daemon as a code outside ENG_ERROR_CODES. */
	for (int e = 1; e < 134; e++)
		ck_assert_msg(strcmp(eng_strerror(eng_errno_code(e)), "E?"),
			      "errno %d maps outside the list", e);
	ck_assert_ptr_nonnull(strstr(eng_errno_text(ELOOP), "symlink"));
	ck_assert_str_eq(eng_errno_text(ENOSPC), strerror(ENOSPC));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("err");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, first_failure_wins);
	tcase_add_test(tc, code_list);
	tcase_add_test(tc, errno_mapping);
	suite_add_tcase(s, tc);
	return check_run(s);
}
