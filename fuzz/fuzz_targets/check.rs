//! Any bytes as `main.miles` (with a module it may import, and two `--set` overrides) through the
//! whole check pipeline: no panic, and every diagnostic has a registered code and spans inside
//! their file on character boundaries.
#![no_main]

use libfuzzer_sys::fuzz_target;
use miles_compiler::fs::MemoryFs;
use miles_compiler::{compile, Options};

fuzz_target!(|data: &[u8]| {
    let fs = MemoryFs::new();
    fs.insert("main.miles", data.to_vec());
    fs.insert("lib/helper.miles", b"import ../main\nconst h = 1\n".to_vec());
    let opts = Options {
        overrides: vec![("train.lr".into(), "1e-4".into()), ("stop".into(), "5.steps".into())],
        recipe: None,
    };
    let c = compile(&fs, &["main.miles".to_string()], &opts);
    for d in &c.diagnostics {
        assert!(miles_grammar::codes::lookup(&d.code).is_some(), "unregistered code {}", d.code);
        let spans = d.primary.iter().chain(&d.secondary).map(|l| l.span).chain(d.rule.iter().map(|r| r.span));
        for s in spans {
            let f = c.program.sources.get(s.file).expect("span in a known file");
            let (a, b) = (s.start as usize, s.end as usize);
            assert!(a <= b && b <= f.text.len(), "span {a}..{b} outside {}", f.path);
            assert!(f.text.is_char_boundary(a) && f.text.is_char_boundary(b), "span {a}..{b} splits a character");
        }
    }
});
