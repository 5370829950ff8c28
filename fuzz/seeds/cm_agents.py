#!/usr/bin/env python3
"""Seed inputs for the cm_agents fuzz target, written into
fuzz/seeds/cm_agents/ (committed; a run adds them as a second corpus
directory). Run from anywhere:

    python3 fuzz/seeds/cm_agents.py

The byte format is documented in fuzz/src/cm_agents.rs (module docs). Each
seed is an exchange worth starting from: a connection's whole life, a SIDR
exchange, a REQ answered by an MRA, a rejection answering a retransmitted
REQ, an established pair under forged and mutated MADs.
"""
import os

here = os.path.dirname(os.path.abspath(__file__))
dst = os.path.join(here, "cm_agents")

# steps (o % 16)
A_CONNECTS, B_CONNECTS = 0, 1
TO_A, TO_B, DROP_TO_A, DROP_TO_B, DUP_TO_A, DUP_TO_B = 2, 3, 4, 5, 6, 7
ADVANCE = 8
A_CALLS, B_CALLS = 9, 10
MUTATE_TO_A, MUTATE_TO_B = 11, 12
FORGE, SIDR, RAW = 13, 14, 15
# consumer calls (k0 % 8)
ACCEPT, REJECT, RTU, ESTABLISH, DISCONNECT, DESTROY, SIDR_REPLY, LISTEN = range(8)
NEXT_TIMEOUT = 5


def call(side, what, k2=0):
    # k1 = 0: the side's first id
    return [side, what, 0, k2]


SETUP = [0x09, 0x02]  # response timeout 2^9 * 4.096 us, one retry; timewait 4 ms

CONNECTED = [A_CONNECTS, 0, 0, 0, TO_B, *call(B_CALLS, ACCEPT), TO_A, *call(A_CALLS, RTU), TO_B]

SEEDS = {
    "connection-life": SETUP + CONNECTED + [*call(A_CALLS, DISCONNECT), TO_B, *call(B_CALLS, DISCONNECT), TO_A, ADVANCE, NEXT_TIMEOUT],
    "sidr": SETUP + [SIDR, 0, TO_B, *call(B_CALLS, SIDR_REPLY), TO_A],
    "mra-then-rep": SETUP + [A_CONNECTS, 0, 0, 0, DUP_TO_B, TO_B, TO_A, *call(B_CALLS, ACCEPT), TO_A, *call(A_CALLS, RTU), TO_B],
    "reject-and-retransmit": SETUP + [A_CONNECTS, 0, 0, 0, DUP_TO_B, *call(B_CALLS, REJECT), TO_B, TO_A, TO_A, ADVANCE, NEXT_TIMEOUT],
    "established-forged": SETUP + CONNECTED + [MUTATE_TO_B, 0x81, 0xF9, 0x00, FORGE, 0x29, 0x00, 0x00, 0x00, 0x00, FORGE, 0x30, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0x00, 0x00, 0x00],
    "dreq-crossing": SETUP + CONNECTED + [*call(A_CALLS, DISCONNECT), *call(B_CALLS, DISCONNECT), TO_A, TO_B, TO_A, TO_B, ADVANCE, NEXT_TIMEOUT],
}

os.makedirs(dst, exist_ok=True)
for name, program in SEEDS.items():
    with open(os.path.join(dst, name), "wb") as f:
        f.write(bytes(program))
print(f"{len(SEEDS)} seeds in {dst}")
