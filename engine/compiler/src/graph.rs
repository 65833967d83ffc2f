//! The lowered form of a recipe: a petgraph graph of typed stage instances joined by typed
//! channels. Every parameter keeps the span it came from, so the planner and the runtime can
//! point back at the recipe line.

use crate::value::{PortKind, Record, Value};
use miles_grammar::diag::Span;
use petgraph::graph::DiGraph;
use petgraph::visit::EdgeRef;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct Param {
    pub value: Value,
    /// Where it was set; for a default, the default's expression in the stage kind.
    pub span: Span,
    pub defaulted: bool,
}

#[derive(Clone, Debug)]
pub struct StageNode {
    /// The recipe binding: `train`.
    pub name: String,
    /// The stage kind: `grpo`.
    pub kind: String,
    /// Where the kind is declared: `std/stages.grpo`.
    pub kind_path: String,
    pub span: Span,
    pub name_span: Span,
    pub output: Option<PortKind>,
    pub params: BTreeMap<String, Param>,
    /// Port -> argument: a `Value::Stage` for an upstream stage, or a record (a model, a prompt set).
    pub inputs: BTreeMap<String, Value>,
    /// The model this stage runs, found upstream through its Policy, then Trajectories ports
    /// (`Eval::model_of`, computed once in lowering); `None` when no model is upstream.
    pub model: Option<Arc<Record>>,
}

impl StageNode {
    pub fn param(&self, name: &str) -> Option<&Value> {
        self.params.get(name).map(|p| &p.value)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ChannelKind {
    Prompts,
    Trajectories,
    Scores,
    TokenScores,
    Policy,
    Weights,
    Metrics,
}

#[derive(Clone, Debug)]
pub struct Channel {
    pub kind: ChannelKind,
    /// The consuming port (for weight sync, the port naming the rollout).
    pub port: String,
    /// A weight-sync edge pointing back from trainer to rollout.
    pub back: bool,
}

#[derive(Clone, Debug, Default)]
pub struct StageGraph {
    pub graph: DiGraph<StageNode, Channel>,
}

impl StageGraph {
    pub fn node(&self, name: &str) -> Option<&StageNode> {
        self.graph.node_weights().find(|n| n.name == name)
    }
    pub fn nodes(&self) -> impl Iterator<Item = &StageNode> {
        self.graph.node_weights()
    }
    /// (from, to, channel) for every edge, in insertion order.
    pub fn edges(&self) -> Vec<(&str, &str, &Channel)> {
        self.graph
            .edge_references()
            .map(|e| (self.graph[e.source()].name.as_str(), self.graph[e.target()].name.as_str(), e.weight()))
            .collect()
    }

    pub fn to_mermaid(&self) -> String {
        let mut s = String::from("flowchart LR\n");
        for n in self.nodes() {
            s.push_str(&format!("    {}[\"{}<br/><i>{}</i>\"]\n", n.name, n.name, n.kind));
        }
        for (a, b, c) in self.edges() {
            if c.back {
                s.push_str(&format!("    {a} -. {:?} .-> {b}\n", c.kind));
            } else {
                s.push_str(&format!("    {a} -- {:?} --> {b}\n", c.kind));
            }
        }
        s
    }

    pub fn to_dot(&self) -> String {
        let mut s = String::from("digraph recipe {\n    rankdir=LR;\n    node [shape=box, style=rounded];\n");
        for n in self.nodes() {
            s.push_str(&format!("    \"{}\" [label=\"{}\\n{}\"];\n", n.name, n.name, n.kind));
        }
        for (a, b, c) in self.edges() {
            let style = if c.back { ", style=dashed, constraint=false" } else { "" };
            s.push_str(&format!("    \"{a}\" -> \"{b}\" [label=\"{:?}\"{style}];\n", c.kind));
        }
        s.push_str("}\n");
        s
    }

    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let nodes: Vec<_> = self
            .nodes()
            .map(|n| {
                let params: serde_json::Map<_, _> =
                    n.params.iter().map(|(k, p)| (k.clone(), p.value.to_json())).collect();
                let inputs: serde_json::Map<_, _> = n.inputs.iter().map(|(k, v)| (k.clone(), v.to_json())).collect();
                json!({
                    "name": n.name,
                    "kind": n.kind,
                    "declared_in": n.kind_path,
                    "output": n.output.map(|p| p.name()),
                    "inputs": inputs,
                    "params": params,
                })
            })
            .collect();
        let edges: Vec<_> = self
            .edges()
            .into_iter()
            .map(|(a, b, c)| json!({ "from": a, "to": b, "channel": c.kind, "port": c.port, "back": c.back }))
            .collect();
        json!({ "nodes": nodes, "edges": edges })
    }
}
