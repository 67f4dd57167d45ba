//! The leader's side of a quorum queue: handing ready messages to consumers and basic.get,
//! length limits, expiry at the head, and the delivery horizon (see [`crate::state`]).

use super::*;

impl QuorumQueue {
    /// Drops from the head while the ready messages are over `x-max-length(-bytes)`, with
    /// overflow drop-head.
    pub(super) fn enforce_limits_locked(&self, st: &mut Inner, props: &mut Proposals) {
        let args = self.args();
        if args.overflow != Overflow::DropHead
            || (args.max_length.is_none() && args.max_length_bytes.is_none())
        {
            return;
        }
        let mut count = st.ready_count() as u64;
        let mut bytes = st.qs.ready_bytes();
        let over = |count: u64, bytes: u64| {
            args.max_length.is_some_and(|m| count > m)
                || args.max_length_bytes.is_some_and(|m| bytes > m)
        };
        let mut drop = Vec::new();
        for k in st.qs.ready().iter() {
            if !over(count, bytes) {
                break;
            }
            if st.out.contains_key(k) {
                continue;
            }
            if let Some(m) = st.qs.get(*k) {
                count -= 1;
                bytes = bytes.saturating_sub(m.message.body.len() as u64);
                drop.push(*k);
            }
        }
        for k in &drop {
            st.out.insert(*k, Out::Dropping);
        }
        props.maxlen.extend(drop);
    }

    /// When message `m` expires (ms since the epoch), if it does.
    pub(super) fn deadline(&self, m: &QMsg) -> Option<u64> {
        let own = m
            .message
            .properties
            .expiration
            .as_ref()
            .and_then(|e| warren_broker::args::parse_expiration(e.as_str()?).ok());
        let ttl = match (self.args().message_ttl, own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }?;
        Some(m.enqueued_ms.saturating_add(ttl))
    }

    /// The next ready message not handed out, from key `from` on.
    pub(super) fn next_ready(st: &Inner, from: u64) -> Option<u64> {
        st.qs
            .ready()
            .range(from..)
            .find(|k| !st.out.contains_key(k))
            .copied()
    }

    /// Checks message `key` before it is handed out: expired ones are proposed for dropping,
    /// one beyond the horizon asks for a further horizon. Returns true when it may go.
    pub(super) fn may_hand_out(
        &self,
        st: &mut Inner,
        key: u64,
        now: u64,
        props: &mut Proposals,
    ) -> Option<bool> {
        let m = st.qs.get(key)?;
        if self.deadline(m).is_some_and(|d| d <= now) {
            st.out.insert(key, Out::Dropping);
            props.expired.push(key);
            return Some(false);
        }
        if !m.redelivered && key > st.qs.horizon() {
            Self::extend_horizon(st, key, props);
            return None;
        }
        Some(true)
    }

    /// Keeps the horizon a step ahead of `position` (the first message not yet handed out),
    /// so that deliveries rarely wait for it.
    pub(super) fn extend_horizon(st: &mut Inner, position: u64, props: &mut Proposals) {
        if position + HORIZON_STEP / 2 > st.horizon_asked {
            let h = position + HORIZON_STEP;
            st.horizon_asked = h;
            props.horizon = Some(h);
        }
    }

    /// [`Self::extend_horizon`] from the first ready message not handed out.
    pub(super) fn keep_horizon_ahead(st: &mut Inner, props: &mut Proposals) {
        if !st.leading() {
            return;
        }
        let position = Self::next_ready(st, 0).unwrap_or_else(|| st.qs.next_key());
        Self::extend_horizon(st, position, props);
    }

    /// Delivers ready messages to consumers with credit (the leader only).
    pub(super) fn dispatch_locked(&self, st: &mut Inner, this: &Arc<Queue>, props: &mut Proposals) {
        Self::keep_horizon_ahead(st, props);
        if !st.leading() || st.consumers.is_empty() {
            return;
        }
        let now = self.clock.now_ms();
        let sac = self.args().single_active_consumer;
        let mut refused = vec![false; st.consumers.len()];
        let mut from = 0;
        while let Some(key) = Self::next_ready(st, from) {
            from = key + 1;
            match self.may_hand_out(st, key, now, props) {
                None => break,
                Some(false) => continue,
                Some(true) => {}
            }
            // Highest priority first, round-robin among equals; with a single active
            // consumer only the first registered one.
            let n = st.consumers.len();
            let candidates: Vec<usize> = if sac {
                vec![0]
            } else {
                let top = st
                    .consumers
                    .iter()
                    .enumerate()
                    .filter(|(i, c)| !refused[*i] && c.has_credit())
                    .map(|(_, c)| c.priority)
                    .max();
                let Some(top) = top else { break };
                (0..n)
                    .map(|i| (st.next_consumer + i) % n)
                    .filter(|i| st.consumers[*i].priority == top)
                    .collect()
            };
            let mut handed = false;
            for i in candidates {
                if refused[i] || !st.consumers[i].has_credit() {
                    continue;
                }
                let m = st.qs.get(key).expect("ready key is held");
                let qm = QueuedMessage {
                    seq: key,
                    message: with_delivery_count(m),
                    redelivered: m.redelivered,
                    stored: None,
                    expires_at: self.deadline(m),
                };
                let redelivered = m.redelivered;
                let count = m.delivery_count;
                let c = &mut st.consumers[i];
                let holder = match c.remote {
                    Some((node, consumer)) => Out::Remote { node, consumer },
                    None => Out::Delivered,
                };
                let no_ack = c.c.no_ack;
                match c.c.target.deliver(this, &c.c.tag, no_ack, qm) {
                    Ok(()) => {
                        if !no_ack {
                            c.in_flight += 1;
                        }
                        st.next_consumer = (i + 1) % n;
                        st.out.insert(key, holder);
                        if no_ack {
                            props.acked.push(key);
                        } else {
                            props.checkout.push((key, count));
                        }
                        self.deliveries.fetch_add(1, Ordering::Relaxed);
                        if redelivered {
                            self.stats.redeliver.fetch_add(1, Ordering::Relaxed);
                        }
                        handed = true;
                        break;
                    }
                    Err(_) => refused[i] = true,
                }
            }
            if !handed {
                break;
            }
        }
    }
}
