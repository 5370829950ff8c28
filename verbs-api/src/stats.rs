//! Counters of a device, its port and its QPs in one snapshot (what
//! `urnic stat` shows), and a publisher that keeps a text copy of them in a
//! file so another process can read them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use rocev2::transport::stats::QpStats;

use crate::counter_file::{sweep_counter_files, CounterFile};
use crate::device::{Context, DeviceInner};

/// One snapshot of every counter of a device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Device name.
    pub name: String,
    /// Poll loop: frames in and out of the port, completions, CQ overruns.
    pub datapath: Vec<(String, u64)>,
    /// The port's own counters (AF_XDP socket and XDP program: bytes,
    /// drops by reason, impairments).
    pub port: Vec<(String, u64)>,
    /// Transport-wide: frames refused before reaching a QP, by reason
    /// (`rx_drop_bad_icrc`, `rx_unknown_qpn`, ...), CNPs.
    pub transport: Vec<(String, u64)>,
    /// The verbs layer: memory regions dropped while memory windows were
    /// bound to them (`mr_dereg_deferred`), of those still waiting to be
    /// deregistered (`mr_dereg_pending`) and freed since (`mr_deferred_freed`).
    pub verbs: Vec<(String, u64)>,
    /// Per QP: packets and bytes, retransmits, NAKs by kind, RNR.
    pub qps: Vec<(u32, QpStats)>,
}

impl Context {
    /// Every counter of this device now.
    pub fn counters(&self) -> DeviceCounters {
        counters_of(&self.inner)
    }

    /// Keep `dir/<device>.<pid>.stat` up to date with [`Context::counters`]
    /// (every 250 ms while the device is open), for `urnic stat`. The file
    /// is removed when the device closes. Files of processes that no longer
    /// run (killed, or C programs that exited without closing their
    /// devices) are removed first ([`sweep_counter_files`]).
    pub fn publish_counters(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        sweep_counter_files(dir);
        let path = dir.join(format!("{}.{}.stat", self.inner.name, std::process::id()));
        let file = Arc::new(CounterFile::create(path.clone(), &counters_of(&self.inner).to_string())?);
        if let Ok(mut files) = self.inner.counter_files.lock() {
            files.push(file.clone());
        }
        let weak: Weak<DeviceInner> = Arc::downgrade(&self.inner);
        std::thread::Builder::new().name("urnic-stat".into()).spawn(move || loop {
            std::thread::sleep(Duration::from_millis(250));
            let Some(inner) = weak.upgrade() else { break };
            let text = counters_of(&inner).to_string();
            // The last reference may be this one: then the device closes
            // here, and removes the file.
            drop(inner);
            if !file.rewrite(&text) {
                break;
            }
        })?;
        Ok(path)
    }
}

fn counters_of(inner: &DeviceInner) -> DeviceCounters {
    let nic = &inner.nic;
    let transport: Vec<(String, u64)> = nic.engine_stats().iter().collect();
    let mut qps: Vec<(u32, QpStats)> = Vec::new();
    nic.for_each_engine(|e| qps.extend(e.qpns().filter_map(|n| e.qp_stats(n).map(|s| (n, *s)))));
    qps.sort_by_key(|(n, _)| *n);
    let (deferred, pending, freed) = inner.deferred.counts();
    let verbs =
        vec![("mr_dereg_deferred".to_string(), deferred), ("mr_dereg_pending".to_string(), pending), ("mr_deferred_freed".to_string(), freed)];
    DeviceCounters {
        name: inner.name.clone(),
        datapath: nic.stats.iter().map(|(k, v)| (k.to_string(), v)).collect(),
        port: nic.port_counters(),
        transport,
        verbs,
        qps,
    }
}

impl DeviceCounters {
    /// The value of counter `name` in any of the device-wide groups.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.datapath.iter().chain(&self.port).chain(&self.transport).chain(&self.verbs).find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

impl fmt::Display for DeviceCounters {
    /// `group.counter value` lines; zero QP counters are left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "device {}", self.name)?;
        for (group, list) in [("datapath", &self.datapath), ("port", &self.port), ("transport", &self.transport), ("verbs", &self.verbs)] {
            for (k, v) in list {
                writeln!(f, "{group}.{k} {v}")?;
            }
        }
        for (qpn, s) in &self.qps {
            for (k, v) in s.iter().filter(|(_, v)| *v != 0) {
                writeln!(f, "qp{qpn:#x}.{k} {v}")?;
            }
        }
        Ok(())
    }
}
