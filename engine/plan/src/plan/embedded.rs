//! Step time of the embedded backend (docs/plan.md, "Step time on a CPU host", "Step time on a
//! GPU"): the work of each pass counted once, here, and priced at the rate of where the process
//! computes (`On`). libtorch on one CPU thread runs every op to completion, so a pass costs the
//! sum of its ops: matmul FLOPs at an effective rate, a fixed dispatch cost per op ("kernel"),
//! and the bytes the non-matmul ops write at an effective rate. At 0.1M parameters the last two
//! dominate (bench/RESULTS.md, "Profile of a miles GRPO step"); matmuls take over from ~10M
//! parameters. On a GPU (`gpu::rate`) the same counts are priced at the GPU's datasheet peaks and
//! a host-side launch per op, plus a logits read-back per sampled token.

use super::gpu::{self, Gpu};
use crate::evidence::{sources, Evidence};
use crate::input::*;
use crate::model::{self, div};
use crate::output::{DataParallelReport, Estimate};
use crate::time::{work_seconds, Rate, Work};

/// Where the embedded process computes, as the plan prices its work: the host's one libtorch
/// thread, or the GPU a `local` cluster's `device` resolved to (`Ctx::gpu`).
#[derive(Clone, Copy, Debug)]
pub(super) enum On<'a> {
    Cpu,
    Gpu(&'a Gpu),
}

impl<'a> On<'a> {
    pub(super) fn of(cx: &'a super::Ctx) -> On<'a> {
        cx.gpu.as_ref().map_or(On::Cpu, On::Gpu)
    }

    /// What the rates of this place rest on: measured on the CPU, assumed on a GPU.
    pub(super) fn evidence(self) -> Evidence {
        match self {
            On::Cpu => Evidence::measured(sources::CPU_RATES),
            On::Gpu(_) => Evidence::assumed(sources::GPU_RATES),
        }
    }
}

/// ATen ops of one decoder layer's forward, counted in `Policy::hidden` (no biases, no q/k
/// norms): RMSNorm, the q|k|v weight cat and GEMM, rotary (neg, cat, two muls, add), the
/// grouped keys/values repeated (two copies), attention (libtorch's CPU path with a mask: scale,
/// QK^T, mask, softmax, AV), the contiguous copy, the output GEMM and residual add, RMSNorm, the
/// gate|up cat and GEMM, SiLU, the gated product, the down GEMM and residual add.
pub const LAYER_KERNELS: f64 = 25.0;
/// ATen ops above the layers: the mask (aranges, comparisons, and/or), rotary tables (two
/// index_selects), the embedding lookup, the final RMSNorm and the LM head.
pub const HEAD_KERNELS: f64 = 11.0;
/// An MoE layer's router (its GEMM, the gate, top-k, the renormalisation), an estimate.
pub const ROUTER_KERNELS: f64 = 6.0;
/// Each routed expert of an MoE layer, an estimate: gathering its tokens, the gate|up GEMM, SiLU,
/// the gated product, the down GEMM, the weighting and the scatter back.
pub const EXPERT_KERNELS: f64 = 7.0;
/// The loss on top of the log-probs (`token_logprobs`, `pg_terms`, masked means, statistics).
pub const LOSS_KERNELS: f64 = 20.0;
/// A decode step writes its keys and values into the cache: two copies per layer.
pub const CACHE_KERNELS: f64 = 2.0;
/// A wrapped module's adapter (`Adapters::delta`): x A^T, its B^T, the scale; and the add (or
/// the concatenation of a fused GEMM's deltas).
pub const LORA_KERNELS: f64 = 4.0;
/// AdamW per trainable tensor (decay, two moment updates, bias corrections, sqrt, division,
/// update) plus its share of the gradient-norm clip.
pub const ADAM_KERNELS_PER_TENSOR: f64 = 12.0;
/// Bytes AdamW reads and writes per trainable parameter (weight, gradient and the two moments
/// read, weight and moments written: 7 FP32 tensors).
pub const ADAM_BYTES_PER_PARAM: f64 = 28.0;

/// What one forward pass computes over.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pass<'a> {
    /// Sequences in the batch and new tokens per sequence.
    pub rows: f64,
    pub tokens: f64,
    /// Keys each query attends (the whole padded sequence in training; the cache in decode).
    pub keys: f64,
    /// Decode step: writes to the KV cache, repeats the cached keys and values for every step.
    pub decode: bool,
    /// Training loss on top (log-softmax over the vocabulary, the policy loss).
    pub loss: bool,
    /// PPO's critic: a value head instead of the LM head, no vocabulary-wide tensors.
    pub critic: bool,
    pub lora: Option<&'a Lora>,
    pub entropy_in_loss: bool,
}

/// Trainable tensors of the policy (each decoder layer's 9 weights, the embedding, the final norm
/// and an untied LM head), or of the adapters (A and B per wrapped module and layer).
pub(crate) fn trainable_tensors(m: &ModelSpec, lora: Option<&Lora>) -> f64 {
    match lora {
        Some(lo) => 2.0 * (lo.target_modules.len() as u64 * m.layers * lo.adapters.value.max(1)) as f64,
        // An MoE layer trades its 3 MLP weights for a router and 3 per expert.
        None => {
            let moe = (model::moe_layers(m) * (1 + 3 * m.experts)) as f64 - 3.0 * model::moe_layers(m) as f64;
            9.0 * m.layers as f64 + moe + 2.0 + if m.tied_embeddings == Some(true) { 0.0 } else { 1.0 }
        }
    }
}

/// ATen ops of the layers' forward: `LAYER_KERNELS` each, and in an MoE layer the router's and
/// every expert's instead of the dense MLP's 6 (an expert no token chose still costs its gather).
fn layer_kernels(m: &ModelSpec) -> f64 {
    let moe = model::moe_layers(m) as f64;
    m.layers as f64 * LAYER_KERNELS + moe * (ROUTER_KERNELS + EXPERT_KERNELS * m.experts as f64 - 6.0)
}

/// One forward pass: matmul FLOPs 2 x active parameters per token plus attention 4 x layers x
/// keys x q; kernels counted per layer and head; bytes: the FP32 tensors the forward writes,
/// `model::embedded_layer_elements` per layer (a decode step also copies the repeated cache,
/// 2 q per key) plus the head's.
pub(crate) fn forward(m: &ModelSpec, p: &Pass) -> Work {
    let tokens = p.rows * p.tokens;
    let layers = m.layers as f64;
    let d = m.hidden_size as f64;
    let q = (m.heads * m.head_dim) as f64;
    let active = if p.critic { model::critic_spec(m).active_params } else { m.active_params } as f64;
    let (mut flops, mut kernels) = (2.0 * active + 4.0 * layers * p.keys * q, layer_kernels(m) + HEAD_KERNELS);
    let mut per_token = layers * model::embedded_layer_elements(m, p.keys.round() as u64);
    if p.decode {
        kernels += layers * CACHE_KERNELS;
        if m.kv_heads < m.heads {
            per_token += layers * 2.0 * q * (p.keys - 1.0).max(0.0);
        }
    }
    per_token += if p.critic {
        3.0 * d
    } else if p.loss {
        model::embedded_head_elements(m, p.entropy_in_loss)
    } else {
        3.0 * d + m.vocab as f64
    };
    if p.loss {
        kernels += LOSS_KERNELS;
    }
    if let Some(lo) = p.lora.filter(|_| !p.critic) {
        let rank = lo.rank.value as f64;
        for &t in &lo.target_modules {
            for (n, mlp, _) in model::lora_instances(m, t) {
                let (fan_in, fan_out) = model::lora_shape(m, t, mlp);
                flops += n * 2.0 * rank * (fan_in + fan_out);
                kernels += n * LORA_KERNELS;
                per_token += n * (rank + fan_out);
            }
        }
    }
    Work { flops: tokens * flops, kernels, bytes: 4.0 * tokens * per_token }
}

/// A backward pass: twice the forward's FLOPs (input and weight gradients), kernels and bytes.
/// With LoRA the frozen base needs no weight gradients; not modelled (an upper bound).
pub(crate) fn backward(fwd: Work) -> Work {
    fwd.scale(2.0)
}

pub(crate) fn rate(a: &Assumptions) -> Rate {
    Rate {
        flops_per_s: a.embedded_flops_per_s,
        kernel_s: a.embedded_kernel_s,
        bytes_per_s: a.embedded_bytes_per_s,
        sync_s: 0.0,
    }
}

/// The rate of `on` with GEMMs in `gemm`, and what it assumed in words. On the CPU: `rate`, bf16
/// GEMMs at `embedded_bf16_flops_per_s`; on a GPU: `gpu::rate`.
pub(super) fn rate_in(a: &Assumptions, on: On, gemm: Precision) -> (Rate, String) {
    match (on, gemm) {
        (On::Gpu(g), _) => (gpu::rate(a, g, gemm), gpu::rate_note(a, g, gemm)),
        (On::Cpu, Precision::Bf16) => {
            let r = Rate { flops_per_s: a.embedded_bf16_flops_per_s, ..rate(a) };
            (r, rate_note_in(&r, "bf16 "))
        }
        (On::Cpu, _) => (rate(a), rate_note(&rate(a))),
    }
}

pub(super) fn rate_note(r: &Rate) -> String {
    rate_note_in(r, "")
}

fn rate_note_in(r: &Rate, gemm: &str) -> String {
    format!(
        "one libtorch thread (miles run --threads 1; a recipe cannot set threads): {gemm}matmuls at {:.0} GFLOP/s, {:.0} us per op, other ops write at {:.1} GB/s",
        r.flops_per_s / 1e9,
        r.kernel_s * 1e6,
        r.bytes_per_s / 1e9
    )
}

/// One optimizer step of the embedded trainer: per micro-batch the forward with the loss and
/// its backward; the old log-probs' no-grad forward when a batch is trained in several steps;
/// the KL reference's forward; PPO's critic (its values, its value loss forward and backward);
/// OPD's teacher (a no-grad forward of its own shape per micro-batch, as the old log-probs');
/// AdamW. A data-parallel trainer (`t.data_parallel`) is priced on its busiest rank: the trained
/// passes of ceil(micro-batches / N), the pre-update passes on the whole batch (every rank makes
/// them: simple and exact), AdamW over 1/N of the parameters under ZeRO-1, and the collectives
/// (`data_parallel::exchange`). Returns the estimate and the critic's and the teacher's seconds in
/// it, and the data-parallel report.
#[allow(clippy::too_many_arguments)]
pub(super) fn train_step(
    a: &Assumptions,
    on: On,
    m: &ModelSpec,
    t: &Trainer,
    global: Option<u64>,
    steps_per_rollout: u64,
    critic: bool,
    kl_reference: bool,
    entropy_in_loss: bool,
    lengths: Option<&super::lengths::Lengths>,
) -> (Estimate, f64, f64, Option<DataParallelReport>) {
    // The embedded trainer's `precision` is its GEMMs' (its weights stay fp32).
    let (r, rate_note) = rate_in(a, on, t.precision.value);
    // Priced at the expected sequence (a micro-batch pads to its longest, so this is low when
    // lengths vary much); memory stays at seq_len (`train_mem`).
    let seq = lengths.map_or(t.seq_len.value as f64, |l| l.sequence(t.seq_len.value));
    let micro = t.micro_batch.value.max(1);
    let global = global.unwrap_or(micro);
    let all_micros = global.div_ceil(micro);
    let micros = all_micros as f64;
    let dp = t.data_parallel.as_ref();
    let ranks = dp.map_or(1, |d| d.ranks.value.max(1));
    // The micro-batches the busiest rank trains (all of them in one process).
    let trained = super::data_parallel::micro_batches_per_rank(all_micros, ranks) as f64;
    // ZeRO-1: each rank updates the parameters it owns, 1/N of them.
    let adam_share = if dp.is_some_and(|d| d.zero.value == Zero::Optimizer) { 1.0 / ranks as f64 } else { 1.0 };
    let lora = t.lora.as_ref();
    let pass = |rows: u64, loss: bool, critic: bool| Pass {
        rows: rows as f64,
        tokens: seq,
        keys: seq,
        decode: false,
        loss,
        critic,
        lora,
        entropy_in_loss,
    };
    let fwd = forward(m, &pass(micro, true, false));
    let policy = (fwd + backward(fwd)).scale(trained);
    let no_grad = forward(m, &pass(micro, false, false)).scale(micros);
    let old = if steps_per_rollout > 1 { no_grad } else { Work::default() };
    let reference = if kl_reference { no_grad } else { Work::default() };
    let params = match lora {
        Some(lo) => model::lora_params(m, lo).other + model::lora_params(m, lo).routed,
        None => m.params as f64,
    };
    let mut adam = Work {
        flops: 0.0,
        kernels: ADAM_KERNELS_PER_TENSOR * trainable_tensors(m, lora),
        bytes: ADAM_BYTES_PER_PARAM * params,
    };
    let cp = if critic { model::critic_spec(m).params as f64 } else { 0.0 };
    let critic_work = if critic {
        let c = forward(m, &pass(micro, false, true));
        adam = adam
            + Work {
                flops: 0.0,
                kernels: ADAM_KERNELS_PER_TENSOR * trainable_tensors(m, None),
                bytes: ADAM_BYTES_PER_PARAM * cp,
            };
        // The values (PPO's targets) on the whole batch, the value loss on the rank's share.
        c.scale(micros) + (c + backward(c)).scale(trained)
    } else {
        Work::default()
    };
    let adam = adam.scale(adam_share);
    let teacher_work = t.teacher.as_ref().map_or(Work::default(), |tm| {
        forward(tm, &Pass { lora: None, entropy_in_loss: false, ..pass(micro, false, false) }).scale(micros)
    });
    let total = policy + old + reference + critic_work + teacher_work + adam;
    let exchange = dp.map(|d| super::data_parallel::exchange(a, d, params + cp, all_micros, steps_per_rollout));
    let collective_s = exchange.as_ref().map_or(0.0, |x| x.collective.seconds);
    let seconds = work_seconds(&total, &r) + collective_s;
    let critic_s = work_seconds(&critic_work, &r);
    let teacher_s = work_seconds(&teacher_work, &r);
    let mut notes = vec![
        format!(
            "{} micro-batch(es) of {} x seq {}: forward with loss + backward (2x its FLOPs, ops and bytes){}{}",
            micros,
            micro,
            if seq == t.seq_len.value as f64 {
                t.seq_len.value.to_string()
            } else {
                format!("{seq:.1} expected (memory at {})", t.seq_len.value)
            },
            if steps_per_rollout > 1 { " + the old log-probs' forward" } else { "" },
            if kl_reference { " + the KL reference's forward" } else { "" }
        ),
        format!(
            "{:.3e} matmul FLOPs, {:.0} ops, {:.1} MB written per optimizer step{}",
            total.flops,
            total.kernels,
            total.bytes / 1e6,
            if dp.is_some() { " on the busiest rank" } else { "" }
        ),
        rate_note,
    ];
    if critic {
        notes.push(format!("critic: values + value loss forward and backward: {:.3} s of the step", critic_s));
    }
    if let Some(tm) = &t.teacher {
        notes.push(format!("teacher: {} no-grad forward per micro-batch: {:.3} s of the step", tm.name, teacher_s));
    }
    if lora.is_some() {
        notes.push(
            "LoRA: adapters' thin matmuls and ops added; the frozen base's weight gradients still counted".into(),
        );
    }
    if let Some(x) = &exchange {
        notes.push(format!(
            "data-parallel: {} ranks{}, the busiest trains {} of the step's {} micro-batch(es) (ceil({} / {})); the passes before the update (old log-probs, KL reference, critic values) on the whole batch on every rank{}",
            x.ranks,
            if adam_share < 1.0 { " (ZeRO-1)" } else { "" },
            x.micro_batches_per_rank,
            x.micro_batches,
            x.micro_batches,
            x.ranks,
            if adam_share < 1.0 { "; AdamW on the 1/N of the parameters the rank owns" } else { "" }
        ));
        notes.extend(x.collective.assumptions.iter().cloned());
    }
    super::lengths::note_into(lengths, &mut notes);
    let compute = on.evidence();
    let evidence = match &exchange {
        Some(x) => Evidence::weakest([("compute", &compute), ("collectives", &x.collective.evidence)]),
        None => compute,
    };
    (Estimate { seconds, assumptions: notes, evidence }, critic_s, teacher_s, exchange)
}

/// Generating one rollout batch in the embedded engine: each prompt prefilled once, then one
/// forward over every sample per decode step (the cache repeated for the n samples). An episode
/// plays one `generate` call per turn over the episodes still going, and its later turns prefill
/// their whole context again (the embedded engine keeps no prefix cache across calls). Sampling
/// in Rust and built-in verifiers' rewards are not counted (~0).
///
/// Expected lengths (`Lengths`): prompts and contexts are priced at the recipe's means, and an
/// episode's later calls hold only the episodes expected to get there (mean_turns). A call runs
/// until its slowest row stops, a stopped row still computed (engine/tch generate.rs), so its
/// decode steps are its longest response's: the plan takes the stated mean response for it
/// (else max_new_tokens), which is right when a batch's answers end together (a trained format,
/// bench/RESULTS.md "Expected lengths in the plan") and low when one runs to max_new_tokens.
pub(super) fn rollout(
    cx: &super::Ctx,
    m: &ModelSpec,
    b: &crate::output::BatchReport,
    lora: Option<&Lora>,
) -> Option<Estimate> {
    let input = cx.input;
    let e = input.stages.iter().filter(|s| s.role == Role::Rollout).find_map(|s| s.engine.as_ref())?;
    let on = On::of(cx);
    let (r, rate_note) = rate_in(&input.assumptions, on, if e.embedded { e.precision.value } else { Precision::Fp32 });
    let lengths = super::lengths::plan_lengths(cx);
    let (prompts, samples) = (b.rollout_batch as f64, b.samples_per_rollout as f64);
    // The prompt block pads to the batch's longest prompt; priced at the expected one.
    let p = lengths.as_ref().map_or(e.prompt_len.value as f64, |l| l.prompt);
    let episode = super::episodes::plan_episodes(cx);
    // Calls (turns of the longest episode), decode tokens per call, tokens prefilled again by the
    // later calls per episode that plays them all, and the share of episodes in a later call.
    let (turns, per_turn, later_prefill, later_share) = match (&episode, lengths.as_ref()) {
        (Some(ep), l) => {
            let turns = div(ep.sampled_tokens as f64, ep.turn_tokens.max(1) as f64).max(1.0);
            let (share, ratio) = l.map_or((1.0, 1.0), |l| l.later_turns(turns));
            let later = ep.prefill_retokenize.saturating_sub(ep.prompt_tokens) as f64 * ratio;
            (turns, ep.turn_tokens as f64, later, share)
        }
        (None, _) => (1.0, e.response_len.value as f64, 0.0, 1.0),
    };
    let pass = |rows: f64, tokens: f64, keys: f64, decode: bool| Pass {
        rows,
        tokens,
        keys,
        decode,
        loss: false,
        critic: false,
        lora,
        entropy_in_loss: false,
    };
    let mut work = forward(m, &pass(prompts, p, p, false));
    let later_rows = samples * later_share;
    if later_prefill > 0.0 && turns > 1.0 {
        // Later turns: every playing episode's context so far, in (turns - 1) calls.
        let per_call = later_prefill / (turns - 1.0);
        work = work + forward(m, &pass(later_rows, per_call, per_call, false)).scale(turns - 1.0);
    }
    // The first token comes from the prefill; each later one needs a decode step, up to the
    // call's longest response, taken at the expected one.
    let response = lengths.as_ref().map_or(per_turn, |l| l.response);
    let steps = (response - 1.0).max(0.0);
    let context = p + later_prefill / turns.max(1.0) + response / 2.0;
    work = work + forward(m, &pass(samples, 1.0, context, true)).scale(steps);
    if turns > 1.0 {
        work = work + forward(m, &pass(later_rows, 1.0, context, true)).scale(steps * (turns - 1.0));
    }
    // Each call samples its prefill's token and one per decode step, each a read of the logits
    // back to the host on a GPU (`Rate::sync_s`, 0 on the CPU).
    let sampled = (steps + 1.0) * turns;
    let seconds = work_seconds(&work, &r) + sampled * r.sync_s;
    let mut assumptions = vec![
        format!(
            "embedded engine: {} prompts prefilled ({} tokens), {} samples x {} decode steps of one token{}",
            b.rollout_batch,
            if lengths.as_ref().is_some_and(|l| l.prompt_stated) { format!("{p:.1} expected") } else { e.prompt_len.value.to_string() },
            b.samples_per_rollout,
            if lengths.as_ref().is_some_and(|l| l.response_stated) { format!("{steps:.1} expected") } else { steps.to_string() },
            if turns > 1.0 {
                format!(
                    " per turn, {} turns (each later turn's context prefilled again{})",
                    turns,
                    if later_share < 1.0 { format!("; {:.0}% of the episodes play each later turn", later_share * 100.0) } else { String::new() }
                )
            } else {
                String::new()
            }
        ),
        format!(
            "{:.3e} matmul FLOPs, {:.0} ops, {:.1} MB written; a call decodes until its slowest sample stops (stopped rows still computed), {}; sampling and built-in rewards not counted",
            work.flops,
            work.kernels,
            work.bytes / 1e6,
            if lengths.as_ref().is_some_and(|l| l.response_stated) {
                "taken at the expected response (low if one runs to max_new_tokens)"
            } else {
                "every response full length"
            }
        ),
        rate_note,
    ];
    if r.sync_s > 0.0 {
        assumptions.push(format!(
            "{sampled:.0} sampling steps (each call's prefill and decode steps), each a device-to-host read of the logits: {:.1} ms of the rollout",
            sampled * r.sync_s * 1e3
        ));
    }
    super::lengths::note_into(lengths.as_ref(), &mut assumptions);
    Some(Estimate { seconds, assumptions, evidence: on.evidence() })
}

/// The local handoff in the embedded process: each tensor of the update (the weights, or the
/// adapters under LoRA) copied into the engine's, read + write at the host's memory bandwidth
/// (on a GPU: device to device at its HBM's, `embedded_gpu_bandwidth_efficiency` of it), one op
/// per tensor.
pub(super) fn sync(
    a: &Assumptions,
    on: On,
    host: &HostSpec,
    m: &ModelSpec,
    lora: Option<&Lora>,
    bytes: f64,
) -> Estimate {
    let tensors = trainable_tensors(m, lora);
    let (bw, kernel_s, path, source) = match on {
        On::Cpu => (host.memory_bandwidth, a.embedded_kernel_s, String::new(), String::new()),
        On::Gpu(g) => (
            g.peaks.hbm * a.embedded_gpu_bandwidth_efficiency,
            a.embedded_gpu_kernel_s,
            format!(" device to device on {}", g.name),
            format!(" ({}, {}; not measured)", g.hbm_note(a), g.source()),
        ),
    };
    let seconds = div(2.0 * bytes, bw) + tensors * kernel_s;
    Estimate {
        seconds,
        assumptions: vec![format!(
            "local handoff: {:.2} MB in {:.0} tensors copied{path} (read + write) at {:.0} GB/s{source}, {:.0} us per copy",
            bytes / 1e6,
            tensors,
            bw / 1e9,
            kernel_s * 1e6
        )], evidence: on.evidence() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{work_seconds, Rate};

    /// A 1-layer model: d 4, one head of 4, MLP 8, vocab 10, 100 active parameters.
    fn tiny() -> ModelSpec {
        ModelSpec {
            name: "tiny".into(),
            params: 100,
            active_params: 100,
            layers: 1,
            dense_layers: 1,
            hidden_size: 4,
            heads: 1,
            kv_heads: 1,
            head_dim: 4,
            vocab: 10,
            intermediate_size: Some(8),
            tied_embeddings: Some(true),
            ..crate::fixtures::glm5()
        }
    }

    #[test]
    fn tiny_forward_by_hand() {
        let m = tiny();
        let p = Pass {
            rows: 1.0,
            tokens: 2.0,
            keys: 2.0,
            decode: false,
            loss: false,
            critic: false,
            lora: None,
            entropy_in_loss: false,
        };
        let w = forward(&m, &p);
        // FLOPs per token: 2 x 100 + attention 4 x 1 layer x 2 keys x q 4 = 232; 2 tokens.
        assert_eq!(w.flops, 464.0);
        // Ops: one layer's 25 + the head's 11.
        assert_eq!(w.kernels, 36.0);
        // Elements per token: layer 6d + 5q + 4kv + 4f + 2 H S = 24 + 20 + 16 + 32 + 4 = 96,
        // head 3d + vocab = 22: 118 x 2 tokens x 4 B.
        assert_eq!(w.bytes, 944.0);
        // At 1 GFLOP/s, 5 us per op, 1 GB/s: 464 ns + 180 us + 944 ns.
        let r = Rate { flops_per_s: 1e9, kernel_s: 5e-6, bytes_per_s: 1e9, sync_s: 0.0 };
        assert!((work_seconds(&w, &r) - (464e-9 + 180e-6 + 944e-9)).abs() < 1e-15);
        // A backward pass doubles all three.
        assert_eq!(backward(w), w.scale(2.0));
    }

    /// A dense 8B decoder (Qwen3-8B's shape).
    fn dense_8b() -> ModelSpec {
        ModelSpec {
            name: "8b".into(),
            params: 8_200_000_000,
            active_params: 8_200_000_000,
            layers: 36,
            dense_layers: 36,
            hidden_size: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            vocab: 151_936,
            experts: 0,
            top_k: 0,
            attention: Attention::Gqa,
            kv_lora_rank: None,
            qk_rope_head_dim: None,
            intermediate_size: Some(12_288),
            tied_embeddings: Some(false),
            ..crate::fixtures::glm5()
        }
    }

    /// The three terms of `work_seconds` apart: FLOPs, ops, bytes.
    fn terms(w: &Work, r: &Rate) -> (f64, f64, f64) {
        (w.flops / r.flops_per_s, w.kernels * r.kernel_s, w.bytes / r.bytes_per_s)
    }

    fn h200() -> Gpu {
        Gpu::new(&MachineGpu { index: 0, name: "NVIDIA H200".into(), memory: 150_121_545_728, sm: "sm_90".into() })
    }

    /// The same counts priced on a GPU: a tiny model's pass is its ops' launches, an 8B model's
    /// training pass its matmuls (bf16 tensor cores or fp32 without them).
    #[test]
    fn on_a_gpu_a_small_model_is_launch_bound_and_a_large_one_flop_bound() {
        let a = Assumptions::default();
        let g = h200();
        let pass = |rows: f64, tokens: f64, loss: bool| Pass {
            rows,
            tokens,
            keys: tokens,
            decode: false,
            loss,
            critic: false,
            lora: None,
            entropy_in_loss: false,
        };
        for p in [Precision::Bf16, Precision::Fp32] {
            let (r, note) = rate_in(&a, On::Gpu(&g), p);
            assert!(note.contains("NVIDIA H200 (H200 SXM datasheet, dense)"), "{note}");
            let small = forward(&tiny(), &pass(32.0, 16.0, true));
            let (f, k, b) = terms(&small, &r);
            assert!(k > 100.0 * (f + b), "{p:?}: flops {f:e} s, ops {k:e} s, bytes {b:e} s");
            let w = forward(&dense_8b(), &pass(4.0, 2048.0, true));
            let large = w + backward(w);
            let (f, k, b) = terms(&large, &r);
            assert!(f > 2.0 * (k + b), "{p:?}: flops {f:e} s, ops {k:e} s, bytes {b:e} s");
        }
        // bf16 GEMMs run at the tensor cores' peak, fp32 ones at the fp32 peak: ~15x apart.
        let bf16 = rate_in(&a, On::Gpu(&g), Precision::Bf16).0;
        let fp32 = rate_in(&a, On::Gpu(&g), Precision::Fp32).0;
        assert!((bf16.flops_per_s / fp32.flops_per_s - 989.5 / 67.0).abs() < 1e-9);
        // The CPU's rate is unchanged by the GPU's: no logits to read back.
        assert_eq!(rate_in(&a, On::Cpu, Precision::Fp32).0, rate(&a));
        assert_eq!(rate(&a).sync_s, 0.0);
    }

    /// The GPU's launch cost is its own assumption: the same ops cost 10 us each there, 5 us on
    /// one CPU thread, and a decode step's logits read back adds `embedded_gpu_sync_s`.
    #[test]
    fn gpu_rates_are_the_assumptions_they_name() {
        let a = Assumptions::default();
        let g = h200();
        let (r, _) = rate_in(&a, On::Gpu(&g), Precision::Bf16);
        assert_eq!((r.kernel_s, r.sync_s), (a.embedded_gpu_kernel_s, a.embedded_gpu_sync_s));
        assert_eq!(rate_in(&a, On::Cpu, Precision::Bf16).0.kernel_s, a.embedded_kernel_s);
        let host = HostSpec { name: "host".into(), cpus: 16, memory: 64 << 30, memory_bandwidth: 50e9, fp32: None };
        let cpu = sync(&a, On::Cpu, &host, &tiny(), None, 1e9);
        let gpu = sync(&a, On::Gpu(&g), &host, &tiny(), None, 1e9);
        assert!(gpu.seconds < cpu.seconds / 10.0, "{} vs {}", gpu.seconds, cpu.seconds);
        assert!(gpu.assumptions[0].contains("device to device on NVIDIA H200"), "{:?}", gpu.assumptions);
    }
}
