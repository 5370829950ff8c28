#!/usr/bin/env bash
# Build urnic's libibverbs.so.1 and librdmacm.so.1: the Rust static library (crate urnic-ibverbs)
# linked into a shared object with rdma-core's soname and symbol versions.
# A Rust cdylib cannot carry symbol versions (rustc passes its own anonymous
# version script), so the last step is a plain `cc -shared`.
#   ibverbs-abi/link.sh [release|debug]     (default: release)
# Prints the directory holding libibverbs.so.1 and librdmacm.so.1 (for LD_LIBRARY_PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-release}
case "$profile" in
  release) cargo build -q --release -p urnic-ibverbs ;;
  debug) cargo build -q -p urnic-ibverbs ;;
  *) echo "link.sh: profile is release or debug, not '$profile'" >&2; exit 64 ;;
esac
target=${CARGO_TARGET_DIR:-target}
out="$target/$profile/urnic-lib"
mkdir -p "$out"
# Pull in exactly the exported symbols (and what they need) rather than the
# whole archive: libbpf is bundled twice (libbpf-sys and libxdp's build).
undefs=$(sed -n 's/^\t\t\([A-Za-z_0-9]*\);$/-Wl,--undefined=\1/p' ibverbs-abi/libibverbs.map)
# A temporary of our own, renamed into place: concurrent runs (tests in
# parallel processes) never see or move each other's half-written file.
tmp="$out/libibverbs.so.1.tmp.$$"
# shellcheck disable=SC2086
cc -shared -o "$tmp" \
  -Wl,-soname,libibverbs.so.1 \
  -Wl,--version-script=ibverbs-abi/libibverbs.map \
  -Wl,-z,now -Wl,--gc-sections \
  $undefs "$target/$profile/liburnic_ibverbs.a" \
  -lelf -lz -lpthread -ldl -lm -lgcc_s
mv "$tmp" "$out/libibverbs.so.1"
ln -sf libibverbs.so.1 "$out/libibverbs.so"
# librdmacm.so.1: forwarders into the RDMA-CM of the libibverbs.so.1 above
# (one copy of the device state; see ibverbs-abi/src/rdmacm/mod.rs).
cc -shared -fPIC -O2 -Wall -Werror -o "$out/librdmacm.so.1.tmp.$$" \
  -Wl,-soname,librdmacm.so.1 \
  -Wl,--version-script=ibverbs-abi/rdmacm/librdmacm.map \
  -Wl,-z,now -Wl,--no-undefined \
  ibverbs-abi/rdmacm/librdmacm.c -L"$out" -l:libibverbs.so.1
mv "$out/librdmacm.so.1.tmp.$$" "$out/librdmacm.so.1"
ln -sf librdmacm.so.1 "$out/librdmacm.so"
echo "$out"
