//! Setting and clearing a vhost's policies and operator policies ([`crate::policy`]): a
//! policy change is a durable topology change like a declare (one `put_policy` or
//! `remove_policy` record of the definitions log), applied at once to every queue and
//! exchange of the vhost; a queue whose length limit dropped then drops (or dead-letters)
//! from its head, as RabbitMQ does.

use super::*;
use crate::policy::{Applied, Policy, Target};

impl Topology {
    /// Applies the policies to every queue and exchange again; returns the queues whose
    /// settings changed (their limits are enforced by the caller, outside the topology
    /// lock). Each of those joins `sweeps`: a policy may have given it a TTL or an
    /// `x-expires`, and a queue that never held a message is visited only through the set.
    pub(super) fn reapply_policies(&mut self, sweeps: &SweepSet) -> Vec<Arc<Queue>> {
        let mut changed = Vec::new();
        for q in self.queues.values() {
            if q.apply_policy(self.policies.applied(q.name(), Target::Queue(q.kind()))) {
                sweeps.add(q);
                changed.push(q.clone());
            }
        }
        for x in self.exchanges.values_mut() {
            x.apply_policy(self.policies.applied(&x.name, Target::Exchange));
        }
        changed
    }
}

impl VHost {
    /// Creates or replaces `policy` (an operator policy with `operator`), applies it to the
    /// vhost's queues and exchanges, and stores it.
    ///
    /// Errors: 541 INTERNAL_ERROR when it cannot be stored (the change is rolled back).
    pub fn set_policy(&self, operator: bool, policy: Policy) -> Result<()> {
        let mut topo = self.topology.write();
        let name = policy.name.clone();
        let previous = topo
            .policies
            .of_mut(operator)
            .insert(name.clone(), policy.clone());
        let changed = topo.reapply_policies(&self.sweeps);
        let undo = Undo::added(Removed::Policy {
            operator,
            name: name.clone(),
            previous,
        });
        let what = format!("failed to set policy '{name}' in vhost '{}'", self.name);
        let command = TopologyCommand::PutPolicy { operator, policy };
        let saved = self.save(&mut topo, vec![command], undo, what);
        drop(topo);
        for q in changed {
            q.enforce_limits();
        }
        saved
    }

    /// Removes policy `name` (an operator policy with `operator`); returns false when there
    /// was none. The vhost's queues and exchanges go back to what remains.
    ///
    /// Errors: 541 INTERNAL_ERROR when the removal cannot be stored (it is rolled back).
    pub fn clear_policy(&self, operator: bool, name: &str) -> Result<bool> {
        let mut topo = self.topology.write();
        let Some(previous) = topo.policies.of_mut(operator).remove(name) else {
            return Ok(false);
        };
        let changed = topo.reapply_policies(&self.sweeps);
        let undo = Undo::added(Removed::Policy {
            operator,
            name: name.to_string(),
            previous: Some(previous),
        });
        let what = format!("failed to clear policy '{name}' in vhost '{}'", self.name);
        let command = TopologyCommand::RemovePolicy {
            operator,
            name: name.to_string(),
        };
        self.save(&mut topo, vec![command], undo, what)?;
        drop(topo);
        for q in changed {
            q.enforce_limits();
        }
        Ok(true)
    }

    /// The vhost's policies (operator policies with `operator`), by name.
    pub fn policies(&self, operator: bool) -> Vec<Policy> {
        self.topology
            .read()
            .policies
            .of(operator)
            .values()
            .cloned()
            .collect()
    }

    /// What applies to the exchange `name` now (nothing when it does not exist).
    pub fn exchange_policy(&self, name: &str) -> Arc<Applied> {
        self.topology
            .read()
            .exchanges
            .get(name)
            .map(|x| x.applied_policy().clone())
            .unwrap_or_default()
    }
}
