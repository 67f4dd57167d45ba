//! Paging: beyond its in-memory window a queue keeps its ready messages as spill-file entries
//! (their place in the message store), reads them back as consumers reach them, and holds
//! unacked deliveries beyond the unacked window by location only. Recovery hands a durable
//! queue its messages the same way.

use super::*;

/// One priority's messages beyond the in-memory window, in queue order: the spill file's
/// entries first, then the messages that could not be paged out (the store refused the
/// write: disk full or failing), held whole in memory until they can be.
pub(super) struct Spilled {
    pub(super) file: SpillFile,
    pub(super) held: VecDeque<QueuedMessage>,
}

/// Warnings of the paging paths, one line per interval each (a full disk fails them all).
pub(super) static PAGE_OUT_FAILED: LogLimit = LogLimit::new();

pub(super) static SPILL_WRITE_FAILED: LogLimit = LogLimit::new();

pub(super) static SPILL_READ_FAILED: LogLimit = LogLimit::new();

impl ClassicQueue {
    /// Adds messages recovered from the store, in id order, as ready: the first window's worth
    /// is read into memory, the rest goes to the spill file (of its priority) unread. Every
    /// entry stays in the queue, in order: when the spill file cannot be written (a full
    /// disk), its entries wait in memory until it can.
    pub fn recover(&self, entries: &mut dyn Iterator<Item = SpillEntry>) {
        let Some(b) = &self.backing else {
            return;
        };
        let mut st = self.state.lock();
        // Recovered messages may have deadlines (read when they reach the head).
        st.has_deadlines = true;
        for e in entries {
            let level = st.level(e.priority);
            let e = if !Self::window_full(&st, b) && st.spilled_at(level) == 0 {
                // Unreadable now: it goes first in the spill, where what follows queues
                // behind it.
                match self.load_spilled(&mut st, b, e, true) {
                    Ok(()) => continue,
                    Err(e) => e,
                }
            } else {
                e
            };
            let result = self.spilled(&mut st, b, level).file.push(&[e]);
            self.spill_written(result);
        }
    }

    /// Reports a spill-file write that failed (its entries are kept in memory).
    pub(super) fn spill_written(&self, result: std::io::Result<()>) {
        if let Err(err) = result {
            if let Some(suppressed) = SPILL_WRITE_FAILED.admit() {
                warn!(queue = %self.name, error = %err, suppressed, "cannot write spill file; keeping its entries in memory until it can be written");
            }
        }
    }

    pub(super) fn window_full(st: &State, b: &Backing) -> bool {
        st.ready.len() >= b.paging.window || st.ready_bytes >= b.paging.window_bytes
    }

    /// What priority `level` holds beyond the window, created on first use (its spill file
    /// is written once it has a batch of entries).
    pub(super) fn spilled<'a>(
        &self,
        st: &'a mut State,
        b: &Backing,
        level: usize,
    ) -> &'a mut Spilled {
        if st.spills.len() <= level {
            st.spills.resize_with(level + 1, || None);
        }
        let priority = st.priority.is_some();
        st.spills[level].get_or_insert_with(|| Spilled {
            file: b.store.spill_file(b.spill_path(priority.then_some(level))),
            held: VecDeque::new(),
        })
    }

    /// Where `qm` is in the store, writing it there (as a transient page, released when it
    /// leaves the queue) unless it is a persistent message of this durable queue. `None`
    /// without a store or when the write fails.
    pub(super) fn page(&self, b: &Backing, qm: &QueuedMessage) -> Option<SpillEntry> {
        let (location, transient) = match qm.stored {
            Some(loc) => (loc, false),
            None => {
                let m = &qm.message;
                match b.store.append_transient(
                    qm.seq,
                    &m.exchange,
                    &m.routing_key,
                    &m.properties,
                    &m.body,
                    self.enqueued_at(qm),
                ) {
                    Ok(loc) => (loc, true),
                    Err(e) => {
                        if let Some(suppressed) = PAGE_OUT_FAILED.admit() {
                            warn!(queue = %self.name, error = %e, suppressed, "cannot page message out; keeping it in memory");
                        }
                        return None;
                    }
                }
            }
        };
        Some(SpillEntry {
            seq: qm.seq,
            id: qm.seq,
            location,
            redelivered: qm.redelivered,
            transient,
            priority: qm.message.properties.priority.unwrap_or(0),
        })
    }

    /// When the in-memory window is full (or messages of its priority are already beyond it,
    /// to keep order), puts `qm` behind them: in the spill file, or held in memory when the
    /// store cannot take it. Returns `qm` when it belongs in the window instead.
    pub(super) fn spill_if_full(&self, st: &mut State, qm: QueuedMessage) -> Option<QueuedMessage> {
        let Some(b) = &self.backing else {
            return Some(qm);
        };
        let level = st.level(qm.message.properties.priority.unwrap_or(0));
        if !Self::window_full(st, b) && st.spilled_at(level) == 0 {
            return Some(qm);
        }
        // Messages held before this one go to the spill first, if the store takes them now.
        self.page_held(st, b, level);
        st.spilled_bytes += qm.message.body.len();
        let entry = match self.spilled(st, b, level).held.is_empty() {
            true => self.page(b, &qm),
            false => None,
        };
        let spilled = self.spilled(st, b, level);
        match entry {
            Some(entry) => {
                let result = spilled.file.push(&[entry]);
                self.spill_written(result);
            }
            None => spilled.held.push_back(qm),
        }
        None
    }

    /// Pages out the messages priority `level` holds in memory behind its spill, from the
    /// front, for as long as the store takes them.
    pub(super) fn page_held(&self, st: &mut State, b: &Backing, level: usize) {
        let Some(Some(spilled)) = st.spills.get_mut(level) else {
            return;
        };
        while let Some(qm) = spilled.held.front() {
            let Some(entry) = self.page(b, qm) else {
                return;
            };
            spilled.held.pop_front();
            let result = spilled.file.push(&[entry]);
            self.spill_written(result);
        }
    }

    /// Once the disk takes writes again, writes out what the spill files and the held
    /// messages keep in memory because it did not.
    pub(super) fn retry_paging(&self, st: &mut State) {
        let Some(b) = &self.backing else {
            return;
        };
        for level in 0..st.spills.len() {
            if let Some(Some(spilled)) = st.spills.get_mut(level) {
                let result = spilled.file.retry();
                self.spill_written(result);
            }
            self.page_held(st, b, level);
        }
    }

    /// Brings back what is paged out as it is needed: requeued messages that sort before
    /// the head, the spill of a priority above the head's, and spilled messages once the
    /// in-memory window is half empty.
    #[inline]
    pub(super) fn refill(&self, st: &mut State) {
        // Called for every delivery: nothing paged out is the common case, answered inline.
        if st.paged.is_empty() && st.spilled() == 0 {
            return;
        }
        self.refill_paged(st);
    }

    fn refill_paged(&self, st: &mut State) {
        let Some(b) = &self.backing else {
            return;
        };
        let max = st.priority;
        loop {
            // Requeued messages paged out, ahead of the head of the queue.
            if !st.paged.is_empty() {
                let head = st.ready.front().map(|f| order_key(f, max));
                let mut loaded = 0;
                while let Some(e) = st.paged.front() {
                    if loaded == 64 || head.is_some_and(|h| entry_key(e, max) > h) {
                        break;
                    }
                    let e = st.paged.pop_front().expect("front checked");
                    if let Err(e) = self.load_spilled(st, b, e, false) {
                        st.paged.insert_sorted(e, |x| entry_key(x, max));
                        return;
                    }
                    loaded += 1;
                }
            }
            if max.is_none() {
                break;
            }
            // A priority spilled above the priority of the head is delivered first.
            let head_level = st
                .ready
                .front()
                .map(|f| st.level(f.message.properties.priority.unwrap_or(0)));
            let top = (0..st.spills.len()).rev().find(|&l| st.spilled_at(l) > 0);
            match (top, head_level) {
                (Some(t), h) if h.is_none_or(|h| t > h) => {
                    if !self.refill_from(st, b, t, 64) {
                        return;
                    }
                }
                _ => break,
            }
        }
        if st.ready.len() > b.paging.window / 2
            || st.ready_bytes > b.paging.window_bytes / 2
            || st.spilled() == 0
        {
            return;
        }
        while !Self::window_full(st, b) && st.spilled() > 0 {
            let want = (b.paging.window - st.ready.len()).clamp(1, 64);
            let top = (0..st.spills.len())
                .rev()
                .find(|&l| st.spilled_at(l) > 0)
                .unwrap_or(0);
            if !self.refill_from(st, b, top, want) {
                return;
            }
        }
    }

    /// Reads up to `want` entries of priority `level`'s spill back into memory, or once the
    /// spill file is empty takes its held messages; false when the spill file cannot be read
    /// (its entries stay).
    pub(super) fn refill_from(
        &self,
        st: &mut State,
        b: &Backing,
        level: usize,
        want: usize,
    ) -> bool {
        let Some(Some(spilled)) = st.spills.get_mut(level) else {
            return false;
        };
        if spilled.file.is_empty() {
            let n = want.min(spilled.held.len());
            let held: Vec<QueuedMessage> = spilled.held.drain(..n).collect();
            for qm in held {
                st.spilled_bytes = st.spilled_bytes.saturating_sub(qm.message.body.len());
                st.insert_ordered(qm);
            }
            return n > 0;
        }
        let entries = match spilled.file.pop(want) {
            Ok(e) => e,
            Err(e) => {
                if let Some(suppressed) = SPILL_READ_FAILED.admit() {
                    warn!(queue = %self.name, error = %e, suppressed, "cannot read spill file");
                }
                return false;
            }
        };
        let mut entries = entries.into_iter();
        while let Some(mut e) = entries.next() {
            e.priority = level as u8;
            if let Err(e) = self.load_spilled(st, b, e, true) {
                // Back to the front of the spill, in order, to be read again later.
                let back: Vec<SpillEntry> = std::iter::once(e).chain(entries).collect();
                if let Some(Some(spilled)) = st.spills.get_mut(level) {
                    spilled.file.unpop(back);
                }
                return false;
            }
        }
        true
    }

    /// Reads a paged-out message back; its TTL counts from its enqueue time. A transient
    /// page is released. `Err(Some(e))`: an I/O error that may pass (the caller keeps the
    /// entry queued, to be read again); `Err(None)`: the record is corrupt or its segment is
    /// gone, and the message has left the queue.
    pub(super) fn read_back(
        &self,
        b: &Backing,
        e: SpillEntry,
    ) -> std::result::Result<QueuedMessage, Option<SpillEntry>> {
        match b.store.read(e.location) {
            Ok(m) => {
                if e.transient {
                    b.store.release(e.location);
                }
                let now = self.clock.now_ms();
                let enqueued = m.enqueued_ms.unwrap_or(now);
                let message = Arc::new(Message::new(
                    m.exchange,
                    m.routing_key,
                    m.properties,
                    m.body,
                ));
                let expires_at = self.deadline_from(&message, enqueued);
                Ok(QueuedMessage {
                    seq: e.seq,
                    message,
                    redelivered: e.redelivered,
                    stored: (!e.transient).then_some(e.location),
                    expires_at,
                })
            }
            Err(StoreError::Io(err)) if err.kind() != std::io::ErrorKind::NotFound => {
                static READ_FAILED: LogLimit = LogLimit::new();
                if let Some(suppressed) = READ_FAILED.admit() {
                    warn!(queue = %self.name, error = %err, suppressed, "cannot read stored message; it stays queued and is read again later");
                }
                Err(Some(e))
            }
            Err(err) => {
                static UNREADABLE: LogLimit = LogLimit::new();
                if let Some(suppressed) = UNREADABLE.admit() {
                    warn!(queue = %self.name, error = %err, suppressed, "dropping unreadable stored message");
                }
                self.forget_entry(b, &e);
                Err(None)
            }
        }
    }

    /// Reads `e` back into the ready list; `spilled` when it came from a spill file (whose
    /// byte count it leaves). Gives `e` back when it cannot be read now (see
    /// [`Queue::read_back`]): the caller puts it back where it was.
    pub(super) fn load_spilled(
        &self,
        st: &mut State,
        b: &Backing,
        e: SpillEntry,
        spilled: bool,
    ) -> std::result::Result<(), SpillEntry> {
        match self.read_back(b, e) {
            Ok(qm) => {
                if spilled {
                    st.spilled_bytes = st.spilled_bytes.saturating_sub(qm.message.body.len());
                }
                st.insert_ordered(qm);
                Ok(())
            }
            Err(Some(e)) => Err(e),
            Err(None) => Ok(()),
        }
    }

    /// A paged-out message leaves this queue for good.
    pub(super) fn forget_entry(&self, b: &Backing, e: &SpillEntry) {
        if e.transient {
            b.store.release(e.location);
        } else {
            self.forget(e.seq, Some(e.location));
        }
    }

    /// The bound on unacknowledged deliveries a channel keeps in memory from this queue
    /// (messages, body bytes): beyond it the channel holds them by [`Queue::page_out`].
    /// `None` without a store.
    pub fn unacked_window(&self) -> Option<(usize, usize)> {
        self.backing
            .as_ref()
            .map(|b| (b.paging.unacked_window, b.paging.unacked_window_bytes))
    }

    /// Where the store keeps `qm`, delivered from this queue and not yet acknowledged, so
    /// that its channel can drop the body: a persistent message of a durable queue is there
    /// already, another one is written as a transient page. `None` without a store or when
    /// the write fails (the channel keeps the message then). Settle it with
    /// [`Queue::settle_paged`].
    pub fn page_out(&self, qm: &QueuedMessage) -> Option<SpillEntry> {
        self.page(self.backing.as_ref()?, qm)
    }

    /// Settles deliveries their channel held paged out, as [`Queue::settle`] does: acked ones
    /// leave the store, rejected ones are read back to be dead-lettered, and requeued ones go
    /// back to their place without their body, which is read when they reach the head.
    pub fn settle_paged_with(
        &self,
        this: &Arc<Queue>,
        channel_key: u64,
        settlements: Vec<PagedSettlement>,
    ) {
        let Some(b) = &self.backing else {
            return;
        };
        let mut st = self.state.lock();
        if st.deleted {
            drop(st);
            for s in settlements {
                self.forget_entry(b, &s.entry);
            }
            return;
        }
        let max = st.priority;
        let mut requeued = false;
        for s in settlements {
            st.unacked = st.unacked.saturating_sub(1);
            if let Some(tag) = &s.consumer_tag {
                if let Some(c) = st
                    .consumers
                    .iter_mut()
                    .find(|c| c.target.channel_key() == channel_key && &c.tag == tag)
                {
                    c.in_flight = c.in_flight.saturating_sub(1);
                }
            }
            let mut e = s.entry;
            if s.requeue {
                e.redelivered = true;
                st.paged.insert_sorted(e, |x| entry_key(x, max));
                requeued = true;
            } else if s.rejected && self.args().dead_letter_exchange.is_some() {
                match self.read_back(b, e) {
                    Ok(qm) => self.discard(&mut st, qm, DeathReason::Rejected),
                    // Rejected: it leaves the queue whether or not it can be dead-lettered.
                    Err(Some(e)) => self.forget_entry(b, &e),
                    Err(None) => {}
                }
            } else {
                if !s.rejected {
                    crate::registry::bump(&self.stats.ack);
                }
                self.forget_entry(b, &e);
            }
        }
        self.dispatch_from(this, &mut st, None);
        // A requeued message with a deadline waits in the queue again: the sweep expires it.
        let sweep = requeued && st.has_deadlines && st.ready_count() > 0;
        let dead = self.flush_dead(&mut st);
        drop(st);
        if sweep {
            self.join_sweeps(this);
        }
        self.publish_dead(dead);
    }
}

/// [`order_key`] of a paged-out entry.
pub(super) fn entry_key(e: &SpillEntry, max: Option<u8>) -> (u8, u64) {
    match max {
        Some(max) => (max - e.priority.min(max), e.seq),
        None => (0, e.seq),
    }
}
