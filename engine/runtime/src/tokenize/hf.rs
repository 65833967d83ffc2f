//! A Hugging Face tokenizer from a model directory: `tokenizer.json` (the `tokenizers` crate),
//! special tokens from `tokenizer_config.json` (strings or `{"content": ...}` objects) and
//! `generation_config.json` (`eos_token_id`, a number or a list), and the chat template
//! (`chat_template.jinja`, or `chat_template` in tokenizer_config.json).

use super::chat::{ChatTemplate, RenderOptions};
use super::SpecialTokens;
use crate::token::TokenId;
use crate::{RunError, E_DATA_FILE};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// End-of-turn tokens of common chat models, looked up in the vocabulary.
const END_OF_TURN: [&str; 5] = ["<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|eot|>"];

/// Files of a model directory that are not weights nor config.json: the tokenizer's, the chat
/// template's and the generation settings. An export carries them through (engine/tch's
/// `export_hf`), and a saved model gets them copied (`copy_files`).
pub const CARRIED_FILES: [&str; 10] = [
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
];

pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
    /// `bos_token`, `eos_token`, ... as text: what a chat template sees.
    special_text: BTreeMap<String, String>,
    chat: Option<ChatTemplate>,
    dir: PathBuf,
    /// Ids of the added vocabulary (`added_tokens` of tokenizer.json), and those marked special
    /// (turn delimiters, eos, ...): what text from outside may not produce (`encode_untrusted`).
    added_ids: std::collections::HashSet<TokenId>,
    special_ids: std::collections::HashSet<TokenId>,
}

fn read_json(path: &Path) -> Result<Option<Value>, RunError> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| RunError::new(E_DATA_FILE, format!("{}: not valid JSON: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RunError::io(E_DATA_FILE, "cannot read", path, e)),
    }
}

/// A special token's text: a string, or an AddedToken object's `content`.
fn token_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

impl HfTokenizer {
    /// Loads the tokenizer of the model in `dir`.
    pub fn load(dir: &Path) -> Result<HfTokenizer, RunError> {
        let tj = dir.join("tokenizer.json");
        if !tj.exists() {
            return Err(RunError::new(E_DATA_FILE, format!("{}: no tokenizer.json in the model directory", dir.display()))
                .with_help("miles reads fast (tokenizer.json) tokenizers; save one with `AutoTokenizer.from_pretrained(...).save_pretrained(dir)`"));
        }
        let inner = tokenizers::Tokenizer::from_file(&tj)
            .map_err(|e| RunError::new(E_DATA_FILE, format!("{}: cannot load the tokenizer: {e}", tj.display())))?;
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json(&config_path)?.unwrap_or(Value::Null);
        let generation = read_json(&dir.join("generation_config.json"))?.unwrap_or(Value::Null);

        let mut special_text = BTreeMap::new();
        for key in ["bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"] {
            if let Some(t) = config.get(key).and_then(token_text) {
                special_text.insert(key.to_string(), t);
            }
        }
        let id_of = |key: &str| -> Result<Option<TokenId>, RunError> {
            match special_text.get(key) {
                None => Ok(None),
                Some(t) => inner.token_to_id(t).map(Some).ok_or_else(|| {
                    RunError::new(
                        E_DATA_FILE,
                        format!("{}: `{key}` {t:?} is not in the vocabulary of tokenizer.json", config_path.display()),
                    )
                }),
            }
        };
        let bos = id_of("bos_token")?;
        let eos = id_of("eos_token")?;
        let pad = id_of("pad_token")?;
        let end_of_turn = END_OF_TURN.iter().find_map(|t| inner.token_to_id(t));
        let mut stop: Vec<TokenId> = eos.into_iter().collect();
        match generation.get("eos_token_id") {
            Some(Value::Number(n)) => stop.extend(n.as_u64().map(|x| x as TokenId)),
            Some(Value::Array(ids)) => stop.extend(ids.iter().filter_map(Value::as_u64).map(|x| x as TokenId)),
            _ => {}
        }
        stop.extend(end_of_turn);
        let mut seen = std::collections::HashSet::new();
        stop.retain(|id| seen.insert(*id));

        let chat = ChatTemplate::from_model_dir(dir, &config)?;
        let added = inner.get_added_tokens_decoder();
        let added_ids = added.keys().copied().collect();
        let special_ids = added.iter().filter(|(_, t)| t.special).map(|(id, _)| *id).collect();
        Ok(HfTokenizer {
            inner,
            special: SpecialTokens { bos, eos, pad, end_of_turn, stop },
            special_text,
            chat,
            dir: dir.to_path_buf(),
            added_ids,
            special_ids,
        })
    }

    /// Copies the tokenizer's files from its model directory into `dir` (an exported model),
    /// keeping any `dir` already has.
    pub fn copy_files(&self, dir: &Path) -> Result<(), RunError> {
        for name in CARRIED_FILES {
            let (from, to) = (self.dir.join(name), dir.join(name));
            if from.is_file() && !to.exists() {
                std::fs::copy(&from, &to).map_err(|e| RunError::io(crate::E_OUT_DIR, "cannot copy", &from, e))?;
            }
        }
        Ok(())
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.as_ref()
    }

    /// `add_special_tokens` as in `tokenizer(text, add_special_tokens=...)`.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<TokenId>, RunError> {
        self.inner.encode(text, add_special_tokens).map(|e| e.get_ids().to_vec()).map_err(|e| {
            RunError::new(crate::E_DATA_LINE, format!("cannot tokenize {:?}: {e}", crate::quote::truncate(text, 60)))
        })
    }

    /// The ids of `before + text + after` where `text` comes from outside (an environment's
    /// observation, a tool's result) and the rest from the chat template: no id of an added
    /// token (`<|im_end|>`, `<tool_call>`, the eos, ...) comes from `text`, so an observation
    /// that spells a turn delimiter reads as those characters and never ends a turn. The ids
    /// are `encode`'s when no added token falls in `text`'s bytes (ordinary text keeps its joint
    /// tokenisation); otherwise `before` and `after` are encoded with their added tokens around
    /// `text` encoded plain (`encode_plain`).
    pub fn encode_untrusted(
        &self,
        before: &str,
        text: &str,
        after: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<TokenId>, RunError> {
        let full = format!("{before}{text}{after}");
        let (from, to) = (before.len(), before.len() + text.len());
        let joint = self.inner.encode(full.as_str(), add_special_tokens).map_err(|e| self.fail(&full, &e))?;
        let forged = joint
            .get_ids()
            .iter()
            .zip(joint.get_offsets())
            .any(|(id, &(s, e))| self.added_ids.contains(id) && s < to && e > from);
        if !forged {
            return Ok(joint.get_ids().to_vec());
        }
        let mut ids = self.encode(before, add_special_tokens)?;
        ids.extend(self.encode_plain(text)?);
        ids.extend(self.encode(after, false)?);
        Ok(ids)
    }

    /// `encode_untrusted` over a sequence of pieces, each `(text, untrusted)`: the joint ids when
    /// no added token's id falls in an untrusted piece (ordinary text keeps its joint
    /// tokenisation); otherwise each trusted piece encoded with its added tokens and each
    /// untrusted one plain. A chat rendering is many such pieces: the template's text around
    /// every message's.
    pub fn encode_pieces(&self, pieces: &[(&str, bool)], add_special_tokens: bool) -> Result<Vec<TokenId>, RunError> {
        let full: String = pieces.iter().map(|p| p.0).collect();
        let joint = self.inner.encode(full.as_str(), add_special_tokens).map_err(|e| self.fail(&full, &e))?;
        let mut spans = Vec::new();
        let mut at = 0;
        for (text, untrusted) in pieces {
            if *untrusted {
                spans.push((at, at + text.len()));
            }
            at += text.len();
        }
        let forged = joint
            .get_ids()
            .iter()
            .zip(joint.get_offsets())
            .any(|(id, &(s, e))| self.added_ids.contains(id) && spans.iter().any(|&(from, to)| s < to && e > from));
        if !forged {
            return Ok(joint.get_ids().to_vec());
        }
        let mut ids = Vec::new();
        for (i, (text, untrusted)) in pieces.iter().enumerate().filter(|(_, p)| !p.0.is_empty()) {
            match untrusted {
                true => ids.extend(self.encode_plain(text)?),
                false => ids.extend(self.encode(text, add_special_tokens && i == 0)?),
            }
        }
        Ok(ids)
    }

    /// `text` as plain text: the added vocabulary's matching skipped, the normaliser,
    /// pre-tokenizer and model run as in `encode`. A special token's id that the model's own
    /// vocabulary yields for the text is refused (no such id may come from outside text).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<TokenId>, RunError> {
        use tokenizers::{Model, Normalizer, OffsetType, PreTokenizedString, PreTokenizer};
        let mut pre = PreTokenizedString::from(text);
        if let Some(n) = self.inner.get_normalizer() {
            pre.normalize(|s| n.normalize(s)).map_err(|e| self.fail(text, &e))?;
        }
        if let Some(p) = self.inner.get_pre_tokenizer() {
            p.pre_tokenize(&mut pre).map_err(|e| self.fail(text, &e))?;
        }
        let model = self.inner.get_model();
        pre.tokenize(|s| model.tokenize(s.get())).map_err(|e| self.fail(text, &e))?;
        let ids = pre.into_encoding(None, 0, OffsetType::Byte).map_err(|e| self.fail(text, &e))?.get_ids().to_vec();
        if let Some(id) = ids.iter().find(|id| self.special_ids.contains(id)) {
            return Err(self.fail(text, &format!("the model's vocabulary encodes it to special token {id}")));
        }
        Ok(ids)
    }

    fn fail(&self, text: &str, e: &dyn std::fmt::Display) -> RunError {
        RunError::new(crate::E_DATA_LINE, format!("cannot tokenize {:?}: {e}", crate::quote::truncate(text, 60)))
    }

    /// Text of `ids`; with `skip_special_tokens`, special tokens are left out. Ids outside the
    /// vocabulary (a model whose embedding is padded past it) are dropped.
    pub fn decode(&self, ids: &[TokenId], skip_special_tokens: bool) -> String {
        let n = self.vocab_size() as TokenId;
        let known: Vec<TokenId> = ids.iter().copied().filter(|&id| id < n).collect();
        self.inner.decode(&known, skip_special_tokens).unwrap_or_else(|_| "\u{FFFD}".to_string())
    }

    /// `apply_chat_template(messages, tokenize=False, ...)`: `messages_json` is a JSON list of
    /// messages (their key order is kept).
    pub fn render_chat(&self, messages_json: &str, options: &RenderOptions) -> Result<String, RunError> {
        let t = self.chat.as_ref().ok_or_else(|| {
            RunError::new(
                E_DATA_FILE,
                format!("{}: the tokenizer has no chat template (no chat_template.jinja, no `chat_template` in tokenizer_config.json)", self.dir.display()),
            )
            .with_help("give string prompts, or a model whose tokenizer has a chat template")
        })?;
        t.render(messages_json, options, &self.special_text)
    }
}

#[cfg(test)]
mod tests {
    //! Against the references `scripts/make-hf-fixtures.py` computed with Hugging Face's own
    //! `tokenizers` and `transformers` (tests/fixtures/hf/<arch>/reference/).
    use super::*;
    use serde_json::value::RawValue;

    const ARCHS: [&str; 3] = ["llama", "qwen2", "qwen3"];

    fn dir(arch: &str) -> PathBuf {
        PathBuf::from(format!("{}/../../tests/fixtures/hf/{arch}", env!("CARGO_MANIFEST_DIR")))
    }

    fn reference(arch: &str, file: &str) -> String {
        std::fs::read_to_string(dir(arch).join("reference").join(file)).unwrap()
    }

    #[test]
    fn encodings_and_decodings_equal_the_reference() {
        let mut wrong = Vec::new();
        let mut n = 0;
        for arch in ARCHS {
            let t = HfTokenizer::load(&dir(arch)).unwrap();
            let cases: Vec<Value> = serde_json::from_str(&reference(arch, "tokenizer.json")).unwrap();
            for c in cases {
                let text = c["text"].as_str().unwrap();
                let ids = |k: &str| -> Vec<TokenId> { serde_json::from_value(c[k].clone()).unwrap() };
                let with = t.encode(text, true).unwrap();
                let without = t.encode(text, false).unwrap();
                let checks = [
                    ("ids", format!("{with:?}"), format!("{:?}", ids("ids"))),
                    ("ids_no_special", format!("{without:?}"), format!("{:?}", ids("ids_no_special"))),
                    ("decoded", t.decode(&with, false), c["decoded"].as_str().unwrap().to_string()),
                    (
                        "decoded_skip_special",
                        t.decode(&with, true),
                        c["decoded_skip_special"].as_str().unwrap().to_string(),
                    ),
                ];
                for (what, got, want) in checks {
                    n += 1;
                    if got != want {
                        wrong.push(format!("{arch} {text:?} {what}: got {got:?}, want {want:?}"));
                    }
                }
            }
        }
        assert!(wrong.is_empty(), "{} of {n} differ:\n{}", wrong.len(), wrong.join("\n"));
        assert_eq!(n, 3 * 16 * 4);
    }

    #[test]
    fn chat_renderings_equal_apply_chat_template() {
        let mut wrong = Vec::new();
        let mut n = 0;
        for arch in ARCHS {
            let t = HfTokenizer::load(&dir(arch)).unwrap();
            // Raw values keep the key order of messages and tools, as Python's dicts do.
            let cases: Vec<BTreeMap<String, Box<RawValue>>> =
                serde_json::from_str(&reference(arch, "chat.json")).unwrap();
            for c in cases {
                let name = c["name"].get();
                let options = RenderOptions {
                    add_generation_prompt: c["add_generation_prompt"].get() == "true",
                    tools_json: c.get("tools").map(|r| r.get().to_string()),
                    ..Default::default()
                };
                let want: String = serde_json::from_str(c["text"].get()).unwrap();
                let want_ids: Vec<TokenId> = serde_json::from_str(c["ids"].get()).unwrap();
                n += 1;
                match t.render_chat(c["messages"].get(), &options) {
                    Ok(text) if text != want => {
                        wrong.push(format!("{arch} {name} text: rendered\n{text:?}\nwant\n{want:?}"))
                    }
                    Ok(text) => {
                        let ids = t.encode(&text, false).unwrap();
                        if ids != want_ids {
                            wrong.push(format!("{arch} {name} ids: {ids:?}, want {want_ids:?}"));
                        }
                    }
                    Err(e) => wrong.push(format!("{arch} {name} text: {e}")),
                }
            }
        }
        assert!(wrong.is_empty(), "{} of {n} differ:\n{}", wrong.len(), wrong.join("\n"));
        assert_eq!(n, 10 + 12 + 12);
    }

    #[test]
    fn special_tokens_and_stop_ids() {
        let llama = HfTokenizer::load(&dir("llama")).unwrap();
        let s = llama.special();
        assert_eq!(s.bos, llama.inner.token_to_id("<|begin_of_text|>"));
        assert_eq!(s.eos, llama.inner.token_to_id("<|eot_id|>"));
        assert_eq!(s.pad, llama.inner.token_to_id("<|end_of_text|>"));
        assert_eq!(s.end_of_turn, s.eos);
        // eos, then generation_config.json's list [1, 4], without repeats.
        assert_eq!(
            s.stop,
            [s.eos.into_iter().collect::<Vec<_>>(), vec![1, 4]].concat().into_iter().fold(Vec::new(), |mut v, x| {
                if !v.contains(&x) {
                    v.push(x)
                }
                v
            })
        );
        let qwen = HfTokenizer::load(&dir("qwen3")).unwrap();
        assert_eq!(qwen.special().bos, None);
        assert_eq!(qwen.special().end_of_turn, qwen.inner.token_to_id("<|im_end|>"));
        assert!(qwen.special().stop.contains(&qwen.inner.token_to_id("<|im_end|>").unwrap()));
    }

    #[test]
    fn the_common_tokenizer_renders_chat_prompts_and_stops_at_end_of_turn() {
        use crate::tokenize::Tokenizer;
        use crate::tokenize::{Messages, Prompt};
        let t = Tokenizer::Hf(Box::new(HfTokenizer::load(&dir("qwen3")).unwrap()));
        let json = r#"[{"role": "user", "content": "Say hello."}]"#;
        let list = serde_json::from_str(json).unwrap();
        let ids = t.encode_prompt(&Prompt::Chat(Messages { json: json.into(), list })).unwrap();
        let Tokenizer::Hf(hf) = &t else { unreachable!() };
        assert_eq!(hf.decode(&ids, false), "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n");
        let mut answer = t.encode_answer("hello").unwrap();
        assert_eq!(answer.last(), t.special().stop.first());
        answer.extend(hf.encode("junk", false).unwrap());
        assert_eq!(t.decode(&answer), "hello");
    }

    #[test]
    fn missing_and_broken_files_are_named() {
        let e = HfTokenizer::load(Path::new("/nonexistent/model")).err().unwrap();
        assert_eq!(e.message, "/nonexistent/model: no tokenizer.json in the model directory");
        let tmp = std::env::temp_dir().join(format!("miles-hf-broken-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::copy(dir("llama").join("tokenizer.json"), tmp.join("tokenizer.json")).unwrap();
        std::fs::write(tmp.join("tokenizer_config.json"), r#"{"eos_token": "<nope>"}"#).unwrap();
        let e = HfTokenizer::load(&tmp).err().unwrap();
        assert!(
            e.message
                .ends_with("tokenizer_config.json: `eos_token` \"<nope>\" is not in the vocabulary of tokenizer.json"),
            "{e}"
        );
        std::fs::write(tmp.join("tokenizer_config.json"), r#"{"chat_template": "{% if %}"}"#).unwrap();
        let e = HfTokenizer::load(&tmp).err().unwrap();
        assert!(e.message.contains("tokenizer_config.json: the chat template does not parse"), "{e}");
        std::fs::write(tmp.join("tokenizer_config.json"), "{}").unwrap();
        let t = HfTokenizer::load(&tmp).unwrap();
        let e = t.render_chat("[]", &RenderOptions::default()).unwrap_err();
        assert!(e.message.contains("the tokenizer has no chat template"), "{e}");
    }
}
