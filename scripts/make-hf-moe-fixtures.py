#!/usr/bin/env python3
"""Writes tests/fixtures/hf/qwen3_moe/ and tests/fixtures/hf/mixtral/: tiny random-weight
mixture-of-experts Hugging Face directories made by transformers itself, and the reference
logits it computes for them. engine/tch/tests/integration/hf_moe.rs compares our forward with
them; CI never runs this script.

Regenerate (by hand, from the repository root, in the fixtures' private venv; see
scripts/make-hf-fixtures.py, whose helpers this imports):

    bench/out/trl-venv/bin/python scripts/make-hf-moe-fixtures.py

transformers 5 holds experts as fused 3-D parameters in memory (`mlp.experts.gate_up_proj`
[E, 2I, H], `mlp.experts.down_proj` [E, H, I]) but save_pretrained writes them back in the Hub's
per-expert form (`mlp.experts.{j}.{gate,up,down}_proj.weight` for Qwen3-MoE,
`block_sparse_moe.experts.{j}.w1/w2/w3.weight` for Mixtral); `check_layout` asserts that, so a
transformers that starts saving the fused form fails here instead of silently changing what the
fixtures test.

  qwen3_moe/  Qwen3MoeForCausalLM, fp32: 3 layers, layer 1 dense (`mlp_only_layers = [1]`, width
              `intermediate_size` 48) between two MoE layers of 8 experts (width
              `moe_intermediate_size` 24), top 2, `norm_topk_prob = false` (the raw softmax
              weights: Mixtral covers the renormalised case), q/k norm, head_dim 16 != 32 / 4,
              GQA, untied; the qwen3 fixture's tokenizer (vocab 500)
  mixtral/    MixtralForCausalLM, weights in bf16: 2 layers of 4 experts (width 48), top 2, GQA,
              untied; the llama fixture's tokenizer (vocab 600, bos added by the tokenizer)

  <arch>/reference/logits.safetensors   the layout of the dense fixtures (make-hf-fixtures.py)
  <arch>/VERSIONS.json                  torch / transformers / tokenizers / python versions
"""

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import tokenizers
import torch
import transformers
from safetensors import safe_open
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "hf"
SEED = 4321

_spec = importlib.util.spec_from_file_location("make_hf_fixtures", ROOT / "scripts" / "make-hf-fixtures.py")
dense = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dense)


def randomize(model):
    """Norms away from 1 (dense.randomize), and routers with logits far enough apart that
    transformers' top-k and ours cannot break a near-tie differently."""
    dense.randomize(model)
    g = torch.Generator().manual_seed(SEED + 3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate.weight") and p.dim() == 2:
                p.copy_(1.0 * torch.randn(p.shape, generator=g))


def check_layout(d: Path, want: list, refuse: list):
    """The saved weights hold the per-expert names in `want` and none containing `refuse`."""
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    for n in want:
        assert n in names, f"{d}: save_pretrained wrote no {n} (has {sorted(names)[:8]}...)"
    for r in refuse:
        bad = [n for n in names if r in n]
        assert not bad, f"{d}: save_pretrained wrote the fused form ({bad[:3]}): update the loader and this script"


def make(name, cfg_cls, model_cls, cfg_kwargs, tok_from, add_bos, pad_token, dtype, want, refuse):
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(OUT / tok_from / f, d / f)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    pad_id = tok.token_to_id(pad_token)
    torch.manual_seed(SEED)
    cfg = cfg_cls(
        vocab_size=tok.get_vocab_size(),
        pad_token_id=pad_id,
        initializer_range=0.1,
        attn_implementation="eager",
        **cfg_kwargs,
    )
    model = model_cls(cfg)
    randomize(model)
    if dtype != torch.float32:
        # The reference comes from the rounded weights in fp32 (as in make-hf-fixtures.py).
        with torch.no_grad():
            for prm in model.parameters():
                prm.copy_(prm.to(dtype).to(torch.float32))
    dense.reference_logits(model, d, tok, add_bos, pad_id)
    model = model.to(dtype)
    model.save_pretrained(str(d))
    check_layout(d, want, refuse)
    dense.check_reload(d, model_cls)
    versions = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "python": sys.version.split()[0],
    }
    (d / "VERSIONS.json").write_text(json.dumps(versions, indent=2) + "\n")
    size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
    assert size < 1_000_000, f"{d}: {size} bytes"
    print(f"wrote {d} ({size / 1e3:.0f} kB)")


def main():
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        hidden_act="silu",
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    )
    make(
        "qwen3_moe",
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
        dict(
            common,
            num_hidden_layers=3,
            head_dim=16,
            intermediate_size=48,
            moe_intermediate_size=24,
            num_experts=8,
            norm_topk_prob=False,
            mlp_only_layers=[1],
            decoder_sparse_step=1,
            rms_norm_eps=1e-6,
            router_aux_loss_coef=0.001,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            bos_token_id=None,
            eos_token_id=2,
        ),
        "qwen3",
        False,
        "<|endoftext|>",
        torch.float32,
        [
            "model.layers.0.mlp.gate.weight",
            "model.layers.0.mlp.experts.7.gate_proj.weight",
            "model.layers.1.mlp.up_proj.weight",
            "model.layers.2.mlp.experts.0.down_proj.weight",
        ],
        ["gate_up_proj", "experts.down_proj"],
    )
    make(
        "mixtral",
        MixtralConfig,
        MixtralForCausalLM,
        dict(
            common,
            num_hidden_layers=2,
            intermediate_size=48,
            num_local_experts=4,
            rms_norm_eps=1e-5,
            router_jitter_noise=0.0,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            bos_token_id=0,
            eos_token_id=1,
        ),
        "llama",
        True,
        "<|end_of_text|>",
        torch.bfloat16,
        [
            "model.layers.0.block_sparse_moe.gate.weight",
            "model.layers.1.block_sparse_moe.experts.3.w1.weight",
            "model.layers.1.block_sparse_moe.experts.3.w2.weight",
            "model.layers.1.block_sparse_moe.experts.3.w3.weight",
        ],
        ["gate_up_proj", "experts.down_proj"],
    )


if __name__ == "__main__":
    main()
