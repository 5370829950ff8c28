//! What the tests of Debian's programs share across crates: where urnic's
//! libraries are and perftest's result rows. Used by loopback-test's
//! programs module and urnic-tools' rxe lab (which includes this file by
//! path), both crates one level below the workspace root.

use std::path::PathBuf;

/// Where urnic's libraries are (the directory holding `file`, e.g.
/// `libibverbs.so.1`), or a loud failure saying how to make them.
pub fn lib_dir(file: &str) -> PathBuf {
    if let Ok(d) = std::env::var("URNIC_LIB_DIR") {
        return PathBuf::from(d);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    for profile in ["release", "debug"] {
        let d = root.join("target").join(profile).join("urnic-lib");
        if d.join(file).exists() {
            return d;
        }
    }
    panic!("urnic's {file} is not built: run `bash ibverbs-abi/link.sh release` (deploy/test.sh does)");
}

/// Whether perftest gave up on its report because it could not measure the
/// CPU's clock: it times the cycle counter against gettimeofday over a few
/// short sleeps and refuses a report when the fit's r² is below 0.9
/// (perftest's get_clock.c, `sample_get_cpu_mhz`), which a loaded host's
/// scheduling causes. Nothing of the run itself is in question: the pair may
/// run again.
pub fn perftest_clock_unmeasured(out: &str) -> bool {
    out.contains("Correlation coefficient r^2:") && out.contains("Can't produce a report")
}

/// The numbers of perftest's result lines (`#bytes #iterations ...`).
pub fn perftest_rows(out: &str) -> Vec<Vec<f64>> {
    out.lines()
        .filter_map(|l| {
            let nums: Result<Vec<f64>, _> = l.split_whitespace().map(str::parse::<f64>).collect();
            nums.ok().filter(|n| n.len() >= 4)
        })
        .collect()
}
