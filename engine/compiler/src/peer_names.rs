//! Names other RL frameworks (TRL, verl, OpenRLHF, slime) give to settings miles has, so that an
//! unknown field written under its foreign name (E0105) is answered with ours: "`epsilon_high` is
//! TRL's name (GRPOConfig): miles calls it `clip_high`", with a rename fix where the value keeps
//! its meaning. The table is data (`peer_names.tsv`, its columns documented at its top), checked
//! against the stdlib by the tests below and rendered into docs/language.md.

use std::sync::OnceLock;

/// One foreign name.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerName {
    pub framework: &'static str,
    /// Where the framework declares it: a config class, a config path or a flag.
    pub origin: &'static str,
    /// As a recipe spells it.
    pub name: &'static str,
    /// Stage kinds or schemas where the name gets this help; empty: any that declares `field`.
    pub applies: Vec<&'static str>,
    /// Ours, or none (then `note` says what to do instead).
    pub target: Option<Target>,
    /// Renaming the field keeps the value's meaning, so a machine-applicable fix may do it.
    pub rename: bool,
    pub note: Option<&'static str>,
}

/// Our field: of the kind the name was written on (`kind` none), or of another stage kind or
/// schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub kind: Option<&'static str>,
    pub field: &'static str,
}

const DATA: &str = include_str!("peer_names.tsv");

/// The table, parsed once. A malformed row is a bug the tests catch; at run time it only costs
/// the help (an empty table), never a panic.
pub fn table() -> &'static [PeerName] {
    static TABLE: OnceLock<Vec<PeerName>> = OnceLock::new();
    TABLE.get_or_init(|| parse(DATA).unwrap_or_default())
}

/// Parses the TSV: `#` comments, one header row, then seven tab-separated columns per row.
pub fn parse(text: &'static str) -> Result<Vec<PeerName>, String> {
    let mut rows = Vec::new();
    let mut header = false;
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        if !header {
            header = true;
            continue;
        }
        let at = i + 1;
        let cols: Vec<&'static str> = line.split('\t').collect();
        if cols.len() != 7 {
            return Err(format!("peer_names.tsv:{at}: {} columns, expected 7", cols.len()));
        }
        let [framework, origin, name, applies, field, fix, note] = [0, 1, 2, 3, 4, 5, 6].map(|c| cols[c].trim());
        if framework.is_empty() || origin.is_empty() || name.is_empty() || applies.is_empty() || field.is_empty() {
            return Err(format!("peer_names.tsv:{at}: an empty column"));
        }
        let applies: Vec<&'static str> =
            if applies == "*" { Vec::new() } else { applies.split(',').map(str::trim).collect() };
        let target = match field {
            "-" => None,
            f => Some(match f.split_once('.') {
                Some((kind, field)) => Target { kind: Some(kind), field },
                None => Target { kind: None, field: f },
            }),
        };
        let rename = match fix {
            "rename" => true,
            "-" => false,
            other => return Err(format!("peer_names.tsv:{at}: fix `{other}`, expected `rename` or `-`")),
        };
        let note = (!note.is_empty()).then_some(note);
        if target.is_none() && (note.is_none() || rename) {
            return Err(format!("peer_names.tsv:{at}: no field of ours: a note says so, and nothing is renamed"));
        }
        if applies.is_empty() && target.as_ref().is_none_or(|t| t.kind.is_some()) {
            return Err(format!("peer_names.tsv:{at}: `*` applies only to a bare field of ours"));
        }
        rows.push(PeerName { framework, origin, name, applies, target, rename, note });
    }
    Ok(rows)
}

/// The rows for `name` written on the stdlib stage kind or schema `decl`; `declares` says whether
/// `decl` has a field (a `*` row applies only where its field exists).
pub fn lookup(decl: &str, name: &str, declares: impl Fn(&str) -> bool) -> Vec<&'static PeerName> {
    table()
        .iter()
        .filter(|r| r.name == name)
        .filter(|r| {
            if r.applies.is_empty() {
                r.target.as_ref().is_some_and(|t| declares(t.field))
            } else {
                r.applies.contains(&decl)
            }
        })
        .collect()
}

/// The help for `name` written on `decl`, from its rows (`lookup`), and the field to rename it to
/// when every row agrees on one rename on `decl` itself.
pub fn help(decl: &str, name: &str, rows: &[&PeerName]) -> Option<(String, Option<&'static str>)> {
    if rows.is_empty() {
        return None;
    }
    // Frameworks that agree (same field, same note) share one sentence.
    let mut groups: Vec<Vec<&PeerName>> = Vec::new();
    for r in rows {
        match groups.iter_mut().find(|g| g[0].target == r.target && g[0].note == r.note && g[0].rename == r.rename) {
            Some(g) => g.push(r),
            None => groups.push(vec![r]),
        }
    }
    let sentences: Vec<String> = groups
        .iter()
        .map(|g| {
            let whose: Vec<String> = g.iter().map(|r| format!("{}'s ({})", r.framework, r.origin)).collect();
            let mut s = format!("`{name}` is {}", join_and(&whose).replacen("'s (", "'s name (", 1));
            match &g[0].target {
                Some(Target { kind: Some(k), field }) if *k != decl => {
                    s.push_str(&format!(": miles calls it `{field}`, a field of {}, not of `{decl}`", describe(k)))
                }
                Some(t) => s.push_str(&format!(": miles calls it `{}`", t.field)),
                None => {}
            }
            if let Some(n) = g[0].note {
                s.push_str(if g[0].target.is_some() { "; " } else { ": " });
                s.push_str(n);
            }
            s
        })
        .collect();
    let rename = match groups.as_slice() {
        [g] if g[0].rename => g[0].target.as_ref().filter(|t| t.kind.is_none_or(|k| k == decl)).map(|t| t.field),
        _ => None,
    };
    Some((sentences.join(". "), rename))
}

/// How a kind holding our field is named in the help.
fn describe(kind: &str) -> String {
    match kind {
        "generate" => "the rollout stage (`generate`)".into(),
        "recipe_settings" => "the recipe".into(),
        k => format!("`{k}`"),
    }
}

fn join_and(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The generated section of docs/language.md (between its `peer-names` markers).
pub fn markdown() -> String {
    let mut s = String::from(
        "<!-- peer-names:begin: generated from engine/compiler/src/peer_names.tsv by \
         `MILES_BLESS=1 cargo test -p miles-compiler --lib peer_names`; do not edit by hand. -->\n\n\
         | framework | where | name | on | miles | fix |\n|---|---|---|---|---|---|\n",
    );
    for r in table() {
        let on = match r.applies.as_slice() {
            [] => "any".to_string(),
            ["recipe_settings"] => "recipe".to_string(),
            kinds => kinds.join(", "),
        };
        let ours = match &r.target {
            Some(Target { kind: Some(k), field }) => format!("`{k}.{field}`"),
            Some(t) => format!("`{}`", t.field),
            None => "none".into(),
        };
        let ours = match r.note {
            Some(n) => format!("{ours}: {}", n.replace('|', "\\|")),
            None => ours,
        };
        s.push_str(&format!(
            "| {} | `{}` | `{}` | {on} | {ours} | {} |\n",
            r.framework,
            r.origin.replace('|', "\\|"),
            r.name,
            if r.rename { "rename" } else { "" }
        ));
    }
    s.push_str("\n<!-- peer-names:end -->");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use miles_grammar::ast::ItemKind;
    use std::collections::{BTreeMap, BTreeSet};

    /// Every stage kind and schema of the embedded stdlib, with its fields.
    fn stdlib_decls() -> BTreeMap<String, BTreeSet<String>> {
        let mut out = BTreeMap::new();
        for (i, (path, text)) in crate::program::STDLIB.iter().enumerate() {
            let (file, diags) = miles_grammar::parse(miles_grammar::diag::FileId(i as u32), text);
            assert!(diags.iter().all(|d| !d.is_error()), "std/{path} does not parse");
            for item in &file.items {
                let (name, fields) = match &item.kind {
                    ItemKind::Stage(s) => (&s.name.name, &s.fields),
                    ItemKind::Schema(s) => (&s.name.name, &s.fields),
                    _ => continue,
                };
                out.insert(name.clone(), fields.iter().map(|f| f.name.name.clone()).collect());
            }
        }
        out
    }

    #[test]
    fn the_table_parses() {
        let rows = parse(DATA).expect("peer_names.tsv");
        assert!(rows.len() > 50, "{} rows", rows.len());
        assert_eq!(table().len(), rows.len());
        let mut seen = BTreeSet::new();
        for r in &rows {
            assert!(seen.insert((r.framework, r.name)), "{} `{}` is listed twice", r.framework, r.name);
            assert!(["TRL", "verl", "OpenRLHF", "slime"].contains(&r.framework), "unknown framework {}", r.framework);
        }
    }

    #[test]
    fn malformed_rows_are_errors() {
        let bad = [
            ("h\nTRL\tX\tname\tgrpo\tlr\trename\n", "columns"),
            ("h\nTRL\tX\tname\tgrpo\tlr\tmaybe\t\n", "fix `maybe`"),
            ("h\nTRL\tX\tname\tgrpo\t-\t-\t\n", "no field of ours"),
            ("h\nTRL\tX\tname\t*\tgenerate.top_k\trename\t\n", "`*`"),
            ("h\nTRL\t\tname\tgrpo\tlr\trename\t\n", "empty column"),
        ];
        for (text, want) in bad {
            let err = parse(text).expect_err(text);
            assert!(err.contains(want), "{err}");
        }
    }

    /// The table cannot rot: every kind it applies to and every field of ours it names is declared
    /// by the stdlib, and no foreign name is (then the row could never fire).
    #[test]
    fn every_field_of_ours_exists_in_the_stdlib() {
        let decls = stdlib_decls();
        assert!(decls.contains_key("grpo") && decls.contains_key("recipe_settings"));
        let mut problems = Vec::new();
        for r in table() {
            let row = format!("{} `{}`", r.framework, r.name);
            for k in &r.applies {
                match decls.get(*k) {
                    None => problems.push(format!("{row}: applies to `{k}`, which the stdlib does not declare")),
                    Some(fields) if fields.contains(r.name) => {
                        problems.push(format!("{row}: `{k}` declares `{}` itself", r.name))
                    }
                    Some(_) => {}
                }
            }
            let Some(t) = &r.target else { continue };
            let homes: Vec<&str> = match t.kind {
                Some(k) => vec![k],
                None if r.applies.is_empty() => {
                    if !decls.values().any(|f| f.contains(t.field)) {
                        problems.push(format!("{row}: no stage kind or schema declares `{}`", t.field));
                    }
                    vec![]
                }
                None => r.applies.clone(),
            };
            for k in homes {
                if !decls.get(k).is_some_and(|f| f.contains(t.field)) {
                    problems.push(format!("{row}: `{k}` has no field `{}`", t.field));
                }
            }
        }
        assert!(problems.is_empty(), "{problems:#?}");
    }

    fn help_on(decl: &str, name: &str) -> Option<(String, Option<&'static str>)> {
        let decls = stdlib_decls();
        let fields = decls.get(decl).cloned().unwrap_or_default();
        help(decl, name, &lookup(decl, name, |f| fields.contains(f)))
    }

    #[test]
    fn a_plain_rename_says_whose_name_and_renames() {
        let (h, fix) = help_on("grpo", "epsilon_high").unwrap();
        assert_eq!(h, "`epsilon_high` is TRL's name (GRPOConfig): miles calls it `clip_high`");
        assert_eq!(fix, Some("clip_high"));
        // Two frameworks agreeing share one sentence and one fix.
        let (h, fix) = help_on("ppo", "eps_clip").unwrap();
        assert_eq!(
            h,
            "`eps_clip` is OpenRLHF's name (--actor.eps_clip, formerly --eps_clip) and slime's (--eps-clip): \
             miles calls it `clip_low`"
        );
        assert_eq!(fix, Some("clip_low"));
    }

    #[test]
    fn a_value_that_changes_gets_no_fix() {
        let (h, fix) = help_on("grpo", "loss_type").unwrap();
        assert!(h.contains("`\"dr_grpo\"` is `constant`") && h.contains("`std_norm = false`"), "{h}");
        assert_eq!(fix, None);
        let (h, fix) = help_on("grpo", "mask_truncated_completions").unwrap();
        assert!(
            h.starts_with("`mask_truncated_completions` is TRL's name (GRPOConfig): miles has no such option;"),
            "{h}"
        );
        assert_eq!(fix, None);
    }

    #[test]
    fn a_field_of_another_stage_names_it_and_is_not_renamed_here() {
        let (h, fix) = help_on("grpo", "num_generations").unwrap();
        assert_eq!(
            h,
            "`num_generations` is TRL's name (GRPOConfig): miles calls it `samples_per_prompt`, a field of \
             the rollout stage (`generate`), not of `grpo`"
        );
        assert_eq!(fix, None);
        // Written on the rollout itself, it is renamed.
        assert_eq!(help_on("generate", "num_generations").unwrap().1, Some("samples_per_prompt"));
    }

    #[test]
    fn frameworks_that_disagree_are_both_told_and_nothing_is_renamed() {
        let (h, fix) = help_on("grpo", "train_batch_size").unwrap();
        assert!(h.contains("miles calls it `rollout_batch`; verl counts prompts per step"), "{h}");
        assert!(
            h.ends_with(". `train_batch_size` is OpenRLHF's name (--train_batch_size, now --train.batch_size): miles calls it `global_batch`"),
            "{h}"
        );
        assert_eq!(fix, None);
    }

    #[test]
    fn a_name_applies_only_where_the_table_says() {
        assert!(help_on("generate", "epsilon_high").is_none());
        assert!(help_on("grpo", "clip_highh").is_none());
        // `*`: wherever the field of ours exists, and nowhere else.
        assert_eq!(help_on("sft", "learning_rate").unwrap().1, Some("lr"));
        assert!(help_on("generate", "learning_rate").is_none());
    }

    #[test]
    fn language_md_section_is_generated_from_the_table() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/language.md");
        let text = std::fs::read_to_string(&path).expect("docs/language.md");
        let begin = text.find("<!-- peer-names:begin").expect("docs/language.md has no peer-names section");
        let end_marker = "<!-- peer-names:end -->";
        let end = text.find(end_marker).expect("docs/language.md has no peer-names end marker") + end_marker.len();
        let want = markdown();
        if std::env::var_os("MILES_BLESS").is_some() && text[begin..end] != want {
            let new = format!("{}{want}{}", &text[..begin], &text[end..]);
            // Write then rename: a reader never sees half a file.
            let tmp = path.with_extension("md.tmp");
            std::fs::write(&tmp, new).expect("write docs/language.md");
            std::fs::rename(&tmp, &path).expect("replace docs/language.md");
            return;
        }
        assert!(
            text[begin..end] == want,
            "docs/language.md's peer-names table is stale: MILES_BLESS=1 cargo test -p miles-compiler --lib peer_names"
        );
    }
}
