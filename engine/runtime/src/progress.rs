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
        Progress { bar, plain, total, started: Instant::now(), eval: None }
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
            eprintln!("eval step {step}: accuracy {:.1}%", acc * 100.0);
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
            self.note(&format!("done: eval accuracy {:.1}% -> {:.1}%", s * 100.0, e * 100.0));
        }
    }
}
