//! urnic's RDMA-CM (the CM agent on QP1 and `urnic::cm`) against Linux's
//! CM on rxe, in both roles: Debian's unmodified `ucmatose` in an rxe guest
//! and `urnic ucmatose` (the same exchange on urnic's Rust API) in our
//! namespace. Several connections each way: REQ, REP, RTU from both sides'
//! agents, messages both ways, DREQ, DREP. Every frame of the guest's tap
//! capture must parse (ICRC) and tshark must dissect it; the CM MADs must
//! be there, dissected by tshark as CM, one of each per connection at least.

mod rxe_lab;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use rocev2::cm::{CmMad, GSI_QPN};
use rxe_lab::{check_capture, guest_rc, text, Lab, GUEST_IP, OUR_IP};

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

/// CM MADs in the capture by name (a REJ by name and reason), each also
/// dissected by tshark as CM.
fn cm_mads(pcap: &Path) -> BTreeMap<String, usize> {
    let frames = urnic_datapath::capture::read_frames(pcap).unwrap();
    let mut by_name = BTreeMap::new();
    let mut total = 0;
    for f in &frames {
        let Ok(p) = rocev2::wire::parse_frame(f) else { continue };
        if p.repr.transport.bth.dest_qp != GSI_QPN {
            continue;
        }
        let m = CmMad::parse(p.payload).unwrap_or_else(|e| panic!("{}: a QP1 frame that is no CM MAD: {e}", pcap.display()));
        let name = match &m.msg {
            rocev2::cm::CmMessage::Rej(r) => format!("REJ {}", r.reason),
            other => other.name().to_string(),
        };
        *by_name.entry(name).or_insert(0) += 1;
        total += 1;
    }
    let o = std::process::Command::new("tshark").arg("-r").arg(pcap).args(["-Y", "infiniband.mad.mgmtclass == 0x07"]).output().unwrap();
    let dissected = String::from_utf8_lossy(&o.stdout);
    assert_eq!(dissected.lines().filter(|l| l.contains("CM: ")).count(), total, "tshark dissects every CM MAD as CM:\n{dissected}");
    by_name
}

fn assert_cm_exchange(pcap: &Path, connections: usize) {
    assert!(check_capture(pcap) > 0);
    let m = cm_mads(pcap);
    // Both ends of an RDMA-CM connection send its RC data from the UDP port
    // of the flow label the REQ carries (Linux rdma_get_udp_sport).
    let frames = urnic_datapath::capture::read_frames(pcap).unwrap();
    let parsed: Vec<_> = frames.iter().filter_map(|f| rocev2::wire::parse_frame(f).ok()).collect();
    let ports: Vec<u16> = parsed
        .iter()
        .filter_map(|p| match CmMad::parse(p.payload).map(|m| m.msg) {
            Ok(rocev2::cm::CmMessage::Req(r)) if p.repr.transport.bth.dest_qp == GSI_QPN => {
                Some(rocev2::wire::sport::flow_label_to_sport(r.primary.flow_label))
            }
            _ => None,
        })
        .collect();
    let data: Vec<_> = parsed.iter().filter(|p| p.repr.transport.bth.opcode.service() == rocev2::wire::Service::Rc).collect();
    assert!(!data.is_empty(), "{}: no RC data", pcap.display());
    for p in data {
        assert!(
            ports.contains(&p.repr.udp.src_port),
            "{}: RC frame from UDP port {} (the REQs' flow labels give {ports:?})",
            pcap.display(),
            p.repr.udp.src_port
        );
    }
    // The release by the DREPs: a DREP only answers a DREQ, and once a run's
    // tap capture held the four DREPs but none of the four DREQs rxe sent
    // right after its data burst (the DREPs prove they arrived).
    for name in ["REQ", "REP", "RTU", "DREP"] {
        assert!(m.get(name).copied().unwrap_or(0) >= connections, "{}: {connections} connections but CM MADs {m:?}", pcap.display());
    }
    assert!(m.keys().all(|k| !k.starts_with("REJ")), "{}: a REJ in {m:?}", pcap.display());
}

/// Wait (up to 300 s) until the guest's console log has a line with `needle`.
fn wait_for_line(log: &Path, needle: &str) {
    for _ in 0..3000 {
        if std::fs::read_to_string(log).unwrap_or_default().contains(needle) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("the guest never printed {needle:?}: {}", std::fs::read_to_string(log).unwrap_or_default());
}

/// rxe's ucmatose is the server; urnic's the client.
#[test]
fn rxe_ucmatose_server_urnic_client() {
    let lab = Lab::new("cm-srv", 1500);
    let (mut child, log, pcap) = lab.guest("ucmatose-server", "ucmatose -c 4 -C 20 -S 1000");
    lab.wait_ready(&log);
    // A client that comes before the server listens is rejected (reason 8)
    // and a retry from the same QPNs would be stale to the connections the
    // server did accept meanwhile (Linux's stale check, REJ 10): start once,
    // after the server said it starts and had time to listen.
    wait_for_line(&log, "cmatose: starting server");
    std::thread::sleep(std::time::Duration::from_secs(3));
    let out = lab.urnic(&args(&format!("ucmatose -s {GUEST_IP} -c 4 -C 20 -S 1000"))).output().unwrap();
    let _ = child.wait();
    let g = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(out.status.success(), "urnic ucmatose client failed:\n{}\n--- rxe guest ---\n{g}", text(&out));
    assert_eq!(guest_rc(&log), Some(0), "rxe ucmatose server failed:\n{g}\n--- urnic ---\n{}", text(&out));
    assert!(g.contains("data transfers complete") && g.contains("disconnected"), "{g}");
    assert_cm_exchange(&pcap, 4);
}

/// urnic's ucmatose is the server (started first); rxe's the client.
#[test]
fn urnic_ucmatose_server_rxe_client() {
    let lab = Lab::new("cm-cli", 1500);
    let server = lab.urnic(&args(&format!("ucmatose -b {OUR_IP} -c 3 -C 20 -S 1000"))).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let (mut child, log, pcap) = lab.guest("ucmatose-client", &format!("ucmatose -s {OUR_IP} -c 3 -C 20 -S 1000"));
    let _ = child.wait();
    let out = server.wait_with_output().unwrap();
    let g = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(out.status.success(), "urnic ucmatose server failed:\n{}\n--- rxe guest ---\n{g}", text(&out));
    assert_eq!(guest_rc(&log), Some(0), "rxe ucmatose client failed:\n{g}\n--- urnic ---\n{}", text(&out));
    assert!(g.contains("data transfers complete") && g.contains("test complete"), "{g}");
    assert_cm_exchange(&pcap, 3);
}
