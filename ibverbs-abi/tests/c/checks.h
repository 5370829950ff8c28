/*
 * The check helpers of the C test programs: one line per check ("ok" or
 * "FAIL", what was checked, details), counted in `checks` / `failures` for
 * the program's summary ("N checks, M failed"); `need` stops the program at
 * a failed precondition. Include once, from the program's own file.
 */
#ifndef URNIC_TESTS_CHECKS_H
#define URNIC_TESTS_CHECKS_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int checks, failures;

static void report(int ok, const char *what, const char *fmt, ...)
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

/* A fatal precondition: stop here. */
static void need(int ok, const char *what)
{
	if (!ok) {
		printf("FAIL %s (errno %d %s): cannot go on\n", what, errno, strerror(errno));
		exit(1);
	}
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
