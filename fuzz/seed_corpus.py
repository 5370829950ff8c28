#!/usr/bin/env python3
"""Seed corpus for the parse_frame fuzz target: every UDP/4791 frame of
../../shared/pcaps/*.pcap (classic pcap, either byte order) into
corpus/parse_frame/, plus the two hardware CNP vectors. Run from anywhere:

    python3 fuzz/seed_corpus.py
"""
import os
import struct

here = os.path.dirname(os.path.abspath(__file__))
shared = os.path.join(here, "..", "..", "shared")
src = os.path.join(shared, "pcaps")
dst = os.path.join(here, "corpus", "parse_frame")
if not os.path.isdir(src):
    raise SystemExit(f"reference captures missing: {src}")
os.makedirs(dst, exist_ok=True)

ENDIAN = {0xA1B2C3D4: "<", 0xA1B23C4D: "<", 0xD4C3B2A1: ">", 0x4D3CB2A1: ">"}


def frames(path):
    b = open(path, "rb").read()
    e = ENDIAN[struct.unpack("<I", b[:4])[0]]
    off = 24
    while off + 16 <= len(b):
        incl = struct.unpack(e + "I", b[off + 8:off + 12])[0]
        yield b[off + 16:off + 16 + incl]
        off += 16 + incl


def is_roce(f):
    # Ethernet (optionally one 802.1Q tag) / IPv4 or IPv6 / UDP dst 4791
    et, off = f[12:14], 14
    if et == b"\x81\x00":
        et, off = f[16:18], 18
    if et == b"\x08\x00" and len(f) >= off + 20:
        ihl = (f[off] & 0x0F) * 4
        return f[off + 9] == 17 and f[off + ihl + 2:off + ihl + 4] == b"\x12\xb7"
    if et == b"\x86\xdd" and len(f) >= off + 48:
        return f[off + 6] == 17 and f[off + 42:off + 44] == b"\x12\xb7"
    return False


n = 0
for name in sorted(os.listdir(src)):
    if name.endswith(".pcap"):
        for i, f in enumerate(frames(os.path.join(src, name))):
            if is_roce(f):
                open(os.path.join(dst, f"{name}-{i:04}"), "wb").write(f)
                n += 1
for line in open(os.path.join(shared, "vectors", "cnp_vectors.txt")):
    parts = line.split()
    if len(parts) == 3 and not line.startswith("#"):
        name, kind, hexs = parts
        data = bytes.fromhex(hexs)
        if kind == "ipv4":  # give it an Ethernet header so parse_frame sees it whole
            data = bytes(12) + b"\x08\x00" + data
        open(os.path.join(dst, f"vector-{name}"), "wb").write(data)
        n += 1
print(f"{n} seed inputs in {dst}")
