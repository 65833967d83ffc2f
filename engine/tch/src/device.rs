//! The one device this process computes on, chosen once from the recipe's `device` before any
//! tensor is made (as `torch.set_default_device` would): every parameter, cache and input tensor
//! of the embedded backend is created on `current()`. CPU unless a run selected CUDA.
//!
//! The binary links only libtorch's CPU library (the CUDA one and its GBs of dependencies are not
//! needed to build or to run on a CPU). CUDA is loaded at run time: `libtorch_cuda.so`, from the
//! directory the process's `libtorch_cpu.so` was loaded from, registers libtorch's CUDA hooks when
//! it is opened, as Python's `import torch` does.

use miles_runtime::{DeviceSpec, RunError, E_NO_GPU};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use tch::Device;

/// The libtorch version this binary was built against (torch/version.py beside the linked
/// libtorch, read by build.rs): another version's libraries cannot be loaded into it.
pub const BUILT_TORCH: &str = env!("MILES_TORCH_VERSION");

/// What `select` chose (it holds the lock while it opens CUDA); `ON_GPU` mirrors it for
/// `current`, which every input tensor of a forward calls.
static CHOSEN: Mutex<Option<Device>> = Mutex::new(None);
static ON_GPU: AtomicBool = AtomicBool::new(false);

/// Where this process's tensors live: the first visible GPU once `select` chose it, else the CPU.
pub fn current() -> Device {
    if ON_GPU.load(Ordering::Acquire) {
        Device::Cuda(0)
    } else {
        Device::Cpu
    }
}

/// `t` on this process's device (no copy on the CPU).
pub(crate) fn put(t: tch::Tensor) -> tch::Tensor {
    match current() {
        Device::Cpu => t,
        d => t.to_device(d),
    }
}

/// `Tensor::from_slice` on this process's device: inputs built from host vectors.
pub(crate) fn from_slice<T: tch::kind::Element>(data: &[T]) -> tch::Tensor {
    put(tch::Tensor::from_slice(data))
}

/// Chooses the device for `want` (once per process; later calls must agree) and says what was
/// chosen and why, for the run's log.
pub fn select(want: DeviceSpec) -> Result<(Device, String), RunError> {
    let mut chosen = CHOSEN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = *chosen {
        return match (want, d) {
            (DeviceSpec::Cpu, Device::Cuda(_)) => {
                Err(RunError::internal("this process already computes on the GPU; a second stage asked for the CPU"))
            }
            _ => Ok((d, format!("{d:?} (chosen earlier in this process)"))),
        };
    }
    match want {
        DeviceSpec::Cpu => Ok((Device::Cpu, "cpu (device = cpu)".into())),
        DeviceSpec::Cuda => {
            let d = open_cuda().map_err(|why| {
                RunError::new(E_NO_GPU, format!("the recipe's cluster says device = cuda, but {why}")).with_help(
                    "run on a machine with an NVIDIA GPU and libtorch's CUDA build (scripts/gpu-bundle.sh), or set device = auto (the CPU where there is no GPU) or device = cpu",
                )
            })?;
            *chosen = Some(d);
            ON_GPU.store(true, Ordering::Release);
            Ok((d, "cuda:0 (device = cuda)".into()))
        }
        DeviceSpec::Auto => match open_cuda() {
            Ok(d) => {
                *chosen = Some(d);
                ON_GPU.store(true, Ordering::Release);
                Ok((d, "cuda:0 (device = auto: a GPU and libtorch's CUDA library are here)".into()))
            }
            Err(why) => Ok((Device::Cpu, format!("cpu (device = auto: {why})"))),
        },
    }
}

/// Loads libtorch's CUDA half and checks that it sees a GPU; the reason in words otherwise.
fn open_cuda() -> Result<Device, String> {
    // The driver first: without it libtorch_cuda.so may load and then see nothing.
    let gpus = miles_cuda::devices().map_err(|e| format!("this machine has no usable CUDA driver: {e}"))?;
    if gpus.is_empty() {
        return Err("the CUDA driver shows no GPU (check CUDA_VISIBLE_DEVICES)".into());
    }
    let dir = libtorch_dir().ok_or("the directory of libtorch_cpu.so could not be found in this process's mappings")?;
    if let Some(v) = torch_version(&dir) {
        let base = |s: &str| s.split('+').next().unwrap_or(s).to_string();
        if base(&v) != base(BUILT_TORCH) {
            return Err(format!(
                "the libtorch in {} is version {v}, and miles was built against {BUILT_TORCH}",
                dir.display()
            ));
        }
    }
    let lib = dir.join("libtorch_cuda.so");
    if !lib.is_file() {
        return Err(format!(
            "{} is missing: this libtorch is a CPU-only install (scripts/setup-libtorch.sh removes the CUDA libraries); point LD_LIBRARY_PATH at a CUDA build of libtorch {BUILT_TORCH} (scripts/gpu-bundle.sh does)",
            lib.display()
        ));
    }
    dlopen_global(&lib)?;
    if !tch::Cuda::is_available() {
        return Err(format!("{} loaded, but libtorch sees no CUDA device", lib.display()));
    }
    Ok(Device::Cuda(0))
}

/// The directory holding the libtorch_cpu.so this process mapped.
fn libtorch_dir() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
}

/// torch/version.py's `__version__` for a wheel's torch/lib (None for a bare libtorch archive).
fn torch_version(lib_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(lib_dir.parent()?.join("version.py")).ok()?;
    crate::torch_version::parse_version_py(&text)
}

fn dlopen_global(lib: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(lib.as_os_str().as_bytes())
        .map_err(|_| "a library path holds a NUL byte".to_string())?;
    // SAFETY: dlopen with a valid C string; the handle is kept for the life of the process (never
    // closed: libtorch's CUDA hooks stay registered).
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a thread-local C string or null.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "unknown error".to_string()
        } else {
            unsafe { std::ffi::CStr::from_ptr(err) }.to_string_lossy().into_owned()
        };
        return Err(format!("{} could not be loaded: {msg}", lib.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_linked_libtorch_is_found_and_its_version_is_the_built_one() {
        let dir = libtorch_dir().expect("libtorch_cpu.so is mapped in a test of this crate");
        if let Some(v) = torch_version(&dir) {
            assert_eq!(v, BUILT_TORCH);
        }
    }

    /// Every machine: CPU is CPU; auto falls back with a reason where there is no GPU, and cuda
    /// is E0518 naming what is missing. With a GPU (bench/gpu/run.sh) the same calls choose it.
    #[test]
    fn cuda_is_refused_with_a_reason_where_the_machine_lacks_it() {
        assert_eq!(select(DeviceSpec::Cpu).unwrap().0, current());
        match select(DeviceSpec::Cuda) {
            Ok((d, _)) => assert!(d.is_cuda()),
            Err(e) => {
                assert_eq!(e.code, E_NO_GPU);
                assert!(e.message.contains("device = cuda"), "{}", e.message);
                let (d, why) = select(DeviceSpec::Auto).unwrap();
                assert_eq!(d, Device::Cpu);
                assert!(why.starts_with("cpu (device = auto: "), "{why}");
                eprintln!("skipped the GPU half: {}", e.message);
            }
        }
    }
}
