//! RDMA WRITE bandwidth in the shape of perftest's `ib_write_bw`: two devices
//! on an in-memory link, `iters` writes of `size` bytes with `depth` in flight.
//!
//! `cargo run --release -p urnic --example write_bw -- [size] [iters] [depth]`

use std::time::Instant;

use urnic::*;

fn qp_to_rts(qp: &Qp, remote_qpn: u32, remote_gid: Gid, sq_psn: u32, rq_psn: u32, mtu: Mtu) -> Result<()> {
    let mut a = QpAttr { qp_state: QpState::Init, qp_access_flags: Access::REMOTE_WRITE, ..QpAttr::default() };
    qp.modify(&a, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)?;
    a.qp_state = QpState::Rtr;
    a.path_mtu = mtu;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = Psn::new(rq_psn);
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr = Some(AhAttr { dgid: remote_gid, sgid_index: 1, port_num: 1, ..AhAttr::default() });
    qp.modify(
        &a,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )?;
    a.qp_state = QpState::Rts;
    a.sq_psn = Psn::new(sq_psn);
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    qp.modify(
        &a,
        QpAttrMask::STATE | QpAttrMask::SQ_PSN | QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(65536);
    let iters: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(5000);
    let depth: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(128);

    let hub = MemHub::new(1);
    let client = open_device(DeviceConfig::memory(&hub, "urnic0", [2, 0, 0, 0, 0, 1], [10, 0, 0, 1]))?;
    let server = open_device(DeviceConfig::memory(&hub, "urnic1", [2, 0, 0, 0, 0, 2], [10, 0, 0, 2]))?;

    let (cpd, spd) = (client.alloc_pd()?, server.alloc_pd()?);
    let src = cpd.alloc_mr(size, Access::LOCAL_WRITE)?;
    let dst = spd.alloc_mr(size, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let (ccq, scq) = (client.create_cq(2 * depth as u32, None)?, server.create_cq(16, None)?);
    let caps = QpCaps { max_send_wr: depth as u32, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let cqp = cpd.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &ccq, recv_cq: &ccq, srq: None, cap: caps, sq_sig_all: true })?;
    let sqp = spd.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &scq, recv_cq: &scq, srq: None, cap: caps, sq_sig_all: true })?;
    let mtu = client.query_port(1)?.active_mtu;
    qp_to_rts(&cqp, sqp.qp_num(), server.query_gid(1, 1)?, 1, 2, mtu)?;
    qp_to_rts(&sqp, cqp.qp_num(), client.query_gid(1, 1)?, 2, 1, mtu)?;

    // The server's address and rkey travel out of band in real programs.
    let remote = RemoteAddr { addr: dst.addr(), rkey: dst.rkey() };
    let wr =
        SendWr { wr_id: 0, op: SendOp::Write { remote }, payload: Payload::Sgl(vec![src.sge(0, size as u32)]), flags: SendFlags::SIGNALED, ud: None };
    let mut wc = vec![WorkCompletion::default(); 64];
    let start = Instant::now();
    let (mut posted, mut done) = (0, 0);
    while done < iters {
        while posted < iters && posted - done < depth {
            cqp.post_send(&wr)?;
            posted += 1;
        }
        let n = ccq.poll(&mut wc)?;
        if let Some(bad) = wc[..n].iter().find(|c| c.status != WcStatus::Success) {
            return Err(Error::new(ErrorKind::Io, format!("write failed: {:?}", bad.status)));
        }
        done += n;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(" #bytes     #iterations    BW average[MB/sec]   MsgRate[Mpps]");
    println!(" {:<10} {:<10}       {:<10.2}           {:.6}", size, iters, (size * iters) as f64 / secs / 1e6, iters as f64 / secs / 1e6);
    Ok(())
}
