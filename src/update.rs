//! `miles update [NAME]`: resolves again against the repositories' current tags (every package,
//! or only NAME and what it needs) and rewrites miles.lock.

use miles_package::project::Mode;

#[derive(clap::Args)]
pub struct Args {
    /// Update only this package (others stay at their locked versions when they still fit).
    pub name: Option<String>,
}

pub fn run(args: Args) -> u8 {
    let before = crate::packages::project_root(".")
        .ok()
        .and_then(|r| std::fs::read_to_string(miles_compiler::fs::join(&r, miles_package::lock::FILE)).ok())
        .and_then(|t| miles_package::lock::Lock::parse(miles_compiler::FileId(0), &t).ok());
    match crate::packages::build_at(".", &Mode::Update(args.name)) {
        Ok((_, b)) => {
            for p in &b.packages {
                let old = before.as_ref().and_then(|l| l.get(&p.name)).map(|l| l.version.clone());
                match old {
                    Some(v) if v != p.version => eprintln!("updated {} {v} -> {}", p.name, p.version),
                    None => eprintln!("added {} {}", p.name, p.version),
                    _ => {}
                }
            }
            if !b.lock_changed {
                eprintln!("miles.lock is up to date");
            }
            0
        }
        Err(c) => c,
    }
}
