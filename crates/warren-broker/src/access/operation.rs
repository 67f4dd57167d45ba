//! Every operation a client can ask for, and what access each one needs.
//!
//! [`required_access`] is the single place that decides which permission an operation needs on
//! which resource. It is an exhaustive `match` without a wildcard arm: an [`Operation`] variant
//! added without an access decision does not compile. The AMQP channel code, the management API
//! and any other front end describe what they are about to do as an [`Operation`] and ask
//! [`crate::access::AccessControl::check`]; none of them repeats a permission rule.
//!
//! The AMQP 0-9-1 rules are RabbitMQ's (rabbitmq.com/docs/access-control, the table in "How
//! Permissions Work"; `rabbit_channel.erl`):
//!
//! | operation | configure | write | read | topic |
//! |---|---|---|---|---|
//! | exchange.declare | exchange | | | |
//! | exchange.declare, new, with `alternate-exchange` | exchange | AE | exchange | |
//! | exchange.declare passive | any one of the three on the exchange | | | |
//! | exchange.delete | exchange | | | |
//! | queue.declare | queue | | | |
//! | queue.declare, new, with `x-dead-letter-exchange` | queue | DLX | queue | |
//! | queue.declare passive | any one of the three on the queue | | | |
//! | queue.delete | queue | | | |
//! | queue.bind / queue.unbind | | queue | exchange | read, binding key |
//! | exchange.bind / exchange.unbind | | destination | source | read, binding key |
//! | basic.publish | | exchange | | write, routing key |
//! | basic.get / basic.consume / queue.purge | | | queue | |
//!
//! - The default exchange is checked as `amq.default` (`check_resource_access/4` in
//!   `rabbit_access_control.erl`), and named so in refusals.
//! - A server-named queue is checked under the name the server generated (`amq.gen-…`), which
//!   is why RabbitMQ's docs suggest `^amq\.gen.*` in configure patterns.
//! - Exclusive queues need nothing more: their exclusivity is enforced by the queue (405
//!   RESOURCE_LOCKED), not by permissions.
//! - Passive declares: RabbitMQ up to 4.2.5 checked nothing, 4.2.6 and 4.3.0 required configure,
//!   and 4.3.1 settled on any one permission on the resource (rabbitmq-server#16085: a passive
//!   declare changes nothing, but must not let anyone probe for names). Warren follows 4.3.1; a
//!   refusal reads as the configure one.
//! - Direct reply-to (`amq.rabbitmq.reply-to`) needs nothing to declare or consume.
//! - Topic checks apply only when the exchange is a topic exchange, and RabbitMQ makes them after
//!   looking the exchange up; see [`Requirement::topic`].
//!
//! Management operations need user tags (rabbitmq.com/docs/management#permissions,
//! `rabbit_web_dispatch_access_control.erl`); see [`ManagementAccess`]. Management requests that
//! act on queues, exchanges, bindings or messages are the AMQP operations above.

use std::fmt;

use super::permissions::Permission;

/// The name RabbitMQ checks and reports for the default exchange `""`.
pub const DEFAULT_EXCHANGE_PERMISSION_NAME: &str = "amq.default";

/// The pseudo-queue of direct reply-to.
pub const DIRECT_REPLY_TO_QUEUE: &str = "amq.rabbitmq.reply-to";

/// An operation to be authorised. Names are borrowed from the request; nothing is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation<'a> {
    // --- AMQP 0-9-1: connection and channel ---
    /// connection.open: the user needs permissions in the vhost (530 NOT_ALLOWED otherwise).
    ConnectionOpen,
    /// connection.update-secret: the vhost access is checked again with the new credentials.
    ConnectionUpdateSecret,
    /// connection.close.
    ConnectionClose,
    /// channel.open (the user's channel limit is checked separately, with the count).
    ChannelOpen,
    /// channel.close.
    ChannelClose,
    /// channel.flow.
    ChannelFlow,

    // --- AMQP 0-9-1: exchanges ---
    /// exchange.declare.
    ExchangeDeclare {
        /// Exchange name.
        exchange: &'a str,
        /// Only check that it exists.
        passive: bool,
        /// The `alternate-exchange` argument, given only when the declare creates the exchange
        /// (RabbitMQ does not check it when the exchange exists already).
        alternate_exchange: Option<&'a str>,
    },
    /// exchange.delete.
    ExchangeDelete {
        /// Exchange name.
        exchange: &'a str,
    },
    /// exchange.bind.
    ExchangeBind {
        /// Destination exchange.
        destination: &'a str,
        /// Source exchange.
        source: &'a str,
        /// Binding key.
        routing_key: &'a str,
    },
    /// exchange.unbind.
    ExchangeUnbind {
        /// Destination exchange.
        destination: &'a str,
        /// Source exchange.
        source: &'a str,
        /// Binding key.
        routing_key: &'a str,
    },

    // --- AMQP 0-9-1: queues ---
    /// queue.declare; for a server-named queue, `queue` is the generated name.
    QueueDeclare {
        /// Queue name.
        queue: &'a str,
        /// Only check that it exists.
        passive: bool,
        /// The `x-dead-letter-exchange` argument, given only when the declare creates the queue
        /// (RabbitMQ does not check it when the queue exists already).
        dead_letter_exchange: Option<&'a str>,
    },
    /// queue.delete.
    QueueDelete {
        /// Queue name.
        queue: &'a str,
    },
    /// queue.bind.
    QueueBind {
        /// Queue name.
        queue: &'a str,
        /// Source exchange.
        exchange: &'a str,
        /// Binding key.
        routing_key: &'a str,
    },
    /// queue.unbind.
    QueueUnbind {
        /// Queue name.
        queue: &'a str,
        /// Source exchange.
        exchange: &'a str,
        /// Binding key.
        routing_key: &'a str,
    },
    /// queue.purge.
    QueuePurge {
        /// Queue name.
        queue: &'a str,
    },

    // --- AMQP 0-9-1: messages ---
    /// basic.publish.
    BasicPublish {
        /// Exchange name; `""` is the default exchange.
        exchange: &'a str,
        /// Routing key.
        routing_key: &'a str,
        /// The message's `user_id` property, if set: it must name the publishing user unless
        /// that user has the `impersonator` tag.
        user_id: Option<&'a str>,
    },
    /// basic.get.
    BasicGet {
        /// Queue name.
        queue: &'a str,
    },
    /// basic.consume.
    BasicConsume {
        /// Queue name.
        queue: &'a str,
    },
    /// basic.cancel.
    BasicCancel,
    /// basic.ack.
    BasicAck,
    /// basic.nack.
    BasicNack,
    /// basic.reject.
    BasicReject,
    /// basic.recover and basic.recover-async.
    BasicRecover,
    /// basic.qos.
    BasicQos,
    /// confirm.select.
    ConfirmSelect,
    /// tx.select.
    TxSelect,
    /// tx.commit.
    TxCommit,
    /// tx.rollback.
    TxRollback,

    // --- Management: users, vhosts, permissions, limits (administrator) ---
    /// Create or update a vhost.
    VhostPut {
        /// Vhost name.
        vhost: &'a str,
    },
    /// Delete a vhost.
    VhostDelete {
        /// Vhost name.
        vhost: &'a str,
    },
    /// Set a vhost's limits.
    VhostLimitsSet {
        /// Vhost name.
        vhost: &'a str,
    },
    /// Clear a vhost's limits.
    VhostLimitsClear {
        /// Vhost name.
        vhost: &'a str,
    },
    /// Create or update a user.
    UserPut {
        /// User name.
        user: &'a str,
    },
    /// Delete a user.
    UserDelete {
        /// User name.
        user: &'a str,
    },
    /// Set a user's limits.
    UserLimitsSet {
        /// User name.
        user: &'a str,
    },
    /// Clear a user's limits.
    UserLimitsClear {
        /// User name.
        user: &'a str,
    },
    /// Set a user's permissions in a vhost.
    PermissionsSet {
        /// User name.
        user: &'a str,
        /// Vhost name.
        vhost: &'a str,
    },
    /// Clear a user's permissions in a vhost.
    PermissionsClear {
        /// User name.
        user: &'a str,
        /// Vhost name.
        vhost: &'a str,
    },
    /// Set a user's topic permissions on an exchange.
    TopicPermissionsSet {
        /// User name.
        user: &'a str,
        /// Vhost name.
        vhost: &'a str,
        /// Topic exchange.
        exchange: &'a str,
    },
    /// Clear a user's topic permissions on one exchange, or on all (`None`).
    TopicPermissionsClear {
        /// User name.
        user: &'a str,
        /// Vhost name.
        vhost: &'a str,
        /// Topic exchange, or all.
        exchange: Option<&'a str>,
    },
    /// List users.
    UsersList,
    /// List all permissions and topic permissions.
    PermissionsList,
    /// Export the definitions of the whole broker.
    DefinitionsExport,
    /// Import a definitions file.
    DefinitionsImport,

    // --- Management: policies and parameters (policymaker) ---
    /// Create or update a policy (or operator policy) in a vhost.
    PolicyPut {
        /// Vhost name.
        vhost: &'a str,
        /// Policy name.
        name: &'a str,
    },
    /// Delete a policy.
    PolicyDelete {
        /// Vhost name.
        vhost: &'a str,
        /// Policy name.
        name: &'a str,
    },
    /// Create, update or delete an operator policy in a vhost (administrators only, as in
    /// RabbitMQ's `rabbit_mgmt_wm_operator_policy`).
    OperatorPolicyChange {
        /// Vhost name.
        vhost: &'a str,
        /// Policy name.
        name: &'a str,
    },
    /// Set a vhost-scoped runtime parameter (e.g. a federation upstream).
    ParameterPut {
        /// Vhost name.
        vhost: &'a str,
        /// Component, e.g. `federation-upstream`.
        component: &'a str,
        /// Parameter name.
        name: &'a str,
    },
    /// Clear a vhost-scoped runtime parameter.
    ParameterDelete {
        /// Vhost name.
        vhost: &'a str,
        /// Component.
        component: &'a str,
        /// Parameter name.
        name: &'a str,
    },
    /// Set a global runtime parameter (e.g. `cluster_name`).
    GlobalParameterPut {
        /// Parameter name.
        name: &'a str,
    },
    /// Clear a global runtime parameter.
    GlobalParameterDelete {
        /// Parameter name.
        name: &'a str,
    },

    // --- Management: reads ---
    /// The overview page and `whoami`: any management user.
    Overview,
    /// List vhosts (the front end shows only those the user can access, unless administrator or
    /// monitoring).
    VhostsList,
    /// Read a vhost's queues, exchanges, bindings, connections and channels.
    VhostRead {
        /// Vhost name.
        vhost: &'a str,
    },
    /// Node metrics and cluster state.
    NodesRead,
    /// Look at one client connection (or its channels).
    ConnectionView {
        /// The user the connection belongs to.
        owner: &'a str,
    },
    /// Force one client connection closed.
    ConnectionForceClose {
        /// The user the connection belongs to.
        owner: &'a str,
    },
}

/// The kind of a resource in permission checks and refusal texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResourceKind {
    /// An exchange.
    Exchange,
    /// A queue.
    Queue,
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResourceKind::Exchange => "exchange",
            ResourceKind::Queue => "queue",
        })
    }
}

/// What a resource check asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// This one permission.
    Permission(Permission),
    /// Any one of read, write or configure (passive declares); refused as configure.
    AnyPermission,
}

/// One permission check on one named resource in the caller's vhost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceCheck<'a> {
    /// Exchange or queue.
    pub kind: ResourceKind,
    /// The name checked: `amq.default` for the default exchange.
    pub name: &'a str,
    /// The permission needed.
    pub need: Need,
}

/// A topic-permission check on a routing or binding key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicCheck<'a> {
    /// The exchange whose topic permissions apply (publish: the target; bind: the source).
    pub exchange: &'a str,
    /// `Write` for publish, `Read` for bind and unbind.
    pub permission: Permission,
    /// The routing key (publish) or binding key (bind).
    pub routing_key: &'a str,
}

/// The tags a management operation needs. Every management operation also needs one of the four
/// management tags (`administrator`, `monitoring`, `policymaker`, `management`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManagementAccess<'a> {
    /// Any management user.
    AnyManagementUser,
    /// `administrator`.
    Administrator,
    /// `administrator` or `monitoring`.
    Monitoring,
    /// `administrator`, `monitoring`, or permissions in `vhost`.
    VhostVisible {
        /// The vhost read.
        vhost: &'a str,
    },
    /// `administrator`, or `policymaker` with permissions in `vhost`.
    Policymaker {
        /// The vhost whose policies or parameters change.
        vhost: &'a str,
    },
    /// `administrator` or `policymaker`.
    GlobalPolicymaker,
    /// `administrator` or `monitoring`, or the user is `owner`.
    MonitorOrOwner {
        /// The user the object belongs to.
        owner: &'a str,
    },
    /// `administrator`, or the user is `owner`.
    AdministratorOrOwner {
        /// The user the object belongs to.
        owner: &'a str,
    },
}

/// Most resource checks one operation makes (a declare with an alternate or dead-letter exchange).
pub const MAX_RESOURCE_CHECKS: usize = 3;

/// Everything an operation needs, in the order RabbitMQ checks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Requirement<'a> {
    /// The user needs permissions in the vhost (connection.open).
    pub vhost_access: bool,
    resources: [Option<ResourceCheck<'a>>; MAX_RESOURCE_CHECKS],
    /// A topic check. RabbitMQ makes it after the resource checks *and* after looking the
    /// exchange up, and only if that exchange is a topic exchange: a missing exchange is 404
    /// NOT_FOUND, not 403. See `AccessControl::check_after_lookup`.
    pub topic: Option<TopicCheck<'a>>,
    /// A publish's `user_id` property to compare with the user (406 PRECONDITION_FAILED when it
    /// differs and the user lacks `impersonator`), checked with the topic check.
    pub user_id: Option<&'a str>,
    /// Tags needed for a management operation.
    pub management: Option<ManagementAccess<'a>>,
}

impl<'a> Requirement<'a> {
    /// Nothing at all.
    pub fn none() -> Self {
        Requirement::default()
    }

    /// The resource checks, in order.
    pub fn resources(&self) -> impl Iterator<Item = &ResourceCheck<'a>> {
        self.resources.iter().flatten()
    }

    /// True when nothing is needed.
    #[inline]
    pub fn is_none(&self) -> bool {
        // Resource checks fill the array from the front (`with`), so the first slot tells.
        !self.vhost_access
            && self.resources[0].is_none()
            && self.topic.is_none()
            && self.user_id.is_none()
            && self.management.is_none()
    }

    fn vhost_access() -> Self {
        Requirement {
            vhost_access: true,
            ..Default::default()
        }
    }

    fn management(access: ManagementAccess<'a>) -> Self {
        Requirement {
            management: Some(access),
            ..Default::default()
        }
    }

    fn with(mut self, kind: ResourceKind, name: &'a str, need: Need) -> Self {
        let name = match kind {
            ResourceKind::Exchange => exchange_permission_name(name),
            ResourceKind::Queue => name,
        };
        let slot = self
            .resources
            .iter_mut()
            .find(|r| r.is_none())
            .expect("an operation makes at most MAX_RESOURCE_CHECKS resource checks");
        *slot = Some(ResourceCheck { kind, name, need });
        self
    }

    fn on_exchange(self, name: &'a str, permission: Permission) -> Self {
        self.with(ResourceKind::Exchange, name, Need::Permission(permission))
    }

    fn on_queue(self, name: &'a str, permission: Permission) -> Self {
        self.with(ResourceKind::Queue, name, Need::Permission(permission))
    }

    fn with_topic(
        mut self,
        exchange: &'a str,
        permission: Permission,
        routing_key: &'a str,
    ) -> Self {
        self.topic = Some(TopicCheck {
            exchange: exchange_permission_name(exchange),
            permission,
            routing_key,
        });
        self
    }
}

/// The name an exchange is checked and reported under: `amq.default` for `""`.
pub fn exchange_permission_name(name: &str) -> &str {
    if name.is_empty() {
        DEFAULT_EXCHANGE_PERMISSION_NAME
    } else {
        name
    }
}

/// What `op` needs. Pure: depends on nothing but `op`. Inlined, so that a caller naming a
/// constant operation (basic.ack on every acknowledgement) folds its check away.
#[inline]
pub fn required_access<'a>(op: &Operation<'a>) -> Requirement<'a> {
    use ManagementAccess as M;
    use Permission::{Configure, Read, Write};
    use ResourceKind::{Exchange, Queue};
    let none = Requirement::none();
    match *op {
        Operation::ConnectionOpen | Operation::ConnectionUpdateSecret => {
            Requirement::vhost_access()
        }
        Operation::ConnectionClose
        | Operation::ChannelOpen
        | Operation::ChannelClose
        | Operation::ChannelFlow => none,

        Operation::ExchangeDeclare {
            exchange,
            passive: true,
            ..
        } => none.with(Exchange, exchange, Need::AnyPermission),
        Operation::ExchangeDeclare {
            exchange,
            passive: false,
            alternate_exchange,
        } => {
            let req = none.on_exchange(exchange, Configure);
            match alternate_exchange {
                Some(ae) => req.on_exchange(exchange, Read).on_exchange(ae, Write),
                None => req,
            }
        }
        Operation::ExchangeDelete { exchange } => none.on_exchange(exchange, Configure),
        Operation::ExchangeBind {
            destination,
            source,
            routing_key,
        }
        | Operation::ExchangeUnbind {
            destination,
            source,
            routing_key,
        } => none
            .on_exchange(destination, Write)
            .on_exchange(source, Read)
            .with_topic(source, Read, routing_key),

        Operation::QueueDeclare { queue, .. } if queue.starts_with(DIRECT_REPLY_TO_QUEUE) => none,
        Operation::QueueDeclare {
            queue,
            passive: true,
            ..
        } => none.with(Queue, queue, Need::AnyPermission),
        Operation::QueueDeclare {
            queue,
            passive: false,
            dead_letter_exchange,
        } => {
            let req = none.on_queue(queue, Configure);
            match dead_letter_exchange {
                Some(dlx) => req.on_queue(queue, Read).on_exchange(dlx, Write),
                None => req,
            }
        }
        Operation::QueueDelete { queue } => none.on_queue(queue, Configure),
        Operation::QueueBind {
            queue,
            exchange,
            routing_key,
        }
        | Operation::QueueUnbind {
            queue,
            exchange,
            routing_key,
        } => none
            .on_queue(queue, Write)
            .on_exchange(exchange, Read)
            .with_topic(exchange, Read, routing_key),
        Operation::QueuePurge { queue } => none.on_queue(queue, Read),

        Operation::BasicPublish {
            exchange,
            routing_key,
            user_id,
        } => Requirement {
            user_id,
            ..none
                .on_exchange(exchange, Write)
                .with_topic(exchange, Write, routing_key)
        },
        Operation::BasicGet { queue } => none.on_queue(queue, Read),
        Operation::BasicConsume { queue } if queue == DIRECT_REPLY_TO_QUEUE => none,
        Operation::BasicConsume { queue } => none.on_queue(queue, Read),
        Operation::BasicCancel
        | Operation::BasicAck
        | Operation::BasicNack
        | Operation::BasicReject
        | Operation::BasicRecover
        | Operation::BasicQos
        | Operation::ConfirmSelect
        | Operation::TxSelect
        | Operation::TxCommit
        | Operation::TxRollback => none,

        Operation::VhostPut { .. }
        | Operation::VhostDelete { .. }
        | Operation::VhostLimitsSet { .. }
        | Operation::VhostLimitsClear { .. }
        | Operation::UserPut { .. }
        | Operation::UserDelete { .. }
        | Operation::UserLimitsSet { .. }
        | Operation::UserLimitsClear { .. }
        | Operation::PermissionsSet { .. }
        | Operation::PermissionsClear { .. }
        | Operation::TopicPermissionsSet { .. }
        | Operation::TopicPermissionsClear { .. }
        | Operation::UsersList
        | Operation::PermissionsList
        | Operation::DefinitionsExport
        | Operation::DefinitionsImport
        | Operation::OperatorPolicyChange { .. } => Requirement::management(M::Administrator),

        Operation::PolicyPut { vhost, .. }
        | Operation::PolicyDelete { vhost, .. }
        | Operation::ParameterPut { vhost, .. }
        | Operation::ParameterDelete { vhost, .. } => {
            Requirement::management(M::Policymaker { vhost })
        }
        Operation::GlobalParameterPut { .. } | Operation::GlobalParameterDelete { .. } => {
            Requirement::management(M::GlobalPolicymaker)
        }

        Operation::Overview | Operation::VhostsList => {
            Requirement::management(M::AnyManagementUser)
        }
        Operation::VhostRead { vhost } => Requirement::management(M::VhostVisible { vhost }),
        Operation::NodesRead => Requirement::management(M::Monitoring),
        Operation::ConnectionView { owner } => Requirement::management(M::MonitorOrOwner { owner }),
        Operation::ConnectionForceClose { owner } => {
            Requirement::management(M::AdministratorOrOwner { owner })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Permission::{Configure, Read, Write};
    use ResourceKind::{Exchange, Queue};

    fn checks<'a>(op: Operation<'a>) -> Vec<(ResourceKind, &'a str, Need)> {
        required_access(&op)
            .resources()
            .map(|c| (c.kind, c.name, c.need))
            .collect()
    }

    fn p(perm: Permission) -> Need {
        Need::Permission(perm)
    }

    #[test]
    fn exchange_operations() {
        let declare = |passive, ae| Operation::ExchangeDeclare {
            exchange: "x",
            passive,
            alternate_exchange: ae,
        };
        assert_eq!(
            checks(declare(false, None)),
            vec![(Exchange, "x", p(Configure))]
        );
        assert_eq!(
            checks(declare(false, Some("ae"))),
            vec![
                (Exchange, "x", p(Configure)),
                (Exchange, "x", p(Read)),
                (Exchange, "ae", p(Write))
            ]
        );
        assert_eq!(
            checks(declare(true, Some("ae"))),
            vec![(Exchange, "x", Need::AnyPermission)]
        );
        assert_eq!(
            checks(Operation::ExchangeDelete { exchange: "x" }),
            vec![(Exchange, "x", p(Configure))]
        );
        for op in [
            Operation::ExchangeBind {
                destination: "d",
                source: "s",
                routing_key: "k",
            },
            Operation::ExchangeUnbind {
                destination: "d",
                source: "s",
                routing_key: "k",
            },
        ] {
            assert_eq!(
                checks(op),
                vec![(Exchange, "d", p(Write)), (Exchange, "s", p(Read))]
            );
            assert_eq!(
                required_access(&op).topic,
                Some(TopicCheck {
                    exchange: "s",
                    permission: Read,
                    routing_key: "k"
                })
            );
        }
    }

    #[test]
    fn queue_operations() {
        let declare = |queue, passive, dlx| Operation::QueueDeclare {
            queue,
            passive,
            dead_letter_exchange: dlx,
        };
        assert_eq!(
            checks(declare("q", false, None)),
            vec![(Queue, "q", p(Configure))]
        );
        assert_eq!(
            checks(declare("q", false, Some(""))),
            vec![
                (Queue, "q", p(Configure)),
                (Queue, "q", p(Read)),
                (Exchange, "amq.default", p(Write))
            ]
        );
        assert_eq!(
            checks(declare("q", true, None)),
            vec![(Queue, "q", Need::AnyPermission)]
        );
        assert_eq!(
            checks(declare("amq.gen-JzTY20BRgKO-HjmUJj0wLg", false, None)),
            vec![(Queue, "amq.gen-JzTY20BRgKO-HjmUJj0wLg", p(Configure))]
        );
        assert!(required_access(&declare("amq.rabbitmq.reply-to", false, None)).is_none());
        assert!(required_access(&declare("amq.rabbitmq.reply-to.g1h2AA", true, None)).is_none());
        assert_eq!(
            checks(Operation::QueueDelete { queue: "q" }),
            vec![(Queue, "q", p(Configure))]
        );
        assert_eq!(
            checks(Operation::QueuePurge { queue: "q" }),
            vec![(Queue, "q", p(Read))]
        );
        for op in [
            Operation::QueueBind {
                queue: "q",
                exchange: "x",
                routing_key: "a.b",
            },
            Operation::QueueUnbind {
                queue: "q",
                exchange: "x",
                routing_key: "a.b",
            },
        ] {
            assert_eq!(
                checks(op),
                vec![(Queue, "q", p(Write)), (Exchange, "x", p(Read))]
            );
            let topic = required_access(&op).topic.unwrap();
            assert_eq!(
                (topic.exchange, topic.permission, topic.routing_key),
                ("x", Read, "a.b")
            );
        }
    }

    #[test]
    fn message_operations() {
        let publish = Operation::BasicPublish {
            exchange: "",
            routing_key: "q",
            user_id: Some("bob"),
        };
        let req = required_access(&publish);
        assert_eq!(checks(publish), vec![(Exchange, "amq.default", p(Write))]);
        assert_eq!(req.user_id, Some("bob"));
        assert_eq!(
            req.topic,
            Some(TopicCheck {
                exchange: "amq.default",
                permission: Write,
                routing_key: "q"
            })
        );
        assert_eq!(
            checks(Operation::BasicGet { queue: "q" }),
            vec![(Queue, "q", p(Read))]
        );
        assert_eq!(
            checks(Operation::BasicConsume { queue: "q" }),
            vec![(Queue, "q", p(Read))]
        );
        assert!(required_access(&Operation::BasicConsume {
            queue: DIRECT_REPLY_TO_QUEUE
        })
        .is_none());
    }

    #[test]
    fn operations_that_need_nothing() {
        for op in [
            Operation::ConnectionClose,
            Operation::ChannelOpen,
            Operation::ChannelClose,
            Operation::ChannelFlow,
            Operation::BasicCancel,
            Operation::BasicAck,
            Operation::BasicNack,
            Operation::BasicReject,
            Operation::BasicRecover,
            Operation::BasicQos,
            Operation::ConfirmSelect,
            Operation::TxSelect,
            Operation::TxCommit,
            Operation::TxRollback,
        ] {
            assert!(required_access(&op).is_none(), "{op:?}");
        }
        for op in [Operation::ConnectionOpen, Operation::ConnectionUpdateSecret] {
            let req = required_access(&op);
            assert!(req.vhost_access);
            assert_eq!(req.resources().count(), 0);
        }
    }

    #[test]
    fn management_operations() {
        use ManagementAccess as M;
        let m = |op| required_access(&op).management;
        for op in [
            Operation::VhostPut { vhost: "v" },
            Operation::VhostDelete { vhost: "v" },
            Operation::VhostLimitsSet { vhost: "v" },
            Operation::VhostLimitsClear { vhost: "v" },
            Operation::UserPut { user: "u" },
            Operation::UserDelete { user: "u" },
            Operation::UserLimitsSet { user: "u" },
            Operation::UserLimitsClear { user: "u" },
            Operation::PermissionsSet {
                user: "u",
                vhost: "v",
            },
            Operation::PermissionsClear {
                user: "u",
                vhost: "v",
            },
            Operation::TopicPermissionsSet {
                user: "u",
                vhost: "v",
                exchange: "x",
            },
            Operation::TopicPermissionsClear {
                user: "u",
                vhost: "v",
                exchange: None,
            },
            Operation::UsersList,
            Operation::PermissionsList,
            Operation::DefinitionsExport,
            Operation::DefinitionsImport,
            Operation::OperatorPolicyChange {
                vhost: "v",
                name: "o",
            },
        ] {
            assert_eq!(m(op), Some(M::Administrator), "{op:?}");
        }
        assert_eq!(
            m(Operation::PolicyPut {
                vhost: "v",
                name: "p"
            }),
            Some(M::Policymaker { vhost: "v" })
        );
        assert_eq!(
            m(Operation::ParameterDelete {
                vhost: "v",
                component: "c",
                name: "n"
            }),
            Some(M::Policymaker { vhost: "v" })
        );
        assert_eq!(
            m(Operation::GlobalParameterPut { name: "n" }),
            Some(M::GlobalPolicymaker)
        );
        assert_eq!(m(Operation::Overview), Some(M::AnyManagementUser));
        assert_eq!(
            m(Operation::VhostRead { vhost: "v" }),
            Some(M::VhostVisible { vhost: "v" })
        );
        assert_eq!(m(Operation::NodesRead), Some(M::Monitoring));
        assert_eq!(
            m(Operation::ConnectionForceClose { owner: "o" }),
            Some(M::AdministratorOrOwner { owner: "o" })
        );
        assert_eq!(
            m(Operation::ConnectionView { owner: "o" }),
            Some(M::MonitorOrOwner { owner: "o" })
        );
    }
}
