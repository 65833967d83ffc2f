//! Which Parquet files a `parquet { path }` names: one file, a directory of shards, or a Hugging
//! Face `datasets` repository (`data/train-00000-of-00003.parquet`, `<config>/train-*.parquet`,
//! or the converted `<config>/train/0000.parquet`), split into the train shards and the test
//! shards it ships. Only names are read here; docs/data.md ("Parquet").

use crate::{RunError, E_DATA_FILE};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The files of a prompt source, each list in name order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shards {
    pub train: Vec<PathBuf>,
    /// A datasets layout's `test` split; empty when the source ships none.
    pub test: Vec<PathBuf>,
}

/// The split names `datasets` gives files; only `train` and `test` are read (docs/data.md).
const TRAIN: &str = "train";
const TEST: &str = "test";

/// The shards `path` names; a file is its own one shard.
pub fn resolve(path: &Path) -> Result<Shards, RunError> {
    if !path.is_dir() {
        return Ok(Shards { train: vec![path.to_path_buf()], test: Vec::new() });
    }
    in_dir(path, path, 0)
}

/// `root` is what the recipe named (for messages); `dir` where the shards are looked for.
fn in_dir(root: &Path, dir: &Path, depth: usize) -> Result<Shards, RunError> {
    let files = parquet_files(dir)?;
    if !files.is_empty() {
        return by_name(dir, files);
    }
    // The converted layout (`refs/convert/parquet`): a directory per split.
    let split_dir = |s: &str| dir.join(s);
    if !parquet_files(&split_dir(TRAIN)).unwrap_or_default().is_empty() {
        let train = parquet_files(&split_dir(TRAIN))?;
        let test = if split_dir(TEST).is_dir() { parquet_files(&split_dir(TEST))? } else { Vec::new() };
        return Ok(Shards { train, test });
    }
    // Depth 0 is the recipe's directory: `data/` (the default config) or one `<config>/`.
    if depth > 0 {
        return Err(no_parquet(root));
    }
    if dir.join("data").is_dir() {
        return in_dir(root, &dir.join("data"), 1);
    }
    let mut configs = Vec::new();
    for sub in subdirs(dir)? {
        let holds = !parquet_files(&sub).unwrap_or_default().is_empty()
            || !parquet_files(&sub.join(TRAIN)).unwrap_or_default().is_empty();
        if holds {
            configs.push(sub);
        }
    }
    match configs.len() {
        0 => Err(no_parquet(root)),
        1 => in_dir(root, &configs[0], 1),
        _ => {
            let names: Vec<String> = configs.iter().map(|c| c.display().to_string()).collect();
            Err(RunError::new(
                E_DATA_FILE,
                format!("{}: holds {} configurations of a dataset: {}", root.display(), names.len(), names.join(", ")),
            )
            .with_help("set `path` to the configuration to train on"))
        }
    }
}

fn no_parquet(root: &Path) -> RunError {
    RunError::new(
        E_DATA_FILE,
        format!(
            "{}: holds no .parquet file (looked in it, in its `data/`, in each configuration directory and its `train/`)",
            root.display()
        ),
    )
    .with_help("point `path` at a .parquet file or at a directory of .parquet shards")
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, RunError> {
    let entries = std::fs::read_dir(dir).map_err(|e| RunError::io(E_DATA_FILE, "cannot list", dir, e))?;
    let mut out = Vec::new();
    for e in entries {
        out.push(e.map_err(|e| RunError::io(E_DATA_FILE, "cannot list", dir, e))?.path());
    }
    // Name order: `train-00002-...` after `train-00001-...`, the order `datasets` reads them.
    out.sort();
    Ok(out)
}

/// The `.parquet` files directly in `dir`, in name order; hidden files (`.foo.parquet.tmp`
/// partial downloads and the like) are not shards. A dangling link (the Hugging Face cache links
/// each file to a blob) is kept, so that reading it names it rather than the shard going missing.
fn parquet_files(dir: &Path) -> Result<Vec<PathBuf>, RunError> {
    Ok(read_dir(dir)?
        .into_iter()
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            !name.starts_with('.') && name.ends_with(".parquet") && !p.is_dir()
        })
        .collect())
}

fn subdirs(dir: &Path) -> Result<Vec<PathBuf>, RunError> {
    Ok(read_dir(dir)?
        .into_iter()
        .filter(|p| p.is_dir() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect())
}

/// A file's place in a datasets layout, from its name: `train-00001-of-00003.parquet` (with
/// whatever follows the count, as older uploads add a hash), or a whole split, `test.parquet`.
#[derive(Debug, PartialEq, Eq)]
struct Named<'a> {
    split: &'a str,
    /// (index, count) of a sharded name.
    shard: Option<(u32, u32)>,
}

fn named(file: &str) -> Option<Named<'_>> {
    let stem = file.strip_suffix(".parquet")?;
    // Split names are words (`datasets` allows `\w+(\.\w+)*`), so the first `-` ends one.
    let is_split = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '.');
    let Some((split, rest)) = stem.split_once('-') else {
        return is_split(stem).then_some(Named { split: stem, shard: None }).filter(|n| known(n.split));
    };
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    let index = rest.get(..5).filter(|s| digits(s))?;
    let count = rest.get(5..).and_then(|r| r.strip_prefix("-of-")).and_then(|r| r.get(..5)).filter(|s| digits(s))?;
    if !is_split(split) {
        return None;
    }
    Some(Named { split, shard: Some((index.parse().ok()?, count.parse().ok()?)) })
}

/// An unsharded file names a split only with one of the names `datasets` infers splits from.
fn known(split: &str) -> bool {
    matches!(split, "train" | "test" | "validation" | "valid" | "dev" | "eval")
}

/// Files of one directory: a datasets layout when a name says its split, else plain shards, all
/// trained on.
fn by_name(dir: &Path, files: Vec<PathBuf>) -> Result<Shards, RunError> {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let names: Vec<String> = files.iter().map(|p| name(p)).collect();
    let parsed: Vec<Option<Named>> = names.iter().map(|n| named(n)).collect();
    if parsed.iter().all(Option::is_none) {
        return Ok(Shards { train: files, test: Vec::new() });
    }
    if let Some(odd) = names.iter().zip(&parsed).find(|(_, p)| p.is_none()).map(|(n, _)| n) {
        return Err(RunError::new(
            E_DATA_FILE,
            format!(
                "{}: `{odd}` names no split, beside files that do ({}): a datasets layout names every file `SPLIT-00000-of-00001.parquet`",
                dir.display(),
                names.iter().filter(|n| named(n).is_some()).take(3).cloned().collect::<Vec<_>>().join(", ")
            ),
        )
        .with_help("rename or move the file, or point `path` at one file"));
    }
    let mut splits: BTreeMap<&str, Vec<(Named, &PathBuf)>> = BTreeMap::new();
    for (n, p) in parsed.into_iter().flatten().zip(&files) {
        splits.entry(n.split).or_default().push((n, p));
    }
    for (split, shards) in &splits {
        complete(dir, split, shards)?;
    }
    let take = |s: &str| splits.get(s).map(|v| v.iter().map(|(_, p)| (*p).clone()).collect()).unwrap_or_default();
    let train: Vec<PathBuf> = take(TRAIN);
    if train.is_empty() {
        let present: Vec<&str> = splits.keys().copied().collect();
        return Err(RunError::new(
            E_DATA_FILE,
            format!("{}: a datasets layout with split(s) {} and no `train` split", dir.display(), present.join(", ")),
        )
        .with_help("point `path` at the files to train on"));
    }
    Ok(Shards { train, test: take(TEST) })
}

/// Every shard of a sharded split is there, once: `-of-00003` needs 00000, 00001 and 00002.
fn complete(dir: &Path, split: &str, shards: &[(Named, &PathBuf)]) -> Result<(), RunError> {
    let err = |msg: String| {
        Err(RunError::new(E_DATA_FILE, format!("{}: {msg}", dir.display()))
            .with_help("download the dataset again (a shard may have failed to download), or point `path` at one file"))
    };
    let counted: Vec<(u32, u32)> = shards.iter().filter_map(|(n, _)| n.shard).collect();
    if counted.is_empty() {
        return Ok(()); // one `{split}.parquet`
    }
    if counted.len() < shards.len() {
        return err(format!("the `{split}` split is in sharded files and in a `{split}.parquet` beside them"));
    }
    let count = counted[0].1;
    if let Some((_, other)) = counted.iter().find(|(_, c)| *c != count) {
        return err(format!("the `{split}` shards disagree on their count (-of-{count:05} and -of-{other:05})"));
    }
    let mut seen = vec![0usize; count as usize];
    for (i, _) in &counted {
        match seen.get_mut(*i as usize) {
            Some(n) => *n += 1,
            None => return err(format!("`{split}` shard {i:05} is past its count of {count:05}")),
        }
    }
    if let Some(i) = seen.iter().position(|n| *n > 1) {
        return err(format!("`{split}` shard {i:05} is there more than once"));
    }
    let missing: Vec<String> =
        seen.iter().enumerate().filter(|(_, n)| **n == 0).map(|(i, _)| format!("{i:05}")).collect();
    if !missing.is_empty() {
        return err(format!(
            "the `{split}` split has {count} shards (-of-{count:05}) but {} of them {} missing: {}",
            missing.len(),
            if missing.len() == 1 { "is" } else { "are" },
            missing.iter().map(|i| format!("{split}-{i}-of-{count:05}")).collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of empty files: only names matter here.
    fn tree(name: &str, files: &[&str]) -> PathBuf {
        let d = std::env::temp_dir().join(format!("miles-shards-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for f in files {
            let p = d.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"").unwrap();
        }
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn rel(root: &Path, v: &[PathBuf]) -> Vec<String> {
        v.iter().map(|p| p.strip_prefix(root).unwrap().display().to_string()).collect()
    }

    #[test]
    fn names_of_a_datasets_layout() {
        assert_eq!(named("train-00001-of-00003.parquet"), Some(Named { split: "train", shard: Some((1, 3)) }));
        assert_eq!(
            named("test-00000-of-00001-5a9c1f2e3d4b6a7c.parquet"),
            Some(Named { split: "test", shard: Some((0, 1)) })
        );
        assert_eq!(named("test.parquet"), Some(Named { split: "test", shard: None }));
        assert_eq!(named("part-0.parquet"), None);
        assert_eq!(named("shard.parquet"), None);
        assert_eq!(named("train-1-of-3.parquet"), None);
        assert_eq!(named("train-00001-of-00003.json"), None);
    }

    #[test]
    fn a_file_plain_shards_and_the_layouts() {
        let f = PathBuf::from("x/prompts.parquet");
        assert_eq!(resolve(&f).unwrap(), Shards { train: vec![f], test: vec![] });
        // Plain shards: all trained on, in name order; other files and hidden ones ignored.
        let d = tree("plain", &["b.parquet", "a.parquet", "README.md", ".c.parquet", "sub/x.txt"]);
        let s = resolve(&d).unwrap();
        assert_eq!((rel(&d, &s.train), s.test.len()), (vec!["a.parquet".into(), "b.parquet".into()], 0));
        // The hub's layout: data/, train and test shards, validation not read.
        let d = tree(
            "hub",
            &[
                "README.md",
                "data/train-00002-of-00003.parquet",
                "data/train-00000-of-00003.parquet",
                "data/train-00001-of-00003.parquet",
                "data/test-00000-of-00001.parquet",
                "data/validation-00000-of-00001.parquet",
            ],
        );
        let s = resolve(&d).unwrap();
        assert_eq!(
            rel(&d, &s.train),
            vec![
                "data/train-00000-of-00003.parquet",
                "data/train-00001-of-00003.parquet",
                "data/train-00002-of-00003.parquet"
            ]
        );
        assert_eq!(rel(&d, &s.test), vec!["data/test-00000-of-00001.parquet"]);
        // The same directory named at data/ itself.
        assert_eq!(resolve(&d.join("data")).unwrap(), s);
        // One configuration directory, and the converted layout (a directory per split).
        let d = tree("config", &["main/train-00000-of-00001.parquet", "main/test-00000-of-00001.parquet"]);
        let s = resolve(&d).unwrap();
        assert_eq!(
            (rel(&d, &s.train), rel(&d, &s.test)),
            (vec!["main/train-00000-of-00001.parquet".into()], vec!["main/test-00000-of-00001.parquet".into()])
        );
        let d =
            tree("convert", &["default/train/0000.parquet", "default/train/0001.parquet", "default/test/0000.parquet"]);
        let s = resolve(&d).unwrap();
        assert_eq!(rel(&d, &s.train), vec!["default/train/0000.parquet", "default/train/0001.parquet"]);
        assert_eq!(rel(&d, &s.test), vec!["default/test/0000.parquet"]);
        // Unsharded split files.
        let d = tree("whole", &["train.parquet", "test.parquet"]);
        let s = resolve(&d).unwrap();
        assert_eq!((rel(&d, &s.train), rel(&d, &s.test)), (vec!["train.parquet".into()], vec!["test.parquet".into()]));
    }

    #[test]
    fn missing_shards_and_other_faults_are_errors_naming_the_directory() {
        let msg = |files: &[&str], name: &str| {
            let d = tree(name, files);
            let e = resolve(&d).unwrap_err();
            assert_eq!(e.code, E_DATA_FILE);
            e.message.replace(&d.display().to_string(), "DIR")
        };
        assert_eq!(
            msg(&["data/train-00000-of-00003.parquet", "data/train-00002-of-00003.parquet"], "missing"),
            "DIR/data: the `train` split has 3 shards (-of-00003) but 1 of them is missing: train-00001-of-00003"
        );
        assert_eq!(
            msg(&["train-00000-of-00002.parquet", "train-00001-of-00003.parquet"], "counts"),
            "DIR: the `train` shards disagree on their count (-of-00002 and -of-00003)"
        );
        assert_eq!(
            msg(&["train-00000-of-00001.parquet", "train-00000-of-00001-abc.parquet"], "twice"),
            "DIR: `train` shard 00000 is there more than once"
        );
        assert_eq!(
            msg(&["train-00000-of-00001.parquet", "train-00003-of-00001.parquet"], "past"),
            "DIR: `train` shard 00003 is past its count of 00001"
        );
        assert_eq!(
            msg(&["test-00000-of-00001.parquet"], "notrain"),
            "DIR: a datasets layout with split(s) test and no `train` split"
        );
        assert_eq!(
            msg(&["train-00000-of-00001.parquet", "extra.parquet"], "odd"),
            "DIR: `extra.parquet` names no split, beside files that do (train-00000-of-00001.parquet): a datasets layout names every file `SPLIT-00000-of-00001.parquet`"
        );
        assert_eq!(
            msg(&["README.md", "notes/a.txt"], "none"),
            "DIR: holds no .parquet file (looked in it, in its `data/`, in each configuration directory and its `train/`)"
        );
        assert_eq!(
            msg(&["main/train-00000-of-00001.parquet", "socratic/train-00000-of-00001.parquet"], "configs"),
            "DIR: holds 2 configurations of a dataset: DIR/main, DIR/socratic"
        );
    }
}
