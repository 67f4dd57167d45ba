//! The half of a channel that queues reach from any task: [`ChannelShared`] takes deliveries
//! (it is the queues' [`DeliveryTarget`]), numbers them with delivery tags and keeps the unacked
//! map, the consumers and the channel-wide prefetch behind one mutex.

use super::*;

/// A message delivered on this channel and not yet settled.
pub(super) struct Unacked {
    pub(super) queue: Arc<Queue>,
    pub(super) consumer_tag: Option<Arc<str>>,
    pub(super) message: QueuedMessage,
}

pub(super) struct ConsumerInfo {
    pub(super) queue: Arc<Queue>,
    /// What operators see of it (`None` for direct reply-to's consumer, which RabbitMQ does
    /// not list).
    pub(super) details: Option<ConsumerDetails>,
}

/// What a channel took from one queue: its per-queue stats (RabbitMQ's channel-queue
/// `deliveries`). Held with a weak reference to the queue, which keeps the queue's
/// allocation (not its contents) and so its address, the tally's key, from being reused.
pub(super) struct QueueTally {
    queue: std::sync::Weak<Queue>,
    counts: QueueDeliveries,
}

/// The tallies of a channel by queue address: counted under the channel's lock, which
/// deliveries, gets and acks hold anyway (a hash lookup of a pointer each). The tallies of
/// deleted queues are dropped whenever the map has doubled since the last sweep of it, so
/// that a channel that consumes from one short-lived queue after another (a reply queue
/// per request) keeps only the live ones.
#[derive(Default)]
pub(super) struct Tallies {
    map: rustc_hash::FxHashMap<usize, QueueTally>,
    /// The size at which a new tally makes the next use drop those of deleted queues.
    sweep_at: usize,
    /// A sweep is due at the next use.
    sweep_due: bool,
}

/// The fewest tallies a channel keeps before it looks for deleted queues' ones.
const TALLY_SWEEP_MIN: usize = 16;

impl Tallies {
    /// The tally of `queue`, made at its first use.
    #[inline]
    pub(super) fn of(&mut self, queue: &Arc<Queue>) -> &mut QueueDeliveries {
        if self.sweep_due {
            self.sweep();
        }
        let due = &mut self.sweep_due;
        let at = self.sweep_at.max(TALLY_SWEEP_MIN);
        let len = self.map.len();
        &mut self
            .map
            .entry(Arc::as_ptr(queue) as *const () as usize)
            .or_insert_with(|| {
                *due = len + 1 >= at;
                QueueTally {
                    queue: Arc::downgrade(queue),
                    counts: QueueDeliveries::default(),
                }
            })
            .counts
    }

    /// Drops the tallies of deleted queues.
    #[cold]
    fn sweep(&mut self) {
        self.map.retain(|_, t| t.queue.strong_count() > 0);
        self.sweep_at = 2 * self.map.len();
        self.sweep_due = false;
    }

    /// Counts `n` acknowledgements of deliveries from `queues` (runs of the same queue are
    /// looked up once).
    pub(super) fn acked<'a>(&mut self, queues: impl Iterator<Item = &'a Arc<Queue>>) {
        let mut run: Option<(&Arc<Queue>, u64)> = None;
        for q in queues {
            match &mut run {
                Some((r, n)) if Arc::ptr_eq(r, q) => *n += 1,
                _ => {
                    if let Some((r, n)) = run.take() {
                        self.of(r).ack += n;
                    }
                    run = Some((q, 1));
                }
            }
        }
        if let Some((r, n)) = run {
            self.of(r).ack += n;
        }
    }

    /// The tallies of the queues that still exist, named.
    fn named(&self) -> Vec<QueueDeliveries> {
        self.map
            .values()
            .filter_map(|t| {
                let q = t.queue.upgrade()?;
                Some(QueueDeliveries {
                    queue: q.name().to_string(),
                    ..t.counts.clone()
                })
            })
            .collect()
    }
}

pub(super) struct SharedState {
    pub(super) open: bool,
    pub(super) flow: bool,
    pub(super) next_tag: u64,
    pub(super) unacked: BTreeMap<u64, Unacked>,
    /// Body bytes of `unacked`.
    pub(super) unacked_bytes: usize,
    /// Unacknowledged deliveries beyond the in-memory bound, by store location.
    pub(super) paged: PagedUnacked,
    pub(super) global_prefetch: u16,
    pub(super) consumers: HashMap<Arc<str>, ConsumerInfo>,
    /// Set while the connection task handles a method on this channel: basic.cancel
    /// notifications raised meanwhile wait in `deferred_cancels` until the method's reply is
    /// queued (RabbitMQ sends queue.delete-ok before the basic.cancel it causes on the same
    /// channel; py-amqp fails queue_delete otherwise).
    pub(super) replying: bool,
    pub(super) deferred_cancels: Vec<Arc<str>>,
    /// A consumer registered with its queue whose basic.consume-ok is not queued yet: other
    /// tasks must not deliver to it before the client has learned its tag.
    pub(super) announcing: Option<Arc<str>>,
    /// What the channel took from each queue.
    pub(super) tallies: Tallies,
}

/// The part of a channel that queues deliver into.
pub struct ChannelShared {
    pub(super) key: u64,
    pub(super) id: u16,
    pub(super) outbox: Arc<Outbox>,
    pub(super) frame_max: u32,
    pub(super) cancel_notify: bool,
    /// The broker's delivery acknowledgement timeout, ms (`None`: off).
    pub(super) consumer_timeout: Option<u64>,
    pub(super) st: Mutex<SharedState>,
    /// Counters and modes in the operators' read model.
    pub(super) stats: Arc<ChannelEntry>,
}

impl ChannelProbe for ChannelShared {
    fn unacked(&self) -> u64 {
        let st = self.st.lock();
        (st.unacked.len() + st.paged.len()) as u64
    }

    fn consumers(&self) -> Vec<ConsumerDetails> {
        let listed: Vec<(ConsumerDetails, Arc<Queue>)> = {
            let st = self.st.lock();
            st.consumers
                .values()
                .filter_map(|c| c.details.clone().map(|d| (d, c.queue.clone())))
                .collect()
        };
        // The queues' settings are read with the channel unlocked (queues lock before
        // channels).
        let mut out: Vec<ConsumerDetails> = listed
            .into_iter()
            .map(|(mut d, q)| {
                d.consumer_timeout =
                    super::ack_timeout::timeout_for(q.as_ref(), self.consumer_timeout);
                d
            })
            .collect();
        out.sort_by(|a, b| a.tag.cmp(&b.tag));
        out
    }

    fn deliveries(&self) -> Vec<QueueDeliveries> {
        let tallies: Vec<QueueDeliveries> = self.st.lock().tallies.named();
        tallies
    }
}

/// Writes a content-bearing method, its content header and body frames.
pub fn write_content(
    buf: &mut BytesMut,
    channel: u16,
    method: &Method,
    msg: &Message,
    frame_max: u32,
) {
    buf.reserve(msg.body.len() + 256);
    encode_method_frame(channel, method, buf);
    write_header_and_body(buf, channel, msg, frame_max);
}

/// Writes the content header (with the message's properties, encoded once per message) and
/// the body frames.
pub(super) fn write_header_and_body(
    buf: &mut BytesMut,
    channel: u16,
    msg: &Message,
    frame_max: u32,
) {
    let props = msg.encoded_properties();
    buf.put_u8(FRAME_HEADER);
    buf.put_u16(channel);
    buf.put_u32(12 + props.len() as u32);
    buf.put_u16(BASIC_CLASS);
    buf.put_u16(0);
    buf.put_u64(msg.body.len() as u64);
    buf.put_slice(props);
    buf.put_u8(FRAME_END);
    encode_body_frames(channel, &msg.body, frame_max, buf);
}

/// Writes basic.deliver and its content straight into `buf`: the hot path of every consumer,
/// so without building a [`Method`] (which would copy three strings per delivery).
pub(super) fn write_delivery(
    buf: &mut BytesMut,
    channel: u16,
    consumer_tag: &str,
    delivery_tag: u64,
    redelivered: bool,
    msg: &Message,
    frame_max: u32,
) {
    buf.reserve(
        msg.body.len() + consumer_tag.len() + msg.exchange.len() + msg.routing_key.len() + 128,
    );
    buf.put_u8(FRAME_METHOD);
    buf.put_u16(channel);
    let size_at = buf.len();
    buf.put_u32(0);
    buf.put_u16(BASIC_CLASS);
    buf.put_u16(BasicDeliver::METHOD_ID);
    put_shortstr(buf, consumer_tag);
    buf.put_u64(delivery_tag);
    buf.put_u8(u8::from(redelivered));
    put_shortstr(buf, &msg.exchange);
    put_shortstr(buf, &msg.routing_key);
    let size = (buf.len() - size_at - 4) as u32;
    buf[size_at..size_at + 4].copy_from_slice(&size.to_be_bytes());
    buf.put_u8(FRAME_END);
    write_header_and_body(buf, channel, msg, frame_max);
}

impl DeliveryTarget for ChannelShared {
    fn channel_key(&self) -> u64 {
        self.key
    }

    fn deliver(
        &self,
        queue: &Arc<Queue>,
        consumer_tag: &Arc<str>,
        no_ack: bool,
        msg: QueuedMessage,
    ) -> Result<(), QueuedMessage> {
        let mut st = self.st.lock();
        if !st.open || !st.flow || st.announcing.as_ref() == Some(consumer_tag) {
            return Err(msg);
        }
        if !no_ack
            && st.global_prefetch != 0
            && st.unacked.len() + st.paged.len() >= usize::from(st.global_prefetch)
        {
            return Err(msg);
        }
        let tag = st.next_tag + 1;
        let high_water = self.outbox.high_water();
        let written = self.outbox.with(|buf| {
            if buf.len() >= high_water {
                return false;
            }
            write_delivery(
                buf,
                self.id,
                consumer_tag,
                tag,
                msg.redelivered,
                &msg.message,
                self.frame_max,
            );
            true
        });
        if !written {
            drop(st);
            self.outbox.park(queue);
            return Err(msg);
        }
        let counters = &self.stats.counters;
        bump(if no_ack {
            &counters.deliver_no_ack
        } else {
            &counters.deliver
        });
        let tally = st.tallies.of(queue);
        if no_ack {
            tally.deliver_no_ack += 1;
        } else {
            tally.deliver += 1;
        }
        if msg.redelivered {
            bump(&counters.redeliver);
            tally.redeliver += 1;
        }
        st.next_tag = tag;
        if !no_ack {
            hold(&mut st, tag, queue, Some(consumer_tag.clone()), msg);
        }
        Ok(())
    }

    fn cancelled_by_broker(&self, consumer_tag: &Arc<str>) {
        let mut st = self.st.lock();
        if st.consumers.remove(consumer_tag).is_some() && st.open && self.cancel_notify {
            if st.replying {
                st.deferred_cancels.push(consumer_tag.clone());
                return;
            }
            self.outbox.send(
                self.id,
                &Method::BasicCancel(BasicCancel {
                    consumer_tag: consumer_tag.to_string(),
                    nowait: true,
                }),
            );
        }
    }
}

/// Keeps delivery `tag` until it is settled: in memory, or by its store location once the
/// channel holds the queue's `unacked_window` in memory.
pub(super) fn hold(
    st: &mut SharedState,
    tag: u64,
    queue: &Arc<Queue>,
    consumer_tag: Option<Arc<str>>,
    msg: QueuedMessage,
) {
    if let Some((count, bytes)) = queue.unacked_window() {
        if st.unacked.len() >= count || st.unacked_bytes >= bytes {
            if let Some(e) = queue.page_out(&msg) {
                st.paged.push(tag, queue, consumer_tag, e);
                return;
            }
        }
    }
    st.unacked_bytes += msg.message.body.len();
    st.unacked.insert(
        tag,
        Unacked {
            queue: queue.clone(),
            consumer_tag,
            message: msg,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_amqp::table::FieldTable;

    fn queue(name: &str) -> Arc<Queue> {
        Arc::new(warren_broker::ClassicQueue::new(
            name,
            "/",
            false,
            None,
            false,
            FieldTable::new(),
        ))
    }

    #[test]
    fn tallies_count_per_queue_and_forget_deleted_queues() {
        let mut t = Tallies::default();
        let kept = queue("kept");
        t.of(&kept).deliver += 2;
        t.acked([&kept, &kept].into_iter());
        // A reply queue per request: each used once, then deleted.
        for i in 0..1000 {
            let q = queue(&format!("reply-{i}"));
            t.of(&q).get += 1;
            t.of(&kept).deliver += 1;
        }
        assert!(t.map.len() <= 2 * TALLY_SWEEP_MIN, "{}", t.map.len());
        let named = t.named();
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].queue, "kept");
        assert_eq!((named[0].deliver, named[0].ack), (1002, 2));
    }
}
