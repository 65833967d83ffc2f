#!/usr/bin/env python3
"""Writes tests/fixtures/hf/: tiny random-weight Hugging Face model directories and the reference
outputs that `transformers` computes for them. The Rust tests (engine/tch/tests/integration/hf.rs,
and the tokenizer / chat-template tests) compare against these files; CI never runs this script.

Regenerate (by hand, from the repository root; needs network access to the package registry once):

    python3 -m venv /work/venv-hf
    /work/venv-hf/bin/pip install torch transformers tokenizers safetensors jinja2
    /work/venv-hf/bin/python scripts/make-hf-fixtures.py            # writes tests/fixtures/hf/

Everything is seeded, but a different torch/transformers/tokenizers version may produce different
bytes; the tests only need the references to agree with the weights written beside them.
The tokenizers are trained on the repository's docs/ and recipes/ (see `corpus`), so after those
change every architecture's tokenizer and references are rewritten too (each directory stays
self-consistent; restore the ones you did not mean to change with `git checkout`).
Versions used last: see tests/fixtures/hf/VERSIONS.json.

Layout (one directory per architecture, each loadable by `AutoModelForCausalLM.from_pretrained`
and `AutoTokenizer.from_pretrained`):

  llama/   LlamaForCausalLM: untied lm_head, rope_scaling llama3, GQA, fp32 weights SHARDED
           (model-0000X-of-0000N.safetensors + model.safetensors.index.json), config.json in the
           transformers 4.x form (rope_theta + rope_scaling + torch_dtype), Llama-3-style
           chat template (bos added by the tokenizer's post-processor, <|eot_id|> ends a turn)
  qwen2/, qwen3/ have config.json in the transformers 5 form (rope_parameters, dtype).
  qwen2/   Qwen2ForCausalLM: QKV bias, TIED embeddings, weights saved in bf16, vocab_size larger
           than the tokenizer (padded rows, as in real Qwen checkpoints), ChatML template with tools,
           tokenizer.json with the Qwen2 pipeline real checkpoints ship (NFC, digits split one by
           one): transformers builds a Qwen2Tokenizer by class for model_type qwen2 and ignores the
           file's pipeline, so the file must carry the same one
  qwen3/   Qwen3ForCausalLM: q/k RMSNorm, explicit head_dim != hidden/heads, untied, fp32,
           ChatML template with tools

  <arch>/reference/logits.safetensors
           input_ids [B,T] i64, attention_mask [B,T] i64 (row 1 is LEFT-padded), position_ids
           [B,T] i64 (index among the row's real tokens, 0 on pads), logits [B,T,V] f32,
           logprobs [B,T-1] f32 (log p(input_ids[:,t+1] | prefix); meaningful where
           attention_mask[:,t] and attention_mask[:,t+1] are both 1). Compare only real positions.
  <arch>/reference/tokenizer.json
           [{text, ids (add_special_tokens=true), ids_no_special, tokens, decoded,
             decoded_skip_special}]   computed by transformers' AutoTokenizer; every id list is
           checked to equal what `tokenizers.Tokenizer.from_file(<arch>/tokenizer.json)` gives
  <arch>/reference/chat.json
           [{name, messages, tools?, add_generation_prompt, text, ids}]   ids = encode(text,
           add_special_tokens=false): the template itself renders bos where it wants one.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import torch
import transformers
import tokenizers
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, decoders, trainers, processors
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "hf"
SEED = 1234

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# The split of Qwen2/Qwen2.5 checkpoints' tokenizer.json (and of transformers' Qwen2Tokenizer):
# GPT-2's, except that \p{N} takes ONE digit.
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

# Llama-3 structure: bos once, then a header per message, content trimmed, <|eot_id|> ends a turn.
LLAMA3_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{%- if loop.index0 == 0 %}{%- set content = bos_token + content %}{%- endif %}"
    "{{- content }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# ChatML with tools, the structure of the Qwen2.5/Qwen3 templates (no thinking blocks).
CHATML_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

TOKENIZER_STRINGS = [
    "",
    "a",
    "hello world",
    "Hello, World!",
    "  two leading spaces and trailing  ",
    "   ",
    "tabs\tand\nnewlines\n\n",
    "line\r\nwindows",
    "unicode: héllo wörld — naïve café",
    "CJK 你好世界 and emoji 🙂👍",
    "numbers 12345 3.14159 -7",
    'code: fn main() { println!("hi"); }',
    "the recipe compiles to a stage graph",
    "<|im_start|>user\nhi<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "not special: <|im_start and im_end|>",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    }
]

CONVERSATIONS = [
    ("system_user", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]),
    (
        "system_user_assistant",
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
        ],
    ),
    ("user_only", [{"role": "user", "content": "Say hello."}]),
    (
        "multi_turn",
        [
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello. How can I help?"},
            {"role": "user", "content": "  Sort: c a b  "},
        ],
    ),
    ("unicode", [{"role": "user", "content": "héllo 你好 🙂\n\tnew line"}]),
]

TOOL_CONVERSATION = (
    "tool_call",
    [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": '{"temp_c": 21}'},
        {"role": "assistant", "content": "It is 21 C in Paris."},
    ],
)


def corpus():
    """Text the BPE is trained on: the repository's docs and recipes (fixed order)."""
    files = sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "recipes").rglob("*.miles"))
    texts = [f.read_text(encoding="utf-8") for f in files]
    texts += TOKENIZER_STRINGS  # so unicode bytes and specials appear at least once
    return texts


def train_bpe(specials, vocab_size, qwen2=False):
    tok = Tokenizer(models.BPE())
    if qwen2:
        # As real Qwen2 checkpoints ship it; trained with it, so no merge joins two digits.
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def write_tokenizer(d: Path, kind: str):
    if kind == "llama3":
        tok = train_bpe(LLAMA3_SPECIALS, 600)
        bos = "<|begin_of_text|>"
        bos_id = tok.token_to_id(bos)
        # Llama 3 adds bos through the post-processor.
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
                ),
            ]
        )
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos,
            "eos_token": "<|eot_id|>",
            "pad_token": "<|end_of_text|>",
            "model_max_length": 4096,
            "clean_up_tokenization_spaces": False,
            "chat_template": LLAMA3_TEMPLATE,
        }
    else:
        tok = train_bpe(CHATML_SPECIALS, 500, qwen2=kind == "qwen2")
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "model_max_length": 4096,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHATML_TEMPLATE,
        }
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    return tok


def randomize(model):
    """HF initialises norms to 1 and biases to 0, which would hide a loader that drops them:
    perturb every vector so each parameter changes the logits."""
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                if "norm" in name:
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.2 * torch.randn(p.shape, generator=g))


def batch(tok, add_bos, pad_id, vocab):
    texts = [
        "The recipe compiles to a stage graph and runs.",
        "Hello, wörld!",
        "fn main() { let x = 42; }",
    ]
    rows = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=add_bos).ids
        rows.append(ids)
    T = max(len(r) for r in rows)
    # Row 0 and 2 cut/extended to T, row 1 stays shorter and is LEFT-padded.
    g = torch.Generator().manual_seed(SEED + 2)
    for i in (0, 2):
        while len(rows[i]) < T:
            rows[i].append(int(torch.randint(0, vocab, (1,), generator=g)))
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r) :] = torch.tensor(r)
        mask[i, T - len(r) :] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0) * mask
    return ids, mask, pos


def reference_logits(model, d: Path, tok, add_bos, pad_id):
    ids, mask, pos = batch(tok, add_bos, pad_id, model.config.vocab_size)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    r = d / "reference"
    r.mkdir(exist_ok=True)
    save_file(
        {
            "input_ids": ids.contiguous(),
            "attention_mask": mask.contiguous(),
            "position_ids": pos.contiguous(),
            "logits": logits.contiguous(),
            "logprobs": lp.contiguous(),
        },
        str(r / "logits.safetensors"),
    )


def reference_tokenizer(d: Path, supports_tools: bool):
    from transformers import AutoTokenizer

    tk = AutoTokenizer.from_pretrained(str(d))
    # What a loader of tokenizer.json alone (ours: the Rust `tokenizers` crate) computes.
    own = Tokenizer.from_file(str(d / "tokenizer.json"))

    def agree(text, ids, add_special_tokens, what):
        got = own.encode(text, add_special_tokens=add_special_tokens).ids
        assert got == ids, (
            f"{d}: {what} {text!r}: tokenizer.json gives {got}, transformers' {type(tk).__name__} {ids}"
        )

    out = []
    for s in TOKENIZER_STRINGS:
        ids = tk(s, add_special_tokens=True)["input_ids"]
        agree(s, ids, True, "ids")
        agree(s, tk(s, add_special_tokens=False)["input_ids"], False, "ids_no_special")
        out.append(
            {
                "text": s,
                "ids": ids,
                "ids_no_special": tk(s, add_special_tokens=False)["input_ids"],
                "tokens": tk.convert_ids_to_tokens(ids),
                "decoded": tk.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tk.decode(ids, skip_special_tokens=True),
            }
        )
    (d / "reference" / "tokenizer.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")

    chats = []
    convs = list(CONVERSATIONS) + ([TOOL_CONVERSATION] if supports_tools else [])
    for name, msgs in convs:
        tools = TOOLS if name == "tool_call" else None
        for agp in (True, False):
            text = tk.apply_chat_template(msgs, tools=tools, add_generation_prompt=agp, tokenize=False)
            entry = {"name": name, "messages": msgs, "add_generation_prompt": agp, "text": text}
            if tools:
                entry["tools"] = tools
            entry["ids"] = tk(text, add_special_tokens=False)["input_ids"]
            agree(text, entry["ids"], False, f"chat {name}")
            chats.append(entry)
    (d / "reference" / "chat.json").write_text(json.dumps(chats, indent=1, ensure_ascii=False) + "\n")


def make(name, cfg_cls, model_cls, cfg_kwargs, tok_kind, dtype, shard, supports_tools, legacy_config=False):
    d = OUT / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    tok = write_tokenizer(d, tok_kind)
    if tok_kind == "llama3":
        bos_id, eos_ids, pad_id = tok.token_to_id("<|begin_of_text|>"), [tok.token_to_id("<|end_of_text|>"), tok.token_to_id("<|eot_id|>")], tok.token_to_id("<|end_of_text|>")
    else:
        bos_id, eos_ids, pad_id = None, [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")], tok.token_to_id("<|endoftext|>")
    vocab = cfg_kwargs.pop("vocab_size", tok.get_vocab_size())
    assert vocab >= tok.get_vocab_size()
    torch.manual_seed(SEED)
    cfg = cfg_cls(
        vocab_size=vocab,
        bos_token_id=bos_id,
        eos_token_id=eos_ids[0],
        pad_token_id=pad_id,
        initializer_range=0.1,
        attn_implementation="eager",
        **cfg_kwargs,
    )
    model = model_cls(cfg)
    randomize(model)
    if dtype != torch.float32:
        # The reference is computed from the rounded weights, in fp32, so a loader that converts
        # them to fp32 must reproduce it exactly.
        # Parameters only: rounding the rotary inv_freq buffer too would change the reference.
        with torch.no_grad():
            for prm in model.parameters():
                prm.copy_(prm.to(dtype).to(torch.float32))
    reference_logits(model, d, tok, tok_kind == "llama3", pad_id)
    model = model.to(dtype)
    model.save_pretrained(str(d), max_shard_size="150KB" if shard else "1GB")
    model.generation_config.bos_token_id = bos_id
    model.generation_config.eos_token_id = eos_ids
    model.generation_config.pad_token_id = pad_id
    model.generation_config.save_pretrained(str(d))
    if legacy_config:
        to_legacy_config(d / "config.json")
    check_reload(d, model_cls)
    reference_tokenizer(d, supports_tools)


def to_legacy_config(path: Path):
    """Rewrites a config.json the way transformers 4.x wrote it (most checkpoints on the hub):
    top-level rope_theta, `rope_scaling` instead of v5's `rope_parameters`, `torch_dtype`."""
    c = json.loads(path.read_text())
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = None if rp.get("rope_type") == "default" else rp
    c["torch_dtype"] = c.pop("dtype")
    path.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")


def check_reload(d: Path, model_cls):
    """The written directory, loaded back by transformers, reproduces the reference logits."""
    from safetensors.torch import load_file

    ref = load_file(str(d / "reference" / "logits.safetensors"))
    m = model_cls.from_pretrained(str(d), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        got = m(
            input_ids=ref["input_ids"], attention_mask=ref["attention_mask"], position_ids=ref["position_ids"]
        ).logits
    real = ref["attention_mask"].bool()
    err = (got - ref["logits"])[real].abs().max().item()
    assert err < 1e-5, f"{d}: reloaded model differs from the reference by {err}"


def main():
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    OUT.mkdir(parents=True, exist_ok=True)
    common = dict(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        hidden_act="silu",
    )
    make(
        "llama",
        LlamaConfig,
        LlamaForCausalLM,
        dict(
            common,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            rope_scaling={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            rope_theta=500000.0,
        ),
        "llama3",
        torch.float32,
        True,
        False,
        legacy_config=True,
    )
    make(
        "qwen2",
        Qwen2Config,
        Qwen2ForCausalLM,
        dict(common, vocab_size=512, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1000000.0),
        "qwen2",
        torch.bfloat16,
        False,
        True,
    )
    make(
        "qwen3",
        Qwen3Config,
        Qwen3ForCausalLM,
        dict(common, head_dim=24, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=1000000.0),
        "chatml",
        torch.float32,
        False,
        True,
    )
    versions = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "python": sys.version.split()[0],
    }
    (OUT / "VERSIONS.json").write_text(json.dumps(versions, indent=2) + "\n")
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"wrote {OUT} ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
