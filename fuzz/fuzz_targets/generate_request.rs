//! `miles serve`'s `/generate` body as the server reads it (JSON, SGLang's shape, the limits):
//! no panic, and a body the default limits accept never asks for more completions than
//! `--max-prompts` × `--max-n` allow. HTTP framing itself is hyper's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use miles_workers::http::{check_generate_body, Limits};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    if let Ok(completions) = check_generate_body(data, &limits) {
        assert!(completions <= limits.max_prompts.saturating_mul(limits.max_n));
    }
});
