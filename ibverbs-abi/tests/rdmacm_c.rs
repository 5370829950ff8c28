//! C programs against the system's `<rdma/rdma_cma.h>` (librdmacm-dev) on
//! urnic's `librdmacm.so.1`:
//!
//! * `rdmacm_bad_arguments_get_librdmacm_answers`: `tests/c/rdmacm_bad_args.c`
//!   calls the `rdma_*` functions with NULL and invalid arguments and in the
//!   wrong states inside a network namespace holding one urnic device; every
//!   answer must be librdmacm's (-1 and errno), never a crash.
//! * `rdmacm_struct_layouts_match_the_c_compiler`: sizes, alignments and
//!   field offsets of librdmacm's structs as cc lays them out, against
//!   bindgen's translation in `urnic_ibverbs::cmffi`.
//! * `librdmacm_exports_rdma_cores_versions`: every symbol Debian's
//!   librdmacm.so.1 exports is exported by ours with the same version.
//!
//! The libraries are `$URNIC_LIB_DIR`'s when that is set; otherwise
//! `bash ibverbs-abi/link.sh debug` builds them from the current source.

use std::fmt::Write as _;
use std::mem::{align_of, offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use urnic_datapath::netns::VethPair;
use urnic_ibverbs::cmffi;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn require_c_toolchain() {
    let h = "/usr/include/rdma/rdma_cma.h";
    assert!(Path::new(h).exists(), "{h} is missing: apt-get install librdmacm-dev (deploy/deps.sh build installs it)");
    let cc = Command::new("cc").arg("--version").output();
    assert!(cc.is_ok_and(|o| o.status.success()), "no C compiler `cc`: apt-get install gcc");
}

fn cc(src: Option<&Path>, text_src: Option<&str>, out: &Path, extra: &[String]) {
    let mut c = Command::new("cc");
    c.args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-o"]).arg(out);
    match src {
        Some(p) => c.arg(p),
        None => c.args(["-x", "c", "-"]),
    };
    c.args(extra).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("run cc");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("cc stdin");
        if let Some(t) = text_src {
            stdin.write_all(t.as_bytes()).expect("feed cc");
        }
    }
    let o = child.wait_with_output().expect("cc output");
    assert!(o.status.success(), "cc failed ({}):\n{}", o.status, text(&o));
}

fn lib_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("URNIC_LIB_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        assert!(d.join("librdmacm.so.1").exists(), "URNIC_LIB_DIR={} holds no librdmacm.so.1", d.display());
        return d;
    }
    let o = Command::new("bash").arg(root().join("ibverbs-abi/link.sh")).arg("debug").current_dir(root()).output().expect("run ibverbs-abi/link.sh");
    assert!(o.status.success(), "bash ibverbs-abi/link.sh debug failed ({}):\n{}", o.status, text(&o));
    let printed = String::from_utf8_lossy(&o.stdout).lines().last().unwrap_or("").trim().to_string();
    let d = root().join(printed);
    assert!(d.join("librdmacm.so.1").exists(), "link.sh reported {} but it holds no librdmacm.so.1:\n{}", d.display(), text(&o));
    d
}

#[test]
fn rdmacm_bad_arguments_get_librdmacm_answers() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test creates network namespaces and attaches XDP programs: run it as root");
    require_c_toolchain();
    let lib = lib_dir();
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("rdmacm_bad_args-{}", std::process::id()));
    let src = root().join("ibverbs-abi/tests/c/rdmacm_bad_args.c");
    // Linked against urnic's libraries: every symbol it imports must be
    // there with rdma-core's version.
    cc(Some(&src), None, &exe, &[format!("-L{}", lib.display()), "-l:librdmacm.so.1".into(), "-l:libibverbs.so.1".into()]);

    let pair = VethPair::create("cmbad", 1500).expect("veth pair in two namespaces (needs root and iproute2)");
    let start = Instant::now();
    loop {
        let out = Command::new("ip").args(["-n", &pair.ns[0], "-o", "link", "show", &pair.ifname[0]]).output().expect("ip link");
        if String::from_utf8_lossy(&out.stdout).contains("state UP") {
            break;
        }
        // A hang guard, not a timing assertion.
        assert!(start.elapsed() < Duration::from_secs(30), "veth never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let a = pair.ipv4[0];
    let o = Command::new("ip")
        .args(["netns", "exec", &pair.ns[0], "env"])
        .arg(format!("LD_LIBRARY_PATH={}", lib.display()))
        .arg(format!("URNIC_DEVICES={}", pair.ifname[0]))
        .arg("URNIC_STATS=0")
        .arg(&exe)
        .arg(format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]))
        .output()
        .expect("run rdmacm_bad_args");
    let _ = std::fs::remove_file(&exe);
    let out = text(&o);
    assert!(o.status.success(), "rdmacm_bad_args failed ({}):\n{out}", o.status);
    assert!(!out.contains("FAIL") && !out.contains("internal error"), "{out}");
    let summary = out.lines().find(|l| l.ends_with("failed")).unwrap_or("");
    let checks: usize = summary.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(summary.ends_with(" 0 failed") && checks >= 50, "expected the full run (50+ checks, none failed):\n{out}");
    println!("{out}");
}

struct Item {
    c: String,
    rust: usize,
}

macro_rules! ty {
    ($v:ident, $c:literal, $t:ident) => {
        $v.push(Item { c: format!("sizeof({})", $c), rust: size_of::<cmffi::$t>() });
        $v.push(Item { c: format!("_Alignof({})", $c), rust: align_of::<cmffi::$t>() });
    };
}

macro_rules! at {
    ($v:ident, $c:literal, $t:ident, $($($f:ident).+),+ $(,)?) => {
        $( $v.push(Item { c: format!("offsetof({}, {})", $c, stringify!($($f).+)), rust: offset_of!(cmffi::$t, $($f).+) }); )+
    };
}

macro_rules! at_as {
    ($v:ident, $c:literal, $t:ident, $cf:literal => $($f:ident).+) => {
        $v.push(Item { c: format!("offsetof({}, {})", $c, $cf), rust: offset_of!(cmffi::$t, $($f).+) });
    };
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
    require_c_toolchain();
    let items = items();
    let mut prog = String::from("#include <stddef.h>\n#include <stdio.h>\n#include <rdma/rdma_cma.h>\n\nint main(void)\n{\n");
    for it in &items {
        writeln!(prog, "\tprintf(\"%zu\\n\", (size_t)({}));", it.c).unwrap();
    }
    prog.push_str("\treturn 0;\n}\n");
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cmlayout-{}", std::process::id()));
    cc(None, Some(&prog), &exe, &[]);
    let o = Command::new(&exe).output().expect("run the layout program");
    let _ = std::fs::remove_file(&exe);
    assert!(o.status.success(), "layout program failed:\n{}", text(&o));
    let c_values: Vec<usize> = String::from_utf8_lossy(&o.stdout).lines().map(|l| l.trim().parse().expect("a number")).collect();
    assert_eq!(c_values.len(), items.len());
    let mut table = String::new();
    let mut wrong = 0;
    for (it, c) in items.iter().zip(&c_values) {
        let mark = if *c == it.rust { "" } else { "   <-- differs" };
        wrong += usize::from(*c != it.rust);
        writeln!(table, "{:<60} C {:>5}  urnic {:>5}{mark}", it.c, c, it.rust).unwrap();
    }
    assert_eq!(wrong, 0, "{wrong} of {} layout items differ between cc and urnic_ibverbs::cmffi:\n{table}", items.len());
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
    let ours = exports(&lib_dir().join("librdmacm.so.1"));
    let theirs = exports(system);
    assert!(theirs.len() > 60, "{theirs:?}");
    let missing: Vec<_> = theirs.iter().filter(|s| !ours.contains(s)).collect();
    assert!(missing.is_empty(), "symbols Debian's librdmacm exports and ours does not (name, version): {missing:?}");
}
