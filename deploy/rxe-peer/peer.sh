#!/usr/bin/env bash
# urnic's Linux Soft-RoCE peer: a small Debian guest running rdma_rxe with
# rdma-core and perftest under qemu, on a bridge inside its own network
# namespace, so urnic (in another namespace on the same bridge) can be tested
# against the kernel's RoCEv2 implementation. Nothing touches the host's own
# interfaces or routes.
#
#   peer.sh build                   build (once; cached) the guest kernel + initramfs
#   peer.sh up [--mtu N]            namespace $NS with bridge br0 (idempotent)
#   peer.sh down                    delete the namespace (bridge, taps, veths)
#   peer.sh veth NAME IP/LEN        namespace NAME whose eth0 sits on the bridge
#   peer.sh veth-del NAME           delete namespace NAME
#   peer.sh run [opts] [-- CMD]     boot one guest, run CMD (bash) there, exit with its status
#       --ip A/LEN   guest address (default 10.99.0.1/24)   --mtu N     eth0/tap MTU (1500)
#       --name N     guest name (default from the IP)       --share D   D is /host; /host/cmd.sh runs if no CMD
#       --timeout S  kill the guest after S s (300)         --log F     console also to F
#       --pcap F     tcpdump the guest's tap into F while it runs
#   peer.sh wait-ready LOG [S]      wait until the guest logging to LOG is ready (PEER-READY)
#   peer.sh selftest                two guests, ibv_rc_pingpong between them
#
# In the guest: RXE_DEV=rxe0, RXE_GID_V2 (index of the IPv4-mapped RoCEv2
# GID), PEER_IP. The console shows "PEER-READY ..." when rxe0 is active and
# "PEER-EXIT rc=N" after the command.
#
# Environment: URNIC_PEER_CACHE (default /var/cache/urnic/rxe-peer), URNIC_PEER_NS
# (default urnic-rxe), PEER_ACCEL (tcg | kvm; KVM does not work on the dev VMs).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${URNIC_PEER_CACHE:-/var/cache/urnic/rxe-peer}
NS=${URNIC_PEER_NS:-urnic-rxe}
BR=br0
ACCEL=${PEER_ACCEL:-tcg}
# Bump when the guest recipe changes: the cache is rebuilt.
RECIPE=3
SUITE=bookworm
PKGS=kmod,iproute2,ibverbs-providers,ibverbs-utils,perftest,rdmacm-utils,iputils-ping,procps
MODULES="virtio_pci virtio_net rdma_rxe ib_uverbs rdma_ucm crc32_generic crc32-pclmul 9pnet_virtio 9p"

say() { echo "peer.sh: $*" >&2; }
fail() { say "error: $*"; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root (namespaces, taps, qemu)"

deps() { bash "$HERE/../deps.sh" peer test >/dev/null; }

# ------------------------------------------------------------------ build
debian_mirror() {
    local m
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
        grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -n1 | tr -d ' ' || true)
    echo "${m:-http://deb.debian.org/debian}"
}

build() {
    deps
    mkdir -p "$CACHE"
    # One builder at a time (tests start guests in parallel); the others
    # wait and then find the cache ready.
    exec 9>"$CACHE/.lock"
    flock 9
    build_locked
    flock -u 9
}

build_locked() {
    local out=$CACHE/out stamp=$CACHE/out/recipe
    # The cache is keyed by the recipe version and the guest init's content
    # (not its mtime: a fresh clone must reuse a cache CI kept).
    local want; want="$RECIPE $(sha256sum "$HERE/guest-init" | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$out/initramfs.cpio.zst" ]; then
        return 0
    fi
    mkdir -p "$out"
    if [ ! -f "$CACHE/kernel/.done" ]; then
        local pkg
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
        [ -n "$pkg" ] || { apt-get update -qq; pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}'); }
        [ -n "$pkg" ] || fail "cannot find the Debian kernel package"
        say "kernel: $pkg"
        rm -rf "$CACHE/kernel" "$CACHE/deb" && mkdir -p "$CACHE/kernel" "$CACHE/deb"
        (cd "$CACHE/deb" && apt-get download -q "$pkg" >/dev/null 2>&1) || fail "apt-get download $pkg"
        dpkg -x "$CACHE"/deb/*.deb "$CACHE/kernel"
        touch "$CACHE/kernel/.done"
    fi
    local kver; kver=$(ls "$CACHE/kernel/lib/modules" | head -n1)
    depmod -b "$CACHE/kernel" "$kver"
    if [ ! -f "$CACHE/rootfs/.done" ]; then
        local mirror; mirror=$(debian_mirror)
        say "debootstrap $SUITE from $mirror (a minute or two)"
        rm -rf "$CACHE/rootfs"
        debootstrap --variant=minbase --include="$PKGS" "$SUITE" "$CACHE/rootfs" "$mirror" >"$CACHE/debootstrap.log" 2>&1 ||
            fail "debootstrap failed: $CACHE/debootstrap.log"
        touch "$CACHE/rootfs/.done"
    fi
    say "packing the initramfs"
    local st=$CACHE/staging
    rm -rf "$st" && cp -a "$CACHE/rootfs" "$st"
    rm -rf "$st/.done" "$st"/usr/share/{doc,man,info,locale} "$st"/var/cache/apt/* "$st"/var/lib/apt/lists/*
    mkdir -p "$st/lib/modules/$kver"
    cp "$CACHE/kernel/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$st/lib/modules/$kver/" 2>/dev/null || true
    local m f
    for m in $MODULES; do modprobe -d "$CACHE/kernel" -S "$kver" --show-depends "$m"; done |
        awk '$1 == "insmod" {print $2}' | sort -u | while read -r f; do
            f=${f#"$CACHE/kernel"}
            mkdir -p "$st$(dirname "$f")" && cp "$CACHE/kernel$f" "$st$f"
        done
    depmod -b "$st" "$kver"
    install -m 755 "$HERE/guest-init" "$st/init"
    (cd "$st" && find . -print0 | cpio --null -o -H newc --quiet) | zstd -q -T0 -9 >"$out/initramfs.cpio.zst.tmp"
    mv "$out/initramfs.cpio.zst.tmp" "$out/initramfs.cpio.zst"
    cp "$CACHE/kernel/boot/vmlinuz-$kver" "$out/vmlinuz"
    rm -rf "$st"
    echo "$want" >"$stamp"
    say "guest ready: $(du -sh "$out" | cut -f1) in $out"
}

# ---------------------------------------------------------------- network
up() {
    local mtu=1500
    [ "${1:-}" = --mtu ] && mtu=$2
    ip netns list | awk '{print $1}' | grep -qx "$NS" || ip netns add "$NS"
    ip -n "$NS" link set lo up
    nsenter --net="/run/netns/$NS" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    if ! ip -n "$NS" link show "$BR" >/dev/null 2>&1; then
        ip -n "$NS" link add "$BR" type bridge stp_state 0 forward_delay 0
    fi
    local cur; cur=$(ip -n "$NS" -o link show "$BR" | grep -o 'mtu [0-9]*' | cut -d' ' -f2)
    [ "$cur" -ge "$mtu" ] || ip -n "$NS" link set "$BR" mtu "$mtu"
    ip -n "$NS" link set "$BR" up
}

down() { ip netns del "$NS" 2>/dev/null || true; }

veth() {
    local name=$1 addr=$2 mtu=1500
    [ "${3:-}" = --mtu ] && mtu=$4
    up --mtu "$mtu"
    ip netns list | awk '{print $1}' | grep -qx "$name" || ip netns add "$name"
    local v="vb-${name: -12}"
    ip -n "$NS" link del "$v" 2>/dev/null || true
    ip -n "$name" link del eth0 2>/dev/null || true
    ip -n "$NS" link add "$v" mtu "$mtu" type veth peer name eth0 netns "$name" mtu "$mtu"
    ip -n "$NS" link set "$v" master "$BR" up
    ip -n "$name" link set lo up
    ip -n "$name" addr add "$addr" dev eth0
    ip -n "$name" link set eth0 up
}

veth_del() { ip netns del "$1" 2>/dev/null || true; }

# -------------------------------------------------------------------- run
run() {
    local addr=10.99.0.1/24 mtu=1500 name= share= tmo=300 logf= pcap=
    while [ $# -gt 0 ]; do
        case "$1" in
            --ip) addr=$2; shift 2 ;;
            --mtu) mtu=$2; shift 2 ;;
            --name) name=$2; shift 2 ;;
            --share) share=$2; shift 2 ;;
            --timeout) tmo=$2; shift 2 ;;
            --log) logf=$2; shift 2 ;;
            --pcap) pcap=$2; shift 2 ;;
            --) shift; break ;;
            *) fail "unknown option $1" ;;
        esac
    done
    local cmd="$*"
    build
    up --mtu "$mtu"
    local o1 o2 o3 o4; IFS=. read -r o1 o2 o3 o4 <<<"${addr%/*}"
    [ -n "$name" ] || name="rxe$o4"
    local tap="tp-$o3-$o4" mac
    mac=$(printf '52:54:00:%02x:%02x:%02x' "$o2" "$o3" "$o4")
    ip -n "$NS" link del "$tap" 2>/dev/null || true
    ip -n "$NS" tuntap add dev "$tap" mode tap
    ip -n "$NS" link set "$tap" mtu "$mtu" master "$BR" up

    local args="console=ttyS0 quiet loglevel=0 panic=-1 peer.ip=$addr peer.mtu=$mtu peer.name=$name"
    [ -z "$cmd" ] || args+=" peer.cmd=$(printf '%s\n' "$cmd" | base64 -w0)"
    [ ${#args} -lt 1900 ] || fail "command too long for the kernel command line: use --share DIR"
    local accel=(-accel tcg)
    [ "$ACCEL" = kvm ] && accel=(-accel kvm -cpu host)
    local q=(qemu-system-x86_64 "${accel[@]}" -m 768 -smp 1 -nodefaults -no-user-config -display none -no-reboot
        -chardev stdio,id=con,signal=off -serial chardev:con
        -kernel "$CACHE/out/vmlinuz" -initrd "$CACHE/out/initramfs.cpio.zst" -append "$args"
        -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no" -device "virtio-net-pci,netdev=n0,mac=$mac")
    [ -z "$share" ] || q+=(-virtfs "local,path=$share,mount_tag=host,security_model=none,id=host")

    local console; console=$(mktemp)
    local dump=
    if [ -n "$pcap" ]; then
        # Immediate mode: every frame reaches the file before qemu exits.
        nsenter --net="/run/netns/$NS" tcpdump -i "$tap" -s 0 -U --immediate-mode -w "$pcap" 2>/dev/null &
        dump=$!
    fi
    cleanup_run() {
        [ -z "$dump" ] || { sleep 0.3; kill -INT "$dump" 2>/dev/null; wait "$dump" 2>/dev/null || true; dump=; }
        ip -n "$NS" link del "$tap" 2>/dev/null || true
    }
    trap cleanup_run EXIT
    set +e
    nsenter --net="/run/netns/$NS" timeout --kill-after=5 "$tmo" "${q[@]}" </dev/null 2>&1 |
        sed -u 's/\r//g; s/\x1b\[[0-9;?]*[a-zA-Z]//g; s/\x1bc//g' | tee "$console" ${logf:+"$logf"}
    set -e
    cleanup_run
    trap - EXIT
    local rc; rc=$(sed -n 's/^PEER-EXIT rc=\([0-9]*\).*/\1/p' "$console" | tail -n1)
    rm -f "$console"
    [ -n "$rc" ] || { say "guest $name ended without PEER-EXIT (timeout or crash)"; return 124; }
    return "$rc"
}

wait_ready() {
    local f=$1 t=${2:-180} i=0
    while [ $i -lt $((t * 10)) ]; do
        grep -q '^PEER-READY' "$f" 2>/dev/null && return 0
        grep -q '^PEER-EXIT' "$f" 2>/dev/null && { say "guest exited before it was ready"; return 1; }
        sleep 0.1; i=$((i + 1))
    done
    say "guest not ready after ${t}s"; return 1
}

selftest() {
    local t0=$SECONDS dir; dir=$(mktemp -d)
    run --ip 10.99.0.1/24 --log "$dir/a" -- 'ibv_rc_pingpong -d $RXE_DEV -g $RXE_GID_V2 -n 20' >/dev/null 2>&1 &
    local srv=$!
    wait_ready "$dir/a" 180 || true
    local rc=0
    run --ip 10.99.0.2/24 --log "$dir/b" -- \
        'for i in $(seq 30); do ibv_rc_pingpong -d $RXE_DEV -g $RXE_GID_V2 -n 20 10.99.0.1 && exit 0; sleep 1; done; exit 1' \
        >/dev/null 2>&1 || rc=$?
    wait "$srv" || rc=$?
    grep -h -E 'bytes in|PEER-EXIT' "$dir/a" "$dir/b" || true
    rm -rf "$dir"
    if [ "$rc" = 0 ]; then echo "SELFTEST PASS ($((SECONDS - t0)) s)"; else echo "SELFTEST FAIL ($((SECONDS - t0)) s)"; return 1; fi
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
