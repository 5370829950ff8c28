//! The TCP side channel's client end, shared by `urnic perf` and the
//! pingpongs: the server's name is resolved before anything else (a name
//! that does not resolve cannot start to), and a refused connection is
//! retried for a while, saying so (the server may still be starting),
//! while any other failure ends the attempt at once.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

/// How long a refused connection is retried.
pub const RETRY_REFUSED: Duration = Duration::from_secs(30);

/// The server a client connects to, resolved.
#[derive(Clone, Debug)]
pub struct Peer {
    /// As given.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// What `host` resolved to.
    pub addrs: Vec<SocketAddr>,
}

impl Peer {
    /// Resolve `host` now.
    pub fn resolve(host: &str, port: u16) -> Result<Peer> {
        let addrs: Vec<SocketAddr> =
            (host, port).to_socket_addrs().with_context(|| format!("Couldn't resolve {host}: not an address, and name resolution failed"))?.collect();
        if addrs.is_empty() {
            bail!("Couldn't resolve {host}: no address");
        }
        tracing::debug!(host, port, ?addrs, "server resolved");
        Ok(Peer { host: host.to_string(), port, addrs })
    }

    /// Connect to the first address that accepts. Refused connections are
    /// retried for [`RETRY_REFUSED`] with a note on stderr; any other error
    /// (no route, unreachable, ...) fails at once.
    pub fn connect(&self) -> Result<TcpStream> {
        let start = Instant::now();
        let mut said = false;
        loop {
            let mut refused = None;
            for a in &self.addrs {
                match TcpStream::connect(a) {
                    Ok(s) => return Ok(s),
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => refused = Some(e),
                    Err(e) => return Err(e).with_context(|| format!("Couldn't connect to {}:{} ({a})", self.host, self.port)),
                }
            }
            let e = refused.unwrap_or_else(|| std::io::ErrorKind::ConnectionRefused.into());
            if start.elapsed() >= RETRY_REFUSED {
                return Err(e).with_context(|| {
                    format!("Couldn't connect to {}:{}: no server listening after {} s", self.host, self.port, RETRY_REFUSED.as_secs())
                });
            }
            if !said {
                eprintln!("waiting for server {}:{} (connection refused; retrying for {} s) …", self.host, self.port, RETRY_REFUSED.as_secs());
                said = true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
