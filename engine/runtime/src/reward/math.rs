//! The math-answer verifier: the final answer of a response (the last `\boxed{...}`, braces
//! nested, or a GSM8K-style `#### 42` line) against the label, equal as numbers when both read as
//! numbers (`0.5` = `1/2` = `\frac{1}{2}`, `1,234` = `1234`), else equal as normalised text.

/// The final answer of `response`, if it gives one.
pub fn final_answer(response: &str) -> Option<String> {
    let boxed = ["\\boxed{", "\\fbox{"]
        .iter()
        .filter_map(|open| response.rfind(open).map(|i| (i, open.len())))
        .max_by_key(|(i, _)| *i);
    if let Some((i, len)) = boxed {
        let body = &response[i + len..];
        let mut depth = 1usize;
        for (j, c) in body.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(body[..j].trim().to_string());
                    }
                }
                _ => {}
            }
        }
        return None;
    }
    let i = response.rfind("####")?;
    let line = response[i + 4..].lines().next().unwrap_or("").trim();
    (!line.is_empty()).then(|| line.to_string())
}

/// Whether `answer` and `label` say the same.
pub fn equivalent(answer: &str, label: &str) -> bool {
    let (a, b) = (normalise(answer), normalise(label));
    match (number(&a), number(&b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Scores a response against a label: 1 or 0.
pub fn score(response: &str, label: &str) -> f32 {
    let label = final_answer(label).unwrap_or_else(|| label.to_string());
    match final_answer(response) {
        Some(a) if equivalent(&a, &label) => 1.0,
        _ => 0.0,
    }
}

/// Spacing, `$`, `\left`/`\right`, `\dfrac`, `\text{...}` wrappers and a trailing period go.
fn normalise(s: &str) -> String {
    let mut t = s.trim().trim_end_matches('.').to_string();
    for (from, to) in [
        ("\\left", ""),
        ("\\right", ""),
        ("\\!", ""),
        ("\\,", ""),
        ("\\;", ""),
        ("\\ ", ""),
        ("\\dfrac", "\\frac"),
        ("\\tfrac", "\\frac"),
        ("$", ""),
    ] {
        t = t.replace(from, to);
    }
    if let Some(inner) = t.strip_prefix("\\text{").and_then(|r| r.strip_suffix('}')) {
        t = inner.to_string();
    }
    t.chars().filter(|c| !c.is_whitespace()).collect()
}

/// An exact rational, reduced, denominator positive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ratio(i128, i128);

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 {
        a.abs()
    } else {
        gcd(b, a % b)
    }
}

impl Ratio {
    fn new(n: i128, d: i128) -> Option<Ratio> {
        if d == 0 {
            return None;
        }
        let g = gcd(n, d).max(1);
        let s = if d < 0 { -1 } else { 1 };
        Some(Ratio(s * n / g, s * d / g))
    }

    fn div(self, o: Ratio) -> Option<Ratio> {
        Ratio::new(self.0.checked_mul(o.1)?, self.1.checked_mul(o.0)?)
    }
}

/// `-12`, `1,234.5`, `0.5`, `.5`, `3/4`, `\frac{3}{4}`, `\frac34`, `-\frac{1}{2}`, `50\%`.
fn number(s: &str) -> Option<Ratio> {
    let s = s.strip_suffix("\\%").or_else(|| s.strip_suffix('%')).unwrap_or(s);
    if let Some(rest) = s.strip_prefix('-') {
        let r = number(rest)?;
        return Ratio::new(-r.0, r.1);
    }
    if let Some(rest) = s.strip_prefix("\\frac") {
        let (num, rest) = group(rest)?;
        let (den, rest) = group(rest)?;
        if !rest.is_empty() {
            return None;
        }
        return number(num)?.div(number(den)?);
    }
    if let Some((n, d)) = s.split_once('/') {
        return number(n)?.div(number(d)?);
    }
    decimal(s)
}

/// A `{...}` group or a single character: LaTeX's argument rule (`\frac34`).
fn group(s: &str) -> Option<(&str, &str)> {
    if let Some(body) = s.strip_prefix('{') {
        let mut depth = 1;
        for (i, c) in body.char_indices() {
            depth += match c {
                '{' => 1,
                '}' => -1,
                _ => 0,
            };
            if depth == 0 {
                return Some((&body[..i], &body[i + 1..]));
            }
        }
        return None;
    }
    let c = s.chars().next()?;
    Some(s.split_at(c.len_utf8()))
}

fn decimal(s: &str) -> Option<Ratio> {
    // Thousands separators only where they group by three: `1,234` but not the pair `1,2`.
    let plain = if s.contains(',') {
        let (int, frac) = s.split_once('.').map(|(i, f)| (i, Some(f))).unwrap_or((s, None));
        let parts: Vec<&str> = int.split(',').collect();
        let grouped = !parts[0].is_empty() && parts[0].len() <= 3 && parts[1..].iter().all(|p| p.len() == 3);
        if !grouped {
            return None;
        }
        let mut t = parts.concat();
        if let Some(f) = frac {
            t.push('.');
            t.push_str(f);
        }
        t
    } else {
        s.to_string()
    };
    let (int, frac) = plain.split_once('.').unwrap_or((&plain, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let n: i128 =
        digits.trim_start_matches('0').parse().ok().or_else(|| digits.chars().all(|c| c == '0').then_some(0))?;
    let d = 10i128.checked_pow(frac.len() as u32)?;
    Ratio::new(n, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_answers() {
        let cases = [
            ("so \\boxed{42}.", Some("42")),
            ("\\boxed{1} then \\boxed{\\frac{1}{2}}", Some("\\frac{1}{2}")),
            ("\\boxed{\\{1,2\\}}", Some("\\{1,2\\}")),
            ("\\boxed{a^{2}+b_{i}}", Some("a^{2}+b_{i}")),
            ("\\boxed{unclosed", None),
            ("Natalia sold 48.\n#### 72\n", Some("72")),
            ("#### ", None),
            ("no answer", None),
            ("\\fbox{7}", Some("7")),
        ];
        for (text, want) in cases {
            assert_eq!(final_answer(text).as_deref(), want, "{text}");
        }
    }

    #[test]
    fn equivalence() {
        let same = [
            ("0.5", "1/2"),
            ("\\frac{1}{2}", "0.5"),
            ("\\dfrac12", ".5"),
            ("-\\frac{3}{4}", "-0.75"),
            ("1,234", "1234"),
            ("1,234,567.50", "1234567.5"),
            ("$42$", "42"),
            ("42.", "42"),
            ("042", "42"),
            ("50\\%", "50"),
            ("\\text{east}", "east"),
            ("x + 1", "x+1"),
            ("\\left(1,2\\right)", "(1,2)"),
            ("0", "0.000"),
        ];
        for (a, b) in same {
            assert!(equivalent(a, b), "{a} vs {b}");
        }
        let differ = [("1,2", "12"), ("0.5", "0.51"), ("1/0", "0"), ("x", "y"), ("12,34", "1234"), ("1/3", "0.333")];
        for (a, b) in differ {
            assert!(!equivalent(a, b), "{a} vs {b}");
        }
    }

    #[test]
    fn scores() {
        assert_eq!(score("The total is \\boxed{\\frac{6}{4}}", "1.5"), 1.0);
        assert_eq!(score("#### 1,000", "1000"), 1.0);
        // A GSM8K label carries its own `#### answer` line.
        assert_eq!(score("#### 72", "48 + 24 = 72\n#### 72"), 1.0);
        assert_eq!(score("I think 72", "72"), 0.0);
        assert_eq!(score("\\boxed{71}", "72"), 0.0);
    }
}
