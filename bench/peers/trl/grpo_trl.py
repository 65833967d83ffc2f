"""The TRL side of the comparison: the GRPO run of recipes/compare-trl*.miles in TRL's GRPOTrainer.

Reads the run spec miles executes (`miles run --print-spec`) and the exact problems miles draws
for it (bench/peers/tools export-prompts), so both sides train on the same prompts in the same
order with the same group size, batch, completion length, learning rate, Adam settings, clip range
and thread count. CPU only, offline (HF_HUB_OFFLINE=1): the model and the tokenizer are built here.

  - model: GPT-2 (transformers' GPT2LMHeadModel) sized from the spec's `model` (gpt2_config):
    n_layer = n_layers, n_embd = d_model, n_head = n_heads, n_positions = max_len, vocab_size,
    init std; GPT-2's own 4x MLP (n_inner = 4 d_model), which matches a SwiGLU of
    d_ff = 8/3 d_model in parameters (recipes/compare-trl*.miles choose d_ff so); tied
    embeddings, no dropout. Its parameter count and config go to summary.json, next to miles'
    (bench/peers/run.py checks the counts are within 5%). GPT-2 has no grouped-query attention,
    so a spec with n_kv_heads != n_heads is refused.
    With --init DIR instead: the Hugging Face Llama directory miles' recipe loads too
    (recipes/compare-trl-hf.miles, written by trl/make_same_model.py): LlamaForCausalLM and the
    directory's tokenizer (miles' character tokenizer as Hugging Face files), so both sides start
    from the same weights and token ids.
  - held-out evaluation: greedy answers to the spec's first `eval.prompts` test problems, scored
    as miles' eval (exact match ending in [EOS]), after the warm-up and after GRPO, timed apart
    from the steps (as miles' eval is reported apart).
  - tokenizer: miles' character tokenizer ([PAD]=0, [BOS]=1, [EOS]=2, then the task's characters
    in sorted order), as a PreTrainedTokenizerFast that prepends [BOS] like miles' encode_prompt.
  - warm-up: the same supervised steps as miles' `sft` stage on the same problems (a plain PyTorch
    loop: TRL's GRPOTrainer has no warm-up), timed apart from GRPO.
  - reward: exact match of the answer, which must end with [EOS] (miles' verifier).

Writes OUT/metrics.jsonl with miles' metric names (rollout/reward_mean, perf/step_s, perf/gen_s,
perf/train_s, perf/gen_tokens, perf/trained_tokens) so bench/peers/run.py reads both sides alike.

Usage: python grpo_trl.py --spec SPEC.json --prompts PROMPTS.json --out DIR [--seed N] [--threads N]
       [--init HF_DIR] [--steps N] [--no-sft] [--save-sft DIR] [--eval-every N]
"""

import argparse
import json
import os
import shutil
import sys
import time

T_START = time.perf_counter()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No accelerator: TRL would otherwise look for one.
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    TrainerCallback,
    set_seed,
)
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

T_IMPORTED = time.perf_counter()
PAD, BOS, EOS = 0, 1, 2


def build_tokenizer(chars):
    vocab = {"[PAD]": PAD, "[BOS]": BOS, "[EOS]": EOS}
    for i, c in enumerate(chars):
        vocab[c] = i + 3
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[PAD]"))
    # One token per character, as miles' CharTokenizer.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", BOS)])
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]", padding_side="left"
    )
    return fast


def load_init(dir_, chars):
    """The shared Hugging Face checkpoint and its tokenizer. The tokenizer must give this
    script's ids (miles' CharTokenizer numbering) for every character of the task, BOS in front:
    decode_answer and the SFT/eval encodings below rely on them."""
    model = LlamaForCausalLM.from_pretrained(dir_, dtype=torch.float32)
    tok = PreTrainedTokenizerFast.from_pretrained(dir_, padding_side="left")
    want = [BOS] + [i + 3 for i in range(len(chars))]
    got = tok("".join(chars))["input_ids"]
    if got != want or (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) != (BOS, EOS, PAD):
        sys.exit(f"{dir_}: its tokenizer is not miles' character tokenizer for {''.join(chars)!r}: {got} "
                 f"(want {want}), specials {tok.bos_token_id}/{tok.eos_token_id}/{tok.pad_token_id}")
    return model, tok


def decode_answer(ids, chars):
    """miles' CharTokenizer::decode: characters up to the first EOS, specials dropped."""
    out = []
    for t in ids:
        if t == EOS:
            break
        if t >= 3 and t - 3 < len(chars):
            out.append(chars[t - 3])
    return "".join(out)


def sft_warmup(model, spec, batches, chars):
    """miles' run_sft: masked cross-entropy of answer+EOS given BOS+prompt, AdamW with the train
    spec's betas/eps/decay, global-norm clip, fresh optimizer afterwards (GRPOTrainer makes its own).
    Returns miles' SFT metric rows (loss and pre-clip grad norm every 10 steps and at the end), so
    the two sides' warm-ups can be compared step by step."""
    sft, tr = spec["sft"], spec["train"]
    cid = {c: i + 3 for i, c in enumerate(chars)}
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=sft["lr"],
        betas=(tr["beta1"], tr["beta2"]),
        eps=tr["eps"],
        weight_decay=tr["weight_decay"],
    )
    model.train()
    warm = sft.get("warmup_steps", 0)
    rows = []
    for k, batch in enumerate(batches):
        lr = sft["lr"] * (k + 1) / warm if warm and k < warm else sft["lr"]
        for g in opt.param_groups:
            g["lr"] = lr
        seqs, masks = [], []
        for it in batch:
            p = [BOS] + [cid[c] for c in it["prompt"]]
            a = [cid[c] for c in it["label"]] + [EOS]
            seqs.append(p + a)
            masks.append([0] * len(p) + [1] * len(a))
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [PAD] * (width - len(s)) for s in seqs])
        att = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        m = torch.tensor([mm + [0] * (width - len(mm)) for mm in masks], dtype=torch.float32)
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        tgt = m[:, 1:]
        loss = -(logp * tgt).sum() / tgt.sum().clamp_min(1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if tr["grad_clip"] > 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tr["grad_clip"])
        else:
            grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack(grads))
        opt.step()
        if (k + 1) % 10 == 0 or k + 1 == len(batches):
            rows.append({"step": 0, "sft/step": k + 1, "sft/loss": loss.item(), "sft/grad_norm": float(norm)})
    del opt
    return rows


def gpt2_config(m):
    """The GPT-2 of a miles model spec: same depth, width, heads, context and vocabulary. The MLP
    is GPT-2's 4 x d_model; miles' SwiGLU has three d_model x d_ff matrices against GPT-2's two,
    so the two match in parameters at d_ff = 8/3 d_model (0.1M: 176 ~ 170.7 at d 64; 10M: 1024 at
    d 384); run.py compares the totals."""
    return dict(
        vocab_size=m["vocab_size"],
        n_positions=m["max_len"],
        n_embd=m["d_model"],
        n_layer=m["n_layers"],
        n_head=m["n_heads"],
        n_inner=4 * m["d_model"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        initializer_range=m.get("init_std", 0.02),
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )


@torch.no_grad()
def evaluate(model, items, max_new, chars):
    """miles' held-out eval: greedy responses of up to max_new tokens to each prompt ([BOS] +
    prompt), exact match of the answer ending in [EOS]. Returns (accuracy, mean response tokens)."""
    cid = {c: i + 3 for i, c in enumerate(chars)}
    was_training = model.training
    model.eval()
    seqs = [[BOS] + [cid[c] for c in it["prompt"]] for it in items]
    width = max(len(q) for q in seqs)
    ids = torch.tensor([[PAD] * (width - len(q)) + q for q in seqs])  # left-padded, as TRL does
    att = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in seqs])
    out = model.generate(
        input_ids=ids, attention_mask=att, max_new_tokens=max_new, do_sample=False,
        eos_token_id=EOS, pad_token_id=PAD,
    )[:, width:].tolist()
    ok, toks = 0, 0
    for resp, it in zip(out, items):
        resp = resp[: resp.index(EOS) + 1] if EOS in resp else resp
        toks += len(resp)
        ok += int(EOS in resp and decode_answer(resp, chars) == it["label"])
    model.train(was_training)
    return ok / max(len(items), 1), toks / max(len(items), 1)


class StepLog(TrainerCallback):
    """Per-step wall time (from one step's end to the next: everything the loop does), with the
    rollout-phase timings and token counts the wrapped trainer methods recorded. With `every` > 0,
    also the held-out accuracy every `every` steps (as miles' `eval { every }`), timed apart: the
    next step's clock starts after it."""

    def __init__(self, path, probe, every=0, evaluate_now=None):
        self.f = open(path, "a")
        self.probe = probe
        self.last = None
        self.every = every
        self.evaluate_now = evaluate_now

    def on_train_begin(self, args, state, control, **kw):
        self.last = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        now = time.perf_counter()
        p = self.probe
        step_s = now - self.last
        self.last = now
        row = {
            "step": state.global_step,
            "rollout/reward_mean": p.pop("reward_mean", None),
            "perf/step_s": step_s,
            "perf/gen_s": p.pop("gen_s", 0.0),
            "perf/rollout_s": p.get("rollout_s", 0.0),
            # Everything after the rollout phase: loss forward, backward, optimizer, Trainer loop.
            "perf/train_s": step_s - p.pop("rollout_s", 0.0),
            "perf/gen_tokens": p.pop("gen_tokens", 0),
            "perf/trained_tokens": p.pop("trained_tokens", 0),
        }
        if self.every and state.global_step % self.every == 0:
            t = time.perf_counter()
            acc, resp_len = self.evaluate_now()
            row.update({"eval/accuracy": acc, "eval/response_len": resp_len, "perf/eval_s": time.perf_counter() - t})
            self.last = time.perf_counter()
        self.f.write(json.dumps(row) + "\n")
        self.f.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=None, help="default: the spec's seed")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=None, help="default: the spec's steps")
    ap.add_argument("--init", default=None, help="a Hugging Face Llama directory to start from (instead of a GPT-2 "
                    "built from the spec's sizes): trl/make_same_model.py's, the one the miles recipe loads")
    ap.add_argument("--no-sft", action="store_true", help="skip the spec's SFT warm-up (an --init that is warmed up "
                    "already, e.g. the model/ of a miles run; for bisecting the SFT from GRPO)")
    ap.add_argument("--eval-every", type=int, default=0, help="held-out accuracy every N GRPO steps too (default: "
                    "at the start and the end only)")
    ap.add_argument("--save-sft", default=None, help="write the model after the SFT warm-up here (Hugging Face "
                    "directory with the --init tokenizer; a miles recipe can start from it)")
    a = ap.parse_args()

    spec = json.load(open(a.spec))
    data = json.load(open(a.prompts))
    seed = spec["seed"] if a.seed is None else a.seed
    steps = spec["steps"] if a.steps is None else a.steps
    m, ro, tr = spec["model"], spec["rollout"], spec["train"]
    # What this script mirrors; anything else in the spec would silently differ, so refuse it.
    group = ro["rollout_batch"] * ro["samples_per_prompt"]
    unsupported = {
        "one optimizer step per RL step (rollout_batch x samples_per_prompt == global_batch)": group
        == tr["global_batch"],
        "no TIS (TRL corrects only vLLM rollouts)": tr.get("tis_cap") is None,
        "no entropy bonus": tr.get("entropy_coef", 0.0) == 0.0,
        "token aggregation (TRL's dapo)": tr.get("aggregation", "token") == "token",
        "constant learning rate, no warm-up": tr.get("decay", "none") == "none" and tr.get("warmup_steps", 0) == 0,
        "multi-head attention (GPT-2 has no grouped-query attention: n_kv_heads == n_heads)": a.init is not None
        or m.get("n_kv_heads", m["n_heads"]) == m["n_heads"],
        "d_model a multiple of heads": a.init is not None or m["d_model"] % m["n_heads"] == 0,
        "a dense model (no experts)": a.init is not None or not m.get("experts"),
        # TRL generates with its training model: one precision for both (bf16: autocast, bf16=True).
        "the engine's precision equal to the trainer's": ro.get("precision", "fp32") == tr.get("precision", "fp32"),
    }
    bad = [k for k, ok in unsupported.items() if not ok]
    if bad:
        sys.exit("grpo_trl.py mirrors only: " + "; ".join(bad))

    bf16 = tr.get("precision", "fp32") == "bf16"
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(a.threads)
    set_seed(seed)
    chars = data["tokenizer"]["chars"]
    if a.init:
        model, tok = load_init(a.init, chars)
        cfg = None
    else:
        tok = build_tokenizer(chars)
        cfg = GPT2Config(**gpt2_config(m))
        model = GPT2LMHeadModel(cfg)
    n_params = sum(p.numel() for p in model.parameters())  # a tied lm_head counted once

    t0 = time.perf_counter()
    if a.save_sft and not a.init:
        sys.exit("--save-sft needs --init (the directory's tokenizer goes with the weights)")
    sft_rows = []
    if spec.get("sft") and not a.no_sft:
        # miles' trainer runs its SFT warm-up in its own precision too.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            sft_rows = sft_warmup(model, spec, data["sft"], chars)
    sft_s = time.perf_counter() - t0
    if a.save_sft:
        tmp = a.save_sft.rstrip("/") + ".tmp"
        model.save_pretrained(tmp, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):  # the --init files, byte for byte
            shutil.copy(os.path.join(a.init, f), tmp)
        shutil.rmtree(a.save_sft, ignore_errors=True)
        os.rename(tmp, a.save_sft)  # whole or absent: miles reads it as a model directory
    test = data["test"][: max(1, spec.get("eval", {}).get("prompts", 200))]
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # miles evaluates on its engine
        eval_start = evaluate(model, test, ro["max_new_tokens"], chars)
    eval_s = time.perf_counter() - t0

    rows = [it for step in data["rollout"][:steps] for it in step]
    ds = Dataset.from_list(rows)
    probe = {}

    def exact_match(prompts, completions, completion_ids, label, **kw):
        r = [1.0 if (EOS in ids and decode_answer(ids, chars) == lab) else 0.0 for ids, lab in zip(completion_ids, label)]
        probe["reward_mean"] = sum(r) / max(len(r), 1)
        if len(probe.setdefault("first_prompts", [])) < 2:
            # What TRL fed the model, to check it is miles' step order (run.py compares).
            probe["first_prompts"].append(list(dict.fromkeys(prompts)))
        return r

    args = GRPOConfig(
        output_dir=os.path.join(a.out, "trainer"),
        per_device_train_batch_size=tr["micro_batch"],
        gradient_accumulation_steps=tr["global_batch"] // tr["micro_batch"],
        num_generations=ro["samples_per_prompt"],
        max_completion_length=ro["max_new_tokens"],
        temperature=ro["temperature"],
        top_p=ro["top_p"],
        top_k=ro["top_k"],
        learning_rate=tr["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=tr["beta1"],
        adam_beta2=tr["beta2"],
        adam_epsilon=tr["eps"],
        weight_decay=tr["weight_decay"],
        max_grad_norm=tr["grad_clip"],
        beta=tr["kl_coef"],
        epsilon=tr["clip_low"],
        epsilon_high=tr["clip_high"],
        loss_type="dapo",
        scale_rewards="group" if tr["std_norm"] else "none",
        num_iterations=1,
        max_steps=steps,
        shuffle_dataset=False,
        seed=seed,
        data_seed=seed,
        use_cpu=True,
        bf16=bf16,
        fp16=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[exact_match], args=args, train_dataset=ds, processing_class=tok)

    # Phase timings: generation (HF generate) and the whole rollout phase (tokenize, generate,
    # reward, advantages), wrapped around TRL's own methods without changing what they do.
    gen_single = trainer._generate_single_turn

    def timed_gen(*x, **k):
        t = time.perf_counter()
        out = gen_single(*x, **k)
        probe["gen_s"] = probe.get("gen_s", 0.0) + time.perf_counter() - t
        probe["gen_tokens"] = probe.get("gen_tokens", 0) + sum(len(c) for c in out[0])
        return out

    trainer._generate_single_turn = timed_gen
    gen_score = trainer._generate_and_score_completions

    def timed_rollout(*x, **k):
        t = time.perf_counter()
        out = gen_score(*x, **k)
        probe["rollout_s"] = probe.get("rollout_s", 0.0) + time.perf_counter() - t
        probe["trained_tokens"] = probe.get("trained_tokens", 0) + int(
            out["prompt_mask"].sum().item() + out["completion_mask"].sum().item()
        )
        return out

    trainer._generate_and_score_completions = timed_rollout
    metrics_path = os.path.join(a.out, "metrics.jsonl")
    with open(metrics_path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in sft_rows)
    def evaluate_now():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return evaluate(trainer.model, test, ro["max_new_tokens"], chars)

    trainer.add_callback(StepLog(metrics_path, probe, a.eval_every, evaluate_now))
    t1 = time.perf_counter()
    trainer.train()
    grpo_s = time.perf_counter() - t1
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        eval_end = evaluate(trainer.model, test, ro["max_new_tokens"], chars)
    eval_s += time.perf_counter() - t0
    summary = {
        "framework": "trl",
        "params": n_params,
        "gpt2": cfg
        and {k: cfg.to_dict()[k] for k in ("n_layer", "n_embd", "n_head", "n_inner", "n_positions", "vocab_size")},
        "init": a.init,
        "llama": a.init
        and {k: model.config.to_dict()[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                                     "intermediate_size", "max_position_embeddings", "vocab_size")},
        "eval_start": eval_start[0],
        "eval_end": eval_end[0],
        "eval_prompts": len(test),
        "eval_s": eval_s,
        "seed": seed,
        "threads": a.threads,
        "steps": steps,
        "import_s": T_IMPORTED - T_START,
        "sft_s": sft_s,
        "grpo_s": grpo_s,
        "wall_s": time.perf_counter() - T_START,
        "first_prompts": probe.get("first_prompts", []),
        "versions": {
            "trl": __import__("trl").__version__,
            "transformers": __import__("transformers").__version__,
            "torch": torch.__version__,
        },
    }
    json.dump(summary, open(os.path.join(a.out, "summary.json"), "w"), indent=1)
    print(f"trl: {n_params} parameters; SFT {sft_s:.1f} s; GRPO {steps} steps {grpo_s:.1f} s; held-out accuracy "
          f"{eval_start[0]:.3f} -> {eval_end[0]:.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
