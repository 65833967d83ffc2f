//! `miles test [DIR]`: runs the `[[test]]` tables of a package's miles.toml: each names a recipe
//! file that must pass, or must fail with a given check, so a library's house rules are tested.

use crate::diagnostics::emit;
use crate::files::DiskFs;
use crate::DiagFormat;
use miles_compiler::{Program, Sources};
use miles_package::project::Mode;
use miles_package::testing;

#[derive(clap::Args)]
pub struct Args {
    /// The package's directory (default: the one holding the nearest miles.toml).
    #[arg(default_value = ".")]
    pub dir: String,
}

pub fn run(args: Args) -> u8 {
    let (p, b) = match crate::packages::build_at(&args.dir, &Mode::Locked) {
        Ok(x) => x,
        Err(c) => return c,
    };
    if p.manifest.tests.is_empty() {
        eprintln!("{}: no [[test]] in miles.toml (docs/packages.md shows how to declare one)", p.manifest.name);
        return 0;
    }
    let outcomes = testing::run(&p, &b.map, &DiskFs);
    let mut failed = 0;
    for o in &outcomes {
        let what = o.name();
        if let Some(d) = o.diagnostic() {
            failed += 1;
            println!("test {what} ... FAILED");
            emit(&Sources::default(), &[d], DiagFormat::Auto);
            let Program { sources, .. } = &o.compilation.program;
            emit(sources, &o.compilation.diagnostics, DiagFormat::Auto);
        } else {
            println!("test {what} ... ok");
        }
    }
    println!("{}: {} passed, {failed} failed", if failed == 0 { "ok" } else { "FAILED" }, outcomes.len() - failed);
    u8::from(failed > 0)
}
