#!/usr/bin/env bash
# urnic's Linux Soft-RoCE peer: a small Debian guest running rdma_rxe with
# rdma-core and perftest under qemu, on a bridge inside its own network
# namespace, so urnic (in another namespace on the same bridge) can be tested
# against the kernel's RoCEv2 implementation. Nothing touches the host's own
# interfaces or routes: no NAT, no route out, IPv6 off unless --ipv6 asks for
# it (then only link-local: nothing configures other IPv6 addresses).
#
#   peer.sh build                   build (once; cached) the guest kernel + initramfs
#   peer.sh up [--mtu N]            namespace $NS with bridge br0 (idempotent)
#   peer.sh down                    delete the namespace (bridge, taps, veths)
#   peer.sh veth NAME IP/LEN [--mtu N] [--ipv6]
#                                   namespace NAME whose eth0 (a veth) sits on the bridge;
#                                   --ipv6 leaves IPv6 on there (link-local fe80::, GID index 0)
#   peer.sh veth-del NAME           delete namespace NAME
#   peer.sh run [opts] [-- CMD]     boot one guest, run CMD (bash) there, exit with its status
#       --ip A/LEN   guest address (default 10.99.0.1/24)   --mtu N     eth0/tap MTU (1500)
#       --name N     guest name (default from the IP)       --share D   D is /host; /host/cmd.sh runs if no CMD
#       --timeout S  kill the guest after S s (300)         --log F     console also to F
#       --pcap F     tcpdump the guest's tap into F while it runs
#       --ipv6       IPv6 on in the guest: its link-local address (rxe's GID 0)
#                    passed DAD before PEER-READY, so ND for it is answered
#   peer.sh wait-ready LOG [S]      wait (S s, default 180) until the guest logging to LOG is ready
#   peer.sh selftest                two guests, ibv_rc_pingpong between them
#
# In the guest: RXE_DEV=rxe0, RXE_GID_V2 (index of the IPv4-mapped RoCEv2
# GID), PEER_IP; with --ipv6 also RXE_GID_LL (index of the link-local GID,
# 0) and PEER_IP6 (that address). The console shows "PEER-READY ..." when
# rxe0 is active and "PEER-EXIT rc=N" after the command. `run` exits with N,
# 124 on timeout.
#
# Environment: URNIC_PEER_CACHE (default /var/cache/urnic/rxe-peer), URNIC_PEER_NS
# (default urnic-rxe), PEER_ACCEL (tcg | kvm; KVM does not work on the dev VMs).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${URNIC_PEER_CACHE:-/var/cache/urnic/rxe-peer}
NS=${URNIC_PEER_NS:-urnic-rxe}
BR=br0
ACCEL=${PEER_ACCEL:-tcg}

# The guest recipe. The cache is keyed by all of it (plus guest-init's
# content): changing any line rebuilds what depends on it. Bump RECIPE for
# changes to the packing steps below.
RECIPE=4
SUITE=bookworm
KERNEL_META=linux-image-amd64   # we take the versioned package it depends on
PKGS=kmod,iproute2,ibverbs-providers,ibverbs-utils,perftest,rdmacm-utils,qperf,iputils-ping,procps
# Modules for the initramfs; modprobe resolves their dependencies. The
# last five are for tests that delay some of the guest's incoming frames
# (tc: an ingress filter redirecting them to an ifb device with netem);
# guest-init does not load them.
MODULES="virtio_pci virtio_net rdma_rxe ib_uverbs rdma_ucm crc32_generic crc32-pclmul 9pnet_virtio 9p sch_ingress cls_u32 act_mirred ifb sch_netem"

say() { echo "peer.sh: $*" >&2; }
fail() { say "error: $*"; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root (namespaces, taps, qemu)"

# Host packages: qemu-system-x86 debootstrap cpio zstd kmod (peer) and
# tcpdump for --pcap (test). Quiet when all are present.
deps() { bash "$HERE/../deps.sh" peer test >/dev/null || fail "deploy/deps.sh peer test failed"; }

ns_exec() { ip netns exec "$NS" "$@"; }
ns_exists() { [ -e "/run/netns/$1" ]; }

# ------------------------------------------------------------------ build
debian_mirror() {
    # The Debian mirror the host's apt uses (one-line or deb822 sources);
    # only Debian's mirrors are reachable from the dev VMs and CI.
    local m
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
        grep -v '^\s*#' | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -n1 | tr -d ' ' || true)
    echo "${m:-http://deb.debian.org/debian}"
}

build() {
    deps
    mkdir -p "$CACHE"
    # One builder at a time (tests start guests in parallel): the others wait
    # here and then find the cache ready.
    exec 9>"$CACHE/.lock"
    flock 9
    build_locked
    exec 9>&-
}

build_locked() {
    local out=$CACHE/out
    local want_out want_root
    want_root="$SUITE $PKGS"
    want_out="$RECIPE $KERNEL_META $want_root $MODULES $(sha256sum "$HERE/guest-init" | cut -d' ' -f1)"
    if [ "$(cat "$out/recipe" 2>/dev/null)" = "$want_out" ] && [ -f "$out/initramfs.cpio.zst" ] && [ -f "$out/vmlinuz" ]; then
        return 0
    fi
    local t0=$SECONDS

    # 1. The kernel: Debian's own (6.1, rdma_rxe as a module), unpacked, not installed.
    if [ "$(cat "$CACHE/kernel/.done" 2>/dev/null)" != "$KERNEL_META" ]; then
        local pkg=
        kernel_pkg() { apt-cache depends "$KERNEL_META" 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
        pkg=$(kernel_pkg)
        [ -n "$pkg" ] || { apt-get update -qq; pkg=$(kernel_pkg); }
        [ -n "$pkg" ] || fail "cannot resolve $KERNEL_META to a kernel package"
        say "kernel: $pkg"
        rm -rf "$CACHE/kernel" "$CACHE/deb" && mkdir -p "$CACHE/kernel" "$CACHE/deb"
        (cd "$CACHE/deb" && apt-get download -q "$pkg" >/dev/null 2>&1) || fail "apt-get download $pkg"
        dpkg -x "$CACHE"/deb/*.deb "$CACHE/kernel"
        echo "$KERNEL_META" >"$CACHE/kernel/.done"
    fi
    local kver; kver=$(ls "$CACHE/kernel/lib/modules" | head -n1)
    [ -f "$CACHE/kernel/boot/vmlinuz-$kver" ] || fail "no vmlinuz-$kver in $CACHE/kernel"
    depmod -b "$CACHE/kernel" "$kver"

    # 2. The userland: debootstrap minbase with rdma-core and perftest.
    if [ "$(cat "$CACHE/rootfs/.done" 2>/dev/null)" != "$want_root" ]; then
        local mirror; mirror=$(debian_mirror)
        say "debootstrap $SUITE from $mirror (a minute or two)"
        rm -rf "$CACHE/rootfs"
        debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$CACHE/rootfs" "$mirror" >"$CACHE/debootstrap.log" 2>&1 ||
            fail "debootstrap failed: $CACHE/debootstrap.log"
        echo "$want_root" >"$CACHE/rootfs/.done"
    fi

    # 3. The initramfs: the rootfs without docs/apt lists, the modules we
    #    need (with their dependencies) and our /init, as a zstd cpio.
    say "packing the initramfs"
    local st=$CACHE/staging
    rm -rf "$st" && cp -a "$CACHE/rootfs" "$st"
    rm -rf "$st/.done" "$st"/usr/share/{doc,man,info,locale} "$st"/var/cache/apt/* "$st"/var/lib/apt/lists/*
    mkdir -p "$st/lib/modules/$kver"
    cp "$CACHE/kernel/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$st/lib/modules/$kver/" 2>/dev/null || true
    local m f
    for m in $MODULES; do
        modprobe -d "$CACHE/kernel" -S "$kver" --show-depends "$m" || fail "module $m not found in $kver"
    done | awk '$1 == "insmod" {print $2}' | sort -u | while read -r f; do
        f=${f#"$CACHE/kernel"}
        mkdir -p "$st$(dirname "$f")" && cp "$CACHE/kernel$f" "$st$f"
    done
    depmod -b "$st" "$kver"
    install -m 755 "$HERE/guest-init" "$st/init"
    mkdir -p "$out"
    (cd "$st" && find . -print0 | cpio --null -o -H newc --quiet) | zstd -q -T0 -9 >"$out/initramfs.cpio.zst.tmp"
    cp "$CACHE/kernel/boot/vmlinuz-$kver" "$out/vmlinuz.tmp"
    # Renames are atomic: a guest booting meanwhile sees the old or the new files.
    mv "$out/initramfs.cpio.zst.tmp" "$out/initramfs.cpio.zst"
    mv "$out/vmlinuz.tmp" "$out/vmlinuz"
    rm -rf "$st"
    echo "$want_out" >"$out/recipe"
    say "guest ready in $((SECONDS - t0)) s: $(du -sh "$out" | cut -f1) in $out (kernel $kver)"
}

# ---------------------------------------------------------------- network
# The bridge namespace: br0, no addresses, no routes, no IPv6, no STP delay.
# (It only forwards frames: IPv6 between the guests and the veth namespaces
# needs no IPv6 here, whatever --ipv6 says there.)
up() {
    local mtu=1500
    [ "${1:-}" = --mtu ] && mtu=$2
    ns_exists "$NS" || ip netns add "$NS"
    ip -n "$NS" link set lo up
    ns_exec sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip -n "$NS" link show "$BR" >/dev/null 2>&1 || ip -n "$NS" link add "$BR" type bridge stp_state 0 forward_delay 0
    # The bridge's MTU must be at least its ports' (frames larger are dropped).
    local cur; cur=$(ip -n "$NS" -o link show "$BR" | grep -o 'mtu [0-9]*' | cut -d' ' -f2)
    [ "$cur" -ge "$mtu" ] || ip -n "$NS" link set "$BR" mtu "$mtu"
    ip -n "$NS" link set "$BR" up
}

down() { ip netns del "$NS" 2>/dev/null || true; }

veth() {
    [ $# -ge 2 ] || fail "usage: peer.sh veth NAME IP/LEN [--mtu N] [--ipv6]"
    local name=$1 addr=$2 mtu=1500 v6=0
    shift 2
    while [ $# -gt 0 ]; do
        case "$1" in
            --mtu) mtu=$2; shift 2 ;;
            --ipv6) v6=1; shift ;;
            *) fail "veth: unknown option $1" ;;
        esac
    done
    up --mtu "$mtu"
    ns_exists "$name" || ip netns add "$name"
    # IPv6 off (the default), or on for link-local GIDs: the kernel then
    # gives eth0 fe80:: from its MAC's EUI-64 (addr_gen_mode 0) and answers
    # neighbour solicitation for it once DAD is done.
    local off=$((1 - v6))
    ip netns exec "$name" sysctl -qw net.ipv6.conf.all.disable_ipv6=$off net.ipv6.conf.default.disable_ipv6=$off
    # The bridge end's name must fit IFNAMSIZ (15): the name's last 12 characters.
    local v="vb-$name"
    [ ${#v} -le 15 ] || v="vb-${name:${#name}-12}"
    ip -n "$NS" link del "$v" 2>/dev/null || true
    ip -n "$name" link del eth0 2>/dev/null || true
    ip -n "$NS" link add "$v" mtu "$mtu" type veth peer name eth0 netns "$name" mtu "$mtu"
    ip -n "$NS" link set "$v" master "$BR" up
    ip -n "$name" link set lo up
    ip -n "$name" addr add "$addr" dev eth0
    ip -n "$name" link set eth0 up
}

veth_del() { [ $# -ge 1 ] || fail "usage: peer.sh veth-del NAME"; ip netns del "$1" 2>/dev/null || true; }

# -------------------------------------------------------------------- run
# What to undo on exit, also on INT/TERM/HUP: the running guest (run) and
# selftest's background server and scratch directory.
RUN_TAP= RUN_DUMP= RUN_PIDFILE= RUN_CONSOLE= ST_SRV= ST_DIR=

on_exit() {
    cleanup_run
    if [ -n "$ST_SRV" ]; then kill "$ST_SRV" 2>/dev/null || true; wait "$ST_SRV" 2>/dev/null || true; fi
    [ -z "$ST_DIR" ] || rm -rf "$ST_DIR"
    ST_SRV= ST_DIR=
}
# Set again in each function that needs it: a background `run ... &` is a
# subshell, which does not inherit traps.
arm_traps() { trap on_exit EXIT; trap 'exit 130' INT; trap 'exit 143' TERM HUP; }

cleanup_run() {
    # qemu (and the timeout/sed/tee around it) survive a signal to this shell:
    # stop it through its pidfile. A no-op once it has exited.
    if [ -n "$RUN_PIDFILE" ]; then
        [ ! -s "$RUN_PIDFILE" ] || kill "$(cat "$RUN_PIDFILE")" 2>/dev/null || true
        rm -f "$RUN_PIDFILE"
    fi
    if [ -n "$RUN_DUMP" ]; then
        sleep 0.3   # let tcpdump write the last frames
        kill -TERM "$RUN_DUMP" 2>/dev/null || true   # tcpdump flushes and exits on TERM
        wait "$RUN_DUMP" 2>/dev/null || true
    fi
    [ -z "$RUN_TAP" ] || ip -n "$NS" link del "$RUN_TAP" 2>/dev/null || true
    [ -z "$RUN_CONSOLE" ] || rm -f "$RUN_CONSOLE"
    RUN_TAP= RUN_DUMP= RUN_PIDFILE= RUN_CONSOLE=
}

run() {
    local addr=10.99.0.1/24 mtu=1500 name= share= tmo=300 logf= pcap= v6=0
    while [ $# -gt 0 ]; do
        case "$1" in
            --ip) addr=$2; shift 2 ;;
            --mtu) mtu=$2; shift 2 ;;
            --name) name=$2; shift 2 ;;
            --share) share=$(cd "$2" && pwd); shift 2 ;;
            --timeout) tmo=$2; shift 2 ;;
            --log) logf=$2; shift 2 ;;
            --pcap) pcap=$2; shift 2 ;;
            --ipv6) v6=1; shift ;;
            --) shift; break ;;
            *) fail "unknown option $1 (a command goes after --)" ;;
        esac
    done
    local cmd="$*"
    [[ $addr =~ ^([0-9]+)\.([0-9]+)\.([0-9]+)\.([0-9]+)/[0-9]+$ ]] || fail "--ip wants A.B.C.D/LEN, not '$addr'"
    local o2=${BASH_REMATCH[2]} o3=${BASH_REMATCH[3]} o4=${BASH_REMATCH[4]}
    build
    up --mtu "$mtu"

    # Tap and MAC from the address: guests with distinct addresses can run
    # side by side on one bridge.
    [ -n "$name" ] || name="rxe$o4"
    local tap="tp-$o3-$o4" mac
    mac=$(printf '52:54:00:%02x:%02x:%02x' "$o2" "$o3" "$o4")
    arm_traps
    ip -n "$NS" link del "$tap" 2>/dev/null || true
    ip -n "$NS" tuntap add dev "$tap" mode tap
    RUN_TAP=$tap
    ip -n "$NS" link set "$tap" mtu "$mtu" master "$BR" up

    # Parameters for guest-init; the command travels base64-encoded (the
    # kernel command line holds 2048 bytes: longer commands go via --share).
    local args="console=ttyS0 quiet loglevel=0 panic=-1 peer.ip=$addr peer.mtu=$mtu peer.name=$name peer.ipv6=$v6"
    [ -z "$cmd" ] || args+=" peer.cmd=$(printf '%s\n' "$cmd" | base64 -w0)"
    [ ${#args} -lt 1900 ] || fail "command too long for the kernel command line: use --share DIR"

    local accel=(-accel tcg)
    [ "$ACCEL" = kvm ] && accel=(-accel kvm -cpu host)
    RUN_PIDFILE=$(mktemp) RUN_CONSOLE=$(mktemp)
    local q=(qemu-system-x86_64 "${accel[@]}" -m 768 -smp 1 -nodefaults -no-user-config -display none -no-reboot
        -pidfile "$RUN_PIDFILE" -chardev stdio,id=con,signal=off -serial chardev:con
        -kernel "$CACHE/out/vmlinuz" -initrd "$CACHE/out/initramfs.cpio.zst" -append "$args"
        -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no" -device "virtio-net-pci,netdev=n0,mac=$mac")
    [ -z "$share" ] || q+=(-virtfs "local,path=$share,mount_tag=host,security_model=none,id=host")

    if [ -n "$pcap" ]; then
        # Immediate mode: every frame reaches the file before qemu exits.
        # `ip netns exec` execs tcpdump, so $! is tcpdump itself (not a
        # subshell, which would ignore the signal that should stop it).
        ip netns exec "$NS" tcpdump -i "$tap" -s 0 -U --immediate-mode -w "$pcap" 2>/dev/null &
        RUN_DUMP=$!
    fi
    set +e
    ns_exec timeout --kill-after=5 "$tmo" "${q[@]}" </dev/null 2>&1 |
        sed -u 's/\r//g; s/\x1b\[[0-9;?]*[a-zA-Z]//g; s/\x1bc//g' | tee "$RUN_CONSOLE" ${logf:+"$logf"}
    set -e
    local rc; rc=$(sed -n 's/^PEER-EXIT rc=\([0-9]*\).*/\1/p' "$RUN_CONSOLE" | tail -n1)
    cleanup_run
    [ -n "$rc" ] || { say "guest $name ended without PEER-EXIT (timeout after ${tmo}s or crash)"; return 124; }
    return "$rc"
}

# A test harness starts `peer.sh run ... --log LOG &` and then this.
wait_ready() {
    [ $# -ge 1 ] || fail "usage: peer.sh wait-ready LOG [SECS]"
    local f=$1 t=${2:-180} i=0
    while [ $i -lt $((t * 10)) ]; do
        grep -q '^PEER-READY' "$f" 2>/dev/null && return 0
        grep -q '^PEER-EXIT' "$f" 2>/dev/null && { say "guest exited before it was ready"; return 1; }
        sleep 0.1; i=$((i + 1))
    done
    say "guest not ready after ${t}s"; return 1
}

# ---------------------------------------------------------------- selftest
selftest() {
    local t0=$SECONDS dir
    arm_traps   # on interruption, on_exit takes the background server down too
    dir=$(mktemp -d) && ST_DIR=$dir
    build
    # (In the background subshell ST_DIR is cleared: its exit must not delete the logs.)
    (ST_DIR=; run --ip 10.99.0.1/24 --name server --timeout 300 --log "$dir/server" -- \
        'ibv_rc_pingpong -d $RXE_DEV -g $RXE_GID_V2 -n 20') >/dev/null 2>&1 &
    ST_SRV=$!
    wait_ready "$dir/server" 240 || true
    local rc=0
    # The client retries until the server listens.
    run --ip 10.99.0.2/24 --name client --timeout 300 --log "$dir/client" -- \
        'for i in $(seq 60); do ibv_rc_pingpong -d $RXE_DEV -g $RXE_GID_V2 -n 20 10.99.0.1 && exit 0; sleep 1; done; exit 1' \
        >/dev/null 2>&1 || rc=$?
    wait "$ST_SRV" || rc=$?
    ST_SRV=
    if [ "$rc" = 0 ]; then
        grep -h -E 'PEER-READY|bytes in|PEER-EXIT' "$dir/server" "$dir/client" || true
        echo "SELFTEST PASS ($((SECONDS - t0)) s)"
    else
        local f; for f in server client; do echo "===== $f"; grep -v '^\s*$' "$dir/$f" || true; done
        echo "SELFTEST FAIL ($((SECONDS - t0)) s)"
        return 1
    fi
}

case "${1:-}" in
    build) build ;;
    up) shift; up "$@" ;;
    down) down ;;
    veth) shift; veth "$@" ;;
    veth-del) shift; veth_del "$@" ;;
    run) shift; run "$@" ;;
    wait-ready) shift; wait_ready "$@" ;;
    selftest) selftest ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
