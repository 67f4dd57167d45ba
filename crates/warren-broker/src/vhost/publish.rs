//! Publishing into a vhost: routing from the publish exchange (with `CC` / `BCC` keys and
//! delayed exchanges on the way), then enqueueing on every queue reached, with one store write
//! for the durable ones.

use crate::dead_letter::{DeadLetter, DeadLetterSink, DeathReason};
use crate::error::{BrokerError, Result};

use super::routing::Routed;
use super::{VHost, REPLY_TO};
use crate::message::{ConfirmTicket, Message};
use crate::queue::Queue;
use crate::sender_selected::{self, SenderKeys};
use std::sync::Arc;
use warren_store::Completion;

/// What became of a publish.
#[derive(Debug, Clone)]
pub struct Published {
    /// At least one queue received the message.
    pub routed: bool,
    /// How many queues enqueued it (RabbitMQ's exchange `publish_out` counts each).
    pub queues: u32,
    /// The message was written to the store (with the caller's completion, if one was given,
    /// to run after the fsync that covers it); otherwise nothing is pending.
    pub stored: bool,
    /// A queue it went to asks publishers to pause ([`Queue::is_pressured`]).
    pub pressured: Option<Arc<Queue>>,
    /// A queue it was routed to refused it (full, with overflow `reject-publish` or
    /// `reject-publish-dlx`): the publisher confirm is a nack.
    pub rejected: bool,
}

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Routing failed (404 no exchange, 403 internal exchange).
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The message store refuses writes (disk full or failing); the message went nowhere.
    #[error("{0}")]
    StoreUnavailable(String),
}

impl VHost {
    /// Routes and enqueues a published message. A persistent message routed to durable queues
    /// of a durable broker is written to the store once, with `waiter` to be completed after
    /// its fsync (publisher confirms, tx.commit).
    ///
    /// Errors: 404 / 403 (missing or internal exchange), 406 (a `CC` / `BCC` header that is
    /// not an array, an `x-delay` header a delayed exchange cannot read), or the
    /// store refusing writes.
    pub fn publish(
        &self,
        msg: Arc<Message>,
        waiter: Option<(Arc<dyn Completion>, u64)>,
    ) -> std::result::Result<Published, PublishError> {
        if msg.exchange.is_empty() && msg.routing_key.starts_with(REPLY_TO) {
            let routed = self.deliver_reply(msg);
            return Ok(Published {
                routed,
                queues: u32::from(routed),
                stored: false,
                pressured: None,
                rejected: false,
            });
        }
        let published = msg.clone();
        self.dispatch(&published.exchange, msg, waiter, true)
    }

    /// Routes `msg` from exchange `start` (its publish exchange, or the delayed exchange that
    /// held it) with its routing key and `CC` / `BCC` keys, holds it in the delayed exchanges
    /// that must delay it, and enqueues it on the queues it reached.
    pub(super) fn dispatch(
        &self,
        start: &str,
        msg: Arc<Message>,
        waiter: Option<(Arc<dyn Completion>, u64)>,
        refuse_internal: bool,
    ) -> std::result::Result<Published, PublishError> {
        // As published (BCC included): what a delayed exchange holds.
        let original = msg.clone();
        let msg = match msg.sender_keys {
            Some(_) => msg,
            None => match SenderKeys::from_headers(msg.properties.headers.as_ref()) {
                Ok(keys) => sender_selected::prepare(msg, keys),
                Err(reason) => {
                    // RabbitMQ checks the exchange before it reads the message.
                    self.check_publishable(start, refuse_internal)?;
                    return Err(BrokerError::precondition_failed(format!(
                        "invalid message: {reason}"
                    ))
                    .into());
                }
            },
        };
        let mut routed = Routed::default();
        {
            let single = [msg.routing_key.as_str()];
            let all;
            let keys: &[&str] = match &msg.sender_keys {
                Some(k) if !k.is_empty() => {
                    all = k.all(&msg.routing_key);
                    &all
                }
                _ => &single,
            };
            self.route_inner(
                start,
                keys,
                msg.properties.headers.as_ref(),
                refuse_internal,
                &mut routed,
            )?;
        }
        // Held copies go to the store before the queues' copy, whose fsync then covers them.
        let mut held_durably = false;
        for (x, durable, delay) in &routed.delayed {
            held_durably |= self.hold(x, *durable, &original, *delay)?;
        }
        let sync_waiter = waiter.clone().filter(|_| held_durably);
        let mut queues = routed.queues;
        let mut published = if queues.is_empty() {
            Published {
                routed: false,
                queues: 0,
                stored: false,
                pressured: None,
                rejected: false,
            }
        } else {
            let mut rejected = Vec::new();
            queues.retain(|q| {
                let refuse = q.rejects_publish(&msg);
                if refuse {
                    rejected.push(q.clone());
                }
                !refuse
            });
            for q in &rejected {
                let args = q.args();
                if args.overflow != crate::args::Overflow::RejectPublishDlx {
                    continue;
                }
                if let Some(source) = q.dead_letter_source(&args) {
                    self.dead_letter(
                        &source,
                        vec![DeadLetter {
                            message: msg.clone(),
                            reason: DeathReason::Maxlen,
                        }],
                    );
                }
            }
            // An early confirm (all durable queues acked) must not overtake the fsync of a
            // held copy.
            self.enqueue(msg, queues, waiter, !rejected.is_empty(), !held_durably)?
        };
        if let Some(w) = sync_waiter {
            if !published.stored && !published.rejected {
                published.stored = self.sync(w);
            }
        }
        Ok(published)
    }

    /// Fails like routing would from exchange `name`: 404 when it is missing, 403 when it is
    /// internal and `refuse_internal`.
    pub(super) fn check_publishable(&self, name: &str, refuse_internal: bool) -> Result<()> {
        if name.is_empty() {
            return Ok(());
        }
        let topo = self.topology.read();
        let x = topo
            .exchanges
            .get(name)
            .ok_or_else(|| self.no_exchange(name))?;
        if x.internal && refuse_internal {
            return Err(BrokerError::access_refused(format!(
                "cannot publish to internal {}",
                self.exchange_resource(name)
            )));
        }
        Ok(())
    }

    /// Enqueues a routed message on `queues`, writing it to the store first when it is
    /// persistent and some of them are durable.
    pub(super) fn enqueue(
        &self,
        msg: Arc<Message>,
        queues: Vec<Arc<Queue>>,
        waiter: Option<(Arc<dyn Completion>, u64)>,
        rejected: bool,
        early_confirm: bool,
    ) -> std::result::Result<Published, PublishError> {
        if queues.is_empty() {
            return Ok(Published {
                routed: true,
                queues: 0,
                stored: false,
                pressured: None,
                rejected,
            });
        }
        // Each queue enqueues in id order (see `Queue::enqueue_order`): the id is taken and the
        // message enqueued under the queues' order locks. Dead letters wait until they are
        // released, as dead-lettering publishes again.
        let order = crate::queue::lock_enqueue_order(&queues);
        let id = self.next_id();
        let mut location = None;
        // Queues that confirm publishes themselves (quorum queues) each take a part of the
        // publisher's confirm; the store's fsync is another part when it writes the message.
        let replicated = queues.iter().filter(|q| q.confirms_publishes()).count();
        let stores = self.persist.is_some()
            && msg.is_persistent()
            && queues.iter().any(|q| q.store().is_some());
        let parts = replicated + usize::from(stores);
        let (waiter, mut shares) = match waiter {
            Some(w) if parts > 1 => {
                let joint: Arc<dyn Completion> = Arc::new(JointConfirm::new(parts as u32, w));
                let share = (joint, 0);
                (Some(share.clone()), Some(share))
            }
            Some(w) if replicated == 1 => (None, Some(w)),
            w => (w, None),
        };
        let early_confirm = early_confirm && replicated == 0;
        let mut confirmed_later = false;
        if let (Some(p), true) = (&self.persist, msg.is_persistent()) {
            let durable: Vec<&str> = queues
                .iter()
                .filter(|q| q.store().is_some())
                .map(|q| q.store_key())
                .collect();
            if !durable.is_empty() {
                if let (Some((sink, token)), true) = (&waiter, early_confirm) {
                    let ticket = ConfirmTicket::new(durable.len() as u32, sink.clone(), *token);
                    let _ = msg.confirm.set(Arc::new(ticket));
                }
                let loc = p
                    .store
                    .append_publish(
                        id,
                        &msg.exchange,
                        &msg.routing_key,
                        &msg.properties,
                        &msg.body,
                        self.clock.now_ms(),
                        &durable,
                        waiter,
                    )
                    .map_err(|e| PublishError::StoreUnavailable(e.to_string()))?;
                location = Some(loc);
            }
        }
        let mut pressured = None;
        let mut dead = Vec::new();
        for q in &queues {
            let (pressure, letters) = if q.confirms_publishes() {
                confirmed_later |= shares.is_some();
                let share = match (&shares, replicated > 1 || stores) {
                    (Some(s), true) => Some(s.clone()),
                    _ => shares.take(),
                };
                q.enqueue_confirmed(q, msg.clone(), id, share)
            } else {
                let stored = if q.store().is_some() { location } else { None };
                q.publish_held(msg.clone(), id, stored)
            };
            if pressure && pressured.is_none() {
                pressured = Some(q.clone());
            }
            if !letters.is_empty() {
                dead.push((q.clone(), letters));
            }
        }
        drop(order);
        for (q, letters) in dead {
            q.dead_letter(letters);
        }
        Ok(Published {
            routed: true,
            queues: queues.len() as u32,
            stored: location.is_some() || confirmed_later,
            pressured,
            rejected,
        })
    }

    /// Completes `waiter` once everything written to the store so far is fsynced; returns
    /// false (and drops the waiter) for an in-memory broker.
    pub fn sync(&self, waiter: (Arc<dyn Completion>, u64)) -> bool {
        match &self.persist {
            Some(p) => {
                p.store.sync(waiter);
                true
            }
            None => false,
        }
    }
}

/// A publisher confirm shared by several parts (the store's fsync, each quorum queue's
/// commit): completed once every part is, acked when all of them succeeded.
struct JointConfirm {
    remaining: std::sync::atomic::AtomicU32,
    ok: std::sync::atomic::AtomicBool,
    sink: Arc<dyn Completion>,
    token: u64,
}

impl JointConfirm {
    fn new(parts: u32, (sink, token): (Arc<dyn Completion>, u64)) -> Self {
        JointConfirm {
            remaining: std::sync::atomic::AtomicU32::new(parts),
            ok: std::sync::atomic::AtomicBool::new(true),
            sink,
            token,
        }
    }
}

impl Completion for JointConfirm {
    fn complete(&self, tokens: &[u64], ok: bool) {
        use std::sync::atomic::Ordering;
        // One completion per part (the store completes each sink once per batch).
        debug_assert!(tokens.len() <= 1);
        if !ok {
            self.ok.store(false, Ordering::Release);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.sink
                .complete(&[self.token], self.ok.load(Ordering::Acquire));
        }
    }
}
