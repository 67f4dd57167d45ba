//! The classic queue as a [`QueueBackend`]: every operation is the [`ClassicQueue`]'s own
//! (in the files of this directory by concern), reached through the trait by routing, the
//! operations layer and the front ends.

use super::*;
use bytes::Bytes;

impl QueueBackend for ClassicQueue {
    fn name(&self) -> &str {
        ClassicQueue::name(self)
    }
    fn shared_name(&self) -> Arc<str> {
        self.name.clone()
    }
    fn vhost(&self) -> &str {
        ClassicQueue::vhost(self)
    }
    fn kind(&self) -> &'static str {
        "classic"
    }
    fn durable(&self) -> bool {
        ClassicQueue::durable(self)
    }
    fn exclusive_owner(&self) -> Option<u64> {
        ClassicQueue::exclusive_owner(self)
    }
    fn auto_delete(&self) -> bool {
        ClassicQueue::auto_delete(self)
    }
    fn arguments(&self) -> &FieldTable {
        ClassicQueue::arguments(self)
    }
    fn store_key(&self) -> &str {
        ClassicQueue::store_key(self)
    }
    fn store(&self) -> Option<&Store> {
        ClassicQueue::store(self)
    }
    fn args(&self) -> Arc<QueueArgs> {
        ClassicQueue::args(self)
    }
    fn applied_policy(&self) -> Arc<crate::policy::Applied> {
        ClassicQueue::applied_policy(self)
    }
    fn apply_policy(&self, applied: crate::policy::Applied) -> bool {
        ClassicQueue::apply_policy(self, applied)
    }
    fn enforce_limits(&self) {
        ClassicQueue::enforce_limits(self)
    }
    fn enqueue_order(&self) -> parking_lot::MutexGuard<'_, ()> {
        ClassicQueue::enqueue_order(self)
    }
    fn rejects_publish(&self, msg: &Message) -> bool {
        ClassicQueue::rejects_publish(self, msg)
    }
    fn enqueue(
        &self,
        this: &Arc<Queue>,
        message: Arc<Message>,
        seq: u64,
        stored: Option<Location>,
    ) -> (bool, Vec<DeadLetter>) {
        ClassicQueue::enqueue(self, this, message, seq, stored)
    }
    fn dead_letter(&self, dead: Vec<DeadLetter>) {
        ClassicQueue::dead_letter(self, dead)
    }
    fn is_pressured(&self) -> bool {
        ClassicQueue::is_pressured(self)
    }
    fn wake_when_drained(&self, waker: &std::task::Waker) -> bool {
        ClassicQueue::wake_when_drained(self, waker)
    }
    fn forget_drain_waker(&self, waker: &std::task::Waker) {
        ClassicQueue::forget_drain_waker(self, waker)
    }
    fn stalled_at(&self) -> Option<u64> {
        ClassicQueue::stalled_at(self)
    }
    fn mark_stalled(&self, at: u64) {
        ClassicQueue::mark_stalled(self, at)
    }
    fn add_consumer(&self, consumer: Consumer) -> Result<()> {
        ClassicQueue::add_consumer(self, consumer)
    }
    fn remove_consumer(&self, channel_key: u64, tag: &str) -> bool {
        ClassicQueue::remove_consumer(self, channel_key, tag)
    }
    fn dispatch_with(&self, this: &Arc<Queue>) {
        ClassicQueue::dispatch_with(self, this)
    }
    fn touch(&self) {
        ClassicQueue::touch(self)
    }
    fn get(&self, no_ack: bool) -> Option<(QueuedMessage, u32)> {
        ClassicQueue::get(self, no_ack)
    }
    fn settle_with(&self, this: &Arc<Queue>, channel_key: u64, settlements: Vec<Settlement>) {
        ClassicQueue::settle_with(self, this, channel_key, settlements)
    }
    fn unacked_window(&self) -> Option<(usize, usize)> {
        ClassicQueue::unacked_window(self)
    }
    fn page_out(&self, qm: &QueuedMessage) -> Option<SpillEntry> {
        ClassicQueue::page_out(self, qm)
    }
    fn settle_paged_with(
        &self,
        this: &Arc<Queue>,
        channel_key: u64,
        settlements: Vec<PagedSettlement>,
    ) {
        ClassicQueue::settle_paged_with(self, this, channel_key, settlements)
    }
    fn purge(&self) -> u32 {
        ClassicQueue::purge(self)
    }
    fn mark_deleted(&self) -> (u32, Vec<Consumer>) {
        ClassicQueue::mark_deleted(self)
    }
    fn is_deleted(&self) -> bool {
        ClassicQueue::is_deleted(self)
    }
    fn sweep(&self) -> bool {
        ClassicQueue::sweep(self)
    }
    fn needs_sweep(&self) -> bool {
        ClassicQueue::needs_sweep(self)
    }
    fn sweep_mark(&self) -> &std::sync::atomic::AtomicBool {
        &self.sweep_mark
    }
    fn recover(&self, entries: &mut dyn Iterator<Item = SpillEntry>) {
        ClassicQueue::recover(self, entries)
    }
    fn counts(&self) -> QueueCounts {
        ClassicQueue::counts(self)
    }
    fn has_exclusive_consumer(&self) -> bool {
        ClassicQueue::has_exclusive_consumer(self)
    }
    fn ready_bytes(&self) -> u64 {
        ClassicQueue::ready_bytes(self)
    }
    fn ready_in_memory_and_paged_out(&self) -> (u32, u32) {
        ClassicQueue::ready_in_memory_and_paged_out(self)
    }
    fn memory(&self) -> u64 {
        ClassicQueue::memory(self)
    }
    fn deliveries(&self) -> u64 {
        ClassicQueue::deliveries(self)
    }
    fn stats(&self) -> &crate::registry::QueueStats {
        ClassicQueue::stats(self)
    }
    fn positions(&self) -> Positions {
        ClassicQueue::positions(self)
    }
    fn set_put_position(&self, put: u64) {
        ClassicQueue::set_put_position(self, put)
    }
    fn reset_positions(&self) -> u32 {
        ClassicQueue::reset_positions(self)
    }
    fn get_positioned(&self) -> Option<(QueuedMessage, u64)> {
        ClassicQueue::get_positioned(self)
    }
    fn peek_position(&self, pos: u64) -> Option<Bytes> {
        ClassicQueue::peek_position(self, pos)
    }
}
