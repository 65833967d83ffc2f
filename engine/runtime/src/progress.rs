//! Progress on stderr: an indicatif bar on a terminal, plain lines otherwise (logs, CI).

use crate::spec::ProgressMode;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::Instant;

/// A step whose episodes faulted for the same reasons as the last one told is told again only
/// after this many steps (with how many faulted steps were not told), so a run whose environment
/// keeps failing says so every 10 steps, not every step.
pub const FAULT_REPEAT_EVERY: u64 = 10;

pub struct Progress {
    bar: Option<ProgressBar>,
    plain: bool,
    total: u64,
    started: Instant,
    eval: Option<f64>,
    /// What "solved" means in this run (`RunSpec::solved_rule`), printed beside each accuracy.
    rule: String,
    /// The last fault warning told: its step and its reasons; and faulted steps not told since.
    faults_told: Option<(u64, String)>,
    faults_untold: u64,
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
        Progress {
            bar,
            plain,
            total,
            started: Instant::now(),
            eval: None,
            rule: String::new(),
            faults_told: None,
            faults_untold: 0,
        }
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

    /// A step's episode faults (`kinds`: its fault reasons, `line`: the warning; `None` when no
    /// episode faulted). Told at the first faulted step, whenever the reasons change, and
    /// otherwise every `FAULT_REPEAT_EVERY` steps; returns the line as told.
    pub fn faults(&mut self, step: u64, kinds: &str, line: Option<&str>) -> Option<String> {
        let Some(line) = line else {
            // A clean step: the next fault is news again.
            self.faults_told = None;
            self.faults_untold = 0;
            return None;
        };
        let tell = match &self.faults_told {
            None => true,
            Some((at, told)) => told != kinds || step >= at + FAULT_REPEAT_EVERY,
        };
        if !tell {
            self.faults_untold += 1;
            return None;
        }
        let mut msg = format!("warning: {line}");
        if self.faults_untold > 0 {
            msg.push_str(&format!(" ({} more faulted step(s) since the last such line)", self.faults_untold));
        }
        self.faults_told = Some((step, kinds.to_string()));
        self.faults_untold = 0;
        self.note(&msg);
        Some(msg)
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

    /// A step's line; `reward_note` follows the reward (`over 7 trained, 57 dropped` when some
    /// episodes faulted: the reward is then a mean over the survivors, and says so).
    pub fn step(&mut self, step: u64, reward: f64, reward_note: &str, gen_tps: f64, train_tps: f64) {
        let msg = self.step_message(reward, reward_note, gen_tps, train_tps);
        if let Some(b) = &self.bar {
            b.set_position(step);
            b.set_message(msg);
        } else if self.plain {
            let el = self.started.elapsed().as_secs_f64();
            let eta = el / step.max(1) as f64 * self.total.saturating_sub(step) as f64;
            eprintln!("step {step}/{} {msg} eta {eta:.0}s", self.total);
        }
    }

    fn step_message(&self, reward: f64, reward_note: &str, gen_tps: f64, train_tps: f64) -> String {
        let eval = self.eval.map(|a| format!("{:.1}%", a * 100.0)).unwrap_or_else(|| "-".into());
        format!("reward {reward:.3}{reward_note} eval {eval} gen {gen_tps:.0} tok/s train {train_tps:.0} tok/s")
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

    /// Issue #41: the reward of a step whose episodes faulted says what it is a mean over.
    #[test]
    fn the_step_line_says_what_its_reward_is_a_mean_over() {
        let p = Progress::new(ProgressMode::Off, 10);
        assert!(p
            .step_message(1.0, " over 7 trained, 57 dropped", 1.0, 1.0)
            .starts_with("reward 1.000 over 7 trained, 57 dropped eval -"));
    }

    /// Told at the first faulted step, when the reasons change, and every 10 steps otherwise;
    /// a clean step makes the next fault news again.
    #[test]
    fn fault_warnings_are_told_when_they_change_and_every_ten_steps() {
        let mut p = Progress::new(ProgressMode::Off, 100);
        let told: Vec<u64> = (1..=25)
            .filter(|&s| {
                let kinds = if s == 5 { "env_crashed env_timeout" } else { "env_crashed" };
                p.faults(s, kinds, Some(&format!("step {s}: x"))).is_some()
            })
            .collect();
        assert_eq!(told, vec![1, 5, 6, 16]);
        assert_eq!(
            p.faults(26, "env_crashed", Some("step 26: x")).as_deref(),
            Some("warning: step 26: x (9 more faulted step(s) since the last such line)")
        );
        assert_eq!(p.faults(27, "", None), None);
        assert_eq!(p.faults(28, "env_crashed", Some("step 28: x")).as_deref(), Some("warning: step 28: x"));
        let mut q = Progress::new(ProgressMode::Off, 100);
        q.faults(1, "env_crashed", Some("step 1: x"));
        q.faults(2, "env_crashed", Some("step 2: x"));
        assert_eq!(
            q.faults(11, "env_crashed", Some("step 11: x")).as_deref(),
            Some("warning: step 11: x (1 more faulted step(s) since the last such line)")
        );
    }
}
