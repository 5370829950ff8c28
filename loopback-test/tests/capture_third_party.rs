//! The datapath's pcap capture of real traffic between two urnic devices is
//! read by scapy (which recomputes every ICRC) and by tshark without errors.

use std::process::Command;
use std::time::{Duration, Instant};

use urnic::*;

mod veth;

fn up(qp: &Qp, remote_qpn: u32, remote_gid: Gid, sq: u32, rq: u32) {
    qp.connect(&Connect { mtu: Some(Mtu::Mtu1024), rd_atomic: 4, min_rnr_timer: 1, ..Connect::new(remote_qpn, remote_gid, sq, rq) }).unwrap();
}

#[test]
fn captured_traffic_passes_scapy_and_tshark() {
    let hub = MemHub::new(5);
    let ca = open_device(DeviceConfig::memory(&hub, "urnic0", [2, 0, 0, 0, 0, 1], [10, 0, 0, 1])).unwrap();
    let cb = open_device(DeviceConfig::memory(&hub, "urnic1", [2, 0, 0, 0, 0, 2], [10, 0, 0, 2])).unwrap();
    check_capture(&ca, &cb, "memory");
}

/// The same over a real link: AF_XDP devices in two namespaces over veth,
/// capturing what crosses the wire (`--pcap FILE`).
#[test]
fn captured_veth_traffic_passes_scapy_and_tshark() {
    veth::require_root();
    let (_pair, ca, cb) = veth::pair(Impairments::default(), 1500);
    check_capture(&ca, &cb, "veth");
}

fn check_capture(ca: &Context, cb: &Context, tag: &str) {
    let dir = std::env::temp_dir().join(format!("urnic-capture-test-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("urnic0.pcap");
    ca.nic().set_capture(Some(&pcap)).unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (ma, mb) = (pa.alloc_mr(1 << 16, access).unwrap(), pb.alloc_mr(1 << 16, access).unwrap());
    let (qa_cq, qb_cq) = (ca.create_cq(64, None).unwrap(), cb.create_cq(64, None).unwrap());
    let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 };
    let qa = pa.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &qa_cq, recv_cq: &qa_cq, srq: None, cap: caps, sq_sig_all: true }).unwrap();
    let qb = pb.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &qb_cq, recv_cq: &qb_cq, srq: None, cap: caps, sq_sig_all: true }).unwrap();
    up(&qa, qb.qp_num(), cb.query_gid(1, 1).unwrap(), 0xff_fff0, 10);
    up(&qb, qa.qp_num(), ca.query_gid(1, 1).unwrap(), 10, 0xff_fff0);
    qb.post_recv(&RecvWr { wr_id: 1, sgl: vec![mb.sge(32768, 8192)] }).unwrap();
    let remote = RemoteAddr { addr: mb.addr(), rkey: mb.rkey() };
    let ops = [
        SendOp::Write { remote },
        SendOp::Read { remote },
        SendOp::SendWithImm { imm: 7 },
        SendOp::FetchAdd { remote, add: 1 },
        SendOp::CmpSwap { remote, compare: 0, swap: 1 },
    ];
    for (i, op) in ops.iter().enumerate() {
        let len = if matches!(op, SendOp::FetchAdd { .. } | SendOp::CmpSwap { .. }) { 8 } else { 3000 };
        let wr = SendWr { wr_id: i as u64, op: *op, payload: Payload::Sgl(vec![ma.sge(0, len)]), flags: SendFlags::SIGNALED, ud: None };
        qa.post_send(&wr).unwrap();
    }
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut wc = vec![WorkCompletion::default(); 8];
    while got < ops.len() {
        let n = qa_cq.poll(&mut wc).unwrap();
        assert!(wc[..n].iter().all(|c| c.status == WcStatus::Success), "{:?}", &wc[..n]);
        got += n;
        assert!(Instant::now() < deadline, "completions did not arrive");
        std::thread::yield_now();
    }
    ca.nic().set_capture(None).unwrap();

    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../rocev2/tests/third_party_check.py");
    for reader in ["scapy", "tshark"] {
        let out = Command::new("python3").arg(&script).arg(reader).arg(&pcap).output().expect("python3 (deploy/deps.sh)");
        assert_ne!(out.status.code(), Some(2), "{reader} missing: run deploy/deps.sh");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{reader} rejected the capture:\n{text}");
        // WRITE FIRST/MIDDLE/LAST, READ request + 3 responses, SEND FIRST/MIDDLE/LAST_IMM,
        // ACK, CMP_SWAP, FETCH_ADD, ATOMIC ACK: every one dissected.
        for op in [0x06, 0x07, 0x08, 0x0c, 0x0d, 0x0e, 0x0f, 0x00, 0x01, 0x03, 0x11, 0x12, 0x13, 0x14] {
            assert!(text.contains(&format!("\"opcode\": {op},")), "{reader} saw no opcode {op:#x}:\n{text}");
        }
        if reader == "scapy" {
            assert!(!text.contains("\"error\""), "{text}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
