//! Definitions files exported from RabbitMQ: they parse, round-trip unchanged, import into the
//! access-control database with working passwords and permissions, and export back in the same
//! shape. The fixtures and how they were made are described in tests/fixtures/README.md.

use serde_json::Value;
use warren_amqp::constants;
use warren_broker::access::{
    AccessControl, HashingAlgorithm, OpenConnections, Operation, PasswordHash, UserLimits, UserTag,
    VhostLimits,
};
use warren_broker::definitions::format::DestinationType;
use warren_broker::definitions::{export_access, plan_import, Change, Definitions, ImportPlan};

const RABBITMQ_3_10_8: &str = include_str!("fixtures/definitions-rabbitmq-3.10.8.json");
const RABBITMQ_4X: &str = include_str!("fixtures/definitions-rabbitmq-4x-handwritten.json");

fn parse(text: &str) -> (Definitions, Value) {
    (
        Definitions::from_json(text).expect("fixture parses"),
        serde_json::from_str(text).expect("fixture is JSON"),
    )
}

fn import(defs: &Definitions) -> (ImportPlan, AccessControl) {
    let plan = plan_import(defs).expect("fixture imports");
    let mut access = AccessControl::new();
    for change in &plan.changes {
        change
            .apply_to_access(&mut access)
            .expect("access change applies");
    }
    (plan, access)
}

fn user_verifies(defs: &Definitions, name: &str, password: &str) -> bool {
    let user = defs
        .users()
        .iter()
        .find(|u| u.name == name)
        .expect("user in fixture");
    let algorithm = user
        .hashing_algorithm
        .as_deref()
        .and_then(HashingAlgorithm::from_module_name)
        .expect("known algorithm");
    PasswordHash::from_base64(algorithm, user.password_hash.as_deref().unwrap())
        .unwrap()
        .verify(password)
}

#[test]
fn files_round_trip_unchanged() {
    for text in [RABBITMQ_3_10_8, RABBITMQ_4X] {
        let (defs, original) = parse(text);
        let written: Value = serde_json::from_str(&defs.to_json()).unwrap();
        assert_eq!(written, original);
    }
}

#[test]
fn rabbitmq_hashes_verify_with_their_passwords() {
    let (defs, _) = parse(RABBITMQ_3_10_8);
    assert_eq!(defs.version(), Some("3.10.8"));
    assert!(user_verifies(&defs, "app", "app-Secret-1"));
    assert!(!user_verifies(&defs, "app", "app-Secret-2"));
    assert!(user_verifies(&defs, "guest", "guest"));
    assert!(!user_verifies(&defs, "nopass", "temporary"));

    let (defs, _) = parse(RABBITMQ_4X);
    assert!(user_verifies(&defs, "ops", "ops-Secret-512"));
    assert!(user_verifies(&defs, "legacy", "legacy-md5"));
    assert!(user_verifies(&defs, "svc", "pässwörd"));
    assert!(!user_verifies(&defs, "svc", "passwörd"));
}

#[test]
fn rabbitmq_3_10_8_export_imports() {
    let (defs, _) = parse(RABBITMQ_3_10_8);
    let (plan, access) = import(&defs);

    // Logins, as RabbitMQ would accept them.
    assert!(access.authenticate("app", "app-Secret-1").is_ok());
    assert!(access.authenticate("app", "wrong").is_err());
    assert!(access.authenticate("guest", "guest").is_ok());
    assert!(access.authenticate("nopass", "temporary").is_err());
    let app = access.user("app").unwrap();
    assert_eq!(app.tags, vec![UserTag::Monitoring, UserTag::Policymaker]);
    assert_eq!(
        app.limits,
        UserLimits {
            max_connections: Some(4),
            max_channels: Some(32)
        }
    );

    // Vhosts with metadata and limits (from the vhost-limits parameter).
    let staging = access.vhost("staging").unwrap();
    assert_eq!(staging.description, "Staging environment");
    assert_eq!(staging.tags, vec!["qa", "blue"]);
    assert_eq!(staging.default_queue_type.as_deref(), Some("classic"));
    assert_eq!(
        staging.limits,
        VhostLimits {
            max_connections: Some(16),
            max_queues: Some(32)
        }
    );
    assert_eq!(
        access.vhost("/").unwrap().description,
        "Default virtual host"
    );

    // Permissions behave as on the exporting broker.
    let declare = |queue| Operation::QueueDeclare {
        queue,
        passive: false,
        dead_letter_exchange: None,
    };
    assert!(access.check("app", "staging", &declare("app.q")).is_ok());
    let e = access
        .check("app", "staging", &declare("other"))
        .unwrap_err();
    assert_eq!(e.code, constants::ACCESS_REFUSED);
    assert_eq!(
        e.text,
        "configure access to queue 'other' in vhost 'staging' refused for user 'app'"
    );
    // In `/`, app has an entry that grants nothing: it may connect, and do nothing else.
    assert!(access
        .check_connection_open("app", "/", OpenConnections::default())
        .is_ok());
    assert!(access.check("app", "/", &declare("app.q")).is_err());
    // The user's connection limit of 4.
    assert!(access
        .check_connection_open(
            "app",
            "staging",
            OpenConnections {
                in_vhost: 0,
                by_user: 4
            }
        )
        .is_err());
    // Topic permissions on amq.topic with {username}.
    let publish = |routing_key| Operation::BasicPublish {
        exchange: "amq.topic",
        routing_key,
        user_id: None,
    };
    assert!(access
        .check_after_lookup("app", "staging", &publish("app.orders"), true)
        .is_ok());
    assert_eq!(
        access
            .check_after_lookup("app", "staging", &publish("guest.orders"), true)
            .unwrap_err()
            .text,
        "write access to topic 'guest.orders' in exchange 'amq.topic' in vhost 'staging' refused \
         for user 'app'"
    );

    // The topology for the broker: everything the export listed.
    let count = |f: fn(&Change) -> bool| plan.changes.iter().filter(|c| f(c)).count();
    assert_eq!(count(|c| matches!(c, Change::DeclareExchange(_))), 4);
    assert_eq!(count(|c| matches!(c, Change::DeclareQueue(_))), 4);
    assert_eq!(count(|c| matches!(c, Change::Bind(_))), 5);
    assert_eq!(count(|c| matches!(c, Change::SetPolicy(_))), 1);
    assert_eq!(count(|c| matches!(c, Change::SetGlobalParameter { .. })), 1);
    assert_eq!(count(|c| matches!(c, Change::SetVhostLimits { .. })), 1);
    assert_eq!(count(|c| matches!(c, Change::SetParameter { .. })), 0);
    assert!(plan.skipped.is_empty());
    let orders = plan
        .changes
        .iter()
        .find_map(|c| match c {
            Change::DeclareQueue(q) if q.name == "app.orders" => Some(q),
            _ => None,
        })
        .unwrap();
    assert_eq!(orders.vhost, "staging");
    assert!(orders.durable && !orders.auto_delete);
    assert_eq!(
        orders
            .arguments
            .get("x-dead-letter-exchange")
            .and_then(|v| v.as_str()),
        Some("app.events")
    );
    assert_eq!(
        orders
            .arguments
            .get("x-max-length")
            .and_then(|v| v.as_i64()),
        Some(1000)
    );
    assert!(plan.changes.iter().any(|c| matches!(c,
        Change::Bind(b) if b.destination_type == DestinationType::Exchange
            && b.source == "app.events" && b.destination == "app.fanout" && b.routing_key == "fan.*")));
}

#[test]
fn handwritten_4x_file_imports() {
    let (defs, _) = parse(RABBITMQ_4X);
    let (plan, access) = import(&defs);
    assert!(access.authenticate("ops", "ops-Secret-512").is_ok());
    assert!(access.authenticate("legacy", "legacy-md5").is_ok());
    assert!(access.authenticate("svc", "pässwörd").is_ok());
    assert!(access.authenticate("x509-client", "anything").is_err());
    assert_eq!(
        access.user("svc").unwrap().tags,
        vec![UserTag::Monitoring, UserTag::Policymaker]
    );
    assert_eq!(
        access.user("svc").unwrap().limits,
        UserLimits {
            max_connections: Some(10),
            max_channels: None
        }
    );
    let prod = access.vhost("prod").unwrap();
    assert_eq!(
        prod.limits,
        VhostLimits {
            max_connections: None,
            max_queues: Some(100)
        }
    );
    assert_eq!(prod.tags, vec!["production", "eu"]);
    // {username} and {vhost} in svc's topic permissions on `events`.
    let publish = |routing_key, user_id| Operation::BasicPublish {
        exchange: "events",
        routing_key,
        user_id,
    };
    assert!(access
        .check_after_lookup("svc", "prod", &publish("svc.prod.created", None), true)
        .is_ok());
    assert!(access
        .check_after_lookup("svc", "prod", &publish("svc.staging.created", None), true)
        .is_err());
    // ops may impersonate; svc may not.
    assert!(access
        .check_after_lookup("ops", "prod", &publish("x", Some("svc")), true)
        .is_ok());
    assert!(access
        .check_after_lookup("svc", "prod", &publish("svc.prod.x", Some("ops")), true)
        .is_err());
    // The server-named queue is skipped, the federation upstream passed on.
    assert_eq!(plan.skipped.len(), 1);
    assert_eq!(plan.skipped[0].name, "amq.gen-o4sNhtSqmMP1FUPz2HUtqA");
    assert!(plan.changes.iter().any(|c| matches!(c,
        Change::SetParameter { component, name, .. } if component == "federation-upstream" && name == "origin")));
}

/// Warren's export of an imported RabbitMQ file lists the same users (hashes, algorithms, tags,
/// limits), permissions and topic permissions as the file.
#[test]
fn export_matches_rabbitmq_export() {
    let (defs, original) = parse(RABBITMQ_3_10_8);
    let (_, access) = import(&defs);
    let exported = serde_json::to_value(export_access(&access)).unwrap();
    let sorted = |v: &Value, key: &str, by: &[&str]| {
        let mut items = v[key].as_array().unwrap().clone();
        items.sort_by_key(|item| by.iter().map(|k| item[*k].to_string()).collect::<Vec<_>>());
        items
    };
    for (key, by) in [
        ("users", &["name"][..]),
        ("permissions", &["user", "vhost"][..]),
        ("topic_permissions", &["user", "vhost", "exchange"][..]),
        ("parameters", &["vhost", "component", "name"][..]),
    ] {
        assert_eq!(
            sorted(&exported, key, by),
            sorted(&original, key, by),
            "{key} differ"
        );
    }
    // Vhosts: same metadata; limits as an object (4.x) rather than 3.x's pairs.
    let vhosts = sorted(&exported, "vhosts", &["name"]);
    let original_vhosts = sorted(&original, "vhosts", &["name"]);
    for (ours, theirs) in vhosts.iter().zip(&original_vhosts) {
        assert_eq!(ours["name"], theirs["name"]);
        assert_eq!(
            ours["metadata"]["description"],
            theirs["metadata"]["description"]
        );
        assert_eq!(ours["metadata"]["tags"], theirs["metadata"]["tags"]);
    }
    assert_eq!(
        vhosts[1]["limits"],
        serde_json::json!({"max-connections": 16, "max-queues": 32})
    );
}
