//! The forward passes: logits and hidden states over a left-padded batch (with or without a KV
//! cache) and over continuous-batching slots, each layer's attention and MLP (dense SwiGLU with
//! any adapter terms, or routed experts), MoE layers routed and reported through a `Route`.
//!
//! Padding convention: batches are LEFT-padded. A row's positions count only its real tokens, and
//! no real token attends to a pad, so a sequence gives the same logits whatever it is batched
//! with (up to float reduction order) — sampling and training see the same numbers.

use super::cache::{KvCache, SlotCache};
use super::{Layer, Mlp, Policy};
use crate::lora::Target;
use crate::moe::Route;
use tch::{Kind, Tensor};

impl Policy {
    /// `x W^T (+ bias)` for layer `li`'s `t`, plus its adapter's term when `t` is wrapped.
    fn proj(&self, li: usize, t: Target, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Tensor {
        let y = self.lin(x, w, bias);
        match self.lora().and_then(|l| l.delta(li, t, x)) {
            Some(d) => y + d,
            None => y,
        }
    }

    /// A concatenated GEMM's output `y` (q|k|v or gate|up) plus the wrapped parts' adapter terms.
    fn add_deltas(&self, li: usize, y: Tensor, parts: &[(Target, i64)], x: &Tensor) -> Tensor {
        match self.lora().and_then(|l| l.delta_cat(li, parts, x)) {
            Some(d) => y + d,
            None => y,
        }
    }

    /// Layer `li`'s MLP on normed inputs `xn` [B, T, d]: the dense SwiGLU (gate and up as one
    /// GEMM, plus any adapter terms) or the routed experts.
    fn mlp(&self, li: usize, layer: &Layer, xn: &Tensor, route: Option<&mut Route>) -> Tensor {
        match &layer.mlp {
            Mlp::Dense(m) => {
                let ff = m.gate.size()[0];
                // The inner activations stay bf16 under bf16 GEMMs, unless adapters (fp32) add
                // their terms to them.
                let gemm = self.gemm();
                let gate_up = Tensor::cat(&[&m.gate, &m.up], 0);
                let gu = match self.lora() {
                    None => gemm.linear_low(xn, &gate_up, None),
                    Some(_) => gemm.linear(xn, &gate_up, None),
                };
                let gu = self.add_deltas(li, gu, &[(Target::Gate, ff), (Target::Up, ff)], xn);
                let act = gu.narrow(-1, 0, ff).silu() * gu.narrow(-1, ff, ff);
                self.proj(li, Target::Down, &act, &m.down, None)
            }
            Mlp::Moe(m) => match &self.cfg.moe {
                Some(c) => m.forward(c, xn, route, self.gemm()),
                None => xn.zeros_like(),
            },
        }
    }

    /// Logits [B, T, V] for `tokens` [B, T] at `positions` [B, T]. `key_valid` [B, S] marks real
    /// tokens among all S = cache.len + T keys. With a cache, the new keys/values are stored and
    /// `cache.len` advances by T.
    pub fn forward(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        key_valid: &Tensor,
        cache: Option<&mut KvCache>,
    ) -> Tensor {
        self.forward_routed(tokens, positions, key_valid, cache, None)
    }

    /// `forward`, routing MoE layers by `route` (R3 replay) and reporting what they chose. Logits
    /// are fp32 whatever the compute kind.
    pub fn forward_routed(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        key_valid: &Tensor,
        cache: Option<&mut KvCache>,
        route: Option<&mut Route>,
    ) -> Tensor {
        self.lin(&self.hidden(tokens, positions, key_valid, cache, route), &self.lm_head, None).to_kind(Kind::Float)
    }

    /// The final normed hidden states [B, T, d_model] that `forward_routed` projects to logits
    /// (PPO's critic reads values from them), MoE layers routed by `route`.
    pub fn hidden(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        key_valid: &Tensor,
        mut cache: Option<&mut KvCache>,
        route: Option<&mut Route>,
    ) -> Tensor {
        let (b, t) = tokens.size2().unwrap_or((0, 0));
        let cfg = &self.cfg;
        let h = cfg.n_heads as i64;
        let kvh = cfg.n_kv_heads as i64;
        let hd = cfg.head_dim() as i64;
        let past = cache.as_ref().map_or(0, |c| c.len);
        let s = past + t;

        // Query i (slot past+i) may see key j when j is a real token and j <= past+i; it always
        // sees itself, so pad rows stay finite (their outputs are never used).
        let qi = Tensor::arange_start(past, s, (Kind::Int64, crate::device::current())).unsqueeze(1);
        let kj = Tensor::arange(s, (Kind::Int64, crate::device::current())).unsqueeze(0);
        let causal = kj.le_tensor(&qi); // [T, S]
        let diag = kj.eq_tensor(&qi);
        // [B, T, S]
        let allowed = causal.unsqueeze(0).logical_and(&key_valid.unsqueeze(1)).logical_or(&diag.unsqueeze(0));
        // Boolean mask (true = may attend) for libtorch's fused attention, built once per pass.
        let mask = allowed.unsqueeze(1); // [B, 1, T, S]

        let rope = self.rotary(positions, b, t);
        let x = self.embed.index_select(0, &tokens.reshape([-1])).view([b, t, -1]);
        let x = self.decoder(x, route, |li, layer, xn| {
            // One GEMM for Q, K and V (weights concatenated per call; the parameters keep their
            // Hugging Face names and shapes).
            // Biases too are concatenated per call: a copy kept in the layer would miss the
            // optimizer's in-place updates and the gradient.
            let qkv_bias = match (&layer.q_bias, &layer.k_bias, &layer.v_bias) {
                (Some(qb), Some(kb), Some(vb)) => Some(Tensor::cat(&[qb, kb, vb], 0)),
                _ => None,
            };
            let qkv = self.lin(xn, &Tensor::cat(&[&layer.q, &layer.k, &layer.v], 0), qkv_bias.as_ref());
            let qkv =
                self.add_deltas(li, qkv, &[(Target::Q, h * hd), (Target::K, kvh * hd), (Target::V, kvh * hd)], xn);
            let qk = qkv.narrow(-1, 0, (h + kvh) * hd).view([b, t, h + kvh, hd]);
            let qk = match (&layer.q_norm, &layer.k_norm) {
                (Some(qn), Some(kn)) => Tensor::cat(
                    &[
                        rms_norm(&qk.narrow(2, 0, h), qn, cfg.norm_eps),
                        rms_norm(&qk.narrow(2, h, kvh), kn, cfg.norm_eps),
                    ],
                    2,
                ),
                _ => qk,
            };
            // Rotary on the query and key heads together: [B, H + KVH, T, hd].
            let qk = rope(&qk.transpose(1, 2));
            let q = qk.narrow(1, 0, h);
            let k = qk.narrow(1, h, kvh);
            let v = qkv.narrow(-1, (h + kvh) * hd, kvh * hd).view([b, t, kvh, hd]).transpose(1, 2);
            let (k_all, v_all) = match cache.as_deref_mut() {
                Some(c) => {
                    c.k[li].narrow(2, past, t).copy_(&k);
                    c.v[li].narrow(2, past, t).copy_(&v);
                    (c.k[li].narrow(2, 0, s), c.v[li].narrow(2, 0, s))
                }
                None => (k, v),
            };
            let (k_all, v_all) = repeat_kv(k_all, v_all, [b, kvh, s, hd], h);
            // Fused attention (scale 1/sqrt(hd) by default).
            let att = if self.invariant {
                crate::invariant::attention(&q, &k_all, &v_all, &mask)
            } else {
                Tensor::scaled_dot_product_attention(&q, &k_all, &v_all, Some(&mask), 0.0, false, None, false)
            };
            att.transpose(1, 2).contiguous().view([b, t, h * hd])
        });
        if let Some(c) = cache {
            c.len = s;
        }
        rms_norm(&x, &self.norm, cfg.norm_eps)
    }

    /// Logits [B, T, V] for `tokens` [B, T] of the sequences held in cache slots `rows` [B], at
    /// `positions` [B, T] (a token's position is also its cache column). Keys/values are written
    /// into their slots first; a query at position p attends columns 0..=p of its slot, so
    /// sequences of different lengths share a batch with no padding between prompt and response
    /// (continuous batching). Right padding in a prefill is harmless: a padded column is
    /// overwritten by the decode step that reaches it, before any real query can see it.
    pub fn forward_slots(&self, tokens: &Tensor, positions: &Tensor, rows: &Tensor, cache: &mut SlotCache) -> Tensor {
        self.forward_slots_routed(tokens, positions, rows, cache, None)
    }

    /// `forward_slots`, reporting MoE routing into `route`.
    pub fn forward_slots_routed(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        rows: &Tensor,
        cache: &mut SlotCache,
        route: Option<&mut Route>,
    ) -> Tensor {
        let (b, t) = tokens.size2().unwrap_or((0, 0));
        let cfg = &self.cfg;
        let h = cfg.n_heads as i64;
        let kvh = cfg.n_kv_heads as i64;
        let hd = cfg.head_dim() as i64;
        // Batch-invariant: attend over every column, as the trainer does over its max_len layout.
        let span = if self.invariant { cfg.max_len as i64 } else { positions.max().int64_value(&[]) + 1 };
        let kj = Tensor::arange(span, (Kind::Int64, crate::device::current())).view([1, 1, span]);
        let allowed = kj.le_tensor(&positions.unsqueeze(2)); // [B, T, span]
        let mask = Tensor::zeros([b, 1, t, span], (self.kind(), self.device()))
            .masked_fill(&allowed.logical_not().unsqueeze(1), f64::NEG_INFINITY);
        let flat_pos = positions.reshape([-1]);
        let flat_rows = rows.unsqueeze(1).expand([b, t], false).reshape([-1]);
        let rope = self.rotary(positions, b, t);
        let x = self.embed.index_select(0, &tokens.reshape([-1])).view([b, t, -1]);
        let x = self.decoder(x, route, |li, layer, xn| {
            let head_norm = |x: Tensor, w: &Option<Tensor>| match w {
                Some(w) => rms_norm(&x, w, cfg.norm_eps),
                None => x,
            };
            let q = head_norm(
                self.proj(li, Target::Q, xn, &layer.q, layer.q_bias.as_ref()).view([b, t, h, hd]),
                &layer.q_norm,
            );
            let k = head_norm(
                self.proj(li, Target::K, xn, &layer.k, layer.k_bias.as_ref()).view([b, t, kvh, hd]),
                &layer.k_norm,
            );
            let q = rope(&q.transpose(1, 2));
            let k = rope(&k.transpose(1, 2));
            let v = self.proj(li, Target::V, xn, &layer.v, layer.v_bias.as_ref()).view([b, t, kvh, hd]);
            let k_rows = k.transpose(1, 2).reshape([b * t, kvh, hd]);
            let _ = cache.k[li].index_put_(&[Some(&flat_rows), Some(&flat_pos)], &k_rows, false);
            let _ = cache.v[li].index_put_(&[Some(&flat_rows), Some(&flat_pos)], &v.reshape([b * t, kvh, hd]), false);
            let k_all = cache.k[li].index_select(0, rows).narrow(1, 0, span).permute([0, 2, 1, 3]);
            let v_all = cache.v[li].index_select(0, rows).narrow(1, 0, span).permute([0, 2, 1, 3]);
            let (k_all, v_all) = repeat_kv(k_all, v_all, [b, kvh, span, hd], h);
            let att = if self.invariant {
                crate::invariant::attention(&q, &k_all, &v_all, &allowed.unsqueeze(1))
            } else {
                let scores = q.matmul(&k_all.transpose(-2, -1)) * (1.0 / (hd as f64).sqrt()) + &mask;
                scores.softmax(-1, Kind::Float).to_kind(self.kind()).matmul(&v_all)
            };
            att.transpose(1, 2).contiguous().view([b, t, h * hd])
        });
        self.lin(&rms_norm(&x, &self.norm, cfg.norm_eps), &self.lm_head, None).to_kind(Kind::Float)
    }

    /// The decoder layers over the embedded tokens `x` [B, T, d]: each adds to the residual stream
    /// its attention (`attend` gives it [B, T, H * hd] from the normed stream, before the output
    /// projection) and its MLP (MoE layers routed by `route`).
    // `x = x + y` on purpose: tch's `+=` is in-place (add_), which would overwrite activations
    // autograd still needs.
    #[allow(clippy::assign_op_pattern)]
    fn decoder(
        &self,
        mut x: Tensor,
        mut route: Option<&mut Route>,
        mut attend: impl FnMut(usize, &Layer, &Tensor) -> Tensor,
    ) -> Tensor {
        for (li, layer) in self.layers.iter().enumerate() {
            let xn = rms_norm(&x, &layer.ln1, self.cfg.norm_eps);
            let att = attend(li, layer, &xn);
            x = x + self.proj(li, Target::O, &att, &layer.o, layer.o_bias.as_ref());
            let xn = rms_norm(&x, &layer.ln2, self.cfg.norm_eps);
            x = x + self.mlp(li, layer, &xn, route.as_deref_mut());
        }
        x
    }
}

/// Grouped-query attention: each of the `kvh` key/value heads [B, KVH, S, hd] serves `h / kvh`
/// query heads, so keys and values are repeated to [B, H, S, hd] (returned as they are when
/// `kvh == h`).
fn repeat_kv(k: Tensor, v: Tensor, [b, kvh, s, hd]: [i64; 4], h: i64) -> (Tensor, Tensor) {
    if kvh == h {
        return (k, v);
    }
    let g = h / kvh;
    let rep = |x: &Tensor| x.unsqueeze(2).expand([b, kvh, g, s, hd], false).reshape([b, h, s, hd]);
    (rep(&k), rep(&v))
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Tensor {
    // libtorch's native RMSNorm: x * rsqrt(mean(x^2) + eps) * w over the last dimension.
    x.rms_norm(w.size(), Some(w), eps)
}

/// Left-pads `seqs` with PAD. Returns tokens [B, L], key_valid [B, L] (bool) and positions [B, L]
/// (index among the row's real tokens; 0 on pads).
pub fn left_pad(seqs: &[Vec<i64>]) -> (Tensor, Tensor, Tensor, i64) {
    let l = seqs.iter().map(|s| s.len()).max().unwrap_or(0).max(1);
    let b = seqs.len();
    let mut tok = vec![0i64; b * l];
    let mut valid = vec![false; b * l];
    let mut pos = vec![0i64; b * l];
    for (i, s) in seqs.iter().enumerate() {
        let off = l - s.len();
        for (j, &t) in s.iter().enumerate() {
            tok[i * l + off + j] = t;
            valid[i * l + off + j] = true;
            pos[i * l + off + j] = j as i64;
        }
    }
    let shape = [b as i64, l as i64];
    (
        crate::device::from_slice(&tok).view(shape),
        crate::device::from_slice(&valid).view(shape),
        crate::device::from_slice(&pos).view(shape),
        l as i64,
    )
}
