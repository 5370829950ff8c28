//! Post-time SGE checks without the table's lock: a queue's memo of the
//! checker's last verdicts on local keys.
//!
//! [`MemoryTable::local_check_sgl_cached`] answers from the memo only when
//! the table has not changed since the verdict was taken (its generation,
//! bumped by every writer before it changes anything: registration,
//! deregistration, re-registration, window bind and invalidation, local
//! invalidation); then the verdict's region (PD, rights, address space) is
//! still exactly what the checker would read, and the rights and bounds
//! rules are applied to it by the same code as under the lock
//! ([`Region::offset_of`](super::region::Region)). Anything else — a key not
//! in the memo, a changed table, a failing SGE — goes through
//! [`MemoryTable::local_check_sgl`] under the read lock, so every refusal and
//! its message come from the checker itself.
//!
//! The memo is advisory, as the post-time check is: the data movers check
//! every SGE again under the lock before a byte moves. A post racing a
//! deregistration may pass here and complete with `LOC_PROT_ERR`, as it
//! may with the lock (the deregistration can come right after the check).
//!
//! Each entry is a seqlock over atomics (no `unsafe`, no lock): a reader
//! retries nothing, it falls back to the checker when an entry is being
//! written; a writer that finds an entry busy leaves it.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::object::Object;
use super::{MemoryTable, SgeError};
use crate::transport::ids::{Access, PdId, Sge};

/// Local keys a [`LkeyCache`] remembers.
pub const LKEY_CACHE_ENTRIES: usize = 4;

/// What the checker found for one local key at one table generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Verdict {
    generation: u64,
    pd: PdId,
    lkey: u32,
    /// The region's address space: `[base, base + len)`.
    base: u64,
    len: u64,
    access: Access,
}

impl Verdict {
    /// Whether `sge` passes for `pd` with `needed` rights: the region rules
    /// of [`Table::resolve_local`](super::keys::Table) on the remembered region.
    fn admits(&self, pd: PdId, sge: &Sge, needed: Access) -> bool {
        self.pd == pd
            && self.lkey == sge.lkey
            && self.access.contains(needed)
            && super::region::range_offset(self.base, self.len, sge.addr, u64::from(sge.length)).is_ok()
    }
}

#[derive(Default)]
struct Entry {
    /// Even: stable; odd: being written.
    seq: AtomicU64,
    /// 0 = empty (tables start at generation 1).
    generation: AtomicU64,
    pd_lkey: AtomicU64,
    base: AtomicU64,
    len: AtomicU64,
    access: AtomicU32,
}

impl Entry {
    fn read(&self) -> Option<Verdict> {
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            return None;
        }
        let generation = self.generation.load(Ordering::Relaxed);
        let pd_lkey = self.pd_lkey.load(Ordering::Relaxed);
        let base = self.base.load(Ordering::Relaxed);
        let len = self.len.load(Ordering::Relaxed);
        let access = self.access.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if self.seq.load(Ordering::Relaxed) != s1 || generation == 0 {
            return None;
        }
        Some(Verdict { generation, pd: PdId((pd_lkey >> 32) as u32), lkey: pd_lkey as u32, base, len, access: Access::from_bits_retain(access) })
    }

    fn write(&self, v: &Verdict) {
        let s = self.seq.load(Ordering::Relaxed);
        if s & 1 == 1 || self.seq.compare_exchange(s, s + 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            return; // another thread is writing it: leave it to that one
        }
        fence(Ordering::Release);
        self.generation.store(v.generation, Ordering::Relaxed);
        self.pd_lkey.store((u64::from(v.pd.0) << 32) | u64::from(v.lkey), Ordering::Relaxed);
        self.base.store(v.base, Ordering::Relaxed);
        self.len.store(v.len, Ordering::Relaxed);
        self.access.store(v.access.bits(), Ordering::Relaxed);
        self.seq.store(s + 2, Ordering::Release);
    }
}

/// A queue's memo of checker verdicts (one per QP or SRQ; shared by nothing
/// else, so posting on one queue touches no line another queue writes).
#[derive(Default)]
pub struct LkeyCache {
    entries: [Entry; LKEY_CACHE_ENTRIES],
    next: AtomicUsize,
}

impl std::fmt::Debug for LkeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LkeyCache").finish_non_exhaustive()
    }
}

impl LkeyCache {
    /// An empty memo.
    pub fn new() -> LkeyCache {
        LkeyCache::default()
    }

    fn admits(&self, generation: u64, pd: PdId, sge: &Sge, needed: Access) -> bool {
        self.entries.iter().filter_map(Entry::read).any(|v| v.generation == generation && v.admits(pd, sge, needed))
    }

    fn remember(&self, v: &Verdict) {
        if let Some(e) = self.entries.iter().find(|e| e.read().is_some_and(|o| o.pd == v.pd && o.lkey == v.lkey)) {
            e.write(v);
            return;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % LKEY_CACHE_ENTRIES;
        self.entries[i].write(v);
    }
}

impl MemoryTable {
    /// [`local_check_sgl`](Self::local_check_sgl) answered from `cache` when
    /// it can be (see the module's documentation): no lock, no shared
    /// write, when every SGE's key was checked before and the table has not
    /// changed since. Otherwise the checker runs under the read lock and its
    /// verdicts are remembered. Same result, same errors.
    pub fn local_check_sgl_cached(&self, cache: &LkeyCache, pd: PdId, sgl: &[Sge], needed: Access) -> Result<(), SgeError> {
        let generation = self.generation.load(Ordering::Acquire);
        if sgl.iter().all(|s| s.length == 0 || cache.admits(generation, pd, s, needed)) {
            return Ok(());
        }
        let t = self.read();
        // No writer holds the lock: the generation is the one of what we read.
        let generation = self.generation.load(Ordering::Acquire);
        for (index, s) in sgl.iter().enumerate().filter(|(_, s)| s.length != 0) {
            t.resolve_local(pd, s.lkey, s.addr, u64::from(s.length), needed).map_err(|error| SgeError { index, sge: *s, error })?;
        }
        for s in sgl.iter().filter(|s| s.length != 0) {
            if let Some(Object::Mr(r)) = t.get(s.lkey) {
                cache.remember(&Verdict { generation, pd: r.pd, lkey: s.lkey, base: r.base(), len: r.len, access: r.access });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::memory::AccessError;

    const PD: PdId = PdId(1);

    #[test]
    fn the_memo_agrees_with_the_checker_across_changes() {
        let t = MemoryTable::with_seed(3);
        let mut buf = vec![0u8; 4096];
        // SAFETY: `buf` outlives the table's use of it (deregistered below).
        let k = unsafe { t.register(PD, buf.as_mut_ptr(), 4096, 0x10_000, Access::LOCAL_WRITE) }.unwrap();
        let c = LkeyCache::new();
        let sge = |addr: u64, length: u32| Sge { addr, length, lkey: k.lkey };
        let cases = [
            (sge(0x10_000, 4096), Access::LOCAL_WRITE),
            (sge(0x10_000, 4097), Access::empty()),
            (sge(0x0fff, 8), Access::empty()),
            (sge(0x10_ff8, 8), Access::LOCAL_WRITE),
            (sge(0x10_000, 8), Access::REMOTE_READ),
        ];
        for _round in 0..3 {
            for (s, needed) in cases {
                assert_eq!(t.local_check_sgl_cached(&c, PD, &[s], needed), t.local_check_sgl(PD, &[s], needed), "{s:?} {needed:?}");
                assert_eq!(t.local_check_sgl_cached(&c, PdId(2), &[s], needed), t.local_check_sgl(PdId(2), &[s], needed));
            }
        }
        // Re-registered read-only: the remembered LOCAL_WRITE verdict must not answer.
        let ok = sge(0x10_000, 8);
        assert!(t.local_check_sgl_cached(&c, PD, &[ok], Access::LOCAL_WRITE).is_ok());
        // SAFETY: same memory, still alive.
        let k2 = unsafe { t.reregister(k.lkey, PD, buf.as_mut_ptr(), 4096, 0x10_000, Access::empty()) }.unwrap();
        let stale = t.local_check_sgl_cached(&c, PD, &[ok], Access::empty()).unwrap_err();
        assert_eq!(stale.error, AccessError::InvalidKey, "the old key byte is gone");
        let fresh = Sge { lkey: k2.lkey, ..ok };
        assert_eq!(t.local_check_sgl_cached(&c, PD, &[fresh], Access::LOCAL_WRITE).unwrap_err().error, AccessError::AccessDenied);
        assert!(t.local_check_sgl_cached(&c, PD, &[fresh], Access::empty()).is_ok());
        t.deregister(k2.lkey).unwrap();
        assert_eq!(t.local_check_sgl_cached(&c, PD, &[fresh], Access::empty()).unwrap_err().error, AccessError::InvalidKey);
        drop(buf);
    }
}
