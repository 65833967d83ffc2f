//! `miles vendor`: copies every dependency into `vendor/NAME` under the project root, for
//! air-gapped clusters; builds then read those copies (checked against miles.lock's hashes)
//! instead of the cache.

use miles_package::project::{self, Mode, VENDOR};

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> u8 {
    let (p, b) = match crate::packages::build_at(".", &Mode::Locked) {
        Ok(x) => x,
        Err(c) => return c,
    };
    let dir = std::path::Path::new(&p.root).join(VENDOR);
    // Path dependencies are part of the source tree already.
    let git_only = project::Build {
        packages: b.packages.into_iter().filter(|p| p.locked.source.starts_with("git+")).collect(),
        ..b
    };
    match project::vendor(&git_only, &dir) {
        Ok(done) => {
            for (name, path) in done {
                eprintln!("vendored {name} into {}", path.display());
            }
            0
        }
        Err(e) => {
            eprintln!("error: cannot vendor into {}: {e}", dir.display());
            1
        }
    }
}
