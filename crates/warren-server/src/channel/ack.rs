//! basic.ack, basic.nack, basic.reject and basic.recover: settling deliveries by tag (in a
//! transaction, at tx.commit), the paged-out ones included.

use super::*;

/// An acknowledgement operation, deferred until tx.commit in transactional channels.
#[derive(Debug, Clone, Copy)]
pub(super) enum AckOp {
    Ack {
        tag: u64,
        multiple: bool,
    },
    Reject {
        tag: u64,
        multiple: bool,
        requeue: bool,
    },
}

impl Channel {
    pub(super) fn ack_op(&mut self, ctx: &Context, op: AckOp) -> MethodResult {
        if let Some(tx) = self.tx.as_mut() {
            tx.admit(&ctx.limits, 0)?;
            let (tag, multiple) = match op {
                AckOp::Ack { tag, multiple } | AckOp::Reject { tag, multiple, .. } => {
                    (tag, multiple)
                }
            };
            let st = self.shared.st.lock();
            let everything = multiple && tag == 0;
            if !everything && !st.unacked.contains_key(&tag) && !st.paged.contains(tag) {
                return Err(unknown_tag(tag));
            }
            drop(st);
            tx.acks.push(op);
            return Ok(());
        }
        self.apply_ack(op)
    }

    /// Settles unacked deliveries: ack, or reject/nack with or without requeue.
    pub(super) fn apply_ack(&mut self, op: AckOp) -> MethodResult {
        let (tag, multiple, requeue, rejected) = match op {
            AckOp::Ack { tag, multiple } => (tag, multiple, false, false),
            AckOp::Reject {
                tag,
                multiple,
                requeue,
            } => (tag, multiple, requeue, true),
        };
        let (taken, paged, upto): (Vec<Unacked>, _, _) = {
            let mut st = self.shared.st.lock();
            let (taken, paged, upto) = if multiple {
                if tag != 0 && !st.unacked.contains_key(&tag) && !st.paged.contains(tag) {
                    return Err(unknown_tag(tag));
                }
                let keep = if tag == 0 {
                    BTreeMap::new()
                } else {
                    st.unacked.split_off(&(tag + 1))
                };
                let upto = if tag == 0 { st.next_tag } else { tag };
                (
                    std::mem::replace(&mut st.unacked, keep)
                        .into_values()
                        .collect(),
                    st.paged.take_upto(upto, requeue, rejected),
                    Some(upto),
                )
            } else {
                match st.unacked.remove(&tag) {
                    Some(u) => (vec![u], Vec::new(), None),
                    None => match st.paged.remove(tag, requeue, rejected) {
                        Some(p) => (Vec::new(), vec![p], None),
                        None => return Err(unknown_tag(tag)),
                    },
                }
            };
            st.unacked_bytes -= body_bytes(&taken);
            if !rejected {
                st.tallies.acked(
                    taken
                        .iter()
                        .map(|u| &u.queue)
                        .chain(paged.iter().map(|p| &p.queue)),
                );
            }
            (taken, paged, upto)
        };
        if !rejected {
            bump_by(
                &self.shared.stats.counters.ack,
                (taken.len() + paged.len()) as u64,
            );
        }
        settle(self.shared.key, taken, requeue, rejected);
        self.settle_paged(paged, upto, requeue, rejected);
        // Freed channel-wide credit may let other queues deliver.
        let queues = {
            let st = self.shared.st.lock();
            if st.global_prefetch != 0 {
                self.consumer_queues(&st)
            } else {
                Vec::new()
            }
        };
        queues.iter().for_each(|q| q.dispatch());
        Ok(())
    }

    pub(super) fn recover(&mut self, requeue: bool) -> MethodResult {
        if !requeue {
            return Err(BrokerError::not_implemented("requeue=false"));
        }
        let (taken, paged, upto) = {
            let mut st = self.shared.st.lock();
            st.unacked_bytes = 0;
            let upto = st.next_tag;
            (
                std::mem::take(&mut st.unacked).into_values().collect(),
                st.paged.take_upto(upto, true, false),
                upto,
            )
        };
        settle(self.shared.key, taken, true, false);
        self.settle_paged(paged, Some(upto), true, false);
        Ok(())
    }

    /// Settles deliveries held paged out: `first`, then (for `upto`) the rest with a tag up to
    /// it, a chunk at a time with the channel's lock released in between (queues lock
    /// before channels).
    pub(super) fn settle_paged(
        &self,
        first: Vec<unacked::Taken>,
        upto: Option<u64>,
        requeue: bool,
        rejected: bool,
    ) {
        // Nothing paged out in the first chunk means nothing paged out up to `upto` either
        // (`take_upto` returns short chunks only at the end).
        if first.is_empty() {
            return;
        }
        let mut chunk = first;
        loop {
            let more = chunk.len() == unacked::CHUNK;
            unacked::settle(self.shared.key, chunk);
            let Some(upto) = upto.filter(|_| more) else {
                return;
            };
            chunk = self
                .shared
                .st
                .lock()
                .paged
                .take_upto(upto, requeue, rejected);
        }
    }
}

pub(super) fn body_bytes(taken: &[Unacked]) -> usize {
    taken.iter().map(|u| u.message.message.body.len()).sum()
}

pub(super) fn unknown_tag(tag: u64) -> BrokerError {
    BrokerError::precondition_failed(format!("unknown delivery tag {tag}"))
}

/// Settles `taken` deliveries with their queues, grouped per queue, requeueing when asked;
/// `rejected` for basic.reject / basic.nack (dead-lettered without `requeue`).
pub(super) fn settle(channel_key: u64, mut taken: Vec<Unacked>, requeue: bool, rejected: bool) {
    if taken.len() == 1 {
        // One delivery (basic.ack of one tag, the common case): no grouping.
        let u = taken.pop().expect("one element");
        let s = Settlement {
            consumer_tag: u.consumer_tag,
            message: u.message,
            requeue,
            rejected,
        };
        u.queue.settle(channel_key, vec![s]);
        return;
    }
    let mut by_queue: Vec<(Arc<Queue>, Vec<Settlement>)> = Vec::new();
    for u in taken {
        let s = Settlement {
            consumer_tag: u.consumer_tag,
            message: u.message,
            requeue,
            rejected,
        };
        match by_queue.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &u.queue)) {
            Some((_, v)) => v.push(s),
            None => by_queue.push((u.queue, vec![s])),
        }
    }
    for (q, s) in by_queue {
        q.settle(channel_key, s);
    }
}
