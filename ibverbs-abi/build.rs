//! Struct layouts come from the system's `<infiniband/verbs.h>`
//! (libibverbs-dev), translated by bindgen at build time, so they cannot
//! drift from what C programs were compiled against.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=/usr/include/infiniband/verbs.h");
    let header = "/usr/include/infiniband/verbs.h";
    if !std::path::Path::new(header).exists() {
        panic!("{header} is missing: install libibverbs-dev (deploy/deps.sh build does)");
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("verbs.rs");
    bindgen::Builder::default()
        .header_contents(
            "wrapper.h",
            "#include <infiniband/verbs.h>\n#include <infiniband/sa.h>\n#include <rdma/ib_user_verbs.h>\n#include <rdma/ib_user_sa.h>\n",
        )
        .allowlist_type("ibv_.*|verbs_.*|_compat_ibv_port_attr|ib_uverbs_qp_attr|ib_uverbs_ah_attr|ib_user_path_rec")
        .allowlist_var("IBV_.*|IB_.*")
        .allowlist_function("ibv_wc_status_str")
        .blocklist_function(".*")
        .derive_default(true)
        .derive_debug(false)
        .prepend_enum_name(false)
        .layout_tests(true)
        .generate()
        .expect("bindgen on <infiniband/verbs.h>")
        .write_to_file(&out)
        .expect("write verbs.rs");

    // librdmacm's structs (librdmacm-dev), over the verbs types above.
    println!("cargo:rerun-if-changed=/usr/include/rdma/rdma_cma.h");
    let cma = "/usr/include/rdma/rdma_cma.h";
    if !std::path::Path::new(cma).exists() {
        panic!("{cma} is missing: install librdmacm-dev (deploy/deps.sh build does)");
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("rdma_cma.rs");
    bindgen::Builder::default()
        .header_contents("wrapper.h", "#include <rdma/rdma_cma.h>\n#include <rdma/rdma_verbs.h>\n")
        .allowlist_type("rdma_.*")
        .allowlist_var("RDMA_.*|RAI_.*")
        .blocklist_type("ibv_.*|_ibv_.*|_compat_ibv_.*|verbs_.*|pthread_.*|__pthread.*")
        .raw_line("use crate::ffi::*;")
        .blocklist_function(".*")
        .derive_default(true)
        .derive_debug(false)
        .prepend_enum_name(false)
        .layout_tests(true)
        .generate()
        .expect("bindgen on <rdma/rdma_cma.h>")
        .write_to_file(&out)
        .expect("write rdma_cma.rs");
}
