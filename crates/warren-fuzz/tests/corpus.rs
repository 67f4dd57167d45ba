//! Replays the committed corpus of every fuzz target (`fuzz/corpus/<target>/`) through the
//! target's code, without libFuzzer: whatever the fuzzer once found interesting must still run
//! without a panic, a hang or a broken invariant.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

fn corpus_files(target: &str) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(target: &str) {
    let run = warren_fuzz::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, f)| *f)
        .expect("known target");
    let files = corpus_files(target);
    assert!(
        files.len() >= 10,
        "{target}: only {} corpus files; run the seed_corpus example",
        files.len()
    );
    let mut failed = Vec::new();
    for path in &files {
        let data = std::fs::read(path).expect("readable corpus file");
        if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
            failed.push(path.display().to_string());
        }
    }
    assert!(failed.is_empty(), "{target}: inputs that fail: {failed:#?}");
    eprintln!("{target}: {} corpus inputs replayed", files.len());
}

#[test]
fn frame_reader_corpus() {
    replay("frame_reader");
}

#[test]
fn method_decode_corpus() {
    replay("method_decode");
}

#[test]
fn table_decode_corpus() {
    replay("table_decode");
}

#[test]
fn connection_corpus() {
    replay("connection");
}

/// The seeds written by the seed_corpus example are all in the committed corpus, unchanged.
#[test]
fn committed_seeds_are_current() {
    for (target, _) in warren_fuzz::TARGETS {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(target);
        for (name, data) in warren_fuzz::seeds::corpus(target) {
            let committed = std::fs::read(dir.join(&name)).unwrap_or_default();
            assert!(
                committed == data,
                "{target}/{name} is missing or stale: run `cargo run -p warren-fuzz --example seed_corpus`"
            );
        }
    }
}
