#!/usr/bin/env bash
# Miri over the tests of urnic's shared-memory code: the lock-free work queue,
# send, receive and completion rings and the doorbells between the verbs
# layer and the datapath (urnic-datapath), and the memory table's lock, key
# checks and raw-pointer movers (rocev2's transport::memory), and the memory
# regions' raw accessors and ownership (urnic's mr). Miri interprets
# each test, reports any undefined behaviour (an out-of-bounds or dangling
# access, a data race, a misaligned atomic) and emulates weak memory, so a
# missing Acquire/Release between a producer and a consumer fails here even
# where x86's strong ordering hides it natively. The stress tests run fewer
# rounds under Miri (`stress_rounds`, `cfg!(miri)`): it is some ten
# thousand times slower than native code.
#
#   bash deploy/miri.sh                  (10-20 minutes on 2 cores)
#   MIRIFLAGS=-Zmiri-many-seeds=0..8 bash deploy/miri.sh   (8 schedules each)
#
# Needs a nightly toolchain with the miri and rust-src components
# (`rustup component add miri rust-src --toolchain nightly`). It is not part
# of deploy/test.sh: the machines CI runs on have one stable toolchain.
#
# -Zmiri-permissive-provenance: registered memory is named by the address a
# program gave (`u64`), which the memory table turns back into a pointer.
# -Zmiri-disable-isolation: the doorbell tests read the clock and use an
# eventfd.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! cargo +nightly miri --version >/dev/null 2>&1; then
  echo "miri.sh: Miri is missing (rustup component add miri rust-src --toolchain nightly)" >&2
  exit 1
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/miri}
export MIRIFLAGS="-Zmiri-permissive-provenance -Zmiri-disable-isolation ${MIRIFLAGS:-}"
cargo +nightly miri test -p urnic-datapath --lib -- \
  completion_ring:: wq_ring:: recv_ring:: send_ring:: queues:: nic::tests::a_drain_that_stops_at_a_claimed
cargo +nightly miri test -p rocev2 --lib -- transport::memory::
cargo +nightly miri test -p urnic --lib -- mr::tests::
echo "miri.sh: no undefined behaviour in the rings, the doorbells, the memory table or the regions' accessors"
