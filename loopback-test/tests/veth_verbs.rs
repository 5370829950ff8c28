//! The verbs integration cases of `verbs-api/tests/cases` over a real link:
//! two urnic devices, each in its own network namespace, joined by veth,
//! every frame through AF_XDP sockets and urnic's XDP program. Each test
//! makes its own namespaces; they are removed at exit (also after a failed
//! test) and by `VethPair::sweep_stale` if a run was killed.

#[path = "../../verbs-api/tests/common.rs"]
mod common;
#[path = "../../verbs-api/tests/cases/mod.rs"]
mod cases;
mod veth;

fn setup() {
    veth::require_root();
    common::use_fabric(veth::devices);
}

#[test]
fn send_recv_across_sizes_with_imm() {
    setup();
    cases::send_recv_across_sizes_with_imm();
}

#[test]
fn write_and_write_with_imm() {
    setup();
    cases::write_and_write_with_imm();
}

#[test]
fn read_across_sizes_and_sges() {
    setup();
    cases::read_across_sizes_and_sges();
}

#[test]
fn atomics() {
    setup();
    cases::atomics();
}

#[test]
fn srq_feeds_two_qps() {
    setup();
    cases::srq_feeds_two_qps();
}

#[test]
fn ud_send_with_address_handle() {
    setup();
    cases::ud_send_with_address_handle();
}

#[test]
fn memory_windows_bind_use_and_invalidate() {
    setup();
    cases::memory_windows_bind_use_and_invalidate();
}

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

#[test]
fn type2_window_bound_by_wr_and_invalidated_by_send() {
    setup();
    cases::type2_window_bound_by_wr_and_invalidated_by_send();
}

#[test]
fn many_threads_post_on_many_qps() {
    setup();
    cases::many_threads_post_on_many_qps();
}

#[test]
fn error_state_flushes_everything_once() {
    setup();
    cases::error_state_flushes_everything_once();
}

#[test]
fn bad_arguments_are_refused_without_queueing() {
    setup();
    cases::bad_arguments_are_refused_without_queueing();
}

#[test]
fn completion_channel_wakes_a_waiter_and_cq_resize_keeps_entries() {
    setup();
    cases::completion_channel_wakes_a_waiter_and_cq_resize_keeps_entries();
}

#[test]
fn uc_write_and_send() {
    setup();
    cases::uc_write_and_send();
}
