//! Packages over real (local) git repositories, offline: the lock pins a version, `update` moves
//! it and a stricter upstream rule then fails the team's recipe, a clean cache resolves the same
//! bytes, and each bad input is one diagnostic with its code.

use miles_compiler::fs::FileSystem;
use miles_compiler::{compile_in, Options, Sources};
use miles_package::cache::Cache;
use miles_package::project::{self, Mode};
use miles_package::{hash, testing};
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) struct Disk;
impl FileSystem for Disk {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| e.to_string())
    }
}

pub(crate) fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "tag.gpgsign=false",
            "-c",
            "commit.gpgsign=false",
        ])
        .args(args)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

pub(crate) fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

const BASE_V1: &str = r#"//! The platform's GRPO base recipe and its house rules.
import std/tasks/arith

/// The platform's default policy.
model policy = transformer { layers = 2, d_model = 64, heads = 4, vocab = arith.vocab }

/// The base every team's GRPO recipe extends.
recipe grpo_base {
    rollout = generate(policy) { prompts = arith.addition {}, max_new_tokens = 4.tokens }
    reward  = exact_match(rollout)
    train   = grpo(rollout, reward) { rollout_batch = 32, global_batch = 256 }
    sync    = weights(train -> rollout)
    /// A learning rate above 1e-3 diverges on our fleet.
    check train.lr <= 1e-3 else "house rule: the GRPO learning rate is at most 1e-3"
}
"#;

const STRICTER: &str = "    /// Since 1.1: measured divergence above 1e-4.\n    check train.lr <= 1e-4 else \"house rule 1.1: the GRPO learning rate is at most 1e-4\"\n}\n";

fn manifest(v: &str) -> String {
    format!("[package]\nname = \"platform\"\nversion = \"{v}\"\ndescription = \"Base recipes and house rules\"\nlicense = \"Apache-2.0\"\n\n[[test]]\nfile = \"tests/too_fast.miles\"\nexpect = \"fail\"\ncheck = \"house rule\"\n")
}

/// A library repository with tag v1.0.0; its URL.
fn library(tmp: &Path) -> String {
    let lib = tmp.join("platform");
    std::fs::create_dir_all(&lib).expect("mkdir");
    git(&lib, &["init", "-q"]);
    write(&lib.join("miles.toml"), &manifest("1.0.0"));
    write(&lib.join("grpo/base.miles"), BASE_V1);
    write(
        &lib.join("tests/too_fast.miles"),
        "import ../grpo/base { grpo_base }\n\nrecipe too_fast extends grpo_base {\n    train.lr = 2e-3\n}\n",
    );
    git(&lib, &["add", "-A"]);
    git(&lib, &["commit", "-qm", "v1.0.0"]);
    git(&lib, &["tag", "-a", "v1.0.0", "-m", "v1.0.0"]);
    format!("file://{}", lib.display())
}

/// Releases v1.1.0 of the library, which adds a stricter check.
fn release_1_1(tmp: &Path) {
    let lib = tmp.join("platform");
    write(&lib.join("miles.toml"), &manifest("1.1.0"));
    write(&lib.join("grpo/base.miles"), &BASE_V1.replacen("1e-3\"\n}\n", &format!("1e-3\"\n{STRICTER}"), 1));
    git(&lib, &["commit", "-qam", "v1.1.0"]);
    git(&lib, &["tag", "v1.1.0"]);
}

fn project(tmp: &Path, deps: &str) -> String {
    let team = tmp.join("team");
    write(
        &team.join("miles.toml"),
        &format!("[package]\nname = \"team\"\nversion = \"0.1.0\"\n\n[dependencies]\n{deps}\n"),
    );
    write(
        &team.join("recipes/team.miles"),
        "import platform/grpo/base { grpo_base }\n\nrecipe team_grpo extends grpo_base {\n    train.lr = 5e-4\n}\n",
    );
    team.to_string_lossy().into_owned()
}

pub(crate) fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("miles-pkg-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp");
    d
}

/// Every entry of the cache's `src/` and `git/`, temporary ones included.
pub(crate) fn cache_entries(cache: &Cache) -> Vec<String> {
    let mut out = Vec::new();
    for sub in ["src", "git"] {
        if let Ok(rd) = std::fs::read_dir(cache.home.join(sub)) {
            out.extend(rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()));
        }
    }
    out
}

#[test]
fn lock_pins_update_moves_and_the_new_rule_fails_with_its_home() {
    let t = tmp("accept");
    let url = library(&t);
    let team = project(&t, &format!("platform = {{ git = \"{url}\", version = \"^1.0\" }}"));
    let cache = Cache { home: t.join("cache") };
    let mut sources = Sources::default();
    let p = project::open(&team, &mut sources).expect("manifest");
    let b = project::build(&p, &cache, &Mode::Locked, &mut sources).expect("builds");
    assert!(b.lock_changed);
    let lock_v1 = std::fs::read_to_string(t.join("team/miles.lock")).expect("lock written");
    assert!(lock_v1.contains("version = \"1.0.0\"") && lock_v1.contains("reference = \"v1.0.0\""), "{lock_v1}");
    let entry = format!("{team}/recipes/team.miles");
    let c = compile_in(&Disk, std::slice::from_ref(&entry), &Options::default(), &b.map);
    assert!(!c.has_errors(), "{:#?}", c.diagnostics);

    // The library releases 1.1.0; a build keeps the pinned 1.0.0 and changes nothing.
    release_1_1(&t);
    let again = project::build(&p, &cache, &Mode::Locked, &mut sources).expect("builds");
    assert!(!again.lock_changed && again.lock.packages[0].version == "1.0.0");

    // `miles update`: v1.1.0, whose stricter rule the team's recipe breaks.
    let b = project::build(&p, &cache, &Mode::Update(None), &mut sources).expect("updates");
    assert!(b.lock.packages[0].version == "1.1.0", "{:?}", b.lock);
    let c = compile_in(&Disk, std::slice::from_ref(&entry), &Options::default(), &b.map);
    let d = c.diagnostics.iter().find(|d| d.is_error()).expect("the new rule fails");
    assert!(d.message.contains("house rule 1.1"), "{d:#?}");
    let home = &c.program.sources.get(d.primary.as_ref().expect("span").span.file).expect("file").path;
    assert!(home.starts_with(&b.packages[0].root) && home.ends_with("grpo/base.miles"), "rule shown at {home}");

    // The same lock on a clean machine: byte-identical sources.
    let clean = Cache { home: t.join("clean-cache") };
    let b2 = project::build(&p, &clean, &Mode::Locked, &mut sources).expect("builds from the lock");
    assert!(!b2.lock_changed);
    let (a, z) = (Path::new(&b.packages[0].root), Path::new(&b2.packages[0].root));
    assert_ne!(a, z);
    assert_eq!(hash::tree(a).expect("hash"), hash::tree(z).expect("hash"));
    assert_eq!(Some(hash::tree(z).expect("hash")), b2.lock.packages[0].hash);

    // The library's own tests pass at v1.1.0 (the too-fast recipe fails the house rule).
    let mut s = Sources::default();
    let lib = project::open(&b.packages[0].root, &mut s).expect("library manifest");
    let lib_build = project::build(&lib, &clean, &Mode::Locked, &mut s).expect("no deps");
    let outcomes = testing::run(&lib, &lib_build.map, &Disk);
    assert!(outcomes.len() == 1 && outcomes[0].passed, "{}", outcomes[0].why);

    // Cached sources are read-only (an editor's go to definition opens them), yet deletable.
    let cached = z.join("grpo/base.miles");
    assert!(std::fs::metadata(&cached).expect("cached file").permissions().readonly());

    // Tampering with the cached copy is caught, with the package and both hashes.
    let mut perm = std::fs::metadata(&cached).expect("cached file").permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perm.set_readonly(false);
    std::fs::set_permissions(&cached, perm).expect("chmod");
    std::fs::write(&cached, "// edited\n").expect("tamper");
    let e = project::build(&p, &clean, &Mode::Locked, &mut sources).err().expect("mismatch");
    assert_eq!(e.code, "E0116");
    assert!(e.message.contains("`platform`") && e.message.matches("sha256:").count() == 2, "{}", e.message);
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn bad_inputs_are_diagnostics_with_codes() {
    let t = tmp("bad");
    let url = library(&t);
    release_1_1(&t);
    let cache = Cache { home: t.join("cache") };
    let err = |deps: &str| {
        let team = project(&t, deps);
        let _ = std::fs::remove_file(t.join("team/miles.lock"));
        let mut sources = Sources::default();
        let p = project::open(&team, &mut sources).expect("manifest");
        project::build(&p, &cache, &Mode::Locked, &mut sources).err().expect("fails")
    };
    let e = err(&format!("platform = {{ git = \"{url}\", tag = \"v9.9.9\" }}"));
    assert!(e.code == "E0115" && e.help.as_deref().unwrap_or("").contains("v1.1.0"), "{e:?}");
    let e = err(&format!("platform = {{ git = \"{url}\", version = \"^2\" }}"));
    assert_eq!(e.code, "E0115", "{e:?}");
    let before = cache_entries(&cache);
    let e = err("platform = { git = \"file:///nonexistent/repo.git\", version = \"^1\" }");
    assert_eq!(e.code, "E0114", "{e:?}");
    assert_eq!(cache_entries(&cache), before, "a failed fetch leaves nothing behind");
    let e = err(&format!(
        "platform = {{ git = \"{url}\", version = \"^1.0\" }}\nother = {{ git = \"{url}\", tag = \"v1.0.0\" }}"
    ));
    assert_eq!(e.code, "E0117", "{e:?}");

    // Path dependencies: a cycle, and two versions of one package asked by two chains.
    write(
        &t.join("a/miles.toml"),
        "[package]\nname = \"a\"\nversion = \"1.0.0\"\n[dependencies]\nb = { path = \"../b\" }\n",
    );
    write(
        &t.join("b/miles.toml"),
        "[package]\nname = \"b\"\nversion = \"1.0.0\"\n[dependencies]\na = { path = \"../a\" }\n",
    );
    let e = err("a = { path = \"../a\" }");
    assert_eq!(e.code, "E0113");
    assert!(e.message.contains("a -> b -> a"), "{}", e.message);
    write(
        &t.join("mid/miles.toml"),
        &format!("[package]\nname = \"mid\"\nversion = \"1.0.0\"\n[dependencies]\nplatform = {{ git = \"{url}\", version = \"=1.0.0\" }}\n"),
    );
    let e = err(&format!("platform = {{ git = \"{url}\", version = \"^1.1\" }}\nmid = {{ path = \"../mid\" }}"));
    assert_eq!(e.code, "E0118", "{e:?}");
    assert!(
        e.message.contains("team -> platform wants") && e.message.contains("team -> mid -> platform wants"),
        "{}",
        e.message
    );

    // A manifest syntax error names its line.
    write(&t.join("broken/miles.toml"), "[package]\nname = \"x\"\nversion = \"1.0.0\"\n[dependencies\n");
    let mut sources = Sources::default();
    let e = project::open(&t.join("broken").to_string_lossy(), &mut sources).err().expect("fails");
    assert_eq!(e.code, "E0112");
    assert_eq!(sources.line_col(e.primary.expect("span").span).0, 4);
    let _ = std::fs::remove_dir_all(&t);
}

/// An editor's build (`Mode::Frozen`) writes nothing and reaches nothing: with an empty cache a
/// git dependency is E0114 asking for `miles fetch`; once fetched it builds from the lock, or
/// without one from the cache's mirror; a path dependency needs neither.
#[test]
fn frozen_builds_never_write_or_fetch() {
    let t = tmp("frozen");
    let url = library(&t);
    let team = project(&t, &format!("platform = {{ git = \"{url}\", version = \"^1.0\" }}"));
    let lock = t.join("team/miles.lock");
    let cache = Cache { home: t.join("cache") };
    let mut sources = Sources::default();
    let p = project::open(&team, &mut sources).expect("manifest");
    let e = project::build(&p, &cache, &Mode::Frozen, &mut sources).err().expect("nothing cached");
    assert_eq!(e.code, "E0114", "{e:?}");
    assert!(e.message.contains("`platform`") && e.help.as_deref().unwrap_or("").contains("miles fetch"), "{e:?}");
    assert!(cache_entries(&cache).is_empty() && !lock.exists(), "an editor's build wrote something");

    // `miles fetch` (a locked build) fills the cache; the editor then builds from the lock.
    project::build(&p, &cache, &Mode::Locked, &mut sources).expect("fetches");
    let written = std::fs::read_to_string(&lock).expect("lock");
    let b = project::build(&p, &cache, &Mode::Frozen, &mut sources).expect("builds offline");
    assert!(!b.lock_changed && b.packages[0].version == "1.0.0");
    assert_eq!(std::fs::read_to_string(&lock).expect("lock"), written);

    // No lock: resolved in memory from the cached mirror, and not written.
    std::fs::remove_file(&lock).expect("rm lock");
    let mut b = project::build(&p, &cache, &Mode::Frozen, &mut sources).expect("resolves offline");
    assert!(b.lock_changed && !lock.exists());
    project::list_modules(&mut b.map);
    assert_eq!(b.map.get("platform").expect("platform").modules, ["grpo/base", "tests/too_fast"]);
    assert!(b.map.roots[0].modules.is_empty(), "the project's own modules are not listed");

    // A path dependency: no lock, no cache.
    let team = project(&t, "platform = { path = \"../platform\" }");
    let p = project::open(&team, &mut sources).expect("manifest");
    let empty = Cache { home: t.join("empty-cache") };
    let b = project::build(&p, &empty, &Mode::Frozen, &mut sources).expect("path dependency");
    assert!(b.map.get("platform").expect("platform").root.ends_with("/platform") && !lock.exists());
    assert!(cache_entries(&empty).is_empty());
    let _ = std::fs::remove_dir_all(&t);
}

/// A library test whose expectation is not met is E0119, naming the test and why.
#[test]
fn a_failing_library_test_is_e0119() {
    let t = tmp("e0119");
    library(&t);
    let lib = t.join("platform");
    // The too-fast recipe breaks the house rule, so a test expecting it to pass fails.
    write(
        &lib.join("miles.toml"),
        &manifest("1.0.0").replace("expect = \"fail\"\ncheck = \"house rule\"", "expect = \"pass\""),
    );
    let mut sources = Sources::default();
    let p = project::open(&lib.to_string_lossy(), &mut sources).expect("manifest");
    let b = project::build(&p, &Cache { home: t.join("cache") }, &Mode::Locked, &mut sources).expect("no deps");
    let outcomes = testing::run(&p, &b.map, &Disk);
    assert_eq!(outcomes.len(), 1);
    let d = outcomes[0].diagnostic().expect("the test fails");
    assert_eq!(d.code, "E0119");
    assert!(
        d.message.starts_with("library test tests/too_fast.miles failed: expected to pass, failed with E")
            && d.message.contains("house rule"),
        "{}",
        d.message
    );
    let _ = std::fs::remove_dir_all(&t);
}
