//! Same as `examples/run_spec.rs`; a bin target so integration tests can spawn (and kill) it.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(miles_tch::cli::main_with_args(&args));
}
