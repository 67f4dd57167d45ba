//! exchange.declare and exchange.delete on a vhost, and the exchanges as the management API
//! reads them.

use crate::delayed::{self};
use crate::error::{BrokerError, Result};

use super::log::TopologyCommand;
use super::topology::{Removed, Undo};
use super::VHost;
use super::STANDARD_EXCHANGES;
use crate::equivalence::{check_args, check_field};
use crate::exchange::{Binding, Exchange, ExchangeKind};
use crate::limits::{self};
use std::sync::Arc;
use warren_amqp::table::FieldTable;

/// The flags and arguments of exchange.declare.
#[derive(Debug, Clone, Default)]
pub struct ExchangeDeclare {
    /// Exchange name.
    pub name: String,
    /// Type name (`direct`, `fanout`, `topic`, `headers`).
    pub kind: String,
    /// Only check that the exchange exists.
    pub passive: bool,
    /// Survives restarts.
    pub durable: bool,
    /// Deleted with its last binding.
    pub auto_delete: bool,
    /// Not publishable by clients.
    pub internal: bool,
    /// Arguments.
    pub arguments: FieldTable,
}

impl VHost {
    /// exchange.declare. Errors: 404 (passive, missing), 406 (unknown type, as in RabbitMQ 4.x;
    /// 3.x closed the connection with 503), 403 (default exchange, passive or not, or `amq.`
    /// prefix for an exchange that does not exist yet), 406 (inequivalent type, flags or
    /// `alternate-exchange`; a new `x-delayed-message` exchange without a usable
    /// `x-delayed-type`; the vhost's exchange limit reached).
    pub fn declare_exchange(&self, d: &ExchangeDeclare) -> Result<()> {
        if d.passive {
            // RabbitMQ refuses the default exchange even to a passive declare.
            if d.name.is_empty() {
                return Err(default_exchange_refused());
            }
            let topo = self.topology.read();
            return match topo.exchanges.get(&d.name) {
                Some(_) => Ok(()),
                None => Err(self.no_exchange(&d.name)),
            };
        }
        let kind = ExchangeKind::parse(&d.kind).ok_or_else(|| {
            BrokerError::precondition_failed(format!("unknown exchange type '{}'", d.kind))
        })?;
        if d.name.is_empty() {
            return Err(default_exchange_refused());
        }
        // The reserved prefix only stops creating an exchange: redeclaring an existing
        // `amq.*` exchange equivalently succeeds, as in RabbitMQ.
        if !self.exchange_exists(&d.name) {
            check_new_exchange_name(&d.name)?;
        }
        let mut topo = self.topology.write();
        if let Some(x) = topo.exchanges.get(&d.name) {
            let what = self.exchange_resource(&d.name);
            check_field(&what, "type", x.kind.as_str(), kind.as_str())?;
            check_field(&what, "durable", x.durable, d.durable)?;
            check_field(&what, "auto_delete", x.auto_delete, d.auto_delete)?;
            check_field(&what, "internal", x.internal, d.internal)?;
            check_args(&what, &x.arguments, &d.arguments, &["alternate-exchange"])?;
            return Ok(());
        }
        // As RabbitMQ: the limit first, then the type's own validation.
        let user_exchanges = topo
            .exchanges
            .len()
            .saturating_sub(STANDARD_EXCHANGES.len());
        limits::check_exchange(&self.limits.read(), &self.name, &d.name, user_exchanges)?;
        if kind == ExchangeKind::DelayedMessage {
            delayed::routing_kind(&d.arguments)?;
        }
        let mut x = Exchange::new(
            d.name.clone(),
            kind,
            d.durable,
            d.auto_delete,
            d.internal,
            d.arguments.clone(),
        );
        x.apply_policy(
            topo.policies
                .applied(&d.name, crate::policy::Target::Exchange),
        );
        topo.exchanges.insert(d.name.clone(), x);
        if d.durable {
            let put = TopologyCommand::PutExchange {
                name: d.name.clone(),
                kind,
                auto_delete: d.auto_delete,
                internal: d.internal,
                arguments: d.arguments.clone(),
            };
            let undo = Undo::added(Removed::AddedExchange(d.name.clone()));
            let what = format!("failed to declare {}", self.exchange_resource(&d.name));
            self.save(&mut topo, vec![put], undo, what)?;
        }
        Ok(())
    }

    /// exchange.delete. Deleting a missing exchange succeeds, as in RabbitMQ. Errors: 403 for the
    /// default exchange and `amq.` exchanges, 406 with `if_unused` when it is a binding source.
    /// A deleted delayed-message exchange drops the messages it holds.
    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> Result<()> {
        self.check_exchange_deletable(name)?;
        let mut topo = self.topology.write();
        let Some(x) = topo.exchanges.get(name) else {
            return Ok(());
        };
        if if_unused && x.binding_count() > 0 {
            return Err(BrokerError::precondition_failed(format!(
                "{} in use",
                self.exchange_resource(name)
            )));
        }
        let delayed = x.kind == ExchangeKind::DelayedMessage;
        let mut undo = Undo::default();
        topo.remove_exchange(name, &mut undo);
        if undo.durable {
            let what = format!("failed to delete {}", self.exchange_resource(name));
            self.save(&mut topo, TopologyCommand::removals(&undo), undo, what)?;
        }
        if delayed {
            // Under the topology lock, so that a new exchange of the same name cannot have
            // held anything yet.
            self.drop_held(name);
        }
        Ok(())
    }

    /// What RabbitMQ refuses before any permission check on exchange.delete: the default
    /// exchange and the `amq.` system exchanges (403).
    pub(crate) fn check_exchange_deletable(&self, name: &str) -> Result<()> {
        if name.is_empty() {
            return Err(default_exchange_refused());
        }
        if name.starts_with("amq.") {
            return Err(BrokerError::access_refused(format!(
                "deletion of system {} not allowed",
                self.exchange_resource(name)
            )));
        }
        Ok(())
    }

    /// True when the exchange exists.
    pub fn exchange_exists(&self, name: &str) -> bool {
        self.topology.read().exchanges.contains_key(name)
    }

    /// The type of exchange `name` (`""`, the default exchange, is a direct exchange), or
    /// `None` when there is no such exchange.
    pub fn exchange_kind(&self, name: &str) -> Option<ExchangeKind> {
        if name.is_empty() {
            return Some(ExchangeKind::Direct);
        }
        self.topology.read().exchanges.get(name).map(|x| x.kind)
    }

    /// Every exchange of the vhost with its bindings, in no particular order (the default
    /// exchange's implicit bindings to every queue are not listed).
    pub fn exchange_snapshots(&self) -> Vec<ExchangeSnapshot> {
        self.topology
            .read()
            .exchanges
            .values()
            .map(|x| ExchangeSnapshot {
                name: x.name.clone(),
                kind: x.kind,
                durable: x.durable,
                auto_delete: x.auto_delete,
                internal: x.internal,
                arguments: x.arguments.clone(),
                bindings: x.bindings().cloned().collect(),
                policy: x.applied_policy().clone(),
            })
            .collect()
    }
}

/// 403 for creating an exchange with the reserved `amq.` prefix.
pub(crate) fn check_new_exchange_name(name: &str) -> Result<()> {
    if name.starts_with("amq.") {
        return Err(BrokerError::access_refused(format!(
            "exchange name '{name}' contains reserved prefix 'amq.*'"
        )));
    }
    Ok(())
}

pub(crate) fn default_exchange_refused() -> BrokerError {
    BrokerError::access_refused("operation not permitted on the default exchange")
}

/// One exchange as read by the management API: its declared properties and its bindings as
/// a source, copied under the topology's read lock.
#[derive(Debug, Clone)]
pub struct ExchangeSnapshot {
    /// Name (`""` for the default exchange).
    pub name: String,
    /// Declared type.
    pub kind: ExchangeKind,
    /// Survives a restart.
    pub durable: bool,
    /// Deleted with its last binding.
    pub auto_delete: bool,
    /// Not publishable by clients.
    pub internal: bool,
    /// Declared arguments.
    pub arguments: FieldTable,
    /// Its bindings as a source, in binding order.
    pub bindings: Vec<Binding>,
    /// The policy and operator policy that apply to it.
    pub policy: Arc<crate::policy::Applied>,
}
