//! An RC ping-pong in the shape of rdma-core's `ibv_rc_pingpong`: two devices
//! on an in-memory link, SEND/RECV of `size` bytes back and forth `iters` times.
//!
//! `cargo run -p urnic --example rc_pingpong -- [size] [iters]`

use std::time::{Duration, Instant};

use urnic::*;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(4096);
    let iters: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1000);

    // ibv_get_device_list + ibv_open_device: two devices on one in-memory hub.
    let hub = MemHub::new(1);
    let dev = [
        open_device(DeviceConfig::memory(&hub, "urnic0", [2, 0, 0, 0, 0, 1], [10, 0, 0, 1]))?,
        open_device(DeviceConfig::memory(&hub, "urnic1", [2, 0, 0, 0, 0, 2], [10, 0, 0, 2]))?,
    ];

    // ibv_alloc_pd, ibv_reg_mr, ibv_create_cq, ibv_create_qp
    let mut ends = Vec::new();
    for ctx in &dev {
        let pd = ctx.alloc_pd()?;
        let mr = pd.alloc_mr(2 * size.max(1), Access::LOCAL_WRITE)?;
        let cq = ctx.create_cq(64, None)?;
        let qp = pd.create_qp(&QpInit {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            cap: QpCaps { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 },
            sq_sig_all: true,
        })?;
        ends.push((pd, mr, cq, qp));
    }

    // Exchange QPN/PSN/GID (ibv_rc_pingpong does it over TCP) and ibv_modify_qp to RTS.
    let info: Vec<(u32, u32, Gid)> =
        ends.iter().zip(&dev).enumerate().map(|(i, (e, ctx))| (e.3.qp_num(), 0x100 * (i as u32 + 1), ctx.query_gid(1, 1).unwrap())).collect();
    for (i, (_, _, _, qp)) in ends.iter().enumerate() {
        let (me, peer) = (info[i], info[1 - i]);
        let mut attr = QpAttr { qp_state: QpState::Init, ..QpAttr::default() };
        qp.modify(&attr, QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS)?;
        attr.qp_state = QpState::Rtr;
        attr.path_mtu = Mtu::Mtu1024;
        attr.dest_qp_num = peer.0;
        attr.rq_psn = Psn::new(peer.1);
        attr.max_dest_rd_atomic = 1;
        attr.min_rnr_timer = 12;
        attr.ah_attr = Some(AhAttr { dgid: peer.2, sgid_index: 1, port_num: 1, ..AhAttr::default() });
        qp.modify(
            &attr,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )?;
        attr.qp_state = QpState::Rts;
        attr.sq_psn = Psn::new(me.1);
        attr.timeout = 14;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.max_rd_atomic = 1;
        qp.modify(
            &attr,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )?;
    }

    // Ping-pong: post a receive, send, wait for the send and the receive.
    let recv_wr = |mr: &Mr| RecvWr { wr_id: 1, sgl: vec![mr.sge(size, size as u32)] };
    let send_wr =
        |mr: &Mr| SendWr { wr_id: 2, op: SendOp::Send, payload: Payload::Sgl(vec![mr.sge(0, size as u32)]), flags: SendFlags::SIGNALED, ud: None };
    for (_, mr, _, qp) in &ends {
        qp.post_recv(&recv_wr(mr))?;
    }
    let start = Instant::now();
    let mut wc = [WorkCompletion::default(); 4];
    for i in 0..iters * 2 {
        let (s, r) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
        ends[s].3.post_send(&send_wr(&ends[s].1))?;
        for side in [s, r] {
            let deadline = Instant::now() + Duration::from_secs(10);
            let want = if side == s { WcOpcode::Send } else { WcOpcode::Recv };
            'wait: loop {
                let n = ends[side].2.poll(&mut wc)?;
                for c in &wc[..n] {
                    if c.status != WcStatus::Success {
                        return Err(Error::new(ErrorKind::Io, format!("completion with status {:?}", c.status)));
                    }
                    if c.opcode == want {
                        break 'wait;
                    }
                }
                if Instant::now() > deadline {
                    return Err(Error::new(ErrorKind::Io, "no completion within 10 s"));
                }
            }
        }
        ends[r].3.post_recv(&recv_wr(&ends[r].1))?;
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = (2 * iters * size) as f64;
    println!("{} bytes in {:.2} seconds = {:.2} Mbit/sec", bytes as u64, usec / 1e6, bytes * 8.0 / usec);
    println!("{} iters in {:.2} seconds = {:.2} usec/iter", iters, usec / 1e6, usec / iters as f64);
    Ok(())
}
