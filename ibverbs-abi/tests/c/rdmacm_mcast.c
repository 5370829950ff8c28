/*
 * RDMA-CM multicast on urnic's librdmacm.so.1 (rdma_join_multicast,
 * rdma_join_multicast_ex, rdma_leave_multicast): bad arguments and wrong
 * states get -1 and librdmacm's / the kernel's errno; a join reports
 * RDMA_CM_EVENT_MULTICAST_JOIN as the kernel's cma_iboe_join_multicast fills
 * it (param.ud: the group's GID, hop limit 64, QPN 0xFFFFFF, RDMA_UDP_QKEY,
 * the join's context as private data); the id's QP is attached (the kernel
 * holds the group: /proc/net/igmp) unless the join is send-only; a send to
 * the group comes back to the attached QP through the device; leaving and
 * destroying the id detach; an attach the device refuses is
 * RDMA_CM_EVENT_MULTICAST_ERROR. Compiled against the system's
 * <rdma/rdma_cma.h>, linked with urnic's libraries, run in a network
 * namespace holding one urnic device whose IPv4 address is argv[1]
 * (loopback-test/tests/mckey_programs.rs runs it).
 *
 * One line per check ("ok"/"FAIL"); a summary "N checks, M failed"; exit
 * status 1 if any check failed.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdint.h>
#include <rdma/rdma_cma.h>

#include "check.h"

static struct sockaddr_in sin_of(const char *ip)
{
	struct sockaddr_in s;

	memset(&s, 0, sizeof s);
	s.sin_family = AF_INET;
	inet_pton(AF_INET, ip, &s.sin_addr);
	return s;
}

/* Whether the kernel holds IPv4 group `ip` on an interface of this namespace. */
static int host_member(const char *ip)
{
	char line[256], want[16];
	struct in_addr a;
	FILE *f = fopen("/proc/net/igmp", "r");
	int found = 0;

	need(f != NULL, "open /proc/net/igmp");
	inet_pton(AF_INET, ip, &a);
	/* /proc/net/igmp prints the group as the host-order hex of s_addr. */
	snprintf(want, sizeof want, "%08X", a.s_addr);
	while (fgets(line, sizeof line, f))
		if (strstr(line, want))
			found = 1;
	fclose(f);
	return found;
}

static struct rdma_cm_event *next_event(struct rdma_event_channel *ch)
{
	struct rdma_cm_event *ev;

	need(rdma_get_cm_event(ch, &ev) == 0, "rdma_get_cm_event");
	return ev;
}

static struct rdma_cm_id *ud_id(struct rdma_event_channel *ch, struct sockaddr_in *local)
{
	struct rdma_cm_id *id;

	need(rdma_create_id(ch, &id, NULL, RDMA_PS_UDP) == 0, "rdma_create_id UDP");
	need(rdma_bind_addr(id, (struct sockaddr *)local) == 0, "rdma_bind_addr");
	return id;
}

static void ud_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa;

	memset(&qa, 0, sizeof qa);
	qa.qp_type = IBV_QPT_UD;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.sq_sig_all = 1;
	need(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp UD");
}

/* A send to the group through the join event's address vector comes back
 * to the id's attached QP (the device loops its own group sends back). */
static void send_to_self(struct rdma_cm_id *id, struct rdma_ud_param *ud)
{
	static char buf[2][4096];
	struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_ah *ah = ibv_create_ah(id->pd, &ud->ah_attr);
	struct ibv_sge rs = { (uintptr_t)buf[1], sizeof buf[1], 0 }, ss = { (uintptr_t)buf[0], 11, 0 };
	struct ibv_recv_wr rwr = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *brw;
	struct ibv_send_wr swr = { .wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND }, *bsw;
	struct ibv_wc wc;
	int got_recv = 0, got_send = 0, spins = 0, n;

	need(mr && ah, "ibv_reg_mr / ibv_create_ah from the join's ah_attr");
	rs.lkey = ss.lkey = mr->lkey;
	memcpy(buf[0], "to my group", 11);
	swr.wr.ud.ah = ah;
	swr.wr.ud.remote_qpn = ud->qp_num;
	swr.wr.ud.remote_qkey = ud->qkey;
	need(ibv_post_recv(id->qp, &rwr, &brw) == 0, "ibv_post_recv");
	need(ibv_post_send(id->qp, &swr, &bsw) == 0, "ibv_post_send to the group");
	/* A hang guard (spins), not a timing assertion. */
	while ((!got_recv || !got_send) && spins++ < 50000000) {
		n = ibv_poll_cq(id->recv_cq, 1, &wc);
		if (n == 1 && wc.wr_id == 1)
			got_recv = 1 + (wc.status == IBV_WC_SUCCESS && wc.byte_len == 40 + 11 && !memcmp(buf[1] + 40, "to my group", 11));
		n = ibv_poll_cq(id->send_cq, 1, &wc);
		if (n == 1 && wc.wr_id == 2)
			got_send = 1 + (wc.status == IBV_WC_SUCCESS);
	}
	report(got_send == 2, "the send to the group completes", "state %d", got_send);
	report(got_recv == 2, "the attached QP receives its own group send (GRH + 11 bytes)", "state %d", got_recv);
	ibv_destroy_ah(ah);
	ibv_dereg_mr(mr);
}

/* A UD id on the device (its context, for ibv_query_device). */
static struct ibv_context *many_ctx(struct rdma_event_channel *ch, struct sockaddr_in *local, struct rdma_cm_id **id)
{
	*id = ud_id(ch, local);
	return (*id)->verbs;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id, *tcp, *unbound, *so, *sync, **many;
	struct ibv_device_attr dattr;
	struct rdma_cm_event *ev;
	struct rdma_cm_join_mc_attr_ex ex;
	struct sockaddr_in local, group, group2, unicast, zero, g;
	struct ibv_ah_attr *ah;
	uint8_t want_gid[16] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 18, 7, 1 };
	int i, errors, joins;

	if (argc != 2) {
		fprintf(stderr, "usage: %s LOCAL_IPV4\n", argv[0]);
		return 2;
	}
	local = sin_of(argv[1]);
	group = sin_of("239.18.7.1");
	group2 = sin_of("239.18.7.2");
	unicast = sin_of("10.1.2.3");
	zero = sin_of("0.0.0.0");
	need((ch = rdma_create_event_channel()) != NULL, "rdma_create_event_channel");

	/* Arguments and states (librdmacm's checks, then the kernel's
	 * rdma_join_multicast: a UD id with an address). */
	id = ud_id(ch, &local);
	ERR(rdma_join_multicast(id, NULL, NULL), EINVAL);
	ERR(rdma_join_multicast_ex(id, NULL, NULL), EINVAL);
	memset(&ex, 0, sizeof ex);
	ex.addr = (struct sockaddr *)&group;
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
	ERR(rdma_join_multicast_ex(id, &ex, NULL), EOPNOTSUPP);
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	ERR(rdma_join_multicast_ex(id, &ex, NULL), EINVAL);
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS;
	ERR(rdma_join_multicast_ex(id, &ex, NULL), EINVAL);
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	ex.join_flags = RDMA_MC_JOIN_FLAG_RESERVED;
	ERR(rdma_join_multicast_ex(id, &ex, NULL), EINVAL);
	ERR(rdma_join_multicast(id, (struct sockaddr *)&unicast, NULL), EINVAL);
	ERR(rdma_join_multicast(id, (struct sockaddr *)&zero, NULL), EINVAL);
	ERR(rdma_leave_multicast(id, (struct sockaddr *)&group), EADDRNOTAVAIL);
	ERR(rdma_leave_multicast(id, NULL), EINVAL);
	need(rdma_create_id(ch, &unbound, NULL, RDMA_PS_UDP) == 0, "rdma_create_id UDP");
	ERR(rdma_join_multicast(unbound, (struct sockaddr *)&group, NULL), EINVAL);
	need(rdma_create_id(ch, &tcp, NULL, RDMA_PS_TCP) == 0, "rdma_create_id TCP");
	need(rdma_bind_addr(tcp, (struct sockaddr *)&local) == 0, "rdma_bind_addr TCP");
	ERR(rdma_join_multicast(tcp, (struct sockaddr *)&group, NULL), EINVAL);
	rdma_destroy_id(unbound);
	rdma_destroy_id(tcp);

	/* A full-member join with the id's QP. */
	ud_qp(id);
	report(!host_member("239.18.7.1"), "the host is not in 239.18.7.1 before the join", NULL);
	OK(rdma_join_multicast(id, (struct sockaddr *)&group, (void *)0x5eed), "rdma_join_multicast");
	ev = next_event(ch);
	report(ev->event == RDMA_CM_EVENT_MULTICAST_JOIN && ev->status == 0 && ev->id == id, "MULTICAST_JOIN", "%s status %d",
	       rdma_event_str(ev->event), ev->status);
	ah = &ev->param.ud.ah_attr;
	report(ev->param.ud.private_data == (void *)0x5eed, "the join's context is the event's private data", "%p",
	       ev->param.ud.private_data);
	report(ev->param.ud.qp_num == 0xffffff && ev->param.ud.qkey == RDMA_UDP_QKEY, "QPN 0xFFFFFF, Q_Key RDMA_UDP_QKEY",
	       "qpn %#x qkey %#x", ev->param.ud.qp_num, ev->param.ud.qkey);
	report(ah->is_global && !memcmp(ah->grh.dgid.raw, want_gid, 16) && ah->grh.hop_limit == 64 && ah->port_num == 1 &&
	       ah->grh.sgid_index == 1 && ah->dlid == 0 && ah->sl == 0,
	       "ah_attr: GRH to ::ffff:239.18.7.1, hop limit 64, port 1, GID index 1, LID 0, SL 0",
	       "global %d hop %d port %d sgid %d", ah->is_global, ah->grh.hop_limit, ah->port_num, ah->grh.sgid_index);
	report(host_member("239.18.7.1"), "the host joined 239.18.7.1 (IGMP)", NULL);
	send_to_self(id, &ev->param.ud);
	rdma_ack_cm_event(ev);
	ERR(rdma_join_multicast(id, (struct sockaddr *)&group, NULL), EADDRINUSE);

	/* Send-only: no attach, no host membership. */
	ex.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	ex.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER;
	ex.addr = (struct sockaddr *)&group2;
	OK(rdma_join_multicast_ex(id, &ex, NULL), "rdma_join_multicast_ex send-only");
	ev = next_event(ch);
	report(ev->event == RDMA_CM_EVENT_MULTICAST_JOIN && ev->param.ud.ah_attr.grh.dgid.raw[15] == 2, "send-only MULTICAST_JOIN", "%s",
	       rdma_event_str(ev->event));
	/* Not attached: detaching the QP from the group is rxe's EINVAL. */
	report(ibv_detach_mcast(id->qp, &ev->param.ud.ah_attr.grh.dgid, 0) == EINVAL, "a send-only join does not attach the QP", NULL);
	rdma_ack_cm_event(ev);
	report(!host_member("239.18.7.2"), "a send-only join does not join the host", NULL);

	/* Leave: detached, the host leaves; a second leave has nothing to leave. */
	OK(rdma_leave_multicast(id, (struct sockaddr *)&group), "rdma_leave_multicast");
	report(!host_member("239.18.7.1"), "the host left 239.18.7.1", NULL);
	ERR(rdma_leave_multicast(id, (struct sockaddr *)&group), EADDRNOTAVAIL);
	OK(rdma_leave_multicast(id, (struct sockaddr *)&group2), "rdma_leave_multicast send-only");

	/* Destroying an id leaves its groups. */
	OK(rdma_join_multicast(id, (struct sockaddr *)&group, NULL), "rejoin");
	rdma_ack_cm_event(next_event(ch));
	report(host_member("239.18.7.1"), "the host is in 239.18.7.1 again", NULL);
	report(rdma_destroy_id(id) == 0, "rdma_destroy_id with a group joined", NULL);
	report(!host_member("239.18.7.1"), "destroying the id left 239.18.7.1", NULL);

	/* A synchronous id: the join returns once its event is in. */
	need(rdma_create_id(NULL, &sync, NULL, RDMA_PS_UDP) == 0, "rdma_create_id sync");
	need(rdma_bind_addr(sync, (struct sockaddr *)&local) == 0, "rdma_bind_addr sync");
	OK(rdma_join_multicast(sync, (struct sockaddr *)&group, NULL), "synchronous rdma_join_multicast");
	OK(rdma_leave_multicast(sync, (struct sockaddr *)&group), "synchronous rdma_leave_multicast");
	rdma_destroy_id(sync);

	/* More QPs on one group than the device allows (max_mcast_qp_attach,
	 * rxe's 56): the attach is refused, reported as MULTICAST_ERROR with
	 * its errno; the refused join is still the id's to leave. */
	need(ibv_query_device(many_ctx(ch, &local, &so), &dattr) == 0, "ibv_query_device");
	many = calloc(dattr.max_mcast_qp_attach + 1, sizeof *many);
	need(many != NULL, "calloc");
	errors = joins = 0;
	g = sin_of("239.18.8.1");
	for (i = 0; i <= dattr.max_mcast_qp_attach; i++) {
		many[i] = i ? ud_id(ch, &local) : so;
		ud_qp(many[i]);
		need(rdma_join_multicast(many[i], (struct sockaddr *)&g, NULL) == 0, "rdma_join_multicast");
		ev = next_event(ch);
		if (ev->event == RDMA_CM_EVENT_MULTICAST_JOIN)
			joins++;
		else if (ev->event == RDMA_CM_EVENT_MULTICAST_ERROR && ev->status < 0 && ev->id == many[i])
			errors++;
		rdma_ack_cm_event(ev);
	}
	report(joins == dattr.max_mcast_qp_attach && errors == 1, "one QP more than max_mcast_qp_attach: MULTICAST_ERROR",
	       "%d joins, %d errors, limit %d", joins, errors, dattr.max_mcast_qp_attach);
	joins = 0;
	for (i = 0; i <= dattr.max_mcast_qp_attach; i++) {
		joins += rdma_leave_multicast(many[i], (struct sockaddr *)&g) == 0;
		rdma_destroy_qp(many[i]);
		rdma_destroy_id(many[i]);
	}
	report(joins == dattr.max_mcast_qp_attach + 1, "every join is left, the refused one too", "%d left", joins);
	report(!host_member("239.18.8.1"), "the host left 239.18.8.1", NULL);
	free(many);
	rdma_destroy_event_channel(ch);

	return summary();
}
