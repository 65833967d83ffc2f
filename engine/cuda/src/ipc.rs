//! CUDA IPC: a device buffer one process allocated, opened by another process on the same GPU
//! through a 64-byte handle, so a colocated engine copies the trainer's weights device to device
//! with nothing through the host. A handle travels as 128 hex characters on any channel.
//!
//! Every call checks for the driver first and answers [`Unavailable`] without one (cudarc panics
//! on a call whose library is missing).

use crate::Unavailable;
use cudarc::driver::{result, sys};

fn fail(what: &str) -> impl Fn(result::DriverError) -> Unavailable + '_ {
    move |e| Unavailable { reason: format!("the CUDA driver failed to {what}: {e:?}") }
}

/// The primary context of one GPU, current on the calling thread.
pub struct Gpu {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

impl Gpu {
    /// The GPU of ordinal `index` (after CUDA_VISIBLE_DEVICES), its primary context made current.
    pub fn open(index: u32) -> Result<Gpu, Unavailable> {
        crate::devices()?;
        let dev = result::device::get(index as i32).map_err(fail("open the device"))?;
        // SAFETY: `dev` came from cuDeviceGet; the context is released in Drop.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(fail("create a context"))?;
        let gpu = Gpu { dev, ctx };
        gpu.make_current()?;
        Ok(gpu)
    }

    /// Makes this GPU's context current on the calling thread (each thread that calls in needs it).
    pub fn make_current(&self) -> Result<(), Unavailable> {
        // SAFETY: `ctx` is a live primary context retained by `open`.
        unsafe { result::ctx::set_current(self.ctx) }.map_err(fail("make its context current"))
    }

    /// Waits for every operation queued on this context.
    pub fn synchronize(&self) -> Result<(), Unavailable> {
        // SAFETY: the context is current (make_current).
        unsafe { sys::cuCtxSynchronize().result() }.map_err(fail("synchronize"))
    }

    /// `bytes` of device memory, filled with `byte`.
    pub fn alloc(&self, bytes: usize, byte: u8) -> Result<DeviceBuffer, Unavailable> {
        // SAFETY: the context is current; the allocation is freed in Drop.
        let ptr = unsafe { result::malloc_sync(bytes) }
            .map_err(|e| Unavailable { reason: format!("cannot allocate {bytes} bytes on the GPU: {e:?}") })?;
        let buf = DeviceBuffer { ptr, bytes };
        // SAFETY: `ptr` holds `bytes` bytes.
        unsafe { result::memset_d8_sync(ptr, byte, bytes) }.map_err(fail("fill a buffer"))?;
        Ok(buf)
    }

    /// Opens another process's buffer on this GPU from its handle.
    pub fn open_handle(&self, handle: &IpcHandle, bytes: usize) -> Result<Mapped, Unavailable> {
        let mut raw = sys::CUipcMemHandle { reserved: [0; 64] };
        for (d, s) in raw.reserved.iter_mut().zip(handle.0) {
            *d = s as std::ffi::c_char;
        }
        let mut ptr = 0;
        // SAFETY: a handle of 64 bytes; the mapping is closed in Drop.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                raw,
                sys::CUipcMem_flags_enum::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
            .result()
        }
        .map_err(fail("open another process's buffer (cuIpcOpenMemHandle)"))?;
        Ok(Mapped { ptr, bytes })
    }

    /// Device-to-device copy of `bytes` bytes (waits for it).
    pub fn copy(&self, dst: sys::CUdeviceptr, src: sys::CUdeviceptr, bytes: usize) -> Result<(), Unavailable> {
        // SAFETY: callers pass pointers of live buffers holding at least `bytes` bytes.
        unsafe { result::memcpy_dtod_sync(dst, src, bytes) }.map_err(fail("copy device to device"))?;
        self.synchronize()
    }

    /// `n` bytes at `offset` of a device buffer, read back to the host (for verification).
    pub fn read(&self, src: sys::CUdeviceptr, offset: usize, n: usize) -> Result<Vec<u8>, Unavailable> {
        let mut host = vec![0u8; n];
        // SAFETY: the caller's buffer holds offset + n bytes.
        unsafe { result::memcpy_dtoh_sync(&mut host, src + offset as u64) }.map_err(fail("copy to the host"))?;
        Ok(host)
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: retained in `open`.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

/// Device memory this process allocated.
pub struct DeviceBuffer {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl DeviceBuffer {
    /// The handle another process opens this buffer with.
    pub fn export(&self) -> Result<IpcHandle, Unavailable> {
        let mut raw = sys::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `ptr` is a live cuMemAlloc allocation.
        unsafe { sys::cuIpcGetMemHandle(&mut raw, self.ptr).result() }
            .map_err(fail("export a buffer (cuIpcGetMemHandle)"))?;
        let mut h = [0u8; 64];
        for (d, s) in h.iter_mut().zip(raw.reserved) {
            *d = s as u8;
        }
        Ok(IpcHandle(h))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by `Gpu::alloc`, freed once.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Another process's buffer, opened here.
pub struct Mapped {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: opened by `Gpu::open_handle`, closed once.
        let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr).result() };
    }
}

/// A buffer's IPC handle: 64 opaque bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpcHandle(pub [u8; 64]);

impl IpcHandle {
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn from_hex(s: &str) -> Option<IpcHandle> {
        let s = s.trim();
        if s.len() != 128 || !s.is_ascii() {
            return None;
        }
        let mut h = [0u8; 64];
        for (i, b) in h.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(IpcHandle(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_round_trips_through_hex_and_bad_text_is_refused() {
        let mut b = [0u8; 64];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 37 % 256) as u8;
        }
        let h = IpcHandle(b);
        assert_eq!(IpcHandle::from_hex(&h.to_hex()), Some(h));
        assert_eq!(IpcHandle::from_hex("00"), None);
        assert_eq!(IpcHandle::from_hex(&"zz".repeat(64)), None);
    }

    /// Without a driver: an error naming it, never a panic. With a GPU: a buffer exported and
    /// opened again in this process copies what was written.
    #[test]
    fn ipc_answers_without_a_driver_and_copies_with_one() {
        let gpu = match Gpu::open(0) {
            Ok(g) => g,
            Err(e) => {
                assert!(e.reason.contains("libcuda") || e.reason.contains("CUDA driver"), "{e}");
                eprintln!("skipped: {e}");
                return;
            }
        };
        let src = gpu.alloc(1 << 20, 7).unwrap();
        let dst = gpu.alloc(1 << 20, 0).unwrap();
        gpu.copy(dst.ptr, src.ptr, src.bytes).unwrap();
        assert!(gpu.read(dst.ptr, 0, 4096).unwrap().iter().all(|&b| b == 7));
        assert_eq!(src.export().unwrap().to_hex().len(), 128);
    }
}
