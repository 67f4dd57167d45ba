//! The vhost's side of delayed-message exchanges: holding a message until it is due (in
//! memory, paged, or in the store for a durable exchange), releasing it through its exchange,
//! recovering held messages at start, and dropping them with their exchange. The schedule
//! itself is [`crate::delayed`].

use super::*;

impl VHost {
    /// Holds `msg` in delayed exchange `exchange` (durable or not) for `delay` ms. Returns
    /// true when it was written to the store as a persistent record, so that its publisher's
    /// confirm must wait for an fsync.
    pub(super) fn hold(
        &self,
        exchange: &str,
        durable: bool,
        msg: &Arc<Message>,
        delay: u64,
    ) -> std::result::Result<bool, PublishError> {
        let due_ms = self.clock.now_ms().saturating_add(delay);
        let id = self.next_id();
        let (body, persisted) = match &self.persist {
            None => (Body::Memory(msg.clone()), false),
            Some(p) if durable && msg.is_persistent() => {
                let key = delayed::store_key(&self.name, exchange, due_ms);
                let loc = p
                    .store
                    .append_publish(
                        id,
                        &msg.exchange,
                        &msg.routing_key,
                        &msg.properties,
                        &msg.body,
                        self.clock.now_ms(),
                        &[&key],
                        None,
                    )
                    .map_err(|e| PublishError::StoreUnavailable(e.to_string()))?;
                (Body::Stored(loc), true)
            }
            Some(p) => match p.store.append_transient(
                id,
                &msg.exchange,
                &msg.routing_key,
                &msg.properties,
                &msg.body,
                self.clock.now_ms(),
            ) {
                Ok(loc) => (Body::Paged(loc), false),
                Err(e) => {
                    static PAGE_OUT_FAILED: LogLimit = LogLimit::new();
                    if let Some(suppressed) = PAGE_OUT_FAILED.admit() {
                        tracing::warn!(%exchange, error = %e, suppressed, "cannot page delayed message out; keeping it in memory");
                    }
                    (Body::Memory(msg.clone()), false)
                }
            },
        };
        self.delayed.lock().insert(
            due_ms,
            id,
            Held {
                exchange: Arc::from(exchange),
                body,
            },
        );
        Ok(persisted)
    }

    /// Messages held by delayed-message exchanges of this vhost.
    pub fn delayed_count(&self) -> usize {
        self.delayed.lock().len()
    }

    /// Routes the held messages whose delay is over, a bounded batch per call.
    pub(super) fn release_delayed(&self) {
        let now = self.clock.now_ms();
        let due = self.delayed.lock().take_due(now, delayed::RELEASE_BATCH);
        let mut due = due.into_iter();
        while let Some(((due_ms, id), held)) = due.next() {
            if let Err(held) = self.release(due_ms, id, held) {
                // The store refuses writes: put this one and the rest back for a later sweep.
                let mut schedule = self.delayed.lock();
                schedule.insert(due_ms, id, held);
                for ((due_ms, id), held) in due {
                    schedule.insert(due_ms, id, held);
                }
                return;
            }
        }
    }

    /// Routes one held message from its delayed exchange (once: if nothing matches, it is
    /// gone, as with the plugin), then lets go of the held copy. Gives it back when the store
    /// cannot take the routed copy now.
    pub(super) fn release(
        &self,
        due_ms: u64,
        id: u64,
        held: Held,
    ) -> std::result::Result<(), Held> {
        let store = self.persist.as_ref().map(|p| &p.store);
        let msg = match &held.body {
            Body::Memory(m) => Some(m.clone()),
            Body::Paged(loc) | Body::Stored(loc) => match store.map(|s| s.read(*loc)) {
                Some(Ok(m)) => Some(Arc::new(Message::new(
                    m.exchange,
                    m.routing_key,
                    m.properties,
                    m.body,
                ))),
                Some(Err(e)) => {
                    static UNREADABLE: LogLimit = LogLimit::new();
                    if let Some(suppressed) = UNREADABLE.admit() {
                        tracing::warn!(exchange = %held.exchange, error = %e, suppressed, "dropping unreadable delayed message");
                    }
                    None
                }
                None => None,
            },
        };
        if let Some(msg) = msg {
            let delay = delayed::delay_of(msg.properties.headers.as_ref())
                .ok()
                .flatten()
                .unwrap_or(0);
            let released = Arc::new(delayed::released(&msg, delay));
            match self.dispatch(&held.exchange, released, None, false) {
                Ok(_) => {}
                Err(PublishError::StoreUnavailable(_)) => return Err(held),
                Err(PublishError::Broker(e)) => {
                    tracing::debug!(exchange = %held.exchange, error = %e, "delayed message not routed");
                }
            }
        }
        if let Some(s) = store {
            match held.body {
                Body::Paged(loc) => s.release(loc),
                Body::Stored(loc) => {
                    s.ack(
                        &delayed::store_key(&self.name, &held.exchange, due_ms),
                        id,
                        loc,
                    );
                }
                Body::Memory(_) => {}
            }
        }
        Ok(())
    }

    /// True when `exchange` is a durable delayed-message exchange (whose persistent held
    /// messages are recovered).
    pub(crate) fn holds_durably(&self, exchange: &str) -> bool {
        self.topology
            .read()
            .exchanges
            .get(exchange)
            .is_some_and(|x| x.durable && x.kind == ExchangeKind::DelayedMessage)
    }

    /// Re-arms persistent messages that `exchange` held until `due_ms` before a restart
    /// (released on the first sweep when already due).
    pub(crate) fn recover_delayed(
        &self,
        exchange: &str,
        due_ms: u64,
        entries: &[warren_store::RecoveredEntry],
    ) {
        let exchange: Arc<str> = Arc::from(exchange);
        let mut schedule = self.delayed.lock();
        for e in entries {
            schedule.insert(
                due_ms,
                e.id,
                Held {
                    exchange: exchange.clone(),
                    body: Body::Stored(e.location),
                },
            );
        }
    }

    /// Lets go of the messages a deleted delayed exchange held.
    pub(super) fn drop_held(&self, exchange: &str) {
        let gone = self.delayed.lock().remove_exchange(exchange);
        let Some(p) = &self.persist else {
            return;
        };
        for ((due_ms, id), held) in gone {
            match held.body {
                Body::Paged(loc) => p.store.release(loc),
                Body::Stored(loc) => {
                    p.store
                        .ack(&delayed::store_key(&self.name, exchange, due_ms), id, loc)
                }
                Body::Memory(_) => {}
            }
        }
    }
}
