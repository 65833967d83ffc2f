//! The shim's C functions (src/shim.cpp). Every `*mut c_char` return is NULL on success or a
//! malloc'ed message that [`take_error`] frees.

use std::ffi::{c_char, c_int, c_void, CStr};
use torch_sys::C_tensor;

/// Opaque: a `c10::intrusive_ptr<c10d::Store>` and its port.
#[repr(C)]
pub struct RawStore {
    _opaque: [u8; 0],
}

/// Opaque: a `c10::intrusive_ptr<c10d::ProcessGroupGloo>` and its timeout.
#[repr(C)]
pub struct RawGroup {
    _opaque: [u8; 0],
}

extern "C" {
    pub fn miles_c10d_free(ptr: *mut c_void);

    pub fn miles_c10d_store_new(
        host: *const c_char,
        host_len: usize,
        port: u16,
        is_server: c_int,
        timeout_ms: i64,
        out: *mut *mut RawStore,
    ) -> *mut c_char;
    pub fn miles_c10d_store_port(store: *const RawStore) -> u16;
    pub fn miles_c10d_store_free(store: *mut RawStore);
    pub fn miles_c10d_store_set(
        store: *mut RawStore,
        key: *const c_char,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> *mut c_char;
    pub fn miles_c10d_store_get(
        store: *mut RawStore,
        key: *const c_char,
        key_len: usize,
        value: *mut *mut u8,
        value_len: *mut usize,
    ) -> *mut c_char;

    #[allow(clippy::too_many_arguments)]
    pub fn miles_c10d_group_gloo(
        store: *mut RawStore,
        prefix: *const c_char,
        prefix_len: usize,
        rank: c_int,
        world: c_int,
        timeout_ms: i64,
        device_kind: c_int,
        device_name: *const c_char,
        device_name_len: usize,
        missing: *mut i64,
        missing_len: *mut usize,
        out: *mut *mut RawGroup,
    ) -> *mut c_char;
    pub fn miles_c10d_check_tensors(
        ts: *const *mut C_tensor,
        n: usize,
        role: *const c_char,
        role_len: usize,
    ) -> *mut c_char;
    pub fn miles_c10d_group_free(group: *mut RawGroup);
    pub fn miles_c10d_all_reduce(group: *mut RawGroup, ts: *const *mut C_tensor, n: usize, op: c_int) -> *mut c_char;
    pub fn miles_c10d_broadcast(group: *mut RawGroup, t: *mut C_tensor, root: c_int) -> *mut c_char;
    pub fn miles_c10d_all_gather(
        group: *mut RawGroup,
        out: *const *mut C_tensor,
        n: usize,
        input: *mut C_tensor,
    ) -> *mut c_char;
    pub fn miles_c10d_reduce_scatter(
        group: *mut RawGroup,
        out: *mut C_tensor,
        inputs: *const *mut C_tensor,
        n: usize,
    ) -> *mut c_char;
    pub fn miles_c10d_barrier(group: *mut RawGroup) -> *mut c_char;
    pub fn miles_c10d_monitored_barrier(group: *mut RawGroup) -> *mut c_char;
}

/// The shim's message, freed; `None` for success (NULL).
///
/// # Safety
/// `msg` is NULL or a NUL-terminated string malloc'ed by the shim and not yet freed.
pub unsafe fn take_error(msg: *mut c_char) -> Option<String> {
    if msg.is_null() {
        return None;
    }
    let text = CStr::from_ptr(msg).to_string_lossy().into_owned();
    miles_c10d_free(msg.cast());
    Some(text)
}
