//! The package verbs end to end, offline, on the built `miles` binary: `add` locks a library at
//! v1.0.0 from a local git repository, `check` passes, the library releases v1.1.0 with a
//! stricter rule, `update` moves to it and `check` then fails with the rule shown in the
//! dependency; `fetch` on a clean cache gets the same bytes; `vendor`, `test` and `doc` work.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const MILES: &str = env!("CARGO_BIN_EXE_miles");

fn git(dir: &Path, args: &[&str]) {
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
            "commit.gpgsign=false",
        ])
        .args(args)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, text).expect("write");
}

/// `miles args...` in `dir` with its own cache; the git commands it starts time out on their own
/// (MILES_GIT_TIMEOUT), and every step here is local.
fn miles(dir: &Path, home: &Path, args: &[&str]) -> (i32, String) {
    let out: Output = Command::new(MILES)
        .current_dir(dir)
        .args(args)
        .env("MILES_HOME", home)
        .env("MILES_GIT_TIMEOUT", "60")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("miles runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/packages")
}

#[test]
fn add_check_update_fetch_vendor_test_doc() {
    let t = std::env::temp_dir().join(format!("miles-cli-packages-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&t);
    // The example's platform package, published at v1.0.0.
    let lib = t.join("platform");
    let out =
        Command::new("bash").arg(examples().join("make-platform-repo.sh")).arg(&lib).output().expect("script runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let url = format!("file://{}", lib.display());
    let home = t.join("home");
    let team = t.join("team");
    write(&team.join("miles.toml"), "[package]\nname = \"team\"\nversion = \"0.1.0\"\n");
    write(
        &team.join("recipes/team.miles"),
        &std::fs::read_to_string(examples().join("team/recipes/team.miles")).expect("example"),
    );

    let (code, text) = miles(&team, &home, &["add", "platform", "--git", &url, "--version", "^1.0"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("added platform 1.0.0"), "{text}");
    let lock = std::fs::read_to_string(team.join("miles.lock")).expect("lock");
    assert!(lock.contains("reference = \"v1.0.0\""), "{lock}");
    let (code, text) = miles(&team, &home, &["check", "recipes/team.miles"]);
    assert_eq!(code, 0, "{text}");

    // v1.1.0 adds a stricter rule; the lock keeps 1.0.0 until `update`.
    let base = lib.join("grpo/base.miles");
    let src = std::fs::read_to_string(&base).expect("base");
    write(
        &base,
        &format!(
            "{}    check train.lr <= 1e-4 else \"house rule 1.1: at most 1e-4\"\n}}\n",
            src.trim_end().trim_end_matches('}')
        ),
    );
    write(
        &lib.join("miles.toml"),
        &std::fs::read_to_string(lib.join("miles.toml")).expect("m").replace("1.0.0", "1.1.0"),
    );
    git(&lib, &["commit", "-qam", "1.1.0"]);
    git(&lib, &["tag", "v1.1.0"]);
    let (code, text) = miles(&team, &home, &["check", "recipes/team.miles"]);
    assert_eq!(code, 0, "{text}");
    let (code, text) = miles(&team, &home, &["update"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("updated platform 1.0.0 -> 1.1.0"), "{text}");
    let (code, text) = miles(&team, &home, &["check", "--format", "plain", "recipes/team.miles"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("house rule 1.1") && text.contains("grpo/base.miles"), "{text}");

    // A clean cache: `fetch` gets byte-identical sources (the lock's hash is checked) and
    // leaves the lock as it was.
    let lock = std::fs::read_to_string(team.join("miles.lock")).expect("lock");
    let (code, text) = miles(&team, &home.join("clean"), &["fetch"]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(std::fs::read_to_string(team.join("miles.lock")).expect("lock"), lock);

    // Vendored copies are used instead of the cache, and checked like it.
    let (code, text) = miles(&team, &home, &["vendor"]);
    assert_eq!(code, 0, "{text}");
    assert!(team.join("vendor/platform/grpo/base.miles").is_file());
    std::fs::write(team.join("vendor/platform/clusters.miles"), "// changed\n").expect("edit");
    let (code, text) = miles(&team, &home, &["check", "recipes/team.miles"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("E0116"), "{text}");
    std::fs::remove_dir_all(team.join("vendor")).expect("rm");

    // The library's own tests, and its reference.
    let (code, text) = miles(&lib, &home, &["test"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("ok: 2 passed, 0 failed"), "{text}");
    let (code, text) = miles(&lib, &home, &["doc", "--out", "out"]);
    assert_eq!(code, 0, "{text}");
    let md = std::fs::read_to_string(lib.join("out/platform.md")).expect("md");
    assert!(md.contains("### recipe `grpo_base`") && md.contains("house rule 1.1"), "{md}");
    // A test whose expectation is not met: the too-fast recipe breaks the rule it was to pass.
    let manifest = std::fs::read_to_string(lib.join("miles.toml")).expect("manifest");
    write(&lib.join("miles.toml"), &manifest.replace("expect = \"fail\"\ncheck = \"house rule\"", "expect = \"pass\""));
    let (code, text) = miles(&lib, &home, &["test"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("test tests/too_fast.miles ... FAILED") && text.contains("E0119"), "{text}");
    assert!(text.contains("FAILED: 1 passed, 1 failed"), "{text}");

    // An import escaping the root.
    write(&team.join("recipes/escape.miles"), "import ../../platform/grpo/base\n");
    let (code, text) = miles(&team, &home, &["check", "recipes/escape.miles"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("E0110"), "{text}");
    let _ = std::fs::remove_dir_all(&t);
}
