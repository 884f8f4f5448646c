/* test_daemon_codes.c — the daemon answers every code of err.h's one list
 * with the gRPC status the list names, and INTERNAL for anything else. */
#include "check_run.h"
#include <check.h>
#include <errno.h>

#include "job.h"

START_TEST(every_code_maps_to_its_status)
{
	for (int i = 0; i < eng_n_codes; i++)
		ck_assert_str_eq(rpc_code_name(job_rpc_code(eng_codes[i].code)),
				 eng_codes[i].status);
	ck_assert_int_eq(job_rpc_code(0), RPC_OK);
	ck_assert_int_eq(job_rpc_code(-EINVAL), RPC_INVALID_ARGUMENT);
	ck_assert_int_eq(job_rpc_code(-ESHUTDOWN), RPC_UNAVAILABLE);
	/* The data-parallel group's failures (engines/dist/dist.h). */
	ck_assert_int_eq(job_rpc_code(-ECONNRESET), RPC_UNAVAILABLE);
	ck_assert_int_eq(job_rpc_code(-ENOTCONN), RPC_FAILED_PRECONDITION);
	ck_assert_int_eq(job_rpc_code(-ETIMEDOUT), RPC_DEADLINE_EXCEEDED);
	ck_assert_int_eq(job_rpc_code(-EXDEV), RPC_INTERNAL);
	ck_assert_int_eq(job_rpc_code(-12345), RPC_INTERNAL);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("daemon_codes");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, every_code_maps_to_its_status);
	suite_add_tcase(s, tc);
	return check_run(s);
}
