//! Tests of [`AccessControl`]: every refusal text is RabbitMQ's, as read in its source and, where
//! marked, as observed from RabbitMQ 3.10.8 (which words resource refusals without the permission
//! in front; 4.x adds it).

use warren_amqp::constants;

use super::*;
use crate::error::BrokerError;

/// Vhosts `/` and `staging`; users `guest` (administrator, full on `/`), `app` (permissions of
/// the committed definitions fixture), `probe` (no permissions anywhere).
fn fixture() -> AccessControl {
    let mut ac = AccessControl::with_default_guest();
    ac.put_vhost(VhostRecord::new("staging"));
    ac.put_user(UserRecord::with_password(
        "app",
        "app-Secret-1",
        vec![UserTag::Monitoring, UserTag::Policymaker],
    ));
    ac.put_user(UserRecord::with_password("probe", "probe-pass", vec![]));
    ac.set_permissions(
        "app",
        "staging",
        Permissions::new("^app\\..*", "^(app\\..*|amq\\.default|amq\\.topic)$", ".*").unwrap(),
    )
    .unwrap();
    ac
}

fn refused(r: crate::Result<()>) -> BrokerError {
    r.expect_err("expected a refusal")
}

#[test]
fn authenticate_with_rabbitmq_semantics() {
    let ac = fixture();
    assert_eq!(ac.authenticate("app", "app-Secret-1").unwrap().name, "app");
    assert_eq!(
        ac.authenticate("app", "wrong"),
        Err(LoginError::InvalidCredentials("app".into()))
    );
    assert_eq!(
        ac.authenticate("nobody", "x"),
        Err(LoginError::InvalidCredentials("nobody".into()))
    );
    assert_eq!(
        ac.authenticate("app", ""),
        Err(LoginError::BlankPassword("app".into()))
    );
}

#[test]
fn passwordless_users_cannot_log_in_with_a_password() {
    let mut ac = fixture();
    ac.put_user(UserRecord {
        name: "nopass".into(),
        password: PasswordHash::none(),
        tags: vec![],
        limits: UserLimits::default(),
    });
    for candidate in ["", "temporary", "x"] {
        assert!(
            ac.authenticate("nopass", candidate).is_err(),
            "{candidate:?}"
        );
    }
}

#[test]
fn imported_hashes_of_every_algorithm_log_in() {
    let mut ac = AccessControl::new();
    for (name, alg) in [
        ("a256", HashingAlgorithm::Sha256),
        ("a512", HashingAlgorithm::Sha512),
        ("amd5", HashingAlgorithm::Md5),
    ] {
        ac.put_user(UserRecord {
            name: name.into(),
            password: PasswordHash::from_password(alg, "test12"),
            tags: vec![],
            limits: UserLimits::default(),
        });
        assert!(ac.authenticate(name, "test12").is_ok(), "{name}");
        assert!(ac.authenticate(name, "test13").is_err(), "{name}");
    }
}

#[test]
fn connection_open_needs_permissions_in_an_existing_vhost() {
    let ac = fixture();
    assert!(ac
        .check("app", "staging", &Operation::ConnectionOpen)
        .is_ok());
    // Observed from RabbitMQ 3.10.8 (same text in 4.x).
    let e = refused(ac.check("probe", "staging", &Operation::ConnectionOpen));
    assert_eq!(e.code, constants::NOT_ALLOWED);
    assert_eq!(
        e.reply_text(),
        "NOT_ALLOWED - access to vhost 'staging' refused for user 'probe'"
    );
    let e = refused(ac.check("app", "nonexistent-vh", &Operation::ConnectionOpen));
    assert_eq!(
        e.reply_text(),
        "NOT_ALLOWED - vhost nonexistent-vh not found"
    );
    // A permission on one vhost does not open another.
    assert!(ac.check("app", "/", &Operation::ConnectionOpen).is_err());
    assert!(ac
        .check("app", "staging", &Operation::ConnectionUpdateSecret)
        .is_ok());
}

#[test]
fn connection_open_checks_limits_in_rabbitmq_order() {
    let mut ac = fixture();
    let open = |in_vhost, by_user| OpenConnections { in_vhost, by_user };
    assert!(ac
        .check_connection_open("app", "staging", open(100, 100))
        .is_ok());
    ac.set_vhost_limits(
        "staging",
        VhostLimits {
            max_connections: Some(2),
            max_queues: None,
        },
    )
    .unwrap();
    ac.set_user_limits(
        "app",
        UserLimits {
            max_connections: Some(1),
            max_channels: None,
        },
    )
    .unwrap();
    assert!(ac
        .check_connection_open("app", "staging", open(1, 0))
        .is_ok());
    // The vhost's limit first ...
    let e = refused(ac.check_connection_open("app", "staging", open(2, 5)));
    assert!(e.text.ends_with("connection limit (2) is reached"), "{e}");
    // ... then the user's ...
    let e = refused(ac.check_connection_open("app", "staging", open(0, 1)));
    assert_eq!(
        e.text,
        "connection refused for user 'app': user connection limit (1) is reached"
    );
    // ... then the permissions: a user without any is still refused below the limits.
    let e = refused(ac.check_connection_open("probe", "staging", open(0, 0)));
    assert_eq!(e.text, "access to vhost 'staging' refused for user 'probe'");
    // And a missing vhost before everything.
    let e = refused(ac.check_connection_open("app", "gone", open(0, 9)));
    assert_eq!(e.text, "vhost gone not found");
}

#[test]
fn channel_and_queue_limits() {
    let mut ac = fixture();
    assert!(ac.check_channel_open("app", 10_000).is_ok());
    ac.set_user_limits(
        "app",
        UserLimits {
            max_connections: None,
            max_channels: Some(2),
        },
    )
    .unwrap();
    assert!(ac.check_channel_open("app", 1).is_ok());
    let e = refused(ac.check_channel_open("app", 2));
    assert_eq!(e.code, constants::NOT_ALLOWED);
    assert!(ac.check_new_queue("staging", "q", 10_000).is_ok());
    ac.set_vhost_limits(
        "staging",
        VhostLimits {
            max_connections: None,
            max_queues: Some(0),
        },
    )
    .unwrap();
    let e = refused(ac.check_new_queue("staging", "newq", 0));
    assert_eq!(
        e.reply_text(),
        "PRECONDITION_FAILED - cannot declare queue 'newq': queue limit in vhost 'staging' (0) is \
         reached"
    );
}

#[test]
fn resource_refusals_name_permission_kind_and_resource() {
    let ac = fixture();
    let declare = Operation::QueueDeclare {
        queue: "other",
        passive: false,
        dead_letter_exchange: None,
    };
    let e = refused(ac.check("app", "staging", &declare));
    assert_eq!(e.code, constants::ACCESS_REFUSED);
    assert!(!e.is_hard());
    assert_eq!(
        e.reply_text(),
        "ACCESS_REFUSED - configure access to queue 'other' in vhost 'staging' refused for user \
         'app'"
    );
    let declare_x = Operation::ExchangeDeclare {
        exchange: "other.x",
        passive: false,
        alternate_exchange: None,
    };
    assert_eq!(
        refused(ac.check("app", "staging", &declare_x)).text,
        "configure access to exchange 'other.x' in vhost 'staging' refused for user 'app'"
    );
    let ok = Operation::QueueDeclare {
        queue: "app.q",
        passive: false,
        dead_letter_exchange: None,
    };
    assert!(ac.check("app", "staging", &ok).is_ok());
    // The same user has nothing in `/`.
    assert!(ac.check("app", "/", &ok).is_err());
    // An unknown user has nothing anywhere.
    assert!(ac.check("ghost", "staging", &ok).is_err());
}

#[test]
fn default_exchange_is_amq_default() {
    let mut ac = fixture();
    let publish = Operation::BasicPublish {
        exchange: "",
        routing_key: "app.q",
        user_id: None,
    };
    assert!(ac.check("app", "staging", &publish).is_ok());
    ac.set_permissions(
        "probe",
        "staging",
        Permissions::new("^probe\\..*", "^probe\\..*", "^probe\\..*").unwrap(),
    )
    .unwrap();
    assert_eq!(
        refused(ac.check("probe", "staging", &publish)).text,
        "write access to exchange 'amq.default' in vhost 'staging' refused for user 'probe'"
    );
}

#[test]
fn declares_with_alternate_or_dead_letter_exchange() {
    let ac = fixture();
    // app: configure ^app\..*, write ^(app\..*|amq\.default|amq\.topic)$, read .*
    let x = |ae| Operation::ExchangeDeclare {
        exchange: "app.x",
        passive: false,
        alternate_exchange: ae,
    };
    assert!(ac.check("app", "staging", &x(Some("app.ae"))).is_ok());
    assert_eq!(
        refused(ac.check("app", "staging", &x(Some("other.ae")))).text,
        "write access to exchange 'other.ae' in vhost 'staging' refused for user 'app'"
    );
    let q = |dlx| Operation::QueueDeclare {
        queue: "app.q",
        passive: false,
        dead_letter_exchange: dlx,
    };
    assert!(ac.check("app", "staging", &q(Some(""))).is_ok());
    assert_eq!(
        refused(ac.check("app", "staging", &q(Some("dlx")))).text,
        "write access to exchange 'dlx' in vhost 'staging' refused for user 'app'"
    );
}

#[test]
fn passive_declares_need_any_one_permission() {
    let mut ac = fixture();
    ac.set_permissions(
        "probe",
        "staging",
        Permissions::new("", "", "^shared$").unwrap(),
    )
    .unwrap();
    let passive_q = |queue| Operation::QueueDeclare {
        queue,
        passive: true,
        dead_letter_exchange: None,
    };
    assert!(ac.check("probe", "staging", &passive_q("shared")).is_ok());
    assert_eq!(
        refused(ac.check("probe", "staging", &passive_q("secret"))).text,
        "configure access to queue 'secret' in vhost 'staging' refused for user 'probe'"
    );
    ac.set_permissions(
        "probe",
        "staging",
        Permissions::new("", "^shared$", "").unwrap(),
    )
    .unwrap();
    let passive_x = |exchange| Operation::ExchangeDeclare {
        exchange,
        passive: true,
        alternate_exchange: None,
    };
    assert!(ac.check("probe", "staging", &passive_x("shared")).is_ok());
    assert!(ac.check("probe", "staging", &passive_x("other")).is_err());
}

#[test]
fn binds_need_write_on_destination_then_read_on_source() {
    let mut ac = fixture();
    ac.set_permissions(
        "probe",
        "staging",
        Permissions::new("", "^probe\\.q$", "^src$").unwrap(),
    )
    .unwrap();
    let bind = |queue, exchange| Operation::QueueBind {
        queue,
        exchange,
        routing_key: "k",
    };
    assert!(ac
        .check("probe", "staging", &bind("probe.q", "src"))
        .is_ok());
    assert_eq!(
        refused(ac.check("probe", "staging", &bind("other", "other"))).text,
        "write access to queue 'other' in vhost 'staging' refused for user 'probe'",
        "the destination is checked first"
    );
    assert_eq!(
        refused(ac.check("probe", "staging", &bind("probe.q", "other"))).text,
        "read access to exchange 'other' in vhost 'staging' refused for user 'probe'"
    );
    let e2e = Operation::ExchangeUnbind {
        destination: "probe.q",
        source: "nope",
        routing_key: "k",
    };
    assert!(refused(ac.check("probe", "staging", &e2e))
        .text
        .starts_with("read access to exchange 'nope'"));
}

#[test]
fn get_consume_purge_need_read() {
    let mut ac = fixture();
    ac.set_permissions(
        "probe",
        "staging",
        Permissions::new(".*", ".*", "^mine$").unwrap(),
    )
    .unwrap();
    for op in [
        Operation::BasicGet { queue: "theirs" },
        Operation::BasicConsume { queue: "theirs" },
        Operation::QueuePurge { queue: "theirs" },
    ] {
        assert_eq!(
            refused(ac.check("probe", "staging", &op)).text,
            "read access to queue 'theirs' in vhost 'staging' refused for user 'probe'"
        );
    }
    assert!(ac
        .check(
            "probe",
            "staging",
            &Operation::BasicConsume { queue: "mine" }
        )
        .is_ok());
    assert!(ac
        .check(
            "probe",
            "staging",
            &Operation::BasicConsume {
                queue: "amq.rabbitmq.reply-to"
            }
        )
        .is_ok());
}

#[test]
fn topic_permissions_on_publish_and_bind() {
    let mut ac = fixture();
    ac.set_permissions(
        "probe",
        "staging",
        Permissions::new(
            "^probe\\..*",
            "^(probe\\..*|amq\\.topic)$",
            "^(probe\\..*|amq\\.topic)$",
        )
        .unwrap(),
    )
    .unwrap();
    ac.set_topic_permissions(
        "probe",
        "staging",
        "amq.topic",
        "^{username}\\.x$",
        "^r\\.{vhost}$",
    )
    .unwrap();
    let publish = |routing_key| Operation::BasicPublish {
        exchange: "amq.topic",
        routing_key,
        user_id: None,
    };
    let bind = |routing_key| Operation::QueueBind {
        queue: "probe.q",
        exchange: "amq.topic",
        routing_key,
    };
    for op in [
        publish("probe.x"),
        publish("other.x"),
        bind("r.staging"),
        bind("r.other"),
    ] {
        assert!(
            ac.check("probe", "staging", &op).is_ok(),
            "resource checks pass: {op:?}"
        );
    }
    assert!(ac
        .check_after_lookup("probe", "staging", &publish("probe.x"), true)
        .is_ok());
    assert!(ac
        .check_after_lookup("probe", "staging", &bind("r.staging"), true)
        .is_ok());
    // Observed from RabbitMQ 3.10.8 without the permission prefix, which 4.x adds.
    let e = refused(ac.check_after_lookup("probe", "staging", &publish("other.x"), true));
    assert_eq!(e.code, constants::ACCESS_REFUSED);
    assert_eq!(
        e.text,
        "write access to topic 'other.x' in exchange 'amq.topic' in vhost 'staging' refused for \
         user 'probe'"
    );
    assert_eq!(
        refused(ac.check_after_lookup("probe", "staging", &bind("r.other"), true)).text,
        "read access to topic 'r.other' in exchange 'amq.topic' in vhost 'staging' refused for \
         user 'probe'"
    );
    // Not a topic exchange: topic permissions do not apply.
    assert!(ac
        .check_after_lookup("probe", "staging", &publish("other.x"), false)
        .is_ok());
    // No topic permissions for an exchange: everything is allowed.
    let other_x = Operation::BasicPublish {
        exchange: "probe.topic",
        routing_key: "anything",
        user_id: None,
    };
    assert!(ac
        .check_after_lookup("probe", "staging", &other_x, true)
        .is_ok());
    // Cleared: allowed again.
    assert!(ac.clear_topic_permissions("probe", "staging", Some("amq.topic")));
    assert!(ac
        .check_after_lookup("probe", "staging", &publish("other.x"), true)
        .is_ok());
}

#[test]
fn user_id_must_match_unless_impersonator() {
    let mut ac = fixture();
    let publish = |user_id| Operation::BasicPublish {
        exchange: "",
        routing_key: "app.q",
        user_id,
    };
    assert!(ac
        .check_after_lookup("app", "staging", &publish(None), false)
        .is_ok());
    assert!(ac
        .check_after_lookup("app", "staging", &publish(Some("app")), false)
        .is_ok());
    let e = refused(ac.check_after_lookup("app", "staging", &publish(Some("bob")), false));
    assert_eq!(e.code, constants::PRECONDITION_FAILED);
    assert_eq!(
        e.text,
        "user_id property set to 'bob' but authenticated user was 'app'"
    );
    let mut app = ac.user("app").unwrap().clone();
    app.tags.push(UserTag::Impersonator);
    ac.put_user(app);
    assert!(ac
        .check_after_lookup("app", "staging", &publish(Some("bob")), false)
        .is_ok());
}

#[test]
fn management_needs_tags() {
    let mut ac = fixture();
    ac.put_user(UserRecord::with_password(
        "viewer",
        "p",
        vec![UserTag::Management],
    ));
    ac.set_permissions("viewer", "staging", Permissions::full())
        .unwrap();
    let text = |user, op| ac.check(user, "/", &op).map_err(|e| e.text);
    let put_user = Operation::UserPut { user: "x" };
    assert_eq!(text("guest", put_user), Ok(()));
    assert_eq!(text("app", put_user), Err("Not administrator user".into()));
    assert_eq!(text("probe", put_user), Err("Not management user".into()));
    assert_eq!(
        text("probe", Operation::Overview),
        Err("Not management user".into())
    );
    assert_eq!(text("viewer", Operation::Overview), Ok(()));
    assert_eq!(text("app", Operation::NodesRead), Ok(()));
    assert_eq!(
        text("viewer", Operation::NodesRead),
        Err("Not monitor user".into())
    );
    // Policies: administrator, or policymaker with access to the vhost.
    let policy = |vhost| Operation::PolicyPut { vhost, name: "p" };
    assert_eq!(text("app", policy("staging")), Ok(()));
    assert_eq!(
        text("app", policy("/")),
        Err("User not authorised to access object".into())
    );
    assert_eq!(
        text("viewer", policy("staging")),
        Err("User not authorised to access object".into())
    );
    assert_eq!(text("guest", policy("staging")), Ok(()));
    assert_eq!(
        text("app", Operation::GlobalParameterPut { name: "n" }),
        Ok(())
    );
    assert_eq!(
        text("viewer", Operation::GlobalParameterPut { name: "n" }),
        Err("User not authorised to access object".into())
    );
    // Reading a vhost: monitors see all, others only where they have permissions.
    assert_eq!(
        text("viewer", Operation::VhostRead { vhost: "staging" }),
        Ok(())
    );
    assert_eq!(
        text("viewer", Operation::VhostRead { vhost: "/" }),
        Err("User not authorised to access virtual host".into())
    );
    assert_eq!(text("app", Operation::VhostRead { vhost: "/" }), Ok(()));
    // Connections: own ones, or monitor to look / administrator to close.
    assert_eq!(
        text("viewer", Operation::ConnectionView { owner: "viewer" }),
        Ok(())
    );
    assert_eq!(
        text("viewer", Operation::ConnectionView { owner: "app" }),
        Err("User not authorised to access object".into())
    );
    assert_eq!(
        text("app", Operation::ConnectionView { owner: "viewer" }),
        Ok(())
    );
    assert_eq!(
        text("app", Operation::ConnectionForceClose { owner: "viewer" }),
        Err("User not authorised to access object".into())
    );
    assert_eq!(
        text("guest", Operation::ConnectionForceClose { owner: "viewer" }),
        Ok(())
    );
    // Management refusals are soft 403s.
    let e = refused(ac.check("app", "/", &put_user));
    assert_eq!(e.code, constants::ACCESS_REFUSED);
}

#[test]
fn changes_need_existing_users_and_vhosts() {
    let mut ac = fixture();
    assert_eq!(
        ac.set_permissions("nobody", "staging", Permissions::full()),
        Err(AccessError::NoSuchUser("nobody".into()))
    );
    assert_eq!(
        ac.set_permissions("app", "nowhere", Permissions::full()),
        Err(AccessError::NoSuchVhost("nowhere".into()))
    );
    assert_eq!(
        ac.set_topic_permissions("app", "staging", "amq.topic", "(", ".*"),
        Err(AccessError::Pattern(PatternError::Invalid {
            pattern: "(".into(),
            reason: "error: unclosed group".into()
        }))
    );
    assert!(ac.set_user_limits("nobody", UserLimits::default()).is_err());
    assert!(ac
        .set_vhost_limits("nowhere", VhostLimits::default())
        .is_err());
}

#[test]
fn deleting_users_and_vhosts_removes_their_permissions() {
    let mut ac = fixture();
    ac.set_topic_permissions("app", "staging", "amq.topic", ".*", ".*")
        .unwrap();
    assert!(ac.delete_vhost("staging"));
    assert!(ac.permissions("app", "staging").is_none());
    assert!(ac
        .topic_permissions_on("app", "staging", "amq.topic")
        .is_none());
    // Re-creating the vhost does not bring them back.
    ac.put_vhost(VhostRecord::new("staging"));
    assert!(ac
        .check("app", "staging", &Operation::ConnectionOpen)
        .is_err());

    assert!(ac.delete_user("guest"));
    assert!(!ac.delete_user("guest"));
    assert_eq!(ac.all_permissions().count(), 0);
    assert!(ac.authenticate("guest", "guest").is_err());
}

#[test]
fn listing_and_clearing() {
    let mut ac = fixture();
    let mut perms: Vec<_> = ac.all_permissions().map(|(u, v, _)| (u, v)).collect();
    perms.sort();
    assert_eq!(perms, vec![("app", "staging"), ("guest", "/")]);
    ac.set_topic_permissions("app", "staging", "a", ".*", ".*")
        .unwrap();
    ac.set_topic_permissions("app", "staging", "b", ".*", ".*")
        .unwrap();
    assert_eq!(ac.all_topic_permissions().count(), 2);
    assert!(ac.clear_topic_permissions("app", "staging", None));
    assert_eq!(ac.all_topic_permissions().count(), 0);
    assert!(!ac.clear_topic_permissions("app", "staging", None));
    assert!(ac.clear_permissions("app", "staging"));
    assert!(!ac.clear_permissions("app", "staging"));
    assert_eq!(ac.users().count(), 3);
    assert_eq!(ac.vhosts().count(), 2);
    assert!(ac.has_vhost_access("guest", "/"));
    assert!(!ac.has_vhost_access("app", "staging"));
}
