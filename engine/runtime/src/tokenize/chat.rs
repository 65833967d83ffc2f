//! Chat templates: the Jinja `chat_template` of a Hugging Face tokenizer rendered with minijinja
//! the way `tokenizer.apply_chat_template` renders it with jinja2: `trim_blocks` and
//! `lstrip_blocks`, loop controls, Python string and dict methods (minijinja-contrib pycompat),
//! HF's `tojson` (Python `json.dumps`), `raise_exception`, `strftime_now`, the tokenizer's
//! special tokens (`bos_token`, `eos_token`, ...) in the context, and `{% generation %}` blocks
//! (HF's assistant-mask marker) rendered as their content.

use super::pyjson;
use crate::{RunError, E_DATA_FILE, E_DATA_LINE};
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What `apply_chat_template` takes besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    pub add_generation_prompt: bool,
    /// Tool schemas (`tools=`), as a JSON list; their key order is kept.
    pub tools_json: Option<String>,
    /// Other template variables (`enable_thinking`, `date_string`, ...).
    pub extra: BTreeMap<String, Json>,
}

/// A parsed chat template and the file it came from (named in every error).
pub struct ChatTemplate {
    env: Environment<'static>,
    pub file: PathBuf,
}

const NAME: &str = "chat_template";

/// Instructions one render may run. The fixtures' templates take 35 to 55 a message (Qwen3's,
/// a 5-message tool conversation: 271), so this allows ~90,000 messages; a template that loops
/// without end stops here in ~1 s (a debug build; less in release).
const FUEL: u64 = 5_000_000;

/// Bytes one render may write: a million-token prompt is a few MB of text.
const MAX_OUTPUT: usize = 64 << 20;

/// An `io::Write` that refuses past `MAX_OUTPUT` bytes: a template writing without end stops.
#[derive(Default)]
struct Capped {
    out: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + b.len() > MAX_OUTPUT {
            self.overflowed = true;
            return Err(std::io::ErrorKind::FileTooLarge.into());
        }
        self.out.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ChatTemplate {
    /// The template of the model in `dir`: `chat_template.jinja` when present (how recent
    /// `transformers` save it), else `chat_template` in tokenizer_config.json (a string, or a
    /// list of named templates: `default`). `None` when the tokenizer has none.
    pub fn from_model_dir(dir: &Path, tokenizer_config: &Json) -> Result<Option<ChatTemplate>, RunError> {
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            let source =
                std::fs::read_to_string(&jinja).map_err(|e| RunError::io(E_DATA_FILE, "cannot read", &jinja, e))?;
            return ChatTemplate::new(&source, jinja).map(Some);
        }
        let file = dir.join("tokenizer_config.json");
        let source = match tokenizer_config.get("chat_template") {
            None | Some(Json::Null) => return Ok(None),
            Some(Json::String(s)) => s.clone(),
            Some(Json::Array(named)) => {
                let pick = |name: &str| {
                    named
                        .iter()
                        .find(|t| t.get("name").and_then(Json::as_str) == Some(name))
                        .and_then(|t| t.get("template")?.as_str())
                };
                match pick("default") {
                    Some(s) => s.to_string(),
                    None => {
                        return Err(RunError::new(
                            E_DATA_FILE,
                            format!(
                                "{}: `chat_template` lists named templates but none is named `default`",
                                file.display()
                            ),
                        ))
                    }
                }
            }
            Some(_) => {
                return Err(RunError::new(
                    E_DATA_FILE,
                    format!("{}: `chat_template` is neither a string nor a list of named templates", file.display()),
                ))
            }
        };
        ChatTemplate::new(&source, file).map(Some)
    }

    /// Parses `source`; `file` is where it came from.
    pub fn new(source: &str, file: PathBuf) -> Result<ChatTemplate, RunError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Bounds a hostile template's time; recursion keeps minijinja's own limit (500 levels).
        env.set_fuel(Some(FUEL));
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, generation_blocks_as_ifs(source)).map_err(|e| {
            RunError::new(
                E_DATA_FILE,
                format!("{}: the chat template does not parse: {}", file.display(), describe(&e)),
            )
        })?;
        Ok(ChatTemplate { env, file })
    }

    /// `apply_chat_template(messages, tokenize=False, ...)`; `specials` are `bos_token` etc.
    pub fn render(
        &self,
        messages_json: &str,
        options: &RenderOptions,
        specials: &BTreeMap<String, String>,
    ) -> Result<String, RunError> {
        let bad_input = |what: &str, e: serde_json::Error| {
            RunError::new(E_DATA_LINE, format!("{}: {what} are not valid JSON: {e}", self.file.display()))
        };
        let messages: Value = serde_json::from_str(messages_json).map_err(|e| bad_input("the messages", e))?;
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        for (k, v) in specials {
            ctx.insert(k.clone(), Value::from(v.as_str()));
        }
        for (k, v) in &options.extra {
            ctx.insert(k.clone(), Value::from_serialize(v));
        }
        ctx.insert("messages".into(), messages);
        ctx.insert("add_generation_prompt".into(), Value::from(options.add_generation_prompt));
        if let Some(t) = &options.tools_json {
            ctx.insert("tools".into(), serde_json::from_str(t).map_err(|e| bad_input("the tools", e))?);
        }
        let tmpl = self.env.get_template(NAME).map_err(|e| self.render_error(&e))?;
        let mut out = Capped::default();
        match tmpl.render_captured_to(ctx, &mut out).map(drop) {
            Err(_) if out.overflowed => {
                let e =
                    Error::new(ErrorKind::InvalidOperation, format!("the rendering is longer than {MAX_OUTPUT} bytes"));
                return Err(self.render_error(&e));
            }
            r => r.map_err(|e| self.render_error(&e))?,
        };
        // Every piece written is a `str`: the bytes are UTF-8.
        String::from_utf8(out.out).map_err(|e| RunError::internal(format!("a chat rendering is not UTF-8: {e}")))
    }

    fn render_error(&self, e: &Error) -> RunError {
        RunError::new(
            E_DATA_LINE,
            format!("{}: the chat template failed to render: {}", self.file.display(), describe(e)),
        )
    }
}

/// minijinja's message with the template line, without the template's internal name.
fn describe(e: &Error) -> String {
    let mut s = match e.kind() {
        // raise_exception's message is the template author's, verbatim.
        ErrorKind::InvalidOperation if e.detail().is_some() => e.detail().unwrap_or_default().to_string(),
        _ => e.to_string().split(" (in ").next().unwrap_or_default().to_string(),
    };
    if let Some(line) = e.line() {
        s.push_str(&format!(" (template line {line})"));
    }
    s
}

/// `{% generation %}`/`{% endgeneration %}` mark assistant text for HF's masks; jinja2 renders
/// their body. They become an always-true `if`, keeping their whitespace control (`{%-`, `-%}`).
fn generation_blocks_as_ifs(source: &str) -> String {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| regex::Regex::new(r"\{%(-?)\s*(end)?generation\s*(-?)%\}").expect("valid regex"));
    re.replace_all(source, |c: &regex::Captures| {
        let tag = if c.get(2).is_some() { "endif" } else { "if true" };
        format!("{{%{} {tag} {}%}}", &c[1], &c[3])
    })
    .into_owned()
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let text = if sort_keys == Some(true) {
        // serde_json's own map is ordered by key.
        let sorted =
            serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
        pyjson::dumps(&sorted, indent)
    } else {
        pyjson::dumps(&value, indent)
    }
    .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(text))
}

/// `strftime_now(format)`: the current UTC time; `%Y %m %d %H %M %S %y %b %B %a %A %j %%`.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    strftime(&format, secs as i64)
}

fn strftime(format: &str, secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(m - 1) as usize] + d + i64::from(leap && m > 2);
    let wd = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y % 100)),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('b') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('a') => out.push_str(&wd[..3]),
            Some('A') => out.push_str(wd),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &str, gen: bool) -> Result<String, String> {
        let t = ChatTemplate::new(source, PathBuf::from("m/tokenizer_config.json")).map_err(|e| e.message)?;
        let specials = BTreeMap::from([
            ("bos_token".to_string(), "<s>".to_string()),
            ("eos_token".to_string(), "</s>".to_string()),
        ]);
        t.render(messages, &RenderOptions { add_generation_prompt: gen, ..Default::default() }, &specials)
            .map_err(|e| e.message)
    }

    const CHATML: &str = "{{ bos_token }}{% for m in messages %}{% if loop.first and m.role != 'system' %}<|im_start|>system\nYou are helpful.<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

    #[test]
    fn chatml_with_generation_prompt_and_specials() {
        assert_eq!(
            render(CHATML, r#"[{"role": "user", "content": " Hi "}]"#, true).unwrap(),
            "<s><|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_loop_controls_tojson_and_generation_blocks() {
        let t = "{%- for m in messages %}\n  {%- if m.role == 'system' %}{% continue %}{% endif %}\n  {%- if m.content.startswith('x') %}{% break %}{% endif %}\n{{ m.content.upper().split(' ')[0] }}|{{ m.tool_calls[0].arguments | tojson if m.tool_calls is defined else '' }}\n  {%- generation %}{{ eos_token }}{% endgeneration %}\n{% endfor %}";
        let msgs = r#"[{"role": "system", "content": "s"}, {"role": "assistant", "content": "call it", "tool_calls": [{"arguments": {"z": 1.0, "a": [true, null]}}]}, {"role": "user", "content": "x stop"}, {"role": "user", "content": "never"}]"#;
        assert_eq!(render(t, msgs, false).unwrap(), "CALL|{\"z\": 1.0, \"a\": [true, null]}</s>");
    }

    #[test]
    fn failures_name_the_file_and_the_reason() {
        let t = "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('Tool messages are not supported') }}{% endif %}{% endfor %}";
        assert_eq!(
            render(t, r#"[{"role": "tool", "content": "1"}]"#, false).unwrap_err(),
            "m/tokenizer_config.json: the chat template failed to render: Tool messages are not supported (template line 1)"
        );
        let e = render("{% for m in messages %}", "[]", false).unwrap_err();
        assert!(e.starts_with("m/tokenizer_config.json: the chat template does not parse: "), "{e}");
        assert!(e.contains("template line 1"), "{e}");
        let e = render("{{ messages[0].content.nope() }}", r#"[{"role": "user", "content": "a"}]"#, false).unwrap_err();
        assert!(e.starts_with("m/tokenizer_config.json: the chat template failed to render: "), "{e}");
    }

    /// Issue #35: a template that would loop for hours, recurse without end or write gigabytes
    /// is refused in bounded time (the render runs on a thread so that the test itself waits at
    /// most a minute).
    #[test]
    fn a_runaway_template_is_refused_in_bounded_time() {
        let cases = [
            ("loop", "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", "out of fuel"),
            ("recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion"),
            ("output", "{% for a in range(10000) %}{{ 'x' * 1000000 }}{% endfor %}", "longer than"),
        ];
        for (case, source, want) in cases {
            let (tx, rx) = std::sync::mpsc::channel();
            let t0 = std::time::Instant::now();
            std::thread::spawn(move || tx.send(render(source, "[]", false)));
            let got = rx.recv_timeout(std::time::Duration::from_secs(60)).expect("the render did not end in 60 s");
            let e = got.unwrap_err();
            assert!(e.contains("the chat template failed to render") && e.contains(want), "{case}: {e}");
            assert!(t0.elapsed().as_secs_f64() < 30.0, "{case}: {:?}", t0.elapsed());
        }
    }

    /// Against jinja2 configured as transformers configures it (tests/fixtures/chat/, made by
    /// scripts/make-chat-template-fixtures.py): features beyond the HF model fixtures.
    #[test]
    fn renderings_equal_jinja2_as_transformers_runs_it() {
        use serde_json::value::RawValue;
        let dir = PathBuf::from(format!("{}/../../tests/fixtures/chat", env!("CARGO_MANIFEST_DIR")));
        let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
        let r: BTreeMap<String, Box<RawValue>> = serde_json::from_str(&text).unwrap();
        let specials: BTreeMap<String, String> = serde_json::from_str(r["specials"].get()).unwrap();
        let cases: Vec<Json> = serde_json::from_str(r["cases"].get()).unwrap();
        let mut wrong = Vec::new();
        for c in &cases {
            let file = dir.join(c["template"].as_str().unwrap());
            let t = ChatTemplate::new(&std::fs::read_to_string(&file).unwrap(), file).unwrap();
            let options = RenderOptions {
                add_generation_prompt: c["add_generation_prompt"] == true,
                tools_json: (c["tools"] == true).then(|| r["tools"].get().to_string()),
                extra: serde_json::from_value(c["extra"].clone()).unwrap(),
            };
            let got = t.render(r["messages"].get(), &options, &specials).map_err(|e| e.message);
            if got.as_deref().ok() != c["text"].as_str() {
                wrong.push(format!("{c}\ngot {got:?}"));
            }
        }
        assert_eq!(cases.len(), 16);
        assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
    }

    #[test]
    fn dates() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208.
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %A %j %B %y %%", 1_722_000_309),
            "26 Jul 2024 13:25:09 Friday 208 July 24 %"
        );
        assert_eq!(strftime("%Y-%m-%d", 0), "1970-01-01");
        assert_eq!(strftime("%Y-%m-%d %a", 951_782_400), "2000-02-29 Tue");
    }
}
