//! Protection domains, memory regions and memory windows:
//! `ibv_alloc_pd`, `ibv_reg_mr`, `ibv_rereg_mr`, `ibv_dereg_mr`, `ibv_alloc_mw`.
//!
//! # Region memory is shared with the datapath
//!
//! Once registered, a region's bytes are written and read by the datapath
//! threads (receives, READ responses, a peer's WRITEs and atomics) whenever
//! the application has posted work or exposed an rkey, as a NIC's DMA would.
//! So the API never hands out a safe `&[u8]` / `&mut [u8]` over them (the
//! compiler may assume such a borrow's bytes do not change, or are not read,
//! while it lives): [`Mr::read_at`] and [`Mr::write_at`] copy through raw
//! pointers, and [`Mr::as_slice`] / [`Mr::as_mut_slice`] are `unsafe` with the
//! ibverbs contract (no WR or remote access in flight) as their condition,
//! like the posting calls of rust-ibverbs.
//!
//! # Deregistration is one step
//!
//! `ibv_dereg_mr` either removes a region completely or leaves it as it was:
//! [`Mr::dereg`] asks the memory table, which refuses with
//! [`ErrorKind::Busy`], `EBUSY`, while memory windows are bound to the
//! region; on failure the region is handed back still registered, usable
//! locally and remotely.
//!
//! # One checker
//!
//! Posting a WR checks its SGEs with the memory table's own checker
//! ([`MemoryTable::local_check_sgl`]), the one the datapath runs before it
//! moves a byte: a WR is refused at post time exactly when the datapath
//! would refuse it at that moment. Each QP and SRQ keeps a memo of the
//! checker's verdicts on its recent lkeys, valid while the table is
//! unchanged ([`MemoryTable::local_check_sgl_cached`]), so a post takes no
//! lock another queue or the datapath uses; every refusal still comes from
//! the checker itself. A region registered with
//! [`Access::ZERO_BASED`] is addressed by offsets from 0 ([`Mr::iova`] is
//! 0; [`Mr::sge`] makes such SGEs), not by its host address.
//! `Drop` cannot return the error: a dropped region with windows still bound
//! stays registered and its memory stays allocated, held by the device,
//! until the windows are unbound, invalidated or deallocated (retried then,
//! and whenever completions are polled), and is freed at the latest when
//! the device closes. The counters `verbs.mr_dereg_deferred`,
//! `verbs.mr_dereg_pending` and `verbs.mr_deferred_freed` tell how often
//! that happened.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use memmap2::MmapMut;
use rocev2::transport::memory::{Access, LkeyCache, MemoryTable, MwType, PdId, RegError};
use rocev2::transport::wr::Sge;

use crate::backing::{Backing, Owner};
use crate::device::Context;
use crate::error::{Error, ErrorKind, Result};

/// Check an SGE list at post time against the memory table, needing
/// LOCAL_WRITE if `need_local_write`: the checker the datapath uses when it
/// moves the data ([`MemoryTable::local_check_sgl`]), so a WR is refused here
/// exactly when the datapath would refuse it now (same keys, PD, state,
/// rights, and bounds in the region's address space: the IOVA, or offsets
/// from 0 for ZERO_BASED regions). `ibv_post_send` / `ibv_post_recv`: EINVAL.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn check_sgl(memory: &MemoryTable, pd: PdId, sgl: &[Sge], need_local_write: bool) -> Result<()> {
    let needed = if need_local_write { Access::LOCAL_WRITE } else { Access::empty() };
    memory.local_check_sgl(pd, sgl, needed).map_err(sge_error)
}

/// [`check_sgl`] as the post paths run it: `cache` is the posting queue's
/// memo of the checker's verdicts, which answers without the table's lock
/// while the table is unchanged; same result, same errors.
pub(crate) fn check_sgl_cached(memory: &MemoryTable, cache: &LkeyCache, pd: PdId, sgl: &[Sge], need_local_write: bool) -> Result<()> {
    let needed = if need_local_write { Access::LOCAL_WRITE } else { Access::empty() };
    memory.local_check_sgl_cached(cache, pd, sgl, needed).map_err(sge_error)
}

fn sge_error(e: rocev2::transport::memory::SgeError) -> Error {
    Error::with_source(ErrorKind::InvalidArgument, e.to_string(), e)
}

/// The verbs error for a failed registration-side call of the memory table,
/// with the `RegError` as its source.
fn reg_error(e: RegError, what: &str) -> Error {
    let kind = match e {
        // ibv_reg_mr(3) / ibv_rereg_mr(3) / ibv_bind_mw(3): EINVAL.
        RegError::InvalidArgument => ErrorKind::InvalidArgument,
        // ibv_reg_mr(3) / ibv_alloc_mw(3): ENOMEM when out of keys.
        RegError::NoResources => ErrorKind::NoResources,
        // No object with this handle: the kernel's uobject lookup behind
        // ibv_dereg_mr / ibv_rereg_mr / ibv_dealloc_mw fails with ENOENT.
        RegError::InvalidKey => ErrorKind::NotFound,
        // ibv_dereg_mr(3) / ibv_rereg_mr(3): EBUSY while windows are bound.
        RegError::Busy => ErrorKind::Busy,
    };
    Error::with_source(kind, format!("{what}: {e}"), e)
}

/// A protection domain (`struct ibv_pd`).
#[derive(Clone)]
pub struct Pd {
    pub(crate) ctx: Context,
    pub(crate) id: PdId,
}

/// A memory region (`struct ibv_mr`). Deregistered on drop (see the
/// module documentation for a region with windows still bound).
///
/// The remote peer and the datapath write this memory asynchronously, as a
/// NIC's DMA would: read what arrived after its completion was polled, with
/// [`Mr::read_at`] (or the `unsafe` [`Mr::as_slice`]).
pub struct Mr {
    pd: Pd,
    backing: Backing,
    lkey: u32,
    rkey: u32,
    access: Access,
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .finish()
    }
}

/// A failed [`Mr::dereg`] (`ibv_dereg_mr` returning an error): the region,
/// still registered and usable, and why. Converting it into an [`Error`]
/// (as `?` does) drops the region, whose deregistration is then deferred
/// (module documentation).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct DeregError {
    // Boxed: keeps `Result<_, DeregError>` small.
    mr: Box<Mr>,
    error: Error,
}

impl DeregError {
    /// Why (kind [`ErrorKind::Busy`] while memory windows are bound).
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        self.error.kind()
    }

    /// The region back, still registered.
    pub fn into_mr(self) -> Mr {
        *self.mr
    }

    /// The region and the error.
    pub fn into_parts(self) -> (Mr, Error) {
        (*self.mr, self.error)
    }
}

impl From<DeregError> for Error {
    fn from(e: DeregError) -> Error {
        e.error
    }
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
        self.register(Backing::mapped(map), access)
    }

    /// Register a buffer the MR takes ownership of (get it back with [`Mr::into_buffer`]).
    pub fn reg_mr(&self, buf: Vec<u8>, access: Access) -> Result<Mr> {
        if buf.is_empty() {
            return Err(Error::invalid("cannot register a zero-length buffer"));
        }
        self.register(Backing::boxed(buf.into_boxed_slice()), access)
    }

    /// Register caller memory (`ibv_reg_mr`).
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay valid for reads and writes from any
    /// thread, and not be freed or remapped, until the registration ends:
    /// [`Mr::dereg`] returned `Ok`, or the `Mr` was dropped with no memory
    /// window bound to it. (Dropped while windows are still bound, it stays
    /// registered until they are unbound, invalidated or deallocated:
    /// [`Context::deferred_deregistrations`] is then nonzero. Use
    /// [`Mr::dereg`] and handle [`ErrorKind::Busy`] instead.) The caller
    /// must not access the memory other than through the `Mr` while it is
    /// registered except as [`Mr::as_slice`] allows.
    pub unsafe fn reg_mr_raw(&self, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        let Some(ptr) = NonNull::new(addr).filter(|_| len != 0) else {
            return Err(Error::invalid("null address or zero length"));
        };
        self.register(Backing { ptr, len, owner: Owner::Caller }, access)
    }

    fn register(&self, backing: Backing, access: Access) -> Result<Mr> {
        check_access(access)?;
        let inner = &self.ctx.inner;
        // The IOVA is the host address (what `Mr::addr` reports), unless
        // `access` has ZERO_BASED: then the region's addresses are offsets
        // from 0 (`Mr::iova`).
        let ptr = backing.ptr.as_ptr();
        // SAFETY: the backing lives in the Mr, whose memory is released only
        // after deregistration succeeded (`Mr::dereg`, `Drop for Mr`,
        // `DeferredDeregs`); Raw memory is the caller's promise.
        let keys =
            unsafe { inner.memory.register(self.id, ptr, backing.len, ptr as u64, access) }.map_err(|e| reg_error(e, "registration failed"))?;
        inner.reclaim_deferred();
        Ok(Mr { pd: self.clone(), backing, lkey: keys.lkey, rkey: keys.rkey, access })
    }

    /// Allocate a memory window (`ibv_alloc_mw`).
    pub fn alloc_mw(&self, ty: MwType) -> Result<Mw> {
        let rkey = self.ctx.inner.memory.alloc_mw(self.id, ty).map_err(|e| reg_error(e, "alloc_mw failed"))?;
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

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The host address of the first byte (`ibv_mr.addr`). It is also the
    /// region's IOVA unless the region is ZERO_BASED (see [`Mr::iova`]).
    pub fn addr(&self) -> u64 {
        self.backing.ptr.as_ptr() as u64
    }

    /// The address of the first byte in the region's own address space, the
    /// one SGEs (with the lkey) and peers (with the rkey) use: 0 for a
    /// region registered with [`Access::ZERO_BASED`] (addresses are offsets),
    /// else the host address [`Mr::addr`].
    pub fn iova(&self) -> u64 {
        if self.access.contains(Access::ZERO_BASED) {
            0
        } else {
            self.addr()
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.backing.len
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

    /// An SGE covering `[offset, offset + len)` of this region (its address
    /// is `iova() + offset`: the offset itself for a ZERO_BASED region).
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        Sge { addr: self.iova().wrapping_add(offset as u64), length: len, lkey: self.lkey }
    }

    /// A raw pointer to the first byte (the address [`Mr::addr`] gives), as
    /// `AtomicU8::as_ptr` gives one from `&self`: for accesses the copying
    /// calls do not cover, such as spinning with `ptr::read_volatile` on a
    /// byte a peer's WRITE will change. Every dereference is `unsafe`: it
    /// must stay within [`Mr::len`] bytes, happen while the `Mr` exists, and
    /// not overlap bytes the datapath moves at the same time except for
    /// single-byte volatile polls as above.
    pub fn as_ptr(&self) -> *mut u8 {
        self.backing.ptr.as_ptr()
    }

    /// The start of `[offset, offset + len)` if it lies in the region.
    fn range(&self, offset: usize, len: usize) -> Result<*mut u8> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(self.backing.ptr.as_ptr().wrapping_add(offset)),
            _ => Err(Error::invalid(format!("[{offset}, +{len}) lies outside the {}-byte region", self.len()))),
        }
    }

    /// Copy `buf.len()` bytes from byte `offset` of the region into `buf`.
    /// Fails with [`ErrorKind::InvalidArgument`] (copying nothing) if the
    /// range does not lie in the region.
    ///
    /// Bytes the datapath is writing at the same moment (a receive or READ
    /// response landing, a peer's WRITE) read as whatever mix of old and new
    /// values the copy met, as with a NIC's DMA: read after the completion.
    pub fn read_at(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        let src = self.range(offset, buf.len())?;
        // SAFETY: `[src, src + buf.len())` lies in the region (checked
        // above), which is allocated and valid for reads while `self` lives:
        // its memory is released only after deregistration, which needs the
        // `Mr` by value (or the caller of `reg_mr_raw` promised as much). No
        // reference to region memory is made: the bytes are read through the
        // raw pointer, like the datapath's own copies (`MemoryTable`'s
        // `ptr::copy` under its read guard), so no borrow's promise of
        // immutability or exclusivity is broken by a concurrent datapath
        // write; every bit pattern is a valid `u8`. `buf` is a distinct
        // exclusive borrow; `copy` would tolerate overlap anyway.
        unsafe { std::ptr::copy(src, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// The `len` bytes from byte `offset` of the region, copied into a new
    /// `Vec` ([`Mr::read_at`]).
    pub fn read_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        self.range(offset, len)?;
        let mut v = vec![0u8; len];
        self.read_at(offset, &mut v)?;
        Ok(v)
    }

    /// Copy `data` into the region at byte `offset`. Fails with
    /// [`ErrorKind::InvalidArgument`] (copying nothing) if the range does
    /// not lie in the region.
    ///
    /// Write before posting the work that sends these bytes (or before
    /// telling a peer to READ them): a WR or remote access in flight over
    /// the same bytes reads a mix of old and new values.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) -> Result<()> {
        let dst = self.range(offset, data.len())?;
        // SAFETY: as in `read_at`, for writes: the range lies in the region,
        // valid for writes while `self` lives; only raw-pointer accesses
        // reach region memory, so no borrow is invalidated; `&mut self`
        // keeps this thread's other local accessors out meanwhile.
        unsafe { std::ptr::copy(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Set `len` bytes from byte `offset` to `value` (as [`Mr::write_at`]).
    pub fn fill_at(&mut self, offset: usize, len: usize, value: u8) -> Result<()> {
        let dst = self.range(offset, len)?;
        // SAFETY: as in `write_at`.
        unsafe { std::ptr::write_bytes(dst, value, len) };
        Ok(())
    }

    /// The region's bytes, borrowed in place.
    ///
    /// # Safety
    /// While the returned slice lives, nothing may write the region: no
    /// posted WR that writes it (a receive, a READ or atomic landing in it)
    /// may be outstanding, and no remote peer may WRITE or atomically update
    /// it (no rkey of it or of a window into it in a peer's hands, or the
    /// application's protocol guarantees the peer is quiet). This is the
    /// ibverbs rule that the application does not touch memory of a WR
    /// between posting it and polling its completion, made a condition of
    /// the borrow. [`Mr::read_at`] has no such condition.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the region is valid for reads for `self`'s life; the
        // caller guarantees no concurrent writer for the borrow's.
        unsafe { std::slice::from_raw_parts(self.backing.ptr.as_ptr(), self.len()) }
    }

    /// The region's bytes, borrowed mutably in place.
    ///
    /// # Safety
    /// As [`Mr::as_slice`], and moreover nothing may read the region while
    /// the slice lives: no posted WR that reads it (a SEND, WRITE or READ
    /// response sourced from it) may be outstanding, and no remote peer may
    /// READ it. [`Mr::write_at`] has no such condition.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: valid for reads and writes for `self`'s life; `&mut self`
        // excludes other local borrows, the caller excludes the datapath.
        unsafe { std::slice::from_raw_parts_mut(self.backing.ptr.as_ptr(), self.len()) }
    }

    /// Change the access rights (`ibv_rereg_mr` with `IBV_REREG_MR_CHANGE_ACCESS`).
    /// The keys change: old keys stop working. One step: refused with
    /// [`ErrorKind::Busy`] while memory windows are bound (the region keeps
    /// its keys and rights), else the new keys replace the old at once.
    pub fn rereg_access(&mut self, access: Access) -> Result<()> {
        check_access(access)?;
        let inner = &self.pd.ctx.inner;
        let ptr = self.backing.ptr.as_ptr();
        // SAFETY: same memory, same guarantee as at registration.
        let keys = unsafe { inner.memory.reregister(self.lkey, self.pd.id, ptr, self.backing.len, ptr as u64, access) }
            .map_err(|e| reg_error(e, &format!("rereg of lkey {:#x}", self.lkey)))?;
        self.lkey = keys.lkey;
        self.rkey = keys.rkey;
        self.access = access;
        Ok(())
    }

    /// Deregister now (`ibv_dereg_mr`), in one step. On success the region
    /// is gone (its keys fail locally and remotely) and the buffer given to
    /// [`Pd::reg_mr`] comes back (`None` for other regions). On failure
    /// (kind [`ErrorKind::Busy`], `EBUSY`, while memory windows are bound)
    /// nothing changed: the region comes back in the error, still
    /// registered and usable.
    pub fn dereg(self) -> core::result::Result<Option<Vec<u8>>, DeregError> {
        let inner = &self.pd.ctx.inner;
        if let Err(e) = inner.memory.deregister(self.lkey) {
            let error = reg_error(e, &format!("dereg of lkey {:#x}", self.lkey));
            return Err(DeregError { mr: Box::new(self), error });
        }
        let (backing, pd) = self.into_parts();
        let buf = backing.into_vec();
        pd.ctx.inner.reclaim_deferred();
        Ok(buf)
    }

    /// Deregister and return the buffer given to [`Pd::reg_mr`]. Fails as
    /// [`Mr::dereg`] does, and with [`ErrorKind::InvalidArgument`] (before
    /// deregistering) for a region that does not own a `Vec`.
    pub fn into_buffer(self) -> core::result::Result<Vec<u8>, DeregError> {
        if !matches!(self.backing.owner, Owner::Boxed) {
            return Err(DeregError { mr: Box::new(self), error: Error::invalid("this region does not own a Vec buffer") });
        }
        // A boxed backing always gives its Vec back.
        self.dereg().map(Option::unwrap_or_default)
    }

    /// Take the `Mr` apart without running its `Drop`.
    fn into_parts(self) -> (Backing, Pd) {
        let me = ManuallyDrop::new(self);
        // SAFETY: each field is read once and `me` is never used or dropped
        // again, so each is owned exactly once afterwards (the plain fields
        // are `Copy`).
        unsafe { (std::ptr::read(&me.backing), std::ptr::read(&me.pd)) }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        let inner = &self.pd.ctx.inner;
        if let Err(RegError::Busy | RegError::InvalidArgument | RegError::NoResources) = inner.memory.deregister(self.lkey) {
            // Still registered (windows bound): a peer can still reach the
            // memory through them, so it must not be freed. The device holds
            // it until the deregistration succeeds (module documentation).
            let backing = std::mem::replace(&mut self.backing, Backing::empty());
            inner.deferred.push(self.lkey, backing);
        }
        // Retry what waits, this region included: a window unbound between
        // the attempt above and the push must not leave it waiting.
        inner.reclaim_deferred();
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
    /// returns (and records) the new rkey. `len == 0` unbinds the window
    /// (the old rkey stops working).
    pub fn bind(&mut self, mr: &Mr, addr: u64, len: u64, access: Access) -> Result<u32> {
        if self.ty != MwType::Type1 {
            return Err(Error::invalid("type-2 windows are bound with a BIND_MW work request"));
        }
        let key_byte = (self.rkey as u8).wrapping_add(1);
        let inner = &self.pd.ctx.inner;
        let rkey = inner
            .memory
            .bind_mw(self.pd.id, 0, self.rkey, key_byte, mr.lkey(), addr, len, access)
            .map_err(|e| Error::with_source(ErrorKind::InvalidArgument, format!("bind_mw failed: {e}"), e))?;
        self.rkey = rkey;
        // A rebind or unbind may have released the last window of a dropped region.
        inner.reclaim_deferred();
        Ok(rkey)
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        let inner = &self.pd.ctx.inner;
        if inner.memory.dealloc_mw(self.rkey).is_err() {
            // A type-2 window bound by a BIND_MW work request has a key byte
            // this handle does not know unless `set_rkey` recorded it. Its
            // index is still this window's alone (it is freed only here), so
            // the one key byte that matches is this window's current key.
            let index = self.rkey & !0xff;
            for b in 0..=255u32 {
                if inner.memory.dealloc_mw(index | b).is_ok() {
                    break;
                }
            }
        }
        inner.reclaim_deferred();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{open_device, DatapathMode, DeviceConfig, MemHub};
    use rocev2::transport::memory::AccessError;

    const ALL: Access =
        Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC).union(Access::MW_BIND);

    fn device() -> Context {
        let hub = MemHub::new(1);
        let mut cfg = DeviceConfig::memory(&hub, "t0", [2, 0, 0, 0, 0, 9], [10, 0, 0, 9]);
        cfg.datapath = DatapathMode::Manual;
        open_device(cfg).unwrap()
    }

    /// Whether `mr`'s lkey passes the post-time check (the memory table's checker).
    fn locally_known(mr: &Mr) -> bool {
        check_sgl(&mr.pd.ctx.inner.memory, mr.pd.id, &[mr.sge(0, 8)], true).is_ok()
    }

    /// What the memory table says about a remote WRITE of 8 bytes at `mr`'s start with `rkey`.
    fn remote(mr: &Mr, rkey: u32) -> core::result::Result<(), AccessError> {
        mr.pd.ctx.inner.memory.remote_check(mr.pd.id, 0, rkey, mr.addr(), 8, Access::REMOTE_WRITE)
    }

    /// Post-time validation and the datapath's data movers, on the same SGEs.
    fn verdicts(ctx: &Context, pd: &Pd, sge: Sge, need_local_write: bool) -> (bool, bool) {
        let post = check_sgl(&ctx.inner.memory, pd.id, &[sge], need_local_write);
        if let Err(e) = &post {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            assert!(std::error::Error::source(e).is_some_and(|s| s.is::<rocev2::transport::memory::SgeError>()));
        }
        let mut buf = vec![0u8; sge.length as usize];
        let moved = if need_local_write {
            ctx.inner.memory.local_scatter(pd.id, &[sge], 0, &buf)
        } else {
            ctx.inner.memory.local_gather(pd.id, &[sge], 0, &mut buf)
        };
        (post.is_ok(), moved.is_ok())
    }

    #[test]
    fn post_time_checks_decide_as_the_datapath_for_zero_based_and_iova_regions() {
        let ctx = device();
        let pd = ctx.alloc_pd().unwrap();
        let other = ctx.alloc_pd().unwrap();
        const LEN: usize = 4096;
        let zb = pd.alloc_mr(LEN, Access::LOCAL_WRITE | Access::ZERO_BASED).unwrap();
        let va = pd.alloc_mr(LEN, Access::LOCAL_WRITE).unwrap();
        let ro = pd.alloc_mr(LEN, Access::ZERO_BASED).unwrap();
        assert_eq!((zb.iova(), va.iova()), (0, va.addr()));
        assert_eq!(zb.sge(100, 8).addr, 100, "a ZERO_BASED region's SGEs carry offsets");
        let mut accepted = 0;
        for mr in [&zb, &va, &ro] {
            let starts = [0, 1, LEN as u64 - 8, LEN as u64 - 7, LEN as u64, mr.addr(), mr.addr() + 8, mr.addr() + LEN as u64 - 8, u64::MAX - 3];
            for start in starts {
                for length in [1u32, 8, 4096] {
                    for write in [false, true] {
                        let sge = Sge { addr: start, length, lkey: mr.lkey() };
                        let (post, datapath) = verdicts(&ctx, &pd, sge, write);
                        assert_eq!(post, datapath, "{mr:?} {sge:?} write {write}");
                        accepted += usize::from(post);
                        // Another PD's QP may use none of them.
                        assert_eq!(verdicts(&ctx, &other, sge, write), (false, false));
                    }
                }
            }
        }
        // Both outcomes occurred; the ones that must, did.
        assert!(accepted > 0);
        let ok = |mr: &Mr, off: usize, len: u32, write: bool| verdicts(&ctx, &pd, mr.sge(off, len), write);
        assert_eq!(ok(&zb, 0, LEN as u32, true), (true, true));
        assert_eq!(ok(&zb, LEN - 8, 8, false), (true, true));
        assert_eq!(ok(&zb, LEN - 7, 8, false), (false, false));
        assert_eq!(ok(&va, LEN - 8, 8, true), (true, true));
        assert_eq!(ok(&ro, 8, 8, false), (true, true));
        assert_eq!(ok(&ro, 8, 8, true), (false, false), "no LOCAL_WRITE");
        // The host address is no address of a ZERO_BASED region.
        assert_eq!(verdicts(&ctx, &pd, Sge { addr: zb.addr(), length: 8, lkey: zb.lkey() }, false), (false, false));
    }

    #[test]
    fn read_and_write_at_copy_inside_the_region_and_refuse_the_rest() {
        let ctx = device();
        let pd = ctx.alloc_pd().unwrap();
        let mut mr = pd.reg_mr(vec![0; 100], ALL).unwrap();
        mr.write_at(10, b"hello").unwrap();
        assert_eq!(mr.read_vec(10, 5).unwrap(), b"hello");
        mr.fill_at(95, 5, 7).unwrap();
        let mut end = [0u8; 5];
        mr.read_at(95, &mut end).unwrap();
        assert_eq!(end, [7; 5]);
        // Out of range (or overflowing): InvalidArgument, nothing copied.
        assert_eq!(mr.write_at(96, &[1; 5]).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(mr.fill_at(0, 101, 1).unwrap_err().kind(), ErrorKind::InvalidArgument);
        let mut buf = [9u8; 2];
        assert_eq!(mr.read_at(99, &mut buf).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(buf, [9, 9], "a refused read leaves the buffer alone");
        assert_eq!(mr.read_at(usize::MAX, &mut buf).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(mr.read_vec(usize::MAX - 1, 4).unwrap_err().kind(), ErrorKind::InvalidArgument);
        mr.read_at(100, &mut []).unwrap();
        assert_eq!(mr.read_at(101, &mut []).unwrap_err().kind(), ErrorKind::InvalidArgument);
        // The buffer comes back with what was written, nothing else.
        let mut want = vec![0u8; 100];
        want[10..15].copy_from_slice(b"hello");
        want[95..].fill(7);
        assert_eq!(mr.into_buffer().unwrap(), want);
    }

    #[test]
    fn into_buffer_hands_back_a_region_that_owns_no_vec() {
        let ctx = device();
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.alloc_mr(4096, ALL).unwrap();
        let (mr, e) = mr.into_buffer().unwrap_err().into_parts();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(locally_known(&mr) && remote(&mr, mr.rkey()).is_ok(), "still registered");
        let rkey = mr.rkey();
        let probe = pd.alloc_mr(4096, ALL).unwrap();
        assert_eq!(mr.dereg().unwrap(), None);
        assert_eq!(ctx.inner.memory.remote_check(pd.id, 0, rkey, probe.addr(), 8, Access::REMOTE_WRITE), Err(AccessError::InvalidKey));
    }

    #[test]
    fn busy_dereg_and_rereg_leave_the_region_as_it_was() {
        let ctx = device();
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.reg_mr(vec![5; 8192], ALL).unwrap();
        let mut mw = pd.alloc_mw(MwType::Type1).unwrap();
        let wkey = mw.bind(&mr, mr.addr(), 4096, Access::REMOTE_WRITE).unwrap();
        let (lkey, rkey) = (mr.lkey(), mr.rkey());

        let err = mr.dereg().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
        let mut mr = err.into_mr();
        assert!(locally_known(&mr), "lkey dropped from the directory by a failed dereg");
        assert_eq!((remote(&mr, rkey), remote(&mr, wkey)), (Ok(()), Ok(())));
        assert_eq!(mr.rereg_access(ALL).unwrap_err().kind(), ErrorKind::Busy);
        assert_eq!((mr.lkey(), mr.rkey()), (lkey, rkey));
        assert!(locally_known(&mr) && remote(&mr, rkey).is_ok());
        // `?` into a verbs Error keeps the kind and drops the region: deferred.
        let mr2 = pd.alloc_mr(4096, ALL).unwrap();
        let mut mw2 = pd.alloc_mw(MwType::Type1).unwrap();
        mw2.bind(&mr2, mr2.addr(), 8, Access::REMOTE_READ).unwrap();
        let e: Error = mr2.dereg().map(|_| ()).unwrap_err().into();
        assert_eq!(e.kind(), ErrorKind::Busy);
        assert_eq!(ctx.deferred_deregistrations(), 1);
        drop(mw2);
        assert_eq!(ctx.deferred_deregistrations(), 0);

        // Unbound, rereg changes the keys in one step: old ones fail, new ones work.
        mw.bind(&mr, 0, 0, Access::empty()).unwrap();
        assert_eq!(remote(&mr, wkey), Err(AccessError::InvalidKey));
        mr.rereg_access(Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        assert_ne!(mr.lkey(), lkey);
        assert_eq!(remote(&mr, rkey), Err(AccessError::InvalidKey));
        assert!(check_sgl(&ctx.inner.memory, pd.id, &[Sge { addr: mr.addr(), length: 8, lkey }], false).is_err(), "old lkey still known");
        assert!(locally_known(&mr) && remote(&mr, mr.rkey()).is_ok());
        let new_lkey = mr.lkey();
        assert_eq!(mr.dereg().unwrap(), Some(vec![5; 8192]));
        assert!(check_sgl(&ctx.inner.memory, pd.id, &[Sge { addr: 0, length: 8, lkey: new_lkey }], false).is_err());
        assert_eq!(ctx.inner.memory.deregister(new_lkey), Err(RegError::InvalidKey), "deregistered in the table");
    }

    #[test]
    fn a_region_dropped_while_busy_is_held_until_its_window_goes() {
        let ctx = device();
        let pd = ctx.alloc_pd().unwrap();
        let pattern: Vec<u8> = (0..4096).map(|i| (i * 7) as u8).collect();
        let mr = pd.reg_mr(pattern.clone(), ALL).unwrap();
        let (addr, lkey) = (mr.addr(), mr.lkey());
        // A type-2 window bound as a BIND_MW work request of QP 77 would
        // bind it: the handle does not learn the new key byte.
        let mw = pd.alloc_mw(MwType::Type2).unwrap();
        let new_key = (mw.rkey() as u8).wrapping_add(3);
        let wkey = ctx.inner.memory.bind_mw(pd.id, 77, mw.rkey(), new_key, lkey, addr, 4096, Access::REMOTE_READ).unwrap();
        assert_ne!(wkey, mw.rkey());

        drop(mr);
        assert_eq!(ctx.deferred_deregistrations(), 1);
        assert_eq!(ctx.inner.deferred.counts(), (1, 1, 0));
        // Still registered, memory intact and reachable through the window.
        let mut out = vec![0u8; 4096];
        ctx.inner.memory.remote_read(pd.id, 77, wkey, addr, &mut out).unwrap();
        assert_eq!(out, pattern);
        assert!(check_sgl(&ctx.inner.memory, pd.id, &[Sge { addr, length: 8, lkey }], false).is_ok());

        // Dropping the handle (stale rkey) still deallocates the window,
        // which lets the region go.
        drop(mw);
        assert_eq!(ctx.deferred_deregistrations(), 0);
        assert_eq!(ctx.inner.deferred.counts(), (1, 0, 1));
        assert_eq!(ctx.inner.memory.remote_read(pd.id, 77, wkey, addr, &mut out), Err(AccessError::InvalidKey));
        assert!(check_sgl(&ctx.inner.memory, pd.id, &[Sge { addr, length: 8, lkey }], false).is_err());
        assert_eq!(ctx.inner.memory.deregister(lkey), Err(RegError::InvalidKey));
    }

    #[test]
    fn a_region_still_held_when_the_device_closes_goes_with_it() {
        let ctx = device();
        let pd = ctx.alloc_pd().unwrap();
        let mr = pd.alloc_mr(1 << 16, ALL).unwrap();
        // A window no handle owns (so nothing keeps the device open) stays bound.
        let mw = ctx.inner.memory.alloc_mw(pd.id, MwType::Type1).unwrap();
        ctx.inner.memory.bind_mw(pd.id, 0, mw, 1, mr.lkey(), mr.addr(), 4096, Access::REMOTE_READ).unwrap();
        drop(mr);
        assert_eq!(ctx.deferred_deregistrations(), 1);
        let weak = std::sync::Arc::downgrade(&ctx.inner);
        drop((pd, ctx));
        assert!(weak.upgrade().is_none(), "the device closed");
    }
}
