#!/usr/bin/env python3
"""Loads a model `miles run` exported (OUT/model) with Hugging Face `transformers` and its
tokenizer, applies the chat template to one prompt and decodes greedily: the check that an
export is a directory transformers takes as it is.

With `--compare FILE` (a safetensors file holding input_ids, attention_mask, position_ids and
the logits miles computed for them, as engine/tch/tests/integration/hf_moe.rs writes one), it
also runs transformers' forward on those inputs and exits with status 1 when its logits differ
from miles' by more than `--tol` (default 1e-4) at any real position: the check that the weights
mean the same thing to both, mixture-of-experts routing included. Without a tokenizer in the
directory the chat step is skipped.

By hand, in the fixtures' private venv (scripts/make-hf-fixtures.py says how to make it); CI
never runs it (no Python ML stack there); hf_moe.rs runs it where bench/out/trl-venv or
MILES_HF_PYTHON exists. That the weights are the trained ones is tested in Rust:
engine/tch/tests/integration/hf.rs (our forward equals transformers' on every fixture
architecture) and engine/tch/tests/integration/hf_run.rs (the export reloads to the trainer's last
weights). Usage:

    /work/venv-hf/bin/python scripts/check-hf-export.py runs/grpo-hf/model
    bench/out/trl-venv/bin/python scripts/check-hf-export.py OUT/model --compare ours.safetensors
"""
import argparse
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("model_dir")
ap.add_argument("--compare", help="safetensors with input_ids, attention_mask, position_ids, logits")
ap.add_argument("--tol", type=float, default=1e-4)
args = ap.parse_args()

model_dir = args.model_dir
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
print(f"loaded {type(model).__name__} from {model_dir}: {sum(p.numel() for p in model.parameters())} parameters")


def chat_step():
    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.chat_template:
        messages = [{"role": "user", "content": "3+4="}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    else:
        ids = tok("3+4=", return_tensors="pt")
    if not isinstance(ids, torch.Tensor):
        ids = ids["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    print(f"prompt ids {ids[0].tolist()}")
    print(f"greedy answer {tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)!r}")
    print(f"last-position logits[:5] {logits[0, -1, :5].tolist()}")


if os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
    try:
        chat_step()
    except Exception as e:  # a task's own vocabulary may lack "3+4=" (the letters of a string task)
        print(f"chat step skipped: the tokenizer cannot encode the prompt: {e}")

if args.compare:
    from safetensors.torch import load_file

    ref = load_file(args.compare)
    with torch.no_grad():
        got = model(
            input_ids=ref["input_ids"], attention_mask=ref["attention_mask"], position_ids=ref["position_ids"]
        ).logits.float()
    real = ref["attention_mask"].bool()
    err = (got - ref["logits"])[real].abs().max().item()
    print(f"max |logits(transformers) - logits(miles)| over real positions: {err:.3e} (tolerance {args.tol:g})")
    if not err <= args.tol:
        print("FAIL: transformers reads this export differently from miles", file=sys.stderr)
        sys.exit(1)
