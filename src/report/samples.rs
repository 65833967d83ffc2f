//! A language-model run's samples (DIR/samples.jsonl, docs/runs.md "Samples") in `miles report`:
//! a section of `report/samples.html`, one collapsible entry per sample grouped by step, and one
//! line per step in the text report. Samples are untrusted text (a model's output, an
//! environment's observation): the page escapes every character HTML gives a meaning to, and the
//! terminal lines escape control characters, so neither a `<script>` nor an escape sequence in a
//! response does anything but show.

use serde_json::Value;
use std::collections::VecDeque;
use std::io::BufRead;
use std::path::Path;

/// Steps shown: the first few sampled and the last ones (a long run's file holds many more).
const FIRST_STEPS: usize = 5;
const LAST_STEPS: usize = 25;
/// Steps the text report prints a line for (the last ones).
const TEXT_STEPS: usize = 5;
/// Characters of a prompt or response on a text line.
const TEXT_CHARS: usize = 60;

/// The samples of one step, in file order.
pub struct Step {
    pub step: u64,
    pub rows: Vec<Value>,
}

/// The steps of a run's samples.jsonl shown (first and last), and how many were left out and
/// how many lines did not parse; None when the run wrote none.
pub struct Samples {
    pub steps: Vec<Step>,
    pub left_out: usize,
    pub skipped: usize,
}

/// Reads DIR/samples.jsonl line by line, keeping only the steps shown.
pub fn load(dir: &Path) -> Option<Samples> {
    let file = std::fs::File::open(dir.join("samples.jsonl")).ok()?;
    let (mut first, mut last): (Vec<Step>, VecDeque<Step>) = (Vec::new(), VecDeque::new());
    let (mut left_out, mut skipped) = (0, 0);
    for line in std::io::BufReader::new(file).lines() {
        let Ok(line) = line else { break };
        let Some((step, v)) =
            serde_json::from_str::<Value>(&line).ok().and_then(|v| Some((v.get("step")?.as_u64()?, v)))
        else {
            // A torn last line from a kill, which a resume drops.
            skipped += usize::from(!line.trim().is_empty());
            continue;
        };
        let in_first = last.is_empty() && first.last().is_some_and(|s| s.step == step);
        let current = match in_first {
            true => first.last_mut(),
            false => last.back_mut().filter(|s| s.step == step),
        };
        if let Some(s) = current {
            s.rows.push(v);
        } else if first.len() < FIRST_STEPS && last.is_empty() {
            first.push(Step { step, rows: vec![v] });
        } else {
            last.push_back(Step { step, rows: vec![v] });
            if last.len() > LAST_STEPS {
                last.pop_front();
                left_out += 1;
            }
        }
    }
    first.extend(last);
    Some(Samples { steps: first, left_out, skipped }).filter(|s| !s.steps.is_empty() || s.skipped > 0)
}

/// Text safe inside HTML elements and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn text_of(v: &Value) -> String {
    let text = v.get("text").and_then(Value::as_str).unwrap_or("");
    match v.get("cut") {
        Some(c) => format!("{text}\n[cut: {} bytes, {} ids in all]", c["text_bytes"], c["ids"]),
        None => text.to_string(),
    }
}

fn num(v: &Value) -> String {
    v.as_f64().map_or_else(|| "dropped".to_string(), |x| format!("{x:.3}"))
}

/// One sample as a collapsible entry: a summary line, then the prompt and the response or the
/// episode's turns.
fn entry(row: &Value) -> String {
    let ep = row.get("episode");
    let ended = match ep {
        Some(e) => format!("end {}", e["end"].as_str().unwrap_or("?")),
        None => format!("finish {}", row["finish"].as_str().unwrap_or("?")),
    };
    let adapter = row.get("adapter").and_then(Value::as_str).map(|a| format!(" · adapter {a}")).unwrap_or_default();
    let fault = row.get("fault").and_then(Value::as_str);
    let mut s = format!(
        "<details{}><summary>{}{} · reward {} · advantage {} · {} · weights v{}{}</summary>\n",
        if fault.is_some() { " class=\"fault\"" } else { "" },
        esc(row["id"].as_str().unwrap_or("?")),
        esc(&adapter),
        num(&row["reward"]),
        num(&row["advantage"]),
        esc(&ended),
        row["weight_version"],
        if fault.is_some() { " · fault" } else { "" },
    );
    if let Some(f) = fault {
        s.push_str(&format!("<p class=\"why\">{}</p>\n", esc(f)));
    }
    s.push_str(&format!("<h4>prompt</h4><pre>{}</pre>\n", esc(&text_of(&row["prompt"]))));
    if let Some(r) = row.get("response") {
        s.push_str(&format!("<h4>response</h4><pre>{}</pre>\n", esc(&text_of(r))));
    }
    for (k, t) in ep.and_then(|e| e["transcript"].as_array()).into_iter().flatten().enumerate() {
        s.push_str(&format!(
            "<h4>turn {} ({})</h4><pre>{}</pre>\n",
            k + 1,
            esc(t["role"].as_str().unwrap_or("?")),
            esc(&text_of(&t["text"]))
        ));
        if let Some(calls) = t["tool_calls"].as_array().filter(|c| !c.is_empty()) {
            s.push_str(&format!("<p>tool calls: <code>{}</code></p>\n", esc(&Value::Array(calls.clone()).to_string())));
        }
        if let Some(e) = t.get("tool_call_error").and_then(Value::as_str) {
            s.push_str(&format!("<p class=\"why\">tool call did not parse: {}</p>\n", esc(e)));
        }
        if let Some(o) = t.get("observation") {
            let what = if t.get("compacted").is_some() { "compacted context" } else { "observation" };
            s.push_str(&format!("<h4>{what}</h4><pre>{}</pre>\n", esc(&text_of(o))));
        }
    }
    s.push_str("</details>\n");
    s
}

/// The HTML section of one run's samples; None when it wrote none.
pub fn section(label: &str, samples: &Samples) -> String {
    let mut s = format!("<h2>{}: samples (samples.jsonl)</h2>\n", esc(label));
    if samples.left_out > 0 {
        s.push_str(&format!(
            "<p>{} sampled steps between the first {FIRST_STEPS} and the last {LAST_STEPS} are in the file only.</p>\n",
            samples.left_out
        ));
    }
    for st in &samples.steps {
        s.push_str(&format!("<h3>step {}</h3>\n", st.step));
        for row in &st.rows {
            s.push_str(&entry(row));
        }
    }
    s
}

/// Text for a terminal line: control characters (an escape sequence in a response) are shown
/// escaped, and long text is shortened.
fn line_text(s: &str) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == TEXT_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The text report's lines for one run: the file, then the first sample of each of the last few
/// sampled steps.
pub fn text_lines(dir: &Path, samples: &Samples) -> String {
    let n: usize = samples.steps.iter().map(|s| s.rows.len()).sum();
    let mut s = format!(
        "{}: {n} samples shown of {} steps (report/samples.html)\n",
        dir.join("samples.jsonl").display(),
        samples.steps.len()
    );
    for st in samples.steps.iter().rev().take(TEXT_STEPS).rev() {
        let Some(row) = st.rows.first() else { continue };
        let said = match row.get("response") {
            Some(r) => text_of(r),
            None => row
                .pointer("/episode/transcript")
                .and_then(Value::as_array)
                .and_then(|t| t.last())
                .map(|t| text_of(&t["text"]))
                .unwrap_or_default(),
        };
        let fault =
            row.get("fault").and_then(Value::as_str).map(|f| format!(" fault: {}", line_text(f))).unwrap_or_default();
        s.push_str(&format!(
            "  step {} {}: reward {} | {} -> {}{fault}\n",
            st.step,
            line_text(row["id"].as_str().unwrap_or("?")),
            num(&row["reward"]),
            line_text(&text_of(&row["prompt"])),
            line_text(&said),
        ));
    }
    if samples.skipped > 0 {
        s.push_str(&format!("  ({} torn lines skipped)\n", samples.skipped));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dir_with(rows: &[Value], extra: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("miles-report-samples-{}-{}", std::process::id(), rows.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut text: String = rows.iter().map(|r| format!("{r}\n")).collect();
        text.push_str(extra);
        std::fs::write(dir.join("samples.jsonl"), text).unwrap();
        dir
    }

    fn row(step: u64, response: &str) -> Value {
        json!({"step": step, "id": format!("step{step}/p0/s0"), "group": 0, "index": 0, "weight_version": 1,
               "prompt": {"text": "1+2=", "ids": [1]}, "response": {"text": response, "ids": [2]},
               "finish": "stop", "reward": 1.0, "advantage": 0.5})
    }

    /// Samples are untrusted: a `<script>` in a response, a quote in a fault or a tool call, and
    /// an escape sequence are shown as text, never markup or terminal control.
    #[test]
    fn samples_are_escaped_in_the_page_and_on_the_terminal() {
        let mut bad = row(1, "<script>alert('x')</script>\u{1b}[2J");
        bad["fault"] = json!("reward `r\"><img src=x onerror=alert(1)>` failed");
        let ep = json!({"step": 2, "id": "step2/p0/e0", "group": 0, "index": 0, "weight_version": 1,
            "prompt": {"text": "q", "ids": []}, "reward": null, "advantage": null, "fault": "env crashed",
            "episode": {"end": "env_crashed", "env_reward": 0.0, "turns": 1, "chains": 1, "tool_calls": 1, "bad_tool_calls": 0,
              "transcript": [{"role": "assistant", "text": {"text": "<tool>calc </script></tool>", "ids": []}, "finish": "stop",
                "tool_calls": [{"name": "calc", "arguments": "</script><script>"}],
                "observation": {"text": "<b>6</b>", "ids": []}}]}});
        let dir = dir_with(&[bad, ep], "{\"step\": 3, \"id\": \"torn");
        let s = load(&dir).unwrap();
        assert_eq!((s.steps.len(), s.skipped), (2, 1));
        let html = section("run <1>", &s);
        assert!(!html.contains("<script>") && !html.contains("</script>"), "{html}");
        assert!(!html.contains("<img") && !html.contains("<b>"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"), "{html}");
        assert!(html.contains("run &lt;1&gt;"));
        assert!(html.contains("<details class=\"fault\"><summary>step2/p0/e0"), "{html}");
        assert!(
            html.contains("end env_crashed") && html.contains("<h4>observation</h4><pre>&lt;b&gt;6&lt;/b&gt;</pre>")
        );
        let text = text_lines(&dir, &s);
        assert!(!text.contains('\u{1b}'), "{text}");
        assert!(text.contains("\\u{1b}[2J"), "{text}");
        assert!(
            text.contains("step 2 step2/p0/e0: reward dropped | q -> <tool>calc </script></tool> fault: env crashed"),
            "{text}"
        );
        assert!(text.contains("(1 torn lines skipped)"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A long run shows its first and last sampled steps, and says how many are in the file only.
    #[test]
    fn a_long_run_shows_its_first_and_last_sampled_steps() {
        let rows: Vec<Value> = (1..=40).flat_map(|s| [row(s, "a"), row(s, "b")]).collect();
        let dir = dir_with(&rows, "");
        let s = load(&dir).unwrap();
        let steps: Vec<u64> = s.steps.iter().map(|s| s.step).collect();
        let want: Vec<u64> = (1..=5).chain(16..=40).collect();
        assert_eq!(steps, want);
        assert!(s.steps.iter().all(|s| s.rows.len() == 2));
        assert_eq!(s.left_out, 10);
        assert!(section("r", &s).contains("10 sampled steps between the first 5 and the last 25"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
