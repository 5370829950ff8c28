#!/usr/bin/env python3
"""Seed inputs for the engine_frames fuzz target, written into
fuzz/seeds/engine_frames/ (committed; a run adds them as a second corpus
directory). Run from anywhere:

    python3 fuzz/seeds/engine_frames.py

The byte format is documented in fuzz/src/engine_frames.rs (module docs);
the helpers below mirror it. Each seed is a scenario worth starting from:
traffic of each QP type partly exchanged, then forged responses, requests,
CNPs and strangers injected mid-flight.
"""
import os

here = os.path.dirname(os.path.abspath(__file__))
dst = os.path.join(here, "engine_frames")

RC, UC, UD = 0, 1, 2

# steps
DELIVER_AB, DELIVER_BA, DROP_AB, DROP_BA, DUP_AB, DUP_BA = 0, 3, 6, 7, 8, 9
PUMP, TIMERS, ADVANCE, POST, RECV, MODIFY, FORGE, MUTATE = 10, 11, 12, 13, 14, 15, 16, 28

# operations of a work request (w0 & 7)
SEND, SEND_IMM, WRITE, WRITE_IMM, READ, CMP_SWAP, FETCH_ADD, SEND_INV = range(8)

# opcode -> extension headers (deth, reth, atomic_eth, aeth, atomic_ack, immdt, ieth, payload)
def layout(op):
    svc, low = op >> 5, op & 0x1F
    L = dict(deth=0, reth=0, atomic_eth=0, aeth=0, atomic_ack=0, immdt=0, ieth=0, payload=1)
    if op == 0x81:
        return dict(L, payload=0)
    if svc == 3:
        return dict(L, deth=1, immdt=int(low == 5))
    if low in (0x03, 0x05, 0x09):
        L["immdt"] = 1
    if low in (0x06, 0x0A):
        L["reth"] = 1
    if low == 0x0B:
        L.update(reth=1, immdt=1)
    if svc == 0:
        if low == 0x0C:
            L.update(reth=1, payload=0)
        if low in (0x0D, 0x0F, 0x10):
            L["aeth"] = 1
        if low == 0x11:
            L.update(aeth=1, payload=0)
        if low == 0x12:
            L.update(aeth=1, atomic_ack=1, payload=0)
        if low in (0x13, 0x14):
            L.update(atomic_eth=1, payload=0)
        if low in (0x16, 0x17):
            L["ieth"] = 1
    return L


def setup(ty, v6=False, s1=0, s2=0, s3=0, s4=0, s5=0, wrs=()):
    out = bytes([ty | (0x80 if v6 else 0), s1, s2, s3, s4, s5, len(wrs)])
    return out + b"".join(wrs)


def wr(op, length, b_posts=False, w3=0, w4=0):
    return bytes([op | (0x80 if b_posts else 0)]) + length.to_bytes(2, "big") + bytes([w3, w4])


def region(idx=0, key=0, from_end=False, off=0):
    return bytes([idx | key << 2 | (0x10 if from_end else 0)]) + (off & 0xFFFF).to_bytes(2, "big")


def forge(op, to_a=False, qpn=0, psn_base=0, delta=0, flags=0, f7=0, reth=None, atomic=None,
          syndrome=0, msn=0, deth=0, imm=0, ieth=None, payload=(0, 0, 0)):
    """A forged frame; the opcode is given as its byte (f1 = 7, raw)."""
    b = bytes([FORGE, 1 if to_a else 0, 7, op, qpn, psn_base, delta & 0xFF, flags, f7])
    L = layout(op)
    if L["deth"]:
        b += bytes([deth])
    if L["reth"]:
        b += reth if reth is not None else region() + bytes([1])
    if L["atomic_eth"]:
        b += (atomic if atomic is not None else region()) + bytes([1, 0])
    if L["aeth"]:
        b += bytes([syndrome, msn])
    if L["atomic_ack"]:
        b += bytes([7])
    if L["immdt"]:
        b += bytes([imm])
    if L["ieth"]:
        b += ieth if ieth is not None else region()
    return b + bytes(payload)


def mutate(link_ba=False, keep=False, what=0, m1=0, bad_icrc=False):
    return bytes([MUTATE, (1 if link_ba else 0) | (2 if keep else 0) | what << 2 | (0x20 if bad_icrc else 0), m1])


PSN_EXPECTED, PSN_NEXT_SEND, PSN_LAST_SEEN = 0, 1, 3
NAK = lambda code: 0x60 | code
ACK = 0x1F
STRANGER, OTHER_FAMILY = 5 << 2, 6 << 2

mixed = [wr(SEND, 3000), wr(WRITE, 5000, w4=2), wr(READ, 2000, w4=4), wr(FETCH_ADD, 8, w4=8), wr(SEND_IMM, 10)]
seeds = {
    # RC: mixed traffic, half exchanged, then an error NAK for an outstanding PSN
    "rc-nak-mid-flight": setup(RC, wrs=mixed) + bytes([DELIVER_AB] * 5 + [DELIVER_BA] * 2)
    + forge(0x11, to_a=True, psn_base=PSN_NEXT_SEND, delta=-2, syndrome=NAK(2)) + bytes([PUMP, TIMERS, PUMP]),
    # RC: PSN sequence error NAKs repeated (rule 3), then timers
    "rc-seq-nak-repeat": setup(RC, wrs=mixed[:2]) + bytes([DELIVER_AB, DROP_AB, DELIVER_AB])
    + forge(0x11, to_a=True, psn_base=PSN_NEXT_SEND, delta=-3, syndrome=NAK(0)) * 3 + bytes([PUMP, TIMERS, PUMP]),
    # RC: READ in flight, forged READ responses around it
    "rc-read-responses": setup(RC, s1=1, wrs=[wr(READ, 900)]) + bytes([DELIVER_AB])
    + forge(0x0D, to_a=True, psn_base=PSN_NEXT_SEND, delta=-4, payload=(2, 0, 9))
    + forge(0x10, to_a=True, psn_base=PSN_NEXT_SEND, delta=-1, payload=(1, 77, 3))
    + forge(0x0F, to_a=True, psn_base=PSN_NEXT_SEND, delta=5, payload=(0, 0, 0)) + bytes([PUMP]),
    # RC: forged WRITE into the responder's region, good and bad keys, mid-stream
    "rc-forged-writes": setup(RC, wrs=[wr(WRITE, 3000)]) + bytes([DELIVER_AB])
    + forge(0x0A, reth=region(0, 0, off=64) + bytes([1]), payload=(1, 40, 5))
    + forge(0x06, psn_base=PSN_EXPECTED, reth=region(0, 2, off=0) + bytes([2]), payload=(2, 0, 1))
    + forge(0x0A, reth=region(1, 0, off=8) + bytes([1]), payload=(6, 0, 2))
    + forge(0x0A, reth=region(0, 0, from_end=True, off=-8) + bytes([1]), payload=(7, 20, 2)) + bytes([PUMP]),
    # RC: forged atomics on every region, aligned and not
    "rc-forged-atomics": setup(RC)
    + forge(0x13, atomic=region(0, 0, off=16)) + forge(0x14, atomic=region(0, 0, off=3))
    + forge(0x14, atomic=region(2, 0, off=0)) + forge(0x13, psn_base=PSN_EXPECTED, delta=-1, atomic=region(0, 0, off=16))
    + bytes([PUMP]),
    # RC: SEND with Invalidate naming an ordinary MR (rule 4)
    "rc-send-inv-mr": setup(RC, s5=0) + forge(0x17, ieth=region(0), payload=(6, 0, 0)) + bytes([PUMP])
    + forge(0x17, psn_base=PSN_EXPECTED, ieth=region(3), payload=(0, 0, 0)) + bytes([PUMP]),
    # RC: responses from a stranger and from the other IP family (rule 1)
    "rc-stranger": setup(RC, wrs=mixed[:3]) + bytes([DELIVER_AB, DELIVER_AB])
    + forge(0x11, to_a=True, psn_base=PSN_NEXT_SEND, delta=-1, f7=STRANGER, syndrome=NAK(2))
    + forge(0x0A, f7=OTHER_FAMILY, reth=region(0) + bytes([1]), payload=(1, 16, 0))
    + forge(0x81, to_a=True, f7=STRANGER) + mutate(what=6) + bytes([PUMP]),
    # RC: responses while nothing is outstanding (rule 2)
    "rc-idle-responses": setup(RC, wrs=[wr(SEND, 100)]) + bytes([PUMP])
    + forge(0x11, to_a=True, psn_base=PSN_NEXT_SEND, delta=-1, syndrome=NAK(1))
    + forge(0x12, to_a=True, psn_base=PSN_NEXT_SEND, delta=-1) + forge(0x10, to_a=True, psn_base=PSN_NEXT_SEND, payload=(6, 0, 0)),
    # RC: receiver not ready (no receives on B), RNR NAKs and timers
    "rc-rnr": setup(RC, s2=0x18, s5=4, wrs=[wr(SEND, 500), wr(SEND, 70)]) + bytes([DELIVER_AB, DELIVER_BA, TIMERS, DELIVER_AB])
    + forge(0x11, to_a=True, psn_base=PSN_NEXT_SEND, delta=-2, syndrome=0x21) + bytes([RECV, 0, PUMP, TIMERS, PUMP]),
    # RC over IPv6 with MTU 256: long messages, mutated copies of real frames
    "rc-v6-mutations": setup(RC, v6=True, s1=1, wrs=[wr(WRITE, 2000), wr(SEND, 1500)]) + bytes([DELIVER_AB])
    + mutate(what=0, m1=3) + mutate(keep=True, what=1, m1=7) + mutate(link_ba=True, what=3, m1=NAK(0)) + bytes([DELIVER_AB, DUP_AB])
    + mutate(what=5, m1=0x90) + bytes([PUMP, TIMERS, PUMP]),
    # RC: WRITE continuations (placed as their ICRC is checked) with a bad
    # ICRC, at the expected PSN and ahead of it, then the real ones
    "rc-write-bad-icrc": setup(RC, wrs=[wr(WRITE, 5000), wr(WRITE, 3000, w4=4)]) + bytes([DELIVER_AB])
    + mutate(keep=True, what=7, m1=0, bad_icrc=True) + mutate(keep=True, what=0, m1=1, bad_icrc=True)
    + mutate(keep=True, what=7, m1=5, bad_icrc=True) + bytes([DELIVER_AB, DELIVER_AB, PUMP]),
    "rc-write-bad-icrc-4096": setup(RC, v6=True, s1=3, wrs=[wr(WRITE, 12000)]) + bytes([DELIVER_AB])
    + mutate(keep=True, what=7, m1=2, bad_icrc=True) + bytes([DROP_AB]) + mutate(keep=True, what=7, m1=6, bad_icrc=True)
    + bytes([PUMP, TIMERS, PUMP]),
    # RC: retries running out (retry_cnt 0, short timeout), SQD in the middle
    "rc-retry-exhaust": setup(RC, s1=0xE0, wrs=mixed) + bytes([DROP_AB, DROP_AB, TIMERS, MODIFY, 0, DELIVER_AB, TIMERS, MODIFY, 2, PUMP]),
    # UC: a message cut by forged middles and lasts
    "uc-forged-stream": setup(UC, s1=1, wrs=[wr(WRITE, 1000), wr(SEND, 600)]) + bytes([DELIVER_AB])
    + forge(0x27, psn_base=PSN_LAST_SEEN, delta=1, payload=(2, 0, 0)) + forge(0x28, psn_base=PSN_LAST_SEEN, delta=5, payload=(1, 9, 0))
    + forge(0x2B, psn_base=PSN_EXPECTED, reth=region(0) + bytes([1]), imm=3, payload=(1, 12, 0)) + bytes([PUMP]),
    # UD: sends in flight, forged datagrams with right and wrong Q_Keys
    "ud-qkeys": setup(UD, wrs=[wr(SEND, 200), wr(SEND_IMM, 1000)]) + bytes([DELIVER_AB])
    + forge(0x64, deth=0, payload=(1, 100, 1)) + forge(0x64, deth=2, payload=(1, 100, 1))
    + forge(0x65, deth=4, payload=(2, 0, 1)) + forge(0x64, deth=0, payload=(4, 0, 0)) + bytes([PUMP]),
    # CNPs for every QP, with CE-marked traffic
    "cnp-and-ce": setup(RC, wrs=[wr(WRITE, 4000)]) + forge(0x81, to_a=True) + forge(0x81, to_a=True, qpn=10)
    + forge(0x0A, flags=0x20, reth=region(0) + bytes([1]), payload=(1, 8, 0)) + bytes([PUMP]),
}

os.makedirs(dst, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(dst, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {dst}")
