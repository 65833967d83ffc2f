//! Resolution of 200 packages with a diamond of dependencies, in memory (no git): the
//! resolver's own work. `cargo bench -p miles-package --bench resolve`; figures in bench/RESULTS.md.

use miles_grammar::diag::Diagnostic;
use miles_package::manifest::{Dependency, GitRef, Manifest};
use miles_package::resolve::{resolve, Index};
use std::collections::BTreeMap;
use std::time::Instant;

const N: usize = 200;

/// p0 (the project) depends on p1..p3; every package pi depends on the next three packages
/// (pi+1..pi+3) with `^1.0`, so every package below the top is reached by several paths (a
/// diamond at every level); each package has tags v1.0.0..v1.4.0 and v2.0.0.
struct Mem {
    tags: Vec<(String, String)>,
}

fn manifest(i: usize) -> Manifest {
    let mut dependencies = BTreeMap::new();
    for j in i + 1..(i + 4).min(N) {
        dependencies.insert(
            format!("p{j}"),
            Dependency::Git { url: format!("mem://p{j}"), at: GitRef::Version("^1.0".into()) },
        );
    }
    Manifest {
        name: format!("p{i}"),
        version: semver::Version::new(1, 4, 0),
        description: None,
        license: None,
        dependencies,
        tests: vec![],
        rules: vec![],
    }
}

impl Index for Mem {
    fn tags(&mut self, _url: &str) -> Result<Vec<(String, String)>, String> {
        Ok(self.tags.clone())
    }
    fn commit(&mut self, _url: &str, r: &str) -> Result<String, String> {
        Ok(r.to_string())
    }
    fn manifest_at(&mut self, name: &str, _url: &str, _commit: &str) -> Result<Manifest, Diagnostic> {
        Ok(manifest(name[1..].parse().unwrap_or(0)))
    }
    fn manifest_in(&mut self, _dir: &str) -> Result<Manifest, Diagnostic> {
        Ok(manifest(0))
    }
}

fn main() {
    let mut tags: Vec<(String, String)> = (0..5).map(|m| (format!("v1.{m}.0"), format!("c1{m}"))).collect();
    tags.push(("v2.0.0".into(), "c20".into()));
    let root = manifest(0);
    let mut times = Vec::new();
    for _ in 0..31 {
        let mut idx = Mem { tags: tags.clone() };
        let t = Instant::now();
        let r = resolve(&root, &mut idx, &BTreeMap::new()).expect("resolves");
        times.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(r.len(), N - 1);
        assert!(r.iter().all(|p| p.version == semver::Version::new(1, 4, 0)));
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!(
        "resolve {N} packages (diamonds, 3 edges each): median {:.3} ms, max {:.3} ms over 31 runs",
        times[15], times[30]
    );
}
