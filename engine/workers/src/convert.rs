//! Between the runtime's types and the protocol's messages, and between `RunError` and gRPC status.

use crate::pb;
use miles_runtime::{
    FinishReason, RouteId, Routing, RunError, Sample, SamplingParams, TrainStats, Trajectory, E_BACKEND,
};

pub fn params_to_pb(p: &SamplingParams) -> pb::SamplingParams {
    pb::SamplingParams {
        max_new_tokens: p.max_new_tokens as u32,
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k as u32,
        stop_tokens: p.stop_tokens.clone(),
        greedy: p.greedy,
        seed: p.seed,
    }
}

pub fn params_from_pb(p: &pb::SamplingParams) -> SamplingParams {
    SamplingParams {
        max_new_tokens: p.max_new_tokens as usize,
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k as usize,
        stop_tokens: p.stop_tokens.clone(),
        greedy: p.greedy,
        seed: p.seed,
    }
}

pub fn sample_to_pb(s: &Sample) -> pb::Sample {
    pb::Sample {
        prompt_index: s.prompt_index as u32,
        response: s.response.clone(),
        logprobs: s.logprobs.clone(),
        finish: match s.finish {
            FinishReason::Stop => "stop".into(),
            FinishReason::Length => "length".into(),
        },
        weight_version: s.weight_version,
        routing: s.routing.as_ref().map(routing_to_pb),
    }
}

fn routing_to_pb(r: &Routing) -> pb::Routing {
    pb::Routing { layers: r.layers as u32, top_k: r.top_k as u32, id_bytes: r.id.bytes() as u32, data: r.data.clone() }
}

/// An id width no build writes is dropped here with the routing; the trainer then re-routes that
/// sample and says so (`r3/dropped`), so a garbled record never reaches the replay.
fn routing_from_pb(r: pb::Routing) -> Option<Routing> {
    let id = match r.id_bytes {
        1 => RouteId::U8,
        2 => RouteId::U16,
        4 => RouteId::I32,
        _ => return None,
    };
    Some(Routing { layers: r.layers as usize, top_k: r.top_k as usize, id, data: r.data })
}

pub fn sample_from_pb(s: pb::Sample) -> Sample {
    Sample {
        prompt_index: s.prompt_index as usize,
        response: s.response,
        logprobs: s.logprobs,
        finish: if s.finish == "stop" { FinishReason::Stop } else { FinishReason::Length },
        weight_version: s.weight_version,
        routing: s.routing.and_then(routing_from_pb),
    }
}

pub fn traj_to_pb(t: &Trajectory) -> pb::Trajectory {
    pb::Trajectory {
        prompt: t.prompt.clone(),
        response: t.response.clone(),
        rollout_logprobs: t.rollout_logprobs.clone(),
        loss_mask: t.loss_mask.clone(),
        reward: t.reward,
        advantage: t.advantage,
        group: t.group as u32,
        weight_version: t.weight_version,
        routing: t.routing.as_ref().map(routing_to_pb),
        teacher_logprobs: t.teacher_logprobs.clone(),
    }
}

pub fn traj_from_pb(t: pb::Trajectory) -> Trajectory {
    Trajectory {
        prompt: t.prompt,
        response: t.response,
        rollout_logprobs: t.rollout_logprobs,
        loss_mask: t.loss_mask,
        reward: t.reward,
        advantage: t.advantage,
        group: t.group as usize,
        weight_version: t.weight_version,
        routing: t.routing.and_then(routing_from_pb),
        teacher_logprobs: t.teacher_logprobs,
    }
}

/// `$out { typed fields from $s, $rest }`: the one list of the TrainStats fields that cross the
/// wire typed (protobuf's exact f64s); the rest travel in `json`.
macro_rules! typed_stats {
    ($out:path, $s:expr, $($rest:tt)*) => {{
        let s = $s;
        $out {
            loss: s.loss,
            grad_norm: s.grad_norm,
            entropy: s.entropy,
            clip_frac: s.clip_frac,
            kl: s.kl,
            logp_diff: s.logp_diff,
            rollout_kl: s.rollout_kl,
            tis_weight: s.tis_weight,
            optimizer_steps: s.optimizer_steps,
            tokens: s.tokens,
            $($rest)*
        }
    }};
}

pub fn stats_to_pb(s: &TrainStats) -> pb::TrainStats {
    typed_stats!(pb::TrainStats, s, json: serde_json::to_string(s).unwrap_or_default())
}

pub fn stats_from_pb(s: pb::TrainStats) -> TrainStats {
    // Fields added later come from the JSON; the typed ones are taken from protobuf's exact f64s
    // (serde_json's default float parsing can be one ulp off, and these must match bit for bit).
    let base = serde_json::from_str::<TrainStats>(&s.json).unwrap_or_default();
    typed_stats!(TrainStats, &s, ..base)
}

/// A stage's error crosses the wire as `[E0xxx] message`, so the controller can restore its code.
pub fn to_status(e: RunError) -> tonic::Status {
    let mut m = format!("[{}] {}", e.code, e.message);
    if let Some(h) = e.help {
        m.push_str("\nhelp: ");
        m.push_str(&h);
    }
    tonic::Status::internal(m)
}

/// The code and message of a stage error carried by a status (E0508 when it carries none).
pub fn code_of(msg: &str) -> (&'static str, String, Option<String>) {
    let (body, help) = match msg.split_once("\nhelp: ") {
        Some((b, h)) => (b, Some(h.to_string())),
        None => (msg, None),
    };
    if let Some(rest) = body.strip_prefix('[') {
        if let Some((code, m)) = rest.split_once("] ") {
            if let Some(c) = KNOWN.iter().find(|k| **k == code) {
                return (c, m.to_string(), help);
            }
        }
    }
    (E_BACKEND, body.to_string(), help)
}

const KNOWN: &[&str] = &[
    "E0501", "E0502", "E0503", "E0504", "E0505", "E0506", "E0507", "E0508", "E0509", "E0510", "E0513", "E0514",
    "E0515", "E0516",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_crosses_the_wire_in_its_id_type() {
        for id in [RouteId::U8, RouteId::U16, RouteId::I32] {
            let mut r = Routing::new(2, 2, id);
            r.push_token(&[0, 3, 2, 1]);
            r.push_token(&[1, 2, 3, 0]);
            let s = Sample {
                prompt_index: 1,
                response: vec![4, 5],
                logprobs: vec![-1.0, -2.0],
                finish: FinishReason::Stop,
                weight_version: 3,
                routing: Some(r.clone()),
            };
            let back = sample_from_pb(sample_to_pb(&s));
            assert_eq!(back, s);
            assert_eq!(sample_to_pb(&s).routing.unwrap().data.len(), 8 * id.bytes());
        }
        // An id width no build writes loses the routing (the trainer then re-routes that sample).
        let pb = pb::Routing { layers: 1, top_k: 1, id_bytes: 3, data: vec![0; 3] };
        assert_eq!(routing_from_pb(pb), None);
    }
}
