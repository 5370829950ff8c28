//! A minimal reader of classic libpcap files (either byte order,
//! microsecond or nanosecond timestamps, Ethernet link type).

use std::path::Path;

/// One captured frame.
#[derive(Clone, Debug)]
pub struct Record {
    /// Index in the file.
    pub index: usize,
    /// Timestamp in nanoseconds.
    pub ts_nanos: u64,
    /// Captured bytes.
    pub data: Vec<u8>,
}

/// Read every record of a pcap file.
pub fn read(path: &Path) -> Result<Vec<Record>, String> {
    let b = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&b).map_err(|e| format!("{}: {e}", path.display()))
}

/// Parse a pcap image.
pub fn parse(b: &[u8]) -> Result<Vec<Record>, String> {
    if b.len() < 24 {
        return Err("shorter than a pcap header".into());
    }
    let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let (le, nanos) = match magic {
        0xa1b2c3d4 => (true, false),
        0xa1b23c4d => (true, true),
        0xd4c3b2a1 => (false, false),
        0x4d3cb2a1 => (false, true),
        m => return Err(format!("not a classic pcap (magic {m:#x})")),
    };
    let u32_at = |o: usize| -> u32 {
        let a = [b[o], b[o + 1], b[o + 2], b[o + 3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let linktype = u32_at(20);
    if linktype != 1 {
        return Err(format!("link type {linktype} is not Ethernet"));
    }
    let mut off = 24;
    let mut out = Vec::new();
    while off < b.len() {
        if off + 16 > b.len() {
            return Err(format!("truncated record header at {off}"));
        }
        let sec = u64::from(u32_at(off));
        let frac = u64::from(u32_at(off + 4));
        let incl = u32_at(off + 8) as usize;
        off += 16;
        let data = b.get(off..off + incl).ok_or_else(|| format!("truncated record at {off}"))?.to_vec();
        off += incl;
        let ts_nanos = sec * 1_000_000_000 + if nanos { frac } else { frac * 1000 };
        out.push(Record { index: out.len(), ts_nanos, data });
    }
    Ok(out)
}

/// Write records as a classic little-endian microsecond pcap.
pub fn write(path: &Path, frames: &[Vec<u8>]) -> std::io::Result<()> {
    let mut v = Vec::new();
    v.extend_from_slice(&0xa1b2c3d4u32.to_le_bytes());
    v.extend_from_slice(&2u16.to_le_bytes());
    v.extend_from_slice(&4u16.to_le_bytes());
    v.extend_from_slice(&0i32.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&65535u32.to_le_bytes());
    v.extend_from_slice(&1u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        v.extend_from_slice(&(i as u32).to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&(f.len() as u32).to_le_bytes());
        v.extend_from_slice(&(f.len() as u32).to_le_bytes());
        v.extend_from_slice(f);
    }
    std::fs::write(path, v)
}
