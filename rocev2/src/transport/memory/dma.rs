//! Data movement, the "DMA": copies between registered memory and frames,
//! and atomics, each after the checker has approved the whole range, under
//! the table's read guard so deregistration waits for them.
//!
//! Registered memory is the application's, and nothing serialises accesses
//! to the same bytes from elsewhere: the application's own threads, or two
//! shards' engines (one table per device) answering a peer's WRITE and
//! ATOMIC to one address on two QPs, which a hostile peer may send on
//! purpose. The verbs leave such overlaps undefined (a WRITE racing an
//! ATOMIC, or the application's accesses, give unspecified bytes), and the
//! movers are built so that this is all they give: registered memory is
//! reached only through raw pointers (copies and SIMD loads and stores,
//! never a Rust reference over it) and atomics through `AtomicU64`, so a
//! race can tear the values in the overlapping bytes and nothing else; the
//! range written or read is always the one the checker approved. Under
//! Rust's memory model a non-atomic copy racing an atomic is still a data
//! race: a risk taken knowingly, as every RDMA device's DMA takes it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::keys::Table;
use super::{AccessError, AtomicOp, MemoryTable, SgeError};
use crate::transport::ids::{Access, PdId, Sge};
use crate::wire::crc;

impl MemoryTable {
    // ---- responder side (remote keys) ----

    /// Check that `[va, va + len)` may be accessed with `needed` through
    /// `rkey` by QP `qpn` of `pd`. Moves nothing.
    pub fn remote_check(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, len: u64, needed: Access) -> Result<(), AccessError> {
        self.read().resolve_remote(pd, qpn, rkey, va, len, needed).map(|_| ())
    }

    /// Write `data` at `va` through `rkey` (needs REMOTE_WRITE). All checks
    /// precede the copy.
    pub fn remote_write(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, data: &[u8]) -> Result<(), AccessError> {
        let t = self.read();
        let dst = t.resolve_remote(pd, qpn, rkey, va, data.len() as u64, Access::REMOTE_WRITE)?;
        // SAFETY: `resolve_remote` checked that `[dst, dst + data.len())` lies in a
        // registered region, which stays valid while we hold the read guard
        // (deregistration takes the write guard). `data` is a Rust slice and
        // cannot overlap registered memory the table only reaches by raw pointer
        // (if a caller passed a slice of the region itself, `copy` below would
        // still be correct: we use the overlap-tolerant copy).
        unsafe { std::ptr::copy(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// [`remote_check`](Self::remote_check) for an RDMA WRITE of several
    /// packets (needs REMOTE_WRITE): the whole range `[va, va + len)` checked
    /// at its FIRST packet, and a memo of the resolution for
    /// [`remote_write_memo`](Self::remote_write_memo) to place the
    /// message's packets without resolving the R_Key again while the table
    /// has not changed (its generation, read under the same read guard).
    pub fn remote_check_write(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, len: u64) -> Result<WriteMemo, AccessError> {
        let t = self.read();
        let host = t.resolve_remote(pd, qpn, rkey, va, len, Access::REMOTE_WRITE)?;
        // Under the guard no writer is inside: this is the generation of the
        // table the resolution was made in.
        let generation = self.generation.load(Ordering::Acquire);
        Ok(WriteMemo { generation, pd, qpn, rkey, va, len, host: host as usize })
    }

    /// [`remote_write`](Self::remote_write) of one packet of the message
    /// `memo` was taken for: when the table's generation is still the memo's
    /// (no registration, deregistration, re-registration, bind or
    /// invalidation since: every writer bumps it before it changes the
    /// table) and `[va, va + data.len())` lies in the memo's range with the
    /// same PD, QP and R_Key, the resolution the checker made for the whole
    /// range still holds for this part of it (an address space is linear:
    /// the host address of `va` is the range's plus `va - memo.va`), so the
    /// bytes go there; anything else goes through the checker as
    /// `remote_write` does, with its errors. Always inlined: the responder's
    /// `exec_write`, its one caller, is inlined into `handle_request`, whose
    /// size would otherwise leave this out of line again.
    #[inline(always)]
    pub fn remote_write_memo(&self, memo: &WriteMemo, pd: PdId, qpn: u32, rkey: u32, va: u64, data: &[u8]) -> Result<(), AccessError> {
        let t = self.read();
        let generation = self.generation.load(Ordering::Acquire);
        let dst = match memo.place_of(generation, pd, qpn, rkey, va, data.len() as u64) {
            Some(dst) => dst,
            None => t.resolve_remote(pd, qpn, rkey, va, data.len() as u64, Access::REMOTE_WRITE)?,
        };
        // SAFETY: `[dst, dst + data.len())` lies in a registered region: either
        // resolved just now, or a part (`off + data.len() <= memo.len`) of
        // the range resolved at `memo.generation`, which is still the table's
        // under this read guard (no change since), and the guard keeps the
        // region valid until the copy returns (deregistration takes the write
        // guard). `data` is a Rust slice; `copy` tolerates overlap.
        unsafe { std::ptr::copy(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Where [`remote_write_memo`](Self::remote_write_memo) would place
    /// `len` bytes at `va` through the memo alone (fresh, and the range a
    /// part of the memo's), hand that destination to `place` under the
    /// table's read guard and return what it returns; `None`, placing
    /// nothing, where it would need the checker (a changed table), or where
    /// the destination overlaps `apart_from` (every byte `place` reads: it
    /// must not read what it writes). The receive side's fused placement
    /// and ICRC check (`IcrcCheck::place`, reading the whole frame) of an
    /// RDMA WRITE's continuation; the caller takes the ordinary path on
    /// `None`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn remote_place_memo<R>(
        &self,
        memo: &WriteMemo,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        va: u64,
        len: usize,
        apart_from: &[u8],
        place: impl FnOnce(*mut u8) -> R,
    ) -> Option<R> {
        let _t = self.read();
        let generation = self.generation.load(Ordering::Acquire);
        let dst = memo.place_of(generation, pd, qpn, rkey, va, len as u64)?;
        let (d, s) = (dst as usize, apart_from.as_ptr() as usize);
        if d < s.wrapping_add(apart_from.len()) && s < d.wrapping_add(len) {
            return None;
        }
        // `[dst, dst + len)` lies in the range resolved at `memo.generation`,
        // still the table's under this read guard, which keeps the region
        // valid until `place` returns (as in `remote_write_memo`).
        Some(place(dst))
    }

    /// Read `out.len()` bytes at `va` through `rkey` (needs REMOTE_READ).
    pub fn remote_read(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, out: &mut [u8]) -> Result<(), AccessError> {
        let t = self.read();
        let src = t.resolve_remote(pd, qpn, rkey, va, out.len() as u64, Access::REMOTE_READ)?;
        // SAFETY: `[src, src + out.len())` is inside a registered region kept
        // valid by the read guard; `copy` tolerates overlap.
        unsafe { std::ptr::copy(src, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// [`remote_read`](Self::remote_read) that also continues `crc` (a
    /// finished CRC-32) over the bytes read, in the same pass; returns it.
    pub fn remote_read_crc(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, out: &mut [u8], crc: u32) -> Result<u32, AccessError> {
        // SAFETY: `remote_read_with` hands over a source of `out.len()`
        // readable bytes that is not `out`.
        self.remote_read_with(pd, qpn, rkey, va, out, |src, out| unsafe { crc::copy_update_raw(crc, src, out) })
    }

    /// [`remote_read_crc`](Self::remote_read_crc) continuing a CRC not yet
    /// reduced (a READ response's headers, [`crc::CrcLane`]), which the
    /// fused copy adds to its own ([`crc::copy_update_lane_raw`]), as
    /// [`local_gather_crc_lane`](Self::local_gather_crc_lane) does for a
    /// requester's frame.
    pub fn remote_read_crc_lane(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, out: &mut [u8], lane: crc::CrcLane) -> Result<u32, AccessError> {
        // SAFETY: as in `remote_read_crc`.
        self.remote_read_with(pd, qpn, rkey, va, out, |src, out| unsafe { crc::copy_update_lane_raw(lane, src, out) })
    }

    /// The checks of [`remote_read`](Self::remote_read), then `copy` from the
    /// region's bytes (as many as `out` has) into `out`, under the read guard.
    fn remote_read_with(
        &self,
        pd: PdId,
        qpn: u32,
        rkey: u32,
        va: u64,
        out: &mut [u8],
        copy: impl FnOnce(*const u8, &mut [u8]) -> u32,
    ) -> Result<u32, AccessError> {
        let t = self.read();
        // `[src, src + out.len())` is inside a registered region kept valid
        // by the read guard, reached only by raw pointer, so it is not the
        // exclusive `out`.
        let src = t.resolve_remote(pd, qpn, rkey, va, out.len() as u64, Access::REMOTE_READ)?;
        Ok(copy(src, out))
    }

    /// Execute `op` on the 8 bytes at `va` through `rkey` (needs
    /// REMOTE_ATOMIC, 8-byte alignment); returns the original value. Atomic
    /// against every other user of this table.
    pub fn remote_atomic(&self, pd: PdId, qpn: u32, rkey: u32, va: u64, op: AtomicOp) -> Result<u64, AccessError> {
        let t = self.read();
        let p = t.resolve_remote(pd, qpn, rkey, va, 8, Access::REMOTE_ATOMIC)?;
        // IBTA 9.4.5: atomic targets are naturally aligned; rxe also checks the
        // host address (`(uintptr_t)vaddr & 7` in atomic_reply).
        if va & 7 != 0 || (p as usize) & 7 != 0 {
            return Err(AccessError::Misaligned);
        }
        // SAFETY: `p` is 8-byte aligned and `[p, p + 8)` lies in a registered
        // region that stays valid for reads and writes while we hold the read
        // guard; `AtomicU64` has the size and alignment of `u64`. Other
        // accesses to the same bytes are atomics (here) or raw copies that
        // the verbs leave undefined to overlap with an atomic; a peer that
        // overlaps them anyway gets torn values (the module's account).
        let cell = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
        Ok(match op {
            AtomicOp::CmpSwap { compare, swap } => match cell.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(v) | Err(v) => v,
            },
            AtomicOp::FetchAdd { add } => cell.fetch_add(add, Ordering::SeqCst),
        })
    }

    // ---- local side (lkeys in SGE lists) ----

    /// Check every SGE of `sgl` (lkey, PD, state, `needed` rights, bounds in
    /// the region's address space: IOVA, or offsets for ZERO_BASED).
    /// Zero-length SGEs are skipped.
    pub fn local_check(&self, pd: PdId, sgl: &[Sge], needed: Access) -> Result<(), AccessError> {
        self.local_check_sgl(pd, sgl, needed).map_err(|e| e.error)
    }

    /// [`local_check`](Self::local_check) that says which SGE failed: the
    /// verbs layer's post-time validation, so that a WR is refused at post
    /// time exactly when the data movers ([`local_gather`](Self::local_gather),
    /// [`local_scatter`](Self::local_scatter)) would refuse it now. Zero-length
    /// SGEs are skipped, as the movers skip them.
    pub fn local_check_sgl(&self, pd: PdId, sgl: &[Sge], needed: Access) -> Result<(), SgeError> {
        let t = self.read();
        for (index, s) in sgl.iter().enumerate().filter(|(_, s)| s.length != 0) {
            t.resolve_local(pd, s.lkey, s.addr, u64::from(s.length), needed).map_err(|error| SgeError { index, sge: *s, error })?;
        }
        Ok(())
    }

    /// Copy `out.len()` bytes starting at byte `offset` of the SGE list's
    /// concatenation into `out`. Fails (moving nothing) if the range exceeds
    /// the list or any covered SGE is invalid.
    pub fn local_gather(&self, pd: PdId, sgl: &[Sge], offset: u64, out: &mut [u8]) -> Result<(), AccessError> {
        let t = self.read();
        let out_ptr = out.as_mut_ptr();
        t.for_sgl_pieces(pd, sgl, offset, out.len(), Access::empty(), |src, at, n| {
            // SAFETY: `src..src+n` was validated inside a registered region kept
            // alive by the read guard; `at + n <= out.len()` by construction
            // of the pieces; `copy` tolerates overlap.
            unsafe { std::ptr::copy(src, out_ptr.add(at), n) };
        })
    }

    /// [`local_gather`](Self::local_gather) that also continues `crc` (a
    /// finished CRC-32) over the bytes gathered, in the same pass
    /// ([`crc::copy_update_raw`]); returns the continued CRC.
    pub fn local_gather_crc(&self, pd: PdId, sgl: &[Sge], offset: u64, out: &mut [u8], crc: u32) -> Result<u32, AccessError> {
        let t = self.read();
        let mut crc = crc;
        t.for_sgl_pieces(pd, sgl, offset, out.len(), Access::empty(), |src, at, n| {
            // SAFETY: `src..src+n` was validated inside a registered region kept
            // alive by the read guard; `at + n <= out.len()` by construction of
            // the pieces. Registered memory is reached only by raw pointer and
            // cannot be the exclusive `out`.
            crc = unsafe { crc::copy_update_raw(crc, src, &mut out[at..at + n]) };
        })?;
        Ok(crc)
    }

    /// [`local_gather_crc`](Self::local_gather_crc) continuing a CRC not yet
    /// reduced (a frame's headers, [`crc::CrcLane`]): the first piece's fused
    /// copy folds the lane in ([`crc::copy_update_lane_raw`]), later pieces
    /// continue the finished CRC.
    pub fn local_gather_crc_lane(&self, pd: PdId, sgl: &[Sge], offset: u64, out: &mut [u8], lane: crc::CrcLane) -> Result<u32, AccessError> {
        gather_crc_lane(&self.read(), pd, sgl, offset, out, lane)
    }

    /// [`local_gather_crc_lane`](Self::local_gather_crc_lane) for the
    /// frames of one message: a one-SGE list's key is resolved once and the
    /// region's host address kept in `memo`, which later frames use while
    /// the table has not changed since (its generation, bumped by every
    /// writer before it changes anything, read under the same read guard
    /// as the copy: an equal generation means no registration change since
    /// the verdict, so the region and its memory are still exactly those
    /// resolved, and the guard keeps them until the copy is done, as in
    /// every other mover). Anything else (several SGEs, another SGE or PD,
    /// a changed table, a key the checker refuses) goes through the checker
    /// as `local_gather_crc_lane` does, with its errors.
    #[inline]
    pub fn local_gather_crc_lane_memo(
        &self,
        memo: &mut GatherMemo,
        pd: PdId,
        sgl: &[Sge],
        offset: u64,
        out: &mut [u8],
        lane: crc::CrcLane,
    ) -> Result<u32, AccessError> {
        let t = self.read();
        let [sge] = sgl else { return gather_crc_lane(&t, pd, sgl, offset, out, lane) };
        // Under the guard no writer is inside: this is the generation of the
        // table the guard protects.
        let generation = self.generation.load(Ordering::Acquire);
        let fresh = memo.generation == generation && memo.pd == pd && memo.sge == *sge;
        if !fresh {
            // The whole SGE, as the post-time check saw it; a refusal (or an
            // SGE only partly valid) takes the checker's path for this range.
            let Ok(host) = t.resolve_local(pd, sge.lkey, sge.addr, u64::from(sge.length), Access::empty()) else {
                *memo = GatherMemo::default();
                return gather_crc_lane(&t, pd, sgl, offset, out, lane);
            };
            *memo = GatherMemo { generation, pd, sge: *sge, host: host as usize };
        }
        let end = offset.checked_add(out.len() as u64).ok_or(AccessError::OutOfBounds)?;
        if end > u64::from(sge.length) {
            return Err(AccessError::OutOfBounds);
        }
        if out.is_empty() {
            return Ok(lane.finish());
        }
        let src = (memo.host as *const u8).wrapping_add(offset as usize);
        // SAFETY: `[memo.host, memo.host + sge.length)` was resolved inside a
        // registered region at `generation`, which is still the table's under
        // this read guard (no deregistration or re-registration since), and
        // the guard keeps the region valid until the copy returns;
        // `offset + out.len() <= sge.length`. Registered memory is reached
        // only by raw pointer and cannot be the exclusive `out`.
        Ok(unsafe { crc::copy_update_lane_raw(lane, src, out) })
    }

    /// Copy `data` to byte `offset` of the SGE list's concatenation (needs
    /// LOCAL_WRITE). Fails (moving nothing) if the range exceeds the list or
    /// any covered SGE is invalid.
    pub fn local_scatter(&self, pd: PdId, sgl: &[Sge], offset: u64, data: &[u8]) -> Result<(), AccessError> {
        let t = self.read();
        let src = data.as_ptr();
        t.for_sgl_pieces(pd, sgl, offset, data.len(), Access::LOCAL_WRITE, |dst, at, n| {
            // SAFETY: `dst..dst+n` was validated inside a registered region kept
            // alive by the read guard; `at + n <= data.len()`; `copy` tolerates overlap.
            unsafe { std::ptr::copy(src.add(at), dst, n) };
        })
    }
}

/// [`MemoryTable::local_gather_crc_lane`]'s work in a table its caller holds.
fn gather_crc_lane(t: &Table, pd: PdId, sgl: &[Sge], offset: u64, out: &mut [u8], lane: crc::CrcLane) -> Result<u32, AccessError> {
    // The pieces start at 0 of `out` and follow each other: only the
    // first sees the lane. An empty gather is the lane's own CRC.
    let mut crc = None;
    t.for_sgl_pieces(pd, sgl, offset, out.len(), Access::empty(), |src, at, n| {
        // SAFETY: `src..src+n` was validated inside a registered region kept
        // alive by the read guard; `at + n <= out.len()` by construction of
        // the pieces. Registered memory is reached only by raw pointer and
        // cannot be the exclusive `out`.
        crc = Some(unsafe {
            match crc {
                None => crc::copy_update_lane_raw(lane, src, &mut out[at..at + n]),
                Some(c) => crc::copy_update_raw(c, src, &mut out[at..at + n]),
            }
        });
    })?;
    Ok(crc.unwrap_or_else(|| lane.finish()))
}

/// Total length of an SGE list in bytes.
pub fn sgl_len(sgl: &[Sge]) -> u64 {
    sgl.iter().map(|s| u64::from(s.length)).sum()
}

/// A send queue's memo of one resolved local SGE, for
/// [`MemoryTable::local_gather_crc_lane_memo`]: valid only at the table
/// generation it records (0, the default, is no table's).
#[derive(Clone, Copy, Debug, Default)]
pub struct GatherMemo {
    generation: u64,
    pd: PdId,
    sge: Sge,
    /// Host address of the SGE's first byte (a pointer kept as an integer:
    /// it is dereferenced only under the guard that revalidates it).
    host: usize,
}

/// A responder's memo of the remote range an RDMA WRITE of several packets
/// was checked for at its FIRST packet ([`MemoryTable::remote_check_write`],
/// [`MemoryTable::remote_write_memo`]): valid only at the table generation
/// it records (0, the default, is no table's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteMemo {
    generation: u64,
    pd: PdId,
    qpn: u32,
    rkey: u32,
    /// The range checked: `[va, va + len)`.
    va: u64,
    len: u64,
    /// Host address of `va` (a pointer kept as an integer: it is
    /// dereferenced only under the guard that revalidates it).
    host: usize,
}

impl WriteMemo {
    /// The host address of `[va, va + len)` through this memo, if the memo
    /// still holds for it: the table is still at the memo's `generation`
    /// (no registration, deregistration, re-registration, bind or
    /// invalidation since: every writer bumps it before it changes the
    /// table), the PD, QP and R_Key are the memo's, and the range is a part
    /// of the memo's (an address space is linear: the host address of `va`
    /// is the range's plus `va - memo.va`). Read `generation` under the
    /// table's read guard and use the address only under it.
    #[inline(always)]
    fn place_of(&self, generation: u64, pd: PdId, qpn: u32, rkey: u32, va: u64, len: u64) -> Option<*mut u8> {
        let off = va.wrapping_sub(self.va);
        let fresh = self.generation == generation
            && self.pd == pd
            && self.qpn == qpn
            && self.rkey == rkey
            && va >= self.va
            && off.checked_add(len).is_some_and(|end| end <= self.len);
        fresh.then(|| (self.host as *mut u8).wrapping_add(off as usize))
    }
}
