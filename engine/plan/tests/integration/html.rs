//! The HTML plan in a real browser: headless Chromium screenshots the page when
//! `/usr/bin/chromium` exists (Debian package `chromium`); elsewhere the test only checks the
//! page is self-contained.

use miles_plan::{plan, render_html, PlanInput};
use std::path::{Path, PathBuf};
use std::process::Command;

fn page(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(format!("{name}.json"));
    let input: PlanInput = serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    render_html(&plan(&input))
}

#[test]
fn html_is_self_contained() {
    for name in ["glm5_reference_no_offload", "qwen3_4b_colocated", "cpu_laptop", "invalid_layouts"] {
        let html = page(name);
        assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
        for banned in ["<script", "http://", "https://", "<link", "@import", "url(http"] {
            let hay = html.replace("http://www.w3.org/2000/svg", "");
            assert!(!hay.contains(banned), "{name}: {banned}");
        }
    }
}

/// A one-node cluster's GPU-map legend says "node 0", as the text plan does (it said "nodes 0-0").
#[test]
fn gpu_map_legend_names_one_node_as_a_node() {
    let html = page("qwen3_4b_colocated");
    assert!(html.contains("<td>node 0</td>"), "{html}");
    assert!(!html.contains("nodes 0-0"), "{html}");
}

#[test]
fn html_renders_in_chromium() {
    let chromium = Path::new("/usr/bin/chromium");
    if !chromium.exists() {
        eprintln!("skipped: /usr/bin/chromium not installed");
        return;
    }
    let dir: PathBuf = std::env::temp_dir().join(format!("miles-plan-html-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("profile")).expect("temp dir");
    let html = dir.join("plan.html");
    std::fs::write(&html, page("glm5_reference_no_offload")).expect("write html");
    let png = dir.join("plan.png");
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg("--window-size=1280,1700")
        .arg(format!("file://{}", html.display()))
        .output()
        .expect("run chromium");
    let bytes = std::fs::read(&png).unwrap_or_default();
    assert!(
        bytes.len() > 10_000 && bytes.starts_with(b"\x89PNG"),
        "no screenshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if let Ok(keep) = std::env::var("MILES_PLAN_SCREENSHOT") {
        let _ = std::fs::copy(&png, keep);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
