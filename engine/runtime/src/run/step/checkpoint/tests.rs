use super::*;
use crate::sim::{SimConfig, SimTrainer, SimTrainerState, SIM_TRAINER_FILE};

fn spec() -> RunSpec {
    RunSpec::from_json(include_str!("../../../../tests/data/tiny.json")).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("miles-ckpt-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    d
}

/// Checkpoints at `steps` of a trainer whose state says its step.
fn write(root: &Path, spec: &RunSpec, steps: &[u64]) {
    for &s in steps {
        let state = SimTrainerState { version: s, ..Default::default() };
        let t = SimTrainer { cfg: SimConfig::default(), state };
        save_checkpoint(root, spec, s, None, None, &t, |_| Ok(())).unwrap();
    }
}

#[test]
fn the_manifest_lists_every_file_with_its_size_and_sha256() {
    let root = scratch("manifest");
    write(&root, &spec(), &[3]);
    let dir = root.join(ckpt_name(3));
    let m: Manifest = serde_json::from_str(&fs::read_to_string(dir.join(MANIFEST_FILE)).unwrap()).unwrap();
    assert_eq!(m.step, 3);
    assert_eq!(m.files.keys().collect::<Vec<_>>(), [SIM_TRAINER_FILE, STATE_FILE]);
    let sim = fs::read(dir.join(SIM_TRAINER_FILE)).unwrap();
    let want: String = Sha256::digest(&sim).iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(m.files[SIM_TRAINER_FILE], FileSum { bytes: sim.len() as u64, sha256: want });
    let found = newest_good_checkpoint(&root).unwrap().unwrap();
    assert_eq!((found.state.step, found.skipped.len()), (3, 0));
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn a_corrupted_or_truncated_file_is_found_by_its_hash_and_the_previous_checkpoint_used() {
    let root = scratch("corrupt");
    write(&root, &spec(), &[1, 2]);
    let newest = root.join(ckpt_name(2));
    let file = newest.join(SIM_TRAINER_FILE);
    // Same size, one byte changed: only the hash can tell.
    let mut bytes = fs::read(&file).unwrap();
    bytes[0] ^= 0x20;
    fs::write(&file, &bytes).unwrap();
    let found = newest_good_checkpoint(&root).unwrap().unwrap();
    assert_eq!(found.state.step, 1);
    assert_eq!(found.dir, root.join(ckpt_name(1)));
    assert_eq!(found.skipped.len(), 1);
    let line = &found.skipped[0];
    assert!(line.contains(&newest.display().to_string()) && line.contains(&found.dir.display().to_string()), "{line}");
    assert!(line.contains("sim_trainer.json does not match its SHA-256"), "{line}");
    // Truncated: the size says so before any hashing.
    fs::write(&file, &bytes[..bytes.len() / 2]).unwrap();
    let line = &newest_good_checkpoint(&root).unwrap().unwrap().skipped[0];
    assert!(
        line.contains(&format!("sim_trainer.json is {} bytes, its manifest says {}", bytes.len() / 2, bytes.len())),
        "{line}"
    );
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn a_checkpoint_without_a_manifest_is_skipped_and_never_counted_as_kept() {
    let root = scratch("nomanifest");
    write(&root, &spec(), &[1, 2]);
    fs::remove_file(root.join(ckpt_name(2)).join(MANIFEST_FILE)).unwrap();
    let found = newest_good_checkpoint(&root).unwrap().unwrap();
    assert_eq!(found.state.step, 1);
    assert!(found.skipped[0].contains("it has no manifest.json"), "{}", found.skipped[0]);
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn every_checkpoint_damaged_is_an_error_naming_each_not_a_fresh_start() {
    let root = scratch("alldamaged");
    write(&root, &spec(), &[1, 2]);
    for s in [1, 2] {
        fs::remove_file(root.join(ckpt_name(s)).join(SIM_TRAINER_FILE)).unwrap();
    }
    let e = newest_good_checkpoint(&root).err().unwrap();
    assert_eq!(e.code, E_CHECKPOINT);
    assert!(e.message.contains("step-00000001: sim_trainer.json is missing"), "{}", e.message);
    assert!(e.message.contains("step-00000002: sim_trainer.json is missing"), "{}", e.message);
    assert!(newest_good_checkpoint(&root.join("none")).unwrap().is_none(), "no checkpoint at all: a fresh run");
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn at_least_two_checkpoints_stay_whatever_keep_says() {
    let root = scratch("keep");
    let mut s = spec();
    s.checkpoint.keep = 1;
    write(&root, &s, &[1, 2, 3]);
    let mut left: Vec<u64> = list_checkpoints(&root).unwrap().into_iter().map(|(n, _)| n).collect();
    left.sort();
    assert_eq!(left, [2, 3]);
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn a_manifest_naming_a_file_outside_the_checkpoint_is_refused() {
    let root = scratch("escape");
    write(&root, &spec(), &[1]);
    let mp = root.join(ckpt_name(1)).join(MANIFEST_FILE);
    let text = fs::read_to_string(&mp).unwrap().replace(SIM_TRAINER_FILE, "../../etc/passwd");
    fs::write(&mp, text).unwrap();
    let e = newest_good_checkpoint(&root).err().unwrap();
    assert!(e.message.contains("outside the checkpoint"), "{}", e.message);
    let _ = fs::remove_dir_all(&root);
}

#[test]
fn a_write_killed_before_its_rename_is_never_used_and_is_removed() {
    let root = scratch("killed");
    write(&root, &spec(), &[1]);
    // What `kill -9` during the write of step 2 leaves: a temporary directory, files half there.
    let tmp = root.join(".step-00000002.tmp-999999");
    fs::create_dir_all(&tmp).unwrap();
    fs::write(tmp.join(SIM_TRAINER_FILE), b"{\"vers").unwrap();
    let found = newest_good_checkpoint(&root).unwrap().unwrap();
    assert_eq!((found.state.step, found.skipped.len()), (1, 0));
    assert!(!tmp.exists(), "the killed write's directory is removed");
    let _ = fs::remove_dir_all(&root);
}
