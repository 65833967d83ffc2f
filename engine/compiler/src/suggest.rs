//! "Did you mean": the closest candidate by edit distance, if close enough to help.

/// Edit distance counting a swap of two adjacent characters as one edit (`bsae` -> `base`),
/// the most common typo (optimal string alignment distance).
pub fn levenshtein(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for i in 1..=a.len() {
        cur[0] = i;
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                cur[j] = cur[j].min(before[j - 2] + 1);
            }
        }
        std::mem::swap(&mut before, &mut prev);
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

pub fn did_you_mean<'a>(wanted: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let limit = (wanted.chars().count() / 3).clamp(1, 3);
    let lower = wanted.to_lowercase();
    candidates
        .into_iter()
        .filter(|c| *c != wanted)
        .map(|c| {
            let d = levenshtein(&lower, &c.to_lowercase());
            // A prefix or a case-only difference counts as close.
            let d = if c.to_lowercase() == lower || (lower.len() >= 3 && c.to_lowercase().starts_with(&lower)) {
                0
            } else {
                d
            };
            (d, c)
        })
        .filter(|(d, _)| *d <= limit)
        .min_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(b.1)))
        .map(|(_, c)| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn suggests_close_names() {
        assert_eq!(did_you_mean("rollout_bach", ["rollout_batch", "global_batch"]), Some("rollout_batch".into()));
        assert_eq!(did_you_mean("temprature", ["temperature", "top_p"]), Some("temperature".into()));
        assert_eq!(did_you_mean("xyz", ["temperature"]), None);
        assert_eq!(did_you_mean("bsae", ["base", "fast"]), Some("base".into()));
        assert_eq!(did_you_mean("bf61", ["bf16", "fp32"]), Some("bf16".into()));
        assert_eq!(levenshtein("kitten", "sitting"), 3);
    }
}
