//! Quoting outside text in a message (what a reward returned, a program's last words, a line
//! that did not parse): at most so many characters, marked when cut.

/// At most `max` characters of `s`, marked when cut: failures quote what a reward returned.
pub fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((i, _)) => format!("{}… ({} bytes in all)", &s[..i], s.len()),
    }
}

/// The last `max` characters of `s`, marked when cut: a program's last words.
pub fn truncate_tail(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let start = s.char_indices().nth(n - max).map(|(i, _)| i).unwrap_or(0);
    format!("…{}", &s[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation() {
        assert_eq!(truncate("abc", 5), "abc");
        assert_eq!(truncate("abcdef", 3), "abc… (6 bytes in all)");
        assert_eq!(truncate("ééé", 1), "é… (6 bytes in all)");
        assert_eq!(truncate_tail("abcdef", 2), "…ef");
        assert_eq!(truncate_tail("ab", 2), "ab");
    }
}
