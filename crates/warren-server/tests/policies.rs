//! Policies and operator policies end to end: set, shown and removed over the management
//! HTTP API (reqwest), felt by queues and exchanges used over AMQP (lapin), with RabbitMQ's
//! precedence between queue arguments, policies and operator policies, durable across a
//! restart and carried by a definitions export and import.

mod lapin_support;

use lapin::options::{BasicPublishOptions, ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use lapin_support::{bind, get, within, WAIT};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use warren_server::config::{ManagementConfig, PermissionConfig, UserConfig};
use warren_server::{Config, RunningBroker};

fn user(name: &str, tags: &[&str]) -> UserConfig {
    UserConfig {
        name: name.into(),
        password: Some(warren_broker::access::Cleartext::new(format!("{name}-pw"))),
        password_hash: None,
        hashing_algorithm: None,
        tags: tags.iter().map(|t| t.to_string()).collect(),
        loopback_only: false,
        max_connections: None,
        max_channels: None,
    }
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-policies-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

struct Http {
    base: String,
    client: reqwest::Client,
    broker: Option<RunningBroker>,
    conn: Option<Connection>,
}

impl Http {
    async fn start(data_dir: Option<&Path>, definitions: Option<&Path>) -> Http {
        let mut config = Config {
            users: vec![
                user("admin", &["administrator"]),
                user("pm", &["policymaker"]),
                user("pm-elsewhere", &["policymaker"]),
                user("mgmt", &["management"]),
            ],
            permissions: ["admin", "pm", "mgmt"]
                .into_iter()
                .map(|u| PermissionConfig {
                    user: u.into(),
                    vhost: "/".into(),
                    configure: ".*".into(),
                    write: ".*".into(),
                    read: ".*".into(),
                })
                .collect(),
            management: ManagementConfig {
                enabled: true,
                listen: "127.0.0.1:0".parse().unwrap(),
                ..ManagementConfig::default()
            },
            ..Config::default()
        };
        config.definitions.load_file = definitions.map(Path::to_path_buf);
        let mut builder = warren_server::Broker::builder()
            .config(config)
            .bind("127.0.0.1:0")
            .management(true);
        if let Some(d) = data_dir {
            builder = builder.data_dir(d);
        }
        let broker = within("broker start", builder.start())
            .await
            .expect("broker starts");
        let base = format!("http://{}", broker.management_addrs()[0]);
        let mut h = Http {
            base,
            client: reqwest::Client::new(),
            broker: Some(broker),
            conn: None,
        };
        let addr = h.broker.as_ref().unwrap().amqp_addr();
        h.conn = Some(
            within(
                "connect",
                Connection::connect(
                    &format!("amqp://admin:admin-pw@{addr}/%2f"),
                    ConnectionProperties::default(),
                ),
            )
            .await
            .expect("AMQP connection"),
        );
        h
    }

    async fn channel(&self) -> Channel {
        within("channel.open", self.conn.as_ref().unwrap().create_channel())
            .await
            .expect("channel")
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        who: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .basic_auth(who, Some(format!("{who}-pw")));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = within("HTTP request", req.send())
            .await
            .expect("HTTP reply");
        let status = resp.status();
        let text = within("HTTP body", resp.text()).await.expect("body");
        let v = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, v)
    }

    async fn get_json(&self, path: &str) -> Value {
        let (s, v) = self.call(Method::GET, path, "admin", None).await;
        assert_eq!(s, StatusCode::OK, "GET {path}: {v}");
        v
    }

    async fn put_policy(&self, kind: &str, name: &str, body: Value) -> StatusCode {
        let (s, v) = self
            .call(
                Method::PUT,
                &format!("/api/{kind}/%2F/{name}"),
                "admin",
                Some(body),
            )
            .await;
        assert!(s.is_success(), "PUT {kind} {name}: {s} {v}");
        s
    }

    async fn delete_policy(&self, kind: &str, name: &str) {
        let (s, v) = self
            .call(
                Method::DELETE,
                &format!("/api/{kind}/%2F/{name}"),
                "admin",
                None,
            )
            .await;
        assert_eq!(s, StatusCode::NO_CONTENT, "DELETE {kind} {name}: {v}");
    }

    async fn queue(&self, q: &str) -> Value {
        self.get_json(&format!("/api/queues/%2F/{q}")).await
    }

    /// Waits (bounded) until queue `q` has `n` ready messages.
    async fn wait_ready(&self, q: &str, n: u64) {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let v = self.queue(q).await;
            if v["messages_ready"] == n {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "queue {q} never had {n} ready messages: {v}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    async fn stop(mut self) {
        if let Some(c) = self.conn.take() {
            let _ = tokio::time::timeout(WAIT, c.close(200, "bye".into())).await;
        }
        within("broker shutdown", self.broker.take().unwrap().shutdown()).await;
    }
}

async fn declare(ch: &Channel, name: &str, durable: bool, args: FieldTable) {
    within(
        "queue.declare",
        ch.queue_declare(
            name.into(),
            QueueDeclareOptions {
                durable,
                ..Default::default()
            },
            args,
        ),
    )
    .await
    .expect("queue.declare");
}

async fn declare_exchange(ch: &Channel, name: &str, kind: ExchangeKind) {
    within(
        "exchange.declare",
        ch.exchange_declare(
            name.into(),
            kind,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.declare");
}

/// Publishes each body to `exchange` with routing key `key`.
async fn publish_all(ch: &Channel, exchange: &str, key: &str, bodies: &[&str]) {
    for b in bodies {
        within(
            "basic.publish",
            ch.basic_publish(
                exchange.into(),
                key.into(),
                BasicPublishOptions::default(),
                b.as_bytes(),
                BasicProperties::default(),
            ),
        )
        .await
        .expect("basic.publish");
    }
}

async fn drain(ch: &Channel, q: &str) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(b) = get(ch, q).await {
        out.push(String::from_utf8(b).unwrap());
    }
    out
}

fn args(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert((*k).into(), v.clone());
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_length_policy_applies_to_an_existing_queue_until_deleted() {
    let h = Http::start(None, None).await;
    let ch = h.channel().await;
    declare(&ch, "limited", false, FieldTable::default()).await;
    publish_all(&ch, "", "limited", &["a"]).await;
    h.wait_ready("limited", 1).await;

    let created = h
        .put_policy(
            "policies",
            "cap",
            json!({"pattern": "^limited$", "definition": {"max-length": 2}, "apply-to": "queues"}),
        )
        .await;
    assert_eq!(created, StatusCode::CREATED);
    let q = h.queue("limited").await;
    assert_eq!(q["policy"], "cap");
    assert_eq!(q["operator_policy"], Value::Null);
    assert_eq!(q["effective_policy_definition"], json!({"max-length": 2}));

    // The third message drops the head.
    publish_all(&ch, "", "limited", &["b", "c"]).await;
    h.wait_ready("limited", 2).await;
    assert_eq!(drain(&ch, "limited").await, ["b", "c"]);

    // Updating answers 204; deleting the policy restores the unlimited queue.
    let updated = h
        .put_policy(
            "policies",
            "cap",
            json!({"pattern": "^limited$", "definition": {"max-length": 1}, "apply-to": "queues"}),
        )
        .await;
    assert_eq!(updated, StatusCode::NO_CONTENT);
    h.delete_policy("policies", "cap").await;
    publish_all(&ch, "", "limited", &["d", "e", "f"]).await;
    h.wait_ready("limited", 3).await;
    let q = h.queue("limited").await;
    assert_eq!(q["policy"], Value::Null);
    assert_eq!(q["effective_policy_definition"], json!({}));
    assert_eq!(drain(&ch, "limited").await, ["d", "e", "f"]);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_ttl_policy_dead_letters_to_the_policy_dlx() {
    let h = Http::start(None, None).await;
    let ch = h.channel().await;
    declare_exchange(&ch, "pol-dlx", ExchangeKind::Fanout).await;
    declare(&ch, "pol-dead", false, FieldTable::default()).await;
    bind(&ch, "pol-dead", "pol-dlx", "").await;
    declare(&ch, "short-lived", false, FieldTable::default()).await;
    h.put_policy(
        "policies",
        "ttl",
        json!({"pattern": "^short-", "definition": {"message-ttl": 20, "dead-letter-exchange": "pol-dlx"}}),
    )
    .await;
    publish_all(&ch, "", "short-lived", &["expires"]).await;
    h.wait_ready("pol-dead", 1).await;
    h.wait_ready("short-lived", 0).await;
    assert_eq!(drain(&ch, "pol-dead").await, ["expires"]);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_arguments_win_over_the_policy() {
    let h = Http::start(None, None).await;
    let ch = h.channel().await;
    for (x, q) in [("arg-dlx", "arg-dead"), ("policy-dlx", "policy-dead")] {
        declare_exchange(&ch, x, ExchangeKind::Fanout).await;
        declare(&ch, q, false, FieldTable::default()).await;
        bind(&ch, q, x, "").await;
    }
    // The argument's dead-letter exchange wins; of the lengths, the lower one.
    declare(
        &ch,
        "argq",
        false,
        args(&[
            ("x-max-length", AMQPValue::LongInt(1)),
            (
                "x-dead-letter-exchange",
                AMQPValue::LongString("arg-dlx".into()),
            ),
        ]),
    )
    .await;
    h.put_policy(
        "policies",
        "p",
        json!({"pattern": "^argq$", "definition": {"max-length": 5, "dead-letter-exchange": "policy-dlx"}}),
    )
    .await;
    publish_all(&ch, "", "argq", &["one", "two"]).await;
    h.wait_ready("arg-dead", 1).await;
    h.wait_ready("argq", 1).await;
    assert_eq!(drain(&ch, "arg-dead").await, ["one"]);
    assert_eq!(drain(&ch, "argq").await, ["two"]);
    assert_eq!(h.queue("policy-dead").await["messages_ready"], 0);
    // The API shows the policy's definition as it is, next to the arguments.
    let q = h.queue("argq").await;
    assert_eq!(
        q["effective_policy_definition"],
        json!({"max-length": 5, "dead-letter-exchange": "policy-dlx"})
    );
    assert_eq!(q["arguments"]["x-max-length"], 1);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_policy_lowers_max_length() {
    let h = Http::start(None, None).await;
    let ch = h.channel().await;
    declare(&ch, "opq", false, FieldTable::default()).await;
    h.put_policy(
        "policies",
        "user-cap",
        json!({"pattern": "^op", "definition": {"max-length": 10, "message-ttl": 60000}}),
    )
    .await;
    h.put_policy("operator-policies", "op-cap", json!({"pattern": "^op", "definition": {"max-length": 1, "message-ttl": 600000}, "apply-to": "queues"}))
        .await;
    let q = h.queue("opq").await;
    assert_eq!(q["policy"], "user-cap");
    assert_eq!(q["operator_policy"], "op-cap");
    assert_eq!(
        q["effective_policy_definition"],
        json!({"max-length": 1, "message-ttl": 60000})
    );
    publish_all(&ch, "", "opq", &["a", "b", "c"]).await;
    h.wait_ready("opq", 1).await;
    assert_eq!(drain(&ch, "opq").await, ["c"]);
    let listed = h.get_json("/api/operator-policies/%2F").await;
    assert_eq!(
        listed,
        json!([{"vhost": "/", "name": "op-cap", "pattern": "^op", "apply-to": "queues", "priority": 0,
                "definition": {"max-length": 1, "message-ttl": 600000}}])
    );
    h.delete_policy("operator-policies", "op-cap").await;
    publish_all(&ch, "", "opq", &["d", "e"]).await;
    h.wait_ready("opq", 2).await;
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternate_exchange_policy_applies_to_exchanges() {
    let h = Http::start(None, None).await;
    let ch = h.channel().await;
    declare_exchange(&ch, "unrouted", ExchangeKind::Direct).await;
    declare_exchange(&ch, "ae", ExchangeKind::Fanout).await;
    declare(&ch, "ae-q", false, FieldTable::default()).await;
    bind(&ch, "ae-q", "ae", "").await;
    h.put_policy(
        "policies",
        "ae-pol",
        json!({"pattern": "^unrouted$", "definition": {"alternate-exchange": "ae"}, "apply-to": "exchanges"}),
    )
    .await;
    let x = h.get_json("/api/exchanges/%2F/unrouted").await;
    assert_eq!(x["policy"], "ae-pol");
    let ae = h.get_json("/api/exchanges/%2F/ae").await;
    assert!(ae.get("policy").is_none(), "{ae}");
    publish_all(&ch, "unrouted", "nowhere", &["caught"]).await;
    h.wait_ready("ae-q", 1).await;
    h.delete_policy("policies", "ae-pol").await;
    publish_all(&ch, "unrouted", "nowhere", &["lost"]).await;
    // The queue was already checked at 1; a publish confirmed by the next one's round trip.
    publish_all(&ch, "ae", "", &["direct"]).await;
    h.wait_ready("ae-q", 2).await;
    assert_eq!(drain(&ch, "ae-q").await, ["caught", "direct"]);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_errors_and_access() {
    let h = Http::start(None, None).await;
    let put = |who: &'static str, path: &'static str, body: Value| {
        let h = &h;
        async move { h.call(Method::PUT, path, who, Some(body)).await }
    };
    // RabbitMQ 3.10's reasons.
    let cases = [
        (json!({"pattern": "^q", "definition": {"foo": 1}}),
         "Validation failed\n\n[{<<\"foo\">>,1}] are not recognised policy settings\n"),
        (json!({"pattern": "^q", "definition": {"message-ttl": -1}}),
         "Validation failed\n\n-1 is not a valid message TTL\n"),
        (json!({"pattern": "^q", "definition": {"max-length": "x"}}),
         "Validation failed\n\n<<\"x\">> is not a valid maximum length\n"),
        (json!({"pattern": "^q", "definition": {"overflow": "drop-tail"}}),
         "Validation failed\n\n<<\"drop-tail\">> is not a valid overflow value\n"),
        (json!({"pattern": "^q", "definition": {"expires": 0}}),
         "Validation failed\n\n0 is not a valid queue expiry\n"),
        (json!({"pattern": "^q", "definition": {}}),
         "Validation failed\n\nno policy provided\n"),
        (json!({"definition": {"max-length": 1}}), "[{key_missing,pattern}]"),
        (json!({"pattern": "^q", "definition": {"max-length": 1}, "apply-to": "bogus"}),
         "Validation failed\n\napply-to 'bogus' unrecognised; should be one of: 'queues', 'classic_queues',  'quorum_queues', 'streams', 'exchanges', or 'all'\n"),
    ];
    for (body, reason) in cases {
        let (s, v) = put("admin", "/api/policies/%2F/bad", body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(
            v,
            json!({"error": "bad_request", "reason": reason}),
            "{body}"
        );
    }
    let (s, v) = put(
        "admin",
        "/api/operator-policies/%2F/bad",
        json!({"pattern": "^q", "definition": {"overflow": "reject-publish"}}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["reason"],
        "Validation failed\n\n[{<<\"overflow\">>,<<\"reject-publish\">>}] are not recognised policy settings\n"
    );
    // Nothing was stored by the refusals.
    assert_eq!(h.get_json("/api/policies").await, json!([]));
    let (s, _) = h
        .call(Method::GET, "/api/policies/%2F/bad", "admin", None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = h
        .call(Method::DELETE, "/api/policies/%2F/bad", "admin", None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = h
        .call(Method::GET, "/api/policies/nosuchvhost", "admin", None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // A policymaker with access to the vhost may set policies, not operator policies; a
    // management user neither.
    let (s, v) = put(
        "pm",
        "/api/policies/%2F/ok",
        json!({"pattern": "^q", "definition": {"max-length": 1}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = put(
        "pm-elsewhere",
        "/api/policies/%2F/no",
        json!({"pattern": "^q", "definition": {"max-length": 1}}),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    let (s, v) = put(
        "pm",
        "/api/operator-policies/%2F/no",
        json!({"pattern": "^q", "definition": {"max-length": 1}}),
    )
    .await;
    assert_eq!(
        (s, v["reason"].clone()),
        (StatusCode::UNAUTHORIZED, json!("Not administrator user"))
    );
    let (s, v) = put(
        "mgmt",
        "/api/policies/%2F/no",
        json!({"pattern": "^q", "definition": {"max-length": 1}}),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_eq!(v["reason"], "User not authorised to access object");
    let listed = h.get_json("/api/policies").await;
    assert_eq!(
        listed,
        json!([{"vhost": "/", "name": "ok", "pattern": "^q", "apply-to": "all", "priority": 0,
                "definition": {"max-length": 1}}])
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_survive_a_restart() {
    let dir = tempdir("restart");
    let h = Http::start(Some(&dir), None).await;
    let ch = h.channel().await;
    declare(&ch, "kept", true, FieldTable::default()).await;
    h.put_policy(
        "policies",
        "cap",
        json!({"pattern": "^kept$", "definition": {"max-length": 2}, "priority": 7}),
    )
    .await;
    h.put_policy(
        "operator-policies",
        "op",
        json!({"pattern": ".*", "definition": {"expires": 3600000}}),
    )
    .await;
    h.put_policy(
        "policies",
        "gone",
        json!({"pattern": "^x", "definition": {"max-length": 9}}),
    )
    .await;
    h.delete_policy("policies", "gone").await;
    h.stop().await;

    let h = Http::start(Some(&dir), None).await;
    let listed = h.get_json("/api/policies").await;
    assert_eq!(
        listed,
        json!([{"vhost": "/", "name": "cap", "pattern": "^kept$", "apply-to": "all", "priority": 7,
                "definition": {"max-length": 2}}])
    );
    assert_eq!(
        h.get_json("/api/operator-policies")
            .await
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let q = h.queue("kept").await;
    assert_eq!(
        (q["policy"].clone(), q["operator_policy"].clone()),
        (json!("cap"), json!("op"))
    );
    let ch = h.channel().await;
    publish_all(&ch, "", "kept", &["a", "b", "c"]).await;
    h.wait_ready("kept", 2).await;
    assert_eq!(drain(&ch, "kept").await, ["b", "c"]);
    h.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_export_and_import_carry_policies() {
    let h = Http::start(None, None).await;
    let policy = json!({"pattern": "^imp", "definition": {"max-length": 1, "dead-letter-exchange": "dlx"}, "apply-to": "queues", "priority": 2});
    h.put_policy("policies", "exported", policy).await;
    let defs = h.get_json("/api/definitions").await;
    assert_eq!(
        defs["policies"],
        json!([{"vhost": "/", "name": "exported", "pattern": "^imp", "apply-to": "queues", "priority": 2,
                "definition": {"max-length": 1, "dead-letter-exchange": "dlx"}}])
    );
    h.stop().await;

    let dir = tempdir("import");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("defs.json");
    std::fs::write(&file, serde_json::to_vec(&defs).unwrap()).unwrap();
    let h = Http::start(None, Some(&file)).await;
    let again = h.get_json("/api/definitions").await;
    assert_eq!(again["policies"], defs["policies"]);
    h.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// RabbitMQ 4's `apply-to` values: `classic_queues` and `quorum_queues` apply to queues of
/// that type only, `streams` is accepted (a 4.x definitions file with it imports) and
/// applies to none (Warren has no streams); and the lists of policies are open to any
/// management user, as RabbitMQ's (`is_authorized_vhost`), showing the vhosts the user may
/// use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_4_apply_to_values_and_who_may_list() {
    let h = Http::start(None, None).await;
    let ch = h.channel().await;
    declare(&ch, "typed", false, FieldTable::default()).await;
    declare(
        &ch,
        "typed-quorum",
        true,
        args(&[("x-queue-type", AMQPValue::LongString("quorum".into()))]),
    )
    .await;
    for (name, apply_to, priority) in [
        ("quorum-only", "quorum_queues", 9),
        ("streams-only", "streams", 8),
        ("classic-only", "classic_queues", 1),
    ] {
        let created = h
            .put_policy(
                "policies",
                name,
                json!({"pattern": "^typed", "definition": {"max-length": priority},
                       "apply-to": apply_to, "priority": priority}),
            )
            .await;
        assert_eq!(created, StatusCode::CREATED, "{name}");
    }
    // Each queue gets the policy of its type, whatever the priorities.
    let q = h.queue("typed").await;
    assert_eq!(
        (q["type"].clone(), q["policy"].clone()),
        (json!("classic"), json!("classic-only"))
    );
    assert_eq!(q["effective_policy_definition"], json!({"max-length": 1}));
    let q = h.queue("typed-quorum").await;
    assert_eq!(
        (q["type"].clone(), q["policy"].clone()),
        (json!("quorum"), json!("quorum-only"))
    );
    assert_eq!(q["effective_policy_definition"], json!({"max-length": 9}));
    let listed = h.get_json("/api/policies/%2F").await;
    // By priority, as RabbitMQ lists them.
    assert_eq!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["name"].as_str().unwrap(), p["apply-to"].as_str().unwrap()))
            .collect::<Vec<_>>(),
        [
            ("classic-only", "classic_queues"),
            ("streams-only", "streams"),
            ("quorum-only", "quorum_queues")
        ]
    );
    // A management user without policymaker lists them (and operator policies), but may
    // not read one by name.
    for path in [
        "/api/policies",
        "/api/policies/%2F",
        "/api/operator-policies",
    ] {
        let (s, v) = h.call(Method::GET, path, "mgmt", None).await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
    }
    let (s, v) = h.call(Method::GET, "/api/policies", "mgmt", None).await;
    assert_eq!((s, v.as_array().unwrap().len()), (StatusCode::OK, 3));
    let (s, v) = h
        .call(Method::GET, "/api/policies/%2F/classic-only", "mgmt", None)
        .await;
    assert_eq!(
        (s, v["reason"].clone()),
        (
            StatusCode::UNAUTHORIZED,
            json!("User not authorised to access object")
        )
    );
    // The policymaker without permissions in `/` sees none of them.
    let (s, v) = h
        .call(Method::GET, "/api/policies", "pm-elsewhere", None)
        .await;
    assert_eq!((s, v), (StatusCode::OK, json!([])));
    h.stop().await;
}
