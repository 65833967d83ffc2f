//! The models planned from a Hugging Face config.json, under the stage lines: the architecture,
//! whether `miles run` loads it, its parameters, and the keys read and not read (short in text and
//! HTML; every key in JSON).

use crate::output::{ModelSource, Plan};
use crate::units::params;
use std::fmt::Write;

/// Keys listed before "and N more".
const SHOWN: usize = 12;

/// `a, b, c and 9 more`; `none` for no keys.
fn short(keys: &[String]) -> String {
    if keys.is_empty() {
        return "none".into();
    }
    let shown = keys.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
    match keys.len().saturating_sub(SHOWN) {
        0 => shown,
        n => format!("{shown} and {n} more"),
    }
}

/// The model's first line: name, directory, and what a run does with it.
fn headline(m: &ModelSource) -> String {
    let run = if m.loadable {
        "the embedded backend loads it"
    } else {
        "plan only: the embedded backend loads llama, mistral, qwen2, qwen3, qwen3_moe and mixtral"
    };
    format!("{} from {}/config.json ({}; {run})", m.name, m.path, m.architecture)
}

/// `N parameters, M active`, with MTP layers said apart.
fn sizes(m: &ModelSource) -> String {
    let mut s = format!("{} parameters", params(m.params));
    if m.active_params != m.params {
        let _ = write!(s, ", {} active per token", params(m.active_params));
    }
    if m.mtp_params > 0 {
        let _ = write!(s, " (multi-token prediction: {} more, not counted)", params(m.mtp_params));
    }
    s
}

pub(crate) fn models_text(o: &mut String, p: &Plan) {
    for m in &p.models {
        let _ = writeln!(o, "\n  model {}", headline(m));
        let _ = writeln!(o, "    {}", sizes(m));
        let _ = writeln!(o, "    read from config.json: {}", short(&m.read));
        let _ = writeln!(o, "    not read: {}", short(&m.ignored));
    }
}

pub(crate) fn models_html(o: &mut String, p: &Plan, esc: fn(&str) -> String) {
    if p.models.is_empty() {
        return;
    }
    let _ = write!(o, "<h2>Models from config.json</h2><div class=\"card\"><table>");
    for m in &p.models {
        let _ = write!(
            o,
            "<tr><th colspan=\"2\">{}</th></tr><tr><td>size</td><td>{}</td></tr>\
             <tr><td>read from config.json</td><td>{}</td></tr><tr><td>not read</td><td>{}</td></tr>",
            esc(&headline(m)),
            esc(&sizes(m)),
            esc(&short(&m.read)),
            esc(&short(&m.ignored))
        );
    }
    let _ = write!(o, "</table></div>");
}
