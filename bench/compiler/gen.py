#!/usr/bin/env python3
"""Writes a realistic .miles library: 100 modules that import each other (schemas, enums, stage
kinds, constants, checks) and a recipe on top, about 10,000 lines in all.

usage: gen.py OUT_DIR            (writes OUT_DIR/m000.miles ... m098.miles and OUT_DIR/main.miles)
"""
import os
import sys

MODULES = 99  # plus main.miles


def module(i):
    deps = sorted({d for d in (i - 1, i // 2, i // 3) if 0 <= d < i})
    out = [f"// Module {i} of the generated benchmark library.", ""]
    for d in deps:
        out.append(f"import ./m{d:03} as m{d:03}")
    out += ["import std/hardware { h100 }", ""]
    out += [f"/// Modes of component {i}.", f"enum Mode{i} {{"]
    out += [f"    /// Mode {k}.\n    mode{i}_{k}" for k in range(4)]
    out += ["}", ""]
    base = " + ".join([f"m{d:03}.width" for d in deps]) or "8"
    out += [f"/// Base width, derived from the modules this one builds on.", f"const width = ({base}) % 97 + 8"]
    out += [f"const budget: Bytes = width * 512.MiB", f"const deadline: Duration = width * 30.s + 5.min"]
    out += [f"const ratio = width / 4 + 0.25", f"const tags = [\"m{i}\", \"gen\", \"bench\"]", ""]
    for s in range(4):
        out += [f"/// Settings block {s} of module {i}.", f"schema settings{i}_{s} {{"]
        out += [f"    /// How many workers.", f"    workers: Int in 1..=4096 = width * {s + 1}"]
        out += [f"    memory: Bytes = budget", f"    timeout: Duration = deadline"]
        out += [f"    rate: Float in 0..1 = 0.5", f"    mode: Mode{i} = mode{i}_{s}"]
        out += [f"    limit: Tokens = {s + 1}k.tokens", f"    label: String? = none"]
        out += [f"    check workers * 2 >= {s + 1} else \"too few workers\" help \"raise workers\""]
        out += [f"    check memory <= 10.TB and timeout > 1.s else \"out of bounds\""]
        out += [f"    check mode in [mode{i}_0, mode{i}_1, mode{i}_2, mode{i}_3] and rate in 0..=1"]
        out += ["}", ""]
    out += [f"/// A team's own reward stage, kind {i}.", f"stage score{i}(rollout: Trajectories) -> Scores {{"]
    out += [f"    weight: Float in 0..=10 = ratio", f"    settings: settings{i}_0 = settings{i}_0 {{}}"]
    out += [f"    window: Steps = width * 10.steps"]
    out += [f"    check rollout.max_new_tokens > 0.tokens else \"the rollout generates nothing\""]
    out += [f"    check settings.workers >= 1 and window > 0.steps"]
    out += ["}", ""]
    for k in range(4):
        ref = f"m{deps[k % len(deps)]:03}.c{k}" if deps else str(k + 1)
        out.append(f"const c{k} = {ref} * 3 % 1000 + width + len(tags)")
    out += [f"const made{i} = settings{i}_1 {{ workers = c0 % 64 + 1, rate = 0.25, label = \"x\" }}"]
    out += [f"const copy{i} = made{i} {{ workers = 2 }}"]
    out += [f"const mixed = if c1 > c2 then max(c1, c2) else min(c1, c2, c3)"]
    out += [f"const gpus = h100 * 16", f"const per_gpu: Bytes = gpus.gpu.hbm / 2"]
    return "\n".join(out) + "\n"


def main_module():
    imports = [f"import ./m{i:03} as m{i:03}" for i in range(0, MODULES, 11)]
    last = f"m{MODULES - 1:03}"
    return "\n".join(
        ["// The recipe of the generated benchmark library.", "import std/tasks/arith", f"import ./{last} as {last}"]
        + imports
        + [
            "",
            "model policy = transformer { layers = 2, d_model = 64, heads = 4, vocab = arith.vocab }",
            "",
            "recipe bench {",
            "    rollout = generate(policy) { prompts = arith.addition {}, max_new_tokens = 4.tokens }",
            f"    reward  = {last}.score{MODULES - 1}(rollout) {{ weight = 0.5 }}",
            "    train   = grpo(rollout, reward) { rollout_batch = 32, global_batch = 256 }",
            "    sync    = weights(train -> rollout)",
            "    stop    = 100.steps",
            "}",
        ]
    ) + "\n"


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for i in range(MODULES):
        with open(os.path.join(out, f"m{i:03}.miles"), "w") as f:
            f.write(module(i))
    with open(os.path.join(out, "main.miles"), "w") as f:
        f.write(main_module())


main()
