//! Character tokenizer: one token per Unicode scalar, plus PAD, BOS and EOS.

use crate::{RunError, E_DATA_LINE};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

pub type TokenId = u32;

pub const PAD: TokenId = 0;
pub const BOS: TokenId = 1;
pub const EOS: TokenId = 2;
const N_SPECIAL: usize = 3;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CharTokenizer {
    /// Characters in id order; char i has id i + 3.
    chars: Vec<char>,
}

impl CharTokenizer {
    /// A tokenizer over the given characters (deduplicated, sorted so the ids do not depend on
    /// the order the data listed them in).
    pub fn new(chars: impl IntoIterator<Item = char>) -> CharTokenizer {
        let set: BTreeSet<char> = chars.into_iter().collect();
        CharTokenizer { chars: set.into_iter().collect() }
    }

    pub fn vocab_size(&self) -> usize {
        self.chars.len() + N_SPECIAL
    }

    pub fn id(&self, c: char) -> Option<TokenId> {
        self.chars.binary_search(&c).ok().map(|i| (i + N_SPECIAL) as TokenId)
    }

    /// Ids of `text`, without BOS/EOS. Errors on a character outside the vocabulary.
    pub fn encode(&self, text: &str) -> Result<Vec<TokenId>, RunError> {
        text.chars()
            .map(|c| {
                self.id(c).ok_or_else(|| {
                    RunError::new(E_DATA_LINE, format!("character {c:?} is not in the task tokenizer's vocabulary"))
                })
            })
            .collect()
    }

    /// BOS followed by the prompt's characters: what the policy is conditioned on.
    pub fn encode_prompt(&self, prompt: &str) -> Result<Vec<TokenId>, RunError> {
        let mut v = vec![BOS];
        v.extend(self.encode(prompt)?);
        Ok(v)
    }

    /// The gold response: answer characters then EOS (SFT targets).
    pub fn encode_answer(&self, answer: &str) -> Result<Vec<TokenId>, RunError> {
        let mut v = self.encode(answer)?;
        v.push(EOS);
        Ok(v)
    }

    /// Text of a response: stops at the first EOS; PAD, BOS and ids outside the vocabulary are
    /// dropped (a model with a larger vocab may emit them; they never match a label).
    pub fn decode(&self, ids: &[TokenId]) -> String {
        let mut s = String::new();
        for &id in ids {
            if id == EOS {
                break;
            }
            let i = id as usize;
            if i >= N_SPECIAL {
                if let Some(c) = self.chars.get(i - N_SPECIAL) {
                    s.push(*c);
                } else {
                    s.push('\u{FFFD}');
                }
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_specials() {
        let t = CharTokenizer::new("21+=0".chars());
        assert_eq!(t.vocab_size(), 3 + 5);
        let p = t.encode_prompt("12+0=").unwrap();
        assert_eq!(p[0], BOS);
        assert_eq!(t.decode(&p[1..]), "12+0=");
        let a = t.encode_answer("12").unwrap();
        assert_eq!(*a.last().unwrap(), EOS);
        assert_eq!(t.decode(&a), "12");
        assert!(t.encode("x").is_err());
        // ids beyond the tokenizer (a larger model vocab) decode to a replacement char.
        assert_eq!(t.decode(&[100]), "\u{FFFD}");
    }
}
