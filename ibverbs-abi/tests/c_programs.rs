//! C programs compiled in the suite against the system's
//! `<infiniband/verbs.h>` (libibverbs-dev) and run on urnic's
//! `libibverbs.so.1`:
//!
//! * `bad_arguments_get_libibverbs_answers`: `tests/c/bad_args.c` calls the
//!   verbs with NULL and invalid arguments and attributes inside a network
//!   namespace holding one urnic device, and checks each answer against
//!   what rdma-core (with rxe) returns; it must never crash.
//! * `ud_multicast_through_the_library`: `tests/c/mcast_loop.c` attaches two
//!   UD QPs to a group, sends to it from a third and checks each member's
//!   completion, then that a detached QP gets nothing more.
//! * `struct_layouts_match_the_c_compiler`: the sizes, alignments and field
//!   offsets of the structs the library shares with C programs, as the C
//!   compiler lays them out, against the library's view (bindgen's
//!   translation in `urnic_ibverbs::ffi`), so a layout can never drift
//!   silently.
//!
//! The library is `$URNIC_LIB_DIR/libibverbs.so.1` when that is set;
//! otherwise `bash ibverbs-abi/link.sh debug` builds it from the current
//! source first (a no-op cargo build and one link when nothing changed), so
//! the test never runs a stale library.

#[macro_use]
mod c_harness;

use std::mem::{align_of, offset_of, size_of};

use c_harness::{check_layouts, compile_c, lib_dir, link_args, require_c_toolchain, require_root, run_c_check, run_in_namespace, text, Item};
use urnic_ibverbs::ffi;

const HEADER: &str = "/usr/include/infiniband/verbs.h";

/// A C compiler and the verbs header, or a loud failure saying what to install.
fn require_verbs_toolchain() {
    require_c_toolchain(HEADER, "libibverbs-dev");
}

#[test]
fn bad_arguments_get_libibverbs_answers() {
    require_verbs_toolchain();
    println!("{}", run_c_check("bad_args", "cbad", &["libibverbs.so.1"], false, 100));
}

#[test]
fn ud_multicast_through_the_library() {
    require_verbs_toolchain();
    println!("{}", run_c_check("mcast_loop", "cmc", &["libibverbs.so.1"], false, 11));
}

/// `tests/c/no_alloc.c`: posting and polling through the library's ops
/// (the verbs.h inline calls) make no heap allocation on the program's
/// thread, counted by the program's own malloc, which every allocation of
/// the process (the library's included) goes through.
#[test]
fn posting_and_polling_from_c_allocate_nothing() {
    require_root();
    require_verbs_toolchain();
    let lib = lib_dir("libibverbs.so.1");
    // -rdynamic: the program's malloc is the one the library binds to.
    let mut args = vec!["-rdynamic".to_string()];
    args.extend(link_args(&lib, &["libibverbs.so.1"]));
    let exe = compile_c("no_alloc", &args);
    let o = run_in_namespace("cnoal", &lib, &exe, &|_| Vec::new());
    let out = text(&o);
    assert!(o.status.success(), "no_alloc failed ({}):\n{out}", o.status);
    assert!(out.contains("ok   0 heap allocations") && !out.contains("FAIL"), "{out}");
    println!("{out}");
}

/// Every struct the library reads or writes in memory a C program owns (or
/// hands to a program), with the fields it touches and those verbs.h's
/// inline helpers read.
fn items() -> Vec<Item> {
    let mut v = Vec::new();
    ty!(v, "struct ibv_device", ibv_device);
    at!(v, "struct ibv_device", ibv_device, _ops, node_type, transport_type, name, dev_name, dev_path, ibdev_path);
    ty!(v, "struct ibv_context_ops", ibv_context_ops);
    at!(v, "struct ibv_context_ops", ibv_context_ops, poll_cq, req_notify_cq, post_srq_recv, post_send, post_recv, alloc_mw, bind_mw, dealloc_mw);
    ty!(v, "struct ibv_context", ibv_context);
    at!(v, "struct ibv_context", ibv_context, device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat);
    ty!(v, "struct verbs_context", verbs_context);
    at!(
        v,
        "struct verbs_context",
        verbs_context,
        query_port,
        advise_mr,
        alloc_null_mr,
        alloc_dm,
        query_device_ex,
        create_cq_ex,
        create_qp_ex,
        create_srq_ex,
        get_srq_num,
        open_xrcd,
        close_xrcd,
        sz,
        context,
    );
    ty!(v, "struct ibv_device_attr", ibv_device_attr);
    at!(
        v,
        "struct ibv_device_attr",
        ibv_device_attr,
        fw_ver,
        node_guid,
        sys_image_guid,
        max_mr_size,
        page_size_cap,
        vendor_id,
        vendor_part_id,
        hw_ver,
        max_qp,
        max_qp_wr,
        device_cap_flags,
        max_sge,
        max_sge_rd,
        max_cq,
        max_cqe,
        max_mr,
        max_pd,
        max_qp_rd_atom,
        max_ee_rd_atom,
        max_res_rd_atom,
        max_qp_init_rd_atom,
        max_ee_init_rd_atom,
        atomic_cap,
        max_mw,
        max_ah,
        max_srq,
        max_srq_wr,
        max_srq_sge,
        max_pkeys,
        local_ca_ack_delay,
        phys_port_cnt,
    );
    ty!(v, "struct ibv_device_attr_ex", ibv_device_attr_ex);
    at!(v, "struct ibv_device_attr_ex", ibv_device_attr_ex, orig_attr, comp_mask, odp_caps, completion_timestamp_mask);
    ty!(v, "struct ibv_port_attr", ibv_port_attr);
    at!(
        v,
        "struct ibv_port_attr",
        ibv_port_attr,
        state,
        max_mtu,
        active_mtu,
        gid_tbl_len,
        port_cap_flags,
        max_msg_sz,
        bad_pkey_cntr,
        qkey_viol_cntr,
        pkey_tbl_len,
        lid,
        sm_lid,
        lmc,
        max_vl_num,
        sm_sl,
        subnet_timeout,
        init_type_reply,
        active_width,
        active_speed,
        phys_state,
        link_layer,
        flags,
        port_cap_flags2,
    );
    // struct _compat_ibv_port_attr is incomplete in the header (rdma-core
    // defines it in verbs.c); bad_args.c checks what the exported
    // ibv_query_port writes into it.
    ty!(v, "union ibv_gid", ibv_gid);
    ty!(v, "struct ibv_gid_entry", ibv_gid_entry);
    at!(v, "struct ibv_gid_entry", ibv_gid_entry, gid, gid_index, port_num, gid_type, ndev_ifindex);
    ty!(v, "struct ibv_pd", ibv_pd);
    at!(v, "struct ibv_pd", ibv_pd, context, handle);
    ty!(v, "struct ibv_mr", ibv_mr);
    at!(v, "struct ibv_mr", ibv_mr, context, pd, addr, length, handle, lkey, rkey);
    ty!(v, "struct ibv_mw", ibv_mw);
    at!(v, "struct ibv_mw", ibv_mw, context, pd, rkey, handle);
    at_as!(v, "struct ibv_mw", ibv_mw, "type" => type_);
    ty!(v, "struct ibv_mw_bind_info", ibv_mw_bind_info);
    at!(v, "struct ibv_mw_bind_info", ibv_mw_bind_info, mr, addr, length, mw_access_flags);
    ty!(v, "struct ibv_mw_bind", ibv_mw_bind);
    at!(v, "struct ibv_mw_bind", ibv_mw_bind, wr_id, send_flags, bind_info);
    ty!(v, "struct ibv_comp_channel", ibv_comp_channel);
    at!(v, "struct ibv_comp_channel", ibv_comp_channel, context, fd, refcnt);
    ty!(v, "struct ibv_cq", ibv_cq);
    at!(v, "struct ibv_cq", ibv_cq, context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed, async_events_completed);
    ty!(v, "struct ibv_qp", ibv_qp);
    at!(v, "struct ibv_qp", ibv_qp, context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type, mutex, cond, events_completed);
    ty!(v, "struct ibv_qp_cap", ibv_qp_cap);
    at!(v, "struct ibv_qp_cap", ibv_qp_cap, max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data);
    ty!(v, "struct ibv_qp_init_attr", ibv_qp_init_attr);
    at!(v, "struct ibv_qp_init_attr", ibv_qp_init_attr, qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all);
    ty!(v, "struct ibv_qp_init_attr_ex", ibv_qp_init_attr_ex);
    at!(v, "struct ibv_qp_init_attr_ex", ibv_qp_init_attr_ex, qp_type, sq_sig_all, comp_mask, pd, xrcd, create_flags, send_ops_flags);
    ty!(v, "struct ibv_global_route", ibv_global_route);
    at!(v, "struct ibv_global_route", ibv_global_route, dgid, flow_label, sgid_index, hop_limit, traffic_class);
    ty!(v, "struct ibv_ah_attr", ibv_ah_attr);
    at!(v, "struct ibv_ah_attr", ibv_ah_attr, grh, dlid, sl, src_path_bits, static_rate, is_global, port_num);
    ty!(v, "struct ibv_qp_attr", ibv_qp_attr);
    at!(
        v,
        "struct ibv_qp_attr",
        ibv_qp_attr,
        qp_state,
        cur_qp_state,
        path_mtu,
        path_mig_state,
        qkey,
        rq_psn,
        sq_psn,
        dest_qp_num,
        qp_access_flags,
        cap,
        ah_attr,
        alt_ah_attr,
        pkey_index,
        alt_pkey_index,
        en_sqd_async_notify,
        sq_draining,
        max_rd_atomic,
        max_dest_rd_atomic,
        min_rnr_timer,
        port_num,
        timeout,
        retry_cnt,
        rnr_retry,
        alt_port_num,
        alt_timeout,
        rate_limit,
    );
    ty!(v, "struct ibv_sge", ibv_sge);
    at!(v, "struct ibv_sge", ibv_sge, addr, length, lkey);
    ty!(v, "struct ibv_send_wr", ibv_send_wr);
    at!(v, "struct ibv_send_wr", ibv_send_wr, wr_id, next, sg_list, num_sge, opcode, send_flags, wr, qp_type);
    at_as!(v, "struct ibv_send_wr", ibv_send_wr, "imm_data" => __bindgen_anon_1.imm_data);
    at_as!(v, "struct ibv_send_wr", ibv_send_wr, "invalidate_rkey" => __bindgen_anon_1.invalidate_rkey);
    at!(
        v,
        "struct ibv_send_wr",
        ibv_send_wr,
        wr.rdma.remote_addr,
        wr.rdma.rkey,
        wr.atomic.remote_addr,
        wr.atomic.compare_add,
        wr.atomic.swap,
        wr.atomic.rkey,
        wr.ud.ah,
        wr.ud.remote_qpn,
        wr.ud.remote_qkey,
        qp_type.xrc.remote_srqn,
    );
    at_as!(v, "struct ibv_send_wr", ibv_send_wr, "bind_mw.mw" => __bindgen_anon_2.bind_mw.mw);
    at_as!(v, "struct ibv_send_wr", ibv_send_wr, "bind_mw.rkey" => __bindgen_anon_2.bind_mw.rkey);
    at_as!(v, "struct ibv_send_wr", ibv_send_wr, "bind_mw.bind_info" => __bindgen_anon_2.bind_mw.bind_info);
    at_as!(v, "struct ibv_send_wr", ibv_send_wr, "tso.hdr" => __bindgen_anon_2.tso.hdr);
    at_as!(v, "struct ibv_send_wr", ibv_send_wr, "tso.mss" => __bindgen_anon_2.tso.mss);
    ty!(v, "struct ibv_recv_wr", ibv_recv_wr);
    at!(v, "struct ibv_recv_wr", ibv_recv_wr, wr_id, next, sg_list, num_sge);
    ty!(v, "struct ibv_wc", ibv_wc);
    at!(v, "struct ibv_wc", ibv_wc, wr_id, status, opcode, vendor_err, byte_len, qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits);
    at_as!(v, "struct ibv_wc", ibv_wc, "imm_data" => __bindgen_anon_1.imm_data);
    at_as!(v, "struct ibv_wc", ibv_wc, "invalidated_rkey" => __bindgen_anon_1.invalidated_rkey);
    ty!(v, "struct ibv_grh", ibv_grh);
    ty!(v, "struct ibv_srq", ibv_srq);
    at!(v, "struct ibv_srq", ibv_srq, context, srq_context, pd, handle, mutex, cond, events_completed);
    ty!(v, "struct ibv_srq_attr", ibv_srq_attr);
    at!(v, "struct ibv_srq_attr", ibv_srq_attr, max_wr, max_sge, srq_limit);
    ty!(v, "struct ibv_srq_init_attr", ibv_srq_init_attr);
    at!(v, "struct ibv_srq_init_attr", ibv_srq_init_attr, srq_context, attr);
    ty!(v, "struct ibv_ah", ibv_ah);
    at!(v, "struct ibv_ah", ibv_ah, context, pd, handle);
    ty!(v, "struct ibv_async_event", ibv_async_event);
    at!(v, "struct ibv_async_event", ibv_async_event, element, event_type);
    ty!(v, "struct ibv_ece", ibv_ece);
    v
}

#[test]
fn struct_layouts_match_the_c_compiler() {
    require_verbs_toolchain();
    let items = items();
    let table = check_layouts("infiniband/verbs.h", "urnic_ibverbs::ffi", &items);
    // The container_of in verbs_get_ctx (verbs.h) and in the library both
    // rely on `context` being the last field, right after `sz`.
    assert_eq!(offset_of!(ffi::verbs_context, context) + size_of::<ffi::ibv_context>(), size_of::<ffi::verbs_context>());
    assert_eq!(offset_of!(ffi::verbs_context, sz) + size_of::<usize>(), offset_of!(ffi::verbs_context, context));
    println!("{} layout items agree:\n{table}", items.len());
}
