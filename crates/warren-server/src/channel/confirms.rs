//! Publisher confirms (basic.ack / basic.nack to the publisher, rabbitmq.com/docs/confirms)
//! and the wait of tx.commit-ok for what the transaction published to be on disk.

use super::*;
use std::collections::HashSet;

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

/// Sends tx.commit-ok once everything a transaction did is on disk: each publish's own
/// completion (the store's fsync of its message, each quorum queue's commit of it, as for a
/// publisher confirm) and, when the store wrote anything, a barrier that also covers the
/// transaction's acknowledgements.
///
/// RabbitMQ's channel waits for the same confirms before tx.commit-ok; when one of them fails
/// (a nack: the store or a quorum queue could not take the message), the channel is closed
/// with 406 PRECONDITION_FAILED "partial tx completion" (`rabbit_channel:complete_tx`).
pub(super) struct CommitWait {
    channel: u16,
    outbox: Arc<Outbox>,
    state: Mutex<CommitState>,
}

#[derive(Default)]
struct CommitState {
    /// Tokens (a publish's 1-based index in the transaction; 0 for the barrier) not yet
    /// completed.
    pending: HashSet<u64>,
    /// Every part has been handed out: the commit ends when `pending` empties.
    sealed: bool,
    /// A part failed.
    failed: bool,
    /// tx.commit-ok or the channel's close was sent.
    ended: bool,
}

/// How a transaction's commit ended, as the channel sees it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum CommitEnd {
    /// Still waiting for a part.
    Waiting,
    /// tx.commit-ok was sent.
    Committed,
    /// A part failed: channel.close was sent.
    Failed,
}

impl CommitWait {
    pub(super) fn new(channel: u16, outbox: Arc<Outbox>) -> Self {
        CommitWait {
            channel,
            outbox,
            state: Mutex::new(CommitState::default()),
        }
    }

    /// Notes that part `token` will be completed.
    pub(super) fn expect(&self, token: u64) {
        self.state.lock().pending.insert(token);
    }

    /// Every part has been handed out: ends the commit now if none is pending.
    pub(super) fn seal(&self) {
        let end = {
            let mut st = self.state.lock();
            st.sealed = true;
            Self::take_end(&mut st)
        };
        self.send(end);
    }

    /// How the commit stands.
    pub(super) fn end(&self) -> CommitEnd {
        let st = self.state.lock();
        match (st.ended, st.failed) {
            (false, _) => CommitEnd::Waiting,
            (true, false) => CommitEnd::Committed,
            (true, true) => CommitEnd::Failed,
        }
    }

    /// `Some(ok)` when the commit ends now (marked ended).
    fn take_end(st: &mut CommitState) -> Option<bool> {
        if st.ended || !st.sealed || !st.pending.is_empty() {
            return None;
        }
        st.ended = true;
        Some(!st.failed)
    }

    fn send(&self, end: Option<bool>) {
        match end {
            None => {}
            Some(true) => self
                .outbox
                .send(self.channel, &Method::TxCommitOk(TxCommitOk {})),
            Some(false) => {
                let e = BrokerError::precondition_failed("partial tx completion");
                self.outbox.send(
                    self.channel,
                    &Method::ChannelClose(ChannelClose {
                        reply_code: e.code,
                        reply_text: e.reply_text(),
                        class_id: TxCommit::CLASS_ID,
                        method_id: TxCommit::METHOD_ID,
                    }),
                );
            }
        }
    }
}

impl Completion for CommitWait {
    fn complete(&self, tokens: &[u64], ok: bool) {
        let end = {
            let mut st = self.state.lock();
            // A part may be completed twice (confirmed early when consumers acked it, then
            // by the fsync): only the first counts.
            let mut any = false;
            for t in tokens {
                any |= st.pending.remove(t);
            }
            if any && !ok {
                st.failed = true;
            }
            Self::take_end(&mut st)
        };
        self.send(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_amqp::frame::{parse_frame, Frame, Limits};

    fn sent(outbox: &Outbox) -> Vec<Method> {
        let mut buf = outbox.with(|b| b.split());
        let mut out = Vec::new();
        while let Some(f) = parse_frame(&mut buf, &Limits::default()).expect("frame") {
            if let Frame::Method { method, .. } = f {
                out.push(method);
            }
        }
        out
    }

    #[test]
    fn commit_ok_waits_for_every_part_and_the_seal() {
        let outbox = Arc::new(Outbox::new());
        let wait = CommitWait::new(3, outbox.clone());
        wait.expect(1);
        wait.expect(2);
        wait.complete(&[1], true);
        wait.complete(&[2], true);
        assert_eq!(wait.end(), CommitEnd::Waiting, "not sealed yet");
        assert!(sent(&outbox).is_empty());
        wait.seal();
        assert_eq!(wait.end(), CommitEnd::Committed);
        assert!(matches!(sent(&outbox)[..], [Method::TxCommitOk(_)]));
        // A late second completion of a part (confirmed early, then fsynced) sends nothing.
        wait.complete(&[1], true);
        assert!(sent(&outbox).is_empty());
    }

    #[test]
    fn a_failed_part_closes_the_channel_with_partial_tx_completion() {
        let outbox = Arc::new(Outbox::new());
        let wait = CommitWait::new(3, outbox.clone());
        wait.expect(1);
        wait.expect(2);
        wait.seal();
        wait.complete(&[2], false);
        assert_eq!(wait.end(), CommitEnd::Waiting);
        wait.complete(&[1], true);
        assert_eq!(wait.end(), CommitEnd::Failed);
        match &sent(&outbox)[..] {
            [Method::ChannelClose(c)] => {
                assert_eq!(c.reply_code, 406);
                assert_eq!(
                    c.reply_text.as_str(),
                    "PRECONDITION_FAILED - partial tx completion"
                );
                assert_eq!((c.class_id, c.method_id), (90, 20));
            }
            other => panic!("expected channel.close, got {other:?}"),
        }
    }
}
