//! Caps on what a vhost may hold, so that no client can grow the broker's topology without
//! bound: queues (RabbitMQ's `max-queues` vhost limit), exchanges and bindings.
//!
//! A declare or bind that would go past a cap fails with 406 PRECONDITION_FAILED and
//! changes nothing; redeclaring an existing queue or exchange and repeating an existing
//! binding still succeed at the cap. Definitions recovered at start are never refused.

use crate::error::BrokerError;

/// Per-vhost caps. A negative value means no limit and 0 allows none, as in RabbitMQ's vhost
/// limits (`rabbitmqctl set_vhost_limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most queues per vhost (exclusive and server-named ones included).
    pub max_queues: i64,
    /// Most exchanges per vhost, not counting the pre-declared default and `amq.*` ones.
    pub max_exchanges: i64,
    /// Most bindings per vhost, queue and exchange-to-exchange bindings together.
    pub max_bindings: i64,
    /// Most topic-trie nodes visited to route one message (all topic exchanges it passes and
    /// all its routing keys together). Real binding sets need tens to hundreds; a message
    /// that needs more is refused with 406 rather than holding a worker and the vhost's
    /// topology lock (about 10 ms for 100,000 visits of a hostile trie).
    pub topic_match_budget: i64,
}

impl Default for Limits {
    /// 100,000 queues, 10,000 exchanges and 1,000,000 bindings per vhost; 100,000 topic
    /// match steps per message.
    fn default() -> Self {
        Limits {
            max_queues: 100_000,
            max_exchanges: 10_000,
            max_bindings: 1_000_000,
            topic_match_budget: 100_000,
        }
    }
}

impl Limits {
    /// No limits at all.
    pub fn unlimited() -> Self {
        Limits {
            max_queues: -1,
            max_exchanges: -1,
            max_bindings: -1,
            topic_match_budget: -1,
        }
    }

    /// The topic match budget in trie nodes (unlimited for a negative setting).
    pub fn topic_budget(&self) -> usize {
        usize::try_from(self.topic_match_budget).unwrap_or(usize::MAX)
    }
}

/// True when `count` existing items leave no room under `limit`.
fn reached(limit: i64, count: usize) -> bool {
    limit >= 0 && count as u64 >= limit as u64
}

/// Refuses a new queue `queue` in vhost `vhost` that holds `count` queues, with RabbitMQ's
/// text: `cannot declare queue 'q': queue limit in vhost '/' (N) is reached`.
pub fn check_queue(limits: &Limits, vhost: &str, queue: &str, count: usize) -> crate::Result<()> {
    if !reached(limits.max_queues, count) {
        return Ok(());
    }
    Err(BrokerError::precondition_failed(format!(
        "cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({}) is reached",
        limits.max_queues
    )))
}

/// Refuses a new exchange with RabbitMQ's wording for its exchange limit: `cannot declare
/// exchange 'x' in vhost '/': exchange limit of N is reached`.
pub fn check_exchange(
    limits: &Limits,
    vhost: &str,
    exchange: &str,
    count: usize,
) -> crate::Result<()> {
    if !reached(limits.max_exchanges, count) {
        return Ok(());
    }
    Err(BrokerError::precondition_failed(format!(
        "cannot declare {}: exchange limit of {} is reached",
        crate::error::resource("exchange", exchange, vhost),
        limits.max_exchanges
    )))
}

/// Refuses a new binding (RabbitMQ has no binding limit; the text follows its exchange
/// limit's): `cannot bind queue 'q' in vhost '/' to exchange 'x' in vhost '/': binding
/// limit of N is reached`.
pub fn check_binding(
    limits: &Limits,
    vhost: &str,
    source: &str,
    destination: &crate::Destination,
    count: usize,
) -> crate::Result<()> {
    if !reached(limits.max_bindings, count) {
        return Ok(());
    }
    let kind = match destination {
        crate::Destination::Queue(_) => "queue",
        crate::Destination::Exchange(_) => "exchange",
    };
    Err(BrokerError::precondition_failed(format!(
        "cannot bind {} to {}: binding limit of {} is reached",
        crate::error::resource(kind, destination.name(), vhost),
        crate::error::resource("exchange", source, vhost),
        limits.max_bindings
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_and_thresholds() {
        let l = Limits {
            max_queues: 2,
            max_exchanges: 0,
            max_bindings: -1,
            topic_match_budget: -1,
        };
        assert_eq!(l.topic_budget(), usize::MAX);
        assert!(check_queue(&l, "/", "q", 1).is_ok());
        let e = check_queue(&l, "/", "q", 2).unwrap_err();
        assert_eq!(e.code, 406);
        assert_eq!(
            e.text,
            "cannot declare queue 'q': queue limit in vhost '/' (2) is reached"
        );
        assert_eq!(
            check_exchange(&l, "/", "x", 0).unwrap_err().text,
            "cannot declare exchange 'x' in vhost '/': exchange limit of 0 is reached"
        );
        assert!(check_binding(
            &l,
            "/",
            "x",
            &crate::Destination::Queue("q".into()),
            1 << 40
        )
        .is_ok());
        let l = Limits {
            max_bindings: 1,
            ..l
        };
        assert_eq!(
            check_binding(&l, "/", "x", &crate::Destination::Queue("q".into()), 1)
                .unwrap_err()
                .text,
            "cannot bind queue 'q' in vhost '/' to exchange 'x' in vhost '/': binding limit of 1 is reached"
        );
    }
}
