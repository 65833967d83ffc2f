//! Tensors in and out of files and snapshots: the one safetensors writer and reader (checked
//! headers, tensors read by range), host copies of values, and loading by name.

use super::backend_err;
use miles_runtime::safetensors::{self, Dtype, Entry};
use miles_runtime::{NamedTensor, RunError, E_CHECKPOINT};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// The one safetensors writer of checkpoints and exports: an error names the file.
pub(crate) fn write_tensors<S: AsRef<str>, T: AsRef<Tensor>>(named: &[(S, T)], path: &Path) -> Result<(), RunError> {
    // The writer reads host memory: GPU tensors are copied to the host first.
    let host: Vec<(&str, Tensor)> =
        named.iter().map(|(n, t)| (n.as_ref(), t.as_ref().to_device(Device::Cpu))).collect();
    Tensor::write_safetensors(&host, path)
        .map_err(|e| RunError::new(E_CHECKPOINT, format!("cannot write {}: {e}", path.display())))
}

/// The one safetensors reader (checkpoints, adapters, Hugging Face weights): the header is
/// checked against the file first (`miles_runtime::safetensors`: bounds, shapes against byte
/// ranges, no overflow, no overlap), then each tensor is read from its own range, so a hostile
/// header allocates nothing and the file is never held in memory whole.
pub(crate) fn read_tensors(path: &Path) -> Result<Vec<(String, Tensor)>, RunError> {
    let header = safetensors::read_file_header(path)?;
    let mut file = open(path)?;
    header.entries.iter().map(|e| Ok((e.name.clone(), read_entry(&mut file, path, e)?))).collect()
}

/// Opens a safetensors file for `read_entry`.
pub(crate) fn open(path: &Path) -> Result<File, RunError> {
    File::open(path).map_err(|e| RunError::io(E_CHECKPOINT, "cannot open", path, e))
}

/// The libtorch kind of a safetensors dtype; None for those libtorch has no kind for here.
pub(crate) fn kind_of(d: Dtype) -> Option<Kind> {
    Some(match d {
        Dtype::Bool => Kind::Bool,
        Dtype::U8 => Kind::Uint8,
        Dtype::I8 => Kind::Int8,
        Dtype::I16 => Kind::Int16,
        Dtype::I32 => Kind::Int,
        Dtype::I64 => Kind::Int64,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::F32 => Kind::Float,
        Dtype::F64 => Kind::Double,
        Dtype::U16 | Dtype::U32 | Dtype::U64 | Dtype::F8E4M3 | Dtype::F8E5M2 => return None,
    })
}

/// One tensor of a checked header, read from its byte range of `file` (at `path`).
pub(crate) fn read_entry(file: &mut File, path: &Path, e: &Entry) -> Result<Tensor, RunError> {
    let err = |m: String| RunError::new(E_CHECKPOINT, format!("{}: tensor `{}`: {m}", path.display(), e.name));
    let kind = kind_of(e.dtype).ok_or_else(|| err(format!("dtype {} is not read", e.dtype.name())))?;
    let shape: Vec<i64> = e.shape.iter().map(|&d| d as i64).collect();
    // The file's bytes go straight into the tensor's storage (no second copy of a large
    // tensor); an allocation libtorch refuses is an error, not an abort.
    let t = Tensor::f_empty(&shape, (kind, Device::Cpu)).map_err(|t| err(format!("cannot allocate it: {t}")))?;
    let len = usize::try_from(e.len).map_err(|_| err(format!("{} bytes do not fit in memory", e.len)))?;
    if t.numel() * kind.elt_size_in_bytes() != len {
        return Err(RunError::internal(format!(
            "{}: tensor `{}`: checked length {len} differs from libtorch's",
            path.display(),
            e.name
        )));
    }
    // SAFETY: `t` is a fresh contiguous CPU tensor of exactly `len` bytes (checked just above),
    // owned here and not shared; the slice lives only for the read.
    let dst = unsafe { std::slice::from_raw_parts_mut(t.data_ptr() as *mut u8, len) };
    file.seek(SeekFrom::Start(e.start))
        .and_then(|_| file.read_exact(dst))
        .map_err(|io| err(format!("cannot read its {len} bytes at offset {}: {io}", e.start)))?;
    Ok(t)
}

/// A tensor's values as f32, flattened.
pub(crate) fn f32_values(t: &Tensor) -> Result<Vec<f32>, RunError> {
    Vec::<f32>::try_from(t.detach().to_kind(Kind::Float).contiguous().view([-1])).map_err(backend_err)
}

pub(crate) fn named_tensor(name: &str, t: &Tensor) -> Result<NamedTensor, RunError> {
    Ok(NamedTensor {
        name: name.to_string(),
        shape: t.size().iter().map(|&d| d as usize).collect(),
        data: f32_values(t)?,
    })
}

/// Tensors read from a file as weight-snapshot entries.
pub(crate) fn named_tensors(read: Vec<(String, Tensor)>) -> Result<Vec<NamedTensor>, RunError> {
    read.iter().map(|(n, t)| named_tensor(n, t)).collect()
}

/// Copies `read` into `dst` by name; every name must be present with the same shape.
pub(crate) fn load_named(
    dst: &mut [(String, Tensor)],
    read: Vec<(String, Tensor)>,
    path: &Path,
) -> Result<(), RunError> {
    let map: std::collections::HashMap<String, Tensor> = read.into_iter().collect();
    let _g = tch::no_grad_guard();
    for (name, p) in dst.iter_mut() {
        let src = map
            .get(name)
            .ok_or_else(|| RunError::new(E_CHECKPOINT, format!("{}: missing tensor {name}", path.display())))?;
        if src.size() != p.size() || src.kind() != Kind::Float {
            return Err(RunError::new(
                E_CHECKPOINT,
                format!(
                    "{}: tensor {name} is {:?} {:?}, expected {:?} f32",
                    path.display(),
                    src.size(),
                    src.kind(),
                    p.size()
                ),
            ));
        }
        p.f_copy_(src).map_err(backend_err)?;
    }
    Ok(())
}
