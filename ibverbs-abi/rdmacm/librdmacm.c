/* librdmacm.so.1 for urnic: forwarders to the RDMA-CM calls inside urnic's
 * libibverbs.so.1 (exported there as urnic_rdma_* under the private version
 * node URNIC_PRIVATE_1). The CM lives in libibverbs.so.1 so that the ids,
 * contexts and QPs it hands out are the ones libibverbs knows: one copy of
 * the device state per process (see ibverbs-abi/src/rdmacm/mod.rs).
 * rsockets are not offered: rpoll on ordinary descriptors is poll(2), every
 * other r* call fails with ENOSYS. Built by ibverbs-abi/link.sh. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <rdma/rdma_cma.h>

#define P(name) urnic_##name
int P(rdma_accept)(struct rdma_cm_id *, struct rdma_conn_param *);
int P(rdma_ack_cm_event)(struct rdma_cm_event *);
int P(rdma_bind_addr)(struct rdma_cm_id *, struct sockaddr *);
int P(rdma_connect)(struct rdma_cm_id *, struct rdma_conn_param *);
int P(rdma_create_ep)(struct rdma_cm_id **, struct rdma_addrinfo *, struct ibv_pd *, struct ibv_qp_init_attr *);
struct rdma_event_channel *P(rdma_create_event_channel)(void);
int P(rdma_create_id)(struct rdma_event_channel *, struct rdma_cm_id **, void *, enum rdma_port_space);
int P(rdma_create_qp)(struct rdma_cm_id *, struct ibv_pd *, struct ibv_qp_init_attr *);
int P(rdma_create_qp_ex)(struct rdma_cm_id *, struct ibv_qp_init_attr_ex *);
void P(rdma_destroy_ep)(struct rdma_cm_id *);
void P(rdma_destroy_event_channel)(struct rdma_event_channel *);
int P(rdma_destroy_id)(struct rdma_cm_id *);
void P(rdma_destroy_qp)(struct rdma_cm_id *);
int P(rdma_disconnect)(struct rdma_cm_id *);
int P(rdma_establish)(struct rdma_cm_id *);
const char *P(rdma_event_str)(enum rdma_cm_event_type);
void P(rdma_free_devices)(struct ibv_context **);
void P(rdma_freeaddrinfo)(struct rdma_addrinfo *);
int P(rdma_get_cm_event)(struct rdma_event_channel *, struct rdma_cm_event **);
struct ibv_context **P(rdma_get_devices)(int *);
__be16 P(rdma_get_dst_port)(struct rdma_cm_id *);
int P(rdma_get_request)(struct rdma_cm_id *, struct rdma_cm_id **);
__be16 P(rdma_get_src_port)(struct rdma_cm_id *);
int P(rdma_getaddrinfo)(const char *, const char *, const struct rdma_addrinfo *, struct rdma_addrinfo **);
int P(rdma_init_qp_attr)(struct rdma_cm_id *, struct ibv_qp_attr *, int *);
int P(rdma_join_multicast)(struct rdma_cm_id *, struct sockaddr *, void *);
int P(rdma_join_multicast_ex)(struct rdma_cm_id *, struct rdma_cm_join_mc_attr_ex *, void *);
int P(rdma_leave_multicast)(struct rdma_cm_id *, struct sockaddr *);
int P(rdma_listen)(struct rdma_cm_id *, int);
int P(rdma_migrate_id)(struct rdma_cm_id *, struct rdma_event_channel *);
int P(rdma_reject)(struct rdma_cm_id *, const void *, uint8_t);
int P(rdma_resolve_addr)(struct rdma_cm_id *, struct sockaddr *, struct sockaddr *, int);
int P(rdma_resolve_route)(struct rdma_cm_id *, int);
int P(rdma_set_option)(struct rdma_cm_id *, int, int, void *, size_t);
void P(rdma_fini)(void);

/* At exit: the CM agent runs in this process, so let it send what it owes
 * (DREQ/DREP/REJ) and flush a URNIC_PCAP capture before the process goes. */
__attribute__((destructor)) static void urnic_librdmacm_fini(void) { P(rdma_fini)(); }

int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p) { return P(rdma_accept)(id, p); }
int rdma_ack_cm_event(struct rdma_cm_event *e) { return P(rdma_ack_cm_event)(e); }
int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *a) { return P(rdma_bind_addr)(id, a); }
int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *p) { return P(rdma_connect)(id, p); }
int rdma_create_ep(struct rdma_cm_id **id, struct rdma_addrinfo *res, struct ibv_pd *pd, struct ibv_qp_init_attr *a)
{ return P(rdma_create_ep)(id, res, pd, a); }
struct rdma_event_channel *rdma_create_event_channel(void) { return P(rdma_create_event_channel)(); }
int rdma_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id, void *ctx, enum rdma_port_space ps)
{ return P(rdma_create_id)(ch, id, ctx, ps); }
int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_qp_init_attr *a) { return P(rdma_create_qp)(id, pd, a); }
int rdma_create_qp_ex(struct rdma_cm_id *id, struct ibv_qp_init_attr_ex *a) { return P(rdma_create_qp_ex)(id, a); }
void rdma_destroy_ep(struct rdma_cm_id *id) { P(rdma_destroy_ep)(id); }
void rdma_destroy_event_channel(struct rdma_event_channel *ch) { P(rdma_destroy_event_channel)(ch); }
int rdma_destroy_id(struct rdma_cm_id *id) { return P(rdma_destroy_id)(id); }
void rdma_destroy_qp(struct rdma_cm_id *id) { P(rdma_destroy_qp)(id); }
int rdma_disconnect(struct rdma_cm_id *id) { return P(rdma_disconnect)(id); }
int rdma_establish(struct rdma_cm_id *id) { return P(rdma_establish)(id); }
const char *rdma_event_str(enum rdma_cm_event_type e) { return P(rdma_event_str)(e); }
void rdma_free_devices(struct ibv_context **l) { P(rdma_free_devices)(l); }
void rdma_freeaddrinfo(struct rdma_addrinfo *r) { P(rdma_freeaddrinfo)(r); }
int rdma_get_cm_event(struct rdma_event_channel *ch, struct rdma_cm_event **e) { return P(rdma_get_cm_event)(ch, e); }
struct ibv_context **rdma_get_devices(int *n) { return P(rdma_get_devices)(n); }
__be16 rdma_get_dst_port(struct rdma_cm_id *id) { return P(rdma_get_dst_port)(id); }
int rdma_get_request(struct rdma_cm_id *l, struct rdma_cm_id **id) { return P(rdma_get_request)(l, id); }
__be16 rdma_get_src_port(struct rdma_cm_id *id) { return P(rdma_get_src_port)(id); }
int rdma_getaddrinfo(const char *node, const char *service, const struct rdma_addrinfo *hints, struct rdma_addrinfo **res)
{ return P(rdma_getaddrinfo)(node, service, hints, res); }
int rdma_init_qp_attr(struct rdma_cm_id *id, struct ibv_qp_attr *a, int *mask) { return P(rdma_init_qp_attr)(id, a, mask); }
int rdma_join_multicast(struct rdma_cm_id *id, struct sockaddr *a, void *ctx) { return P(rdma_join_multicast)(id, a, ctx); }
int rdma_leave_multicast(struct rdma_cm_id *id, struct sockaddr *a) { return P(rdma_leave_multicast)(id, a); }
int rdma_listen(struct rdma_cm_id *id, int backlog) { return P(rdma_listen)(id, backlog); }
int rdma_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *ch) { return P(rdma_migrate_id)(id, ch); }
int rdma_reject(struct rdma_cm_id *id, const void *d, uint8_t len) { return P(rdma_reject)(id, d, len); }
int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *s, struct sockaddr *d, int ms) { return P(rdma_resolve_addr)(id, s, d, ms); }
int rdma_resolve_route(struct rdma_cm_id *id, int ms) { return P(rdma_resolve_route)(id, ms); }
int rdma_set_option(struct rdma_cm_id *id, int level, int name, void *v, size_t len) { return P(rdma_set_option)(id, level, name, v, len); }

/* Shared receive queues on an id: libibverbs' SRQ on the id's PD. */
int rdma_create_srq(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct ibv_srq *srq;
	if (!id || !attr) { errno = EINVAL; return -1; }
	if (!pd) pd = id->pd;
	if (!pd) { errno = EINVAL; return -1; }
	srq = ibv_create_srq(pd, attr);
	if (!srq) return -1;
	id->pd = pd;
	id->srq = srq;
	return 0;
}
int rdma_create_srq_ex(struct rdma_cm_id *id, struct ibv_srq_init_attr_ex *attr)
{
	struct ibv_srq_init_attr a;
	if (!id || !attr) { errno = EINVAL; return -1; }
	if (attr->comp_mask & ~(uint32_t)(IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE) ||
	    ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC)) {
		errno = EOPNOTSUPP; /* XRC and tag-matching SRQs are not urnic's */
		return -1;
	}
	a.srq_context = attr->srq_context;
	a.attr = attr->attr;
	return rdma_create_srq(id, (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) ? attr->pd : NULL, &a);
}
void rdma_destroy_srq(struct rdma_cm_id *id)
{
	if (id && id->srq) { ibv_destroy_srq(id->srq); id->srq = NULL; }
}
/* rdma_notify: IBV_EVENT_COMM_EST (traffic before the RTU) establishes. */
int rdma_notify(struct rdma_cm_id *id, enum ibv_event_type event)
{
	if (event != IBV_EVENT_COMM_EST) { errno = EINVAL; return -1; }
	return rdma_establish(id);
}
int rdma_join_multicast_ex(struct rdma_cm_id *id, struct rdma_cm_join_mc_attr_ex *a, void *ctx)
{ return P(rdma_join_multicast_ex)(id, a, ctx); }
/* ECE: not offered (a ConnectX feature). */
int rdma_set_local_ece(struct rdma_cm_id *id, struct ibv_ece *ece) { (void)id; (void)ece; errno = EOPNOTSUPP; return -1; }
int rdma_get_remote_ece(struct rdma_cm_id *id, struct ibv_ece *ece) { (void)id; (void)ece; errno = EOPNOTSUPP; return -1; }
int rdma_reject_ece(struct rdma_cm_id *id, const void *d, uint8_t len) { return rdma_reject(id, d, len); }

/* rsockets: out of scope. rpoll on ordinary descriptors is poll(2). */
int rpoll(struct pollfd *fds, nfds_t nfds, int timeout) { return poll(fds, nfds, timeout); }
#define NOSYS(decl) decl { errno = ENOSYS; return -1; }
NOSYS(int rsocket(int d, int t, int p))
NOSYS(int rbind(int s, const struct sockaddr *a, socklen_t l))
NOSYS(int rlisten(int s, int b))
NOSYS(int raccept(int s, struct sockaddr *a, socklen_t *l))
NOSYS(int rconnect(int s, const struct sockaddr *a, socklen_t l))
NOSYS(int rshutdown(int s, int h))
NOSYS(int rclose(int s))
NOSYS(ssize_t rrecv(int s, void *b, size_t l, int f))
NOSYS(ssize_t rrecvfrom(int s, void *b, size_t l, int f, struct sockaddr *a, socklen_t *al))
NOSYS(ssize_t rrecvmsg(int s, struct msghdr *m, int f))
NOSYS(ssize_t rsend(int s, const void *b, size_t l, int f))
NOSYS(ssize_t rsendto(int s, const void *b, size_t l, int f, const struct sockaddr *a, socklen_t al))
NOSYS(ssize_t rsendmsg(int s, const struct msghdr *m, int f))
NOSYS(ssize_t rread(int s, void *b, size_t c))
NOSYS(ssize_t rreadv(int s, const struct iovec *v, int n))
NOSYS(ssize_t rwrite(int s, const void *b, size_t c))
NOSYS(ssize_t rwritev(int s, const struct iovec *v, int n))
NOSYS(int rselect(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *t))
NOSYS(int rgetpeername(int s, struct sockaddr *a, socklen_t *l))
NOSYS(int rgetsockname(int s, struct sockaddr *a, socklen_t *l))
NOSYS(int rsetsockopt(int s, int lv, int n, const void *v, socklen_t l))
NOSYS(int rgetsockopt(int s, int lv, int n, void *v, socklen_t *l))
NOSYS(off_t riomap(int s, void *b, size_t l, int p, int f, off_t o))
NOSYS(int riounmap(int s, void *b, size_t l))
NOSYS(size_t riowrite(int s, const void *b, size_t c, off_t o, int f))
int rfcntl(int s, int cmd, ...) { (void)s; (void)cmd; errno = ENOSYS; return -1; }
