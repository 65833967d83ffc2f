// torch-sys links libtorch but puts no rpath on the final binary, so tests, examples and the CLI
// would need LD_LIBRARY_PATH. torch-sys declares `links = "tch"` and exports the library
// directory, which reaches us as DEP_TCH_LIBTORCH_LIB because we depend on it directly.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    } else {
        println!(
            "cargo:warning=DEP_TCH_LIBTORCH_LIB is not set: binaries will need LD_LIBRARY_PATH \
             to find libtorch (run scripts/setup-libtorch.sh)"
        );
    }
}
