//! Virtual hosts: the exchanges, queues and bindings of one namespace.
//!
//! All topology changes (declare, delete, bind) take the vhost's write lock; routing a publish
//! takes the read lock only, so publishers on different connections route in parallel.
//!
//! This file holds the [`VHost`] itself and its housekeeping; each concept has a file below
//! `vhost/`: `exchanges.rs`, `queues.rs` and `bindings.rs` (the topology operations),
//! `topology.rs` (the tables under the lock and the undo steps of a change that could not be
//! stored), `publish.rs` and `routing.rs` (a message's way to its queues), `reply_to.rs` (direct
//! reply-to), `dead_letters.rs`, `delaying.rs` (delayed-message exchanges), `policies.rs`, and
//! `durable.rs` with [`log`] (the definitions on disk). The [`Broker`](crate::Broker) that
//! holds every vhost is in [`crate::broker`].

use crate::clock::{Clock, SystemClock};
use crate::delayed::{self, Body, Held};
use crate::error::{resource, BrokerError, Result};
mod delaying;
mod durable;
pub mod log;
mod policies;
mod routing;

use crate::exchange::{Binding, Destination, Exchange, ExchangeKind};
use crate::limits::Limits;
use crate::log_limit::LogLimit;
use crate::message::Message;
use crate::persist::{get_bool, get_str, get_table, s, Persistence};
use crate::queue::{Backing, ClassicQueue, Queue, QueueKind, SweepSet};
use crate::sender_selected::SenderKeys;
use log::TopologyCommand;
use parking_lot::RwLock;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use warren_amqp::table::{FieldTable, FieldValue};
mod bindings;
mod dead_letters;
mod exchanges;
mod publish;
mod queues;
mod reply_to;
mod topology;

pub(crate) use exchanges::{check_new_exchange_name, default_exchange_refused};
pub use exchanges::{ExchangeDeclare, ExchangeSnapshot};
pub use publish::{PublishError, Published};
pub use queues::QueueDeclare;
pub(crate) use queues::{decide_queue_name, finish_queue_delete};
use reply_to::ReplyConsumer;
pub use reply_to::REPLY_TO;
use topology::Topology;
pub(crate) use topology::{Removed, Undo};

/// A virtual host.
pub struct VHost {
    /// The vhost's name (`/` by default); its queues share this copy.
    pub name: Arc<str>,
    topology: RwLock<Topology>,
    persist: Option<Arc<Persistence>>,
    ids: Arc<AtomicU64>,
    clock: Arc<dyn Clock>,
    /// This vhost, for its queues to re-publish dead letters through.
    me: Weak<VHost>,
    /// Direct reply-to consumers, by the name their requests carry in `reply_to`.
    reply_consumers: parking_lot::Mutex<HashMap<String, ReplyConsumer>>,
    /// Stands in for a queue in deliveries to direct reply-to consumers (never routed to).
    reply_queue: Arc<Queue>,
    /// The stored definitions may differ from the ones in memory (a save failed): the next
    /// sweep writes them again.
    defs_dirty: std::sync::atomic::AtomicBool,
    /// Where the durable definitions log stands (see [`log`]).
    defs_log: parking_lot::Mutex<log::LogState>,
    /// Recovery only: how many `RemoveQueue` commands per queue name the replay has still to
    /// apply (see [`VHost::expect_removes`]). A leaf lock.
    replay_removes: parking_lot::Mutex<HashMap<String, usize>>,
    /// No retry of a failed save before this instant.
    defs_retry_at: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Messages held by delayed-message exchanges, by due time.
    delayed: parking_lot::Mutex<delayed::Schedule>,
    /// Caps on queues, exchanges and bindings (shared with the broker).
    limits: Arc<RwLock<Limits>>,
    /// The vhost was deleted: nothing of it is written to disk any more.
    removed: std::sync::atomic::AtomicBool,
    /// Kinds of queue other than classic, by `x-queue-type` (see [`VHost::set_queue_kind`]).
    queue_kinds: RwLock<HashMap<String, Arc<dyn QueueKind>>>,
    /// Where queues created and deleted are counted (the broker's registry's).
    churn: Arc<crate::registry::ChurnCounters>,
    /// The queues the sweep visits: those with something to do (see [`SweepSet`]).
    sweeps: Arc<SweepSet>,
    /// The queues that may hold messages (see [`VHost::used_queues`]).
    used: Arc<crate::queue::UsedSet>,
    /// Sweeps so far; every [`FULL_SWEEP_EVERY`]th visits every queue.
    sweep_rounds: AtomicU64,
    /// Where durable topology changes made here are replicated, in a cluster (the broker's).
    replicator: crate::replica::ReplicatorSlot,
}

/// Every this many sweeps (1 minute at the broker's 50 ms), the sweep also visits every queue
/// that may hold messages ([`VHost::used_queues`]), not only those in the sweep set: a bound on
/// how late anything missed by the set is seen (a queue held by another node re-sends its
/// consumers there after a failed attempt only then). A queue that never held a message has
/// nothing to sweep that the set does not follow (its `x-expires` from its declare, a policy
/// from its application), so idle queues are left out. Not more often, because it touches
/// each queue's memory: about 0.5 µs of CPU per queue.
const FULL_SWEEP_EVERY: u64 = 1200;

/// Every this many full passes (10 minutes), the sweep visits every queue, idle ones too: the
/// bound on how late a state that neither set follows would be seen. About 50 ms of CPU with
/// 100,000 queues, once in 10 minutes.
const ALL_QUEUES_EVERY: u64 = 10;

/// The exchanges every vhost has from the start: they do not count against the exchange
/// limit and cannot be deleted.
const STANDARD_EXCHANGES: [(&str, ExchangeKind); 6] = [
    ("", ExchangeKind::Direct),
    ("amq.direct", ExchangeKind::Direct),
    ("amq.fanout", ExchangeKind::Fanout),
    ("amq.topic", ExchangeKind::Topic),
    ("amq.headers", ExchangeKind::Headers),
    ("amq.match", ExchangeKind::Headers),
];

impl VHost {
    /// A vhost with the default exchange and `amq.direct`, `amq.fanout`, `amq.topic`,
    /// `amq.headers` and `amq.match`, all durable, as RabbitMQ pre-declares them.
    pub fn new(name: &str) -> Self {
        let mut topo = Topology::default();
        for (n, k) in STANDARD_EXCHANGES {
            topo.exchanges.insert(
                n.into(),
                Exchange::new(n, k, true, false, false, FieldTable::new()),
            );
        }
        VHost {
            name: name.into(),
            topology: RwLock::new(topo),
            persist: None,
            ids: Arc::new(AtomicU64::new(1)),
            clock: Arc::new(SystemClock),
            me: Weak::new(),
            reply_consumers: parking_lot::Mutex::new(HashMap::new()),
            reply_queue: Arc::new(ClassicQueue::new(
                REPLY_TO,
                name,
                false,
                None,
                false,
                FieldTable::new(),
            )),
            defs_dirty: std::sync::atomic::AtomicBool::new(false),
            defs_log: parking_lot::Mutex::new(log::LogState::default()),
            replay_removes: parking_lot::Mutex::new(HashMap::new()),
            defs_retry_at: parking_lot::Mutex::new(None),
            delayed: parking_lot::Mutex::new(delayed::Schedule::default()),
            limits: Arc::default(),
            removed: std::sync::atomic::AtomicBool::new(false),
            queue_kinds: RwLock::new(HashMap::new()),
            churn: Arc::default(),
            sweeps: Arc::default(),
            used: Arc::default(),
            sweep_rounds: AtomicU64::new(0),
            replicator: Arc::default(),
        }
    }

    /// This vhost as a part of a broker: with the broker's message store and definitions
    /// (`persist`, `None` in memory), message ids, clock and per-vhost caps, and `me`, the
    /// handle its queues re-publish dead letters through.
    pub(crate) fn attached(
        mut self,
        persist: Option<Arc<Persistence>>,
        ids: Arc<AtomicU64>,
        clock: Arc<dyn Clock>,
        limits: Arc<RwLock<Limits>>,
        me: Weak<VHost>,
    ) -> VHost {
        self.persist = persist;
        self.ids = ids;
        self.clock = clock;
        self.limits = limits;
        self.me = me;
        self
    }

    /// This vhost counting the queues it creates and deletes in `churn` (the broker's
    /// registry's [`crate::registry::ChurnCounters`]).
    pub(crate) fn counting_churn_in(mut self, churn: Arc<crate::registry::ChurnCounters>) -> VHost {
        self.churn = churn;
        self
    }

    /// This vhost handing its durable topology changes to `slot`'s replicator once one is
    /// set (the broker's, see [`crate::replica`]).
    pub(crate) fn replicating_to(mut self, slot: crate::replica::ReplicatorSlot) -> VHost {
        self.replicator = slot;
        self
    }

    /// The durable queue `name`, if the vhost has one (recovery hands it its messages).
    pub(crate) fn durable_queue(&self, name: &str) -> Option<Arc<Queue>> {
        self.topology
            .read()
            .queues
            .get(name)
            .filter(|q| q.durable())
            .cloned()
    }

    /// Empties the vhost for its deletion: marks it removed (nothing of it is written any
    /// more), drops its exchanges, bindings and delayed messages, and returns its queues for
    /// the caller to finish deleting.
    pub(crate) fn clear_for_removal(&self) -> Vec<Arc<Queue>> {
        let queues = {
            let mut topo = self.topology.write();
            self.removed.store(true, Ordering::Release);
            let queues = topo.queues.drain().map(|(_, q)| q).collect();
            topo.exchanges.clear();
            topo.bindings = 0;
            queues
        };
        // Persistent messages it held stay in the store until the next start, which drops
        // them with the vhost gone.
        *self.delayed.lock() = delayed::Schedule::default();
        queues
    }

    /// Periodic housekeeping: retries a failed save of the durable definitions (at most once a
    /// second), routes the delayed messages whose delay is over, expires messages at the head
    /// of each queue and deletes the queues unused for longer than their `x-expires`.
    ///
    /// Only the queues with something to sweep are visited (see [`SweepSet`]), every
    /// [`FULL_SWEEP_EVERY`]th time those that may hold messages too, and every
    /// [`ALL_QUEUES_EVERY`]th of those times all of them: a vhost with many idle queues does
    /// next to nothing for them here.
    pub fn sweep(&self) {
        self.retry_save();
        self.release_delayed();
        let round = self.sweep_rounds.fetch_add(1, Ordering::Relaxed) + 1;
        let queues = if round.is_multiple_of(FULL_SWEEP_EVERY * ALL_QUEUES_EVERY) {
            self.queues()
        } else {
            self.sweep_targets(round.is_multiple_of(FULL_SWEEP_EVERY))
        };
        for q in queues {
            if q.sweep() {
                self.remove_queue(&q);
            }
            self.sweeps.settle(&q);
        }
    }

    /// The queues a sweep visits: the sweep set, and with `full` every queue that may hold
    /// messages as well, each once.
    fn sweep_targets(&self, full: bool) -> Vec<Arc<Queue>> {
        let mut queues = self.sweeps.snapshot();
        if full {
            let addr = |q: &Arc<Queue>| Arc::as_ptr(q) as *const () as usize;
            let listed: std::collections::HashSet<usize> = queues.iter().map(addr).collect();
            queues.extend(
                self.used_queues()
                    .into_iter()
                    .filter(|q| !listed.contains(&addr(q))),
            );
        }
        queues
    }

    /// How many queues the sweep visits now (the others have nothing to sweep).
    pub fn swept_queues(&self) -> usize {
        self.sweeps.len()
    }

    /// A fresh message id, increasing across the broker.
    fn next_id(&self) -> u64 {
        match &self.persist {
            Some(p) => p.store.next_id(),
            None => self.ids.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn backing(&self) -> Option<Backing> {
        self.persist.as_ref().map(|p| Backing {
            store: p.store.clone(),
            paging: p.paging.clone(),
            spill: p.spill_number(),
        })
    }

    fn exchange_resource(&self, name: &str) -> String {
        resource("exchange", name, &self.name)
    }

    fn queue_resource(&self, name: &str) -> String {
        resource("queue", name, &self.name)
    }

    fn destination_resource(&self, d: &Destination) -> String {
        match d {
            Destination::Queue(q) => self.queue_resource(q),
            Destination::Exchange(x) => self.exchange_resource(x),
        }
    }

    fn no_exchange(&self, name: &str) -> BrokerError {
        BrokerError::not_found(format!("no {}", self.exchange_resource(name)))
    }

    fn no_queue(&self, name: &str) -> BrokerError {
        BrokerError::not_found(format!("no {}", self.queue_resource(name)))
    }
}

#[cfg(test)]
#[path = "vhost_tests.rs"]
mod tests;
