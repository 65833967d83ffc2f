#!/usr/bin/env python3
"""Runs the GRPO comparison (miles vs TRL) and writes bench/peers/RESULTS-table.md.

Both sides run one recipe (--recipe; default recipes/compare-trl.miles, the 0.1M model;
recipes/compare-trl-10m.miles is the ~10M one): miles with `miles run`, TRL with trl/grpo_trl.py
on the run spec miles prints (model sizes included) and the prompts miles draws
(tools/export-prompts). Each recipe writes its own table and outputs: compare-trl.miles
bench/peers/RESULTS-table.md and bench/out/peers/, compare-trl-NAME.miles
bench/peers/RESULTS-table-NAME.md and bench/out/peers-NAME/. They alternate, seed by
seed (the first side alternates too), so slow spells of this shared machine hit both. Peak memory
is each process's max RSS (wait4). The machine's matmul peak (tools/peak-flops) is measured at the
start and the end of the same run; the profile of our step comes from the per-phase timings in
miles' metrics.jsonl and a FLOP count of the model (below).

A recipe whose policy is a Hugging Face directory (`model policy = hf { path = "DIR" }`, as
recipes/compare-trl-hf.miles) is the same-model comparison: both sides start from that checkpoint
(TRL: grpo_trl.py --init DIR). When DIR is missing (or with --remake-init) it is written first by
trl/make_same_model.py: a random LlamaForCausalLM sized as --init-recipe's model, init seed
--init-seed, with the task's character tokenizer.

Called by bench/peers/run.sh (which builds and installs what this needs); standard library only.
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def timed(cmd, log):
    """Runs cmd; returns (wall seconds, max RSS in MiB, exit code). RSS from wait4 (Linux: KiB)."""
    t = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, ru = os.wait4(p.pid, 0)
    return time.perf_counter() - t, ru.ru_maxrss / 1024.0, os.waitstatus_to_exitcode(status)


def read_steps(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return [r for r in rows if r.get("step", 0) >= 1 and "rollout/reward_mean" in r]


def smooth(xs, w):
    return [statistics.fmean(xs[max(0, i - w + 1) : i + 1]) for i in range(len(xs))]


def first_reach(rows, step_s, sm, threshold, window):
    """(GRPO seconds, step) when the `window`-step mean reward first reaches `threshold`."""
    cum = 0.0
    for i, (r, s, x) in enumerate(zip(rows, step_s, sm)):
        cum += s
        if i + 1 >= window and x >= threshold:
            return cum, r["step"]
    return None, None


def curve(rows, bucket):
    """Mean rollout reward per `bucket` steps (steps 1..bucket, bucket+1..2 bucket, ...)."""
    rew = [r["rollout/reward_mean"] for r in rows]
    return [statistics.fmean(rew[i : i + bucket]) for i in range(0, len(rew), bucket)]


def hf_init_path(recipe):
    """The directory of a recipe's `hf { path = "..." }` policy, or None (its own transformer).
    Read from the text because `miles run --print-spec` needs the directory to exist already."""
    m = re.search(r'model\s+\w+\s*=\s*hf\s*\{[^}]*?path\s*=\s*"([^"]+)"', open(os.path.join(ROOT, recipe)).read())
    return m.group(1) if m else None


def make_init(a, tools, init_dir):
    """trl/make_same_model.py on the sizes of --init-recipe's model (its spec) and the task's
    characters (export-prompts of that spec)."""
    base = os.path.join(a.out, "init")
    os.makedirs(base, exist_ok=True)
    spec_path = os.path.join(base, "spec.json")
    open(spec_path, "w").write(sh([a.miles, "run", a.init_recipe, "--steps", "1", "--print-spec"], cwd=ROOT))
    prompts_path = os.path.join(base, "prompts.json")
    sh([os.path.join(tools, "export-prompts"), spec_path, prompts_path])
    out = subprocess.run([a.python, os.path.join(ROOT, "bench/peers/trl/make_same_model.py"), "--spec", spec_path,
                          "--prompts", prompts_path, "--out", os.path.join(ROOT, init_dir), "--seed",
                          str(a.init_seed)], capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"make_same_model.py failed:\n{out.stdout}{out.stderr}")
    print(out.stderr.strip(), file=sys.stderr)


def summarise(rows, threshold, window, gain):
    # A step is generate-score-train-sync: miles' last step also runs the held-out evaluation
    # (perf/eval_s), which TRL's steps never include, so it is taken out (both sides report it
    # apart).
    step_s = [r["perf/step_s"] - r.get("perf/eval_s", 0.0) for r in rows]
    rew = [r["rollout/reward_mean"] for r in rows]
    sm = smooth(rew, window)
    t_hit, s_hit = first_reach(rows, step_s, sm, threshold, window)
    # The SFT warm-up sets where GRPO starts, differently for the two models and seeds; the gain
    # over the run's own first `window` steps measures what GRPO itself achieved, and how fast.
    start = statistics.fmean(rew[:window])
    g_hit, gs_hit = first_reach(rows, step_s, sm, start + gain, window)
    tot = lambda k: sum(r.get(k, 0.0) for r in rows)  # noqa: E731
    return {
        "steps": len(rows),
        "step_s": statistics.median(step_s),
        "gen_tok_s": tot("perf/gen_tokens") / tot("perf/gen_s"),
        "train_tok_s": tot("perf/trained_tokens") / tot("perf/train_s"),
        "e2e_tok_s": tot("perf/trained_tokens") / sum(step_s),
        "gen_ms": 1e3 * tot("perf/gen_s") / len(rows),
        "train_ms": 1e3 * tot("perf/train_s") / len(rows),
        "rest_ms": 1e3 * (sum(step_s) - tot("perf/gen_s") - tot("perf/train_s")) / len(rows),
        "trained_tokens": tot("perf/trained_tokens") / len(rows),
        "reward_step1": rew[0],
        "reward_start": statistics.fmean(rew[:window]),
        "reward_end": statistics.fmean(rew[-window:]),
        "time_to_threshold_s": t_hit,
        "steps_to_threshold": s_hit,
        "time_to_gain_s": g_hit,
        "steps_to_gain": gs_hit,
        "grpo_s": sum(step_s),
    }


# ---- FLOPs of one step (matmul FLOPs of real tokens; pads and elementwise work not counted) ----


def fwd_flops_per_token(m, kind, ctx):
    """2 x (matmul weights touched per token) + attention scores and mixing over `ctx` keys.
    kind "gpt2": m may carry "n_inner" (the TRL side's MLP width; default GPT-2's 4 d)."""
    d, L, V = m["d_model"], m["n_layers"], m["vocab_size"]
    if kind == "miles":
        kv = d // m["n_heads"] * m["n_kv_heads"]
        per_layer = d * d * 2 + d * kv * 2 + 3 * d * m["d_ff"]  # q, o, k, v, gate/up/down
    else:  # GPT-2: c_attn (3d), c_proj, the MLP's two matrices
        per_layer = 4 * d * d + 2 * d * m.get("n_inner", 4 * d)
    return 2 * (L * per_layer + V * d) + L * 4 * d * ctx


def step_flops(m, kind, prompt_lens, resp_lens, group):
    """(generation, one forward over the trained tokens) FLOPs of a step's batch."""
    gen = 0.0
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        if i % group == 0:  # the group's prompt is prefilled once
            gen += sum(fwd_flops_per_token(m, kind, j + 1) for j in range(p))
        gen += sum(fwd_flops_per_token(m, kind, p + j + 1) for j in range(r))
    fwd = sum(fwd_flops_per_token(m, kind, j + 1) for p, r in zip(prompt_lens, resp_lens) for j in range(p + r))
    return gen, fwd


def miles_profile(rows, spec, peak_gflops):
    """Mean seconds per step by phase and achieved GFLOP/s. Prompt/response lengths are not in the
    metrics per sample, so the FLOP count uses the step's token totals at mean lengths."""
    m = spec["model"]
    ro = spec["rollout"]
    n = ro["rollout_batch"] * ro["samples_per_prompt"]
    ph = {k: statistics.fmean(r.get(f"perf/{k}", 0.0) for r in rows) for k in
          ["step_s", "gen_s", "reward_s", "train_s", "logprob_s", "forward_s", "backward_s", "optimizer_s", "sync_s"]}
    ph["eval_s"] = sum(r.get("perf/eval_s", 0.0) for r in rows) / len(rows)
    gen_tok = statistics.fmean(r["perf/gen_tokens"] for r in rows)
    trained = statistics.fmean(r["perf/trained_tokens"] for r in rows)
    resp = gen_tok / n
    prompt = (trained - gen_tok) / n
    pl = [round(prompt)] * n
    rl = [round(resp)] * n
    gen_f, fwd_f = step_flops(m, "miles", pl, rl, ro["samples_per_prompt"])
    # The separate "old" log-prob pass is skipped on-policy (one optimizer step per rollout batch):
    # its FLOPs count only when it ran.
    lp_f = fwd_f if ph["logprob_s"] > 0.02 * ph["forward_s"] else 0.0
    flops = {
        "gen_s": gen_f,
        "logprob_s": lp_f,
        "forward_s": fwd_f,
        "backward_s": 2 * fwd_f,
    }
    total = gen_f + lp_f + fwd_f * 3
    out = {"phases": ph, "flops": flops, "step_flops": total, "prompt_len": prompt, "resp_len": resp}
    out["achieved_gflops"] = total / ph["step_s"] / 1e9
    out["mfu"] = out["achieved_gflops"] / peak_gflops
    out["phase_gflops"] = {k: flops[k] / ph[k] / 1e9 for k in flops if ph.get(k, 0) > 0 and flops[k] > 0}
    return out


def mean_std(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None, 0
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0), len(xs)


def fmt(xs, digits=3, unit=""):
    mu, sd, k = mean_std(xs)
    if mu is None:
        return "not reached"
    s = f"{mu:.{digits}f} ± {sd:.{digits}f}{unit}"
    if k < len(xs):
        s += f" ({k}/{len(xs)} seeds reached it)"
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--miles", required=True, help="release miles binary")
    ap.add_argument("--tools", required=True, help="directory of export-prompts and peak-flops")
    ap.add_argument("--python", default=os.path.join(ROOT, "bench/out/trl-venv/bin/python"))
    ap.add_argument("--recipe", default="recipes/compare-trl.miles")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=None, help="default: the recipe's stop")
    ap.add_argument("--threshold", type=float, default=0.4, help="mean reward (over --window steps) to reach")
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--gain", type=float, default=0.05, help="reward gain over the first --window steps to reach")
    ap.add_argument("--out", default=None, help="default: bench/out/peers[-NAME] (NAME: see --table)")
    ap.add_argument("--table", default=None, help="default: bench/peers/RESULTS-table.md for recipes/compare-trl.miles, "
                    "bench/peers/RESULTS-table-NAME.md for recipes/compare-trl-NAME.miles (or any recipe's stem)")
    ap.add_argument("--title", default=None, help="the table's heading (default: by the model size)")
    ap.add_argument("--label", default=None, help="what miles was built from (default: git rev of this tree)")
    ap.add_argument("--init-recipe", default="recipes/compare-trl.miles",
                    help="an hf recipe's missing checkpoint is made with this recipe's model sizes")
    ap.add_argument("--init-seed", type=int, default=0, help="the seed of that checkpoint's random init")
    ap.add_argument("--remake-init", action="store_true", help="rewrite an hf recipe's checkpoint even if present")
    ap.add_argument("--bucket", type=int, default=20, help="steps per point of the reward-curve table")
    a = ap.parse_args()
    suffix = recipe_suffix(a.recipe)
    if a.out is None:
        a.out = os.path.join(ROOT, "bench/out", "peers" + (f"-{suffix}" if suffix else ""))
    if a.table is None:
        a.table = os.path.join(ROOT, "bench/peers", "RESULTS-table" + (f"-{suffix}" if suffix else "") + ".md")

    os.makedirs(a.out, exist_ok=True)
    init_dir = hf_init_path(a.recipe)
    if init_dir and (a.remake_init or not os.path.exists(os.path.join(ROOT, init_dir, "config.json"))):
        make_init(a, a.tools, init_dir)
    spec0 = json.loads(sh([a.miles, "run", a.recipe, "--print-spec"], cwd=ROOT))
    if init_dir and (spec0.get("hf") or {}).get("path") != init_dir:
        sys.exit(f"{a.recipe}: read the hf path {init_dir!r} from the text, the spec has {spec0.get('hf')}")
    # A recipe whose trainer computes its GEMMs in bf16 is measured against libtorch's bf16 peak.
    kind = spec0["train"].get("precision", "fp32")
    peak_cmd = [os.path.join(a.tools, "peak-flops"), "--threads", str(a.threads), "--json", "--kind", kind]
    for shape in model_shapes(spec0):
        peak_cmd += ["--shape", shape]
    peaks = [json.loads(sh(peak_cmd))]
    print(f"peak before: {peaks[0]['peak_gflops']:.1f} GFLOP/s", file=sys.stderr)

    runs = []
    for seed in range(a.seeds):
        sets = ["--set", f"seed={seed}"]
        steps = ["--steps", str(a.steps)] if a.steps else []
        spec_text = sh([a.miles, "run", a.recipe, *sets, *steps, "--print-spec"], cwd=ROOT)
        spec = json.loads(spec_text)
        spec_path = os.path.join(a.out, f"spec-s{seed}.json")
        open(spec_path, "w").write(spec_text)
        prompts_path = os.path.join(a.out, f"prompts-s{seed}.json")
        sh([os.path.join(a.tools, "export-prompts"), spec_path, prompts_path])
        order = ["miles", "trl"] if seed % 2 == 0 else ["trl", "miles"]
        for side in order:
            out = os.path.join(a.out, f"{side}-s{seed}")
            shutil.rmtree(out, ignore_errors=True)
            if side == "miles":
                cmd = [a.miles, "run", a.recipe, *sets, *steps, "--out", out, "--threads", str(a.threads),
                       "--progress", "plain"]
            else:
                cmd = [a.python, os.path.join(ROOT, "bench/peers/trl/grpo_trl.py"), "--spec", spec_path,
                       "--prompts", prompts_path, "--out", out, "--seed", str(seed), "--threads", str(a.threads)]
                if init_dir:
                    cmd += ["--init", os.path.join(ROOT, init_dir)]
            wall, rss, rc = timed(cmd, out + ".log")
            if rc != 0:
                sys.exit(f"{side} seed {seed} failed (exit {rc}); see {out}.log")
            rows = read_steps(os.path.join(out, "metrics.jsonl"))
            s = summarise(rows, a.threshold, a.window, a.gain)
            s.update(side=side, seed=seed, wall_s=wall, rss_mib=rss, curve=curve(rows, a.bucket))
            if side == "trl":
                summ = json.load(open(os.path.join(out, "summary.json")))
                s.update(params=summ["params"], sft_s=summ["sft_s"], import_s=summ["import_s"],
                         versions=summ["versions"], gpt2=summ.get("gpt2"), init=summ.get("init"),
                         eval_start=summ.get("eval_start"),
                         eval_end=summ.get("eval_end"), eval_s=summ.get("eval_s"))
                want = [[it["prompt"] for it in step] for step in json.load(open(prompts_path))["rollout"][:2]]
                s["same_prompts"] = summ["first_prompts"] == want
            else:
                s["profile"] = None  # filled below with the peak
                s["rows"] = rows
                s["spec"] = spec
                evals = read_evals(os.path.join(out, "metrics.jsonl"))
                if evals:
                    s["eval_start"], s["eval_end"] = evals[0], evals[-1]
            runs.append(s)
            print(f"{side} seed {seed}: {s['step_s']*1e3:.0f} ms/step, reward {s['reward_start']:.2f} -> "
                  f"{s['reward_end']:.2f}, {wall:.0f} s, {rss:.0f} MiB", file=sys.stderr)
    peaks.append(json.loads(sh(peak_cmd)))
    # The best matmul seen in the run (square or at the model's shapes, before or after):
    # contention only ever lowers a measurement, so the highest is the closest to what this
    # machine can do.
    peak = max(max(p["peak_gflops"], *p["model_shapes"].values()) for p in peaks)

    # Parameter counts: miles' from its model config (Policy::num_params' formula), TRL's printed.
    spec = runs[0]["spec"] if runs[0]["side"] == "miles" else runs[1]["spec"]
    m = spec["model"]
    d, L, V, ff = m["d_model"], m["n_layers"], m["vocab_size"], m["d_ff"]
    kv = d // m["n_heads"] * m["n_kv_heads"]
    miles_params = 2 * V * d + d + L * (2 * d + 2 * d * d + 2 * d * kv + 3 * d * ff)
    trl_params = next(r["params"] for r in runs if r["side"] == "trl")
    param_gap = abs(miles_params - trl_params) / trl_params
    print(f"parameters: miles {miles_params}, TRL {trl_params} ({100*param_gap:.2f}% apart)", file=sys.stderr)
    if param_gap > 0.05:
        sys.exit(f"the two models are more than 5% apart in parameters; fix {a.recipe}")

    for r in runs:
        if r["side"] == "miles":
            r["profile"] = miles_profile(r["rows"], r["spec"], peak)
    # TRL's achieved FLOP/s, same FLOP model (GPT-2 matmuls, or miles' for the shared Llama), for context.
    for r in runs:
        if r["side"] == "trl":
            rows = read_steps(os.path.join(a.out, f"trl-s{r['seed']}", "metrics.jsonl"))
            ro = spec["rollout"]
            n = ro["rollout_batch"] * ro["samples_per_prompt"]
            gen_tok = statistics.fmean(x["perf/gen_tokens"] for x in rows)
            trained = statistics.fmean(x["perf/trained_tokens"] for x in rows)
            pl = [round((trained - gen_tok) / n)] * n
            rl = [round(gen_tok / n)] * n
            gen_f, fwd_f = step_flops({**m, "n_inner": (r.get("gpt2") or {}).get("n_inner", 4 * m["d_model"])},
                                      "miles" if r.get("init") else "gpt2", pl, rl, ro["samples_per_prompt"])
            # TRL does no separate old-log-prob pass when generation and optimisation are aligned.
            r["achieved_gflops"] = (gen_f + 3 * fwd_f) / statistics.fmean(x["perf/step_s"] for x in rows) / 1e9

    by = {side: [r for r in runs if r["side"] == side] for side in ("miles", "trl")}
    col = lambda side, k: [r[k] for r in by[side]]  # noqa: E731

    def ratio(k, inverse=False):
        a_, b_ = mean_std(col("miles", k))[0], mean_std(col("trl", k))[0]
        if a_ is None or b_ is None:
            return "-"
        return f"{(b_ / a_ if inverse else a_ / b_):.1f}x"

    first = runs[0]
    date = datetime.date.today().isoformat()
    cpu = "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()
    trl_v = next(r["versions"] for r in runs if r["side"] == "trl")
    steps_n = first["steps"]
    lines = []
    w = lines.append
    title = a.title or ("GRPO side by side: miles and TRL on the same run" if not suffix else
                        f"TRL side-by-side from one Hugging Face checkpoint at ~{size_words(miles_params)} "
                        f"parameters ({date})" if init_dir else
                        f"TRL side-by-side at ~{size_words(miles_params)} parameters ({date})")
    w(f"## {title}\n")
    cmd = "bash bench/peers/run.sh" + ("" if a.recipe == "recipes/compare-trl.miles" else f" --recipe {a.recipe}")
    w(f"Command: `{cmd}` (seeds {a.seeds}, threads {a.threads}). Date: {date}. "
      f"Machine: {os.cpu_count()} vCPUs ({cpu}), shared: other engineers were compiling "
      f"(load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end); the sides alternate seed by seed "
      f"so a slow spell hits both. Versions: miles at `{a.label or git_rev()}` ({libtorch_version()}, release build); "
      f"TRL {trl_v['trl']}, transformers {trl_v['transformers']}, torch {trl_v['torch']} (CPU).\n")
    w(f"Run: `{a.recipe}`: two-digit addition, {spec['sft']['steps'] if spec.get('sft') else 0} SFT warm-up steps, "
      f"then {steps_n} GRPO steps of {spec['rollout']['rollout_batch']} prompts x {spec['rollout']['samples_per_prompt']} "
      f"samples, up to {spec['rollout']['max_new_tokens']} new tokens, lr {spec['train']['lr']}, one optimizer step per "
      f"RL step, {a.threads} thread(s). Same prompts in the same order on both sides "
      f"({'checked' if all(r.get('same_prompts') for r in by['trl']) else 'NOT the same: check the export'}). "
      + (f"Model: ONE Hugging Face LlamaForCausalLM checkpoint both sides load (`{init_dir}`, "
         f"bench/peers/trl/make_same_model.py, init seed {a.init_seed}: {L} layers, d {d}, {m['n_heads']} heads, "
         f"SwiGLU {ff}; miles {miles_params:,} parameters by its formula, TRL counts {trl_params:,}); same "
         f"tokenizer ids (miles' character tokenizer).\n" if init_dir else
         f"Models: miles {miles_params:,} parameters (Llama-style: {L} layers, d {d}, {m['n_heads']} heads, "
         f"SwiGLU {ff}), "
         f"TRL {trl_params:,} (GPT-2{gpt2_words(by['trl'])}), {100*param_gap:.1f}% apart.\n"))
    w(f"| | miles | TRL | miles / TRL |")
    w(f"|---|---:|---:|---:|")
    w(f"| seconds per GRPO step (median) | {fmt(col('miles','step_s'), 4)} | {fmt(col('trl','step_s'), 4)} | "
      f"{ratio('step_s', inverse=True)} faster |")
    w(f"| generated tokens/s (generation phase) | {fmt(col('miles','gen_tok_s'), 0)} | {fmt(col('trl','gen_tok_s'), 0)} | "
      f"{ratio('gen_tok_s')} |")
    w(f"| trained tokens/s (training phase) | {fmt(col('miles','train_tok_s'), 0)} | {fmt(col('trl','train_tok_s'), 0)} | "
      f"{ratio('train_tok_s')} |")
    w(f"| trained tokens/s (whole step) | {fmt(col('miles','e2e_tok_s'), 0)} | {fmt(col('trl','e2e_tok_s'), 0)} | "
      f"{ratio('e2e_tok_s')} |")
    w(f"| step split, ms per step (mean): generation / training / rest | "
      f"{split(by['miles'])} | {split(by['trl'])} | |")
    w(f"| trained tokens per step (prompt + response, mean) | {fmt(col('miles','trained_tokens'), 0)} | "
      f"{fmt(col('trl','trained_tokens'), 0)} | |")
    w(f"| peak memory (max RSS, MiB) | {fmt(col('miles','rss_mib'), 0)} | {fmt(col('trl','rss_mib'), 0)} | "
      f"{ratio('rss_mib', inverse=True)} less |")
    if all(r.get("eval_start") is not None for r in runs):
        n_eval = spec["eval"]["prompts"]
        w(f"| held-out greedy accuracy ({n_eval} test problems), after SFT -> after GRPO | "
          f"{fmt(col('miles','eval_start'), 3)} -> {fmt(col('miles','eval_end'), 3)} | "
          f"{fmt(col('trl','eval_start'), 3)} -> {fmt(col('trl','eval_end'), 3)} | |")
    w(f"| rollout reward at step 1 (the SFT start point, 128 samples) | {fmt(col('miles','reward_step1'), 3)} | "
      f"{fmt(col('trl','reward_step1'), 3)} | |")
    w(f"| mean reward, first {a.window} steps | {fmt(col('miles','reward_start'), 3)} | {fmt(col('trl','reward_start'), 3)} | |")
    w(f"| mean reward, last {a.window} steps (after {steps_n}) | {fmt(col('miles','reward_end'), 3)} | "
      f"{fmt(col('trl','reward_end'), 3)} | |")
    w(f"| GRPO wall time to a {a.window}-step mean reward >= {a.threshold} (s) | {fmt(col('miles','time_to_threshold_s'), 1)} | "
      f"{fmt(col('trl','time_to_threshold_s'), 1)} | "
      f"{ratio('time_to_threshold_s', inverse=True) if all(x is not None for x in col('trl','time_to_threshold_s')) else '-'} |")
    w(f"| ... in steps | {fmt(col('miles','steps_to_threshold'), 0)} | {fmt(col('trl','steps_to_threshold'), 0)} | |")
    w(f"| GRPO wall time until the {a.window}-step mean reward is {a.gain} above its first {a.window} steps (s) | "
      f"{fmt(col('miles','time_to_gain_s'), 1)} | {fmt(col('trl','time_to_gain_s'), 1)} | "
      f"{ratio('time_to_gain_s', inverse=True) if all(x is not None for x in col('trl','time_to_gain_s') + col('miles','time_to_gain_s')) else '-'} |")
    w(f"| ... in steps | {fmt(col('miles','steps_to_gain'), 0)} | {fmt(col('trl','steps_to_gain'), 0)} | |")
    w(f"| GRPO wall time, all {steps_n} steps (s) | {fmt(col('miles','grpo_s'), 1)} | {fmt(col('trl','grpo_s'), 1)} | "
      f"{ratio('grpo_s', inverse=True)} less |")
    w(f"| process wall time incl. start-up and SFT (s) | {fmt(col('miles','wall_s'), 1)} | {fmt(col('trl','wall_s'), 1)} | "
      f"{ratio('wall_s', inverse=True)} less |")
    w("")
    w(f"Mean ± std over {a.seeds} seeds (0..{a.seeds-1}). Definitions, identical for both sides: a step is one "
      "generate-score-train-sync iteration, timed end to end (miles: `perf/step_s`; TRL: from one `on_step_end` to the "
      "next). Generated tokens/s: response tokens (EOS included) / time in generation (miles: the engine's `generate`; "
      "TRL: `_generate_single_turn`, i.e. HF `generate`). Trained tokens: prompt + response tokens of the step's "
      f"{spec['rollout']['rollout_batch'] * spec['rollout']['samples_per_prompt']} "
      "samples; training phase: miles' `train_rl` (log-prob recompute when not on-policy, forward, backward, AdamW); TRL: the step minus "
      "its rollout phase (`_generate_and_score_completions`), i.e. loss forward, backward, optimizer and the Trainer "
      "loop; the split's rest is the step minus both (miles: reward, sync, orchestration; TRL: tokenising, "
      "reward, advantages, the Trainer loop outside its training step). The held-out evaluation (greedy, at the start "
      "and the end) is outside the steps on both sides. Time to threshold: GRPO step time summed until the mean reward of the last "
      f"{a.window} steps first reaches {a.threshold}; SFT and start-up are excluded there and included in the last row. "
      f"TRL's start-up includes ~{statistics.fmean(col('trl','import_s')):.0f} s of Python imports.\n")

    # ---- the reward curves ----
    n_b = min(len(r["curve"]) for r in runs)
    w(f"### Reward curves\n")
    w(f"Mean rollout reward per {a.bucket} GRPO steps, mean ± std over the {a.seeds} seeds (per seed: the mean of "
      f"the {a.bucket} steps' `rollout/reward_mean`).\n")
    w("| steps | miles | TRL | miles - TRL |")
    w("|---|---:|---:|---:|")
    for b in range(n_b):
        mc = [r["curve"][b] for r in by["miles"]]
        tc = [r["curve"][b] for r in by["trl"]]
        w(f"| {b*a.bucket+1}-{min((b+1)*a.bucket, steps_n)} | {fmt(mc, 3)} | {fmt(tc, 3)} | "
          f"{statistics.fmean(mc) - statistics.fmean(tc):+.3f} |")
    w("")

    # ---- the profile ----
    prof = [r["profile"] for r in by["miles"]]
    ph = {k: statistics.fmean(p["phases"][k] for p in prof) for k in prof[0]["phases"]}
    tr_other = ph["train_s"] - ph["logprob_s"] - ph["forward_s"] - ph["backward_s"] - ph["optimizer_s"]
    orch = ph["step_s"] - ph["gen_s"] - ph["reward_s"] - ph["train_s"] - ph["sync_s"] - ph["eval_s"]
    pg = {k: statistics.fmean(p["phase_gflops"].get(k, 0.0) for p in prof) for k in prof[0]["phase_gflops"]}
    mfu = statistics.fmean(p["mfu"] for p in prof)
    ach = statistics.fmean(p["achieved_gflops"] for p in prof)
    sq = {k: statistics.fmean(p["square"][k] for p in peaks) for k in peaks[0]["square"]}
    shapes = {k: statistics.fmean(p["model_shapes"][k] for p in peaks) for k in peaks[0]["model_shapes"]}
    w("### Profile of a miles GRPO step\n")
    w(f"Mean over all steps and seeds of the per-phase timings miles writes to metrics.jsonl (`perf/*`). "
      f"FLOPs: matmul FLOPs of real tokens (2 x weights per token, plus attention over the causal context; "
      f"backward = 2 x forward; pads, norms, softmax and AdamW not counted). Peak: libtorch {kind} matmul on "
      f"{a.threads} thread(s), the best matmul of the run (square n = 256..2048 and the model's own shapes, "
      f"measured before and after the runs: contention only lowers a measurement)."
      + (f" The same CPU type measured ~165 GFLOP/s (fp32) at n = 2048 when quiet (../shared/context/toolchain-facts.md, "
         f"beside the repository); under this run's load the square matmuls reached only "
         f"{max(max(p['square'].values()) for p in peaks):.0f}.\n" if kind == "fp32" else "\n"))
    w("| phase | ms per step | share | GFLOP/s achieved |")
    w("|---|---:|---:|---:|")
    tot = ph["step_s"]
    for name, key, gk in [
        ("sampling (prefill + decode with KV cache, sampling in Rust)", "gen_s", "gen_s"),
        ("reward and advantages", "reward_s", None),
        ("log-prob recompute (no grad; skipped on-policy)", "logprob_s", "logprob_s"),
        ("forward with loss", "forward_s", "forward_s"),
        ("backward", "backward_s", "backward_s"),
        ("optimizer (grad norm, clip, AdamW)", "optimizer_s", None),
        ("other training work (packing, stats)", None, None),
        ("weight sync (trainer -> engine copy)", "sync_s", None),
        ("evaluation (start and end only; per step)", "eval_s", None),
        ("orchestration (executor, metrics, rest)", None, None),
    ]:
        v = ph[key] if key else (tr_other if name.startswith("other") else orch)
        g = f"{pg[gk]:.2f}" if gk and gk in pg else ""
        w(f"| {name} | {v*1e3:.2f} | {100*v/tot:.0f}% | {g} |")
    w(f"| **whole step** | **{tot*1e3:.2f}** | 100% | **{ach:.2f}** |")
    w("")
    quiet = f", {100*ach/165:.1f}% of the quiet fp32 165 GFLOP/s" if kind == "fp32" else ""
    w(f"MFU on this CPU: **{100*mfu:.1f}%** of the run's {peak:.0f} GFLOP/s {kind} peak{quiet} "
      f"({ach:.2f} GFLOP/s over the whole step; "
      f"{prof[0]['step_flops']/1e6:.1f} MFLOP per step at {prof[0]['prompt_len']:.1f} prompt + "
      f"{prof[0]['resp_len']:.1f} response tokens per sample). TRL, same FLOP model with its "
      f"{'Llama' if init_dir else 'GPT-2'}: "
      f"{statistics.fmean(r['achieved_gflops'] for r in by['trl']):.2f} GFLOP/s. "
      f"libtorch matmul at this run's shapes: "
      + ", ".join(f"{k}: {v:.1f}" for k, v in shapes.items())
      + f" GFLOP/s; square: " + ", ".join(f"n={k}: {v:.0f}" for k, v in sq.items()) + " GFLOP/s.\n")

    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(a.table), exist_ok=True)
    open(a.table, "w").write(text)
    raw = [{k: v for k, v in r.items() if k not in ("rows", "spec")} for r in runs]
    json.dump({"runs": raw, "peaks": peaks, "params": {"miles": miles_params, "trl": trl_params}},
              open(os.path.join(a.out, "results.json"), "w"), indent=1)
    print(text)


def recipe_suffix(recipe):
    """'' for recipes/compare-trl.miles (the 0.1M table), NAME for recipes/compare-trl-NAME.miles,
    else the recipe's file stem."""
    stem = os.path.splitext(os.path.basename(recipe))[0]
    if stem == "compare-trl":
        return ""
    return stem[len("compare-trl-"):] if stem.startswith("compare-trl-") else stem


def model_shapes(spec):
    """The GEMMs of the recipe's model for tools/peak-flops, as MxKxN: 1024 rows (a training batch
    of 128 sequences x 8 tokens) through d -> d_ff, d -> d, d_ff -> d, and 128 rows (a decode
    step of 128 samples) through d -> d_ff. At 0.1M these are peak-flops' defaults."""
    m = spec["model"]
    d, ff = m["d_model"], m["d_ff"]
    return [f"1024x{d}x{ff}", f"1024x{d}x{d}", f"1024x{ff}x{d}", f"128x{d}x{ff}"]


def read_evals(path):
    """Held-out accuracies in the order written (step 0 after SFT, ..., the last step)."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    return [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]


def split(runs):
    k = ["gen_ms", "train_ms", "rest_ms"]
    return " / ".join(f"{statistics.fmean(r[x] for r in runs):.0f}" for x in k)


def size_words(n):
    """~10M for 10,634,112 (the order of magnitude a recipe names, rounded down), ~0.1M for 102,720."""
    return f"{int(n // 1e6)}M" if n >= 1e6 else f"{n / 1e6:.1f}M"


def gpt2_words(trl_runs):
    g = next((r.get("gpt2") for r in trl_runs if r.get("gpt2")), None)
    if not g:
        return ""
    return f": {g['n_layer']} layers, d {g['n_embd']}, {g['n_head']} heads, MLP {g['n_inner']}"


def libtorch_version():
    try:
        d = next(x for x in os.listdir(os.path.join(ROOT, ".libtorch")) if x.startswith("torch-") and x.endswith(".dist-info"))
        return "libtorch " + d[len("torch-"):-len(".dist-info")]
    except (OSError, StopIteration):
        return "libtorch"


def git_rev():
    try:
        rev = sh(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT).strip()
        dirty = sh(["git", "status", "--porcelain", "--untracked-files=no", "engine", "src"], cwd=ROOT).strip()
        return rev + ("+uncommitted engine changes" if dirty else "")
    except (subprocess.CalledProcessError, OSError):
        return "unknown"


if __name__ == "__main__":
    main()
