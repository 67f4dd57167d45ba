//! Routing: the walk from the exchange a message is published to through exchange-to-exchange
//! bindings and alternate exchanges to the queues it reaches, as RabbitMQ routes
//! (`rabbit_exchange:route`), with a budget on topic matching.

use super::*;

/// Why a routing walk failed.
pub(super) enum WalkError {
    /// A reply to the publisher (an unreadable `x-delay`).
    Broker(BrokerError),
    /// Topic matching in this exchange used up the message's budget.
    TooComplex(String),
}

impl From<BrokerError> for WalkError {
    fn from(e: BrokerError) -> Self {
        WalkError::Broker(e)
    }
}

/// What a routing walk reached.
#[derive(Default)]
pub(super) struct Routed {
    /// Queues, each once.
    pub(super) queues: Vec<Arc<Queue>>,
    /// The queues by address, once there are too many to look through.
    pub(super) index: HashSet<usize>,
    /// Delayed-message exchanges that hold the message: (name, durable, delay in ms).
    pub(super) delayed: Vec<(String, bool, u64)>,
}

impl Routed {
    pub(super) fn add_queue(&mut self, q: &Arc<Queue>) {
        const LINEAR: usize = 16;
        let addr = Arc::as_ptr(q) as *const () as usize;
        if self.queues.len() < LINEAR {
            if self.queues.iter().any(|o| Arc::ptr_eq(o, q)) {
                return;
            }
        } else {
            if self.index.is_empty() {
                self.index.extend(
                    self.queues
                        .iter()
                        .map(|o| Arc::as_ptr(o) as *const () as usize),
                );
            }
            if !self.index.insert(addr) {
                return;
            }
        }
        self.queues.push(q.clone());
    }
}

/// The exchanges a routing walk has queued up, the first one apart (most walks visit one).
struct Seen<'a> {
    start: &'a str,
    few: Vec<&'a str>,
    many: HashSet<&'a str>,
}

impl<'a> Seen<'a> {
    fn new(start: &'a str) -> Self {
        Seen {
            start,
            few: Vec::new(),
            many: HashSet::new(),
        }
    }

    /// Records `name`; false when it was seen already.
    fn insert(&mut self, name: &'a str) -> bool {
        if name == self.start {
            return false;
        }
        if !self.many.is_empty() {
            return self.many.insert(name);
        }
        if self.few.contains(&name) {
            return false;
        }
        self.few.push(name);
        if self.few.len() > 16 {
            self.many.extend(self.few.drain(..));
        }
        true
    }
}

impl VHost {
    /// Routes a basic.publish: fills `out` with each queue the message goes to, once.
    ///
    /// The message is routed with `routing_key` and the keys of its `CC` and `BCC` headers
    /// (sender-selected distribution), through exchange-to-exchange bindings and alternate
    /// exchanges as [`Topology::walk`] describes; delayed-message exchanges that would hold it
    /// contribute nothing. Errors: 404 for a missing exchange, 403 for an internal one, 406
    /// for `CC` / `BCC` headers that are not arrays or an unreadable `x-delay`.
    pub fn route(
        &self,
        exchange: &str,
        routing_key: &str,
        headers: Option<&FieldTable>,
        out: &mut Vec<Arc<Queue>>,
    ) -> Result<()> {
        let sender_keys = SenderKeys::from_headers(headers).map_err(|reason| {
            BrokerError::precondition_failed(format!("invalid message: {reason}"))
        })?;
        let mut routed = Routed::default();
        self.route_inner(
            exchange,
            &sender_keys.all(routing_key),
            headers,
            true,
            &mut routed,
        )?;
        for q in routed.queues {
            if !out.iter().any(|o| Arc::ptr_eq(o, &q)) {
                out.push(q);
            }
        }
        Ok(())
    }

    /// [`VHost::route`] with the routing keys given; dead-lettering and releasing delayed
    /// messages may go through an internal exchange.
    pub(super) fn route_inner(
        &self,
        exchange: &str,
        keys: &[&str],
        headers: Option<&FieldTable>,
        refuse_internal: bool,
        out: &mut Routed,
    ) -> Result<()> {
        let topo = self.topology.read();
        if exchange.is_empty() {
            // The default exchange: each key names a queue.
            for key in keys {
                if let Some(q) = topo.queues.get(*key) {
                    out.add_queue(q);
                }
            }
            return Ok(());
        }
        let x = topo
            .exchanges
            .get(exchange)
            .ok_or_else(|| self.no_exchange(exchange))?;
        if x.internal && refuse_internal {
            return Err(BrokerError::access_refused(format!(
                "cannot publish to internal {}",
                self.exchange_resource(exchange)
            )));
        }
        let budget = self.limits.read().topic_budget();
        topo.walk(x, keys, headers, budget, out)
            .map_err(|e| match e {
                WalkError::Broker(e) => e,
                WalkError::TooComplex(through) => BrokerError::precondition_failed(format!(
                "cannot route message through {}: topic matching needs more than {budget} steps",
                self.exchange_resource(&through)
            )),
            })
    }
}

impl Topology {
    /// RabbitMQ's routing walk (`rabbit_exchange:route`): starting at `start`, each exchange
    /// reached routes the message in turn, every exchange at most once (so binding cycles
    /// end). Alternate exchanges are decided per exchange visited: one whose own bindings give
    /// no destination at all (queue or exchange) passes the message to its
    /// `alternate-exchange`, wherever it sits in the walk. A delayed-message exchange that
    /// must hold the message routes it nowhere now and is recorded in `out.delayed` (without
    /// trying its alternate exchange; see [`crate::delayed`]).
    ///
    /// Errors: 406 for an `x-delay` header a delayed exchange cannot read; the name of the
    /// topic exchange where the walk used up its `budget` of trie nodes.
    pub(super) fn walk<'a>(
        &'a self,
        start: &'a Exchange,
        keys: &[&str],
        headers: Option<&FieldTable>,
        mut budget: usize,
        out: &mut Routed,
    ) -> std::result::Result<(), WalkError> {
        let mut work: Vec<&'a Exchange> = vec![start];
        let mut seen = Seen::new(&start.name);
        while let Some(x) = work.pop() {
            if x.kind == ExchangeKind::DelayedMessage {
                if let Some(delay) = delayed::delay_of(headers)? {
                    if !out.delayed.iter().any(|(n, _, _)| *n == x.name) {
                        out.delayed.push((x.name.clone(), x.durable, delay));
                    }
                    continue;
                }
            }
            let mut any = false;
            let complete = x.route_keys(keys, headers, &mut budget, &mut |d| {
                any = true;
                match d {
                    Destination::Queue(name) => {
                        if let Some(q) = self.queues.get(&**name) {
                            out.add_queue(q);
                        }
                    }
                    Destination::Exchange(name) => {
                        if let Some(e) = self.exchanges.get(&**name) {
                            if seen.insert(&e.name) {
                                work.push(e);
                            }
                        }
                    }
                }
            });
            if !complete {
                return Err(WalkError::TooComplex(x.name.clone()));
            }
            if !any {
                if let Some(ae) = x.alternate_exchange().and_then(|n| self.exchanges.get(n)) {
                    if seen.insert(&ae.name) {
                        work.push(ae);
                    }
                }
            }
        }
        Ok(())
    }
}
