#!/usr/bin/env python3
"""Independent readers of urnic's frames: scapy (scapy.contrib.roce) and tshark.

usage: third_party_check.py scapy|tshark FILE.pcap
Prints one JSON object per RoCE frame with the fields the reader dissects.
Exits 2 if the reader is missing, 1 if any frame fails to dissect.
"""
import json
import subprocess
import sys


def scapy_mode(path):
    try:
        from scapy.all import rdpcap, raw, UDP
        from scapy.contrib.roce import BTH, AETH
    except ImportError as e:
        print(f"scapy not installed: {e}", file=sys.stderr)
        sys.exit(2)
    bad = 0
    for i, pkt in enumerate(rdpcap(path)):
        if BTH not in pkt:
            print(json.dumps({"index": i, "error": "no BTH"}))
            bad += 1
            continue
        bth = pkt[BTH]
        stored = bth.icrc
        again = pkt.copy()
        again[BTH].icrc = None
        computed = int.from_bytes(raw(again)[-4:], "big")
        out = {
            "index": i,
            "opcode": bth.opcode,
            "dest_qp": bth.dqpn,
            "psn": bth.psn,
            "ack_req": bth.ackreq,
            "pad": bth.padcount,
            "pkey": bth.pkey,
            "becn": bth.becn,
            "solicited": bth.solicited,
            "icrc_stored": stored,
            "icrc_computed": computed,
        }
        if AETH in pkt:
            out["aeth_syndrome"] = pkt[AETH].syndrome
            out["aeth_msn"] = pkt[AETH].msn
        if stored != computed:
            bad += 1
        print(json.dumps(out))
    sys.exit(1 if bad else 0)


def tshark_mode(path):
    fields = [
        "frame.number", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
        "infiniband.bth.a", "infiniband.bth.padcnt", "infiniband.bth.p_key", "infiniband.reth.va",
        "infiniband.reth.r_key", "infiniband.reth.dmalen", "infiniband.deth.q_key", "infiniband.deth.srcqp",
        "infiniband.aeth.msn", "infiniband.immdt", "_ws.malformed", "_ws.expert.severity",
    ]
    cmd = ["tshark", "-n", "-r", path, "--disable-protocol", "rpcordma", "-T", "fields", "-E", "separator=\t", "-E", "occurrence=f"]
    for f in fields:
        cmd += ["-e", f]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        print("tshark not installed", file=sys.stderr)
        sys.exit(2)
    if res.returncode != 0:
        print(res.stderr, file=sys.stderr)
        sys.exit(1)
    bad = 0
    for line in res.stdout.splitlines():
        v = line.split("\t")
        v += [""] * (len(fields) - len(v))
        rec = dict(zip(fields, v))

        def num(k):
            s = rec[k]
            if not s:
                return None
            return int(s, 0) if s.startswith("0x") else int(s)

        out = {
            "index": num("frame.number") - 1,
            "opcode": num("infiniband.bth.opcode"),
            "dest_qp": num("infiniband.bth.destqp"),
            "psn": num("infiniband.bth.psn"),
            "ack_req": num("infiniband.bth.a"),
            "pad": num("infiniband.bth.padcnt"),
            "pkey": num("infiniband.bth.p_key"),
            "reth_va": num("infiniband.reth.va"),
            "reth_rkey": num("infiniband.reth.r_key"),
            "reth_len": num("infiniband.reth.dmalen"),
            "deth_qkey": num("infiniband.deth.q_key"),
            "deth_src_qp": num("infiniband.deth.srcqp"),
            "aeth_msn": num("infiniband.aeth.msn"),
            "malformed": bool(rec["_ws.malformed"]),
        }
        if out["opcode"] is None or out["malformed"]:
            bad += 1
        print(json.dumps(out))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("scapy", "tshark"):
        print(__doc__, file=sys.stderr)
        sys.exit(64)
    (scapy_mode if sys.argv[1] == "scapy" else tshark_mode)(sys.argv[2])
