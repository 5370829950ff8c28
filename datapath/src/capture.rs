//! Optional capture of every frame a NIC sends and receives, as a classic
//! pcap file (microsecond timestamps, Ethernet) that Wireshark and tshark open.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// Writes frames to a pcap file.
pub struct PcapWriter {
    out: BufWriter<File>,
    /// Frames written.
    pub frames: u64,
}

impl PcapWriter {
    /// Create (truncate) `path` and write the pcap header.
    pub fn create(path: &Path) -> io::Result<PcapWriter> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(&0xa1b2_c3d4u32.to_le_bytes())?;
        out.write_all(&2u16.to_le_bytes())?;
        out.write_all(&4u16.to_le_bytes())?;
        out.write_all(&0i32.to_le_bytes())?; // thiszone
        out.write_all(&0u32.to_le_bytes())?; // sigfigs
        out.write_all(&65535u32.to_le_bytes())?; // snaplen
        out.write_all(&1u32.to_le_bytes())?; // LINKTYPE_ETHERNET
        Ok(PcapWriter { out, frames: 0 })
    }

    /// Append one frame, stamped with the wall clock.
    pub fn write(&mut self, frame: &[u8]) -> io::Result<()> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let len = u32::try_from(frame.len()).unwrap_or(u32::MAX);
        self.out.write_all(&(now.as_secs() as u32).to_le_bytes())?;
        self.out.write_all(&now.subsec_micros().to_le_bytes())?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(frame)?;
        self.frames += 1;
        Ok(())
    }

    /// Flush buffered frames to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl Drop for PcapWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
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
        }
        let b = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(&b[..4], &0xa1b2_c3d4u32.to_le_bytes());
        assert_eq!(b.len(), 24 + 16 + 3 + 16 + 70);
        assert_eq!(u32::from_le_bytes(b[32..36].try_into().unwrap()), 3);
        assert_eq!(&b[40..43], &[1, 2, 3]);
    }
}
