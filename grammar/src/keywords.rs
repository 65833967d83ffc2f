//! The language's keywords, for tools (completion, rename, highlighting). They are written once
//! in `miles.pest`; the tests below fail when the grammar gains or loses one that these lists do
//! not follow.

/// Reserved words: never a name (the grammar's `keyword` rule).
pub const KEYWORDS: &[&str] = &[
    "import",
    "const",
    "enum",
    "interface",
    "schema",
    "stage",
    "check",
    "else",
    "true",
    "false",
    "none",
    "and",
    "or",
    "not",
    "in",
    "is",
    "if",
    "then",
];

/// Contextual keywords: they mean something in one place and stay usable as names elsewhere
/// (`model = ...` is a field).
pub const CONTEXTUAL_KEYWORDS: &[&str] = &["model", "cluster", "recipe", "extends", "on", "as", "at", "warn", "help"];

/// The words that begin a top-level item.
pub const ITEM_KEYWORDS: &[&str] =
    &["import", "const", "enum", "interface", "schema", "stage", "model", "cluster", "recipe"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{MilesParser, Rule};
    use pest::Parser;

    const GRAMMAR: &str = include_str!("miles.pest");

    /// The words of the grammar's `kw_*` rules (`kw_import = @{ "import" ~ !ident_char }`).
    fn grammar_keywords() -> Vec<&'static str> {
        GRAMMAR.lines().filter(|l| l.starts_with("kw_")).filter_map(|l| l.split('"').nth(1)).collect()
    }

    #[test]
    fn every_keyword_of_the_grammar_is_listed_once() {
        let mut listed: Vec<&str> = KEYWORDS.iter().chain(CONTEXTUAL_KEYWORDS).copied().collect();
        let mut in_grammar = grammar_keywords();
        listed.sort_unstable();
        in_grammar.sort_unstable();
        assert_eq!(listed, in_grammar);
    }

    #[test]
    fn reserved_words_are_not_names_and_contextual_ones_are() {
        let is_name = |w: &str| MilesParser::parse(Rule::ident, w).is_ok_and(|p| p.as_str() == w);
        for w in KEYWORDS {
            assert!(!is_name(w), "`{w}` is listed as reserved but the grammar reads it as a name");
        }
        for w in CONTEXTUAL_KEYWORDS {
            assert!(is_name(w), "`{w}` is listed as contextual but the grammar reserves it");
        }
    }

    #[test]
    fn item_keywords_are_the_grammar_item_heads() {
        let head = GRAMMAR.split("item_head = _{").nth(1).and_then(|r| r.split('~').next()).unwrap_or_default();
        let mut words: Vec<&str> = head.split('"').skip(1).step_by(2).collect();
        let mut listed = ITEM_KEYWORDS.to_vec();
        words.sort_unstable();
        listed.sort_unstable();
        assert_eq!(words, listed);
    }
}
