//! Rename: the same search as find references (every analysis given, so a library constant is
//! renamed in each open recipe that uses it), refused for the read-only stdlib and for names that
//! are not identifiers.

use crate::analysis::Analysis;
use crate::references::{references, Found};
use miles_grammar::diag::{FileId, Span};

/// The name under the cursor, if it can be renamed: its span, or why not.
pub fn prepare_rename(a: &Analysis, file: FileId, offset: usize) -> Result<Span, String> {
    let Some((span, def)) = a.resolve(file, offset) else { return Err("no name to rename here".into()) };
    if a.program().module(def.module).is_std {
        return Err(format!("`{}` is declared in the standard library, which is read-only", def.name));
    }
    Ok(span)
}

/// The edits that rename the name under the cursor (at `file`/`offset` of `analyses[at]`) in
/// all `analyses`, or why it cannot be renamed.
pub fn rename(
    analyses: &[&Analysis],
    at: usize,
    file: FileId,
    offset: usize,
    new_name: &str,
) -> Result<Vec<(Found, String)>, String> {
    let Some(a) = analyses.get(at) else { return Err("no name to rename here".into()) };
    prepare_rename(a, file, offset)?;
    if !is_identifier(new_name) {
        return Err(format!("`{new_name}` is not a valid name"));
    }
    let found = references(analyses, at, file, offset, true);
    Ok(found.into_iter().map(|f| (f, new_name.to_string())).collect())
}

pub use miles_grammar::KEYWORDS;

pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&s)
}

#[cfg(test)]
mod tests {
    use super::is_identifier;
    use crate::fixture::{loc, recipe, text_of, Fixture};
    use insta::assert_snapshot;

    /// Renames the cursor's name to `new_name` with the analyses of `open` documents (the
    /// cursor's document first): one line per edit, or the refusal.
    fn check(fixture: &str, open: &[&str], new_name: &str) -> String {
        let fx = Fixture::parse(fixture);
        let (analyses, file) = fx.open_documents(open);
        let refs: Vec<&crate::Analysis> = analyses.iter().collect();
        match super::rename(&refs, 0, file, fx.offset, new_name) {
            Ok(edits) => edits
                .into_iter()
                .map(|(f, t)| {
                    let a = refs[f.analysis];
                    format!("{} `{}` -> {t}\n", loc(a, f.span), text_of(a, f.span))
                })
                .collect(),
            Err(e) => format!("error: {e}"),
        }
    }

    #[test]
    fn identifiers() {
        assert!(is_identifier("train_2"));
        assert!(!is_identifier("2train"));
        assert!(!is_identifier("check"));
    }

    #[test]
    fn a_constant() {
        let fx = "const ba$0se = 2\nconst twice = base * 2\nconst list = [base, twice]\n";
        assert_snapshot!(check(fx, &[], "renamed"), @r"
        main.miles:1:7-1:11 `base` -> renamed
        main.miles:2:15-2:19 `base` -> renamed
        main.miles:3:15-3:19 `base` -> renamed
        ");
        assert_snapshot!(check(fx, &[], "check"), @"error: `check` is not a valid name");
    }

    #[test]
    fn a_library_constant_in_every_open_document_that_uses_it() {
        // The bug this guards: rename searched only the cursor document's analysis, so renaming
        // a library constant left the open recipes that use it unchanged (and broken).
        let fx = recipe("").replace("const peak_lr", "const pea$0k_lr");
        assert_snapshot!(check(&fx, &["main.miles"], "top_lr"), @r"
        lib/common.miles:2:7-2:14 `peak_lr` -> top_lr
        main.miles:16:32-16:39 `peak_lr` -> top_lr
        ");
    }

    #[test]
    fn not_in_the_stdlib() {
        let fx = recipe("").replace("train  = grpo(", "train  = gr$0po(");
        assert_snapshot!(check(&fx, &[], "x"), @"error: `grpo` is declared in the standard library, which is read-only");
    }
}
