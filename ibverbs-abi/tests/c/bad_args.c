/*
 * Bad input to urnic's libibverbs.so.1: NULL or invalid arguments and
 * attributes must get the answer libibverbs gives (NULL with errno, -1 with
 * errno, or a returned error code, as each verb's man page says), never a
 * crash. Compiled against the system's <infiniband/verbs.h>, linked with
 * -libverbs and run with urnic's library first on LD_LIBRARY_PATH, in a
 * network namespace where exactly one urnic device exists
 * (ibverbs-abi/tests/c_programs.rs runs it).
 *
 * The expected answers are rdma-core 44's with the rxe provider on a 6.1
 * kernel (libibverbs/verbs.c, cmd_device.c, providers/rxe/rxe.c and the
 * kernel's uverbs and rxe checks), cited next to each check. Where rdma-core
 * itself would crash (a NULL object: it dereferences it) urnic answers
 * EINVAL; where urnic's answer differs from rxe's a comment says why.
 *
 * Every check also has a control: the same call with good arguments
 * succeeds, so a failure is the argument's fault and not a broken object.
 * One line per check ("ok"/"FAIL"); exit status 1 if any check failed.
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"

/* A verb that returns an object: NULL with errno `want`. */
static void expect_null(const void *p, int err, int want, const char *what)
{
	if (p)
		report(0, what, "returned an object, expected NULL/%s",
		       strerror(want));
	else
		report(err == want, what, "NULL, errno %d (%s), expected %d (%s)",
		       err, strerror(err), want, strerror(want));
}

/* A verb that returns an error code (0 or an errno value). */
static void expect_rc(int rc, int want, const char *what)
{
	report(rc == want, what, "returned %d (%s), expected %d (%s)", rc,
	       rc > 0 ? strerror(rc) : "-", want, want ? strerror(want) : "success");
}

/* A verb that returns -1 and sets errno (`want` 0: any errno). */
static void expect_m1(int rc, int err, int want, const char *what)
{
	if (want)
		report(rc == -1 && err == want, what,
		       "returned %d, errno %d (%s), expected -1/%s", rc, err,
		       strerror(err), strerror(want));
	else
		report(rc == -1, what, "returned %d, errno %d (%s), expected -1",
		       rc, err, strerror(err));
}

/* errno right after the call, before printing can change it. */
#define NULL_CALL(expr, want, what)                                            \
	do {                                                                   \
		void *p_;                                                      \
		errno = 0;                                                     \
		p_ = (void *)(expr);                                           \
		expect_null(p_, errno, want, what);                            \
	} while (0)

#define M1_CALL(expr, want, what)                                              \
	do {                                                                   \
		int rc_;                                                       \
		errno = 0;                                                     \
		rc_ = (expr);                                                  \
		expect_m1(rc_, errno, want, what);                             \
	} while (0)

static struct ibv_qp_init_attr qp_init(struct ibv_cq *cq, enum ibv_qp_type t)
{
	struct ibv_qp_init_attr a;

	memset(&a, 0, sizeof(a));
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = t;
	a.cap.max_send_wr = 8;
	a.cap.max_recv_wr = 8;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	return a;
}

static int to_init(struct ibv_qp *qp, int port, int access)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = access;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					     IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int to_rtr(struct ibv_qp *qp, const union ibv_gid *dgid, int sgid_index,
		  uint32_t dqpn, enum ibv_mtu mtu)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dqpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.sgid_index = sgid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC |
					     IBV_QP_MIN_RNR_TIMER);
}

static int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
					     IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

int main(void)
{
	struct ibv_device **devs;
	struct ibv_context *ctx;
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	union ibv_gid gid0, gid;
	struct ibv_gid_entry ge;
	uint16_t pkey;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_comp_channel *ch;
	struct ibv_qp *qp;
	struct ibv_qp_init_attr qa;
	struct ibv_qp_attr attr;
	struct ibv_sge sge[64];
	struct ibv_send_wr swr, *bad_s;
	struct ibv_recv_wr rwr, *bad_r;
	struct ibv_wc wc[2];
	char *buf;
	int n, rc, i;

	/* --- devices ------------------------------------------------------ */
	devs = ibv_get_device_list(&n);
	need(devs != NULL && n == 1, "ibv_get_device_list: exactly one urnic device");
	printf("device %s\n", ibv_get_device_name(devs[0]));

	/* rdma-core dereferences the device (verbs_open_device): a crash.
	 * urnic only opens devices of its own list: EINVAL. */
	NULL_CALL(ibv_open_device(NULL), EINVAL, "ibv_open_device(NULL)");
	ctx = ibv_open_device(devs[0]);
	need(ctx != NULL, "ibv_open_device");

	/* --- queries ------------------------------------------------------ */
	expect_rc(ibv_query_device(ctx, &da), 0, "ibv_query_device (control)");
	report(da.max_mcast_grp == 8192 && da.max_mcast_qp_attach == 56 && da.max_total_mcast_qp_attach == 0x70000,
	       "ibv_query_device: rxe's multicast limits", "max_mcast_grp %d max_mcast_qp_attach %d max_total_mcast_qp_attach %d",
	       da.max_mcast_grp, da.max_mcast_qp_attach, da.max_total_mcast_qp_attach);
	/* rdma-core writes through the NULL attr (a crash); urnic: EINVAL. */
	expect_rc(ibv_query_device(ctx, NULL), EINVAL, "ibv_query_device(attr NULL)");

	/* The inline ibv_query_port goes through verbs_context.query_port:
	 * the kernel's ib_query_port rejects a port outside 1..phys_port_cnt
	 * with EINVAL (rdma_is_port_valid), returned as the error code. */
	expect_rc(ibv_query_port(ctx, 1, &pa), 0, "ibv_query_port(port 1) (control)");
	report(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET &&
		       pa.gid_tbl_len > 0,
	       "port 1 is an active Ethernet port with GIDs", "state %d link_layer %d gid_tbl_len %d",
	       pa.state, pa.link_layer, pa.gid_tbl_len);
	expect_rc(ibv_query_port(ctx, 0, &pa), EINVAL, "ibv_query_port(port 0)");
	expect_rc(ibv_query_port(ctx, 2, &pa), EINVAL, "ibv_query_port(port 2)");
	/* The exported (compat) ibv_query_port, as old binaries call it. */
	expect_rc((ibv_query_port)(ctx, 0, (struct _compat_ibv_port_attr *)&pa), EINVAL,
		  "compat ibv_query_port(port 0)");
	expect_rc((ibv_query_port)(ctx, 2, (struct _compat_ibv_port_attr *)&pa), EINVAL,
		  "compat ibv_query_port(port 2)");
	expect_rc(ibv_query_port(ctx, 1, &pa), 0, "ibv_query_port(port 1) again");
	/* The exported ibv_query_port fills rdma-core's struct
	 * _compat_ibv_port_attr (defined in verbs.c, not the header: struct
	 * ibv_port_attr up to `flags`) and nothing past it (__lib_query_port
	 * copies exactly that size). */
	{
		struct ibv_port_attr compat;
		const size_t csz = (offsetof(struct ibv_port_attr, flags) + 1 + 3) & ~(size_t)3;
		const unsigned char *b = (const unsigned char *)&compat;
		size_t k;
		int untouched = 1;

		memset(&compat, 0xa5, sizeof(compat));
		rc = (ibv_query_port)(ctx, 1, (struct _compat_ibv_port_attr *)&compat);
		for (k = csz; k < sizeof(compat); k++)
			untouched &= b[k] == 0xa5;
		report(rc == 0 && memcmp(&compat, &pa, csz) == 0 && untouched,
		       "compat ibv_query_port(port 1) fills the compat struct and nothing past it",
		       "rc %d, %s, %s", rc, memcmp(&compat, &pa, csz) ? "fields differ" : "fields agree",
		       untouched ? "tail untouched" : "tail written");
	}

	/* ibv_query_gid: -1 on failure (verbs.c: `if (ret) return -1`), with
	 * errno not specified; urnic sets EINVAL. An index past the table is
	 * EINVAL in the kernel (rdma_get_gid_attr) and in the sysfs fallback. */
	expect_rc(ibv_query_gid(ctx, 1, 0, &gid0), 0, "ibv_query_gid(index 0) (control)");
	M1_CALL(ibv_query_gid(ctx, 1, pa.gid_tbl_len, &gid), EINVAL, "ibv_query_gid(index gid_tbl_len)");
	M1_CALL(ibv_query_gid(ctx, 1, -1, &gid), EINVAL, "ibv_query_gid(index -1)");
	M1_CALL(ibv_query_gid(ctx, 2, 0, &gid), EINVAL, "ibv_query_gid(port 2)");

	/* ibv_query_pkey: -1 when sysfs has no ports/N/pkeys/I. */
	expect_rc(ibv_query_pkey(ctx, 1, 0, &pkey), 0, "ibv_query_pkey(index 0) (control)");
	report(pkey == htobe16(0xffff), "P_Key 0 is the default partition", "0x%04x", be16toh(pkey));
	M1_CALL(ibv_query_pkey(ctx, 1, 1, &pkey), EINVAL, "ibv_query_pkey(index 1)");
	M1_CALL(ibv_query_pkey(ctx, 1, -1, &pkey), EINVAL, "ibv_query_pkey(index -1)");
	M1_CALL(ibv_query_pkey(ctx, 2, 0, &pkey), EINVAL, "ibv_query_pkey(port 2)");

	/* ibv_query_gid_ex (inline, calls _ibv_query_gid_ex): the error code.
	 * Index past the table: EINVAL (kernel rdma_get_gid_attr; sysfs
	 * fallback query_sysfs_gid_entry). Bad port: EINVAL. Unknown flags:
	 * EINVAL (uverbs_get_flags32). */
	expect_rc(ibv_query_gid_ex(ctx, 1, 0, &ge, 0), 0, "ibv_query_gid_ex(index 0) (control)");
	report(memcmp(&ge.gid, &gid0, sizeof(gid0)) == 0 && ge.gid_index == 0 && ge.port_num == 1,
	       "ibv_query_gid_ex agrees with ibv_query_gid", NULL);
	expect_rc(ibv_query_gid_ex(ctx, 1, pa.gid_tbl_len, &ge, 0), EINVAL,
		  "ibv_query_gid_ex(index gid_tbl_len)");
	expect_rc(ibv_query_gid_ex(ctx, 1, 100000, &ge, 0), EINVAL, "ibv_query_gid_ex(index 100000)");
	expect_rc(ibv_query_gid_ex(ctx, 2, 0, &ge, 0), EINVAL, "ibv_query_gid_ex(port 2)");
	expect_rc(ibv_query_gid_ex(ctx, 1, 0, &ge, 1), EINVAL, "ibv_query_gid_ex(flags 1)");

	/* ibv_query_device_ex (inline): input->comp_mask != 0 is EINVAL in
	 * the helper itself; urnic has no query_device_ex op, so the helper
	 * falls back to ibv_query_device, which must work. */
	{
		struct ibv_device_attr_ex dax;
		struct ibv_query_device_ex_input in;

		memset(&dax, 0xa5, sizeof(dax));
		expect_rc(ibv_query_device_ex(ctx, NULL, &dax), 0,
			  "ibv_query_device_ex (legacy fallback)");
		report(dax.orig_attr.max_qp_wr == da.max_qp_wr && dax.orig_attr.max_cqe == da.max_cqe &&
			       dax.comp_mask == 0 && dax.odp_caps.general_caps == 0,
		       "ibv_query_device_ex: orig_attr as ibv_query_device, the rest zeroed", NULL);
		memset(&in, 0, sizeof(in));
		in.comp_mask = 1;
		expect_rc(ibv_query_device_ex(ctx, &in, &dax), EINVAL,
			  "ibv_query_device_ex(input comp_mask 1)");
	}

	/* --- PD and MR ---------------------------------------------------- */
	/* rdma-core: get_ops(NULL) is a crash; urnic: EINVAL. */
	NULL_CALL(ibv_alloc_pd(NULL), EINVAL, "ibv_alloc_pd(NULL)");
	pd = ibv_alloc_pd(ctx);
	need(pd != NULL, "ibv_alloc_pd");
	buf = aligned_alloc(4096, 1 << 16);
	need(buf != NULL, "aligned_alloc");
	memset(buf, 0, 1 << 16);

	/* rdma-core dereferences pd->context (a crash); urnic: EINVAL. */
	NULL_CALL(ibv_reg_mr(NULL, buf, 4096, IBV_ACCESS_LOCAL_WRITE), EINVAL, "ibv_reg_mr(pd NULL)");
	/* The kernel cannot pin page 0 (ib_umem_get: pin_user_pages_fast
	 * fails): EFAULT. */
	NULL_CALL(ibv_reg_mr(pd, NULL, 4096, IBV_ACCESS_LOCAL_WRITE), EFAULT, "ibv_reg_mr(addr NULL)");
	/* ib_umem_get: npages == 0 is EINVAL. */
	NULL_CALL(ibv_reg_mr(pd, buf, 0, IBV_ACCESS_LOCAL_WRITE), EINVAL, "ibv_reg_mr(length 0)");
	/* ib_check_mr_access: remote write or atomic without local write is
	 * EINVAL (IBA o10-18). */
	NULL_CALL(ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_REMOTE_WRITE), EINVAL,
		  "ibv_reg_mr(REMOTE_WRITE without LOCAL_WRITE)");
	NULL_CALL(ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_REMOTE_ATOMIC), EINVAL,
		  "ibv_reg_mr(REMOTE_ATOMIC without LOCAL_WRITE)");
	/* ib_check_mr_access: a bit outside IB_ACCESS_SUPPORTED is EINVAL. */
	NULL_CALL(ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | (1 << 15)), EINVAL,
		  "ibv_reg_mr(unknown access bit 1<<15)");
	/* The optional range (relaxed ordering, ...) is a hint a device may
	 * ignore: accepted. The verbs.h macro sends it to ibv_reg_mr_iova2. */
	mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	report(mr != NULL, "ibv_reg_mr(LOCAL_WRITE | RELAXED_ORDERING) is accepted", mr ? NULL : "errno %d", errno);
	if (mr)
		expect_rc(ibv_dereg_mr(mr), 0, "ibv_dereg_mr (relaxed ordering MR)");

	mr = ibv_reg_mr(pd, buf, 1 << 16,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_MW_BIND);
	need(mr != NULL, "ibv_reg_mr (control)");
	report(mr->addr == buf && mr->length == (1 << 16) && mr->pd == pd && mr->context == ctx,
	       "ibv_mr fields", NULL);
	/* uverbs_free_pd (ib_destroy_usecnt): a PD with objects is EBUSY. */
	expect_rc(ibv_dealloc_pd(pd), EBUSY, "ibv_dealloc_pd with a live MR");

	/* --- CQ and channel ----------------------------------------------- */
	/* rxe_cq_chk_attr: cqe <= 0 or > max_cqe is EINVAL. */
	NULL_CALL(ibv_create_cq(ctx, 0, NULL, NULL, 0), EINVAL, "ibv_create_cq(cqe 0)");
	NULL_CALL(ibv_create_cq(ctx, -1, NULL, NULL, 0), EINVAL, "ibv_create_cq(cqe -1)");
	NULL_CALL(ibv_create_cq(ctx, da.max_cqe + 1, NULL, NULL, 0), EINVAL,
		  "ibv_create_cq(cqe max_cqe + 1)");
	NULL_CALL(ibv_create_cq(NULL, 4, NULL, NULL, 0), EINVAL, "ibv_create_cq(context NULL)");
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	need(cq != NULL, "ibv_create_cq (control)");
	report(cq->cqe >= 64, "ibv_create_cq: cqe at least as asked", "cqe %d", cq->cqe);
	expect_rc(ibv_resize_cq(cq, 0), EINVAL, "ibv_resize_cq(cqe 0)");
	expect_rc(ibv_resize_cq(cq, da.max_cqe + 1), EINVAL, "ibv_resize_cq(cqe max_cqe + 1)");

	/* ibv_poll_cq with num_entries < 0: rxe_poll_cq (and mlx5) loop
	 * `npolled < ne` and return 0 without touching wc. */
	memset(wc, 0x5a, sizeof(wc));
	rc = ibv_poll_cq(cq, -1, wc);
	report(rc == 0 && ((unsigned char *)wc)[0] == 0x5a, "ibv_poll_cq(num_entries -1)",
	       "returned %d, expected 0", rc);
	expect_rc(ibv_poll_cq(cq, 2, wc), 0, "ibv_poll_cq on an empty CQ (control)");

	/* ibv_destroy_comp_channel returns the error code (verbs.c: EBUSY
	 * while channel->refcnt, i.e. CQs use it). */
	ch = ibv_create_comp_channel(ctx);
	need(ch != NULL, "ibv_create_comp_channel");
	{
		struct ibv_cq *ccq = ibv_create_cq(ctx, 4, NULL, ch, 0);

		need(ccq != NULL, "ibv_create_cq on a channel");
		expect_rc(ibv_destroy_comp_channel(ch), EBUSY, "ibv_destroy_comp_channel with a CQ attached");
		expect_rc(ibv_destroy_cq(ccq), 0, "ibv_destroy_cq (channel's CQ)");
		expect_rc(ibv_destroy_comp_channel(ch), 0, "ibv_destroy_comp_channel once free");
	}

	/* --- QP creation -------------------------------------------------- */
	/* rdma-core dereferences attr / pd (a crash); urnic: EINVAL. */
	NULL_CALL(ibv_create_qp(pd, NULL), EINVAL, "ibv_create_qp(attr NULL)");
	qa = qp_init(cq, IBV_QPT_RC);
	NULL_CALL(ibv_create_qp(NULL, &qa), EINVAL, "ibv_create_qp(pd NULL)");
	/* rxe_qp_chk_init: `if (!init->recv_cq || !init->send_cq)` EINVAL. */
	qa = qp_init(cq, IBV_QPT_RC);
	qa.send_cq = NULL;
	NULL_CALL(ibv_create_qp(pd, &qa), EINVAL, "ibv_create_qp(send_cq NULL)");
	/* rxe_qp_chk_init: a type other than RC/UC/UD/GSI is EOPNOTSUPP. */
	qa = qp_init(cq, IBV_QPT_XRC_SEND);
	NULL_CALL(ibv_create_qp(pd, &qa), EOPNOTSUPP, "ibv_create_qp(IBV_QPT_XRC_SEND)");
	qa = qp_init(cq, IBV_QPT_RAW_PACKET);
	NULL_CALL(ibv_create_qp(pd, &qa), EOPNOTSUPP, "ibv_create_qp(IBV_QPT_RAW_PACKET)");
	/* rxe_qp_chk_cap: each cap above the device's is EINVAL. */
	qa = qp_init(cq, IBV_QPT_RC);
	qa.cap.max_send_wr = da.max_qp_wr + 1;
	NULL_CALL(ibv_create_qp(pd, &qa), EINVAL, "ibv_create_qp(max_send_wr max_qp_wr + 1)");
	qa = qp_init(cq, IBV_QPT_RC);
	qa.cap.max_recv_wr = da.max_qp_wr + 1;
	NULL_CALL(ibv_create_qp(pd, &qa), EINVAL, "ibv_create_qp(max_recv_wr max_qp_wr + 1)");
	qa = qp_init(cq, IBV_QPT_RC);
	qa.cap.max_send_sge = da.max_sge + 1;
	NULL_CALL(ibv_create_qp(pd, &qa), EINVAL, "ibv_create_qp(max_send_sge max_sge + 1)");
	qa = qp_init(cq, IBV_QPT_RC);
	qa.cap.max_recv_sge = da.max_sge + 1;
	NULL_CALL(ibv_create_qp(pd, &qa), EINVAL, "ibv_create_qp(max_recv_sge max_sge + 1)");
	qa = qp_init(cq, IBV_QPT_RC);
	qa.cap.max_inline_data = 1 << 20;
	NULL_CALL(ibv_create_qp(pd, &qa), EINVAL, "ibv_create_qp(max_inline_data 1 MiB)");
	/* Zero queue depths are not bad input: rxe_qp_chk_cap only bounds
	 * them from above (a receive-only or send-only QP), and the caps
	 * written back are at least what was asked. */
	qa = qp_init(cq, IBV_QPT_RC);
	qa.cap.max_send_wr = 0;
	qa.cap.max_recv_wr = 0;
	qp = ibv_create_qp(pd, &qa);
	report(qp != NULL, "ibv_create_qp(max_send_wr 0, max_recv_wr 0) is accepted",
	       qp ? NULL : "errno %d", errno);
	if (qp)
		expect_rc(ibv_destroy_qp(qp), 0, "ibv_destroy_qp (zero-depth QP)");

	/* ibv_create_qp_ex (inline): comp_mask == PD alone goes to
	 * ibv_create_qp; anything more needs the create_qp_ex op, which urnic
	 * does not offer: NULL/EOPNOTSUPP from the helper. */
	{
		struct ibv_qp_init_attr_ex ax;
		struct ibv_qp *q;

		memset(&ax, 0, sizeof(ax));
		ax.send_cq = cq;
		ax.recv_cq = cq;
		ax.qp_type = IBV_QPT_RC;
		ax.cap.max_send_wr = 4;
		ax.cap.max_recv_wr = 4;
		ax.cap.max_send_sge = 1;
		ax.cap.max_recv_sge = 1;
		ax.comp_mask = IBV_QP_INIT_ATTR_PD;
		ax.pd = pd;
		q = ibv_create_qp_ex(ctx, &ax);
		report(q != NULL, "ibv_create_qp_ex(comp_mask PD) via ibv_create_qp", q ? NULL : "errno %d", errno);
		if (q)
			expect_rc(ibv_destroy_qp(q), 0, "ibv_destroy_qp (qp_ex legacy)");
		ax.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		ax.send_ops_flags = IBV_QP_EX_WITH_SEND;
		NULL_CALL(ibv_create_qp_ex(ctx, &ax), EOPNOTSUPP,
			  "ibv_create_qp_ex(SEND_OPS_FLAGS) without create_qp_ex");
		/* comp_mask PD alone: through ibv_create_qp, which refuses
		 * the type as rxe_qp_chk_init does. */
		ax.comp_mask = IBV_QP_INIT_ATTR_PD;
		ax.qp_type = IBV_QPT_XRC_RECV;
		NULL_CALL(ibv_create_qp_ex(ctx, &ax), EOPNOTSUPP, "ibv_create_qp_ex(IBV_QPT_XRC_RECV)");
	}

	qa = qp_init(cq, IBV_QPT_RC);
	qa.cap.max_send_sge = 2;
	qa.cap.max_recv_sge = 2;
	qp = ibv_create_qp(pd, &qa);
	need(qp != NULL, "ibv_create_qp (control)");
	report(qp->state == IBV_QPS_RESET && qa.cap.max_send_wr >= 8 && qa.cap.max_send_sge >= 2 &&
		       qa.cap.max_recv_sge >= 2,
	       "new QP in RESET, caps written back", "send_wr %u send_sge %u recv_sge %u",
	       qa.cap.max_send_wr, qa.cap.max_send_sge, qa.cap.max_recv_sge);

	/* uverbs_free_cq (ib_destroy_usecnt): a CQ a QP still uses is EBUSY. */
	expect_rc(ibv_destroy_cq(cq), EBUSY, "ibv_destroy_cq of a CQ a QP uses");

	/* --- posting on a RESET QP ---------------------------------------- */
	sge[0].addr = (uintptr_t)buf;
	sge[0].length = 64;
	sge[0].lkey = mr->lkey;
	memset(&swr, 0, sizeof(swr));
	swr.wr_id = 1;
	swr.sg_list = sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	/* rxe: EINVAL, from the doorbell (the kernel's rxe_post_send refuses
	 * a QP below RTS). urnic also points bad_wr at the WR, which was not
	 * posted: bad_wr's meaning in ibv_post_send(3). */
	bad_s = NULL;
	rc = ibv_post_send(qp, &swr, &bad_s);
	report(rc == EINVAL && bad_s == &swr, "ibv_post_send on a RESET QP",
	       "returned %d (%s), bad_wr %s", rc, rc > 0 ? strerror(rc) : "-",
	       bad_s == &swr ? "the WR" : "not the WR");

	/* --- modify_qp ---------------------------------------------------- */
	/* ib_modify_qp_is_ok (rxe_qp_chk_attr): every failure is EINVAL. */
	expect_rc(ibv_modify_qp(NULL, &attr, IBV_QP_STATE), EINVAL, "ibv_modify_qp(qp NULL)");
	expect_rc(ibv_modify_qp(qp, NULL, IBV_QP_STATE), EINVAL, "ibv_modify_qp(attr NULL)");
	rc = to_rtr(qp, &gid0, 0, qp->qp_num, IBV_MTU_1024);
	expect_rc(rc, EINVAL, "ibv_modify_qp RESET -> RTR");
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_RTS;
	expect_rc(ibv_modify_qp(qp, &attr, IBV_QP_STATE), EINVAL, "ibv_modify_qp RESET -> RTS");
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_INIT;
	expect_rc(ibv_modify_qp(qp, &attr, IBV_QP_STATE), EINVAL,
		  "ibv_modify_qp RESET -> INIT without PKEY_INDEX/PORT/ACCESS_FLAGS");
	expect_rc(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL,
		  "ibv_modify_qp RESET -> INIT without ACCESS_FLAGS");
	/* uverbs modify_qp: `IB_QP_PORT && !rdma_is_port_valid` is EINVAL. */
	expect_rc(to_init(qp, 2, IBV_ACCESS_REMOTE_WRITE), EINVAL, "ibv_modify_qp to INIT on port 2");
	expect_rc(to_init(qp, 0, IBV_ACCESS_REMOTE_WRITE), EINVAL, "ibv_modify_qp to INIT on port 0");
	/* A mask bit the RESET -> INIT transition does not allow (RC: AV). */
	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_INIT;
	attr.port_num = 1;
	attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	expect_rc(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
						   IBV_QP_ACCESS_FLAGS | IBV_QP_SQ_PSN),
		  EINVAL, "ibv_modify_qp RESET -> INIT with a disallowed mask bit (SQ_PSN)");
	report(qp->state == IBV_QPS_RESET, "QP still in RESET after the refusals", "state %d", qp->state);
	expect_rc(to_init(qp, 1, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ), 0,
		  "ibv_modify_qp RESET -> INIT (control)");

	/* Posting receives in INIT is allowed; too many SGEs is EINVAL with
	 * bad_wr set (rxe post_one_recv: num_sge > rq->max_sge). */
	for (i = 0; i < 64; i++)
		sge[i] = sge[0];
	memset(&rwr, 0, sizeof(rwr));
	rwr.wr_id = 2;
	rwr.sg_list = sge;
	rwr.num_sge = qa.cap.max_recv_sge + 1;
	bad_r = NULL;
	rc = ibv_post_recv(qp, &rwr, &bad_r);
	report(rc == EINVAL && bad_r == &rwr, "ibv_post_recv with num_sge max_recv_sge + 1",
	       "returned %d (%s), bad_wr %s", rc, rc > 0 ? strerror(rc) : "-",
	       bad_r == &rwr ? "the WR" : "not the WR");
	/* A negative count: rxe's post_one_recv would memcpy num_sge *
	 * sizeof(sge) bytes (a crash); urnic: EINVAL. */
	rwr.num_sge = -1;
	bad_r = NULL;
	rc = ibv_post_recv(qp, &rwr, &bad_r);
	report(rc == EINVAL && bad_r == &rwr, "ibv_post_recv with num_sge -1", "returned %d", rc);
	rwr.num_sge = 1;
	expect_rc(ibv_post_recv(qp, &rwr, &bad_r), 0, "ibv_post_recv (control)");

	/* rxe_qp_chk_attr: a path MTU above the port's is EINVAL; 0 is no
	 * IBA MTU (rxe does not check it; urnic refuses it too). */
	expect_rc(to_rtr(qp, &gid0, 0, qp->qp_num, (enum ibv_mtu)6), EINVAL, "ibv_modify_qp to RTR, path_mtu 6");
	expect_rc(to_rtr(qp, &gid0, 0, qp->qp_num, (enum ibv_mtu)0), EINVAL, "ibv_modify_qp to RTR, path_mtu 0");
	/* rdma_check_ah_attr / the GID cache: an sgid_index past the table is
	 * EINVAL. */
	expect_rc(to_rtr(qp, &gid0, pa.gid_tbl_len, qp->qp_num, IBV_MTU_1024), EINVAL,
		  "ibv_modify_qp to RTR, sgid_index gid_tbl_len");
	report(qp->state == IBV_QPS_INIT, "QP still in INIT after the refusals", "state %d", qp->state);
	/* Connected to itself (our own GID resolves to our own MAC): RTS
	 * without any traffic. */
	expect_rc(to_rtr(qp, &gid0, 0, qp->qp_num, IBV_MTU_1024), 0, "ibv_modify_qp INIT -> RTR (control)");
	expect_rc(to_rts(qp), 0, "ibv_modify_qp RTR -> RTS (control)");

	/* rxe validate_send_wr: num_sge > sq->max_sge is EINVAL, bad_wr set. */
	swr.num_sge = qa.cap.max_send_sge + 1;
	bad_s = NULL;
	rc = ibv_post_send(qp, &swr, &bad_s);
	report(rc == EINVAL && bad_s == &swr, "ibv_post_send with num_sge max_send_sge + 1",
	       "returned %d (%s), bad_wr %s", rc, rc > 0 ? strerror(rc) : "-",
	       bad_s == &swr ? "the WR" : "not the WR");
	/* An opcode that does not exist. rxe queues the WR and fails it at
	 * execution (next_opcode: a LOC_QP_OP_ERR completion); urnic refuses
	 * it at once, EINVAL with bad_wr set, an immediate error as
	 * ibv_post_send(3) allows, and nothing reaches the wire. */
	swr.num_sge = 1;
	swr.opcode = (enum ibv_wr_opcode)0x7f;
	bad_s = NULL;
	rc = ibv_post_send(qp, &swr, &bad_s);
	report(rc == EINVAL && bad_s == &swr, "ibv_post_send with opcode 0x7f", "returned %d", rc);
	swr.opcode = IBV_WR_SEND;

	/* --- memory windows ----------------------------------------------- */
	{
		struct ibv_mw *mw;
		struct ibv_mw_bind bind;

		NULL_CALL(ibv_alloc_mw(pd, (enum ibv_mw_type)3), EINVAL, "ibv_alloc_mw(type 3)");
		mw = ibv_alloc_mw(pd, IBV_MW_TYPE_1);
		report(mw != NULL, "ibv_alloc_mw(type 1) (control)", mw ? NULL : "errno %d", errno);
		if (mw) {
			memset(&bind, 0, sizeof(bind));
			bind.wr_id = 3;
			bind.send_flags = 0;
			/* The verbs.h helper: no MR but a range is EINVAL. */
			bind.bind_info.mr = NULL;
			bind.bind_info.addr = (uintptr_t)buf;
			bind.bind_info.length = 4096;
			expect_rc(ibv_bind_mw(qp, mw, &bind), EINVAL, "ibv_bind_mw without an MR");
			bind.bind_info.mr = mr;
			bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
			rc = ibv_bind_mw(qp, mw, &bind);
			expect_rc(rc, 0, "ibv_bind_mw (type 1, control)");
			if (rc == 0) {
				/* A region with a window bound cannot go.
				 * rxe_dereg_mr answers EINVAL ("See IBA
				 * 10.6.7.2.6"); urnic answers EBUSY, the
				 * errno rdma-core gives for every other
				 * object still in use (PD, CQ, channel). */
				expect_rc(ibv_dereg_mr(mr), EBUSY, "ibv_dereg_mr with a type-1 window bound");
			}
			expect_rc(ibv_dealloc_mw(mw), 0, "ibv_dealloc_mw");
		}
	}

	/* --- SRQ ---------------------------------------------------------- */
	{
		struct ibv_srq_init_attr sa;
		struct ibv_srq *srq;

		/* rxe_srq_chk_init: max_wr <= 0, > max_srq_wr, or max_sge >
		 * max_srq_sge is EINVAL. */
		memset(&sa, 0, sizeof(sa));
		sa.attr.max_wr = 0;
		sa.attr.max_sge = 1;
		NULL_CALL(ibv_create_srq(pd, &sa), EINVAL, "ibv_create_srq(max_wr 0)");
		sa.attr.max_wr = da.max_srq_wr + 1;
		NULL_CALL(ibv_create_srq(pd, &sa), EINVAL, "ibv_create_srq(max_wr max_srq_wr + 1)");
		sa.attr.max_wr = 16;
		sa.attr.max_sge = da.max_srq_sge + 1;
		NULL_CALL(ibv_create_srq(pd, &sa), EINVAL, "ibv_create_srq(max_sge max_srq_sge + 1)");
		NULL_CALL(ibv_create_srq(pd, NULL), EINVAL, "ibv_create_srq(attr NULL)");
		NULL_CALL(ibv_create_srq(NULL, &sa), EINVAL, "ibv_create_srq(pd NULL)");
		sa.attr.max_sge = 1;
		srq = ibv_create_srq(pd, &sa);
		report(srq != NULL, "ibv_create_srq (control)", srq ? NULL : "errno %d", errno);
		if (srq) {
			rwr.num_sge = 2;
			bad_r = NULL;
			rc = ibv_post_srq_recv(srq, &rwr, &bad_r);
			report(rc == EINVAL && bad_r == &rwr, "ibv_post_srq_recv with num_sge max_sge + 1",
			       "returned %d", rc);
			rwr.num_sge = 1;
			expect_rc(ibv_post_srq_recv(srq, &rwr, &bad_r), 0, "ibv_post_srq_recv (control)");
			expect_rc(ibv_destroy_srq(srq), 0, "ibv_destroy_srq");
		}
	}

	/* --- AH and multicast --------------------------------------------- */
	{
		struct ibv_ah_attr ah;
		struct ibv_ah *a;
		struct ibv_qp *ud;
		union ibv_gid mgid;

		/* rdma_check_ah_attr: a RoCE AH without a GRH is EINVAL. */
		memset(&ah, 0, sizeof(ah));
		ah.is_global = 0;
		ah.dlid = 1;
		ah.port_num = 1;
		NULL_CALL(ibv_create_ah(pd, &ah), EINVAL, "ibv_create_ah without is_global");
		NULL_CALL(ibv_create_ah(pd, NULL), EINVAL, "ibv_create_ah(attr NULL)");
		/* An sgid_index past the GID table: EINVAL (the GID cache,
		 * rdma_get_gid_attr). */
		ah.is_global = 1;
		ah.grh.dgid = gid0;
		ah.grh.sgid_index = pa.gid_tbl_len;
		NULL_CALL(ibv_create_ah(pd, &ah), EINVAL, "ibv_create_ah(sgid_index gid_tbl_len)");
		ah.grh.sgid_index = 0;
		ah.grh.hop_limit = 64;
		a = ibv_create_ah(pd, &ah);
		report(a != NULL, "ibv_create_ah to our own GID (control)", a ? NULL : "errno %d", errno);
		if (a)
			expect_rc(ibv_destroy_ah(a), 0, "ibv_destroy_ah");

		/* UD multicast, rxe's answers: ib_attach_mcast refuses a GID
		 * that is not multicast and a QP that is not UD (EINVAL);
		 * attaching twice is 0 (rxe_attach_mcg, uverbs); detaching
		 * what is not attached is EINVAL (rxe_detach_mcg); a QP still
		 * attached cannot be destroyed (uverbs_free_qp: EBUSY). */
		qa = qp_init(cq, IBV_QPT_UD);
		ud = ibv_create_qp(pd, &qa);
		need(ud != NULL, "ibv_create_qp(UD)");
		memset(&mgid, 0, sizeof(mgid));
		mgid.raw[0] = 0xff;
		mgid.raw[1] = 0x0e;
		mgid.raw[15] = 0x01;
		expect_rc(ibv_attach_mcast(ud, &gid0, 0), EINVAL, "ibv_attach_mcast(unicast GID)");
		expect_rc(ibv_attach_mcast(qp, &mgid, 0), EINVAL, "ibv_attach_mcast(RC QP)");
		expect_rc(ibv_attach_mcast(ud, NULL, 0), EINVAL, "ibv_attach_mcast(gid NULL)");
		expect_rc(ibv_detach_mcast(ud, &mgid, 0), EINVAL, "ibv_detach_mcast before any attach");
		expect_rc(ibv_attach_mcast(ud, &mgid, 0), 0, "ibv_attach_mcast(ff0e::1)");
		expect_rc(ibv_attach_mcast(ud, &mgid, 0), 0, "ibv_attach_mcast twice");
		expect_rc(ibv_destroy_qp(ud), EBUSY, "ibv_destroy_qp while attached");
		expect_rc(ibv_detach_mcast(ud, &mgid, 0), 0, "ibv_detach_mcast");
		expect_rc(ibv_detach_mcast(ud, &mgid, 0), EINVAL, "ibv_detach_mcast twice");
		memset(&mgid, 0, sizeof(mgid));
		mgid.raw[10] = 0xff;
		mgid.raw[11] = 0xff;
		mgid.raw[12] = 239;
		mgid.raw[15] = 7;
		expect_rc(ibv_attach_mcast(ud, &mgid, 0), 0, "ibv_attach_mcast(::ffff:239.0.0.7)");
		expect_rc(ibv_detach_mcast(ud, &mgid, 0), 0, "ibv_detach_mcast(::ffff:239.0.0.7)");
		mgid.raw[12] = 240;
		expect_rc(ibv_attach_mcast(ud, &mgid, 0), EINVAL, "ibv_attach_mcast(::ffff:240.0.0.7, not multicast)");
		expect_rc(ibv_destroy_qp(ud), 0, "ibv_destroy_qp (UD)");
	}

	/* --- teardown, in the order the objects allow ---------------------- */
	expect_rc(ibv_destroy_qp(qp), 0, "ibv_destroy_qp");
	expect_rc(ibv_destroy_cq(cq), 0, "ibv_destroy_cq once no QP uses it");
	expect_rc(ibv_dereg_mr(mr), 0, "ibv_dereg_mr");
	expect_rc(ibv_dealloc_pd(pd), 0, "ibv_dealloc_pd once empty");
	expect_rc(ibv_close_device(ctx), 0, "ibv_close_device");
	ibv_free_device_list(devs);
	free(buf);

	return summary();
}
