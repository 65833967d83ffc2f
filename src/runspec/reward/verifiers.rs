//! The `verifiers` environment (docs/agents.md "Verifiers environments"): a verifiers 0.4
//! taskset played as a `rollout_program` whose program is miles' own driver, embedded here so a
//! user needs nothing but `pip install verifiers` and the environment's package.

use miles_compiler::job::read::Fields;
use miles_compiler::value::Record;
use miles_runtime::env::spec::ProgramSpec;

/// The driver (`verifiers_driver.py`): loads the taskset, plays a group's sessions, prints
/// `{"rewards": [...], "metrics": [...]}`. Run as `PYTHON -c DRIVER MODULE ARGS`: passed inline,
/// so a run started on another machine needs no file of miles' there.
pub const DRIVER: &str = include_str!("verifiers_driver.py");

/// The rollout program that plays `env` (a `verifiers { module, args, python, pass_env }`
/// record) for the `env_reward` stage `stage`. `args` was checked to be a JSON object
/// (`miles check`: the capability table's rule for `verifiers.args`).
pub(super) fn program(stage: &str, env: &Record) -> ProgramSpec {
    let text = |name: &str, default: &str| env.str(name).unwrap_or(default).to_string();
    ProgramSpec {
        name: stage.to_string(),
        command: vec![text("python", "python3"), "-c".into(), DRIVER.into(), text("module", ""), text("args", "{}")],
        cwd: None,
        pass_env: env.strings("pass_env"),
    }
}

#[cfg(test)]
mod tests {
    use miles_compiler::fs::MemoryFs;
    use miles_compiler::{compile, Options};
    use miles_runtime::env::spec::EnvSpec;

    const RECIPE: &str = r#"
import std/tasks/arith
model policy = transformer { layers = 1, d_model = 32, heads = 2, vocab = arith.vocab, max_len = 64 }
recipe r {
    rollout = generate(policy) { prompts = arith.addition { digits = 2 }, samples_per_prompt = 2, max_new_tokens = 4.tokens }
    reward = env_reward(rollout) {
        env = verifiers { module = "miles_vf_echo", args = "{\"taskset\": {\"size\": 4}}", python = "/opt/py/bin/python", pass_env = ["PYTHONPATH"] }
    }
    train = grpo(rollout, reward) { rollout_batch = 4, global_batch = 8 }
    sync = weights(train -> rollout) { transport = local }
    stop = 2.steps
}
"#;

    #[test]
    fn a_verifiers_env_runs_the_embedded_driver_as_a_rollout_program() {
        let fs = MemoryFs::with(&[("r.miles", RECIPE)]);
        let c = compile(&fs, &["r.miles".to_string()], &Options::default());
        let errors: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error()).map(|d| d.message.clone()).collect();
        assert!(errors.is_empty(), "{errors:?}");
        let spec = crate::runspec::run_spec(&c.recipes[0]).map_err(|d| d[0].message.clone()).unwrap();
        let env = spec.env.expect("an env_reward run has an env");
        let EnvSpec::RolloutProgram(p) = env.env else { panic!("not a rollout program: {:?}", env.env) };
        assert_eq!(p.name, "reward");
        assert_eq!(p.command[..2], ["/opt/py/bin/python", "-c"]);
        assert_eq!(p.command[2], super::DRIVER);
        assert_eq!(p.command[3..], ["miles_vf_echo", r#"{"taskset": {"size": 4}}"#]);
        assert_eq!(p.pass_env, ["PYTHONPATH"]);
    }

    /// `args` that are not a JSON object are refused by `miles check` (the capability table's
    /// rule, E0511), at the line that sets them, before any run maps the recipe.
    #[test]
    fn verifiers_args_that_are_not_an_object_are_refused_at_check() {
        let with_args = |args: &str| {
            let text = RECIPE.replace(r#"args = "{\"taskset\": {\"size\": 4}}""#, &format!("args = {args}"));
            assert_ne!(text, RECIPE, "the recipe sets `args`");
            let fs = MemoryFs::with(&[("r.miles", text.as_str())]);
            let c = compile(&fs, &["r.miles".to_string()], &Options::default());
            let errors: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error()).cloned().collect();
            (text, errors)
        };
        let (_, ok) = with_args(r#""{\"taskset\": {\"size\": 8}}""#);
        assert!(ok.is_empty(), "{ok:?}");
        for (args, why) in [
            (r#""[1, 2]""#, "it is JSON, not a JSON object"),
            (r#""{taskset: 8}""#, "it is not JSON (key must be a string"),
        ] {
            let (text, errors) = with_args(args);
            let [e] = &errors[..] else { panic!("{args}: one refusal: {errors:?}") };
            assert_eq!(e.code, miles_grammar::diag::ErrorCode::E0511, "{e:?}");
            assert!(e.help.as_deref().is_some_and(|h| h.starts_with(why)), "{args}: {e:?}");
            let span = e.primary.as_ref().expect("a refusal has a line").span;
            assert_eq!(&text[span.start as usize..span.end as usize], args, "the span is the `args` value");
        }
    }

    /// A harness's PEP 723 program runs with the driver's Python only where that Python has every
    /// dependency at an allowed version; anything else (a missing package, a version out of
    /// range, an extra, no metadata block) goes to uv. Needs the agents' venv (verifiers'
    /// dependencies, `packaging`); skips without it.
    #[test]
    fn the_driver_runs_a_harness_script_here_only_when_its_python_has_what_it_declares() {
        let venv =
            std::env::var_os("MILES_AGENTS_VENV").map_or_else(|| "/opt/miles-agents".into(), std::path::PathBuf::from);
        let python = venv.join("bin/python");
        if !python.is_file() {
            eprintln!("skipped: no {} (scripts/setup-test-deps.sh)", python.display());
            return;
        }
        let probe = r#"
import sys
ns = {"__name__": "driver"}
exec(sys.argv[1], ns)
head = '# /// script\n# requires-python = ">=3.10"\n# dependencies = [%s]\n# ///\nprint(1)\n'
for deps in ['"openai", "mcp==2.0.0", "httpx"', '"openai>=999"', '"no-such-package-for-miles"', '"httpx[http2]"', '"openai; python_version < \'3\'", "httpx"']:
    print(ns["satisfied_here"]((head % deps).encode()))
print(ns["satisfied_here"](b"print(1)\n"))
"#;
        let out = std::process::Command::new(&python).args(["-c", probe, super::DRIVER]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
        assert_eq!(lines, ["True", "False", "False", "False", "True", "False"]);
    }

    /// The embedded text is the driver, runnable as `python -c`: its own argument checks answer
    /// before it imports verifiers (so this needs only python3, and skips without it).
    #[test]
    fn the_embedded_driver_refuses_args_that_are_not_an_object() {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let Ok(mut child) = Command::new("python3")
            .args(["-c", super::DRIVER, "m", "[1]"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        else {
            eprintln!("skipped: no python3 on PATH");
            return;
        };
        child.stdin.take().unwrap().write_all(b"{\"task\": {}, \"sessions\": []}\n").unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("`args` must be a JSON object"), "{err}");
        assert!(out.stdout.is_empty());
    }
}
