#!/usr/bin/env python3
"""Extract every UDP/4791 frame of ../../shared/pcaps into corpus/parse_frame/ (seed corpus)."""
import os, struct, sys
here = os.path.dirname(os.path.abspath(__file__))
src = os.path.join(here, "..", "..", "shared", "pcaps")
dst = os.path.join(here, "corpus", "parse_frame")
os.makedirs(dst, exist_ok=True)
n = 0
for name in sorted(os.listdir(src)):
    if not name.endswith(".pcap"):
        continue
    b = open(os.path.join(src, name), "rb").read()
    off = 24
    while off + 16 <= len(b):
        incl = struct.unpack("<I", b[off + 8:off + 12])[0]
        f = b[off + 16:off + 16 + incl]
        off += 16 + incl
        if len(f) > 42 and f[12:14] == b"\x08\x00" and f[23] == 17 and f[36:38] == (4791).to_bytes(2, "big"):
            open(os.path.join(dst, f"{name}-{n:04}"), "wb").write(f)
            n += 1
print(f"{n} seed frames in {dst}")
