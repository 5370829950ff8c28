//! Unit tests of the memory table.
use super::*;
use crate::transport::ids::Sge;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const PD: PdId = PdId(1);
const OTHER_PD: PdId = PdId(2);
const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE).union(Access::REMOTE_READ).union(Access::REMOTE_ATOMIC).union(Access::MW_BIND);

/// Heap memory for a test region, 8-byte aligned.
struct Buf(Vec<u64>);

impl Buf {
    fn new(len: usize) -> Buf {
        Buf(vec![0u64; len.div_ceil(8)])
    }
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr().cast()
    }
    fn bytes(&self) -> Vec<u8> {
        self.0.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }
}

fn reg(t: &MemoryTable, buf: &mut Buf, iova: u64, access: Access) -> MrKeys {
    let len = buf.0.len() * 8;
    // SAFETY: every test keeps `buf` alive past the table's last use of it.
    unsafe { t.register(PD, buf.ptr(), len, iova, access) }.unwrap()
}

#[test]
fn keys_follow_ibverbs_convention() {
    let t = MemoryTable::new();
    let mut b1 = Buf::new(64);
    let mut b2 = Buf::new(64);
    let k1 = reg(&t, &mut b1, 0x1000, ALL);
    let k2 = reg(&t, &mut b2, 0x2000, ALL);
    assert_eq!(k1.lkey, k1.rkey);
    assert_ne!(k1.lkey >> 8, 0, "index 0 is never used");
    assert_ne!(k1.lkey >> 8, k2.lkey >> 8);
    let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
    assert_ne!(mw >> 8, k1.lkey >> 8);
    assert_ne!(mw >> 8, k2.lkey >> 8);
    // A key with the right index and a wrong key byte is refused.
    let wrong = (k1.rkey & !0xff) | ((k1.rkey as u8).wrapping_add(1) as u32);
    assert_eq!(t.remote_check(PD, 1, wrong, 0x1000, 8, Access::REMOTE_READ), Err(AccessError::InvalidKey));
    assert_eq!(t.remote_check(PD, 1, 0, 0x1000, 8, Access::REMOTE_READ), Err(AccessError::InvalidKey));
    assert_eq!(t.remote_check(PD, 1, 0xffff_ff00, 0, 0, Access::empty()), Err(AccessError::InvalidKey));
}

#[test]
fn registration_arguments_are_checked() {
    let t = MemoryTable::new();
    let mut b = Buf::new(16);
    // SAFETY: invalid arguments are refused before anything is stored.
    unsafe {
        assert_eq!(t.register(PD, std::ptr::null_mut(), 16, 0, ALL), Err(RegError::InvalidArgument));
        assert_eq!(t.register(PD, b.ptr(), 16, u64::MAX - 4, ALL), Err(RegError::InvalidArgument));
        assert_eq!(t.register(PD, b.ptr(), 16, 0, Access::REMOTE_WRITE), Err(RegError::InvalidArgument));
        assert_eq!(t.register(PD, b.ptr(), 16, 0, Access::REMOTE_ATOMIC), Err(RegError::InvalidArgument));
        // ZERO_BASED ignores the IOVA, so a huge IOVA is fine.
        assert!(t.register(PD, b.ptr(), 16, u64::MAX - 4, Access::ZERO_BASED | Access::REMOTE_READ).is_ok());
    }
    let small = MemoryTable::with_max_entries(2);
    reg(&small, &mut b, 0, ALL);
    small.alloc_mw(PD, MwType::Type1).unwrap();
    assert_eq!(small.alloc_mw(PD, MwType::Type1), Err(RegError::NoResources));
}

#[test]
fn remote_write_read_and_bounds() {
    let t = MemoryTable::new();
    let mut b = Buf::new(64);
    let k = reg(&t, &mut b, 0x10_000, ALL);
    t.remote_write(PD, 1, k.rkey, 0x10_008, b"hello").unwrap();
    let mut out = [0u8; 5];
    t.remote_read(PD, 1, k.rkey, 0x10_008, &mut out).unwrap();
    assert_eq!(&out, b"hello");
    assert_eq!(&b.bytes()[8..13], b"hello");
    // Last byte in, one past out.
    t.remote_write(PD, 1, k.rkey, 0x10_03f, b"z").unwrap();
    assert_eq!(t.remote_write(PD, 1, k.rkey, 0x10_03f, b"zz"), Err(AccessError::OutOfBounds));
    assert_eq!(t.remote_write(PD, 1, k.rkey, 0xffff, b"z"), Err(AccessError::OutOfBounds));
    assert_eq!(t.remote_check(PD, 1, k.rkey, 0x10_040, 1, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
    assert_eq!(t.remote_check(PD, 1, k.rkey, 0x10_040, 0, Access::REMOTE_READ), Ok(()));
    assert_eq!(t.remote_check(PD, 1, k.rkey, 0x10_000, 64, Access::REMOTE_READ), Ok(()));
    assert_eq!(t.remote_check(PD, 1, k.rkey, 0x10_000, 65, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
}

#[test]
fn bounds_arithmetic_never_overflows() {
    let t = MemoryTable::new();
    let mut b = Buf::new(64);
    // The highest region possible: [2^64 - 65, 2^64 - 1).
    let k = reg(&t, &mut b, u64::MAX - 64, ALL);
    assert_eq!(t.remote_check(PD, 1, k.rkey, u64::MAX - 64, 64, Access::REMOTE_READ), Ok(()));
    assert_eq!(t.remote_check(PD, 1, k.rkey, u64::MAX - 1, 1, Access::REMOTE_READ), Ok(()));
    assert_eq!(t.remote_check(PD, 1, k.rkey, u64::MAX - 1, 2, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
    assert_eq!(t.remote_check(PD, 1, k.rkey, u64::MAX, 1, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
    assert_eq!(t.remote_check(PD, 1, k.rkey, u64::MAX - 64, u64::MAX, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
    assert_eq!(t.remote_check(PD, 1, k.rkey, 0, u64::MAX, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
    let sgl = [Sge { addr: u64::MAX - 8, length: 16, lkey: k.lkey }];
    assert_eq!(t.local_scatter(PD, &sgl, 0, &[1; 16]), Err(AccessError::OutOfBounds));
    assert_eq!(t.local_gather(PD, &sgl, u64::MAX, &mut [0; 2]), Err(AccessError::OutOfBounds));
    assert!(b.bytes().iter().all(|&x| x == 0));
}

#[test]
fn pd_and_access_flags_are_enforced() {
    let t = MemoryTable::new();
    let mut b = Buf::new(64);
    let ro = reg(&t, &mut b, 0, Access::REMOTE_READ);
    assert_eq!(t.remote_write(PD, 1, ro.rkey, 0, b"x"), Err(AccessError::AccessDenied));
    assert_eq!(t.remote_atomic(PD, 1, ro.rkey, 0, AtomicOp::FetchAdd { add: 1 }), Err(AccessError::AccessDenied));
    assert_eq!(t.remote_read(OTHER_PD, 1, ro.rkey, 0, &mut [0; 1]), Err(AccessError::PdMismatch));
    // Local scatter needs LOCAL_WRITE, gather does not.
    let sgl = [Sge { addr: 0, length: 8, lkey: ro.lkey }];
    assert_eq!(t.local_scatter(PD, &sgl, 0, &[1; 8]), Err(AccessError::AccessDenied));
    t.local_gather(PD, &sgl, 0, &mut [0; 8]).unwrap();
    assert_eq!(t.local_check(PD, &sgl, Access::LOCAL_WRITE), Err(AccessError::AccessDenied));
    assert_eq!(t.local_check(OTHER_PD, &sgl, Access::empty()), Err(AccessError::PdMismatch));
    let wr = reg(&t, &mut b, 0, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    assert_eq!(t.remote_read(PD, 1, wr.rkey, 0, &mut [0; 1]), Err(AccessError::AccessDenied));
    t.remote_write(PD, 1, wr.rkey, 0, b"x").unwrap();
    assert_eq!(b.bytes()[0], b'x');
}

#[test]
fn zero_based_regions_use_offsets() {
    let t = MemoryTable::new();
    let mut b = Buf::new(32);
    let k = reg(&t, &mut b, 0xdead_0000, ALL | Access::ZERO_BASED);
    t.remote_write(PD, 1, k.rkey, 4, b"abcd").unwrap();
    assert_eq!(&b.bytes()[4..8], b"abcd");
    assert_eq!(t.remote_check(PD, 1, k.rkey, 0xdead_0000, 1, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
    let sgl = [Sge { addr: 30, length: 2, lkey: k.lkey }];
    t.local_scatter(PD, &sgl, 0, b"yz").unwrap();
    assert_eq!(&b.bytes()[30..32], b"yz");
}

#[test]
fn local_check_sgl_names_the_first_refused_sge_and_agrees_with_the_movers() {
    let t = MemoryTable::new();
    let (mut a, mut z) = (Buf::new(64), Buf::new(64));
    let ka = reg(&t, &mut a, 0x4000, ALL);
    let kz = reg(&t, &mut z, 0x9000, ALL | Access::ZERO_BASED);
    let ro = reg(&t, &mut a, 0x8000, Access::REMOTE_READ);
    let cases: Vec<(Sge, Access, Option<AccessError>)> = vec![
        (Sge { addr: 0x4000, length: 64, lkey: ka.lkey }, Access::LOCAL_WRITE, None),
        (Sge { addr: 0x4001, length: 64, lkey: ka.lkey }, Access::empty(), Some(AccessError::OutOfBounds)),
        (Sge { addr: 0x3fff, length: 1, lkey: ka.lkey }, Access::empty(), Some(AccessError::OutOfBounds)),
        // ZERO_BASED: offsets from 0, never the IOVA given at registration.
        (Sge { addr: 0, length: 64, lkey: kz.lkey }, Access::LOCAL_WRITE, None),
        (Sge { addr: 60, length: 4, lkey: kz.lkey }, Access::empty(), None),
        (Sge { addr: 61, length: 4, lkey: kz.lkey }, Access::empty(), Some(AccessError::OutOfBounds)),
        (Sge { addr: 0x9000, length: 4, lkey: kz.lkey }, Access::empty(), Some(AccessError::OutOfBounds)),
        (Sge { addr: u64::MAX, length: 4, lkey: kz.lkey }, Access::empty(), Some(AccessError::OutOfBounds)),
        (Sge { addr: 0x8000, length: 8, lkey: ro.lkey }, Access::LOCAL_WRITE, Some(AccessError::AccessDenied)),
        (Sge { addr: 0x8000, length: 8, lkey: ro.lkey ^ 0x80 }, Access::empty(), Some(AccessError::InvalidKey)),
    ];
    for (sge, needed, want) in cases {
        let got = t.local_check_sgl(PD, &[sge], needed);
        assert_eq!(got.err().map(|e| e.error), want, "{sge:?} {needed:?}");
        // The movers decide the same way.
        let len = sge.length as usize;
        let moved = if needed.contains(Access::LOCAL_WRITE) {
            t.local_scatter(PD, &[sge], 0, &vec![0; len])
        } else {
            t.local_gather(PD, &[sge], 0, &mut vec![0; len])
        };
        assert_eq!(moved.err(), want, "{sge:?} {needed:?}");
    }
    // The index counts zero-length SGEs, which are skipped.
    let sgl = [
        Sge { addr: 0, length: 8, lkey: kz.lkey },
        Sge { addr: 0, length: 0, lkey: 0 },
        Sge { addr: 0x4000, length: 8, lkey: ka.lkey },
        Sge { addr: 0x4000, length: 8, lkey: kz.lkey },
    ];
    let e = t.local_check_sgl(PD, &sgl, Access::empty()).unwrap_err();
    assert_eq!(e, SgeError { index: 3, sge: sgl[3], error: AccessError::OutOfBounds });
    assert_eq!(e.to_string(), format!("sge[3] (addr 0x4000, length 8, lkey {:#x}): the range lies outside the region or window", kz.lkey));
    assert_eq!(t.local_check(PD, &sgl, Access::empty()), Err(AccessError::OutOfBounds));
    assert_eq!(t.local_check_sgl(OTHER_PD, &sgl[1..3], Access::empty()).unwrap_err().index, 1);
}

#[test]
fn sge_lists_scatter_and_gather_across_elements() {
    let t = MemoryTable::new();
    let mut b = Buf::new(64);
    let k = reg(&t, &mut b, 0x1000, ALL);
    let sgl = [
        Sge { addr: 0x1000, length: 3, lkey: k.lkey },
        Sge { addr: 0x1000, length: 0, lkey: 0xbad }, // zero-length: ignored
        Sge { addr: 0x1020, length: 4, lkey: k.lkey },
        Sge { addr: 0x1030, length: 2, lkey: k.lkey },
    ];
    assert_eq!(sgl_len(&sgl), 9);
    t.local_scatter(PD, &sgl, 0, b"abcdefghi").unwrap();
    let bytes = b.bytes();
    assert_eq!(&bytes[0..3], b"abc");
    assert_eq!(&bytes[0x20..0x24], b"defg");
    assert_eq!(&bytes[0x30..0x32], b"hi");
    let mut out = [0u8; 5];
    t.local_gather(PD, &sgl, 2, &mut out).unwrap();
    assert_eq!(&out, b"cdefg");
    // Running offsets: scatter the next piece at offset 7.
    t.local_scatter(PD, &sgl, 7, b"XY").unwrap();
    assert_eq!(&b.bytes()[0x30..0x32], b"XY");
    // Past the end: refused, nothing written.
    assert_eq!(t.local_scatter(PD, &sgl, 8, b"12"), Err(AccessError::OutOfBounds));
    assert_eq!(&b.bytes()[0x31..0x32], b"Y");
    // A bad SGE after good ones: refused before the good ones are written.
    let bad = [Sge { addr: 0x1000, length: 4, lkey: k.lkey }, Sge { addr: 0x1000, length: 4, lkey: k.lkey ^ 1 }];
    assert_eq!(t.local_scatter(PD, &bad, 0, b"12345678"), Err(AccessError::InvalidKey));
    assert_eq!(&b.bytes()[0..3], b"abc");
    assert_eq!(t.local_check(PD, &bad, Access::empty()), Err(AccessError::InvalidKey));
}

#[test]
fn a_gather_continues_a_header_lane_as_it_continues_the_finished_crc() {
    use crate::wire::crc;
    let t = MemoryTable::new();
    let mut b = Buf::new(8192);
    let k = reg(&t, &mut b, 0x10_000, ALL);
    let fill: Vec<u8> = (0..8192u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    t.local_scatter(PD, &[Sge { addr: 0x10_000, length: 8192, lkey: k.lkey }], 0, &fill).unwrap();
    let header: Vec<u8> = (0..56u8).map(|i| i.wrapping_mul(37)).collect();
    let mask = [0u8; crc::SHORT_MAX];
    let Some(lane) = crc::update_masked_lane(!0, &header, &mask) else {
        eprintln!("this CPU has no PCLMULQDQ/SSSE3/SSE4.1: no lanes to continue");
        return;
    };
    let head = lane.finish();
    // One SGE, several (the first short or long enough for the fused copy), offsets inside them.
    let lists: [&[(u64, u32)]; 4] = [&[(0, 4096)], &[(100, 1024), (3000, 2000)], &[(7, 300), (5000, 1500), (64, 2048)], &[(1, 1)]];
    for list in lists {
        let sgl: Vec<Sge> = list.iter().map(|&(at, length)| Sge { addr: 0x10_000 + at, length, lkey: k.lkey }).collect();
        let total = sgl_len(&sgl) as usize;
        for (offset, len) in [(0, total), (0, total.min(1024)), (1, total - 1), (total as u64 / 3, total - total / 3), (0, 0)] {
            let mut want = vec![0u8; len];
            let want_crc = t.local_gather_crc(PD, &sgl, offset, &mut want, head).unwrap();
            let mut got = vec![0u8; len];
            let got_crc = t.local_gather_crc_lane(PD, &sgl, offset, &mut got, lane).unwrap();
            assert_eq!(got, want, "{list:?} offset {offset} len {len}");
            assert_eq!(got_crc, want_crc, "{list:?} offset {offset} len {len}");
            let mut h = crc32fast::Hasher::new_with_initial(head);
            h.update(&want);
            assert_eq!(want_crc, h.finalize());
        }
    }
    // A refused gather is refused the same way.
    let bad = [Sge { addr: 0x10_000, length: 4, lkey: k.lkey ^ 1 }];
    assert_eq!(t.local_gather_crc_lane(PD, &bad, 0, &mut [0; 4], lane), Err(AccessError::InvalidKey));
    // A READ response's payload (remote key) continues the lane as it
    // continues the finished CRC: lengths either side of the fused copy's
    // minimum, of whole lanes and of the 4096-byte MTU, odd starts.
    for (at, len) in [(0, 0), (3, 1), (0, 511), (1, 512), (16, 1024), (5, 1040), (0, 4096), (2, 4096), (9, 4097), (100, 5000)] {
        let mut want = vec![0u8; len];
        let want_crc = t.remote_read_crc(PD, 1, k.rkey, 0x10_000 + at, &mut want, head).unwrap();
        let mut got = vec![0u8; len];
        let got_crc = t.remote_read_crc_lane(PD, 1, k.rkey, 0x10_000 + at, &mut got, lane).unwrap();
        assert_eq!(got, want, "at {at} len {len}");
        assert_eq!(got, fill[at as usize..at as usize + len], "at {at} len {len}");
        assert_eq!(got_crc, want_crc, "at {at} len {len}");
        let mut h = crc32fast::Hasher::new_with_initial(head);
        h.update(&want);
        assert_eq!(want_crc, h.finalize(), "at {at} len {len}");
    }
    // Refused as remote_read refuses: a wrong key, a range beyond the region.
    assert_eq!(t.remote_read_crc_lane(PD, 1, k.rkey ^ 1, 0x10_000, &mut [0; 4], lane), Err(AccessError::InvalidKey));
    assert_eq!(
        t.remote_read_crc_lane(PD, 1, k.rkey, 0x10_000 + 8190, &mut [0; 4], lane),
        t.remote_read(PD, 1, k.rkey, 0x10_000 + 8190, &mut [0; 4]).map(|_| 0)
    );
    assert!(t.remote_read_crc_lane(PD, 1, k.rkey, 0x10_000 + 8190, &mut [0; 4], lane).is_err());
}

#[test]
fn reregister_and_deregister_make_old_keys_stale() {
    let t = MemoryTable::new();
    let mut b = Buf::new(64);
    let k1 = reg(&t, &mut b, 0x1000, ALL);
    // SAFETY: `b` outlives the table's use.
    let k2 = unsafe { t.reregister(k1.lkey, PD, b.ptr(), 64, 0x2000, ALL) }.unwrap();
    assert_eq!(k1.lkey >> 8, k2.lkey >> 8, "re-registration keeps the index");
    assert_ne!(k1.lkey, k2.lkey, "and changes the key byte");
    assert_eq!(t.remote_write(PD, 1, k1.rkey, 0x1000, b"x"), Err(AccessError::InvalidKey));
    t.remote_write(PD, 1, k2.rkey, 0x2000, b"x").unwrap();
    assert_eq!(t.deregister(k1.lkey), Err(RegError::InvalidKey));
    t.deregister(k2.lkey).unwrap();
    assert_eq!(t.remote_write(PD, 1, k2.rkey, 0x2000, b"y"), Err(AccessError::InvalidKey));
    assert_eq!(t.deregister(k2.lkey), Err(RegError::InvalidKey));
    // The index is reused with another key byte.
    let k3 = reg(&t, &mut b, 0x2000, ALL);
    assert_ne!(k3.lkey, k2.lkey);
    assert_eq!(t.remote_write(PD, 1, k2.rkey, 0x2000, b"y"), Err(AccessError::InvalidKey));
    assert_eq!(b.bytes()[0], b'x');
    // Kind mismatches.
    let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
    assert_eq!(t.deregister(mw), Err(RegError::InvalidArgument));
    assert_eq!(t.dealloc_mw(k3.lkey), Err(RegError::InvalidArgument));
}

#[test]
fn atomics_check_alignment_and_return_original() {
    let t = MemoryTable::new();
    let mut b = Buf::new(32);
    let k = reg(&t, &mut b, 0x1000, ALL);
    assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1004, AtomicOp::FetchAdd { add: 1 }), Err(AccessError::Misaligned));
    assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1020, AtomicOp::FetchAdd { add: 1 }), Err(AccessError::OutOfBounds));
    assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1008, AtomicOp::FetchAdd { add: 5 }), Ok(0));
    assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1008, AtomicOp::FetchAdd { add: u64::MAX }), Ok(5));
    assert_eq!(b.0[1], 4, "fetch-add wraps");
    assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1008, AtomicOp::CmpSwap { compare: 3, swap: 9 }), Ok(4));
    assert_eq!(b.0[1], 4, "compare failed: unchanged");
    assert_eq!(t.remote_atomic(PD, 1, k.rkey, 0x1008, AtomicOp::CmpSwap { compare: 4, swap: 9 }), Ok(4));
    assert_eq!(b.0[1], 9);
    // An aligned VA over a misaligned host address is refused too.
    let mut raw = Buf::new(32);
    // SAFETY: `raw` outlives the table's use.
    let k2 = unsafe { t.register(PD, raw.ptr().add(4), 16, 0x8000, ALL) }.unwrap();
    assert_eq!(t.remote_atomic(PD, 1, k2.rkey, 0x8000, AtomicOp::FetchAdd { add: 1 }), Err(AccessError::Misaligned));
    assert!(raw.bytes().iter().all(|&x| x == 0));
}

#[test]
fn concurrent_atomics_from_two_threads_sum_exactly() {
    let t = Arc::new(MemoryTable::new());
    let mut b = Buf::new(8);
    let k = reg(&t, &mut b, 0x1000, ALL);
    const N: u64 = if cfg!(miri) { 200 } else { 50_000 };
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let t = Arc::clone(&t);
            std::thread::spawn(move || {
                for _ in 0..N {
                    t.remote_atomic(PD, i, k.rkey, 0x1000, AtomicOp::FetchAdd { add: 1 }).unwrap();
                }
                // A CAS loop on top: exact increments too. Each failed CAS
                // returns the value it found, the next one's guess, as a
                // requester's loop would (a READ of the word racing the
                // other thread's atomics is the overlap the verbs leave
                // undefined: see `dma`'s module doc).
                let mut guess = 0;
                for _ in 0..N {
                    loop {
                        let op = AtomicOp::CmpSwap { compare: guess, swap: guess + 1 };
                        let found = t.remote_atomic(PD, i, k.rkey, 0x1000, op).unwrap();
                        if found == guess {
                            guess += 1;
                            break;
                        }
                        guess = found;
                    }
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    assert_eq!(b.0[0], 4 * N);
}

/// Deregister `k` from one thread while `hold` runs on another: `hold` takes
/// what it holds, calls `pause` (which returns once the deregistration has
/// been seen still waiting), then lets go; the deregistration must return
/// only after that, and the key fail afterwards.
fn assert_deregistration_waits_for(t: &Arc<MemoryTable>, k: MrKeys, what: &str, hold: impl FnOnce(&MemoryTable, &dyn Fn()) + Send + 'static) {
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let t2 = Arc::clone(t);
    let mover = std::thread::spawn(move || {
        hold(&t2, &|| {
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        })
    });
    held_rx.recv().unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (t3, done2) = (Arc::clone(t), Arc::clone(&done));
    let dereg = std::thread::spawn(move || {
        t3.deregister(k.lkey).unwrap();
        done2.store(true, Ordering::SeqCst);
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!done.load(Ordering::SeqCst), "deregister returned while {what} held the region");
    release_tx.send(()).unwrap();
    mover.join().unwrap();
    dereg.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    assert_eq!(t.remote_write(PD, 1, k.rkey, 0x1000, b"x"), Err(AccessError::InvalidKey));
}

#[test]
fn deregistration_waits_for_an_in_flight_mover() {
    let t = Arc::new(MemoryTable::new());
    let mut b = Buf::new(64);
    let k = reg(&t, &mut b, 0x1000, ALL);
    // A mover holding the read guard, as `remote_write` does while copying.
    assert_deregistration_waits_for(&t, k, "a mover", move |t, pause| {
        let guard = t.read();
        assert!(guard.resolve_remote(PD, 1, k.rkey, 0x1000, 8, Access::REMOTE_WRITE).is_ok());
        pause();
        drop(guard);
    });
}

/// A batch that has moved data holds the table until it ends: a
/// deregistration from another thread waits for the batch, not only for
/// the copy.
#[test]
fn deregistration_waits_for_a_batch() {
    let t = Arc::new(MemoryTable::new());
    let mut b = Buf::new(64);
    let k = reg(&t, &mut b, 0x1000, ALL);
    assert_deregistration_waits_for(&t, k, "a batch", move |t, pause| {
        let batch = t.batch();
        t.remote_write(PD, 1, k.rkey, 0x1000, b"a").unwrap();
        pause();
        // Still inside the batch: the region is still there.
        t.remote_write(PD, 1, k.rkey, 0x1001, b"b").unwrap();
        drop(batch);
    });
    assert_eq!(&b.bytes()[..2], b"ab");
}

/// Deregistration against traffic in batches: movers on three threads
/// write, read and gather through whatever region is current, in batches of
/// 16 copies (one also invalidating and re-binding a window inside its
/// batches, a write on a batch's thread); the main thread registers a fresh
/// buffer, lets the traffic run, deregisters it and checks that no byte of
/// it changes afterwards, then frees it. A mover that copied after the
/// deregistration returned would change the snapshot (or write to freed
/// memory, which the allocator's reuse of the next buffer would show).
///
/// Each mover keeps to its own 80 bytes of the region: movers racing each
/// other on the same bytes is the overlap the verbs leave undefined (`dma`'s
/// module doc), and without it Miri (`deploy/miri.sh`) checks what this test
/// is about: every copy happens before the deregistration returns.
#[test]
fn deregistration_races_batched_traffic() {
    use std::sync::atomic::{AtomicBool, AtomicU32};
    const LEN: usize = 256;
    const LANE: u64 = 80;
    let t = Arc::new(MemoryTable::new());
    let current = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let moved = Arc::new(AtomicU64::new(0));
    let movers: Vec<_> = (0..3u8)
        .map(|m| {
            let (t, current, stop, moved) = (t.clone(), current.clone(), stop.clone(), moved.clone());
            std::thread::spawn(move || {
                let mut win = Buf::new(64);
                let own = reg(&t, &mut win, 0, ALL);
                let mut mw = t.alloc_mw(PD, MwType::Type2).unwrap();
                let mut out = [0u8; 32];
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _batch = t.batch();
                    for _ in 0..16 {
                        let k = current.load(Ordering::Acquire);
                        i += 1;
                        let at = 0x10_000 + u64::from(m) * LANE + i % (LANE - 32);
                        let fill = [m.wrapping_add(i as u8) | 1; 32];
                        if t.remote_write(PD, 1, k, at, &fill).is_ok() {
                            moved.fetch_add(1, Ordering::Relaxed);
                        }
                        let _ = t.remote_read(PD, 1, k, at, &mut out);
                        let sge = Sge { addr: at, length: 32, lkey: k };
                        let _ = t.local_gather(PD, &[sge], 0, &mut out);
                        if m == 0 && i.is_multiple_of(8) {
                            // A write inside the batch: bind a type-2 window
                            // over this thread's own region, then invalidate it.
                            mw = t.bind_mw(PD, 7, mw, (mw as u8).wrapping_add(1), own.lkey, 0, 64, Access::REMOTE_READ).unwrap();
                            t.invalidate(PD, 7, mw).unwrap();
                        }
                    }
                }
                t.dealloc_mw(mw).unwrap();
                t.deregister(own.lkey).unwrap();
                drop(win);
            })
        })
        .collect();
    for round in 0..if cfg!(miri) { 8 } else { 200 } {
        let mut b = Buf::new(LEN);
        let k = reg(&t, &mut b, 0x10_000, ALL);
        current.store(k.rkey, Ordering::Release);
        let before = moved.load(Ordering::Relaxed);
        while moved.load(Ordering::Relaxed) < before + 4 {
            std::thread::yield_now();
        }
        t.deregister(k.lkey).unwrap();
        let snapshot = b.bytes();
        for _ in 0..20 {
            std::thread::yield_now();
        }
        assert_eq!(b.bytes(), snapshot, "round {round}: a byte changed after deregister returned");
        assert!(snapshot.iter().any(|&x| x != 0), "round {round}: the traffic reached the region");
        drop(b);
    }
    stop.store(true, Ordering::Relaxed);
    for m in movers {
        m.join().unwrap();
    }
}

/// A send queue's memo of a resolved local key
/// ([`MemoryTable::local_gather_crc_lane_memo`]) gives what the checker's
/// gather gives, and never outlives a registration change: after a
/// deregistration and a registration of another buffer under the same key the
/// memo's next gather reads the new buffer; after a
/// deregistration it is refused as the checker refuses it; a deregistration
/// waits for a batch that gathered through the memo.
#[test]
fn a_gather_memo_gives_the_checkers_bytes_and_follows_registration_changes() {
    use crate::wire::crc;
    let mask = [0u8; crc::SHORT_MAX];
    let Some(lane) = crc::update_masked_lane(!0, &[0x5a; 56], &mask) else {
        eprintln!("this CPU has no PCLMULQDQ/SSSE3/SSE4.1: no lanes to continue");
        return;
    };
    let t = Arc::new(MemoryTable::new());
    let mut b = Buf::new(8192);
    let k = reg(&t, &mut b, 0x10_000, ALL);
    let fill: Vec<u8> = (0..8192u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    t.local_scatter(PD, &[Sge { addr: 0x10_000, length: 8192, lkey: k.lkey }], 0, &fill).unwrap();
    let mut memo = GatherMemo::default();
    let gather = |t: &MemoryTable, memo: &mut GatherMemo, sgl: &[Sge], offset: u64, len: usize| {
        let mut want = vec![0u8; len];
        let want_crc = t.local_gather_crc_lane(PD, sgl, offset, &mut want, lane);
        let mut got = vec![0u8; len];
        let got_crc = t.local_gather_crc_lane_memo(memo, PD, sgl, offset, &mut got, lane);
        assert_eq!(got_crc, want_crc, "{sgl:?} offset {offset} len {len}");
        assert_eq!(got, want, "{sgl:?} offset {offset} len {len}");
        got_crc.map(|_| got)
    };
    // One SGE's frames in turn (the memo taken at the first, used by the
    // rest), ranges at its end and past it, an empty one.
    let one = [Sge { addr: 0x10_100, length: 6000, lkey: k.lkey }];
    for (offset, len) in [(0, 1024), (1024, 1024), (2048, 4096), (5999, 1), (6000, 0), (5000, 1001), (u64::MAX, 2), (0, 0)] {
        let _ = gather(&t, &mut memo, &one, offset, len);
    }
    assert_eq!(gather(&t, &mut memo, &one, 6, 4096).unwrap(), fill[0x106..0x106 + 4096]);
    // Another SGE, another PD, several SGEs, a wrong key, an SGE beyond the region.
    let other = [Sge { addr: 0x10_000, length: 100, lkey: k.lkey }];
    assert_eq!(gather(&t, &mut memo, &other, 3, 90).unwrap(), fill[3..93]);
    let two = [Sge { addr: 0x10_000, length: 100, lkey: k.lkey }, Sge { addr: 0x11_000, length: 3000, lkey: k.lkey }];
    assert_eq!(gather(&t, &mut memo, &two, 50, 1000).unwrap()[50..], fill[0x1000..0x1000 + 950]);
    let mut out = [0u8; 8];
    assert_eq!(t.local_gather_crc_lane_memo(&mut memo, PdId(2), &one, 0, &mut out, lane), Err(AccessError::PdMismatch));
    assert_eq!(gather(&t, &mut memo, &[Sge { lkey: k.lkey ^ 1, ..one[0] }], 0, 8), Err(AccessError::InvalidKey));
    // The SGE reaches past the region, the range read does not: the mover
    // checks the range (the post-time check refuses such an SGE).
    let beyond = [Sge { addr: 0x11_000, length: 5000, lkey: k.lkey }];
    assert_eq!(gather(&t, &mut memo, &beyond, 0, 8).unwrap(), fill[0x1000..0x1008]);
    assert_eq!(gather(&t, &mut memo, &beyond, 4090, 8), Err(AccessError::OutOfBounds));
    // Another buffer registered under the same key: the memo's SGE matches.
    assert!(gather(&t, &mut memo, &one, 0, 64).is_ok());
    let mut b2 = Buf::new(8192);
    t.deregister(k.lkey).unwrap();
    // SAFETY: `b2` outlives the table's last use of it (deregistered below).
    let k2 = unsafe { t.register_with_key(PD, b2.ptr(), 8192, 0x10_000, ALL, k.lkey) }.unwrap();
    assert_eq!(k2.lkey, k.lkey);
    let fill2: Vec<u8> = fill.iter().map(|x| !x).collect();
    t.local_scatter(PD, &[Sge { addr: 0x10_000, length: 8192, lkey: k.lkey }], 0, &fill2).unwrap();
    assert_eq!(gather(&t, &mut memo, &one, 0, 64).unwrap(), fill2[0x100..0x140], "the memo read the old buffer");
    // A deregistration waits for a batch that gathered through the memo;
    // afterwards the memo's gather is refused.
    let k3 = MrKeys { lkey: k.lkey, rkey: k.rkey };
    assert_deregistration_waits_for(&t, k3, "a batch gathering through a memo", move |t, pause| {
        let batch = t.batch();
        let mut memo = GatherMemo::default();
        let mut out = [0u8; 64];
        t.local_gather_crc_lane_memo(&mut memo, PD, &one, 0, &mut out, lane).unwrap();
        pause();
        t.local_gather_crc_lane_memo(&mut memo, PD, &one, 64, &mut out, lane).unwrap();
        drop(batch);
    });
    assert_eq!(t.local_gather_crc_lane_memo(&mut memo, PD, &one, 0, &mut out, lane), Err(AccessError::InvalidKey));
    drop((b, b2));
}

/// Deregistration against a gatherer that keeps its memo across batches:
/// the main thread registers a buffer under the same key each round (a
/// memo of the old round's SGE would match the new one but for the table's
/// generation), fills it with a round's pattern, deregisters it and then
/// overwrites it with a poison pattern. A gather through a stale memo would
/// read the poison (or a freed buffer); every successful gather must read
/// one round's pattern whole.
#[test]
fn a_gather_memo_never_reads_a_deregistered_region() {
    use crate::wire::crc;
    use std::sync::atomic::AtomicBool;
    const LEN: usize = 512;
    let mask = [0u8; crc::SHORT_MAX];
    let Some(lane) = crc::update_masked_lane(!0, &[0x5a; 56], &mask) else {
        eprintln!("this CPU has no PCLMULQDQ/SSSE3/SSE4.1: no lanes to continue");
        return;
    };
    let t = Arc::new(MemoryTable::new());
    let mut first = Buf::new(LEN);
    let key = reg(&t, &mut first, 0x20_000, ALL).lkey;
    t.deregister(key).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let gathered = Arc::new(AtomicU64::new(0));
    let gatherer = {
        let (t, stop, gathered) = (t.clone(), stop.clone(), gathered.clone());
        std::thread::spawn(move || {
            let sge = [Sge { addr: 0x20_000, length: LEN as u32, lkey: key }];
            let mut memo = GatherMemo::default();
            let mut out = [0u8; LEN];
            while !stop.load(Ordering::Relaxed) {
                let _batch = t.batch();
                for _ in 0..8 {
                    if t.local_gather_crc_lane_memo(&mut memo, PD, &sge, 0, &mut out, lane).is_ok() {
                        assert_ne!(out[0], 0xee, "a gather read the poison written after deregistration");
                        assert!(out.iter().all(|&x| x == out[0]), "a gather read two rounds' bytes");
                        gathered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    for round in 0..200u32 {
        let mut b = Buf::new(LEN);
        b.0.fill(u64::from_ne_bytes([(round % 200) as u8 + 1; 8]));
        // SAFETY: `b` outlives the registration (deregistered below).
        unsafe { t.register_with_key(PD, b.ptr(), LEN, 0x20_000, ALL, key) }.unwrap();
        let before = gathered.load(Ordering::Relaxed);
        // (A gatherer that failed stops counting: its panic is reported below.)
        while gathered.load(Ordering::Relaxed) < before + 2 && !gatherer.is_finished() {
            std::thread::yield_now();
        }
        t.deregister(key).unwrap();
        b.0.fill(u64::from_ne_bytes([0xee; 8]));
        for _ in 0..5 {
            std::thread::yield_now();
        }
        drop(b);
    }
    stop.store(true, Ordering::Relaxed);
    gatherer.join().unwrap();
}

#[test]
fn type1_window_bind_use_rebind_and_rules() {
    let t = MemoryTable::new();
    let mut b = Buf::new(256);
    let mr = reg(&t, &mut b, 0x1000, ALL);
    let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
    // Unbound: no access.
    assert_eq!(t.remote_check(PD, 1, mw, 0x1000, 1, Access::REMOTE_READ), Err(AccessError::Invalidated));
    let k1 = (mw as u8).wrapping_add(1);
    let r1 = t.bind_mw(PD, 0, mw, k1, mr.lkey, 0x1010, 0x20, Access::REMOTE_READ | Access::REMOTE_WRITE).unwrap();
    assert_eq!(r1 >> 8, mw >> 8);
    assert_eq!(r1 as u8, k1);
    assert_eq!(t.remote_check(PD, 1, mw, 0x1010, 1, Access::REMOTE_READ), Err(AccessError::InvalidKey), "old key stale");
    t.remote_write(PD, 9, r1, 0x1010, b"win").unwrap(); // type 1: any QP of the PD
    assert_eq!(&b.bytes()[0x10..0x13], b"win");
    assert_eq!(t.remote_write(PD, 9, r1, 0x100f, b"w"), Err(AccessError::OutOfBounds));
    assert_eq!(t.remote_write(PD, 9, r1, 0x102f, b"ww"), Err(AccessError::OutOfBounds));
    assert_eq!(t.remote_atomic(PD, 9, r1, 0x1010, AtomicOp::FetchAdd { add: 1 }), Err(AccessError::AccessDenied));
    assert_eq!(t.remote_check(OTHER_PD, 9, r1, 0x1010, 1, Access::REMOTE_READ), Err(AccessError::PdMismatch));
    // Deregistration refused while bound; invalidating the MR too.
    assert_eq!(t.deregister(mr.lkey), Err(RegError::Busy));
    // SAFETY: refused, nothing changes.
    assert_eq!(unsafe { t.reregister(mr.lkey, PD, b.ptr(), 256, 0x1000, ALL) }, Err(RegError::Busy));
    assert_eq!(t.invalidate(PD, 1, mr.rkey), Err(AccessError::AccessDenied));
    // Type 1 windows cannot be invalidated (o10-37.2.26).
    assert_eq!(t.invalidate(PD, 1, r1), Err(AccessError::AccessDenied));
    // Rebind moves the window; the previous rkey is stale.
    let r2 = t.bind_mw(PD, 0, r1, k1.wrapping_add(1), mr.lkey, 0x1080, 0x10, Access::REMOTE_READ).unwrap();
    assert_eq!(t.remote_check(PD, 1, r1, 0x1010, 1, Access::REMOTE_READ), Err(AccessError::InvalidKey));
    assert_eq!(t.remote_check(PD, 1, r2, 0x1080, 0x10, Access::REMOTE_READ), Ok(()));
    // Bind with length 0 unbinds; then the MR can go.
    let r3 = t.bind_mw(PD, 0, r2, k1.wrapping_add(2), 0, 0, 0, Access::empty()).unwrap();
    assert_eq!(t.remote_check(PD, 1, r3, 0x1080, 1, Access::REMOTE_READ), Err(AccessError::Invalidated));
    t.deregister(mr.lkey).unwrap();
    t.dealloc_mw(r3).unwrap();
    assert_eq!(t.dealloc_mw(r3), Err(RegError::InvalidKey));
}

#[test]
fn bind_checks_mr_rights_and_range() {
    let t = MemoryTable::new();
    let mut b = Buf::new(256);
    let mr = reg(&t, &mut b, 0x1000, ALL);
    let no_bind = reg(&t, &mut b, 0x1000, ALL - Access::MW_BIND);
    let ro_bind = reg(&t, &mut b, 0x1000, Access::REMOTE_READ | Access::MW_BIND);
    let zb = reg(&t, &mut b, 0x1000, ALL | Access::ZERO_BASED);
    let mw = t.alloc_mw(PD, MwType::Type1).unwrap();
    let rr = Access::REMOTE_READ;
    let bind = |mr: u32, addr, len, acc| t.bind_mw(PD, 0, mw, 7, mr, addr, len, acc);
    assert_eq!(bind(no_bind.lkey, 0x1000, 8, rr), Err(AccessError::AccessDenied)); // C10-73
    assert_eq!(bind(ro_bind.lkey, 0x1000, 8, Access::REMOTE_WRITE), Err(AccessError::AccessDenied)); // C10-74
    assert_eq!(bind(ro_bind.lkey, 0x1000, 8, Access::REMOTE_ATOMIC), Err(AccessError::AccessDenied)); // C10-74
    assert_eq!(bind(zb.lkey, 0, 8, rr), Err(AccessError::AccessDenied)); // no windows on ZB MRs (rxe)
    assert_eq!(bind(mr.lkey, 0x1000, 8, rr | Access::ZERO_BASED), Err(AccessError::AccessDenied)); // o10-36.2.2
    assert_eq!(bind(mr.lkey, 0x1000, 8, rr | Access::LOCAL_WRITE), Err(AccessError::AccessDenied));
    assert_eq!(bind(mr.lkey, 0x0fff, 8, rr), Err(AccessError::OutOfBounds)); // C10-75
    assert_eq!(bind(mr.lkey, 0x10f9, 8, rr), Err(AccessError::OutOfBounds));
    assert_eq!(bind(mr.lkey, u64::MAX, 8, rr), Err(AccessError::OutOfBounds));
    assert_eq!(bind(mr.lkey ^ 0x80, 0x1000, 8, rr), Err(AccessError::InvalidKey));
    assert_eq!(bind(mw, 0x1000, 8, rr), Err(AccessError::InvalidKey));
    assert_eq!(t.bind_mw(OTHER_PD, 0, mw, 7, mr.lkey, 0x1000, 8, rr), Err(AccessError::PdMismatch));
    let other_mr = {
        let len = b.0.len() * 8;
        // SAFETY: `b` outlives the table's use.
        unsafe { t.register(OTHER_PD, b.ptr(), len, 0x1000, ALL) }.unwrap()
    };
    assert_eq!(bind(other_mr.lkey, 0x1000, 8, rr), Err(AccessError::PdMismatch));
    // Every failure left the window unbound with its key.
    assert_eq!(t.remote_check(PD, 1, mw, 0x1000, 1, rr), Err(AccessError::Invalidated));
    // Remote write through a window on an MR without REMOTE_WRITE but with LOCAL_WRITE works.
    let lw = reg(&t, &mut b, 0x1000, Access::LOCAL_WRITE | Access::MW_BIND);
    let r = bind(lw.lkey, 0x1000, 16, Access::REMOTE_WRITE).unwrap();
    t.remote_write(PD, 1, r, 0x1008, b"ok").unwrap();
    assert_eq!(&b.bytes()[8..10], b"ok");
    assert_eq!(t.remote_write(PD, 1, lw.rkey, 0x1008, b"no"), Err(AccessError::AccessDenied));
}

#[test]
fn type2_window_is_tied_to_its_qp_and_invalidated() {
    let t = MemoryTable::new();
    let mut b = Buf::new(128);
    let mr = reg(&t, &mut b, 0x1000, ALL);
    let mw = t.alloc_mw(PD, MwType::Type2).unwrap();
    // Zero length bind of a type 2 window is refused (o10-37.2.40).
    assert_eq!(t.bind_mw(PD, 5, mw, 1, mr.lkey, 0x1000, 0, Access::REMOTE_READ), Err(AccessError::AccessDenied));
    let acc = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::ZERO_BASED;
    // Key bytes other than the window's own: `alloc_mw` draws that byte at
    // random, and a bind that kept it would leave `mw` a valid key below.
    let k = (mw as u8).wrapping_add(0x42);
    let r = t.bind_mw(PD, 5, mw, k, mr.lkey, 0x1020, 0x20, acc).unwrap();
    assert_eq!(r, (mw & !0xff) | u32::from(k));
    assert_ne!(r, mw);
    // Zero-based window: offsets from the window start.
    t.remote_write(PD, 5, r, 0, b"zb").unwrap();
    assert_eq!(&b.bytes()[0x20..0x22], b"zb");
    assert_eq!(t.remote_check(PD, 5, r, 0x1f, 2, Access::REMOTE_READ), Err(AccessError::OutOfBounds));
    assert_eq!(t.remote_check(PD, 5, r, 0x1f, 1, Access::REMOTE_READ), Ok(()));
    // Another QP of the same PD may not use it.
    assert_eq!(t.remote_write(PD, 6, r, 0, b"xx"), Err(AccessError::WrongQp));
    assert_eq!(&b.bytes()[0x20..0x22], b"zb");
    // A bound type 2 window cannot be re-bound (o10-37.2.30).
    assert_eq!(t.bind_mw(PD, 5, r, k.wrapping_add(1), mr.lkey, 0x1000, 8, Access::REMOTE_READ), Err(AccessError::AccessDenied));
    assert_eq!(t.deregister(mr.lkey), Err(RegError::Busy));
    // Invalidation: only by the bound QP, in the PD, with the current key.
    assert_eq!(t.invalidate(PD, 6, r), Err(AccessError::WrongQp));
    assert_eq!(t.invalidate(OTHER_PD, 5, r), Err(AccessError::PdMismatch));
    assert_eq!(t.invalidate(PD, 5, mw), Err(AccessError::InvalidKey));
    t.invalidate(PD, 5, r).unwrap();
    assert_eq!(t.invalidate(PD, 5, r), Err(AccessError::Invalidated));
    assert_eq!(t.remote_write(PD, 5, r, 0, b"no"), Err(AccessError::Invalidated));
    // Free again: can be bound with a new key (old one stale), MR can then be deregistered
    // once the window is deallocated.
    let r2 = t.bind_mw(PD, 5, r, k.wrapping_add(2), mr.lkey, 0x1000, 8, Access::REMOTE_READ).unwrap();
    assert_eq!(t.remote_check(PD, 5, r, 0x1000, 1, Access::REMOTE_READ), Err(AccessError::InvalidKey));
    assert_eq!(t.remote_check(PD, 5, r2, 0x1000, 8, Access::REMOTE_READ), Ok(()));
    t.dealloc_mw(r2).unwrap();
    t.deregister(mr.lkey).unwrap();
}

#[test]
fn mr_invalidation_until_reregistration() {
    let t = MemoryTable::new();
    let mut b = Buf::new(64);
    let k = reg(&t, &mut b, 0x1000, ALL);
    assert_eq!(t.invalidate(OTHER_PD, 1, k.rkey), Err(AccessError::PdMismatch));
    t.invalidate(PD, 1, k.rkey).unwrap();
    assert_eq!(t.remote_write(PD, 1, k.rkey, 0x1000, b"x"), Err(AccessError::Invalidated));
    let sgl = [Sge { addr: 0x1000, length: 1, lkey: k.lkey }];
    assert_eq!(t.local_scatter(PD, &sgl, 0, b"x"), Err(AccessError::Invalidated));
    assert_eq!(t.invalidate(PD, 1, k.rkey), Err(AccessError::Invalidated));
    // SAFETY: `b` outlives the table's use.
    let k2 = unsafe { t.reregister(k.lkey, PD, b.ptr(), 64, 0x1000, ALL) }.unwrap();
    t.remote_write(PD, 1, k2.rkey, 0x1000, b"x").unwrap();
    assert_eq!(b.bytes()[0], b'x');
}

#[test]
fn table_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<MemoryTable>();
}

#[test]
fn register_with_a_chosen_key() {
    let t = MemoryTable::new();
    let mut b1 = Buf::new(64);
    let mut b2 = Buf::new(64);
    let mut b3 = Buf::new(64);
    // SAFETY: the buffers outlive the table's use of them.
    let k = unsafe { t.register_with_key(PD, b1.ptr(), 64, 0x5000, ALL, 0x3ea) }.unwrap();
    assert_eq!((k.lkey, k.rkey), (0x3ea, 0x3ea));
    t.remote_write(PD, 1, 0x3ea, 0x5008, &[7; 8]).unwrap();
    assert_eq!(b1.bytes()[8..16], [7; 8]);
    // The index is taken: refused, whatever the key byte.
    // SAFETY: as above.
    assert_eq!(unsafe { t.register_with_key(PD, b2.ptr(), 64, 0, ALL, 0x311) }, Err(RegError::InvalidArgument));
    // SAFETY: as above.
    assert_eq!(unsafe { t.register_with_key(PD, b2.ptr(), 64, 0, ALL, 0x0ff) }, Err(RegError::InvalidArgument), "index 0");
    // Indices skipped on the way stay available to plain registration.
    let a = reg(&t, &mut b2, 0, ALL);
    let b = reg(&t, &mut b3, 0, ALL);
    assert_eq!([a.lkey >> 8, b.lkey >> 8], [1, 2]);
    t.deregister(0x3ea).unwrap();
    assert_eq!(t.remote_write(PD, 1, 0x3ea, 0x5008, &[7; 8]), Err(AccessError::InvalidKey));
}

/// A responder's memo of a WRITE's checked range
/// ([`MemoryTable::remote_check_write`], [`MemoryTable::remote_write_memo`])
/// places what the checker's `remote_write` places and refuses what it
/// refuses: every part of the range, ranges reaching past it or before it,
/// another R_Key, PD or QP (a type-2 window bound to one QP), and after
/// registration changes (another buffer under the same key, a
/// deregistration, an invalidation) never the old resolution.
#[test]
fn a_write_memo_places_as_the_checker_and_follows_registration_changes() {
    let t = MemoryTable::new();
    let mut b = Buf::new(8192);
    let k = reg(&t, &mut b, 0x10_000, ALL);
    let memo = t.remote_check_write(PD, 3, k.rkey, 0x10_100, 6000).unwrap();
    assert_eq!(t.remote_check_write(PD, 3, k.rkey, 0x10_100, 8000), Err(AccessError::OutOfBounds));
    assert_eq!(t.remote_check_write(OTHER_PD, 3, k.rkey, 0x10_100, 60), Err(AccessError::PdMismatch));
    let mut round = 0u8;
    // Each case twice: the checker's write of one pattern, then the memo's of
    // another; the same verdict, and on success the memo's bytes in place.
    let mut same = |t: &MemoryTable, pd: PdId, qpn: u32, rkey: u32, va: u64, len: usize| {
        round = round.wrapping_add(2);
        let want = t.remote_write(pd, qpn, rkey, va, &vec![round; len]);
        let got = t.remote_write_memo(&memo, pd, qpn, rkey, va, &vec![round + 1; len]);
        assert_eq!(got, want, "pd {pd:?} qpn {qpn} rkey {rkey:#x} va {va:#x} len {len}");
        if got.is_ok() {
            let mut back = vec![0u8; len];
            t.remote_read(pd, qpn, rkey, va, &mut back).unwrap();
            assert!(back.iter().all(|&x| x == round + 1), "va {va:#x} len {len}: not the memo's bytes");
        }
        got
    };
    // The message's packets in turn, and its range's edges.
    for (va, len) in [(0x10_100, 1024), (0x10_500, 1024), (0x10_900, 3952), (0x11_86f, 1), (0x11_870, 0)] {
        assert_eq!(same(&t, PD, 3, k.rkey, va, len), Ok(()));
    }
    // Past the memo's range (but in the region), before it, past the region.
    assert_eq!(same(&t, PD, 3, k.rkey, 0x11_800, 200), Ok(()));
    assert_eq!(same(&t, PD, 3, k.rkey, 0x10_0ff, 2), Ok(()));
    assert_eq!(same(&t, PD, 3, k.rkey, 0x11_f00, 0x200), Err(AccessError::OutOfBounds));
    assert_eq!(same(&t, PD, 3, k.rkey, u64::MAX, 2), Err(AccessError::OutOfBounds));
    // Another key byte, another PD, another QP.
    let wrong = (k.rkey & !0xff) | u32::from((k.rkey as u8).wrapping_add(1));
    assert_eq!(same(&t, PD, 3, wrong, 0x10_100, 8), Err(AccessError::InvalidKey));
    assert_eq!(same(&t, OTHER_PD, 3, k.rkey, 0x10_100, 8), Err(AccessError::PdMismatch));
    assert_eq!(same(&t, PD, 4, k.rkey, 0x10_100, 8), Ok(()));
    // A type-2 window bound to QP 5: its memo does not serve QP 6, and after
    // the window's invalidation it serves nobody.
    let mw = t.alloc_mw(PD, MwType::Type2).unwrap();
    let w = t.bind_mw(PD, 5, mw, (mw as u8).wrapping_add(1), k.lkey, 0x10_000, 0x1000, Access::REMOTE_WRITE).unwrap();
    let wmemo = t.remote_check_write(PD, 5, w, 0x10_000, 0x1000).unwrap();
    assert_eq!(t.remote_write_memo(&wmemo, PD, 5, w, 0x10_800, &[1; 16]), Ok(()));
    assert_eq!(t.remote_write_memo(&wmemo, PD, 6, w, 0x10_800, &[1; 16]), Err(AccessError::WrongQp));
    t.invalidate(PD, 5, w).unwrap();
    assert_eq!(t.remote_write_memo(&wmemo, PD, 5, w, 0x10_800, &[1; 16]), Err(AccessError::Invalidated));
    // Another buffer registered under the same key: the memo's range
    // matches, the generation does not; its bytes go to the new buffer.
    let mut b2 = Buf::new(8192);
    t.deregister(k.lkey).unwrap();
    assert_eq!(t.remote_write_memo(&memo, PD, 3, k.rkey, 0x10_100, &[9; 64]), Err(AccessError::InvalidKey));
    // SAFETY: `b2` outlives the table's last use of it.
    let k2 = unsafe { t.register_with_key(PD, b2.ptr(), 8192, 0x10_000, ALL, k.lkey) }.unwrap();
    assert_eq!(k2.rkey, k.rkey);
    let before = b.bytes();
    assert_eq!(t.remote_write_memo(&memo, PD, 3, k.rkey, 0x10_100, &[0xa5; 64]), Ok(()));
    assert_eq!(b.bytes(), before, "the memo wrote into the deregistered buffer");
    assert_eq!(b2.bytes()[0x100..0x140], [0xa5; 64]);
    // The default memo is no table's.
    assert_eq!(t.remote_write_memo(&WriteMemo::default(), PD, 3, k.rkey, 0x10_100, &[1; 8]), Ok(()));
    t.deregister(k2.lkey).unwrap();
    drop((b, b2));
}

/// The receive side's placement through a memo
/// ([`MemoryTable::remote_place_memo`]) hands over exactly the address
/// `remote_write_memo` writes, and nothing where that one would need the
/// checker (another QP or key, a range past the memo's, a changed table)
/// or where the destination overlaps the bytes the placement reads.
#[test]
fn a_placement_through_a_memo_gets_the_memos_address_or_nothing() {
    let t = MemoryTable::new();
    let mut b = Buf::new(8192);
    let base = b.ptr() as usize;
    let k = reg(&t, &mut b, 0x10_000, ALL);
    let memo = t.remote_check_write(PD, 3, k.rkey, 0x10_100, 6000).unwrap();
    let frame = [0u8; 64];
    let at = |va: u64, len: usize, apart: &[u8]| t.remote_place_memo(&memo, PD, 3, k.rkey, va, len, apart, |dst| dst as usize);
    assert_eq!(at(0x10_100, 1024, &frame), Some(base + 0x100));
    assert_eq!(at(0x10_500, 3952, &frame), Some(base + 0x500));
    // Past the memo's range, before it; another QP, key or PD.
    assert_eq!(at(0x11_800, 200, &frame), None);
    assert_eq!(at(0x10_0ff, 2, &frame), None);
    assert_eq!(t.remote_place_memo(&memo, PD, 4, k.rkey, 0x10_100, 8, &frame, |_| ()), None);
    assert_eq!(t.remote_place_memo(&memo, PD, 3, k.rkey ^ 1, 0x10_100, 8, &frame, |_| ()), None);
    assert_eq!(t.remote_place_memo(&memo, OTHER_PD, 3, k.rkey, 0x10_100, 8, &frame, |_| ()), None);
    // The destination overlapping what the placement reads, at either end.
    // SAFETY: the slices lie inside `b`'s 8192 bytes, which outlive them
    // (read only as addresses: the placement closure touches nothing).
    let inside = |off: usize, len: usize| unsafe { std::slice::from_raw_parts((base + off) as *const u8, len) };
    assert_eq!(at(0x10_100, 1024, inside(0x4ff, 1)), None);
    assert_eq!(at(0x10_100, 1024, inside(0x80, 0x81)), None);
    assert_eq!(at(0x10_100, 1024, inside(0x500, 64)), Some(base + 0x100));
    assert_eq!(at(0x10_100, 1024, inside(0x80, 0x80)), Some(base + 0x100));
    // After a change to the table the memo is stale: nothing.
    let mut b2 = Buf::new(64);
    let k2 = reg(&t, &mut b2, 0x90_000, ALL);
    assert_eq!(at(0x10_100, 1024, &frame), None);
    t.deregister(k2.lkey).unwrap();
    t.deregister(k.lkey).unwrap();
    drop((b, b2));
}

/// A memo serves only the table it was taken on: two tables with the same
/// keys (the same seed) and as many changes each, a WRITE memo and a gather
/// memo taken on one are stale on the other, so the other's own region is
/// resolved and written or read, never the first table's memory through the
/// memo's pointer. (Generations come from one counter for the whole
/// process; numbered per table, both tables would be at generation 2 here.)
#[test]
fn a_memo_from_another_table_is_never_fresh() {
    let (a, b) = (MemoryTable::with_seed(7), MemoryTable::with_seed(7));
    let (mut ba, mut bb) = (Buf::new(4096), Buf::new(4096));
    let (ka, kb) = (reg(&a, &mut ba, 0x2000, ALL), reg(&b, &mut bb, 0x2000, ALL));
    assert_eq!((ka.lkey, ka.rkey), (kb.lkey, kb.rkey), "the same seed gives the same keys");
    let memo = a.remote_check_write(PD, 3, ka.rkey, 0x2000, 4096).unwrap();
    assert_eq!(b.remote_write_memo(&memo, PD, 3, kb.rkey, 0x2100, &[0x5c; 64]), Ok(()));
    assert_eq!(bb.bytes()[0x100..0x140], [0x5c; 64], "table b's own region");
    assert!(ba.bytes().iter().all(|&x| x == 0), "table a's region written through a's memo by b");
    // The requester's gather memo, the same way round.
    let Some(lane) = crate::wire::crc::update_masked_lane(!0, &[0u8; 16], &[0u8; 16]) else { return };
    a.remote_write(PD, 1, ka.rkey, 0x2000, &[0x11; 256]).unwrap();
    b.remote_write(PD, 1, kb.rkey, 0x2000, &[0x22; 256]).unwrap();
    let sgl = [Sge { addr: 0x2000, length: 256, lkey: ka.lkey }];
    let mut memo = GatherMemo::default();
    let mut out = [0u8; 256];
    a.local_gather_crc_lane_memo(&mut memo, PD, &sgl, 0, &mut out, lane).unwrap();
    assert_eq!(out, [0x11; 256]);
    b.local_gather_crc_lane_memo(&mut memo, PD, &sgl, 0, &mut out, lane).unwrap();
    assert_eq!(out, [0x22; 256], "table b's gather read table a's region through a's memo");
    drop((ba, bb));
}
