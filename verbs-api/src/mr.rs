//! Protection domains, memory regions and memory windows:
//! `ibv_alloc_pd`, `ibv_reg_mr`, `ibv_rereg_mr`, `ibv_dereg_mr`, `ibv_alloc_mw`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use memmap2::MmapMut;
use rocev2::transport::memory::{Access, MwType, PdId};
use rocev2::transport::wr::Sge;

use crate::device::Context;
use crate::error::{Error, ErrorKind, Result};

/// What the verbs layer knows about a registered key, for checking SGEs at
/// post time without a lock (a copy-on-write snapshot).
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyInfo {
    pub(crate) key: u32,
    pub(crate) pd: PdId,
    pub(crate) iova: u64,
    pub(crate) len: u64,
    pub(crate) access: Access,
}

/// Lock-free lookup of live lkeys (writers serialize on a mutex).
#[derive(Default)]
pub(crate) struct KeyDirectory {
    snapshot: ArcSwap<HashMap<u32, KeyInfo>>,
    writer: Mutex<()>,
}

impl KeyDirectory {
    pub(crate) fn insert(&self, info: KeyInfo) {
        let _g = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut m = HashMap::clone(&self.snapshot.load());
        m.insert(info.key >> 8, info);
        self.snapshot.store(Arc::new(m));
    }

    pub(crate) fn remove(&self, key: u32) {
        let _g = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let mut m = HashMap::clone(&self.snapshot.load());
        if m.get(&(key >> 8)).is_some_and(|i| i.key == key) {
            m.remove(&(key >> 8));
        }
        self.snapshot.store(Arc::new(m));
    }

    /// Check an SGE list against live keys of `pd`, needing `access` locally.
    pub(crate) fn check_sgl(&self, pd: PdId, sgl: &[Sge], need_local_write: bool) -> Result<()> {
        let snap = self.snapshot.load();
        for (i, s) in sgl.iter().enumerate() {
            if s.length == 0 {
                continue;
            }
            let info = snap
                .get(&(s.lkey >> 8))
                .filter(|k| k.key == s.lkey)
                .ok_or_else(|| Error::invalid(format!("sge[{i}]: lkey {:#x} is not a registered memory region", s.lkey)))?;
            if info.pd != pd {
                return Err(Error::invalid(format!("sge[{i}]: lkey {:#x} belongs to another protection domain", s.lkey)));
            }
            let end = s.addr.checked_add(u64::from(s.length));
            if s.addr < info.iova || end.is_none_or(|e| e > info.iova + info.len) {
                return Err(Error::invalid(format!(
                    "sge[{i}]: [{:#x}, +{}) lies outside the region [{:#x}, +{})",
                    s.addr, s.length, info.iova, info.len
                )));
            }
            if need_local_write && !info.access.contains(Access::LOCAL_WRITE) {
                return Err(Error::invalid(format!("sge[{i}]: lkey {:#x} lacks LOCAL_WRITE", s.lkey)));
            }
        }
        Ok(())
    }
}

/// A protection domain (`struct ibv_pd`).
#[derive(Clone)]
pub struct Pd {
    pub(crate) ctx: Context,
    pub(crate) id: PdId,
}

enum Backing {
    /// urnic-allocated anonymous memory (hugepages when available).
    Mapped(MmapMut),
    /// A caller buffer the MR owns.
    Owned(Box<[u8]>),
    /// Caller memory registered with `reg_mr_raw`.
    Raw { ptr: *mut u8, len: usize },
}

// SAFETY: the raw backing is only reachable through `&self`/`&mut self` on
// `Mr`, and the caller of `reg_mr_raw` promised the memory is valid for the
// MR's life from any thread.
unsafe impl Send for Backing {}
// SAFETY: as above; shared access hands out `&[u8]` only.
unsafe impl Sync for Backing {}

/// A memory region (`struct ibv_mr`). Deregistered on drop.
///
/// The remote peer and the datapath write this memory asynchronously, as a
/// NIC's DMA would: read what arrived after its completion was polled.
pub struct Mr {
    pd: Pd,
    backing: Backing,
    lkey: u32,
    rkey: u32,
    access: Access,
}

impl Pd {
    pub(crate) fn new(ctx: Context) -> Pd {
        let id = PdId(ctx.inner.alloc_id());
        Pd { ctx, id }
    }

    /// The PD's number.
    pub fn id(&self) -> u32 {
        self.id.0
    }

    /// The context it belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Allocate `len` bytes of zeroed memory and register it. Uses 2 MiB
    /// hugepages when `len` is a multiple of 2 MiB and hugepages are available.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<Mr> {
        if len == 0 {
            return Err(Error::invalid("cannot allocate a zero-length region"));
        }
        let map = if len.is_multiple_of(2 << 20) {
            memmap2::MmapOptions::new().len(len).huge(Some(21)).map_anon().or_else(|_| MmapMut::map_anon(len))
        } else {
            MmapMut::map_anon(len)
        }
        .map_err(|e| Error::new(ErrorKind::NoResources, format!("mmap of {len} bytes failed: {e}")))?;
        self.register(Backing::Mapped(map), access)
    }

    /// Register a buffer the MR takes ownership of (get it back with [`Mr::into_buffer`]).
    pub fn reg_mr(&self, buf: Vec<u8>, access: Access) -> Result<Mr> {
        if buf.is_empty() {
            return Err(Error::invalid("cannot register a zero-length buffer"));
        }
        self.register(Backing::Owned(buf.into_boxed_slice()), access)
    }

    /// Register caller memory (`ibv_reg_mr`).
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay valid for reads and writes, and not be
    /// freed or remapped, until the returned `Mr` is dropped (deregistered).
    pub unsafe fn reg_mr_raw(&self, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        if addr.is_null() || len == 0 {
            return Err(Error::invalid("null address or zero length"));
        }
        self.register(Backing::Raw { ptr: addr, len }, access)
    }

    fn register(&self, mut backing: Backing, access: Access) -> Result<Mr> {
        check_access(access)?;
        let (ptr, len) = backing_ptr(&mut backing);
        let iova = ptr as u64;
        // SAFETY: the backing lives in the Mr, which deregisters before the
        // backing is dropped (Drop for Mr); Raw memory is the caller's promise.
        let keys = unsafe { self.ctx.inner.memory.register(self.id, ptr, len, iova, access) }
            .map_err(|e| Error::new(ErrorKind::NoResources, format!("registration failed: {e:?}")))?;
        self.ctx.inner.keys.insert(KeyInfo { key: keys.lkey, pd: self.id, iova, len: len as u64, access });
        Ok(Mr { pd: self.clone(), backing, lkey: keys.lkey, rkey: keys.rkey, access })
    }

    /// Allocate a memory window (`ibv_alloc_mw`).
    pub fn alloc_mw(&self, ty: MwType) -> Result<Mw> {
        let rkey = self
            .ctx
            .inner
            .memory
            .alloc_mw(self.id, ty)
            .map_err(|e| Error::new(ErrorKind::NoResources, format!("alloc_mw failed: {e:?}")))?;
        Ok(Mw { pd: self.clone(), rkey, ty })
    }
}

fn check_access(access: Access) -> Result<()> {
    // IBTA 10.6.3.1 / ibv_reg_mr(3): remote write or atomic requires local write.
    if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) && !access.contains(Access::LOCAL_WRITE) {
        return Err(Error::invalid("REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE (ibv_reg_mr: EINVAL)"));
    }
    Ok(())
}

fn backing_ptr(b: &mut Backing) -> (*mut u8, usize) {
    match b {
        Backing::Mapped(m) => (m.as_mut_ptr(), m.len()),
        Backing::Owned(v) => (v.as_mut_ptr(), v.len()),
        Backing::Raw { ptr, len } => (*ptr, *len),
    }
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Start address (the IOVA remote peers use with the rkey).
    pub fn addr(&self) -> u64 {
        match &self.backing {
            Backing::Mapped(m) => m.as_ptr() as u64,
            Backing::Owned(v) => v.as_ptr() as u64,
            Backing::Raw { ptr, .. } => *ptr as u64,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &self.backing {
            Backing::Mapped(m) => m.len(),
            Backing::Owned(v) => v.len(),
            Backing::Raw { len, .. } => *len,
        }
    }

    /// Whether the region is empty (never: zero-length regions are refused).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Access rights.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// An SGE covering `[offset, offset + len)` of this region.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge { addr: self.addr() + offset as u64, length: len, lkey: self.lkey }
    }

    /// The region's bytes.
    pub fn as_slice(&self) -> &[u8] {
        match &self.backing {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
            // SAFETY: the caller of reg_mr_raw promised validity for the MR's life.
            Backing::Raw { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
        }
    }

    /// The region's bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.backing {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
            // SAFETY: as in `as_slice`, and `&mut self` makes this the only local view.
            Backing::Raw { ptr, len } => unsafe { std::slice::from_raw_parts_mut(*ptr, *len) },
        }
    }

    /// Change the access rights (`ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_ACCESS`).
    /// The keys change: old keys stop working.
    pub fn rereg_access(&mut self, access: Access) -> Result<()> {
        check_access(access)?;
        let inner = &self.pd.ctx.inner;
        let (ptr, len) = backing_ptr(&mut self.backing);
        inner.memory.deregister(self.lkey).map_err(|e| Error::new(ErrorKind::Busy, format!("rereg: {e:?}")))?;
        inner.keys.remove(self.lkey);
        // SAFETY: same backing, same guarantee as at registration.
        let keys = unsafe { inner.memory.register(self.pd.id, ptr, len, ptr as u64, access) }
            .map_err(|e| Error::new(ErrorKind::NoResources, format!("rereg failed: {e:?}")))?;
        inner.keys.insert(KeyInfo { key: keys.lkey, pd: self.pd.id, iova: ptr as u64, len: len as u64, access });
        self.lkey = keys.lkey;
        self.rkey = keys.rkey;
        self.access = access;
        Ok(())
    }

    /// Deregister now (`ibv_dereg_mr`), reporting failure (e.g. windows still
    /// bound: `Busy`) instead of the best effort of `Drop`.
    pub fn dereg(mut self) -> Result<Option<Vec<u8>>> {
        self.try_dereg()?;
        let backing = std::mem::replace(&mut self.backing, Backing::Owned(Box::new([])));
        self.lkey = 0;
        Ok(match backing {
            Backing::Owned(v) => Some(v.into_vec()),
            _ => None,
        })
    }

    /// Deregister and return the buffer given to [`Pd::reg_mr`].
    pub fn into_buffer(self) -> Result<Vec<u8>> {
        self.dereg()?.ok_or_else(|| Error::invalid("this region does not own a Vec buffer"))
    }

    fn try_dereg(&mut self) -> Result<()> {
        if self.lkey == 0 {
            return Ok(());
        }
        let inner = &self.pd.ctx.inner;
        inner.keys.remove(self.lkey);
        inner
            .memory
            .deregister(self.lkey)
            .map_err(|e| Error::new(ErrorKind::Busy, format!("dereg of lkey {:#x} failed: {e:?}", self.lkey)))
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        if self.try_dereg().is_err() {
            // Still registered (windows bound): the memory must outlive the
            // registration, so leak it rather than free memory a peer can reach.
            let b = std::mem::replace(&mut self.backing, Backing::Owned(Box::new([])));
            std::mem::forget(b);
        }
    }
}

/// A memory window (`struct ibv_mw`). Deallocated on drop.
pub struct Mw {
    pd: Pd,
    rkey: u32,
    ty: MwType,
}

impl Mw {
    /// The window's current rkey (changes on each bind).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// Its type.
    pub fn mw_type(&self) -> MwType {
        self.ty
    }

    /// Record the rkey after a bind (type 2 binds complete via a WR).
    pub fn set_rkey(&mut self, rkey: u32) {
        self.rkey = rkey;
    }

    /// Bind a type-1 window to `[addr, addr + len)` of `mr` (`ibv_bind_mw`):
    /// returns (and records) the new rkey.
    pub fn bind(&mut self, mr: &Mr, addr: u64, len: u64, access: Access) -> Result<u32> {
        if self.ty != MwType::Type1 {
            return Err(Error::invalid("type-2 windows are bound with a BIND_MW work request"));
        }
        let key_byte = (self.rkey as u8).wrapping_add(1);
        let rkey = self
            .pd
            .ctx
            .inner
            .memory
            .bind_mw(self.pd.id, 0, self.rkey, key_byte, mr.lkey(), addr, len, access)
            .map_err(|e| Error::invalid(format!("bind_mw failed: {e:?}")))?;
        self.rkey = rkey;
        Ok(rkey)
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let _ = self.pd.ctx.inner.memory.dealloc_mw(self.rkey);
    }
}
