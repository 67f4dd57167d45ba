//! exchange.declare and queue.declare on a channel, with the `amq.rabbitmq.reply-to` and
//! last-queue-name shortcuts of the other queue methods.

use super::*;

impl Channel {
    pub(super) fn exchange_declare(&mut self, ctx: &Context, m: ExchangeDeclare) -> MethodResult {
        ctx.ops().declare_exchange(&ExchangeSpec {
            name: m.exchange,
            kind: m.kind,
            passive: m.passive,
            durable: m.durable,
            auto_delete: m.auto_delete,
            internal: m.internal,
            arguments: m.arguments,
        })?;
        if !m.nowait {
            self.send(ExchangeDeclareOk {});
        }
        Ok(())
    }

    /// RabbitMQ's queue name shortcuts: an empty queue name means the queue most recently
    /// declared on the channel (404 when there is none), and in queue.bind / queue.unbind an
    /// empty routing key with an empty queue name means that queue's name too.
    pub(super) fn expand_shortcuts(&self, method: &mut Method) -> MethodResult {
        let expand = |q: &mut String| -> MethodResult {
            if q.is_empty() {
                if self.last_queue.is_empty() {
                    return Err(BrokerError::not_found("no previously declared queue"));
                }
                q.clone_from(&self.last_queue);
            }
            Ok(())
        };
        match method {
            Method::BasicGet(m) => expand(&mut m.queue),
            Method::BasicConsume(m) => expand(&mut m.queue),
            Method::QueueDelete(m) => expand(&mut m.queue),
            Method::QueuePurge(m) => expand(&mut m.queue),
            Method::QueueBind(m) => {
                let empty = m.queue.is_empty();
                expand(&mut m.queue)?;
                if empty && m.routing_key.is_empty() {
                    m.routing_key.clone_from(&self.last_queue);
                }
                Ok(())
            }
            Method::QueueUnbind(m) => {
                let empty = m.queue.is_empty();
                expand(&mut m.queue)?;
                if empty && m.routing_key.is_empty() {
                    m.routing_key.clone_from(&self.last_queue);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    pub(super) fn queue_declare(&mut self, ctx: &Context, m: QueueDeclare) -> MethodResult {
        let DeclaredQueue {
            name,
            counts,
            queue,
        } = ctx.ops().declare_queue(&QueueSpec {
            name: m.queue,
            passive: m.passive,
            durable: m.durable,
            exclusive: m.exclusive,
            auto_delete: m.auto_delete,
            arguments: m.arguments,
        })?;
        if queue.is_some() {
            self.last_queue.clone_from(&name);
        }
        if !m.nowait {
            self.send(QueueDeclareOk {
                queue: name,
                message_count: counts.ready,
                consumer_count: counts.consumers,
            });
        }
        Ok(())
    }
}
