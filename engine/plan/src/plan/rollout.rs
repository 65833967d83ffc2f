//! A rollout stage: weights and KV cache per GPU (E0402), concurrency (E0407), decode throughput
//! and the time to generate one rollout batch.

use super::episodes::plan_episodes;
use super::lengths::{self, Lengths};
use super::placement::Placed;
use super::trainer::{peak_flops, tp_domain_warning};
use super::Ctx;
use crate::evidence::{sources, Evidence};
use crate::input::*;
use crate::model::{self, div};
use crate::output::*;
use crate::time::{self, DecodeShape};
use crate::units::gb_fixed;
use miles_grammar::diag::ErrorCode;

pub(super) fn plan_engine(
    cx: &mut Ctx,
    st: &Stage,
    e: &Engine,
    pl: &Placed,
    engines: u64,
    batch: Option<&BatchReport>,
    memory: &mut Vec<MemoryReport>,
) -> Option<RolloutReport> {
    let m = st.model.as_ref()?;
    let a = cx.input.assumptions.clone();
    let gpus = pl.gpus();
    if pl.placed == Where::Host || gpus == 0 || !engines_fit(cx, st, e, engines, gpus) {
        return None;
    }
    let g = cx.device(&pl.ranges)?;
    let kv = KvCache::size(m, e, g);
    tp_domain_warning(cx, st, "engine", e.tp.value, e.tp.span, g, gpus);
    check_kv_cache(cx, st, e, m, g, &kv, gpus);
    let demand = demand(cx, st, e, batch, engines, &kv);
    memory.push(kv.memory_report(st, e, g));
    // Time at the expected lengths when the recipe states them (the KV cache above is sized for
    // the bounds).
    let lengths = lengths::plan_lengths(cx);
    let decode = Decode::at(&a, m, e, g, &kv, demand, engines, lengths.as_ref());
    let rollout_time = rollout_time(cx, &a, m, e, g, gpus, engines, batch, &decode, lengths.as_ref());
    Some(RolloutReport {
        stage: st.name.clone(),
        engines,
        gpus_per_engine: e.tp.value,
        weights_per_gpu: kv.weights as u64,
        kv_bytes_per_gpu: kv.kv.max(0.0) as u64,
        kv_bytes_per_token: kv.per_token as u64,
        kv_tokens_per_engine: kv.tokens as u64,
        sequences_per_engine: kv.sequences,
        requested_concurrent: e.max_concurrent.map(|m| m.value),
        decode_batch: decode.batch,
        tokens_per_s: decode.tokens_per_s,
        rollout_time,
        throttle: None,
    })
}

/// Whether `engines` engines of TP GPUs fit in the stage's `gpus` (E0404 when not).
fn engines_fit(cx: &mut Ctx, st: &Stage, e: &Engine, engines: u64, gpus: u64) -> bool {
    let tp = e.tp.value;
    if engines.saturating_mul(tp) > gpus || engines == 0 {
        cx.error(
            ErrorCode::E0404,
            format!(
                "{}: {engines} engines x TP{tp} need {} GPUs, the stage has {gpus}",
                st.name,
                engines.saturating_mul(tp)
            ),
            e.engines.and_then(|n| n.span).or(st.span),
            "engines do not fit the GPUs",
            None,
        );
        return false;
    }
    true
}

/// One engine GPU's memory: the weights, and the KV cache in what `mem_fraction` leaves.
struct KvCache {
    weights: f64,
    /// HBM the engine may use: weights plus KV cache.
    budget: f64,
    /// Bytes left for the KV cache (negative: the weights do not fit).
    kv: f64,
    /// GPUs sharing one attention head group's KV (TP / DP-attention).
    group: u64,
    latent_per_token: f64,
    indexer_per_token: f64,
    per_token: f64,
    /// Tokens the engine's KV cache holds.
    tokens: f64,
    /// Tokens per sequence: prompt + response.
    seq: u64,
    /// Whole sequences the KV cache holds.
    sequences: u64,
    fits: bool,
}

impl KvCache {
    fn size(m: &ModelSpec, e: &Engine, g: &GpuSpec) -> KvCache {
        let (tp, dp) = (e.tp.value, e.dp.value);
        let p = e.precision.value;
        let kvp = e.kv_precision.map_or(Precision::Bf16, |k| k.value);
        let weights = model::rollout_weight_bytes(m, tp, dp, p);
        let budget = g.hbm as f64 * e.mem_fraction.value;
        let kv = budget - weights;
        let group = (tp / dp).max(1);
        // DSA's indexer keys sit in the KV cache beside the latent.
        let latent_per_token = model::kv_bytes_per_token(m, group, kvp);
        let indexer_per_token = model::indexer_bytes_per_token(m);
        let per_token = latent_per_token + indexer_per_token;
        let tokens = if kv > 0.0 { (dp as f64 * div(kv, per_token)).floor() } else { 0.0 };
        let seq = e.prompt_len.value.saturating_add(e.response_len.value);
        let sequences = if seq == 0 { 0 } else { (tokens / seq as f64) as u64 };
        KvCache {
            weights,
            budget,
            kv,
            group,
            latent_per_token,
            indexer_per_token,
            per_token,
            tokens,
            seq,
            sequences,
            fits: kv > 0.0 && sequences > 0,
        }
    }

    fn memory_report(&self, st: &Stage, e: &Engine, g: &GpuSpec) -> MemoryReport {
        let (tp, dp) = (e.tp.value, e.dp.value);
        MemoryReport {
            stage: st.name.clone(),
            role: st.role,
            device: g.name.clone(),
            capacity: g.hbm,
            usable: self.budget as u64,
            items: vec![
                MemItem {
                    name: "weights".into(),
                    bytes: self.weights as u64,
                    note: format!(
                        "{} on TP{tp}{}",
                        e.precision.value.as_str(),
                        if dp > 1 { format!(" (DP-attention {dp})") } else { String::new() }
                    ),
                },
                MemItem {
                    name: "kv_cache".into(),
                    bytes: self.kv.max(0.0) as u64,
                    note: format!(
                        "{} tokens per engine at {} B/token/GPU",
                        crate::units::count(self.tokens as u64),
                        self.per_token
                    ),
                },
            ],
            total: (self.weights + self.kv.max(0.0)) as u64,
            fits: self.fits,
            offload: None,
            lora: None,
            ranks: None,
        }
    }
}

/// E0402 when the weights leave no room for the KV cache (with the fixes that would), or the KV
/// cache holds not one sequence.
fn check_kv_cache(cx: &mut Ctx, st: &Stage, e: &Engine, m: &ModelSpec, g: &GpuSpec, kv: &KvCache, gpus: u64) {
    let (tp, dp) = (e.tp.value, e.dp.value);
    let p = e.precision.value;
    if kv.kv <= 0.0 {
        let mut fixes = Vec::new();
        let mut t2 = tp * 2;
        while t2 <= 64 * tp && t2 <= gpus {
            if model::rollout_weight_bytes(m, t2, dp, p) < 0.8 * kv.budget {
                fixes.push(format!("TP{t2} engines"));
                break;
            }
            t2 *= 2;
        }
        if p.bytes() > 1.1 && g.fp8.is_some() {
            fixes.push(format!(
                "`precision = fp8_blockwise` ({} per GPU)",
                gb_fixed(model::rollout_weight_bytes(m, tp, dp, Precision::Fp8Blockwise))
            ));
        }
        if e.mem_fraction.value < 0.9 {
            fixes.push("a larger `mem_fraction`".into());
        }
        cx.error(
            ErrorCode::E0402,
            format!(
                "{}: weights take {} per GPU, more than the engine's {} ({} x mem_fraction {})",
                st.name,
                gb_fixed(kv.weights),
                gb_fixed(kv.budget),
                gb_fixed(g.hbm as f64),
                e.mem_fraction.value
            ),
            e.tp.span.or(st.span),
            "no room left for the KV cache",
            Some(format!("fixes: {}", if fixes.is_empty() { "more GPUs per engine".into() } else { fixes.join("; ") })),
        );
    } else if kv.sequences == 0 {
        cx.error(
            ErrorCode::E0402,
            format!(
                "{}: the KV cache holds {} tokens per engine, one sequence of {} + {} tokens does not fit",
                st.name, kv.tokens, e.prompt_len.value, e.response_len.value
            ),
            e.response_len.span.or(st.span),
            "sequence too long for the KV cache",
            Some("fixes: larger TP, `kv_precision = fp8_blockwise`, shorter responses".into()),
        );
    }
}

/// Requests an engine actually has in flight: its share of the rollout batch (or of the
/// schedule's samples in flight), at most what the recipe allows per engine (E0407 when that is
/// more than the KV cache holds).
fn demand(
    cx: &mut Ctx,
    st: &Stage,
    e: &Engine,
    batch: Option<&BatchReport>,
    engines: u64,
    kv: &KvCache,
) -> Option<u64> {
    let in_flight = in_flight_per_engine(cx.input, batch, engines);
    let demand = match (e.max_concurrent.map(|m| m.value), in_flight) {
        (Some(mc), Some(f)) => Some(mc.min(f)),
        (mc, f) => mc.or(f),
    };
    if let (Some(mc), Some(want)) = (e.max_concurrent, demand) {
        if kv.fits && want > kv.sequences {
            cx.warning(
                ErrorCode::E0407,
                format!(
                    "{}: {} concurrent requests per engine, the KV cache holds {} sequences of {} tokens",
                    st.name, want, kv.sequences, kv.seq
                ),
                mc.span.or(st.span),
                "requests beyond this wait or are retracted",
                Some("larger TP or fewer concurrent requests; shorter prompts with prefix caching help too".into()),
            );
        }
    }
    demand
}

/// Decode throughput: the sequences an engine decodes together and the time of one step.
struct Decode {
    batch: u64,
    /// Seconds per decode step.
    step_s: f64,
    /// Tokens per second of the whole fleet.
    fleet_tps: f64,
    tokens_per_s: Rate,
}

impl Decode {
    /// Decode at the batch the KV cache allows (or the recipe asks for, if smaller).
    #[allow(clippy::too_many_arguments)]
    fn at(
        a: &Assumptions,
        m: &ModelSpec,
        e: &Engine,
        g: &GpuSpec,
        kv: &KvCache,
        demand: Option<u64>,
        engines: u64,
        lengths: Option<&Lengths>,
    ) -> Decode {
        let (tp, dp) = (e.tp.value, e.dp.value);
        let p = e.precision.value;
        let decode_batch = demand.map_or(kv.sequences, |d| d.min(kv.sequences));
        let split = model::param_split(m);
        // The average context of a decoding sequence, at the expected lengths when stated.
        let seq_max = e.prompt_len.value.saturating_add(e.response_len.value);
        let ctx_avg = match lengths.filter(|l| l.stated()) {
            Some(l) => l.prompt + (l.sequence(seq_max) - l.prompt) / 2.0,
            None => e.prompt_len.value as f64 + e.response_len.value as f64 / 2.0,
        };
        // Sparse attention reads the latent of its top-k tokens, and every indexer key to pick them.
        let attended = m.sparse_topk.map_or(ctx_avg, |k| ctx_avg.min(k as f64));
        let kv_read_per_sequence = attended * kv.latent_per_token + ctx_avg * kv.indexer_per_token;
        let d = DecodeShape {
            batch: decode_batch as f64,
            dense_weight_bytes: div(split.other, kv.group as f64) * p.bytes(),
            expert_weight_bytes: div(split.routed, tp as f64) * p.bytes(),
            experts_touched: model::experts_touched(m, decode_batch),
            kv_read_bytes: div(decode_batch as f64, dp as f64) * kv_read_per_sequence,
            hbm_bw: g.hbm_bandwidth,
            bw_efficiency: a.decode_bandwidth_efficiency,
            flops: div(2.0 * m.active_params as f64 * decode_batch as f64, tp as f64),
            peak_flops: peak_flops(g, p),
            mfu: a.decode_mfu,
        };
        let (step_s, compute_bound) = time::decode_step_s(&d);
        let engine_tps = div(decode_batch as f64, step_s);
        let fleet_tps = engine_tps * engines as f64;
        let tokens_per_s = Rate {
            per_s: fleet_tps,
            assumptions: vec![
                match m.sparse_topk {
                    Some(k) => format!(
                        "{} sequences per engine decode together, average context {:.0} tokens; sparse attention reads {} of them (+ indexer keys)",
                        decode_batch, ctx_avg, attended.min(k as f64)
                    ),
                    None => format!("{} sequences per engine decode together, average context {:.0} tokens", decode_batch, ctx_avg),
                },
                format!(
                    "a step reads {} of weights ({:.0}% of experts touched) + {} of KV per GPU",
                    gb_fixed(d.dense_weight_bytes + d.expert_weight_bytes * d.experts_touched),
                    d.experts_touched * 100.0,
                    gb_fixed(d.kv_read_bytes)
                ),
                format!(
                    "{} HBM {:.1} TB/s x {:.0}%; {}",
                    g.name,
                    g.hbm_bandwidth / 1e12,
                    a.decode_bandwidth_efficiency * 100.0,
                    if compute_bound { "compute-bound" } else { "bandwidth-bound" }
                ),
                format!("{:.1} ms per step, {:.0} tokens/s per engine x {} engines", step_s * 1e3, engine_tps, engines),
            ], evidence: Evidence::assumed(sources::DECODE) };
        Decode { batch: decode_batch, step_s, fleet_tps, tokens_per_s }
    }
}

/// Tokens one sample decodes and prefills. An episode decodes only its turns and prefills its
/// prompt and observations once (TITO keeps the prefix cache valid); the environment's own time
/// is not modelled.
struct PerSample {
    episode: Option<EpisodeReport>,
    /// Share of prompt tokens found in the prefix cache, when the recipe gives one.
    hit: Option<f64>,
    /// Expected over longest prompt (1 without stated lengths).
    p_ratio: f64,
    /// Tokens decoded at the bounds (what a wave waits for).
    decoded: u64,
    prefilled: u64,
    /// Expected over bound sampled tokens (1 without stated lengths).
    sampled_ratio: f64,
    decoded_mean: f64,
}

impl PerSample {
    fn of(cx: &Ctx, e: &Engine, lengths: Option<&Lengths>) -> PerSample {
        let episode = plan_episodes(cx);
        // A prefix-cache hit rate, when the recipe gives one, applies to every prompt token a
        // request carries (a turn's prompt is the whole context so far); else each context is
        // prefilled once.
        let hit = e.prefix_cache_hit.map(|h| h.value.clamp(0.0, 1.0));
        // Prefill at the expected lengths: the prompt, and an episode's later turns for the share
        // of episodes expected to play them, at the expected contexts (`Lengths::later_turns`).
        let (p_exp, p_max) = lengths.map_or((1.0, 1.0), |l| (l.prompt, l.max_prompt));
        let p_ratio = if lengths.is_some_and(|l| l.stated()) { model::div(p_exp, p_max) } else { 1.0 };
        let prefill_of = |total: u64, prompt: u64, turns: f64| {
            let (share, ratio) = lengths.map_or((1.0, 1.0), |l| l.later_turns(turns));
            prompt as f64 * p_ratio + total.saturating_sub(prompt) as f64 * share * ratio
        };
        let (decoded, prefilled) = match (&episode, hit) {
            (Some(ep), h) => {
                let turns = model::div(ep.sampled_tokens as f64, ep.turn_tokens.max(1) as f64).max(1.0);
                let prefilled = match h {
                    Some(h) => (1.0 - h) * prefill_of(ep.prefill_retokenize, ep.prompt_tokens, turns),
                    // With TITO a later turn prefills its observation alone: the share of episodes.
                    None => {
                        let share = lengths.map_or(1.0, |l| l.later_turns(turns).0);
                        ep.prompt_tokens as f64 * p_ratio
                            + ep.prefill_tito.saturating_sub(ep.prompt_tokens) as f64 * share
                    }
                };
                (ep.sampled_tokens, prefilled.round() as u64)
            }
            (None, Some(h)) => (e.response_len.value, ((1.0 - h) * e.prompt_len.value as f64 * p_ratio).round() as u64),
            (None, None) => (e.response_len.value, (e.prompt_len.value as f64 * p_ratio).round() as u64),
        };
        // Tokens decoded per sample at the expected lengths (the bound, `decoded`, still sets how
        // long a wave waits for its slowest sample).
        let sampled_ratio = lengths.filter(|l| l.stated()).map_or(1.0, Lengths::sampled_ratio);
        let decoded_mean = decoded as f64 * sampled_ratio;
        PerSample { episode, hit, p_ratio, decoded, prefilled, sampled_ratio, decoded_mean }
    }
}

/// The time to generate one rollout batch: decode at the fleet's throughput (or, unless
/// fully_async refills slots, the waves' longest samples) plus the prefill.
#[allow(clippy::too_many_arguments)]
fn rollout_time(
    cx: &Ctx,
    a: &Assumptions,
    m: &ModelSpec,
    e: &Engine,
    g: &GpuSpec,
    gpus: u64,
    engines: u64,
    batch: Option<&BatchReport>,
    decode: &Decode,
    lengths: Option<&Lengths>,
) -> Option<Estimate> {
    let s = PerSample::of(cx, e, lengths);
    let (decoded, prefilled, step_s) = (s.decoded, s.prefilled, decode.step_s);
    batch.filter(|_| decode.batch > 0).map(|b| {
        let samples = b.samples_per_rollout as f64;
        let gen = samples * s.decoded_mean;
        let prefill = div(
            samples * prefilled as f64 * 2.0 * m.active_params as f64,
            gpus as f64 * peak_flops(g, e.precision.value) * a.train_mfu,
        );
        let waves = div(samples, (decode.batch * engines) as f64).ceil().max(1.0);
        // A batch generated in waves waits for each wave's last sample; fully_async refills a
        // slot as soon as a sample ends, so only throughput bounds it.
        let refilled = cx.input.schedule.mode.value == ScheduleMode::FullyAsync;
        let latency = if refilled { 0.0 } else { waves * decoded as f64 * step_s };
        let expected = if s.sampled_ratio < 1.0 { format!(", {:.0} expected", s.decoded_mean) } else { String::new() };
        let what = match &s.episode {
            Some(ep) => format!(
                "{} episodes x {} sampled tokens ({} turns of {}{expected}); environment time not counted",
                b.samples_per_rollout, decoded, ep.max_turns, ep.turn_tokens
            ),
            None => format!("{} samples x {} response tokens{expected}", b.samples_per_rollout, decoded),
        };
        let mut est = Estimate {
            seconds: div(gen, decode.fleet_tps).max(latency) + prefill,
            assumptions: vec![
                what,
                if refilled {
                    format!(
                        "slots refilled per sample (fully_async): throughput-bound, {:.1} ms per decode step",
                        step_s * 1e3
                    )
                } else {
                    format!("at least {} wave(s) of {} decode steps of {:.1} ms", waves, decoded, step_s * 1e3)
                },
                format!(
                    "prefill {} tokens per sample{} in {:.1} s at MFU {:.0}%; {}",
                    crate::units::count(prefilled),
                    s.hit.map_or(String::new(), |h| format!(" ({:.0}% prefix-cache hits)", h * 100.0)),
                    prefill,
                    a.train_mfu * 100.0,
                    if s.sampled_ratio < 1.0 || s.p_ratio < 1.0 {
                        "throughput at the expected lengths, a wave's wait at the longest response"
                    } else {
                        "every response assumed full length"
                    }
                ),
            ],
            evidence: Evidence::assumed(sources::DECODE),
        };
        lengths::note_into(lengths, &mut est.assumptions);
        est
    })
}

/// Samples one engine has in flight: the rollout batch (sync, one_step_off) or the schedule's
/// `max_concurrent` (fully_async, refilled per sample), spread evenly over the engines.
pub(super) fn in_flight_per_engine(input: &PlanInput, batch: Option<&BatchReport>, engines: u64) -> Option<u64> {
    let samples = batch.map(|b| b.samples_per_rollout);
    let fleet = match (input.schedule.mode.value, input.schedule.max_concurrent) {
        (ScheduleMode::FullyAsync, Some(mc)) => Some(mc.value),
        _ => samples,
    }?;
    Some(fleet.div_ceil(engines.max(1)))
}
