/*
 * urnic's ibv_post_send / ibv_post_recv / ibv_poll_cq allocate nothing.
 * This program defines malloc and its relatives itself (forwarding to
 * glibc's __libc_* functions), so every heap allocation of the process,
 * urnic's library included, passes through them; those made by the main
 * thread while `counting` is set are counted. It connects an RC QP to
 * itself on the one urnic device (the device loops its own GID back), posts
 * receives, SENDs from an SGE, inline SENDs and two-SGE RDMA WRITEs through
 * the verbs.h inline calls (the library's ops), polls every completion, and
 * expects zero allocations in that loop. The datapath thread is not
 * counted: its work is not the post/poll path. Deterministic, no timing.
 * ibverbs-abi/tests/c_programs.rs runs it in a namespace with one device.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <execinfo.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "check.h"

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

/* volatile: the compiler must not move these stores across a malloc it
 * knows as a builtin. */
static __thread volatile int counting, tracing;
static unsigned long allocations, everyone;

/* The first counted allocation's call stack goes to stderr (library
 * offsets: addr2line -e libibverbs.so.1 resolves them), so a failure says
 * where the library allocated (the control malloc below is not traced). backtrace() is warmed up before counting
 * starts (its first call loads libgcc_s, which allocates). */
static void count(void)
{
	void *stack[48];
	int depth;

	__atomic_fetch_add(&everyone, 1, __ATOMIC_RELAXED);
	if (!counting)
		return;
	if (__atomic_fetch_add(&allocations, 1, __ATOMIC_RELAXED) == 0 && tracing) {
		counting = 0;
		depth = backtrace(stack, 48);
		fprintf(stderr, "no_alloc: the first allocation while posting and polling, from:\n");
		backtrace_symbols_fd(stack, depth, 2);
		counting = 1;
	}
}

void *malloc(size_t n)
{
	count();
	return __libc_malloc(n);
}

void *calloc(size_t n, size_t m)
{
	count();
	return __libc_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
	count();
	return __libc_realloc(p, n);
}

void free(void *p)
{
	__libc_free(p);
}

void *memalign(size_t a, size_t n)
{
	count();
	return __libc_memalign(a, n);
}

void *aligned_alloc(size_t a, size_t n)
{
	count();
	return __libc_memalign(a, n);
}

int posix_memalign(void **out, size_t a, size_t n)
{
	void *p;

	count();
	p = __libc_memalign(a, n);
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

/* Poll until `n` completions came, all successful. */
static void drain(struct ibv_cq *cq, int n)
{
	struct ibv_wc wc[16];
	int got = 0, k, i;

	while (got < n) {
		k = ibv_poll_cq(cq, 16, wc);
		need(k >= 0, "ibv_poll_cq");
		for (i = 0; i < k; i++)
			if (wc[i].status != IBV_WC_SUCCESS) {
				printf("FAIL completion wr_id %llu status %s\n", (unsigned long long)wc[i].wr_id,
				       ibv_wc_status_str(wc[i].status));
				exit(1);
			}
		got += k;
	}
}

/* Three receives; a SEND from an SGE, an inline SEND, a two-SGE WRITE. */
static void round_trip(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mr *mr, char *buf, uint64_t i)
{
	struct ibv_sge rs = { (uintptr_t)(buf + 8192), 256, mr->lkey };
	struct ibv_sge ss = { (uintptr_t)buf, 64, mr->lkey };
	struct ibv_sge two[2] = { { (uintptr_t)buf, 32, mr->lkey }, { (uintptr_t)(buf + 64), 32, mr->lkey } };
	char data[8] = "inline!";
	struct ibv_sge is = { (uintptr_t)data, sizeof(data), 0 };
	struct ibv_recv_wr rwr, *bad_r;
	struct ibv_send_wr s[3], *bad_s;
	int k;

	for (k = 0; k < 2; k++) {
		memset(&rwr, 0, sizeof(rwr));
		rwr.wr_id = i * 8 + k;
		rwr.sg_list = &rs;
		rwr.num_sge = 1;
		need(ibv_post_recv(qp, &rwr, &bad_r) == 0, "ibv_post_recv");
	}
	memset(s, 0, sizeof(s));
	s[0].wr_id = i;
	s[0].sg_list = &ss;
	s[0].num_sge = 1;
	s[0].opcode = IBV_WR_SEND;
	s[0].send_flags = IBV_SEND_SIGNALED;
	s[0].next = &s[1];
	s[1] = s[0];
	s[1].sg_list = &is;
	s[1].send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	s[1].next = &s[2];
	s[2] = s[0];
	s[2].sg_list = two;
	s[2].num_sge = 2;
	s[2].opcode = IBV_WR_RDMA_WRITE;
	s[2].wr.rdma.remote_addr = (uintptr_t)(buf + 16384);
	s[2].wr.rdma.rkey = mr->rkey;
	s[2].next = NULL;
	need(ibv_post_send(qp, s, &bad_s) == 0, "ibv_post_send");
	/* 3 send completions, 2 receive completions, one CQ. */
	drain(cq, 5);
}

int main(void)
{
	struct ibv_device **devs;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_init_attr qa;
	struct ibv_qp_attr a;
	union ibv_gid gid;
	char *buf;
	int n;
	uint64_t i;
	const uint64_t rounds = 500;
	unsigned long before;

	before = __atomic_load_n(&everyone, __ATOMIC_RELAXED);
	devs = ibv_get_device_list(&n);
	need(devs != NULL && n == 1, "ibv_get_device_list: exactly one urnic device");
	ctx = ibv_open_device(devs[0]);
	need(ctx != NULL, "ibv_open_device");
	need(ibv_query_gid(ctx, 1, 1, &gid) == 0, "ibv_query_gid(index 1)");
	pd = ibv_alloc_pd(ctx);
	need(pd != NULL, "ibv_alloc_pd");
	buf = aligned_alloc(4096, 1 << 16);
	need(buf != NULL, "aligned_alloc");
	memset(buf, 1, 1 << 16);
	mr = ibv_reg_mr(pd, buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	need(mr != NULL, "ibv_reg_mr");
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	need(cq != NULL, "ibv_create_cq");
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 16;
	qa.cap.max_recv_wr = 16;
	qa.cap.max_send_sge = 2;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = 64;
	qp = ibv_create_qp(pd, &qa);
	need(qp != NULL, "ibv_create_qp");
	/* The library's own allocations come through this malloc. */
	n = __atomic_load_n(&everyone, __ATOMIC_RELAXED) > before + 1;
	printf("%s the library allocates through this program's malloc (%lu calls while opening the device)\n",
	       n ? "ok  " : "FAIL", __atomic_load_n(&everyone, __ATOMIC_RELAXED) - before);
	if (!n)
		return 1;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	need(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0, "to INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qp->qp_num;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	need(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0,
	     "to RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	need(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
					   IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	     "to RTS");

	/* Warm-up: first-use allocations of this thread are not per post. */
	for (i = 0; i < 20; i++)
		round_trip(qp, cq, mr, buf, i);
	{
		void *warm[4];
		backtrace(warm, 4);
	}
	tracing = 1;
	counting = 1;
	for (i = 0; i < rounds; i++)
		round_trip(qp, cq, mr, buf, 100 + i);
	counting = 0;
	tracing = 0;
	printf("%s %lu heap allocations while posting %llu WRs and polling their completions\n",
	       allocations == 0 ? "ok  " : "FAIL", allocations, (unsigned long long)(rounds * 5));
	/* The counter counts: one malloc on this thread is seen. */
	{
		void *volatile p;

		counting = 1;
		p = malloc(24);
		counting = 0;
		free(p);
	}
	printf("%s the counting allocator saw %lu allocation(s) of a control malloc\n",
	       allocations == 1 ? "ok  " : "FAIL", allocations);

	need(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	need(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	need(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	need(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	need(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(devs);
	free(buf);
	return allocations == 1 ? 0 : 1;
}
