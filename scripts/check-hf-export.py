#!/usr/bin/env python3
"""Loads a model `miles run` exported (OUT/model) with Hugging Face `transformers` and its
tokenizer, applies the chat template to one prompt and decodes greedily: the check that an
export is a directory transformers takes as it is.

By hand, in the fixtures' private venv (scripts/make-hf-fixtures.py says how to make it); CI
never runs it (no Python ML stack there). That the weights are the trained ones is tested in
Rust: engine/tch/tests/integration/hf.rs (our forward equals transformers' on every fixture
architecture) and engine/tch/tests/integration/hf_run.rs (the export reloads to the trainer's last
weights). Usage:

    /work/venv-hf/bin/python scripts/check-hf-export.py runs/grpo-hf/model
"""
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
tok = AutoTokenizer.from_pretrained(model_dir)
messages = [{"role": "user", "content": "3+4="}]
ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
if not isinstance(ids, torch.Tensor):
    ids = ids["input_ids"]
with torch.no_grad():
    logits = model(ids).logits
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
print(f"loaded {type(model).__name__} from {model_dir}: {sum(p.numel() for p in model.parameters())} parameters")
print(f"prompt ids {ids[0].tolist()}")
print(f"greedy answer {tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)!r}")
print(f"last-position logits[:5] {logits[0, -1, :5].tolist()}")
