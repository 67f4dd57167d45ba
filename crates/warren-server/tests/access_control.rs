//! Permissions on every AMQP operation, through a real client: each row of RabbitMQ's
//! access-control table (rabbitmq.com/docs/access-control, "How Permissions Work") is run once
//! with permissions that allow it and once with permissions that refuse it, and a refusal must
//! be RabbitMQ's channel.close 403 ACCESS_REFUSED with its exact text. Topic permissions (with
//! the `{username}` and `{vhost}` variables), `user_id` and impersonation follow.
//!
//! The users and permissions are set through the embedded broker's access-control database,
//! between operations of a connection that stays open: a change applies to the next
//! operation.

mod lapin_support;

use lapin::options::{
    BasicConsumeOptions, BasicGetOptions, ExchangeBindOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, ExchangeUnbindOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use lapin_support::{within, Env};
use warren_broker::access::{Permissions, UserRecord, UserTag};
use warren_server::RunningBroker;

const USER: &str = "alice";
const PASSWORD: &str = "alice-pw";

/// An operation of the table, run on a fresh channel of the test user's connection.
#[derive(Debug, Clone)]
enum Op {
    QueueDeclare {
        queue: &'static str,
        dlx: Option<&'static str>,
    },
    QueueDeclarePassive(&'static str),
    QueueDelete(&'static str),
    QueueBind {
        queue: &'static str,
        exchange: &'static str,
        key: &'static str,
    },
    QueueUnbind {
        queue: &'static str,
        exchange: &'static str,
        key: &'static str,
    },
    QueuePurge(&'static str),
    ExchangeDeclare {
        exchange: &'static str,
        ae: Option<&'static str>,
    },
    ExchangeDeclarePassive(&'static str),
    ExchangeDelete(&'static str),
    ExchangeBind {
        destination: &'static str,
        source: &'static str,
        key: &'static str,
    },
    ExchangeUnbind {
        destination: &'static str,
        source: &'static str,
        key: &'static str,
    },
    Publish {
        exchange: &'static str,
        key: &'static str,
        user_id: Option<&'static str>,
    },
    Get(&'static str),
    Consume(&'static str),
}

/// Permissions of the test user for one run: (configure, write, read) on `/`, topic
/// permissions (write, read) on `amq.topic`, and the user's tags.
#[derive(Debug, Clone, Copy)]
struct Grant {
    perms: (&'static str, &'static str, &'static str),
    topic: Option<(&'static str, &'static str)>,
    impersonator: bool,
}

const fn perms(configure: &'static str, write: &'static str, read: &'static str) -> Grant {
    Grant {
        perms: (configure, write, read),
        topic: None,
        impersonator: false,
    }
}

/// One row: the operation, permissions that allow it, and permissions (or another operation)
/// that get it refused with `refusal`.
struct Row {
    name: &'static str,
    allowed: (Grant, Op),
    refused: (Grant, Op),
    /// The reply text of the refusal, after `ACCESS_REFUSED - ` (or the whole text when it
    /// starts with another code name).
    refusal: &'static str,
}

fn table() -> Vec<Row> {
    use Op::*;
    vec![
        Row {
            name: "queue.declare needs configure on the queue",
            allowed: (perms("^new\\.q$", "", ""), QueueDeclare { queue: "new.q", dlx: None }),
            refused: (perms("^other$", ".*", ".*"), QueueDeclare { queue: "new.q2", dlx: None }),
            refusal: "configure access to queue 'new.q2' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "queue.declare of an existing queue needs configure too",
            allowed: (perms("^q$", "", ""), QueueDeclare { queue: "q", dlx: None }),
            refused: (perms("", ".*", ".*"), QueueDeclare { queue: "q", dlx: None }),
            refusal: "configure access to queue 'q' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "a new queue with x-dead-letter-exchange needs read on it and write on the DLX",
            allowed: (perms("^dl\\.q$", "^dlx$", "^dl\\.q$"), QueueDeclare { queue: "dl.q", dlx: Some("dlx") }),
            refused: (perms("^dl\\.q2$", "", "^dl\\.q2$"), QueueDeclare { queue: "dl.q2", dlx: Some("dlx") }),
            refusal: "write access to exchange 'dlx' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "a passive queue.declare needs one permission on the queue (RabbitMQ 4.3.1)",
            allowed: (perms("", "", "^q$"), QueueDeclarePassive("q")),
            refused: (perms("^other$", "^other$", "^other$"), QueueDeclarePassive("q")),
            refusal: "configure access to queue 'q' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "queue.delete needs configure on the queue",
            allowed: (perms("^del\\.q$", "", ""), QueueDelete("del.q")),
            refused: (perms("", ".*", ".*"), QueueDelete("del.q")),
            refusal: "configure access to queue 'del.q' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "queue.bind needs write on the queue",
            allowed: (perms("", "^q$", "^x$"), QueueBind { queue: "q", exchange: "x", key: "k" }),
            refused: (perms(".*", "", ".*"), QueueBind { queue: "q", exchange: "x", key: "k" }),
            refusal: "write access to queue 'q' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "queue.bind needs read on the exchange",
            allowed: (perms("", "^q$", "^x$"), QueueBind { queue: "q", exchange: "x", key: "k2" }),
            refused: (perms(".*", ".*", "^q$"), QueueBind { queue: "q", exchange: "x", key: "k2" }),
            refusal: "read access to exchange 'x' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "queue.unbind needs write on the queue and read on the exchange",
            allowed: (perms("", "^q$", "^x$"), QueueUnbind { queue: "q", exchange: "x", key: "k" }),
            refused: (perms(".*", ".*", "^q$"), QueueUnbind { queue: "q", exchange: "x", key: "k2" }),
            refusal: "read access to exchange 'x' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "queue.purge needs read on the queue",
            allowed: (perms("", "", "^q$"), QueuePurge("q")),
            refused: (perms(".*", ".*", ""), QueuePurge("q")),
            refusal: "read access to queue 'q' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "exchange.declare needs configure on the exchange",
            allowed: (perms("^new\\.x$", "", ""), ExchangeDeclare { exchange: "new.x", ae: None }),
            refused: (perms("", ".*", ".*"), ExchangeDeclare { exchange: "new.x2", ae: None }),
            refusal: "configure access to exchange 'new.x2' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "a new exchange with alternate-exchange needs read on it and write on the AE",
            allowed: (perms("^ae\\.x$", "^ae$", "^ae\\.x$"), ExchangeDeclare { exchange: "ae.x", ae: Some("ae") }),
            refused: (perms("^ae\\.x2$", "", "^ae\\.x2$"), ExchangeDeclare { exchange: "ae.x2", ae: Some("ae") }),
            refusal: "write access to exchange 'ae' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "a passive exchange.declare needs one permission on the exchange",
            allowed: (perms("", "^x$", ""), ExchangeDeclarePassive("x")),
            refused: (perms("^other$", "", ""), ExchangeDeclarePassive("x")),
            refusal: "configure access to exchange 'x' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "exchange.delete needs configure on the exchange",
            allowed: (perms("^del\\.x$", "", ""), ExchangeDelete("del.x")),
            refused: (perms("", ".*", ".*"), ExchangeDelete("del.x")),
            refusal: "configure access to exchange 'del.x' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "exchange.bind needs write on the destination",
            allowed: (perms("", "^dst$", "^src$"), ExchangeBind { destination: "dst", source: "src", key: "k" }),
            refused: (perms(".*", "^src$", ".*"), ExchangeBind { destination: "dst", source: "src", key: "k" }),
            refusal: "write access to exchange 'dst' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "exchange.bind needs read on the source",
            allowed: (perms("", "^dst$", "^src$"), ExchangeBind { destination: "dst", source: "src", key: "k2" }),
            refused: (perms(".*", ".*", "^dst$"), ExchangeBind { destination: "dst", source: "src", key: "k2" }),
            refusal: "read access to exchange 'src' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "exchange.unbind needs write on the destination and read on the source",
            allowed: (perms("", "^dst$", "^src$"), ExchangeUnbind { destination: "dst", source: "src", key: "k" }),
            refused: (perms(".*", "^src$", ".*"), ExchangeUnbind { destination: "dst", source: "src", key: "k2" }),
            refusal: "write access to exchange 'dst' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "basic.publish needs write on the exchange",
            allowed: (perms("", "^x$", ""), Publish { exchange: "x", key: "k", user_id: None }),
            refused: (perms(".*", "^other$", ".*"), Publish { exchange: "x", key: "k", user_id: None }),
            refusal: "write access to exchange 'x' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "basic.publish to the default exchange needs write on amq.default",
            allowed: (perms("", "^amq\\.default$", ""), Publish { exchange: "", key: "q", user_id: None }),
            refused: (perms(".*", "^q$", ".*"), Publish { exchange: "", key: "q", user_id: None }),
            refusal: "write access to exchange 'amq.default' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "basic.get needs read on the queue",
            allowed: (perms("", "", "^q$"), Get("q")),
            refused: (perms(".*", ".*", ""), Get("q")),
            refusal: "read access to queue 'q' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "basic.consume needs read on the queue",
            allowed: (perms("", "", "^q$"), Consume("q")),
            refused: (perms(".*", ".*", "^x$"), Consume("q")),
            refusal: "read access to queue 'q' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "direct reply-to needs no permission",
            allowed: (perms("", "", ""), Consume("amq.rabbitmq.reply-to")),
            refused: (perms("", "", ""), Consume("q")),
            refusal: "read access to queue 'q' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "topic permissions: publish needs a routing key matching the write pattern ({username})",
            allowed: (
                Grant { topic: Some(("^{username}\\.", ".*")), ..perms("", ".*", "") },
                Publish { exchange: "amq.topic", key: "alice.k", user_id: None },
            ),
            refused: (
                Grant { topic: Some(("^{username}\\.", ".*")), ..perms("", ".*", "") },
                Publish { exchange: "amq.topic", key: "bob.k", user_id: None },
            ),
            refusal: "write access to topic 'bob.k' in exchange 'amq.topic' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "topic permissions: {client_id} stays literal on AMQP 0-9-1",
            allowed: (
                Grant { topic: Some(("^{client_id}\\.", "")), ..perms("", ".*", "") },
                Publish { exchange: "amq.topic", key: "{client_id}.k", user_id: None },
            ),
            refused: (
                Grant { topic: Some(("^{client_id}\\.", "")), ..perms("", ".*", "") },
                Publish { exchange: "amq.topic", key: "c1.k", user_id: None },
            ),
            refusal: "write access to topic 'c1.k' in exchange 'amq.topic' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "topic permissions: queue.bind needs a binding key matching the read pattern ({vhost})",
            allowed: (
                Grant { topic: Some(("", "^r\\.{vhost}$")), ..perms("", "^q$", "^amq\\.topic$") },
                QueueBind { queue: "q", exchange: "amq.topic", key: "r./" },
            ),
            refused: (
                Grant { topic: Some(("", "^r\\.{vhost}$")), ..perms("", "^q$", "^amq\\.topic$") },
                QueueBind { queue: "q", exchange: "amq.topic", key: "r.other" },
            ),
            refusal: "read access to topic 'r.other' in exchange 'amq.topic' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "topic permissions: exchange.bind from a topic exchange checks the source's read pattern",
            allowed: (
                Grant { topic: Some(("", "^{username}$")), ..perms("", "^dst$", "^amq\\.topic$") },
                ExchangeBind { destination: "dst", source: "amq.topic", key: "alice" },
            ),
            refused: (
                Grant { topic: Some(("", "^{username}$")), ..perms("", "^dst$", "^amq\\.topic$") },
                ExchangeBind { destination: "dst", source: "amq.topic", key: "bob" },
            ),
            refusal: "read access to topic 'bob' in exchange 'amq.topic' in vhost '/' refused for user 'alice'",
        },
        Row {
            name: "user_id must name the user unless the user is an impersonator",
            allowed: (
                Grant { impersonator: true, ..perms("", ".*", "") },
                Publish { exchange: "x", key: "k", user_id: Some("someone-else") },
            ),
            refused: (
                perms("", ".*", ""),
                Publish { exchange: "x", key: "k", user_id: Some("someone-else") },
            ),
            refusal: "PRECONDITION_FAILED - user_id property set to 'someone-else' but authenticated user was 'alice'",
        },
    ]
}

/// Gives the test user exactly `grant`.
fn apply(broker: &RunningBroker, grant: Grant) {
    let mut access = broker.state().broker.access_mut();
    let tags = if grant.impersonator {
        vec![UserTag::Impersonator]
    } else {
        Vec::new()
    };
    access.put_user(UserRecord::with_password(USER, PASSWORD, tags));
    let (c, w, r) = grant.perms;
    access
        .set_permissions(
            USER,
            "/",
            Permissions::new(c, w, r).expect("valid patterns"),
        )
        .expect("set permissions");
    access.clear_topic_permissions(USER, "/", None);
    if let Some((w, r)) = grant.topic {
        access
            .set_topic_permissions(USER, "/", "amq.topic", w, r)
            .expect("set topic permissions");
    }
}

fn table_args(key: &str, value: &str) -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(key.into(), AMQPValue::LongString(value.into()));
    t
}

/// Runs `op` on a new channel of `conn`; `Err` carries the close's reply code and text.
async fn run(conn: &Connection, op: &Op) -> Result<(), (u16, String)> {
    let ch: Channel = within("channel.open", conn.create_channel())
        .await
        .expect("channel.open");
    let res: lapin::Result<()> = match op.clone() {
        Op::QueueDeclare { queue, dlx } => {
            let args = dlx.map_or_else(FieldTable::default, |d| {
                table_args("x-dead-letter-exchange", d)
            });
            ch.queue_declare(queue.into(), QueueDeclareOptions::default(), args)
                .await
                .map(|_| ())
        }
        Op::QueueDeclarePassive(queue) => ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map(|_| ()),
        Op::QueueDelete(queue) => ch
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .map(|_| ()),
        Op::QueueBind {
            queue,
            exchange,
            key,
        } => {
            ch.queue_bind(
                queue.into(),
                exchange.into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
        }
        Op::QueueUnbind {
            queue,
            exchange,
            key,
        } => {
            ch.queue_unbind(
                queue.into(),
                exchange.into(),
                key.into(),
                FieldTable::default(),
            )
            .await
        }
        Op::QueuePurge(queue) => ch
            .queue_purge(queue.into(), QueuePurgeOptions::default())
            .await
            .map(|_| ()),
        Op::ExchangeDeclare { exchange, ae } => {
            let args = ae.map_or_else(FieldTable::default, |a| table_args("alternate-exchange", a));
            ch.exchange_declare(
                exchange.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                args,
            )
            .await
        }
        Op::ExchangeDeclarePassive(exchange) => {
            ch.exchange_declare(
                exchange.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
        }
        Op::ExchangeDelete(exchange) => {
            ch.exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
                .await
        }
        Op::ExchangeBind {
            destination,
            source,
            key,
        } => {
            ch.exchange_bind(
                destination.into(),
                source.into(),
                key.into(),
                ExchangeBindOptions::default(),
                FieldTable::default(),
            )
            .await
        }
        Op::ExchangeUnbind {
            destination,
            source,
            key,
        } => {
            ch.exchange_unbind(
                destination.into(),
                source.into(),
                key.into(),
                ExchangeUnbindOptions::default(),
                FieldTable::default(),
            )
            .await
        }
        Op::Publish {
            exchange,
            key,
            user_id,
        } => {
            lapin_support::confirm_select(&ch).await;
            let mut props = BasicProperties::default();
            if let Some(u) = user_id {
                props = props.with_user_id(u.into());
            }
            lapin_support::publish_outcome(&ch, exchange, key, b"m", props).await
        }
        Op::Get(queue) => ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .map(|_| ()),
        Op::Consume(queue) => ch
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map(|_| ()),
    };
    match res {
        Ok(()) => {
            let _ = ch.close(200, "bye".into()).await;
            Ok(())
        }
        Err(e) => match e.kind() {
            lapin::ErrorKind::ProtocolError(p) => {
                Err((p.get_id(), p.get_message().as_str().to_string()))
            }
            other => panic!("{op:?}: expected a channel.close, got {other:?}"),
        },
    }
}

#[tokio::test]
async fn every_row_of_the_access_control_table_is_allowed_and_refused() {
    let env = Env::start().await;
    let broker = env.broker.as_ref().expect("broker");
    // The resources the rows act on, declared by guest (full permissions).
    let admin = env.channel().await;
    for q in ["q", "del.q"] {
        lapin_support::declare_queue(&admin, q).await;
    }
    for x in ["x", "src", "dst", "dlx", "ae", "del.x"] {
        within(
            "exchange.declare",
            admin.exchange_declare(
                x.into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("exchange.declare");
    }
    lapin_support::bind(&admin, "q", "x", "k").await;
    within(
        "exchange.bind",
        admin.exchange_bind(
            "dst".into(),
            "src".into(),
            "k".into(),
            ExchangeBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.bind");

    apply(broker, perms("", "", ""));
    let uri = format!("amqp://{USER}:{PASSWORD}@{}/%2f", broker.amqp_addr());
    let conn = within(
        "connect as alice",
        Connection::connect(&uri, ConnectionProperties::default()),
    )
    .await
    .expect("alice logs in");

    for row in table() {
        // Refused first: a declare refused must not have created what the allowed run then
        // creates, and a delete refused must find what the allowed run then deletes.
        let (grant, op) = &row.refused;
        apply(broker, *grant);
        let expected = if row.refusal.contains(" - ") {
            row.refusal.to_string()
        } else {
            format!("ACCESS_REFUSED - {}", row.refusal)
        };
        let code = if expected.starts_with("ACCESS_REFUSED") {
            403
        } else {
            406
        };
        match within(row.name, run(&conn, op)).await {
            Ok(()) => panic!("{}: {op:?} was allowed with {grant:?}", row.name),
            Err(got) => assert_eq!(got, (code, expected), "{}", row.name),
        }
        let (grant, op) = &row.allowed;
        apply(broker, *grant);
        if let Err(e) = within(row.name, run(&conn, op)).await {
            panic!("{}: {op:?} refused with {grant:?}: {e:?}", row.name);
        }
    }
    let _ = conn.close(200, "bye".into()).await;
    env.stop().await;
}

/// A publish permission is cached per channel; a change of permissions applies to the next
/// publish on the same channel.
#[tokio::test]
async fn a_permission_change_applies_to_an_open_channel() {
    let env = Env::start().await;
    let broker = env.broker.as_ref().expect("broker");
    lapin_support::declare_queue(&env.channel().await, "q").await;
    apply(broker, perms("", ".*", ".*"));
    let uri = format!("amqp://{USER}:{PASSWORD}@{}/%2f", broker.amqp_addr());
    let conn = within(
        "connect as alice",
        Connection::connect(&uri, ConnectionProperties::default()),
    )
    .await
    .expect("alice logs in");
    let ch = within("channel.open", conn.create_channel())
        .await
        .expect("channel.open");
    lapin_support::confirm_select(&ch).await;
    lapin_support::publish(&ch, "", "q", b"one").await;
    apply(broker, perms("", "^nothing$", ".*"));
    let res =
        lapin_support::publish_outcome(&ch, "", "q", b"two", BasicProperties::default()).await;
    lapin_support::expect_code(res, 403);
    let admin = env.channel().await;
    assert_eq!(lapin_support::drain(&admin, "q").await, vec!["one"]);
    let _ = conn.close(200, "bye".into()).await;
    env.stop().await;
}
