//! R3 (rollout routing replay): the experts a mixture-of-experts engine routed each token to, per
//! MoE layer, recorded during sampling and carried with the trajectory so the trainer's forward
//! uses the same experts (docs/moe.md). Stored compactly: each id in the smallest integer type
//! that holds the expert count (or the recipe's `routing_dtype`).

use serde::{Deserialize, Serialize};

/// The integer type of one recorded expert id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteId {
    #[default]
    U8,
    U16,
    I32,
}

impl RouteId {
    pub fn bytes(self) -> usize {
        match self {
            RouteId::U8 => 1,
            RouteId::U16 => 2,
            RouteId::I32 => 4,
        }
    }

    /// Largest expert count whose ids (0..experts) the type holds.
    pub fn max_experts(self) -> u64 {
        match self {
            RouteId::U8 => 1 << 8,
            RouteId::U16 => 1 << 16,
            RouteId::I32 => 1 << 31,
        }
    }

    /// The smallest type that holds ids 0..experts.
    pub fn smallest_for(experts: usize) -> RouteId {
        [RouteId::U8, RouteId::U16, RouteId::I32]
            .into_iter()
            .find(|t| experts as u64 <= t.max_experts())
            .unwrap_or(RouteId::I32)
    }
}

/// One trajectory's routing: `tokens` x `layers` x `top_k` expert ids, token-major, each id
/// `id.bytes()` little-endian. Token t is the t-th token of prompt + response; the engine records
/// every token it forwarded, so the last response token (never fed back) has none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Routing {
    /// MoE layers (the model's layers after its leading dense ones).
    pub layers: usize,
    pub top_k: usize,
    pub id: RouteId,
    pub data: Vec<u8>,
}

impl Routing {
    pub fn new(layers: usize, top_k: usize, id: RouteId) -> Routing {
        Routing { layers, top_k, id, data: Vec::new() }
    }

    /// Ids per token (layers x top_k).
    pub fn per_token(&self) -> usize {
        self.layers * self.top_k
    }

    /// Tokens recorded.
    pub fn tokens(&self) -> usize {
        self.data.len().checked_div(self.per_token() * self.id.bytes()).unwrap_or(0)
    }

    /// Bytes on the wire and in the buffer.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Appends one token's ids (layers x top_k, layer-major).
    pub fn push_token(&mut self, ids: &[i64]) {
        debug_assert_eq!(ids.len(), self.per_token());
        for &e in ids {
            match self.id {
                RouteId::U8 => self.data.push(e as u8),
                RouteId::U16 => self.data.extend_from_slice(&(e as u16).to_le_bytes()),
                RouteId::I32 => self.data.extend_from_slice(&(e as i32).to_le_bytes()),
            }
        }
    }

    /// Every id, as i64, token-major (tokens x layers x top_k).
    pub fn ids(&self) -> Vec<i64> {
        match self.id {
            RouteId::U8 => self.data.iter().map(|&b| b as i64).collect(),
            RouteId::U16 => self.data.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as i64).collect(),
            RouteId::I32 => {
                self.data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect()
            }
        }
    }

    /// Keeps the first `tokens` tokens (a response cut short).
    pub fn truncate(&mut self, tokens: usize) {
        self.data.truncate(tokens * self.per_token() * self.id.bytes());
    }

    /// Why this routing cannot be replayed for a sequence of `seq_len` tokens on a model with
    /// `layers` MoE layers, `top_k` and `experts`; None when it fits.
    pub fn mismatch(&self, seq_len: usize, layers: usize, top_k: usize, experts: usize) -> Option<String> {
        if self.layers != layers || self.top_k != top_k {
            return Some(format!(
                "routing records {} MoE layers x top-{}, the model has {layers} x top-{top_k}",
                self.layers, self.top_k
            ));
        }
        let w = self.per_token() * self.id.bytes();
        if w > 0 && self.data.len() % w != 0 {
            return Some(format!("routing holds {} bytes, not a whole number of {w}-byte tokens", self.data.len()));
        }
        if self.tokens() + 1 < seq_len || self.tokens() > seq_len {
            return Some(format!("routing records {} tokens for a sequence of {seq_len}", self.tokens()));
        }
        if let Some(e) = self.ids().into_iter().find(|&e| e < 0 || e as usize >= experts) {
            return Some(format!("routing names expert {e}; the model has {experts}"));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smallest_type_holds_the_expert_count() {
        assert_eq!(RouteId::smallest_for(8), RouteId::U8);
        assert_eq!(RouteId::smallest_for(256), RouteId::U8);
        assert_eq!(RouteId::smallest_for(257), RouteId::U16);
        assert_eq!(RouteId::smallest_for(70_000), RouteId::I32);
    }

    #[test]
    fn ids_round_trip_in_every_type() {
        for id in [RouteId::U8, RouteId::U16, RouteId::I32] {
            let mut r = Routing::new(2, 2, id);
            r.push_token(&[0, 7, 3, 1]);
            r.push_token(&[5, 2, 6, 4]);
            assert_eq!(r.tokens(), 2);
            assert_eq!(r.bytes(), 8 * id.bytes());
            assert_eq!(r.ids(), vec![0, 7, 3, 1, 5, 2, 6, 4]);
            r.truncate(1);
            assert_eq!(r.ids(), vec![0, 7, 3, 1]);
        }
    }

    #[test]
    fn mismatch_names_what_does_not_fit() {
        let mut r = Routing::new(1, 2, RouteId::U8);
        r.push_token(&[0, 1]);
        r.push_token(&[2, 3]);
        assert_eq!(r.mismatch(3, 1, 2, 4), None);
        assert_eq!(r.mismatch(2, 1, 2, 4), None);
        assert!(r.mismatch(5, 1, 2, 4).unwrap().contains("2 tokens for a sequence of 5"));
        assert!(r.mismatch(3, 2, 2, 4).unwrap().contains("1 MoE layers"));
        assert!(r.mismatch(3, 1, 2, 3).unwrap().contains("expert 3"));
    }
}
