//! The data directory as a whole: the exclusive lock that keeps a second broker out of it, and
//! the format version that keeps a binary from misreading a layout it does not know.
//!
//! Two brokers writing the same directory destroy each other's data without either noticing
//! (each recovers only what it wrote itself), so [`DataDir::open`] takes an exclusive advisory
//! lock (`flock(2)`) on `warren.lock` and holds it for as long as the broker uses the
//! directory; the lock file also records the holder's process id, for the error message a
//! second broker prints. The lock is released by the kernel when the process exits, however
//! it exits (`kill -9` included), so a stale lock file never keeps a broker from starting.
//! `flock` locks belong to an open file, not to a process: a second broker embedded in the
//! same process is refused too.
//!
//! The file `format-version` holds the layout version as a decimal number and a newline. A
//! directory with a newer version than [`FORMAT_VERSION`] is refused; an older one is upgraded
//! by the steps in [`upgrade`] or refused with instructions. A directory without the file but
//! with the first layout (`messages/`, `definitions/`) is that first version and gets the file;
//! an empty directory is new. A directory holding anything else is not a Warren data directory
//! and is refused, so that a mistyped `--data-dir` does not scatter files into, say, a home
//! directory.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The layout version this build reads and writes. Version 1: `messages/` (segment log),
/// `definitions/` (one file per vhost, replaced whole), `spill/` (scratch).
pub const FORMAT_VERSION: u32 = 1;

/// Name of the lock file inside the data directory.
pub const LOCK_FILE: &str = "warren.lock";

/// Name of the format version file inside the data directory.
pub const FORMAT_FILE: &str = "format-version";

/// Entries of a version-1 data directory, and ones that may sit beside them.
const KNOWN_ENTRIES: &[&str] = &[
    "messages",
    "definitions",
    "spill",
    "log",
    LOCK_FILE,
    FORMAT_FILE,
    "lost+found",
];

/// Why a data directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// The directory could not be created, read or written.
    #[error("data directory {}: {action}: {source}", dir.display())]
    Io {
        /// The data directory.
        dir: PathBuf,
        /// What was being done.
        action: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The path exists and is not a directory.
    #[error("data directory {} exists and is not a directory", dir.display())]
    NotADirectory {
        /// The path given as data directory.
        dir: PathBuf,
    },
    /// Another broker holds the lock.
    #[error(
        "data directory {} is in use by another Warren process{}: its lock file {} is locked; \
         stop that broker or choose another data directory",
        dir.display(),
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
        lock.display()
    )]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The process id written by the holder, when readable.
        pid: Option<u32>,
    },
    /// The directory was written by a newer Warren.
    #[error(
        "data directory {} has format version {found}, newer than the versions this Warren \
         ({}) can read (up to {FORMAT_VERSION}): run the newer Warren that wrote it",
        dir.display(),
        env!("CARGO_PKG_VERSION")
    )]
    TooNew {
        /// The data directory.
        dir: PathBuf,
        /// The version found.
        found: u32,
    },
    /// The directory has an old format this Warren cannot upgrade.
    #[error(
        "data directory {} has format version {found}, which this Warren ({}) cannot upgrade \
         to version {FORMAT_VERSION}: export its definitions and messages with the Warren that \
         wrote it, or start on an empty directory",
        dir.display(),
        env!("CARGO_PKG_VERSION")
    )]
    TooOld {
        /// The data directory.
        dir: PathBuf,
        /// The version found.
        found: u32,
    },
    /// The format file does not hold a version number.
    #[error("data directory {}: {} does not hold a format version number: {content:?}", dir.display(), FORMAT_FILE)]
    BadFormatFile {
        /// The data directory.
        dir: PathBuf,
        /// What the file holds (first bytes).
        content: String,
    },
    /// The directory holds files that are not Warren's.
    #[error(
        "{} is not empty and is not a Warren data directory (it holds {entry:?} and no {}): \
         choose an empty or new directory",
        dir.display(),
        FORMAT_FILE
    )]
    Foreign {
        /// The directory.
        dir: PathBuf,
        /// One entry that is not Warren's.
        entry: String,
    },
}

/// A data directory in use: holds the lock until dropped.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    /// The locked file; closing it releases the lock.
    _lock: File,
}

impl DataDir {
    /// Creates `dir` if needed, locks it, and checks (or writes, or upgrades) its format
    /// version.
    ///
    /// Errors: [`DataDirError`]: not a directory, not creatable, locked by another broker
    /// (naming its pid), or a format this build cannot use.
    pub fn open(dir: &Path) -> Result<DataDir, DataDirError> {
        let io = |action: &str| {
            let dir = dir.to_path_buf();
            let action = action.to_string();
            move |source| DataDirError::Io {
                dir,
                action,
                source,
            }
        };
        match std::fs::metadata(dir) {
            Ok(m) if !m.is_dir() => {
                return Err(DataDirError::NotADirectory {
                    dir: dir.to_path_buf(),
                })
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(io("cannot create it"))?;
            }
            Err(e) => return Err(io("cannot read it")(e)),
        }
        let lock = lock(dir)?;
        check_format(dir)?;
        Ok(DataDir {
            path: dir.to_path_buf(),
            _lock: lock,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Opens and locks `dir/warren.lock`, then writes this process's id into it.
fn lock(dir: &Path) -> Result<File, DataDirError> {
    let path = dir.join(LOCK_FILE);
    let io = |action: &str| {
        let dir = dir.to_path_buf();
        let action = format!("{action} {}", path.display());
        move |source| DataDirError::Io {
            dir,
            action,
            source,
        }
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io("cannot open lock file"))?;
    // SAFETY: flock on a file descriptor we own; it has no memory-safety preconditions.
    let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(DataDirError::Locked {
                dir: dir.to_path_buf(),
                lock: path.clone(),
                pid: text.trim().parse().ok(),
            });
        }
        return Err(io("cannot lock")(err));
    }
    let pid = format!("{}\n", std::process::id());
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(pid.as_bytes()))
        .map_err(io("cannot write lock file"))?;
    Ok(file)
}

/// Reads the format version, writes it for a new or first-layout directory, and upgrades or
/// refuses an old one.
fn check_format(dir: &Path) -> Result<(), DataDirError> {
    let path = dir.join(FORMAT_FILE);
    let found = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse::<u32>()
            .map_err(|_| DataDirError::BadFormatFile {
                dir: dir.to_path_buf(),
                content: text.chars().take(40).collect(),
            })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let entries = std::fs::read_dir(dir).map_err(|source| DataDirError::Io {
                dir: dir.to_path_buf(),
                action: "cannot list it".into(),
                source,
            })?;
            for e in entries.filter_map(|e| e.ok()) {
                let name = e.file_name().to_string_lossy().into_owned();
                if !KNOWN_ENTRIES.contains(&name.as_str()) && !name.starts_with('.') {
                    return Err(DataDirError::Foreign {
                        dir: dir.to_path_buf(),
                        entry: name,
                    });
                }
            }
            // Empty, or the first layout, which had no version file.
            write_format(dir, FORMAT_VERSION)?;
            return Ok(());
        }
        Err(source) => {
            return Err(DataDirError::Io {
                dir: dir.to_path_buf(),
                action: format!("cannot read {}", path.display()),
                source,
            })
        }
    };
    if found > FORMAT_VERSION {
        return Err(DataDirError::TooNew {
            dir: dir.to_path_buf(),
            found,
        });
    }
    if found < FORMAT_VERSION {
        upgrade(dir, found)?;
        write_format(dir, FORMAT_VERSION)?;
        tracing::info!(
            dir = %dir.display(),
            from = found,
            to = FORMAT_VERSION,
            "upgraded the data directory's format"
        );
    }
    Ok(())
}

/// Rewrites the layout of `dir` from version `from` to [`FORMAT_VERSION`], one step per
/// version. Version 1 is the first layout, so no step exists yet: every older number is
/// refused.
fn upgrade(dir: &Path, from: u32) -> Result<(), DataDirError> {
    // When version 2 comes: `if from == 1 { upgrade_1_to_2(dir)?; }` and so on, each step
    // crash-safe (a step interrupted by a crash runs again on the next start).
    Err(DataDirError::TooOld {
        dir: dir.to_path_buf(),
        found: from,
    })
}

/// Writes `format-version` atomically: a temporary file, fsync, rename, directory fsync.
fn write_format(dir: &Path, version: u32) -> Result<(), DataDirError> {
    let path = dir.join(FORMAT_FILE);
    let tmp = dir.join(format!("{FORMAT_FILE}.tmp"));
    let r = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(format!("{version}\n").as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        File::open(dir)?.sync_all()
    })();
    r.map_err(|source| DataDirError::Io {
        dir: dir.to_path_buf(),
        action: format!("cannot write {}", path.display()),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("warren-datadir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn second_open_is_refused_with_the_holders_pid() {
        let d = scratch("lock");
        let first = DataDir::open(&d).unwrap();
        let err = DataDir::open(&d).unwrap_err();
        match &err {
            DataDirError::Locked { pid, .. } => assert_eq!(*pid, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
        let text = err.to_string();
        assert!(text.contains(&d.display().to_string()), "{text}");
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        drop(first);
        DataDir::open(&d).expect("free again once the holder is gone");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn format_versions() {
        let d = scratch("format");
        drop(DataDir::open(&d).unwrap());
        assert_eq!(std::fs::read_to_string(d.join(FORMAT_FILE)).unwrap(), "1\n");
        std::fs::write(d.join(FORMAT_FILE), "2\n").unwrap();
        let e = DataDir::open(&d).unwrap_err().to_string();
        assert!(e.contains("format version 2, newer"), "{e}");
        std::fs::write(d.join(FORMAT_FILE), "0\n").unwrap();
        let e = DataDir::open(&d).unwrap_err().to_string();
        assert!(e.contains("cannot upgrade"), "{e}");
        std::fs::write(d.join(FORMAT_FILE), "garbage").unwrap();
        assert!(matches!(
            DataDir::open(&d),
            Err(DataDirError::BadFormatFile { .. })
        ));
        // The first layout without a version file is version 1.
        std::fs::remove_file(d.join(FORMAT_FILE)).unwrap();
        std::fs::create_dir_all(d.join("messages")).unwrap();
        std::fs::create_dir_all(d.join("definitions")).unwrap();
        drop(DataDir::open(&d).unwrap());
        assert_eq!(std::fs::read_to_string(d.join(FORMAT_FILE)).unwrap(), "1\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn foreign_directories_and_files_are_refused() {
        let d = scratch("foreign");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("notes.txt"), "mine").unwrap();
        let e = DataDir::open(&d).unwrap_err().to_string();
        assert!(e.contains("not a Warren data directory"), "{e}");
        assert!(e.contains("notes.txt"), "{e}");
        let f = d.join("notes.txt");
        let e = DataDir::open(&f).unwrap_err().to_string();
        assert!(e.contains("is not a directory"), "{e}");
        assert!(e.contains("notes.txt"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
