/*
 * Blocking waits and signals, as libibverbs and librdmacm behave over the
 * kernel's channels: ibv_get_cq_event, ibv_get_async_event and
 * rdma_get_cm_event block in one read(2) of the channel's fd, so a signal
 * whose handler was installed without SA_RESTART ends the wait with -1 and
 * errno EINTR, and one with SA_RESTART lets the wait go on to its event.
 * Programs depend on the first: qperf ends each test from SIGALRM and
 * expects its ibv_get_cq_event to return EINTR (a wait that swallowed the
 * signal left its rc_lat client blocked after the last message, and the
 * server timed out waiting for it).
 *
 * Linked with urnic's librdmacm.so.1 and libibverbs.so.1, run in a network
 * namespace holding one urnic device whose address is argv[1]
 * (ibverbs-abi/tests/rdmacm_c.rs runs it). A repeating 20 ms interval timer
 * delivers the signals until the call returns; a wait still blocked after
 * 500 of them fails the program (a hang guard, not a timing check).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

#include "check.h"

static volatile sig_atomic_t ticks;
static const char *waiting_in;

static void on_alarm(int sig)
{
	(void)sig;
	if (++ticks >= 500) {
		static const char msg[] = "FAIL a wait went on through 500 signals: ";
		(void)!write(1, msg, sizeof msg - 1);
		(void)!write(1, waiting_in, strlen(waiting_in));
		(void)!write(1, "\n", 1);
		_exit(1);
	}
}

/* SIGALRM's handler, with or without SA_RESTART, and a timer repeating
 * every 20 ms (0: stopped). */
static void alarms(int restart, int on)
{
	struct sigaction sa;
	struct itimerval it;

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm;
	sa.sa_flags = restart ? SA_RESTART : 0;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
	memset(&it, 0, sizeof it);
	if (on) {
		it.it_value.tv_usec = 20000;
		it.it_interval.tv_usec = 20000;
	}
	ticks = 0;
	setitimer(ITIMER_REAL, &it, NULL);
}

struct resolver {
	struct rdma_cm_id *id;
	struct sockaddr_in dst;
	int rc;
};

/* Once the main thread has been signalled a few times in its wait, give it
 * an event: resolve the device's own address. SIGALRM is blocked here, so
 * every signal goes to the waiting thread. */
static void *resolve_later(void *arg)
{
	struct resolver *r = arg;
	sigset_t s;

	sigemptyset(&s);
	sigaddset(&s, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &s, NULL);
	while (ticks < 5)
		usleep(1000);
	r->rc = rdma_resolve_addr(r->id, NULL, (struct sockaddr *)&r->dst, 2000);
	return NULL;
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_comp_channel *cch;
	struct ibv_cq *cq, *ev_cq;
	void *ev_ctx;
	struct ibv_async_event aev;
	struct rdma_event_channel *ch;
	struct rdma_cm_event *ev;
	struct resolver r;
	pthread_t t;
	int n, rc;

	if (argc < 2) {
		fprintf(stderr, "usage: %s LOCAL_IPV4\n", argv[0]);
		return 2;
	}
	list = ibv_get_device_list(&n);
	need(list && n > 0, "ibv_get_device_list");
	ctx = ibv_open_device(list[0]);
	need(ctx != NULL, "ibv_open_device");
	cch = ibv_create_comp_channel(ctx);
	need(cch != NULL, "ibv_create_comp_channel");
	cq = ibv_create_cq(ctx, 4, NULL, cch, 0);
	need(cq != NULL, "ibv_create_cq on the channel");
	need(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");

	/* Without SA_RESTART: each wait ends with EINTR at the first signal
	 * that finds it blocked. */
	waiting_in = "ibv_get_cq_event";
	alarms(0, 1);
	ERR(ibv_get_cq_event(cch, &ev_cq, &ev_ctx), EINTR);
	alarms(0, 0);

	waiting_in = "ibv_get_async_event";
	alarms(0, 1);
	ERR(ibv_get_async_event(ctx, &aev), EINTR);
	alarms(0, 0);

	ch = rdma_create_event_channel();
	need(ch != NULL, "rdma_create_event_channel");
	memset(&r, 0, sizeof r);
	need(rdma_create_id(ch, &r.id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	waiting_in = "rdma_get_cm_event";
	alarms(0, 1);
	ERR(rdma_get_cm_event(ch, &ev), EINTR);
	alarms(0, 0);

	/* With SA_RESTART: the same wait goes on through the signals to the
	 * event another thread causes (the channel is intact after the EINTR
	 * above). */
	r.dst.sin_family = AF_INET;
	need(inet_pton(AF_INET, argv[1], &r.dst.sin_addr) == 1, "the device's address");
	waiting_in = "rdma_get_cm_event with SA_RESTART";
	alarms(1, 1);
	need(pthread_create(&t, NULL, resolve_later, &r) == 0, "pthread_create");
	errno = 0;
	rc = rdma_get_cm_event(ch, &ev);
	n = ticks;
	alarms(1, 0);
	pthread_join(t, NULL);
	report(r.rc == 0, "rdma_resolve_addr of the device's own address", "rc %d", r.rc);
	report(rc == 0 && ev->event == RDMA_CM_EVENT_ADDR_RESOLVED && n >= 5,
	       "rdma_get_cm_event with SA_RESTART waits through the signals to its event",
	       "rc %d errno %d (%s), event %s, %d signals", rc, errno, strerror(errno),
	       rc == 0 ? rdma_event_str(ev->event) : "none", n);
	if (rc == 0)
		rdma_ack_cm_event(ev);

	rdma_destroy_id(r.id);
	rdma_destroy_event_channel(ch);
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(cch);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return summary();
}
