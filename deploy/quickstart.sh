#!/usr/bin/env bash
# Quick start: build, then two urnic endpoints moving RDMA traffic with
# perftest-style results: `bash deploy/quickstart.sh`
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/deps.sh build
cargo build --release -p urnic-tools --quiet
./target/release/urnic demo "$@"
