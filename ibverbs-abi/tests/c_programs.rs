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

use std::fmt::Write as _;
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use urnic_datapath::netns::VethPair;
use urnic_ibverbs::ffi;

const HEADER: &str = "/usr/include/infiniband/verbs.h";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A C compiler and the verbs header, or a loud failure saying what to install.
fn require_c_toolchain() {
    assert!(Path::new(HEADER).exists(), "{HEADER} is missing: apt-get install libibverbs-dev (deploy/deps.sh build installs it)");
    let cc = Command::new("cc").arg("--version").output();
    assert!(cc.is_ok_and(|o| o.status.success()), "no C compiler `cc`: apt-get install gcc (deploy/deps.sh build installs it)");
}

/// Compile `src` (a C file or, with `stdin_src`, C text on stdin) into
/// `out`, with `extra` arguments after the source; panics with cc's output.
fn cc(src: &str, stdin_src: Option<&str>, out: &Path, extra: &[String]) {
    let mut c = Command::new("cc");
    c.args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"]).arg(out);
    match stdin_src {
        Some(_) => c.args(["-x", "c", "-"]),
        None => c.arg(src),
    };
    c.args(extra).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("run cc");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("cc stdin");
        if let Some(text) = stdin_src {
            stdin.write_all(text.as_bytes()).expect("feed cc");
        }
    }
    let o = child.wait_with_output().expect("cc output");
    assert!(o.status.success(), "cc {src} failed ({}):\n{}", o.status, text(&o));
}

/// The directory holding urnic's libibverbs.so.1 (see the module docs).
fn lib_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("URNIC_LIB_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        assert!(d.join("libibverbs.so.1").exists(), "URNIC_LIB_DIR={} holds no libibverbs.so.1", d.display());
        return d;
    }
    let o = Command::new("bash").arg(root().join("ibverbs-abi/link.sh")).arg("debug").current_dir(root()).output().expect("run ibverbs-abi/link.sh");
    assert!(o.status.success(), "bash ibverbs-abi/link.sh debug failed ({}):\n{}", o.status, text(&o));
    // link.sh prints the directory, relative to the workspace root.
    let printed = String::from_utf8_lossy(&o.stdout).lines().last().unwrap_or("").trim().to_string();
    let d = root().join(printed);
    assert!(d.join("libibverbs.so.1").exists(), "link.sh reported {} but it holds no libibverbs.so.1:\n{}", d.display(), text(&o));
    d
}

/// Compile `tests/c/<name>.c` against urnic's library, run it in a fresh
/// namespace whose only interface (one end of a veth pair) is the one
/// urnic device, and return its output after checking it passed: exit 0,
/// no `FAIL`, a last line "N checks, 0 failed" with at least `min_checks`.
fn run_c_check(name: &str, tag: &str, min_checks: usize) -> String {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test creates network namespaces and attaches XDP programs: run it as root");
    require_c_toolchain();
    let lib = lib_dir();
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let src = root().join(format!("ibverbs-abi/tests/c/{name}.c"));
    // Linked against urnic's library itself: every symbol the program
    // imports must exist there, with rdma-core's version.
    cc(&src.to_string_lossy(), None, &exe, &[format!("-L{}", lib.display()), "-l:libibverbs.so.1".into()]);

    let pair = VethPair::create(tag, 1500).expect("veth pair in two namespaces (needs root and iproute2)");
    // The kernel reports a new veth's carrier a moment after it is set up
    // (linkwatch); until then no device is eligible. A hang guard, not a
    // timing assertion.
    let start = Instant::now();
    loop {
        let out = Command::new("ip").args(["-n", &pair.ns[0], "-o", "link", "show", &pair.ifname[0]]).output().expect("ip link");
        if String::from_utf8_lossy(&out.stdout).contains("state UP") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "veth never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = Command::new("ip")
        .args(["netns", "exec", &pair.ns[0], "env"])
        .arg(format!("LD_LIBRARY_PATH={}", lib.display()))
        .arg(format!("URNIC_DEVICES={}", pair.ifname[0]))
        // No live counters under /run: the test leaves nothing behind.
        .arg("URNIC_STATS=0")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
    let _ = std::fs::remove_file(&exe);
    let out = text(&o);
    assert!(o.status.success(), "{name} failed ({}):\n{out}", o.status);
    assert!(!out.contains("FAIL") && !out.contains("internal error"), "{out}");
    let summary = out.lines().find(|l| l.ends_with("failed")).unwrap_or("");
    let checks: usize = summary.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(summary.ends_with(" 0 failed") && checks >= min_checks, "expected the full run ({min_checks}+ checks, none failed):\n{out}");
    out
}

#[test]
fn bad_arguments_get_libibverbs_answers() {
    println!("{}", run_c_check("bad_args", "cbad", 100));
}

#[test]
fn ud_multicast_through_the_library() {
    println!("{}", run_c_check("mcast_loop", "cmc", 11));
}

/// `tests/c/no_alloc.c`: posting and polling through the library's ops
/// (the verbs.h inline calls) make no heap allocation on the program's
/// thread, counted by the program's own malloc, which every allocation of
/// the process (the library's included) goes through.
#[test]
fn posting_and_polling_from_c_allocate_nothing() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test creates network namespaces and attaches XDP programs: run it as root");
    require_c_toolchain();
    let lib = lib_dir();
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("no_alloc-{}", std::process::id()));
    let src = root().join("ibverbs-abi/tests/c/no_alloc.c");
    // -rdynamic: the program's malloc is the one the library binds to.
    cc(&src.to_string_lossy(), None, &exe, &["-rdynamic".into(), format!("-L{}", lib.display()), "-l:libibverbs.so.1".into()]);
    let pair = VethPair::create("cnoal", 1500).expect("veth pair in two namespaces (needs root and iproute2)");
    // Wait for the carrier (see bad_arguments_get_libibverbs_answers): a hang guard.
    let start = Instant::now();
    loop {
        let out = Command::new("ip").args(["-n", &pair.ns[0], "-o", "link", "show", &pair.ifname[0]]).output().expect("ip link");
        if String::from_utf8_lossy(&out.stdout).contains("state UP") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "veth never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = Command::new("ip")
        .args(["netns", "exec", &pair.ns[0], "env"])
        .arg(format!("LD_LIBRARY_PATH={}", lib.display()))
        .arg(format!("URNIC_DEVICES={}", pair.ifname[0]))
        .arg("URNIC_STATS=0")
        .arg(&exe)
        .output()
        .expect("run no_alloc");
    let _ = std::fs::remove_file(&exe);
    let out = text(&o);
    assert!(o.status.success(), "no_alloc failed ({}):\n{out}", o.status);
    assert!(out.contains("ok   0 heap allocations") && !out.contains("FAIL"), "{out}");
    println!("{out}");
}

/// One compared quantity: its C expression and the library's value.
struct Item {
    c: String,
    rust: usize,
}

/// `sizeof` and `_Alignof` of a C type against its bindgen translation.
macro_rules! ty {
    ($v:ident, $c:literal, $t:ident) => {
        $v.push(Item { c: format!("sizeof({})", $c), rust: size_of::<ffi::$t>() });
        $v.push(Item { c: format!("_Alignof({})", $c), rust: align_of::<ffi::$t>() });
    };
}

/// `offsetof` of fields whose path is the same in C and Rust.
macro_rules! at {
    ($v:ident, $c:literal, $t:ident, $($($f:ident).+),+ $(,)?) => {
        $( $v.push(Item { c: format!("offsetof({}, {})", $c, stringify!($($f).+)), rust: offset_of!(ffi::$t, $($f).+) }); )+
    };
}

/// `offsetof` of a field bindgen names differently (anonymous unions, Rust
/// keywords): its C path, then the Rust one.
macro_rules! at_as {
    ($v:ident, $c:literal, $t:ident, $cf:literal => $($f:ident).+) => {
        $v.push(Item { c: format!("offsetof({}, {})", $c, $cf), rust: offset_of!(ffi::$t, $($f).+) });
    };
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
    require_c_toolchain();
    let items = items();
    let mut prog = String::from("#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\nint main(void)\n{\n");
    for it in &items {
        writeln!(prog, "\tprintf(\"%zu\\n\", (size_t)({}));", it.c).unwrap();
    }
    prog.push_str("\treturn 0;\n}\n");
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("layout-{}", std::process::id()));
    cc("<generated layout program>", Some(&prog), &exe, &[]);
    let o = Command::new(&exe).output().expect("run the layout program");
    let _ = std::fs::remove_file(&exe);
    assert!(o.status.success(), "layout program failed:\n{}", text(&o));
    let c_values: Vec<usize> = String::from_utf8_lossy(&o.stdout).lines().map(|l| l.trim().parse().expect("a number")).collect();
    assert_eq!(c_values.len(), items.len(), "the layout program printed {} values for {} items", c_values.len(), items.len());
    let mut table = String::new();
    let mut wrong = 0;
    for (it, c) in items.iter().zip(&c_values) {
        let mark = if *c == it.rust { "" } else { "   <-- differs" };
        wrong += usize::from(*c != it.rust);
        writeln!(table, "{:<70} C {:>5}  urnic {:>5}{mark}", it.c, c, it.rust).unwrap();
    }
    assert_eq!(wrong, 0, "{wrong} of {} layout items differ between cc and urnic_ibverbs::ffi:\n{table}", items.len());
    // The container_of in verbs_get_ctx (verbs.h) and in the library both
    // rely on `context` being the last field, right after `sz`.
    assert_eq!(offset_of!(ffi::verbs_context, context) + size_of::<ffi::ibv_context>(), size_of::<ffi::verbs_context>());
    assert_eq!(offset_of!(ffi::verbs_context, sz) + size_of::<usize>(), offset_of!(ffi::verbs_context, context));
    println!("{} layout items agree:\n{table}", items.len());
}
