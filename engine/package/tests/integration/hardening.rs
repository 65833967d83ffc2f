//! Issue #35: a change to `miles.lock` alone cannot swap the code a build runs (every entry,
//! transitive ones too, is checked against the manifests, the repositories and its hash), a
//! package holding a symbolic link is refused, and hostile git URLs never reach git.

use super::git_packages::{cache_entries, git, tmp, write, Disk};
use miles_compiler::{compile_in, Options, Sources};
use miles_package::cache::Cache;
use miles_package::project::{self, Build, Mode};
use miles_package::Diagnostic;
use std::path::Path;

/// A repository `name` at tag v1.0.0 (its manifest plus `files`), with a branch `evil` one commit
/// further that changes `files[0]` to `evil`; its URL.
fn repo(tmp: &Path, name: &str, deps: &str, files: &[(&str, &str)], evil: &str) -> String {
    let dir = tmp.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    git(&dir, &["init", "-q"]);
    write(
        &dir.join("miles.toml"),
        &format!("[package]\nname = \"{name}\"\nversion = \"1.0.0\"\n\n[dependencies]\n{deps}\n"),
    );
    for (path, text) in files {
        write(&dir.join(path), text);
    }
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-qm", "v1.0.0"]);
    git(&dir, &["tag", "v1.0.0"]);
    git(&dir, &["checkout", "-qb", "evil"]);
    write(&dir.join(files[0].0), evil);
    git(&dir, &["commit", "-qam", "evil"]);
    git(&dir, &["checkout", "-q", "-"]);
    format!("file://{}", dir.display())
}

const BASE: &str = "import catalog/models { lr }\n\nconst base_lr = lr\n";
const EVIL_BASE: &str = "import catalog/models { lr }\n\nconst base_lr = lr\nconst evil = 1\n";

/// `team` depends on `platform` (tag v1.0.0), which depends on `catalog` (tag v1.0.0); both have
/// an `evil` branch. The team's recipe reads `platform/grpo/base`.
struct World {
    t: std::path::PathBuf,
    team: String,
    cache: Cache,
    platform: String,
    catalog: String,
}

fn world(name: &str) -> World {
    let t = tmp(name);
    let catalog =
        repo(&t, "catalog", "", &[("models.miles", "const lr = 1e-4\n")], "const lr = 1e-4\nconst evil = 1\n");
    let platform = repo(
        &t,
        "platform",
        &format!("catalog = {{ git = \"{catalog}\", tag = \"v1.0.0\" }}"),
        &[("grpo/base.miles", BASE)],
        EVIL_BASE,
    );
    let team = t.join("team");
    write(
        &team.join("miles.toml"),
        &format!("[package]\nname = \"team\"\nversion = \"0.1.0\"\n\n[dependencies]\nplatform = {{ git = \"{platform}\", tag = \"v1.0.0\" }}\n"),
    );
    write(&team.join("recipes/team.miles"), "import platform/grpo/base { base_lr }\n\nconst mine = base_lr\n");
    let cache = Cache { home: t.join("cache") };
    World { team: team.to_string_lossy().into_owned(), t, cache, platform, catalog }
}

impl World {
    // A test's failure path; the size of the error does not matter.
    #[allow(clippy::result_large_err)]
    fn build(&self, mode: &Mode) -> Result<(Build, Sources), (Diagnostic, Sources)> {
        let mut sources = Sources::default();
        let p = project::open(&self.team, &mut sources).expect("manifest");
        match project::build(&p, &self.cache, mode, &mut sources) {
            Ok(b) => Ok((b, sources)),
            Err(d) => Err((d, sources)),
        }
    }
    fn lock_path(&self) -> std::path::PathBuf {
        Path::new(&self.team).join("miles.lock")
    }
    fn lock(&self) -> String {
        std::fs::read_to_string(self.lock_path()).expect("lock")
    }
    /// The commit and hash of `package`'s `evil` branch, as a lock would record them.
    fn evil(&self, package: &str, url: &str) -> (String, String) {
        let other = self.t.join(format!("attacker-{package}"));
        write(
            &other.join("miles.toml"),
            &format!("[package]\nname = \"attacker\"\nversion = \"0.1.0\"\n[dependencies]\n{package} = {{ git = \"{url}\", branch = \"evil\" }}\n"),
        );
        let mut sources = Sources::default();
        let p = project::open(&other.to_string_lossy(), &mut sources).expect("manifest");
        let b = project::build(&p, &Cache { home: self.t.join("attacker-cache") }, &Mode::Locked, &mut sources)
            .expect("the evil branch builds");
        let l = b.lock.get(package).expect("locked");
        (l.commit.clone().expect("commit"), l.hash.clone().expect("hash"))
    }
}

/// The value of `key` in `package`'s entry of `lock`, replaced by `value` (the line removed for
/// `None`).
fn edit(lock: &str, package: &str, key: &str, value: Option<&str>) -> String {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            current = n.trim_matches('"').to_string();
        }
        if current == package && line.starts_with(&format!("{key} = ")) {
            if let Some(v) = value {
                out.push(format!("{key} = {v:?}"));
            }
            continue;
        }
        out.push(line.to_string());
    }
    out.join("\n") + "\n"
}

/// The text a diagnostic's primary label covers, and its 1-based line.
fn shown(d: &Diagnostic, sources: &Sources) -> (String, usize) {
    let span = d.primary.as_ref().expect("a label").span;
    let text = &sources.get(span.file).expect("file").text;
    (text[span.start as usize..span.end as usize].to_string(), sources.line_col(span).0)
}

/// A pull request that edits only miles.lock, pointing a package (direct or transitive) at other
/// contents of its own repository with a matching hash, is refused at the lock's line (E0120); an
/// edited hash is E0116 there; a removed hash, a path-like name or a short commit is refused
/// too. None of them builds, so the other code never reaches a compilation.
#[test]
fn a_lock_only_change_cannot_swap_code() {
    let w = world("swap");
    let (b, _) = w.build(&Mode::Locked).map_err(|(d, _)| d).expect("builds");
    assert_eq!(b.packages.len(), 2);
    let entry = format!("{}/recipes/team.miles", w.team);
    let c = compile_in(&Disk, std::slice::from_ref(&entry), &Options::default(), &b.map);
    assert!(!c.has_errors(), "{:#?}", c.diagnostics);
    let good = w.lock();

    for (package, url) in [("platform", w.platform.clone()), ("catalog", w.catalog.clone())] {
        let (commit, hash) = w.evil(package, &url);
        let poisoned = edit(&edit(&good, package, "commit", Some(&commit)), package, "hash", Some(&hash));
        std::fs::write(w.lock_path(), &poisoned).expect("edit the lock");
        let (d, sources) = w.build(&Mode::Locked).err().expect("refused");
        assert_eq!(d.code, "E0120", "{package}: {d:?}");
        assert!(
            d.message.contains(&format!("`{package}`")) && d.message.contains("tag `v1.0.0` names commit"),
            "{}",
            d.message
        );
        let (at, _) = shown(&d, &sources);
        assert_eq!(at, format!("commit = {commit:?}"), "{package}");
        // The editor's build refuses it the same way, and nothing rewrote the lock.
        let (d, _) = w.build(&Mode::Frozen).err().expect("refused offline");
        assert_eq!(d.code, "E0120", "{package} offline: {d:?}");
        assert_eq!(w.lock(), poisoned);
        assert!(!cache_entries(&w.cache).iter().any(|e| e.contains(&commit[..12])), "the other commit was exported");

        // Only the hash edited: the files do not hash to it.
        std::fs::write(w.lock_path(), edit(&good, package, "hash", Some(&hash))).expect("edit");
        let (d, sources) = w.build(&Mode::Locked).err().expect("refused");
        assert_eq!(d.code, "E0116", "{package}: {d:?}");
        assert_eq!(shown(&d, &sources).0, format!("hash = {hash:?}"));

        // No hash at all: nothing to check the files against.
        let text = edit(&good, package, "hash", None);
        std::fs::write(w.lock_path(), &text).expect("edit");
        let (d, sources) = w.build(&Mode::Locked).err().expect("refused");
        assert_eq!(d.code, "E0120", "{package}: {d:?}");
        let (at, line) = shown(&d, &sources);
        assert!(at == format!("name = \"{package}\"") && text.lines().nth(line - 1) == Some(at.as_str()), "{at}");
    }

    for (key, value, code) in
        [("name", "../../escape", "E0112"), ("commit", "abc", "E0112"), ("commit", "aaaaaaaaaaa\u{e9}", "E0112")]
    {
        std::fs::write(w.lock_path(), edit(&good, "catalog", key, Some(value))).expect("edit");
        let (d, sources) = w.build(&Mode::Locked).err().expect("refused");
        assert_eq!(d.code, code, "{key} = {value}: {d:?}");
        assert_eq!(shown(&d, &sources).0, format!("{key} = {value:?}"));
    }
    assert!(!w.t.join("escape").exists());

    // The lock restored: it builds again, unchanged.
    std::fs::write(w.lock_path(), &good).expect("restore");
    let (b, _) = w.build(&Mode::Locked).map_err(|(d, _)| d).expect("builds");
    assert!(!b.lock_changed);
    let _ = std::fs::remove_dir_all(&w.t);
}

/// An entry nobody declares (added to the lock by hand) is never fetched: the lock is stale and
/// resolved again from the manifests, and the rewritten lock drops it.
#[test]
fn an_entry_nobody_declares_is_never_fetched() {
    let w = world("extra");
    w.build(&Mode::Locked).map_err(|(d, _)| d).expect("builds");
    let stranger = repo(&w.t, "stranger", "", &[("x.miles", "const x = 1\n")], "const x = 2\n");
    let (commit, hash) = w.evil("stranger", &stranger);
    let before = cache_entries(&w.cache);
    let extra = format!(
        "{}\n[[package]]\nname = \"stranger\"\nversion = \"1.0.0\"\nsource = \"git+{stranger}\"\nreference = \"evil\"\ncommit = \"{commit}\"\nhash = \"{hash}\"\ndependencies = []\n",
        w.lock()
    );
    std::fs::write(w.lock_path(), &extra).expect("edit");
    let (b, _) = w.build(&Mode::Locked).map_err(|(d, _)| d).expect("resolved again");
    assert!(b.lock_changed && b.lock.get("stranger").is_none() && b.map.get("stranger").is_none());
    assert!(!w.lock().contains("stranger"));
    assert_eq!(cache_entries(&w.cache), before, "the stranger's repository was fetched");
    let _ = std::fs::remove_dir_all(&w.t);
}

/// A dependency whose files hold a symbolic link (here one leaving the package) is E0122: the
/// hash covers files, not what a link points at.
#[cfg(unix)]
#[test]
fn a_symbolic_link_in_a_dependency_is_refused() {
    let w = world("symlink");
    let lib = w.t.join("platform");
    std::fs::write(w.t.join("secret.miles"), "const secret = 1\n").expect("secret");
    std::os::unix::fs::symlink("../../secret.miles", lib.join("grpo/secret.miles")).expect("link");
    git(&lib, &["add", "-A"]);
    git(&lib, &["commit", "-qm", "link"]);
    git(&lib, &["tag", "v1.1.0"]);
    let manifest = std::fs::read_to_string(Path::new(&w.team).join("miles.toml")).expect("manifest");
    write(&Path::new(&w.team).join("miles.toml"), &manifest.replace("tag = \"v1.0.0\"", "tag = \"v1.1.0\""));
    let (d, _) = w.build(&Mode::Locked).err().expect("refused");
    assert_eq!(d.code, "E0122", "{d:?}");
    assert!(d.message.contains("`platform`") && d.message.contains("`grpo/secret.miles`"), "{}", d.message);
    assert!(!w.lock_path().exists(), "no lock records a package that was refused");
    let _ = std::fs::remove_dir_all(&w.t);
}

/// A `--upload-pack=...` or `ext::` URL in miles.lock is E0121 at its line and runs nothing.
#[test]
fn hostile_urls_in_the_lock_run_nothing() {
    let w = world("urls");
    w.build(&Mode::Locked).map_err(|(d, _)| d).expect("builds");
    let good = w.lock();
    let marker = w.t.join("ran");
    for url in [format!("--upload-pack=touch {}", marker.display()), format!("ext::sh -c touch% {}", marker.display())]
    {
        let text = edit(&good, "catalog", "source", Some(&format!("git+{url}")));
        std::fs::write(w.lock_path(), &text).expect("edit");
        let (d, sources) = w.build(&Mode::Locked).err().expect("refused");
        assert_eq!(d.code, "E0121", "{d:?}");
        assert!(shown(&d, &sources).0.starts_with("source = "));
        assert!(!marker.exists(), "{url} ran a command");
    }
    let _ = std::fs::remove_dir_all(&w.t);
}

/// `miles vendor` joins each package's name under `vendor/` and replaces what is there: a name
/// that is not a package name is refused before any path is made from it.
#[test]
fn vendor_takes_only_package_names() {
    let w = world("vendor");
    let (mut b, _) = w.build(&Mode::Locked).map_err(|(d, _)| d).expect("builds");
    let outside = w.t.join("keep");
    write(&outside.join("file"), "kept\n");
    b.packages[0].name = "../../keep".into();
    let e = project::vendor(&b, &Path::new(&w.team).join("vendor")).expect_err("refused");
    assert!(e.to_string().contains("not a package name"), "{e}");
    assert_eq!(std::fs::read_to_string(outside.join("file")).expect("still there"), "kept\n");
    b.packages[0].name = "catalog".into();
    let done = project::vendor(&b, &Path::new(&w.team).join("vendor")).expect("vendors");
    assert!(done.iter().all(|(_, p)| p.starts_with(Path::new(&w.team).join("vendor"))));
    let _ = std::fs::remove_dir_all(&w.t);
}
