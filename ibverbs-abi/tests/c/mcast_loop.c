/*
 * UD multicast through urnic's libibverbs.so.1, as a C program uses it:
 * two UD QPs attach to a group (ibv_attach_mcast), a third sends to it
 * through an address handle on the group's GID with remote QPN 0xFFFFFF,
 * and each member gets its own completion (the device delivers its own
 * group sends to its attached QPs, as an HCA does). After ibv_detach_mcast
 * the detached QP gets nothing more. Run in a network namespace where
 * exactly one urnic device exists (ibverbs-abi/tests/c_programs.rs runs it).
 * One line per check; exit status 1 if any failed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define QKEY 0x11111111u
#define SLOT 4096
#define GRH 40

#include "check.h"

static void check(int ok, const char *what)
{
	report(ok, what, NULL);
}

static struct ibv_qp *ud_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_UD,
		.sq_sig_all = 1,
	};
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1, .qkey = QKEY };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);

	need(qp != NULL, "ibv_create_qp(UD)");
	need(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), "INIT");
	a.qp_state = IBV_QPS_RTR;
	need(!ibv_modify_qp(qp, &a, IBV_QP_STATE), "RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 1;
	need(!ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN), "RTS");
	return qp;
}

static void post_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *buf, int slot)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(buf + slot * SLOT), .length = SLOT, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;

	need(!ibv_post_recv(qp, &wr, &bad), "ibv_post_recv");
}

/* Wait for `n` completions (a hang guard, not a timing check). */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	int got = 0;
	long spins = 0;

	while (got < n && spins++ < 200000000L) {
		int k = ibv_poll_cq(cq, n - got, wc + got);

		if (k < 0)
			return -1;
		got += k;
	}
	return got;
}

int main(void)
{
	struct ibv_device **devs;
	struct ibv_context *ctx;
	struct ibv_device_attr da;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp *tx, *m1, *m2;
	struct ibv_ah *ah;
	struct ibv_ah_attr aa;
	union ibv_gid group;
	struct ibv_wc wc[8];
	char *buf;
	int i, n;

	devs = ibv_get_device_list(&n);
	need(devs && n == 1, "exactly one device");
	ctx = ibv_open_device(devs[0]);
	need(ctx != NULL, "ibv_open_device");
	need(!ibv_query_device(ctx, &da), "ibv_query_device");
	check(da.max_mcast_grp > 0 && da.max_mcast_qp_attach >= 2, "the device offers multicast");
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	buf = calloc(16, SLOT);
	need(pd && cq && buf, "PD, CQ, buffer");
	mr = ibv_reg_mr(pd, buf, 16 * SLOT, IBV_ACCESS_LOCAL_WRITE);
	need(mr != NULL, "ibv_reg_mr");
	tx = ud_qp(pd, cq);
	m1 = ud_qp(pd, cq);
	m2 = ud_qp(pd, cq);

	/* ::ffff:239.5.5.5 */
	memset(&group, 0, sizeof(group));
	group.raw[10] = 0xff;
	group.raw[11] = 0xff;
	group.raw[12] = 239;
	group.raw[13] = 5;
	group.raw[14] = 5;
	group.raw[15] = 5;
	check(ibv_attach_mcast(m1, &group, 0) == 0, "ibv_attach_mcast(m1)");
	check(ibv_attach_mcast(m2, &group, 0) == 0, "ibv_attach_mcast(m2)");
	for (i = 0; i < 2; i++) {
		post_recv(m1, mr, buf, 2 + i);
		post_recv(m2, mr, buf, 4 + i);
	}

	memset(&aa, 0, sizeof(aa));
	aa.is_global = 1;
	aa.grh.dgid = group;
	aa.grh.sgid_index = 1;
	aa.grh.hop_limit = 1;
	aa.port_num = 1;
	ah = ibv_create_ah(pd, &aa);
	need(ah != NULL, "ibv_create_ah(group)");

	for (int round = 0; round < 2; round++) {
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 32, .lkey = mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 100 + round, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad;
		int want = round == 0 ? 3 : 2, recv_m1 = 0, recv_m2 = 0, ok = 1;

		snprintf(buf, 32, "to the group, round %d", round);
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = 0xffffff;
		wr.wr.ud.remote_qkey = QKEY;
		if (round == 1)
			check(ibv_detach_mcast(m1, &group, 0) == 0, "ibv_detach_mcast(m1)");
		need(!ibv_post_send(tx, &wr, &bad), "ibv_post_send to the group");
		n = poll_n(cq, wc, want);
		check(n == want, round == 0 ? "a send and two receive completions" : "a send and one receive completion");
		for (i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				ok = 0;
			if (wc[i].opcode != IBV_WC_RECV)
				continue;
			if (wc[i].qp_num == m1->qp_num)
				recv_m1++;
			if (wc[i].qp_num == m2->qp_num)
				recv_m2++;
			if (wc[i].src_qp != tx->qp_num || wc[i].byte_len != GRH + 32 || !(wc[i].wc_flags & IBV_WC_GRH) ||
			    strcmp(buf + wc[i].wr_id * SLOT + GRH, buf) != 0)
				ok = 0;
		}
		check(ok, "every completion succeeded, from the sender, with GRH and the data");
		check(recv_m1 == (round == 0) && recv_m2 == 1,
		      round == 0 ? "one copy at each member" : "nothing at the detached QP, one copy at the other");
	}
	/* m1's receives are still posted: nothing arrived after the detach. */
	check(ibv_poll_cq(cq, 8, wc) == 0, "no late completion");
	check(ibv_detach_mcast(m1, &group, 0) == EINVAL, "detaching m1 again: EINVAL");
	check(ibv_destroy_qp(m2) == EBUSY, "destroying an attached QP: EBUSY");
	check(ibv_detach_mcast(m2, &group, 0) == 0, "ibv_detach_mcast(m2)");

	need(!ibv_destroy_ah(ah), "ibv_destroy_ah");
	need(!ibv_destroy_qp(tx) && !ibv_destroy_qp(m1) && !ibv_destroy_qp(m2), "ibv_destroy_qp");
	need(!ibv_dereg_mr(mr) && !ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd), "teardown");
	need(!ibv_close_device(ctx), "ibv_close_device");
	ibv_free_device_list(devs);
	free(buf);
	return summary();
}
