//! Packing: trajectories as padded micro-batches aligned for next-token prediction (left-padded,
//! or right-aligned for the batch-invariant mode), per-token values scattered into and read out of
//! that layout, and R3's recorded experts laid over it.

use crate::model::{left_pad, Policy};
use miles_runtime::tasks::TokenId;
use miles_runtime::{RunError, Trajectory};
use tch::{Kind, Tensor};

/// One padded micro-batch, aligned for next-token prediction: column c of the [B, L-1] tensors
/// is the prediction of token c+1 from tokens 0..=c.
pub struct Packed {
    pub tokens: Tensor,
    pub valid: Tensor,
    pub positions: Tensor,
    /// Next tokens [B, L-1].
    pub(super) targets: Tensor,
    /// Loss mask over predicted tokens [B, L-1] (response tokens only, times the trajectory mask).
    pub(super) mask: Tensor,
    /// Response token j of row b sits at column off_b + j.
    pub(super) offsets: Vec<i64>,
    pub(super) lens: Vec<usize>,
    pub(super) width: i64,
    /// Column of each row's first token (left padding: after the pads; aligned: 0).
    pub(super) starts: Vec<usize>,
}

pub fn pack(prompts: &[&[TokenId]], responses: &[&[TokenId]], masks: Option<&[&[f32]]>) -> Packed {
    let seqs: Vec<Vec<i64>> =
        prompts.iter().zip(responses).map(|(p, r)| p.iter().chain(r.iter()).map(|&t| t as i64).collect()).collect();
    let (tokens, valid, positions, l) = left_pad(&seqs);
    let w = l - 1;
    let b = seqs.len();
    let mut mask = vec![0f32; b * w.max(0) as usize];
    let mut offsets = Vec::with_capacity(b);
    for (i, (p, r)) in prompts.iter().zip(responses).enumerate() {
        // Sequence starts at column l - len; response token j is token index p.len()+j, predicted
        // at column (l - len) + p.len() + j - 1.
        let off = l - (p.len() + r.len()) as i64 + p.len() as i64 - 1;
        offsets.push(off);
        for j in 0..r.len() {
            let m = masks.map_or(1.0, |ms| ms[i].get(j).copied().unwrap_or(0.0));
            mask[i * w as usize + (off as usize + j)] = m;
        }
    }
    let targets = tokens.narrow(1, 1, w);
    Packed {
        mask: crate::device::from_slice(&mask).view([b as i64, w]),
        targets,
        tokens,
        valid,
        positions,
        offsets,
        lens: responses.iter().map(|r| r.len()).collect(),
        width: w,
        starts: seqs.iter().map(|q| (l as usize).saturating_sub(q.len())).collect(),
    }
}

/// `pack` for the batch-invariant mode: token i of every row in column i (right padding) over
/// `max_len` columns, the layout the sampler's slot cache has, so each query attends the same key
/// columns in both.
pub fn pack_aligned(
    prompts: &[&[TokenId]],
    responses: &[&[TokenId]],
    masks: Option<&[&[f32]]>,
    max_len: usize,
) -> Packed {
    let b = prompts.len();
    let l = max_len.max(2);
    let w = l - 1;
    let (mut tok, mut valid, mut mask) = (vec![0i64; b * l], vec![false; b * l], vec![0f32; b * w]);
    let mut offsets = Vec::with_capacity(b);
    for (i, (p, r)) in prompts.iter().zip(responses).enumerate() {
        for (j, &t) in p.iter().chain(r.iter()).take(l).enumerate() {
            tok[i * l + j] = t as i64;
            valid[i * l + j] = true;
        }
        let off = p.len() as i64 - 1;
        offsets.push(off);
        for j in 0..r.len() {
            if let Some(m) = mask.get_mut(i * w + (off as usize + j)) {
                *m = masks.map_or(1.0, |ms| ms[i].get(j).copied().unwrap_or(0.0));
            }
        }
    }
    let shape = [b as i64, l as i64];
    let tokens = crate::device::from_slice(&tok).view(shape);
    let positions =
        Tensor::arange(l as i64, (Kind::Int64, crate::device::current())).unsqueeze(0).repeat([b as i64, 1]);
    Packed {
        mask: crate::device::from_slice(&mask).view([b as i64, w as i64]),
        targets: tokens.narrow(1, 1, w as i64),
        tokens,
        valid: crate::device::from_slice(&valid).view(shape),
        positions,
        offsets,
        lens: responses.iter().map(|r| r.len()).collect(),
        width: w as i64,
        starts: vec![0; b],
    }
}

/// The layout `policy`'s forward needs: aligned for the batch-invariant mode, else left-padded.
pub fn pack_for(policy: &Policy, prompts: &[&[TokenId]], responses: &[&[TokenId]], masks: Option<&[&[f32]]>) -> Packed {
    match policy.invariant {
        true => pack_aligned(prompts, responses, masks, policy.cfg.max_len),
        false => pack(prompts, responses, masks),
    }
}

impl Packed {
    /// Scatters per-response-token values into a [B, L-1] tensor aligned with `targets`.
    pub(super) fn align(&self, values: &[&[f32]]) -> Tensor {
        let b = self.lens.len();
        let w = self.width as usize;
        let mut out = vec![0f32; b * w];
        for i in 0..b {
            for j in 0..self.lens[i] {
                out[i * w + self.offsets[i] as usize + j] = values[i].get(j).copied().unwrap_or(0.0);
            }
        }
        crate::device::from_slice(&out).view([b as i64, w as i64])
    }

    /// `align` of per-trajectory values `values` (indexed over the whole batch): row i of this
    /// micro-batch is the batch's trajectory `rows[i]`.
    pub(super) fn align_rows(&self, values: &[Vec<f32>], rows: &[usize]) -> Tensor {
        self.align(&rows.iter().take(self.lens.len()).map(|&r| values[r].as_slice()).collect::<Vec<_>>())
    }

    pub(super) fn extract(&self, t: &Tensor) -> Result<Vec<Vec<f32>>, RunError> {
        let flat = crate::model::f32_values(t)?;
        let w = self.width as usize;
        Ok((0..self.lens.len())
            .map(|i| (0..self.lens[i]).map(|j| flat[i * w + self.offsets[i] as usize + j]).collect())
            .collect())
    }
}

/// Packs a chunk of trajectories' prompts and responses with `layout` (`pack`, or `pack_for` a
/// policy), over their loss masks when `masked`.
pub(super) fn pack_chunk(
    chunk: &[Trajectory],
    masked: bool,
    layout: impl FnOnce(&[&[TokenId]], &[&[TokenId]], Option<&[&[f32]]>) -> Packed,
) -> Packed {
    let pr: Vec<&[TokenId]> = chunk.iter().map(|t| t.prompt.as_slice()).collect();
    let rs: Vec<&[TokenId]> = chunk.iter().map(|t| t.response.as_slice()).collect();
    let ms: Vec<&[f32]> = chunk.iter().map(|t| t.loss_mask.as_slice()).collect();
    layout(&pr, &rs, masked.then_some(ms.as_slice()))
}

/// R3: the recorded experts of a packed micro-batch's trajectories, per MoE layer [B, L, k], and
/// the mask [B, L] of tokens that have them (pads and each sequence's last token do not). None
/// when no trajectory carries routing.
pub fn recorded_routes(chunk: &[Trajectory], pk: &Packed) -> Option<(Vec<Tensor>, Tensor)> {
    let first = chunk.iter().find_map(|t| t.routing.as_ref())?;
    let (layers, k) = (first.layers, first.top_k);
    let (b, l) = (chunk.len(), pk.width as usize + 1);
    let mut ids = vec![vec![0i64; b * l * k]; layers];
    let mut mask = vec![false; b * l];
    for (i, t) in chunk.iter().enumerate() {
        let Some(r) = t.routing.as_ref().filter(|r| r.layers == layers && r.top_k == k) else { continue };
        let start = pk.starts[i];
        for (tok, per) in r.ids().chunks_exact(layers * k).enumerate() {
            let col = start + tok;
            mask[i * l + col] = true;
            for (li, layer_ids) in ids.iter_mut().enumerate() {
                layer_ids[(i * l + col) * k..(i * l + col + 1) * k].copy_from_slice(&per[li * k..(li + 1) * k]);
            }
        }
    }
    let shape = [b as i64, l as i64];
    let ids = ids.iter().map(|v| crate::device::from_slice(v).view([b as i64, l as i64, k as i64])).collect();
    Some((ids, crate::device::from_slice(&mask).view(shape)))
}
