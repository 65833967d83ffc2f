"""The q/k-norm table of bench/RESULTS.md ("Hugging Face in and out") from bench/moe/qknorm.sh's runs."""
import statistics
import sys

# The run reader of bench/moe/table.py (this script's folder is on sys.path when it runs); no
# __pycache__ left in the tree for it.
sys.dont_write_bytecode = True
from table import mean, run  # noqa: E402

root = sys.argv[1]
seeds = (4, 5, 6)

print("| qk_norm | held-out accuracy start -> end (per seed) | end mean +- std | route mismatch | router disagreement | KL(rollout, train) |")
print("|---|---|---:|---:|---:|---:|")
for qk in ["true", "false"]:
    rs = [run(root, f"qk{qk}-s{s}")[0] for s in seeds]
    ends = [r["end"] for r in rs]
    per = ", ".join(f"{r['start']:.0f} -> {r['end']:.0f}" for r in rs)
    print(
        f"| {qk} | {per} | {mean(ends):.1f}% +- {statistics.stdev(ends):.1f} | {mean([r['mismatch'] for r in rs]):.3f}% | "
        f"{mean([r['disagree'] for r in rs]):.3f}% | {mean([r['kl'] for r in rs]):.2e} |"
    )
