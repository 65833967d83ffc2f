//! Weight sync planned through recipes with the published layouts of Miles Table 8 (issue #38):
//! tests/plans/table8-*.miles. The planner's broadcast and P2P figures must stay within 15% of
//! the measured ones; the unit tests beside the formulas (engine/plan/src/time/sync/tests.rs)
//! check the same mechanism on all eight published rows.

use miles_compiler::fs::FileSystem;
use miles_compiler::{compile, Options};
use miles_plan::Transport;

struct Disk;
impl FileSystem for Disk {
    fn read(&self, path: &str) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| e.to_string())
    }
}

/// Broadcast and P2P seconds of the recipe's one weight sync.
fn sync_seconds(file: &str) -> (f64, f64, String) {
    // The text names the figures; the JSON carries every assumption the estimate used.
    let c = compile(&Disk, &[file.to_string()], &Options::default());
    assert!(!c.has_errors(), "{file} has errors: {:#?}", c.diagnostics);
    let p = miles_plan::plan(&miles_plan::plan_input(&c.recipes[0]));
    let text = miles_plan::render_text(&p);
    let s = &p.syncs[0];
    let json = serde_json::to_string_pretty(s).expect("sync report as JSON");
    assert_eq!(s.transport, Transport::Broadcast, "{text}");
    let p2p = s.alternatives.iter().find(|a| a.transport == Transport::P2p).expect("p2p alternative");
    (s.estimate.seconds, p2p.seconds, format!("{}\n{json}", sync_section(&text)))
}

fn within(name: &str, got: f64, measured: f64) {
    let err = (got - measured) / measured;
    assert!(err.abs() <= 0.15, "{name}: planned {got:.2} s, measured {measured} s ({:+.1}%)", err * 100.0);
}

/// One Table 8 row through its recipe: both transports within 15% of the measured seconds, and
/// the plan's weight-sync section snapshotted.
fn table8_row(file: &str, name: &str, broadcast_s: f64, p2p_s: f64, snapshot: &str) {
    let (b, p, text) = sync_seconds(file);
    within(&format!("{name} broadcast"), b, broadcast_s);
    within(&format!("{name} p2p"), p, p2p_s);
    insta::assert_snapshot!(snapshot, text);
}

#[test]
fn glm5_table8_row() {
    table8_row("tests/plans/table8-glm-5.miles", "GLM-5", 58.3015, 8.4797, "table8_glm5_sync");
}

#[test]
fn kimi_k2_table8_row() {
    table8_row("tests/plans/table8-kimi-k2.miles", "Kimi K2", 53.2791, 7.2273, "table8_kimi_k2_sync");
}

/// The plan's weight-sync section: its heading to the next blank line.
fn sync_section(text: &str) -> String {
    let start = text.find("Weight sync").unwrap_or_else(|| panic!("no weight sync section:\n{text}"));
    let rest = &text[start..];
    rest[..rest.find("\n\n").unwrap_or(rest.len())].to_string()
}
