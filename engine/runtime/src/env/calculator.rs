//! `calculator`: a built-in agentic task. The question is a product of two numbers too large to
//! guess (`37*59=?`); the agent may call the `calc` tool (`<tool>calc 37*59</tool>`, or in the
//! Hermes format of a chat model `<tool_call>\n{"name": "calc", "arguments": {"expr": "37*59"}}\n</tool_call>`,
//! the tool's schema in the template's system turn: `tools`), reads the
//! result (`<result>2183</result>`), then answers with a turn that calls no tool: the last integer
//! of that turn is the answer. Reward 1 for the right answer, 0 otherwise, plus `tool_reward` per
//! well-formed tool call (summed only under the `sum` reward mode). Short observations over a
//! small alphabet, so a tiny char-level policy on CPU can learn to copy the question into the
//! tool and the result into its answer.

pub use crate::spec::env::CalculatorSpec;

use super::{Action, EnvFault, Environment, StepResult, Task, ToolFormat};
use crate::rng::Rng;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

pub struct Calculator {
    spec: CalculatorSpec,
    /// Expected answer of each open episode.
    open: Mutex<HashMap<String, i64>>,
}

/// The `calc` tool's schema, as a chat template's `tools=` takes it.
const TOOLS: &str = r#"[{"type": "function", "function": {"name": "calc", "description": "Integer arithmetic: + - * / and parentheses.", "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}}]"#;

/// Every character an observation of this environment may hold (for a char tokenizer).
pub const ALPHABET: &str = "0123456789+-*/()=?<>abcdefghijklmnopqrstuvwxyz `:.,";

impl Calculator {
    pub fn new(spec: CalculatorSpec) -> Calculator {
        Calculator { spec, open: Mutex::new(HashMap::new()) }
    }

    /// The question and its answer: from the data row (`prompt` an expression, `label` its
    /// value) when it has a label, else generated from the episode's seed.
    fn question(&self, task: &Task) -> Result<(String, i64), EnvFault> {
        if let (Some(q), false) = (task.prompt.as_str(), task.label.is_null()) {
            let label = match &task.label {
                serde_json::Value::Number(n) => n.as_i64(),
                serde_json::Value::String(s) => s.trim().parse().ok(),
                _ => None,
            };
            let answer = label.ok_or_else(|| EnvFault::Error(format!("label {} is not an integer", task.label)))?;
            return Ok((q.to_string(), answer));
        }
        let digits = self.spec.digits.clamp(1, 6);
        let (lo, hi) = (10u64.pow(digits - 1), 10u64.pow(digits));
        let mut rng = Rng::new(task.seed);
        let a = lo + rng.below(hi - lo);
        let b = lo + rng.below(hi - lo);
        Ok((format!("{a}*{b}=?"), (a * b) as i64))
    }
}

impl Environment for Calculator {
    fn name(&self) -> &str {
        "calculator"
    }

    fn reset(&self, task: &Task, _timeout: Duration) -> Result<String, EnvFault> {
        let (q, answer) = self.question(task)?;
        self.open.lock().unwrap_or_else(|p| p.into_inner()).insert(task.episode.clone(), answer);
        Ok(q)
    }

    fn step(&self, episode: &str, action: &Action, _timeout: Duration) -> Result<StepResult, EnvFault> {
        let answer = *self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(episode)
            .ok_or_else(|| EnvFault::Error(format!("no open episode `{episode}`")))?;
        if action.tool_calls.is_empty() {
            let given = last_integer(&action.text);
            let right = given == Some(answer);
            return Ok(StepResult {
                observation: if right { "correct" } else { "wrong" }.into(),
                reward: Some(if right { 1.0 } else { 0.0 }),
                terminated: true,
                truncated: false,
            });
        }
        let mut out = String::new();
        let mut good = 0;
        for call in &action.tool_calls {
            if call.name != "calc" {
                out += &format!("<error>unknown tool `{}`: the tool is calc</error>", call.name);
                continue;
            }
            match eval(&call.argument_text()) {
                Ok(v) => {
                    good += 1;
                    out += &format!("<result>{v}</result>");
                }
                Err(e) => out += &format!("<error>{e}</error>"),
            }
        }
        Ok(StepResult {
            observation: out,
            reward: Some(self.spec.tool_reward * good as f32),
            terminated: false,
            truncated: false,
        })
    }

    fn close(&self, episode: &str) {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).remove(episode);
    }

    /// `calc`: one string argument, the expression. Written as Python's `json.dumps` writes it,
    /// keys in schema order (tests/fixtures/hf/qwen3-chat/reference/tools.json is the same text).
    fn tools(&self) -> Option<String> {
        Some(TOOLS.to_string())
    }

    /// The expert: call the tool on the question's expression (written in the run's tool format),
    /// then answer with its result; or,
    /// for a `1 - demo_tool_rate` share of the tasks (by the episode's seed), answer at once.
    fn demonstrate(&self, task: &Task, observations: &[String], format: ToolFormat) -> Option<String> {
        match observations {
            [question] => {
                let by_heart = Rng::derived(task.seed, "demo_tool", 0).next_f64() >= self.spec.demo_tool_rate as f64;
                if by_heart {
                    return self.question(task).ok().map(|(_, answer)| answer.to_string());
                }
                let expr = question.trim().trim_end_matches('?').trim_end_matches('=').trim();
                let arguments = match format {
                    ToolFormat::Tag => serde_json::Value::String(expr.to_string()),
                    ToolFormat::Hermes => serde_json::json!({ "expr": expr }),
                };
                Some(format.write(&super::ToolCall { name: "calc".into(), arguments }))
            }
            [.., last] => {
                let v = last.strip_prefix("<result>")?.strip_suffix("</result>")?;
                Some(v.to_string())
            }
            [] => None,
        }
    }
}

/// The last integer in `text` (an optional minus sign, then digits).
fn last_integer(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    let end = bytes.iter().rposition(u8::is_ascii_digit)? + 1;
    let mut start = end;
    while start > 0 && bytes[start - 1].is_ascii_digit() {
        start -= 1;
    }
    let neg = start > 0 && bytes[start - 1] == b'-';
    let v: i64 = text[start..end].parse().ok()?;
    Some(if neg { -v } else { v })
}

/// Integer arithmetic: `+ - * /` (division truncates), parentheses, unary minus; overflow,
/// division by zero and bad syntax are errors the model reads.
pub fn eval(expr: &str) -> Result<i64, String> {
    let toks: Vec<char> = expr.chars().filter(|c| !c.is_whitespace()).collect();
    if toks.is_empty() {
        return Err("empty expression".into());
    }
    let mut p = Parser { toks: &toks, i: 0, depth: 0 };
    let v = p.sum()?;
    match p.toks.get(p.i) {
        None => Ok(v),
        Some(c) => Err(format!("unexpected `{c}`")),
    }
}

struct Parser<'a> {
    toks: &'a [char],
    i: usize,
    depth: usize,
}

impl Parser<'_> {
    fn sum(&mut self) -> Result<i64, String> {
        let mut v = self.product()?;
        while let Some(&op @ ('+' | '-')) = self.toks.get(self.i) {
            self.i += 1;
            let r = self.product()?;
            v = if op == '+' { v.checked_add(r) } else { v.checked_sub(r) }.ok_or("overflow")?;
        }
        Ok(v)
    }

    fn product(&mut self) -> Result<i64, String> {
        let mut v = self.atom()?;
        while let Some(&op @ ('*' | '/')) = self.toks.get(self.i) {
            self.i += 1;
            let r = self.atom()?;
            v = if op == '*' {
                v.checked_mul(r).ok_or("overflow")?
            } else if r == 0 {
                return Err("division by zero".into());
            } else {
                v / r
            };
        }
        Ok(v)
    }

    fn atom(&mut self) -> Result<i64, String> {
        match self.toks.get(self.i) {
            Some('-') => {
                self.i += 1;
                Ok(-self.atom()?)
            }
            Some('(') => {
                self.depth += 1;
                if self.depth > 64 {
                    return Err("too deeply nested".into());
                }
                self.i += 1;
                let v = self.sum()?;
                if self.toks.get(self.i) != Some(&')') {
                    return Err("missing `)`".into());
                }
                self.i += 1;
                self.depth -= 1;
                Ok(v)
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.i;
                while self.toks.get(self.i).is_some_and(|c| c.is_ascii_digit()) {
                    self.i += 1;
                }
                let s: String = self.toks[start..self.i].iter().collect();
                s.parse().map_err(|_| format!("number too large: {s}"))
            }
            Some(c) => Err(format!("unexpected `{c}`")),
            None => Err("expression ends early".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::ToolFormat;
    use serde_json::json;

    fn task(id: &str, seed: u64) -> Task {
        Task { episode: id.into(), prompt: json!(null), label: json!(null), metadata: json!({}), seed }
    }

    fn act(text: &str) -> Action {
        Action { text: text.into(), tool_calls: ToolFormat::Tag.parse(text).unwrap() }
    }

    #[test]
    fn arithmetic() {
        assert_eq!(eval("12*7"), Ok(84));
        assert_eq!(eval(" 2+3*(4-1) "), Ok(11));
        assert_eq!(eval("-7/2"), Ok(-3));
        assert_eq!(eval("1/0").unwrap_err(), "division by zero");
        assert_eq!(eval("(1").unwrap_err(), "missing `)`");
        assert_eq!(eval("2x").unwrap_err(), "unexpected `x`");
        assert_eq!(eval("99999999999*99999999999").unwrap_err(), "overflow");
        assert_eq!(eval(&"(".repeat(100)).unwrap_err(), "too deeply nested");
        assert_eq!(last_integer("the answer is -84."), Some(-84));
        assert_eq!(last_integer("none"), None);
    }

    #[test]
    fn an_episode_with_the_tool() {
        let env = Calculator::new(CalculatorSpec { tool_reward: 0.1, ..Default::default() });
        let t = Duration::from_secs(1);
        let q = env.reset(&task("e1", 7), t).unwrap();
        let (a, b) = q.trim_end_matches("=?").split_once('*').unwrap();
        let product = a.parse::<i64>().unwrap() * b.parse::<i64>().unwrap();
        assert!(q.chars().all(|c| ALPHABET.contains(c)), "{q}");
        let r = env.step("e1", &act(&format!("<tool>calc {a}*{b}</tool>")), t).unwrap();
        assert_eq!(
            r,
            StepResult {
                observation: format!("<result>{product}</result>"),
                reward: Some(0.1),
                terminated: false,
                truncated: false
            }
        );
        // A bad call is an observation, not a fault.
        let r = env.step("e1", &act("<tool>calc 3*</tool><tool>sum 1</tool>"), t).unwrap();
        assert_eq!(
            r.observation,
            "<error>expression ends early</error><error>unknown tool `sum`: the tool is calc</error>"
        );
        assert_eq!(r.reward, Some(0.0));
        let r = env.step("e1", &act(&format!("{product}")), t).unwrap();
        assert_eq!((r.reward, r.terminated), (Some(1.0), true));
        env.close("e1");
        assert!(matches!(env.step("e1", &act("1"), t), Err(EnvFault::Error(_))));
    }

    #[test]
    fn demonstrations_call_the_tool_at_the_rate_asked() {
        let t = Duration::from_secs(1);
        let first_turns = |rate: f32| -> Vec<String> {
            let env = Calculator::new(CalculatorSpec { demo_tool_rate: rate, ..Default::default() });
            (0..200)
                .map(|i| {
                    let task = task("d", i);
                    let q = env.reset(&task, t).unwrap();
                    env.demonstrate(&task, &[q], ToolFormat::Tag).unwrap()
                })
                .collect()
        };
        assert!(first_turns(1.0).iter().all(|a| a.starts_with("<tool>calc ")));
        let half = first_turns(0.5);
        let calls = half.iter().filter(|a| a.starts_with("<tool>")).count();
        assert!((70..=130).contains(&calls), "{calls} of 200");
        // An answer by heart is the right one; after a call, the result is copied.
        let env = Calculator::new(CalculatorSpec { demo_tool_rate: 0.0, ..Default::default() });
        let row = Task { episode: "d".into(), prompt: json!("6*7="), label: json!("42"), metadata: json!({}), seed: 0 };
        assert_eq!(env.demonstrate(&row, &["6*7=".into()], ToolFormat::Tag).as_deref(), Some("42"));
        let obs = ["6*7=".to_string(), "<result>42</result>".to_string()];
        assert_eq!(env.demonstrate(&row, &obs, ToolFormat::Tag).as_deref(), Some("42"));
        assert_eq!(env.demonstrate(&row, &["6*7=".into(), "<error>x</error>".into()], ToolFormat::Tag), None);
    }

    /// Under the Hermes format the expert's call is the one the driver parses back, and its
    /// answer after the result is the same as under the tag format.
    #[test]
    fn hermes_demonstrations_call_calc_with_the_expression() {
        let env = Calculator::new(CalculatorSpec::default());
        let row = Task { episode: "d".into(), prompt: json!("6*7=?"), label: json!(42), metadata: json!({}), seed: 0 };
        let call = env.demonstrate(&row, &["6*7=?".into()], ToolFormat::Hermes).unwrap();
        assert_eq!(call, "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"6*7\"}}\n</tool_call>");
        let calls = ToolFormat::Hermes.parse(&call).unwrap();
        assert_eq!((calls[0].name.as_str(), calls[0].argument_text()), ("calc", "6*7".to_string()));
        let obs = ["6*7=?".to_string(), "<result>42</result>".to_string()];
        assert_eq!(env.demonstrate(&row, &obs, ToolFormat::Hermes).as_deref(), Some("42"));
        let tools: serde_json::Value = serde_json::from_str(&env.tools().unwrap()).unwrap();
        assert_eq!(tools[0]["function"]["name"], "calc");
    }

    #[test]
    fn questions_from_data_rows() {
        let env = Calculator::new(CalculatorSpec::default());
        let t = Duration::from_secs(1);
        let row =
            Task { episode: "d".into(), prompt: json!("6*7=?"), label: json!("42"), metadata: json!({}), seed: 0 };
        assert_eq!(env.reset(&row, t).unwrap(), "6*7=?");
        assert_eq!(env.step("d", &act("it is 41"), t).unwrap().reward, Some(0.0));
        let bad = Task { label: json!([1]), ..row };
        assert!(matches!(env.reset(&bad, t), Err(EnvFault::Error(_))));
        // Same seed, same question.
        assert_eq!(env.reset(&task("x", 3), t).unwrap(), env.reset(&task("y", 3), t).unwrap());
    }
}
