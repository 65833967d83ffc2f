//! Any bytes as `miles.lock` through `Lock::parse` (the TOML reading and the check of every
//! entry: names, URLs, commit ids, hashes): no panic, and an error's spans lie inside the text on
//! character boundaries. A lock that parses renders to a lock that parses to the same entries.
#![no_main]

use libfuzzer_sys::fuzz_target;
use miles_grammar::diag::{Diagnostic, FileId};
use miles_package::lock::Lock;

fn check_diagnostic(d: &Diagnostic, text: &str) {
    for s in d.primary.iter().chain(&d.secondary).map(|l| l.span) {
        let (a, b) = (s.start as usize, s.end as usize);
        assert!(a <= b && b <= text.len(), "span {a}..{b} outside the text");
        assert!(text.is_char_boundary(a) && text.is_char_boundary(b), "span {a}..{b} splits a character");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Lock::parse(FileId(0), text) {
        Ok(lock) => {
            let again = Lock::parse(FileId(0), &lock.render()).expect("a rendered lock parses");
            let (mut a, mut b) = (lock.packages.clone(), again.packages.clone());
            a.sort_by(|x, y| x.name.cmp(&y.name));
            b.sort_by(|x, y| x.name.cmp(&y.name));
            assert_eq!(a, b, "render and parse round-trip");
        }
        Err(d) => check_diagnostic(&d, text),
    }
});
