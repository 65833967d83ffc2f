//! Any bytes as `miles.toml` through `Manifest::parse` (names, versions, requirements, git URLs,
//! `[[test]]` and `[[rule]]` tables) and `with_dependency` (what `miles add` writes): no panic,
//! and an error's spans lie inside the text on character boundaries.
#![no_main]

use libfuzzer_sys::fuzz_target;
use miles_grammar::diag::FileId;
use miles_package::manifest::{self, Dependency, Manifest};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Manifest::parse(FileId(0), text) {
        Ok(_) => {
            // `miles add` rewrites a manifest that parses; reading its output must not panic.
            let added = manifest::with_dependency(text, "fuzzdep", &Dependency::Path("../fuzzdep".into()));
            let _ = Manifest::parse(FileId(0), &added);
        }
        Err(d) => {
            for s in d.primary.iter().chain(&d.secondary).map(|l| l.span) {
                let (a, b) = (s.start as usize, s.end as usize);
                assert!(a <= b && b <= text.len(), "span {a}..{b} outside the text");
                assert!(text.is_char_boundary(a) && text.is_char_boundary(b), "span {a}..{b} splits a character");
            }
        }
    }
});
