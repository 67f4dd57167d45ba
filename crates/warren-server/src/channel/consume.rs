//! basic.qos, basic.consume (direct reply-to included), basic.cancel and basic.get.

use super::*;

impl Channel {
    pub(super) fn basic_qos(&mut self, m: BasicQos) -> MethodResult {
        if m.prefetch_size != 0 {
            return Err(BrokerError::not_implemented(format!(
                "prefetch_size!=0 ({})",
                m.prefetch_size
            )));
        }
        let queues = if m.global {
            let mut st = self.shared.st.lock();
            st.global_prefetch = m.prefetch_count;
            self.consumer_queues(&st)
        } else {
            self.consumer_prefetch = m.prefetch_count;
            Vec::new()
        };
        self.registration
            .entry()
            .set_prefetch(m.prefetch_count, m.global);
        self.send(BasicQosOk {});
        queues.iter().for_each(|q| q.dispatch());
        Ok(())
    }

    pub(super) fn consumer_queues(&self, st: &SharedState) -> Vec<Arc<Queue>> {
        let mut out: Vec<Arc<Queue>> = Vec::new();
        for c in st.consumers.values() {
            if !out.iter().any(|q| Arc::ptr_eq(q, &c.queue)) {
                out.push(c.queue.clone());
            }
        }
        out
    }

    pub(super) fn basic_consume(&mut self, ctx: &Context, m: BasicConsume) -> MethodResult {
        let tag: Arc<str> = if m.consumer_tag.is_empty() {
            names::consumer_tag().into()
        } else {
            m.consumer_tag.as_str().into()
        };
        if self.shared.st.lock().consumers.contains_key(&tag) {
            return Err(BrokerError::not_allowed(format!(
                "attempt to reuse consumer tag '{tag}'"
            )));
        }
        if m.queue == REPLY_TO {
            return self.consume_replies(ctx, tag, m.no_ack, m.nowait);
        }
        let details = ConsumerDetails {
            tag: tag.to_string(),
            queue: String::new(),
            ack_required: !m.no_ack,
            exclusive: m.exclusive,
            prefetch_count: self.consumer_prefetch,
            arguments: m.arguments.clone(),
            consumer_timeout: None,
        };
        let consumer = Consumer::new(
            tag.clone(),
            self.shared.clone(),
            m.no_ack,
            m.exclusive,
            self.consumer_prefetch,
            m.arguments,
        );
        // Until consume-ok is queued, a publish on another connection must not deliver to the
        // new consumer: basic.deliver would reach the client before the tag it names.
        self.shared.st.lock().announcing = Some(tag.clone());
        let q = match ctx.ops().consume(&m.queue, consumer) {
            Ok(q) => q,
            Err(e) => {
                self.shared.st.lock().announcing = None;
                return Err(e);
            }
        };
        self.shared.st.lock().consumers.insert(
            tag.clone(),
            ConsumerInfo {
                queue: q.clone(),
                details: Some(ConsumerDetails {
                    queue: q.name().to_string(),
                    ..details
                }),
            },
        );
        if !m.nowait {
            self.send(BasicConsumeOk {
                consumer_tag: tag.to_string(),
            });
        }
        self.shared.st.lock().announcing = None;
        q.dispatch();
        Ok(())
    }

    /// basic.consume on `amq.rabbitmq.reply-to` (direct reply-to): no queue, just a name that
    /// this channel's requests will carry in `reply_to`.
    pub(super) fn consume_replies(
        &mut self,
        ctx: &Context,
        tag: Arc<str>,
        no_ack: bool,
        nowait: bool,
    ) -> MethodResult {
        if !no_ack {
            return Err(BrokerError::precondition_failed(
                "reply consumer cannot acknowledge",
            ));
        }
        if self.reply_to.is_some() {
            return Err(BrokerError::precondition_failed(
                "reply consumer already set",
            ));
        }
        let target: Arc<dyn DeliveryTarget> = self.shared.clone();
        let name = ctx
            .ops()
            .consume_replies(Arc::downgrade(&target), tag.clone())?;
        self.reply_to = Some(name);
        self.shared.st.lock().consumers.insert(
            tag.clone(),
            ConsumerInfo {
                queue: ctx.vhost.reply_queue().clone(),
                details: None,
            },
        );
        if !nowait {
            self.send(BasicConsumeOk {
                consumer_tag: tag.to_string(),
            });
        }
        Ok(())
    }

    pub(super) fn cancel_consumer(&mut self, ctx: &Context, tag: &str) -> MethodResult {
        let ops = ctx.ops();
        ops.authorize(&Operation::BasicCancel)?;
        let Some(info) = self.shared.st.lock().consumers.remove(tag) else {
            return Ok(());
        };
        if Arc::ptr_eq(&info.queue, ctx.vhost.reply_queue()) {
            if let Some(name) = self.reply_to.take() {
                ops.cancel_replies(&name)?;
            }
            return Ok(());
        }
        ops.cancel(&info.queue, self.shared.key, tag)
    }

    pub(super) fn basic_get(&mut self, ctx: &Context, m: BasicGet) -> MethodResult {
        // Pop under the queue lock alone, then take the channel lock: queues lock themselves
        // before channels, never after.
        let got = ctx.ops().get(&m.queue, m.no_ack)?;
        let q = got.queue;
        let Some((msg, remaining)) = got.message else {
            bump(&self.shared.stats.counters.get_empty);
            self.send(BasicGetEmpty {
                cluster_id: String::new(),
            });
            return Ok(());
        };
        let counters = &self.shared.stats.counters;
        bump(if m.no_ack {
            &counters.get_no_ack
        } else {
            &counters.get
        });
        if msg.redelivered {
            bump(&counters.redeliver);
        }
        let mut st = self.shared.st.lock();
        let tally = st.tallies.of(&q);
        if m.no_ack {
            tally.get_no_ack += 1;
        } else {
            tally.get += 1;
        }
        if msg.redelivered {
            tally.redeliver += 1;
        }
        st.next_tag += 1;
        let tag = st.next_tag;
        let method = Method::BasicGetOk(BasicGetOk {
            delivery_tag: tag,
            redelivered: msg.redelivered,
            exchange: msg.message.exchange.clone(),
            routing_key: msg.message.routing_key.clone(),
            message_count: remaining,
        });
        self.shared.outbox.with(|buf| {
            write_content(buf, self.id(), &method, &msg.message, self.shared.frame_max)
        });
        if !m.no_ack {
            hold(&mut st, tag, &q, None, msg);
        }
        Ok(())
    }
}
