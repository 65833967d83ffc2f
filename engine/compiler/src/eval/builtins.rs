//! The builtin functions: one enum carries each one's name, signature and doc, so evaluation,
//! "did you mean" and the editor (completion, hover) read the same list.

use super::{Eval, R};
use crate::value::Value;
use miles_grammar::diag::ErrorCode;
use miles_grammar::diag::{Diagnostic, Span};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Builtin {
    Min,
    Max,
    Len,
    Ceil,
    Floor,
    Divisors,
    Gcd,
    ModelOf,
    Has,
    Exists,
    ParquetFiles,
    HfConfig,
    ReadJson,
    HfSnapshot,
    PeftAdapter,
    LoraFit,
}

impl Builtin {
    /// Every builtin, in the order they are listed to users.
    pub const ALL: [Builtin; 16] = [
        Builtin::Min,
        Builtin::Max,
        Builtin::Len,
        Builtin::Ceil,
        Builtin::Floor,
        Builtin::Divisors,
        Builtin::Gcd,
        Builtin::ModelOf,
        Builtin::Has,
        Builtin::Exists,
        Builtin::ParquetFiles,
        Builtin::HfConfig,
        Builtin::ReadJson,
        Builtin::HfSnapshot,
        Builtin::PeftAdapter,
        Builtin::LoraFit,
    ];

    pub fn all() -> impl Iterator<Item = Builtin> {
        Builtin::ALL.into_iter()
    }

    pub fn from_name(name: &str) -> Option<Builtin> {
        Builtin::all().find(|b| b.name() == name)
    }

    /// The names of all builtins, in `ALL` order.
    pub fn names() -> Vec<&'static str> {
        Builtin::all().map(Builtin::name).collect()
    }

    /// How it is called in source: `model_of`.
    pub const fn name(self) -> &'static str {
        match self {
            Builtin::Min => "min",
            Builtin::Max => "max",
            Builtin::Len => "len",
            Builtin::Ceil => "ceil",
            Builtin::Floor => "floor",
            Builtin::Divisors => "divisors",
            Builtin::Gcd => "gcd",
            Builtin::ModelOf => "model_of",
            Builtin::Has => "has",
            Builtin::Exists => "exists",
            Builtin::ParquetFiles => "parquet_files",
            Builtin::HfConfig => "hf_config",
            Builtin::ReadJson => "read_json",
            Builtin::HfSnapshot => "hf_snapshot",
            Builtin::PeftAdapter => "peft_adapter",
            Builtin::LoraFit => "lora_fit",
        }
    }

    /// The call with its parameters: `model_of(stage)`.
    pub const fn signature(self) -> &'static str {
        match self {
            Builtin::Min => "min(a, b, ...)",
            Builtin::Max => "max(a, b, ...)",
            Builtin::Len => "len(x)",
            Builtin::Ceil => "ceil(x)",
            Builtin::Floor => "floor(x)",
            Builtin::Divisors => "divisors(n, ...)",
            Builtin::Gcd => "gcd(n, ...)",
            Builtin::ModelOf => "model_of(stage)",
            Builtin::Has => "has(record, \"field\")",
            Builtin::Exists => "exists(path)",
            Builtin::ParquetFiles => "parquet_files(path)",
            Builtin::HfConfig => "hf_config(dir)",
            Builtin::ReadJson => "read_json(path)",
            Builtin::HfSnapshot => "hf_snapshot(repo, revision)",
            Builtin::PeftAdapter => "peft_adapter(dir)",
            Builtin::LoraFit => "lora_fit(lora, model)",
        }
    }

    /// What it returns, in one line.
    pub const fn doc(self) -> &'static str {
        match self {
            Builtin::Min => "the smallest of numbers of one unit",
            Builtin::Max => "the largest of numbers of one unit",
            Builtin::Len => "length of a list, map or string",
            Builtin::Ceil => "the smallest integer not below x",
            Builtin::Floor => "the largest integer not above x",
            Builtin::Divisors => {
                "the positive integers that divide every argument, in increasing order: the values a rule's help \
                 can propose (`divisors(32, 8)` is [1, 2, 4, 8])"
            }
            Builtin::Gcd => "the greatest integer that divides every argument (`gcd(32, 12)` is 4)",
            Builtin::ModelOf => "the model a stage runs, found upstream",
            Builtin::Has => "whether the record has the field",
            Builtin::Exists => "whether the file or directory is there (paths relative to where `miles` runs)",
            Builtin::ParquetFiles => {
                "how many .parquet files `miles run` finds where a `parquet { path }` points: 1 for a file, 0 \
                 when nothing is there; for a directory, those in it, else in its `train/`, its `data/` (or \
                 `data/train/`), or each configuration directory (or its `train/`), as the run looks for \
                 shards (names only; docs/data.md, \"Parquet\")"
            }
            Builtin::ReadJson => {
                "a JSON file's value (objects as maps, arrays as lists; paths relative to where `miles` runs): \
                 what a checkpoint's config says, for checks against the recipe"
            }
            Builtin::HfSnapshot => {
                "the directory of a Hub repository (\"ORG/NAME\") at a revision (branch, tag or commit) in the \
                 local Hugging Face cache (HF_HUB_CACHE, HF_HOME), resolved offline; an error says how to download it"
            }
            Builtin::PeftAdapter => {
                "a PEFT LoRA adapter directory's adapter_config.json and tensor layout: rank, alpha, dropout, \
                 target_modules, layers, base_model"
            }
            Builtin::LoraFit => {
                "whether the PEFT adapter a `lora { init }` starts from fits the model's sizes (layers, d_model, \
                 heads, kv_heads, head_dim, d_ff): a map of `fits` and `why` (\"\", or why not, naming the tensor)"
            }
            Builtin::HfConfig => {
                "a Hugging Face model directory's config.json as `miles check` and `miles plan` read it: \
                 architecture, whether the embedded backend loads it (`loadable`), the decoder's sizes, the \
                 experts, the attention (MLA and DSA widths), params and active params, and the keys it \
                 read and did not read (docs/models.md, \"Planning from config.json\")"
            }
        }
    }

    /// `signature: doc`, as the editor shows it.
    pub fn detail(self) -> String {
        format!("{}: {}", self.signature(), self.doc())
    }
}

impl<'p> Eval<'p> {
    /// E0207: `b` called with `given` arguments where it takes `want`.
    fn arity_err(&mut self, b: Builtin, want: &str, given: usize, span: Span) -> R<Value> {
        self.report(
            Diagnostic::error(ErrorCode::E0207, format!("`{}` takes {want}, given {given}", b.name()))
                .with_primary(span, "wrong number of arguments"),
        );
        None
    }

    pub(super) fn builtin(&mut self, b: Builtin, args: Vec<(Value, Span)>, span: Span) -> R<Value> {
        let name = b.name();
        match b {
            Builtin::Min | Builtin::Max => {
                if args.is_empty() {
                    return self.arity_err(b, "one or more arguments", args.len(), span);
                }
                self.extreme(b, &args)
            }
            Builtin::Len => {
                if args.len() != 1 {
                    return self.arity_err(b, "one argument", args.len(), span);
                }
                match &args[0].0 {
                    Value::List(l) => Some(Value::int(l.len() as i128)),
                    Value::Map(m) => Some(Value::int(m.len() as i128)),
                    Value::Str(s) => Some(Value::int(s.chars().count() as i128)),
                    other => {
                        self.report(
                            Diagnostic::error(
                                ErrorCode::E0201,
                                format!("`len` needs a list, map or string, found {}", other.type_name()),
                            )
                            .with_primary(args[0].1, "here"),
                        );
                        None
                    }
                }
            }
            Builtin::Ceil | Builtin::Floor => {
                if args.len() != 1 {
                    return self.arity_err(b, "one argument", args.len(), span);
                }
                match &args[0].0 {
                    Value::Num { q, .. } => {
                        Some(Value::Num { q: if b == Builtin::Ceil { q.ceil() } else { q.floor() }, float: false })
                    }
                    other => {
                        self.report(
                            Diagnostic::error(
                                ErrorCode::E0201,
                                format!("`{name}` needs a number, found {}", other.type_name()),
                            )
                            .with_primary(args[0].1, "here"),
                        );
                        None
                    }
                }
            }
            Builtin::Divisors | Builtin::Gcd => {
                if args.is_empty() {
                    return self.arity_err(b, "one or more positive integers", args.len(), span);
                }
                let mut ns = Vec::with_capacity(args.len());
                for (v, sp) in &args {
                    match v {
                        Value::Num { q, .. } if q.to_i128().is_some_and(|n| n > 0 && n <= MAX_DIVIDEND) => {
                            ns.extend(q.to_i128())
                        }
                        other => {
                            self.report(
                                Diagnostic::error(
                                    ErrorCode::E0201,
                                    format!("`{name}` needs positive integers up to 10^12, found {other}"),
                                )
                                .with_primary(*sp, "here"),
                            );
                            return None;
                        }
                    }
                }
                let g = ns.iter().fold(0i128, |a, &b| gcd(a, b));
                Some(if b == Builtin::Gcd {
                    Value::int(g)
                } else {
                    Value::List(divisors(g).into_iter().map(Value::int).collect())
                })
            }
            Builtin::Has => {
                if args.len() != 2 {
                    return self.arity_err(b, "two arguments (a record and a field name)", args.len(), span);
                }
                let yes = match (&args[0].0, &args[1].0) {
                    (Value::Record(r), Value::Str(f)) => r.fields.contains_key(f),
                    (Value::Map(m), Value::Str(f)) => m.contains_key(f),
                    _ => false,
                };
                Some(Value::Bool(yes))
            }
            Builtin::Exists
            | Builtin::ParquetFiles
            | Builtin::HfConfig
            | Builtin::ReadJson
            | Builtin::HfSnapshot
            | Builtin::PeftAdapter
            | Builtin::LoraFit => self.file_builtin(b, args, span),
            Builtin::ModelOf => {
                if args.len() != 1 {
                    return self.arity_err(b, "one argument", args.len(), span);
                }
                if self.inputs_loop(&args[0].0) || !self.inputs_complete(&args[0].0) {
                    // An input upstream failed to resolve, or the inputs loop (E0303): reported
                    // already.
                    return None;
                }
                self.model_of(&args[0].0).map(Value::Record).or_else(|| {
                    self.report(
                        Diagnostic::error(ErrorCode::E0201, "cannot tell which model this stage runs")
                            .with_primary(args[0].1, "no model upstream")
                            .with_help("`model_of` follows Policy and Trajectories inputs up to a `model`"),
                    );
                    None
                })
            }
        }
    }
}

/// The largest number `divisors` factors (a million trial divisions at most).
const MAX_DIVIDEND: i128 = 1_000_000_000_000;

fn gcd(a: i128, b: i128) -> i128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The divisors of `n` > 0, in increasing order (trial division up to its square root).
fn divisors(n: i128) -> Vec<i128> {
    let (mut low, mut high) = (Vec::new(), Vec::new());
    let mut d = 1;
    while d * d <= n {
        if n % d == 0 {
            low.push(d);
            if d * d != n {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

impl Eval<'_> {
    /// `min` or `max` of one or more numbers of one unit.
    fn extreme(&mut self, b: Builtin, args: &[(Value, Span)]) -> R<Value> {
        let name = b.name();
        let mut best = args[0].0.clone();
        for (v, sp) in &args[1..] {
            let ord = match (&best, v) {
                (Value::Num { q: a, .. }, Value::Num { q: b, .. }) => b.cmp(a),
                (Value::Quantity { q: a, dim: da }, Value::Quantity { q: b, dim: db }) if da == db => b.cmp(a),
                _ => {
                    self.report(
                        Diagnostic::error(ErrorCode::E0202, format!("`{name}` needs numbers of one unit"))
                            .with_primary(*sp, v.type_name()),
                    );
                    return None;
                }
            };
            if (b == Builtin::Min && ord.is_lt()) || (b == Builtin::Max && ord.is_gt()) {
                best = v.clone();
            }
        }
        Some(best)
    }

    /// The builtins that read files through the evaluator's `FileSystem`.
    fn file_builtin(&mut self, b: Builtin, args: Vec<(Value, Span)>, span: Span) -> R<Value> {
        let name = b.name();
        match b {
            Builtin::Exists | Builtin::ParquetFiles | Builtin::HfConfig | Builtin::ReadJson => {
                if args.len() != 1 {
                    return self.arity_err(b, "one argument", args.len(), span);
                }
                let (path, at) = match &args[0] {
                    (Value::Str(p), at) => (p.clone(), *at),
                    (other, at) => {
                        self.report(
                            Diagnostic::error(
                                ErrorCode::E0201,
                                format!("`{name}` needs a path, found {}", other.type_name()),
                            )
                            .with_primary(*at, "here"),
                        );
                        return None;
                    }
                };
                let Some(fs) = self.fs else {
                    self.report(
                        Diagnostic::error(ErrorCode::E0210, format!("`{name}` cannot read files here"))
                            .with_primary(span, "no file system in this evaluation"),
                    );
                    return None;
                };
                if b == Builtin::Exists {
                    return Some(Value::Bool(fs.exists(&path)));
                }
                if b == Builtin::ParquetFiles {
                    return Some(Value::int(parquet_files(fs, &path) as i128));
                }
                if b == Builtin::ReadJson {
                    return self.read_json(&path, at);
                }
                self.hf_config(&path, at)
            }
            Builtin::HfSnapshot => {
                if args.len() != 2 {
                    return self.arity_err(b, "two arguments (a repository id and a revision)", args.len(), span);
                }
                self.hf_snapshot(&args, span)
            }
            Builtin::PeftAdapter => {
                if args.len() != 1 {
                    return self.arity_err(b, "one argument", args.len(), span);
                }
                let (Value::Str(dir), at) = &args[0] else {
                    self.report(
                        Diagnostic::error(
                            ErrorCode::E0201,
                            format!("`{name}` needs a path, found {}", args[0].0.type_name()),
                        )
                        .with_primary(args[0].1, "here"),
                    );
                    return None;
                };
                let adapter = self.peft_adapter(dir, *at)?;
                Some(self.peft_value(&adapter))
            }
            // `lora_fit`, the last of the builtins `builtin` sends here.
            _ => {
                if args.len() != 2 {
                    return self.arity_err(b, "two arguments (a `lora` record and a model)", args.len(), span);
                }
                self.lora_fit(&args[0], &args[1])
            }
        }
    }
}

impl Eval<'_> {
    /// `dir/config.json` as the `hf` schema reads it (memoised per directory); a failure is one
    /// E0210 at `at`, where the directory was written.
    fn read_json(&mut self, path: &str, at: Span) -> R<Value> {
        let fs = self.fs?;
        let read = fs
            .read(path)
            .map_err(|e| format!("cannot read {path}: {e}"))
            .and_then(|b| String::from_utf8(b).map_err(|_| format!("{path} is not UTF-8 text")))
            .and_then(|t| serde_json::from_str(&t).map_err(|e| format!("{path} is not valid JSON: {e}")));
        match read {
            Ok(json) => Some(json_value(&json)),
            Err(why) => {
                self.report(Diagnostic::error(ErrorCode::E0210, why).with_primary(at, "this file"));
                None
            }
        }
    }

    fn hf_config(&mut self, dir: &str, at: Span) -> R<Value> {
        let fs = self.fs?;
        let file = crate::fs::join(dir, "config.json");
        let read = self.hf_configs.entry(dir.to_string()).or_insert_with(|| {
            let bytes = fs.read(&file).map_err(|e| format!("cannot read {file}: {e}"))?;
            let text = String::from_utf8(bytes).map_err(|_| format!("{file} is not UTF-8 text"))?;
            crate::hf::config_map(&text).map_err(|why| format!("{file}: {why}"))
        });
        match read.clone() {
            Ok(m) => Some(Value::Map(m)),
            Err(why) => {
                let missing = why.starts_with("cannot read");
                self.report(
                    Diagnostic::error(ErrorCode::E0210, why)
                        .with_primary(at, if missing { "no model directory here" } else { "this model directory" })
                        .with_help(
                            "`path` is a Hugging Face model directory (config.json, model.safetensors or its shards, \
                             tokenizer.json), relative to where `miles` runs; docs/models.md lists what is read",
                        ),
                );
                None
            }
        }
    }
}

impl Eval<'_> {
    /// `hf_snapshot(repo, revision)`: the snapshot directory in the Hub cache. With no `repo`
    /// the `hf` record has neither it nor `path`: E0106 at the record. A repository that does
    /// not resolve is E0215 at the `repo` the recipe wrote.
    fn hf_snapshot(&mut self, args: &[(Value, Span)], span: Span) -> R<Value> {
        let record = self.frames.last().map_or(span, |f| f.span);
        let (repo, at) = match &args[0] {
            (Value::Str(r), at) => (r.clone(), *at),
            (Value::None, _) => {
                self.report(
                    Diagnostic::error(ErrorCode::E0106, "`hf` needs `path` or `repo`")
                        .with_primary(record, "neither `path` nor `repo` is set")
                        .with_help(
                            "`path = \"DIR\"` names a model directory; `repo = \"ORG/NAME\"` a model in the local \
                             Hugging Face cache (docs/models.md, \"The Hub cache\")",
                        ),
                );
                return None;
            }
            (other, at) => {
                self.report(
                    Diagnostic::error(
                        ErrorCode::E0201,
                        format!("`hf_snapshot` needs a repository id, found {}", other.type_name()),
                    )
                    .with_primary(*at, "here"),
                );
                return None;
            }
        };
        let Value::Str(revision) = &args[1].0 else {
            self.report(
                Diagnostic::error(ErrorCode::E0201, format!("a revision is a string, found {}", args[1].0.type_name()))
                    .with_primary(args[1].1, "here"),
            );
            return None;
        };
        let Some(fs) = self.fs else {
            self.report(
                Diagnostic::error(ErrorCode::E0210, "`hf_snapshot` cannot read files here")
                    .with_primary(span, "no file system in this evaluation"),
            );
            return None;
        };
        let Some(root) = self.hub_cache.clone() else {
            self.report(
                Diagnostic::error(
                    ErrorCode::E0215,
                    format!("cannot look for `{repo}`: the Hugging Face cache's location is unknown"),
                )
                .with_primary(at, "this repository")
                .with_help("set HF_HUB_CACHE (or HF_HOME, or HOME) to where the cache is"),
            );
            return None;
        };
        match crate::hub::resolve(fs, &root, &repo, revision) {
            Ok(dir) => Some(Value::Str(dir)),
            Err(e) => {
                self.report(
                    Diagnostic::error(ErrorCode::E0215, e.message)
                        .with_primary(at, "this repository")
                        .with_help(e.help),
                );
                None
            }
        }
    }

    /// `dir`'s PEFT adapter, read once per directory; a failure is one E0216 at `at`.
    fn peft_adapter(&mut self, dir: &str, at: Span) -> R<crate::peft::Adapter> {
        let fs = self.fs?;
        let read = self.peft_adapters.entry(dir.to_string()).or_insert_with(|| crate::peft::read(fs, dir)).clone();
        match read {
            Ok(a) => Some(a),
            Err(why) => {
                self.report(
                    Diagnostic::error(ErrorCode::E0216, why).with_primary(at, "this adapter directory").with_help(
                        "`init` is a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors), \
                             as `PeftModel.save_pretrained` writes it (docs/lora.md)",
                    ),
                );
                None
            }
        }
    }

    /// The adapter as the language sees it; `target_modules` are `LoraTarget` members.
    fn peft_value(&self, a: &crate::peft::Adapter) -> Value {
        let target = self.prelude_decl("LoraTarget");
        let targets = a
            .target_modules
            .iter()
            .filter_map(|t| Some(Value::Enum { decl: target?, ty: "LoraTarget".into(), member: t.clone() }))
            .collect();
        let mut m = std::collections::BTreeMap::new();
        m.insert("rank".to_string(), Value::int(a.rank as i128));
        m.insert("alpha".to_string(), Value::Num { q: a.alpha, float: true });
        m.insert("dropout".to_string(), Value::Num { q: a.dropout, float: true });
        m.insert("target_modules".to_string(), Value::List(targets));
        m.insert("layers".to_string(), Value::int(a.layers as i128));
        m.insert("base_model".to_string(), a.base_model.clone().map_or(Value::None, Value::Str));
        Value::Map(m)
    }

    /// Whether the adapter `lora.init` names fits `model` (a record with the decoder's sizes):
    /// `{fits, why}`, `why` naming the tensor that does not (a map, so a failing check shows
    /// `lora_fit(...).why`). Nothing to compare (no `init`, a model without these sizes) fits.
    /// Reading the adapter reports its own E0216 at the `init` the recipe wrote.
    fn lora_fit(&mut self, lora: &(Value, Span), model: &(Value, Span)) -> R<Value> {
        let answer = |why: String| {
            let mut m = std::collections::BTreeMap::new();
            m.insert("fits".to_string(), Value::Bool(why.is_empty()));
            m.insert("why".to_string(), Value::Str(why));
            Some(Value::Map(m))
        };
        let fits = answer(String::new());
        let Value::Record(l) = &lora.0 else { return fits };
        let Some(init) = l.fields.get("init") else { return fits };
        let Value::Str(dir) = &init.value else { return fits };
        let adapter = self.peft_adapter(dir, init.span)?;
        let Value::Record(r) = &model.0 else { return fits };
        let int = |k: &str| r.fields.get(k).and_then(|f| f.value.as_i64()).map(|v| v.max(0) as u64);
        let (Some(layers), Some(d_model), Some(heads)) = (int("layers"), int("d_model"), int("heads")) else {
            return fits;
        };
        let sizes = crate::peft::ModelSizes {
            layers,
            d_model,
            heads,
            kv_heads: int("kv_heads").unwrap_or(heads),
            head_dim: int("head_dim").unwrap_or(d_model / heads.max(1)),
            d_ff: int("d_ff").unwrap_or(4 * d_model),
        };
        answer(adapter.fits(&sizes).err().unwrap_or_default())
    }
}

/// A JSON value as the language's: numbers exact (a decimal literal's rational), null as `none`.
/// The .parquet files `miles run` would find at `path`, walked as the runtime's
/// `tasks/parquet/shards.rs` walks a directory (the same places, in the same order, stopping
/// where it stops), so that `miles check` can say a directory holds none. Names only: whether a
/// datasets layout is complete, or names several configurations, stays the run's error.
fn parquet_files(fs: &dyn crate::fs::FileSystem, path: &str) -> usize {
    if !fs.is_dir(path) {
        return usize::from(fs.exists(path));
    }
    shards_in(fs, path, 0)
}

/// `shards.rs`'s `in_dir`: the files in `dir`, else the converted layout's `train/` (with its
/// `test/`), else, at the top only, `data/` or the configuration directories.
fn shards_in(fs: &dyn crate::fs::FileSystem, dir: &str, depth: usize) -> usize {
    let here = parquet_in(fs, dir);
    if here > 0 {
        return here;
    }
    let train = parquet_in(fs, &crate::fs::join(dir, "train"));
    if train > 0 {
        return train + parquet_in(fs, &crate::fs::join(dir, "test"));
    }
    if depth > 0 {
        return 0;
    }
    let data = crate::fs::join(dir, "data");
    if fs.is_dir(&data) {
        return shards_in(fs, &data, 1);
    }
    fs.list_dir(dir)
        .iter()
        .filter(|n| !n.starts_with('.'))
        .map(|n| crate::fs::join(dir, n))
        .filter(|sub| fs.is_dir(sub))
        .map(|sub| shards_in(fs, &sub, 1))
        .sum()
}

/// The `.parquet` files directly in `dir`; hidden ones (partial downloads) are not shards.
fn parquet_in(fs: &dyn crate::fs::FileSystem, dir: &str) -> usize {
    fs.list_dir(dir)
        .iter()
        .filter(|n| !n.starts_with('.') && n.ends_with(".parquet") && !fs.is_dir(&crate::fs::join(dir, n)))
        .count()
}

fn json_value(j: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match j {
        J::Null => Value::None,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => match signed_literal(&n.to_string()) {
            Some(q) => Value::Num { q, float: !(n.is_i64() || n.is_u64()) },
            None => Value::None,
        },
        J::String(s) => Value::Str(s.clone()),
        J::Array(a) => Value::List(a.iter().map(json_value).collect()),
        J::Object(o) => Value::Map(o.iter().map(|(k, v)| (k.clone(), json_value(v))).collect()),
    }
}

fn signed_literal(text: &str) -> Option<crate::num::Q> {
    match text.strip_prefix('-') {
        Some(abs) => crate::num::Q::parse_literal(abs)?.checked_neg(),
        None => crate::num::Q::parse_literal(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for b in Builtin::all() {
            assert_eq!(Builtin::from_name(b.name()), Some(b));
            assert!(b.signature().starts_with(&format!("{}(", b.name())), "{b:?}");
        }
        assert_eq!(Builtin::from_name("sum"), None);
        assert_eq!(Builtin::from_name("read_json"), Some(Builtin::ReadJson));
    }

    #[test]
    fn divisors_in_order_and_gcd() {
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(32), vec![1, 2, 4, 8, 16, 32]);
        assert_eq!(divisors(36), vec![1, 2, 3, 4, 6, 9, 12, 18, 36]);
        assert_eq!(divisors(13), vec![1, 13]);
        assert_eq!((gcd(32, 12), gcd(0, 7), gcd(8, 8)), (4, 7, 8));
    }

    /// The layouts of the runtime's `shards.rs` tests, counted by name through a `FileSystem`.
    #[test]
    fn parquet_files_finds_shards_where_the_run_looks() {
        let count = |files: &[&str]| {
            let fs = crate::fs::MemoryFs::new();
            for f in files {
                fs.insert(&format!("d/{f}"), Vec::new());
            }
            parquet_files(&fs, "d")
        };
        assert_eq!(count(&["a.parquet", "b.parquet", "README.md", ".c.parquet", "sub/x.txt"]), 2);
        assert_eq!(count(&["README.md", "data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]), 2);
        assert_eq!(count(&["main/train-00000-of-00001.parquet", "main/test-00000-of-00001.parquet"]), 2);
        assert_eq!(count(&["default/train/0000.parquet", "default/test/0000.parquet"]), 2);
        assert_eq!(count(&["data/train/0000.parquet"]), 1);
        // None: no shard anywhere, a hidden one, one too deep, or beside an empty `data/` (the
        // run looks no further than `data/` when it is there).
        assert_eq!(count(&["README.md", "notes/a.txt"]), 0);
        assert_eq!(count(&["data/.train.parquet.tmp", "data/.x.parquet"]), 0);
        assert_eq!(count(&["main/sub/deep/train.parquet"]), 0);
        assert_eq!(count(&["data/README.md", "main/train-00000-of-00001.parquet"]), 0);
        // A file is its own one shard; nothing is none.
        let fs = crate::fs::MemoryFs::with(&[("p.parquet", "")]);
        assert_eq!((parquet_files(&fs, "p.parquet"), parquet_files(&fs, "missing")), (1, 0));
    }

    #[test]
    fn json_values_are_exact() {
        let j: serde_json::Value =
            serde_json::from_str(r#"{"side": 16, "lr": -2.5e-3, "ok": true, "dims": [1, 2], "none": null}"#).unwrap();
        let Value::Map(m) = json_value(&j) else { panic!("a map") };
        assert_eq!(m["side"], Value::Num { q: crate::num::Q::int(16), float: false });
        assert_eq!(m["lr"], Value::Num { q: crate::num::Q::new(-1, 400).unwrap(), float: true });
        assert_eq!(m["ok"], Value::Bool(true));
        assert_eq!(
            m["dims"],
            Value::List(vec![
                Value::Num { q: crate::num::Q::int(1), float: false },
                Value::Num { q: crate::num::Q::int(2), float: false }
            ])
        );
        assert_eq!(m["none"], Value::None);
        assert_eq!(Builtin::ModelOf.detail(), "model_of(stage): the model a stage runs, found upstream");
    }
}
