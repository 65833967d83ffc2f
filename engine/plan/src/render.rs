use crate::output::Plan;
pub fn render_text(_p: &Plan) -> String { String::new() }
pub fn render_json(p: &Plan) -> String { serde_json::to_string_pretty(p).unwrap_or_default() }
