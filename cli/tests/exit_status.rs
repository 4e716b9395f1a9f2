//! Exit statuses of the CLI without a GPU: `attnforge verify` on the CPU backend succeeds when the
//! selected cases pass and fails when `--filter` selects none (nothing verified is not a pass) or
//! a GPU-only option is given (`--split-keys`);
//! `attnforge bench` fails when no shape is selected, before it looks for a GPU.

use std::process::Command;

fn verify(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_attnforge"))
        .args(["verify", "--backend", "cpu"])
        .args(args)
        .output()
        .expect("run attnforge verify")
}

#[test]
fn a_filter_that_selects_cases_passes() {
    let out = verify(&["--filter", "causal"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
}

#[test]
fn a_filter_that_selects_nothing_fails() {
    let out = verify(&["--filter", "no-such-case"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--filter \"no-such-case\"") && stderr.contains("nothing was verified"),
        "{stderr}"
    );
}

#[test]
fn a_split_on_the_cpu_backend_is_an_error() {
    let out = verify(&["--split-keys", "256"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--split-keys 256") && stderr.contains("use --backend cuda"),
        "{stderr}"
    );
}

#[test]
fn bench_with_no_shape_selected_fails_before_looking_for_a_gpu() {
    let out = Command::new(env!("CARGO_BIN_EXE_attnforge"))
        .args(["bench", "--filter", "no-such-shape"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("run attnforge bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("nothing to time"), "{stderr}");
}
