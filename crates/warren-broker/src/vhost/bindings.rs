//! queue.bind, queue.unbind, exchange.bind and exchange.unbind on a vhost.

use crate::error::{BrokerError, Result};

use super::exchanges::default_exchange_refused;
use super::log::TopologyCommand;
use super::topology::{Removed, Topology, Undo};
use super::VHost;
use crate::equivalence::arg_type_and_value;
use crate::exchange::{Binding, Destination, ExchangeKind};
use crate::limits::{self};
use warren_amqp::table::{FieldTable, FieldValue};

impl VHost {
    /// queue.bind / exchange.bind. `destination` must exist (404), `source` must exist (404) and
    /// must not be the default exchange (403). Headers bindings need a valid `x-match` (406);
    /// a new binding must fit under the vhost's binding limit (406).
    pub fn bind(
        &self,
        source: &str,
        destination: Destination,
        routing_key: &str,
        arguments: &FieldTable,
        connection_id: u64,
    ) -> Result<()> {
        if source.is_empty() || destination.is_default_exchange() {
            return Err(default_exchange_refused());
        }
        let mut topo = self.topology.write();
        self.check_destination(&topo, &destination, connection_id)?;
        let destination = topo.shared(destination);
        let x = topo
            .exchanges
            .get(source)
            .ok_or_else(|| self.no_exchange(source))?;
        if x.routing_kind() == ExchangeKind::Headers
            && crate::headers::MatchMode::from_args(arguments).is_none()
        {
            return Err(BrokerError::precondition_failed(
                match arguments.get("x-match") {
                    Some(FieldValue::LongString(b)) => format!(
                    "Invalid x-match field value <<\"{}\">>; expected all, any, all-with-x, or \
                     any-with-x",
                    String::from_utf8_lossy(b)
                ),
                    other => {
                        let (ty, shown) = other.map(arg_type_and_value).unwrap_or_default();
                        format!("Invalid x-match field type {ty} (value {shown}); expected longstr")
                    }
                },
            ));
        }
        let binding = Binding {
            destination: destination.clone(),
            routing_key: routing_key.to_string(),
            arguments: arguments.clone(),
        };
        if !x.has_binding(&binding) {
            limits::check_binding(
                &self.limits.read(),
                &self.name,
                source,
                &destination,
                topo.bindings,
            )?;
        }
        let Some(x) = topo.exchanges.get_mut(source) else {
            return Err(self.no_exchange(source));
        };
        let durable_source = x.durable;
        let added = x.bind(binding.clone());
        topo.bindings += usize::from(added);
        if added && durable_source && topo.destination_is_durable(&destination) {
            let add = TopologyCommand::AddBinding {
                source: source.to_string(),
                binding: binding.clone(),
            };
            let undo = Undo::added(Removed::AddedBinding(source.to_string(), binding.clone()));
            let what = format!(
                "could not create binding from {} to {}",
                self.exchange_resource(source),
                self.destination_resource(&destination)
            );
            self.save(&mut topo, vec![add], undo, what)?;
        }
        Ok(())
    }

    /// queue.unbind / exchange.unbind. Removing a binding that does not exist succeeds, as in
    /// RabbitMQ; a missing source or destination is 404.
    pub fn unbind(
        &self,
        source: &str,
        destination: Destination,
        routing_key: &str,
        arguments: &FieldTable,
        connection_id: u64,
    ) -> Result<()> {
        if source.is_empty() || destination.is_default_exchange() {
            return Err(default_exchange_refused());
        }
        let mut topo = self.topology.write();
        let binding = Binding {
            destination: destination.clone(),
            routing_key: routing_key.to_string(),
            arguments: arguments.clone(),
        };
        // As in RabbitMQ, unbinding is idempotent: a missing source, destination or binding
        // is not an error, and exclusivity is only checked for a binding that exists.
        let dest_exists = match &destination {
            Destination::Queue(q) => topo.queues.contains_key(&**q),
            Destination::Exchange(x) => topo.exchanges.contains_key(&**x),
        };
        let exists = dest_exists
            && topo
                .exchanges
                .get(source)
                .is_some_and(|x| x.has_binding(&binding));
        if !exists {
            return Ok(());
        }
        self.check_destination(&topo, &destination, connection_id)?;
        let x = topo
            .exchanges
            .get_mut(source)
            .ok_or_else(|| self.no_exchange(source))?;
        let removed = x.unbind(&binding);
        let (durable_source, now_unused) = (x.durable, x.auto_delete && x.binding_count() == 0);
        topo.bindings -= usize::from(removed);
        let mut undo = Undo::default();
        if removed {
            undo.durable = durable_source && topo.destination_is_durable(&destination);
            undo.steps
                .push(Removed::Binding(source.to_string(), binding.clone()));
            if now_unused {
                topo.remove_exchange(source, &mut undo);
            }
        }
        if undo.durable {
            let what = format!(
                "could not delete binding from {} to {}",
                self.exchange_resource(source),
                self.destination_resource(&destination)
            );
            self.save(&mut topo, TopologyCommand::removals(&undo), undo, what)?;
        }
        Ok(())
    }

    pub(super) fn check_destination(
        &self,
        topo: &Topology,
        destination: &Destination,
        connection_id: u64,
    ) -> Result<()> {
        match destination {
            Destination::Queue(q) => topo
                .queues
                .get(&**q)
                .ok_or_else(|| self.no_queue(q))?
                .check_exclusive(connection_id),
            Destination::Exchange(x) if topo.exchanges.contains_key(&**x) => Ok(()),
            Destination::Exchange(x) => Err(self.no_exchange(x)),
        }
    }
}
