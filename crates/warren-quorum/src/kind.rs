//! `x-queue-type: quorum`: RabbitMQ 4.x's declare rules and refusals, and the kind that
//! builds quorum queues for the vhosts.
//!
//! RabbitMQ validates a quorum queue's declare in this order (rabbit_channel,
//! rabbit_amqqueue:check_declare_arguments, rabbit_quorum_queue:declare): a server-named
//! queue is refused before anything else; the type of `x-dead-letter-exchange`; each argument
//! the quorum type accepts, by the validators of `rabbit_amqqueue:declare_args/0` in their
//! order; arguments other queue types accept but quorum queues do not (`x-max-priority`,
//! `x-queue-mode`, ...); then the flags: auto-delete, exclusive, non-durable. Unknown
//! arguments are ignored.

use crate::node::QuorumNode;
use crate::queue::QuorumQueue;
use std::sync::Arc;
use warren_amqp::table::{FieldTable, FieldValue};
use warren_broker::args::{expiry, int, non_neg, type_name};
use warren_broker::queue::{QueueKind, QueueSpec};
use warren_broker::{BrokerError, Queue, Result};

/// The queue type's module name, as RabbitMQ prints it in its refusals.
pub const TYPE_NAME: &str = "rabbit_quorum_queue";

/// RabbitMQ 4.x's default `x-delivery-limit`.
pub const DEFAULT_DELIVERY_LIMIT: u32 = 20;

/// Arguments other queue types (classic, stream) accept and quorum queues refuse.
const OTHER_TYPES_ARGS: &[&str] = &[
    "x-max-priority",
    "x-queue-mode",
    "x-queue-version",
    "x-queue-master-locator",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-stream-filter-size-bytes",
    "x-initial-cluster-size",
];

/// The kind registered as `x-queue-type: quorum`.
pub struct QuorumKind {
    node: Arc<QuorumNode>,
}

impl QuorumKind {
    /// The kind for the node's quorum service.
    pub fn new(node: Arc<QuorumNode>) -> Arc<QuorumKind> {
        Arc::new(QuorumKind { node })
    }
}

fn string_in(v: &FieldValue, allowed: &[&str], bad: &str) -> std::result::Result<(), String> {
    match v {
        FieldValue::LongString(b) => {
            if allowed.iter().any(|a| a.as_bytes() == &b[..]) {
                Ok(())
            } else {
                Err(bad.to_string())
            }
        }
        other => Err(format!("{{unacceptable_type,{}}}", type_name(other))),
    }
}

/// Validates a quorum queue's declared arguments with RabbitMQ's texts (`resource` names
/// the queue: `queue 'q' in vhost '/'`).
pub fn validate_arguments(resource: &str, args: &FieldTable) -> Result<()> {
    let fail = |key: &str, reason: String| {
        BrokerError::precondition_failed(format!("invalid arg '{key}' for {resource}: {reason}"))
    };
    if let Some(v) = args.get("x-dead-letter-exchange") {
        if !matches!(v, FieldValue::LongString(_)) {
            return Err(BrokerError::precondition_failed(format!(
                "invalid type '{}' for arg 'x-dead-letter-exchange' in {resource}",
                type_name(v)
            )));
        }
    }
    if let Some(v) = args.get("x-expires") {
        int(v)
            .and_then(|n| {
                if n == 0 {
                    Err("{value_zero,0}".to_string())
                } else {
                    expiry(n)
                }
            })
            .map_err(|r| fail("x-expires", r))?;
    }
    if let Some(v) = args.get("x-message-ttl") {
        int(v)
            .and_then(expiry)
            .map_err(|r| fail("x-message-ttl", r))?;
    }
    if let Some(v) = args.get("x-dead-letter-routing-key") {
        if !matches!(v, FieldValue::LongString(_)) {
            return Err(fail(
                "x-dead-letter-routing-key",
                format!("{{unacceptable_type,{}}}", type_name(v)),
            ));
        }
        if !args.contains_key("x-dead-letter-exchange") {
            return Err(fail(
                "x-dead-letter-routing-key",
                "routing_key_but_no_dlx_defined".into(),
            ));
        }
    }
    if let Some(v) = args.get("x-dead-letter-strategy") {
        string_in(
            v,
            &["at-most-once", "at-least-once"],
            "invalid_dlx_strategy",
        )
        .map_err(|r| fail("x-dead-letter-strategy", r))?;
    }
    for key in [
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
    ] {
        if let Some(v) = args.get(key) {
            non_neg(v).map_err(|r| fail(key, r))?;
        }
    }
    if let Some(v) = args.get("x-overflow") {
        string_in(
            v,
            &["drop-head", "reject-publish", "reject-publish-dlx"],
            "invalid_overflow",
        )
        .map_err(|r| fail("x-overflow", r))?;
    }
    if let Some(v) = args.get("x-single-active-consumer") {
        if !matches!(v, FieldValue::Bool(_)) {
            return Err(fail(
                "x-single-active-consumer",
                format!("{{unacceptable_type,{}}}", type_name(v)),
            ));
        }
    }
    for key in ["x-consumer-timeout", "x-consumer-disconnected-timeout"] {
        if let Some(v) = args.get(key) {
            non_neg(v).map_err(|r| fail(key, r))?;
        }
    }
    if let Some(v) = args.get("x-quorum-initial-group-size") {
        let n = non_neg(v).map_err(|r| fail("x-quorum-initial-group-size", r))?;
        if n == 0 {
            return Err(fail("x-quorum-initial-group-size", "{value_zero,0}".into()));
        }
    }
    if let Some(v) = args.get("x-queue-leader-locator") {
        string_in(
            v,
            &["client-local", "balanced"],
            "invalid_queue_locator_arg",
        )
        .map_err(|r| fail("x-queue-leader-locator", r))?;
    }
    if let Some(v) = args.get("x-member-placement-tag") {
        match v {
            FieldValue::LongString(b) if !b.is_empty() => {}
            FieldValue::LongString(_) => {
                return Err(fail(
                    "x-member-placement-tag",
                    "invalid_member_placement_tag_arg".into(),
                ))
            }
            other => {
                return Err(fail(
                    "x-member-placement-tag",
                    format!("{{unacceptable_type,{}}}", type_name(other)),
                ))
            }
        }
    }
    for (key, _) in args.iter() {
        if OTHER_TYPES_ARGS.contains(&key.as_str()) {
            return Err(BrokerError::precondition_failed(format!(
                "invalid arg '{key}' for {resource} of queue type {TYPE_NAME}"
            )));
        }
    }
    Ok(())
}

impl QueueKind for QuorumKind {
    fn validate(&self, resource: &str, arguments: &FieldTable) -> Result<()> {
        validate_arguments(resource, arguments)
    }

    fn check_server_named(&self) -> Result<()> {
        Err(BrokerError::precondition_failed(format!(
            "Cannot declare a server-named queue for type {TYPE_NAME}"
        )))
    }

    fn check_flags(
        &self,
        resource: &str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
    ) -> Result<()> {
        let refuse = |what: &str| {
            Err(BrokerError::precondition_failed(format!(
                "invalid property '{what}' for {resource}"
            )))
        };
        if auto_delete {
            return refuse("auto-delete");
        }
        if exclusive {
            return refuse("exclusive-owner");
        }
        if !durable {
            return refuse("non-durable");
        }
        Ok(())
    }

    fn build(&self, spec: QueueSpec) -> Arc<Queue> {
        QuorumQueue::start(self.node.clone(), spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn s(v: &str) -> FieldValue {
        FieldValue::LongString(Bytes::copy_from_slice(v.as_bytes()))
    }

    fn refused(pairs: &[(&str, FieldValue)]) -> String {
        let t: FieldTable = pairs.iter().cloned().collect();
        let e = validate_arguments("queue 'q' in vhost '/'", &t).unwrap_err();
        assert_eq!(e.code, 406);
        e.text
    }

    #[test]
    fn rabbitmq_texts() {
        assert_eq!(
            refused(&[("x-max-priority", FieldValue::I32(5))]),
            "invalid arg 'x-max-priority' for queue 'q' in vhost '/' of queue type rabbit_quorum_queue"
        );
        assert_eq!(
            refused(&[("x-dead-letter-strategy", s("sometimes"))]),
            "invalid arg 'x-dead-letter-strategy' for queue 'q' in vhost '/': invalid_dlx_strategy"
        );
        assert_eq!(
            refused(&[("x-quorum-initial-group-size", FieldValue::I32(0))]),
            "invalid arg 'x-quorum-initial-group-size' for queue 'q' in vhost '/': {value_zero,0}"
        );
        assert_eq!(
            refused(&[("x-max-length", FieldValue::I32(-1))]),
            "invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}"
        );
        assert_eq!(
            refused(&[("x-message-ttl", s("1"))]),
            "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': \"expected integer, got longstr\""
        );
        let ok: FieldTable = [
            ("x-delivery-limit", FieldValue::I32(3)),
            ("x-overflow", s("reject-publish")),
            ("x-dead-letter-exchange", s("dlx")),
            ("x-dead-letter-strategy", s("at-least-once")),
            ("x-quorum-initial-group-size", FieldValue::I32(3)),
            ("x-single-active-consumer", FieldValue::Bool(true)),
            ("x-unknown", s("ignored")),
        ]
        .into_iter()
        .collect();
        assert!(validate_arguments("queue 'q' in vhost '/'", &ok).is_ok());
    }
}
