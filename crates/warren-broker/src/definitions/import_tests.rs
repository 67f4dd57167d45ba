use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::json;

use super::*;
use crate::definitions::export_access;

fn defs(v: Value) -> Definitions {
    serde_json::from_value(v).unwrap()
}

fn plan(v: Value) -> Result<ImportPlan> {
    plan_import_with_rng(&defs(v), &mut StdRng::seed_from_u64(7))
}

fn apply(plan: &ImportPlan, access: &mut AccessControl) {
    for change in &plan.changes {
        change.apply_to_access(access).unwrap();
    }
}

fn user(extra: Value) -> Value {
    let mut u = json!({"name": "u", "tags": []});
    u.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    json!({ "users": [u] })
}

fn only_user(p: ImportPlan) -> UserChange {
    match p.changes.as_slice() {
        [Change::PutUser(u)] => u.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn changes_come_in_rabbitmq_order() {
    let p = plan(json!({
        "bindings": [{"vhost": "/", "source": "x", "destination": "q", "destination_type": "queue", "routing_key": "k", "arguments": {}}],
        "queues": [{"vhost": "/", "name": "q", "durable": true, "auto_delete": false, "arguments": {"x-max-length": 5}}],
        "parameters": [{"vhost": "/", "component": "federation-upstream", "name": "up", "value": {"uri": "amqp://"}}],
        "policies": [{"vhost": "/", "name": "p", "pattern": "^q$", "definition": {"max-length": 1}}],
        "global_parameters": [{"name": "cluster_name", "value": "c"}],
        "topic_permissions": [{"user": "u", "vhost": "/", "exchange": "amq.topic", "write": ".*", "read": ".*"}],
        "exchanges": [{"vhost": "/", "name": "x", "type": "topic", "durable": true, "auto_delete": false, "internal": false, "arguments": {}}],
        "permissions": [{"user": "u", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
        "vhosts": [{"name": "/"}],
        "users": [{"name": "u", "password_hash": "", "tags": []}]
    }))
    .unwrap();
    let kinds: Vec<&str> = p
        .changes
        .iter()
        .map(|c| match c {
            Change::PutUser(_) => "user",
            Change::PutVhost(_) => "vhost",
            Change::SetVhostLimits { .. } => "vhost-limits",
            Change::SetPermissions { .. } => "permissions",
            Change::SetTopicPermissions { .. } => "topic-permissions",
            Change::DeclareExchange(_) => "exchange",
            Change::SetGlobalParameter { .. } => "global-parameter",
            Change::SetPolicy(_) => "policy",
            Change::SetParameter { .. } => "parameter",
            Change::DeclareQueue(_) => "queue",
            Change::Bind(_) => "binding",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "user",
            "vhost",
            "permissions",
            "exchange",
            "topic-permissions",
            "global-parameter",
            "policy",
            "parameter",
            "queue",
            "binding"
        ]
    );
    match &p.changes[8] {
        Change::DeclareQueue(q) => {
            assert_eq!(
                q.arguments.get("x-max-length").and_then(|v| v.as_i64()),
                Some(5)
            );
        }
        other => panic!("{other:?}"),
    }
    match &p.changes[6] {
        Change::SetPolicy(policy) => {
            assert_eq!((policy.apply_to.as_str(), policy.priority), ("all", 0));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn amq_names_and_the_default_exchange_are_skipped() {
    let p = plan(json!({
        "exchanges": [
            {"vhost": "/", "name": "", "type": "direct"},
            {"vhost": "/", "name": "amq.direct", "type": "direct"},
            {"vhost": "/", "name": "mine", "type": "direct"}
        ],
        "queues": [{"vhost": "/", "name": "amq.gen-abc"}, {"vhost": "/", "name": "q"}],
        "bindings": [{"vhost": "/", "source": "amq.topic", "destination": "q", "destination_type": "queue", "routing_key": "#"}]
    }))
    .unwrap();
    assert_eq!(p.changes.len(), 3, "{:?}", p.changes);
    let skipped: Vec<(&str, &str)> = p
        .skipped
        .iter()
        .map(|s| (s.kind, s.name.as_str()))
        .collect();
    assert_eq!(
        skipped,
        [
            ("exchange", ""),
            ("exchange", "amq.direct"),
            ("queue", "amq.gen-abc")
        ]
    );
}

#[test]
fn objects_without_vhost_need_a_vhost_import() {
    let file = json!({
        "queues": [{"name": "q"}],
        "exchanges": [{"name": "x", "type": "fanout"}],
        "bindings": [{"source": "x", "destination": "q", "destination_type": "queue"}],
        "policies": [{"name": "p", "pattern": ".*", "definition": {}}],
        "parameters": [{"component": "vhost-limits", "name": "limits", "value": {"max-queues": 4}}],
        "users": [{"name": "ignored", "tags": []}]
    });
    assert_eq!(
        plan(file.clone()).unwrap_err(),
        ImportError::MissingVhost {
            kind: "exchange",
            name: "x".into()
        }
    );
    let p = plan_vhost_import(&defs(file), "target").unwrap();
    assert_eq!(p.changes.len(), 5);
    for change in &p.changes {
        let vhost = match change {
            Change::DeclareExchange(x) => &x.vhost,
            Change::DeclareQueue(q) => &q.vhost,
            Change::Bind(b) => &b.vhost,
            Change::SetPolicy(p) => &p.vhost,
            Change::SetVhostLimits { vhost, limits } => {
                assert_eq!(limits.max_queues, Some(4));
                vhost
            }
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(vhost, "target");
    }
}

#[test]
fn password_hash_forms() {
    let u = only_user(
        plan(user(json!({
            "password_hash": "kI3GChNpte2FApYFXScl+0dIluk=",
            "hashing_algorithm": "rabbit_password_hashing_md5"
        })))
        .unwrap(),
    );
    assert!(u.password.verify("test12"));
    assert_eq!(u.password.algorithm, HashingAlgorithm::Md5);

    // No algorithm in a file from RabbitMQ 3.5: MD5.
    let mut d = defs(user(
        json!({"password_hash": "kI3GChNpte2FApYFXScl+0dIluk="}),
    ));
    d.rabbit_version = Some("3.5.7".into());
    let u = only_user(plan_import(&d).unwrap());
    assert!(u.password.verify("test12"));

    // Passwordless, both ways RabbitMQ writes it.
    for extra in [json!({"password_hash": ""}), json!({})] {
        let u = only_user(plan(user(extra)).unwrap());
        assert!(!u.password.is_set());
    }

    assert_eq!(
        plan(user(json!({"password_hash": "!!"}))).unwrap_err(),
        ImportError::BadPasswordHash {
            user: "u".into(),
            reason: "Invalid symbol 33, offset 0.".into()
        }
    );
    assert_eq!(
        plan(user(
            json!({"password_hash": "", "hashing_algorithm": "rabbit_password_hashing_bcrypt"})
        ))
        .unwrap_err(),
        ImportError::UnknownHashingAlgorithm {
            user: "u".into(),
            algorithm: "rabbit_password_hashing_bcrypt".into()
        }
    );
}

#[test]
fn cleartext_passwords_are_hashed_in_the_plan() {
    let p = plan(user(json!({"password": "hunter2"}))).unwrap();
    let shown = format!("{p:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    let u = only_user(p);
    assert_eq!(u.password.algorithm, HashingAlgorithm::Sha256);
    assert!(u.password.verify("hunter2"));
    assert_eq!(
        plan(user(json!({"password": "a", "password_hash": ""}))).unwrap_err(),
        ImportError::BothPasswordAndHash("u".into())
    );
}

#[test]
fn tags_as_list_string_or_legacy_flag() {
    let tags = |extra| only_user(plan(extra).unwrap()).tags;
    assert_eq!(
        tags(json!({"users": [{"name": "u", "tags": "administrator, custom"}]})),
        vec![UserTag::Administrator, UserTag::Other("custom".into())]
    );
    assert_eq!(
        tags(json!({"users": [{"name": "u", "tags": ["monitoring"]}]})),
        vec![UserTag::Monitoring]
    );
    assert_eq!(
        tags(json!({"users": [{"name": "u", "administrator": "true"}]})),
        vec![UserTag::Administrator]
    );
    assert_eq!(
        tags(json!({"users": [{"name": "u", "administrator": false}]})),
        vec![]
    );
    assert_eq!(
        plan(json!({"users": [{"name": "u"}]})).unwrap_err(),
        ImportError::TagsMissing("u".into())
    );
    let many: Vec<String> = (0..40).map(|i| format!("t{i}")).collect();
    assert!(matches!(
        plan(json!({"users": [{"name": "u", "tags": many}]})),
        Err(ImportError::TooManyTags { .. })
    ));
}

#[test]
fn limits_follow_rabbitmq_validation() {
    let u = only_user(
        plan(user(
            json!({"limits": {"max-connections": 4, "max-channels": -1}}),
        ))
        .unwrap(),
    );
    assert_eq!(
        u.limits,
        Some(UserLimits {
            max_connections: Some(4),
            max_channels: None
        })
    );
    assert_eq!(
        only_user(plan(user(json!({"limits": {}}))).unwrap()).limits,
        Some(UserLimits::default())
    );
    assert_eq!(only_user(plan(user(json!({}))).unwrap()).limits, None);
    for bad in [
        json!({"max-connections": "4"}),
        json!({"max-queues": 1}),
        json!({"max-channels": 1.5}),
    ] {
        assert!(
            matches!(
                plan(user(json!({"limits": bad}))),
                Err(ImportError::BadLimit { .. })
            ),
            "{bad}"
        );
    }

    // Vhost limits: from the vhost-limits parameter when there is one ...
    let p = plan(json!({
        "vhosts": [{"name": "v", "limits": [["max-queues", 1]]}],
        "parameters": [{"vhost": "v", "component": "vhost-limits", "name": "limits", "value": {"max-queues": 32, "max-connections": 16}}]
    }))
    .unwrap();
    let limits: Vec<_> = p
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::SetVhostLimits { vhost, limits } => Some((vhost.as_str(), *limits)),
            _ => None,
        })
        .collect();
    assert_eq!(
        limits,
        [(
            "v",
            VhostLimits {
                max_connections: Some(16),
                max_queues: Some(32)
            }
        )]
    );
    // ... else from the vhost entry, in either shape.
    for shape in [json!({"max-queues": 2}), json!([["max-queues", 2]])] {
        let p = plan(json!({"vhosts": [{"name": "v", "limits": shape}]})).unwrap();
        assert_eq!(
            p.changes[1],
            Change::SetVhostLimits {
                vhost: "v".into(),
                limits: VhostLimits {
                    max_connections: None,
                    max_queues: Some(2)
                }
            }
        );
    }
    assert!(matches!(
        plan(json!({"vhosts": [{"name": "v", "limits": {"max-channels": 2}}]})),
        Err(ImportError::BadLimit { .. })
    ));
}

#[test]
fn vhost_metadata_from_either_place() {
    let p = plan(json!({"vhosts": [
        {"name": "a", "metadata": {"description": "meta", "tags": ["x"], "default_queue_type": "quorum"}},
        {"name": "b", "description": "top", "tags": "y,z", "default_queue_type": "classic", "metadata": {"description": "meta"}},
        {"name": "c"}
    ]}))
    .unwrap();
    let vhosts: Vec<VhostChange> = p
        .changes
        .into_iter()
        .map(|c| match c {
            Change::PutVhost(v) => v,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        (
            vhosts[0].description.as_str(),
            vhosts[0].tags.clone(),
            vhosts[0].default_queue_type.as_deref()
        ),
        ("meta", vec!["x".to_string()], Some("quorum"))
    );
    assert_eq!(
        (
            vhosts[1].description.as_str(),
            vhosts[1].tags.clone(),
            vhosts[1].default_queue_type.as_deref()
        ),
        (
            "top",
            vec!["y".to_string(), "z".to_string()],
            Some("classic")
        )
    );
    assert_eq!(
        vhosts[2],
        VhostChange {
            name: "c".into(),
            description: String::new(),
            tags: vec![],
            default_queue_type: None
        }
    );
    assert_eq!(
        plan(json!({"vhosts": [{"name": "v", "metadata": {"default_queue_type": ""}}]}))
            .unwrap_err(),
        ImportError::EmptyDefaultQueueType("v".into())
    );
}

#[test]
fn invalid_patterns_and_arguments_refuse_the_file() {
    assert!(matches!(
        plan(
            json!({"permissions": [{"user": "u", "vhost": "/", "configure": "(", "write": "", "read": ""}]})
        ),
        Err(ImportError::Pattern { .. })
    ));
    assert!(matches!(
        plan(
            json!({"topic_permissions": [{"user": "u", "vhost": "/", "exchange": "t", "write": "", "read": "[a"}]})
        ),
        Err(ImportError::Pattern { .. })
    ));
    assert_eq!(
        plan(json!({"queues": [{"vhost": "/", "name": "q", "arguments": {"x-expires": null}}]}))
            .unwrap_err(),
        ImportError::Argument {
            kind: "queue",
            name: "q".into(),
            vhost: "/".into(),
            error: ArgumentError::Null("x-expires".into())
        }
    );
}

#[test]
fn duplicate_bindings_collapse() {
    let b = json!({"vhost": "/", "source": "x", "destination": "q", "destination_type": "queue", "routing_key": "k", "arguments": {"a": 1}});
    let mut other_key = b.clone();
    other_key["routing_key"] = json!("k2");
    let p = plan(json!({"bindings": [b.clone(), b, other_key]})).unwrap();
    assert_eq!(p.changes.len(), 2);
}

#[test]
fn applying_twice_changes_nothing() {
    let file = json!({
        "users": [{"name": "app", "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["management"],
                   "limits": {"max-channels": 8}}],
        "vhosts": [{"name": "v", "metadata": {"description": "d", "tags": []}}],
        "permissions": [{"user": "app", "vhost": "v", "configure": "^app", "write": ".*", "read": ".*"}],
        "topic_permissions": [{"user": "app", "vhost": "v", "exchange": "amq.topic", "write": "^{username}\\.", "read": ".*"}],
        "parameters": [{"vhost": "v", "component": "vhost-limits", "name": "limits", "value": {"max-connections": 3}}]
    });
    let p = plan(file).unwrap();
    let mut access = AccessControl::new();
    apply(&p, &mut access);
    let once = export_access(&access);
    apply(&p, &mut access);
    assert_eq!(export_access(&access), once);
    assert!(access.authenticate("app", "test12").is_ok());
    assert_eq!(access.user("app").unwrap().limits.max_channels, Some(8));
    assert_eq!(access.vhost("v").unwrap().limits.max_connections, Some(3));
    // The plan of the exported file applies to the same state again.
    let again = plan_import(&once).unwrap();
    let mut fresh = AccessControl::new();
    apply(&again, &mut fresh);
    assert_eq!(export_access(&fresh), once);
}

#[test]
fn apply_keeps_limits_that_the_file_does_not_mention() {
    let mut access = AccessControl::new();
    apply(
        &plan(
            json!({"users": [{"name": "u", "tags": [], "limits": {"max-channels": 2}}],
                     "vhosts": [{"name": "v", "limits": {"max-queues": 5}}]}),
        )
        .unwrap(),
        &mut access,
    );
    apply(
        &plan(json!({"users": [{"name": "u", "tags": ["management"]}],
                     "vhosts": [{"name": "v", "metadata": {"description": "new"}}]}))
        .unwrap(),
        &mut access,
    );
    assert_eq!(access.user("u").unwrap().limits.max_channels, Some(2));
    assert_eq!(access.user("u").unwrap().tags, vec![UserTag::Management]);
    assert_eq!(access.vhost("v").unwrap().limits.max_queues, Some(5));
    assert_eq!(access.vhost("v").unwrap().description, "new");
}

#[test]
fn topology_changes_are_left_to_the_broker() {
    let p = plan(json!({"queues": [{"vhost": "/", "name": "q"}]})).unwrap();
    let mut access = AccessControl::new();
    assert_eq!(p.changes[0].apply_to_access(&mut access), Ok(false));
}

#[test]
fn permissions_for_unknown_users_fail_at_apply() {
    let p = plan(json!({"permissions": [{"user": "ghost", "vhost": "/", "configure": "", "write": "", "read": ""}]}))
        .unwrap();
    let mut access = AccessControl::with_default_guest();
    assert_eq!(
        p.changes[0].apply_to_access(&mut access),
        Err(AccessError::NoSuchUser("ghost".into()))
    );
}

#[test]
fn queue_type_is_read_from_the_x_queue_type_argument_too() {
    // RabbitMQ 3.x exports carry the type only in the arguments.
    let p = plan(json!({
        "vhosts": [{"name": "/"}],
        "queues": [
            {"name": "qq", "vhost": "/", "durable": true, "auto_delete": false,
             "arguments": {"x-queue-type": "quorum"}},
            {"name": "cq", "vhost": "/", "durable": true, "auto_delete": false, "arguments": {}}
        ]
    }))
    .unwrap();
    let types: Vec<(String, Option<String>)> = p
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::DeclareQueue(q) => Some((q.name.clone(), q.queue_type.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        types,
        vec![
            ("qq".to_string(), Some("quorum".to_string())),
            ("cq".to_string(), None)
        ]
    );
}
