#!/usr/bin/env bash
# The whole test suite: `bash deploy/test.sh`
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/deps.sh build test peer
[ -d ../shared/pcaps ] || { echo "test.sh: ../shared (reference captures and vectors) must sit next to this repository" >&2; exit 1; }
# Namespaces left by a killed earlier run (urnic-* whose process is gone).
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^urnic-.*-[0-9]+-[0-9]+-[a-z]+$' || true); do
  pid=$(echo "$ns" | awk -F- '{print $(NF-2)}')
  [ -d "/proc/$pid" ] || ip netns del "$ns" 2>/dev/null || true
done
cargo fmt --all --check
cargo build --workspace --all-targets --quiet
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The fuzz crate sits outside the workspace: the same checks for it.
(cd fuzz && cargo fmt --check && cargo clippy --all-targets --quiet -- -D warnings)
cargo test --workspace --doc --quiet
# Docs on public items resolve (no link to a private or missing item).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# urnic's libibverbs.so.1 (loopback-test's verbs_programs runs Debian's programs on it).
bash ibverbs-abi/link.sh release >/dev/null
# Fuzz smoke (issue 14): every target in fuzz/ builds and runs 20 s without a crash.
bash deploy/fuzz-smoke.sh 20
cargo nextest run --workspace --no-fail-fast
