//! Find references: every use of the name under the cursor, in every analysis given.
//!
//! The language server keeps one analysis per open document, each compiled on its own with its
//! own `FileId`s; a library module's constant is used by each recipe that imports it. So the
//! definition is matched across analyses by its file's path and offsets, never by `FileId`.

use crate::analysis::Analysis;
use miles_grammar::diag::{FileId, Span};

/// A span in one of the analyses searched: `analyses[analysis]`, in that analysis's file ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub analysis: usize,
    pub span: Span,
}

/// Every use of the name under the cursor (at `file`/`offset` of `analyses[at]`) in all
/// `analyses`, and its declaration when `include_declaration`. Sorted by path and offset, each
/// place once.
pub fn references(
    analyses: &[&Analysis],
    at: usize,
    file: FileId,
    offset: usize,
    include_declaration: bool,
) -> Vec<Found> {
    let Some(here) = analyses.get(at) else { return Vec::new() };
    let Some((_, def)) = here.resolve(file, offset) else { return Vec::new() };
    let Some(path) = here.program().sources.get(def.span.file).map(|f| f.path.as_str()) else { return Vec::new() };
    let mut out: Vec<(&str, Found)> = Vec::new();
    for (i, a) in analyses.iter().enumerate() {
        let Some(f) = a.file_id(path) else { continue };
        let target = Span { file: f, start: def.span.start, end: def.span.end };
        let mut spans: Vec<Span> = a.refs.iter().filter(|(_, d)| *d == target).map(|(u, _)| *u).collect();
        if include_declaration {
            spans.push(target);
        }
        for s in spans {
            let Some(p) = a.program().sources.get(s.file).map(|f| f.path.as_str()) else { continue };
            if !out.iter().any(|(q, x)| *q == p && x.span.start == s.start && x.span.end == s.end) {
                out.push((p, Found { analysis: i, span: s }));
            }
        }
    }
    out.sort_by_key(|(p, x)| (*p, x.span.start));
    out.into_iter().map(|(_, x)| x).collect()
}

#[cfg(test)]
mod tests {
    use crate::fixture::{loc, recipe, text_of, Fixture};
    use insta::assert_snapshot;

    /// References of the cursor's name, searched in the analyses of `open` documents (the
    /// cursor's document first), one line each.
    pub fn check(fixture: &str, open: &[&str]) -> String {
        let fx = Fixture::parse(fixture);
        let (analyses, file) = fx.open_documents(open);
        let refs: Vec<&crate::Analysis> = analyses.iter().collect();
        super::references(&refs, 0, file, fx.offset, true)
            .into_iter()
            .map(|f| format!("{} `{}`\n", loc(refs[f.analysis], f.span), text_of(refs[f.analysis], f.span)))
            .collect()
    }

    #[test]
    fn across_open_documents() {
        // The cursor is in lib/common.miles; the recipe that uses it is open too.
        let fx = recipe("").replace("const peak_lr", "const pea$0k_lr");
        assert_snapshot!(check(&fx, &["main.miles"]), @r"
        lib/common.miles:2:7-2:14 `peak_lr`
        main.miles:16:32-16:39 `peak_lr`
        ");
        // Alone, the library's own analysis knows no uses.
        assert_snapshot!(check(&fx, &[]), @"lib/common.miles:2:7-2:14 `peak_lr`");
    }

    #[test]
    fn of_a_stage_instance() {
        let fx = recipe("").replace("reward = exact_match(rollout)", "reward = exact_match(roll$0out)");
        assert_snapshot!(check(&fx, &[]), @r"
        main.miles:8:5-8:12 `rollout`
        main.miles:12:26-12:33 `rollout`
        main.miles:13:19-13:26 `rollout`
        main.miles:19:29-19:36 `rollout`
        ");
    }
}
