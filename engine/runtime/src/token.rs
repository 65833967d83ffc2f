//! Token ids, and the special ids of the built-in character tokenizer (`tokenize::CharTokenizer`):
//! what engines sample, TITO sessions record and trainers score.

pub type TokenId = u32;

pub const PAD: TokenId = 0;
pub const BOS: TokenId = 1;
pub const EOS: TokenId = 2;
