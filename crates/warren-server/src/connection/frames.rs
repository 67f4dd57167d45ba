//! The frame loop's state: [`Conn`] routes each frame to its channel, handles the
//! connection class's methods, and turns channel and connection errors into closes.

use super::*;
use crate::channel::AckCheck;
use rustc_hash::FxHashMap;

pub(super) struct Conn {
    pub(super) id: u64,
    /// This connection's entry in the operators' read model.
    pub(super) registration: ConnectionHandle,
    pub(super) vhost: Arc<VHost>,
    pub(super) outbox: Arc<Outbox>,
    /// The open channels. Boxed: a map's table reserves room for several entries at once,
    /// and most connections use one channel (an idle connection's memory, bench (h)).
    /// Looked up for every frame, with FxHash: the numbers come from this connection's own
    /// client and are bounded by channel_max, so a keyed hash (SipHash, about 80
    /// instructions per lookup) protects nothing here.
    pub(super) channels: FxHashMap<u16, Box<Channel>>,
    pub(super) frame_max: u32,
    pub(super) channel_max: u16,
    pub(super) cancel_notify: bool,
    pub(super) limits: ChannelLimits,
    /// Content announced and not yet received over all channels, bytes.
    pub(super) incomplete_content: Cell<u64>,
    /// This connection's place in the vhost's and user's connection and channel counts;
    /// given up at cleanup, so that a closing connection no longer counts.
    pub(super) slot: Option<ConnectionSlot>,
    pub(super) state: Arc<ServerState>,
    pub(super) actor: Arc<Actor>,
    pub(super) durable: Arc<dyn DurableSink>,
    /// The client published since the last check (the memory alarm pauses publishers).
    pub(super) published: bool,
    /// When the channels' delivery acknowledgement timeouts are checked next; `None` while
    /// no channel has an unacknowledged delivery or a consumer that acknowledges (a manual-ack
    /// basic.consume or basic.get sets it).
    pub(super) ack_due: Option<std::time::Instant>,
}

impl Conn {
    pub(super) fn handle_frame(&mut self, frame: Frame) -> Option<End> {
        let ctx = Context {
            broker: &self.state.broker,
            actor: &self.actor,
            vhost: &self.vhost,
            limits: self.limits,
            incomplete_content: &self.incomplete_content,
            durable: &self.durable,
        };
        match frame {
            Frame::Heartbeat { channel: 0 } => None,
            // RabbitMQ: a heartbeat belongs on channel 0.
            Frame::Heartbeat { channel } => Some(End::Error(ConnError::new(
                constants::UNEXPECTED_FRAME,
                format!("heartbeat frame on channel {channel}"),
            ))),
            Frame::Method { channel: 0, method } => self.connection_method(method),
            Frame::Method { channel, method } => {
                let (class_id, method_id) = (method.class_id(), method.method_id());
                match &method {
                    Method::BasicPublish(_) => self.published = true,
                    // A new consumer's queue may set a shorter timeout than those watched:
                    // check at once. A basic.get starts the watch when there is none.
                    Method::BasicConsume(m) if !m.no_ack => {
                        self.ack_due = Some(std::time::Instant::now());
                    }
                    Method::BasicGet(m) if !m.no_ack && self.ack_due.is_none() => {
                        self.ack_due = Some(std::time::Instant::now());
                    }
                    _ => {}
                }
                let Some(ch) = self.channels.get_mut(&channel) else {
                    return match method {
                        Method::ChannelOpen(_) => {
                            // channel_max bounds how many channels are open at once, not their
                            // numbers (RabbitMQ's rabbit_reader:create_channel).
                            let open = self.channels.len();
                            if self.channel_max != 0 && open >= usize::from(self.channel_max) {
                                return Some(End::Error(ConnError::new(
                                    constants::NOT_ALLOWED,
                                    format!(
                                        "number of channels opened ({open}) has reached the negotiated channel_max ({})",
                                        self.channel_max
                                    ),
                                )));
                            }
                            // The user's max-channels over all their connections (530).
                            let counted = self.slot.as_mut().map(|slot| {
                                slot.open_channel(&self.state.broker.access(), open as u64)
                            });
                            if let Some(Err(e)) = counted {
                                // RabbitMQ names no method in this close.
                                return Some(End::Error(ConnError::from_broker(e, 0, 0)));
                            }
                            let ch = Channel::new(
                                channel,
                                self.outbox.clone(),
                                self.frame_max,
                                self.cancel_notify,
                                self.registration.open_channel(channel),
                                self.limits.consumer_timeout,
                            );
                            self.outbox.send(
                                channel,
                                &Method::ChannelOpenOk(ChannelOpenOk {
                                    channel_id: Bytes::new(),
                                }),
                            );
                            self.channels.insert(channel, Box::new(ch));
                            None
                        }
                        _ => Some(End::Error(ConnError {
                            class_id,
                            method_id,
                            ..ConnError::new(constants::CHANNEL_ERROR, "expected 'channel.open'")
                        })),
                    };
                };
                // A method where content was expected: RabbitMQ names the pending basic.publish.
                let (class_id, method_id) = if ch.expects_content() {
                    (BASIC_CLASS, BasicPublish::METHOD_ID)
                } else {
                    (class_id, method_id)
                };
                ch.settle_commit(&ctx);
                if ch.closing {
                    match method {
                        Method::ChannelCloseOk(_) => {
                            self.channels.remove(&channel);
                        }
                        Method::ChannelClose(_) => {
                            self.outbox
                                .send(channel, &Method::ChannelCloseOk(ChannelCloseOk {}));
                            self.channels.remove(&channel);
                        }
                        _ => {}
                    }
                    return None;
                }
                match ch.handle_method(&ctx, method) {
                    Ok(Outcome::Done) => None,
                    Ok(Outcome::Closed) => {
                        self.channels.remove(&channel);
                        None
                    }
                    Err(e) => self.channel_error(channel, e, class_id, method_id),
                }
            }
            Frame::Header {
                channel,
                class_id,
                weight,
                body_size,
                properties,
            } => {
                let ch = match content_channel(&mut self.channels, channel) {
                    Ok(Some(ch)) => ch,
                    Ok(None) => return None,
                    Err(e) => return Some(End::Error(e)),
                };
                let (c, m) = content_error_ids(ch);
                match ch.handle_header(&ctx, class_id, weight, body_size, properties) {
                    Ok(()) => None,
                    Err(e) => self.channel_error(channel, e, c, m),
                }
            }
            Frame::Body { channel, payload } => {
                let ch = match content_channel(&mut self.channels, channel) {
                    Ok(Some(ch)) => ch,
                    Ok(None) => return None,
                    Err(e) => return Some(End::Error(e)),
                };
                let (c, m) = content_error_ids(ch);
                match ch.handle_body(&ctx, payload) {
                    Ok(()) => None,
                    Err(e) => self.channel_error(channel, e, c, m),
                }
            }
        }
    }

    /// Soft errors close the channel; hard ones the connection.
    pub(super) fn channel_error(
        &mut self,
        channel: u16,
        e: BrokerError,
        class_id: u16,
        method_id: u16,
    ) -> Option<End> {
        if e.is_hard() {
            return Some(End::Error(ConnError::from_broker(e, class_id, method_id)));
        }
        debug!(channel, code = e.code, text = %e.text, "closing channel");
        let ctx = Context {
            broker: &self.state.broker,
            actor: &self.actor,
            vhost: &self.vhost,
            limits: self.limits,
            incomplete_content: &self.incomplete_content,
            durable: &self.durable,
        };
        if let Some(ch) = self.channels.get_mut(&channel) {
            ch.close_with_error(&ctx, &e, class_id, method_id);
        }
        None
    }

    pub(super) fn connection_method(&mut self, method: Method) -> Option<End> {
        match method {
            Method::ConnectionClose(_) => {
                self.cleanup();
                self.outbox
                    .send(0, &Method::ConnectionCloseOk(ConnectionCloseOk {}));
                Some(End::ClientClosed)
            }
            Method::ConnectionUpdateSecret(_) => {
                self.outbox.send(
                    0,
                    &Method::ConnectionUpdateSecretOk(ConnectionUpdateSecretOk {}),
                );
                None
            }
            // RabbitMQ (rabbit_reader:handle_method0) answers CHANNEL_ERROR here.
            other => Some(End::Error(ConnError {
                class_id: other.class_id(),
                method_id: other.method_id(),
                ..ConnError::new(
                    constants::CHANNEL_ERROR,
                    "unexpected method in connection state running",
                )
            })),
        }
    }

    /// Checks every channel's oldest unacknowledged delivery against its acknowledgement
    /// timeout: a channel whose delivery waited too long is closed with RabbitMQ's 406
    /// PRECONDITION_FAILED (its deliveries are requeued). Sets when to check next.
    pub(super) fn check_acks(&mut self) {
        let mut next: Option<std::time::Instant> = None;
        let mut timed_out = Vec::new();
        for (&id, ch) in &mut self.channels {
            if ch.closing {
                continue;
            }
            match ch.check_ack_timeout() {
                AckCheck::Idle => {}
                AckCheck::Watching { period, due } => {
                    let mut t = std::time::Instant::now() + period;
                    if let Some(d) = due {
                        t = t.min(d);
                    }
                    next = Some(next.map_or(t, |n| n.min(t)));
                }
                AckCheck::TimedOut(t) => timed_out.push((id, t)),
            }
        }
        self.ack_due = next;
        for (id, t) in timed_out {
            // RabbitMQ's warning (rabbit_channel:handle_consumer_timed_out).
            warn!(
                "Consumer '{}' on channel {id} and {} has timed out waiting for a consumer \
                 acknowledgement of a delivery with delivery tag = {}. Timeout used: {} ms. \
                 This timeout value can be configured, see consumers doc guide to learn more",
                t.consumer_tag.as_deref().unwrap_or("none"),
                t.queue,
                t.delivery_tag,
                t.timeout
            );
            let _ = self.channel_error(id, t.error(id), 0, 0);
        }
    }

    pub(super) fn take_pressure(&mut self) -> Vec<Arc<warren_broker::Queue>> {
        let mut out: Vec<Arc<warren_broker::Queue>> = Vec::new();
        for ch in self.channels.values_mut() {
            if let Some(q) = ch.take_pressure() {
                if !out.iter().any(|o| Arc::ptr_eq(o, &q)) {
                    out.push(q);
                }
            }
        }
        out
    }

    pub(super) fn flush_confirms(&mut self) {
        for ch in self.channels.values_mut() {
            ch.flush_confirms();
        }
    }

    /// Releases every channel's consumers and unacked messages, and this connection's
    /// exclusive queues. Idempotent.
    pub(super) fn cleanup(&mut self) {
        let ctx = Context {
            broker: &self.state.broker,
            actor: &self.actor,
            vhost: &self.vhost,
            limits: self.limits,
            incomplete_content: &self.incomplete_content,
            durable: &self.durable,
        };
        for (_, mut ch) in self.channels.drain() {
            ch.cleanup(&ctx);
        }
        self.vhost.remove_exclusive_queues(self.id);
        self.slot = None;
    }
}

/// Class and method ids for an error caused by a content frame: the pending basic.publish, or
/// none when no content was expected (as RabbitMQ reports them).
pub(super) fn content_error_ids(ch: &Channel) -> (u16, u16) {
    if ch.expects_content() {
        (BASIC_CLASS, BasicPublish::METHOD_ID)
    } else {
        (0, 0)
    }
}

/// The open channel a content frame belongs to; `Ok(None)` when the channel is closing
/// (the frame is discarded). A content frame on channel 0 or on a channel that is not open is
/// 505 UNEXPECTED_FRAME, as in RabbitMQ (whose channel expects a method first).
pub(super) fn content_channel(
    channels: &mut FxHashMap<u16, Box<Channel>>,
    channel: u16,
) -> Result<Option<&mut Channel>, ConnError> {
    if channel == 0 {
        return Err(ConnError::new(
            constants::UNEXPECTED_FRAME,
            "content frame on channel 0",
        ));
    }
    match channels.get_mut(&channel) {
        None => Err(ConnError::new(
            constants::UNEXPECTED_FRAME,
            "expected method frame, got non method frame instead",
        )),
        Some(ch) if ch.closing => Ok(None),
        Some(ch) => Ok(Some(ch)),
    }
}
