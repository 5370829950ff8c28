//! The memory behind a registered region and its release: who owns it
//! (urnic's mapping, a buffer handed over, or the caller's raw memory), and
//! the regions dropped while memory windows were still bound, held until the
//! table lets them go (`ibv_dereg_mr`'s EBUSY made safe for `Drop`).

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use memmap2::{MmapMut, MmapRaw};
use rocev2::transport::memory::{MemoryTable, RegError};

/// Who releases the memory behind a region.
pub(crate) enum Owner {
    /// urnic-allocated anonymous memory (hugepages when available); held
    /// as `MmapRaw`, which never makes a slice of it.
    Mapped(#[allow(dead_code)] MmapRaw),
    /// A caller buffer the MR owns, turned into its raw pointer
    /// (`Box::into_raw`) so that moving the `Mr` asserts nothing about
    /// memory the datapath reaches by pointer; rebuilt to be freed.
    Boxed,
    /// Caller memory registered with `reg_mr_raw`: nothing to free.
    Caller,
}

/// A region's memory: after registration it is reached only through `ptr`.
pub(crate) struct Backing {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
    pub(crate) owner: Owner,
}

// SAFETY: `Backing` is a pointer to memory valid from any thread (our own
// mapping or box, or caller memory whose validity from any thread the caller
// of `reg_mr_raw` promised) plus what frees it; moving it to another thread
// moves no thread-bound state.
unsafe impl Send for Backing {}
// SAFETY: through `&Backing` nothing is reachable but the pointer and length
// (copies of them); every access to the bytes is an explicit raw-pointer
// access with its own contract (`Mr::read_at` and friends).
unsafe impl Sync for Backing {}

impl Backing {
    pub(crate) fn mapped(map: MmapMut) -> Backing {
        let map = MmapRaw::from(map);
        let len = map.len();
        match NonNull::new(map.as_mut_ptr()) {
            Some(ptr) => Backing { ptr, len, owner: Owner::Mapped(map) },
            // mmap never maps page 0; keep the mapping released properly anyway.
            None => Backing { ptr: NonNull::dangling(), len: 0, owner: Owner::Mapped(map) },
        }
    }

    pub(crate) fn boxed(buf: Box<[u8]>) -> Backing {
        let len = buf.len();
        let raw: *mut [u8] = Box::into_raw(buf);
        // SAFETY: `Box::into_raw` never returns null.
        let ptr = unsafe { NonNull::new_unchecked(raw.cast::<u8>()) };
        Backing { ptr, len, owner: Owner::Boxed }
    }

    /// Nothing (what a deregistered `Mr` is left holding).
    pub(crate) fn empty() -> Backing {
        Backing { ptr: NonNull::dangling(), len: 0, owner: Owner::Caller }
    }

    /// Release the memory; the `Vec` a boxed backing was made from comes back.
    pub(crate) fn into_vec(self) -> Option<Vec<u8>> {
        let me = ManuallyDrop::new(self);
        match me.owner {
            Owner::Boxed => {
                let raw = std::ptr::slice_from_raw_parts_mut(me.ptr.as_ptr(), me.len);
                // SAFETY: `raw` is what `Box::into_raw` returned in `boxed`, and
                // `me` is not dropped, so it is rebuilt exactly once.
                Some(unsafe { Box::from_raw(raw) }.into_vec())
            }
            _ => {
                drop(ManuallyDrop::into_inner(me));
                None
            }
        }
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        if let Owner::Boxed = self.owner {
            let raw = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
            // SAFETY: as in `into_vec`; `Drop` runs once.
            drop(unsafe { Box::from_raw(raw) });
        }
        // `Owner::Mapped` unmaps when the field drops; `Caller` frees nothing.
    }
}

/// Regions dropped while still registered (windows bound), held by the
/// device until their deregistration succeeds.
#[derive(Default)]
pub(crate) struct DeferredDeregs {
    pub(crate) list: Mutex<Vec<(u32, Backing)>>,
    /// `list.len()`, readable without the lock.
    pub(crate) pending: AtomicUsize,
    /// Regions ever dropped while busy.
    pub(crate) deferred: AtomicU64,
    /// Of those, freed once their windows were gone.
    pub(crate) freed: AtomicU64,
}

impl DeferredDeregs {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u32, Backing)>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hold `backing` (still registered as `lkey`) until it can be deregistered.
    pub(crate) fn push(&self, lkey: u32, backing: Backing) {
        let mut l = self.lock();
        l.push((lkey, backing));
        self.pending.store(l.len(), Ordering::SeqCst);
        self.deferred.fetch_add(1, Ordering::Relaxed);
    }

    /// Regions waiting.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    /// Retry the deregistration of every waiting region; free those that
    /// succeed. Cheap when none waits (one atomic load, inlined into the
    /// caller: every poll that returns completions asks).
    #[inline]
    pub(crate) fn reclaim(&self, memory: &MemoryTable) {
        if self.pending() != 0 {
            self.reclaim_waiting(memory);
        }
    }

    #[cold]
    #[inline(never)]
    fn reclaim_waiting(&self, memory: &MemoryTable) {
        let released: Vec<Backing> = {
            let mut l = self.lock();
            let mut keep = Vec::with_capacity(l.len());
            let mut released = Vec::new();
            for (lkey, b) in l.drain(..) {
                match memory.deregister(lkey) {
                    // InvalidKey: the table does not know it any more either.
                    Ok(()) | Err(RegError::InvalidKey) => released.push(b),
                    Err(_) => keep.push((lkey, b)),
                }
            }
            *l = keep;
            self.pending.store(l.len(), Ordering::SeqCst);
            released
        };
        self.freed.fetch_add(released.len() as u64, Ordering::Relaxed);
        drop(released);
    }

    /// The device is closing (its datapath threads have stopped). Retry
    /// once; what still cannot be deregistered stays in the list to be freed
    /// with it if `datapath_gone` (nothing can reach the memory any more once
    /// the NIC, the only holder of the memory table besides the device, is
    /// dropped, which happens first), else is leaked, loudly: someone else
    /// still holds the NIC and could move data into it.
    pub(crate) fn close(&self, memory: &MemoryTable, datapath_gone: bool) {
        self.reclaim(memory);
        if datapath_gone {
            return;
        }
        let l = std::mem::take(&mut *self.lock());
        if !l.is_empty() {
            let bytes: usize = l.iter().map(|(_, b)| b.len).sum();
            eprintln!(
                "urnic: device closed while {} dropped memory region(s) ({bytes} bytes) still had memory windows bound \
                 and its NIC is still shared: leaking them rather than freeing memory a peer can reach",
                l.len()
            );
            std::mem::forget(l);
        }
    }

    /// `(deferred, pending, freed)` for the counters.
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        (self.deferred.load(Ordering::Relaxed), self.pending() as u64, self.freed.load(Ordering::Relaxed))
    }
}
