//! The kernel baselines of `urnic bench`, on the same veth: TCP throughput
//! and 64-byte-write message rate (iperf3, CPU time of both processes), and
//! 8-byte UDP and TCP (TCP_NODELAY) ping-pong latency against our own echo.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use urnic_datapath::netns::{in_netns, VethPair};

use super::metrics::cpu_children;
use super::{timed_rounds, WARMUP_ROUNDS};

/// What failed when a thread could not enter a namespace.
const NETNS: &str = "entering the veth's namespace";

fn ip_of(pair: &VethPair, end: usize) -> String {
    let a = pair.ipv4[end];
    format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
}

/// iperf3 single-stream TCP from end 1 to end 0: (Mb/s, CPU s per GB of
/// both iperf3 processes). `extra` adds client options (e.g. -l 64 -N).
pub(super) fn iperf3(pair: &VethPair, secs: u32, extra: &[&str]) -> Result<(f64, f64)> {
    let c0 = cpu_children();
    let mut server = Command::new("ip")
        .args(["netns", "exec", &pair.ns[0], "iperf3", "-s", "-1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("iperf3 (apt install iperf3; deploy/deps.sh test)")?;
    std::thread::sleep(Duration::from_millis(300));
    let ip = ip_of(pair, 0);
    let t = secs.to_string();
    let mut args = vec!["netns", "exec", &pair.ns[1], "iperf3", "-c", &ip, "-t", &t, "-J"];
    args.extend_from_slice(extra);
    let out = Command::new("ip").args(&args).output().context("iperf3")?;
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    // "sum_received": { ... "bits_per_second": N
    let at = text.find("\"sum_received\"").with_context(|| format!("iperf3 output without sum_received: {text}"))?;
    let bps = text[at..]
        .split("\"bits_per_second\":")
        .nth(1)
        .and_then(|v| v.trim_start().split(|c: char| c == ',' || c.is_whitespace() || c == '}').next())
        .and_then(|v| v.parse::<f64>().ok())
        .context("iperf3: no bits_per_second")?;
    // CPU of both iperf3 processes (user + system, the kernel's TCP work in
    // their context; softirq work elsewhere is not counted) per GB moved.
    let gb = bps / 8.0 * f64::from(secs) / 1e9;
    Ok((bps / 1e6, (cpu_children() - c0) / gb))
}

/// Kernel UDP ping-pong of 8 bytes: one-way µs samples (RTT/2).
pub(super) fn udp_pingpong(pair: &VethPair, iters: usize) -> Result<Vec<f64>> {
    let srv = in_netns(Some(&pair.ns[0]), || UdpSocket::bind("0.0.0.0:9999")).context(NETNS)?.context("UDP ping-pong: bind :9999")?;
    let n = iters + WARMUP_ROUNDS;
    let echo = std::thread::spawn(move || {
        let mut b = [0u8; 64];
        for _ in 0..n {
            if let Ok((k, from)) = srv.recv_from(&mut b) {
                let _ = srv.send_to(&b[..k], from);
            }
        }
    });
    let cli = in_netns(Some(&pair.ns[1]), || UdpSocket::bind("0.0.0.0:0")).context(NETNS)?.context("UDP ping-pong: bind")?;
    cli.set_read_timeout(Some(Duration::from_secs(2))).context("UDP ping-pong: SO_RCVTIMEO")?;
    cli.connect((std::net::Ipv4Addr::from(pair.ipv4[0]), 9999)).context("UDP ping-pong: connect")?;
    let mut b = [0u8; 64];
    let samples = timed_rounds(iters, || {
        cli.send(&[7u8; 8]).context("UDP ping-pong: send")?;
        cli.recv(&mut b).map(drop).context("UDP ping-pong")
    })?;
    let _ = echo.join();
    Ok(samples)
}

/// Kernel TCP ping-pong of 8 bytes over one TCP_NODELAY connection:
/// one-way µs samples (RTT/2).
pub(super) fn tcp_pingpong(pair: &VethPair, iters: usize) -> Result<Vec<f64>> {
    let listener = in_netns(Some(&pair.ns[0]), || TcpListener::bind("0.0.0.0:9998")).context(NETNS)?.context("TCP ping-pong: bind :9998")?;
    let n = iters + WARMUP_ROUNDS;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 8];
        for _ in 0..n {
            s.read_exact(&mut b)?;
            s.write_all(&b)?;
        }
        Ok(())
    });
    let addr = std::net::SocketAddr::from((pair.ipv4[0], 9998));
    let mut cli = in_netns(Some(&pair.ns[1]), move || TcpStream::connect_timeout(&addr, Duration::from_secs(2)))
        .context(NETNS)?
        .context("TCP ping-pong connect")?;
    cli.set_nodelay(true).context("TCP ping-pong: TCP_NODELAY")?;
    cli.set_read_timeout(Some(Duration::from_secs(2))).context("TCP ping-pong: SO_RCVTIMEO")?;
    let mut b = [0u8; 8];
    let samples = timed_rounds(iters, || {
        cli.write_all(&[7u8; 8]).context("TCP ping-pong: write")?;
        cli.read_exact(&mut b).context("TCP ping-pong")
    })?;
    echo.join().map_err(|_| anyhow!("TCP echo thread panicked"))?.context("TCP echo")?;
    Ok(samples)
}
