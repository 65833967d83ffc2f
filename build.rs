// The `miles` binary links libtorch through miles-tch; torch-sys puts no rpath on it, and a
// dependency's link arguments do not reach this binary, so it takes the library directory from
// torch-sys itself (DEP_TCH_LIBTORCH_LIB, exported because this package depends on it directly).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{dir}");
        println!("cargo:rustc-link-arg-tests=-Wl,-rpath,{dir}");
    }
    // The libtorch version miles-engine links (miles-tch's build script reads it), named when the
    // engine cannot load its libraries.
    println!("cargo:rerun-if-env-changed=DEP_MILES_TCH_TORCH_VERSION");
    let version = std::env::var("DEP_MILES_TCH_TORCH_VERSION").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=MILES_TORCH_VERSION={version}");
}
