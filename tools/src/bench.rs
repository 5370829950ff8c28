//! `urnic bench`: urnic against the baselines a user would pick, on the same
//! veth between two namespaces, in one run: urnic WRITE bandwidth and SEND
//! latency (two AF_XDP devices, run-to-completion on one thread), the raw
//! AF_XDP frame-forwarding ceiling (one thread blasting MTU-sized RoCE frames
//! through the same XDP program and AF_XDP path, another receiving), kernel
//! TCP stream throughput (iperf3) and kernel UDP ping-pong latency. Prints a
//! markdown table with the ratios.

use std::net::UdpSocket;
use std::process::Command;
use std::time::{Duration, Instant};

use urnic::{open_af_xdp, DatapathMode, XskConfig};
use urnic_datapath::netns::{in_netns, VethPair};
use urnic_datapath::{Port, XskPort};

use crate::perf::{connect_pair, send_lat, write_bw, Endpoint};

thread_local! {
    static CPU_PER_GB: std::cell::Cell<f64> = const { std::cell::Cell::new(f64::NAN) };
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len().max(1)) - 1;
    v.get(i).copied().unwrap_or(f64::NAN)
}

/// Resident memory of this process, bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .map_or(0, |pages| pages * 4096)
}

/// CPU time (user + system) of this process so far, seconds.
fn cpu_self() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru.ru_utime.tv_sec as f64 + ru.ru_utime.tv_usec as f64 / 1e6 + ru.ru_stime.tv_sec as f64 + ru.ru_stime.tv_usec as f64 / 1e6
    }
}

/// CPU time of finished children (iperf3), seconds.
fn cpu_children() -> f64 {
    // SAFETY: as above.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru.ru_utime.tv_sec as f64 + ru.ru_utime.tv_usec as f64 / 1e6 + ru.ru_stime.tv_sec as f64 + ru.ru_stime.tv_usec as f64 / 1e6
    }
}

/// `nqps` connected RC QP pairs on one pair of devices, 64 KiB WRITEs spread
/// round-robin with 128 in flight: aggregate MB/s, and memory per QP.
fn many_qps(pair: &VethPair, nqps: usize, iters: usize) -> Result<(f64, f64), String> {
    use urnic::{Access, Connect, Payload, QpCaps, QpInit, QpType, RemoteAddr, SendFlags, SendOp, SendWr, WcStatus, WorkCompletion};
    let x = XskConfig::new(&pair.ifname[0]);
    let a = open_af_xdp(Some(&pair.ns[0]), "many0", &x, DatapathMode::Manual).map_err(|e| e.to_string())?;
    let y = XskConfig::new(&pair.ifname[1]);
    let b = open_af_xdp(Some(&pair.ns[1]), "many1", &y, DatapathMode::Manual).map_err(|e| e.to_string())?;
    let e = |what: &'static str| move |err: urnic::Error| format!("{what}: {err}");
    let (pa, pb) = (a.alloc_pd().map_err(e("pd"))?, b.alloc_pd().map_err(e("pd"))?);
    let acc = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (ma, mb) = (pa.alloc_mr(65536, acc).map_err(e("mr"))?, pb.alloc_mr(65536, acc).map_err(e("mr"))?);
    let (ca, cb) = (a.create_cq(4096, None).map_err(e("cq"))?, b.create_cq(4096, None).map_err(e("cq"))?);
    let caps = QpCaps { max_send_wr: if nqps == 1 { 128 } else { 16 }, max_recv_wr: 1, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 };
    let before = rss();
    let mut qps = Vec::with_capacity(nqps);
    for i in 0..nqps {
        let qa = pa.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &ca, recv_cq: &ca, srq: None, cap: caps, sq_sig_all: true }).map_err(e("qp"))?;
        let qb = pb.create_qp(&QpInit { qp_type: QpType::Rc, send_cq: &cb, recv_cq: &cb, srq: None, cap: caps, sq_sig_all: true }).map_err(e("qp"))?;
        let psn = i as u32 + 1;
        qa.connect(&Connect { access: acc, ..Connect::new(qb.qp_num(), b.query_gid(1, 1).map_err(e("gid"))?, psn, psn) }).map_err(e("connect"))?;
        qb.connect(&Connect { access: acc, ..Connect::new(qa.qp_num(), a.query_gid(1, 1).map_err(e("gid"))?, psn, psn) }).map_err(e("connect"))?;
        qps.push((qa, qb));
    }
    let per_qp = (rss().saturating_sub(before)) as f64 / (2 * nqps) as f64;
    let remote = RemoteAddr { addr: mb.addr(), rkey: mb.rkey() };
    let mut wc = vec![WorkCompletion::default(); 256];
    let (mut posted, mut done) = (0usize, 0usize);
    let start = Instant::now();
    while done < iters {
        while posted < iters && posted - done < 128 {
            let (qa, _) = &qps[posted % nqps];
            qa.post_send(&SendWr { wr_id: posted as u64, op: SendOp::Write { remote }, payload: Payload::Sgl(vec![ma.sge(0, 65536)]), flags: SendFlags::SIGNALED, ud: None })
                .map_err(e("post"))?;
            posted += 1;
        }
        a.poll();
        b.poll();
        let n = ca.poll(&mut wc).map_err(e("poll"))?;
        if let Some(bad) = wc[..n].iter().find(|w| w.status != WcStatus::Success) {
            return Err(format!("completion {:?}", bad.status));
        }
        done += n;
        if start.elapsed() > Duration::from_secs(120) {
            return Err(format!("{nqps} QPs: only {done}/{iters} WRITEs in 120 s"));
        }
    }
    let mbs = (iters * 65536) as f64 / start.elapsed().as_secs_f64() / 1e6;
    Ok((mbs, per_qp))
}

/// urnic: (WRITE MB/s at `size`, SEND latency p50 µs, p99 µs at 8 B).
fn urnic(pair: &VethPair, size: usize, iters: usize) -> Result<(f64, f64, f64), String> {
    let x = XskConfig::new(&pair.ifname[0]);
    let a = open_af_xdp(Some(&pair.ns[0]), "bench0", &x, DatapathMode::Manual).map_err(|e| e.to_string())?;
    let y = XskConfig::new(&pair.ifname[1]);
    let b = open_af_xdp(Some(&pair.ns[1]), "bench1", &y, DatapathMode::Manual).map_err(|e| e.to_string())?;
    let buf = (2 * size.max(8192)).div_ceil(4096) * 4096;
    let mut ea = Endpoint::new(&a, buf, 128)?;
    let mut eb = Endpoint::new(&b, buf, 128)?;
    ea.drive = vec![a.clone(), b.clone()];
    eb.drive = vec![a.clone(), b.clone()];
    connect_pair(&ea, &eb)?;
    let cpu0 = cpu_self();
    let bw = write_bw(&mut ea, &mut eb, size, iters, 128)?;
    let cpu = cpu_self() - cpu0;
    CPU_PER_GB.with(|c| c.set(cpu / ((size * iters) as f64 / 1e9)));
    let lat = send_lat(&mut ea, &mut eb, 8, 2000)?;
    Ok((bw.avg_mbs, lat.typical, lat.p99))
}

/// The raw AF_XDP ceiling: frames per second from one AF_XDP socket to the
/// other through the same XDP program, `frame_len`-byte RoCE frames.
fn raw_afxdp(pair: &VethPair, frame_len: usize, secs: f64) -> Result<f64, String> {
    // A valid RoCE frame (WRITE MIDDLE to a QPN nobody has) to the peer's IP.
    let frame = {
        use rocev2::wire::*;
        let payload = frame_len - 58;
        let repr = FrameRepr {
            eth: EthernetRepr { dst: pair.mac[1], src: pair.mac[0], vlan: None, ethertype: 0x0800 },
            ip: IpRepr::V4(Ipv4Repr { src: pair.ipv4[0], dst: pair.ipv4[1], dscp: 0, ecn: 2, ident: 0, dont_frag: true, ttl: 64, protocol: 17, payload_len: 0 }),
            udp: UdpRepr { src_port: 50000, dst_port: ROCEV2_UDP_PORT, length: 0, checksum: 0 },
            transport: TransportRepr {
                bth: BthRepr { opcode: Opcode::RC_WRITE_MIDDLE, solicited: false, mig_req: false, pad_count: 0, tver: 0, pkey: 0xffff, fecn: false, becn: false, resv6: 0, dest_qp: 0x77, ack_req: false, resv7: 0, psn: rocev2::Psn::new(1) },
                deth: None,
                reth: None,
                atomic_eth: None,
                aeth: None,
                atomic_ack: None,
                immediate: None,
                invalidate_rkey: None,
            },
        };
        let mut f = vec![0u8; repr.frame_len(payload)];
        repr.emit(&vec![0x5a; payload], &mut f).map_err(|e| e.to_string())?;
        f
    };
    let ns_rx = pair.ns[1].clone();
    let if_rx = pair.ifname[1].clone();
    let ns_tx = pair.ns[0].clone();
    let if_tx = pair.ifname[0].clone();
    let mut rx = in_netns(Some(&ns_rx), move || XskPort::open(&XskConfig::new(&if_rx))).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    let mut tx = in_netns(Some(&ns_tx), move || XskPort::open(&XskConfig::new(&if_tx))).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = stop.clone();
    let sender = std::thread::spawn(move || {
        let mut sent = 0u64;
        while !s2.load(std::sync::atomic::Ordering::Relaxed) {
            for _ in 0..64 {
                match tx.transmit_with(&mut |buf| {
                    buf[..frame.len()].copy_from_slice(&frame);
                    Some(frame.len())
                }) {
                    Ok(true) => sent += 1,
                    _ => break,
                }
            }
            let _ = tx.flush();
        }
        sent
    });
    // Warm up, then count for `secs`.
    let warm = Instant::now() + Duration::from_millis(200);
    while Instant::now() < warm {
        let _ = rx.receive(256, &mut |_| {});
    }
    let start = Instant::now();
    let mut got = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        got += rx.receive(256, &mut |_| {}).unwrap_or(0) as u64;
    }
    let pps = got as f64 / start.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = sender.join();
    Ok(pps)
}

/// iperf3 single-stream TCP throughput, Mb/s.
fn iperf3(pair: &VethPair, secs: u32) -> Result<(f64, f64), String> {
    let c0 = cpu_children();
    let mut server = Command::new("ip")
        .args(["netns", "exec", &pair.ns[0], "iperf3", "-s", "-1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("iperf3 (apt install iperf3; deploy/deps.sh test): {e}"))?;
    std::thread::sleep(Duration::from_millis(300));
    let ip = format!("{}.{}.{}.{}", pair.ipv4[0][0], pair.ipv4[0][1], pair.ipv4[0][2], pair.ipv4[0][3]);
    let out = Command::new("ip")
        .args(["netns", "exec", &pair.ns[1], "iperf3", "-c", &ip, "-t", &secs.to_string(), "-J"])
        .output()
        .map_err(|e| format!("iperf3: {e}"))?;
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    // "sum_received": { ... "bits_per_second": N
    let at = text.find("\"sum_received\"").ok_or_else(|| format!("iperf3 output without sum_received: {text}"))?;
    let bps = text[at..]
        .split("\"bits_per_second\":")
        .nth(1)
        .and_then(|v| v.trim_start().split(|c: char| c == ',' || c.is_whitespace() || c == '}').next())
        .and_then(|v| v.parse::<f64>().ok())
        .ok_or("iperf3: no bits_per_second")?;
    // CPU of both iperf3 processes (user + system, the kernel's TCP work in
    // their context; softirq work elsewhere is not counted) per GB moved.
    let cpu = cpu_children() - c0;
    let gb = bps / 8.0 * f64::from(secs) / 1e9;
    Ok((bps / 1e6, cpu / gb))
}

/// Kernel UDP ping-pong of 8 bytes: (p50, p99) one-way µs (RTT/2).
fn udp_pingpong(pair: &VethPair, iters: usize) -> Result<(f64, f64), String> {
    let server_ip = pair.ipv4[0];
    let ns0 = pair.ns[0].clone();
    let srv = in_netns(Some(&ns0), || UdpSocket::bind("0.0.0.0:9999")).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    let n = iters + 100;
    let echo = std::thread::spawn(move || {
        let mut b = [0u8; 64];
        for _ in 0..n {
            if let Ok((k, from)) = srv.recv_from(&mut b) {
                let _ = srv.send_to(&b[..k], from);
            }
        }
    });
    let ns1 = pair.ns[1].clone();
    let cli = in_netns(Some(&ns1), || UdpSocket::bind("0.0.0.0:0")).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    cli.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    cli.connect((std::net::Ipv4Addr::from(server_ip), 9999)).map_err(|e| e.to_string())?;
    let mut samples = Vec::with_capacity(iters);
    let mut b = [0u8; 64];
    for i in 0..n {
        let t = Instant::now();
        cli.send(&[7u8; 8]).map_err(|e| e.to_string())?;
        cli.recv(&mut b).map_err(|e| format!("UDP ping-pong: {e}"))?;
        if i >= 100 {
            samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    let _ = echo.join();
    Ok((median(&mut samples.clone()), pct(&mut samples, 0.99)))
}

/// WRITE bandwidth (MB/s) for each size, on a veth of `link_mtu`, with both
/// devices on one thread (run-to-completion) or a datapath thread each.
fn sweep(link_mtu: u32, two_cores: bool, sizes: &[usize]) -> Result<Vec<f64>, String> {
    let _ = VethPair::sweep_stale();
    let pair = VethPair::create("sweep", link_mtu).map_err(|e| format!("namespaces (root): {e}"))?;
    let mode = if two_cores { DatapathMode::Thread { core: None, idle: urnic::IdlePolicy::default() } } else { DatapathMode::Manual };
    let a = open_af_xdp(Some(&pair.ns[0]), "sw0", &XskConfig::new(&pair.ifname[0]), mode.clone()).map_err(|e| e.to_string())?;
    let b = open_af_xdp(Some(&pair.ns[1]), "sw1", &XskConfig::new(&pair.ifname[1]), mode).map_err(|e| e.to_string())?;
    let max = sizes.iter().copied().max().unwrap_or(65536);
    let buf = (2 * max.max(8192)).div_ceil(4096) * 4096;
    let mut ea = Endpoint::new(&a, buf, 128)?;
    let mut eb = Endpoint::new(&b, buf, 128)?;
    if !two_cores {
        ea.drive = vec![a.clone(), b.clone()];
        eb.drive = vec![a.clone(), b.clone()];
    }
    connect_pair(&ea, &eb)?;
    let mut out = Vec::new();
    for &size in sizes {
        let iters = (256usize << 20).div_ceil(size).clamp(2000, 20_000);
        out.push(write_bw(&mut ea, &mut eb, size, iters, 128)?.avg_mbs);
    }
    Ok(out)
}

fn plot_sweep(sizes: &[usize], series: &[(String, Vec<f64>)], ceiling: f64, path: &std::path::Path) -> Result<(), String> {
    use crate::dcqcn_plot::{Canvas, Panel, COLORS, H, W};
    let mut c = Canvas::new();
    let ymax = series.iter().flat_map(|s| s.1.iter().copied()).fold(ceiling, f64::max) * 1.1;
    // x: log2 of the size.
    let (lo, hi) = ((sizes[0] as f64).log2(), (*sizes.last().unwrap_or(&1) as f64).log2());
    let p = Panel { area: (50, 20, W as i64 - 20, H as i64 - 30), xmax: hi - lo, ymax };
    p.frame(&mut c);
    for (k, (_, v)) in series.iter().enumerate() {
        for (i, w) in v.windows(2).enumerate() {
            let x0 = (sizes[i] as f64).log2() - lo;
            let x1 = (sizes[i + 1] as f64).log2() - lo;
            c.line(p.at(x0, w[0]), p.at(x1, w[1]), COLORS[k % COLORS.len()]);
        }
    }
    // The raw AF_XDP ceiling (MTU 1024 frames) as a dashed black line.
    let (xa, y) = p.at(0.0, ceiling);
    let (xb, _) = p.at(hi - lo, ceiling);
    let mut x = xa;
    while x < xb {
        c.line((x, y), ((x + 6).min(xb), y), [0, 0, 0]);
        x += 12;
    }
    c.save(path)
}

/// The bandwidth sweep and the baselines, written to `dir` as report.md,
/// bandwidth.png and sweep.csv.
pub fn report(dir: &std::path::Path, runs: usize) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let sizes = [64usize, 256, 1024, 4096, 16384, 65536, 262_144, 1 << 20];
    let mut series = Vec::new();
    for (mtu, label) in [(1500u32, "MTU 1024"), (9000, "MTU 4096")] {
        for two in [false, true] {
            let v = sweep(mtu, two, &sizes)?;
            eprintln!("{label}, {}: {:?}", if two { "2 cores" } else { "1 core" }, v.iter().map(|x| *x as i64).collect::<Vec<_>>());
            series.push((format!("{label}, {}", if two { "two datapath cores" } else { "one core, run-to-completion" }), v));
        }
    }
    let pair = VethPair::create("ceil", 1500).map_err(|e| e.to_string())?;
    let ceiling = raw_afxdp(&pair, 1078, 1.0)? * 1024.0 / 1e6;
    drop(pair);
    let mut md = String::from("# urnic benchmark report\n\nWRITE bandwidth (MB/s, 10^6 bytes) between two namespaces over veth, by message size.\n\n| size |");
    for (l, _) in &series {
        md.push_str(&format!(" {l} |"));
    }
    md.push_str("\n|---|");
    md.push_str(&"---|".repeat(series.len()));
    md.push('\n');
    let mut csv = String::from("size");
    for (l, _) in &series {
        csv.push_str(&format!(",{}", l.replace(',', ";")));
    }
    csv.push('\n');
    for (i, s) in sizes.iter().enumerate() {
        md.push_str(&format!("| {s} |"));
        csv.push_str(&s.to_string());
        for (_, v) in &series {
            md.push_str(&format!(" {:.0} |", v[i]));
            csv.push_str(&format!(",{:.1}", v[i]));
        }
        md.push('\n');
        csv.push('\n');
    }
    md.push_str(&format!("\nRaw AF_XDP ceiling at MTU 1024 (1078-byte frames, payload bytes): {ceiling:.0} MB/s (dashed line in bandwidth.png; x axis log2 of the size 64 B..1 MiB, one line per column above in order: blue, orange, green, red).\n\n"));
    std::fs::write(dir.join("sweep.csv"), csv).map_err(|e| e.to_string())?;
    plot_sweep(&sizes, &series, ceiling, &dir.join("bandwidth.png"))?;
    // The baselines table.
    let table = baselines(runs)?;
    md.push_str("## Against the baselines (same veth, same run, medians)\n\n");
    md.push_str(&table);
    std::fs::write(dir.join("report.md"), &md).map_err(|e| e.to_string())?;
    println!("{md}");
    println!("written: {}", dir.display());
    Ok(())
}

/// Run everything `runs` times and print medians and ratios.
pub fn run(runs: usize) -> Result<(), String> {
    println!("{}", baselines(runs)?);
    Ok(())
}

/// The baselines table (markdown).
fn baselines(runs: usize) -> Result<String, String> {
    let mut u_bw = Vec::new();
    let (mut u_p50, mut u_p99) = (Vec::new(), Vec::new());
    let mut raw = Vec::new();
    let mut tcp = Vec::new();
    let (mut u_cpu, mut t_cpu) = (Vec::new(), Vec::new());
    let (mut one_qp, mut many, mut per_qp) = (Vec::new(), Vec::new(), Vec::new());
    let (mut k_p50, mut k_p99) = (Vec::new(), Vec::new());
    for r in 0..runs {
        let _ = VethPair::sweep_stale();
        let pair = VethPair::create("bench", 1500).map_err(|e| format!("namespaces (root): {e}"))?;
        let (bw, p50, p99) = urnic(&pair, 65536, 3000)?;
        u_bw.push(bw);
        u_cpu.push(CPU_PER_GB.with(|c| c.get()));
        u_p50.push(p50);
        u_p99.push(p99);
        raw.push(raw_afxdp(&pair, 1078, 1.0)?);
        let (t, tc) = iperf3(&pair, 2)?;
        tcp.push(t);
        t_cpu.push(tc);
        let (one, _) = many_qps(&pair, 1, 2000)?;
        let (agg, mem) = many_qps(&pair, 1000, 4000)?;
        one_qp.push(one);
        many.push(agg);
        per_qp.push(mem);
        let (a, b) = udp_pingpong(&pair, 2000)?;
        k_p50.push(a);
        k_p99.push(b);
        eprintln!("run {}: urnic {:.0} MB/s, lat {:.1} us; raw AF_XDP {:.0} kpps; TCP {:.0} Mb/s; UDP lat {:.1} us", r + 1, bw, p50, raw[r] / 1e3, tcp[r], a);
    }
    let bw = median(&mut u_bw);
    let raw_pps = median(&mut raw);
    // The ceiling in payload bytes: every 1078-byte frame carries 1024 bytes of a 64 KiB WRITE.
    let raw_mbs = raw_pps * 1024.0 / 1e6;
    let tcp_mbs = median(&mut tcp) / 8.0;
    let (lp50, lp99) = (median(&mut u_p50), median(&mut u_p99));
    let mut out = String::new();
    let (kp50, kp99) = (median(&mut k_p50), median(&mut k_p99));
    out.push_str(&format!("| measure (median of {runs} runs, same veth, same run) | urnic | baseline | urnic / baseline |\n"));
    out.push_str("|---|---|---|---|\n");
    out.push_str(&format!("| 64 KiB WRITE bandwidth vs raw AF_XDP frame forwarding (1078-byte frames, 1024 B payload each) | {bw:.0} MB/s | {raw_mbs:.0} MB/s ({:.0} kpps) | {:.2} |\n", raw_pps / 1e3, bw / raw_mbs));
    out.push_str(&format!("| 64 KiB WRITE bandwidth vs kernel TCP single stream (iperf3) | {bw:.0} MB/s | {tcp_mbs:.0} MB/s | {:.2} |\n", bw / tcp_mbs));
    out.push_str(&format!("| 8 B SEND latency p50 vs kernel UDP ping-pong p50 (one-way) | {lp50:.1} us | {kp50:.1} us | {:.2} |\n", lp50 / kp50));
    out.push_str(&format!("| 8 B SEND latency p99 vs kernel UDP ping-pong p99 (one-way) | {lp99:.1} us | {kp99:.1} us | {:.2} |\n", lp99 / kp99));
    let (uc, tc) = (median(&mut u_cpu), median(&mut t_cpu));
    out.push_str(&format!("| CPU seconds per GB moved (urnic: whole process, both devices; TCP: both iperf3 processes) | {uc:.2} s/GB | {tc:.2} s/GB | {:.2} |\n", uc / tc));
    let (one, agg, mem) = (median(&mut one_qp), median(&mut many), median(&mut per_qp));
    out.push_str(&format!("| 1000 connected QPs sharing one device vs 1 QP, 64 KiB WRITE aggregate | {agg:.0} MB/s | {one:.0} MB/s | {:.2} |\n", agg / one));
    out.push_str(&format!("| memory per QP (RSS growth / QPs created, 16-deep send queue) | {:.1} KiB | | |\n", mem / 1024.0));
    Ok(out)
}
