#!/usr/bin/env python3
"""Writes tests/fixtures/peft/llama-r4/: a real PEFT LoRA adapter for the tiny Llama base model
tests/fixtures/hf/llama (written by scripts/make-hf-fixtures.py), and the outputs PEFT computes
with it. The Rust LoRA tests compare against these files; CI never runs this script.

Regenerate (by hand, from the repository root; needs network access to the package registry once,
no model hub: the base model is the committed fixture):

    python3 -m venv /work/venv-peft
    /work/venv-peft/bin/pip install torch transformers peft safetensors
    /work/venv-peft/bin/python scripts/make-peft-fixture.py     # writes tests/fixtures/peft/llama-r4/

The adapter is LoraConfig(r=4, lora_alpha=8 (scale alpha/r = 2), lora_dropout=0, bias="none",
task_type="CAUSAL_LM", target_modules q/k/v/o_proj + gate/up/down_proj) on both layers. PEFT
initialises lora_B to zero, which would make the adapter a no-op, so every lora_A and lora_B is
overwritten with N(0, 0.05^2) values (torch.manual_seed(0), in named_parameters order).
Everything is seeded, but another torch/transformers/peft version may produce different bytes;
the tests only need the references to agree with the adapter written beside them.
If the base model fixture is regenerated, rerun this script too.
Versions used last: see tests/fixtures/peft/llama-r4/VERSIONS.json.

Files (under tests/fixtures/peft/llama-r4/):

  adapter_config.json         PEFT's own, from save_pretrained; base_model_name_or_path is
                              rewritten to "../../hf/llama" (relative to this directory) and
                              target_modules sorted (PEFT writes a set, in hash order). The
                              model card (README.md) save_pretrained also writes is deleted.
  adapter_model.safetensors   PEFT's own tensor names, f32, for L in 0..2:
      base_model.model.model.layers.L.self_attn.{q,k,v,o}_proj.lora_{A,B}.weight
      base_model.model.model.layers.L.mlp.{gate,up,down}_proj.lora_{A,B}.weight
                              lora_A [r=4, in], lora_B [out, r=4]; (in, out) per module:
                              q (64,64), k (64,32), v (64,32), o (64,64),
                              gate (64,96), up (64,96), down (96,64)
  reference/logits.safetensors   (B=3, T=17, V=600 with the current base fixture)
      input_ids [B,T] i64, attention_mask [B,T] i64, position_ids [B,T] i64: copied unchanged
                              from tests/fixtures/hf/llama/reference/logits.safetensors (row 1
                              LEFT-padded; compare only real positions)
      logits [B,T,V] f32        the PEFT model (adapter unmerged) on those inputs
      logprobs [B,T-1] f32      log p(input_ids[:,t+1] | prefix) from `logits`
      merged_logits [B,T,V] f32 the model after merge_and_unload() on the same inputs
  reference/merged.safetensors
      model.layers.L.self_attn.{q,k,v,o}_proj.weight, model.layers.L.mlp.{gate,up,down}_proj.weight
                              [out, in] f32: the base weight + (alpha/r) * B @ A, as
                              merge_and_unload() computes it (transformers names)
  VERSIONS.json               torch, transformers, peft, safetensors, python versions used
"""

import json
import shutil
import sys
from pathlib import Path

import peft
import safetensors
import torch
import transformers
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "tests" / "fixtures" / "hf" / "llama"
OUT = ROOT / "tests" / "fixtures" / "peft" / "llama-r4"
BASE_REL = "../../hf/llama"  # BASE, relative to OUT
SEED = 0
STD = 0.05
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def forward(model, ref):
    """As make-hf-fixtures.py's reference_logits: explicit attention_mask and position_ids."""
    model.eval()
    with torch.no_grad():
        logits = model(
            input_ids=ref["input_ids"], attention_mask=ref["attention_mask"], position_ids=ref["position_ids"]
        ).logits.float()
    ids = ref["input_ids"]
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return logits, lp


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    (OUT / "reference").mkdir(parents=True)

    base_ref = load_file(str(BASE / "reference" / "logits.safetensors"))
    inputs = {k: base_ref[k] for k in ("input_ids", "attention_mask", "position_ids")}
    real = inputs["attention_mask"].bool()

    model = AutoModelForCausalLM.from_pretrained(str(BASE), dtype=torch.float32, attn_implementation="eager")
    # The base model alone must still reproduce its own reference, or the inputs are misread.
    base_logits, _ = forward(model, inputs)
    err = (base_logits - base_ref["logits"])[real].abs().max().item()
    assert err < 1e-5, f"base model differs from {BASE}/reference by {err}"

    cfg = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=TARGETS,
        task_type="CAUSAL_LM",
        bias="none",
    )
    model = get_peft_model(model, cfg)

    torch.manual_seed(SEED)
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape) * STD)
                n += 1
    assert n == 2 * len(TARGETS) * model.config.num_hidden_layers, n

    model.save_pretrained(str(OUT))
    # save_pretrained also writes a boilerplate model card naming the base by its absolute path.
    (OUT / "README.md").unlink(missing_ok=True)
    cpath = OUT / "adapter_config.json"
    c = json.loads(cpath.read_text())
    c["base_model_name_or_path"] = BASE_REL
    # PEFT keeps target_modules as a set: sort it so a rerun writes the same bytes.
    c["target_modules"] = sorted(c["target_modules"])
    cpath.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")

    logits, lp = forward(model, inputs)
    lora_delta = (logits - base_logits)[real].abs().max().item()
    assert lora_delta > 1e-3, f"adapter barely changes the logits ({lora_delta})"

    merged = model.merge_and_unload()
    merged_logits, _ = forward(merged, inputs)
    diff = (merged_logits - logits)[real].abs().max().item()
    diff_all = (merged_logits - logits).abs().max().item()
    assert diff < 1e-4, f"merged model differs from the unmerged one by {diff}"

    save_file(
        {
            **{k: v.contiguous() for k, v in inputs.items()},
            "logits": logits.contiguous(),
            "logprobs": lp.contiguous(),
            "merged_logits": merged_logits.contiguous(),
        },
        str(OUT / "reference" / "logits.safetensors"),
    )
    sd = merged.state_dict()
    touched = {
        k: sd[k].detach().to(torch.float32).contiguous()
        for k in sorted(sd)
        if k.endswith(".weight") and k.split(".")[-2] in TARGETS
    }
    assert len(touched) == len(TARGETS) * merged.config.num_hidden_layers, sorted(touched)
    save_file(touched, str(OUT / "reference" / "merged.safetensors"))

    # The written adapter, loaded back by PEFT onto a fresh base, reproduces the reference.
    from peft import PeftModel

    fresh = AutoModelForCausalLM.from_pretrained(str(BASE), dtype=torch.float32, attn_implementation="eager")
    reloaded = PeftModel.from_pretrained(fresh, str(OUT))
    got, _ = forward(reloaded, inputs)
    rerr = (got - logits)[real].abs().max().item()
    assert rerr < 1e-5, f"reloaded adapter differs from the reference by {rerr}"

    versions = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "safetensors": safetensors.__version__,
        "python": sys.version.split()[0],
    }
    (OUT / "VERSIONS.json").write_text(json.dumps(versions, indent=2) + "\n")

    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"max |logits(base) - logits(lora)| over real positions: {lora_delta:.6g}")
    print(f"max |logits(unmerged) - logits(merged)| over real positions: {diff:.6g} (all positions: {diff_all:.6g})")
    print(f"max |logits(reloaded) - logits(unmerged)| over real positions: {rerr:.6g}")
    print(f"wrote {OUT} ({total / 1e6:.3f} MB)")


if __name__ == "__main__":
    main()
