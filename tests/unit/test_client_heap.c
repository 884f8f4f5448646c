/* test_client_heap.c — the C client keeps freed heap pages for reuse
 * (client/transport_grpc.c: keep_heap_pages): gRPC receives a stream into
 * 64 KiB slices from malloc and frees them after each message; with
 * glibc's default trim threshold the heap then shrank and the next
 * message faulted the same pages in again (docs/PERF.md, the stream).
 *
 * The pattern: 64 blocks of 64 KiB (a 4 MiB message's receive slices)
 * allocated, written and freed on the main thread; the heap's end
 * (sbrk(0)) before and after the frees says whether glibc gave the pages
 * back. Without the client it does (glibc's default, the precondition
 * that makes this test able to fail); after a channel is opened, not.
 * And a block of 1 MiB (a message copied out whole) is then taken from the
 * heap, not mapped afresh (glibc maps blocks of 128 KiB and more by
 * default).
 * Under AddressSanitizer malloc is the sanitizer's, not glibc's: the test
 * has nothing to check there and exits 77 (skipped).
 */
#define _DEFAULT_SOURCE
#include <check.h>
#include <malloc.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_run.h"

#include "transport.h"

#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#define GLIBC_MALLOC 0
#else
#define GLIBC_MALLOC 1
#endif

#define SLICES 64
#define SLICE_BYTES (64 << 10)

/* Whether freeing one message's worth of slices shrank the heap. */
static bool message_shrinks_heap(void)
{
	void *p[SLICES];
	uintptr_t end;

	for (int i = 0; i < SLICES; i++) {
		p[i] = malloc(SLICE_BYTES);
		ck_assert_ptr_nonnull(p[i]);
		memset(p[i], 1, SLICE_BYTES);
	}
	end = (uintptr_t)sbrk(0);
	for (int i = SLICES - 1; i >= 0; i--)
		free(p[i]);
	return (uintptr_t)sbrk(0) < end;
}

/* Whether a 1 MiB block is mapped on its own (mmap) rather than taken from
 * the heap. */
static bool big_block_mapped(void)
{
	size_t before = mallinfo2().hblks, during;
	void *p = malloc(1 << 20);

	ck_assert_ptr_nonnull(p);
	during = mallinfo2().hblks;
	free(p);
	return during > before;
}

/* glibc's defaults, without the client: the freed top of the heap goes
 * back, a large block is mapped (each test runs in its own process). */
START_TEST(test_glibc_defaults)
{
	ck_assert(message_shrinks_heap());
	ck_assert(big_block_mapped());
}
END_TEST

START_TEST(test_heap_kept_after_open)
{
	char msg[ECT_MSG_MAX];
	struct ect_channel *ch = NULL;

	/* No server needed: gRPC connects on the first call. */
	ck_assert_int_eq(ect_open("127.0.0.1:1", 1 << 20, &ch, msg), 0);
	ck_assert(!big_block_mapped());
	ck_assert(!message_shrinks_heap());
	ck_assert(!message_shrinks_heap());
	ect_close(ch);
}
END_TEST

int main(void)
{
	Suite *s;
	TCase *tc;

	if (!GLIBC_MALLOC) {
		puts("SKIP: malloc is AddressSanitizer's here, not glibc's");
		return 77;
	}
	s = suite_create("client_heap");
	tc = tcase_create("heap");

	tcase_add_test(tc, test_glibc_defaults);
	tcase_add_test(tc, test_heap_kept_after_open);
	suite_add_tcase(s, tc);
	return check_run(s);
}
