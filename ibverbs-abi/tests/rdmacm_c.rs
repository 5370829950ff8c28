//! C programs against the system's `<rdma/rdma_cma.h>` (librdmacm-dev) on
//! urnic's `librdmacm.so.1`:
//!
//! * `rdmacm_bad_arguments_get_librdmacm_answers`: `tests/c/rdmacm_bad_args.c`
//!   calls the `rdma_*` functions with NULL and invalid arguments and in the
//!   wrong states inside a network namespace holding one urnic device; every
//!   answer must be librdmacm's (-1 and errno), never a crash.
//! * `signals_interrupt_blocked_waits_as_the_kernels_channels_do`:
//!   `tests/c/interrupted_waits.c`, blocking waits of both libraries under
//!   SIGALRM with and without SA_RESTART.
//! * `rdmacm_struct_layouts_match_the_c_compiler`: sizes, alignments and
//!   field offsets of librdmacm's structs as cc lays them out, against
//!   bindgen's translation in `urnic_ibverbs::cmffi`.
//! * `librdmacm_exports_rdma_cores_versions`: every symbol Debian's
//!   librdmacm.so.1 exports is exported by ours with the same version.
//!
//! The libraries are `$URNIC_LIB_DIR`'s when that is set; otherwise
//! `bash ibverbs-abi/link.sh debug` builds them from the current source.

#[macro_use]
mod c_harness;

use std::mem::{align_of, offset_of, size_of};
use std::path::Path;
use std::process::Command;

use c_harness::{check_layouts, lib_dir, require_c_toolchain, run_c_check, text, Item};
use urnic_ibverbs::cmffi as ffi;

/// A C compiler and librdmacm's header, or a loud failure saying what to install.
fn require_rdmacm_toolchain() {
    require_c_toolchain("/usr/include/rdma/rdma_cma.h", "librdmacm-dev");
}

#[test]
fn rdmacm_bad_arguments_get_librdmacm_answers() {
    require_rdmacm_toolchain();
    // Linked against urnic's libraries; the device's address is its argument.
    println!("{}", run_c_check("rdmacm_bad_args", "cmbad", &["librdmacm.so.1", "libibverbs.so.1"], true, 50));
}

/// `tests/c/interrupted_waits.c`: a signal ends a blocked
/// `ibv_get_cq_event`, `ibv_get_async_event` or `rdma_get_cm_event` with
/// EINTR when its handler lacks SA_RESTART (qperf ends its tests so), and
/// with SA_RESTART the wait goes on to its event.
#[test]
fn signals_interrupt_blocked_waits_as_the_kernels_channels_do() {
    require_rdmacm_toolchain();
    println!("{}", run_c_check("interrupted_waits", "cmintr", &["librdmacm.so.1", "libibverbs.so.1"], true, 5));
}

fn items() -> Vec<Item> {
    let mut v = Vec::new();
    ty!(v, "struct rdma_event_channel", rdma_event_channel);
    at!(v, "struct rdma_event_channel", rdma_event_channel, fd);
    ty!(v, "struct rdma_cm_id", rdma_cm_id);
    at!(
        v,
        "struct rdma_cm_id",
        rdma_cm_id,
        verbs,
        channel,
        context,
        qp,
        route,
        ps,
        port_num,
        event,
        send_cq_channel,
        send_cq,
        recv_cq_channel,
        recv_cq,
        srq,
        pd,
        qp_type
    );
    ty!(v, "struct rdma_route", rdma_route);
    at!(v, "struct rdma_route", rdma_route, addr, path_rec, num_paths);
    ty!(v, "struct rdma_addr", rdma_addr);
    at_as!(v, "struct rdma_addr", rdma_addr, "src_addr" => __bindgen_anon_1);
    at_as!(v, "struct rdma_addr", rdma_addr, "dst_addr" => __bindgen_anon_2);
    at!(v, "struct rdma_addr", rdma_addr, addr);
    ty!(v, "struct rdma_ib_addr", rdma_ib_addr);
    at!(v, "struct rdma_ib_addr", rdma_ib_addr, sgid, dgid, pkey);
    ty!(v, "struct rdma_conn_param", rdma_conn_param);
    at!(
        v,
        "struct rdma_conn_param",
        rdma_conn_param,
        private_data,
        private_data_len,
        responder_resources,
        initiator_depth,
        flow_control,
        retry_count,
        rnr_retry_count,
        srq,
        qp_num
    );
    ty!(v, "struct rdma_ud_param", rdma_ud_param);
    at!(v, "struct rdma_ud_param", rdma_ud_param, private_data, private_data_len, ah_attr, qp_num, qkey);
    ty!(v, "struct rdma_cm_event", rdma_cm_event);
    at!(v, "struct rdma_cm_event", rdma_cm_event, id, listen_id, event, status, param);
    ty!(v, "struct rdma_addrinfo", rdma_addrinfo);
    at!(
        v,
        "struct rdma_addrinfo",
        rdma_addrinfo,
        ai_flags,
        ai_family,
        ai_qp_type,
        ai_port_space,
        ai_src_len,
        ai_dst_len,
        ai_src_addr,
        ai_dst_addr,
        ai_src_canonname,
        ai_dst_canonname,
        ai_route_len,
        ai_route,
        ai_connect_len,
        ai_connect,
        ai_next
    );
    v
}

#[test]
fn rdmacm_struct_layouts_match_the_c_compiler() {
    require_rdmacm_toolchain();
    let items = items();
    let table = check_layouts("rdma/rdma_cma.h", "urnic_ibverbs::cmffi", &items);
    println!("{} layout items agree:\n{table}", items.len());
}

/// `(symbol, version)` of the dynamic symbols a library defines.
fn exports(lib: &Path) -> Vec<(String, String)> {
    let o = Command::new("objdump").arg("-T").arg(lib).output().expect("objdump (binutils)");
    assert!(o.status.success(), "objdump -T {}:\n{}", lib.display(), text(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.contains("*UND*"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (ver, name) = (f.get(f.len().checked_sub(2)?)?, f.last()?);
            ver.starts_with("RDMACM_").then(|| (name.to_string(), ver.to_string()))
        })
        .collect()
}

#[test]
fn librdmacm_exports_rdma_cores_versions() {
    let system = Path::new("/usr/lib/x86_64-linux-gnu/librdmacm.so.1");
    assert!(system.exists(), "Debian's librdmacm.so.1 is missing: apt-get install librdmacm1");
    let ours = exports(&lib_dir("librdmacm.so.1").join("librdmacm.so.1"));
    let theirs = exports(system);
    assert!(theirs.len() > 60, "{theirs:?}");
    let missing: Vec<_> = theirs.iter().filter(|s| !ours.contains(s)).collect();
    assert!(missing.is_empty(), "symbols Debian's librdmacm exports and ours does not (name, version): {missing:?}");
}
