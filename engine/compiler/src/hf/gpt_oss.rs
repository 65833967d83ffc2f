//! gpt-oss (`gpt_oss`, plan only): grouped-query attention with biases on all four projections
//! and a learned sink per head, alternating sliding-window and full layers (`layer_types`,
//! `sliding_window`); every layer a mixture of `num_local_experts` experts of
//! `intermediate_size`, with a biased router and biased expert projections.

use super::moe::{plan_only, top_k};
use super::{Fields, Gqa, MoeSizes, Sized};
use crate::num::Q;

pub(super) fn read(f: &Fields) -> Result<Sized, String> {
    let g = Gqa::read(f)?;
    let experts = f.positive("num_local_experts")?;
    // The published config.json has both names; transformers reads `num_experts_per_tok`.
    let key = if f.int("num_experts_per_tok")?.is_some() { "num_experts_per_tok" } else { "experts_per_token" };
    let top_k = top_k(f, key, experts)?;
    if let Some(other) = f.int("experts_per_token")?.filter(|&k| k != top_k) {
        return Err(format!("`experts_per_token` = {other} and `num_experts_per_tok` = {top_k} disagree"));
    }
    let d_ff = f.positive("intermediate_size")?;
    // Read so the plan says they were seen: a sliding-window layer caches at most the window, and
    // the planner sizes every layer's KV cache as full attention (an upper bound, docs/models.md).
    f.int("sliding_window")?;
    if let Some(v) = f.get("layer_types") {
        let n = v.as_array().map(|a| a.len() as u64);
        if n != Some(g.layers) {
            return Err(format!("`layer_types` must list one type per layer ({}), found {v}", g.layers));
        }
    }
    let attention_bias = f.bool("attention_bias")?.unwrap_or(true);
    let aux_loss_coef = f.number("router_aux_loss_coef")?.unwrap_or(Q::ZERO);
    let moe = MoeSizes { biases: true, ..MoeSizes::every_layer(experts, top_k, d_ff, aux_loss_coef) };
    let s = plan_only(f, "gpt_oss", g, d_ff, None, moe)?;
    Ok(Sized { qkv_bias: attention_bias, o_bias: attention_bias, sinks: true, ..s })
}
