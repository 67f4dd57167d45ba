//! Replies to durable topology changes, held back until the definitions are on disk.

use super::*;

/// A connection's durable topology changes in flight: while any is, the connection's outbox
/// is held, so that a declare-ok (and every frame after it: other replies, deliveries,
/// confirms) leaves only once the change is on disk. The connection reads no further frames
/// until they settle ([`DurableReplies::settle`]); other connections are not affected, and the
/// changes of one read share one fsync.
pub struct DurableReplies {
    pub(super) outbox: Arc<Outbox>,
    pub(super) pending: AtomicU64,
    pub(super) failure: Mutex<Option<BrokerError>>,
    pub(super) settled: tokio::sync::Notify,
}

impl DurableReplies {
    /// For the connection writing to `outbox`.
    pub fn new(outbox: Arc<Outbox>) -> Self {
        DurableReplies {
            outbox,
            pending: AtomicU64::new(0),
            failure: Mutex::new(None),
            settled: tokio::sync::Notify::new(),
        }
    }

    /// Waits until every change is on disk or rolled back, then lets the outbox write again.
    /// Returns the refusal of a change that could not be stored: the connection must close
    /// with it (what was held is discarded).
    pub async fn settle(&self) -> Option<BrokerError> {
        if !self.outbox.is_held() {
            return None;
        }
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.pending.load(Ordering::Acquire) == 0 {
                break;
            }
            notified.await;
        }
        match self.failure.lock().take() {
            Some(e) => {
                self.outbox.discard();
                Some(e)
            }
            None => {
                self.outbox.release();
                None
            }
        }
    }
}

impl DurableSink for DurableReplies {
    fn begin(&self) {
        self.outbox.hold();
        self.pending.fetch_add(1, Ordering::AcqRel);
    }

    fn settled(&self, outcome: Result<(), BrokerError>) {
        if let Err(e) = outcome {
            self.failure.lock().get_or_insert(e);
        }
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.settled.notify_waiters();
        }
    }
}
