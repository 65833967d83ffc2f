//! `combine` (std/stages): a weighted sum of reward stages. Its parts must score the
//! combination's own rollout (E0311, at `parts`, naming the part and the rollout it scores): a
//! part of another rollout would score responses the trainer never sees beside these. The count
//! of weights is a `check` of the stage kind; what the run executes is the capability table's.

use crate::eval::Eval;
use crate::graph::StageGraph;
use crate::value::Value;
use miles_grammar::diag::{Diagnostic, ErrorCode};

pub(crate) fn check(ev: &mut Eval, g: &StageGraph) {
    let combinations = g.graph.node_weights().filter(|n| n.kind == "combine" && n.kind_path.starts_with("std/"));
    for node in combinations {
        let (Some(Value::Stage(rollout)), Some(parts)) = (node.inputs.get("rollout"), node.params.get("parts")) else {
            continue;
        };
        let Value::List(items) = &parts.value else { continue };
        for item in items {
            let Value::Stage(name) = item else { continue };
            let Some(part) = g.node(name) else { continue };
            let Some(Value::Stage(theirs)) = part.inputs.get("rollout") else { continue };
            if theirs != rollout {
                ev.report(
                    Diagnostic::error(
                        ErrorCode::E0311,
                        format!(
                            "`{name}` scores the samples of `{theirs}`, but the combination `{}` weighs rewards of `{rollout}`",
                            node.name
                        ),
                    )
                    .with_primary(parts.span, format!("`{name}` scores another rollout"))
                    .with_secondary(part.name_span, format!("a reward of `{theirs}`"))
                    .with_help(format!("score `{rollout}` in `{name}`: {name} = {}({rollout}) {{ ... }}", part.kind)),
                );
            }
        }
    }
}
