//! Text to token ids and back, for either tokenizer a run may use: the character tokenizer of
//! the built-in tasks (`chars`) or a Hugging Face tokenizer loaded from a model directory (`hf`),
//! with its special tokens and chat template (`chat`); a prompt is text or chat messages
//! (`prompt`). The executors hold a [`Tokenizer`] and call the same methods for both.

pub mod chars;
pub mod chat;
pub mod hf;
pub mod prompt;
pub(crate) mod pyjson;

pub use chars::CharTokenizer;
pub use chat::{ChatTemplate, RenderOptions};
pub use hf::HfTokenizer;
pub use prompt::{Messages, Prompt};

use crate::token::TokenId;
use crate::RunError;

/// The ids a run treats specially. `stop` holds every id that ends a response: the eos token,
/// the end-of-turn token of a chat model, and `generation_config.json`'s `eos_token_id`(s).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpecialTokens {
    pub bos: Option<TokenId>,
    pub eos: Option<TokenId>,
    pub pad: Option<TokenId>,
    /// `<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`, ... when the vocabulary has one.
    pub end_of_turn: Option<TokenId>,
    pub stop: Vec<TokenId>,
}

/// A run's tokenizer: the built-in character tokenizer or a Hugging Face one.
pub enum Tokenizer {
    Char(CharTokenizer),
    Hf(Box<HfTokenizer>),
}

impl Tokenizer {
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Char(t) => t.vocab_size(),
            Tokenizer::Hf(t) => t.vocab_size(),
        }
    }

    pub fn special(&self) -> SpecialTokens {
        match self {
            Tokenizer::Char(_) => {
                use crate::token::{BOS, EOS, PAD};
                SpecialTokens { bos: Some(BOS), eos: Some(EOS), pad: Some(PAD), end_of_turn: None, stop: vec![EOS] }
            }
            Tokenizer::Hf(t) => t.special().clone(),
        }
    }

    /// The ids the policy is conditioned on. A string prompt is encoded with the tokenizer's
    /// special tokens (BOS); a chat prompt is rendered by the chat template (with
    /// `add_generation_prompt`) and encoded without adding any, as `apply_chat_template` does.
    pub fn encode_prompt(&self, prompt: &Prompt) -> Result<Vec<TokenId>, RunError> {
        match (self, prompt) {
            (Tokenizer::Char(t), Prompt::Text(s)) => t.encode_prompt(s),
            (Tokenizer::Char(_), Prompt::Chat(_)) => Err(RunError::new(
                crate::E_DATA_LINE,
                "a chat prompt needs a tokenizer with a chat template: give the model a Hugging Face tokenizer",
            )),
            (Tokenizer::Hf(t), Prompt::Text(s)) => t.encode(s, true),
            (Tokenizer::Hf(t), Prompt::Chat(m)) => {
                let text =
                    t.render_chat(&m.json, &RenderOptions { add_generation_prompt: true, ..Default::default() })?;
                t.encode(&text, false)
            }
        }
    }

    /// A gold response (SFT target): its ids, then the first stop id.
    pub fn encode_answer(&self, answer: &str) -> Result<Vec<TokenId>, RunError> {
        match self {
            Tokenizer::Char(t) => t.encode_answer(answer),
            Tokenizer::Hf(t) => {
                let mut ids = t.encode(answer, false)?;
                ids.extend(t.special().stop.first());
                Ok(ids)
            }
        }
    }

    /// The text of a response: up to the first stop id, special tokens skipped.
    pub fn decode(&self, ids: &[TokenId]) -> String {
        match self {
            Tokenizer::Char(t) => t.decode(ids),
            Tokenizer::Hf(t) => {
                let end = ids.iter().position(|id| t.special().stop.contains(id)).unwrap_or(ids.len());
                t.decode(&ids[..end], true)
            }
        }
    }
}

impl Tokenizer {
    /// Writes the tokenizer beside a saved model: the character tokenizer as tokenizer.json, a
    /// Hugging Face one as its model directory's tokenizer files (files already there are kept).
    pub fn save(&self, dir: &std::path::Path) -> Result<(), RunError> {
        match self {
            Tokenizer::Char(t) => {
                let (tokenizer, config) = t.hf_files();
                crate::atomic_write::write_json(&dir.join("tokenizer.json"), &tokenizer)?;
                crate::atomic_write::write_json(&dir.join("tokenizer_config.json"), &config)
            }
            Tokenizer::Hf(t) => t.copy_files(dir),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A char tokenizer saved as Hugging Face files loads back through `tokenizers` with the same
    /// ids for prompts and answers, the same text back, and the same refusal of an unknown char.
    #[test]
    fn a_saved_char_tokenizer_is_a_hugging_face_one_with_the_same_ids() {
        let char_tok = Tokenizer::Char(CharTokenizer::new("abcdefghij>".chars()));
        let dir = std::env::temp_dir().join(format!("miles-char-hf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        char_tok.save(&dir).unwrap();
        let hf = Tokenizer::Hf(Box::new(crate::tokenize::HfTokenizer::load(&dir).unwrap()));
        assert_eq!(hf.vocab_size(), char_tok.vocab_size());
        assert_eq!(hf.special().bos, char_tok.special().bos);
        assert_eq!(hf.special().stop, char_tok.special().stop);
        for s in ["abc>", "j", "hgfedcba>", ">>a"] {
            let p = Prompt::Text(s.into());
            assert_eq!(hf.encode_prompt(&p).unwrap(), char_tok.encode_prompt(&p).unwrap(), "{s}");
            let a = char_tok.encode_answer(s).unwrap();
            assert_eq!(hf.encode_answer(s).unwrap(), a, "{s}");
            assert_eq!(hf.decode(&a), s);
        }
        assert!(hf.encode_answer("abz").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_char_tokenizer_behind_the_common_api() {
        let t = Tokenizer::Char(CharTokenizer::new("12+=".chars()));
        let p = t.encode_prompt(&Prompt::Text("1+2=".into())).unwrap();
        assert_eq!(p[0], crate::token::BOS);
        assert_eq!(t.decode(&t.encode_answer("21").unwrap()), "21");
        assert_eq!(t.special().stop, vec![crate::token::EOS]);
        let chat = Prompt::Chat(Messages { json: "[]".into(), list: vec![] });
        assert!(t.encode_prompt(&chat).unwrap_err().message.starts_with("a chat prompt needs"));
    }
}
