#!/usr/bin/env python3
"""Writes tests/fixtures/hf-configs/<model>/config.json (directories holding ONLY config.json)
from the published config.json values of each model (the sources are in that directory's
README.md), then counts each model's parameters as transformers lays it out: the model is built
on the meta device (no memory) and `sum(p.numel() for p in model.parameters())` is printed
beside `miles`'s own count, which tests/language/hf_configs.rs pins.

Run by hand in a private venv with torch and transformers (5.x):
    bench/out/trl-venv/bin/python scripts/make-hf-config-fixtures.py [--count]
Without --count it only writes the files.
"""
import json
import os
import sys

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf-configs")

QWEN3_COMMON = {
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "head_dim": 128, "hidden_act": "silu", "initializer_range": 0.02, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
LLAMA31_COMMON = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "initializer_range": 0.02,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": 128256,
}
FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
DEEPSEEK_COMMON = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001, "ep_size": 1, "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02,
    "intermediate_size": 18432, "kv_lora_rank": 512, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_shared_experts": 1, "norm_topk_prob": True, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "quantization_config": FP8,
    "rms_norm_eps": 1e-06, "scoring_func": "sigmoid", "seq_aux": True, "tie_word_embeddings": False,
    "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": True, "v_head_dim": 128,
}
GLM45_COMMON = {
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "pad_token_id": 151329, "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu",
    "partial_rotary_factor": 0.5, "initializer_range": 0.02, "model_type": "glm4_moe", "norm_topk_prob": True,
    "n_group": 1, "topk_group": 1, "n_shared_experts": 1, "num_experts_per_tok": 8, "num_key_value_heads": 8,
    "num_attention_heads": 96, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
    "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.0", "use_cache": True, "vocab_size": 151552,
}
GPT_OSS_COMMON = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "initial_context_length": 4096, "initializer_range": 0.02, "intermediate_size": 2880,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_key_value_heads": 8, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088,
}


def gpt_oss(layers, experts):
    return {**GPT_OSS_COMMON, "num_hidden_layers": layers, "num_local_experts": experts,
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]}


CONFIGS = {
    "qwen3-8b": {**QWEN3_COMMON, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
                 "intermediate_size": 12288, "max_window_layers": 36, "num_attention_heads": 32,
                 "num_hidden_layers": 36, "num_key_value_heads": 8},
    "qwen3-30b-a3b": {**QWEN3_COMMON, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                      "decoder_sparse_step": 1, "hidden_size": 2048, "intermediate_size": 6144,
                      "max_window_layers": 48, "mlp_only_layers": [], "moe_intermediate_size": 768,
                      "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
                      "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
                      "output_router_logits": False, "router_aux_loss_coef": 0.001},
    "qwen3-235b-a22b": {**QWEN3_COMMON, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                        "decoder_sparse_step": 1, "hidden_size": 4096, "intermediate_size": 12288,
                        "max_window_layers": 94, "mlp_only_layers": [], "moe_intermediate_size": 1536,
                        "norm_topk_prob": True, "num_attention_heads": 64, "num_experts": 128,
                        "num_experts_per_tok": 8, "num_hidden_layers": 94, "num_key_value_heads": 4,
                        "output_router_logits": False, "router_aux_loss_coef": 0.001},
    "mixtral-8x7b": {"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
                     "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
                     "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
                     "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
                     "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": False,
                     "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
                     "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                     "transformers_version": "4.36.0.dev0", "use_cache": True, "vocab_size": 32000},
    "llama-3.1-8b": {**LLAMA31_COMMON, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                     "num_hidden_layers": 32, "num_key_value_heads": 8},
    "llama-3.1-70b": {**LLAMA31_COMMON, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
                      "num_hidden_layers": 80, "num_key_value_heads": 8},
    "deepseek-v3": {**DEEPSEEK_COMMON, "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3,
                    "max_position_embeddings": 163840, "model_type": "deepseek_v3", "n_group": 8,
                    "n_routed_experts": 256, "num_attention_heads": 128, "num_key_value_heads": 128,
                    "num_nextn_predict_layers": 1,
                    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                     "type": "yarn"},
                    "rope_theta": 10000, "routed_scaling_factor": 2.5, "topk_group": 4,
                    "transformers_version": "4.33.1", "vocab_size": 129280},
    "kimi-k2-instruct": {**DEEPSEEK_COMMON, "bos_token_id": 163584, "eos_token_id": 163585,
                         "first_k_dense_replace": 1, "max_position_embeddings": 131072, "model_type": "kimi_k2",
                         "n_group": 1, "n_routed_experts": 384, "num_attention_heads": 64,
                         "num_key_value_heads": 64, "num_nextn_predict_layers": 0, "pretraining_tp": 1,
                         "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                                          "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                          "type": "yarn"},
                         "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "topk_group": 1,
                         "transformers_version": "4.48.3", "vocab_size": 163840},
    "glm-4.5": {**GLM45_COMMON, "hidden_size": 5120, "intermediate_size": 12288, "max_position_embeddings": 131072,
                "moe_intermediate_size": 1536, "n_routed_experts": 160, "routed_scaling_factor": 2.5,
                "first_k_dense_replace": 3, "num_hidden_layers": 92, "use_qk_norm": True},
    "glm-4.6": {**GLM45_COMMON, "hidden_size": 5120, "intermediate_size": 12288, "max_position_embeddings": 202752,
                "moe_intermediate_size": 1536, "n_routed_experts": 160, "routed_scaling_factor": 2.5,
                "first_k_dense_replace": 3, "num_hidden_layers": 92, "use_qk_norm": True,
                "transformers_version": "4.57.0.dev0"},
    "glm-4.5-air": {**GLM45_COMMON, "hidden_size": 4096, "intermediate_size": 10944,
                    "max_position_embeddings": 131072, "moe_intermediate_size": 1408, "n_routed_experts": 128,
                    "routed_scaling_factor": 1.0, "first_k_dense_replace": 1, "num_hidden_layers": 46,
                    "use_qk_norm": False},
    "glm-5": {"architectures": ["GlmMoeDsaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": 0, "eos_token_id": [154820, 154827, 154829], "pad_token_id": 154820,
              "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 6144, "index_head_dim": 128,
              "index_n_heads": 32, "index_topk": 2048, "initializer_range": 0.02, "intermediate_size": 12288,
              "kv_lora_rank": 512, "max_position_embeddings": 202752, "model_type": "glm_moe_dsa",
              "moe_intermediate_size": 2048, "n_group": 1, "n_routed_experts": 256, "n_shared_experts": 1,
              "norm_topk_prob": True, "num_attention_heads": 64, "num_experts_per_tok": 8,
              "num_hidden_layers": 78, "num_key_value_heads": 64, "num_nextn_predict_layers": 1,
              "q_lora_rank": 2048, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
              "rope_parameters": {"rope_theta": 1000000, "rope_type": "default"}, "routed_scaling_factor": 2.5,
              "scoring_func": "sigmoid", "tie_word_embeddings": False, "topk_group": 1, "dtype": "bfloat16",
              "transformers_version": "5.2.0.dev0", "use_cache": True, "v_head_dim": 256, "vocab_size": 154880},
    "gpt-oss-20b": gpt_oss(24, 32),
    "gpt-oss-120b": gpt_oss(36, 128),
}


def write():
    for name, cfg in CONFIGS.items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        tmp = os.path.join(d, "config.json.tmp")
        with open(tmp, "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        os.replace(tmp, os.path.join(d, "config.json"))


def count():
    import torch
    import transformers
    for name, cfg in CONFIGS.items():
        cfg = dict(cfg)
        cfg.pop("quantization_config", None)
        if cfg["model_type"] == "kimi_k2":
            cfg["model_type"] = "deepseek_v3"
        mt = cfg.pop("model_type")
        c = transformers.AutoConfig.for_model(mt, **cfg)
        with torch.device("meta"):
            m = transformers.AutoModelForCausalLM.from_config(c)
        n = sum(p.numel() for p in m.parameters())
        print(f"{name}: {n}")


if __name__ == "__main__":
    write()
    if "--count" in sys.argv:
        count()
