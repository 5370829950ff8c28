#!/usr/bin/env bash
# Quick start: build, then two urnic endpoints moving RDMA traffic with
# perftest-style results: `bash deploy/quickstart.sh`. By default the two
# devices sit in two network namespaces joined by veth, through AF_XDP and the
# XDP program (needs root); `bash deploy/quickstart.sh --link memory` runs them
# over an in-memory link without privileges.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/deps.sh build
cargo build --release -p urnic-tools --quiet
./target/release/urnic demo "$@"
