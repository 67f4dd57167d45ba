//! The delivery acknowledgement timeout (RabbitMQ's `consumer_timeout`,
//! rabbitmq.com/docs/consumers#acknowledgement-timeout): a channel whose oldest
//! unacknowledged delivery (to a consumer or by basic.get) has waited longer than the
//! timeout is closed with 406 PRECONDITION_FAILED, and what it held is requeued.
//!
//! The timeout is the delivery's queue's `x-consumer-timeout` argument or `consumer-timeout`
//! policy (the lower of the two when both are set), else the broker's
//! `amqp.consumer_timeout`, as RabbitMQ 3.12-4.2's channel resolves it; only the oldest
//! delivery is looked at, as there.
//!
//! Deliveries carry no timestamp: the delivery path stays as it was. Instead the connection
//! checks its channels periodically and each check notes the channel's last delivery tag
//! with the time ([`AckClock`]): a delivery with a tag up to a noted one was made no later
//! than that note's time, so the oldest delivery is known to have waited at least as long
//! as the time since the first note that covers its tag. A channel is thus never closed
//! early, and late by at most about one check period, which is a tenth of the smallest
//! timeout that applies (between [`MIN_PERIOD`] and [`MAX_PERIOD`]; RabbitMQ checks once a
//! minute).

use super::*;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Shortest time between two checks of a connection's channels.
pub const MIN_PERIOD: Duration = Duration::from_millis(10);

/// Longest time between two checks of a connection's channels that have something to watch
/// (RabbitMQ's `channel_tick_interval`, one minute).
pub const MAX_PERIOD: Duration = Duration::from_secs(60);

/// Most notes a channel keeps; beyond it every other one is dropped (a delivery is then
/// attributed to a later note: never closed early, at worst later).
const MAX_NOTES: usize = 64;

/// (time, last delivery tag) notes of one channel, oldest first, tags increasing; kept
/// while the channel holds unacknowledged deliveries.
#[derive(Default)]
pub(super) struct AckClock {
    notes: VecDeque<(Instant, u64)>,
}

/// What one check of a channel found.
#[derive(Debug, PartialEq, Eq)]
pub enum AckCheck {
    /// Nothing to watch: no unacknowledged delivery and no consumer that acknowledges.
    Idle,
    /// Watching: check again within `period`, or at `due` (when the oldest delivery would
    /// time out) if that is sooner.
    Watching {
        /// A tenth of the smallest timeout that applies, within 10 ms and 60 s.
        period: Duration,
        /// When the oldest delivery's timeout runs out, if one applies to it.
        due: Option<Instant>,
    },
    /// The oldest delivery waited longer than its timeout: the channel must be closed.
    TimedOut(TimedOut),
}

/// A delivery that waited too long for its acknowledgement.
#[derive(Debug, PartialEq, Eq)]
pub struct TimedOut {
    /// The timeout that applied, ms.
    pub timeout: u64,
    /// The delivery's tag.
    pub delivery_tag: u64,
    /// The consumer it went to (`None` for basic.get).
    pub consumer_tag: Option<String>,
    /// `queue 'q' in vhost 'v'`.
    pub queue: String,
}

impl TimedOut {
    /// The error the channel is closed with: RabbitMQ's 406 and reply text
    /// (`rabbit_channel:handle_consumer_timed_out`).
    pub fn error(&self, channel: u16) -> BrokerError {
        BrokerError::precondition_failed(format!(
            "delivery acknowledgement on channel {channel} timed out. Timeout value used: {} ms. \
             This timeout value can be configured, see consumers doc guide to learn more",
            self.timeout
        ))
    }
}

/// The timeout in ms that applies to deliveries of `queue` when the broker's is `global`.
pub fn timeout_for(queue: &Queue, global: Option<u64>) -> Option<u64> {
    queue.args().consumer_timeout.or(global)
}

/// A tenth of `timeout_ms`, within [`MIN_PERIOD`] and [`MAX_PERIOD`].
fn period_for(timeout_ms: u64) -> Duration {
    Duration::from_millis(timeout_ms / 10).clamp(MIN_PERIOD, MAX_PERIOD)
}

impl AckClock {
    /// Notes that deliveries up to `next_tag` were made by `now`, and forgets the notes that
    /// cover no delivery from `oldest` on. Returns the earliest time by which delivery
    /// `oldest` is known to have been made.
    fn note(&mut self, now: Instant, next_tag: u64, oldest: u64) -> Instant {
        if self.notes.back().is_none_or(|&(_, t)| t < next_tag) {
            self.notes.push_back((now, next_tag));
        }
        while self.notes.front().is_some_and(|&(_, t)| t < oldest) {
            self.notes.pop_front();
        }
        if self.notes.len() > MAX_NOTES {
            // Keep the first (it dates the oldest delivery) and the last.
            let last = self.notes.len() - 1;
            let mut i = 0;
            self.notes.retain(|_| {
                let keep = i % 2 == 0 || i == last;
                i += 1;
                keep
            });
        }
        self.notes.front().map_or(now, |&(at, _)| at)
    }

    fn clear(&mut self) {
        self.notes = VecDeque::new();
    }
}

impl Channel {
    /// Checks this channel's oldest unacknowledged delivery against its timeout (its queue's
    /// argument or policy, else the broker's `amqp.consumer_timeout`; none when neither is
    /// set) and says when to check again. Called by the connection, at most every 10 ms.
    pub fn check_ack_timeout(&mut self) -> AckCheck {
        let global = self.shared.consumer_timeout;
        // The queues are asked for their timeouts with the channel unlocked: queues lock
        // themselves before channels, never after.
        let (next_tag, oldest, consumed) = {
            let st = self.shared.st.lock();
            let in_memory: Option<unacked::HeldDelivery<'_>> = st
                .unacked
                .first_key_value()
                .map(|(tag, u)| (*tag, &u.queue, u.consumer_tag.as_ref()));
            let paged = st.paged.oldest();
            let oldest = match (in_memory, paged) {
                (Some(a), Some(b)) => Some(if a.0 < b.0 { a } else { b }),
                (a, b) => a.or(b),
            }
            .map(|(tag, q, c)| (tag, q.clone(), c.cloned()));
            let consumed: Vec<Arc<Queue>> = st
                .consumers
                .values()
                .filter(|c| c.details.as_ref().is_some_and(|d| d.ack_required))
                .map(|c| c.queue.clone())
                .collect();
            (st.next_tag, oldest, consumed)
        };
        // Read after the tags: every delivery up to `next_tag` was made by now.
        let now = Instant::now();
        let smallest = consumed
            .iter()
            .filter_map(|q| timeout_for(q.as_ref(), global))
            .min();
        let Some((tag, queue, consumer_tag)) = oldest else {
            self.ack_clock.clear();
            return match smallest {
                Some(t) => AckCheck::Watching {
                    period: period_for(t),
                    due: None,
                },
                None if consumed.is_empty() => AckCheck::Idle,
                // Consumers without a timeout: watched at the longest period, so that a
                // policy that gives their queue one is noticed.
                None => AckCheck::Watching {
                    period: MAX_PERIOD,
                    due: None,
                },
            };
        };
        let delivered_by = self.ack_clock.note(now, next_tag, tag);
        let timeout = timeout_for(queue.as_ref(), global);
        let period = match (timeout, smallest) {
            (Some(a), Some(b)) => period_for(a.min(b)),
            (Some(t), None) | (None, Some(t)) => period_for(t),
            (None, None) => MAX_PERIOD,
        };
        let Some(timeout) = timeout else {
            return AckCheck::Watching { period, due: None };
        };
        // A timeout too large to add to the time never runs out.
        let Some(due) = delivered_by.checked_add(Duration::from_millis(timeout)) else {
            return AckCheck::Watching { period, due: None };
        };
        if now >= due {
            return AckCheck::TimedOut(TimedOut {
                timeout,
                delivery_tag: tag,
                consumer_tag: consumer_tag.map(|c| c.to_string()),
                queue: queue.resource_name(),
            });
        }
        AckCheck::Watching {
            period,
            due: Some(due),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_date_the_oldest_delivery_no_earlier_than_it_was_made() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut c = AckClock::default();
        // Tags 1-3 delivered before the first check.
        assert_eq!(c.note(at(0), 3, 1), at(0));
        // Nothing new: the note of tag 3 still dates tag 1.
        assert_eq!(c.note(at(10), 3, 1), at(0));
        // Tag 4 and 5 came; tags up to 3 were acknowledged: 4 is dated by the next note.
        assert_eq!(c.note(at(20), 5, 4), at(20));
        assert_eq!(c.note(at(30), 7, 4), at(20));
        assert_eq!(c.note(at(40), 7, 6), at(30));
        // Many notes while an old delivery stays: it keeps its date.
        for i in 0..1000 {
            assert_eq!(c.note(at(50 + i), 8 + i, 6), at(30));
        }
        assert!(c.notes.len() <= MAX_NOTES + 1);
        // A later oldest delivery is dated no earlier than it was made.
        let d = c.note(at(2000), 2000, 500);
        assert!(d >= at(50 + 500 - 8), "{:?}", d - t0);
    }

    #[test]
    fn periods() {
        assert_eq!(period_for(0), MIN_PERIOD);
        assert_eq!(period_for(300), Duration::from_millis(30));
        assert_eq!(period_for(1_800_000), MAX_PERIOD);
    }
}
