//! The machine's NVIDIA GPUs, read through the CUDA driver API (cudarc, loaded at run time).
//!
//! Nothing here links CUDA: a binary built on a machine without a toolkit runs on one with a
//! driver, and on a machine without one every query answers [`Unavailable`] naming the library,
//! never a panic (cudarc panics on a call whose library is missing, so we look for it first).

pub mod ipc;
pub mod nccl;

use cudarc::driver::{result, sys};
use serde::Serialize;

/// One GPU as the driver reports it. `index` is the ordinal the process sees (after
/// `CUDA_VISIBLE_DEVICES`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Gpu {
    pub index: u32,
    pub name: String,
    pub memory_bytes: u64,
    /// Compute capability, e.g. (9, 0) for Hopper.
    pub compute_capability: (u32, u32),
}

impl Gpu {
    /// `sm_90`-style name of the compute capability.
    pub fn sm(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

/// Why the machine's GPUs cannot be used: the library or the call that failed, in words.
#[derive(Clone, Debug, PartialEq)]
pub struct Unavailable {
    pub reason: String,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// The driver library's names that cudarc searches (libcuda.so, libcuda.so.1, ...), for messages.
const DRIVER_LIBRARY: &str = "libcuda.so (the NVIDIA driver)";

/// The GPUs this process can see; an empty list where the driver is present but shows none.
pub fn devices() -> Result<Vec<Gpu>, Unavailable> {
    // SAFETY: only tries to open the library; no CUDA function is called.
    if !unsafe { sys::is_culib_present() } {
        return Err(Unavailable { reason: format!("{DRIVER_LIBRARY} is not installed or not on the loader's path") });
    }
    let fail =
        |what: &str, e: result::DriverError| Unavailable { reason: format!("the CUDA driver failed {what}: {e:?}") };
    match result::init() {
        Ok(()) => {}
        // No device at all (a driver without GPUs, or CUDA_VISIBLE_DEVICES empty).
        Err(result::DriverError(sys::cudaError_enum::CUDA_ERROR_NO_DEVICE)) => return Ok(Vec::new()),
        Err(e) => return Err(fail("to initialise (cuInit)", e)),
    }
    let count = result::device::get_count().map_err(|e| fail("to count devices", e))?;
    let mut gpus = Vec::with_capacity(count.max(0) as usize);
    for i in 0..count {
        let dev = result::device::get(i).map_err(|e| fail("to open a device", e))?;
        let name = result::device::get_name(dev).map_err(|e| fail("to name a device", e))?;
        // SAFETY: `dev` came from cuDeviceGet above.
        let (memory, major, minor) = unsafe {
            (
                result::device::total_mem(dev).map_err(|e| fail("to read device memory", e))?,
                result::device::get_attribute(
                    dev,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                )
                .map_err(|e| fail("to read the compute capability", e))?,
                result::device::get_attribute(
                    dev,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                )
                .map_err(|e| fail("to read the compute capability", e))?,
            )
        };
        gpus.push(Gpu {
            index: i as u32,
            name,
            memory_bytes: memory as u64,
            compute_capability: (major.max(0) as u32, minor.max(0) as u32),
        });
    }
    Ok(gpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs on every machine: with a driver it lists real GPUs, without one it must answer an
    /// error naming the driver library (this is the no-panic guarantee CI checks).
    #[test]
    fn devices_answer_without_panicking() {
        match devices() {
            Ok(gpus) => {
                for g in &gpus {
                    assert!(!g.name.is_empty());
                    assert!(g.memory_bytes > 0);
                    assert!(g.compute_capability.0 >= 3, "{g:?}");
                }
                eprintln!("GPUs: {gpus:?}");
            }
            Err(e) => {
                assert!(e.reason.contains("libcuda") || e.reason.contains("CUDA driver"), "{e}");
                eprintln!("skipped the GPU half of this test: {e}");
            }
        }
    }
}
