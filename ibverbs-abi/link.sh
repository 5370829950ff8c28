#!/usr/bin/env bash
# Build urnic's libibverbs.so.1 and librdmacm.so.1: the Rust static library (crate urnic-ibverbs)
# linked into a shared object with rdma-core's soname and symbol versions.
# A Rust cdylib cannot carry symbol versions (rustc passes its own anonymous
# version script), so the last step is a plain `cc -shared`.
#   ibverbs-abi/link.sh [release|debug|asan]     (default: release)
# Prints the directory holding libibverbs.so.1 and librdmacm.so.1 (for LD_LIBRARY_PATH).
# asan: the release build instrumented by the address sanitizer, for
# deploy/asan.sh. rustc puts its sanitizer runtime only into executables, and
# the programs that load this library are not ours, so the runtime goes into
# a shared object of its own beside the library (libasan_rust.so, a
# dependency of libibverbs.so.1 found by its rpath), which a program must
# load first: LD_PRELOAD=<dir>/libasan_rust.so.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-release}
target=${CARGO_TARGET_DIR:-target}
built="$target/$profile"
extra=()
case "$profile" in
  release) cargo build -q --release -p urnic-ibverbs ;;
  debug) cargo build -q -p urnic-ibverbs ;;
  asan)
    host=$(rustc -vV | sed -n 's/^host: //p')
    # --target: the sanitizer instruments the library, not build scripts.
    # The flags are deploy/asan.sh's for its tests (one build of each crate).
    RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes" \
      cargo build -q --release -p urnic-ibverbs --target "$host"
    built="$target/$host/release"
    ;;
  *) echo "link.sh: profile is release, debug or asan, not '$profile'" >&2; exit 64 ;;
esac
out="$built/urnic-lib"
mkdir -p "$out"
if [ "$profile" = asan ]; then
  # The runtime's archive less its .preinit_array entry (not allowed in a
  # shared object; the runtime then starts from its constructor).
  rt="$(rustc --print sysroot)/lib/rustlib/$host/lib/librustc-stable_rt.asan.a"
  [ -f "$rt" ] || { echo "link.sh: no address sanitizer runtime at $rt" >&2; exit 1; }
  objs=$(mktemp -d)
  (cd "$objs" && ar x "$rt" && rm -f asan_preinit.cpp.o)
  cc -shared -o "$out/libasan_rust.so.tmp.$$" "$objs"/*.o -lpthread -ldl -lm -lrt
  rm -rf "$objs"
  mv "$out/libasan_rust.so.tmp.$$" "$out/libasan_rust.so"
  extra=(-L"$out" -l:libasan_rust.so -Wl,-rpath,"$(cd "$out" && pwd)")
fi
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
  $undefs "$built/liburnic_ibverbs.a" "${extra[@]}" \
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
