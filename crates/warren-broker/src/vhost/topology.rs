//! A vhost's topology (exchanges, queues, binding count, policies) under its lock, and the
//! undo steps that put a change back when it cannot be stored.

use crate::error::BrokerError;

use crate::exchange::{Binding, Destination, Exchange};
use crate::policy::Target;
use crate::queue::{Queue, SweepSet};
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Default)]
pub(super) struct Topology {
    pub(super) exchanges: HashMap<String, Exchange>,
    /// Keyed by the queue's name: its [`crate::QueueBackend::shared_name`] when it was
    /// inserted (a queue that replaces another of the same name keeps the old key).
    pub(super) queues: HashMap<Arc<str>, Arc<Queue>>,
    /// Bindings of all exchanges, for the binding limit.
    pub(super) bindings: usize,
    /// Policies and operator policies.
    pub(super) policies: crate::policy::Policies,
}

impl Topology {
    pub(super) fn queue_is_durable(&self, name: &str) -> bool {
        self.queues
            .get(name)
            .is_some_and(|q| q.durable() && q.exclusive_owner().is_none())
    }

    /// `d` naming its queue with the name the queue is kept under, when the queue exists:
    /// every binding to a queue then shares the queue's one copy of its name.
    pub(super) fn shared(&self, d: Destination) -> Destination {
        match d {
            Destination::Queue(q) => match self.queues.get_key_value(&*q) {
                Some((name, _)) => Destination::Queue(name.clone()),
                None => Destination::Queue(q),
            },
            x => x,
        }
    }

    pub(super) fn exchange_is_durable(&self, name: &str) -> bool {
        self.exchanges.get(name).is_some_and(|x| x.durable)
    }

    pub(super) fn destination_is_durable(&self, d: &Destination) -> bool {
        match d {
            Destination::Queue(q) => self.queue_is_durable(q),
            Destination::Exchange(x) => self.exchange_is_durable(x),
        }
    }

    /// Removes an exchange, its bindings as a source and as a destination, and then any
    /// auto-delete exchange left without bindings; records each removal in `undo`.
    pub(super) fn remove_exchange(&mut self, name: &str, undo: &mut Undo) {
        if let Some(x) = self.exchanges.remove(name) {
            self.bindings -= x.binding_count();
            undo.durable |= x.durable;
            undo.steps.push(Removed::Exchange(x));
        }
        self.unbind_everywhere(&Destination::Exchange(name.into()), undo);
    }

    /// Removes a queue and its bindings, and then any auto-delete exchange left without
    /// bindings; records each removal in `undo`.
    pub(super) fn remove_queue(&mut self, name: &str, undo: &mut Undo) {
        let name = match self.queues.remove_entry(name) {
            Some((key, q)) => {
                undo.durable |= q.durable() && q.exclusive_owner().is_none();
                undo.steps.push(Removed::Queue(q));
                key
            }
            None => name.into(),
        };
        self.unbind_everywhere(&Destination::Queue(name), undo);
    }

    /// Removes every binding to `dest` (removed destinations were recorded as durable when
    /// they were, which covers their bindings).
    pub(super) fn unbind_everywhere(&mut self, dest: &Destination, undo: &mut Undo) {
        let mut emptied = Vec::new();
        for x in self.exchanges.values_mut() {
            let gone = x.unbind_destination(dest);
            if gone.is_empty() {
                continue;
            }
            self.bindings -= gone.len();
            for b in gone {
                undo.steps.push(Removed::Binding(x.name.clone(), b));
            }
            if x.auto_delete && x.binding_count() == 0 {
                emptied.push(x.name.clone());
            }
        }
        for name in emptied {
            self.remove_exchange(&name, undo);
        }
    }

    /// Puts back what a change removed, newest first (the change could not be stored). A
    /// queue whose settings change back joins `sweeps` (see [`Topology::reapply_policies`]).
    pub(super) fn rollback(&mut self, undo: Undo, sweeps: &SweepSet) {
        for step in undo.steps.into_iter().rev() {
            match step {
                Removed::AddedExchange(name) => {
                    if let Some(x) = self.exchanges.remove(&name) {
                        self.bindings -= x.binding_count();
                    }
                }
                Removed::AddedQueue(q) => {
                    if self
                        .queues
                        .get(q.name())
                        .is_some_and(|o| Arc::ptr_eq(o, &q))
                    {
                        self.queues.remove(q.name());
                    }
                }
                Removed::AddedBinding(source, b) => {
                    if let Some(x) = self.exchanges.get_mut(&source) {
                        self.bindings -= usize::from(x.unbind(&b));
                    }
                }
                Removed::Exchange(mut x) => {
                    // Policies may have changed since it was removed.
                    x.apply_policy(self.policies.applied(&x.name, Target::Exchange));
                    self.bindings += x.binding_count();
                    self.exchanges.insert(x.name.clone(), x);
                }
                Removed::Binding(source, b) => {
                    if let Some(x) = self.exchanges.get_mut(&source) {
                        self.bindings += usize::from(x.bind(b));
                    }
                }
                Removed::Queue(q) => {
                    if q.apply_policy(self.policies.applied(q.name(), Target::Queue(q.kind()))) {
                        sweeps.add(&q);
                    }
                    self.queues.insert(q.shared_name(), q);
                }
                Removed::Policy {
                    operator,
                    name,
                    previous,
                } => {
                    let list = self.policies.of_mut(operator);
                    match previous {
                        Some(p) => list.insert(name, p),
                        None => list.remove(&name),
                    };
                    self.reapply_policies(sweeps);
                }
            }
        }
    }
}

/// What a topology change removed, so that it can be put back when the change cannot be
/// stored.
#[derive(Default)]
pub(crate) struct Undo {
    pub(super) steps: Vec<Removed>,
    /// Something durable was removed: the definitions must be saved.
    pub(super) durable: bool,
}

impl Undo {
    /// Undoes one addition.
    pub(super) fn added(step: Removed) -> Self {
        Undo {
            steps: vec![step],
            durable: true,
        }
    }
}

pub(crate) enum Removed {
    /// An exchange a declare added.
    AddedExchange(String),
    /// A queue a declare added.
    AddedQueue(Arc<Queue>),
    /// A binding a bind added to the named source exchange.
    AddedBinding(String, Binding),
    Exchange(Exchange),
    /// A binding removed from the named source exchange.
    Binding(String, Binding),
    Queue(Arc<Queue>),
    /// A policy a change replaced or removed (`None`: it added it).
    Policy {
        /// An operator policy.
        operator: bool,
        /// Its name.
        name: String,
        /// What was there before.
        previous: Option<crate::policy::Policy>,
    },
}

/// 541 INTERNAL_ERROR for a topology change refused because the definitions could not be
/// stored: RabbitMQ answers a metadata store failure (a Khepri timeout) with this code and a
/// text such as `failed to declare exchange 'x' in vhost '/' because the operation timed out`.
pub(super) fn not_stored(what: &str, e: &dyn std::fmt::Display) -> BrokerError {
    BrokerError::internal(format!(
        "{what} because the definitions could not be stored: {e}"
    ))
}
