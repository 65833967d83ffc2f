//! How far each estimate of a plan can be trusted (docs/plan.md, "Evidence"): measured on this
//! project's runs, fitted to published figures (named), derived by formula from the recipe and the
//! catalogs, or resting on a constant we assumed. A figure built from several is as strong as its
//! weakest input.

use serde::Serialize;

/// The kinds of evidence, weakest first (the order `weakest` compares).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceKind {
    /// Rests on a constant nobody measured (a datasheet peak at an assumed efficiency).
    Assumed,
    /// Constants fitted to published figures, which `source` names.
    Fitted,
    /// Rates measured on this project's runs (bench/RESULTS.md).
    Measured,
    /// Arithmetic on the recipe and the catalogs, no rate involved.
    Derived,
}

impl EvidenceKind {
    /// The word a plan prints beside the figure.
    pub fn label(self) -> &'static str {
        match self {
            EvidenceKind::Assumed => "assumed",
            EvidenceKind::Fitted => "fitted",
            EvidenceKind::Measured => "measured here",
            EvidenceKind::Derived => "derived",
        }
    }

    /// Strongest first: how the summary lists them.
    pub const ALL: [EvidenceKind; 4] =
        [EvidenceKind::Measured, EvidenceKind::Fitted, EvidenceKind::Derived, EvidenceKind::Assumed];
}

/// An estimate's evidence: its kind and what it rests on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evidence {
    pub kind: EvidenceKind,
    /// The measurement, the published figures or the assumed constants, in words.
    pub source: String,
}

impl Evidence {
    pub fn measured(source: impl Into<String>) -> Evidence {
        Evidence { kind: EvidenceKind::Measured, source: source.into() }
    }
    pub fn fitted(source: impl Into<String>) -> Evidence {
        Evidence { kind: EvidenceKind::Fitted, source: source.into() }
    }
    pub fn derived(source: impl Into<String>) -> Evidence {
        Evidence { kind: EvidenceKind::Derived, source: source.into() }
    }
    pub fn assumed(source: impl Into<String>) -> Evidence {
        Evidence { kind: EvidenceKind::Assumed, source: source.into() }
    }

    /// The evidence of a figure built from named parts: the weakest kind among them, naming the
    /// parts of that kind (`as its weakest parts: rollout, train step`).
    pub fn weakest<'a>(parts: impl IntoIterator<Item = (&'a str, &'a Evidence)>) -> Evidence {
        let parts: Vec<(&str, &Evidence)> = parts.into_iter().collect();
        let Some(kind) = parts.iter().map(|(_, e)| e.kind).min() else {
            return Evidence::derived("no time-consuming part");
        };
        let names: Vec<&str> = parts.iter().filter(|(_, e)| e.kind == kind).map(|(n, _)| *n).collect();
        Evidence {
            kind,
            source: format!("as its weakest part{}: {}", if names.len() == 1 { "" } else { "s" }, names.join(", ")),
        }
    }

    /// `[fitted]`: the tag beside a figure in text.
    pub fn tag(&self) -> String {
        format!("[{}]", self.kind.label())
    }
}

/// Where each source of evidence is written once, so every estimate that rests on it says the same.
pub(crate) mod sources {
    pub const SYNC: &str = "weight-sync constants fitted to the eight layouts of the Miles/LMSYS P2P weight-transfer post (Table 8's GLM-5 and Kimi K2 among them; docs/plan.md, \"Weight sync\")";
    pub const CPU_RATES: &str =
        "the embedded backend's CPU rates, measured on this project's runs (docs/plan.md, \"Step time on a CPU host\")";
    pub const GPU_RATES: &str = "GPU datasheet peaks at assumed efficiencies, never measured (docs/gpu.md)";
    pub const TRAIN_MFU: &str = "the GPU datasheet peak at the assumed train_mfu";
    pub const DECODE: &str = "HBM bandwidth and peak FLOP/s at the assumed decode efficiencies";
    pub const COLLECTIVE: &str =
        "c10d's loopback bandwidth measured on this project's runs (bench/RESULTS.md, \"Data-parallel trainers\")";
    pub const OFFLOAD: &str =
        "the host link's rate fitted to Miles §3.2 (Qwen3-30B-A3B actor offload 5.2 s; reload 1.3 s checked)";
    pub const DISK: &str = "local NVMe bandwidth and link_efficiency, assumed";
}

/// Every estimate of a plan with what it is called there, in the order the plan prints them.
pub fn of_plan(p: &crate::output::Plan) -> Vec<(String, &Evidence)> {
    let mut all: Vec<(String, &Evidence)> = Vec::new();
    for r in &p.rollouts {
        all.push((format!("{} tokens/s", r.stage), &r.tokens_per_s.evidence));
        if let Some(t) = &r.rollout_time {
            all.push((format!("{} time per batch", r.stage), &t.evidence));
        }
    }
    for m in &p.memory {
        if let Some(o) = &m.offload {
            all.push((format!("{} optimizer offload", m.stage), &o.per_step.evidence));
        }
    }
    for s in &p.syncs {
        all.push((format!("{} ({})", s.name, s.transport.as_str()), &s.estimate.evidence));
    }
    if let Some(c) = &p.colocation {
        all.push(("eviction".into(), &c.switch.evidence));
    }
    if let Some(d) = &p.diffusion {
        let parts = [
            ("denoise", Some(&d.denoise)),
            ("reward", d.reward.as_ref()),
            ("train", d.train.as_ref()),
            ("eval", d.eval.as_ref()),
            ("pretrain", d.pretrain.as_ref()),
            ("classifiers", d.classifiers.as_ref()),
        ];
        all.extend(parts.into_iter().filter_map(|(n, e)| e.map(|e| (n.to_string(), &e.evidence))));
    }
    if let Some(st) = &p.step {
        if p.diffusion.is_none() {
            all.push(("train step".into(), &st.train_step.evidence));
        }
        if let Some(d) = &st.data_parallel {
            all.push(("collectives".into(), &d.collective.evidence));
        }
        all.push(("step".into(), &st.step.evidence));
    }
    all
}

/// The closing line: how many estimates of each kind (`4 estimates: 1 measured here, 3 assumed`).
pub fn summary(p: &crate::output::Plan) -> Option<String> {
    let all = of_plan(p);
    if all.is_empty() {
        return None;
    }
    let kinds: Vec<String> =
        count(all.iter().map(|(_, e)| *e)).into_iter().map(|(k, n)| format!("{n} {}", k.label())).collect();
    Some(format!("{} estimate{}: {}", all.len(), if all.len() == 1 { "" } else { "s" }, kinds.join(", ")))
}

/// Counts per kind over a plan's estimates, strongest first, kinds with none left out.
pub fn count<'a>(all: impl IntoIterator<Item = &'a Evidence>) -> Vec<(EvidenceKind, usize)> {
    let all: Vec<&Evidence> = all.into_iter().collect();
    EvidenceKind::ALL
        .into_iter()
        .map(|k| (k, all.iter().filter(|e| e.kind == k).count()))
        .filter(|&(_, n)| n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_figure_is_as_strong_as_its_weakest_input() {
        let (m, f, a) = (Evidence::measured("m"), Evidence::fitted("f"), Evidence::assumed("a"));
        assert_eq!(Evidence::weakest([("m", &m), ("f", &f)]).kind, EvidenceKind::Fitted);
        let b = Evidence::assumed("b");
        let w = Evidence::weakest([("m", &m), ("f", &f), ("rollout", &a), ("train", &b)]);
        assert_eq!((w.kind, w.source.as_str()), (EvidenceKind::Assumed, "as its weakest parts: rollout, train"));
        assert_eq!(Evidence::weakest([]).kind, EvidenceKind::Derived);
        assert_eq!(
            count([&m, &f, &a, &a]),
            vec![(EvidenceKind::Measured, 1), (EvidenceKind::Fitted, 1), (EvidenceKind::Assumed, 2)]
        );
    }
}
