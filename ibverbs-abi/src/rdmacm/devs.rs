//! The devices RDMA-CM opens (through `ibv_open_device`, so its contexts
//! are the ones libibverbs calls accept), each with its CM agent and the
//! thread that hands the agent's events to channels; `rdma_get_devices`.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::addr::eligible;
use super::{with_cma, CmDev, Cma};
use crate::ffi::*;
use crate::guard;

/// The index of `ifname`'s device in `c.devs`, opening it (and starting
/// its CM agent and the thread that hands its events to channels).
pub(crate) unsafe fn open_dev(c: &mut Cma, ifname: &str) -> Result<usize, c_int> {
    if let Some(i) = c.devs.iter().position(|d| d.ifname == ifname) {
        return Ok(i);
    }
    let mut n = 0;
    let list = crate::device::ibv_get_device_list(&mut n);
    if list.is_null() {
        return Err(libc::ENODEV);
    }
    let want = format!("urnic-{ifname}");
    let mut dev = ptr::null_mut();
    for i in 0..n as usize {
        let d = *list.add(i);
        if CStr::from_ptr((*d).name.as_ptr()).to_bytes() == want.as_bytes() {
            dev = d;
        }
    }
    crate::device::ibv_free_device_list(list);
    if dev.is_null() {
        return Err(libc::ENODEV);
    }
    let verbs = crate::device::ibv_open_device(dev);
    if verbs.is_null() {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::ENODEV));
    }
    let Some(u) = crate::ctx::uctx(verbs) else { return Err(libc::ENODEV) };
    u.held.store(true, Ordering::Release);
    let chan = match urnic::cm::CmChannel::new(&u.ctx) {
        Ok(ch) => Arc::new(ch),
        Err(e) => return Err(super::errno(&e)),
    };
    let pd = crate::mr::ibv_alloc_pd(verbs);
    if pd.is_null() {
        return Err(libc::ENOMEM);
    }
    let idx = c.devs.len();
    c.devs.push(CmDev { ifname: ifname.to_string(), verbs, chan: chan.clone(), pd });
    super::dispatch::start(idx, ifname, chan);
    Ok(idx)
}

/// Open every eligible device (a wildcard listener listens on all).
pub(crate) unsafe fn open_all(c: &mut Cma) -> Vec<usize> {
    let mut v = vec![];
    for d in eligible() {
        match open_dev(c, &d.ifname) {
            Ok(i) => v.push(i),
            Err(e) => eprintln!("urnic librdmacm: opening urnic-{}: {}", d.ifname, std::io::Error::from_raw_os_error(e)),
        }
    }
    v
}

/// `rdma_get_devices`: the contexts of every urnic device, opened.
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard("rdma_get_devices", ptr::null_mut(), || {
        let ctxs: Vec<*mut ibv_context> = with_cma(|c| {
            open_all(c);
            c.devs.iter().map(|d| d.verbs).collect()
        });
        let arr = libc::calloc(ctxs.len() + 1, std::mem::size_of::<*mut ibv_context>()) as *mut *mut ibv_context;
        if arr.is_null() {
            return super::event::null(libc::ENOMEM);
        }
        for (i, c) in ctxs.iter().enumerate() {
            *arr.add(i) = *c;
        }
        if !num.is_null() {
            *num = ctxs.len() as c_int;
        }
        arr
    })
}

/// `rdma_free_devices`: the array only (contexts stay open, as librdmacm's).
#[no_mangle]
pub unsafe extern "C" fn urnic_rdma_free_devices(list: *mut *mut ibv_context) {
    libc::free(list.cast());
}
