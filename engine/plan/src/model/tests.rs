//! The memory formulas against hand-computed figures (docs/plan.md).

use super::*;
use crate::fixtures::glm5;
use crate::input::Attention;

fn llama8b() -> ModelSpec {
    ModelSpec {
        name: "Llama-3.1-8B".into(),
        params: 8_030_000_000,
        active_params: 8_030_000_000,
        layers: 32,
        dense_layers: 0,
        hidden_size: 4096,
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        vocab: 128_256,
        experts: 0,
        top_k: 0,
        max_context: 131_072,
        attention: Attention::Gqa,
        kv_lora_rank: None,
        qk_rope_head_dim: None,
        sparse_topk: None,
        index_head_dim: None,
        update_requantize_s: None,
        intermediate_size: None,
        tied_embeddings: None,
    }
}

fn layout(backend: Backend, tp: u64, pp: u64, cp: u64, ep: u64, dp: u64) -> Layout {
    Layout { backend, tp, pp, cp, ep, dp, precision: Precision::Bf16 }
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

#[test]
fn glm5_split_from_total_and_active() {
    // (744 - 40) / (256 - 8) = 2.8387 B per expert; x 256 = 726.7 B routed.
    let s = param_split(&glm5());
    assert!(close(s.routed, 726.71e9, 1e-4), "{}", s.routed);
    assert!(close(s.other, 17.29e9, 1e-3), "{}", s.other);
    assert_eq!(param_split(&llama8b()).routed, 0.0);
}

#[test]
fn glm5_reference_optimizer_is_279_gb_per_rank() {
    // domain.md §9: 32 training GPUs, TP2 PP4 CP4 EP8 -> 744e9 x 12 / 32 = 279 GB.
    let l = layout(Backend::Megatron, 2, 4, 4, 8, 1);
    assert_eq!((l.etp(), l.edp()), (1, 1));
    let b = state_bytes(&glm5(), &l, None);
    assert!(close(b.optimizer, 279.0e9, 1e-9), "{}", b.optimizer);
    // Weights: 17.29e9 / 8 + 726.71e9 / 32 = 24.87e9 params, 2 bytes each.
    assert!(close(b.weights, 49.74e9, 1e-3), "{}", b.weights);
    assert!(close(b.gradients, 99.48e9, 1e-3), "{}", b.gradients);
}

#[test]
fn dense_megatron_distributed_optimizer_is_6_plus_12_over_d() {
    // Megatron docs: 6 + 12/d bytes per parameter with the distributed optimizer.
    let l = layout(Backend::Megatron, 1, 1, 1, 1, 8);
    let b = state_bytes(&llama8b(), &l, None);
    let p = 8.03e9;
    assert!(close(b.weights + b.gradients + b.optimizer, p * (6.0 + 12.0 / 8.0), 1e-12));
}

#[test]
fn fsdp_and_embedded() {
    let m = llama8b();
    let b = state_bytes(&m, &layout(Backend::Fsdp, 1, 1, 1, 1, 8), None);
    assert!(close(b.optimizer, 8.03e9 * 12.0 / 8.0, 1e-12));
    assert!(close(b.weights, 8.03e9 * 2.0 / 8.0 + 2.0 * 8.03e9 / 32.0 * 2.0, 1e-12));
    let l = Layout { precision: Precision::Fp32, ..layout(Backend::Embedded, 1, 1, 1, 1, 1) };
    let b = state_bytes(&m, &l, None);
    assert_eq!((b.weights, b.gradients, b.optimizer), (8.03e9 * 4.0, 8.03e9 * 4.0, 8.03e9 * 8.0));
}

#[test]
fn activations_by_recompute() {
    // s = 8192 / 2 (CP2), b = 1, h = 4096, t = 2: 34 s b h / t = 34 x 4096 x 4096 / 2.
    assert_eq!(layer_activation_bytes(4096.0, 1.0, 4096.0, 2.0, Recompute::Off), 285_212_672.0);
    assert_eq!(layer_activation_bytes(4096.0, 1.0, 4096.0, 2.0, Recompute::Full), 16_777_216.0);
    let m = llama8b();
    let l = layout(Backend::Megatron, 2, 4, 2, 1, 1);
    // Full: 8 layers/stage x 4 in flight x 16.78 MB + one layer at 285.2 MB + logits
    // 4096 x 128256 x 4 / 2 = 1050.7 MB.
    let a = activation_bytes(&m, &l, 8192, 1, None, Recompute::Full);
    assert_eq!(a, 8.0 * 4.0 * 16_777_216.0 + 285_212_672.0 + 1_050_673_152.0);
    // Two micro-batches only: two in flight.
    let a2 = activation_bytes(&m, &l, 8192, 1, Some(2), Recompute::Full);
    assert_eq!(a2, 8.0 * 2.0 * 16_777_216.0 + 285_212_672.0 + 1_050_673_152.0);
}

#[test]
fn kv_cache_per_token() {
    // MLA: 78 layers x (512 + 64) x 2 bytes = 89,856 bytes, whatever the TP.
    assert_eq!(kv_bytes_per_token(&glm5(), 8, Precision::Bf16), 89_856.0);
    // DSA's indexer: an FP8 key of 128 and a 4-byte scale per layer, only for a sparse model.
    assert_eq!(indexer_bytes_per_token(&glm5()), 0.0);
    let dsa = ModelSpec { sparse_topk: Some(2048), index_head_dim: Some(128), ..glm5() };
    assert_eq!(indexer_bytes_per_token(&dsa), 78.0 * 132.0);
    // GQA: 32 layers x 2 x (8 heads / TP2 = 4) x 128 x 2 bytes = 65,536.
    assert_eq!(kv_bytes_per_token(&llama8b(), 2, Precision::Bf16), 65_536.0);
    // TP16 > 8 KV heads: one head per GPU (replicated).
    assert_eq!(kv_bytes_per_token(&llama8b(), 16, Precision::Bf16), 16_384.0);
}

#[test]
fn r3_matches_domain_example() {
    // domain.md: 32K tokens x 60 layers x k=8 x 4 bytes (int32 ids) ~ 60 MB.
    let m = ModelSpec { layers: 60, dense_layers: 0, ..glm5() };
    assert_eq!(r3_bytes(&m, 32_768 + 1, 4), 62_914_560.0);
    assert_eq!(r3_bytes(&llama8b(), 32_768, 4), 0.0);
    // GLM-5's 256 experts fit a u8: a quarter of that.
    assert_eq!(route_id_bytes(&m, None), 1);
    assert_eq!(r3_bytes(&m, 32_768 + 1, route_id_bytes(&m, None)), 15_728_640.0);
    assert_eq!(r3_bytes_per_token(&m, 1), 480.0);
}

#[test]
fn route_id_is_the_smallest_type_for_the_expert_count() {
    let with = |experts| ModelSpec { experts, ..glm5() };
    assert_eq!(route_id_bytes(&with(8), None), 1);
    assert_eq!(route_id_bytes(&with(256), None), 1);
    assert_eq!(route_id_bytes(&with(257), None), 2);
    assert_eq!(route_id_bytes(&with(65_536), None), 2);
    assert_eq!(route_id_bytes(&with(65_537), None), 4);
    assert_eq!(route_id_bytes(&with(8), Some(4)), 4);
}

#[test]
fn rollout_weights() {
    // GLM-5 fp8 on TP8: (17.29e9 + 726.71e9) / 8 x (1 + 4/16384) bytes.
    let w = rollout_weight_bytes(&glm5(), 8, 1, Precision::Fp8Blockwise);
    assert!(close(w, 93.0e9 * (1.0 + 4.0 / 16384.0), 1e-3), "{w}");
    // DP attention 8: the non-expert part is whole on every GPU.
    let w = rollout_weight_bytes(&glm5(), 8, 8, Precision::Bf16);
    assert!(close(w, (17.29e9 + 726.71e9 / 8.0) * 2.0, 1e-3), "{w}");
}

#[test]
fn experts_touched_saturates() {
    let m = glm5();
    assert!(close(experts_touched(&m, 1), 8.0 / 256.0, 1e-12));
    assert!(experts_touched(&m, 1000) > 0.999);
    assert_eq!(experts_touched(&llama8b(), 3), 1.0);
}

/// Qwen3-30B-A3B as std/models has it (config.json: 48 layers, hidden 2048, 32 Q / 4 KV heads
/// of 128, 128 experts of width 768, top 8).
fn qwen3_30b() -> ModelSpec {
    ModelSpec {
        name: "Qwen3-30B-A3B".into(),
        params: 30_500_000_000,
        active_params: 3_300_000_000,
        layers: 48,
        hidden_size: 2048,
        heads: 32,
        kv_heads: 4,
        vocab: 151_936,
        experts: 128,
        top_k: 8,
        max_context: 40_960,
        ..llama8b()
    }
}

fn lora(rank: u64, adapters: u64, targets: &[LoraTarget]) -> Lora {
    Lora {
        rank: rank.into(),
        adapters: adapters.into(),
        target_modules: targets.to_vec(),
        dropout: 0.0,
        init: None,
        span: None,
    }
}

const QKVO: &[LoraTarget] = &[LoraTarget::QProj, LoraTarget::KProj, LoraTarget::VProj, LoraTarget::OProj];
const MLP: &[LoraTarget] = &[LoraTarget::GateProj, LoraTarget::UpProj, LoraTarget::DownProj];

#[test]
fn lora_attention_adapters_are_rank_times_in_plus_out_per_layer() {
    // q 2048 -> 4096, k and v 2048 -> 512, o 4096 -> 2048: 17,408 x rank 16 x 48 layers.
    let a = lora_params(&qwen3_30b(), &lora(16, 1, QKVO));
    assert_eq!((a.other, a.routed), (13_369_344.0, 0.0));
    let q = lora_target_params(&qwen3_30b(), LoraTarget::QProj, 16);
    assert_eq!(q.other, 48.0 * 16.0 * (2048.0 + 4096.0));
}

#[test]
fn lora_on_moe_mlp_wraps_every_routed_expert() {
    // One expert of one layer: (30.5e9 - 3.3e9) / 120 / 48 = 4.72M = 3 x 2048 x width, so
    // width 768.6 (config.json: moe_intermediate_size 768).
    let m = qwen3_30b();
    assert!(close(expert_width(&m), 768.0, 1e-3), "{}", expert_width(&m));
    let a = lora_params(&m, &lora(16, 1, MLP));
    assert_eq!(a.other, 0.0);
    assert!(close(a.routed, 3.0 * 16.0 * (2048.0 + 768.6) * 128.0 * 48.0, 1e-4), "{}", a.routed);
    // A dense model wraps one MLP per layer, of the width the record gives or the params leave.
    let dense = lora_params(&llama8b(), &lora(8, 1, &[LoraTarget::DownProj]));
    assert_eq!(dense.routed, 0.0);
    let given = ModelSpec { intermediate_size: Some(14_336), ..llama8b() };
    assert_eq!(lora_params(&given, &lora(8, 1, &[LoraTarget::DownProj])).other, 32.0 * 8.0 * (14_336.0 + 4096.0));
    // Qwen3-4B (tied embeddings): the width left by its parameters is within 0.2% of 9728.
    let qwen3_4b = ModelSpec {
        params: 4_020_000_000,
        active_params: 4_020_000_000,
        layers: 36,
        hidden_size: 2560,
        heads: 32,
        kv_heads: 8,
        vocab: 151_936,
        ..llama8b()
    };
    assert!(close(dense_mlp_width(&qwen3_4b), 9728.0, 2e-3), "{}", dense_mlp_width(&qwen3_4b));
}

#[test]
fn lora_freezes_the_base_same_weights_no_base_gradients_or_optimizer() {
    // Megatron TP2 EP8 DP4 on 8 GPUs: the same model with and without LoRA.
    let (m, l) = (qwen3_30b(), layout(Backend::Megatron, 2, 1, 1, 8, 4));
    let full = state_bytes(&m, &l, None);
    let lo = state_bytes(&m, &l, Some(&lora(16, 1, QKVO)));
    assert_eq!(lo.weights, full.weights);
    assert_eq!(full.adapters, 0.0);
    // Attention adapters split like attention: by TP2; their optimizer state also by DP4.
    let local = 13_369_344.0 / 2.0;
    assert_eq!((lo.adapters, lo.gradients, lo.optimizer), (local * 2.0, local * 4.0, local / 4.0 * 12.0));
    assert!(full.gradients > 17e9 && full.optimizer > 45e9, "{full:?}");
    // Expert adapters split like the experts: by EP8.
    let e = state_bytes(&m, &l, Some(&lora(16, 1, &[LoraTarget::UpProj])));
    let up = lora_target_params(&m, LoraTarget::UpProj, 16).routed;
    assert!(close(e.gradients, up / 8.0 * 4.0, 1e-12), "{e:?}");
}

#[test]
fn two_adapters_double_adapter_state_not_the_base() {
    let (m, l) = (qwen3_30b(), layout(Backend::Fsdp, 1, 1, 1, 1, 8));
    let one = state_bytes(&m, &l, Some(&lora(16, 1, QKVO)));
    let two = state_bytes(&m, &l, Some(&lora(16, 2, QKVO)));
    assert_eq!(two.weights, one.weights);
    assert_eq!(
        (two.adapters, two.gradients, two.optimizer),
        (2.0 * one.adapters, 2.0 * one.gradients, 2.0 * one.optimizer)
    );
}

/// A dense model small enough to size by hand: 4 layers, h 64, q 4 x 16 = 64, kv 2 x 16 = 32,
/// MLP width 128.
fn tiny() -> ModelSpec {
    ModelSpec {
        params: 1_000_000,
        active_params: 1_000_000,
        layers: 4,
        hidden_size: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        vocab: 1000,
        intermediate_size: Some(128),
        ..llama8b()
    }
}

fn with_dropout(lo: Lora, dropout: f64) -> Lora {
    Lora { dropout, ..lo }
}

#[test]
fn lora_dropout_keeps_each_wrapped_layers_input() {
    let (m, l) = (tiny(), layout(Backend::Megatron, 1, 1, 1, 1, 1));
    let all = with_dropout(lora(8, 1, &LoraTarget::ALL), 0.1);
    // Input widths per layer: q, k, v, o, gate, up 64 each, down 128 = 512. seq 32 x
    // micro-batch 2 = 64 tokens x 512 x 2 B (bf16) = 65,536 B per layer, x 4 layers.
    let b = lora_dropout_bytes(&m, &l, &all, 32, 2, None, Recompute::Off);
    assert_eq!(b, 4.0 * 64.0 * 512.0 * 2.0);
    assert_eq!(b, 262_144.0);
    // Linear in the micro-batch (and the same under `selective`).
    assert_eq!(lora_dropout_bytes(&m, &l, &all, 32, 4, None, Recompute::Selective), 2.0 * b);
    // Dropout 0: the adapter reuses the input the base layer keeps, nothing extra.
    assert_eq!(lora_dropout_bytes(&m, &l, &with_dropout(all.clone(), 0.0), 32, 2, None, Recompute::Off), 0.0);
    // Attention only: 4 x 64 per layer.
    let qkvo = with_dropout(lora(8, 1, QKVO), 0.1);
    assert_eq!(lora_dropout_bytes(&m, &l, &qkvo, 32, 2, None, Recompute::Off), 4.0 * 64.0 * 256.0 * 2.0);
    // PP2: 2 layers per stage x 2 micro-batches in flight; CP2 and TP2 each halve it.
    let pp = layout(Backend::Megatron, 1, 2, 1, 1, 1);
    assert_eq!(lora_dropout_bytes(&m, &pp, &all, 32, 2, None, Recompute::Off), 2.0 * 2.0 * 65_536.0);
    assert_eq!(lora_dropout_bytes(&m, &pp, &all, 32, 2, Some(1), Recompute::Off), 2.0 * 65_536.0);
    let split = layout(Backend::Megatron, 2, 1, 2, 1, 1);
    assert_eq!(lora_dropout_bytes(&m, &split, &all, 32, 2, None, Recompute::Off), b / 4.0);
    // Full recomputation: one layer of one micro-batch, while it is recomputed.
    assert_eq!(lora_dropout_bytes(&m, &pp, &all, 32, 2, None, Recompute::Full), 65_536.0);
    // FP32 training: 4 B.
    let fp32 = Layout { precision: Precision::Fp32, ..l };
    assert_eq!(lora_dropout_bytes(&m, &fp32, &all, 32, 2, None, Recompute::Off), 2.0 * b);
}

#[test]
fn lora_dropout_on_experts_keeps_only_routed_tokens() {
    // 2 MoE layers of 4 experts, top 2, h 64: one expert is (P - A) / (E - k) = 12,288
    // params = 2 layers x 3 x 64 x 32, so width 32.
    let m = ModelSpec {
        params: 124_576,
        active_params: 100_000,
        layers: 2,
        hidden_size: 64,
        experts: 4,
        top_k: 2,
        intermediate_size: None,
        ..tiny()
    };
    assert_eq!(expert_width(&m), 32.0);
    let down = with_dropout(lora(8, 1, &[LoraTarget::DownProj]), 0.05);
    // 8 wrapped experts x (16 tokens x 2/4) rows x 32 = 2 layers x k 2 x 16 tokens x 32, bf16.
    let l = layout(Backend::Megatron, 1, 1, 1, 1, 1);
    assert_eq!(lora_dropout_bytes(&m, &l, &down, 16, 1, None, Recompute::Off), 2.0 * 2.0 * 16.0 * 32.0 * 2.0);
    assert_eq!(lora_dropout_bytes(&m, &l, &down, 16, 3, None, Recompute::Off), 3.0 * 4096.0);
    // gate_proj reads h = 64. TP2 EP1 (ETP2): the TP group gathers the tokens, so every rank
    // keeps all k x tokens at width h; TP2 EP2 (ETP1): its half of the tokens.
    let gate = with_dropout(lora(8, 1, &[LoraTarget::GateProj]), 0.05);
    let etp2 = layout(Backend::Megatron, 2, 1, 1, 1, 1);
    assert_eq!(lora_dropout_bytes(&m, &etp2, &gate, 16, 1, None, Recompute::Off), 2.0 * 2.0 * 16.0 * 64.0 * 2.0);
    let ep2 = layout(Backend::Megatron, 2, 1, 1, 2, 1);
    assert_eq!(lora_dropout_bytes(&m, &ep2, &gate, 16, 1, None, Recompute::Off), 2.0 * 2.0 * 8.0 * 64.0 * 2.0);
    // down_proj's input (width f) is split over ETP either way: k x tokens x f / TP.
    assert_eq!(lora_dropout_bytes(&m, &etp2, &down, 16, 1, None, Recompute::Off), 2048.0);
    assert_eq!(lora_dropout_bytes(&m, &ep2, &down, 16, 1, None, Recompute::Off), 2048.0);
}

#[test]
fn embedded_trainer_activations_by_hand() {
    // tiny: d 64, q 4 x 16 = 64, kv 2 x 16 = 32, f 128, 4 heads, seq 8. Per token and layer:
    // 6 x 64 + 5 x 64 + 4 x 32 + 2 x 64 (GQA repeat) + 4 x 128 + 2 x 4 x 8 = 1536.
    let m = tiny();
    assert_eq!(embedded_layer_elements(&m, 8), 1536.0);
    // MHA: no repeated keys and values.
    let mha = ModelSpec { kv_heads: 4, ..tiny() };
    assert_eq!(embedded_layer_elements(&mha, 8), 1536.0 - 128.0 + 4.0 * 32.0);
    // Head: 3 x 64 + 3 x vocab 1000; the entropy in the loss keeps one more vocab tensor.
    assert_eq!(embedded_head_elements(&m, false), 3192.0);
    assert_eq!(embedded_head_elements(&m, true), 4192.0);
    // Micro-batch 2 x seq 8 = 16 tokens x (4 layers x 1536 + 3192) plus the concatenated
    // weights 4 x (128 x 64 + 2 x 128 x 64) = 98,304, 4 B each.
    let a = embedded_activation_bytes(&m, 8, 2, false, None);
    assert_eq!(a, (16.0 * 9336.0 + 98_304.0) * 4.0);
    assert_eq!(a, 990_720.0);
    // LoRA rank 8 on all 7 targets: each keeps its A output, 7 x 8 x 4 layers per token.
    let lo = lora(8, 1, &LoraTarget::ALL);
    assert_eq!(embedded_activation_bytes(&m, 8, 2, false, Some(&lo)), 990_720.0 + 16.0 * 224.0 * 4.0);
    // Linear in the micro-batch above the concatenated weights.
    let b = embedded_activation_bytes(&m, 8, 4, false, None);
    assert_eq!(b - a, 16.0 * 9336.0 * 4.0);
}

#[test]
fn ppo_critic_bytes_by_hand() {
    // tiny, untied: 1,000,000 params - LM head 1000 x 64 + value head 64 = 936,064.
    let m = ModelSpec { tied_embeddings: Some(false), ..tiny() };
    assert_eq!(critic_dropped_head(&m), 64_000);
    assert_eq!((critic_spec(&m).params, critic_spec(&m).active_params), (936_064, 936_064));
    // Tied (the head is the embedding, kept) or not known: 1,000,064.
    for tied in [Some(true), None] {
        assert_eq!(critic_spec(&ModelSpec { tied_embeddings: tied, ..tiny() }).params, 1_000_064);
    }
    // Megatron TP1 PP1 DP1, bf16: 2 B weights, 4 B FP32 gradients, 12 B Adam state per param.
    let l = layout(Backend::Megatron, 1, 1, 1, 1, 1);
    let c = critic_state_bytes(&m, &l);
    assert_eq!((c.weights, c.adapters, c.gradients, c.optimizer), (1_872_128.0, 0.0, 3_744_256.0, 11_232_768.0));
    // TP2: weights and gradients halve; DP2 shards the optimizer state too.
    let c = critic_state_bytes(&m, &layout(Backend::Megatron, 2, 1, 1, 1, 2));
    assert_eq!((c.weights, c.gradients, c.optimizer), (936_064.0, 1_872_128.0, 2_808_192.0));
    // FSDP over 2: a half of everything, plus two gathered layers (936,064 / 4 x 2 x 2 B).
    let c = critic_state_bytes(&m, &layout(Backend::Fsdp, 1, 1, 1, 1, 2));
    assert_eq!((c.weights, c.gradients, c.optimizer), (936_064.0 + 936_064.0, 1_872_128.0, 5_616_384.0));
    // Embedded, FP32: 4 B weights, 4 B gradients, 8 B moments.
    let fp32 = Layout { precision: Precision::Fp32, ..layout(Backend::Embedded, 1, 1, 1, 1, 1) };
    let c = critic_state_bytes(&m, &fp32);
    assert_eq!((c.weights, c.gradients, c.optimizer), (3_744_256.0, 3_744_256.0, 7_488_512.0));

    // Activations: the policy's without the FP32 logits. seq 32, micro-batch 2, TP1, off:
    // 34 x 32 x 2 x 64 = 139,264 B per layer x 4 layers; the logits are 64 x 1000 x 4 B.
    let a = critic_activation_bytes(&m, &l, 32, 2, None, Recompute::Off);
    assert_eq!(a, 4.0 * 139_264.0);
    assert_eq!(activation_bytes(&m, &l, 32, 2, None, Recompute::Off), a + 256_000.0);
    // Embedded, seq 8 x micro-batch 2 = 16 tokens: 4 layers x 1536 + 3 x 64 per token, plus
    // the concatenated weights 98,304, 4 B each; the policy's head adds 3 x vocab per token.
    let e = embedded_critic_activation_bytes(&m, 8, 2);
    assert_eq!(e, (16.0 * (4.0 * 1536.0 + 192.0) + 98_304.0) * 4.0);
    assert_eq!(e, 798_720.0);
    assert_eq!(embedded_activation_bytes(&m, 8, 2, false, None), e + 16.0 * 3000.0 * 4.0);
}

#[test]
fn opd_teacher_bytes_by_hand() {
    // tiny as the teacher: 1,000,000 params, d 64, 4 layers, vocab 1000. Frozen: weights only.
    let t = tiny();
    // Megatron TP1 bf16: 2 B per param; TP2 halves them.
    let l = layout(Backend::Megatron, 1, 1, 1, 1, 1);
    assert_eq!(teacher_weight_bytes(&t, &l, false), 2_000_000.0);
    assert_eq!(teacher_weight_bytes(&t, &layout(Backend::Megatron, 2, 1, 1, 1, 2), false), 1_000_000.0);
    // FSDP over 2: half the weights, plus two gathered layers (1,000,000 / 4 x 2 x 2 B).
    assert_eq!(teacher_weight_bytes(&t, &layout(Backend::Fsdp, 1, 1, 1, 1, 2), false), 2_000_000.0);
    // The embedded CPU host: FP32 and whole, whatever the trainer's precision.
    assert_eq!(teacher_weight_bytes(&t, &l, true), 4_000_000.0);

    // GPU no-grad forward, seq 32, micro-batch 2: one layer 34 x 32 x 2 x 64 = 139,264 B, plus
    // FP32 logits and log-softmax 2 x 64 tokens x 1000 x 4 B = 512,000 B.
    assert_eq!(teacher_activation_bytes(&t, &l, 32, 2), 651_264.0);
    // TP2 or CP2: half of each.
    assert_eq!(teacher_activation_bytes(&t, &layout(Backend::Megatron, 2, 1, 1, 1, 1), 32, 2), 325_632.0);
    assert_eq!(teacher_activation_bytes(&t, &layout(Backend::Megatron, 1, 1, 2, 1, 1), 32, 2), 325_632.0);
    // Fewer than the policy's activations with no recomputation: 4 layers x 139,264 + 256,000.
    assert!(teacher_activation_bytes(&t, &l, 32, 2) < activation_bytes(&t, &l, 32, 2, None, Recompute::Off));

    // Embedded, seq 8 x micro-batch 2 = 16 tokens: one layer's 1536 + 3 x 64 + 2 x 1000 = 3728
    // per token, plus one layer's concatenated weights (64 + 64) x 64 + 2 x 128 x 64 = 24,576,
    // 4 B each; no autograd.
    let e = embedded_teacher_activation_bytes(&t, 8, 2);
    assert_eq!(e, (16.0 * 3728.0 + 24_576.0) * 4.0);
    assert_eq!(e, 336_896.0);
}

#[test]
fn ppo_critic_of_an_moe_model_keeps_its_experts() {
    // Subtracting the head from total and active leaves total - active, so the routed
    // experts (and their sharding over EP) are the policy's.
    let m = ModelSpec { tied_embeddings: Some(false), ..qwen3_30b() };
    let c = critic_spec(&m);
    assert_eq!(c.params, 30_500_000_000 - 151_936 * 2048 + 2048);
    assert_eq!(param_split(&c).routed, param_split(&m).routed);
    let l = layout(Backend::Megatron, 2, 1, 1, 8, 4);
    let (p, q) = (state_bytes(&m, &l, None), critic_state_bytes(&m, &l));
    // Only the dense part changes: by (head - d) / TP2 params on every rank.
    let dense = (151_936.0 * 2048.0 - 2048.0) / 2.0;
    assert!(close(p.weights - q.weights, dense * 2.0, 1e-9), "{p:?} {q:?}");
    assert!(close(p.gradients - q.gradients, dense * 4.0, 1e-9), "{p:?} {q:?}");
}

#[test]
fn div_by_zero_is_zero() {
    assert_eq!(div(1.0, 0.0), 0.0);
    let l = layout(Backend::Megatron, 1, 1, 1, 1, 1);
    let m = ModelSpec { layers: 0, hidden_size: 0, ..llama8b() };
    assert!(activation_bytes(&m, &Layout { pp: 0, cp: 0, ..l }, 0, 0, Some(0), Recompute::Full).is_finite());
    let all = with_dropout(lora(16, 1, &LoraTarget::ALL), 0.1);
    let moe = ModelSpec { layers: 0, hidden_size: 0, ..qwen3_30b() };
    for m in [&m, &moe] {
        let a = lora_params(m, &all);
        assert!(a.routed.is_finite() && a.other.is_finite() && a.other >= 0.0, "{a:?}");
        let d = lora_dropout_bytes(m, &Layout { pp: 0, cp: 0, ..l }, &all, 0, 0, Some(0), Recompute::Off);
        assert!(d.is_finite() && d >= 0.0, "{d}");
    }
}
