//! The soak's bookkeeping: every message published (and what its publisher heard back), every
//! delivery (with its queue, `redelivered` flag and what the consumer did with it), and how
//! each client connection ended. [`Ledger::verdict`] turns them into the exactly-once check.
//!
//! The rules, with random disconnects:
//!
//! * A message the broker confirmed (basic.ack) must be acknowledged by some consumer by the
//!   end; one that was never delivered, or delivered and never acknowledged, is **lost**.
//! * A message the broker refused (basic.nack) must never be delivered.
//! * A message published without an answer before its publisher's connection dropped may or
//!   may not arrive; either is fine (counted as `unconfirmed` / `unconfirmed_arrived`).
//! * Once a consumer acknowledged a delivery on a connection that then closed cleanly, the
//!   broker had the ack: any later delivery of that message is a **duplicate**. So is a
//!   delivery from a queue after the message was rejected (requeue=false) there on such a
//!   connection.
//! * An ack sent on a connection that then dropped may have been lost with it: a later
//!   delivery is allowed, and counted as `redelivered_after_drop`; so are deliveries after a
//!   consumer's connection dropped with the message unacknowledged.
//! * A delivery of a message that its queue delivered before must carry `redelivered=true`
//!   (a **flag violation** otherwise). A message's first delivery from another queue (a
//!   dead-letter queue) is a first delivery there.

use std::collections::HashMap;

/// A message's identity: publisher id and sequence number, carried in its body.
pub type MsgId = (u32, u64);

/// What the publisher heard about a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confirm {
    /// No answer (yet); final when the publisher's connection dropped.
    Pending,
    /// basic.ack.
    Acked,
    /// basic.nack.
    Nacked,
}

/// What a consumer did with a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Nothing (yet): the connection ended first.
    None,
    /// basic.ack (alone or covered by a multiple ack).
    Ack,
    /// basic.nack or basic.reject with requeue=true.
    Requeue,
    /// basic.reject with requeue=false (dead-lettered when the queue has a DLX).
    Reject,
}

#[derive(Clone, Debug)]
struct Delivery {
    queue: u8,
    redelivered: bool,
    conn: u32,
    settle: Settle,
}

#[derive(Clone, Debug)]
struct Msg {
    confirm: Confirm,
    deliveries: Vec<Delivery>,
}

/// Where a delivery is recorded, to settle it later.
#[derive(Clone, Copy, Debug)]
pub struct DeliveryRef {
    id: MsgId,
    index: usize,
}

/// All messages, deliveries and connections of a soak run.
#[derive(Default)]
pub struct Ledger {
    msgs: HashMap<MsgId, Msg>,
    /// Per connection: None while open, then whether it closed cleanly.
    conns: Vec<Option<bool>>,
    /// Deliveries of ids that were never published.
    pub unexpected: u64,
}

/// The outcome of a run.
#[derive(Debug, Default, serde::Serialize)]
pub struct Verdict {
    pub published: u64,
    pub confirmed: u64,
    pub nacked: u64,
    pub unconfirmed: u64,
    pub unconfirmed_arrived: u64,
    pub deliveries: u64,
    pub acked_deliveries: u64,
    pub requeued: u64,
    pub rejected: u64,
    pub redelivered_after_drop: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub flag_violations: u64,
    pub nacked_delivered: u64,
    pub unexpected: u64,
    /// A few ids of each failure, for the report.
    pub examples: Vec<String>,
}

impl Verdict {
    /// True when no rule was broken.
    pub fn ok(&self) -> bool {
        self.lost == 0
            && self.duplicates == 0
            && self.flag_violations == 0
            && self.nacked_delivered == 0
            && self.unexpected == 0
    }
}

impl Ledger {
    /// Registers a client connection; returns its id.
    pub fn open_conn(&mut self) -> u32 {
        self.conns.push(None);
        (self.conns.len() - 1) as u32
    }

    /// Records how connection `conn` ended.
    pub fn end_conn(&mut self, conn: u32, clean: bool) {
        self.conns[conn as usize] = Some(clean);
    }

    /// Records a publish (before it is sent).
    pub fn published(&mut self, id: MsgId) {
        self.msgs.insert(
            id,
            Msg {
                confirm: Confirm::Pending,
                deliveries: Vec::new(),
            },
        );
    }

    /// Records the broker's answer to a publish.
    pub fn confirmed(&mut self, id: MsgId, ack: bool) {
        if let Some(m) = self.msgs.get_mut(&id) {
            m.confirm = if ack { Confirm::Acked } else { Confirm::Nacked };
        }
    }

    /// Records a delivery; `None` for an id never published.
    pub fn delivered(
        &mut self,
        id: MsgId,
        queue: u8,
        redelivered: bool,
        conn: u32,
    ) -> Option<DeliveryRef> {
        let Some(m) = self.msgs.get_mut(&id) else {
            self.unexpected += 1;
            return None;
        };
        m.deliveries.push(Delivery {
            queue,
            redelivered,
            conn,
            settle: Settle::None,
        });
        Some(DeliveryRef {
            id,
            index: m.deliveries.len() - 1,
        })
    }

    /// Records what the consumer did with a delivery (once its ack/nack/reject was sent).
    pub fn settle(&mut self, d: DeliveryRef, how: Settle) {
        if let Some(m) = self.msgs.get_mut(&d.id) {
            m.deliveries[d.index].settle = how;
        }
    }

    /// Applies the rules of the module documentation. Call once every connection has ended.
    pub fn verdict(&self) -> Verdict {
        let mut v = Verdict {
            unexpected: self.unexpected,
            ..Verdict::default()
        };
        let clean = |conn: u32| self.conns.get(conn as usize) == Some(&Some(true));
        let example = |v: &mut Verdict, what: &str, id: &MsgId, m: &Msg| {
            if v.examples.len() < 20 {
                v.examples
                    .push(format!("{what}: {id:?} {:?} {:?}", m.confirm, m.deliveries));
            }
        };
        for (id, m) in &self.msgs {
            v.published += 1;
            match m.confirm {
                Confirm::Acked => v.confirmed += 1,
                Confirm::Nacked => v.nacked += 1,
                Confirm::Pending => v.unconfirmed += 1,
            }
            let delivered = !m.deliveries.is_empty();
            if m.confirm == Confirm::Nacked && delivered {
                v.nacked_delivered += 1;
                example(&mut v, "nacked but delivered", id, m);
            }
            if m.confirm == Confirm::Pending && delivered {
                v.unconfirmed_arrived += 1;
            }
            let acked = m.deliveries.iter().any(|d| d.settle == Settle::Ack);
            if m.confirm == Confirm::Acked && !acked {
                v.lost += 1;
                example(&mut v, "lost", id, m);
            }
            // Walk the deliveries in order.
            let mut final_ack = false;
            let mut rejected_from: Vec<u8> = Vec::new();
            let mut seen_in: Vec<u8> = Vec::new();
            let mut maybe_settled = false;
            let mut duplicate = false;
            for d in &m.deliveries {
                v.deliveries += 1;
                if final_ack || rejected_from.contains(&d.queue) {
                    duplicate = true;
                } else if maybe_settled {
                    v.redelivered_after_drop += 1;
                }
                if seen_in.contains(&d.queue) {
                    if !d.redelivered {
                        v.flag_violations += 1;
                        example(&mut v, "redelivered=false on a second delivery", id, m);
                    }
                } else {
                    seen_in.push(d.queue);
                }
                maybe_settled = false;
                match d.settle {
                    Settle::Ack => {
                        v.acked_deliveries += 1;
                        if clean(d.conn) {
                            final_ack = true;
                        } else {
                            maybe_settled = true;
                        }
                    }
                    Settle::Reject => {
                        v.rejected += 1;
                        if clean(d.conn) {
                            rejected_from.push(d.queue);
                        } else {
                            maybe_settled = true;
                        }
                    }
                    Settle::Requeue => v.requeued += 1,
                    Settle::None => {
                        if !clean(d.conn) {
                            maybe_settled = true;
                        }
                    }
                }
            }
            if duplicate {
                v.duplicates += 1;
                example(&mut v, "duplicate", id, m);
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(deliveries: &[(u8, bool, bool, Settle)], confirm: bool) -> Verdict {
        let mut l = Ledger::default();
        let clean = l.open_conn();
        l.end_conn(clean, true);
        let dropped = l.open_conn();
        l.end_conn(dropped, false);
        l.published((1, 1));
        if confirm {
            l.confirmed((1, 1), true);
        }
        for &(queue, redelivered, on_clean, how) in deliveries {
            let conn = if on_clean { clean } else { dropped };
            let d = l.delivered((1, 1), queue, redelivered, conn).unwrap();
            l.settle(d, how);
        }
        l.verdict()
    }

    #[test]
    fn exactly_once_rules() {
        use Settle::*;
        assert!(one(&[(0, false, true, Ack)], true).ok());
        // Confirmed, never delivered.
        assert_eq!(one(&[], true).lost, 1);
        // Delivered, never acked.
        assert_eq!(one(&[(0, false, false, None)], true).lost, 1);
        // Unconfirmed and never delivered: fine.
        assert!(one(&[], false).ok());
        // Acked on a clean connection, then delivered again.
        let v = one(&[(0, false, true, Ack), (0, true, true, Ack)], true);
        assert_eq!(v.duplicates, 1);
        // Acked on a dropped connection, then redelivered: allowed.
        let v = one(&[(0, false, false, Ack), (0, true, true, Ack)], true);
        assert!(v.ok(), "{v:?}");
        assert_eq!(v.redelivered_after_drop, 1);
        // A second delivery without the redelivered flag.
        let v = one(&[(0, false, true, Requeue), (0, false, true, Ack)], true);
        assert_eq!(v.flag_violations, 1);
        // Rejected to the dead-letter queue, delivered there: fine.
        let v = one(&[(0, false, true, Reject), (1, false, true, Ack)], true);
        assert!(v.ok(), "{v:?}");
        // Rejected without requeue, then delivered from the same queue again.
        let v = one(&[(0, false, true, Reject), (0, true, true, Ack)], true);
        assert_eq!(v.duplicates, 1);
    }
}
