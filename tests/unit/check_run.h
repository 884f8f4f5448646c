/* check_run.h — run a Check suite and turn its result into an exit code
 * (0 when every test passed), shared by the unit test programs. */
#ifndef ENGINED_CHECK_RUN_H
#define ENGINED_CHECK_RUN_H

#include <check.h>

static inline int check_run(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

#endif
