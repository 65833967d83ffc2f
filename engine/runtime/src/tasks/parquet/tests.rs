use super::*;
use crate::spec::{HeldOut, OnError, SplitSpec, TaskKind, TaskSpec};
use crate::tasks::prompts::{self, tests::settings, Prompt};
use crate::tasks::{TaskSet, TrainSource};
use crate::E_DATA_LINE;
use serde_json::json;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(format!("{}/../../tests/fixtures/data/{name}", env!("CARGO_MANIFEST_DIR")))
}

/// A fresh directory under the temp dir, with `files` copied in as (fixture, name in it).
fn shard_dir(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let d = std::env::temp_dir().join(format!("miles-pq-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    for (from, to) in files {
        std::fs::copy(fixture(from), d.join(to)).unwrap();
    }
    d
}

/// A split of `test_size` rows by `seed`, the default rule, shipped test shards read.
fn split(test_size: usize, seed: u64) -> SplitSpec {
    SplitSpec { test_size, seed, ..Default::default() }
}

fn question(path: PathBuf) -> DataSettings {
    let mut s = settings(path, OnError::Stop);
    s.prompt_field = "question".into();
    s
}

#[test]
fn strings_chats_and_passthrough_fields() {
    let rows = prompts::read(&settings(fixture("prompts.parquet"), OnError::Stop), &mut Vec::new()).unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0].prompt, Prompt::Text("What is 6 times 7?".into()));
    assert_eq!(rows[0].label, json!("42"));
    assert_eq!(rows[0].metadata["level"], json!(1));
    assert_eq!(rows[0].metadata["tags"], json!(["arith", "easy"]));
    assert!(rows[0].origin.ends_with("prompts.parquet#1"));
    let mut s = settings(fixture("chat.parquet"), OnError::Stop);
    s.prompt_field = "messages".into();
    let rows = prompts::read(&s, &mut Vec::new()).unwrap();
    let Prompt::Chat(m) = &rows[0].prompt else { panic!("{:?}", rows[0].prompt) };
    assert_eq!(m.list[0]["role"], "system");
    assert_eq!(m.list[1]["content"], "What is 6 times 7?");
    // Schema order, as written: role before content.
    assert!(m.json.starts_with(r#"[{"role": "system", "content": "#), "{}", m.json);
    assert_eq!(rows[0].label, json!("42"));
}

#[test]
fn a_missing_column_lists_the_columns_present() {
    let mut s = settings(fixture("prompts.parquet"), OnError::Stop);
    s.prompt_field = "question".into();
    let e = prompts::read(&s, &mut Vec::new()).unwrap_err();
    assert_eq!(e.code, E_DATA_FILE);
    assert!(
        e.message.ends_with(
            "prompts.parquet: no column `question` (the prompt field); its columns are: prompt, answer, level, tags"
        ),
        "{e}"
    );
}

#[test]
fn empty_bad_rows_and_non_parquet_files() {
    let e = prompts::read(&settings(fixture("empty.parquet"), OnError::Stop), &mut Vec::new()).unwrap_err();
    assert!(e.message.ends_with("empty.parquet: holds no prompts"), "{e}");
    let mut s = settings(fixture("prompts.parquet"), OnError::Stop);
    s.prompt_field = "level".into();
    let e = prompts::read(&s, &mut Vec::new()).unwrap_err();
    assert_eq!(e.code, E_DATA_LINE);
    assert!(
        e.message.ends_with("prompts.parquet#1: field `level` must be a string or a list of chat messages, found 1"),
        "{e}"
    );
    let e = prompts::read(
        &settings(fixture("../rewards/verify.py").with_extension("parquet"), OnError::Stop),
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(e.message.contains("prompt file not found"), "{e}");
    let not = std::env::temp_dir().join(format!("miles-notparquet-{}.parquet", std::process::id()));
    std::fs::write(&not, "hello").unwrap();
    let e = prompts::read(&settings(not, OnError::Stop), &mut Vec::new()).unwrap_err();
    assert!(e.message.contains("cannot read it as Parquet"), "{e}");
}

/// The same table written by pyarrow in each codec reads to the same rows.
#[test]
fn every_codec_pyarrow_writes_reads_the_same_rows() {
    let strip = |rows: Vec<PromptRow>| -> Vec<PromptRow> {
        rows.into_iter().map(|r| PromptRow { origin: r.origin.rsplit('#').next().unwrap().into(), ..r }).collect()
    };
    let want = strip(prompts::read(&settings(fixture("prompts.parquet"), OnError::Stop), &mut Vec::new()).unwrap());
    for codec in ["zstd", "gzip", "lz4", "brotli"] {
        let path = fixture(&format!("codecs/{codec}.parquet"));
        let file = std::fs::File::open(&path).unwrap();
        let meta = SerializedFileReader::new(file).unwrap().metadata().row_group(0).column(0).compression();
        assert_eq!(codec_name(meta), Some(codec), "the fixture is written in {codec}");
        let rows = prompts::read(&settings(path, OnError::Stop), &mut Vec::new()).unwrap();
        assert_eq!(strip(rows), want, "{codec}");
    }
}

/// A codec no build reads (LZO: no pyarrow writes one; the fixture's footer says LZO) is named
/// with the file and the column, before any row is read.
#[test]
fn a_codec_miles_does_not_read_is_named() {
    let path = fixture("codecs/lzo.parquet");
    let e = prompts::read(&settings(path.clone(), OnError::Stop), &mut Vec::new()).unwrap_err();
    assert_eq!(e.code, E_DATA_FILE);
    assert_eq!(
        e.message,
        format!(
            "{}: column `prompt` is compressed with LZO, which miles does not read (it reads snappy, zstd, gzip, lz4, brotli or none)",
            path.display()
        )
    );
    assert!(e.help.unwrap().contains("compression=\"zstd\""));
}

/// 50 rows in 7 row groups of 8 (the last of 2): read group by group, in order, numbered
/// through the file.
#[test]
fn many_row_groups_read_in_order() {
    let path = fixture("row-groups.parquet");
    let reader = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let groups: Vec<i64> = reader.metadata().row_groups().iter().map(|g| g.num_rows()).collect();
    assert_eq!(groups, vec![8, 8, 8, 8, 8, 8, 2]);
    let rows = prompts::read(&settings(path.clone(), OnError::Stop), &mut Vec::new()).unwrap();
    assert_eq!(rows.len(), 50);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.prompt, Prompt::Text(format!("{i}+{i}=")));
        assert_eq!(r.label, json!((2 * i).to_string()));
        assert_eq!(r.metadata["row"], json!(i));
        assert_eq!(r.origin, format!("{}#{}", path.display(), i + 1));
    }
    // A malformed row past the first group keeps its number in the file.
    let mut s = settings(path.clone(), OnError::Skip);
    s.prompt_field = "row".into();
    let mut w = Vec::new();
    assert!(prompts::read(&s, &mut w).is_err(), "every row is skipped: no prompts");
    assert_eq!(w.len(), 50);
    assert_eq!(
        w[41],
        format!("skipped {}#42: field `row` must be a string or a list of chat messages, found 41", path.display())
    );
}

/// The fixture repository (3 zstd train shards of 8 rows, a test shard of 6): the train shards
/// in name order, rows numbered per shard; the test shards are the held-out rows.
#[test]
fn a_datasets_repository_reads_its_train_shards_and_ships_its_test_split() {
    let dir = fixture("hf-dataset");
    let s = question(dir.clone());
    let mut w = Vec::new();
    let rows = prompts::read(&s, &mut w).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(rows.len(), 24);
    let ids: Vec<String> = rows.iter().map(|r| r.metadata["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, (0..24).map(|i| format!("train-{i}")).collect::<Vec<_>>());
    assert_eq!(rows[9].origin, format!("{}#2", dir.join("data/train-00001-of-00003.parquet").display()));
    assert_eq!((rows[9].prompt.clone(), rows[9].label.clone()), (Prompt::Text("0+9=".into()), json!("9")));
    let test = prompts::read_shipped_test(&s, &split(200, 1234), &mut w).unwrap().expect("the test shards");
    assert_eq!(test.len(), 6);
    assert_eq!(test[0].origin, format!("{}#1", dir.join("data/test-00000-of-00001.parquet").display()));
    assert_eq!(test[0].prompt, Prompt::Text("9+0=".into()));
    // At most test_size of them, drawn by the seed, kept in file order.
    let four = prompts::read_shipped_test(&s, &split(4, 1234), &mut w).unwrap().unwrap();
    assert_eq!(four.len(), 4);
    assert!(four.windows(2).all(|p| p[0].metadata["id"].as_str() < p[1].metadata["id"].as_str()), "{four:?}");
    assert_eq!(four, prompts::read_shipped_test(&s, &split(4, 1234), &mut w).unwrap().unwrap());
    // A file, or a directory of plain shards, ships none.
    assert_eq!(
        prompts::read_shipped_test(&question(dir.join("data/test-00000-of-00001.parquet")), &split(4, 1), &mut w)
            .unwrap(),
        None
    );
    let plain = shard_dir(
        "plain",
        &[
            ("hf-dataset/data/train-00000-of-00003.parquet", "a.parquet"),
            ("hf-dataset/data/test-00000-of-00001.parquet", "b.parquet"),
        ],
    );
    assert_eq!(prompts::read(&question(plain.clone()), &mut w).unwrap().len(), 14);
    assert_eq!(prompts::read_shipped_test(&question(plain), &split(4, 1), &mut w).unwrap(), None);
}

/// A run's task over the repository: the test shards are the held-out split, the train shards
/// the rest, whole.
#[test]
fn a_run_over_the_repository_holds_out_its_test_shards() {
    let kind = TaskKind::Data {
        path: fixture("hf-dataset"),
        prompt_field: "question".into(),
        label_field: "answer".into(),
        test_path: None,
        on_error: OnError::Stop,
    };
    let spec =
        TaskSpec { kind, split: SplitSpec { test_size: 200, seed: 7, ..Default::default() }, partial_credit: false };
    let t = TaskSet::build(&spec).unwrap();
    let TrainSource::List(train) = &t.train else { panic!("a file's rows") };
    assert_eq!((train.len(), t.test.len()), (24, 6));
    assert!(t.test.iter().all(|r| r.metadata["id"].as_str().unwrap().starts_with("test-")));
}

/// `held_out = drawn`: the test shards are not read; the held-out rows are drawn from the train
/// shards' 24 rows as for one file, and the rest train.
#[test]
fn held_out_drawn_ignores_the_test_shards_and_draws_from_the_train_rows() {
    let s = question(fixture("hf-dataset"));
    let drawn = SplitSpec { held_out: HeldOut::Drawn, ..split(200, 1234) };
    assert_eq!(prompts::read_shipped_test(&s, &drawn, &mut Vec::new()).unwrap(), None);
    let kind = TaskKind::Data {
        path: fixture("hf-dataset"),
        prompt_field: "question".into(),
        label_field: "answer".into(),
        test_path: None,
        on_error: OnError::Stop,
    };
    let spec = TaskSpec { kind, split: SplitSpec { held_out: HeldOut::Drawn, ..split(5, 7) }, partial_credit: false };
    let t = TaskSet::build(&spec).unwrap();
    let TrainSource::List(train) = &t.train else { panic!("a file's rows") };
    let id = |r: &crate::tasks::PromptRow| r.metadata["id"].as_str().unwrap().to_string();
    assert_eq!(t.test.len(), 5, "{:?}", t.test);
    assert!(t.test.iter().chain(train).all(|r| id(r).starts_with("train-")), "{:?}", t.test);
    // The fixture's 24 train prompts are distinct: every row is in one split or the other.
    assert_eq!(train.len() + t.test.len(), 24);
    assert!(t.test.iter().all(|r| !train.iter().any(|x| id(x) == id(r))));
}

#[test]
fn a_shard_without_the_prompt_column_or_a_missing_shard_is_named() {
    let d = shard_dir(
        "column",
        &[
            ("hf-dataset/data/train-00000-of-00003.parquet", "train-00000-of-00002.parquet"),
            ("prompts.parquet", "train-00001-of-00002.parquet"),
        ],
    );
    let e = prompts::read(&question(d.clone()), &mut Vec::new()).unwrap_err();
    assert_eq!(
        e.message,
        format!(
            "{}: no column `question` (the prompt field); its columns are: prompt, answer, level, tags",
            d.join("train-00001-of-00002.parquet").display()
        )
    );
    let d = shard_dir(
        "missing",
        &[
            ("hf-dataset/data/train-00000-of-00003.parquet", "train-00000-of-00003.parquet"),
            ("hf-dataset/data/train-00002-of-00003.parquet", "train-00002-of-00003.parquet"),
        ],
    );
    let e = prompts::read(&question(d.clone()), &mut Vec::new()).unwrap_err();
    assert_eq!(
        e.message,
        format!(
            "{}: the `train` split has 3 shards (-of-00003) but 1 of them is missing: train-00001-of-00003",
            d.display()
        )
    );
    // A dangling link, as a Hugging Face cache holds for a blob that never arrived: named.
    let d = shard_dir("dangling", &[("hf-dataset/data/train-00000-of-00003.parquet", "a.parquet")]);
    std::os::unix::fs::symlink(d.join("no-such-blob"), d.join("b.parquet")).unwrap();
    let e = prompts::read(&question(d.clone()), &mut Vec::new()).unwrap_err();
    assert!(e.message.starts_with(&format!("prompt file not found: {}", d.join("b.parquet").display())), "{e}");
    let d = shard_dir("nothing", &[]);
    let e = prompts::read(&question(d.clone()), &mut Vec::new()).unwrap_err();
    assert!(e.message.starts_with(&format!("{}: holds no .parquet file", d.display())), "{e}");
}
