#!/usr/bin/env python3
"""Writes tests/fixtures/trl-parity/: a fixed batch of GRPO samples for the qwen3 fixture model
(tests/fixtures/hf/qwen3) and what TRL's GRPOTrainer computes on exactly those samples, per loss
variant: the advantages, the per-token log-probs, the loss of each optimizer step and the grad norm.
engine/tch/tests/integration/trl_parity.rs reads it (without Python) and checks miles' trainer
against it; bench/peers/trl-parity.md is the result. CI never runs this script.

Regenerate (by hand, from the repository root, with the TRL peer's venv):

    bash bench/peers/trl/setup.sh
    bench/out/trl-venv/bin/python scripts/make-trl-parity-fixture.py

How TRL is driven: a real GRPOTrainer (TRL 1.16.0) with the fixture model, a reward function that
returns the fixture's rewards and TRL's `rollout_func` hook returning the fixture's prompt and
completion ids in place of generation. Advantages, old and reference log-probs come from TRL's
`_generate_and_score_completions`, each micro-batch's loss from TRL's `compute_loss`, the optimizer
from TRL's `create_optimizer`. Re-implemented (three lines of transformers' `Trainer` training loop,
because driving `train()` would shuffle the batch and split it where we cannot name the rows):
`loss.backward()` per micro-batch, `clip_grad_norm_(max_grad_norm)`, `optimizer.step()`; and the
split of the generation batch into micro-batches is in fixture order (TRL's `_prepare_inputs`
shuffles it first: only the row order changes, which no loss here depends on except through which
rows share a micro-batch, and miles is given the same rows together).
"""

import json
import os
import random
import sys
import tempfile

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "tests/fixtures/hf/qwen3")
OUT = os.path.join(ROOT, "tests/fixtures/trl-parity")

EOS = 2  # qwen3 fixture's config.json eos_token_id
MAX_COMPLETION = 12
G = 4  # completions per prompt
LR = 2e-3

# 4 prompts x 4 completions. Lengths: 12 without EOS = truncated at max_completion_length; shorter
# ones end with EOS. Group 1 is flat (every reward equal: advantage 0 under any estimator).
PROMPT_LENS = [5, 9, 3, 7]
COMPLETION_LENS = [[3, 12, 7, 12], [5, 9, 12, 2], [12, 4, 6, 10], [8, 12, 1, 5]]
REWARDS = [[1.0, 0.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5], [0.3, -0.5, 1.2, 0.0], [0.0, 0.0, 0.0, 1.0]]


def samples():
    rng = random.Random(43)
    out = []
    for g, plen in enumerate(PROMPT_LENS):
        prompt = [rng.randrange(3, 500) for _ in range(plen)]
        for k, clen in enumerate(COMPLETION_LENS[g]):
            truncated = clen == MAX_COMPLETION
            body = [rng.randrange(3, 500) for _ in range(clen if truncated else clen - 1)]
            completion = body if truncated else body + [EOS]
            out.append(
                {"group": g, "prompt": prompt, "completion": completion, "reward": REWARDS[g][k], "truncated": truncated}
            )
    return out


# Each variant: TRL's settings. `micro` = per_device_train_batch_size; the generation batch is the
# whole fixture (16 rows); `steps` = optimizer steps taken and recorded (num_iterations x
# steps_per_generation / gradient_accumulation_steps of them exist; 1 or 2 are recorded). GSPO's
# clip range is so narrow that the common learning rate would clip every sequence (no gradient in
# the second pass): it gets a smaller one, so some sequences stay inside the range.
VARIANTS = {
    "grpo": dict(loss_type="grpo", scale_rewards="group", micro=16, accum=1, steps=1),
    "dapo_clip_higher": dict(loss_type="dapo", epsilon_high=0.28, micro=16, accum=1, steps=1),
    "bnpo": dict(loss_type="bnpo", micro=8, accum=2, steps=1),
    "dr_grpo": dict(loss_type="dr_grpo", scale_rewards="none", micro=16, accum=1, steps=1),
    # num_iterations = 2: the second pass over the batch after one AdamW step (old log-probs from
    # the weights that generated it).
    "grpo_iter2": dict(loss_type="grpo", num_iterations=2, micro=16, accum=1, steps=2),
    "gspo_iter2": dict(
        loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4,
        num_iterations=2, micro=16, accum=1, steps=2, lr=1e-6,
    ),
    # KL to the reference (the initial model), k3. TRL 1.16's default `use_bias_correction_kl = True`
    # multiplies each token's KL by its (differentiable) importance ratio; miles adds the plain k3.
    # Both are recorded: without the correction the two must agree, with it they differ as predicted.
    "grpo_beta_iter2": dict(
        loss_type="grpo", beta=0.04, use_bias_correction_kl=False, num_iterations=2, micro=16, accum=1, steps=2,
    ),
    "grpo_beta_bias_corrected_iter2": dict(
        loss_type="grpo", beta=0.04, use_bias_correction_kl=True, num_iterations=2, micro=16, accum=1, steps=2,
    ),
    # Two optimizer steps per generation batch (steps_per_generation = 2): TRL's dapo normaliser
    # is the generation batch's tokens / 2 in each step, miles' the step's own tokens.
    "dapo_two_steps": dict(loss_type="dapo", micro=8, accum=1, steps_per_generation=2, steps=2),
}


def config(name, v, tmp):
    kw = dict(
        output_dir=os.path.join(tmp, name),
        per_device_train_batch_size=v["micro"],
        gradient_accumulation_steps=v["accum"],
        num_generations=G,
        max_completion_length=MAX_COMPLETION,
        temperature=1.0,
        learning_rate=v.get("lr", LR),
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        loss_type=v["loss_type"],
        scale_rewards=v.get("scale_rewards", "group"),
        epsilon=v.get("epsilon", 0.2),
        epsilon_high=v.get("epsilon_high"),
        importance_sampling_level=v.get("importance_sampling_level", "token"),
        num_iterations=v.get("num_iterations", 1),
        beta=v.get("beta", 0.0),
        use_bias_correction_kl=v.get("use_bias_correction_kl", True),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    if "steps_per_generation" in v:
        kw["steps_per_generation"] = v["steps_per_generation"]
    return GRPOConfig(**kw)


def rows(out, lo, hi):
    """Rows lo..hi of the generation batch, as TRL's `split_tensor_dict` cuts it."""
    return {k: (t[lo:hi] if torch.is_tensor(t) and t.dim() > 0 else t) for k, t in out.items()}


def trimmed(x, mask):
    return [[float(v) for v, m in zip(r, mr) if m] for r, mr in zip(x.tolist(), mask.tolist())]


def run_variant(name, v, data, tmp):
    torch.manual_seed(0)
    ds = Dataset.from_dict({"prompt": [f"p{s['group']}" for s in data], "idx": list(range(len(data)))})

    def reward(prompts, completions, completion_ids, idx, **_):
        return [data[i]["reward"] for i in idx]

    def rollout(prompts, trainer):
        assert prompts == [f"p{s['group']}" for s in data], "rollout_func got the batch in another order"
        return {"prompt_ids": [s["prompt"] for s in data], "completion_ids": [s["completion"] for s in data],
                "logprobs": None}

    args = config(name, v, tmp)
    trainer = GRPOTrainer(model=MODEL, reward_funcs=reward, args=args, train_dataset=ds, rollout_func=rollout)
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    inputs = [{"prompt": f"p{s['group']}", "idx": i} for i, s in enumerate(data)]
    out = trainer._generate_and_score_completions(inputs)
    mask = out["completion_mask"]
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)
    att = torch.cat([out["prompt_mask"], mask], 1)
    with torch.no_grad():
        logps0, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, att, out["completion_ids"].size(1))
    trainer.create_optimizer()
    opt = trainer.optimizer
    micro, accum = v["micro"], v["accum"]
    per_step = micro * accum
    n = len(data)
    steps = []
    for s in range(v["steps"]):
        lo = (s * per_step) % n  # num_iterations: the next pass starts again at row 0
        opt.zero_grad()
        step = {"rows": [lo, lo + per_step]}
        if s > 0:
            # The weights this step starts from (after the earlier steps' updates): its log-probs,
            # so a step's loss can be recomputed from them.
            with torch.no_grad():
                lp, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, att, out["completion_ids"].size(1))
            step["logps"] = trimmed(lp, mask)
        loss_sum = 0.0
        for a in range(accum):
            part = rows(out, lo + a * micro, lo + (a + 1) * micro)
            loss = trainer.compute_loss(model, part)
            loss.backward()
            loss_sum += float(loss.detach())
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm))
        opt.step()
        steps.append({**step, "loss": loss_sum, "grad_norm": norm})
    rec = {
        "trl": {
            "loss_type": args.loss_type,
            "scale_rewards": args.scale_rewards,
            "epsilon": args.epsilon,
            "epsilon_high": args.epsilon_high,
            "importance_sampling_level": args.importance_sampling_level,
            "num_iterations": args.num_iterations,
            "learning_rate": args.learning_rate,
            "beta": args.beta,
            "use_bias_correction_kl": args.use_bias_correction_kl,
            "per_device_train_batch_size": micro,
            "gradient_accumulation_steps": accum,
            "steps_per_generation": args.steps_per_generation,
            "mask_truncated_completions": args.mask_truncated_completions,
            "optim": str(args.optim),
            "optimizer": type(opt).__name__,
        },
        "advantages": [float(a) for a in out["advantages"].tolist()],
        "logps": trimmed(logps0, mask),
        "steps": steps,
    }
    if "old_per_token_logps" in out:
        rec["old_logps"] = trimmed(out["old_per_token_logps"], mask)
    if "ref_per_token_logps" in out:
        rec["ref_logps"] = trimmed(out["ref_per_token_logps"], mask)
    return rec


def main():
    data = samples()
    fixture = {
        "about": "TRL GRPOTrainer's advantages and losses on fixed samples; see scripts/make-trl-parity-fixture.py",
        "model": "tests/fixtures/hf/qwen3",
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                     "python": sys.version.split()[0]},
        "settings": {
            "num_generations": G, "max_completion_length": MAX_COMPLETION, "temperature": 1.0,
            "learning_rate": LR, "lr_scheduler_type": "constant", "weight_decay": 0.0, "adam_beta1": 0.9,
            "adam_beta2": 0.999, "adam_epsilon": 1e-8, "max_grad_norm": 1.0, "dtype": "float32",
            "std_epsilon": 1e-4,
        },
        "samples": data,
        "variants": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, v in VARIANTS.items():
            fixture["variants"][name] = run_variant(name, v, data, tmp)
            st = fixture["variants"][name]["steps"]
            print(name, " ".join(f"loss={s['loss']:.9g} norm={s['grad_norm']:.6g}" for s in st))
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "fixture.json")
    tmp_path = path + ".tmp"
    with open(tmp_path, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    os.replace(tmp_path, path)
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
