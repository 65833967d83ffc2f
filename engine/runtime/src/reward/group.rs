//! Group rewards (`group_command_reward`, `group_http_reward`): the program or service gets one
//! request per group, the prompt, label and metadata once and every member's response, and
//! answers one score per member, in order (ranking, pairwise preference). The answer is the
//! batch protocol's (`{"id": N, "scores": [...]}`, reward/protocol.rs); a fault fails the whole
//! group, and its message names the group. docs/rewards.md, "Group rewards".

use super::RewardInput;
use serde_json::json;

/// One request's worth of a batch: the samples it carries (indices into the batch, in order) and,
/// for a group, the group's name (what a failure names).
#[derive(Debug, Clone, PartialEq)]
pub struct Unit {
    pub group: Option<String>,
    pub members: Vec<usize>,
}

/// The groups of a batch in the order their first member comes, each member in batch order. A
/// group is never split: its members may be anywhere in the batch.
pub fn groups(items: &[RewardInput]) -> Vec<Unit> {
    let mut order: Vec<usize> = Vec::new();
    let mut members: std::collections::HashMap<usize, Vec<usize>> = std::collections::HashMap::new();
    for (i, it) in items.iter().enumerate() {
        members
            .entry(it.group)
            .or_insert_with(|| {
                order.push(it.group);
                Vec::new()
            })
            .push(i);
    }
    order
        .into_iter()
        .map(|g| {
            let m = members.remove(&g).unwrap_or_default();
            Unit { group: Some(name(items, &m)), members: m }
        })
        .collect()
}

/// Per-sample requests: consecutive chunks of at most `size` samples.
pub fn chunks(n: usize, size: usize) -> Vec<Unit> {
    (0..n)
        .step_by(size.max(1))
        .map(|s| Unit { group: None, members: (s..(s + size.max(1)).min(n)).collect() })
        .collect()
}

/// A group's name: its members' shared sample-id prefix (`step12/p3` for `step12/p3/s0`, ...), a
/// lone member's id, else the first member's id followed by `...`.
fn name(items: &[RewardInput], members: &[usize]) -> String {
    let ids: Vec<&str> = members.iter().map(|&i| items[i].sample_id.as_str()).collect();
    match ids.as_slice() {
        [] => String::new(),
        [one] => one.to_string(),
        [first, rest @ ..] => {
            let prefix = first.rsplit_once('/').map(|(p, _)| p);
            match prefix.filter(|p| rest.iter().all(|id| id.rsplit_once('/').map(|(q, _)| q) == Some(*p))) {
                Some(p) => p.to_string(),
                None => format!("{first}..."),
            }
        }
    }
}

/// The JSON text of group request `id` (one line): the group's prompt, label and metadata (its
/// first member's: every member answers the same prompt) and each member's response.
pub fn request(id: u64, group: &str, members: &[&RewardInput]) -> String {
    let first = members.first();
    let responses: Vec<_> = members
        .iter()
        .map(|m| json!({"sample_id": m.sample_id, "response": m.response, "finish_reason": m.finish}))
        .collect();
    json!({
        "id": id,
        "group": group,
        "prompt": first.map(|m| m.prompt.clone()),
        "label": first.map(|m| m.label.clone()),
        "metadata": first.map(|m| m.metadata.clone()),
        "responses": responses,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reward::input;

    fn member(id: &str, group: usize) -> RewardInput {
        RewardInput { group, ..input(id, "r", json!("l")) }
    }

    #[test]
    fn a_batch_is_cut_into_whole_groups_named_by_their_prefix() {
        let items =
            [member("step1/p0/s0", 0), member("step1/p1/s0", 1), member("step1/p0/s1", 0), member("eval/p2", 2)];
        let got = groups(&items);
        assert_eq!(
            got,
            vec![
                Unit { group: Some("step1/p0".into()), members: vec![0, 2] },
                Unit { group: Some("step1/p1/s0".into()), members: vec![1] },
                Unit { group: Some("eval/p2".into()), members: vec![3] },
            ]
        );
        let odd = [member("a/s0", 0), member("b/s1", 0)];
        assert_eq!(groups(&odd)[0].group.as_deref(), Some("a/s0..."));
        assert_eq!(
            chunks(5, 2).iter().map(|u| u.members.clone()).collect::<Vec<_>>(),
            [vec![0, 1], vec![2, 3], vec![4]]
        );
        assert!(chunks(0, 2).is_empty());
    }

    #[test]
    fn a_group_request_carries_the_prompt_once_and_every_response() {
        let items = [member("step1/p0/s0", 0), member("step1/p0/s1", 0)];
        let r = request(4, "step1/p0", &items.iter().collect::<Vec<_>>());
        assert!(!r.contains('\n'));
        assert_eq!(
            r,
            r#"{"group":"step1/p0","id":4,"label":"l","metadata":{},"prompt":"q","responses":[{"finish_reason":"stop","response":"r","sample_id":"step1/p0/s0"},{"finish_reason":"stop","response":"r","sample_id":"step1/p0/s1"}]}"#
        );
    }
}
