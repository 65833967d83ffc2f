"""One Hugging Face Llama checkpoint both sides of the TRL comparison start from.

The 0.1M comparison (recipes/compare-trl.miles) trained two different models: miles its own
Llama-style transformer with its own init, TRL a GPT-2 of the same size. This writes ONE random
LlamaForCausalLM, sized as the spec's `model` (layers, d_model, heads, kv heads, d_ff, vocab,
max_len, rope theta, norm eps, init std; untied embeddings, as miles' transformer), from a seed,
plus the task's character tokenizer as a Hugging Face one (the same JSON miles' CharTokenizer
writes with `hf_files`: `<pad>` 0, `<s>` 1 added in front, `</s>` 2, then the characters in sorted
order), so miles loads it with `hf { path = DIR }` (recipes/compare-trl-hf.miles) and TRL with
`grpo_trl.py --init DIR`.

Checks before it writes (atomically: a temp directory renamed into place): the tokenizer, loaded
back by `tokenizers` and by transformers' PreTrainedTokenizerFast, encodes every prompt and answer
of PROMPTS.json (bench/peers/tools export-prompts) to miles' CharTokenizer ids (BOS + prompt
characters; answer characters + EOS), and the saved weights load back bit-identical.

Usage (the TRL venv):
  bench/out/trl-venv/bin/python bench/peers/trl/make_same_model.py \
      --spec SPEC.json --prompts PROMPTS.json --out recipes/data/compare-trl-init [--seed 0]
SPEC.json: `miles run recipes/compare-trl.miles --print-spec`; PROMPTS.json: export-prompts of it.
bench/peers/run.py runs it when the hf recipe's directory is missing (or with --remake-init). The
init is reproducible: seed 0 gives the committed model.safetensors byte for byte (torch 2.15, CPU).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

PAD, BOS, EOS = 0, 1, 2


def char_tokenizer_files(chars):
    """miles' CharTokenizer::hf_files (engine/runtime/src/tokenize/chars.rs), field for field."""
    pad, bos, eos = "<pad>", "<s>", "</s>"
    vocab = {pad: PAD, bos: BOS, eos: EOS}
    for i, c in enumerate(chars):
        vocab[c] = i + 3

    def added(i, t):
        return {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}

    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added(PAD, pad), added(BOS, bos), added(EOS, eos)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated",
                          "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [BOS], "tokens": [bos]}},
        },
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "add_bos_token": True,
        "model_max_length": 1_000_000,
    }
    return tokenizer, config


def llama_config(m):
    if m.get("experts"):
        sys.exit("make_same_model.py: a dense model only (the spec has experts)")
    return LlamaConfig(
        vocab_size=m["vocab_size"],
        hidden_size=m["d_model"],
        intermediate_size=m["d_ff"],
        num_hidden_layers=m["n_layers"],
        num_attention_heads=m["n_heads"],
        num_key_value_heads=m.get("n_kv_heads", m["n_heads"]),
        max_position_embeddings=m["max_len"],
        rms_norm_eps=m.get("norm_eps", 1e-5),
        rope_theta=m.get("rope_theta", 10000.0),
        initializer_range=m.get("init_std", 0.02),
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        torch_dtype="float32",
    )


def check_tokenizer(dir_, chars, data):
    """Every prompt and answer the run uses encodes to miles' CharTokenizer ids, through both
    Python loaders (miles' own loader of the same JSON is checked by its unit test
    `a_saved_char_tokenizer_is_a_hugging_face_one_with_the_same_ids`)."""
    cid = {c: i + 3 for i, c in enumerate(chars)}
    raw = Tokenizer.from_file(os.path.join(dir_, "tokenizer.json"))
    fast = PreTrainedTokenizerFast.from_pretrained(dir_)
    assert (fast.bos_token_id, fast.eos_token_id, fast.pad_token_id) == (BOS, EOS, PAD), "special ids"
    items = [it for step in data["sft"] for it in step] + [it for step in data["rollout"] for it in step]
    items += data["test"]
    seen = set()
    for it in items:
        if it["prompt"] in seen:
            continue
        seen.add(it["prompt"])
        want_p = [BOS] + [cid[c] for c in it["prompt"]]
        want_a = [cid[c] for c in it["label"]]
        for name, got_p, got_a in [
            ("tokenizers", raw.encode(it["prompt"]).ids, raw.encode(it["label"], add_special_tokens=False).ids),
            ("transformers", fast(it["prompt"])["input_ids"], fast(it["label"], add_special_tokens=False)["input_ids"]),
        ]:
            if got_p != want_p or got_a != want_a:
                sys.exit(f"{name} encodes {it['prompt']!r} -> {it['label']!r} as {got_p} / {got_a}, "
                         f"miles' CharTokenizer as {want_p} / {want_a}")
        if fast.decode(want_a + [EOS], skip_special_tokens=True) != it["label"]:
            sys.exit(f"decode of {it['label']!r} differs")
    return len(seen)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True, help="miles run recipes/compare-trl.miles --print-spec")
    ap.add_argument("--prompts", required=True, help="export-prompts of that spec (the tokenizer's characters)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0, help="the init's seed (torch.manual_seed)")
    a = ap.parse_args()
    spec = json.load(open(a.spec))
    data = json.load(open(a.prompts))
    chars = data["tokenizer"]["chars"]
    m = spec["model"]
    if "d_model" not in m:
        sys.exit("make_same_model.py: the spec's model has no sizes; give the spec of recipes/compare-trl.miles "
                 "(its own transformer), not of the hf recipe")
    if len(chars) + 3 > m["vocab_size"]:
        sys.exit(f"the task's {len(chars)} characters + 3 specials exceed the model's vocab {m['vocab_size']}")

    cfg = llama_config(m)
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(cfg).float().eval()
    n_params = sum(p.numel() for p in model.parameters())

    parent = os.path.dirname(os.path.abspath(a.out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".same-model-", dir=parent)
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model directory is for reading
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tok, tok_cfg = char_tokenizer_files(chars)
        json.dump(tok, open(os.path.join(tmp, "tokenizer.json"), "w"), indent=2)
        json.dump(tok_cfg, open(os.path.join(tmp, "tokenizer_config.json"), "w"), indent=2)
        n_checked = check_tokenizer(tmp, chars, data)
        back = LlamaForCausalLM.from_pretrained(tmp)
        sd = model.state_dict()
        for k, v in back.state_dict().items():
            if not torch.equal(v, sd[k]):
                sys.exit(f"weights do not load back: {k}")
        for f in os.listdir(tmp):  # transformers writes the weights owner-only
            os.chmod(os.path.join(tmp, f), 0o644)
        json.dump({"seed": a.seed, "params": n_params, "chars": chars, "model": m, "prompts_checked": n_checked},
                  open(os.path.join(tmp, "made-by.json"), "w"), indent=1)
        shutil.rmtree(a.out, ignore_errors=True)
        os.rename(tmp, a.out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"{a.out}: LlamaForCausalLM, {n_params} parameters, init seed {a.seed}; tokenizer checked on "
          f"{n_checked} distinct prompts", file=sys.stderr)


if __name__ == "__main__":
    main()
