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

/// A platform's `[[rule]]` reaches every recipe of a project that depends on it, on the stdlib
/// stage kind it names, whatever the recipe calls the stage; the project's own rules apply too,
/// and a rule naming no stage kind is a manifest error.
#[test]
fn house_rules_in_a_manifest_apply_to_every_recipe_of_the_build() {
    let d = std::env::temp_dir().join(format!("miles-house-rules-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    let home = d.join("home");
    write(
        &d.join("platform/miles.toml"),
        "[package]\nname = \"platform\"\nversion = \"1.0.0\"\n\n[[rule]]\nstage = \"grpo\"\ncheck = \"lr <= 1e-4\"\nmessage = \"house rule: GRPO learning rates above 1e-4 diverge on our models\"\nhelp = \"lower lr\"\n",
    );
    write(&d.join("platform/empty.miles"), "// Nothing but the rule in miles.toml.\n");
    let team_toml = |own_rule: &str| {
        format!("[package]\nname = \"team\"\nversion = \"0.1.0\"\n\n[dependencies]\nplatform = {{ path = \"../platform\" }}\n{own_rule}")
    };
    write(&d.join("team/miles.toml"), &team_toml(""));
    let recipe = |lr: &str, samples: u32| {
        format!(
            "import std/tasks/arith\nmodel policy = transformer {{ layers = 1, d_model = 32, heads = 2, vocab = arith.vocab }}\nrecipe r {{\n    gen = generate(policy) {{ prompts = arith.addition {{}}, samples_per_prompt = {samples} }}\n    score = exact_match(gen)\n    learner = grpo(gen, score) {{ rollout_batch = 16, global_batch = {}, lr = {lr} }}\n    sync = weights(learner -> gen)\n    stop = 10.steps\n}}\n",
            16 * samples
        )
    };
    let team = d.join("team");
    write(&team.join("r.miles"), &recipe("3e-4", 8));
    let (code, out) = miles(&team, &home, &["check", "r.miles"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("house rule: GRPO learning rates above 1e-4 diverge on our models"), "{out}");
    assert!(out.contains("platform/miles.toml:5"), "the rule is named where it is declared: {out}");
    assert!(out.contains("learner"), "the failing stage is the recipe's `learner`: {out}");

    write(&team.join("r.miles"), &recipe("1e-4", 8));
    let (code, out) = miles(&team, &home, &["check", "r.miles"]);
    assert_eq!(code, 0, "{out}");

    // The project's own rule, on another kind, as a warning.
    let own = "\n[[rule]]\nstage = \"generate\"\ncheck = \"samples_per_prompt >= 16\"\nmessage = \"team rule: groups of 16\"\nwarn = true\n";
    write(&team.join("miles.toml"), &team_toml(own));
    let (code, out) = miles(&team, &home, &["check", "r.miles"]);
    assert_eq!(code, 0, "a warning does not fail the check: {out}");
    assert!(out.contains("team rule: groups of 16") && out.contains("team/miles.toml:8"), "{out}");
    write(&team.join("r.miles"), &recipe("1e-4", 16));
    let (code, out) = miles(&team, &home, &["check", "r.miles"]);
    assert!(code == 0 && !out.contains("team rule"), "{out}");

    write(&team.join("miles.toml"), &team_toml("\n[[rule]]\nstage = \"gpro\"\ncheck = \"lr < 1\"\n"));
    let (code, out) = miles(&team, &home, &["check", "r.miles"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("names no stage kind `gpro`") && out.contains("did you mean `grpo`?"), "{out}");
    let _ = std::fs::remove_dir_all(&d);
}
