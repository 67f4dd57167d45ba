//! Group commit for the durable definitions logs: one writer thread appends the records every
//! vhost hands it and fsyncs each file it touched once per batch, so concurrent changes (many
//! connections declaring, or one pipelining) share an fsync. Whatever arrives while a batch is
//! written goes into the next one.
//!
//! A record's waiter learns the outcome after the fsync: a blocked caller is woken, a callback
//! is called. On failure the batch's bytes are cut off every file again (each file ends with
//! whole records only) and its callbacks run on a thread of their own: a callback may take a
//! vhost's topology lock to roll its change back, and a caller blocked on a later batch may
//! hold that lock while it waits for this thread.

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

/// Called once with the outcome of the batch that held the record.
pub(crate) type Callback = Box<dyn FnOnce(Result<(), String>) + Send>;

/// Who waits for a record.
pub(crate) enum Waiter {
    /// A caller blocked in [`DefsWriter::append_and_wait`].
    Blocked(Arc<Blocked>),
    /// A callback.
    Callback(Callback),
}

/// A blocked caller's slot.
#[derive(Default)]
pub(crate) struct Blocked {
    outcome: Mutex<Option<Result<(), String>>>,
    done: Condvar,
}

/// Work to run on the writer thread once the batch it was queued with is written; its argument
/// tells whether that batch was.
pub(crate) type AfterWritten = Box<dyn FnOnce(bool) + Send>;

#[derive(Default)]
struct State {
    pending: Vec<(PathBuf, Vec<u8>)>,
    waiters: Vec<Waiter>,
    after: Vec<AfterWritten>,
    shutdown: bool,
}

struct Inner {
    state: Mutex<State>,
    wake: Condvar,
    /// Batches that failed, and whose callbacks (rollbacks) have not all run yet.
    failures: std::sync::atomic::AtomicU64,
    rolling_back: std::sync::atomic::AtomicUsize,
}

/// The writer thread and its queue.
pub(crate) struct DefsWriter {
    inner: Arc<Inner>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl DefsWriter {
    /// Starts the writer thread.
    pub(crate) fn start() -> Self {
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            failures: Default::default(),
            rolling_back: Default::default(),
        });
        let run = inner.clone();
        let thread = std::thread::Builder::new()
            .name("warren-defs".into())
            .spawn(move || writer_loop(&run))
            .expect("spawn the definitions writer");
        DefsWriter {
            inner,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Queues `record` for `path`; `waiter` learns the outcome after the fsync.
    pub(crate) fn append(&self, path: PathBuf, record: Vec<u8>, waiter: Waiter) {
        let mut st = self.inner.state.lock();
        if st.shutdown {
            drop(st);
            complete(
                &self.inner,
                vec![waiter],
                Err("the broker is closed".into()),
            );
            return;
        }
        st.pending.push((path, record));
        st.waiters.push(waiter);
        drop(st);
        self.inner.wake.notify_one();
    }

    /// Runs `job` on the writer thread once everything queued before it is written (a
    /// compaction's snapshot, which must not precede the records it covers). Dropped unrun
    /// when the writer has stopped.
    pub(crate) fn after_written(&self, job: AfterWritten) {
        let mut st = self.inner.state.lock();
        if st.shutdown {
            return;
        }
        st.after.push(job);
        drop(st);
        self.inner.wake.notify_one();
    }

    /// Queues `record` and waits until it is fsynced (or failed).
    pub(crate) fn append_and_wait(&self, path: PathBuf, record: Vec<u8>) -> Result<(), String> {
        let slot = Arc::new(Blocked::default());
        self.append(path, record, Waiter::Blocked(slot.clone()));
        let mut outcome = slot.outcome.lock();
        loop {
            if let Some(r) = outcome.take() {
                return r;
            }
            slot.done.wait(&mut outcome);
        }
    }

    /// A number that changes with every failed batch, and while the rollbacks of a failed
    /// batch are still running.
    pub(crate) fn failures(&self) -> u64 {
        use std::sync::atomic::Ordering;
        let rolling = self.inner.rolling_back.load(Ordering::Acquire) as u64;
        self.inner.failures.load(Ordering::Acquire) + (rolling << 32)
    }

    /// Writes what is queued, then stops the thread. Later appends fail.
    pub(crate) fn close(&self) {
        self.inner.state.lock().shutdown = true;
        self.inner.wake.notify_one();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for DefsWriter {
    fn drop(&mut self) {
        self.close();
    }
}

fn writer_loop(inner: &Arc<Inner>) {
    loop {
        let (batch, waiters, after) = {
            let mut st = inner.state.lock();
            while st.pending.is_empty() && st.after.is_empty() && !st.shutdown {
                inner.wake.wait(&mut st);
            }
            if st.pending.is_empty() && st.after.is_empty() {
                return;
            }
            (
                std::mem::take(&mut st.pending),
                std::mem::take(&mut st.waiters),
                std::mem::take(&mut st.after),
            )
        };
        let outcome = write_batch(batch).map_err(|e| e.to_string());
        if outcome.is_err() {
            inner
                .failures
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        let ok = outcome.is_ok();
        complete(inner, waiters, outcome);
        for job in after {
            job(ok);
        }
    }
}

/// Appends each file's records and fsyncs it; on error cuts every touched file back.
fn write_batch(batch: Vec<(PathBuf, Vec<u8>)>) -> std::io::Result<()> {
    let mut files: HashMap<PathBuf, (std::fs::File, u64, bool)> = HashMap::new();
    let result = (|| {
        for (path, record) in &batch {
            if !files.contains_key(path) {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                let created = !path.exists();
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                let len = f.metadata()?.len();
                files.insert(path.clone(), (f, len, created));
            }
            let (f, _, _) = files.get_mut(path).expect("inserted above");
            f.write_all(record)?;
        }
        for (path, (f, _, created)) in &files {
            f.sync_data()?;
            if *created {
                if let Some(dir) = path.parent() {
                    std::fs::File::open(dir)?.sync_all()?;
                }
            }
        }
        Ok(())
    })();
    if result.is_err() {
        for (f, len, _) in files.values() {
            let _ = f.set_len(*len);
        }
    }
    result
}

fn complete(inner: &Arc<Inner>, waiters: Vec<Waiter>, outcome: Result<(), String>) {
    let mut callbacks = Vec::new();
    for w in waiters {
        match w {
            Waiter::Blocked(slot) => {
                *slot.outcome.lock() = Some(outcome.clone());
                slot.done.notify_all();
            }
            Waiter::Callback(f) => callbacks.push(f),
        }
    }
    if callbacks.is_empty() {
        return;
    }
    if outcome.is_ok() {
        for f in callbacks {
            f(Ok(()));
        }
    } else {
        // Rollbacks take topology locks: not on this thread (see the module docs), and the
        // latest change first.
        use std::sync::atomic::Ordering;
        inner.rolling_back.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("warren-defs-rollback".into())
            .spawn({
                let outcome = outcome.clone();
                let inner = inner.clone();
                move || {
                    for f in callbacks.into_iter().rev() {
                        f(outcome.clone());
                    }
                    inner.rolling_back.fetch_sub(1, Ordering::AcqRel);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the thread that rolls failed definitions back");
        }
    }
}
