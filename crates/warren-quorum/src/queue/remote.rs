//! Consumers and basic.get on a member whose node does not lead (see [`crate::remote`]): the
//! member's side (telling the leader's node its consumers, handing deliveries to their
//! channels, asking for one message) and the leader's side (keeping other nodes' consumers,
//! delivering to them, answering their gets, returning what a lost node held).

use super::*;
use crate::remote::{Cast, GroupServer, RemoteConsumer, RemoteMessage, WireMessage};
use std::time::Duration;
use warren_broker::DeliveryTarget;

/// How long a subscription or a remote basic.get waits for the leader's node.
const REMOTE_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A consumer of another node's client, as the leader sees it: deliveries go over the
/// connection to that node.
struct RemoteTarget {
    cluster: Arc<crate::transport::Cluster>,
    peer: NodeId,
    group: String,
    term: u64,
    consumer: u64,
}

impl DeliveryTarget for RemoteTarget {
    fn channel_key(&self) -> u64 {
        // Never one of this process's channels (their keys count up from 1).
        (1 << 63) | (self.peer << 40) | (self.consumer & ((1 << 40) - 1))
    }

    fn deliver(
        &self,
        _queue: &Arc<Queue>,
        _consumer_tag: &Arc<str>,
        _no_ack: bool,
        msg: QueuedMessage,
    ) -> std::result::Result<(), QueuedMessage> {
        let cast = Cast::Deliver {
            group: self.group.clone(),
            term: self.term,
            consumer: self.consumer,
            delivery: RemoteMessage {
                key: msg.seq,
                redelivered: msg.redelivered,
                message: WireMessage(msg.message.clone()),
            },
        };
        if self.cluster.cast(self.peer, cast) {
            Ok(())
        } else {
            Err(msg)
        }
    }

    fn cancelled_by_broker(&self, _consumer_tag: &Arc<str>) {
        // The queue was deleted: its member on the consumer's node goes too, and cancels.
    }
}

impl QuorumQueue {
    /// The queue as an `Arc` (None while it is being dropped).
    pub(super) fn myself(&self) -> Option<Arc<QuorumQueue>> {
        self.myself.upgrade()
    }

    /// Takes the next ready message for basic.get, handed to `holder`: the message and the
    /// ready messages left, or none. None (outer) when this node does not lead.
    pub(super) fn take_one(
        &self,
        no_ack: bool,
        holder: Out,
    ) -> Option<Option<(QueuedMessage, u32)>> {
        let mut props = Proposals::default();
        let got = {
            let mut st = self.inner.lock();
            if !st.leading() {
                return None;
            }
            let now = self.clock.now_ms();
            let mut from = 0;
            let mut got = None;
            while let Some(key) = Self::next_ready(&st, from) {
                from = key + 1;
                match self.may_hand_out(&mut st, key, now, &mut props) {
                    None => break,
                    Some(false) => continue,
                    Some(true) => {}
                }
                let m = st.qs.get(key).expect("ready key is held");
                let count = m.delivery_count;
                let qm = QueuedMessage {
                    seq: key,
                    message: with_delivery_count(m),
                    redelivered: m.redelivered,
                    stored: None,
                    expires_at: self.deadline(m),
                };
                if qm.redelivered {
                    self.stats.redeliver.fetch_add(1, Ordering::Relaxed);
                }
                st.out.insert(key, holder);
                if no_ack {
                    props.acked.push(key);
                } else {
                    props.checkout.push((key, count));
                }
                let left = st.ready_count() as u32;
                got = Some((qm, left));
                break;
            }
            Self::keep_horizon_ahead(&mut st, &mut props);
            got
        };
        self.propose(props);
        if got.is_some() {
            self.stats.get.fetch_add(1, Ordering::Relaxed);
            self.deliveries.fetch_add(1, Ordering::Relaxed);
        }
        Some(got)
    }

    /// Sends `req` to the leader's node and waits for its answer (at most
    /// [`REMOTE_CALL_TIMEOUT`]), for a synchronous caller on a worker thread of a
    /// multi-threaded runtime (the server's is one). None when no other node is known to
    /// lead, or it did not answer.
    fn call_leader(&self, req: Request) -> Option<Response> {
        let cluster = self.node.cluster()?.clone();
        let leader = self.raft.get()?.metrics().borrow().current_leader?;
        if leader == self.node.cfg.node_id {
            return None;
        }
        match cluster.call_blocking(leader, req, REMOTE_CALL_TIMEOUT)? {
            Ok(r) => Some(r),
            Err(e) => {
                debug!(queue = %self.name, leader, error = %e, "the leader's node did not answer");
                None
            }
        }
    }

    /// Whether a consumer (`exclusive` or not) may be added on a member that does not lead,
    /// given the consumers of every node, which the leader's node knows: false when it may
    /// not. Allowed when no other node is known to lead or its node cannot be asked (the
    /// member's own consumers are checked anyway).
    pub(super) fn check_consume_at_leader(&self, exclusive: bool) -> bool {
        let req = Request::CheckConsume {
            group: self.key.clone(),
            exclusive,
        };
        match self.call_leader(req) {
            Some(Response::Done(Err(e))) => e != EXCLUSIVE_USE,
            _ => true,
        }
    }

    /// basic.get on a member that does not lead: the leader's node hands out the message.
    /// None when the queue is empty or the leader's node cannot be asked.
    pub(super) fn get_from_leader(&self, no_ack: bool) -> Option<(QueuedMessage, u32)> {
        let req = Request::Get {
            group: self.key.clone(),
            no_ack,
        };
        match self.call_leader(req)? {
            Response::Got(Ok(Some((m, left)))) => Some((m.into_queued(), left)),
            Response::Got(Ok(None)) => None,
            other => {
                debug!(queue = %self.name, answer = ?other, "basic.get through the leader's node failed");
                None
            }
        }
    }

    /// queue.purge here, when this member leads: drops every ready message not handed out;
    /// the number dropped. None when this member does not lead.
    pub(super) fn purge_here(&self) -> Option<u32> {
        let mut props = Proposals::default();
        let n = {
            let mut st = self.inner.lock();
            if !st.leading() {
                return None;
            }
            let keys: Vec<u64> = st
                .qs
                .ready()
                .iter()
                .filter(|k| !st.out.contains_key(k))
                .copied()
                .collect();
            for k in &keys {
                st.out.insert(*k, Out::Dropping);
            }
            let n = keys.len() as u32;
            props.purged = keys;
            n
        };
        self.propose(props);
        Some(n)
    }

    /// queue.purge on a member that does not lead: the leader's node purges. The number of
    /// messages purged (0 when the leader's node cannot be asked).
    pub(super) fn purge_at_leader(&self) -> u32 {
        let req = Request::Purge {
            group: self.key.clone(),
        };
        match self.call_leader(req) {
            Some(Response::Purged(Ok(n))) => n,
            other => {
                debug!(queue = %self.name, answer = ?other, "queue.purge through the leader's node failed");
                0
            }
        }
    }

    /// Tells the leader's node this node's consumers when they, the leader, its term or the
    /// connection to it changed since it last accepted them (one list on its way at a
    /// time; the vhost's sweep calls this again after a failure).
    pub(super) fn sync_subscription(&self) {
        let Some(cluster) = self.node.cluster().cloned() else {
            return;
        };
        let Some(raft) = self.raft.get() else { return };
        let (leader, term) = {
            let m = raft.metrics();
            let m = m.borrow();
            (m.current_leader, m.current_term)
        };
        let me = self.node.cfg.node_id;
        let Some(leader) = leader.filter(|l| *l != me) else {
            return;
        };
        let Some(generation) = cluster.generation(leader) else {
            return;
        };
        let (consumers, want) = {
            let mut st = self.inner.lock();
            let sub = &st.subscription;
            if st.deleted || sub.pending || st.leader_term.is_some() {
                return;
            }
            let want = (leader, term, generation, sub.version);
            if sub.sent == Some(want) {
                return;
            }
            let same_link = sub
                .sent
                .is_some_and(|s| (s.0, s.1, s.2) == (leader, term, generation));
            if !same_link {
                // What the previous leader (or connection) handed out and the channels did
                // not take yet is returned there, or by the new leadership.
                st.parked.clear();
            }
            let consumers: Vec<RemoteConsumer> = st
                .consumers
                .iter()
                .filter(|c| c.remote.is_none())
                .map(|c| RemoteConsumer {
                    id: c.id,
                    tag: c.c.tag.to_string(),
                    no_ack: c.c.no_ack,
                    prefetch: c.c.prefetch,
                    priority: c.priority,
                    exclusive: c.c.exclusive,
                })
                .collect();
            let sub = &mut st.subscription;
            sub.target = Some((leader, term));
            if consumers.is_empty() && !same_link {
                // Nothing to tell a leader that never had this node's consumers.
                sub.sent = Some(want);
                return;
            }
            sub.pending = true;
            (consumers, want)
        };
        let Some(q) = self.myself() else { return };
        self.node.runtime.spawn(async move {
            let req = Request::Subscribe {
                group: q.key.clone(),
                term,
                consumers,
            };
            let r = cluster
                .call(leader, req, Duration::ZERO, REMOTE_CALL_TIMEOUT)
                .await;
            let ok = matches!(r, Ok(Response::Subscribed(Ok(()))));
            {
                let mut st = q.inner.lock();
                st.subscription.pending = false;
                if ok {
                    st.subscription.sent = Some(want);
                } else {
                    debug!(queue = %q.name, leader, term, answer = ?r, "consumers not subscribed at the leader's node");
                }
            }
            if ok {
                // The consumers may have changed meanwhile.
                q.sync_subscription();
            }
        });
    }

    /// Offers the parked deliveries to their consumers' channels again, in order; those of a
    /// consumer that is gone are returned.
    pub(super) fn offer_parked(&self, st: &mut Inner, this: &Arc<Queue>, props: &mut Proposals) {
        if st.parked.is_empty() {
            return;
        }
        let parked = std::mem::take(&mut st.parked);
        let mut full: Vec<u64> = Vec::new();
        for (id, qm) in parked {
            if full.contains(&id) {
                st.parked.push((id, qm));
                continue;
            }
            match st
                .consumers
                .iter()
                .find(|c| c.remote.is_none() && c.id == id)
            {
                None => props.returned.push(qm.seq),
                Some(c) => {
                    if let Err(qm) = c.c.target.deliver(this, &c.c.tag, c.c.no_ack, qm) {
                        full.push(id);
                        st.parked.push((id, qm));
                    } else {
                        self.deliveries.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

/// The leader's answer when a consumer would break an exclusive use.
const EXCLUSIVE_USE: &str = "in exclusive use";

impl GroupServer for QuorumQueue {
    fn ready_to_hand_out(&self) -> bool {
        QuorumQueue::ready_to_hand_out(self)
    }

    fn subscribe(
        &self,
        peer: NodeId,
        term: u64,
        consumers: Vec<RemoteConsumer>,
    ) -> std::result::Result<(), String> {
        let Some(cluster) = self.node.cluster().cloned() else {
            return Err("this node is not in a cluster".into());
        };
        let Some(me) = self.myself() else {
            return Err("the queue is being deleted".into());
        };
        let this: Arc<Queue> = me;
        let mut props = Proposals::default();
        {
            let mut st = self.inner.lock();
            if st.deleted {
                return Err("the queue is being deleted".into());
            }
            if st.leader_term != Some(term) {
                return Err(format!("this node does not lead the queue in term {term}"));
            }
            let mut kept: HashMap<u64, u32> = HashMap::new();
            st.consumers.retain(|c| match c.remote {
                Some((node, id)) if node == peer => {
                    kept.insert(id, c.in_flight);
                    false
                }
                _ => true,
            });
            for rc in consumers {
                let target = Arc::new(RemoteTarget {
                    cluster: cluster.clone(),
                    peer,
                    group: self.key.clone(),
                    term,
                    consumer: rc.id,
                });
                let c = Consumer::new(
                    rc.tag.into(),
                    target,
                    rc.no_ack,
                    rc.exclusive,
                    rc.prefetch,
                    FieldTable::new(),
                );
                st.consumers.push(QConsumer {
                    c,
                    priority: rc.priority,
                    in_flight: kept.get(&rc.id).copied().unwrap_or(0),
                    id: 0,
                    remote: Some((peer, rc.id)),
                });
            }
            self.dispatch_locked(&mut st, &this, &mut props);
        }
        self.propose(props);
        self.touch();
        Ok(())
    }

    fn deliver(&self, peer: NodeId, term: u64, consumer: u64, delivery: RemoteMessage) {
        let Some(me) = self.myself() else { return };
        let this: Arc<Queue> = me;
        let mut props = Proposals::default();
        {
            let mut st = self.inner.lock();
            // From a leadership this node no longer follows: that leadership's end returns
            // the message.
            if st.deleted
                || st.leader_term.is_some()
                || st.subscription.target != Some((peer, term))
            {
                return;
            }
            let qm = delivery.into_queued();
            let waiting = st.parked.iter().any(|(id, _)| *id == consumer);
            match st
                .consumers
                .iter()
                .find(|c| c.remote.is_none() && c.id == consumer)
            {
                None => props.returned.push(qm.seq),
                Some(_) if waiting => st.parked.push((consumer, qm)),
                Some(c) => match c.c.target.deliver(&this, &c.c.tag, c.c.no_ack, qm) {
                    Ok(()) => {
                        self.deliveries.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(qm) => st.parked.push((consumer, qm)),
                },
            }
        }
        self.propose(props);
    }

    fn get(
        &self,
        peer: NodeId,
        no_ack: bool,
    ) -> std::result::Result<Option<(RemoteMessage, u32)>, String> {
        self.touch();
        let holder = Out::Remote {
            node: peer,
            consumer: 0,
        };
        let got = self
            .take_one(no_ack, holder)
            .ok_or_else(|| "this node does not lead the queue".to_string())?;
        Ok(got.map(|(qm, left)| {
            (
                RemoteMessage {
                    key: qm.seq,
                    redelivered: qm.redelivered,
                    message: WireMessage(qm.message),
                },
                left,
            )
        }))
    }

    fn purge(&self) -> std::result::Result<u32, String> {
        self.purge_here()
            .ok_or_else(|| "this node does not lead the queue".to_string())
    }

    fn check_consume(&self, exclusive: bool) -> std::result::Result<(), String> {
        let st = self.inner.lock();
        if !st.leading() {
            return Err("this node does not lead the queue".into());
        }
        if st.consumers.iter().any(|c| c.c.exclusive) || (exclusive && !st.consumers.is_empty()) {
            return Err(EXCLUSIVE_USE.into());
        }
        Ok(())
    }

    fn change_member(&self, node: NodeId, add: bool) -> crate::remote::MemberChange {
        let me = self.myself();
        Box::pin(async move {
            match me {
                // At the leader's node, from here when this member does not lead (asked by a
                // node without a member).
                Some(q) => q.change_member(node, add).await,
                None => Err("the queue is being deleted".into()),
            }
        })
    }

    fn peer_lost(&self, peer: NodeId) {
        let mut props = Proposals::default();
        {
            let mut st = self.inner.lock();
            st.consumers
                .retain(|c| c.remote.is_none_or(|(node, _)| node != peer));
            if st.leading() {
                let held: Vec<u64> = st
                    .out
                    .iter()
                    .filter(|(_, o)| matches!(o, Out::Remote { node, .. } if *node == peer))
                    .map(|(k, _)| *k)
                    .collect();
                for k in &held {
                    st.out.insert(*k, Out::Returning);
                }
                props.returned = held;
            }
        }
        if !props.returned.is_empty() {
            info!(queue = %self.name, vhost = %self.vhost, node = peer, messages = props.returned.len(), "deliveries to a node whose connection dropped are returned");
        }
        self.propose(props);
    }
}
