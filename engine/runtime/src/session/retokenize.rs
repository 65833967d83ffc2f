//! `tito/retokenize_mismatch`: how many tokens a naive path that re-renders the conversation as
//! text and re-tokenises it would get wrong, on the same episode. The naive ids of the last turn
//! (`ChatCodec::naive_ids`) are compared with TITO's (that turn's exact prompt and output); the
//! count is the tokens outside their longest common subsequence (the larger side), i.e. the ids the
//! trainer would score that were never generated, or miss that were.
//!
//! Where it is non-zero: a policy may sample a non-canonical tokenisation of its text (`calc` as
//! `ca` + `lc`: the same text, other ids); decoding then re-encoding gives the canonical ids. A
//! tokenizer without turn delimiters lets BPE merge across a turn boundary. A template that
//! rewrites history (Qwen3 drops earlier turns' reasoning; a harness re-serialises parsed tool
//! calls) changes earlier turns' text itself.

use crate::token::TokenId;

/// Above this many DP cells the count is the larger differing span (an upper bound).
const MAX_CELLS: usize = 1 << 24;

pub fn mismatch(tito: &[TokenId], naive: &[TokenId]) -> usize {
    let p = tito.iter().zip(naive).take_while(|(a, b)| a == b).count();
    let (a, b) = (&tito[p..], &naive[p..]);
    let s = a.iter().rev().zip(b.iter().rev()).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[..a.len() - s], &b[..b.len() - s]);
    let longest = a.len().max(b.len());
    if a.is_empty() || b.is_empty() || a.len() * b.len() > MAX_CELLS {
        return longest;
    }
    let mut prev = vec![0usize; b.len() + 1];
    let mut row = vec![0usize; b.len() + 1];
    for x in a {
        for (j, y) in b.iter().enumerate() {
            row[j + 1] = if x == y { prev[j] + 1 } else { row[j].max(prev[j + 1]) };
        }
        std::mem::swap(&mut prev, &mut row);
    }
    longest - prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{message_key, ChatCodec, Role, Rule, Session};
    use crate::tokenize::CharTokenizer;
    use crate::tokenize::{HfTokenizer, Tokenizer};
    use crate::FinishReason;
    use std::path::PathBuf;

    #[test]
    fn counts() {
        assert_eq!(mismatch(&[1, 2, 3], &[1, 2, 3]), 0);
        assert_eq!(mismatch(&[1, 2, 3, 9], &[1, 5, 9]), 2);
        assert_eq!(mismatch(&[1, 7, 8, 4], &[1, 6, 4]), 2);
        assert_eq!(mismatch(&[1, 2], &[1, 2, 3]), 1);
    }

    /// Plays a two-turn tool episode through a TITO session: the first turn's sampled ids are
    /// `turn1`, the tool answers `2183`, the second turn samples `2183`. Returns (TITO ids of the
    /// last turn, naive ids of the same turn).
    fn episode(codec: &ChatCodec, turn1: Vec<TokenId>, stop: TokenId) -> (Vec<TokenId>, Vec<TokenId>) {
        let first = "What is 37*59?";
        let mut s = Session::new(Rule::Linear);
        let path = vec![message_key("user", first.as_bytes())];
        let at = s.attach(&path).unwrap();
        let prompt = s.context(at, &codec.first_prompt(first).unwrap());
        let n = turn1.len();
        let c0 = s.record(at, &path, prompt, turn1.clone(), vec![0.0; n], vec![0; n], FinishReason::Stop);
        let mut path = s.checkpoints[c0].path.clone();
        path.push(message_key("tool", b"2183"));
        let at = s.attach(&path).unwrap();
        let prompt = s.context(at, &codec.observation(Role::Tool, "2183").unwrap());
        let mut out2 = codec_encode(codec, "2183");
        out2.push(stop);
        let m = out2.len();
        s.record(at, &path, prompt.clone(), out2.clone(), vec![0.0; m], vec![0; m], FinishReason::Stop);
        let tito: Vec<TokenId> = prompt.iter().chain(&out2).copied().collect();
        let naive = codec.naive_ids(first, &[(codec.decode(&turn1), Role::Tool, "2183".into())], &out2).unwrap();
        (tito, naive)
    }

    /// Canonical ids of `text` (no special tokens).
    fn codec_encode(codec: &ChatCodec, text: &str) -> Vec<TokenId> {
        match codec.tokenizer() {
            Tokenizer::Char(t) => t.encode(text).unwrap(),
            Tokenizer::Hf(h) => h.encode(text, false).unwrap(),
        }
    }

    fn qwen() -> Tokenizer {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf/qwen2");
        Tokenizer::Hf(Box::new(HfTokenizer::load(&dir).unwrap()))
    }

    #[test]
    fn a_canonical_episode_retokenises_exactly() {
        // The naive path is faithful when the policy sampled canonical ids: 0 mismatches, so a
        // non-zero count below is the re-tokenisation and nothing else.
        let tok = qwen();
        let codec = ChatCodec::new(&tok, None).unwrap();
        let Tokenizer::Hf(h) = &tok else { unreachable!() };
        let im_end = h.special().end_of_turn.unwrap();
        let (pre, post) = codec.delimiters(Role::Tool);
        assert_eq!(
            (pre, post),
            ("\n<|im_start|>user\n<tool_response>\n", "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
        );
        let mut turn1 = h.encode("<tool>calc 37*59</tool>", false).unwrap();
        turn1.push(im_end);
        let (tito, naive) = episode(&codec, turn1, im_end);
        assert_eq!(mismatch(&tito, &naive), 0, "{tito:?}\n{naive:?}");
    }

    #[test]
    fn a_non_canonical_sample_is_lost_by_re_tokenising() {
        let tok = qwen();
        let codec = ChatCodec::new(&tok, None).unwrap();
        let Tokenizer::Hf(h) = &tok else { unreachable!() };
        let im_end = h.special().end_of_turn.unwrap();
        // The policy wrote `calc` as `ca` + `lc`: the same text, ids the tokenizer never produces.
        let canonical = h.encode("<tool>calc", false).unwrap();
        let mut sampled = h.encode("<tool>ca", false).unwrap();
        sampled.extend(h.encode("lc", false).unwrap());
        assert_ne!(canonical, sampled);
        assert_eq!(h.decode(&canonical, false), h.decode(&sampled, false));
        let mut turn1 = sampled.clone();
        turn1.extend(h.encode(" 37*59</tool>", false).unwrap());
        turn1.push(im_end);
        let (tito, naive) = episode(&codec, turn1, im_end);
        let n = mismatch(&tito, &naive);
        assert_eq!(n, mismatch(&sampled, &canonical));
        assert!(n > 0);
    }

    #[test]
    fn the_char_tokenizer_is_canonical() {
        let tok = Tokenizer::Char(CharTokenizer::new("0123456789*?<>/ abcdeilmnorstuWh".chars()));
        let codec = ChatCodec::new(&tok, None).unwrap();
        assert_eq!(codec.delimiters(Role::User), ("", ""));
        let Tokenizer::Char(t) = &tok else { unreachable!() };
        let mut turn1 = t.encode("<tool>calc 37*59</tool>").unwrap();
        turn1.push(crate::token::EOS);
        let (tito, naive) = episode(&codec, turn1, crate::token::EOS);
        assert_eq!(mismatch(&tito, &naive), 0);
    }
}
