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
	ck_assert_str_eq(eng_strerror(-EXDEV), "E?");
	ck_assert_int_eq(eng_errno_code(EACCES), -EPERM);
	ck_assert_int_eq(eng_errno_code(ENOENT), -ENOENT);
	ck_assert_int_eq(eng_errno_code(EROFS), -EIO);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("err");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, first_failure_wins);
	tcase_add_test(tc, code_list);
	suite_add_tcase(s, tc);
	return check_run(s);
}
