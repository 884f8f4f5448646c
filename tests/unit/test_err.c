/* test_err.c — the error-recording convention of err.h. */
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

int main(void)
{
	Suite *s = suite_create("err");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, first_failure_wins);
	suite_add_tcase(s, tc);
	return check_run(s);
}
