//! RDMA-CM through the Rust API (`urnic::cm`) on the in-memory hub: two
//! devices, and one device connecting to itself (cases in `cm_cases`).

mod cm_cases;
mod common;

#[test]
fn connect_move_data_disconnect() {
    cm_cases::connect_move_data_disconnect();
}

#[test]
fn reject_and_no_listener() {
    cm_cases::reject_and_no_listener();
}

#[test]
fn a_device_connects_to_itself() {
    cm_cases::a_device_connects_to_itself();
}

#[test]
fn ud_resolution_through_sidr() {
    cm_cases::ud_resolution_through_sidr();
}
