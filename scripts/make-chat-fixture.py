#!/usr/bin/env python3
"""Writes tests/fixtures/hf/qwen3-chat/: a tiny random-weight Qwen3ForCausalLM directory whose
tokenizer and chat template are made for agentic episodes with tool calls (the `calculator`
environment in the Hermes/Qwen tool format), and the renderings `transformers` computes for it.
The Rust tests (engine/runtime: the episode's loss mask against the template, the codec's
delimiters; tests/e2e/agent_hf.rs through recipes/agent-hf-laptop.miles) compare against these
files; CI never runs this script.

Regenerate (by hand, from the repository root; needs the package registry once). torch is NOT
needed: the weights are drawn with numpy and written with safetensors; when torch happens to be
installed, the directory is also loaded back with AutoModelForCausalLM (no missing or unexpected
tensor) and the reference logits are written.

    python3 -m venv /work/venv-chat
    /work/venv-chat/bin/pip install tokenizers transformers safetensors numpy jinja2
    /work/venv-chat/bin/python scripts/make-chat-fixture.py

What differs from tests/fixtures/hf/qwen3 (whose 500-token BPE is trained on the docs and whose
context is 128 positions, too short for a system turn with tools):

  tokenizer.json   byte-level BPE with the Qwen2 split (every digit its own token, so numbers are
                   char-level), trained on calculator conversations rendered by the template
                   below, so the template's boilerplate merges into few tokens; ChatML specials
                   <|endoftext|> (pad), <|im_start|>, <|im_end|> (eos, end of turn) and the
                   non-special added tokens <tool_call>, </tool_call>, <tool_response>,
                   </tool_response> (as Qwen2.5/Qwen3 ship them: decoding keeps them, so a tool
                   call survives skip_special_tokens)
  chat template    ChatML with tools in the Hermes/Qwen format, compact: the tools as JSON lines
                   inside <tools></tools> in the system turn, an assistant's tool calls as
                   <tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>, tool results as
                   <tool_response>\\n...\\n</tool_response> in a user turn; every assistant turn's
                   content and its <|im_end|> inside {% generation %} (transformers'
                   return_assistant_tokens_mask: what a trainer trains on)
  config.json      hidden 64, 2 layers, 4 heads (2 kv, head_dim 16), d_ff 192,
                   max_position_embeddings 512, untied, fp32, random init (normal 0.02; output
                   projections scaled by 1/sqrt(2 layers), norms 1: the init of miles' own decoder)

  reference/chat.json   [{name, messages, tools, add_generation_prompt, text, ids,
                          assistant_masks?}]: transformers' apply_chat_template; ids encode the
                          text without adding specials (the template writes them);
                          assistant_masks from return_assistant_tokens_mask
  reference/tools.json  the calculator's tools as the template is given them (key order kept)
  VERSIONS.json         the library versions that wrote the directory
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import tokenizers
import transformers
from safetensors.numpy import save_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "hf" / "qwen3-chat"
SEED = 4321

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB = 384

# Qwen2/Qwen2.5's split: GPT-2's, except that \p{N} takes ONE digit.
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\\n</tools>\\nCall a tool as <tool_call>\\n{"name": <name>, "arguments": <args>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}
            {%- if message.content %}
                {{- message.content }}
            {%- endif %}
            {%- if message.tool_calls %}
                {%- for tool_call in message.tool_calls %}
                    {%- if tool_call.function is defined %}
                        {%- set tool_call = tool_call.function %}
                    {%- endif %}
                    {%- if message.content or not loop.first %}
                        {{- '\\n' }}
                    {%- endif %}
                    {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' + (tool_call.arguments | tojson) + '}\\n</tool_call>' }}
                {%- endfor %}
            {%- endif %}
            {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# The calculator's one tool, as `Calculator::tools` (engine/runtime/src/env/calculator.rs) gives
# it; a Rust test checks the two agree.
CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Integer arithmetic: + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expr": {"type": "string"}},
            "required": ["expr"],
        },
    },
}


def call(expr):
    return {"type": "function", "function": {"name": "calc", "arguments": {"expr": expr}}}


def episode(a, b, by_heart=False, wrong=None):
    """A calculator episode as chat messages (the environment's texts: env/calculator.rs)."""
    q = f"{a}*{b}=?"
    if by_heart:
        return [{"role": "user", "content": q}, {"role": "assistant", "content": str(wrong or a * b)}]
    return [
        {"role": "user", "content": q},
        {"role": "assistant", "content": "", "tool_calls": [call(f"{a}*{b}")]},
        {"role": "tool", "content": f"<result>{a * b}</result>"},
        {"role": "assistant", "content": str(wrong or a * b)},
    ]


def corpus(render):
    """Rendered calculator conversations (fixed seed), and every character an observation may
    hold (env/calculator.rs `ALPHABET`), so the merges are the template's and the task's."""
    rng = np.random.default_rng(SEED)
    texts = []
    for i in range(400):
        a, b = (int(x) for x in rng.integers(10, 100, size=2))
        texts.append(render(episode(a, b, by_heart=i % 2 == 1), [CALC_TOOL]))
    texts.append("0123456789+-*/()=?<>abcdefghijklmnopqrstuvwxyz `:.,")
    texts.append("<error>unknown tool `sum`: the tool is calc</error><error>expression ends early</error>")
    return texts


def train_tokenizer(render):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        # The tool tags are learnt as whole tokens, not merged from their characters.
        special_tokens=SPECIALS + TOOL_TAGS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(render), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # As Qwen ships them, the tool tags are added but not special: skip_special_tokens keeps them.
    j = json.loads(tok.to_str())
    for t in j["added_tokens"]:
        if t["content"] in TOOL_TAGS:
            t["special"] = False
    return Tokenizer.from_str(json.dumps(j))


def render_jinja(messages, tools, add_generation_prompt=False):
    """The template rendered as transformers does (jinja2, trim/lstrip blocks, HF's tojson)
    before any tokenizer exists: only to build the training corpus."""
    import jinja2

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    src = CHAT_TEMPLATE.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
    return env.from_string(src).render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)


def weights(cfg):
    """Random init as miles' own decoder draws it (engine/tch/src/model/mod.rs `init`)."""
    rng = np.random.default_rng(SEED)
    H, I, V, L = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    hd, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    std, out_std = 0.02, 0.02 / np.sqrt(2 * L)

    def normal(shape, s=std):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    w = {"model.embed_tokens.weight": normal((V, H)), "model.norm.weight": np.ones(H, np.float32)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(H, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(H, np.float32)
        w[p + "self_attn.q_proj.weight"] = normal((nh * hd, H))
        w[p + "self_attn.k_proj.weight"] = normal((nkv * hd, H))
        w[p + "self_attn.v_proj.weight"] = normal((nkv * hd, H))
        w[p + "self_attn.o_proj.weight"] = normal((H, nh * hd), out_std)
        w[p + "self_attn.q_norm.weight"] = np.ones(hd, np.float32)
        w[p + "self_attn.k_norm.weight"] = np.ones(hd, np.float32)
        w[p + "mlp.gate_proj.weight"] = normal((I, H))
        w[p + "mlp.up_proj.weight"] = normal((I, H))
        w[p + "mlp.down_proj.weight"] = normal((H, I), out_std)
    w["lm_head.weight"] = normal((V, H))
    return w


def config(tok):
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "dtype": "float32",
        "eos_token_id": ids["<|im_end|>"],
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 192,
        "layer_types": ["full_attention", "full_attention"],
        "max_position_embeddings": 512,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "pad_token_id": ids["<|endoftext|>"],
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": transformers.__version__,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": tok.get_vocab_size(),
    }


def references(d: Path):
    """What transformers computes for the written directory: tokenizer ids agree with the
    tokenizer.json loaded alone, and the chat renderings with their assistant masks."""
    from transformers import AutoConfig, AutoTokenizer

    AutoConfig.from_pretrained(str(d))
    tk = AutoTokenizer.from_pretrained(str(d))
    own = Tokenizer.from_file(str(d / "tokenizer.json"))
    convs = [
        ("tool_prompt", episode(37, 59)[:1], [CALC_TOOL]),
        ("tool_episode", episode(37, 59), [CALC_TOOL]),
        ("by_heart_episode", episode(12, 34, by_heart=True, wrong=400), [CALC_TOOL]),
        ("no_tools", [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "6*7=?"}], None),
    ]
    out = []
    for name, msgs, tools in convs:
        for agp in (True, False):
            if agp and msgs[-1]["role"] == "assistant":
                continue
            text = tk.apply_chat_template(msgs, tools=tools, add_generation_prompt=agp, tokenize=False)
            assert text == render_jinja(msgs, tools, agp), f"{name}: jinja2 and transformers disagree"
            ids = tk(text, add_special_tokens=False)["input_ids"]
            assert own.encode(text, add_special_tokens=False).ids == ids, f"{name}: tokenizer.json disagrees"
            entry = {"name": name, "messages": msgs, "tools": tools, "add_generation_prompt": agp, "text": text, "ids": ids}
            if not agp:
                r = tk.apply_chat_template(
                    msgs, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
                )
                assert list(r["input_ids"]) == ids, f"{name}: apply_chat_template's ids differ"
                entry["assistant_masks"] = list(r["assistant_masks"])
            out.append(entry)
    (d / "reference").mkdir(exist_ok=True)
    (d / "reference" / "chat.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    # The tools as text (key order kept), which `Calculator::tools` must equal.
    (d / "reference" / "tools.json").write_text(json.dumps([CALC_TOOL], ensure_ascii=False) + "\n")


def check_with_torch(d: Path):
    """When torch is installed: transformers loads the weights with nothing missing or extra."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch not installed: the weights were not loaded back by transformers", file=sys.stderr)
        return None
    from transformers import AutoModelForCausalLM

    m, info = AutoModelForCausalLM.from_pretrained(str(d), output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"{d}: transformers loading info {bad}"
    return torch.__version__


def main():
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    tok = train_tokenizer(lambda m, t: render_jinja(m, t))
    tok.save(str(OUT / "tokenizer.json"))
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 512,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False) + "\n")
    cfg = config(tok)
    (OUT / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = {
        "bos_token_id": None,
        "eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
        "pad_token_id": tok.token_to_id("<|endoftext|>"),
        "transformers_version": transformers.__version__,
    }
    (OUT / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    save_file(weights(cfg), str(OUT / "model.safetensors"), metadata={"format": "pt"})
    references(OUT)
    versions = {
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
    }
    torch_version = check_with_torch(OUT)
    if torch_version:
        versions["torch"] = torch_version
    (OUT / "VERSIONS.json").write_text(json.dumps(versions, indent=2) + "\n")
    size = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    assert size < 2 << 20, f"{OUT} is {size} bytes"
    print(f"wrote {OUT} ({size} bytes, vocab {tok.get_vocab_size()})")


if __name__ == "__main__":
    main()
