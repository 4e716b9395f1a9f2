//! Prints the rendered CUDA source of one kernel of the compile matrix, the first whose name
//! contains FILTER, optionally with its tile replaced (for reading resource use while tuning).
//! The kernels without specialisation are printed when FILTER names their entry exactly
//! (`attnforge_append_paged_kv`, `attnforge_merge_states`); the GPU reference kernels when FILTER
//! starts with `attnforge_reference` (the first of `codegen::reference_matrix` whose name
//! contains it).
//! Usage: `cargo run --example render_kernel -- FILTER [TILE]`
fn main() {
    let mut args = std::env::args().skip(1);
    let filter = args.next().unwrap_or_default();
    for fixed in [
        attnforge::codegen::render_append(),
        attnforge::codegen::render_merge_states(),
    ] {
        if fixed.entry == filter {
            print!("{}", fixed.source);
            return;
        }
    }
    if filter.starts_with("attnforge_reference") {
        let matrix = attnforge::codegen::reference_matrix();
        match matrix.iter().find(|s| s.name().contains(&filter)) {
            Some(spec) => print!("{}", attnforge::codegen::render_reference(spec).source),
            None => {
                eprintln!("no reference kernel matches {filter:?}");
                std::process::exit(1);
            }
        }
        return;
    }
    let tile = args
        .next()
        .map(|t| attnforge::codegen::TileConfig::parse(&t).expect("a tile like w4q2kv64"));
    let matrix = attnforge::codegen::compile_matrix();
    match matrix.iter().find(|s| s.name().contains(&filter)) {
        Some(spec) => {
            let mut spec = spec.clone();
            if let Some(t) = tile {
                spec.tile = t;
            }
            print!("{}", attnforge::codegen::render(&spec).source)
        }
        None => {
            eprintln!(
                "no kernel of the {} in the matrix matches {filter:?}",
                matrix.len()
            );
            std::process::exit(1);
        }
    }
}
