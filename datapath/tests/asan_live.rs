//! Whether the address sanitizer is really watching, for `deploy/asan.sh`:
//! a run under it that reports nothing means something only if the code is
//! instrumented and the runtime reports what it finds. The test starts
//! itself again as a child that reads one byte past a heap allocation, and
//! checks that the sanitizer stopped the child with its report. It is
//! ignored in ordinary runs, which have no sanitizer to find (the child's
//! read would go unreported and the test fail); `deploy/asan.sh` runs it
//! with `--ignored`.

use std::process::Command;

/// Set in the child: make the faulty read.
const CHILD: &str = "URNIC_ASAN_LIVE_CHILD";

const NAME: &str = "the_sanitizer_reports_a_read_past_an_allocation";

#[test]
#[ignore = "only under the address sanitizer: deploy/asan.sh runs it"]
fn the_sanitizer_reports_a_read_past_an_allocation() {
    if std::env::var_os(CHILD).is_some() {
        let block = std::hint::black_box(vec![7u8; 24]);
        // SAFETY: none, on purpose: this read past the allocation is the
        // fault the sanitizer must report, made only in the child process.
        let past = unsafe { std::ptr::read_volatile(block.as_ptr().wrapping_add(block.len())) };
        std::hint::black_box(past);
        return;
    }
    let exe = std::env::current_exe().expect("the test's own executable");
    let out = Command::new(exe).args(["--exact", NAME, "--ignored", "--test-threads", "1"]).env(CHILD, "1").output().expect("start the child");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("AddressSanitizer: heap-buffer-overflow"),
        "the child's read past a 24-byte allocation went unreported (exit {}): this build is not instrumented\n{err}",
        out.status
    );
}
