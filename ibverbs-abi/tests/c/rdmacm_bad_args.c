/*
 * Bad input to urnic's librdmacm.so.1: NULL or invalid arguments, calls in
 * the wrong state, options and port spaces urnic does not take must get -1
 * with the errno librdmacm (rdma-core 44 over the kernel's rdma_ucm) gives,
 * never a crash. Where librdmacm itself would dereference a NULL argument
 * urnic answers EINVAL. Compiled against the system's <rdma/rdma_cma.h>,
 * linked with urnic's librdmacm.so.1 and libibverbs.so.1, run in a network
 * namespace holding one urnic device whose address is argv[1]
 * (ibverbs-abi/tests/rdmacm_c.rs runs it).
 *
 * One line per check ("ok"/"FAIL"); a summary "N checks, M failed"; exit
 * status 1 if any check failed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#include "check.h"

static struct sockaddr_in sin_of(const char *ip, int port)
{
	struct sockaddr_in s;

	memset(&s, 0, sizeof s);
	s.sin_family = AF_INET;
	s.sin_port = htons(port);
	inet_pton(AF_INET, ip, &s.sin_addr);
	return s;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id, *id2, *udid;
	struct rdma_cm_event *ev;
	struct rdma_addrinfo hints, *res;
	struct sockaddr_in local, other, nowhere;
	struct sockaddr_un_like { sa_family_t f; char p[108]; } unix_addr;
	struct ibv_qp_init_attr qpa;
	struct ibv_qp_attr qattr;
	int v, mask, flags, fds[2];
	struct pollfd pfd;

	if (argc < 2) {
		fprintf(stderr, "usage: %s LOCAL_IPV4\n", argv[0]);
		return 2;
	}
	local = sin_of(argv[1], 0);
	other = sin_of("192.0.2.1", 0); /* TEST-NET-1: not ours */

	ch = rdma_create_event_channel();
	need(ch != NULL, "rdma_create_event_channel");
	need(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id TCP");

	/* rdma_create_id: NULL out pointer; a port space the kernel refuses
	 * (ucma_get_qp_type: EINVAL); RDMA_PS_IB: not urnic's. */
	ERR(rdma_create_id(ch, NULL, NULL, RDMA_PS_TCP), EINVAL);
	ERR(rdma_create_id(ch, &id2, NULL, (enum rdma_port_space)0x7777), EINVAL);
	ERR(rdma_create_id(ch, &id2, NULL, RDMA_PS_IB), EPROTONOSUPPORT);

	/* Calls in the wrong state (the kernel's cma_comp_exch: EINVAL). */
	ERR(rdma_resolve_route(id, 1000), EINVAL);
	ERR(rdma_connect(id, NULL), EINVAL);
	ERR(rdma_accept(id, NULL), EINVAL);
	ERR(rdma_reject(id, NULL, 0), EINVAL);
	ERR(rdma_disconnect(id), EINVAL);
	ERR(rdma_establish(id), EINVAL);

	/* rdma_bind_addr: NULL; a family RDMA-CM has no IP for; an address no
	 * urnic device has (rdma_translate_ip: EADDRNOTAVAIL). */
	ERR(rdma_bind_addr(id, NULL), EINVAL);
	memset(&unix_addr, 0, sizeof unix_addr);
	unix_addr.f = AF_UNIX;
	ERR(rdma_bind_addr(id, (struct sockaddr *)&unix_addr), EAFNOSUPPORT);
	ERR(rdma_bind_addr(id, (struct sockaddr *)&other), EADDRNOTAVAIL);
	/* Control: our address binds; twice is EINVAL; a second id on the same
	 * address and port is EADDRINUSE. */
	need(rdma_bind_addr(id, (struct sockaddr *)&local) == 0, "rdma_bind_addr local");
	report(id->verbs != NULL, "bound id has the device's ibv_context", NULL);
	report(rdma_get_src_port(id) != 0, "rdma_get_src_port after an ephemeral bind", NULL);
	ERR(rdma_bind_addr(id, (struct sockaddr *)&local), EINVAL);
	need(rdma_create_id(ch, &id2, NULL, RDMA_PS_TCP) == 0, "rdma_create_id 2");
	local.sin_port = rdma_get_src_port(id);
	ERR(rdma_bind_addr(id2, (struct sockaddr *)&local), EADDRINUSE);
	local.sin_port = 0;

	/* rdma_resolve_addr: no destination. */
	ERR(rdma_resolve_addr(id2, NULL, NULL, 1000), EINVAL);

	/* rdma_create_qp: NULL attributes; an id on no device yet. */
	memset(&qpa, 0, sizeof qpa);
	qpa.qp_type = IBV_QPT_RC;
	qpa.cap.max_send_wr = qpa.cap.max_recv_wr = 4;
	qpa.cap.max_send_sge = qpa.cap.max_recv_sge = 1;
	ERR(rdma_create_qp(id, NULL, NULL), EINVAL);
	ERR(rdma_create_qp(id2, NULL, &qpa), EINVAL);
	/* Control: a QP on the bound id, with the CQs librdmacm makes, in INIT. */
	need(rdma_create_qp(id, NULL, &qpa) == 0, "rdma_create_qp");
	report(id->qp && id->qp->state == IBV_QPS_INIT && id->send_cq && id->recv_cq && id->pd, "rdma_create_qp: INIT, CQs, PD", NULL);
	ERR(rdma_create_qp(id, NULL, &qpa), EINVAL); /* one QP per id */

	/* rdma_init_qp_attr: NULL; INIT for an RC id; RTR before any request or response. */
	ERR(rdma_init_qp_attr(id, NULL, &mask), EINVAL);
	memset(&qattr, 0, sizeof qattr);
	qattr.qp_state = IBV_QPS_INIT;
	report(rdma_init_qp_attr(id, &qattr, &mask) == 0 && (mask & IBV_QP_STATE) && qattr.port_num == 1,
	       "rdma_init_qp_attr INIT", NULL);
	qattr.qp_state = IBV_QPS_RTR;
	ERR(rdma_init_qp_attr(id, &qattr, &mask), EINVAL); /* no request, no response yet */

	/* rdma_set_option: NULL value, wrong length, unknown names; the common
	 * ones are taken. */
	v = 1;
	ERR(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, NULL, sizeof v), EINVAL);
	ERR(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &v, 1), EINVAL);
	ERR(rdma_set_option(id, RDMA_OPTION_ID, 99, &v, sizeof v), EINVAL);
	ERR(rdma_set_option(id, 42, 0, &v, sizeof v), EINVAL);
	report(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &v, sizeof v) == 0, "REUSEADDR taken", NULL);
	report(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &v, sizeof v) == 0, "AFONLY taken", NULL);
	{
		uint8_t tos = 32;
		report(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos) == 0, "TOS taken", NULL);
	}

	/* Events: NULL arguments; a non-blocking channel with nothing queued. */
	ERR(rdma_get_cm_event(NULL, &ev), EINVAL);
	ERR(rdma_get_cm_event(ch, NULL), EINVAL);
	ERR(rdma_ack_cm_event(NULL), EINVAL);
	flags = fcntl(ch->fd, F_GETFL);
	need(fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK) == 0, "O_NONBLOCK");
	ERR(rdma_get_cm_event(ch, &ev), EAGAIN);
	pfd.fd = ch->fd;
	pfd.events = POLLIN;
	report(poll(&pfd, 1, 0) == 0, "the channel fd polls empty", NULL);

	/* A neighbour nobody answers for: 0, then ADDR_ERROR with a status. */
	nowhere = sin_of(argv[1], 0);
	nowhere.sin_addr.s_addr = htonl((ntohl(nowhere.sin_addr.s_addr) & ~0xffu) | 0xfe);
	need(rdma_create_id(ch, &udid, NULL, RDMA_PS_UDP) == 0, "rdma_create_id UDP");
	report(udid->qp_type == IBV_QPT_UD, "RDMA_PS_UDP ids are UD", NULL);
	if (rdma_resolve_addr(udid, NULL, (struct sockaddr *)&nowhere, 500) == 0) {
		pfd.fd = ch->fd;
		report(poll(&pfd, 1, 10000) == 1, "the channel fd polls readable with an event", NULL);
		need(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event");
		report(ev->event == RDMA_CM_EVENT_ADDR_ERROR && ev->status < 0 && ev->id == udid,
		       "unresolvable neighbour: ADDR_ERROR", "%s status %d", rdma_event_str(ev->event), ev->status);
		rdma_ack_cm_event(ev);
	} else {
		report(0, "rdma_resolve_addr of a silent neighbour", "errno %d", errno);
	}

	/* Multicast: a TCP (RC) id cannot join; nothing joined to leave
	 * (the rest: loopback-test/tests/mckey_programs.rs, rdmacm_mcast.c). */
	ERR(rdma_join_multicast(id, (struct sockaddr *)&local, NULL), EINVAL);
	ERR(rdma_leave_multicast(id, (struct sockaddr *)&local), EADDRNOTAVAIL);

	/* rdma_getaddrinfo: a bad host is getaddrinfo's EAI code. */
	memset(&hints, 0, sizeof hints);
	hints.ai_flags = RAI_NUMERICHOST;
	hints.ai_port_space = RDMA_PS_TCP;
	v = rdma_getaddrinfo("not-an-address", "7471", &hints, &res);
	report(v == EAI_NONAME, "rdma_getaddrinfo of a bad numeric host", "rc %d (%s)", v, gai_strerror(v));
	ERR(rdma_getaddrinfo(argv[1], "7471", &hints, NULL), EINVAL);
	hints.ai_flags = RAI_PASSIVE;
	report(rdma_getaddrinfo(NULL, "7471", &hints, &res) == 0 && res->ai_src_addr && !res->ai_dst_addr &&
	       res->ai_qp_type == IBV_QPT_RC, "rdma_getaddrinfo passive", NULL);
	rdma_freeaddrinfo(res);

	/* Strings and rsockets. */
	report(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0, "rdma_event_str", NULL);
	report(strcmp(rdma_event_str((enum rdma_cm_event_type)99), "UNKNOWN EVENT") == 0, "rdma_event_str unknown", NULL);
	ERR(rsocket(AF_INET, SOCK_STREAM, 0), ENOSYS);
	need(pipe(fds) == 0, "pipe");
	need(write(fds[1], "x", 1) == 1, "write");
	pfd.fd = fds[0];
	pfd.events = POLLIN;
	report(rpoll(&pfd, 1, 1000) == 1 && (pfd.revents & POLLIN), "rpoll on a pipe is poll", NULL);

	/* Destroy: NULL; then everything, controls. */
	ERR(rdma_destroy_id(NULL), EINVAL);
	ERR(rdma_migrate_id(NULL, ch), EINVAL);
	rdma_destroy_qp(id);
	report(id->qp == NULL, "rdma_destroy_qp", NULL);
	report(rdma_destroy_id(udid) == 0 && rdma_destroy_id(id2) == 0 && rdma_destroy_id(id) == 0, "rdma_destroy_id", NULL);
	rdma_destroy_event_channel(ch);

	return summary();
}
