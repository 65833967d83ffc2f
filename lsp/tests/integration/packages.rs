//! The server in a package: a document under `miles.toml` compiles with its project's
//! dependencies, as `miles check` does (docs/packages.md). A path dependency needs no lock and no
//! cache; a git dependency that is not fetched is one diagnostic asking for `miles fetch`, and the
//! editor never writes `miles.lock`.

use crate::support::{self, *};
use insta::assert_snapshot;
use miles_package::cache::Cache;
use miles_package::project::{self, Mode};
use serde_json::{json, Value};
use std::path::Path;

const PLATFORM: &str = r#"//- platform/miles.toml
[package]
name = "platform"
version = "1.0.0"
//- platform/grpo/base.miles
//! The platform's GRPO base recipe and its house rules.
import std/tasks/arith

/// The platform's default policy.
model policy = transformer { layers = 2, d_model = 64, heads = 4, vocab = arith.vocab }

/// The base every team's GRPO recipe extends.
recipe grpo_base {
    rollout = generate(policy) { prompts = arith.addition {}, max_new_tokens = 4.tokens }
    reward  = exact_match(rollout)
    train   = grpo(rollout, reward) { rollout_batch = 32, global_batch = 256 }
    sync    = weights(train -> rollout)
    check train.lr <= 1e-3 else "house rule: the GRPO learning rate is at most 1e-3"
}
//- platform/clusters.miles
const nodes = 2
"#;

/// The team's recipe (`$0` where a test asks), its manifest with `dependency`, and the platform.
fn team(recipe: &str, dependency: &str) -> String {
    format!(
        "//- team/recipes/team.miles\n{recipe}//- team/miles.toml\n[package]\nname = \"team\"\nversion = \"0.1.0\"\n\n[dependencies]\nplatform = {dependency}\n{PLATFORM}"
    )
}

const PATH_DEP: &str = r#"{ path = "../platform" }"#;
const RECIPE: &str =
    "import platform/grpo/base { grpo_base }\n\nrecipe team_grpo extends grpo_base {\n    train.lr = 5e-4\n}\n";

/// The main document's diagnostics, the fixture's directory shown as `$DIR`.
fn diagnostics(c: &mut Client) -> String {
    let uri = c.main_uri();
    render_diagnostics(&c.diagnostics(&uri)).replace(&*c.fx.dir.to_string_lossy(), "$DIR")
}

/// A request at a 0-based line and column of the main document.
fn at(c: &mut Client, method: &str, line: u32, character: u32) -> Value {
    let uri = c.main_uri();
    c.request(method, json!({ "textDocument": { "uri": uri }, "position": { "line": line, "character": character } }))
}

#[test]
fn a_path_dependency_resolves_for_diagnostics_definition_hover_and_completion() {
    let mut c = Client::start(&team(RECIPE, PATH_DEP));
    let uri = c.main_uri();
    assert_eq!(render_diagnostics(&c.diagnostics(&uri)), "", "a valid package import is clean");

    // `extends grpo_b|ase` goes to the recipe in the dependency's file.
    let d = at(&mut c, "textDocument/definition", 2, 30);
    let target = d["uri"].as_str().unwrap_or("").to_string();
    assert_eq!(
        format!("{} `{}`", c.loc(&target, &d["range"]), c.range_text(&target, &d["range"])),
        "platform/grpo/base.miles:8:8-8:17 `grpo_base`"
    );
    // The import path goes to the module.
    let d = at(&mut c, "textDocument/definition", 0, 20);
    assert_eq!(c.loc(d["uri"].as_str().unwrap_or(""), &d["range"]), "platform/grpo/base.miles:1:1-1:1");
    let h = at(&mut c, "textDocument/hover", 2, 30);
    let hover = h["contents"]["value"].as_str().unwrap_or("");
    assert!(hover.contains("The base every team's GRPO recipe extends."), "{hover}");

    // A module the dependency does not have.
    let text = RECIPE.replace("grpo/base", "grpo/bas");
    c.change(2, json!([{ "text": text }]));
    assert_snapshot!("wrong_module_path", diagnostics(&mut c));

    // `import platform/` offers the dependency's modules, first.
    c.change(3, json!([{ "text": "import platform/\n" }]));
    let items = render_completions(&at(&mut c, "textDocument/completion", 0, 16));
    let head: String = items.lines().take(3).map(|l| format!("{l}\n")).collect();
    assert_snapshot!(head, @r"
    platform/clusters (9)  module of package `platform`
    platform/grpo/base (9)  module of package `platform`
    std/hardware (9)  standard library module
    ");
    assert!(!c.fx.path("team/miles.lock").exists(), "the editor never writes miles.lock");
    c.shutdown();
}

#[test]
fn a_dependency_not_fetched_is_one_diagnostic_until_the_manifest_changes() {
    let git = r#"{ git = "file:///nonexistent/platform.git", tag = "v1.0.0" }"#;
    let mut c = Client::start(&team(RECIPE, git));
    let uri = c.main_uri();
    assert_snapshot!("not_fetched", diagnostics(&mut c));
    assert!(!c.fx.path("team/miles.lock").exists(), "the editor never writes miles.lock");

    // The manifest now names the path dependency: the build is made again.
    let manifest = c.fx.path("team/miles.toml");
    let text = std::fs::read_to_string(&manifest).expect("manifest").replace(git, PATH_DEP);
    std::fs::write(&manifest, text).expect("write");
    c.notify("workspace/didChangeWatchedFiles", json!({ "changes": [{ "uri": support::uri(&manifest), "type": 2 }] }));
    assert_eq!(render_diagnostics(&c.diagnostics(&uri)), "");
    c.shutdown();
}

#[test]
fn a_broken_manifest_is_one_diagnostic_with_its_line() {
    let mut c = Client::start(&team(RECIPE, "{ path = "));
    assert_snapshot!("broken_manifest", diagnostics(&mut c));
    c.shutdown();
}

fn git(dir: &Path, args: &[&str]) {
    let config =
        ["user.name=t", "user.email=t@t", "init.defaultBranch=main", "tag.gpgsign=false", "commit.gpgsign=false"];
    let out = std::process::Command::new("git")
        .current_dir(dir)
        .args(config.iter().flat_map(|c| ["-c", c]))
        .args(args)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A git dependency, fetched (as `miles check` or `miles fetch` would) while the editor is open:
/// the watcher sees the new lock, and definitions lead into the cache.
#[test]
fn a_fetched_git_dependency_leads_into_the_cache() {
    let unfetched = r#"{ git = "file:///nonexistent/platform.git", tag = "v1.0.0" }"#;
    let mut c = Client::start_with(&team(RECIPE, unfetched), true);
    assert!(diagnostics(&mut c).contains("E0114"));

    let platform = c.fx.path("platform");
    git(&platform, &["init", "-q"]);
    git(&platform, &["add", "-A"]);
    git(&platform, &["commit", "-qm", "v1.0.0"]);
    git(&platform, &["tag", "v1.0.0"]);
    let manifest = c.fx.path("team/miles.toml");
    let url = format!("file://{}", platform.display());
    let text = std::fs::read_to_string(&manifest).expect("manifest").replace("file:///nonexistent/platform.git", &url);
    std::fs::write(&manifest, text).expect("write");
    let home = c.fx.path(".miles-home");
    let mut sources = miles_compiler::Sources::default();
    let p = project::open(&c.fx.path("team").to_string_lossy(), &mut sources).expect("manifest");
    project::build(&p, &Cache { home: home.clone() }, &Mode::Locked, &mut sources).expect("fetches");
    // Each change on disk is a publication; the last one follows the lock.
    let mut shown = diagnostics(&mut c);
    for _ in 0..20 {
        if shown.is_empty() {
            break;
        }
        shown = diagnostics(&mut c);
    }
    assert_eq!(shown, "");

    let d = at(&mut c, "textDocument/definition", 2, 30);
    let target = d["uri"].as_str().unwrap_or("").to_string();
    let path = lsp_types::Url::parse(&target).ok().and_then(|u| u.to_file_path().ok()).unwrap_or_default();
    assert!(path.starts_with(home.join("src")) && path.ends_with("grpo/base.miles"), "{}", path.display());
    assert_eq!(c.range_text(&target, &d["range"]), "grpo_base");
    c.shutdown();
}
