//! `miles fetch`: brings every locked dependency into the cache (checking its hash), so later
//! checks, plans and runs work offline.

use miles_package::project::Mode;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> u8 {
    match crate::packages::build_at(".", &Mode::Locked) {
        Ok((_, b)) => {
            for (line, p) in crate::packages::describe(&b).iter().zip(&b.packages) {
                println!("{line}: {}", p.root);
            }
            0
        }
        Err(c) => c,
    }
}
