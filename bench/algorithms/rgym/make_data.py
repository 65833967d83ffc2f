"""Writes a prompt file for miles' `jsonl` prompts from one reasoning-gym dataset (docs/data.md).

    bench/out/rgym-venv/bin/python bench/algorithms/rgym/make_data.py \
        --dataset basic_arithmetic --rows 1200 --seed 1 --out recipes/data/rgym/basic_arithmetic.jsonl

One row per distinct problem:

    {"prompt": "5-3=", "label": "2", "dataset": "basic_arithmetic", "question": "Calculate 5-3.",
     "metadata": {"source_dataset": "basic_arithmetic", "source_index": 0, "expression": "5-3", ...}}

- `prompt` is a compact rendering of the entry's question: the variable part only (the
  template's fixed English is the same on every row and would only cost a character-level model
  sequence length); the whole question is kept in `question`.
- `label` is the entry's `answer`: the SFT warm-up's target and what `score_answer` checks.
- `dataset`, `question` and `metadata` (the entry's own) are what score.py needs to rebuild the
  entry and the dataset object whose `score_answer` scores it, made with this file's
  configuration of `dataset` (DATASETS below, which score.py imports); miles passes every field
  but the prompt and label to the reward as the sample's `metadata`, untouched.

miles holds the test split out of the same file (`test_size`, `split_seed`), so one file is
written; rows are deduplicated by prompt so the split is clean. A dataset with fewer distinct
problems than `--rows` gives all it has (the count is printed).
"""

import argparse
import json
import os
import sys

import reasoning_gym as rg

# The candidates tried for a 0.1M-parameter character model: a small configuration of each and
# the compact prompt of an entry. score.py scores with the same configuration: changing one
# here changes what an existing file's rows are scored against, so regenerate the data with it.
# The chosen one is in the README of recipes/data/rgym/.
DATASETS = {
    # "Calculate 5-3." -> "5-3=" (answers -18..18; the generator also writes `(-9-8)`, `2+-1`).
    "basic_arithmetic": (
        dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+", "-"],
             format_style="simple", whitespace="no_space"),
        lambda e: e["metadata"]["expression"] + "=",
    ),
    # "Spell this word backward (example: sun -> nus): neon" -> "neon>"
    "spell_backward": (
        dict(min_word_len=3, max_word_len=5),
        lambda e: e["metadata"]["word"] + ">",
    ),
    # 'How many times does the letter "m" appear in the text: "a b c"?' -> "m:a b c="
    "letter_counting": (
        dict(min_words=2, max_words=3),
        lambda e: e["metadata"]["target_letter"] + ":" + " ".join(e["metadata"]["span"]) + "=",
    ),
    # "convert the base-3 number 11 to base-6" -> "11:3>6="
    "base_conversion": (
        dict(min_base=2, max_base=10, min_value=0, max_value=31),
        lambda e: f'{e["metadata"]["source_repr"]}:{e["metadata"]["source_base"]}>{e["metadata"]["target_base"]}=',
    ),
}


def rows(name, n, seed):
    """Up to `n` rows of distinct prompts, in the generator's order."""
    config, compact = DATASETS[name]
    # The generator's space may be smaller than `n`: draw at most 50x as many entries.
    draw = 50 * n
    dataset = rg.create_dataset(name, size=draw, seed=seed, **config)
    seen = set()
    out = []
    for i in range(draw):
        entry = dataset[i]
        prompt = compact(entry)
        if prompt in seen:
            continue
        seen.add(prompt)
        out.append({
            "prompt": prompt,
            "label": entry["answer"],
            "dataset": name,
            "question": entry["question"],
            "metadata": entry["metadata"],
        })
        if len(out) == n:
            break
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", required=True, choices=sorted(DATASETS))
    ap.add_argument("--rows", type=int, default=1200, help="distinct problems to write (train + test)")
    ap.add_argument("--seed", type=int, default=1, help="reasoning-gym's dataset seed")
    ap.add_argument("--out", required=True, help="the .jsonl file to write")
    args = ap.parse_args()
    if args.rows < 2:
        sys.exit("make_data: --rows must be at least 2 (miles needs a train and a test prompt)")
    data = rows(args.dataset, args.rows, args.seed)
    chars = sorted({c for r in data for c in r["prompt"] + r["label"]})
    # Written next to the target and renamed: a reader never sees half a file.
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = f"{args.out}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        for r in data:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    os.replace(tmp, args.out)
    print(f"{args.out}: {len(data)} rows of {args.dataset} (seed {args.seed}); "
          f"{len(chars)} characters in prompts and labels: {''.join(chars)!r}")


if __name__ == "__main__":
    main()
