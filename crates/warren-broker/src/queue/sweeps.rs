//! The queues a vhost's periodic sweep visits: only those with something to do (message TTLs,
//! `x-expires`, paging the disk refused), so that a broker holding many idle queues does no
//! work at rest.
//!
//! A queue is added when it is created, when a policy is applied to it, and when it enqueues
//! a message with a deadline or finds its paging stalled ([`SweepSet::add`], cheap once it is
//! in). After each visit the sweep asks the queue whether it still needs one
//! ([`super::QueueBackend::needs_sweep`]) and drops it when not ([`SweepSet::settle`]). The
//! queue's mark ([`super::QueueBackend::sweep_mark`]) is cleared before that question and set
//! again by anyone adding the queue meanwhile, so that a queue that gains a deadline while it
//! is being dropped stays in.

use super::Queue;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The set of queues a vhost's sweep visits, by the address of their `Arc`.
#[derive(Default)]
pub struct SweepSet {
    queues: Mutex<HashMap<usize, Arc<Queue>>>,
}

fn key(q: &Arc<Queue>) -> usize {
    Arc::as_ptr(q) as *const () as usize
}

impl SweepSet {
    /// Adds `q` unless its mark says it is in already (one atomic load then).
    pub fn add(&self, q: &Arc<Queue>) {
        if q.sweep_mark().load(Ordering::Acquire) {
            return;
        }
        let mut set = self.queues.lock();
        q.sweep_mark().store(true, Ordering::Release);
        set.entry(key(q)).or_insert_with(|| q.clone());
    }

    /// The queues to visit now.
    pub fn snapshot(&self) -> Vec<Arc<Queue>> {
        self.queues.lock().values().cloned().collect()
    }

    /// How many queues the sweep visits.
    pub fn len(&self) -> usize {
        self.queues.lock().len()
    }

    /// True when the sweep visits no queue.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// After a visit: keeps `q` (adding it if it was not in) while it needs sweeping or was
    /// added meanwhile, drops it otherwise. A deleted queue is always dropped.
    pub fn settle(&self, q: &Arc<Queue>) {
        let mark = q.sweep_mark();
        mark.store(false, Ordering::Release);
        let needs = !q.is_deleted() && q.needs_sweep();
        let mut set = self.queues.lock();
        if needs || (mark.load(Ordering::Acquire) && !q.is_deleted()) {
            mark.store(true, Ordering::Release);
            set.entry(key(q)).or_insert_with(|| q.clone());
        } else {
            set.remove(&key(q));
        }
    }
}
