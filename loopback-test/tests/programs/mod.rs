//! Debian's unmodified programs on urnic's libraries (libibverbs.so.1,
//! librdmacm.so.1), shared by verbs_programs and rdmacm_programs: two
//! namespaces joined by veth, the server in one and the client in the
//! other, each process with its own urnic device (the datapath runs inside
//! the program). The programs find urnic through LD_LIBRARY_PATH, as
//! `urnic exec` sets it.
//!
//! The libraries are built by `ibverbs-abi/link.sh release` (deploy/test.sh
//! runs it first); `URNIC_LIB_DIR` points elsewhere.

#![allow(dead_code)]

mod common;
#[allow(unused_imports)] // Not every test binary of the harness reads perftest rows.
pub use common::{lib_dir, perftest_clock_unmeasured, perftest_rows};

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use urnic_datapath::netns::VethPair;

/// The Debian program, or a loud failure naming its package.
pub fn program(name: &str, package: &str) -> &'static str {
    let found = Command::new("sh").arg("-c").arg(format!("command -v {name}")).output().is_ok_and(|o| o.status.success());
    assert!(found, "{name} is missing: apt-get install {package} (deploy/deps.sh test installs it)");
    Box::leak(name.to_string().into_boxed_str())
}

/// A veth pair in two fresh namespaces (side 0 the client's, side 1 the
/// server's) and urnic's libraries.
pub struct Lab {
    pub pair: VethPair,
    pub lib: PathBuf,
}

impl Lab {
    /// A pair whose ends are up, with the libraries of the directory that
    /// holds `lib_file`.
    pub fn new(tag: &str, lib_file: &str) -> Lab {
        crate::veth::require_root();
        let pair = VethPair::create(tag, 1500).expect("veth pair");
        let lab = Lab { pair, lib: lib_dir(lib_file) };
        // The kernel reports a new veth's carrier a moment after it is set
        // up (linkwatch); until then no device is eligible.
        for side in 0..2 {
            let start = Instant::now();
            loop {
                let out =
                    Command::new("ip").args(["-n", &lab.pair.ns[side], "-o", "link", "show", &lab.pair.ifname[side]]).output().expect("ip link");
                if String::from_utf8_lossy(&out.stdout).contains("state UP") {
                    break;
                }
                assert!(start.elapsed() < Duration::from_secs(30), "veth never came up");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        lab
    }

    /// The IPv4 address of `side`.
    pub fn ip(&self, side: usize) -> String {
        let a = self.pair.ipv4[side];
        format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])
    }

    /// `args` in namespace `side` (0 client, 1 server) on urnic.
    pub fn command(&self, side: usize, args: &[&str]) -> Command {
        self.command_env(side, &[], args)
    }

    /// `args` in namespace `side` on urnic, with the `env` settings
    /// (`NAME=VALUE`) too.
    pub fn command_env(&self, side: usize, env: &[String], args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.pair.ns[side], "env"])
            .arg(format!("LD_LIBRARY_PATH={}", self.lib.display()))
            .arg(format!("URNIC_DEVICES={}", self.pair.ifname[side]))
            .args(env)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Wait until something listens on TCP `port` in the server's namespace.
    pub fn wait_listening(&self, port: u16, server: &mut Child) {
        let start = Instant::now();
        loop {
            let out = Command::new("ip").args(["netns", "exec", &self.pair.ns[1], "ss", "-Hltn", &format!("sport = :{port}")]).output().expect("ss");
            if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                return;
            }
            if let Ok(Some(st)) = server.try_wait() {
                panic!("server exited ({st}) before listening on {port}:\n{}", drain(server));
            }
            // A hang guard, not a timing assertion: a server that never
            // listens has failed.
            assert!(start.elapsed() < Duration::from_secs(120), "server never listened on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What an exited child wrote (stdout, then stderr).
pub fn drain(child: &mut Child) -> String {
    use std::io::Read;
    let mut s = String::new();
    if let Some(o) = child.stdout.as_mut() {
        let _ = o.read_to_string(&mut s);
    }
    if let Some(e) = child.stderr.as_mut() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// Wait for a server that finishes on its own (bounded: a hung server is
/// killed and fails the test).
pub fn finish(mut child: Child) -> Output {
    let start = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return child.wait_with_output().expect("server output");
        }
        if start.elapsed() > Duration::from_secs(180) {
            let _ = child.kill();
            let o = child.wait_with_output().expect("server output");
            panic!("server hung after the client finished:\n{}", text(&o));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether a client/server pair failed only because perftest could not
/// measure the CPU clock on either side ([`perftest_clock_unmeasured`]):
/// such a pair may run again.
pub fn perftest_pair_unmeasured(client: &Output, server: &Output) -> bool {
    let failed = !client.status.success() || !server.status.success();
    failed && (perftest_clock_unmeasured(&text(client)) || perftest_clock_unmeasured(&text(server)))
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}
