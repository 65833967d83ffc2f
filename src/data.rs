//! `miles data RECIPE`: what the model will see, before any training. For the prompt source of
//! the recipe's rollout it shows the first rows as the policy is conditioned on them (rendered
//! text with special tokens, ids, label and metadata), a histogram of prompt lengths against the
//! rollout's limits, the train/test split under the recipe's `split_by`, and the rows skipped as
//! malformed (docs/data.md, "Previewing with `miles data`"). It reads the file and builds the
//! tokenizer with the runtime's own code (`miles_runtime::tasks`, `tokenize`), so what it shows
//! and the errors it stops with are the run's; libtorch is never loaded.

use crate::diagnostics::{emit, summary};
use crate::files::DiskFs;
use crate::runspec::{self, RunJob};
use crate::DiagFormat;
use miles_compiler::job::read::Fields;
use miles_compiler::job::ModelJob;
use miles_compiler::{CompiledRecipe, Options};
use miles_runtime::spec::{SplitBy, TaskSpec};
use miles_runtime::tasks::{self, Prompt, PromptRow, TaskSet};
use miles_runtime::tokenize::{HfTokenizer, Tokenizer};
use miles_runtime::RunError;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fmt::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// The recipe file.
    pub file: String,
    /// Which recipe, when the file has several.
    #[arg(long)]
    pub recipe: Option<String>,
    /// Override a field with full type checking: `--set rollout.prompts.split_by=row` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// How many rows to show, from the top of the file.
    #[arg(short = 'n', default_value_t = 3)]
    pub n: usize,
    /// Print the same as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Bins of the length histogram.
const BINS: usize = 10;
/// Ids shown whole up to this many; a longer prompt shows its first and last ones.
const IDS_SHOWN: usize = 24;
/// Dropped rows listed by name.
const DROPPED_SHOWN: usize = 3;

/// What the run reads of a recipe, as `miles run` maps it.
struct Reading {
    stage: String,
    task: TaskSpec,
    hf: Option<PathBuf>,
    /// Characters the character tokenizer also covers (an environment's observations).
    extra: String,
    max_prompt: Option<usize>,
    max_new: usize,
    max_len: Option<usize>,
    /// An environment plays episodes: each first prompt as sent is checked, not the row.
    env: bool,
    seed: u64,
    /// A model whose tokenizer is not on this machine (a catalog entry): the lengths are the
    /// character tokenizer's, and the preview says so.
    foreign_model: Option<String>,
}

pub fn run(args: Args) -> u8 {
    let overrides = match crate::check::sets_or_exit(&args.set) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let c = crate::packages::compile(
        &DiskFs,
        std::slice::from_ref(&args.file),
        &Options { overrides, recipe: args.recipe, hub_cache: crate::packages::hub_cache() },
    );
    let (errors, warnings) = summary(&c.diagnostics);
    if errors > 0 || warnings > 0 {
        emit(&c.program.sources, &c.diagnostics, DiagFormat::Auto);
    }
    if errors > 0 {
        eprintln!("miles data: the recipe has {errors} error(s)");
        return 1;
    }
    let r = match crate::graph::pick_recipe(&c, &args.file) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let reading = match reading(r) {
        Ok(x) => x,
        Err(why) => {
            eprintln!("error: {why}");
            return 1;
        }
    };
    let preview = match preview(&reading, args.n) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    if args.json {
        let mut v = preview.json;
        v["recipe"] = json!(r.name);
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        print!("recipe {}, {}", r.name, preview.text);
    }
    // A split the run would refuse: shown above, and the exit status says so.
    match preview.refusal {
        Some(e) => {
            eprintln!("{e}");
            1
        }
        None => 0,
    }
}

/// The run's reading of the recipe's main rollout; for a recipe this machine cannot run (a GPU
/// cluster's), the same readings from the typed job.
fn reading(r: &CompiledRecipe) -> Result<Reading, String> {
    let rollout = r.job.main_rollout().ok_or("the recipe has no `generate` stage: it reads no prompts")?;
    let stage = rollout.name.clone();
    if let Ok(RunJob::Lm(spec)) = runspec::run_job(r) {
        return Ok(Reading {
            stage,
            task: spec.task.clone(),
            hf: spec.hf.as_ref().map(|h| h.path.clone()),
            extra: spec.env.as_ref().map_or("", |e| e.alphabet()).to_string(),
            max_prompt: spec.rollout.max_prompt_tokens,
            max_new: spec.rollout.max_new_tokens,
            max_len: Some(spec.model.max_len),
            env: spec.env.is_some(),
            seed: spec.seed,
            foreign_model: None,
        });
    }
    let prompts = r.graph.node(&stage).and_then(|n| n.record("prompts"));
    let task = runspec::task::task_spec(prompts, false).ok_or_else(|| match prompts {
        Some(p) => format!(
            "`{stage}` reads its prompts from `{}`: `miles data` reads `jsonl`, `parquet` and the built-in tasks",
            p.schema_name
        ),
        None => format!("`{stage}` has no prompt set (`prompts`) to preview"),
    })?;
    let (hf, max_len, foreign_model) = match rollout.model.as_ref() {
        Some(ModelJob::Hf(h)) => (Some(PathBuf::from(&h.path)), Some(h.sizes.max_len as usize), None),
        Some(ModelJob::Transformer { sizes, .. }) => (None, Some(sizes.max_len as usize), None),
        Some(ModelJob::Catalog(c)) => (None, None, Some(c.str("name").unwrap_or("catalog model").to_string())),
        Some(ModelJob::Other { schema }) => (None, None, Some(schema.clone())),
        _ => (None, None, None),
    };
    let limits = rollout.rollout.as_ref();
    Ok(Reading {
        stage,
        task,
        hf,
        extra: String::new(),
        max_prompt: limits.map(|l| l.prompt_tokens.value as usize).filter(|n| *n > 0),
        max_new: limits.map_or(0, |l| l.response_tokens.value as usize),
        max_len,
        env: r.job.episodes().is_some(),
        seed: r.job.seed,
        foreign_model,
    })
}

/// The preview as text and as JSON, and the run's refusal of its split, if any.
struct Preview {
    text: String,
    json: Value,
    refusal: Option<RunError>,
}

fn preview(rd: &Reading, n: usize) -> Result<Preview, RunError> {
    let hf = match &rd.hf {
        Some(p) => Some(HfTokenizer::load(p)?),
        None => None,
    };
    match tasks::data_settings(&rd.task.kind) {
        Some((train, test)) => file_preview(rd, n, &train, test.as_ref(), hf),
        None => generated_preview(rd, n, hf),
    }
}

/// A file's rows: the run's reader, split and tokenizer.
fn file_preview(
    rd: &Reading,
    n: usize,
    settings: &tasks::prompts::DataSettings,
    test_settings: Option<&tasks::prompts::DataSettings>,
    hf: Option<HfTokenizer>,
) -> Result<Preview, RunError> {
    let mut warnings = Vec::new();
    let (rows, test_rows) = tasks::read_rows(&rd.task, settings, test_settings, &mut warnings)?;
    let total = rows.len() + test_rows.as_ref().map_or(0, Vec::len);
    // Where the test rows come from when the split does not draw them.
    let test_from = match (test_settings, &test_rows) {
        (Some(t), _) => Some(t.path.display().to_string()),
        (None, Some(_)) => Some("the test shards the dataset ships".to_string()),
        (None, None) => None,
    };
    let shown: Vec<PromptRow> = rows.iter().take(n).cloned().collect();
    let split = tasks::split_rows(rows, test_rows, settings, &rd.task.split, &mut warnings)?;
    let refusal = split.check(&settings.path, &rd.task.split.by).err();
    // The run's tokenizer: over the rows it trains and tests on (the character one's ids depend
    // on which characters those hold).
    let tokenizer = tasks::data_tokenizer(hf, split.train.iter().chain(&split.test), &rd.extra)?;
    // Where each row went, by its file:line.
    let mut went: HashMap<&str, &str> = HashMap::new();
    for (rows, name) in [(&split.train, "train"), (&split.test, "test"), (&split.dropped, "dropped")] {
        for r in rows {
            went.insert(&r.origin, name);
        }
    }
    let used: Vec<&PromptRow> = split.train.iter().chain(&split.test).collect();
    let lengths = Lengths::measure(&tokenizer, &used)?;

    let mut out = String::new();
    let mut j = serde_json::Map::new();
    let format = match settings.path.extension().and_then(|e| e.to_str()) {
        _ if settings.path.is_dir() => "parquet shards",
        Some("parquet") => "parquet",
        _ => "jsonl",
    };
    let _ = writeln!(out, "rollout `{}`", rd.stage);
    let _ = writeln!(
        out,
        "prompts: {format} {} (prompt field `{}`, label field `{}`): {total} row(s) read",
        settings.path.display(),
        settings.prompt_field,
        settings.label_field
    );
    j.insert("rollout".into(), json!(rd.stage));
    j.insert(
        "source".into(),
        json!({"format": format, "path": settings.path.display().to_string(), "prompt_field": settings.prompt_field,
               "label_field": settings.label_field, "test_path": test_settings.map(|t| t.path.display().to_string()),
               "rows": total}),
    );
    tokenizer_line(&mut out, &mut j, &tokenizer, rd);

    let mut jrows = Vec::new();
    for r in &shown {
        let split = went.get(r.origin.as_str()).copied().unwrap_or("skipped");
        let ids = match tokenizer.encode_prompt(&r.prompt) {
            Ok(ids) => ids,
            Err(e) if split == "train" || split == "test" => return Err(at(r, e)),
            // A row the run leaves out may hold a character the run's character tokenizer lacks.
            Err(_) => {
                let _ = writeln!(out, "\nrow {}, {split}: not tokenized (the run does not read it)", r.origin);
                let _ = writeln!(out, "  | {}", short(r.prompt_key(), 200));
                jrows.push(json!({"origin": r.origin, "split": split, "text": r.prompt_key(), "ids": null,
                                  "tokens": null, "label": r.label, "metadata": r.metadata}));
                continue;
            }
        };
        show_row(&mut out, &tokenizer, r, &ids, split);
        jrows.push(json!({"origin": r.origin, "split": split, "text": visible_text(&tokenizer, &r.prompt, &ids),
                          "ids": ids, "tokens": ids.len(), "label": r.label, "metadata": r.metadata}));
    }
    j.insert("rows".into(), Value::Array(jrows));
    lengths.write(&mut out, &mut j, rd, "train and test rows");

    // The split.
    let s = &rd.task.split;
    let rule = s.by.describe();
    let _ = writeln!(out, "\nsplit: by {rule}, seed {}, test_size {}", s.seed, s.test_size);
    if let Some(from) = &test_from {
        let _ = writeln!(out, "  test rows from {from}, not drawn from the train rows");
    }
    let _ = writeln!(
        out,
        "  train {}, test {}, dropped {}{}",
        split.train.len(),
        split.test.len(),
        split.dropped.len(),
        match &s.by {
            SplitBy::Key(k) => format!(" ({} value(s) of `{k}`)", split.groups),
            _ => String::new(),
        }
    );
    let why = match &s.by {
        SplitBy::Prompt => "a test row has its prompt",
        _ => "a test row has its key",
    };
    if !split.dropped.is_empty() {
        let _ = writeln!(out, "  dropped because {why} (split_by = {rule} keeps them apart):");
    }
    for r in split.dropped.iter().take(DROPPED_SHOWN) {
        let _ = writeln!(out, "    {}: {}", r.origin, short(r.prompt_key(), 60));
    }
    if split.dropped.len() > DROPPED_SHOWN {
        let _ = writeln!(out, "    ... and {} more", split.dropped.len() - DROPPED_SHOWN);
    }
    if let Some(e) = &refusal {
        let _ = writeln!(out, "  the run stops here: {}", e.message);
    }
    j.insert(
        "split".into(),
        json!({"by": rule, "seed": s.seed, "test_size": s.test_size, "train": split.train.len(), "test": split.test.len(),
               "dropped": split.dropped.len(), "groups": (split.groups > 0).then_some(split.groups), "test_from": test_from,
               "dropped_examples": split.dropped.iter().take(DROPPED_SHOWN)
                   .map(|r| json!({"origin": r.origin, "prompt": r.prompt.to_json(), "label": r.label})).collect::<Vec<_>>(),
               "error": refusal.as_ref().map(|e| json!({"code": e.code, "message": e.message, "help": e.help}))}),
    );

    // Malformed rows (skipped under `on_error = skip`; under `stop` the read above stopped).
    let (skipped, other): (Vec<String>, Vec<String>) = warnings.into_iter().partition(|w| w.starts_with("skipped "));
    let skipped: Vec<String> = skipped.into_iter().map(|w| w["skipped ".len()..].to_string()).collect();
    let _ = writeln!(out, "\nmalformed rows skipped: {}", skipped.len());
    for w in &skipped {
        let _ = writeln!(out, "  {w}");
    }
    for w in &other {
        let _ = writeln!(out, "warning: {w}");
    }
    j.insert("malformed".into(), json!(skipped));
    j.insert("warnings".into(), json!(other));
    Ok(Preview { text: out, json: Value::Object(j), refusal })
}

/// A built-in task: problems drawn from the seed, not read from a file.
fn generated_preview(rd: &Reading, n: usize, hf: Option<HfTokenizer>) -> Result<Preview, RunError> {
    let task = TaskSet::build_for(&rd.task, hf, &rd.extra)?;
    let name = serde_json::to_value(&rd.task.kind).ok().and_then(|v| v["type"].as_str().map(str::to_string));
    let name = name.unwrap_or_default();
    let mut out = String::new();
    let mut j = serde_json::Map::new();
    let _ = writeln!(out, "rollout `{}`", rd.stage);
    let _ = writeln!(
        out,
        "prompts: `{name}`, a built-in generated task: each step draws new problems from the seed (no file); \
         the first {n} of step 1:"
    );
    j.insert("rollout".into(), json!(rd.stage));
    j.insert("source".into(), json!({"format": "generated", "task": rd.task.kind}));
    tokenizer_line(&mut out, &mut j, &task.tokenizer, rd);
    let mut jrows = Vec::new();
    for r in task.train_batch(rd.seed, "rollout", 0, n) {
        let ids = task.tokenizer.encode_prompt(&r.prompt)?;
        show_row(&mut out, &task.tokenizer, &r, &ids, "train");
        jrows.push(json!({"split": "train", "text": visible_text(&task.tokenizer, &r.prompt, &ids), "ids": ids,
                          "tokens": ids.len(), "label": r.label, "metadata": r.metadata}));
    }
    j.insert("rows".into(), Value::Array(jrows));
    let test: Vec<&PromptRow> = task.test.iter().collect();
    Lengths::measure(&task.tokenizer, &test)?.write(&mut out, &mut j, rd, "test rows");
    let s = &rd.task.split;
    let _ = writeln!(
        out,
        "\nsplit: by prompt, seed {}: {} test problem(s) held out (test_size {}, at most half of the problems); \
         train problems are drawn each step and never equal a test one",
        s.seed,
        task.test.len(),
        s.test_size
    );
    j.insert(
        "split".into(),
        json!({"by": "prompt", "seed": s.seed, "test_size": s.test_size, "test": task.test.len()}),
    );
    j.insert("malformed".into(), json!([]));
    j.insert("warnings".into(), json!([]));
    Ok(Preview { text: out, json: Value::Object(j), refusal: None })
}

fn tokenizer_line(out: &mut String, j: &mut serde_json::Map<String, Value>, t: &Tokenizer, rd: &Reading) {
    let (text, v) = match (t, &rd.hf) {
        (Tokenizer::Hf(h), Some(p)) => {
            let chat = if h.chat_template().is_some() { "with a chat template" } else { "no chat template" };
            (
                format!("{} (Hugging Face, {} tokens, {chat})", p.display(), t.vocab_size()),
                json!({"kind": "hf", "path": p.display().to_string(), "vocab": t.vocab_size(), "chat_template": h.chat_template().is_some()}),
            )
        }
        _ => {
            let note = match &rd.foreign_model {
                Some(m) => format!(
                    "; the model ({m}) brings no tokenizer here, so lengths are in characters (an `hf` model \
                     directory shows its own tokens)"
                ),
                None => String::new(),
            };
            (
                format!("characters of the data ({} tokens with <pad>, <s>, </s>){note}", t.vocab_size()),
                json!({"kind": "char", "vocab": t.vocab_size(), "model_without_tokenizer": rd.foreign_model}),
            )
        }
    };
    let _ = writeln!(out, "tokenizer: {text}");
    j.insert("tokenizer".into(), v);
}

/// The prompt as the policy is conditioned on it, special tokens written out: a Hugging Face
/// tokenizer's ids decoded with them, the character tokenizer's BOS as `<s>`.
fn visible_text(t: &Tokenizer, prompt: &Prompt, ids: &[u32]) -> String {
    match (t, prompt) {
        (Tokenizer::Hf(h), _) => h.decode(ids, false),
        (Tokenizer::Char(_), Prompt::Text(s)) => format!("<s>{s}"),
        (Tokenizer::Char(_), Prompt::Chat(m)) => m.json.clone(),
    }
}

fn show_row(out: &mut String, t: &Tokenizer, r: &PromptRow, ids: &[u32], split: &str) {
    let origin = if r.origin.is_empty() { String::new() } else { format!("{}, ", r.origin) };
    let _ = writeln!(out, "\nrow {origin}{split}: {} tokens", ids.len());
    for line in visible_text(t, &r.prompt, ids).split('\n') {
        let _ = writeln!(out, "  |{}{line}", if line.is_empty() { "" } else { " " });
    }
    let _ = writeln!(out, "  ids: {}", show_ids(ids));
    let _ = writeln!(out, "  label: {}", short(&r.label.to_string(), 200));
    if !r.metadata.is_empty() {
        let _ = writeln!(out, "  metadata: {}", short(&Value::Object(r.metadata.clone()).to_string(), 200));
    }
}

/// Ids in brackets; a long list as its first and last ones.
fn show_ids(ids: &[u32]) -> String {
    let list = |ids: &[u32]| ids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    if ids.len() <= IDS_SHOWN {
        return format!("[{}]", list(ids));
    }
    let (head, tail) = (IDS_SHOWN * 2 / 3, IDS_SHOWN / 3);
    format!("[{}, ... {} more ..., {}]", list(&ids[..head]), ids.len() - head - tail, list(&ids[ids.len() - tail..]))
}

/// At most `max` characters, with `...` when cut.
fn short(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

fn at(r: &PromptRow, e: RunError) -> RunError {
    if r.origin.is_empty() {
        e
    } else {
        RunError { message: format!("{}: {}", r.origin, e.message), ..e }
    }
}

/// Prompt lengths in tokens (as the run encodes them) and the longest answer.
struct Lengths {
    prompts: Vec<usize>,
    longest_answer: usize,
}

impl Lengths {
    fn measure(t: &Tokenizer, rows: &[&PromptRow]) -> Result<Lengths, RunError> {
        // Rendering and tokenizing every row is the whole cost: spread it over the cores, in
        // contiguous chunks so the lengths keep the rows' order.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
        let chunk = rows.len().div_ceil(threads).max(256);
        let parts: Vec<Result<(Vec<usize>, usize), RunError>> = std::thread::scope(|s| {
            let handles: Vec<_> = rows
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        let (mut lens, mut answer) = (Vec::with_capacity(part.len()), 0);
                        for r in part {
                            lens.push(t.encode_prompt(&r.prompt).map_err(|e| at(r, e))?.len());
                            answer = answer.max(t.encode_answer(&r.label_text()).map_err(|e| at(r, e))?.len());
                        }
                        Ok((lens, answer))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(RunError::internal("a tokenizing thread panicked"))))
                .collect()
        });
        let (mut prompts, mut longest_answer) = (Vec::with_capacity(rows.len()), 0);
        for part in parts {
            let (lens, answer) = part?;
            prompts.extend(lens);
            longest_answer = longest_answer.max(answer);
        }
        Ok(Lengths { prompts, longest_answer })
    }

    /// The histogram with the limits marked, and what a row over them does to the run.
    fn write(&self, out: &mut String, j: &mut serde_json::Map<String, Value>, rd: &Reading, over_what: &str) {
        let lens = &self.prompts;
        let (Some(&lo), Some(&hi)) = (lens.iter().min(), lens.iter().max()) else { return };
        let mean = lens.iter().sum::<usize>() as f64 / lens.len() as f64;
        let _ = writeln!(
            out,
            "\nprompt lengths in tokens, {} {over_what}: min {lo}, mean {mean:.1}, max {hi}; longest answer {} \
             (with its stop token)",
            lens.len(),
            self.longest_answer
        );
        // The run's two bounds on a prompt: the rollout's `max_prompt_tokens`, and the model's
        // `max_len` less the room a response needs (max_new_tokens, or the longest answer).
        let room = rd.max_len.map(|m| m.saturating_sub(rd.max_new.max(self.longest_answer)));
        let mut limits: Vec<(usize, &str, String)> = Vec::new();
        if let Some(m) = rd.max_prompt {
            limits.push((m, "max_prompt_tokens", format!("max_prompt_tokens {m}")));
        }
        if let (Some(room), Some(max_len)) = (room, rd.max_len) {
            if rd.max_prompt != Some(room) {
                let response = if rd.max_new >= self.longest_answer {
                    format!("max_new_tokens {}", rd.max_new)
                } else {
                    format!("the longest answer {}", self.longest_answer)
                };
                limits.push((room, "max_len", format!("max_len {max_len} less {response} = {room}")));
            }
        }
        let width = (hi - lo) / BINS + 1;
        let bins = (hi - lo) / width + 1;
        let mut counts = vec![0usize; bins];
        for &l in lens {
            counts[(l - lo) / width] += 1;
        }
        let most = counts.iter().copied().max().unwrap_or(1).max(1);
        let mut marked = vec![false; limits.len()];
        let mut jbins = Vec::new();
        for (b, &c) in counts.iter().enumerate() {
            let (from, to) = (lo + b * width, (lo + (b + 1) * width - 1).min(hi));
            for (k, (limit, _, name)) in limits.iter().enumerate() {
                if !marked[k] && from > *limit {
                    let _ = writeln!(out, "  {:>13} -- {name} --", "");
                    marked[k] = true;
                }
            }
            let range = if from == to { format!("{from}") } else { format!("{from}-{to}") };
            let bar = "#".repeat((c * 40).div_ceil(most));
            let gap = if bar.is_empty() { "" } else { " " };
            let _ = writeln!(out, "  {range:>11} | {bar}{gap}{c}");
            jbins.push(json!({"from": from, "to": to, "count": c}));
        }
        for (k, (_, _, name)) in limits.iter().enumerate() {
            if !marked[k] {
                let _ = writeln!(out, "  {:>13} -- {name} --", "");
            }
        }
        let over = |limit: usize| lens.iter().filter(|&&l| l > limit).count();
        let mut jlimits = Vec::new();
        for (limit, key, name) in &limits {
            let n = over(*limit);
            let _ = writeln!(out, "  over {name}: {n}");
            jlimits.push(json!({"name": key, "limit": limit, "over": n}));
        }
        if rd.env {
            let _ = writeln!(
                out,
                "  (an environment plays these rows: each episode's first prompt as sent, the row joined to the \
                 reset observation, is checked against max_prompt_tokens when it is played, E0510)"
            );
        } else if limits.iter().any(|(l, _, _)| over(*l) > 0) {
            let _ = writeln!(
                out,
                "  a row over a limit stops the run before its first step (E0510): raise the limit, or leave the \
                 longer rows out of the file"
            );
        }
        if limits.is_empty() {
            let _ = writeln!(out, "  (the rollout sets no limit on a prompt)");
        }
        j.insert(
            "lengths".into(),
            json!({"rows": lens.len(), "min": lo, "max": hi, "mean": mean, "longest_answer": self.longest_answer,
                   "bins": jbins, "limits": jlimits, "max_prompt_tokens": rd.max_prompt, "max_new_tokens": rd.max_new,
                   "max_len": rd.max_len}),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_id_lists_show_their_ends() {
        assert_eq!(show_ids(&[1, 2, 3]), "[1, 2, 3]");
        let ids: Vec<u32> = (0..100).collect();
        assert_eq!(
            show_ids(&ids),
            "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, ... 76 more ..., 92, 93, 94, 95, 96, 97, 98, 99]"
        );
        assert_eq!(short("abcdef", 3), "abc...");
        assert_eq!(short("abc", 3), "abc");
    }
}
