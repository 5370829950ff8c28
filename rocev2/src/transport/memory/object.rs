//! What a key names: a memory region or a memory window, and a window's
//! bind state. Shared by the key pool, the checker and the window rules.

use super::region::Region;
use super::MwType;
use crate::transport::ids::{Access, PdId};

#[derive(Debug)]
pub(super) enum Object {
    Mr(Region),
    Mw(Window),
}

#[derive(Clone, Copy, Debug)]
pub(super) enum WindowState {
    /// Allocated, not bound (type 2 after invalidation, type 1 unbound).
    Free,
    /// Bound to `[addr, addr + len)` of the MR at index `mr`.
    Bound {
        mr: u32,
        addr: u64,
        len: u64,
        access: Access,
        /// Type 2: the QP the window is bound to.
        qpn: Option<u32>,
    },
}

#[derive(Debug)]
pub(super) struct Window {
    pub(super) pd: PdId,
    pub(super) ty: MwType,
    pub(super) state: WindowState,
}
