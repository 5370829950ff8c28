//! Event channels and events: `rdma_create_event_channel`,
//! `rdma_get_cm_event`, `rdma_ack_cm_event`, `rdma_event_str`.

use std::collections::VecDeque;
use std::os::raw::{c_char, c_int};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::{fail, UCmId};
use crate::cmffi::*;
use crate::ffi::*;
use crate::{guard, lock, null_err};

/// `struct rdma_event_channel` (its fd an eventfd counting queued events)
/// and the queue.
#[repr(C)]
pub(crate) struct UEventChannel {
    pub(crate) ch: rdma_event_channel,
    pub(crate) queue: Mutex<VecDeque<Box<UEvent>>>,
    /// The threads inside [`next_event`], and [`DESTROYED`] once the
    /// program destroyed the channel: the last of them frees it.
    state: AtomicUsize,
}

/// [`UEventChannel::state`]'s flag: `rdma_destroy_event_channel` was called.
const DESTROYED: usize = 1 << (usize::BITS - 1);

/// Close the channel's fd and free it.
unsafe fn free_channel(ch: *mut rdma_event_channel) {
    let b = Box::from_raw(ch as *mut UEventChannel);
    libc::close(b.ch.fd);
}

/// `struct rdma_cm_event` and what its pointers point at.
#[repr(C)]
pub(crate) struct UEvent {
    pub(crate) ev: rdma_cm_event,
    pub(crate) data: Vec<u8>,
}

/// The channel behind a C pointer of ours (`None` for NULL).
pub(crate) unsafe fn uchannel<'a>(ch: *mut rdma_event_channel) -> Option<&'a UEventChannel> {
    (!ch.is_null()).then(|| &*(ch as *const UEventChannel))
}

/// What an event says (the id's type decides `param.conn` or `param.ud`).
pub(crate) struct NewEvent {
    pub(crate) id: *mut UCmId,
    pub(crate) listen_id: *mut UCmId,
    pub(crate) event: rdma_cm_event_type,
    pub(crate) status: c_int,
    /// Private data and the length librdmacm reports (the kernel reports the
    /// whole private data field of the MAD less RDMA-CM's header).
    pub(crate) data: Vec<u8>,
    pub(crate) data_len: usize,
    pub(crate) conn: rdma_conn_param,
    pub(crate) ud: Option<(ibv_ah_attr, u32, u32)>,
    /// `param.ud.private_data` as a pointer of the program's (a multicast
    /// join's context, as librdmacm reports it), instead of `data`.
    pub(crate) private_ptr: *mut std::os::raw::c_void,
}

impl NewEvent {
    pub(crate) fn new(id: *mut UCmId, event: rdma_cm_event_type, status: c_int) -> NewEvent {
        NewEvent {
            id,
            listen_id: ptr::null_mut(),
            event,
            status,
            data: vec![],
            data_len: 0,
            conn: rdma_conn_param::default(),
            ud: None,
            private_ptr: ptr::null_mut(),
        }
    }

    /// Private data padded to `len` bytes, as the kernel hands it up.
    pub(crate) fn with_data(mut self, data: &[u8], len: usize) -> NewEvent {
        let mut d = data.to_vec();
        d.resize(len.max(d.len()), 0);
        self.data_len = d.len().min(255);
        self.data = d;
        self
    }
}

/// Queue `e` on `ch` and count it on the fd.
pub(crate) unsafe fn push_event(ch: *mut rdma_event_channel, e: NewEvent) {
    let Some(c) = uchannel(ch) else { return };
    let mut ev: rdma_cm_event = std::mem::zeroed();
    ev.id = e.id as *mut rdma_cm_id;
    ev.listen_id = e.listen_id as *mut rdma_cm_id;
    ev.event = e.event;
    ev.status = e.status;
    let mut b = Box::new(UEvent { ev, data: e.data });
    let pd = if !e.private_ptr.is_null() {
        e.private_ptr as *const _
    } else if b.data.is_empty() {
        ptr::null()
    } else {
        b.data.as_ptr() as *const _
    };
    let len = e.data_len as u8;
    match e.ud {
        Some((ah, qpn, qkey)) => {
            let ud = b.ev.param.ud.as_mut();
            ud.private_data = pd;
            ud.private_data_len = len;
            ud.ah_attr = ah;
            ud.qp_num = qpn;
            ud.qkey = qkey;
        }
        None => {
            let conn = b.ev.param.conn.as_mut();
            *conn = e.conn;
            conn.private_data = pd;
            conn.private_data_len = len;
        }
    }
    lock(&c.queue).push_back(b);
    let one = 1u64;
    libc::write(c.ch.fd, (&one as *const u64).cast(), 8);
}

/// Drop the events queued for `id` (it is being destroyed).
pub(crate) unsafe fn drop_events_of(ch: *mut rdma_event_channel, id: *mut UCmId) {
    if let Some(c) = uchannel(ch) {
        lock(&c.queue).retain(|e| e.ev.id != id as *mut rdma_cm_id);
    }
}

/// `rdma_create_event_channel`.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_create_event_channel() -> *mut rdma_event_channel {
    guard("rdma_create_event_channel", ptr::null_mut(), || {
        let fd = libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC);
        if fd < 0 {
            return ptr::null_mut();
        }
        let b = Box::new(UEventChannel { ch: rdma_event_channel { fd }, queue: Mutex::new(VecDeque::new()), state: AtomicUsize::new(0) });
        Box::into_raw(b) as *mut rdma_event_channel
    })
}

/// `rdma_destroy_event_channel`: the caller has destroyed its ids.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    guard("rdma_destroy_event_channel", (), || {
        if ch.is_null() {
            return;
        }
        // librdmacm frees the channel whatever ids still name it (qperf
        // leaves its listening id): those ids report no more events.
        super::with_cma(|c| {
            for &i in c.ids.keys() {
                let id = i as *mut UCmId;
                if (*id).id.channel == ch {
                    (*id).id.channel = ptr::null_mut();
                }
            }
        });
        // A thread blocked in rdma_get_cm_event on this channel (rping's
        // cm_thread, while its main thread tears down) keeps the channel
        // alive: it is woken, sees the flag and stays blocked for good, as
        // a read of the kernel's channel blocks on after the fd is closed
        // (the file lives until that read returns); the last one out frees
        // it. Without readers it goes now.
        let c = &*(ch as *const UEventChannel);
        let readers = c.state.fetch_or(DESTROYED, Ordering::SeqCst);
        if readers == 0 {
            free_channel(ch);
        } else {
            // One count per blocked reader (the fd is an EFD_SEMAPHORE).
            let n = readers as u64;
            libc::write(c.ch.fd, (&n as *const u64).cast(), 8);
        }
    })
}

/// Take the next event of `ch`: blocks in `read` on the fd unless it is
/// O_NONBLOCK (then EAGAIN). As librdmacm's read of the kernel's channel, a
/// signal whose handler lacks SA_RESTART ends the wait with EINTR. A
/// channel destroyed while this thread waits on it never returns (see
/// `rdma_destroy_event_channel`).
pub(crate) unsafe fn next_event(ch: *mut rdma_event_channel) -> Result<Box<UEvent>, c_int> {
    let Some(c) = uchannel(ch) else { return Err(libc::EINVAL) };
    c.state.fetch_add(1, Ordering::SeqCst);
    let got = loop {
        let mut v = 0u64;
        let n = libc::read(c.ch.fd, (&mut v as *mut u64).cast(), 8);
        if c.state.load(Ordering::SeqCst) & DESTROYED != 0 {
            leave_channel(ch);
            #[cfg(test)]
            STAYED_BLOCKED.fetch_add(1, Ordering::SeqCst);
            loop {
                std::thread::park();
            }
        }
        if n < 0 {
            break Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
        }
        // A count whose event was dropped with its id: wait for the next.
        if let Some(ev) = lock(&c.queue).pop_front() {
            break Ok(ev);
        }
    };
    leave_channel(ch);
    got
}

/// Readers that saw their channel destroyed and stay blocked (for tests).
#[cfg(test)]
static STAYED_BLOCKED: AtomicUsize = AtomicUsize::new(0);

/// A thread leaves [`next_event`]; the last one out of a destroyed channel
/// frees it.
unsafe fn leave_channel(ch: *mut rdma_event_channel) {
    let c = &*(ch as *const UEventChannel);
    if c.state.fetch_sub(1, Ordering::SeqCst) == DESTROYED | 1 {
        free_channel(ch);
    }
}

/// `rdma_get_cm_event`.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_get_cm_event(ch: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int {
    guard("rdma_get_cm_event", -1, || {
        if ch.is_null() || event.is_null() {
            return fail(libc::EINVAL);
        }
        match next_event(ch) {
            Ok(ev) => {
                let p = Box::into_raw(ev);
                let id = (*p).ev.id;
                if !id.is_null() {
                    (*id).event = &mut (*p).ev;
                }
                *event = &mut (*p).ev;
                0
            }
            Err(e) => fail(e),
        }
    })
}

/// `rdma_ack_cm_event`: frees the event.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    guard("rdma_ack_cm_event", -1, || {
        if event.is_null() {
            return fail(libc::EINVAL);
        }
        let b = Box::from_raw(event as *mut UEvent);
        let id = b.ev.id;
        if !id.is_null() && super::with_cma(|c| c.ids.contains_key(&(id as usize))) && (*id).event == event {
            (*id).event = ptr::null_mut();
        }
        drop(b);
        0
    })
}

const EVENT_STR: [&std::ffi::CStr; 16] = [
    c"RDMA_CM_EVENT_ADDR_RESOLVED",
    c"RDMA_CM_EVENT_ADDR_ERROR",
    c"RDMA_CM_EVENT_ROUTE_RESOLVED",
    c"RDMA_CM_EVENT_ROUTE_ERROR",
    c"RDMA_CM_EVENT_CONNECT_REQUEST",
    c"RDMA_CM_EVENT_CONNECT_RESPONSE",
    c"RDMA_CM_EVENT_CONNECT_ERROR",
    c"RDMA_CM_EVENT_UNREACHABLE",
    c"RDMA_CM_EVENT_REJECTED",
    c"RDMA_CM_EVENT_ESTABLISHED",
    c"RDMA_CM_EVENT_DISCONNECTED",
    c"RDMA_CM_EVENT_DEVICE_REMOVAL",
    c"RDMA_CM_EVENT_MULTICAST_JOIN",
    c"RDMA_CM_EVENT_MULTICAST_ERROR",
    c"RDMA_CM_EVENT_ADDR_CHANGE",
    c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

/// `rdma_event_str`: the event's name ("UNKNOWN EVENT" outside the enum).
#[no_mangle]
pub extern "C" fn urnic_rdma_event_str(event: rdma_cm_event_type) -> *const c_char {
    match EVENT_STR.get(event as usize) {
        Some(s) => s.as_ptr(),
        None => c"UNKNOWN EVENT".as_ptr(),
    }
}

/// Wait on a synchronous id's private channel for its next event; ack it
/// and return its type and status (librdmacm's `ucma_complete`).
pub(crate) unsafe fn complete(id: *mut UCmId) -> Result<(rdma_cm_event_type, c_int), c_int> {
    let ev = next_event((*id).id.channel)?;
    Ok((ev.ev.event, ev.ev.status))
}

/// NULL with errno (for pointer-returning calls).
pub(crate) fn null<T>(e: c_int) -> *mut T {
    null_err(e)
}

/// A synchronous id waits for its event; 0 or -1 with the event's errno.
pub(crate) unsafe fn sync_wait(id: *mut rdma_cm_id) -> c_int {
    let sync = super::with_cma(|c| c.ids.get(&(id as usize)).is_some_and(|s| s.own_channel));
    if !sync {
        return 0;
    }
    match complete(id as *mut UCmId) {
        Ok((_, 0)) => 0,
        Ok((ev, status)) => {
            let e = if status < 0 {
                -status
            } else if ev == RDMA_CM_EVENT_REJECTED {
                libc::ECONNREFUSED
            } else {
                libc::ECONNABORTED
            };
            fail(e)
        }
        Err(e) => fail(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    /// rping's teardown: its cm_thread waits in `rdma_get_cm_event` while
    /// the main thread destroys its ids (an id's queued event dropped leaves
    /// a count with no event behind) and then the channel. The waiting
    /// thread must stay blocked, as on the kernel's channel, never come back
    /// with EBADF from the closed fd (rping then exits 255) or read a freed
    /// channel.
    #[test]
    fn a_reader_waiting_on_a_destroyed_channel_stays_blocked() {
        for round in 1..=20 {
            // SAFETY: the channel is ours; the reader holds it while inside.
            unsafe {
                let ch = urnic_rdma_create_event_channel();
                assert!(!ch.is_null());
                let addr = ch as usize;
                let (tx, rx) = mpsc::channel();
                std::thread::spawn(move || {
                    let got = next_event(addr as *mut rdma_event_channel);
                    let _ = tx.send(got.err());
                });
                let c = &*(ch as *const UEventChannel);
                let start = Instant::now();
                while c.state.load(Ordering::SeqCst) == 0 {
                    assert!(start.elapsed() < Duration::from_secs(60), "the reader never started");
                    std::thread::sleep(Duration::from_millis(1));
                }
                // A count whose event was dropped with its id, then the channel.
                let one = 1u64;
                libc::write(c.ch.fd, (&one as *const u64).cast(), 8);
                urnic_rdma_destroy_event_channel(ch);
                // The reader sees the destroy and stays (hang guard only).
                let start = Instant::now();
                while STAYED_BLOCKED.load(Ordering::SeqCst) < round {
                    if let Ok(e) = rx.try_recv() {
                        panic!("a reader of a destroyed channel returned (errno {e:?}) instead of staying blocked");
                    }
                    assert!(start.elapsed() < Duration::from_secs(60), "the reader never saw its channel destroyed");
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert!(rx.try_recv().is_err(), "the reader returned");
            }
        }
    }
}
