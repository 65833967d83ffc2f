//! `__version__` of a torch wheel's torch/version.py: the version of the libtorch beside it. Read
//! by build.rs (the version miles links) and by `crate::device` (the version a GPU machine has).

pub fn parse_version_py(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix("__version__")?.split('=').nth(1)?.trim();
        Some(v.trim_matches(|c| c == '\'' || c == '"').to_string())
    })
}
