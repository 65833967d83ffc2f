//! Mixture-of-experts MLPs and R3 (rollout routing replay), docs/moe.md.
//!
//! A MoE layer's MLP is a router `gate` [E, d] and E SwiGLU experts (Qwen3-MoE's parameter names:
//! `mlp.gate.weight`, `mlp.experts.{j}.{gate,up,down}_proj.weight`), plus an optional shared expert
//! every token uses (`mlp.shared_expert.*`, as Qwen2-MoE names it, without its sigmoid gate). Each
//! token goes to the `top_k` experts of highest score (softmax over the router's logits, or an
//! independent sigmoid per expert), weighted by those scores, renormalised to sum to 1 when
//! `norm_topk`.
//!
//! R3 replays the rollout's choice in the trainer: where a token has recorded experts, the forward
//! uses them instead of its own top-k, and recomputes their weights from the *current* router over
//! the recorded experts (Miles' choice: the router still learns, through the weights of the experts
//! the sampler actually used). Gradient then reaches exactly the recorded experts. The router's own
//! top-k is computed either way, so the route mismatch (`r3/route_mismatch`) is measured with and
//! without replay.

use crate::model::Gemm;
use miles_runtime::{Gating, MoeConfig};
use tch::{Kind, Tensor};

/// One SwiGLU MLP's weights: gate and up [f, d], down [d, f].
pub(crate) struct Swiglu {
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

impl Swiglu {
    fn apply(&self, x: &Tensor, gemm: Gemm) -> Tensor {
        let f = self.gate.size()[0];
        let gu = gemm.linear_low(x, &Tensor::cat(&[&self.gate, &self.up], 0), None);
        gemm.linear(&(gu.narrow(-1, 0, f).silu() * gu.narrow(-1, f, f)), &self.down, None)
    }
}

pub(crate) struct MoeLayer {
    pub router: Tensor,
    pub experts: Vec<Swiglu>,
    pub shared: Option<Swiglu>,
}

/// Parameter names of MoE layer `i`'s MLP, in creation order.
pub(crate) fn mlp_param_names(moe: &MoeConfig, i: usize) -> Vec<String> {
    let mut v = vec![format!("model.layers.{i}.mlp.gate.weight")];
    for j in 0..moe.experts {
        for p in ["gate_proj", "up_proj", "down_proj"] {
            v.push(format!("model.layers.{i}.mlp.experts.{j}.{p}.weight"));
        }
    }
    if moe.shared_expert_d_ff > 0 {
        for p in ["gate_proj", "up_proj", "down_proj"] {
            v.push(format!("model.layers.{i}.mlp.shared_expert.{p}.weight"));
        }
    }
    v
}

/// The MLP width of a parameter named under `stem` (`model.layers.3.mlp.experts.1.up_proj`): the
/// expert's or the shared expert's in a MoE layer; None for a dense MLP's.
pub(crate) fn mlp_width(moe: Option<&MoeConfig>, stem: &str) -> Option<usize> {
    let m = moe?;
    if stem.contains(".mlp.experts.") {
        Some(m.expert_d_ff)
    } else if stem.contains(".mlp.shared_expert.") {
        Some(m.shared_expert_d_ff)
    } else {
        None
    }
}

/// What a forward pass routes by and what it reports, for the MoE layers of one batch [B, T].
#[derive(Default)]
pub struct Route {
    /// R3: per MoE layer, recorded experts [B, T, k] (int64), used where the mask [B, T] is true;
    /// elsewhere (pads, the unrecorded last token) the router chooses.
    pub replay: Option<(Vec<Tensor>, Tensor)>,
    /// Real tokens [B, T] for the load-balancing loss and the load statistics; None: routes are
    /// recorded but no statistics computed (the sampler's passes).
    pub valid: Option<Tensor>,
    /// Filled per MoE layer: the experts the forward used [B, T, k].
    pub used: Vec<Tensor>,
    /// Filled per MoE layer: the router's own top-k [B, T, k] (equal to `used` without replay).
    pub own: Vec<Tensor>,
    /// Filled per MoE layer: the share of routed slots each expert received [E], over valid tokens.
    pub load: Vec<Tensor>,
    /// Sum over MoE layers of the load-balancing loss (in the autograd graph), when asked.
    pub aux: Option<Tensor>,
    /// Compute `aux` (training passes only).
    pub want_aux: bool,
    moe_layers: usize,
}

impl Route {
    /// Routing for a training or log-prob pass: replay `replay` where given, statistics over
    /// `valid` tokens.
    pub fn for_batch(replay: Option<(Vec<Tensor>, Tensor)>, valid: &Tensor, want_aux: bool) -> Route {
        Route { replay, valid: Some(valid.shallow_clone()), want_aux, ..Route::default() }
    }
}

impl MoeLayer {
    /// The MLP output [B, T, d] for normed inputs `x` [B, T, d] (any float kind: the engine's
    /// bf16 or the trainer's fp32), the experts' GEMMs as `gemm` says. The router's GEMM is fp32
    /// under bf16 matmuls (routes must not flip with the trainer's precision).
    pub(crate) fn forward(&self, cfg: &MoeConfig, x: &Tensor, route: Option<&mut Route>, gemm: Gemm) -> Tensor {
        let invariant = gemm == Gemm::Invariant;
        let size = x.size();
        let (b, t, d) = (size[0], size[1], size[2]);
        let k = cfg.top_k as i64;
        let flat = x.reshape([b * t, d]);
        // Scores in fp32 whatever the compute kind (as engines do), from the router in that kind:
        // a bf16 engine's router logits differ from the fp32 trainer's, which is what flips routes.
        let logits = match invariant {
            true => crate::invariant::linear(&flat, &self.router, None),
            false => flat.linear::<Tensor>(&self.router, None),
        }
        .to_kind(Kind::Float);
        let scores = match cfg.gating {
            Gating::Softmax => logits.softmax(-1, Kind::Float),
            Gating::Sigmoid => logits.sigmoid(),
        };
        let own = scores.topk(k, -1, true, true).1; // [N, k]
        let mut used = own.shallow_clone();
        let mut route = route;
        if let Some(r) = route.as_deref_mut() {
            let li = r.moe_layers;
            if let Some((ids, mask)) = &r.replay {
                if let Some(rec) = ids.get(li) {
                    let m = mask.reshape([b * t, 1]).expand([b * t, k], false);
                    used = rec.reshape([b * t, k]).where_self(&m, &own);
                }
            }
        }
        let w = scores.gather(-1, &used, false);
        let w = if cfg.norm_topk { &w / w.sum_dim_intlist(-1, true, Kind::Float).clamp_min(1e-20) } else { w };
        let w = w.to_kind(x.kind());
        let mut out = match &self.shared {
            Some(s) => s.apply(&flat, gemm),
            None => flat.zeros_like(),
        };
        // Each expert computes only its tokens: the gradient reaches the experts that were used.
        let hits = used.unsqueeze(-1).eq_tensor(&Tensor::arange(cfg.experts as i64, (Kind::Int64, x.device())));
        for (e, expert) in self.experts.iter().enumerate() {
            let hit = hits.select(-1, e as i64); // [N, k]
            let rows = hit.any_dim(-1, false).nonzero().squeeze_dim(-1);
            if rows.numel() == 0 {
                continue;
            }
            let we = (&w * hit.to_kind(w.kind())).sum_dim_intlist(-1, false, w.kind()).index_select(0, &rows);
            let ye = expert.apply(&flat.index_select(0, &rows), gemm) * we.unsqueeze(-1);
            out = out.index_add(0, &rows, &ye);
        }
        // The sampler records routes only; the load and the aux loss are for the passes that
        // give their real tokens (`Route::for_batch`), not for every decode step.
        if let Some(r) = route.as_deref_mut().filter(|r| r.valid.is_none()) {
            r.used.push(used.view([b, t, k]));
            r.own.push(own.view([b, t, k]));
            r.moe_layers += 1;
            return out.view([b, t, d]);
        }
        if let Some(r) = route {
            let valid = r.valid.as_ref().map(|v| v.reshape([b * t]));
            let n_valid = valid.as_ref().map_or((b * t) as f64, |v| v.sum(Kind::Float).double_value(&[]).max(1.0));
            let counts = {
                let _g = tch::no_grad_guard();
                let onehot = hits.to_kind(Kind::Float).sum_dim_intlist(1, false, Kind::Float); // [N, E]
                let onehot = match &valid {
                    Some(v) => onehot * v.to_kind(Kind::Float).unsqueeze(-1),
                    None => onehot,
                };
                onehot.sum_dim_intlist(0, false, Kind::Float) / (n_valid * k as f64)
                // [E], sums to 1
            };
            if r.want_aux {
                // Switch Transformer's loss, E * sum_e f_e P_e: 1 when routing is balanced.
                let p = match cfg.gating {
                    Gating::Softmax => scores.shallow_clone(),
                    Gating::Sigmoid => &scores / scores.sum_dim_intlist(-1, true, Kind::Float),
                };
                let p = match &valid {
                    Some(v) => p * v.to_kind(Kind::Float).unsqueeze(-1),
                    None => p,
                };
                let p_mean = p.sum_dim_intlist(0, false, Kind::Float) / n_valid;
                let aux = (&counts * p_mean).sum(Kind::Float) * cfg.experts as f64;
                r.aux = Some(match r.aux.take() {
                    Some(a) => a + aux,
                    None => aux,
                });
            }
            r.load.push(counts);
            r.used.push(used.detach().view([b, t, k]));
            r.own.push(own.view([b, t, k]));
            r.moe_layers += 1;
        }
        out.view([b, t, d])
    }
}

/// Per MoE layer, (tokens whose set of `a` experts differs from that of `b`, `mask`ed tokens),
/// each [B, T, k] against the mask [B, T]: the router-flip count; and the [B, T] mask of tokens
/// that differ in any layer.
pub fn flips(a: &[Tensor], b: &[Tensor], mask: &Tensor) -> (Vec<(f64, f64)>, Tensor) {
    let m = mask.to_kind(Kind::Float);
    let n = m.sum(Kind::Double).double_value(&[]);
    let mut any = mask.zeros_like().to_kind(Kind::Bool);
    let per = a
        .iter()
        .zip(b)
        .map(|(x, y)| {
            let differs = x.sort(-1, false).0.ne_tensor(&y.sort(-1, false).0).any_dim(-1, false);
            any = any.logical_or(&differs);
            ((differs.to_kind(Kind::Float) * &m).sum(Kind::Double).double_value(&[]), n)
        })
        .collect();
    (per, any.logical_and(mask))
}

/// The experts a pass used, as one host array [B, T, layers, k] (token-major, as `Routing`
/// stores them), or None for a dense model.
pub(crate) fn used_ids(route: &Route) -> Option<(Vec<i64>, [usize; 4])> {
    let first = route.used.first()?;
    let s = first.size();
    let (b, t, k) = (s[0] as usize, s[1] as usize, s[2] as usize);
    let all = Tensor::stack(&route.used, 2).contiguous().view([-1]);
    let v = Vec::<i64>::try_from(all).ok()?;
    Some((v, [b, t, route.used.len(), k]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(rows: &[&[f32]]) -> Tensor {
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_slice(&flat).view([rows.len() as i64, rows[0].len() as i64])
    }

    fn cfg(gating: Gating) -> MoeConfig {
        MoeConfig { gating, ..MoeConfig::routed(3, 2, 1) }
    }

    /// Router logits x W^T = [x0, x1, -x0 - x1]; expert j outputs [(j + 1) silu(x0) x1, 0].
    fn layer() -> MoeLayer {
        let expert = |j: f32| Swiglu { gate: t(&[&[1.0, 0.0]]), up: t(&[&[0.0, 1.0]]), down: t(&[&[j + 1.0], &[0.0]]) };
        MoeLayer {
            router: t(&[&[1.0, 0.0], &[0.0, 1.0], &[-1.0, -1.0]]),
            experts: (0..3).map(|j| expert(j as f32)).collect(),
            shared: None,
        }
    }

    fn silu(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    fn run(l: &MoeLayer, c: &MoeConfig, x: &[&[f32]], route: &mut Route) -> Vec<f32> {
        let x = t(x).unsqueeze(0);
        let y = l.forward(c, &x, Some(route), Gemm::Plain);
        Vec::<f32>::try_from(y.reshape([-1])).unwrap()
    }

    /// Hand-computed: x = [1, 0.5] has logits [1, 0.5, -1.5]; softmax picks experts 0 and 1 with
    /// weights p0 / (p0 + p1) and p1 / (p0 + p1); expert j's output is (j + 1) silu(1) 0.5.
    #[test]
    fn moe_router_picks_top_k_and_renormalises() {
        let l = layer();
        let mut r = Route::default();
        let y = run(&l, &cfg(Gating::Softmax), &[&[1.0, 0.5]], &mut r);
        let e: Vec<f64> = [1.0f64, 0.5, -1.5].iter().map(|z| z.exp()).collect();
        let (w0, w1) = (e[0] / (e[0] + e[1]), e[1] / (e[0] + e[1]));
        let unit = silu(1.0) * 0.5;
        let want = w0 * unit + w1 * 2.0 * unit;
        assert!((y[0] as f64 - want).abs() < 1e-6, "{} vs {want}", y[0]);
        assert_eq!(y[1], 0.0);
        assert_eq!(Vec::<i64>::try_from(r.used[0].reshape([-1])).unwrap(), vec![0, 1]);
        // Sigmoid gating: scores sigmoid(logits), the same top-2, renormalised.
        let mut r = Route::default();
        let y = run(&l, &cfg(Gating::Sigmoid), &[&[1.0, 0.5]], &mut r);
        let s = |z: f64| 1.0 / (1.0 + (-z).exp());
        let (s0, s1) = (s(1.0), s(0.5));
        let want = (s0 * unit + s1 * 2.0 * unit) / (s0 + s1);
        assert!((y[0] as f64 - want).abs() < 1e-6, "{} vs {want}", y[0]);
        // Without renormalisation the weights are the raw softmax probabilities.
        let mut c = cfg(Gating::Softmax);
        c.norm_topk = false;
        let y = run(&l, &c, &[&[1.0, 0.5]], &mut Route::default());
        let sum: f64 = e.iter().sum();
        let want = (e[0] * unit + e[1] * 2.0 * unit) / sum;
        assert!((y[0] as f64 - want).abs() < 1e-6, "{} vs {want}", y[0]);
    }

    /// Replay: the token is sent to the recorded experts {2, 0}, weighted by the current router's
    /// scores of those two, and only they (and the router) get gradient.
    #[test]
    fn gradients_flow_only_to_recorded_experts() {
        let l = layer();
        for p in [&l.router].into_iter().chain(l.experts.iter().flat_map(|e| [&e.gate, &e.up, &e.down])) {
            let _ = p.set_requires_grad(true);
        }
        let recorded = Tensor::from_slice(&[2i64, 0]).view([1, 1, 2]);
        let mask = Tensor::from_slice(&[true]).view([1, 1]);
        let mut r = Route { replay: Some((vec![recorded], mask)), ..Route::default() };
        let x = t(&[&[1.0, 0.5]]).unsqueeze(0);
        let y = l.forward(&cfg(Gating::Softmax), &x, Some(&mut r), Gemm::Plain);
        let e: Vec<f64> = [1.0f64, 0.5, -1.5].iter().map(|z| z.exp()).collect();
        let (w2, w0) = (e[2] / (e[0] + e[2]), e[0] / (e[0] + e[2]));
        let unit = silu(1.0) * 0.5;
        let want = w2 * 3.0 * unit + w0 * unit;
        assert!((y.double_value(&[0, 0, 0]) - want).abs() < 1e-6);
        assert_eq!(Vec::<i64>::try_from(r.used[0].reshape([-1])).unwrap(), vec![2, 0]);
        assert_eq!(Vec::<i64>::try_from(r.own[0].reshape([-1])).unwrap(), vec![0, 1], "the router's own choice");
        y.sum(Kind::Float).backward();
        let norm = |t: &Tensor| t.grad().abs().sum(Kind::Float).double_value(&[]);
        assert!(norm(&l.experts[0].down) > 0.0 && norm(&l.experts[2].down) > 0.0);
        assert!(norm(&l.router) > 0.0, "the router learns through the recorded experts' weights");
        let unused = &l.experts[1];
        assert!(!unused.down.grad().defined() || norm(&unused.down) == 0.0, "expert 1 was not recorded");
        assert!(!unused.gate.grad().defined() || norm(&unused.gate) == 0.0);
    }

    /// Switch's loss E sum_e f_e P_e by hand for two tokens: x = [1, 0.5] picks {0, 1}, x = [0, 2]
    /// picks {1, 0}; f = [1/2, 1/2, 0]. A pad token (valid = false) counts for nothing.
    #[test]
    fn aux_loss_balances_expert_load() {
        let l = layer();
        let valid = Tensor::from_slice(&[true, true, false]).view([1, 3]);
        let mut r = Route::for_batch(None, &valid, true);
        run(&l, &cfg(Gating::Softmax), &[&[1.0, 0.5], &[0.0, 2.0], &[-5.0, -5.0]], &mut r);
        let p = |z: [f64; 3]| {
            let e: Vec<f64> = z.iter().map(|v| v.exp()).collect();
            let s: f64 = e.iter().sum();
            e.iter().map(|v| v / s).collect::<Vec<_>>()
        };
        let (a, b) = (p([1.0, 0.5, -1.5]), p([0.0, 2.0, -2.0]));
        let pm: Vec<f64> = (0..3).map(|e| (a[e] + b[e]) / 2.0).collect();
        let f = [0.5, 0.5, 0.0];
        let want = 3.0 * (0..3).map(|e| f[e] * pm[e]).sum::<f64>();
        let got = r.aux.as_ref().unwrap().double_value(&[]);
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        let load = Vec::<f32>::try_from(&r.load[0]).unwrap();
        assert_eq!(load, vec![0.5, 0.5, 0.0]);
    }
}
