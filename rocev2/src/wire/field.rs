//! What every checked header view is made of, in the smoltcp style: the
//! [`view!`] macro and the never-panicking field accessors.
//!
//! Each view wraps a buffer `T: AsRef<[u8]>` (`&[u8]`, `&mut [u8]`,
//! `Vec<u8>`, ...) that starts at its header:
//!
//! - `new_checked` validates the length (and, where the layout depends on
//!   them, the fields that say how long the header is) and returns a typed
//!   [`WireError`](super::error::WireError) otherwise;
//! - `new_unchecked` wraps any buffer; `check_len` validates it later;
//! - field accessors read in place and **never panic**: a field that lies
//!   outside the buffer (possible only with `new_unchecked`, or with an
//!   `AsRef` impl whose length changes) reads as zero;
//! - setters (for `T: AsMut<[u8]>`) write in place; a field outside the
//!   buffer is not written.
//!
//! Semantic checks that do not concern the layout (the IPv4 header checksum,
//! fragments, known opcodes, TVer) belong to the `Repr` parsers, which sit
//! in the same file as their view (`EthernetRepr::parse` beside
//! `EthernetFrame`, and so on) and are built on it.

/// Generates the constructor/accessor boilerplate every view shares.
macro_rules! view {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wrap `buffer` without any check (accessors still never panic).
            #[inline]
            pub const fn new_unchecked(buffer: T) -> $name<T> {
                $name { buffer }
            }

            /// Wrap `buffer` after [`check_len`](Self::check_len) accepts it.
            #[inline]
            pub fn new_checked(buffer: T) -> Result<$name<T>, $crate::wire::error::WireError> {
                let v = $name { buffer };
                v.check_len()?;
                Ok(v)
            }

            /// The wrapped buffer.
            #[inline]
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The bytes this view looks at (the whole buffer).
            #[inline]
            pub fn as_bytes(&self) -> &[u8] {
                self.buffer.as_ref()
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            /// The wrapped buffer, mutable (crate-internal: the setters are the API).
            #[inline]
            pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
                self.buffer.as_mut()
            }
        }
    };
}
pub(crate) use view;

// Never-panicking big-endian field access: reads outside the slice give
// zeros, writes outside it are dropped.

#[inline]
pub(crate) fn rd<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = b.get(off..).and_then(|s| s.get(..N)) {
        a.copy_from_slice(s);
    }
    a
}
#[inline]
pub(crate) fn wr<const N: usize>(b: &mut [u8], off: usize, v: [u8; N]) {
    if let Some(s) = b.get_mut(off..).and_then(|s| s.get_mut(..N)) {
        s.copy_from_slice(&v);
    }
}
#[inline]
pub(crate) fn u8_at(b: &[u8], off: usize) -> u8 {
    b.get(off).copied().unwrap_or(0)
}
#[inline]
pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes(rd(b, off))
}
#[inline]
pub(crate) fn u24_at(b: &[u8], off: usize) -> u32 {
    let [x, y, z] = rd(b, off);
    u32::from_be_bytes([0, x, y, z])
}
#[inline]
pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(rd(b, off))
}
#[inline]
pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_be_bytes(rd(b, off))
}
#[inline]
pub(crate) fn set_u8(b: &mut [u8], off: usize, v: u8) {
    if let Some(x) = b.get_mut(off) {
        *x = v;
    }
}
/// Replace the bits of `mask` in byte `off` with those of `v`.
#[inline]
pub(crate) fn set_bits(b: &mut [u8], off: usize, mask: u8, v: u8) {
    if let Some(x) = b.get_mut(off) {
        *x = (*x & !mask) | (v & mask);
    }
}
#[inline]
pub(crate) fn set_u16(b: &mut [u8], off: usize, v: u16) {
    wr(b, off, v.to_be_bytes());
}
/// Low 24 bits of `v`.
#[inline]
pub(crate) fn set_u24(b: &mut [u8], off: usize, v: u32) {
    let [_, x, y, z] = v.to_be_bytes();
    wr(b, off, [x, y, z]);
}
#[inline]
pub(crate) fn set_u32(b: &mut [u8], off: usize, v: u32) {
    wr(b, off, v.to_be_bytes());
}
#[inline]
pub(crate) fn set_u64(b: &mut [u8], off: usize, v: u64) {
    wr(b, off, v.to_be_bytes());
}
/// `b[from..to]`, or as much of it as exists (never panics).
#[inline]
pub(crate) fn slice(b: &[u8], from: usize, to: usize) -> &[u8] {
    let to = to.min(b.len());
    b.get(from..to).unwrap_or(&[])
}
/// Mutable `b[from..to]`, or as much of it as exists (never panics).
#[inline]
pub(crate) fn slice_mut(b: &mut [u8], from: usize, to: usize) -> &mut [u8] {
    let to = to.min(b.len());
    b.get_mut(from..to).unwrap_or(&mut [])
}
