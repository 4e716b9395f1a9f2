//! Prints the rendered CUDA source of one kernel of the compile matrix (by index or name filter).
//! Usage: `cargo run --example render_kernel -- [FILTER]`
fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let matrix = attnforge::codegen::compile_matrix();
    match matrix.iter().find(|s| s.name().contains(&filter)) {
        Some(spec) => print!("{}", attnforge::codegen::render(spec).source),
        None => {
            eprintln!(
                "no kernel of the {} in the matrix matches {filter:?}",
                matrix.len()
            );
            std::process::exit(1);
        }
    }
}
