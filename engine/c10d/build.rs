// Compiles src/shim.cpp against the headers of the libtorch that torch-sys found and links it to
// that libtorch's own c10d (TCPStore, PrefixStore, ProcessGroupGloo live in libtorch_cpu.so).
// torch-sys declares `links = "tch"` and exports its library directory, which reaches us as
// DEP_TCH_LIBTORCH_LIB because this package depends on torch-sys directly.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/shim.cpp");
    println!("cargo:rerun-if-changed=src/gloo_decls");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        panic!(
            "miles-c10d: DEP_TCH_LIBTORCH_LIB is not set (torch-sys found no libtorch): run \
             scripts/setup-libtorch.sh"
        );
    };
    let lib = PathBuf::from(lib);
    let root = lib.parent().map(PathBuf::from).unwrap_or_else(|| lib.clone());
    let include = root.join("include");
    if !include.join("torch/csrc/distributed/c10d/ProcessGroupGloo.hpp").exists() {
        panic!(
            "miles-c10d: {} has no torch/csrc/distributed/c10d/ProcessGroupGloo.hpp: this libtorch \
             was built without distributed support, which the trainer's collectives need",
            include.display()
        );
    }
    cc::Build::new()
        .cpp(true)
        .pic(true)
        .std("c++17")
        // The wheel's symbols name std::__cxx11::basic_string: the new libstdc++ ABI.
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        // ProcessGroupGloo.hpp is all behind this (as in libtorch's own build).
        .define("USE_C10D_GLOO", None)
        .define("USE_DISTRIBUTED", None)
        // Before libtorch's include: the wheel ships no gloo headers (see src/gloo_decls/README.md).
        .include("src/gloo_decls")
        // libtorch's headers as system headers: their own warnings stay quiet, the shim's show.
        .flag("-isystem")
        .flag(&include)
        .flag("-isystem")
        .flag(include.join("torch/csrc/api/include"))
        .warnings(true)
        .extra_warnings(true)
        .file("src/shim.cpp")
        .compile("miles_c10d_shim");
    // The shim's references resolve in these; torch-sys links them too, but its link line comes
    // after ours only by crate order, so name them here as well.
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    // Applies to this package's own tests, examples and benches only (dependents set their own).
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
}
