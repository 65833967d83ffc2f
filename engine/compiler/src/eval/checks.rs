//! Checks: `check`/`warn` rules and `in` constraints, and the power-assert style explanation of
//! a failing rule (the values it read, and where they were set).

use super::{Env, Eval};
use crate::types::Type;
use crate::value::{ItemRef, Value};
use miles_grammar::ast::{self, Expr, ExprKind};
use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, Span};

impl<'p> Eval<'p> {
    /// Runs one `check`; on failure reports E0301 at `primary` naming the rule and showing
    /// the values the check relates. `labels` adds where related fields were set.
    pub fn run_check(
        &mut self,
        check: &ast::Check,
        env: Env,
        primary: Span,
        owner: ItemRef,
        labels: &[(Span, String)],
    ) -> bool {
        let rule = self.decl_path(owner);
        self.run_check_as(check, env, primary, rule, labels)
    }

    /// `run_check` for a rule declared outside the language (a manifest's house rule): `rule`
    /// names it in the diagnostic.
    pub fn run_check_as(
        &mut self,
        check: &ast::Check,
        env: Env,
        primary: Span,
        rule: String,
        labels: &[(Span, String)],
    ) -> bool {
        let v = self.eval(&check.expr, env, Some(&Type::Bool));
        match v {
            Some(Value::Bool(true)) => true,
            Some(Value::Bool(false)) => {
                let message = check
                    .message
                    .as_ref()
                    .map(|m| self.render_text(m, env))
                    .filter(|m| !m.is_empty())
                    .unwrap_or_else(|| "check failed".to_string());
                let shown = self.explain_values(&check.expr, env);
                // `at FIELD`: the diagnostic points where the recipe set the field it blames,
                // and names the stage or record the rule belongs to beside it.
                let blamed = check.at.as_ref().and_then(|at| self.set_span(at, env)).filter(|sp| *sp != primary);
                let (at, what) =
                    if check.warn { ("this rule warns here", "warns") } else { ("this check fails here", "fails") };
                let mut d = if check.warn {
                    Diagnostic::warning(ErrorCode::E0309, message)
                } else {
                    Diagnostic::error(ErrorCode::E0301, message)
                };
                d = match blamed {
                    Some(sp) => {
                        d.with_primary(sp, at).with_secondary(primary, format!("the rule that {what} is on this"))
                    }
                    None => d.with_primary(primary, at),
                };
                let primary = blamed.unwrap_or(primary);
                for (sp, msg) in labels {
                    d = d.with_secondary(*sp, msg.clone());
                }
                for (sp, text) in &shown.1 {
                    if sp.file == primary.file && *sp != primary {
                        d = d.with_secondary(*sp, text.clone());
                    }
                }
                let mut help = String::new();
                if !shown.0.is_empty() {
                    help.push_str(&format!("values: {}", shown.0.join(", ")));
                }
                if let Some(h) = check.help.as_ref().map(|h| self.render_text(h, env)).filter(|h| !h.is_empty()) {
                    if !help.is_empty() {
                        help.push('\n');
                    }
                    help.push_str(&h);
                }
                if !help.is_empty() {
                    d = d.with_help(help);
                }
                d = d.with_rule(rule, check.span);
                self.report(d);
                false
            }
            Some(other) => {
                self.report(
                    Diagnostic::error(
                        ErrorCode::E0302,
                        format!("a check must be true or false, found {}", other.type_name()),
                    )
                    .with_primary(check.expr.span, "not a Bool"),
                );
                false
            }
            None => false,
        }
    }

    /// A failing rule's `else` or `help` text with its `\\(expr)` parts replaced by their values,
    /// read where the rule is. A line holding an interpolation that is `none` (or cannot be
    /// read) is left out: a rule proposes a value only where there is one.
    fn render_text(&mut self, t: &ast::Text, env: Env) -> String {
        let mut lines: Vec<String> = Vec::new();
        let mut line = String::new();
        let mut drop = false;
        for p in &t.parts {
            match p {
                ast::TextPart::Lit(s) => {
                    let mut pieces = s.split('\n');
                    line.push_str(pieces.next().unwrap_or(""));
                    for piece in pieces {
                        if !std::mem::take(&mut drop) {
                            lines.push(std::mem::take(&mut line));
                        }
                        line = piece.to_string();
                    }
                }
                ast::TextPart::Expr { expr, .. } => match self.quiet_eval(expr, env) {
                    Some(Value::None) | None => drop = true,
                    Some(v) => line.push_str(&prose(&v)),
                },
            }
        }
        if !drop {
            lines.push(line);
        }
        lines.retain(|l| !l.trim().is_empty());
        lines.join("\n")
    }

    pub(super) fn quiet_eval(&mut self, e: &Expr, env: Env) -> Option<Value> {
        self.quiet += 1;
        let refs = self.references.len();
        let v = self.eval(e, env, None);
        self.references.truncate(refs);
        self.quiet -= 1;
        v
    }

    /// `name = value` for every name and field path in a check, power-assert style, plus the
    /// spans where fields the check reads were set.
    fn explain_values(&mut self, e: &Expr, env: Env) -> (Vec<String>, Vec<(Span, String)>) {
        let mut paths: Vec<&Expr> = Vec::new();
        collect_paths(e, &mut paths);
        let mut out = Vec::new();
        let mut spans = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for p in paths {
            let text = expr_text(p);
            if !seen.insert(text.clone()) {
                continue;
            }
            if let Some(v) = self.quiet_eval(p, env) {
                if matches!(
                    v,
                    Value::Stage(_) | Value::Decl(_) | Value::Module(_) | Value::Builtin(_) | Value::Record(_)
                ) {
                    continue;
                }
                // A bare enum member (`disaggregated`) says nothing new.
                if matches!(&v, Value::Enum { member, .. } if *member == text) {
                    continue;
                }
                if let Some(sp) = self.set_span(p, env) {
                    spans.push((sp, format!("`{text}` = {v}")));
                }
                out.push(format!("{text} = {v}"));
            }
        }
        (out, spans)
    }

    /// Where the field a path names was set in the recipe (not where it was defaulted).
    fn set_span(&mut self, p: &Expr, env: Env) -> Option<Span> {
        if let (Env::Record(f), ExprKind::Name(id)) = (env, &p.kind) {
            return self
                .frames
                .get(f)?
                .provided
                .get(&id.name)
                .filter(|fv| !fv.defaulted && fv.span != Span::default())
                .map(|fv| fv.span);
        }
        let Env::Instance(i) = env else { return None };
        match &p.kind {
            ExprKind::Name(id) => {
                let inst = &self.recipe.as_ref()?.instances[i];
                inst.provided.get(&id.name).map(|x| x.0.span)
            }
            ExprKind::Field(base, field) => {
                if let ExprKind::Name(b) = &base.kind {
                    let r = self.recipe.as_ref()?;
                    let inst = &r.instances[i];
                    let target = inst.args.iter().find(|(p, _, _)| *p == b.name).map(|(_, v, _)| v.clone());
                    if let Some(Value::Stage(n)) = target {
                        let j = *r.by_name.get(&n)?;
                        return r.instances[j].provided.get(&field.name).map(|x| x.0.span);
                    }
                    if target.is_some() {
                        return None;
                    }
                    // Not a port: a field of this stage holding a record (`engine.tp`), where
                    // the recipe set it.
                    let Some(Value::Record(rec)) = self.quiet_eval(base, env) else { return None };
                    return rec.fields.get(&field.name).filter(|fv| !fv.defaulted).map(|fv| fv.span);
                }
                // `model_of(policy).max_len`: where the record's field was set, or, for a
                // default, the record itself (the model the recipe wrote).
                let Some(Value::Record(rec)) = self.quiet_eval(base, env) else { return None };
                let fv = rec.fields.get(&field.name)?;
                Some(if fv.defaulted { rec.span } else { fv.span })
            }
            _ => None,
        }
    }

    pub(super) fn in_constraint(&mut self, v: &Value, c: &Expr, env: Env) -> Option<bool> {
        if matches!(v, Value::None) {
            return Some(true);
        }
        let cons = self.eval(c, env, None)?;
        self.contains(&cons, v, c.span)
    }
}

/// A value written into prose: a string without quotes, a list as its items separated by commas.
fn prose(v: &Value) -> String {
    match v {
        Value::Str(s) => s.clone(),
        Value::List(items) => items.iter().map(prose).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

pub(super) fn out_of_range(name: &str, v: &Value, cons: Option<&Value>, span: Span, cons_span: Span) -> Diagnostic {
    let allowed = cons.map(|c| c.to_string()).unwrap_or_else(|| "the declared range".into());
    Diagnostic::error(ErrorCode::E0204, format!("`{name}` = {v} is outside {allowed}"))
        .with_primary(span, format!("must be in {allowed}"))
        .with_secondary(cons_span, "range declared here")
        .with_help(format!("choose a value in {allowed}"))
}

/// Names and field paths (`rollout_batch`, `rollout.samples_per_prompt`) inside an expression.
fn collect_paths<'e>(root: &'e Expr, out: &mut Vec<&'e Expr>) {
    // Iterative, in source order: a failing check over a 200,000-term sum is that deep.
    let mut stack = vec![root];
    while let Some(e) = stack.pop() {
        let at = stack.len();
        match &e.kind {
            ExprKind::Name(_) => out.push(e),
            ExprKind::Field(base, _) if is_path(base) => out.push(e),
            ExprKind::Field(base, _) => stack.push(base),
            // The callee names a function, not a value worth showing.
            ExprKind::Call { args, .. } => stack.extend(args.iter().map(|a| &a.value)),
            // What a record, map or range literal reads is not shown: the help stays one line.
            ExprKind::Record { .. } | ExprKind::Map(_) | ExprKind::Range { .. } => {}
            _ => e.for_each_child(|c| stack.push(c)),
        }
        stack[at..].reverse();
    }
}

fn is_path(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Name(_) => true,
        ExprKind::Field(b, _) => is_path(b),
        // `model_of(rollout).layers`: a builtin applied to paths reads like a path.
        ExprKind::Call { callee, args, .. } => {
            matches!(&callee.kind, ExprKind::Name(_))
                && args.iter().all(|a| is_path(&a.value) || matches!(a.value.kind, ExprKind::Str(_)))
        }
        _ => false,
    }
}

pub fn expr_text(e: &Expr) -> String {
    match &e.kind {
        ExprKind::Name(id) => id.name.clone(),
        ExprKind::Field(b, f) => format!("{}.{}", expr_text(b), f.name),
        ExprKind::Call { callee, args, .. } => {
            let args: Vec<String> = args.iter().map(|a| expr_text(&a.value)).collect();
            format!("{}({})", expr_text(callee), args.join(", "))
        }
        ExprKind::Str(s) => format!("{s:?}"),
        _ => "…".into(),
    }
}
