// torch-sys links libtorch but puts no rpath on the final binary, so tests, examples and the CLI
// would need LD_LIBRARY_PATH. torch-sys declares `links = "tch"` and exports the library
// directory, which reaches us as DEP_TCH_LIBTORCH_LIB because we depend on it directly.
#[path = "src/torch_version.rs"]
mod torch_version;

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        // Applies to this package's own tests, examples, benches and bins only.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        // rustc-link-arg does not propagate to dependents; export the directory so a dependent's
        // build script (the `miles` CLI) can emit the same rpath from DEP_MILES_TCH_LIBTORCH_LIB.
        println!("cargo:libtorch_lib={dir}");
        // The version a run checks a GPU machine's libtorch against (crate::device).
        let version_py = std::path::Path::new(&dir).join("../version.py");
        println!("cargo:rerun-if-changed={}", version_py.display());
        let version = std::fs::read_to_string(&version_py)
            .ok()
            .and_then(|t| torch_version::parse_version_py(&t))
            .unwrap_or_else(|| "unknown".into());
        println!("cargo:rustc-env=MILES_TORCH_VERSION={version}");
        // For the `miles` CLI's message when `miles-engine` cannot load its libtorch.
        println!("cargo:torch_version={version}");
    } else {
        println!("cargo:rustc-env=MILES_TORCH_VERSION=unknown");
        println!(
            "cargo:warning=DEP_TCH_LIBTORCH_LIB is not set: binaries will need LD_LIBRARY_PATH \
             to find libtorch (run scripts/setup-libtorch.sh)"
        );
    }
}
