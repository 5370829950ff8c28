//! Classic libpcap files for rocev2's tests (either byte order, microsecond
//! or nanosecond timestamps, Ethernet link type), read and written with the
//! `pcap-file` crate. Also used by the responder's unit test against the
//! rxe captures (`src/transport/responder/rxe_captures.rs`).

use std::borrow::Cow;
use std::path::Path;
use std::time::Duration;

use pcap_file::pcap::{PcapPacket, PcapParser, PcapWriter};
use pcap_file::{DataLink, PcapError};

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

/// The frames of a pcap file, in file order.
pub fn frames(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    Ok(read(path)?.into_iter().map(|r| r.data).collect())
}

/// Parse a pcap image.
pub fn parse(b: &[u8]) -> Result<Vec<Record>, String> {
    let (mut rest, parser) = PcapParser::new(b).map_err(|e| match e {
        PcapError::IncompleteBuffer => "shorter than a pcap header".to_string(),
        e => format!("not a classic pcap: {e}"),
    })?;
    let linktype = parser.header().datalink;
    if linktype != DataLink::ETHERNET {
        return Err(format!("link type {linktype:?} is not Ethernet"));
    }
    let mut out = Vec::new();
    while !rest.is_empty() {
        let at = b.len() - rest.len();
        let (next, p) = parser.next_packet(rest).map_err(|e| format!("record at {at}: {e}"))?;
        let ts_nanos = u64::try_from(p.timestamp.as_nanos()).map_err(|_| format!("record at {at}: timestamp out of range"))?;
        out.push(Record { index: out.len(), ts_nanos, data: p.data.into_owned() });
        rest = next;
    }
    Ok(out)
}

/// Write records as a classic little-endian microsecond pcap, frame `i`
/// stamped `i` seconds.
pub fn write(path: &Path, frames: &[Vec<u8>]) -> std::io::Result<()> {
    let err = |e: PcapError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let header = pcap_file::pcap::PcapHeader { endianness: pcap_file::Endianness::Little, ..Default::default() };
    let mut w = PcapWriter::with_header(Vec::new(), header).map_err(err)?;
    for (i, f) in frames.iter().enumerate() {
        let len = u32::try_from(f.len()).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "frame longer than 4 GiB"))?;
        w.write_packet(&PcapPacket { timestamp: Duration::from_secs(i as u64), orig_len: len, data: Cow::Borrowed(f) }).map_err(err)?;
    }
    std::fs::write(path, w.into_writer())
}
