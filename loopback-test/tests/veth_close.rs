//! A device that closes right after a completion still answers for it.
//!
//! The datapath may hold a batch of bare ACKs back for one poll so that
//! they leave with the application's reply in one kick (`Nic::poll_shard`).
//! If the application instead closes its device after that completion, the
//! ACK must still leave: otherwise the peer retransmits into a closed
//! device and its send ends in a retry-exceeded error although the message
//! arrived. (Found by the rxe interop pingpong, whose last message was
//! never acknowledged.)

mod veth;

use urnic::*;
use urnic_datapath::netns::VethPair;

const MSG: usize = 64;

fn init(cq: &Cq, cap: QpCaps) -> QpInit<'_> {
    QpInit { qp_type: QpType::Rc, send_cq: cq, recv_cq: cq, srq: None, cap, sq_sig_all: true }
}

#[test]
fn ack_of_the_last_message_leaves_when_the_receiver_closes() {
    veth::require_root();
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create("close", 1500).expect("create namespaces and veth");
    let mut xsk = XskConfig::new(&pair.ifname[0]);
    let a =
        open_af_xdp(Some(&pair.ns[0]), "close0", &xsk, DatapathMode::Thread { core: None, idle: IdlePolicy::default() }).expect("AF_XDP device a");
    xsk.ifname = pair.ifname[1].clone();
    // The receiver drives its datapath itself, so nothing polls it once it
    // has seen the completion and closed.
    let b = open_af_xdp(Some(&pair.ns[1]), "close1", &xsk, DatapathMode::Manual).expect("AF_XDP device b");

    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let caps = QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(16, None).unwrap(), b.create_cq(16, None).unwrap());
    let (ma, mb) = (pa.alloc_mr(MSG, access).unwrap(), pb.alloc_mr(MSG, access).unwrap());
    let qa = pa.create_qp(&init(&cqa, caps)).unwrap();
    let qb = pb.create_qp(&init(&cqb, caps)).unwrap();
    // ACK timeout 4.096 µs × 2^17 ≈ 0.5 s, one retry: a lost ACK shows as a
    // retransmission and then a retry-exceeded error, while a loaded machine
    // (the sender's datapath thread not running for a while) does not.
    let ca = Connect { timeout: 17, retry_cnt: 1, ..Connect::new(qb.qp_num(), b.query_gid(1, 1).unwrap(), 7, 9) };
    let cb = Connect { timeout: 17, retry_cnt: 1, ..Connect::new(qa.qp_num(), a.query_gid(1, 1).unwrap(), 9, 7) };
    qa.connect(&ca).unwrap();
    qb.connect(&cb).unwrap();

    qb.post_recv(&RecvWr { wr_id: 1, sgl: vec![mb.sge(0, MSG as u32)] }).unwrap();
    qa.post_send(&SendWr { wr_id: 2, op: SendOp::Send, payload: Payload::Sgl(vec![ma.sge(0, MSG as u32)]), flags: SendFlags::SIGNALED, ud: None })
        .unwrap();

    // Receiver: poll until the message is here, then close at once.
    let mut wc = [WorkCompletion::default(); 4];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        b.poll();
        if cqb.poll(&mut wc).unwrap() > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the SEND never arrived");
    }
    assert_eq!(wc[0].status, WcStatus::Success);
    drop((qb, mb, cqb, pb));
    drop(b);

    // Sender: the ACK must have left before the device went away.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let n = loop {
        let n = cqa.poll(&mut wc).unwrap();
        if n > 0 {
            break n;
        }
        assert!(std::time::Instant::now() < deadline, "no send completion on a");
        std::thread::yield_now();
    };
    assert_eq!(n, 1);
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    let stats = qa.stats().unwrap();
    assert_eq!(stats.req_retransmits, 0, "the sender had to retransmit: the receiver's ACK was lost at close");
    drop(pair);
}

/// A device opened on an interface queue right after another one closed
/// there binds: the kernel frees the old socket's buffer pool from a
/// workqueue, and until then bind says EBUSY (seen as `urnic bench`
/// failing to open a device between two passes); the port retries that.
#[test]
fn a_device_reopened_at_once_on_the_same_queue_binds() {
    veth::require_root();
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create("reopen", 1500).expect("create namespaces and veth");
    let xsk = XskConfig::new(&pair.ifname[0]);
    for i in 0..30 {
        let ctx = open_af_xdp(Some(&pair.ns[0]), "reopen0", &xsk, DatapathMode::Manual).unwrap_or_else(|e| panic!("open {i}: {e}"));
        ctx.poll();
        drop(ctx);
    }
}
