//! Runs a RunSpec JSON file on the embedded backend, without the compiler:
//! `cargo run --release -p miles-tch --example run_spec -- engine/runtime/tests/data/laptop.json runs/x`
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(miles_tch::cli::main_with_args(&args));
}
