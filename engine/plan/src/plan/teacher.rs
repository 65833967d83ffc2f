//! On-policy distillation's teacher stage on GPUs of its own (`teacher_logprobs(model, rollout)
//! { gpus = N }`, disaggregated): its weights sharded over its N GPUs (TP N), one no-grad forward
//! over every token the trainer trains on each step, on its own pool (docs/plan.md, "On-policy
//! distillation: the teacher"). Without `gpus` the teacher is planned with the trainer it feeds.

use super::placement::Placed;
use super::trainer::peak_flops;
use super::Ctx;
use crate::input::*;
use crate::model::{self, div, Layout};
use crate::output::*;
use crate::time;
use crate::units::{gb_fixed, params as param_count};
use miles_grammar::diag::Diagnostic;
use miles_grammar::diag::ErrorCode;

/// The teacher's memory per GPU (into `memory`) and its seconds per optimizer step.
pub(super) fn plan_teacher(
    cx: &mut Ctx,
    st: &Stage,
    job: &TeacherJob,
    pl: &Placed,
    batch: Option<&BatchReport>,
    memory: &mut Vec<MemoryReport>,
) -> Option<f64> {
    let tm = st.model.as_ref()?;
    let gpus = pl.gpus().max(1);
    let g = cx.device(&pl.ranges)?;
    let a = &cx.input.assumptions;
    let l = Layout { backend: Backend::Megatron, tp: gpus, pp: 1, cp: 1, ep: 1, dp: 1, precision: job.precision };
    let weights = model::teacher_weight_bytes(tm, &l, false);
    let activations = model::teacher_activation_bytes(tm, &l, job.seq_len, job.micro_batch);
    let (capacity, usable) = (g.hbm, g.hbm as f64 * a.usable_hbm);
    let total = weights + activations;
    let items = vec![
        MemItem {
            name: "teacher_weights".into(),
            bytes: weights as u64,
            note: format!(
                "OPD teacher {}, {} params, {} x {} B, TP{gpus} over its own GPUs: frozen, no gradients, no optimizer state",
                tm.name,
                param_count(tm.params),
                l.precision.as_str(),
                l.precision.bytes()
            ),
        },
        MemItem {
            name: "teacher_activations".into(),
            bytes: activations as u64,
            note: format!(
                "no-grad forward: one layer + FP32 logits and log-softmax, seq {} x micro-batch {}, / TP{gpus}",
                job.seq_len, job.micro_batch
            ),
        },
    ];
    let fits = total <= usable;
    if !fits {
        let mut d = Diagnostic::error(
            ErrorCode::E0401,
            format!(
                "{} does not fit in GPU memory: {} per GPU, {} has {} usable; over by {}",
                st.name,
                gb_fixed(total),
                g.name,
                gb_fixed(usable),
                gb_fixed(total - usable)
            ),
        )
        .with_help(format!("give the teacher more GPUs (gpus = {}), or a smaller teacher", gpus * 2));
        if let Some(sp) = st.span {
            d = d.with_primary(sp, format!("needs {} per GPU", gb_fixed(total)));
        }
        cx.diags.push(d);
    }
    memory.push(MemoryReport {
        stage: st.name.clone(),
        role: st.role,
        device: g.name.clone(),
        capacity,
        usable: usable as u64,
        total: total as u64,
        items,
        fits,
        offload: None,
        lora: None,
        ranks: None,
    });
    // Every token the trainer trains on, forward only, at the trainer's MFU on the teacher's pool.
    let b = batch?;
    let tokens = (b.global_batch * job.seq_len) as f64;
    let per_token = time::teacher_flops_per_token(
        tm.active_params as f64,
        tm.layers as f64,
        job.seq_len as f64,
        (tm.heads * tm.head_dim) as f64,
    );
    Some(div(tokens * per_token, gpus as f64 * peak_flops(g, l.precision) * a.train_mfu))
}
