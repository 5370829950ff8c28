#!/usr/bin/env bash
# Install what urnic's build and tests need, idempotently.
#   deploy/deps.sh [build] [test] [peer] [all]      (default: build test)
# Quiet when everything is present. Needs root (apt-get) for missing packages.
set -euo pipefail

groups=("$@")
[ ${#groups[@]} -eq 0 ] && groups=(build test)
for g in "${groups[@]}"; do [ "$g" = all ] && groups=(build test peer); done

want_apt=()
want_pip=()
for g in "${groups[@]}"; do
  case "$g" in
    build) want_apt+=(clang llvm libelf-dev zlib1g-dev m4 pkg-config make libbpf-dev libibverbs-dev librdmacm-dev) ;;
    # g++: libfuzzer-sys compiles libFuzzer (C++) for the fuzz targets.
    # fonts-dejavu-core: the text of the figures (urnic bench --report, dcqcn-sim).
    test)  want_apt+=(iproute2 iputils-ping ethtool tcpdump tshark python3 iperf3 g++ ibverbs-utils ibverbs-providers perftest qperf rdmacm-utils fonts-dejavu-core); want_pip+=(scapy) ;;
    peer)  want_apt+=(qemu-system-x86 debootstrap cpio zstd kmod) ;;
    *) echo "deps.sh: unknown group '$g' (build, test, peer, all)" >&2; exit 64 ;;
  esac
done

missing=()
for p in "${want_apt[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then echo "deps.sh: need root to apt-get install ${missing[*]}" >&2; exit 1; fi
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture: answer no, non-interactively.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get update -qq -o DPkg::Lock::Timeout=600
  apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >/dev/null
fi

for m in "${want_pip[@]}"; do
  if ! python3 -c "import $m" 2>/dev/null; then
    echo "deps: pip installing $m"
    python3 -m pip install -q "$m"
  fi
done

# The Rust toolchain matters to build and test only (peer.sh needs none).
needs_cargo=0
for g in "${groups[@]}"; do case "$g" in build|test) needs_cargo=1 ;; esac; done
if [ "$needs_cargo" = 1 ]; then
  command -v cargo >/dev/null || { echo "deps.sh: cargo is missing (the machine's Rust toolchain)" >&2; exit 1; }
  if ! command -v cargo-nextest >/dev/null; then
    echo "deps: installing cargo-nextest"
    cargo install --locked -q cargo-nextest
  fi
fi
# cargo-fuzz runs the fuzz targets (deploy/fuzz-smoke.sh); with
# RUSTC_BOOTSTRAP=1 it works on the stable toolchain.
for g in "${groups[@]}"; do
  if [ "$g" = test ] && ! cargo fuzz --version >/dev/null 2>&1; then
    echo "deps: installing cargo-fuzz"
    cargo install --locked -q cargo-fuzz
  fi
done
[ ${#missing[@]} -eq 0 ] && echo "deps: all present (${groups[*]})"
exit 0
