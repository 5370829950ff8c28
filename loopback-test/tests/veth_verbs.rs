//! The verbs integration cases of `verbs-api/tests/cases` over a real link:
//! two urnic devices, each in its own network namespace, joined by veth,
//! every frame through AF_XDP sockets and urnic's XDP program. Each test
//! makes its own namespaces; they are removed at exit (also after a failed
//! test) and by `VethPair::sweep_stale` if a run was killed.

#[path = "../../verbs-api/tests/cases/mod.rs"]
mod cases;
#[path = "../../verbs-api/tests/common.rs"]
mod common;
mod veth;
#[macro_use]
#[path = "veth/verbs_cases.rs"]
mod verbs_cases;

fn setup() {
    veth::require_root();
    common::use_fabric(veth::devices);
}

verbs_cases!(setup);

#[test]
fn dereg_with_a_bound_window_is_busy_and_changes_nothing() {
    setup();
    cases::dereg_with_a_bound_window_is_busy_and_changes_nothing();
}

#[test]
fn dropping_a_region_with_bound_windows_defers_its_release() {
    setup();
    cases::dropping_a_region_with_bound_windows_defers_its_release();
}
