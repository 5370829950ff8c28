//! Work queue entries: what a posted work request becomes once it sits in a
//! queue (the application-to-datapath ring, the requester's send queue, a
//! receive queue). A hardware NIC copies the WR into a fixed-size WQE slot of
//! the ring; so do these types: the SGEs and inline bytes of an ordinary WR
//! live inside the entry, so posting one needs no heap allocation. Between
//! threads the entries travel boxed: a poster overwrites a reused box in
//! place ([`SendWqe::fill_from`]) and only the pointer moves on, to the
//! engine's send queue and back once the WQE is reaped.
//!
//! [`SendWr`] / [`RecvWr`] (owned, `Vec`-based) and [`SendWrRef`] /
//! [`RecvWrRef`] (borrowed slices, what a C `ibv_send_wr` is translated into)
//! both convert into [`SendWqe`] / [`RecvWqe`].

use core::ops::Deref;

use crate::transport::ids::Sge;
use crate::transport::wr::{Payload, RecvWr, SendFlags, SendOp, SendWr, UdDest};

/// SGEs a send WQE holds in place (more take one heap allocation).
pub const SEND_WQE_SGES: usize = 16;
/// SGEs a receive WQE holds in place (more take one heap allocation).
pub const RECV_WQE_SGES: usize = 8;
/// Inline bytes a send WQE holds in place: urnic's `max_inline_data` (rxe's
/// too, `RXE_MAX_INLINE_DATA`), so every inline WR a device accepts fits.
pub const WQE_INLINE_BYTES: usize = 400;

/// Where a doorbell's drain takes a QP's posted send WQEs from, and what
/// takes back the boxes of the WQEs the engine reaped since the last drain
/// (the application-to-datapath send ring's consumer):
/// [`Engine::drain_posts`](crate::transport::engine::Engine::drain_posts).
pub trait SendSource {
    /// Keep the box of a reaped WQE for a later post.
    fn recycle(&mut self, wqe: Box<SendWqe>);
    /// The next posted WQE, oldest first.
    fn next_wqe(&mut self) -> Option<Box<SendWqe>>;
}

/// Where a doorbell's drain takes a QP's (or an SRQ's) posted receive WQEs
/// from (the application-to-datapath receive ring's consumer): each is lent
/// by reference, oldest first, and copied once, into the engine's receive
/// queue ([`Engine::drain_posts`](crate::transport::engine::Engine::drain_posts)).
pub trait RecvSource {
    /// Hand the next posted WQE to `f`: what `f` returned, or `None` (and
    /// `f` not called) when there is none.
    fn next_recv<R>(&mut self, f: impl FnOnce(&RecvWqe) -> R) -> Option<R>;
}

/// No source (`None`: nothing to lend), or `S`.
impl<S: RecvSource> RecvSource for Option<S> {
    #[inline]
    fn next_recv<R>(&mut self, f: impl FnOnce(&RecvWqe) -> R) -> Option<R> {
        self.as_mut()?.next_recv(f)
    }
}

/// Owned receive WQEs as a [`RecvSource`] (tests, callers without a ring).
pub struct OwnedRecvs<I>(pub I);

impl<I: Iterator<Item = RecvWqe>> RecvSource for OwnedRecvs<I> {
    fn next_recv<R>(&mut self, f: impl FnOnce(&RecvWqe) -> R) -> Option<R> {
        self.0.next().map(|w| f(&w))
    }
}

/// A list of `T` held in place up to `N` elements, on the heap beyond.
/// Equality and hashing are those of the list (storage beyond its length,
/// left over from an earlier list in a reused slot, does not count).
#[derive(Clone, Debug)]
pub enum InlineVec<T: Copy + Default, const N: usize> {
    /// Up to `N` elements in the entry itself.
    Inline {
        /// Elements in use.
        len: u16,
        /// Storage; `buf[..len]` is the list.
        buf: [T; N],
    },
    /// More than `N` elements (or a `Vec` handed over whole).
    Heap(Vec<T>),
}

impl<T: Copy + Default, const N: usize> InlineVec<T, N> {
    /// A copy of `s`: in place if it fits, else one heap allocation.
    pub fn from_slice(s: &[T]) -> Self {
        if s.len() <= N {
            let mut buf = [T::default(); N];
            buf[..s.len()].copy_from_slice(s);
            InlineVec::Inline { len: s.len() as u16, buf }
        } else {
            InlineVec::Heap(s.to_vec())
        }
    }

    /// Take over `v`: copied in place if it fits (the `Vec` is freed), else
    /// kept as it is (no copy, no new allocation).
    pub fn from_vec(v: Vec<T>) -> Self {
        if v.len() <= N {
            Self::from_slice(&v)
        } else {
            InlineVec::Heap(v)
        }
    }

    /// Make the list a copy of `s`, writing only `s`'s elements when it
    /// fits in place (the rest of the storage keeps its old contents, which
    /// nothing reads); else on the heap, in the `Vec` already there if any
    /// (a slot reused by long lists allocates once), as
    /// [`from_slice`](Self::from_slice) otherwise.
    pub fn set_from_slice(&mut self, s: &[T]) {
        match self {
            InlineVec::Inline { len, buf } if s.len() <= N => {
                buf[..s.len()].copy_from_slice(s);
                *len = s.len() as u16;
            }
            InlineVec::Heap(v) if s.len() > N => {
                v.clear();
                v.extend_from_slice(s);
            }
            _ => *self = Self::from_slice(s),
        }
    }

    /// Whether the elements live in place (no heap memory behind them).
    pub fn is_inline(&self) -> bool {
        matches!(self, InlineVec::Inline { .. })
    }
}

impl<T: Copy + Default, const N: usize> Default for InlineVec<T, N> {
    fn default() -> Self {
        InlineVec::Inline { len: 0, buf: [T::default(); N] }
    }
}

impl<T: Copy + Default + PartialEq, const N: usize> PartialEq for InlineVec<T, N> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Copy + Default + Eq, const N: usize> Eq for InlineVec<T, N> {}

impl<T: Copy + Default + core::hash::Hash, const N: usize> core::hash::Hash for InlineVec<T, N> {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl<T: Copy + Default, const N: usize> Deref for InlineVec<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            // `len <= N` by construction; `get` keeps it panic-free anyway.
            InlineVec::Inline { len, buf } => buf.get(..usize::from(*len)).unwrap_or(&[]),
            InlineVec::Heap(v) => v,
        }
    }
}

/// The SGE list of a send WQE.
pub type SendSgl = InlineVec<Sge, SEND_WQE_SGES>;
/// The SGE list of a receive WQE.
pub type RecvSgl = InlineVec<Sge, RECV_WQE_SGES>;
/// The inline data of a send WQE.
pub type InlineData = InlineVec<u8, WQE_INLINE_BYTES>;

/// Where a send WQE's payload comes from (see [`Payload`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WqePayload {
    /// Gathered from registered memory at transmit time.
    Sgl(SendSgl),
    /// Copied at post time (`IBV_SEND_INLINE`).
    Inline(InlineData),
}

impl WqePayload {
    /// Total payload length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            WqePayload::Sgl(s) => s.iter().map(|s| u64::from(s.length)).sum(),
            WqePayload::Inline(d) => d.len() as u64,
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A borrowed payload: [`Payload`] over slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PayloadRef<'a> {
    /// SGEs (gathered at transmit time).
    Sgl(&'a [Sge]),
    /// Inline bytes (copied at post time).
    Inline(&'a [u8]),
}

impl PayloadRef<'_> {
    /// Total payload length in bytes.
    #[inline]
    pub fn len(&self) -> u64 {
        match self {
            PayloadRef::Sgl(s) => s.iter().map(|s| u64::from(s.length)).sum(),
            PayloadRef::Inline(d) => d.len() as u64,
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A send work request over borrowed SGEs / inline bytes: what a post path
/// that must not allocate (the C `ibv_post_send`) builds on its stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SendWrRef<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local data.
    pub payload: PayloadRef<'a>,
    /// `IBV_SEND_*` flags.
    pub flags: SendFlags,
    /// Destination for UD QPs; `None` for connected QPs.
    pub ud: Option<UdDest>,
}

impl SendWr {
    /// This WR over borrowed slices.
    pub fn borrowed(&self) -> SendWrRef<'_> {
        let payload = match &self.payload {
            Payload::Sgl(s) => PayloadRef::Sgl(s),
            Payload::Inline(d) => PayloadRef::Inline(d),
        };
        SendWrRef { wr_id: self.wr_id, op: self.op, payload, flags: self.flags, ud: self.ud }
    }
}

/// A receive work request over a borrowed SGE list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecvWrRef<'a> {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where incoming SEND data is placed.
    pub sgl: &'a [Sge],
}

impl RecvWr {
    /// This WR over a borrowed SGE list.
    pub fn borrowed(&self) -> RecvWrRef<'_> {
        RecvWrRef { wr_id: self.wr_id, sgl: &self.sgl }
    }
}

/// A queued send work request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SendWqe {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local data: source for SEND/WRITE, destination for READ/atomics.
    pub payload: WqePayload,
    /// `IBV_SEND_*` flags.
    pub flags: SendFlags,
    /// Destination for UD QPs; `None` for connected QPs.
    pub ud: Option<UdDest>,
}

impl From<&SendWrRef<'_>> for SendWqe {
    fn from(w: &SendWrRef<'_>) -> SendWqe {
        let payload = match w.payload {
            PayloadRef::Sgl(s) => WqePayload::Sgl(InlineVec::from_slice(s)),
            PayloadRef::Inline(d) => WqePayload::Inline(InlineVec::from_slice(d)),
        };
        SendWqe { wr_id: w.wr_id, op: w.op, payload, flags: w.flags, ud: w.ud }
    }
}

impl SendWqe {
    /// An empty SEND, for a slot about to be filled by [`fill_from`](Self::fill_from).
    pub fn empty() -> SendWqe {
        SendWqe { wr_id: 0, op: SendOp::Send, payload: WqePayload::Sgl(SendSgl::default()), flags: SendFlags::empty(), ud: None }
    }

    /// Overwrite this WQE with `w` in place: only the fields and the SGEs or
    /// inline bytes `w` has are written, not the whole several-hundred-byte
    /// entry (a slot reused for the next post). Equal to `SendWqe::from(w)`.
    pub fn fill_from(&mut self, w: &SendWrRef<'_>) {
        self.wr_id = w.wr_id;
        self.op = w.op;
        self.flags = w.flags;
        self.ud = w.ud;
        match (&mut self.payload, w.payload) {
            (WqePayload::Sgl(v), PayloadRef::Sgl(s)) => v.set_from_slice(s),
            (WqePayload::Inline(v), PayloadRef::Inline(d)) => v.set_from_slice(d),
            (p, PayloadRef::Sgl(s)) => *p = WqePayload::Sgl(InlineVec::from_slice(s)),
            (p, PayloadRef::Inline(d)) => *p = WqePayload::Inline(InlineVec::from_slice(d)),
        }
    }
}

impl From<SendWrRef<'_>> for SendWqe {
    fn from(w: SendWrRef<'_>) -> SendWqe {
        SendWqe::from(&w)
    }
}

impl From<SendWr> for SendWqe {
    fn from(w: SendWr) -> SendWqe {
        let payload = match w.payload {
            Payload::Sgl(s) => WqePayload::Sgl(InlineVec::from_vec(s)),
            Payload::Inline(d) => WqePayload::Inline(InlineVec::from_vec(d)),
        };
        SendWqe { wr_id: w.wr_id, op: w.op, payload, flags: w.flags, ud: w.ud }
    }
}

impl From<&SendWr> for SendWqe {
    fn from(w: &SendWr) -> SendWqe {
        SendWqe::from(&w.borrowed())
    }
}

/// A queued receive work request.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct RecvWqe {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where incoming SEND data is placed.
    pub sgl: RecvSgl,
}

impl RecvWqe {
    /// Overwrite this WQE with `w` in place: the `wr_id` and only the SGEs
    /// `w` has (a ring slot reused for the next post, not a new WQE whose
    /// eight SGEs are zero-filled first). Equal to `RecvWqe::from(w)`.
    #[inline]
    pub fn fill_from(&mut self, w: &RecvWrRef<'_>) {
        self.wr_id = w.wr_id;
        self.sgl.set_from_slice(w.sgl);
    }
}

impl From<&RecvWrRef<'_>> for RecvWqe {
    fn from(w: &RecvWrRef<'_>) -> RecvWqe {
        RecvWqe { wr_id: w.wr_id, sgl: InlineVec::from_slice(w.sgl) }
    }
}

/// A copy of a WQE lent (a receive queue's copy of a ring slot).
impl From<&RecvWqe> for RecvWqe {
    #[inline]
    fn from(w: &RecvWqe) -> RecvWqe {
        w.clone()
    }
}

impl From<RecvWrRef<'_>> for RecvWqe {
    fn from(w: RecvWrRef<'_>) -> RecvWqe {
        RecvWqe::from(&w)
    }
}

impl From<RecvWr> for RecvWqe {
    fn from(w: RecvWr) -> RecvWqe {
        RecvWqe { wr_id: w.wr_id, sgl: InlineVec::from_vec(w.sgl) }
    }
}

impl From<&RecvWr> for RecvWqe {
    fn from(w: &RecvWr) -> RecvWqe {
        RecvWqe::from(&w.borrowed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(i: u64) -> Sge {
        Sge { addr: 0x1000 * i, length: 8, lkey: 0x100 }
    }

    #[test]
    fn small_lists_stay_in_place_and_large_ones_keep_their_vec() {
        let few: Vec<Sge> = (0..SEND_WQE_SGES as u64).map(sge).collect();
        let many: Vec<Sge> = (0..SEND_WQE_SGES as u64 + 1).map(sge).collect();
        let a = SendSgl::from_slice(&few);
        assert!(a.is_inline());
        assert_eq!(&*a, &few[..]);
        let moved = many.clone();
        let p = moved.as_ptr();
        let b = SendSgl::from_vec(moved);
        assert!(!b.is_inline());
        assert_eq!(&*b, &many[..]);
        assert_eq!(b.as_ptr(), p, "a Vec too long to fit is moved, not copied");
        assert!(RecvSgl::default().is_empty());
    }

    #[test]
    fn a_slot_filled_in_place_equals_a_new_wqe() {
        let sges: Vec<Sge> = (0..3).map(sge).collect();
        let many: Vec<Sge> = (0..SEND_WQE_SGES as u64 + 2).map(sge).collect();
        let bytes = [7u8; 40];
        let av = crate::transport::attr::AddressVector { sgid: [1; 16], dgid: [2; 16], hop_limit: 64, ..crate::transport::qp::UNUSED_PATH };
        let ud = UdDest { av, remote_qpn: 5, remote_qkey: 6 };
        let wrs = [
            SendWrRef { wr_id: 1, op: SendOp::Send, payload: PayloadRef::Sgl(&sges), flags: SendFlags::SIGNALED, ud: None },
            SendWrRef { wr_id: 2, op: SendOp::Send, payload: PayloadRef::Sgl(&sges[..1]), flags: SendFlags::empty(), ud: Some(ud) },
            SendWrRef { wr_id: 3, op: SendOp::Send, payload: PayloadRef::Inline(&bytes), flags: SendFlags::INLINE, ud: None },
            SendWrRef { wr_id: 4, op: SendOp::Send, payload: PayloadRef::Inline(&bytes[..3]), flags: SendFlags::INLINE, ud: None },
            SendWrRef { wr_id: 5, op: SendOp::Send, payload: PayloadRef::Sgl(&many), flags: SendFlags::empty(), ud: None },
            SendWrRef { wr_id: 6, op: SendOp::Send, payload: PayloadRef::Sgl(&[]), flags: SendFlags::empty(), ud: None },
            SendWrRef { wr_id: 7, op: SendOp::Send, payload: PayloadRef::Sgl(&sges[..2]), flags: SendFlags::empty(), ud: None },
        ];
        // One slot reused for each WR in turn (every change of payload kind
        // and length, in place and on the heap) reads as a new WQE would.
        let mut slot = SendWqe::empty();
        for w in &wrs {
            slot.fill_from(w);
            assert_eq!(slot, SendWqe::from(w), "WR {}", w.wr_id);
        }
    }

    #[test]
    fn owned_and_borrowed_wrs_make_the_same_wqe() {
        let wr =
            SendWr { wr_id: 7, op: SendOp::Send, payload: Payload::Inline(vec![1, 2, 3]), flags: SendFlags::INLINE | SendFlags::SIGNALED, ud: None };
        let a = SendWqe::from(&wr);
        let b = SendWqe::from(wr.clone());
        assert_eq!(a, b);
        assert_eq!(a.payload.len(), 3);
        let rwr = RecvWr { wr_id: 9, sgl: vec![sge(1), sge(2)] };
        assert_eq!(RecvWqe::from(&rwr), RecvWqe::from(rwr.clone()));
        assert_eq!(&*RecvWqe::from(rwr).sgl, &[sge(1), sge(2)]);
    }

    #[test]
    fn a_receive_slot_filled_in_place_equals_a_new_wqe() {
        let many: Vec<Sge> = (0..RECV_WQE_SGES as u64 + 3).map(sge).collect();
        // Every change of length: in place, on the heap (shorter and longer
        // there), back in place, empty.
        let lens = [3, 1, RECV_WQE_SGES, RECV_WQE_SGES + 3, RECV_WQE_SGES + 1, RECV_WQE_SGES + 2, 2, RECV_WQE_SGES + 1, 0, 4];
        let mut slot = RecvWqe::default();
        for (id, n) in lens.into_iter().enumerate() {
            let w = RecvWrRef { wr_id: id as u64, sgl: &many[..n] };
            slot.fill_from(&w);
            assert_eq!(slot, RecvWqe::from(&w), "{n} SGEs");
            assert_eq!(slot.sgl.is_inline(), n <= RECV_WQE_SGES);
        }
    }
}
