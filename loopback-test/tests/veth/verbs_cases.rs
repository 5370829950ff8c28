//! The verbs integration cases (`verbs-api/tests/cases`) that both veth
//! test binaries run, one device per namespace (`veth_verbs.rs`) and two
//! shards per device (`veth_verbs_sharded.rs`). A binary declares
//! `mod common;` and `mod cases;` (the verbs-api test files) and a
//! `setup()` that picks its fabric, includes this file with `#[macro_use]`
//! and writes `verbs_cases!(setup);`: one `#[test]` per case below, each
//! calling `setup()` and then the case.

/// One `#[test]` per shared case: `setup()`, then `cases::<name>()`.
macro_rules! verbs_cases {
    ($setup:path) => {
        verbs_cases!(@each $setup;
            send_recv_across_sizes_with_imm,
            write_and_write_with_imm,
            read_across_sizes_and_sges,
            atomics,
            srq_feeds_two_qps,
            ud_send_with_address_handle,
            memory_windows_bind_use_and_invalidate,
            type2_window_bound_by_wr_and_invalidated_by_send,
            many_threads_post_on_many_qps,
            error_state_flushes_everything_once,
            bad_arguments_are_refused_without_queueing,
            a_full_queue_refuses_posts_at_once,
            completion_channel_wakes_a_waiter_and_cq_resize_keeps_entries,
            uc_write_and_send,
        );
    };
    (@each $setup:path; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                $setup();
                crate::cases::$case();
            }
        )*
    };
}
