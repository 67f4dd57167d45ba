//! Writes the seed corpus (see `warren_fuzz::seeds`) to `fuzz/corpus/<target>/seed-*`,
//! replacing the previous seed files and leaving the fuzzer's own finds alone.
//!
//! Run from anywhere: `cargo run -p warren-fuzz --example seed_corpus`.

use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (target, _) in warren_fuzz::TARGETS {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("seed-"))
            {
                std::fs::remove_file(&path)?;
            }
        }
        let files = warren_fuzz::seeds::corpus(target);
        for (name, data) in &files {
            std::fs::write(dir.join(name), data)?;
        }
        println!("{target}: {} seed files in {}", files.len(), dir.display());
    }
    Ok(())
}
