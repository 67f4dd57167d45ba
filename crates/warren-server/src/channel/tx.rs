//! Transactions (tx.select, tx.commit, tx.rollback): what a transaction holds until its commit,
//! and the bounds on it.

use super::*;

#[derive(Default)]
pub(super) struct TxState {
    pub(super) publishes: Vec<(Arc<Message>, bool)>,
    pub(super) acks: Vec<AckOp>,
    /// Body bytes of `publishes`.
    pub(super) bytes: u64,
}

impl TxState {
    /// Refuses one more operation (and `bytes` more message bytes) beyond the configured caps.
    pub(super) fn admit(&self, limits: &ChannelLimits, bytes: u64) -> MethodResult {
        if self.publishes.len() + self.acks.len() >= limits.tx_max_operations {
            return Err(BrokerError::precondition_failed(format!(
                "transaction holds the maximum of {} publishes and acknowledgements \
                 (amqp.tx_max_operations); commit or roll back",
                limits.tx_max_operations
            )));
        }
        if self.bytes + bytes > limits.tx_max_bytes {
            return Err(BrokerError::precondition_failed(format!(
                "transaction would hold {} bytes of messages, over the limit of {} \
                 (amqp.tx_max_bytes); commit or roll back",
                self.bytes + bytes,
                limits.tx_max_bytes
            )));
        }
        Ok(())
    }
}
