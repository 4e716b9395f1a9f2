//! NVRTC compiles through `attnforge::jit::compile` (no cache): CUBIN for every architecture,
//! ptxas' report, errors mapped to user snippets, missing entries, NVRTC option errors.

mod jit_support;

use attnforge::jit::compile::compile;
use attnforge::jit::{Arch, CompileOptions, JitError, KernelSource, SnippetSpan};
use jit_support::{nvrtc, ADD_KERNEL, SPILL_KERNEL};

/// ELF files (CUBIN is one) start with these bytes.
const ELF_MAGIC: &[u8] = b"\x7fELF";

fn source<'a>(
    name: &'a str,
    entry: &'a str,
    src: &'a str,
    snippets: &'a [SnippetSpan],
) -> KernelSource<'a> {
    KernelSource {
        name,
        entry,
        source: src,
        snippets,
    }
}

#[test]
fn compiles_cubin_for_every_arch_with_a_report() {
    let Some(nvrtc) = nvrtc() else { return };
    for arch in Arch::ALL {
        let k = compile(
            &nvrtc,
            &source("add", "add", ADD_KERNEL, &[]),
            &CompileOptions::new(arch),
        )
        .unwrap();
        assert!(k.cubin.starts_with(ELF_MAGIC), "{arch}: not an ELF image");
        assert_eq!(k.arch, arch);
        assert!(
            k.log.contains(&format!("for '{arch}'")),
            "{arch}: {}",
            k.log
        );
        let r = &k.report;
        assert_eq!(r.entry, "add");
        assert!(r.registers > 0, "{arch}: {r:?}");
        assert_eq!(r.shared_bytes, 256 * 4, "{arch}: static tile of 256 floats");
        assert!(!r.spills(), "{arch}: {r:?}");
    }
}

#[test]
fn spills_are_reported() {
    let Some(nvrtc) = nvrtc() else { return };
    let k = compile(
        &nvrtc,
        &source("heavy", "heavy", SPILL_KERNEL, &[]),
        &CompileOptions::new(Arch::Sm90a),
    )
    .unwrap();
    assert!(k.report.spills(), "{}", k.log);
    assert!(k.report.spill_store_bytes > 0 && k.report.stack_frame_bytes > 0);
}

#[test]
fn snippet_errors_name_the_snippet_and_its_own_lines() {
    let Some(nvrtc) = nvrtc() else { return };
    // Lines 3..=5 are "the user's" logits_transform body; its line 2 has the error.
    let src = "extern \"C\" __global__ void k(float* out, float s) {\n\
               float t;\n\
               t = s * 2.0f;\n\
               t = t + undefined_param;\n\
               out[0] = t;\n\
               }\n";
    let spans = [SnippetSpan {
        label: "custom logits_transform".into(),
        first_line: 3,
        line_count: 3,
    }];
    let err = compile(
        &nvrtc,
        &source("custom_demo", "k", src, &spans),
        &CompileOptions::new(Arch::Sm80),
    )
    .unwrap_err();
    let JitError::Compile { kernel, log } = &err else {
        panic!("wrong error: {err:?}")
    };
    assert_eq!(kernel, "custom_demo");
    assert!(
        log.contains(
            "custom logits_transform, line 2: error: identifier \"undefined_param\" is undefined"
        ),
        "{log}"
    );
    let shown = err.to_string();
    assert!(
        shown.starts_with("kernel custom_demo failed to compile:\n"),
        "{shown}"
    );
    assert!(
        shown.lines().count() > 3,
        "the log must print verbatim, line by line: {shown}"
    );
    assert!(!shown.contains("\\n"), "Debug-escaped: {shown}");
}

#[test]
fn snippet_errors_behind_a_line_directive() {
    let Some(nvrtc) = nvrtc() else { return };
    // The generator's layout: `#line 1 "LABEL"` before the body, `#line` back afterwards.
    let src = "__device__ float hook(float s) {\n\
               #line 1 \"custom logits_transform\"\n\
               float t = s;\n\
               return t * missing_scale;\n\
               }\n\
               #line 6 \"gen.cu\"\n\
               extern \"C\" __global__ void k(float* o) { o[0] = hook(o[0]); }\n";
    let spans = [SnippetSpan {
        label: "custom logits_transform".into(),
        first_line: 3,
        line_count: 2,
    }];
    let err = compile(
        &nvrtc,
        &source("gen", "k", src, &spans),
        &CompileOptions::new(Arch::Sm90a),
    )
    .unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.contains(
            "custom logits_transform, line 2: error: identifier \"missing_scale\" is undefined"
        ),
        "{shown}"
    );
}

#[test]
fn errors_outside_snippets_keep_generated_line_numbers() {
    let Some(nvrtc) = nvrtc() else { return };
    let src = "extern \"C\" __global__ void k(float* out) {\n  out[0] = 1.0f\n}\n";
    let err = compile(
        &nvrtc,
        &source("plain", "k", src, &[]),
        &CompileOptions::new(Arch::Sm80),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("plain.cu(3): error: expected a \";\""),
        "{err}"
    );
}

#[test]
fn a_missing_entry_is_an_error_listing_what_exists() {
    let Some(nvrtc) = nvrtc() else { return };
    let err = compile(
        &nvrtc,
        &source("add", "addd", ADD_KERNEL, &[]),
        &CompileOptions::new(Arch::Sm80),
    )
    .unwrap_err();
    match err {
        JitError::MissingEntry { entry, found, .. } => {
            assert_eq!(entry, "addd");
            assert_eq!(found, ["add"]);
        }
        other => panic!("wrong error: {other}"),
    }
}

#[test]
fn an_invalid_option_is_a_typed_error() {
    let Some(nvrtc) = nvrtc() else { return };
    let mut opts = CompileOptions::new(Arch::Sm80);
    opts.extra.push("--no-such-option".into());
    let err = compile(&nvrtc, &source("add", "add", ADD_KERNEL, &[]), &opts).unwrap_err();
    assert!(
        matches!(
            err,
            JitError::Nvrtc {
                call: "nvrtcCompileProgram",
                ..
            } | JitError::Compile { .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--no-such-option"), "{err}");
}

#[test]
fn in_memory_headers_and_defines() {
    let Some(nvrtc) = nvrtc() else { return };
    let mut opts = CompileOptions::new(Arch::Sm89);
    opts.headers.push((
        "scale.cuh".into(),
        "#define SCALE_BY(x) ((x) * FACTOR)\n".into(),
    ));
    opts.extra.push("-DFACTOR=3.0f".into());
    let src = "#include \"scale.cuh\"\nextern \"C\" __global__ void k(float* o) { o[0] = SCALE_BY(o[0]); }\n";
    let k = compile(&nvrtc, &source("hdr", "k", src, &[]), &opts).unwrap();
    assert!(k.cubin.starts_with(ELF_MAGIC));
}

#[test]
fn a_nul_byte_is_rejected_before_nvrtc() {
    let Some(nvrtc) = nvrtc() else { return };
    let err = compile(
        &nvrtc,
        &source("nul", "k", "int x;\0", &[]),
        &CompileOptions::new(Arch::Sm80),
    )
    .unwrap_err();
    assert!(matches!(err, JitError::InvalidInput { .. }), "{err}");
    assert!(err.to_string().contains("NUL byte at offset 6"), "{err}");
}
