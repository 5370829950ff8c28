//! One urnic device per interface: a second open of an interface that a
//! device holds, by this process or another, fails with `EBUSY` and names
//! the holder's PID; the claim ends when the holder closes the device or
//! dies. An open without the privileges it needs fails with `EPERM`.

mod veth;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use urnic::*;
use urnic_datapath::netns::VethPair;

const NS_VAR: &str = "URNIC_TEST_HOLDER_NETNS";
const IF_VAR: &str = "URNIC_TEST_HOLDER_IF";
const READY: &str = "urnic-test-holder-open";

fn manual() -> DatapathMode {
    DatapathMode::Manual
}

fn veth(tag: &str) -> VethPair {
    veth::require_root();
    let _ = VethPair::sweep_stale();
    VethPair::create(tag, 1500).expect("create namespaces and veth")
}

/// Open `pair`'s first end, retrying while the interface is still busy
/// being released (a generous deadline: a hang is a failure).
fn open_when_free(pair: &VethPair) -> Context {
    let xsk = XskConfig::new(&pair.ifname[0]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match open_af_xdp(Some(&pair.ns[0]), "again", &xsk, manual()) {
            Ok(c) => return c,
            Err(e) if e.kind() == ErrorKind::Busy && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("the interface never became free: {e}"),
        }
    }
}

#[test]
fn a_second_open_in_this_process_is_refused_naming_this_process() {
    let pair = veth("excl");
    let xsk = XskConfig::new(&pair.ifname[0]);
    let first = open_af_xdp(Some(&pair.ns[0]), "first", &xsk, manual()).expect("first device");
    let e = open_af_xdp(Some(&pair.ns[0]), "second", &xsk, manual()).err().expect("the interface is taken");
    eprintln!("second open: {e}");
    assert_eq!((e.kind(), e.errno()), (ErrorKind::Busy, libc::EBUSY), "{e}");
    let me = std::process::id();
    let want = format!("interface {} is in use by urnic process {me} (", pair.ifname[0]);
    assert!(e.message().starts_with(&want), "{e}");
    assert!(std::error::Error::source(&e).is_some(), "the datapath's error is kept");
    // The other end of the veth, in the other namespace, is another interface.
    let mut other = xsk.clone();
    other.ifname = pair.ifname[1].clone();
    let b = open_af_xdp(Some(&pair.ns[1]), "b", &other, manual()).expect("the peer end is free");
    // The first device still works after the refused open.
    assert_eq!(first.query_port(1).unwrap().state, PortState::Active);
    drop((first, b));
    drop(open_when_free(&pair));
}

#[test]
fn another_process_holding_the_interface_is_named_and_its_death_frees_it() {
    let pair = veth("exclp");
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args(["hold_the_interface_until_stdin_closes", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env(NS_VAR, &pair.ns[0])
        .env(IF_VAR, &pair.ifname[0])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the holder");
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let opened = lines.by_ref().map_while(std::io::Result::ok).any(|l| l.contains(READY));
    if !opened {
        let out = child.wait_with_output().unwrap();
        panic!("the holder did not open its device: {}", String::from_utf8_lossy(&out.stderr));
    }

    let xsk = XskConfig::new(&pair.ifname[0]);
    let e = open_af_xdp(Some(&pair.ns[0]), "contender", &xsk, manual()).err().expect("the child holds the interface");
    eprintln!("open while another process holds it: {e}");
    assert_eq!((e.kind(), e.errno()), (ErrorKind::Busy, libc::EBUSY), "{e}");
    let want = format!("interface {} is in use by urnic process {pid} (", pair.ifname[0]);
    assert!(e.message().starts_with(&want), "{e}");
    assert!(e.message().contains("hold_the_interface_until_stdin_closes"), "the holder's command line: {e}");

    // SIGKILL: no destructor runs, the kernel drops the lock with the process.
    child.kill().unwrap();
    child.wait().unwrap();
    let dev = open_when_free(&pair);
    assert_eq!(dev.query_port(1).unwrap().state, PortState::Active);
}

/// The child of the test above (run by it, with the namespace and interface
/// in the environment): opens a device, says so, and holds it until its
/// stdin closes or it is killed.
#[test]
#[ignore = "run by another_process_holding_the_interface_is_named_and_its_death_frees_it"]
fn hold_the_interface_until_stdin_closes() {
    let (ns, ifname) = match (std::env::var(NS_VAR), std::env::var(IF_VAR)) {
        (Ok(ns), Ok(i)) => (ns, i),
        _ => panic!("only another_process_holding_the_interface_is_named_and_its_death_frees_it runs this, with {NS_VAR} and {IF_VAR} set"),
    };
    let dev = open_af_xdp(Some(&ns), "holder", &XskConfig::new(&ifname), manual()).expect("holder device");
    println!("{READY}");
    let _ = std::io::stdin().lines().count();
    drop(dev);
}

/// Linux capability sets of the calling thread (`capget`/`capset`, version 3).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_V3: u32 = 0x2008_0522;
const CAP_NET_ADMIN: u32 = 12;

#[test]
fn an_open_without_cap_net_admin_is_refused_with_eperm() {
    let pair = veth("exclc");
    let (ns, ifname) = (pair.ns[0].clone(), pair.ifname[0].clone());
    // Capabilities are per thread: drop CAP_NET_ADMIN from this thread's
    // effective set (threads it starts inherit that); the rest of the
    // process keeps it.
    let e = std::thread::spawn(move || {
        let mut hdr = CapHeader { version: CAP_V3, pid: 0 };
        let mut data = [CapData::default(); 2];
        // SAFETY: capget writes two CapData for version 3.
        assert_eq!(unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) }, 0);
        data[0].effective &= !(1 << CAP_NET_ADMIN);
        // SAFETY: capset reads two CapData for version 3; only this thread changes.
        assert_eq!(unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) }, 0, "{}", std::io::Error::last_os_error());
        open_af_xdp(Some(&ns), "nocap", &XskConfig::new(&ifname), manual()).err().expect("no CAP_NET_ADMIN")
    })
    .join()
    .unwrap();
    eprintln!("open without CAP_NET_ADMIN: {e}");
    assert_eq!((e.kind(), e.errno()), (ErrorKind::PermissionDenied, libc::EPERM), "{e}");
    assert!(e.message().contains("CAP_NET_ADMIN") && e.message().contains(&pair.ifname[0]), "{e}");
    // This thread still has it, and nothing was left claimed.
    drop(open_when_free(&pair));
}
