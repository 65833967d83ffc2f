//! The run's task and LoRA adapters: a prompt set record (the rollout's `prompts`, or a
//! multi-LoRA adapter's) as the runtime's `TaskSpec`, which only `miles run` reads.

use miles_compiler::job::read::Fields;
use miles_compiler::job::LoraJob;
use miles_compiler::value::Record;
use miles_runtime::spec::*;

fn count(r: &Record, name: &str) -> u64 {
    r.u64(name).map_or(0, |v| v.value)
}

fn text(r: &Record, name: &str) -> String {
    r.str(name).unwrap_or_default().to_string()
}

/// The task a prompt set names; None for a prompt set the runtime does not read.
pub(crate) fn task_spec(prompts: Option<&Record>, partial_credit: bool) -> Option<TaskSpec> {
    let p = prompts?;
    let kind = match p.schema_name.as_str() {
        "addition" => TaskKind::Addition { digits: count(p, "digits") as u32 },
        "multiplication" => TaskKind::Multiplication { digits: count(p, "digits") as u32 },
        kind @ ("reverse" | "sort") => {
            let (min_len, max_len, alphabet) =
                (count(p, "min_len") as usize, count(p, "max_len") as usize, text(p, "alphabet"));
            if kind == "reverse" {
                TaskKind::Reverse { min_len, max_len, alphabet, working: count(p, "working") as usize }
            } else {
                TaskKind::Sort { min_len, max_len, alphabet }
            }
        }
        "jsonl" | "parquet" => TaskKind::Data {
            path: text(p, "path").into(),
            prompt_field: text(p, "prompt_field"),
            label_field: text(p, "label_field"),
            test_path: None,
            on_error: if p.member("on_error").map(|e| e.value) == Some("stop") { OnError::Stop } else { OnError::Skip },
        },
        _ => return None,
    };
    let int = |name: &str| p.value(name).and_then(|v| v.as_i64());
    let test_size = int("test_size").unwrap_or(200).max(1) as usize;
    let split_seed = int("split_seed").unwrap_or(1234).max(0) as u64;
    // A file's split rule (`split_by`; the stdlib's check makes `key` come with `split_key`);
    // a built-in task has none and splits by prompt.
    let by = match (p.member("split_by").map(|m| m.value), p.str("split_key")) {
        (Some("row"), _) => SplitBy::Row,
        (Some("key"), Some(k)) => SplitBy::Key(k.to_string()),
        _ => SplitBy::Prompt,
    };
    // Where a datasets repository's held-out rows come from (`parquet`'s `held_out`); every
    // other source reads as the default, which for one file draws them from its rows.
    let held_out =
        if p.member("held_out").map(|m| m.value) == Some("drawn") { HeldOut::Drawn } else { HeldOut::Shipped };
    Some(TaskSpec { kind, split: SplitSpec { test_size, seed: split_seed, by, held_out }, partial_credit })
}

/// The trainer's LoRA; the `named` adapters' prompts become their tasks (the capability table
/// refused any the runtime cannot read).
pub(super) fn lora_spec(l: &LoraJob, seed: u64, partial_credit: bool) -> LoraSpec {
    let adapters = l
        .named
        .iter()
        .filter_map(|a| {
            Some(AdapterSpec {
                name: text(a, "name"),
                task: task_spec(a.record("prompts"), a.bool("partial_credit").map_or(partial_credit, |b| b.value))?,
                lr: a.f64("lr").map(|v| v.value),
            })
        })
        .collect();
    LoraSpec {
        rank: l.rank.value as usize,
        alpha: l.alpha,
        dropout: l.dropout,
        target_modules: l.target_modules.clone(),
        init_seed: seed,
        adapters,
        init: l.init.as_ref().map(|d| std::path::PathBuf::from(&d.value)),
    }
}
