//! RDMA-CM (`urnic::cm`, the CM agent on QP1) over a real link: two urnic
//! devices in two network namespaces joined by veth, every CM MAD and data
//! frame through AF_XDP and urnic's XDP program; the cases of
//! `verbs-api/tests/cm_cases`.

#[path = "../../verbs-api/tests/cm_cases/mod.rs"]
mod cm_cases;
#[path = "../../verbs-api/tests/common.rs"]
mod common;
mod veth;

fn setup() {
    veth::require_root();
    common::use_fabric(veth::devices);
}

#[test]
fn connect_move_data_disconnect() {
    setup();
    cm_cases::connect_move_data_disconnect();
}

#[test]
fn reject_and_no_listener() {
    setup();
    cm_cases::reject_and_no_listener();
}

#[test]
fn a_device_connects_to_itself() {
    setup();
    cm_cases::a_device_connects_to_itself();
}

#[test]
fn ud_resolution_through_sidr() {
    setup();
    cm_cases::ud_resolution_through_sidr();
}
