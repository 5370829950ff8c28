//! Debian's unmodified `mckey` (RDMA-CM multicast, issue 18) on urnic's
//! librdmacm.so.1 against `mckey` on Linux rxe (the kernel's CMA joins the
//! group: IGMP from `cma_igmp_send`), in both roles, in one guest boot:
//!
//! 1. rxe receives: the guest's `mckey -m GROUP -b GUEST -C 10` joins, then
//!    urnic's `mckey -m GROUP -b OURS -s -C 10` sends; rxe must get all 10.
//! 2. rxe sends: urnic's receiver joins (the kernel holds the group on our
//!    eth0), then the guest's `mckey ... -s -o` (a send-only join) sends.
//!
//! Both joins go through the lab's bridge, whose IGMP snooping (on, as
//! Linux bridges start) learns each member's report and forwards the group
//! to it. The guest's tap is captured: every RoCE frame must pass our parser
//! (ICRC) and tshark's dissection, and the group's UD SENDs (opcode 0x65,
//! QP 0xFFFFFF, Q_Key 0x01234567) of both senders are there. IPv4 groups
//! only: the kernel's CMA refuses IPv6 groups on RoCEv2 (ENOTSUPP in
//! `cma_iboe_join_multicast`).
//!
//! The library is built by `ibverbs-abi/link.sh release`; `URNIC_LIB_DIR`
//! points elsewhere. Nothing is timed: loops have hang guards.

mod rxe_lab;

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use rxe_lab::{check_capture, lib_dir, text, Lab, GUEST_IP, OUR_IP};

const GROUP: &str = "239.18.99.1";
const COUNT: usize = 10;

/// The guest's script: case 1's receiver (a marker once the kernel holds
/// the group on eth0), then case 2's sender once /host/go exists.
fn guest_script() -> String {
    format!(
        "mckey -m {GROUP} -b {GUEST_IP} -C {COUNT} >/host/rx.out 2>&1 & pid=$!\n\
         for i in $(seq 1200); do ip maddr show dev eth0 | grep -qw {GROUP} && break; sleep 0.1; done\n\
         echo URNIC-CASE-rxe-receiver-joined\n\
         wait $pid; rc=$?\ncat /host/rx.out\n\
         [ $rc = 0 ] || {{ echo \"URNIC-CASE-FAILED receiver rc=$rc\"; exit $rc; }}\n\
         echo URNIC-CASE-rxe-receiver-done\n\
         for i in $(seq 3000); do [ -e /host/go ] && break; sleep 0.1; done\n\
         echo URNIC-CASE-rxe-sender\n\
         mckey -m {GROUP} -b {GUEST_IP} -s -o -C {COUNT} >/host/tx.out 2>&1; rc=$?\ncat /host/tx.out\n\
         [ $rc = 0 ] || {{ echo \"URNIC-CASE-FAILED sender rc=$rc\"; exit $rc; }}\n"
    )
}

/// urnic's mckey, killed if the test fails while it runs.
struct Ours(Option<Child>);

impl Drop for Ours {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// urnic's mckey in our namespace (device urnic-eth0).
fn ours(lab: &Lab, args: &[&str]) -> Ours {
    let mut argv: Vec<String> = ["mckey", "-m", GROUP, "-b", OUR_IP, "-C", &COUNT.to_string()].iter().map(|a| a.to_string()).collect();
    argv.extend(args.iter().map(|a| a.to_string()));
    lab.ours(&lib_dir("librdmacm.so.1"), &argv).spawn().map(|c| Ours(Some(c))).expect("ip netns exec mckey")
}

/// Wait for urnic's mckey to end (a hang guard kills it after 300 s).
fn finish(mut ours: Ours, who: &str) -> Output {
    let mut child = ours.0.take().expect("running");
    let start = Instant::now();
    while matches!(child.try_wait(), Ok(None)) {
        if start.elapsed() > Duration::from_secs(300) {
            let _ = child.kill();
            panic!("{who} did not finish:\n{}", text(&child.wait_with_output().expect("mckey output")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().expect("mckey output")
}

fn in_group(ns: &str) -> bool {
    let o = Command::new("ip").args(["-n", ns, "maddr", "show", "dev", "eth0"]).output().expect("ip maddr");
    String::from_utf8_lossy(&o.stdout).split_whitespace().any(|w| w == GROUP)
}

/// The group's UD SENDs with immediate from `src` in the capture (tshark).
fn group_sends(pcap: &Path, src: &str) -> usize {
    let filter = format!(
        "ip.src == {src} && ip.dst == {GROUP} && udp.dstport == 4791 && infiniband.bth.opcode == 0x65 \
         && infiniband.bth.destqp == 0xffffff && infiniband.deth.q_key == 0x01234567"
    );
    let o = Command::new("tshark").arg("-r").arg(pcap).args(["--disable-protocol", "rpcordma", "-Y", &filter]).output().expect("tshark");
    String::from_utf8_lossy(&o.stdout).lines().count()
}

#[test]
fn mckey_urnic_and_rxe_both_roles() {
    let lab = Lab::new("mck", 1500);
    let mut guest = lab.boot("mckey", &guest_script());
    lab.wait_ready(&guest.log);

    // 1. urnic sends, rxe receives.
    guest.wait_for_marker("URNIC-CASE-rxe-receiver-joined");
    let o = finish(ours(&lab, &["-s"]), "urnic's sender");
    let t = text(&o);
    assert!(o.status.success() && t.contains("data transfers complete"), "urnic's sender failed ({}):\n{t}", o.status);
    assert!(t.contains(&format!("mckey: joined dgid: ::ffff:{GROUP} mlid 0x0 sl 0")), "{t}");
    guest.wait_for_marker("URNIC-CASE-rxe-receiver-done");
    let rx = std::fs::read_to_string(guest.share.join("rx.out")).unwrap_or_default();
    assert!(rx.contains("receiving data transfers") && rx.contains("data transfers complete"), "rxe's receiver:\n{rx}");
    eprintln!("urnic -> rxe: rxe's mckey received {COUNT} messages");

    // 2. rxe sends (send-only join), urnic receives.
    let mut rx = ours(&lab, &[]);
    let start = Instant::now();
    while !in_group(&lab.ours) {
        if let Some(Ok(Some(_))) = rx.0.as_mut().map(Child::try_wait) {
            panic!("urnic's receiver exited before joining:\n{}", text(&rx.0.take().unwrap().wait_with_output().unwrap()));
        }
        // A hang guard, not a timing assertion.
        assert!(start.elapsed() < Duration::from_secs(120), "urnic's receiver never joined {GROUP}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(guest.share.join("go"), "").unwrap();
    let o = finish(rx, "urnic's receiver");
    let t = text(&o);
    assert!(o.status.success() && t.contains("data transfers complete"), "urnic's receiver failed ({}):\n{t}", o.status);
    assert!(!in_group(&lab.ours), "urnic's receiver left: the kernel no longer holds {GROUP}");
    guest.finish("the guest");
    let g = guest.console();
    assert!(g.contains(&format!("mckey: joined dgid: ::ffff:{GROUP} mlid 0x0 sl 0")), "rxe's send-only join:\n{g}");
    eprintln!("rxe -> urnic: urnic's mckey received {COUNT} messages");

    let pcap = &guest.pcap;
    let frames = check_capture(pcap);
    assert_eq!(group_sends(pcap, OUR_IP), COUNT, "urnic's {COUNT} sends to {GROUP} on the guest's tap");
    assert_eq!(group_sends(pcap, GUEST_IP), COUNT, "rxe's {COUNT} sends to {GROUP} on the guest's tap");
    eprintln!("{frames} RoCE frames captured, every one parsed (ICRC checked) and dissected");
}
