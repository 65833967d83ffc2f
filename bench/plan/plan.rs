//! Planning time against cluster size: `cargo bench -p miles-plan --bench plan`.
//!
//! The worst case for the planner is a cluster listed node by node (one pool per node, as a
//! heterogeneous inventory would be), so that is what this measures: 1k, 10k and 100k GPUs of
//! GB300 (4 per node), GLM-5.2 rollout on half, training on the other half, p2p sync. Rendering
//! text and JSON is timed too; HTML draws at most 4096 cells, so it is bounded separately.

use miles_plan::*;
use std::hint::black_box;
use std::time::Instant;

fn input(gpus: u64) -> PlanInput {
    let nodes = gpus / 4;
    let half = gpus / 2;
    PlanInput {
        recipe: "bench".into(),
        cluster: Cluster {
            name: "fleet".into(),
            pools: (0..nodes).map(|_| NodePool { gpu: fixtures::gb300(), nodes: Spanned::new(1) }).collect(),
            host: None,
            span: None,
        },
        stages: vec![
            Stage {
                teacher: None,
                name: "rollout".into(),
                kind: "generate".into(),
                role: Role::Rollout,
                model: Some(fixtures::glm5()),
                gpus: Some(Spanned::new(GpuRequest::Count(half))),
                engine: Some(Engine {
                    engines: None,
                    tp: Spanned::new(8),
                    dp: Spanned::new(1),
                    ep: Spanned::new(1),
                    precision: Spanned::new(Precision::Fp8Blockwise),
                    embedded: false,
                    kv_precision: None,
                    mem_fraction: Spanned::new(0.85),
                    max_concurrent: None,
                    prefix_cache_hit: None,
                    prompt_len: Spanned::new(8192),
                    response_len: Spanned::new(24576),
                }),
                trainer: None,
                span: None,
            },
            Stage {
                teacher: None,
                name: "train".into(),
                kind: "grpo".into(),
                role: Role::Train,
                model: Some(fixtures::glm5()),
                gpus: None,
                engine: None,
                trainer: Some(Trainer {
                    backend: Spanned::new(Backend::Megatron),
                    tp: Spanned::new(2),
                    pp: Spanned::new(4),
                    cp: Spanned::new(4),
                    ep: Spanned::new(8),
                    dp: None,
                    precision: Spanned::new(Precision::Bf16),
                    micro_batch: Spanned::new(1),
                    seq_len: Spanned::new(32768),
                    recompute: Spanned::new(Recompute::Full),
                    optimizer_offload: Spanned::new(OptimizerOffload::StreamFromDisk),
                    lora: None,
                    teacher: None,
                    teacher_process: false,
                    data_parallel: None,
                }),
                span: None,
            },
        ],
        graph: Graph::default(),
        placement: Placement::default(),
        syncs: vec![WeightSync {
            name: "sync".into(),
            from: "train".into(),
            to: "rollout".into(),
            transport: Spanned::new(Transport::P2p),
            channel: Default::default(),
            bucket: Spanned::new(1_000_000_000),
            span: None,
        }],
        schedule: Schedule {
            mode: Spanned::new(ScheduleMode::FullyAsync),
            max_staleness: Some(Spanned::new(4)),
            buffer_capacity: None,
            max_concurrent: None,
            dynamic_rounds: None,
        },
        batch: Batch {
            rollout_batch: Some(Spanned::new(64)),
            samples_per_prompt: Some(Spanned::new(8)),
            global_batch: Some(Spanned::new(512)),
            steps_per_rollout: None,
            epochs: None,
        },
        r3: Spanned::new(false),
        r3_id_bytes: None,
        episodes: None,
        context_cap: None,
        assumptions: Assumptions::default(),
        device: None,
        models: Vec::new(),
    }
}

/// Median of `runs` timings, in seconds.
fn median(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    println!("{:>8} {:>7} {:>12} {:>12} {:>12}", "GPUs", "pools", "plan", "text+json", "html");
    for gpus in [1_000u64, 10_000, 100_000] {
        let inp = input(gpus);
        let p = plan(&inp);
        assert_eq!(p.summary.errors, 0, "{}", render_text(&p));
        let runs = if gpus >= 100_000 { 11 } else { 31 };
        let tp = median(runs, || {
            black_box(plan(black_box(&inp)));
        });
        let tr = median(runs, || {
            black_box(render_text(&p));
            black_box(render_json(&p));
        });
        let th = median(runs, || {
            black_box(render_html(&p));
        });
        println!(
            "{:>8} {:>7} {:>9.3} ms {:>9.3} ms {:>9.3} ms",
            gpus,
            inp.cluster.pools.len(),
            tp * 1e3,
            tr * 1e3,
            th * 1e3
        );
    }
}
