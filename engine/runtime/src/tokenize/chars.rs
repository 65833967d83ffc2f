//! Character tokenizer: one token per Unicode scalar, plus PAD, BOS and EOS.

use crate::token::{TokenId, BOS, EOS, PAD};
use crate::{RunError, E_DATA_LINE};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

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

    /// The tokenizer as a Hugging Face `tokenizer.json` and `tokenizer_config.json`: a word-level
    /// vocabulary of single characters (each character its own pre-token), BOS added in front
    /// of every encoding, pieces joined back without spaces. Loaded by `tokenizers` (ours and
    /// Python's `AutoTokenizer`), it gives this tokenizer's ids; a character outside it is an
    /// error there too (its `<unk>` is not in the vocabulary).
    pub fn hf_files(&self) -> (serde_json::Value, serde_json::Value) {
        use serde_json::json;
        let (pad, bos, eos) = ("<pad>", "<s>", "</s>");
        let mut vocab = serde_json::Map::new();
        for (id, t) in [(PAD, pad), (BOS, bos), (EOS, eos)] {
            vocab.insert(t.into(), json!(id));
        }
        for (i, c) in self.chars.iter().enumerate() {
            vocab.insert(c.to_string(), json!(i + N_SPECIAL));
        }
        let added = |id: TokenId, t: &str| json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
        let tokenizer = json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [added(PAD, pad), added(BOS, bos), added(EOS, eos)],
            "normalizer": null,
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated", "invert": false},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [BOS], "tokens": [bos]}}
            },
            "decoder": {"type": "Fuse"},
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
        });
        let config = json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos,
            "eos_token": eos,
            "pad_token": pad,
            "add_bos_token": true,
            "model_max_length": 1_000_000
        });
        (tokenizer, config)
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
