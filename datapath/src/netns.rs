//! Network namespaces: run code inside a named namespace (`ip netns add NAME`).
//!
//! AF_XDP sockets, XDP attachments, netlink and UDP sockets belong to the
//! namespace of the thread that created them and keep working from any
//! thread afterwards. So a device is opened inside its namespace on a
//! short-lived thread that entered it with `setns(2)`, and then used from
//! anywhere. (`ip netns exec` is no substitute in-process: it also remounts
//! `/sys`, which hides the bpf filesystem.)

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// Where `ip netns add NAME` puts the namespace handle.
pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

/// Move the calling thread into the network namespace `name`.
pub fn enter_netns(name: &str) -> io::Result<()> {
    let path = netns_path(name);
    let f = File::open(&path).map_err(|e| io::Error::new(e.kind(), format!("network namespace {}: {e}", path.display())))?;
    // SAFETY: setns on an open namespace fd only changes this thread's namespace.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("setns into {}: {e}", path.display())));
    }
    Ok(())
}

/// Run `f` on a new thread inside network namespace `name` (`None`: the
/// caller's namespace) and return its result.
pub fn in_netns<T: Send + 'static>(name: Option<&str>, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    let name = name.map(str::to_string);
    let handle = std::thread::Builder::new().name("urnic-netns".into()).spawn(move || -> io::Result<T> {
        if let Some(n) = &name {
            enter_netns(n)?;
        }
        Ok(f())
    })?;
    handle.join().map_err(|_| io::Error::other("thread inside the network namespace panicked"))?
}

/// Namespaces this process made and has not deleted yet (deleted at exit).
static MADE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
static AT_EXIT: std::sync::Once = std::sync::Once::new();

extern "C" fn delete_made_namespaces() {
    let names: Vec<String> = MADE.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default();
    for n in names {
        let _ = ip(&["netns", "del", &n]);
    }
}

fn ip(args: &[&str]) -> io::Result<()> {
    let out = std::process::Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(())
}

/// Delete the network namespaces whose owner is gone: `owner` maps a
/// namespace's name to the PID of the process that made it (`None`: not
/// one of ours), and a namespace whose process no longer runs (killed before
/// it could clean up) is deleted, after SIGTERM to whatever still runs in it
/// (a guest's qemu, say). Returns the names deleted.
pub fn sweep_orphaned(owner: impl Fn(&str) -> Option<u32>) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/run/netns") else { return Vec::new() };
    let mut removed = Vec::new();
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner(&name) else { continue };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(o) = std::process::Command::new("ip").args(["netns", "pids", &name]).output() {
            for p in String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                // SAFETY: kill has no memory preconditions; p runs in the orphaned namespace.
                unsafe { libc::kill(p, libc::SIGTERM) };
            }
        }
        if ip(&["netns", "del", &name]).is_ok() {
            removed.push(name);
        }
    }
    removed
}

/// Wait until interface `ifname` in namespace `ns` has a link-local IPv6
/// address (fe80::/64, the kernel's own, from the MAC's EUI-64 by default)
/// that passed duplicate address detection: until then the kernel neither
/// answers neighbour solicitations for it nor sends from it (RFC 4862 5.4),
/// so a peer cannot resolve the link-local GID (index 0). DAD takes a second
/// or two after the link comes up. Fails after `guard` (a hang guard), when
/// DAD failed, or when IPv6 is off on the interface.
pub fn wait_link_local(ns: &str, ifname: &str, guard: std::time::Duration) -> io::Result<()> {
    let deadline = std::time::Instant::now() + guard;
    loop {
        let out = std::process::Command::new("ip").args(["-n", ns, "-6", "-o", "addr", "show", "dev", ifname, "scope", "link"]).output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!("ip -n {ns} addr show dev {ifname}: {}", String::from_utf8_lossy(&out.stderr).trim())));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(" inet6 fe80:")).collect();
        if lines.iter().any(|l| l.contains("dadfailed")) {
            return Err(io::Error::other(format!("{ifname} in {ns}: duplicate address detection failed for its link-local address")));
        }
        if lines.iter().any(|l| !l.contains("tentative")) {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            let why = if lines.is_empty() { "has no link-local IPv6 address (IPv6 off?)" } else { "link-local address still tentative" };
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{ifname} in {ns} {why} after {guard:?}")));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Two network namespaces joined by a veth pair, for tests and the quick
/// start: `ns[0]`/`ifname[0]` has `ipv4[0]`/24 and `mac[0]`, `ns[1]` the
/// other end. Both namespaces (and with them the veth) are deleted on drop,
/// at process exit if the value was leaked (a panicking test), and by
/// [`VethPair::sweep_stale`] if the process was killed.
#[derive(Debug)]
pub struct VethPair {
    /// Namespace names.
    pub ns: [String; 2],
    /// Interface names inside them.
    pub ifname: [String; 2],
    /// IPv4 addresses (/24).
    pub ipv4: [[u8; 4]; 2],
    /// IPv6 addresses (fd75::1/64 and fd75::2/64, no duplicate address
    /// detection so they are usable at once).
    pub ipv6: [[u8; 16]; 2],
    /// MAC addresses.
    pub mac: [[u8; 6]; 2],
}

const PREFIX: &str = "urnic-";

impl VethPair {
    /// Create `urnic-<tag>-<pid>-<n>-{a,b}` with veth `u0`/`u1`,
    /// 10.99.0.1/24 + fd75::1/64 and 10.99.0.2/24 + fd75::2/64, MTU `mtu`,
    /// both up. Needs root.
    pub fn create(tag: &str, mtu: u32) -> io::Result<VethPair> {
        VethPair::create_with_queues(tag, mtu, 1)
    }

    /// [`VethPair::create`] with `queues` RX and TX queues on each end.
    pub fn create_with_queues(tag: &str, mtu: u32, queues: u32) -> io::Result<VethPair> {
        let base = next_base(tag);
        let pair = VethPair {
            ns: [format!("{base}-a"), format!("{base}-b")],
            ifname: ["u0".into(), "u1".into()],
            ipv4: [[10, 99, 0, 1], [10, 99, 0, 2]],
            ipv6: [std::net::Ipv6Addr::new(0xfd75, 0, 0, 0, 0, 0, 0, 1).octets(), std::net::Ipv6Addr::new(0xfd75, 0, 0, 0, 0, 0, 0, 2).octets()],
            mac: [[0x02, 0x75, 0x72, 0, 0, 1], [0x02, 0x75, 0x72, 0, 0, 2]],
        };
        for ns in &pair.ns {
            add_netns(ns)?;
        }
        let mtu_s = mtu.to_string();
        let q = queues.max(1).to_string();
        let mac = |m: [u8; 6]| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        ip(&[
            "-n",
            &pair.ns[0],
            "link",
            "add",
            "u0",
            "address",
            &mac(pair.mac[0]),
            "mtu",
            &mtu_s,
            "numrxqueues",
            &q,
            "numtxqueues",
            &q,
            "type",
            "veth",
            "peer",
            "name",
            "u1",
            "address",
            &mac(pair.mac[1]),
            "mtu",
            &mtu_s,
            "numrxqueues",
            &q,
            "numtxqueues",
            &q,
            "netns",
            &pair.ns[1],
        ])?;
        for i in 0..2 {
            let a = pair.ipv4[i];
            let cidr = format!("{}.{}.{}.{}/24", a[0], a[1], a[2], a[3]);
            ip(&["-n", &pair.ns[i], "addr", "add", &cidr, "dev", &pair.ifname[i]])?;
            let v6 = format!("{}/64", std::net::Ipv6Addr::from(pair.ipv6[i]));
            ip(&["-n", &pair.ns[i], "addr", "add", &v6, "dev", &pair.ifname[i], "nodad"])?;
            ip(&["-n", &pair.ns[i], "link", "set", &pair.ifname[i], "up"])?;
            ip(&["-n", &pair.ns[i], "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }

    /// Wait until both ends' link-local addresses passed duplicate address
    /// detection (see [`wait_link_local`]), for traffic between the
    /// link-local GIDs (index 0).
    pub fn wait_link_local(&self, guard: std::time::Duration) -> io::Result<()> {
        for i in 0..2 {
            wait_link_local(&self.ns[i], &self.ifname[i], guard)?;
        }
        Ok(())
    }

    /// Delete both namespaces now (also done on drop).
    pub fn delete(&self) {
        for ns in &self.ns {
            del_netns(ns);
        }
    }

    /// Delete namespaces left by urnic processes that no longer run (killed
    /// before they could clean up): those of [`VethPair`]s and
    /// [`Segment`]s alike. Returns how many were deleted.
    pub fn sweep_stale() -> usize {
        sweep_stale_labs()
    }
}

/// `urnic-<tag>-<pid>-<n>`: a fresh base name for this process's next lab
/// (namespaces are `<base>-<suffix>`, the suffix without a `-`).
fn next_base(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    AT_EXIT.call_once(|| {
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(delete_made_namespaces) };
    });
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{PREFIX}{tag}-{}-{n}", std::process::id())
}

/// `ip netns add ns`, remembered for deletion at exit.
fn add_netns(ns: &str) -> io::Result<()> {
    ip(&["netns", "add", ns])?;
    if let Ok(mut v) = MADE.lock() {
        v.push(ns.to_string());
    }
    Ok(())
}

/// `ip netns del ns` (its interfaces go with it), forgotten for exit.
fn del_netns(ns: &str) {
    let _ = ip(&["netns", "del", ns]);
    if let Ok(mut v) = MADE.lock() {
        v.retain(|n| n != ns);
    }
}

/// Delete the `urnic-<tag>-<pid>-<n>-<suffix>` namespaces whose process no
/// longer runs. Returns how many were deleted.
fn sweep_stale_labs() -> usize {
    // The pid is third from the end.
    sweep_orphaned(|name| name.strip_prefix(PREFIX)?.rsplit('-').nth(2)?.parse().ok()).len()
}

impl Drop for VethPair {
    fn drop(&mut self) {
        self.delete();
    }
}

/// Several network namespaces on one Ethernet segment: each member
/// namespace has a veth whose other end is a port of a Linux bridge in a
/// namespace of its own, so every member reaches every other and sees what
/// a host on a shared L2 segment sees (a third member can send frames to the
/// other two, spoof their addresses, and is flooded frames to unknown MACs).
///
/// Member `i` is namespace `ns[i]` = `urnic-<tag>-<pid>-<n>-<letter>`
/// (`a`, `b`, `c`, ...) with interface `ifname[i]` = `u<i>`, `ipv4[i]` =
/// 10.99.0.(i+1)/24, `ipv6[i]` = fd75::(i+1)/64 and `mac[i]` =
/// 02:75:72:00:00:(i+1). The bridge `br0` (no STP, so ports forward at
/// once) and its ports `p<i>` are in `bridge_ns` = `urnic-<tag>-<pid>-<n>-br`.
/// All namespaces (and with them every interface) are deleted on drop, at
/// process exit if the value was leaked (a panicking test), and by
/// [`Segment::sweep_stale`] (or [`VethPair::sweep_stale`]) if the process
/// was killed.
#[derive(Debug)]
pub struct Segment {
    /// Member namespace names.
    pub ns: Vec<String>,
    /// Each member's interface on the segment.
    pub ifname: Vec<String>,
    /// Each member's IPv4 address (/24).
    pub ipv4: Vec<[u8; 4]>,
    /// Each member's IPv6 address (/64, no duplicate address detection so
    /// it is usable at once).
    pub ipv6: Vec<[u8; 16]>,
    /// Each member's MAC address.
    pub mac: Vec<[u8; 6]>,
    /// The namespace holding the bridge.
    pub bridge_ns: String,
}

impl Segment {
    /// Most members a segment has (one letter each, and the last octet of
    /// their addresses).
    pub const MAX_MEMBERS: usize = 26;

    /// Create a segment of `members` namespaces (2 to
    /// [`Segment::MAX_MEMBERS`]) with MTU `mtu` on every interface, all up,
    /// the bridge forwarding. Needs root and iproute2. On error whatever was
    /// made is deleted again.
    pub fn create(tag: &str, members: usize, mtu: u32) -> io::Result<Segment> {
        if !(2..=Segment::MAX_MEMBERS).contains(&members) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a segment has 2 to {} members, not {members}", Segment::MAX_MEMBERS)));
        }
        if tag.is_empty() || tag.contains(['/', ' ']) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad segment tag {tag:?}")));
        }
        let base = next_base(tag);
        let seg = Segment {
            ns: (0..members).map(|i| format!("{base}-{}", (b'a' + i as u8) as char)).collect(),
            ifname: (0..members).map(|i| format!("u{i}")).collect(),
            ipv4: (0..members).map(|i| [10, 99, 0, i as u8 + 1]).collect(),
            ipv6: (0..members).map(|i| std::net::Ipv6Addr::new(0xfd75, 0, 0, 0, 0, 0, 0, i as u16 + 1).octets()).collect(),
            mac: (0..members).map(|i| [0x02, 0x75, 0x72, 0, 0, i as u8 + 1]).collect(),
            bridge_ns: format!("{base}-br"),
        };
        // From here on a failure drops `seg`, which deletes what exists.
        seg.build(mtu)?;
        Ok(seg)
    }

    fn build(&self, mtu: u32) -> io::Result<()> {
        let br = self.bridge_ns.as_str();
        add_netns(br)?;
        for ns in &self.ns {
            add_netns(ns)?;
        }
        let mtu_s = mtu.to_string();
        // stp_state 0: no spanning tree, so a port forwards as soon as it is
        // up (no listening/learning delay).
        ip(&["-n", br, "link", "add", "br0", "mtu", &mtu_s, "type", "bridge", "stp_state", "0"])?;
        ip(&["-n", br, "link", "set", "br0", "up"])?;
        let mac = |m: [u8; 6]| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        for i in 0..self.ns.len() {
            let port = format!("p{i}");
            ip(&[
                "-n",
                br,
                "link",
                "add",
                &port,
                "mtu",
                &mtu_s,
                "type",
                "veth",
                "peer",
                "name",
                &self.ifname[i],
                "address",
                &mac(self.mac[i]),
                "mtu",
                &mtu_s,
                "netns",
                &self.ns[i],
            ])?;
            ip(&["-n", br, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", br, "link", "set", &port, "up"])?;
            let (ns, ifname) = (&self.ns[i], &self.ifname[i]);
            let a = self.ipv4[i];
            ip(&["-n", ns, "addr", "add", &format!("{}.{}.{}.{}/24", a[0], a[1], a[2], a[3]), "dev", ifname])?;
            ip(&["-n", ns, "addr", "add", &format!("{}/64", std::net::Ipv6Addr::from(self.ipv6[i])), "dev", ifname, "nodad"])?;
            ip(&["-n", ns, "link", "set", ifname, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// Delete every namespace of the segment now (also done on drop).
    pub fn delete(&self) {
        for ns in &self.ns {
            del_netns(ns);
        }
        del_netns(&self.bridge_ns);
    }

    /// Delete namespaces left by urnic processes that no longer run (killed
    /// before they could clean up): segments' and [`VethPair`]s' alike.
    /// Returns how many were deleted.
    pub fn sweep_stale() -> usize {
        sweep_stale_labs()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.delete();
    }
}
