#!/usr/bin/env bash
# The address sanitizer over urnic's native code, as it runs: the Rust tests
# of the protocol crate, the datapath (real AF_XDP sockets on veth pairs in
# namespaces, the XDP program, the UMEM's raw spans), the verbs API, the
# loopback lab (forged and hostile frames, multicast, close), the CLI,
# `urnic soak` and urnic's tools against Linux rxe in qemu; then urnic's
# libibverbs.so.1 and librdmacm.so.1 built with the sanitizer under the C
# test programs and Debian's unmodified programs
# (ibverbs-utils, perftest, rdmacm-utils, qperf). Any out-of-bounds access,
# use after free or double free in urnic's code fails the run with the
# sanitizer's report. Miri (deploy/miri.sh) covers the lock-free rings and
# the memory table's ordering; the fuzz targets (deploy/fuzz-smoke.sh) the
# frame parsers and the engine under random input; this covers the rest:
# the system-call and FFI code neither can run.
#
#   bash deploy/asan.sh           (root; about 20 minutes on 2 cores)
#
# Stable toolchain: RUSTC_BOOTSTRAP=1 lets it take -Zsanitizer=address, as
# the fuzz smoke does. Leak checking is off (the programs exit without
# freeing what they hold, as C programs do); deploy/asan.supp lists the one
# suppressed report, in libxdp. Not part of deploy/test.sh, for time.
# Debian's programs against rxe (interop_rxe_programs) are left out: the
# preloaded runtime would reach the qemu guests too, whose coroutines
# (makecontext/swapcontext) the sanitizer warns it may misreport.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/deps.sh build test peer
[ "$(id -u)" = 0 ] || { echo "asan.sh: run as root (the tests make network namespaces and attach XDP programs)" >&2; exit 1; }
root=$PWD
host=$(rustc -vV | sed -n 's/^host: //p')
export ASAN_OPTIONS="detect_leaks=0:suppressions=$root/deploy/asan.supp"
# Instrumented tests in a target directory of their own. --target: build
# scripts and proc macros stay uninstrumented. The flags are those of
# `ibverbs-abi/link.sh asan`: keep them equal, or the library's build
# repeats every crate's.
asan_test() {
  CARGO_TARGET_DIR="$root/target/asan" RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes" \
    cargo test -q --release --no-fail-fast --target "$host" "$@"
}

echo "asan.sh: the sanitizer is live (it reports a read past a heap allocation)"
asan_test -p urnic-datapath --test asan_live -- --ignored

echo "asan.sh: the protocol crate, the datapath and the verbs API"
asan_test -p rocev2 -p urnic-datapath -p urnic --lib --tests

echo "asan.sh: the loopback lab on veth"
veth=()
for t in loopback-test/tests/veth_*.rs loopback-test/tests/capture_third_party.rs loopback-test/tests/xdp_program.rs; do
  veth+=(--test "$(basename "$t" .rs)")
done
asan_test -p loopback-test "${veth[@]}" -- --test-threads 1

echo "asan.sh: the CLI, urnic soak, and urnic's tools against Linux rxe (qemu guests)"
asan_test -p urnic-tools --bins --test cli --test soak --test stat --test interop_rxe --test interop_rxe_cm -- \
  --test-threads 1 --skip exec_runs_an_ibverbs_program_on_urnic

echo "asan.sh: libibverbs.so.1 and librdmacm.so.1 under C programs"
lib=$(CARGO_TARGET_DIR="$root/target/asan" bash ibverbs-abi/link.sh asan)
# The library's own code must be instrumented (it calls the runtime's checks).
# (grep -c reads all of nm's output: grep -q would stop early, and under
# pipefail nm's SIGPIPE would fail the test.)
[ "$(nm -D "$lib/libibverbs.so.1" | grep -c ' U __asan_report_load')" -gt 0 ] || { echo "asan.sh: $lib/libibverbs.so.1 is not instrumented" >&2; exit 1; }
# The programs (and the harnesses that start them) are not instrumented:
# the runtime must be the first library they load. The harnesses are built
# first and run directly, each from its package's directory as cargo would:
# no compiler runs with the runtime preloaded (rustc hangs under it).
programs=(-p urnic-ibverbs --test c_programs --test rdmacm_c
  -p loopback-test --test verbs_programs --test rdmacm_programs --test mckey_programs
  -p urnic-tools --test cli)
# Built once with readable errors; the second call only lists what was built.
cargo test -q --no-run "${programs[@]}"
cargo test -q --no-run --message-format=json "${programs[@]}" | python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(os.path.dirname(m["manifest_path"]), m["target"]["name"], m["executable"])
' >"$root/target/asan/programs.txt"
while read -r dir name exe; do
  # no_alloc counts the program's own malloc, which the sanitizer replaces;
  # of the CLI's tests, the one that runs a program on the library.
  case "$name" in
    cli) filter=(--exact exec_runs_an_ibverbs_program_on_urnic) ;;
    *) filter=(--skip posting_and_polling_from_c_allocate_nothing) ;;
  esac
  echo "asan.sh: $name"
  # stdin from /dev/null: the list being read is not theirs.
  (cd "$dir" && URNIC_LIB_DIR="$lib" LD_PRELOAD="$lib/libasan_rust.so" "$exe" --test-threads 1 "${filter[@]}" </dev/null)
done <"$root/target/asan/programs.txt"
echo "asan.sh: no memory error in urnic's code, its tests or under the C programs"
