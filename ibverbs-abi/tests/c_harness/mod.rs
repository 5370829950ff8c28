//! What the C-program tests (c_programs.rs, rdmacm_c.rs) share: the C
//! compiler, urnic's libraries, a C program run in a namespace holding one
//! urnic device and its checks read back (`tests/c/check.h` prints them),
//! and the struct layout comparison against the C compiler.
//!
//! The libraries are `$URNIC_LIB_DIR`'s when that is set; otherwise
//! `bash ibverbs-abi/link.sh debug` builds them from the current source
//! first (a no-op cargo build and one link when nothing changed), so a test
//! never runs a stale library.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use urnic_datapath::netns::VethPair;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A C compiler and `header` (from Debian's `package`), or a loud failure
/// saying what to install.
pub fn require_c_toolchain(header: &str, package: &str) {
    assert!(Path::new(header).exists(), "{header} is missing: apt-get install {package} (deploy/deps.sh build installs it)");
    let cc = Command::new("cc").arg("--version").output();
    assert!(cc.is_ok_and(|o| o.status.success()), "no C compiler `cc`: apt-get install gcc (deploy/deps.sh build installs it)");
}

/// Compile `src` (a C file or, with `stdin_src`, C text on stdin) into
/// `out`, with `extra` arguments after the source; panics with cc's output.
pub fn cc(src: &str, stdin_src: Option<&str>, out: &Path, extra: &[String]) {
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

/// The directory holding urnic's libraries, checked to hold `file` (see
/// the module docs).
pub fn lib_dir(file: &str) -> PathBuf {
    if let Some(d) = std::env::var_os("URNIC_LIB_DIR").filter(|d| !d.is_empty()) {
        let d = PathBuf::from(d);
        assert!(d.join(file).exists(), "URNIC_LIB_DIR={} holds no {file}", d.display());
        return d;
    }
    let o = Command::new("bash").arg(root().join("ibverbs-abi/link.sh")).arg("debug").current_dir(root()).output().expect("run ibverbs-abi/link.sh");
    assert!(o.status.success(), "bash ibverbs-abi/link.sh debug failed ({}):\n{}", o.status, text(&o));
    // link.sh prints the directory, relative to the workspace root.
    let printed = String::from_utf8_lossy(&o.stdout).lines().last().unwrap_or("").trim().to_string();
    let d = root().join(printed);
    assert!(d.join(file).exists(), "link.sh reported {} but it holds no {file}:\n{}", d.display(), text(&o));
    d
}

/// The C program of a test: `tests/c/<name>.c`, compiled with `cc_args`
/// (after the source) into the test's scratch directory.
pub fn compile_c(name: &str, cc_args: &[String]) -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let src = root().join(format!("ibverbs-abi/tests/c/{name}.c"));
    cc(&src.to_string_lossy(), None, &exe, cc_args);
    exe
}

/// The link arguments for urnic's libraries in `lib` (`libs`: their file
/// names): the program is linked against urnic's libraries themselves, so
/// every symbol it imports must be there with rdma-core's version.
pub fn link_args(lib: &Path, libs: &[&str]) -> Vec<String> {
    let mut v = vec![format!("-L{}", lib.display())];
    v.extend(libs.iter().map(|l| format!("-l:{l}")));
    v
}

/// Run `exe` with `args` in a fresh namespace whose only interface (one
/// end of a veth pair, `tag`) is the one urnic device, on the libraries of
/// `lib` (`args` gets the device's IPv4 address); `exe` is removed
/// afterwards.
pub fn run_in_namespace(tag: &str, lib: &Path, exe: &Path, args: &dyn Fn(&str) -> Vec<String>) -> Output {
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
    let a = pair.ipv4[0];
    let o = Command::new("ip")
        .args(["netns", "exec", &pair.ns[0], "env"])
        .arg(format!("LD_LIBRARY_PATH={}", lib.display()))
        .arg(format!("URNIC_DEVICES={}", pair.ifname[0]))
        // No live counters under /run: the test leaves nothing behind.
        .arg("URNIC_STATS=0")
        .arg(exe)
        .args(args(&format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3])))
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
    let _ = std::fs::remove_file(exe);
    o
}

/// The root check of the tests that make namespaces.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test creates network namespaces and attaches XDP programs: run it as root");
}

/// Compile `tests/c/<name>.c` (a program of `tests/c/check.h`'s checks)
/// against urnic's libraries `libs`, run it in a fresh namespace holding
/// one urnic device (`tag`), the device's IPv4 address as its argument
/// when `with_ip`, and return its output after checking it passed: exit 0,
/// no `FAIL`, a summary "N checks, 0 failed" with at least `min_checks`.
pub fn run_c_check(name: &str, tag: &str, libs: &[&str], with_ip: bool, min_checks: usize) -> String {
    require_root();
    let lib = lib_dir(libs[0]);
    let exe = compile_c(name, &link_args(&lib, libs));
    let o = run_in_namespace(tag, &lib, &exe, &|ip| if with_ip { vec![ip.to_string()] } else { Vec::new() });
    let out = text(&o);
    assert!(o.status.success(), "{name} failed ({}):\n{out}", o.status);
    assert!(!out.contains("FAIL") && !out.contains("internal error"), "{out}");
    let summary = out.lines().find(|l| l.ends_with("failed")).unwrap_or("");
    let checks: usize = summary.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(summary.ends_with(" 0 failed") && checks >= min_checks, "expected the full run ({min_checks}+ checks, none failed):\n{out}");
    out
}

/// One compared quantity: its C expression and the library's value.
pub struct Item {
    pub c: String,
    pub rust: usize,
}

/// `sizeof` and `_Alignof` of a C type against its bindgen translation
/// (`ffi::$t`: the test names its bindings module `ffi`).
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

/// The C compiler's value of every item (a program including `header`,
/// e.g. `infiniband/verbs.h`) against the library's (`bindings` names its
/// module in messages): all must agree. Returns the table.
pub fn check_layouts(header: &str, bindings: &str, items: &[Item]) -> String {
    let mut prog = format!("#include <stddef.h>\n#include <stdio.h>\n#include <{header}>\n\nint main(void)\n{{\n");
    for it in items {
        writeln!(prog, "\tprintf(\"%zu\\n\", (size_t)({}));", it.c).unwrap();
    }
    prog.push_str("\treturn 0;\n}\n");
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("layout-{bindings}-{}", std::process::id()));
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
    assert_eq!(wrong, 0, "{wrong} of {} layout items differ between cc and {bindings}:\n{table}", items.len());
    table
}
