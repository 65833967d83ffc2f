//! What the Hugging Face tests (`hf`, `hf_moe`) share: the fixtures of tests/fixtures/hf, scratch
//! copies to break, transformers' reference logits and our forward against them, and the check
//! that a broken copy is refused naming what is wrong.

use miles_tch::hf::HfMeta;
use miles_tch::model::Policy;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Kind, Tensor};

/// A fixture directory of tests/fixtures/hf.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf").join(name)
}

/// A path under the temp dir named by `tag` and this process, removed first (not created).
pub fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("miles-hf-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The files (not subdirectories) of `from`, copied into `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

/// `dir/config.json`, rewritten through `f`.
pub fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(v.as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// A fixture's reference/logits.safetensors: transformers' logits and next-token log-probs on a
/// left-padded batch.
pub struct Reference {
    pub ids: Tensor,
    pub mask: Tensor,
    pub pos: Tensor,
    pub logits: Tensor,
    pub logprobs: Tensor,
}

impl Reference {
    /// `p`'s logits on the reference batch.
    pub fn forward(&self, p: &Policy) -> Tensor {
        tch::no_grad(|| p.forward(&self.ids, &self.pos, &self.mask, None))
    }
}

pub fn reference(name: &str) -> Reference {
    let path = fixture(name).join("reference/logits.safetensors");
    let mut m: HashMap<String, Tensor> = Tensor::read_safetensors(&path).unwrap().into_iter().collect();
    let mut take = |k: &str| m.remove(k).unwrap_or_else(|| panic!("{k} in {}", path.display()));
    Reference {
        ids: take("input_ids"),
        mask: take("attention_mask").to_kind(Kind::Bool),
        pos: take("position_ids"),
        logits: take("logits"),
        logprobs: take("logprobs"),
    }
}

/// Max |a - b| over the rows/positions where `valid` [B, T] is true.
pub fn max_err(a: &Tensor, b: &Tensor, valid: &Tensor) -> f64 {
    let d = (a - b).abs();
    let d = if d.dim() == 3 { d.amax([-1], false) } else { d };
    d.masked_select(valid).max().double_value(&[])
}

/// Each position's log-prob of the next token of `ids`, from `logits` [B, T, V]: [B, T - 1].
fn logprobs(logits: &Tensor, ids: &Tensor) -> Tensor {
    let t = ids.size()[1];
    logits
        .narrow(1, 0, t - 1)
        .log_softmax(-1, Kind::Float)
        .gather(-1, &ids.narrow(1, 1, t - 1).unsqueeze(-1), false)
        .squeeze_dim(-1)
}

/// `policy`'s forward on fixture `name`'s reference batch agrees with transformers' logits and
/// log-probs within 1e-4 on the real positions; the batch has a padded row, so the mask is
/// exercised. Returns the reference and our logits.
pub fn assert_matches_reference(name: &str, policy: &Policy) -> (Reference, Tensor) {
    let r = reference(name);
    assert!(!bool::try_from(r.mask.all()).unwrap(), "{name}: reference has no padded row");
    let logits = r.forward(policy);
    let t = r.ids.size()[1];
    let both = r.mask.narrow(1, 0, t - 1).logical_and(&r.mask.narrow(1, 1, t - 1));
    let err = max_err(&logits, &r.logits, &r.mask);
    let lp_err = max_err(&logprobs(&logits, &r.ids), &r.logprobs, &both);
    eprintln!("{name}: max |logits - transformers| = {err:.3e}, max |logprobs - transformers| = {lp_err:.3e}");
    assert!(err <= 1e-4, "{name}: logits differ by {err}");
    assert!(lp_err <= 1e-4, "{name}: log-probs differ by {lp_err}");
    (r, logits)
}

/// Adds `scale * (i % period)` to the i-th parameter in place, as an optimizer step changes them,
/// so an export must carry the new values.
pub fn perturb(policy: &Policy, scale: f64, period: usize) {
    tch::no_grad(|| {
        for (i, (_, t)) in policy.params().iter().enumerate() {
            let _ = t.shallow_clone().f_add_scalar_(scale * (i % period) as f64).unwrap();
        }
    });
}

/// The tokenizer and other files `meta` carried from its source are in `out`, byte for byte.
pub fn assert_carried(meta: &HfMeta, out: &Path, name: &str) {
    for f in &meta.carried_files {
        assert_eq!(std::fs::read(meta.dir.join(f)).unwrap(), std::fs::read(out.join(f)).unwrap(), "{name}: {f}");
    }
}

/// (case, fixture, how the copy is broken, substrings the error must contain)
pub type Bad = (&'static str, &'static str, fn(&Path), &'static [&'static str]);

/// Each case's broken copy of its fixture (under `temp(tag-case)`) fails to load with
/// E_CHECKPOINT, its message holding every expected substring.
pub fn assert_refused(tag: &str, cases: &[Bad]) {
    for (case, base, mutate, want) in cases {
        let dir = temp(&format!("{tag}-{}", case.replace(' ', "-")));
        copy_dir(&fixture(base), &dir);
        mutate(&dir);
        let e = match Policy::load_hf(&dir, None) {
            Ok(_) => panic!("{case}: loaded"),
            Err(e) => e,
        };
        assert_eq!(e.code, miles_runtime::E_CHECKPOINT, "{case}");
        for w in *want {
            assert!(e.message.contains(w), "{case}: `{}` lacks `{w}`", e.message);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
