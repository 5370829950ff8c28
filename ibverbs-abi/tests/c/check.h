/*
 * The bookkeeping of the C test programs (bad_args.c, rdmacm_bad_args.c, interrupted_waits.c,
 * rdmacm_mcast.c, mcast_loop.c, no_alloc.c): one line per check ("ok"/"FAIL" and what
 * was checked), a fatal precondition that stops the program, ERR/OK for a
 * call's -1/errno or 0, and the summary line "N checks, M failed" that the
 * Rust tests (c_programs.rs, rdmacm_c.rs, mckey_programs.rs) read. A
 * program includes it once.
 */
#ifndef URNIC_TEST_CHECK_H
#define URNIC_TEST_CHECK_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks, failures;

/* One check: `ok`, what it was, and (with `fmt`) what was seen. */
static inline void report(int ok, const char *what, const char *fmt, ...)
{
	va_list ap;

	checks++;
	if (!ok)
		failures++;
	printf("%s %s", ok ? "ok  " : "FAIL", what);
	if (fmt) {
		printf(": ");
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
	}
	printf("\n");
	fflush(stdout);
}

/* A fatal precondition (the device, a control object): stop here. */
static inline void need(int ok, const char *what)
{
	if (!ok) {
		printf("FAIL %s (errno %d %s): cannot go on\n", what, errno, strerror(errno));
		exit(1);
	}
}

/* The summary line; the program's exit status (1 if any check failed). */
static inline int summary(void)
{
	printf("%d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}

/* A call returning -1 with errno `want`. */
#define ERR(call, want)                                                                  \
	do {                                                                             \
		errno = 0;                                                               \
		int rc_ = (call);                                                        \
		int e_ = errno;                                                          \
		report(rc_ == -1 && e_ == (want), #call, "rc %d errno %d (%s), want %s", \
		       rc_, e_, strerror(e_), #want);                                    \
	} while (0)

/* A call returning 0 (its errno shown if not). */
#define OK(call, what)                                                                  \
	do {                                                                            \
		errno = 0;                                                              \
		int rc_ = (call);                                                       \
		int e_ = errno;                                                         \
		report(rc_ == 0, what, rc_ ? "errno %d (%s)" : NULL, e_, strerror(e_)); \
	} while (0)

#endif
