//! `attnforge compile --explain NAME`: what one kernel of the compile matrix is (its spec and
//! tile) and every tuning choice the generator made for it, with the reason for each
//! (`codegen::PrefillPolicy`), without compiling anything.

use std::process::ExitCode;

use attnforge::codegen::{self, KernelSpec};

/// Columns the reasons are wrapped to.
const WRAP_COLUMNS: usize = 96;

/// Prints the explanation of the kernel named `name` (exactly, or the only one whose name
/// contains it); an error listing a few candidates otherwise.
pub fn print(name: &str) -> Result<ExitCode, String> {
    let spec = find(name)?;
    print!("{}", explain(&spec));
    Ok(ExitCode::SUCCESS)
}

fn find(name: &str) -> Result<KernelSpec, String> {
    let matrix = codegen::compile_matrix();
    if let Some(exact) = matrix.iter().find(|s| s.name() == name) {
        return Ok(exact.clone());
    }
    let matches: Vec<&KernelSpec> = matrix.iter().filter(|s| s.name().contains(name)).collect();
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(format!(
            "--explain: no kernel of the compile matrix is named {name:?} (list them with `attnforge compile --filter TEXT --arch sm_90a`)"
        )),
        many => {
            let shown: Vec<String> = many.iter().take(5).map(|s| s.name()).collect();
            Err(format!(
                "--explain: {} kernels match {name:?}, among them:\n  {}\nname one exactly",
                many.len(),
                shown.join("\n  ")
            ))
        }
    }
}

/// The text `--explain` prints for `spec`.
pub fn explain(spec: &KernelSpec) -> String {
    let t = spec.tile;
    let mut out = format!(
        "{}\n  inputs {}, output {}, QK accumulation {}, head dims {}, mask {}, variant {}, K/V {}\n  \
         tile {}: {} warps ({} threads), {} m16 query tiles per warp, {}-key tiles in {}-key sub-tiles, \
         {} K/V buffer(s), {} warp layout, {}\n  {} query rows per CTA, {} bytes of shared memory\n\nchoices \
         (codegen::PrefillPolicy; docs/kernel-design.md):\n",
        spec.name(),
        spec.input_dtype,
        spec.output_dtype,
        spec.qk_accum.name(),
        spec.head_dims,
        spec.mask.name(),
        spec.variant.label(),
        spec.kv.name(),
        t.label(),
        t.num_warps,
        t.threads(),
        t.mma_q,
        t.kv_tile,
        t.kv_sub,
        t.kv_stages,
        if t.warp_specialized {
            "warp-specialised (a producer warpgroup, two consumer warpgroups of 64 rows in turns)"
        } else if t.split_keys {
            "key-split"
        } else {
            "rows"
        },
        if t.wgmma { "wgmma (sm_90a)" } else { "mma.sync" },
        t.cta_q(),
        spec.smem_bytes(),
    );
    let width = spec
        .policy()
        .explain()
        .iter()
        .map(|(c, _, _)| c.len())
        .max()
        .unwrap_or(0);
    for (constant, value, why) in spec.policy().explain() {
        out.push_str(&format!("  {constant:<width$}  {value:<5}  "));
        let indent = " ".repeat(width + 11);
        let mut column = 0;
        for word in why.split_whitespace() {
            if column > 0 && column + word.len() + 1 > WRAP_COLUMNS - indent.len() {
                out.push('\n');
                out.push_str(&indent);
                column = 0;
            } else if column > 0 {
                out.push(' ');
                column += 1;
            }
            out.push_str(word);
            column += word.len();
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explains_every_choice_of_a_named_kernel() {
        let name = "attnforge_prefill_f16_of16_qkf32_d128x128_causal_none_ragged_w8q1kv64g";
        let spec = find(name).unwrap();
        let text = explain(&spec);
        assert!(text.starts_with(name));
        for (constant, value, _) in spec.policy().explain() {
            assert!(
                text.contains(&format!("{constant} ")) && text.contains(&value),
                "{constant}"
            );
        }
    }

    #[test]
    fn refuses_unknown_and_ambiguous_names() {
        assert!(find("no_such_kernel").unwrap_err().contains("no kernel"));
        assert!(find("w8q1kv64g").unwrap_err().contains("kernels match"));
    }
}
