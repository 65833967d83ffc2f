//! The code in `miles explain`'s texts (grammar/src/codes.rs, docs/errors.md) is compiled, as
//! docs/language.md's examples are (issue #42: E0401 once advised a field the language does not
//! have).
//!
//! - A ```miles or ```miles,fails block in an explanation checks as documented
//!   (`docs::check_blocks`).
//! - An inline span that is Miles code (a binding `a = b`, a field declaration `a: T`, a block
//!   `kind { ... }`, a call `kind(...)`, a quantity `512.MB`, a bare number) compiles in one of the
//!   places such code stands (an item, a constant, a schema body, a block of a schema or stage
//!   kind that declares its field, a recipe binding) without an error of the language (E00xx,
//!   E01xx, E02xx), or fails there with exactly the code it explains (a deliberate mistake, as
//!   E0202's `1.GB + 2.s`). A span with `...` is a sketch: its words are checked, not compiled.
//! - An inline span that is one word (`max_len`) names something the language has: a keyword,
//!   builtin, or a declaration, field or enum member of the stdlib.
//!
//! Other spans (commands, paths, versions, metric names, prose arithmetic) are not Miles code.

use crate::common;
use crate::docs::{check_blocks, miles_blocks};

use miles_compiler::program::STDLIB;
use miles_grammar::ast::ItemKind;
use miles_grammar::codes::CODES;
use std::collections::BTreeSet;

/// One-word spans of the explanations that are not Miles: commands, `miles.toml` and
/// `miles.lock` keys, and the placeholders of a sketch (`recipe x extends y`).
const NOT_MILES: &[&str] = &["miles", "git", "hash", "sbatch", "scontrol", "y"];

/// The README's recipe, with a hole in each place a snippet may stand.
const RECIPE: &str = "import std/tasks/arith
model policy = transformer { layers = 2, d_model = 64, heads = 4, vocab = arith.vocab }
recipe tiny {
    rollout = generate(policy) {
        prompts = arith.addition { digits = 2 }
        max_new_tokens = 4.tokens
        @generate
    }
    reward = exact_match(rollout) { @exact_match }
    train = grpo(rollout, reward) {
        rollout_batch = 16
        global_batch = 128
        @grpo
    }
    @sync
    @recipe
}
";

/// Stage kinds the recipe above instantiates, and so takes a snippet's field in their block.
const RECIPE_STAGES: &[&str] = &["generate", "exact_match", "grpo", "weights"];

const SYNC: &str = "sync = weights(train -> rollout) { @weights }";

/// The stdlib's declarations: (schema or stage kind, its field names), and every name it has.
struct Stdlib {
    owners: Vec<(String, bool, Vec<String>)>,
    names: BTreeSet<String>,
}

fn stdlib() -> Stdlib {
    let mut owners = Vec::new();
    let mut names: BTreeSet<String> = BTreeSet::new();
    for (i, (_, src)) in STDLIB.iter().enumerate() {
        let (file, _) = miles_grammar::parse(miles_grammar::diag::FileId(i as u32), src);
        for item in &file.items {
            if let Some(n) = item.name() {
                names.insert(n.name.clone());
            }
            match &item.kind {
                ItemKind::Schema(s) => {
                    let fields: Vec<String> = s.fields.iter().map(|f| f.name.name.clone()).collect();
                    owners.push((s.name.name.clone(), false, fields));
                }
                ItemKind::Stage(s) => {
                    let fields: Vec<String> = s.fields.iter().map(|f| f.name.name.clone()).collect();
                    names.extend(s.ports.iter().map(|p| p.name.name.clone()));
                    owners.push((s.name.name.clone(), true, fields));
                }
                ItemKind::Enum(e) => names.extend(e.members.iter().map(|m| m.name.name.clone())),
                _ => {}
            }
        }
    }
    for (_, _, fields) in &owners {
        names.extend(fields.iter().cloned());
    }
    names.extend(miles_grammar::KEYWORDS.iter().map(|k| k.to_string()));
    names.extend(miles_grammar::CONTEXTUAL_KEYWORDS.iter().map(|k| k.to_string()));
    names.extend(miles_compiler::eval::Builtin::names().into_iter().map(str::to_string));
    Stdlib { owners, names }
}

/// The inline code spans of a Markdown text, outside fenced blocks.
fn inline_spans(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let parts: Vec<&str> = line.split('`').collect();
        out.extend(parts.iter().skip(1).step_by(2).map(|s| s.to_string()));
    }
    out
}

fn is_word(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// Miles code, by its shape (see the module's doc).
fn is_code(s: &str) -> bool {
    let starts_ident = s.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let head: String = s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    let after = &s[head.len()..];
    let quantity = s.chars().next().is_some_and(|c| c.is_ascii_digit())
        && s.split('.').skip(1).any(|p| p.starts_with(|c: char| c.is_ascii_alphabetic()));
    let number = !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    quantity
        || number
        || (starts_ident
            && (after.starts_with(" = ")
                || after.starts_with(": ")
                || after.starts_with('(')
                || after.starts_with(" {")))
}

/// The language's error codes: syntax, names, types (checks, plans and runs are not the language).
fn language_codes(c: &miles_compiler::Compilation) -> Vec<&'static str> {
    let mut v: Vec<&'static str> =
        c.diagnostics.iter().map(|d| d.code.as_str()).filter(|c| ["E00", "E01", "E02"].contains(&&c[..3])).collect();
    v.sort();
    v
}

/// The language codes `with` reports beyond `base`'s (as multisets).
fn new_codes(base: &str, with: &str) -> Vec<&'static str> {
    let mut have = language_codes(&common::compile_str(base));
    let mut out = Vec::new();
    for c in language_codes(&common::compile_str(with)) {
        match have.iter().position(|h| *h == c) {
            Some(i) => {
                have.remove(i);
            }
            None => out.push(c),
        }
    }
    out
}

fn recipe(fill: &[(&str, &str)]) -> String {
    let mut r = RECIPE.to_string();
    for (hole, text) in fill {
        r = r.replace(&format!("@{hole}"), text);
    }
    r = r.replace("@sync", SYNC);
    for hole in ["generate", "exact_match", "grpo", "weights", "recipe", "sync"] {
        r = r.replace(&format!("@{hole}"), "");
    }
    r
}

/// (base, with the snippet) for each place `snippet` may stand.
fn hosts(snippet: &str, std: &Stdlib) -> Vec<(String, String)> {
    let mut out = vec![
        (String::new(), format!("import std/tasks/arith\n{snippet}\n")),
        (String::new(), format!("import std/tasks/arith\nconst snippet = {snippet}\n")),
        ("schema snippet {}\n".to_string(), format!("schema snippet {{\n    {snippet}\n}}\n")),
        (recipe(&[]), recipe(&[("recipe", &format!("snippet = {snippet}"))])),
        (recipe(&[]), recipe(&[("recipe", snippet)])),
        // A recipe binding that replaces the weight sync (`sync = weights(...)`).
        (recipe(&[("sync", "")]), recipe(&[("sync", snippet)])),
    ];
    let field = snippet.split_once(" = ").map(|(f, _)| f.trim());
    for (owner, stage, fields) in &std.owners {
        if !field.is_some_and(|f| fields.iter().any(|x| x == f)) {
            continue;
        }
        if !*stage {
            out.push((
                format!("import std/tasks/arith\nconst snippet = {owner} {{}}\n"),
                format!("import std/tasks/arith\nconst snippet = {owner} {{ {snippet} }}\n"),
            ));
        } else if RECIPE_STAGES.contains(&owner.as_str()) {
            out.push((recipe(&[]), recipe(&[(owner.as_str(), snippet)])));
        } else {
            // Another stage kind, fed by the rollout, beside the recipe's own.
            let empty = format!("snippet = {owner}(rollout) {{}}");
            let full = format!("snippet = {owner}(rollout) {{ {snippet} }}");
            out.push((recipe(&[("recipe", &empty)]), recipe(&[("recipe", &full)])));
        }
    }
    out
}

/// Why a span of `code`'s explanation disagrees with the language, if it does.
fn disagreement(code: &str, span: &str, std: &Stdlib) -> Option<String> {
    if is_word(span) {
        return (!std.names.contains(span) && !NOT_MILES.contains(&span))
            .then(|| format!("{code}: `{span}` is no keyword, builtin, declaration, field or enum member"));
    }
    if !is_code(span) {
        return None;
    }
    if span.contains("...") {
        let words: Vec<&str> =
            span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| is_word(w)).collect();
        let unknown: Vec<&&str> = words.iter().filter(|w| !std.names.contains(**w)).collect();
        return (!unknown.is_empty()).then(|| format!("{code}: `{span}` names {unknown:?}, which the language lacks"));
    }
    let mut tried = Vec::new();
    for (base, with) in hosts(span, std) {
        let new = new_codes(&base, &with);
        if new.is_empty() || new.iter().all(|c| *c == code) {
            return None;
        }
        tried.push(new);
    }
    Some(format!("{code}: `{span}` is not valid Miles where such code stands (codes in each place: {tried:?})"))
}

#[test]
fn explanations_hold_code_the_language_accepts() {
    let std = stdlib();
    let mut problems = Vec::new();
    let mut spans = 0;
    for c in CODES {
        let blocks = miles_blocks(c.explanation);
        problems.extend(check_blocks(&format!("the explanation of {}", c.code), &blocks));
        for span in inline_spans(c.explanation) {
            spans += usize::from(is_code(&span) || is_word(&span));
            problems.extend(disagreement(c.code, &span, &std));
        }
    }
    assert!(spans >= 40, "the explanations' code is found ({spans} spans)");
    assert!(problems.is_empty(), "explanations that disagree with the language:\n{}", problems.join("\n"));
}

/// The test tells a span that disagrees from one that agrees: the advice E0401 once gave, a
/// field written as a declaration, an unknown word, against their corrections.
#[test]
fn a_span_the_language_lacks_is_caught() {
    let std = stdlib();
    assert!(disagreement("E0401", "optimizer_offload = stream_from_disk", &std).is_some());
    assert!(disagreement("E0401", "optimizer = adam { state = stream_from_disk }", &std).is_none());
    assert!(disagreement("E0502", "on_error: skip", &std).is_some());
    assert!(disagreement("E0502", "on_error = skip", &std).is_none());
    assert!(disagreement("E0503", "vocab_size", &std).is_some());
    assert!(disagreement("E0503", "vocab", &std).is_none());
    // A deliberate mistake shows its own code, and only where it explains that code.
    assert!(disagreement("E0202", "1.GB + 2.s", &std).is_none());
    assert!(disagreement("E0201", "1.GB + 2.s", &std).is_some());
}
