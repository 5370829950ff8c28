// SPDX-License-Identifier: GPL-2.0 OR BSD-2-Clause
/*
 * urnic's XDP program: RoCEv2 (UDP to our port, addressed to one of our IPs
 * or to an IP multicast group) goes to the AF_XDP socket of the receiving
 * queue; everything else (ARP,
 * ICMP, ND, other UDP, TCP) passes to the kernel, which keeps answering ARP
 * and neighbour solicitations for us. Optional test impairments (drop,
 * corrupt, ECN CE marking) act on our traffic only. Counters per reason in a
 * per-CPU array.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_ADDRS 8

/* Mirrored by `Config` in src/lib.rs: keep the layouts identical. */
struct urnic_cfg {
	__u16 udp_port;      /* host order */
	__u16 n_ipv4;
	__u16 n_ipv6;
	__u16 pad0;
	__u32 ipv4[MAX_ADDRS]; /* network order, as on the wire */
	__u8 ipv6[MAX_ADDRS][16];
	__u32 drop_thresh;   /* act when bpf_get_prandom_u32() < thresh; 0xffffffff = always */
	__u32 corrupt_thresh;
	__u32 ce_thresh;
	__u32 pad1;
	__u64 ce_above_pps;  /* 0 = off */
};
_Static_assert(sizeof(struct urnic_cfg) == 192, "struct urnic_cfg layout changed: update lib.rs");

enum counter {
	C_SEEN,
	C_REDIRECTED,
	C_PASS_NOT_IP,
	C_PASS_NOT_UDP,
	C_PASS_OTHER_PORT,
	C_PASS_NOT_OURS,
	C_PASS_MALFORMED,
	C_PASS_NO_SOCKET,
	C_IMPAIR_DROPPED,
	C_IMPAIR_CE_MARKED,
	C_IMPAIR_CORRUPTED,
	C_MAX,
};

/* ce_above_pps: GCRA (virtual scheduling) state, shared by all CPUs. */
struct rate_state {
	__u64 tat_ns; /* theoretical arrival time of the next conforming frame */
};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct urnic_cfg);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Rate meter of ce_above_pps (reset by the loader when it changes). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rate_state);
} rate SEC(".maps");

static __always_inline void count(__u32 c)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &c);
	if (v)
		*v += 1;
}

static __always_inline int pass(__u32 c)
{
	count(c);
	return XDP_PASS;
}

/* RoCEv2 multicast (UD, DestQP 0xFFFFFF) to any group the kernel let in:
 * the engine delivers it to the group's attached QPs or counts it as a
 * group without a member (rx_mcast_no_member). The kernel filters groups
 * by MAC where the NIC does (the device joins through a socket, IGMP/MLD). */
static __always_inline int ipv4_is_ours(const struct urnic_cfg *cfg, __u32 daddr)
{
	if (cfg->n_ipv4 == 0 && cfg->n_ipv6 == 0)
		return 1;
	/* 224.0.0.0/4 (RFC 5771) */
	if ((bpf_ntohl(daddr) & 0xf0000000) == 0xe0000000)
		return 1;
#pragma unroll
	for (int i = 0; i < MAX_ADDRS; i++) {
		if (i < cfg->n_ipv4 && cfg->ipv4[i] == daddr)
			return 1;
	}
	return 0;
}

static __always_inline int ipv6_is_ours(const struct urnic_cfg *cfg, const struct in6_addr *daddr)
{
	if (cfg->n_ipv4 == 0 && cfg->n_ipv6 == 0)
		return 1;
	/* ff00::/8 (RFC 4291) */
	if (daddr->in6_u.u6_addr8[0] == 0xff)
		return 1;
#pragma unroll
	for (int i = 0; i < MAX_ADDRS; i++) {
		if (i >= cfg->n_ipv6)
			break;
		const __u32 *a = (const __u32 *)cfg->ipv6[i];
		if (a[0] == daddr->in6_u.u6_addr32[0] && a[1] == daddr->in6_u.u6_addr32[1] &&
		    a[2] == daddr->in6_u.u6_addr32[2] && a[3] == daddr->in6_u.u6_addr32[3])
			return 1;
	}
	return 0;
}

/* RFC 1624 incremental update of the IPv4 header checksum for one 16-bit word. */
static __always_inline void csum_replace2(__u16 *csum, __u16 old, __u16 new)
{
	__u32 sum = (__u16)~bpf_ntohs(*csum);
	sum += (__u16)~old;
	sum += new;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	*csum = bpf_htons(~sum & 0xffff);
}

/* True with probability thresh / 2^32; thresh 0 = never, 0xffffffff = always. */
static __always_inline int chance(__u32 thresh)
{
	if (thresh == 0)
		return 0;
	if (thresh == 0xffffffff)
		return 1;
	return bpf_get_prandom_u32() < thresh;
}

/* Whether a frame of ours arriving now exceeds ce_above_pps. A phantom
 * queue (a virtual queue drained at the limit, as in HULL, Alizadeh et al.,
 * NSDI 2012): every frame adds one interval (1e9 / pps ns) of virtual
 * backlog, kept as the time the queue would be empty (tat_ns). A frame is
 * marked while the backlog exceeds the burst tolerance of max(250 us, one
 * interval); the backlog is capped one interval above that tolerance, so
 * marking stops within an interval once the rate falls below the limit.
 * Under a sustained rate above the limit nearly every frame is marked (the
 * step marking of a switch whose queue sits above its ECN threshold); below
 * it, none is. The state is shared by all CPUs; concurrent updates may lose
 * a little precision. */
static __always_inline int over_rate(const struct urnic_cfg *cfg)
{
	__u64 pps = cfg->ce_above_pps;
	if (pps == 0)
		return 0;
	__u64 interval = 1000000000ULL / pps;
	if (interval == 0)
		return 0; /* more than one frame per ns: never exceeded */
	__u64 tau = interval > 250000 ? interval : 250000;
	__u32 k = 0;
	struct rate_state *r = bpf_map_lookup_elem(&rate, &k);
	if (!r)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 tat = r->tat_ns;
	if (tat <= now) {
		/* Idle long enough: conforming, the schedule restarts now. */
		r->tat_ns = now + interval;
		return 0;
	}
	int over = tat - now > tau;
	__u64 next = tat + interval;
	if (next - now > tau + interval)
		next = now + tau + interval;
	r->tat_ns = next;
	return over;
}

/* Drop and corruption impairments on a frame of ours. Returns XDP_DROP to
 * drop it, else -1; sets *ce when the frame should be CE-marked. */
static __always_inline int impair(const struct urnic_cfg *cfg, struct udphdr *udp, void *data_end, int *ce)
{
	if (chance(cfg->drop_thresh)) {
		count(C_IMPAIR_DROPPED);
		return XDP_DROP;
	}
	if (chance(cfg->corrupt_thresh)) {
		__u8 *payload = (__u8 *)(udp + 1);
		__u32 r = bpf_get_prandom_u32();
		__u32 span = (__u32)(data_end - (void *)payload);
		if (span > 0 && span <= 65535) {
			__u32 off = (r >> 3) % span;
			/* The verifier wants a small bound on a variable packet offset
			 * (header offsets included, under 64 KiB): the first 8 KiB of
			 * payload, the whole payload at any MTU up to 8 KiB. */
			off &= 0x1fff;
			__u8 *p = payload + off;
			if ((void *)(p + 1) <= data_end) {
				*p ^= (__u8)(1 << (r & 7));
				count(C_IMPAIR_CORRUPTED);
			}
		}
	}
	/* Both rules are evaluated so that the rate meter sees every frame. */
	int by_rate = over_rate(cfg);
	int by_chance = chance(cfg->ce_thresh);
	*ce = by_rate || by_chance;
	return -1;
}

static __always_inline int redirect(struct xdp_md *ctx)
{
	__u32 q = ctx->rx_queue_index;
	if (!bpf_map_lookup_elem(&xsks, &q))
		return pass(C_PASS_NO_SOCKET);
	count(C_REDIRECTED);
	return bpf_redirect_map(&xsks, q, XDP_PASS);
}

static __noinline int handle_ipv4(struct xdp_md *ctx, const struct urnic_cfg *cfg, __u32 l3_off)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	if (l3_off > 64)
		return pass(C_PASS_MALFORMED);
	struct iphdr *ip4 = data + l3_off;
	if ((void *)(ip4 + 1) > data_end)
		return pass(C_PASS_MALFORMED);
	if (ip4->ihl < 5)
		return pass(C_PASS_MALFORMED);
	if (ip4->protocol != IPPROTO_UDP)
		return pass(C_PASS_NOT_UDP);
	/* Later fragments carry no UDP header: the kernel reassembles. */
	if (ip4->frag_off & bpf_htons(0x1fff))
		return pass(C_PASS_OTHER_PORT);
	struct udphdr *udp = (void *)ip4 + ip4->ihl * 4;
	if ((void *)(udp + 1) > data_end)
		return pass(C_PASS_MALFORMED);
	if (udp->dest != bpf_htons(cfg->udp_port))
		return pass(C_PASS_OTHER_PORT);
	if (!ipv4_is_ours(cfg, ip4->daddr))
		return pass(C_PASS_NOT_OURS);
	int ce = 0;
	int v = impair(cfg, udp, data_end, &ce);
	if (v >= 0)
		return v;
	/* ECN-capable (ECT(0) or ECT(1)) only; RFC 1624 checksum update. */
	if (ce && (ip4->tos & 3) != 0 && (ip4->tos & 3) != 3) {
		__u16 old = bpf_ntohs(*(__u16 *)ip4);
		ip4->tos |= 3;
		csum_replace2(&ip4->check, old, bpf_ntohs(*(__u16 *)ip4));
		count(C_IMPAIR_CE_MARKED);
	}
	return redirect(ctx);
}

static __noinline int handle_ipv6(struct xdp_md *ctx, const struct urnic_cfg *cfg, __u32 l3_off)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	if (l3_off > 64)
		return pass(C_PASS_MALFORMED);
	struct ipv6hdr *ip6 = data + l3_off;
	if ((void *)(ip6 + 1) > data_end)
		return pass(C_PASS_MALFORMED);
	if (ip6->nexthdr != IPPROTO_UDP)
		return pass(C_PASS_NOT_UDP);
	struct udphdr *udp = (void *)(ip6 + 1);
	if ((void *)(udp + 1) > data_end)
		return pass(C_PASS_MALFORMED);
	if (udp->dest != bpf_htons(cfg->udp_port))
		return pass(C_PASS_OTHER_PORT);
	if (!ipv6_is_ours(cfg, &ip6->daddr))
		return pass(C_PASS_NOT_OURS);
	int ce = 0;
	int v = impair(cfg, udp, data_end, &ce);
	if (v >= 0)
		return v;
	/* ECN: bits 4..5 of the second byte (the traffic class's low bits). */
	__u8 *b = (__u8 *)ip6;
	__u8 ecn = (b[1] >> 4) & 3;
	if (ce && (ecn == 1 || ecn == 2)) {
		b[1] |= 0x30;
		count(C_IMPAIR_CE_MARKED);
	}
	return redirect(ctx);
}

/* xdp.frags: frames larger than a page arrive as several buffers (jumbo
 * MTUs, AF_XDP multi-buffer). Only the first buffer is directly readable,
 * and it holds every header this program looks at. */
SEC("xdp.frags")
int urnic_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 k = 0;
	const struct urnic_cfg *cfg = bpf_map_lookup_elem(&config, &k);

	count(C_SEEN);
	if (!cfg)
		return XDP_PASS;

	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return pass(C_PASS_MALFORMED);
	__u16 proto = eth->h_proto;
	__u32 l3_off = sizeof(*eth);
	/* One 802.1Q / 802.1ad tag. */
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		if (data + l3_off + 4 > data_end)
			return pass(C_PASS_MALFORMED);
		proto = *(__u16 *)(data + l3_off + 2);
		l3_off += 4;
	}
	if (proto == bpf_htons(ETH_P_IP))
		return handle_ipv4(ctx, cfg, l3_off);
	if (proto == bpf_htons(ETH_P_IPV6))
		return handle_ipv6(ctx, cfg, l3_off);
	return pass(C_PASS_NOT_IP);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
