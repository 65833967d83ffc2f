//! Tensors in and out of files and snapshots: the one safetensors writer and reader of
//! checkpoints, host copies of values, and loading by name.

use super::backend_err;
use miles_runtime::{NamedTensor, RunError, E_CHECKPOINT};
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

/// The one safetensors reader of checkpoints (Hugging Face loading has its own messages).
pub(crate) fn read_tensors(path: &Path) -> Result<Vec<(String, Tensor)>, RunError> {
    Tensor::read_safetensors(path)
        .map_err(|e| RunError::new(E_CHECKPOINT, format!("cannot read {}: {e}", path.display())))
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
