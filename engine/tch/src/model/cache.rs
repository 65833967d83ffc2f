//! Key/value caches: one batch's, preallocated to its longest sequence (batched sampling), and
//! independent slots (continuous batching).

use super::Policy;
use tch::Tensor;

/// Per-layer key/value buffers of a batch, preallocated to the longest sequence so a decode step
/// writes in place instead of concatenating.
pub struct KvCache {
    pub(super) k: Vec<Tensor>,
    pub(super) v: Vec<Tensor>,
    /// Filled slots.
    pub len: i64,
}

impl KvCache {
    /// Buffers for `policy`'s sizes and compute kind.
    pub fn new(policy: &Policy, batch: i64, capacity: i64) -> KvCache {
        let cfg = &policy.cfg;
        let hd = cfg.head_dim() as i64;
        let shape = [batch, cfg.n_kv_heads as i64, capacity, hd];
        let mk = || Tensor::zeros(shape, (policy.kind(), policy.device()));
        KvCache { k: (0..cfg.n_layers).map(|_| mk()).collect(), v: (0..cfg.n_layers).map(|_| mk()).collect(), len: 0 }
    }

    /// Rows `index` of the batch (e.g. each prompt's row repeated n times after a shared prefill).
    pub fn select_rows(&mut self, index: &Tensor) {
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            *t = t.index_select(0, index);
        }
    }
}

/// Per-layer key/value buffers of `slots` independent sequences, [slots, max_len, kv_heads,
/// head_dim]: the engine of continuous batching (`forward_slots`). A slot is reused by the next
/// request as soon as its sequence finishes; nothing is cleared (columns are overwritten in order).
pub struct SlotCache {
    pub(super) k: Vec<Tensor>,
    pub(super) v: Vec<Tensor>,
}

impl SlotCache {
    /// Buffers for `policy`'s sizes and compute kind.
    pub fn new(policy: &Policy, slots: i64) -> SlotCache {
        let cfg = &policy.cfg;
        let hd = cfg.head_dim() as i64;
        let shape = [slots, cfg.max_len as i64, cfg.n_kv_heads as i64, hd];
        let mk = || Tensor::zeros(shape, (policy.kind(), policy.device()));
        SlotCache { k: (0..cfg.n_layers).map(|_| mk()).collect(), v: (0..cfg.n_layers).map(|_| mk()).collect() }
    }
}
