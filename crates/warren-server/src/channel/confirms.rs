//! Publisher confirms (basic.ack / basic.nack to the publisher, rabbitmq.com/docs/confirms)
//! and the wait of tx.commit-ok for the fsync of what the transaction published.

use super::*;

/// Publisher-confirm bookkeeping, shared with the message store's writer thread, which
/// completes the publishes it fsynced.
///
/// Sequence numbers still waiting for an fsync are in `waiting`; settled ones in `done` until
/// sent. A flush sends everything settled below the oldest waiting number: one basic.ack with
/// `multiple` set when all of it succeeded, else one basic.ack / basic.nack per publish.
pub struct Confirms {
    pub(super) channel: u16,
    pub(super) outbox: Arc<Outbox>,
    pub(super) book: Mutex<ConfirmBook>,
    pub(super) stats: Arc<ChannelEntry>,
}

pub(super) struct ConfirmBook {
    pub(super) next_seq: u64,
    pub(super) waiting: BTreeSet<u64>,
    pub(super) done: BTreeMap<u64, bool>,
}

impl Confirms {
    pub(super) fn new(channel: u16, outbox: Arc<Outbox>, stats: Arc<ChannelEntry>) -> Self {
        Confirms {
            channel,
            outbox,
            stats,
            book: Mutex::new(ConfirmBook {
                next_seq: 1,
                waiting: BTreeSet::new(),
                done: BTreeMap::new(),
            }),
        }
    }

    /// Takes the next publish sequence number, marked as waiting.
    pub(super) fn begin(&self) -> u64 {
        let mut b = self.book.lock();
        let seq = b.next_seq;
        b.next_seq += 1;
        b.waiting.insert(seq);
        bump(&self.stats.unconfirmed);
        seq
    }

    /// Settles `seq` without the store: acked (`ok`) or nacked.
    pub(super) fn settle(&self, seq: u64, ok: bool) {
        let mut b = self.book.lock();
        b.waiting.remove(&seq);
        b.done.insert(seq, ok);
    }

    /// Sends what can be confirmed now.
    pub fn flush(&self) {
        let mut b = self.book.lock();
        let limit = b.waiting.first().copied().unwrap_or(u64::MAX);
        let rest = b.done.split_off(&limit);
        let ready = std::mem::replace(&mut b.done, rest);
        let Some((&last, _)) = ready.last_key_value() else {
            return;
        };
        self.stats
            .unconfirmed
            .fetch_sub(ready.len() as u64, std::sync::atomic::Ordering::Relaxed);
        bump_by(
            &self.stats.counters.confirm,
            ready.values().filter(|ok| **ok).count() as u64,
        );
        if ready.values().all(|ok| *ok) {
            self.outbox.send(
                self.channel,
                &Method::BasicAck(BasicAck {
                    delivery_tag: last,
                    multiple: ready.len() > 1,
                }),
            );
            return;
        }
        self.outbox.with(|buf| {
            for (&tag, &ok) in &ready {
                let m = if ok {
                    Method::BasicAck(BasicAck {
                        delivery_tag: tag,
                        multiple: false,
                    })
                } else {
                    Method::BasicNack(BasicNack {
                        delivery_tag: tag,
                        multiple: false,
                        requeue: false,
                    })
                };
                encode_method_frame(self.channel, &m, buf);
            }
        });
    }
}

impl Completion for Confirms {
    fn complete(&self, tokens: &[u64], ok: bool) {
        {
            let mut b = self.book.lock();
            for t in tokens {
                // Settled already (confirmed early when consumers acked it, or nacked).
                if b.waiting.remove(t) {
                    b.done.insert(*t, ok);
                }
            }
        }
        self.flush();
    }
}

/// Sends tx.commit-ok once the store has fsynced the transaction's persistent messages.
pub(super) struct CommitOk {
    pub(super) channel: u16,
    pub(super) outbox: Arc<Outbox>,
}

impl Completion for CommitOk {
    fn complete(&self, _tokens: &[u64], ok: bool) {
        // Not ok only when the store closed (broker shutdown) before the transaction's
        // messages could be written: no commit-ok then.
        if ok {
            self.outbox
                .send(self.channel, &Method::TxCommitOk(TxCommitOk {}));
        }
    }
}
