//! Which thread polls each urnic device of this process, so that a device
//! can tell whether a frame it sends goes to a device that the sending
//! thread itself polls.
//!
//! The one use: a reply that ends a held ACK's hold is kicked on its own,
//! before the ACK is built, so that a peer polling on another core sees it
//! sooner ([`Engine::take_reply_before_ack`]). When the peer device is
//! polled by the very thread that sends (both ends of a link driven by one
//! thread: the one-core benchmark, single-threaded loopback programs), the
//! peer cannot look before that thread is done anyway, and the early kick
//! only adds a system call (on veth a kick costs about a microsecond of
//! fixed work). Whatever this says, frames, their order and their content
//! are the same: only when the port is kicked changes.
//!
//! [`Engine::take_reply_before_ack`]: rocev2::transport::engine::Engine::take_reply_before_ack

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// One device: its MAC and the tag of the thread that polled it last (0:
/// none yet).
struct Entry {
    mac: [u8; 6],
    poller: Arc<AtomicU64>,
}

/// Every live device of the process. Read once per reply that ends a hold,
/// written when a device is made or dropped.
static DEVICES: RwLock<Vec<Entry>> = RwLock::new(Vec::new());

/// Tags handed out to threads (0 is "no thread").
static NEXT_TAG: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static TAG: u64 = NEXT_TAG.fetch_add(1, Ordering::Relaxed);
}

/// This thread's tag.
fn this_thread() -> u64 {
    TAG.with(|t| *t)
}

/// A device's entry in the registry: records which thread polls it, and
/// leaves the registry when dropped.
pub(crate) struct PollerMark {
    poller: Arc<AtomicU64>,
}

impl PollerMark {
    /// Register a device with MAC `mac`.
    pub(crate) fn register(mac: [u8; 6]) -> PollerMark {
        let poller = Arc::new(AtomicU64::new(0));
        DEVICES.write().unwrap_or_else(|e| e.into_inner()).push(Entry { mac, poller: poller.clone() });
        PollerMark { poller }
    }

    /// The calling thread polls this device now (a load, and a store only
    /// when the polling thread changed).
    #[inline]
    pub(crate) fn note(&self) {
        let t = this_thread();
        if self.poller.load(Ordering::Relaxed) != t {
            self.poller.store(t, Ordering::Relaxed);
        }
    }
}

impl Drop for PollerMark {
    fn drop(&mut self) {
        DEVICES.write().unwrap_or_else(|e| e.into_inner()).retain(|e| !Arc::ptr_eq(&e.poller, &self.poller));
    }
}

/// Whether the device of this process with MAC `dst` (a frame's first six
/// bytes) was last polled by the calling thread. False for a MAC of no
/// device here (a peer elsewhere) and for a short slice.
pub(crate) fn polled_by_this_thread(dst: &[u8]) -> bool {
    let Some(dst) = dst.first_chunk::<6>() else { return false };
    let t = this_thread();
    DEVICES.read().unwrap_or_else(|e| e.into_inner()).iter().any(|e| e.mac == *dst && e.poller.load(Ordering::Relaxed) == t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_polled_by_the_thread_that_noted_it_last() {
        let mac = [0x02, 0x7e, 0x57, 0, 0, 1];
        let mark = PollerMark::register(mac);
        // Not polled yet: by no thread.
        assert!(!polled_by_this_thread(&mac));
        mark.note();
        assert!(polled_by_this_thread(&mac));
        // Another MAC, a short slice: not a device here.
        assert!(!polled_by_this_thread(&[0x02, 0x7e, 0x57, 0, 0, 2]));
        assert!(!polled_by_this_thread(&mac[..5]));
        // Another thread polls it now: not this one's any more, and that
        // thread sees it as its own.
        std::thread::scope(|s| {
            s.spawn(|| {
                mark.note();
                assert!(polled_by_this_thread(&mac));
            });
        });
        assert!(!polled_by_this_thread(&mac));
        // Dropped: gone from the registry.
        mark.note();
        drop(mark);
        assert!(!polled_by_this_thread(&mac));
    }
}
