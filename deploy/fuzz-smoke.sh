#!/usr/bin/env bash
# Build every fuzz target of fuzz/ (the [[bin]]s `cargo fuzz list` names) and
# run each for a short, bounded time; fails on the first crash, leak, timeout
# or out-of-memory, printing the end of libFuzzer's log and the reproducer.
#
#   bash deploy/fuzz-smoke.sh [seconds per target]      (default 20)
#
# Works with the stable toolchain: RUSTC_BOOTSTRAP=1 lets stable rustc take
# the -Z flags cargo-fuzz passes (-Zsanitizer=address, coverage passes).
# Corpora grow in fuzz/corpus/<target> (git-ignored); committed seeds in
# fuzz/seeds/<target> are read as a second corpus directory. Logs go to
# fuzz/target/smoke-<target>.log; crashes to fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-20}
cargo fuzz --version >/dev/null 2>&1 || { echo "fuzz-smoke.sh: cargo-fuzz is missing (bash deploy/deps.sh test)" >&2; exit 1; }
export RUSTC_BOOTSTRAP=1
targets=$(cargo fuzz list)
[ -n "$targets" ] || { echo "fuzz-smoke.sh: no fuzz targets found" >&2; exit 1; }
# parse_frame's seeds come from the reference captures (../../shared).
if [ ! -d corpus/parse_frame ] && [ -d ../../shared/pcaps ]; then python3 seed_corpus.py >/dev/null; fi
mkdir -p target
# The harnesses' own tests (a known program through each harness's steps).
if ! cargo test --lib -q >target/smoke-lib-tests.log 2>&1; then
  tail -40 target/smoke-lib-tests.log
  echo "fuzz-smoke: the harness tests failed (log: fuzz/target/smoke-lib-tests.log)" >&2
  exit 1
fi
echo "fuzz-smoke: harness tests pass"
for t in $targets; do
  mkdir -p "corpus/$t"
  dirs=("corpus/$t")
  [ -d "seeds/$t" ] && dirs+=("seeds/$t")
  log="target/smoke-$t.log"
  echo "fuzz-smoke: $t for ${secs}s"
  if ! cargo fuzz build "$t" >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz-smoke: $t does not build (log: fuzz/$log)" >&2
    exit 1
  fi
  if ! cargo fuzz run "$t" "${dirs[@]}" -- -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 >>"$log" 2>&1; then
    tail -60 "$log"
    echo "fuzz-smoke: $t FAILED (log: fuzz/$log; reproduce: RUSTC_BOOTSTRAP=1 cargo fuzz run $t <artifact> from fuzz/)" >&2
    exit 1
  fi
  { grep -E '^#[0-9]+[[:space:]]+DONE' "$log" || true; } | tail -1 | sed "s/^/fuzz-smoke: $t /"
done
