//! queue.declare, queue.delete, purge, exclusive queues and consumers on a vhost.

use crate::args::QueueArgs;
use crate::error::{BrokerError, Result};

use super::log::TopologyCommand;
use super::topology::{Removed, Undo};
use super::VHost;
use crate::equivalence::{check_args, check_field, EQUIVALENT_QUEUE_ARGS};
use crate::limits;
use crate::names;
use crate::policy::Target;
use crate::queue::{queue_type, ClassicQueue, Consumer, Queue, QueueCounts, QueueKind, QueueSpec};
use std::sync::Arc;
use warren_amqp::table::FieldTable;

/// The flags and arguments of queue.declare.
#[derive(Debug, Clone, Default)]
pub struct QueueDeclare {
    /// Queue name; empty asks the server for an `amq.gen-…` name.
    pub name: String,
    /// Only check that the queue exists.
    pub passive: bool,
    /// Survives restarts.
    pub durable: bool,
    /// Owned by the declaring connection and deleted with it.
    pub exclusive: bool,
    /// Deleted when its last consumer goes.
    pub auto_delete: bool,
    /// Arguments (`x-…`).
    pub arguments: FieldTable,
}

impl VHost {
    /// Builds a queue of this vhost, of the kind its `x-queue-type` names: the one place
    /// that picks a queue implementation (declare and recovery both come here). A type
    /// registered with [`VHost::set_queue_kind`] builds its own queue; anything else is a
    /// [`ClassicQueue`] (declare has refused other types already, see [`VHost::declare_queue`];
    /// recovered definitions are taken as they are). The queue gets the vhost's clock, its
    /// dead-letter sink and, with a data directory, the store.
    pub(super) fn new_queue(
        &self,
        name: String,
        durable: bool,
        exclusive_owner: Option<u64>,
        auto_delete: bool,
        arguments: FieldTable,
    ) -> Arc<Queue> {
        let spec = QueueSpec {
            name: name.into(),
            vhost: self.name.clone(),
            durable,
            exclusive_owner,
            auto_delete,
            arguments,
            clock: self.clock.clone(),
            dead_letters: self.me.clone(),
            backing: self.backing(),
            sweeps: Arc::downgrade(&self.sweeps),
            used: Arc::downgrade(&self.used),
        };
        let q = match self.queue_kind(&spec.arguments) {
            Some(kind) => {
                // Its counts may change without a classic enqueue (replicated from other
                // members): always in the used set.
                let q = kind.build(spec);
                self.used.add(&q);
                q
            }
            None => Arc::new(ClassicQueue::from_spec(spec)),
        };
        // Visited once: the first sweep drops it if it has nothing to sweep.
        self.sweeps.add(&q);
        q
    }

    /// The registered kind of queue `arguments` ask for, `None` for a classic queue.
    fn queue_kind(&self, arguments: &FieldTable) -> Option<Arc<dyn QueueKind>> {
        let t = queue_type(arguments)?;
        self.queue_kinds.read().get(t).cloned()
    }

    /// Registers a kind of queue under `x-queue-type` `name`: queue.declare with that type
    /// creates (and recovery rebuilds) queues of this kind, validated by
    /// [`QueueKind::validate`] instead of the classic queue's argument rules. Without it,
    /// types other than `classic` are refused as before (406 "unsupported queue type").
    /// `classic` itself cannot be replaced: the call is ignored for it.
    pub fn set_queue_kind(&self, name: &str, kind: Arc<dyn QueueKind>) {
        if name != "classic" {
            self.queue_kinds.write().insert(name.to_string(), kind);
        }
    }

    /// True when a kind of queue is registered under `x-queue-type` `name` (see
    /// [`VHost::set_queue_kind`]).
    pub fn has_queue_kind(&self, name: &str) -> bool {
        self.queue_kinds.read().contains_key(name)
    }

    /// True when the queue exists.
    pub fn queue_exists(&self, name: &str) -> bool {
        self.topology.read().queues.contains_key(name)
    }

    /// How many queues the vhost has.
    pub fn queue_count(&self) -> usize {
        self.topology.read().queues.len()
    }

    /// queue.declare, for connection `connection_id`. Returns the queue and its counts.
    ///
    /// An exclusive queue is never durable: `durable` is ignored when `exclusive` is set (it
    /// is deleted with its connection anyway), in the declare and in the equivalence check of
    /// a redeclare, as RabbitMQ's `Durable = DurableDeclare andalso not ExclusiveDeclare`.
    ///
    /// Errors: 404 (passive, missing), 403 (`amq.` prefix), 405 (exclusive to another
    /// connection, or exclusivity differs), 406 (inequivalent durable/auto_delete/arguments,
    /// invalid arguments, the vhost's queue limit reached).
    pub fn declare_queue(
        &self,
        d: &QueueDeclare,
        connection_id: u64,
    ) -> Result<(Arc<Queue>, QueueCounts)> {
        if d.passive {
            let q = self.queue(&d.name, connection_id)?;
            q.touch();
            let counts = q.fresh_counts();
            return Ok((q, counts));
        }
        self.check_server_named(d)?;
        let name = decide_queue_name(&d.name)?;
        self.declare_queue_as(name, d, connection_id)
    }

    /// Fails when queue.declare `d` asks for a server-named queue of a kind that cannot have
    /// one (RabbitMQ's "Cannot declare a server-named queue for type ...").
    pub(crate) fn check_server_named(&self, d: &QueueDeclare) -> Result<()> {
        match self.queue_kind(&d.arguments) {
            Some(kind) if d.name.is_empty() => kind.check_server_named(),
            _ => Ok(()),
        }
    }

    /// A non-passive queue.declare under `name`, already decided by [`decide_queue_name`]
    /// (the operations layer decides it before checking permissions on it).
    pub(crate) fn declare_queue_as(
        &self,
        name: String,
        d: &QueueDeclare,
        connection_id: u64,
    ) -> Result<(Arc<Queue>, QueueCounts)> {
        let (q, counts) = self.declare_in(&mut self.topology.write(), name, d, connection_id)?;
        if q.owner_node().is_some() {
            // Asked of the queue's node, once the topology is unlocked.
            let counts = q.fresh_counts();
            return Ok((q, counts));
        }
        Ok((q, counts))
    }

    /// [`VHost::declare_queue_as`] under the topology lock.
    fn declare_in(
        &self,
        topo: &mut super::Topology,
        name: String,
        d: &QueueDeclare,
        connection_id: u64,
    ) -> Result<(Arc<Queue>, QueueCounts)> {
        // As in RabbitMQ, the arguments of an existing queue are only compared (an invalid
        // value is reported as inequivalent); they are validated when the queue is created.
        if let Some(q) = topo.queues.get(name.as_str()) {
            if let Some(reason) = q.unavailable() {
                return Err(BrokerError::not_found(reason));
            }
            let owner = d.exclusive.then_some(connection_id);
            if q.exclusive_owner() != owner {
                // Reuse the 405 text of check_exclusive.
                return Err(q
                    .check_exclusive(u64::MAX)
                    .err()
                    .unwrap_or_else(|| locked_queue(&**q)));
            }
            let what = self.queue_resource(&name);
            check_field(&what, "durable", q.durable(), d.durable && !d.exclusive)?;
            check_field(&what, "auto_delete", q.auto_delete(), d.auto_delete)?;
            check_args(&what, q.arguments(), &d.arguments, EQUIVALENT_QUEUE_ARGS)?;
            q.touch();
            let counts = q.counts();
            return Ok((q.clone(), counts));
        }
        match self.queue_kind(&d.arguments) {
            Some(kind) => {
                let what = self.queue_resource(&name);
                kind.validate(&what, &d.arguments)?;
                let durable = d.durable && !d.exclusive;
                kind.check_flags(&what, durable, d.exclusive, d.auto_delete)?;
            }
            None => {
                QueueArgs::parse(&self.queue_resource(&name), &d.arguments)?;
            }
        }
        limits::check_queue(&self.limits.read(), &self.name, &name, topo.queues.len())?;
        let q = self.new_queue(
            name.clone(),
            d.durable && !d.exclusive,
            d.exclusive.then_some(connection_id),
            d.auto_delete,
            d.arguments.clone(),
        );
        if q.apply_policy(topo.policies.applied(&name, Target::Queue(q.kind()))) {
            // After the policy: a sweep may have dropped the new queue meanwhile.
            self.sweeps.add(&q);
        }
        topo.queues.insert(q.shared_name(), q.clone());
        if topo.queue_is_durable(&name) {
            let put = TopologyCommand::PutQueue {
                name: name.clone(),
                auto_delete: d.auto_delete,
                arguments: d.arguments.clone(),
            };
            let undo = Undo::added(Removed::AddedQueue(q.clone()));
            let what = format!("failed to declare {}", self.queue_resource(&name));
            self.save(topo, vec![put], undo, what)?;
        }
        crate::registry::bump(&self.churn.queue_created);
        Ok((q, QueueCounts::default()))
    }

    /// Looks a queue up for connection `connection_id`: 404 when missing, 405 when exclusive to
    /// another connection.
    pub fn queue(&self, name: &str, connection_id: u64) -> Result<Arc<Queue>> {
        let q = self
            .topology
            .read()
            .queues
            .get(name)
            .cloned()
            .ok_or_else(|| self.no_queue(name))?;
        q.check_exclusive(connection_id)?;
        if let Some(reason) = q.unavailable() {
            return Err(BrokerError::not_found(reason));
        }
        Ok(q)
    }

    /// All queues, in no particular order.
    pub fn queues(&self) -> Vec<Arc<Queue>> {
        self.topology.read().queues.values().cloned().collect()
    }

    /// The queues of this vhost that may hold messages or have counted any: every classic
    /// queue that ever took a put position (enqueued a message, see
    /// [`crate::queue::Positions`]), recovered messages at start, or was added by
    /// [`VHost::track_use`]; every queue of a kind registered with [`VHost::set_queue_kind`];
    /// and every queue held by another node. Only queues the vhost holds now under their
    /// name: not one deleted, replaced, or taken back by a declare that could not be stored.
    /// A classic queue outside it has never held a message: no lengths, no counters. Costs
    /// the number of those queues, not of all queues: what visits queues periodically (the
    /// management rate sampler, the HTTP queue API's checkpoints) visits these.
    pub fn used_queues(&self) -> Vec<Arc<Queue>> {
        let mut used = self.used.snapshot();
        let topo = self.topology.read();
        used.retain(|q| {
            topo.queues
                .get(q.name())
                .is_some_and(|held| Arc::ptr_eq(held, q))
        });
        used
    }

    /// Entries of the used set, pruned or not.
    #[cfg(test)]
    pub(crate) fn used_held(&self) -> usize {
        self.used.held()
    }

    /// Adds `q` to [`VHost::used_queues`] (a put position restored at start, messages
    /// recovered).
    pub fn track_use(&self, q: &Arc<Queue>) {
        self.used.add(q);
    }

    /// queue.delete; returns the number of ready messages deleted. A missing queue is deleted
    /// successfully with count 0, as in RabbitMQ. Errors: 405, 406 (`if_unused`, `if_empty`).
    pub fn delete_queue(
        &self,
        name: &str,
        if_unused: bool,
        if_empty: bool,
        connection_id: u64,
    ) -> Result<u32> {
        // A queue held by another node is deleted there (with its checks), then here.
        let remote = self.topology.read().queues.get(name).cloned();
        if let Some(q) = remote.filter(|q| q.owner_node().is_some()) {
            if let Some(reason) = q.unavailable() {
                return Err(BrokerError::not_found(reason));
            }
            if let Some(deleted) = q.delete_at_owner(if_unused, if_empty) {
                let n = deleted?;
                self.remove_remote_queue(name);
                return Ok(n);
            }
        }
        let q = {
            let mut topo = self.topology.write();
            let Some(q) = topo.queues.get(name).cloned() else {
                return Ok(0);
            };
            q.check_exclusive(connection_id)?;
            let counts = q.counts();
            if if_unused && counts.consumers > 0 {
                return Err(BrokerError::precondition_failed(format!(
                    "{} in use",
                    q.resource_name()
                )));
            }
            if if_empty && counts.ready > 0 {
                return Err(BrokerError::precondition_failed(format!(
                    "{} not empty",
                    q.resource_name()
                )));
            }
            let mut undo = Undo::default();
            topo.remove_queue(name, &mut undo);
            if undo.durable {
                let what = format!("failed to delete {}", q.resource_name());
                self.save(&mut topo, TopologyCommand::removals(&undo), undo, what)?;
            }
            q
        };
        crate::registry::bump(&self.churn.queue_deleted);
        Ok(finish_queue_delete(&q))
    }

    /// Puts `q`, a queue that lives on another node of the cluster (its
    /// [`crate::queue::QueueBackend::owner_node`] is set), under its name, so that declares,
    /// bindings, publishes, consumers and gets here reach it. Nothing is written here: the
    /// cluster's metadata holds it. Returns false when a queue of that name exists already.
    pub fn put_remote_queue(&self, q: Arc<Queue>) -> bool {
        let mut topo = self.topology.write();
        if topo.queues.contains_key(q.name()) {
            return false;
        }
        q.apply_policy(topo.policies.applied(q.name(), Target::Queue(q.kind())));
        // Its counts come from the node holding it.
        self.used.add(&q);
        topo.queues.insert(q.shared_name(), q);
        true
    }

    /// Removes queue `name` with its bindings when it lives on another node (see
    /// [`VHost::put_remote_queue`]): its consumers here are cancelled. Returns it, or `None`
    /// when there is no such queue or it is held here.
    pub fn remove_remote_queue(&self, name: &str) -> Option<Arc<Queue>> {
        let q = {
            let mut topo = self.topology.write();
            let q = topo.queues.get(name).cloned()?;
            q.owner_node()?;
            let mut undo = Undo::default();
            topo.remove_queue(name, &mut undo);
            q
        };
        finish_queue_delete(&q);
        Some(q)
    }

    /// Declares queue `d` (non-passive, durable) in place of its stand-in (see
    /// [`VHost::put_remote_queue`]) in one step, keeping the bindings: this node's new
    /// member of a quorum queue it reached through other nodes until now. Publishes routed
    /// here go to the stand-in until then and to the new queue after; the stand-in's
    /// consumers here are cancelled (basic.cancel). Without a stand-in, a plain declare.
    /// Returns the queue and whether it was created. Errors: those of queue.declare.
    pub fn declare_in_place_of_stand_in(&self, d: &QueueDeclare) -> Result<(Arc<Queue>, bool)> {
        let (declared, stand_in) = {
            let mut topo = self.topology.write();
            let stand_in = match topo.queues.get(d.name.as_str()) {
                Some(q) if q.owner_node().is_some() => topo.queues.remove(d.name.as_str()),
                _ => None,
            };
            let existed = stand_in.is_none() && topo.queues.contains_key(d.name.as_str());
            match self.declare_in(&mut topo, d.name.clone(), d, 0) {
                Ok((q, _)) => ((q, !existed), stand_in),
                Err(e) => {
                    if let Some(s) = stand_in {
                        topo.queues.insert(s.shared_name(), s);
                    }
                    return Err(e);
                }
            }
        };
        if let Some(s) = stand_in {
            finish_queue_delete(&s);
        }
        Ok(declared)
    }

    /// Puts `stand_in` (see [`VHost::put_remote_queue`]) in place of the queue of that name
    /// held here, in one step, keeping the bindings, and deletes the queue held here: this
    /// node's member of a quorum queue was removed, and the queue is reached through the other
    /// members from then on. Nothing is replicated: the definitions log here records the
    /// removal and the bindings again. Returns false (and changes nothing) when no queue of
    /// that name is held here.
    pub fn hand_over_queue(&self, stand_in: Arc<Queue>) -> bool {
        let name = stand_in.name().to_string();
        let old = {
            let mut topo = self.topology.write();
            match topo.queues.get(name.as_str()) {
                Some(q) if q.owner_node().is_none() => {}
                _ => return false,
            }
            let mut commands = vec![TopologyCommand::RemoveQueue { name: name.clone() }];
            commands.extend(super::log::bindings_to(&topo, &name));
            stand_in.apply_policy(topo.policies.applied(&name, Target::Queue(stand_in.kind())));
            self.used.add(&stand_in);
            let old = topo.queues.insert(stand_in.shared_name(), stand_in);
            self.store_detached(&mut topo, commands);
            old
        };
        if let Some(q) = old {
            crate::registry::bump(&self.churn.queue_deleted);
            finish_queue_delete(&q);
        }
        true
    }

    /// Enqueues `msg` (published on another node of the cluster, already routed there) on
    /// queue `name` held here, writing it to the store when it is persistent and the queue
    /// durable; `waiter` is completed once it is on disk (or at once).
    ///
    /// Errors: 404 when there is no such queue here; the store refusing writes.
    pub fn enqueue_forwarded(
        &self,
        name: &str,
        msg: Arc<crate::message::Message>,
        waiter: Option<(Arc<dyn crate::Completion>, u64)>,
    ) -> std::result::Result<super::Published, super::PublishError> {
        let q = self.queue(name, 0)?;
        if q.rejects_publish(&msg) {
            if let Some((sink, token)) = waiter {
                sink.complete(&[token], false);
            }
            return Ok(super::Published {
                routed: true,
                queues: 1,
                stored: false,
                pressured: None,
                rejected: true,
            });
        }
        self.enqueue(msg, vec![q], waiter, false, true)
    }

    /// Deletes `queue` if it is still the one registered under its name (auto-delete after the
    /// last consumer, exclusive queues when their connection closes).
    pub fn remove_queue(&self, queue: &Arc<Queue>) {
        {
            let mut topo = self.topology.write();
            match topo.queues.get(queue.name()) {
                Some(q) if Arc::ptr_eq(q, queue) => {
                    let mut undo = Undo::default();
                    topo.remove_queue(queue.name(), &mut undo);
                    // No client waits on this: a failed save is retried by the sweep.
                    if undo.durable {
                        self.save_detached(&mut topo, TopologyCommand::removals(&undo));
                    }
                }
                _ => return,
            }
        }
        crate::registry::bump(&self.churn.queue_deleted);
        finish_queue_delete(queue);
    }

    /// Deletes every queue exclusive to `connection_id`.
    pub fn remove_exclusive_queues(&self, connection_id: u64) {
        let owned: Vec<Arc<Queue>> = self
            .topology
            .read()
            .queues
            .values()
            .filter(|q| q.exclusive_owner() == Some(connection_id))
            .cloned()
            .collect();
        for q in owned {
            self.remove_queue(&q);
        }
    }

    /// queue.purge; returns the number of messages purged.
    pub fn purge_queue(&self, name: &str, connection_id: u64) -> Result<u32> {
        Ok(self.queue(name, connection_id)?.purge())
    }

    /// Registers a consumer on queue `name` for connection `connection_id` (404, 405, 403).
    pub fn consume(
        &self,
        name: &str,
        consumer: Consumer,
        connection_id: u64,
    ) -> Result<Arc<Queue>> {
        let q = self.queue(name, connection_id)?;
        q.add_consumer(consumer)?;
        Ok(q)
    }
}

/// Marks a queue deleted and cancels its consumers; returns its ready-message count.
pub(crate) fn finish_queue_delete(q: &Arc<Queue>) -> u32 {
    let (count, consumers) = q.mark_deleted();
    for c in consumers {
        c.target.cancelled_by_broker(&c.tag);
    }
    count
}

pub(super) fn locked_queue(q: &Queue) -> BrokerError {
    BrokerError::resource_locked(format!(
        "cannot obtain exclusive access to locked {}. It could be originally declared on another \
         connection or the exclusive property value does not match that of the original \
         declaration.",
        q.resource_name()
    ))
}

/// The name a non-passive queue.declare creates or redeclares: a fresh `amq.gen-…` name for
/// an empty one; 403 for a client-chosen name with the reserved `amq.` prefix.
pub(crate) fn decide_queue_name(requested: &str) -> Result<String> {
    if requested.is_empty() {
        return Ok(names::queue_name());
    }
    if requested.starts_with("amq.") {
        return Err(BrokerError::access_refused(format!(
            "queue name '{requested}' contains reserved prefix 'amq.*'"
        )));
    }
    Ok(requested.to_string())
}
