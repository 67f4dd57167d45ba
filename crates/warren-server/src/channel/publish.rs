//! basic.publish: assembling the content (method, header, body frames), the publish rules
//! of the operations layer, routing and enqueueing, and what the publisher is told.

use super::*;

/// A message being assembled from basic.publish, its content header and body frames.
pub(super) struct PendingContent {
    pub(super) publish: BasicPublish,
    /// What the operations layer established when basic.publish arrived.
    pub(super) check: PublishCheck,
    pub(super) header: Option<(u64, BasicProperties)>,
    pub(super) body: BytesMut,
    pub(super) single: Option<Bytes>,
}

impl Channel {
    /// Handles a content header frame.
    pub fn handle_header(
        &mut self,
        ctx: &Context,
        class_id: u16,
        weight: u16,
        body_size: u64,
        properties: BasicProperties,
    ) -> Result<(), BrokerError> {
        let Some(content) = self.content.as_mut() else {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                "expected method frame, got non method frame instead",
            ));
        };
        if content.header.is_some() {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                "expected content body, got non content body frame instead",
            ));
        }
        if class_id != BASIC_CLASS {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                format!(
                    "expected content header for class {BASIC_CLASS}, got one for class {class_id} instead"
                ),
            ));
        }
        // RabbitMQ's assembler takes a header with a non-zero weight for no header at all.
        if weight != 0 {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                format!(
                    "expected content header for class {BASIC_CLASS}, got non content header frame instead"
                ),
            ));
        }
        if body_size > ctx.limits.max_message_size {
            self.content = None;
            return Err(BrokerError::precondition_failed(format!(
                "message size {body_size} is larger than configured max size {}",
                ctx.limits.max_message_size
            )));
        }
        // Bodies being assembled are held in memory: bound them per connection, or a client
        // could start a large message on every channel and never finish them.
        let incomplete = ctx.incomplete_content.get() + body_size;
        if incomplete > ctx.limits.max_incomplete_content_bytes {
            self.content = None;
            return Err(BrokerError::precondition_failed(format!(
                "message size {body_size} would take the content this connection has started \
                 and not finished to {incomplete} bytes, over the limit of {} \
                 (amqp.max_incomplete_content_bytes)",
                ctx.limits.max_incomplete_content_bytes
            )));
        }
        ctx.incomplete_content.set(incomplete);
        content.header = Some((body_size, properties));
        if body_size == 0 {
            self.finish_publish(ctx)?;
        }
        Ok(())
    }

    /// Handles a body frame.
    pub fn handle_body(&mut self, ctx: &Context, payload: Bytes) -> Result<(), BrokerError> {
        let Some(content) = self.content.as_mut() else {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                "expected method frame, got non method frame instead",
            ));
        };
        let Some((size, _)) = content.header else {
            return Err(BrokerError::new(
                constants::UNEXPECTED_FRAME,
                format!(
                    "expected content header for class {BASIC_CLASS}, got non content header frame instead"
                ),
            ));
        };
        let have = content.single.as_ref().map_or(0, |b| b.len()) + content.body.len();
        if (have + payload.len()) as u64 > size {
            // RabbitMQ 4.x's text (3.x waits for ever).
            return Err(BrokerError::new(
                constants::FRAME_ERROR,
                "content body frame exceeds remaining content size",
            ));
        }
        if have == 0 {
            content.single = Some(payload);
        } else {
            if let Some(first) = content.single.take() {
                content.body.reserve(size as usize);
                content.body.extend_from_slice(&first);
            }
            content.body.extend_from_slice(&payload);
        }
        if payload_len(content) as u64 >= size {
            self.finish_publish(ctx)?;
        }
        Ok(())
    }

    /// Forgets the message being assembled, if any, and returns its share of the connection's
    /// incomplete-content budget.
    pub(super) fn take_content(&mut self, ctx: &Context) -> Option<PendingContent> {
        let content = self.content.take()?;
        if let Some((size, _)) = &content.header {
            let left = ctx.incomplete_content.get().saturating_sub(*size);
            ctx.incomplete_content.set(left);
        }
        Some(content)
    }

    pub(super) fn finish_publish(&mut self, ctx: &Context) -> MethodResult {
        let Some(content) = self.take_content(ctx) else {
            return Ok(());
        };
        let (_, properties) = content.header.unwrap_or_default();
        let body = match content.single {
            Some(b) => b,
            None => content.body.freeze(),
        };
        let msg = ctx.ops().prepare_message(
            content.check,
            content.publish.exchange,
            content.publish.routing_key,
            properties,
            body,
            self.reply_to.as_deref(),
        )?;
        bump(&self.shared.stats.counters.publish);
        if let Some(tx) = self.tx.as_mut() {
            let bytes = msg.body.len() as u64;
            tx.admit(&ctx.limits, bytes)?;
            tx.bytes += bytes;
            tx.publishes.push((msg, content.publish.mandatory));
            return Ok(());
        }
        let Some(confirms) = self.confirm.clone() else {
            self.route_and_enqueue(ctx, msg, content.publish.mandatory, None)?;
            return Ok(());
        };
        let seq = confirms.begin();
        let waiter: Arc<dyn Completion> = confirms.clone();
        match self.route_and_enqueue(ctx, msg, content.publish.mandatory, Some((waiter, seq))) {
            Ok(Some(p)) => {
                if p.rejected {
                    // A full queue with overflow reject-publish refused it.
                    confirms.settle(seq, false);
                } else if !p.stored {
                    confirms.settle(seq, true);
                }
                Ok(())
            }
            Ok(None) => {
                confirms.settle(seq, false);
                Ok(())
            }
            Err(e) => {
                confirms.settle(seq, false);
                Err(e)
            }
        }
    }

    /// Routes and enqueues one publish; a mandatory publish that reaches no queue comes back
    /// as basic.return 312 NO_ROUTE. `Ok(None)` means the message store refused the write
    /// (disk full or failing): the message went nowhere.
    pub(super) fn route_and_enqueue(
        &mut self,
        ctx: &Context,
        msg: Arc<Message>,
        mandatory: bool,
        waiter: Option<(Arc<dyn Completion>, u64)>,
    ) -> Result<Option<Published>, BrokerError> {
        let mut published = match ctx.ops().publish(msg.clone(), waiter) {
            Ok(p) => p,
            Err(PublishError::Broker(e)) => return Err(e),
            Err(PublishError::StoreUnavailable(reason)) => {
                // Every publish is refused while the disk is full: one line per interval,
                // with the count of the refusals it stands for.
                static REFUSED: LogLimit = LogLimit::new();
                if let Some(suppressed) = REFUSED.admit() {
                    tracing::warn!(%reason, suppressed, "publish refused: message store unavailable");
                }
                return Ok(None);
            }
        };
        self.shared
            .stats
            .count_exchange(&msg.exchange, published.queues);
        if !published.routed && !mandatory {
            bump(&self.shared.stats.counters.drop_unroutable);
        }
        if !published.routed && mandatory {
            bump(&self.shared.stats.counters.return_unroutable);
            let method = Method::BasicReturn(BasicReturn {
                reply_code: constants::NO_ROUTE,
                reply_text: "NO_ROUTE".into(),
                exchange: msg.exchange.clone(),
                routing_key: msg.routing_key.clone(),
            });
            self.shared
                .outbox
                .with(|buf| write_content(buf, self.id(), &method, &msg, self.shared.frame_max));
        }
        if let Some(q) = published.pressured.take() {
            self.pressure = Some(q);
        }
        Ok(Some(published))
    }
}

pub(super) fn payload_len(c: &PendingContent) -> usize {
    c.single.as_ref().map_or(0, |b| b.len()) + c.body.len()
}
