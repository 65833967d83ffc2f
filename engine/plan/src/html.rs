use crate::output::Plan;
pub fn render_html(_p: &Plan) -> String { String::new() }
