#!/usr/bin/env bash
# The whole test suite: `bash deploy/test.sh`
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/deps.sh build test
[ -d ../shared/pcaps ] || { echo "test.sh: ../shared (reference captures and vectors) must sit next to this repository" >&2; exit 1; }
cargo build --workspace --all-targets --quiet
cargo test --workspace --doc --quiet
cargo nextest run --workspace --no-fail-fast
