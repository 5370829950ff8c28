//! Putting AF_XDP multi-buffer frames back together from their RX pieces.
//!
//! With `XDP_USE_SG` a frame longer than one UMEM chunk arrives as a chain
//! of descriptors, each piece after the headroom of its own chunk (copy
//! mode: 256 bytes, `XDP_PACKET_HEADROOM`). When a piece fills its chunk to
//! the end and the next piece sits in the chunk right after it — the usual
//! case, since the fill ring is refilled in the order it was consumed — the
//! next piece is moved down over its chunk's headroom, right behind the
//! previous one, and the frame is handed up where it lies: for a 4154-byte
//! frame (IB MTU 4096) in two 4 KiB chunks that is a copy of its 314-byte
//! tail instead of a copy of the whole frame. Otherwise (chunks not
//! adjacent, or a frame continuing in the next receive batch, whose chunks
//! go back to the kernel first) the pieces are copied together.

use std::ops::Range;

/// The UMEM as the reassembly reaches it: bytes by UMEM address, but only
/// those in chunks the caller holds at the moment (received and not yet
/// given back to the kernel). The AF_XDP port's view checks every request
/// against the descriptors in hand, so no slice over a chunk the kernel
/// may be writing is ever made; a plain byte slice (tests) holds everything.
pub trait Held {
    /// The bytes at UMEM addresses `range`, or `None` if any of them lies
    /// outside the chunks held.
    fn bytes(&mut self, range: Range<usize>) -> Option<&mut [u8]>;
}

impl Held for [u8] {
    fn bytes(&mut self, range: Range<usize>) -> Option<&mut [u8]> {
        self.get_mut(range)
    }
}

impl Held for Vec<u8> {
    fn bytes(&mut self, range: Range<usize>) -> Option<&mut [u8]> {
        self.get_mut(range)
    }
}

/// The frame's pieces so far, back to back in UMEM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    /// UMEM address of the frame's first byte.
    start: usize,
    len: usize,
    /// UMEM address where the last piece's chunk ends.
    chunk_end: usize,
    /// Whether the last piece ran to the end of its chunk.
    ends_chunk: bool,
}

/// What a piece completed.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    /// More pieces to come.
    Pending,
    /// The frame is complete and lies at this range of the UMEM.
    InPlace(Range<usize>),
    /// The frame is complete in [`Reassembly::copied`].
    Copied,
    /// The frame outgrew the largest frame carried: this and the rest of
    /// its pieces are dropped (reported once, at the piece that overflowed).
    TooLong,
    /// A piece of a frame already dropped.
    Skipped,
    /// A piece outside the chunks held (a descriptor pointing past the
    /// UMEM, or into a chunk the caller does not hold): its frame is
    /// dropped whole, as for [`Piece::TooLong`].
    Unheld,
}

/// Reassembly state of one RX queue.
#[derive(Debug, Default)]
pub struct Reassembly {
    run: Option<Run>,
    /// Pieces copied together so far.
    gathered: Vec<u8>,
    /// The last frame completed as [`Piece::Copied`].
    copied: Vec<u8>,
    bad: bool,
}

impl Reassembly {
    /// Whether a frame is in progress (its next piece belongs to it).
    pub fn active(&self) -> bool {
        self.run.is_some() || !self.gathered.is_empty() || self.bad
    }

    /// The last frame completed as [`Piece::Copied`].
    pub fn copied(&self) -> &[u8] {
        &self.copied
    }

    /// One piece: `len` bytes at UMEM address `addr` (chunks of `chunk`
    /// bytes); `more` if pieces follow. Frames longer than `max` are
    /// dropped. Reads and writes only the chunks of the frame's pieces
    /// (through `umem`, which must hold them until the frame is handed up or
    /// [`Reassembly::detach`]ed), never elsewhere.
    pub fn push(&mut self, umem: &mut (impl Held + ?Sized), addr: usize, len: usize, more: bool, chunk: usize, max: usize) -> Piece {
        let so_far = self.run.map_or(self.gathered.len(), |r| r.len);
        let out = if self.bad {
            Piece::Skipped
        } else if so_far + len > max {
            self.drop_frame();
            Piece::TooLong
        } else if let Some(p) = self.push_adjacent(umem, addr, len, chunk) {
            p
        } else if addr.checked_add(len).and_then(|end| umem.bytes(addr..end)).is_none() {
            self.drop_frame();
            Piece::Unheld
        } else if let Some(run) = self.run.take() {
            // Not adjacent to the run: both copied together. Checked above:
            // `addr..addr + len` is held.
            self.gather(umem, run.start..run.start + run.len);
            self.gather(umem, addr..addr + len)
        } else if self.gathered.is_empty() {
            let chunk_end = chunk_base(addr, chunk) + chunk;
            self.run = Some(Run { start: addr, len, chunk_end, ends_chunk: addr + len == chunk_end });
            Piece::Pending
        } else {
            self.gather(umem, addr..addr + len)
        };
        if more {
            return out;
        }
        // The last piece: the frame is done, one way or the other.
        let done = match (out, self.run.take()) {
            (Piece::Pending, Some(run)) => Piece::InPlace(run.start..run.start + run.len),
            (Piece::Pending, None) => {
                std::mem::swap(&mut self.gathered, &mut self.copied);
                self.gathered.clear();
                Piece::Copied
            }
            (other, _) => other,
        };
        self.bad = false;
        done
    }

    /// The piece continues the run in the chunk right after its last one:
    /// moved down behind it, in place. One request to `umem` for the run's
    /// chunks and the piece's together, which covers the piece too (a span
    /// held means each part of it is). `None` if the piece is not adjacent,
    /// or that span is not held (the caller then checks the piece alone).
    fn push_adjacent(&mut self, umem: &mut (impl Held + ?Sized), addr: usize, len: usize, chunk: usize) -> Option<Piece> {
        let run = self.run.as_mut()?;
        if !run.ends_chunk || chunk_base(addr, chunk) != run.chunk_end {
            return None;
        }
        let end = addr.checked_add(len)?;
        let span = umem.bytes(run.start..end)?;
        span.copy_within(addr - run.start..end - run.start, run.len);
        run.len += len;
        run.chunk_end += chunk;
        run.ends_chunk = end == run.chunk_end;
        Some(Piece::Pending)
    }

    /// Append the bytes at `range` to the frame being copied together.
    fn gather(&mut self, umem: &mut (impl Held + ?Sized), range: Range<usize>) -> Piece {
        if self.bad {
            return Piece::Unheld;
        }
        match umem.bytes(range) {
            Some(b) => {
                self.gathered.extend_from_slice(b);
                Piece::Pending
            }
            None => {
                self.drop_frame();
                Piece::Unheld
            }
        }
    }

    /// Forget the frame in progress; skip its remaining pieces.
    fn drop_frame(&mut self) {
        self.bad = true;
        self.run = None;
        self.gathered.clear();
    }

    /// The receive batch ends in the middle of a frame and its chunks go
    /// back to the kernel: keep a copy of what lies in them (`umem` still
    /// holds them).
    pub fn detach(&mut self, umem: &mut (impl Held + ?Sized)) {
        if let Some(run) = self.run.take() {
            match umem.bytes(run.start..run.start + run.len) {
                Some(b) => self.gathered.extend_from_slice(b),
                None => self.drop_frame(),
            }
        }
    }
}

/// The address where the chunk (of `chunk` bytes) holding `addr` starts: a
/// mask for the power-of-two chunks the AF_XDP port uses, no division.
#[inline]
fn chunk_base(addr: usize, chunk: usize) -> usize {
    if chunk.is_power_of_two() {
        addr & !(chunk - 1)
    } else {
        addr - addr % chunk
    }
}

/// The transmit side of the same trick: a frame of `n` bytes was built
/// contiguously at `start` across the end of one chunk (whose data area
/// holds `first` bytes from `start`) into the next chunk; move the bytes
/// beyond `first` up by `gap` (that chunk's headroom), where the second
/// descriptor of the chain points. Returns the two pieces' lengths.
pub fn spread_tail(umem: &mut [u8], start: usize, n: usize, first: usize, gap: usize) -> (usize, usize) {
    if n <= first {
        return (n, 0);
    }
    let tail = start + first..start + n;
    umem.copy_within(tail, start + first + gap);
    (first, n - first)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: usize = 4096;
    const HEAD: usize = 256;
    const MAX: usize = 9018;

    /// A UMEM of 8 chunks with `frame`'s bytes laid out as the kernel does:
    /// piece k after the headroom of chunk `chunks[k]`. Returns the pieces.
    fn lay_out(umem: &mut [u8], frame: &[u8], chunks: &[usize]) -> Vec<(usize, usize, bool)> {
        let per = CHUNK - HEAD;
        let mut pieces = Vec::new();
        for (k, part) in frame.chunks(per).enumerate() {
            let addr = chunks[k] * CHUNK + HEAD;
            umem[addr..addr + part.len()].copy_from_slice(part);
            pieces.push((addr, part.len(), (k + 1) * per < frame.len()));
        }
        pieces
    }

    fn frame(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    /// Feed the pieces; the frame handed up.
    fn run(r: &mut Reassembly, umem: &mut (impl Held + ?Sized), pieces: &[(usize, usize, bool)]) -> (Vec<u8>, bool) {
        for &(addr, len, more) in pieces {
            match r.push(umem, addr, len, more, CHUNK, MAX) {
                Piece::Pending => assert!(more),
                Piece::InPlace(range) => return (umem.bytes(range).expect("the frame lies in held chunks").to_vec(), true),
                Piece::Copied => {
                    return (r.copied().to_vec(), false);
                }
                other => panic!("{other:?}"),
            }
        }
        panic!("no frame")
    }

    #[test]
    fn chunk_base_masks_or_divides() {
        for chunk in [2048usize, 4096, 3000, 1] {
            for addr in [0usize, 1, 2047, 2048, 2999, 3000, 4095, 4096, 4097, 12_345, usize::MAX] {
                assert_eq!(chunk_base(addr, chunk), addr - addr % chunk, "{addr} in chunks of {chunk}");
            }
        }
    }

    #[test]
    fn adjacent_chunks_are_joined_in_place() {
        let mut umem = vec![0u8; 8 * CHUNK];
        let mut r = Reassembly::default();
        for (len, chunks) in [(4154, &[2usize, 3][..]), (3841, &[4, 5]), (9018, &[5, 6, 7])] {
            let f = frame(len, len as u8);
            let pieces = lay_out(&mut umem, &f, chunks);
            let (got, in_place) = run(&mut r, &mut umem, &pieces);
            assert_eq!(got, f, "{len} bytes in chunks {chunks:?}");
            assert!(in_place);
            assert!(!r.active());
        }
    }

    #[test]
    fn a_frame_spread_for_transmit_reassembles_to_itself() {
        let mut umem = vec![0u8; 8 * CHUNK];
        let mut r = Reassembly::default();
        for n in [60, 3840, 3841, 4154, 7680] {
            let f = frame(n, 5);
            let start = 2 * CHUNK + HEAD;
            umem[start..start + n].copy_from_slice(&f);
            let (a, b) = spread_tail(&mut umem, start, n, CHUNK - HEAD, HEAD);
            assert_eq!(a + b, n);
            // The two pieces are where the descriptors say, as the receive
            // side of the peer would get them.
            let mut pieces = vec![(start, a, b > 0)];
            if b > 0 {
                assert_eq!(&umem[3 * CHUNK + HEAD..3 * CHUNK + HEAD + b], &f[a..]);
                pieces.push((3 * CHUNK + HEAD, b, false));
            }
            assert_eq!(&umem[start..start + a], &f[..a]);
            assert_eq!(run(&mut r, &mut umem, &pieces), (f, true), "{n} bytes");
        }
    }

    #[test]
    fn other_chunks_are_copied_together() {
        let mut umem = vec![0u8; 8 * CHUNK];
        let mut r = Reassembly::default();
        // Not adjacent, backwards, and adjacent only for the last two pieces.
        for chunks in [&[1usize, 5][..], &[6, 2], &[0, 3, 4]] {
            let f = frame((chunks.len() - 1) * 3840 + 100, 7);
            let pieces = lay_out(&mut umem, &f, chunks);
            let (got, in_place) = run(&mut r, &mut umem, &pieces);
            assert_eq!(got, f, "chunks {chunks:?}");
            assert!(!in_place);
        }
        // A single-piece frame after a copied one.
        let f = frame(100, 1);
        let pieces = lay_out(&mut umem, &f, &[3]);
        assert_eq!(run(&mut r, &mut umem, &pieces), (f, true));
    }

    #[test]
    fn a_frame_split_across_batches_is_copied_before_its_chunks_go_back() {
        let mut umem = vec![0u8; 8 * CHUNK];
        let mut r = Reassembly::default();
        let f = frame(4154, 9);
        let pieces = lay_out(&mut umem, &f, &[1, 2]);
        assert_eq!(r.push(&mut umem, pieces[0].0, pieces[0].1, true, CHUNK, MAX), Piece::Pending);
        r.detach(&mut umem);
        // The kernel reuses chunk 1 before the second piece is handled.
        umem[CHUNK..2 * CHUNK].fill(0xee);
        assert_eq!(r.push(&mut umem, pieces[1].0, pieces[1].1, false, CHUNK, MAX), Piece::Copied);
        assert_eq!(r.copied(), &f[..]);
    }

    #[test]
    fn an_overlong_frame_is_dropped_whole_and_the_next_one_arrives() {
        let mut umem = vec![0u8; 8 * CHUNK];
        let mut r = Reassembly::default();
        let f = frame(3 * 3840 + 10, 3);
        let pieces = lay_out(&mut umem, &f, &[0, 1, 2, 3]);
        let got: Vec<Piece> = pieces.iter().map(|&(a, l, m)| r.push(&mut umem, a, l, m, CHUNK, MAX)).collect();
        assert_eq!(got, vec![Piece::Pending, Piece::Pending, Piece::TooLong, Piece::Skipped]);
        assert!(!r.active());
        let f = frame(5000, 4);
        let pieces = lay_out(&mut umem, &f, &[5, 6]);
        assert_eq!(run(&mut r, &mut umem, &pieces), (f, true));
        // A descriptor pointing past the UMEM is refused, not a panic.
        assert_eq!(r.push(&mut umem, 8 * CHUNK - 10, 100, true, CHUNK, MAX), Piece::Unheld);
        assert_eq!(r.push(&mut umem, usize::MAX - 10, 100, true, CHUNK, MAX), Piece::Skipped);
        assert_eq!(r.push(&mut umem, 0, 10, false, CHUNK, MAX), Piece::Skipped);
    }

    /// A UMEM view holding only some chunks, as the AF_XDP port's does:
    /// every request outside them is refused (and remembered).
    struct Only {
        umem: Vec<u8>,
        held: Vec<usize>,
        refused: usize,
    }

    impl Held for Only {
        fn bytes(&mut self, range: Range<usize>) -> Option<&mut [u8]> {
            let ok = range.start <= range.end && (range.start / CHUNK..range.end.div_ceil(CHUNK)).all(|c| self.held.contains(&c));
            if !ok {
                self.refused += 1;
                return None;
            }
            self.umem.get_mut(range)
        }
    }

    #[test]
    fn only_the_chunks_of_the_frame_in_hand_are_touched() {
        let mut r = Reassembly::default();
        // In place, copied together (not adjacent, backwards, partly
        // adjacent): holding just the frame's chunks is enough.
        for chunks in [&[2usize, 3][..], &[5, 6, 7], &[1, 5], &[6, 2], &[0, 3, 4]] {
            let mut v = Only { umem: vec![0u8; 8 * CHUNK], held: chunks.to_vec(), refused: 0 };
            let f = frame((chunks.len() - 1) * 3840 + 100, 2);
            let pieces = lay_out(&mut v.umem, &f, chunks);
            let (got, _) = run(&mut r, &mut v, &pieces);
            assert_eq!((got, v.refused), (f, 0), "chunks {chunks:?}");
        }
        // A frame split across batches: detached while its chunk is held.
        let mut v = Only { umem: vec![0u8; 8 * CHUNK], held: vec![1], refused: 0 };
        let f = frame(4154, 9);
        let pieces = lay_out(&mut v.umem, &f, &[1, 2]);
        assert_eq!(r.push(&mut v, pieces[0].0, pieces[0].1, true, CHUNK, MAX), Piece::Pending);
        r.detach(&mut v);
        v.held = vec![2];
        assert_eq!(r.push(&mut v, pieces[1].0, pieces[1].1, false, CHUNK, MAX), Piece::Copied);
        assert_eq!((r.copied(), v.refused), (&f[..], 0));
        // A piece in a chunk not held: the frame is dropped whole, the next arrives.
        let mut v = Only { umem: vec![0u8; 8 * CHUNK], held: vec![3], refused: 0 };
        let f = frame(4154, 1);
        let pieces = lay_out(&mut v.umem, &f, &[3, 4]);
        assert_eq!(r.push(&mut v, pieces[0].0, pieces[0].1, true, CHUNK, MAX), Piece::Pending);
        assert_eq!(r.push(&mut v, pieces[1].0, pieces[1].1, false, CHUNK, MAX), Piece::Unheld);
        assert!(!r.active());
        v.held = vec![5, 6];
        let pieces = lay_out(&mut v.umem, &f, &[5, 6]);
        assert_eq!(run(&mut r, &mut v, &pieces), (f, true));
    }
}
