//! Two reference inputs for the crate's tests and bench/plan, which build plan inputs by hand
//! rather than compile a recipe: GLM-5.2 as in stdlib/std/models.miles, and a GB300 as in
//! stdlib/std/hardware.miles except its host link (450 GB/s, the figure the bench has always used).

use crate::input::*;

/// GLM-5.2 744B-A40B, the Miles paper's reference model.
pub fn glm5() -> ModelSpec {
    ModelSpec {
        name: "GLM-5.2".into(),
        params: 744_000_000_000,
        active_params: 40_000_000_000,
        layers: 78,
        dense_layers: 3,
        hidden_size: 6144,
        heads: 64,
        kv_heads: 64,
        head_dim: 256,
        vocab: 154_880,
        experts: 256,
        top_k: 8,
        max_context: 202_752,
        attention: Attention::Mla,
        kv_lora_rank: Some(512),
        qk_rope_head_dim: Some(64),
        sparse_topk: None,
        index_head_dim: None,
        update_requantize_s: None,
        intermediate_size: None,
        tied_embeddings: None,
    }
}

/// The GB300: 288 GB of HBM, 4 per node.
pub fn gb300() -> GpuSpec {
    GpuSpec {
        name: "GB300".into(),
        arch: Arch::Blackwell,
        hbm: 288_000_000_000,
        hbm_bandwidth: 8e12,
        bf16: 2.5e15,
        fp8: Some(5e15),
        fp4: Some(15e15),
        scaleup_domain: 72,
        scaleup_bandwidth: 900e9,
        network_bandwidth: 100e9,
        gpus_per_node: 4,
        host_link_bandwidth: 450e9,
        host_memory: Some(960_000_000_000),
        disk_bandwidth: None,
    }
}
