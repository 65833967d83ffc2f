#!/usr/bin/env bash
# Regenerates the figures of bench/RESULTS.md that this script owns and says how the others are
# regenerated. Every benchmark is outside `make test` (speed is never asserted in tests).
#
#   bash bench/update-results.sh            run the owned benchmarks, splice their tables in
#   bash bench/update-results.sh --list     print every section and the command behind it
#   bash bench/update-results.sh --splice   only splice bench/peers/RESULTS-table.md (no runs)
#
# Owned here: the TRL comparison and the profile of our step (bench/peers/, the section between
# the `peers` markers). The other sections belong to their benchmarks' authors: `--list` prints
# every section with its family (grpo, grpo-hf, agent, compare-trl, lora, multi-lora, ppo, opd,
# moe-r3, diffusion, bf16, async, transport, plan, ...) and command, as their sections say; this
# script never rewrites their numbers.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
results=bench/RESULTS.md

list() {
    # One entry per section of bench/RESULTS.md, in its order: the family (the recipe or part it
    # measures), the section, then the command from the repository root. Binaries: `cargo build
    # --release --bins` first (target/release/miles, miles-engine beside it).
    cat <<'LIST'
family       section of bench/RESULTS.md, then its command (from the repository root)
package      Package resolution: 200 packages with diamonds
               cargo bench -p miles-package --bench resolve                         (bench/package/resolve.rs)
plan         miles plan: planning time against cluster size
               cargo bench -p miles-plan --bench plan                               (bench/plan/plan.rs)
lsp          Language server latency
               cargo bench -p miles-lsp --bench lsp                                 (bench/lsp/lsp.rs)
grpo         Embedded backend: GRPO learns: the laptop recipe
               cargo run --release -p miles-tch --example run_spec -- engine/runtime/tests/data/laptop.json OUT --seed S --threads 1
             + the same run from the recipe
               target/release/miles run recipes/grpo-laptop.miles --threads 1
             + throughput, and Training MFU at three sizes
               cargo bench -p miles-tch --bench throughput -- --threads 1           (bench/tch/throughput.rs)
grpo-hf      Bring your own model: GRPO from a Hugging Face directory
               target/release/miles run recipes/grpo-hf.miles --set seed=S --out OUT --threads 1
agent        Agentic: learning to use a calculator tool (recipes/agent-laptop.miles)
               bash bench/agent/run.sh  (fully_async: add --set 'schedule=fully_async { ... }', see its header)
compare-trl  GRPO side by side: miles and TRL, and the profile of a miles GRPO step
               bash bench/peers/run.sh  (spliced by this script; profile: perf/* metrics + tools/peak-flops)
compiler     miles check: the compiler on a 10,000-line library
               bash bench/compiler/run.sh                                           (bench/compiler/)
transport    Weight transports: update time and GB/s between processes
               cargo bench -p miles-workers --bench transport                       (bench/transport/transport.rs)
async        Asynchronous schedules: simulated long-tailed rollouts
               cargo bench -p miles-runtime --bench async                           (bench/async/async.rs)
             + the laptop recipe under each schedule
               bash bench/async/laptop.sh
plan         miles plan: weight-sync time against fleet width and engine TP (broadcast vs P2P)
               bash bench/plan/sync-sweep.sh target/release/miles
plan         Plan versus actual, the embedded process, step time on a CPU host, expected lengths
               miles run recipes/R.miles --set stop=20.steps --threads 1 --out /tmp/pva/R --progress off
               && miles report /tmp/pva/R   (R: grpo-laptop, agent-laptop, lora-laptop, ppo-laptop, grpo-hf)
lora         LoRA against full fine-tuning (recipes/lora-laptop.miles)
               bash bench/lora/run.sh
multi-lora   Multi-LoRA: two adapters, two tasks, one base (recipes/multi-lora-laptop.miles)
               bash bench/lora/multi.sh
ppo          PPO with a learned critic next to GRPO (recipes/ppo-laptop.miles)
               bash bench/ppo/run.sh
opd          On-policy distillation next to GRPO alone (recipes/opd-laptop.miles)
               bash bench/opd/run.sh  (the stronger-teacher pass: extra --set arguments, see its section)
             + the length effect (recipes/opd-length-laptop.miles)
               bash bench/opd/length.sh
moe-r3       MoE and R3 (recipes/moe-r3-laptop.miles), sync and fully_async
               bash bench/moe/run.sh
             + true on-policy: batch_invariant against the ordinary kernels
               bash bench/moe/invariant.sh
diffusion    Diffusion RL (recipes/diffusion-laptop.miles)
               bash bench/diffusion/run.sh  (learn | timing | table)
async        fully_async across processes: engine workers and miles serve
               bash bench/async/workers.sh
transport    Weight transports near memory bandwidth (shm pipelined, disk-delta profiled, re-run)
               cargo bench -p miles-workers --bench transport -- --sizes 1GB --engines 1
compare-trl  TRL side-by-side at ~10M parameters (recipes/compare-trl-10m.miles)
               bash bench/peers/run.sh --recipe recipes/compare-trl-10m.miles --seeds 4 --threads 1
bf16         bf16 GEMMs on the CPU: TRL side by side, both in bf16 (recipes/compare-trl-10m-bf16.miles)
               bash bench/peers/run.sh --recipe recipes/compare-trl-10m-bf16.miles --seeds 3 --threads 1
             + the laptop recipe learns in bf16 (recipes/grpo-laptop.miles, fp32 against bf16)
               bash bench/precision/laptop.sh  (seeds 1 2 3 by default; the table is from seeds 0-2)
algorithms   Algorithms side by side: GRPO, Dr. GRPO, GSPO, DAPO, RLOO, REINFORCE++, PPO 1 and 4 epochs
               python3 bench/algorithms/run.py  (--tasks strings,hf,rgym; rgym needs bash bench/algorithms/rgym/setup.sh)
             + checked against TRL on the same samples (bench/peers/trl-parity.md)
               cargo test -p miles-tch --locked --test integration trl_parity::
             + TRL's fewer steps, on one model (bench/peers/analysis.md, 2026-12-07)
               bash bench/peers/run.sh --recipe recipes/compare-trl-hf.miles --seeds 3
serve        miles serve load test (100 clients, a hostile request a second)
               bash bench/serve-load/run.sh 60                                      (bench/serve-load/load.rs)
ddp          Data-parallel trainers (recipes/grpo-ddp-laptop.miles): curves, 2x1 vs 1x2, ZeRO-1 memory
               bash bench/ddp/run.sh
             + c10d all-reduce over loopback (ranks as processes)
               cargo bench --locked -p miles-c10d --bench allreduce
adamw        AdamW in place (recipes/compare-trl-10m-bf16.miles, two builds A/B)
               bash bench/tch/adamw-ab.sh OLD_BIN_DIR target/release
gpu          (no section yet: nothing measured on a GPU) tests/e2e/gpu.rs, GPU throughput, CUDA IPC, NCCL tests
               bash scripts/gpu-bundle.sh here, then on the GPU machine: bash bench/gpu/run.sh "$OUT"
Only the compare-trl section between the `peers` markers is spliced by this script; every other
author pastes their figures into their own section with the command, date and machine.
LIST
}

splice() {
    local table=bench/peers/RESULTS-table.md
    [[ -f "$table" ]] || { echo "no $table: run bash bench/peers/run.sh first" >&2; exit 1; }
    local stamp=bench/out/trl-venv/.miles-trl-ok
    local install="(not installed here)"
    [[ -f "$stamp" ]] && install="$(cat "$stamp")"
    python3 - "$results" "$table" "$install" <<'PY'
import sys
path, table, install = sys.argv[1], sys.argv[2], sys.argv[3]
begin, end = "<!-- BEGIN peers: bench/update-results.sh -->", "<!-- END peers -->"
analysis = table.replace("RESULTS-table.md", "analysis.md")
import os
extra = open(analysis).read().rstrip() + "\n\n" if os.path.exists(analysis) else ""
body = open(table).read().rstrip() + "\n\n" + extra + (
    f"TRL's private environment (`bash bench/peers/trl/setup.sh`, bench/out/trl-venv, git-ignored): "
    f"{install} on this machine (pip from the registry; torch with its CUDA packages, which a CPU run "
    f"never loads).\n")
text = open(path).read()
block = f"{begin}\n{body}{end}"
if begin in text and end in text:
    a, rest = text.split(begin, 1)
    _, b = rest.split(end, 1)
    text = a + block + b
else:
    text = text.rstrip() + "\n\n" + block + "\n"
open(path, "w").write(text)
PY
    echo "updated $results"
}

case "${1:-}" in
    --list) list ;;
    --splice) splice ;;
    "")
        bash bench/peers/run.sh
        splice
        echo "Other sections are regenerated by their own commands:"
        list
        ;;
    *) echo "usage: $0 [--list|--splice]" >&2; exit 2 ;;
esac
