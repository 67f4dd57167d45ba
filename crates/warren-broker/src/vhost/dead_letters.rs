//! Dead letters: a queue hands the messages that died in it to its vhost (the
//! [`DeadLetterSink`]), which re-publishes them to the dead-letter exchange.

use crate::dead_letter::{dead_lettered, DeadLetter, DeadLetterSink, DeadLetterSource};

use super::routing::Routed;
use super::VHost;
use crate::log_limit::LogLimit;
use warren_amqp::table::FieldValue;

impl DeadLetterSink for VHost {
    /// Re-publishes messages that died in queue `from` to its dead-letter exchange, with
    /// RabbitMQ's `x-death` history and `x-first-death-*` / `x-last-death-*` headers. A
    /// missing dead-letter exchange drops them, as do automatic (not `rejected`) deaths that
    /// would route a message back to a queue it already died in.
    fn dead_letter(&self, from: &DeadLetterSource<'_>, letters: Vec<DeadLetter>) {
        let dlx = from.exchange;
        let now_s = self.clock.now_ms() / 1000;
        for l in letters {
            let msg = dead_lettered(from, &l, now_s);
            let headers = msg.properties.headers.as_ref();
            let mut routed = Routed::default();
            let sender_keys = msg.sender_keys();
            let keys = sender_keys.all(&msg.routing_key);
            if self
                .route_inner(dlx, &keys, headers, false, &mut routed)
                .is_err()
            {
                continue;
            }
            for (x, durable, delay) in &routed.delayed {
                if let Err(e) = self.hold(x, *durable, &msg, *delay) {
                    static HOLD_FAILED: LogLimit = LogLimit::new();
                    if let Some(suppressed) = HOLD_FAILED.admit() {
                        tracing::warn!(queue = %from.queue, error = %e, suppressed, "cannot hold dead letter in delayed exchange");
                    }
                }
            }
            let mut queues = routed.queues;
            let deaths = headers
                .and_then(|h| h.get("x-death"))
                .and_then(|v| v.as_array())
                .unwrap_or(&[]);
            let field = |d: &FieldValue, k: &str| -> Option<String> {
                d.as_table()
                    .and_then(|t| t.get(k))
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            };
            let any_rejected = deaths
                .iter()
                .any(|d| field(d, "reason").as_deref() == Some("rejected"));
            if !any_rejected {
                queues.retain(|q| {
                    !deaths
                        .iter()
                        .any(|d| field(d, "queue").as_deref() == Some(q.name()))
                });
            }
            if queues.is_empty() {
                continue;
            }
            if let Err(e) = self.enqueue(msg, queues, None, false, true) {
                static DEAD_LETTER_FAILED: LogLimit = LogLimit::new();
                if let Some(suppressed) = DEAD_LETTER_FAILED.admit() {
                    tracing::warn!(queue = %from.queue, error = %e, suppressed, "cannot dead-letter message");
                }
            }
        }
    }
}
