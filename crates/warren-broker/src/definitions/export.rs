//! Exporting the access-control database in the definitions format.
//!
//! [`export_access`] writes users, vhosts, permissions, topic permissions, global
//! parameters and vhost limits as
//! RabbitMQ 4.x does (`rabbit_definitions.erl`, "Export"): tags as lists, vhost metadata and
//! limits as objects, and the limits once more as a `vhost-limits` parameter, which is where
//! RabbitMQ's import reads them. Entries are sorted by name so that exports of equal databases
//! are equal. The broker adds queues, exchanges, bindings, policies and parameters of its own,
//! and the version fields.

use serde_json::{json, Map, Value};

use super::format::{
    Definitions, GlobalParameterDefinition, LimitsDefinition, Object, ParameterDefinition,
    PermissionDefinition, Tags, TopicPermissionDefinition, UserDefinition, VhostDefinition,
    VhostMetadataDefinition,
};
use super::import::VHOST_LIMITS_COMPONENT;
use crate::access::{AccessControl, UserLimits, UserTag, VhostLimits};

fn limit_entries(entries: [(&str, Option<u64>); 2]) -> Object {
    entries
        .into_iter()
        .filter_map(|(k, v)| v.map(|n| (k.to_string(), json!(n))))
        .collect()
}

fn user_limits(l: &UserLimits) -> Object {
    limit_entries([
        ("max-connections", l.max_connections),
        ("max-channels", l.max_channels),
    ])
}

fn vhost_limits(l: &VhostLimits) -> Object {
    limit_entries([
        ("max-connections", l.max_connections),
        ("max-queues", l.max_queues),
    ])
}

/// The access-control part of a definitions file; the other lists are left `None`.
pub fn export_access(access: &AccessControl) -> Definitions {
    let mut users: Vec<UserDefinition> = access
        .users()
        .map(|u| UserDefinition {
            name: u.name.clone(),
            password_hash: Some(u.password.to_base64()),
            password: None,
            hashing_algorithm: Some(u.password.algorithm.module_name().to_string()),
            tags: Some(Tags::List(
                u.tags
                    .iter()
                    .map(UserTag::as_str)
                    .map(str::to_string)
                    .collect(),
            )),
            limits: Some(user_limits(&u.limits)),
            extra: Map::new(),
        })
        .collect();
    users.sort_by(|a, b| a.name.cmp(&b.name));

    let mut vhosts: Vec<VhostDefinition> = access
        .vhosts()
        .map(|v| VhostDefinition {
            name: v.name.clone(),
            description: None,
            tags: None,
            default_queue_type: None,
            metadata: Some(VhostMetadataDefinition {
                description: Some(v.description.clone()),
                tags: Some(Tags::List(v.tags.clone())),
                default_queue_type: v.default_queue_type.clone(),
                extra: Map::new(),
            }),
            limits: Some(LimitsDefinition::Object(vhost_limits(&v.limits))),
            extra: Map::new(),
        })
        .collect();
    vhosts.sort_by(|a, b| a.name.cmp(&b.name));

    let mut parameters: Vec<ParameterDefinition> = access
        .vhosts()
        .filter(|v| v.limits != VhostLimits::default())
        .map(|v| ParameterDefinition {
            vhost: Some(v.name.clone()),
            component: VHOST_LIMITS_COMPONENT.to_string(),
            name: "limits".to_string(),
            value: Value::Object(vhost_limits(&v.limits)),
            extra: Map::new(),
        })
        .collect();
    parameters.sort_by(|a, b| a.vhost.cmp(&b.vhost));

    let mut permissions: Vec<PermissionDefinition> = access
        .all_permissions()
        .map(|(user, vhost, p)| PermissionDefinition {
            user: user.to_string(),
            vhost: vhost.to_string(),
            configure: p.configure.source().to_string(),
            write: p.write.source().to_string(),
            read: p.read.source().to_string(),
            extra: Map::new(),
        })
        .collect();
    permissions.sort_by(|a, b| (&a.user, &a.vhost).cmp(&(&b.user, &b.vhost)));

    let mut topic_permissions: Vec<TopicPermissionDefinition> = access
        .all_topic_permissions()
        .map(|(user, vhost, t)| TopicPermissionDefinition {
            user: user.to_string(),
            vhost: vhost.to_string(),
            exchange: t.exchange().to_string(),
            write: t.write_source().to_string(),
            read: t.read_source().to_string(),
            extra: Map::new(),
        })
        .collect();
    topic_permissions
        .sort_by(|a, b| (&a.user, &a.vhost, &a.exchange).cmp(&(&b.user, &b.vhost, &b.exchange)));

    // All of them: this is also the stored database (the management API's export leaves
    // out names starting with `internal`, as rabbit_definitions does).
    let global_parameters: Vec<GlobalParameterDefinition> = access
        .global_parameters()
        .map(|(name, value)| GlobalParameterDefinition {
            name: name.to_string(),
            value: value.clone(),
            extra: Map::new(),
        })
        .collect();

    Definitions {
        users: Some(users),
        vhosts: Some(vhosts),
        permissions: Some(permissions),
        topic_permissions: Some(topic_permissions),
        parameters: Some(parameters),
        global_parameters: Some(global_parameters),
        ..Definitions::default()
    }
}
