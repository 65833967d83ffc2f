//! Progress on stderr: an indicatif bar on a terminal, plain lines otherwise (logs, CI).

use crate::spec::ProgressMode;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::Instant;

pub struct Progress {
    bar: Option<ProgressBar>,
    plain: bool,
    total: u64,
    started: Instant,
    eval: Option<f64>,
    /// What "solved" means in this run (`RunSpec::solved_rule`), printed beside each accuracy.
    rule: String,
}

impl Progress {
    pub fn new(mode: ProgressMode, total: u64) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let (bar, plain) = match mode {
            ProgressMode::Off => (None, false),
            ProgressMode::Plain => (None, true),
            ProgressMode::Auto if !tty => (None, true),
            ProgressMode::Auto => {
                let b = ProgressBar::new(total);
                let style = ProgressStyle::with_template("{spinner} step {pos}/{len} [{bar:30}] {msg} eta {eta}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> ");
                b.set_style(style);
                (Some(b), false)
            }
        };
        Progress { bar, plain, total, started: Instant::now(), eval: None, rule: String::new() }
    }

    /// Names the success rule on the evaluation lines (`solved: reward >= 1`).
    pub fn with_rule(mut self, rule: String) -> Progress {
        self.rule = rule;
        self
    }

    /// The evaluation's line: its accuracy and, when known, what counted as solved.
    fn eval_line(&self, step: u64, acc: f64) -> String {
        let rule = if self.rule.is_empty() { String::new() } else { format!(" ({})", self.rule) };
        format!("eval step {step}: accuracy {:.1}%{rule}", acc * 100.0)
    }

    pub fn note(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(msg),
            None if self.plain => eprintln!("{msg}"),
            None => {}
        }
    }

    pub fn sft(&self, k: u64, total: u64, loss: f64) {
        if self.plain || self.bar.is_some() {
            self.note(&format!("sft {k}/{total} loss {loss:.4}"));
        }
    }

    pub fn eval(&mut self, step: u64, acc: f64) {
        self.eval = Some(acc);
        if self.plain {
            eprintln!("{}", self.eval_line(step, acc));
        }
    }

    pub fn step(&mut self, step: u64, reward: f64, gen_tps: f64, train_tps: f64) {
        let eval = self.eval.map(|a| format!("{:.1}%", a * 100.0)).unwrap_or_else(|| "-".into());
        let msg = format!("reward {reward:.3} eval {eval} gen {gen_tps:.0} tok/s train {train_tps:.0} tok/s");
        if let Some(b) = &self.bar {
            b.set_position(step);
            b.set_message(msg);
        } else if self.plain {
            let el = self.started.elapsed().as_secs_f64();
            let eta = el / step.max(1) as f64 * self.total.saturating_sub(step) as f64;
            eprintln!("step {step}/{} {msg} eta {eta:.0}s", self.total);
        }
    }

    pub fn finish(&self, start: Option<f64>, end: Option<f64>) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
        if let (Some(s), Some(e)) = (start, end) {
            let rule = if self.rule.is_empty() { String::new() } else { format!(" ({})", self.rule) };
            self.note(&format!("done: eval accuracy {:.1}% -> {:.1}%{rule}", s * 100.0, e * 100.0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The console names what counted as solved beside each held-out accuracy (issue #42).
    #[test]
    fn the_eval_line_names_the_success_rule() {
        let p = Progress::new(ProgressMode::Off, 10)
            .with_rule("solved: episode reward >= 0.5 (env_reward.solved_at)".into());
        assert_eq!(
            p.eval_line(20, 0.25),
            "eval step 20: accuracy 25.0% (solved: episode reward >= 0.5 (env_reward.solved_at))"
        );
        assert_eq!(Progress::new(ProgressMode::Off, 10).eval_line(0, 0.5), "eval step 0: accuracy 50.0%");
    }
}
