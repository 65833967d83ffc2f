//! Package imports: `import NAME/...` resolves under the package's root when the importing
//! package declares it; nothing leaves its package's root except through a declared dependency.

use miles_compiler::fs::MemoryFs;
use miles_compiler::program::{PackageRoot, Packages};
use miles_compiler::{compile_in, Options};

fn packages() -> Packages {
    let root = |name: &str, root: &str, deps: &[&str]| PackageRoot {
        name: name.into(),
        root: root.into(),
        dependencies: deps.iter().map(|d| d.to_string()).collect(),
        modules: Vec::new(),
    };
    Packages {
        roots: vec![
            root("team", "team", &["platform"]),
            root("platform", "/cache/src/platform-abc", &[]),
            root("other", "/cache/src/other-def", &[]),
        ],
        ..Packages::default()
    }
}

fn codes(files: &[(&str, &str)], entry: &str) -> Vec<&'static str> {
    let fs = MemoryFs::with(files);
    let c = compile_in(&fs, &[entry.to_string()], &Options::default(), &packages());
    c.diagnostics.iter().filter(|d| d.is_error()).map(|d| d.code.as_str()).collect()
}

#[test]
fn package_imports_resolve_under_the_root() {
    let files = [
        ("team/recipes/x.miles", "import platform/grpo/base { lr }\nconst mine = lr\n"),
        ("/cache/src/platform-abc/grpo/base.miles", "import ../util\nconst lr = util.lr\n"),
        ("/cache/src/platform-abc/util.miles", "const lr = 1e-4\n"),
    ];
    assert_eq!(codes(&files, "team/recipes/x.miles"), Vec::<&str>::new());
}

#[test]
fn escaping_the_root_or_an_undeclared_package_is_an_error() {
    let escape = [("team/x.miles", "import ../outside\n"), ("outside.miles", "const a = 1\n")];
    assert_eq!(codes(&escape, "team/x.miles"), vec!["E0110"]);
    let undeclared = [("team/x.miles", "import other/y\n"), ("/cache/src/other-def/y.miles", "const a = 1\n")];
    assert_eq!(codes(&undeclared, "team/x.miles"), vec!["E0111"]);
    // A dependency may not reach into the project that uses it either.
    let back = [("team/x.miles", "import platform/p\n"), ("/cache/src/platform-abc/p.miles", "import team/x\n")];
    assert_eq!(codes(&back, "team/x.miles"), vec!["E0111"]);
    // Without packages (no miles.toml), relative imports go anywhere, as before.
    let fs = MemoryFs::with(&escape);
    let c = miles_compiler::compile(&fs, &["team/x.miles".to_string()], &Options::default());
    assert!(!c.has_errors());
}

/// A module a dependency does not have names the package and the path under its root; where the
/// build listed the package's modules (the language server does), the nearest is offered.
#[test]
fn a_missing_package_module_names_the_package() {
    let fs = MemoryFs::with(&[
        ("team/x.miles", "import platform/grpo/bas\n"),
        ("/cache/src/platform-abc/grpo/base.miles", "const lr = 1e-4\n"),
    ]);
    let entry = ["team/x.miles".to_string()];
    let mut map = packages();
    let c = compile_in(&fs, &entry, &Options::default(), &map);
    let d = c.diagnostics.iter().find(|d| d.is_error()).expect("an error");
    assert_eq!(d.code, "E0101");
    assert!(d.message.starts_with("package `platform` has no module `grpo/bas` (cannot read "), "{}", d.message);
    assert_eq!(d.help.as_deref(), Some("module paths are relative to the package's root, /cache/src/platform-abc"));
    map.roots[1].modules = vec!["grpo/base".into(), "clusters".into()];
    let c = compile_in(&fs, &entry, &Options::default(), &map);
    let d = c.diagnostics.iter().find(|d| d.is_error()).expect("an error");
    assert_eq!(d.help.as_deref(), Some("did you mean `platform/grpo/base`?"));
    assert_eq!(d.fixes.iter().map(|f| f.replacement.as_str()).collect::<Vec<_>>(), ["platform/grpo/base"]);
    // Inside one package, the message is the relative import's.
    let fs = MemoryFs::with(&[("team/x.miles", "import ./nope\n")]);
    let c = compile_in(&fs, &entry, &Options::default(), &map);
    let d = c.diagnostics.iter().find(|d| d.is_error()).expect("an error");
    assert!(d.message.starts_with("cannot read module `team/nope.miles`"), "{}", d.message);
}

#[test]
fn an_inherited_rule_names_the_recipe_and_the_override() {
    let base = "import std/tasks/arith\n\
        model policy = transformer { layers = 2, d_model = 64, heads = 4, vocab = arith.vocab }\n\
        recipe base {\n\
            rollout = generate(policy) { prompts = arith.addition {}, max_new_tokens = 4.tokens }\n\
            reward  = exact_match(rollout)\n\
            train   = grpo(rollout, reward) { rollout_batch = 32, global_batch = 256 }\n\
            sync    = weights(train -> rollout)\n\
            check train.lr <= 1e-3 else \"house rule: lr at most 1e-3\"\n\
        }\n";
    let team = "import ../lib/base { base }\n\
        recipe careful extends base {\n    train.lr = 1e-4\n}\n\
        recipe fast extends base {\n    train.lr = 2e-3\n}\n";
    let fs = MemoryFs::with(&[("lib/base.miles", base), ("team/x.miles", team)]);
    let c = miles_compiler::compile(&fs, &["team/x.miles".to_string()], &Options::default());
    let errors: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error()).collect();
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let d = errors[0];
    assert_eq!(d.code, "E0301");
    let labels: Vec<&str> = d.secondary.iter().map(|l| l.message.as_str()).collect();
    assert!(labels.contains(&"checked in recipe `fast`, which inherits this rule from `base`"), "{labels:?}");
    assert!(labels.contains(&"`train.lr` is set here"), "{labels:?}");
    let at = d.secondary.iter().find(|l| l.message.contains("is set here")).expect("label").span;
    assert_eq!(&team[at.start as usize..at.end as usize], "train.lr = 2e-3");
}
