//! String verifiers: exact match, normalised match (case, whitespace and punctuation ignored),
//! and a regex the response must match (with an `answer` group compared to the label).

use regex::Regex;

/// Byte-for-byte equal.
pub fn exact(response: &str, label: &str) -> f32 {
    f32::from(u8::from(response == label))
}

/// Lower case, punctuation removed, whitespace runs collapsed, trimmed.
pub fn normalise(s: &str) -> String {
    let kept: String = s.chars().filter(|c| !c.is_ascii_punctuation()).flat_map(char::to_lowercase).collect();
    kept.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Equal after [`normalise`].
pub fn normalised(response: &str, label: &str) -> f32 {
    f32::from(u8::from(normalise(response) == normalise(label)))
}

/// 1 when `pattern` matches the response; when the pattern has a group named `answer`, its text
/// must also equal the label after [`normalise`] (the last match counts: the final answer).
pub fn regex(pattern: &Regex, response: &str, label: &str) -> f32 {
    let hit = if pattern.capture_names().any(|n| n == Some("answer")) {
        pattern
            .captures_iter(response)
            .last()
            .and_then(|c| c.name("answer").map(|m| normalise(m.as_str()) == normalise(label)))
            .unwrap_or(false)
    } else {
        pattern.is_match(response)
    };
    f32::from(u8::from(hit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_matches() {
        assert_eq!(exact("Paris", "Paris"), 1.0);
        assert_eq!(exact("Paris ", "Paris"), 0.0);
        assert_eq!(normalise("  The  Eiffel-Tower!\n"), "the eiffeltower");
        assert_eq!(normalised("paris.", "Paris"), 1.0);
        assert_eq!(normalised("Rome", "Paris"), 0.0);
    }

    #[test]
    fn regexes() {
        let any = Regex::new(r"^\d+$").unwrap();
        assert_eq!(regex(&any, "123", ""), 1.0);
        assert_eq!(regex(&any, "12a", ""), 0.0);
        let ans = Regex::new(r"Answer:\s*(?P<answer>[^\n]+)").unwrap();
        assert_eq!(regex(&ans, "Answer: 3\nAnswer: Paris.", "paris"), 1.0);
        assert_eq!(regex(&ans, "Answer: Paris\nAnswer: Rome", "paris"), 0.0);
        assert_eq!(regex(&ans, "Paris", "paris"), 0.0);
    }
}
