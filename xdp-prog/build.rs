//! Compiles the XDP program with clang through libbpf-cargo: the object goes
//! to `$OUT_DIR/urnic.bpf.o` (embedded by the loader), the skeleton beside it.

use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SRC: &str = "src/bpf/urnic.bpf.c";

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    println!("cargo:rerun-if-changed={SRC}");
    if std::process::Command::new("clang").arg("--version").output().is_err() {
        panic!("clang is needed to build urnic's XDP program: run `bash deploy/deps.sh build`");
    }
    let obj = out.join("urnic.bpf.o");
    let r = SkeletonBuilder::new()
        .source(SRC)
        .obj(&obj)
        .clang_args(["-I/usr/include/x86_64-linux-gnu", "-O2", "-g", "-Wall"])
        .build_and_generate(out.join("urnic.skel.rs"));
    if let Err(e) = r {
        panic!("building {SRC} with clang/libbpf-cargo failed (is libbpf-dev installed? run `bash deploy/deps.sh build`): {e:#}");
    }
}
