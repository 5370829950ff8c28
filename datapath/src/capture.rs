//! Optional capture of every frame a NIC sends and receives, as a classic
//! pcap file (little-endian, microsecond timestamps, Ethernet) that
//! Wireshark and tshark open, written and read with the `pcap-file` crate.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufWriter};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader};
use pcap_file::{DataLink, Endianness, PcapError, TsResolution};

/// The snap length in the header: libpcap's largest (tcpdump's default),
/// above any Ethernet frame (a 65535-byte MTU plus its header), so every
/// frame is written whole.
const SNAPLEN: u32 = 262_144;

/// Writes frames to a pcap file, through a buffer that is flushed when the
/// writer drops (`Nic::set_capture(None)`).
pub struct PcapWriter {
    out: pcap_file::pcap::PcapWriter<BufWriter<File>>,
    /// Frames written.
    pub frames: u64,
}

/// A `pcap-file` error as an `io::Error` (its own I/O errors unwrapped).
fn io_error(e: PcapError) -> io::Error {
    match e {
        PcapError::IoError(e) => e,
        e => io::Error::new(io::ErrorKind::InvalidData, e),
    }
}

impl PcapWriter {
    /// Create (truncate) `path` and write the pcap header.
    pub fn create(path: &Path) -> io::Result<PcapWriter> {
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: SNAPLEN,
            datalink: DataLink::ETHERNET,
            ts_resolution: TsResolution::MicroSecond,
            endianness: Endianness::Little,
        };
        let out = pcap_file::pcap::PcapWriter::with_header(BufWriter::new(File::create(path)?), header).map_err(io_error)?;
        Ok(PcapWriter { out, frames: 0 })
    }

    /// Append one frame, stamped with the wall clock. A frame longer than
    /// the snap length is refused with `InvalidData`.
    pub fn write(&mut self, frame: &[u8]) -> io::Result<()> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        self.out.write_packet(&PcapPacket { timestamp: now, orig_len: len, data: Cow::Borrowed(frame) }).map_err(io_error)?;
        self.frames += 1;
        Ok(())
    }
}

/// The frames of a classic pcap file (either byte order, µs or ns
/// timestamps), in file order: what a capture of [`PcapWriter`] (or
/// tcpdump) holds. A truncated record or a file that is not a classic pcap
/// is an `InvalidData` or `UnexpectedEof` error.
pub fn read_frames(path: &Path) -> io::Result<Vec<Vec<u8>>> {
    let mut reader = PcapReader::new(File::open(path)?).map_err(io_error)?;
    let mut frames = Vec::new();
    while let Some(packet) = reader.next_packet() {
        frames.push(packet.map_err(io_error)?.data.into_owned());
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_records() {
        let path = std::env::temp_dir().join(format!("urnic-capture-{}.pcap", std::process::id()));
        {
            let mut w = PcapWriter::create(&path).unwrap();
            w.write(&[1, 2, 3]).unwrap();
            w.write(&[4; 70]).unwrap();
            assert!(w.write(&vec![0; SNAPLEN as usize + 1]).is_err(), "longer than the snap length");
            assert_eq!(w.frames, 2);
        }
        let b = std::fs::read(&path).unwrap();
        let frames = read_frames(&path).unwrap();
        assert_eq!(frames, vec![vec![1, 2, 3], vec![4; 70]]);
        std::fs::write(&path, &b[..b.len() - 1]).unwrap();
        assert!(read_frames(&path).is_err(), "a truncated record is an error");
        let _ = std::fs::remove_file(&path);
        assert_eq!(&b[..4], &0xa1b2_c3d4u32.to_le_bytes());
        assert_eq!(u32::from_le_bytes(b[16..20].try_into().unwrap()), SNAPLEN);
        assert_eq!(u32::from_le_bytes(b[20..24].try_into().unwrap()), 1, "LINKTYPE_ETHERNET");
        assert_eq!(b.len(), 24 + 16 + 3 + 16 + 70);
        assert_eq!(u32::from_le_bytes(b[32..36].try_into().unwrap()), 3);
        assert_eq!(&b[40..43], &[1, 2, 3]);
    }
}
