//! The management HTTP API over real sockets: an embedded broker with its management
//! listener, a real HTTP client (reqwest), and lapin on the AMQP side, checking RabbitMQ's
//! paths, JSON fields, status codes and error bodies both ways (declared over AMQP, read
//! over HTTP; declared over HTTP, used over AMQP).

mod binary_support;
mod lapin_support;

use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use lapin_support::within;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use warren_server::config::{ManagementConfig, UserConfig};
use warren_server::{Config, RunningBroker};

struct Http {
    base: String,
    client: reqwest::Client,
    broker: Option<RunningBroker>,
}

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

impl Http {
    async fn start() -> Http {
        Self::start_in(None).await
    }

    /// A broker with its data in `data_dir` (in memory with `None`).
    async fn start_in(data_dir: Option<std::path::PathBuf>) -> Http {
        Self::start_with(|c| c.storage.data_dir = data_dir).await
    }

    /// A broker whose configuration `adjust` changes first.
    async fn start_with(adjust: impl FnOnce(&mut Config)) -> Http {
        let mut config = Config {
            users: vec![
                user("admin", &["administrator"]),
                user("mon", &["monitoring"]),
                user("mgmt", &["management"]),
                user("plain", &[]),
            ],
            management: ManagementConfig {
                enabled: true,
                listen: "127.0.0.1:0".parse().unwrap(),
                ..ManagementConfig::default()
            },
            ..Config::default()
        };
        adjust(&mut config);
        let broker = within(
            "broker start",
            warren_server::Broker::builder()
                .config(config)
                .bind("127.0.0.1:0")
                .management(true)
                .start(),
        )
        .await
        .expect("broker starts");
        let base = format!("http://{}", broker.management_addrs()[0]);
        Http {
            base,
            client: reqwest::Client::new(),
            broker: Some(broker),
        }
    }

    /// A broker with its data in a fresh temporary directory named after `name`, and queues
    /// that keep `window` ready messages in memory; also returns the directory, to delete
    /// after [`Http::stop`].
    async fn start_with_window(name: &str, window: usize) -> (Http, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("warren-mgmt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let h = Self::start_with(|c| {
            c.storage.data_dir = Some(dir.clone());
            c.storage.queue_window = window;
        })
        .await;
        (h, dir)
    }

    async fn amqp(&self) -> Connection {
        self.amqp_as("admin", "%2f").await
    }

    /// An AMQP connection as `user` (password `<user>-pw`) to `vhost` (URI-encoded).
    async fn amqp_as(&self, user: &str, vhost: &str) -> Connection {
        let addr = self.broker.as_ref().unwrap().amqp_addr();
        within(
            "connect",
            Connection::connect(
                &format!("amqp://{user}:{user}-pw@{addr}/{vhost}"),
                ConnectionProperties::default(),
            ),
        )
        .await
        .expect("AMQP connection")
    }

    /// Polls `GET path` as admin until `done` holds for the reply (bounded wait).
    async fn wait_for(&self, path: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = std::time::Instant::now() + lapin_support::WAIT;
        loop {
            let (s, _, v) = self.call(Method::GET, path, Some("admin"), None).await;
            if s == StatusCode::OK && done(&v) {
                return v;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "GET {path} never matched: {s} {v}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        who: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(u) = who {
            req = req.basic_auth(u, Some(format!("{u}-pw")));
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = within("HTTP request", req.send())
            .await
            .expect("HTTP reply");
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = within("HTTP body", resp.text()).await.expect("body");
        let v = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, headers, v)
    }

    /// `POST path` as `who` with `body` sent as is, with `content_type`.
    async fn post_raw(
        &self,
        path: &str,
        who: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let req = self
            .client
            .post(format!("{}{path}", self.base))
            .basic_auth(who, Some(format!("{who}-pw")))
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body);
        let resp = within("HTTP request", req.send())
            .await
            .expect("HTTP reply");
        let status = resp.status();
        let text = within("HTTP body", resp.text()).await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        let (s, _, v) = self.call(Method::GET, path, Some("admin"), None).await;
        assert_eq!(s, StatusCode::OK, "GET {path}: {v}");
        v
    }

    /// Waits (bounded) until queue `q` of `/` has `n` ready messages: publishes over AMQP
    /// without confirms are enqueued some time after lapin has sent them.
    async fn wait_ready(&self, q: &str, n: u64) {
        let deadline = std::time::Instant::now() + lapin_support::WAIT;
        loop {
            let v = self.get(&format!("/api/queues/%2F/{q}")).await;
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
        self.broker.take().unwrap().shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_and_tag_rules() {
    let h = Http::start().await;
    // No credentials, then wrong ones: 401 with a challenge; RabbitMQ's body for the latter.
    let bad = json!({"error": "not_authorized", "reason": "Not_Authorized"});
    for (who, body) in [(None, Value::Null), (Some("nobody"), bad)] {
        let (s, headers, v) = h.call(Method::GET, "/api/overview", who, None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        assert_eq!(
            headers.get("www-authenticate").unwrap(),
            "Basic realm=\"RabbitMQ Management\""
        );
        assert_eq!(v, body);
    }
    // A user without a management tag, and tags too weak for the path: 401 not_authorised.
    let cases = [
        ("plain", "/api/overview", "Not management user"),
        ("mgmt", "/api/users", "Not administrator user"),
        ("mon", "/api/definitions", "Not administrator user"),
        ("mgmt", "/api/nodes", "Not monitor user"),
        // One vhost's record is for administrators (rabbit_mgmt_wm_vhost), the list for all.
        ("mon", "/api/vhosts/%2F", "Not administrator user"),
    ];
    for (who, path, reason) in cases {
        let (s, headers, v) = h.call(Method::GET, path, Some(who), None).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{who} {path}");
        assert!(headers.get("www-authenticate").is_none());
        assert_eq!(
            v,
            json!({"error": "not_authorised", "reason": reason}),
            "{who} {path}"
        );
    }
    // What each tag may do.
    for (who, path) in [
        ("mgmt", "/api/overview"),
        ("mgmt", "/api/queues"),
        ("mgmt", "/api/health/checks/alarms"),
        ("mon", "/api/nodes"),
        ("admin", "/api/users"),
    ] {
        let (s, _, v) = h.call(Method::GET, path, Some(who), None).await;
        assert_eq!(s, StatusCode::OK, "{who} {path}: {v}");
    }
    let (_, _, v) = h.call(Method::GET, "/api/whoami", Some("mon"), None).await;
    assert_eq!(
        v,
        json!({"name": "mon", "tags": ["monitoring"], "is_internal_user": true})
    );
    h.stop().await;
}

/// The web console: `/` and `/console/...` are public static files with nosniff and a CSP,
/// revalidated by ETag; `/api` still needs credentials, and the console's calls
/// (`X-Requested-With: XMLHttpRequest`) get their 401 without a browser challenge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_console_is_served_and_the_api_stays_guarded() {
    let h = Http::start().await;
    let get = |path: &str| h.client.get(format!("{}{path}", h.base));
    let page = within("GET /", get("/").send()).await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let headers = page.headers().clone();
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(
        headers["content-security-policy"],
        warren_mgmt::console::CONTENT_SECURITY_POLICY
    );
    assert_eq!(headers["cache-control"], "no-cache");
    let body = within("body", page.text()).await.unwrap();
    assert!(body.contains(r#"<script type="module" src="/console/js/main.js">"#));
    let again = within(
        "GET / again",
        get("/")
            .header("if-none-match", headers["etag"].clone())
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    for asset in warren_mgmt::console::ASSETS {
        let r = within("asset", get(&format!("/console/{}", asset.path)).send())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{}", asset.path);
        assert_eq!(r.headers()["content-type"], asset.content_type);
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        assert_eq!(within("asset body", r.bytes()).await.unwrap(), asset.body);
    }
    for missing in ["/console/../Cargo.toml", "/console/js/nope.js", "/console/"] {
        let r = within("missing", get(missing).send()).await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{missing}");
    }
    // The console's calls: no challenge, same refusal; with credentials, the same answer.
    for auth in [None, Some("nobody")] {
        let mut req = get("/api/overview").header("x-requested-with", "XMLHttpRequest");
        if let Some(u) = auth {
            req = req.basic_auth(u, Some("x"));
        }
        let r = within("scripted", req.send()).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert!(r.headers().get("www-authenticate").is_none());
    }
    let r = within(
        "scripted ok",
        get("/api/whoami")
            .header("x-requested-with", "XMLHttpRequest")
            .basic_auth("mgmt", Some("mgmt-pw"))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    h.stop().await;
}

/// Writes go through the broker's operations layer with the HTTP user as the actor: the
/// user's configure / write / read permissions are checked as for AMQP, and a refusal is
/// RabbitMQ's 401 "Access refused.".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_checked_against_the_users_permissions() {
    let h = Http::start().await;
    let broker = &h.broker.as_ref().unwrap().state().broker;
    broker
        .access_mut()
        .set_permissions(
            "mgmt",
            "/",
            warren_broker::access::Permissions::new("^mine-", "^mine-", "^mine-").unwrap(),
        )
        .unwrap();
    let refused = json!({"error": "not_authorised", "reason": "Access refused."});
    let put = Some(json!({"durable": false}));
    let (s, _, v) = h
        .call(
            Method::PUT,
            "/api/queues/%2F/theirs",
            Some("mgmt"),
            put.clone(),
        )
        .await;
    assert_eq!((s, v), (StatusCode::UNAUTHORIZED, refused.clone()));
    let (s, _, _) = h
        .call(
            Method::PUT,
            "/api/queues/%2F/mine-1",
            Some("mgmt"),
            put.clone(),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    // The administrator declares a queue "mgmt" may not read, purge or delete.
    let (s, _, _) = h
        .call(Method::PUT, "/api/queues/%2F/theirs", Some("admin"), put)
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let get = Some(json!({"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}));
    for (method, path, body) in [
        (Method::POST, "/api/queues/%2F/theirs/get", get.clone()),
        (Method::DELETE, "/api/queues/%2F/theirs/contents", None),
        (Method::DELETE, "/api/queues/%2F/theirs", None),
        (
            Method::POST,
            "/api/exchanges/%2F/amq.default/publish",
            Some(
                json!({"routing_key": "theirs", "payload": "x", "payload_encoding": "string", "properties": {}}),
            ),
        ),
    ] {
        let (s, _, v) = h.call(method.clone(), path, Some("mgmt"), body).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED, "{method} {path}: {v}");
    }
    let (s, _, v) = h
        .call(
            Method::POST,
            "/api/queues/%2F/mine-1/get",
            Some("mgmt"),
            get,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_show_what_amqp_declared() {
    let h = Http::start().await;
    let conn = h.amqp().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    for q in ["orders", "audit"] {
        within(
            "declare",
            ch.queue_declare(
                q.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            ),
        )
        .await
        .unwrap();
    }
    within(
        "bind",
        ch.queue_bind(
            "audit".into(),
            "amq.topic".into(),
            "order.*".into(),
            Default::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    for i in 0..3 {
        within(
            "publish",
            ch.basic_publish(
                "".into(),
                "orders".into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                BasicProperties::default(),
            ),
        )
        .await
        .unwrap();
    }
    // One message delivered and not acked.
    let got = within(
        "get",
        ch.basic_get("orders".into(), BasicGetOptions { no_ack: false }),
    )
    .await
    .unwrap();
    assert!(got.is_some());

    let q = h.get("/api/queues/%2F/orders").await;
    assert_eq!(q["name"], "orders");
    assert_eq!(q["vhost"], "/");
    assert_eq!(q["durable"], true);
    assert_eq!(q["auto_delete"], false);
    assert_eq!(q["exclusive"], false);
    assert_eq!(q["arguments"], json!({}));
    assert_eq!(q["state"], "running");
    assert_eq!(q["messages_ready"], 2);
    assert_eq!(q["messages_unacknowledged"], 1);
    assert_eq!(q["messages"], 3);
    assert_eq!(q["consumers"], 0);
    assert!(q["node"].as_str().unwrap().starts_with("warren@"));

    // Lists: default order by name, `columns`, `sort`, `sort_reverse`, pages, `name`.
    let all = h.get("/api/queues").await;
    let names: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["audit", "orders"]);
    let cols = h
        .get("/api/queues/%2F?columns=name,messages&sort=messages&sort_reverse=true")
        .await;
    assert_eq!(
        cols,
        json!([{"name": "orders", "messages": 3}, {"name": "audit", "messages": 0}])
    );
    let page = h.get("/api/queues?page=2&page_size=1&columns=name").await;
    assert_eq!(page["items"], json!([{"name": "orders"}]));
    assert_eq!(page["page_count"], 2);
    assert_eq!(page["total_count"], 2);
    assert_eq!(page["filtered_count"], 2);
    let named = h.get("/api/queues?page=1&name=aud&columns=name").await;
    assert_eq!(named["items"], json!([{"name": "audit"}]));
    let (s, _, v) = h
        .call(Method::GET, "/api/queues?page=9", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(
        v,
        json!({"error": "page_out_of_range",
            "reason": "Page out of range, page: 9 page size: 100, len: 2"})
    );

    // 404 bodies: missing queue, vhost, exchange, user, path.
    for path in [
        "/api/queues/%2F/nope",
        "/api/queues/nope",
        "/api/exchanges/%2F/nope",
        "/api/vhosts/nope",
        "/api/users/nope",
        "/api/no-such-thing",
    ] {
        let (s, _, v) = h.call(Method::GET, path, Some("admin"), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(
            v,
            json!({"error": "Object Not Found", "reason": "Not Found"}),
            "{path}"
        );
    }

    // Exchanges: the standard ones; `amq.default` names the default exchange.
    let xs = h.get("/api/exchanges/%2F?columns=name,type,durable").await;
    assert!(xs
        .as_array()
        .unwrap()
        .contains(&json!({"name": "amq.topic", "type": "topic", "durable": true})));
    let d = h.get("/api/exchanges/%2F/amq.default").await;
    assert_eq!(d["name"], "");
    assert_eq!(d["type"], "direct");

    // Bindings: the default exchange's implicit ones and the declared one.
    let b = h.get("/api/bindings/%2F").await;
    let b = b.as_array().unwrap();
    assert!(
        b.contains(&json!({"source": "", "vhost": "/", "destination": "orders",
        "destination_type": "queue", "routing_key": "orders", "arguments": {},
        "properties_key": "orders"}))
    );
    assert!(b.contains(
        &json!({"source": "amq.topic", "vhost": "/", "destination": "audit",
        "destination_type": "queue", "routing_key": "order.*", "arguments": {},
        "properties_key": "order.*"})
    ));
    let src = h.get("/api/exchanges/%2F/amq.topic/bindings/source").await;
    assert_eq!(src.as_array().unwrap().len(), 1);
    let qb = h.get("/api/queues/%2F/audit/bindings").await;
    assert_eq!(qb.as_array().unwrap().len(), 2);

    // Overview totals.
    let o = h.get("/api/overview").await;
    assert_eq!(o["product_name"], "Warren");
    assert_eq!(o["management_version"], o["rabbitmq_version"]);
    assert_eq!(o["queue_totals"]["messages"], 3);
    assert_eq!(o["queue_totals"]["messages_ready"], 2);
    assert_eq!(o["queue_totals"]["messages_unacknowledged"], 1);
    assert_eq!(o["object_totals"]["queues"], 2);
    assert_eq!(o["object_totals"]["connections"], 1);
    assert_eq!(o["object_totals"]["exchanges"], 6);

    // Vhosts, users, permissions, nodes, health checks, aliveness.
    let v = h.get("/api/vhosts/%2F").await;
    assert_eq!(v["name"], "/");
    assert_eq!(v["messages"], 3);
    let users = h.get("/api/users?columns=name,tags").await;
    assert_eq!(
        users[0],
        json!({"name": "admin", "tags": ["administrator"]})
    );
    let p = h.get("/api/permissions/%2F/mgmt").await;
    assert_eq!(
        p,
        json!({"user": "mgmt", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"})
    );
    let nodes = h.get("/api/nodes").await;
    assert_eq!(nodes[0]["running"], true);
    assert_eq!(nodes[0]["mem_alarm"], false);
    assert_eq!(
        h.get("/api/health/checks/alarms").await,
        json!({"status": "ok"})
    );
    let amqp_port = h.broker.as_ref().unwrap().amqp_addr().port();
    assert_eq!(
        h.get(&format!("/api/health/checks/port-listener/{amqp_port}"))
            .await,
        json!({"status": "ok", "port": amqp_port})
    );
    let (s, _, v) = h
        .call(
            Method::GET,
            "/api/health/checks/protocol-listener/stomp",
            Some("admin"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(v["status"], "failed");
    assert_eq!(
        h.get("/api/aliveness-test/%2F").await,
        json!({"status": "ok"})
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_seen_over_amqp() {
    let h = Http::start().await;
    let put = |path: &'static str, body: Value| {
        let h = &h;
        async move { h.call(Method::PUT, path, Some("mgmt"), Some(body)).await }
    };
    // Declare: 201, then 204 for an equivalent redeclare, 400 for an inequivalent one.
    let (s, _, _) = put(
        "/api/queues/%2F/jobs",
        json!({"durable": true, "arguments": {"x-max-length": 10}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _, _) = put(
        "/api/queues/%2F/jobs",
        json!({"durable": true, "arguments": {"x-max-length": 10}}),
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, v) = put(
        "/api/queues/%2F/jobs",
        json!({"durable": false, "arguments": {"x-max-length": 10}}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(
        v,
        json!({"error": "bad_request", "reason": "inequivalent arg 'durable' for queue 'jobs' in vhost '/': received 'false' but current is 'true'"})
    );
    let (s, _, _) = put(
        "/api/exchanges/%2F/work",
        json!({"type": "fanout", "durable": false}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _, v) = put(
        "/api/exchanges/%2F/work",
        json!({"type": "direct", "durable": false}),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (s, headers, _) = h
        .call(
            Method::POST,
            "/api/bindings/%2F/e/work/q/jobs",
            Some("mgmt"),
            Some(json!({"routing_key": "any", "arguments": {}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(headers.get("location").unwrap(), "jobs/any");
    // Keys left out declare a transient queue, and a transient direct exchange.
    let (s, _, _) = put("/api/queues/%2F/bare", json!({})).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(h.get("/api/queues/%2F/bare").await["durable"], false);
    let (s, _, _) = put("/api/exchanges/%2F/bare", json!({})).await;
    assert_eq!(s, StatusCode::CREATED);
    let x = h.get("/api/exchanges/%2F/bare").await;
    assert_eq!(
        (&x["type"], &x["durable"]),
        (&json!("direct"), &json!(false))
    );
    let (s, _, v) = h
        .call(
            Method::POST,
            "/api/exchanges/%2F/nope/publish",
            Some("mgmt"),
            Some(json!({"routing_key": "", "payload": "x", "payload_encoding": "string", "properties": {}})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(
        v,
        json!({"error": "bad_request", "reason": "404 NOT_FOUND - no exchange 'nope' in vhost '/'"})
    );

    // Publish through HTTP, read over AMQP.
    let (s, _, v) = h
        .call(
            Method::POST,
            "/api/exchanges/%2F/work/publish",
            Some("mgmt"),
            Some(
                json!({"routing_key": "", "payload": "hello", "payload_encoding": "string",
                "properties": {"delivery_mode": 2, "headers": {"k": "v"}}}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v, json!({"routed": true}));
    let (_, _, v) = h
        .call(
            Method::POST,
            "/api/exchanges/%2F/amq.default/publish",
            Some("mgmt"),
            Some(json!({"routing_key": "nowhere", "payload": "aGk=", "payload_encoding": "base64", "properties": {}})),
        )
        .await;
    assert_eq!(v, json!({"routed": false}));
    let conn = h.amqp().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let m = within(
        "get",
        ch.basic_get("jobs".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap()
    .expect("message published over HTTP");
    assert_eq!(m.delivery.data, b"hello");
    assert_eq!(m.delivery.properties.delivery_mode(), &Some(2));

    // Publish over AMQP, get over HTTP: requeue keeps it, ack takes it.
    for body in ["one", "two"] {
        within(
            "publish",
            ch.basic_publish(
                "".into(),
                "jobs".into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                BasicProperties::default().with_content_type("text/plain".into()),
            ),
        )
        .await
        .unwrap();
    }
    let get = |ackmode: &'static str| {
        let h = &h;
        async move {
            h.call(
                Method::POST,
                "/api/queues/%2F/jobs/get",
                Some("mgmt"),
                Some(json!({"count": 5, "ackmode": ackmode, "encoding": "auto", "truncate": 2})),
            )
            .await
        }
    };
    h.wait_ready("jobs", 2).await;
    let (s, _, v) = get("ack_requeue_true").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(v[0]["payload"], "on");
    assert_eq!(v[0]["payload_bytes"], 3);
    assert_eq!(v[0]["payload_encoding"], "string");
    assert_eq!(v[0]["properties"]["content_type"], "text/plain");
    assert_eq!(v[0]["exchange"], "");
    assert_eq!(v[0]["routing_key"], "jobs");
    assert_eq!(v[0]["message_count"], 1);
    assert_eq!(h.get("/api/queues/%2F/jobs").await["messages_ready"], 2);
    let (_, _, v) = get("ack_requeue_false").await;
    assert_eq!(v[0]["redelivered"], true);
    assert_eq!(h.get("/api/queues/%2F/jobs").await["messages_ready"], 0);

    // Purge and delete.
    for _ in 0..3 {
        within(
            "publish",
            ch.basic_publish(
                "".into(),
                "jobs".into(),
                BasicPublishOptions::default(),
                b"x",
                BasicProperties::default(),
            ),
        )
        .await
        .unwrap();
    }
    h.wait_ready("jobs", 3).await;
    let (s, _, _) = h
        .call(
            Method::DELETE,
            "/api/queues/%2F/jobs/contents",
            Some("mgmt"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(h.get("/api/queues/%2F/jobs").await["messages_ready"], 0);
    let (s, _, _) = h
        .call(Method::DELETE, "/api/queues/%2F/jobs", Some("mgmt"), None)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, _) = h
        .call(Method::DELETE, "/api/queues/%2F/jobs", Some("mgmt"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let passive = within(
        "passive declare",
        ch.queue_declare(
            "jobs".into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await;
    assert!(passive.is_err(), "queue deleted over HTTP still exists");
    let (s, _, _) = h
        .call(
            Method::DELETE,
            "/api/exchanges/%2F/work",
            Some("mgmt"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, v) = h
        .call(
            Method::DELETE,
            "/api/exchanges/%2F/amq.direct",
            Some("mgmt"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    assert_eq!(
        v,
        json!({"error": "not_authorised", "reason": "Access refused."})
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_and_metrics() {
    let h = Http::start().await;
    let (s, _, _) = h
        .call(
            Method::PUT,
            "/api/queues/%2F/d1",
            Some("admin"),
            Some(json!({"durable": true, "arguments": {"x-message-ttl": 5000}})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    h.call(
        Method::PUT,
        "/api/exchanges/%2F/dx",
        Some("admin"),
        Some(json!({"type": "topic", "durable": true})),
    )
    .await;
    h.call(
        Method::POST,
        "/api/bindings/%2F/e/dx/q/d1",
        Some("admin"),
        Some(json!({"routing_key": "a.#"})),
    )
    .await;
    h.call(
        Method::POST,
        "/api/exchanges/%2F/dx/publish",
        Some("admin"),
        Some(json!({"routing_key": "a.b", "payload": "p", "payload_encoding": "string", "properties": {}})),
    )
    .await;
    let d = h.get("/api/definitions").await;
    assert_eq!(
        d["queues"],
        json!([{"name": "d1", "vhost": "/", "durable": true, "auto_delete": false,
            "arguments": {"x-message-ttl": 5000}}])
    );
    assert_eq!(
        d["exchanges"],
        json!([{"name": "dx", "vhost": "/", "type": "topic", "durable": true,
            "auto_delete": false, "internal": false, "arguments": {}}])
    );
    assert_eq!(
        d["bindings"],
        json!([{"source": "dx", "vhost": "/", "destination": "d1", "destination_type": "queue",
            "routing_key": "a.#", "arguments": {}}])
    );
    assert_eq!(d["vhosts"][0]["name"], "/");
    // Users carry RabbitMQ SHA-256 password hashes that verify against their passwords.
    use warren_broker::access::password::{decode_hash, verify_password, HashingAlgorithm};
    let admin = d["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "admin")
        .unwrap();
    assert_eq!(admin["hashing_algorithm"], "rabbit_password_hashing_sha256");
    let hash = decode_hash(admin["password_hash"].as_str().unwrap()).unwrap();
    assert!(verify_password(&hash, HashingAlgorithm::Sha256, "admin-pw"));
    assert!(!verify_password(&hash, HashingAlgorithm::Sha256, "other"));
    // The export reads back with the broker's own definitions parser.
    let parsed = warren_broker::definitions::Definitions::from_json(&d.to_string()).unwrap();
    assert_eq!(parsed.queues().len(), 1);

    // Prometheus text, aggregated and per object.
    let text = |path: &'static str| {
        let h = &h;
        async move {
            let r = h
                .client
                .get(format!("{}{path}", h.base))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            assert!(r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain; version=0.0.4"));
            r.text().await.unwrap()
        }
    };
    let agg = text("/metrics").await;
    for line in [
        "# TYPE rabbitmq_queue_messages_ready gauge",
        "rabbitmq_queue_messages_ready 1",
        "rabbitmq_queue_messages 1",
        "rabbitmq_queues 1",
        "rabbitmq_connections 0",
        "rabbitmq_alarms_memory_used_watermark 0",
        "# TYPE warren_queue_consumer_deliveries_total counter",
        "warren_queue_consumer_deliveries_total 0",
    ] {
        assert!(agg.lines().any(|l| l == line), "{line} missing in:\n{agg}");
    }
    assert!(agg.contains("rabbitmq_identity_info{"), "{agg}");
    for family in [
        "rabbitmq_global_messages_routed_total{protocol=\"amqp091\"}",
        "rabbitmq_global_messages_unroutable_dropped_total{protocol=\"amqp091\"}",
        "rabbitmq_global_messages_get_empty_total{protocol=\"amqp091\"}",
        "rabbitmq_global_messages_delivered_consume_auto_ack_total{protocol=\"amqp091\"}",
    ] {
        assert!(agg.contains(family), "{family} missing in:\n{agg}");
    }
    // The node's resources under rabbitmq_prometheus's names, with real values.
    for name in [
        "rabbitmq_resident_memory_limit_bytes",
        "rabbitmq_process_open_fds",
        "rabbitmq_process_max_fds",
        "rabbitmq_process_open_tcp_sockets",
        "rabbitmq_process_max_tcp_sockets",
    ] {
        let v: f64 = agg
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing in:\n{agg}"))
            .parse()
            .unwrap();
        assert!(v > 0.0, "{name} {v}");
    }
    // Nothing paged out; no message store in memory, so no store families.
    assert!(
        agg.lines()
            .any(|l| l == "warren_queue_messages_paged_out 0"),
        "{agg}"
    );
    assert!(!agg.contains("warren_store_"), "{agg}");
    // A Prometheus text parser reads it, with gauge types and the per-object labels.
    let parsed = prometheus_parse::Scrape::parse(agg.lines().map(|l| Ok(l.to_string())))
        .expect("parses as Prometheus text");
    let ready = parsed
        .samples
        .iter()
        .find(|s| s.metric == "rabbitmq_queue_messages_ready")
        .expect("rabbitmq_queue_messages_ready sample");
    assert!(matches!(ready.value, prometheus_parse::Value::Gauge(v) if v == 1.0));
    assert_eq!(
        parsed
            .docs
            .get("rabbitmq_queue_messages_ready")
            .map(String::as_str),
        Some("Messages ready to be delivered to consumers")
    );
    assert!(agg.contains("rabbitmq_build_info{"), "{agg}");
    let per = text("/metrics/per-object").await;
    let parsed = prometheus_parse::Scrape::parse(per.lines().map(|l| Ok(l.to_string())))
        .expect("parses as Prometheus text");
    let d1 = parsed
        .samples
        .iter()
        .find(|s| s.metric == "rabbitmq_queue_messages" && s.labels.get("queue") == Some("d1"))
        .expect("per-queue sample");
    assert_eq!(d1.labels.get("vhost"), Some("/"));
    assert!(
        per.lines()
            .any(|l| l == "rabbitmq_queue_messages_ready{queue=\"d1\",vhost=\"/\"} 1"),
        "{per}"
    );
    h.stop().await;
}

/// The `warren` binary serves the API on `--management-listen` next to AMQP, and SIGTERM
/// stops it with the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_the_api_until_sigterm() {
    let dir = binary_support::tempdir("mgmt-binary");
    let amqp = binary_support::free_port();
    let http = binary_support::free_port();
    let listen = format!("127.0.0.1:{http}");
    let mut server = binary_support::Server::start_listening(
        &format!("127.0.0.1:{amqp}"),
        amqp,
        &dir,
        &[],
        None,
        &["--management-listen", &listen],
    );
    let client = reqwest::Client::new();
    let url = format!("http://{listen}/api/overview");
    let r = within(
        "overview",
        client.get(&url).basic_auth("guest", Some("guest")).send(),
    )
    .await
    .expect("the management API answers");
    assert_eq!(r.status(), StatusCode::OK);
    let o: Value = r.json().await.unwrap();
    assert_eq!(o["product_name"], "Warren");
    let listeners = o["listeners"].as_array().unwrap();
    assert!(
        listeners.contains(&json!({"node": o["node"], "protocol": "amqp",
        "ip_address": "127.0.0.1", "port": amqp}))
    );
    server.signal(libc::SIGTERM);
    assert!(server.wait_exit().success());
    assert!(
        std::net::TcpStream::connect(&listen).is_err(),
        "the management listener outlived the broker"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A persistent message published over HTTP into a durable queue is answered only once it
/// is on disk (RabbitMQ's management plugin publishes with confirms): every answered publish
/// is there after kill -9 and a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_publishes_answered_survive_kill_9() {
    let dir = binary_support::tempdir("mgmt-kill");
    let amqp = binary_support::free_port();
    let http = binary_support::free_port();
    let listen = format!("127.0.0.1:{http}");
    let start = || {
        binary_support::Server::start_listening(
            &format!("127.0.0.1:{amqp}"),
            amqp,
            &dir,
            &[],
            None,
            &["--management-listen", &listen],
        )
    };
    let client = reqwest::Client::new();
    let base = format!("http://{listen}/api");
    let mut server = start();
    let r = client
        .put(format!("{base}/queues/%2F/hq"))
        .basic_auth("guest", Some("guest"))
        .json(&json!({"durable": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let n = 100;
    for i in 0..n {
        let r = client
            .post(format!("{base}/exchanges/%2F/amq.default/publish"))
            .basic_auth("guest", Some("guest"))
            .json(
                &json!({"properties": {"delivery_mode": 2}, "routing_key": "hq",
                "payload": i.to_string(), "payload_encoding": "string"}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.json::<Value>().await.unwrap(), json!({"routed": true}));
    }
    server.signal(libc::SIGKILL);
    server.wait_exit();
    let _server = start();
    let r = within(
        "queue after restart",
        client
            .get(format!("{base}/queues/%2F/hq"))
            .basic_auth("guest", Some("guest"))
            .send(),
    )
    .await
    .unwrap();
    let q: Value = r.json().await.unwrap();
    assert_eq!(q["messages"], json!(n));
}

/// Percent-encodes a path segment (connection and channel names hold spaces, `>` and `:`).
fn seg(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A channel of `conn` in confirm mode.
async fn confirm_channel(conn: &Connection) -> lapin::Channel {
    let ch = within("channel", conn.create_channel()).await.unwrap();
    within(
        "confirm",
        ch.confirm_select(lapin::options::ConfirmSelectOptions::default()),
    )
    .await
    .unwrap();
    ch
}

/// Waits for the server's connection.close on `events` and returns (reply code, reply text).
async fn forced_close(
    events: &mut (impl futures_util::Stream<Item = lapin::Event> + Unpin),
) -> (u16, String) {
    use futures_util::StreamExt;
    loop {
        match within("connection.close", events.next()).await {
            Some(lapin::Event::Error(e)) => match e.kind() {
                lapin::ErrorKind::ProtocolError(amqp) => {
                    return (amqp.get_id(), amqp.get_message().to_string())
                }
                other => panic!("expected a connection.close, got {other:?}"),
            },
            Some(_) => continue,
            None => panic!("event stream ended without an error"),
        }
    }
}

/// Two lapin connections are listed with RabbitMQ's fields, their channels and consumers
/// too, with the counts of what went through them; one is closed over HTTP and its client
/// gets 320 CONNECTION_FORCED with the X-Reason text, the other keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_channels_and_consumers_are_listed_and_closed() {
    use lapin::options::{
        BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions,
    };
    let h = Http::start().await;
    let a = h.amqp().await;
    let b = h.amqp().await;
    let mut a_events = a.events_listener();
    let ach = within("channel", a.create_channel()).await.unwrap();
    let bch = within("channel", b.create_channel()).await.unwrap();
    within("qos", ach.basic_qos(7, BasicQosOptions::default()))
        .await
        .unwrap();
    within(
        "confirm",
        bch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .unwrap();
    within(
        "declare",
        ach.queue_declare(
            "work".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    let mut consumer = within(
        "consume",
        ach.basic_consume(
            "work".into(),
            "worker-1".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    for i in 0..3 {
        within("publish", async {
            bch.basic_publish(
                "".into(),
                "work".into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                BasicProperties::default(),
            )
            .await?
            .await
        })
        .await
        .unwrap();
    }
    use futures_util::StreamExt;
    let mut held = Vec::new();
    for _ in 0..3 {
        let d = within("delivery", consumer.next()).await.unwrap().unwrap();
        held.push(d);
    }
    // One acknowledged, two left unacknowledged.
    within("ack", held[0].ack(BasicAckOptions::default()))
        .await
        .unwrap();

    let conns = h
        .wait_for("/api/connections", |v| {
            v.as_array().is_some_and(|a| a.len() == 2)
        })
        .await;
    let amqp_port = h.broker.as_ref().unwrap().amqp_addr().port();
    for c in conns.as_array().unwrap() {
        assert_eq!(c["user"], "admin");
        assert_eq!(c["vhost"], "/");
        assert_eq!(c["protocol"], "AMQP 0-9-1");
        assert_eq!(c["ssl"], false);
        assert_eq!(c["auth_mechanism"], "PLAIN");
        assert_eq!(c["channels"], 1);
        assert_eq!(c["port"], amqp_port);
        assert_eq!(c["peer_host"], "127.0.0.1");
        let name = c["name"].as_str().unwrap();
        assert_eq!(
            name,
            format!("127.0.0.1:{} -> 127.0.0.1:{amqp_port}", c["peer_port"]),
        );
        assert!(c["connected_at"].as_u64().unwrap() > 1_600_000_000_000);
        assert_eq!(c["client_properties"]["product"], "lapin", "{c}");
        assert!(c["client_properties"]["capabilities"].is_object(), "{c}");
    }
    // Which connection is which: the consuming one has the consumer's channel.
    let channels = h
        .wait_for("/api/channels", |v| {
            v.as_array().is_some_and(|a| {
                a.len() == 2
                    && a.iter().any(|c| c["messages_unacknowledged"] == 2)
                    && a.iter().any(|c| c["message_stats"]["confirm"] == 3)
            })
        })
        .await;
    let consuming = channels
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["consumer_count"] == 1)
        .expect("the consumer's channel")
        .clone();
    assert_eq!(consuming["prefetch_count"], 7);
    assert_eq!(consuming["number"], 1);
    assert_eq!(consuming["confirm"], false);
    assert_eq!(consuming["message_stats"]["deliver"], 3);
    assert_eq!(consuming["message_stats"]["ack"], 1);
    let conn_name = consuming["connection_details"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(consuming["name"], format!("{conn_name} (1)"));
    let publishing = channels
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["consumer_count"] == 0)
        .unwrap()
        .clone();
    assert_eq!(publishing["confirm"], true);
    assert_eq!(publishing["message_stats"]["publish"], 3);

    let one = h
        .get(&format!("/api/connections/{}", seg(&conn_name)))
        .await;
    assert_eq!(one["name"], conn_name.as_str());
    let chs = h
        .get(&format!("/api/connections/{}/channels", seg(&conn_name)))
        .await;
    assert_eq!(chs.as_array().unwrap().len(), 1);
    assert_eq!(chs[0]["name"], consuming["name"]);
    let ch = h
        .get(&format!(
            "/api/channels/{}",
            seg(consuming["name"].as_str().unwrap())
        ))
        .await;
    assert_eq!(ch["consumer_count"], 1);
    assert_eq!(
        h.get("/api/vhosts/%2F/connections")
            .await
            .as_array()
            .unwrap()
            .len(),
        2
    );

    let consumers = h.get("/api/consumers").await;
    assert_eq!(consumers.as_array().unwrap().len(), 1, "{consumers}");
    let c = &consumers[0];
    assert_eq!(c["consumer_tag"], "worker-1");
    assert_eq!(c["queue"], json!({"name": "work", "vhost": "/"}));
    assert_eq!(c["ack_required"], true);
    assert_eq!(c["prefetch_count"], 7);
    // RabbitMQ's default delivery acknowledgement timeout (the queue sets none).
    assert_eq!(c["consumer_timeout"], 1_800_000);
    assert_eq!(c["channel_details"]["connection_name"], conn_name.as_str());
    assert_eq!(h.get("/api/consumers/%2F").await, consumers);

    // Counts per queue, per vhost and for the node.
    let q = h.get("/api/queues/%2F/work").await;
    assert_eq!(q["message_stats"]["publish"], 3, "{q}");
    assert_eq!(q["message_stats"]["deliver"], 3);
    assert_eq!(q["message_stats"]["ack"], 1);
    assert_eq!(q["messages_unacknowledged"], 2);
    let v = h.get("/api/vhosts/%2F").await;
    assert_eq!(v["message_stats"]["publish"], 3, "{v}");
    assert_eq!(v["message_stats"]["deliver_get"], 3);
    let o = h.get("/api/overview").await;
    assert_eq!(o["message_stats"]["publish"], 3, "{o}");
    assert_eq!(o["message_stats"]["confirm"], 3);
    assert_eq!(o["object_totals"]["connections"], 2);
    assert_eq!(o["object_totals"]["channels"], 2);

    // Metrics from the same model.
    let (_, _, text) = h.call(Method::GET, "/metrics", None, None).await;
    let text = text.as_str().unwrap().to_string();
    let metrics = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .expect("Prometheus text");
    let value = |name: &str| {
        metrics
            .samples
            .iter()
            .find(|s| s.metric == name)
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
    };
    assert_eq!(value("rabbitmq_connections"), 2.0);
    assert_eq!(value("rabbitmq_channels"), 2.0);
    assert_eq!(value("rabbitmq_consumers"), 1.0);
    assert_eq!(value("rabbitmq_global_messages_received_total"), 3.0);
    assert_eq!(value("rabbitmq_global_messages_confirmed_total"), 3.0);
    assert_eq!(value("rabbitmq_global_messages_delivered_total"), 3.0);
    assert_eq!(value("rabbitmq_global_messages_acknowledged_total"), 1.0);
    // rabbitmq_prometheus's churn counters: two connections and two channels opened.
    assert_eq!(value("rabbitmq_connections_opened_total"), 2.0);
    assert_eq!(value("rabbitmq_connections_closed_total"), 0.0);
    assert_eq!(value("rabbitmq_channels_opened_total"), 2.0);
    assert!(value("rabbitmq_queues_declared_total") >= value("rabbitmq_queues_created_total"));

    // Closed over HTTP: the client gets 320 with the X-Reason text.
    let resp = within(
        "DELETE",
        h.client
            .delete(format!("{}/api/connections/{}", h.base, seg(&conn_name)))
            .basic_auth("admin", Some("admin-pw"))
            .header("X-Reason", "maintenance window")
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let (code, text) = forced_close(&mut a_events).await;
    assert_eq!(
        (code, text.as_str()),
        (320, "CONNECTION_FORCED - maintenance window")
    );
    let conns = h
        .wait_for("/api/connections", |v| {
            v.as_array().is_some_and(|a| a.len() == 1)
        })
        .await;
    assert_ne!(conns[0]["name"], conn_name.as_str());
    // Its unacknowledged deliveries went back to the queue; counts stay in the vhost's.
    h.wait_ready("work", 2).await;
    let v = h.get("/api/vhosts/%2F").await;
    assert_eq!(v["message_stats"]["deliver_get"], 3, "{v}");
    // The other connection works on; an unknown name is 404.
    within(
        "publish",
        bch.basic_publish(
            "".into(),
            "work".into(),
            BasicPublishOptions::default(),
            b"after",
            BasicProperties::default(),
        ),
    )
    .await
    .unwrap();
    let (s, _, _) = h
        .call(Method::DELETE, "/api/connections/nope", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    h.stop().await;
}

/// As RabbitMQ: a management user sees only their own connections and channels and may not
/// read or close another user's; monitoring users see all; consumers are listed for the
/// vhosts a user may use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_lists_show_what_the_user_may_see() {
    let h = Http::start().await;
    let admin = h.amqp().await;
    let mine = h.amqp_as("mgmt", "%2f").await;
    let _ach = within("channel", admin.create_channel()).await.unwrap();
    let _mch = within("channel", mine.create_channel()).await.unwrap();
    h.wait_for("/api/channels", |v| {
        v.as_array().is_some_and(|a| a.len() == 2)
    })
    .await;
    let (s, _, v) = h
        .call(Method::GET, "/api/connections", Some("mgmt"), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v[0]["user"], "mgmt");
    let (_, _, v) = h
        .call(Method::GET, "/api/channels", Some("mgmt"), None)
        .await;
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v[0]["user"], "mgmt");
    let (_, _, v) = h
        .call(Method::GET, "/api/connections", Some("mon"), None)
        .await;
    assert_eq!(v.as_array().unwrap().len(), 2, "{v}");
    let all = h.get("/api/connections").await;
    let theirs = all
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["user"] == "admin")
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let not_yours =
        json!({"error": "not_authorised", "reason": "User not authorised to access object"});
    for method in [Method::GET, Method::DELETE] {
        let (s, _, v) = h
            .call(
                method.clone(),
                &format!("/api/connections/{}", seg(&theirs)),
                Some("mgmt"),
                None,
            )
            .await;
        assert_eq!(
            (s, v),
            (StatusCode::UNAUTHORIZED, not_yours.clone()),
            "{method}"
        );
    }
    // Still open: the refused DELETE closed nothing.
    assert_eq!(h.get("/api/connections").await.as_array().unwrap().len(), 2);
    // A vhost the user has no permissions in is refused.
    let broker = &h.broker.as_ref().unwrap().state().broker;
    broker.add_vhost("private");
    broker
        .access_mut()
        .put_vhost(warren_broker::access::VhostRecord::new("private"));
    let (s, _, _) = h
        .call(
            Method::GET,
            "/api/vhosts/private/connections",
            Some("mgmt"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // Consumers of a vhost: any management user may ask, and sees its own (none there).
    let (s, _, v) = h
        .call(Method::GET, "/api/consumers/private", Some("mgmt"), None)
        .await;
    assert_eq!((s, v), (StatusCode::OK, json!([])));
    h.stop().await;
}

/// PUT and DELETE on vhosts, users, permissions and topic permissions: administrators only,
/// RabbitMQ's status codes; a user and a vhost created over HTTP are used over AMQP at once;
/// deleting the vhost closes its connections with 320 (a consumer connected) and removes its
/// queues; deleting a user closes the user's connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vhosts_users_and_permissions_change_at_run_time() {
    use lapin::options::BasicConsumeOptions;
    let h = Http::start().await;
    let put = |path: &'static str, who: &'static str, body: Value| {
        let h = &h;
        async move { h.call(Method::PUT, path, Some(who), Some(body)).await }
    };
    // Administrators only.
    let (s, _, v) = put("/api/vhosts/v1", "mgmt", json!({})).await;
    assert_eq!(
        (s, v),
        (
            StatusCode::UNAUTHORIZED,
            json!({"error": "not_authorised", "reason": "Not administrator user"})
        )
    );
    let (s, _, _) = put("/api/vhosts/v1", "admin", json!({"description": "first"})).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _, _) = put("/api/vhosts/v1", "admin", json!({"description": "again"})).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, _) = put(
        "/api/users/app",
        "admin",
        json!({"password": "app-pw", "tags": "management"}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    // Without a password, as RabbitMQ allows: the user exists but cannot log in with one.
    let (s, _, v) = put("/api/users/nopw", "admin", json!({"tags": "management"})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, _, _) = h.call(Method::GET, "/api/whoami", Some("nopw"), None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _, _) = put(
        "/api/permissions/v1/app",
        "admin",
        json!({"configure": ".*", "write": ".*", "read": ".*"}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    // RabbitMQ's answer for a user that does not exist.
    let (s, _, v) = put(
        "/api/permissions/v1/ghost",
        "admin",
        json!({"configure": ".*", "write": ".*", "read": ".*"}),
    )
    .await;
    assert_eq!(
        (s, v),
        (
            StatusCode::BAD_REQUEST,
            json!({"error": "bad_request", "reason": "vhost_or_user_not_found"})
        )
    );
    let (s, _, v) = put(
        "/api/topic-permissions/v1/app",
        "admin",
        json!({"exchange": "amq.topic", "write": "^app\\.", "read": ".*"}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(
        h.get("/api/topic-permissions").await,
        json!([{"user": "app", "vhost": "v1", "exchange": "amq.topic", "write": "^app\\.", "read": ".*"}])
    );
    let u = h.get("/api/users/app").await;
    assert_eq!(u["tags"], json!(["management"]));
    assert_eq!(u["hashing_algorithm"], "rabbit_password_hashing_sha256");

    // The new user works in the new vhost over AMQP; a consumer stays connected.
    let conn = h.amqp_as("app", "v1").await;
    let mut events = conn.events_listener();
    let ch = within("channel", conn.create_channel()).await.unwrap();
    within(
        "declare",
        ch.queue_declare(
            "jobs".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    let _consumer = within(
        "consume",
        ch.basic_consume(
            "jobs".into(),
            "c1".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    h.wait_for("/api/consumers/v1", |v| {
        v.as_array().is_some_and(|a| a.len() == 1)
    })
    .await;
    // The user sees their own connection in the vhost.
    let (_, _, v) = h
        .call(Method::GET, "/api/vhosts/v1/connections", Some("app"), None)
        .await;
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");

    // Deleting the vhost closes the consumer's connection with 320 and drops its queues.
    let (s, _, _) = h
        .call(Method::DELETE, "/api/vhosts/v1", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (code, text) = forced_close(&mut events).await;
    assert_eq!(
        (code, text.as_str()),
        (320, "CONNECTION_FORCED - vhost 'v1' is deleted")
    );
    for path in ["/api/vhosts/v1", "/api/queues/v1", "/api/queues/v1/jobs"] {
        let (s, _, _) = h.call(Method::GET, path, Some("admin"), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
    }
    let (s, _, _) = h
        .call(Method::DELETE, "/api/vhosts/v1", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    h.wait_for("/api/connections", |v| {
        v.as_array().is_some_and(|a| a.is_empty())
    })
    .await;
    assert!(h
        .get("/api/topic-permissions")
        .await
        .as_array()
        .unwrap()
        .is_empty());

    // Deleting a user closes that user's connections.
    let (s, _, _) = put(
        "/api/permissions/%2F/app",
        "admin",
        json!({"configure": ".*", "write": ".*", "read": ".*"}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let conn = h.amqp_as("app", "%2f").await;
    let mut events = conn.events_listener();
    let (s, _, _) = h
        .call(Method::DELETE, "/api/users/app", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (code, text) = forced_close(&mut events).await;
    assert_eq!(
        (code, text.as_str()),
        (320, "CONNECTION_FORCED - user 'app' is deleted")
    );
    let (s, _, _) = h
        .call(Method::GET, "/api/users/app", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, _) = h
        .call(
            Method::DELETE,
            "/api/permissions/%2F/mgmt",
            Some("admin"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, _) = h
        .call(
            Method::DELETE,
            "/api/permissions/%2F/mgmt",
            Some("admin"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    h.stop().await;
}

/// Users, vhosts and permissions created over HTTP survive a restart; a vhost deleted over
/// HTTP stays deleted with its durable queues and stored messages; the configuration's
/// users are still applied on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_users_and_vhosts_survive_a_restart() {
    use lapin::options::QueueDeclareOptions as QOpts;
    let dir = std::env::temp_dir().join(format!("warren-mgmt-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let h = Http::start_in(Some(dir.clone())).await;
    for (path, body) in [
        ("/api/vhosts/kept", json!({})),
        ("/api/vhosts/gone", json!({})),
        (
            "/api/users/ops",
            json!({"password": "ops-pw", "tags": ["administrator"]}),
        ),
        (
            "/api/permissions/kept/ops",
            json!({"configure": ".*", "write": ".*", "read": ".*"}),
        ),
        (
            "/api/permissions/gone/ops",
            json!({"configure": ".*", "write": ".*", "read": ".*"}),
        ),
    ] {
        let (s, _, v) = h.call(Method::PUT, path, Some("admin"), Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{path}: {v}");
    }
    // A durable queue with a persistent message in the vhost about to go.
    let conn = h.amqp_as("ops", "gone").await;
    let ch = confirm_channel(&conn).await;
    within(
        "declare",
        ch.queue_declare(
            "orders".into(),
            QOpts {
                durable: true,
                ..QOpts::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    within("publish", async {
        ch.basic_publish(
            "".into(),
            "orders".into(),
            BasicPublishOptions::default(),
            b"kept?",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?
        .await
    })
    .await
    .unwrap();
    let (s, _, _) = h
        .call(Method::DELETE, "/api/vhosts/gone", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    // A vhost created again under the old name starts empty.
    let (s, _, _) = h
        .call(
            Method::PUT,
            "/api/vhosts/gone",
            Some("admin"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _, _) = h
        .call(Method::GET, "/api/queues/gone/orders", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _, _) = h
        .call(Method::DELETE, "/api/vhosts/gone", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    drop(conn);
    h.stop().await;

    let h = Http::start_in(Some(dir.clone())).await;
    let (s, _, v) = h.call(Method::GET, "/api/whoami", Some("ops"), None).await;
    assert_eq!(
        (s, v),
        (
            StatusCode::OK,
            json!({"name": "ops", "tags": ["administrator"], "is_internal_user": true})
        )
    );
    assert_eq!(h.get("/api/vhosts/kept").await["name"], "kept");
    let (s, _, _) = h
        .call(Method::GET, "/api/vhosts/gone", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let perms = h.get("/api/permissions/kept/ops").await;
    assert_eq!(perms["configure"], ".*");
    // The configuration's users are there too, with their permissions on `/`.
    assert_eq!(h.get("/api/users/mgmt").await["name"], "mgmt");
    let conn = h.amqp_as("ops", "kept").await;
    within("close", conn.close(200, "bye".into()))
        .await
        .unwrap();
    h.stop().await;
    // Nothing of the deleted vhost was left in the data directory.
    let leftovers: Vec<String> = std::fs::read_dir(dir.join("definitions"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let gone_stem = format!(
        "vhost-{}.",
        "gone"
            .bytes()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    assert!(
        leftovers.iter().all(|f| !f.starts_with(&gone_stem)),
        "{leftovers:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads from `s` until the server closes it (EOF or reset), within the bounded wait.
async fn closed_by_server(s: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    loop {
        match within("server closes the socket", s.read(&mut buf)).await {
            Ok(0) | Err(_) => return,
            Ok(_) => continue,
        }
    }
}

/// The management listener holds at most `max_connections` sockets (one more is closed at
/// once), closes idle ones after `idle_timeout` and slow senders of headers after
/// `request_timeout`; a normal request goes through afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn management_listener_is_bounded() {
    use tokio::io::AsyncWriteExt;
    let h = Http::start_with(|c| {
        c.management.max_connections = 3;
        c.management.idle_timeout = 1;
        c.management.request_timeout = 1;
    })
    .await;
    let addr = h.broker.as_ref().unwrap().management_addrs()[0];
    let connect = || async move {
        within("connect", tokio::net::TcpStream::connect(addr))
            .await
            .expect("TCP connect")
    };
    // Three idle sockets fill the listener: the fourth is closed as soon as it is accepted
    // (before any idle timeout could apply to it: it sends a request and gets no answer).
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(connect().await);
    }
    let mut extra = connect().await;
    let _ = extra
        .write_all(b"GET /api/overview HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    closed_by_server(&mut extra).await;
    // The idle ones are closed after idle_timeout.
    for s in &mut idle {
        closed_by_server(s).await;
    }
    // A client sending a header byte now and then is never idle, but is cut off.
    let mut slow = connect().await;
    slow.write_all(b"GET /api/overview HTTP/1.1\r\n")
        .await
        .unwrap();
    let dripping = async {
        for _ in 0..100 {
            if slow.write_all(b"X").await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        panic!("a slow header sender was never cut off");
    };
    within("slow sender cut off", dripping).await;
    // Slots are free again: a normal request is served.
    let (s, _, _) = h
        .call(Method::GET, "/api/overview", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    h.stop().await;
}

/// A new connection that sends nothing is closed after `request_timeout` (at most 10 s),
/// not the long idle timeout of a kept-alive one: silent sockets cannot hold the listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_new_management_connections_are_closed_early() {
    let h = Http::start_with(|c| {
        c.management.idle_timeout = 600;
        c.management.request_timeout = 1;
    })
    .await;
    let addr = h.broker.as_ref().unwrap().management_addrs()[0];
    let mut silent = within("connect", tokio::net::TcpStream::connect(addr))
        .await
        .expect("TCP connect");
    let started = std::time::Instant::now();
    closed_by_server(&mut silent).await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "closed after {:?}",
        started.elapsed()
    );
    h.stop().await;
}

/// A vhost created over HTTP gives its creator full permissions on it (RabbitMQ's
/// rabbit_vhost:put_vhost), so that the creator can use it at once; an unknown
/// default_queue_type is refused.
#[tokio::test]
async fn a_new_vhost_is_usable_by_its_creator() {
    let h = Http::start().await;
    let (s, _, _) = h
        .call(
            Method::PUT,
            "/api/vhosts/made",
            Some("admin"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _, p) = h
        .call(
            Method::GET,
            "/api/permissions/made/admin",
            Some("admin"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{p}");
    assert_eq!(p["configure"], ".*");
    assert_eq!(p["write"], ".*");
    assert_eq!(p["read"], ".*");
    let (s, _, v) = h
        .call(
            Method::PUT,
            "/api/queues/made/q1",
            Some("admin"),
            Some(json!({"durable": true})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, _, v) = h
        .call(
            Method::PUT,
            "/api/vhosts/bogus",
            Some("admin"),
            Some(json!({"default_queue_type": "bogus"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    h.stop().await;
}

/// An import over HTTP with a binding to a quorum queue declared in the same file works, and
/// a stream queue (a type Warren lacks) is left out with its bindings instead of failing the
/// file.
#[tokio::test]
async fn imports_bind_quorum_queues_and_leave_out_streams_with_their_bindings() {
    let h = Http::start().await;
    let defs = json!({
        "queues": [
            {"name": "orders", "vhost": "/", "durable": true, "auto_delete": false,
             "arguments": {"x-queue-type": "quorum"}},
            {"name": "events", "vhost": "/", "durable": true, "auto_delete": false,
             "arguments": {"x-queue-type": "stream"}}
        ],
        "exchanges": [
            {"name": "ox", "vhost": "/", "type": "direct", "durable": true,
             "auto_delete": false, "internal": false, "arguments": {}}
        ],
        "bindings": [
            {"source": "ox", "vhost": "/", "destination": "orders",
             "destination_type": "queue", "routing_key": "o", "arguments": {}},
            {"source": "ox", "vhost": "/", "destination": "events",
             "destination_type": "queue", "routing_key": "e", "arguments": {}}
        ]
    });
    let (s, _, v) = h
        .call(Method::POST, "/api/definitions", Some("admin"), Some(defs))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let (s, _, q) = h
        .call(Method::GET, "/api/queues/%2F/orders", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{q}");
    assert_eq!(q["type"], "quorum");
    let (_, _, b) = h
        .call(
            Method::GET,
            "/api/bindings/%2F/e/ox/q/orders",
            Some("admin"),
            None,
        )
        .await;
    assert_eq!(b.as_array().map(Vec::len), Some(1), "{b}");
    let (s, _, _) = h
        .call(Method::GET, "/api/queues/%2F/events", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    h.stop().await;
}

/// Request bodies up to RabbitMQ's default `management.http.max_body_size` (20 MB) are read:
/// a 3 MB definitions file imports; a larger body than that is refused with 413.
#[tokio::test]
async fn large_definitions_files_import() {
    let h = Http::start().await;
    let defs = json!({
        "vhosts": [{"name": "big", "description": "d".repeat(3_000_000)}]
    });
    let (s, _, v) = h
        .call(Method::POST, "/api/definitions", Some("admin"), Some(defs))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let too_big = json!({"vhosts": [{"name": "huge", "description": "d".repeat(21_000_000)}]});
    let (s, _, _) = h
        .call(
            Method::POST,
            "/api/definitions",
            Some("admin"),
            Some(too_big),
        )
        .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    h.stop().await;
}

/// A vhost's `default_queue_type` quorum makes a new durable, non-exclusive queue declared
/// without `x-queue-type` a quorum queue, as RabbitMQ 4; a transient one stays classic.
#[tokio::test]
async fn the_vhost_default_queue_type_applies_to_new_queues() {
    let h = Http::start().await;
    let (s, _, _) = h
        .call(
            Method::PUT,
            "/api/vhosts/prod",
            Some("admin"),
            Some(json!({"default_queue_type": "quorum"})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    for (name, durable, kind) in [("dq", true, "quorum"), ("tq", false, "classic")] {
        let (s, _, v) = h
            .call(
                Method::PUT,
                &format!("/api/queues/prod/{name}"),
                Some("admin"),
                Some(json!({"durable": durable})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        let (_, _, q) = h
            .call(
                Method::GET,
                &format!("/api/queues/prod/{name}"),
                Some("admin"),
                None,
            )
            .await;
        assert_eq!(q["type"], kind, "{name}: {q}");
    }
    // Declaring it again the same way is not an inequivalent x-queue-type.
    let (s, _, v) = h
        .call(
            Method::PUT,
            "/api/queues/prod/dq",
            Some("admin"),
            Some(json!({"durable": true})),
        )
        .await;
    assert!(s.is_success(), "{s} {v}");
    h.stop().await;
}

/// The parts of an export an import must reproduce (sorted, without version fields and
/// password hashes: the configuration's users get fresh salts at every start).
fn topology(defs: &Value) -> Vec<(String, Vec<String>)> {
    [
        "users",
        "vhosts",
        "permissions",
        "topic_permissions",
        "policies",
        "queues",
        "exchanges",
        "bindings",
    ]
    .iter()
    .map(|k| {
        let mut items: Vec<String> = defs[*k]
            .as_array()
            .unwrap_or_else(|| panic!("{k} in {defs}"))
            .iter()
            .map(|o| {
                let mut o = o.clone();
                if let Some(m) = o.as_object_mut() {
                    m.remove("password_hash");
                }
                o.to_string()
            })
            .collect();
        items.sort();
        (k.to_string(), items)
    })
    .collect()
}

/// Checks that what `export_then_import` put into a broker is there: the queue with its
/// arguments, the binding, the user, the policy, and a login over AMQP with the imported
/// password hash.
async fn imported_objects_are_there(h: &Http) {
    let q = h.get("/api/queues/imp/iq").await;
    assert_eq!(
        (q["durable"].clone(), q["arguments"]["x-max-length"].clone()),
        (json!(true), json!(7))
    );
    assert_eq!(q["policy"], "imp-ttl", "{q}");
    let b = h.get("/api/bindings/imp/e/ix/q/iq").await;
    assert_eq!(b[0]["routing_key"], "k.#", "{b}");
    let u = h.get("/api/users/importer").await;
    assert_eq!(u["tags"], json!(["management"]), "{u}");
    let p = h.get("/api/policies/imp/imp-ttl").await;
    assert_eq!(p["definition"], json!({"message-ttl": 60000}), "{p}");
    let t = h.get("/api/topic-permissions/imp/importer").await;
    assert_eq!(t[0]["write"], "^k\\.", "{t}");
    let conn = h.amqp_as("importer", "imp").await;
    within("close", conn.close(200, "bye".into()))
        .await
        .unwrap();
}

/// `GET /api/definitions` from one broker, `POST /api/definitions` into a fresh one with a
/// data directory: 204, everything there (a user logs in over AMQP with its imported
/// password hash), importing again changes nothing, and it all survives a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_import_over_http_round_trips_and_survives_restart() {
    let a = Http::start().await;
    for (method, path, body) in [
        (
            Method::PUT,
            "/api/vhosts/imp",
            json!({"description": "imported"}),
        ),
        (
            Method::PUT,
            "/api/permissions/imp/admin",
            json!({"configure": ".*", "write": ".*", "read": ".*"}),
        ),
        (
            Method::PUT,
            "/api/users/importer",
            json!({"password": "importer-pw", "tags": "management"}),
        ),
        (
            Method::PUT,
            "/api/permissions/imp/importer",
            json!({"configure": ".*", "write": ".*", "read": ".*"}),
        ),
        (
            Method::PUT,
            "/api/topic-permissions/imp/importer",
            json!({"exchange": "ix", "write": "^k\\.", "read": ".*"}),
        ),
        (
            Method::PUT,
            "/api/queues/imp/iq",
            json!({"durable": true, "arguments": {"x-max-length": 7}}),
        ),
        (
            Method::PUT,
            "/api/exchanges/imp/ix",
            json!({"type": "topic", "durable": true}),
        ),
        (
            Method::POST,
            "/api/bindings/imp/e/ix/q/iq",
            json!({"routing_key": "k.#"}),
        ),
        (
            Method::PUT,
            "/api/policies/imp/imp-ttl",
            json!({"pattern": "^i", "apply-to": "queues", "definition": {"message-ttl": 60000}}),
        ),
    ] {
        let (s, _, v) = a.call(method, path, Some("admin"), Some(body)).await;
        assert!(s.is_success(), "{path}: {s} {v}");
    }
    let exported = a.get("/api/definitions").await;
    a.stop().await;

    let dir = std::env::temp_dir().join(format!("warren-defs-import-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let b = Http::start_in(Some(dir.clone())).await;
    let (s, _, v) = b
        .call(Method::GET, "/api/queues/imp/iq", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (s, _, v) = b
        .call(
            Method::POST,
            "/api/definitions",
            Some("admin"),
            Some(exported.clone()),
        )
        .await;
    assert_eq!((s, v), (StatusCode::NO_CONTENT, Value::Null));
    imported_objects_are_there(&b).await;
    let first = b.get("/api/definitions").await;
    assert_eq!(topology(&first), topology(&exported));
    // Idempotent: the same file again changes nothing.
    let (s, _, _) = b
        .call(
            Method::POST,
            "/api/definitions",
            Some("admin"),
            Some(exported.clone()),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(topology(&b.get("/api/definitions").await), topology(&first));
    b.stop().await;

    let b = Http::start_in(Some(dir.clone())).await;
    imported_objects_are_there(&b).await;
    assert_eq!(topology(&b.get("/api/definitions").await), topology(&first));
    b.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file that cannot be imported whole is refused with 400 and its reason, and nothing of
/// it is applied; only administrators may import (401 "Not administrator user").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_import_refuses_bad_files_and_non_administrators() {
    let h = Http::start().await;
    let before = topology(&h.get("/api/definitions").await);
    let partly_good = |binding_to: &str, exchange_type: &str| {
        json!({
            "users": [{"name": "newuser", "password_hash": "", "tags": []}],
            "vhosts": [{"name": "newvh"}],
            "permissions": [{"user": "newuser", "vhost": "newvh",
                "configure": ".*", "write": ".*", "read": ".*"}],
            "queues": [{"name": "nq", "vhost": "newvh", "durable": true,
                "auto_delete": false, "arguments": {}}],
            "exchanges": [{"name": "nx", "vhost": "newvh", "type": exchange_type,
                "durable": true, "auto_delete": false, "internal": false, "arguments": {}}],
            "bindings": [{"source": "nx", "vhost": "newvh", "destination": binding_to,
                "destination_type": "queue", "routing_key": "", "arguments": {}}],
        })
    };
    let cases = [
        (
            partly_good("missing", "direct"),
            "binding of 'nx' to 'missing' with key '' in vhost 'newvh': no queue 'missing'",
        ),
        (
            partly_good("nq", "x-nope"),
            "exchange 'nx' in vhost 'newvh': unknown exchange type 'x-nope'",
        ),
        (
            json!({"permissions": [{"user": "nobody", "vhost": "/",
                "configure": ".*", "write": ".*", "read": ".*"}]}),
            "permissions of 'nobody' in vhost '/'",
        ),
        (
            json!({"vhosts": [{"name": "newvh"}], "policies": [{"name": "p", "vhost": "newvh",
                "pattern": "^", "apply-to": "queues", "priority": 0,
                "definition": {"no-such-key": 1}}]}),
            "policy 'p' in vhost 'newvh'",
        ),
    ];
    for (file, reason) in cases {
        let (s, _, v) = h
            .call(Method::POST, "/api/definitions", Some("admin"), Some(file))
            .await;
        assert_eq!(
            (s, &v["error"]),
            (StatusCode::BAD_REQUEST, &json!("bad_request")),
            "{v}"
        );
        let got = v["reason"].as_str().unwrap_or_default();
        assert!(
            got.starts_with(reason),
            "{got:?} should start with {reason:?}"
        );
    }
    for body in [&b"{not json"[..], b"[1, 2]", b""] {
        let (s, v) = h
            .post_raw(
                "/api/definitions",
                "admin",
                "application/json",
                body.to_vec(),
            )
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    }
    assert_eq!(topology(&h.get("/api/definitions").await), before);
    let (s, _, _) = h
        .call(Method::GET, "/api/vhosts/newvh", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    let good = json!({"vhosts": [{"name": "bynonadmin"}]});
    for (who, reason) in [
        ("mon", "Not administrator user"),
        ("mgmt", "Not administrator user"),
        ("plain", "Not management user"),
    ] {
        for path in ["/api/definitions", "/api/definitions/%2F"] {
            let (s, _, v) = h
                .call(Method::POST, path, Some(who), Some(good.clone()))
                .await;
            assert_eq!(
                (s, v),
                (
                    StatusCode::UNAUTHORIZED,
                    json!({"error": "not_authorised", "reason": reason})
                ),
                "{who} {path}"
            );
        }
    }
    let (s, _, _) = h
        .call(Method::GET, "/api/vhosts/bynonadmin", Some("admin"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    h.stop().await;
}

const RABBITMQ_3_10_8_EXPORT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../warren-broker/tests/fixtures/definitions-rabbitmq-3.10.8.json"
);

/// RabbitMQ 3.10.8's `rabbitmqctl export_definitions` file imports over HTTP as a JSON body
/// (twice: no change); a vhost's export (`GET /api/definitions/{vhost}`)
/// imports into another vhost (`POST /api/definitions/{vhost}`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_export_imports_over_http_as_json() {
    let h = Http::start().await;
    let file = std::fs::read(RABBITMQ_3_10_8_EXPORT).unwrap();
    let (s, v) = h
        .post_raw(
            "/api/definitions",
            "admin",
            "application/json",
            file.clone(),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let app = h.get("/api/users/app").await;
    assert_eq!(app["tags"], json!(["monitoring", "policymaker"]), "{app}");
    assert_eq!(h.get("/api/vhosts/staging").await["name"], "staging");
    let audit = h.get("/api/queues/staging/app.audit").await;
    assert_eq!(audit["policy"], "app-ttl", "{audit}");
    let b = h
        .get("/api/bindings/staging/e/app.events/q/app.orders")
        .await;
    assert_eq!(b[0]["routing_key"], "orders.#", "{b}");
    let once = topology(&h.get("/api/definitions").await);

    // The same file again changes nothing, as a JSON body or as the `file` part of a
    // form upload (RabbitMQ's web UI, `curl -F file=@defs.json`); with a `redirect` part
    // the reply is 303 to it.
    let (s, v) = h
        .post_raw(
            "/api/definitions",
            "admin",
            "application/json",
            file.clone(),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    assert_eq!(topology(&h.get("/api/definitions").await), once);
    let form = |parts: &[(&str, &[u8])]| {
        let mut body = Vec::new();
        for (name, value) in parts {
            body.extend_from_slice(
                format!(
                    "--b0undary\r\nContent-Disposition: form-data; name=\"{name}\"; \
                     filename=\"{name}.json\"\r\n\r\n"
                )
                .as_bytes(),
            );
            body.extend_from_slice(value);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(b"--b0undary--\r\n");
        body
    };
    let multipart = "multipart/form-data; boundary=b0undary";
    let (s, v) = h
        .post_raw(
            "/api/definitions",
            "admin",
            multipart,
            form(&[("file", &file)]),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    assert_eq!(topology(&h.get("/api/definitions").await), once);
    let r = within(
        "form upload with redirect",
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
            .post(format!("{}/api/definitions", h.base))
            .basic_auth("admin", Some("admin-pw"))
            .header(reqwest::header::CONTENT_TYPE, multipart)
            .body(form(&[("file", &file), ("redirect", b"../#/")]))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "../#/");
    let (s, v) = h
        .post_raw(
            "/api/definitions",
            "admin",
            multipart,
            form(&[("other", b"{}")]),
        )
        .await;
    assert_eq!(
        (s, v),
        (
            StatusCode::BAD_REQUEST,
            json!({"error": "bad_request",
                   "reason": "no part named file in the multipart/form-data upload"})
        )
    );

    // One vhost's definitions, into another vhost.
    let staging = h.get("/api/definitions/staging").await;
    assert!(staging.get("users").is_none(), "{staging}");
    assert!(staging["queues"]
        .as_array()
        .unwrap()
        .iter()
        .all(|q| q.get("vhost").is_none() && q["name"].is_string()));
    let (s, _, v) = h
        .call(
            Method::POST,
            "/api/definitions/copy",
            Some("admin"),
            Some(staging.clone()),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "no vhost 'copy' yet: {v}");
    h.call(
        Method::PUT,
        "/api/vhosts/copy",
        Some("admin"),
        Some(json!({})),
    )
    .await;
    let (s, _, v) = h
        .call(
            Method::POST,
            "/api/definitions/copy",
            Some("admin"),
            Some(staging.clone()),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    let copy = h.get("/api/definitions/copy").await;
    for k in ["queues", "exchanges", "bindings", "policies"] {
        let sorted = |d: &Value| {
            let mut v: Vec<String> = d[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.to_string())
                .collect();
            v.sort();
            v
        };
        assert_eq!(sorted(&copy), sorted(&staging), "{k}");
    }
    h.stop().await;
}

/// Reads `v[path...]` as f64 (`NaN` when missing).
fn num(v: &Value, path: &[&str]) -> f64 {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64().unwrap_or(f64::NAN)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_rates_follow_a_paced_publisher() {
    // Samples every 200 ms instead of RabbitMQ's 5 s, so that the test sees rates quickly.
    let h = Http::start_with(|c| c.management.collect_statistics_interval = 200).await;
    let (s, _, node) = h.call(Method::GET, "/api/nodes", Some("admin"), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(node[0]["rates_mode"], "basic");
    assert_eq!(h.get("/api/overview").await["rates_mode"], "basic");
    let conn = h.amqp().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    within(
        "declare",
        ch.queue_declare(
            "paced".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    let empty = h.get("/api/queues/%2F/paced").await;
    let base_memory = empty["memory"].as_u64().expect("memory");
    assert!(base_memory > 0, "{empty}");
    // 20 messages every 50 ms: 400 messages a second, until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let publisher = {
        let stop = stop.clone();
        let ch = ch.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(50));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tick.tick().await;
                for _ in 0..20 {
                    ch.basic_publish(
                        "".into(),
                        "paced".into(),
                        BasicPublishOptions::default(),
                        &[0u8; 100],
                        BasicProperties::default(),
                    )
                    .await
                    .unwrap();
                }
            }
        })
    };
    // Wide bounds around 400/s: the rate is over one 200 ms sample interval.
    let in_range = |r: f64| (150.0..=1000.0).contains(&r);
    let q = h
        .wait_for("/api/queues/%2F/paced", |v| {
            in_range(num(v, &["message_stats", "publish_details", "rate"]))
                && in_range(num(v, &["messages_ready_details", "rate"]))
                && in_range(num(v, &["messages_details", "rate"]))
        })
        .await;
    assert_eq!(
        num(&q, &["messages_unacknowledged_details", "rate"]),
        0.0,
        "{q}"
    );
    assert_eq!(num(&q, &["message_stats", "ack_details", "rate"]), 0.0);
    h.wait_for("/api/overview", |v| {
        in_range(num(v, &["message_stats", "publish_details", "rate"]))
            && in_range(num(v, &["queue_totals", "messages_ready_details", "rate"]))
    })
    .await;
    h.wait_for("/api/vhosts/%2F", |v| {
        in_range(num(v, &["message_stats", "publish_details", "rate"]))
            && in_range(num(v, &["messages_details", "rate"]))
    })
    .await;
    h.wait_for("/api/channels", |v| {
        v.as_array().is_some_and(|a| {
            a.iter()
                .any(|c| in_range(num(c, &["message_stats", "publish_details", "rate"])))
        })
    })
    .await;
    // The default exchange: every message in, and out to one queue.
    h.wait_for("/api/exchanges/%2F/amq.default", |v| {
        in_range(num(v, &["message_stats", "publish_in_details", "rate"]))
            && in_range(num(v, &["message_stats", "publish_out_details", "rate"]))
    })
    .await;
    // A range: one sample a second over the last 10 s, newest first, counts not falling.
    let ranged = h
        .wait_for(
            "/api/queues/%2F/paced?msg_rates_age=10&msg_rates_incr=1&lengths_age=10&lengths_incr=1",
            |v| {
                v["message_stats"]["publish_details"]["samples"]
                    .as_array()
                    .is_some_and(|s| s.len() >= 3)
            },
        )
        .await;
    let samples = ranged["message_stats"]["publish_details"]["samples"]
        .as_array()
        .expect("samples")
        .clone();
    assert!(samples.len() >= 2, "{ranged}");
    for w in samples.windows(2) {
        assert!(
            w[0]["sample"].as_u64() >= w[1]["sample"].as_u64(),
            "{ranged}"
        );
        assert_eq!(
            w[0]["timestamp"].as_u64().unwrap() - w[1]["timestamp"].as_u64().unwrap(),
            1000
        );
    }
    assert!(ranged["message_stats"]["publish_details"]["avg_rate"].is_number());
    assert!(ranged["messages_ready_details"]["samples"].is_array());
    let (s, _, bad) = h
        .call(
            Method::GET,
            "/api/queues/%2F/paced?msg_rates_age=1000&msg_rates_incr=1",
            Some("admin"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(
        bad,
        json!({"error": "invalid_range_parameters",
               "reason": "Invalid range parameters: age 1000, incr 1"})
    );
    // The queue holds its ready messages in memory: at least their bodies.
    let ready = q["messages_ready"].as_u64().unwrap();
    assert!(
        q["memory"].as_u64().unwrap() >= base_memory + ready * 100,
        "{q}"
    );
    // Once the publisher stops, the rates fall back to zero (no new counts, then stale).
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    publisher.await.unwrap();
    h.wait_for("/api/queues/%2F/paced", |v| {
        num(v, &["message_stats", "publish_details", "rate"]) == 0.0
            && num(v, &["messages_ready_details", "rate"]) == 0.0
    })
    .await;
    // Consumed without acknowledgements: the queue's deliveries follow.
    let mut consumer = within(
        "consume",
        ch.basic_consume(
            "paced".into(),
            "c".into(),
            lapin::options::BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    use futures_util::StreamExt;
    let drained = ready;
    let mut got = 0;
    while got < drained {
        within("delivery", consumer.next()).await.unwrap().unwrap();
        got += 1;
    }
    let q = h.get("/api/queues/%2F/paced").await;
    assert!(num(&q, &["message_stats", "deliver_get"]) >= drained as f64);
    assert!(q["message_stats"]["deliver_get_details"]["rate"].is_number());
    h.stop().await;
}

/// Runtime parameters as a RabbitMQ 4.x node without shovel or federation: vhost-limits
/// (the vhost's limits), operator policies, global parameters; RabbitMQ's validation texts
/// and tag rules; durable, exported and imported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_parameters_as_rabbitmq() {
    let dir = std::env::temp_dir().join(format!("warren-mgmt-params-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let h = Http::start_in(Some(dir.clone())).await;
    let call = |m: Method, path: &'static str, who: &'static str, body: Option<Value>| {
        let h = &h;
        async move { h.call(m, path, Some(who), body).await }
    };
    assert_eq!(h.get("/api/parameters").await, json!([]));
    assert_eq!(h.get("/api/global-parameters").await, json!([]));
    // A policymaker with access to `/`.
    for (path, body) in [
        (
            "/api/users/pm",
            json!({"password": "pm-pw", "tags": "policymaker"}),
        ),
        (
            "/api/permissions/%2F/pm",
            json!({"configure": ".*", "write": ".*", "read": ".*"}),
        ),
    ] {
        let (s, _, v) = h.call(Method::PUT, path, Some("admin"), Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{path}: {v}");
    }
    let limits = json!({"value": {"max-queues": 5, "max-connections": 10}});
    let (s, _, v) = call(
        Method::PUT,
        "/api/parameters/vhost-limits/%2F/limits",
        "pm",
        Some(limits.clone()),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, _, _) = call(
        Method::PUT,
        "/api/parameters/vhost-limits/%2F/limits",
        "admin",
        Some(limits),
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let one = json!({"vhost": "/", "component": "vhost-limits", "name": "limits",
                     "value": {"max-connections": 10, "max-queues": 5}});
    assert_eq!(h.get("/api/parameters/vhost-limits/%2F/limits").await, one);
    assert_eq!(h.get("/api/parameters").await, json!([one.clone()]));
    assert_eq!(
        h.get("/api/parameters/vhost-limits").await,
        json!([one.clone()])
    );
    assert_eq!(
        h.get("/api/parameters/vhost-limits/%2F").await,
        json!([one.clone()])
    );
    assert_eq!(h.get("/api/parameters/shovel").await, json!([]));
    // The limit is in force: a queue limit of 0 refuses a new queue.
    let (s, _, _) = call(
        Method::PUT,
        "/api/parameters/vhost-limits/%2F/limits",
        "admin",
        Some(json!({"value": {"max-queues": 0}})),
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, v) = call(
        Method::PUT,
        "/api/queues/%2F/over",
        "admin",
        Some(json!({})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    // RabbitMQ's refusals.
    for (path, body, reason) in [
        (
            "/api/parameters/federation-upstream/%2F/up",
            json!({"value": {"uri": "amqp://"}}),
            "Validation failed\n\ncomponent federation-upstream not found\n",
        ),
        (
            "/api/parameters/vhost-limits/%2F/limits",
            json!({"value": {"max-queues": "x"}}),
            "Validation failed\n\nmax-queues should be a number, actually was <<\"x\">>\n",
        ),
        (
            "/api/parameters/vhost-limits/%2F/limits",
            json!({"value": {"max-things": 1}}),
            "Validation failed\n\nUnrecognised terms [{<<\"max-things\">>,1}] in limits\n",
        ),
        (
            "/api/parameters/vhost-limits/%2F/limits",
            json!({"nothing": 1}),
            "[{key_missing,value}]",
        ),
    ] {
        let (s, _, v) = call(Method::PUT, path, "admin", Some(body)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path}: {v}");
        assert_eq!(v, json!({"error": "bad_request", "reason": reason}));
    }
    let refused =
        json!({"error": "not_authorised", "reason": "User not authorised to access object"});
    for (m, path) in [
        (Method::GET, "/api/parameters"),
        (Method::PUT, "/api/parameters/vhost-limits/%2F/limits"),
        (Method::GET, "/api/global-parameters"),
        (Method::PUT, "/api/global-parameters/cluster_name"),
    ] {
        let (s, _, v) = call(m, path, "mon", Some(json!({"value": {}}))).await;
        assert_eq!(
            (s, v),
            (StatusCode::UNAUTHORIZED, refused.clone()),
            "{path}"
        );
    }
    // Operator policies are parameters too (administrators only); policies only by name.
    let (s, _, v) = call(
        Method::PUT,
        "/api/operator-policies/%2F/cap",
        "admin",
        Some(json!({"pattern": "^cap", "definition": {"max-length": 10}, "apply-to": "queues"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let op = h.get("/api/parameters/operator_policy/%2F/cap").await;
    assert_eq!(op["value"]["pattern"], "^cap");
    assert_eq!(op["value"]["definition"], json!({"max-length": 10}));
    let (s, _, _) = call(
        Method::PUT,
        "/api/parameters/operator_policy/%2F/cap2",
        "pm",
        Some(json!({"value": {"pattern": "x", "definition": {}}})),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _, v) = call(
        Method::PUT,
        "/api/parameters/policy/%2F/ttl",
        "pm",
        Some(json!({"value": {"pattern": "^t", "definition": {"message-ttl": 1000}}})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(h.get("/api/policies/%2F/ttl").await["pattern"], "^t");
    assert_eq!(
        h.get("/api/parameters/policy")
            .await
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(h.get("/api/parameters").await.as_array().unwrap().len(), 2);
    // Global parameters: any JSON; cluster_name names the cluster.
    let (s, _, _) = call(
        Method::PUT,
        "/api/global-parameters/cluster_name",
        "pm",
        Some(json!({"value": "rabbit-test"})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _, _) = call(
        Method::PUT,
        "/api/global-parameters/tags",
        "admin",
        Some(json!({"value": {"region": "eu"}})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(h.get("/api/overview").await["cluster_name"], "rabbit-test");
    assert_eq!(
        h.get("/api/global-parameters/tags").await,
        json!({"name": "tags", "value": {"region": "eu"}})
    );
    let exported = h.get("/api/definitions").await;
    assert_eq!(
        exported["global_parameters"],
        json!([{"name": "cluster_name", "value": "rabbit-test"},
               {"name": "tags", "value": {"region": "eu"}}])
    );
    let params = exported["parameters"].as_array().unwrap();
    assert!(
        params.iter().any(|p| p["component"] == "vhost-limits"),
        "{exported}"
    );
    assert!(
        params.iter().any(|p| p["component"] == "operator_policy"),
        "{exported}"
    );
    h.stop().await;

    // Durable: all there after a restart.
    let h = Http::start_in(Some(dir.clone())).await;
    assert_eq!(
        h.get("/api/global-parameters/cluster_name").await["value"],
        "rabbit-test"
    );
    assert_eq!(
        h.get("/api/parameters/vhost-limits/%2F/limits").await["value"],
        json!({"max-queues": 0})
    );
    // Deletes; a second delete is 404.
    for path in [
        "/api/parameters/vhost-limits/%2F/limits",
        "/api/parameters/operator_policy/%2F/cap",
        "/api/global-parameters/tags",
    ] {
        let (s, _, v) = h.call(Method::DELETE, path, Some("admin"), None).await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{path}: {v}");
        let (s, _, _) = h.call(Method::DELETE, path, Some("admin"), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
        let (s, _, _) = h.call(Method::GET, path, Some("admin"), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
    }
    let (s, _, v) = h
        .call(
            Method::DELETE,
            "/api/parameters/policy/%2F/ttl",
            Some("admin"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    // A RabbitMQ export's parameters and global parameters import.
    let (s, _, v) = h
        .call(
            Method::POST,
            "/api/definitions",
            Some("admin"),
            Some(json!({
                "rabbit_version": "4.0.5",
                "parameters": [
                    {"vhost": "/", "component": "vhost-limits", "name": "limits",
                     "value": {"max-connections": 7}},
                    {"vhost": "/", "component": "operator_policy", "name": "imported",
                     "value": {"pattern": "^imp", "definition": {"max-length": 3},
                               "priority": 2, "apply-to": "queues"}}
                ],
                "global_parameters": [{"name": "cluster_name", "value": "imported-cluster"},
                                      {"name": "internal_cluster_id", "value": "rabbitmq-cluster-id-x"}]
            })),
        )
        .await;
    assert!(s.is_success(), "{s} {v}");
    assert_eq!(
        h.get("/api/parameters/vhost-limits/%2F/limits").await["value"],
        json!({"max-connections": 7})
    );
    assert_eq!(
        h.get("/api/operator-policies/%2F/imported").await["priority"],
        2
    );
    assert_eq!(
        h.get("/api/overview").await["cluster_name"],
        "imported-cluster"
    );
    // `internal...` global parameters are kept but not exported, as RabbitMQ.
    let exported = h.get("/api/definitions").await;
    assert_eq!(
        exported["global_parameters"],
        json!([{"name": "cluster_name", "value": "imported-cluster"}])
    );
    h.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Warren's own metrics over HTTP with a data directory: persistent messages published with
/// confirms over AMQP (lapin) make the message store's fsync counter and histograms grow, the
/// store's bytes and segments show, and a queue window of 8 pages the rest of the queue out,
/// aggregated on /metrics and per queue on /metrics/per-object; all read with a Prometheus
/// text parser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_and_paging_metrics() {
    use lapin::options::QueueDeclareOptions as QOpts;
    use prometheus_parse::{Scrape, Value as PValue};
    let (h, dir) = Http::start_with_window("metrics", 8).await;
    let scrape = |path: &'static str| {
        let h = &h;
        async move {
            let r = within("scrape", h.client.get(format!("{}{path}", h.base)).send())
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            let text = r.text().await.unwrap();
            let parsed = Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
                .unwrap_or_else(|e| panic!("not Prometheus text ({e}):\n{text}"));
            (text, parsed)
        }
    };
    // A counter or gauge's value (the first sample of that name and labels).
    fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
        s.samples
            .iter()
            .find(|x| x.metric == name && labels.iter().all(|(k, v)| x.labels.get(k) == Some(v)))
            .map(|x| match x.value {
                PValue::Counter(v) | PValue::Gauge(v) | PValue::Untyped(v) => v,
                _ => f64::NAN,
            })
            .unwrap_or_else(|| panic!("{name} {labels:?} missing"))
    }
    // A histogram's buckets as (le, cumulative count), +Inf last.
    fn buckets(s: &Scrape, name: &str) -> Vec<(f64, f64)> {
        s.samples
            .iter()
            .find_map(|x| match &x.value {
                PValue::Histogram(b) if x.metric == name => {
                    Some(b.iter().map(|c| (c.less_than, c.count)).collect())
                }
                _ => None,
            })
            .unwrap_or_else(|| panic!("histogram {name} missing"))
    }

    let conn = h.amqp().await;
    let ch = confirm_channel(&conn).await;
    within(
        "declare",
        ch.queue_declare(
            "stored".into(),
            QOpts {
                durable: true,
                ..QOpts::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    let (_, before) = scrape("/metrics").await;
    let fsyncs_before = value(&before, "warren_store_fsyncs_total", &[]);

    // 600 persistent messages, 50 confirms awaited at a time.
    let body = vec![b'm'; 200];
    let n = 600;
    let mut pending = Vec::new();
    for i in 0..n {
        pending.push(
            within(
                "publish",
                ch.basic_publish(
                    "".into(),
                    "stored".into(),
                    BasicPublishOptions::default(),
                    &body,
                    BasicProperties::default().with_delivery_mode(2),
                ),
            )
            .await
            .unwrap(),
        );
        if pending.len() == 50 || i + 1 == n {
            for c in pending.drain(..) {
                assert!(within("confirm", c).await.unwrap().is_ack());
            }
        }
    }

    // Every publish is confirmed, so the writer is idle: the counters agree with each other
    // (a scrape racing a last fsync is taken again).
    let deadline = std::time::Instant::now() + lapin_support::WAIT;
    let (text, m) = loop {
        let (text, m) = scrape("/metrics").await;
        let fsyncs = value(&m, "warren_store_fsyncs_total", &[]);
        let count = value(&m, "warren_store_fsync_seconds_count", &[]);
        if fsyncs == count {
            break (text, m);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fsyncs {fsyncs} != histogram count {count}:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    for line in [
        "# TYPE warren_store_fsync_seconds histogram",
        "# TYPE warren_store_group_commit_batch_records histogram",
        "# TYPE warren_store_fsyncs_total counter",
        "# TYPE warren_store_bytes gauge",
        "# HELP warren_store_fsync_seconds Latency of the message store's fsyncs, seconds",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing in:\n{text}"
        );
    }
    let fsyncs = value(&m, "warren_store_fsyncs_total", &[]);
    assert!(fsyncs > fsyncs_before, "{fsyncs} after {fsyncs_before}");
    let stored = value(&m, "warren_store_bytes", &[]);
    assert!(stored >= (n * body.len()) as f64, "{stored} bytes:\n{text}");
    // On disk: what was written, and the zeros ahead of the open segment's records.
    let written = value(&m, "warren_store_written_bytes_total", &[]);
    assert!(written >= (n * body.len()) as f64, "{written} written");
    assert!(
        stored <= written + warren_store::PREALLOCATE as f64,
        "{stored} bytes on disk, {written} written"
    );
    assert!(value(&m, "warren_store_segments", &[]) >= 1.0);
    assert!(value(&m, "warren_store_records_written_total", &[]) >= n as f64);
    assert_eq!(value(&m, "warren_store_compactions_total", &[]), 0.0);
    for (name, count) in [
        ("warren_store_fsync_seconds", fsyncs),
        (
            "warren_store_group_commit_batch_records",
            value(&m, "warren_store_group_commit_batch_records_count", &[]),
        ),
    ] {
        let b = buckets(&m, name);
        assert!(b.len() > 10, "{name}: {b:?}");
        assert!(
            b.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{name} buckets not cumulative: {b:?}"
        );
        assert_eq!(b.last().unwrap(), &(f64::INFINITY, count), "{name}");
        assert!(count >= 1.0, "{name}");
    }
    // Every record written was in one group commit.
    assert_eq!(
        value(&m, "warren_store_group_commit_batch_records_sum", &[]),
        value(&m, "warren_store_records_written_total", &[])
    );
    assert!(value(&m, "warren_store_fsync_seconds_sum", &[]) > 0.0);
    // Beyond the window of 8 the queue's messages are paged out.
    let paged = value(&m, "warren_queue_messages_paged_out", &[]);
    assert!(paged > 0.0 && paged <= (n - 8) as f64, "{paged} paged out");
    assert_eq!(value(&m, "rabbitmq_queue_messages_paged_out", &[]), paged);
    assert_eq!(value(&m, "rabbitmq_queue_messages_ready", &[]), n as f64);

    let (per_text, per) = scrape("/metrics/per-object").await;
    let q = [("vhost", "/"), ("queue", "stored")];
    assert_eq!(value(&per, "warren_queue_messages_paged_out", &q), paged);
    assert_eq!(value(&per, "rabbitmq_queue_messages_ready", &q), n as f64);
    assert!(
        per_text.contains("warren_store_fsync_seconds_bucket{le=\"0.001\"}"),
        "{per_text}"
    );
    drop(conn);
    h.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `method path` as admin, expecting success; the reply.
async fn admin_ok(h: &Http, method: Method, path: &str, body: Option<Value>) -> Value {
    let (s, _, v) = h.call(method.clone(), path, Some("admin"), body).await;
    assert!(s.is_success(), "{method} {path}: {s} {v}");
    v
}

/// `GET path` as `who`, expecting 200; the reply.
async fn get_as(h: &Http, who: &str, path: &str) -> Value {
    let (s, _, v) = h.call(Method::GET, path, Some(who), None).await;
    assert_eq!(s, StatusCode::OK, "GET {path} as {who}: {v}");
    v
}

/// The `field` of each item of a list reply.
fn names(v: &Value, field: &str) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|i| i[field].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Who sees what in lists, as rabbit_mgmt_util: queues, exchanges, bindings, policies and
/// parameters of the vhosts the user may use (all for administrators only: a monitoring
/// user learns that other vhosts exist, not what is in them); consumers of the user's own
/// channels (all for monitors); the overview of a user that is not a monitor covers its
/// vhosts and its own connections, without the node's details.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_show_what_rabbitmq_shows_each_user() {
    use lapin::options::BasicConsumeOptions;
    let h = Http::start().await;
    // A vhost only the administrator may use, with a queue, an exchange, a binding, a
    // policy and limits; and the same in `/`.
    admin_ok(&h, Method::PUT, "/api/vhosts/private", None).await;
    admin_ok(
        &h,
        Method::PUT,
        "/api/permissions/private/admin",
        Some(json!({"configure": ".*", "write": ".*", "read": ".*"})),
    )
    .await;
    for (v, n) in [("private", "private"), ("%2F", "root")] {
        let path = |p: &str| p.replace("{v}", v).replace("{n}", n);
        admin_ok(
            &h,
            Method::PUT,
            &path("/api/queues/{v}/q-{n}"),
            Some(json!({})),
        )
        .await;
        admin_ok(
            &h,
            Method::PUT,
            &path("/api/exchanges/{v}/x-{n}"),
            Some(json!({})),
        )
        .await;
        admin_ok(
            &h,
            Method::POST,
            &path("/api/bindings/{v}/e/x-{n}/q/q-{n}"),
            Some(json!({"routing_key": "k"})),
        )
        .await;
        admin_ok(
            &h,
            Method::PUT,
            &path("/api/policies/{v}/p-{n}"),
            Some(json!({"pattern": "^none$", "definition": {"max-length": 1}})),
        )
        .await;
        admin_ok(
            &h,
            Method::PUT,
            &path("/api/parameters/vhost-limits/{v}/limits"),
            Some(json!({"value": {"max-queues": 100}})),
        )
        .await;
    }
    // Consumers: one of the administrator's, one of mgmt's.
    let theirs = h.amqp().await;
    let mine = h.amqp_as("mgmt", "%2f").await;
    let (mut channels, mut consumers) = (Vec::new(), Vec::new());
    for (conn, tag) in [(&theirs, "admin-consumer"), (&mine, "mgmt-consumer")] {
        let ch = within("channel", conn.create_channel()).await.unwrap();
        channels.push(ch.clone());
        let consumer = within(
            "consume",
            ch.basic_consume(
                "q-root".into(),
                tag.into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .unwrap();
        consumers.push(consumer);
    }
    h.wait_for("/api/consumers", |v| {
        v.as_array().is_some_and(|a| a.len() == 2)
    })
    .await;

    let lists = [
        ("/api/queues", "name"),
        ("/api/exchanges", "name"),
        ("/api/bindings", "source"),
        ("/api/policies", "name"),
    ];
    for who in ["mgmt", "mon"] {
        for (path, field) in lists {
            let v = get_as(&h, who, path).await;
            assert!(
                !v.as_array()
                    .unwrap()
                    .iter()
                    .any(|i| i["vhost"] == "private"),
                "{who} sees private in {path}: {v}"
            );
            assert!(
                names(&v, field).iter().any(|n| !n.is_empty()),
                "{who} sees nothing in {path}: {v}"
            );
        }
        let (s, _, v) = h
            .call(Method::GET, "/api/queues/private", Some(who), None)
            .await;
        assert_eq!(
            (s, v),
            (
                StatusCode::UNAUTHORIZED,
                json!({"error": "not_authorised",
                       "reason": "User not authorised to access virtual host"})
            ),
            "{who}"
        );
    }
    // (Parameters need policymaker: administrators see every vhost's.)
    for path in lists.iter().map(|l| l.0).chain(["/api/parameters"]) {
        let v = get_as(&h, "admin", path).await;
        assert!(
            v.as_array()
                .unwrap()
                .iter()
                .any(|i| i["vhost"] == "private"),
            "admin misses private in {path}: {v}"
        );
    }
    // Vhosts: a monitor learns of every vhost, a management user of its own.
    assert_eq!(
        names(&get_as(&h, "mgmt", "/api/vhosts").await, "name"),
        ["/"]
    );
    assert_eq!(
        names(&get_as(&h, "mon", "/api/vhosts").await, "name"),
        ["/", "private"]
    );
    // Consumers: mgmt sees its own, the monitor both.
    assert_eq!(
        names(&get_as(&h, "mgmt", "/api/consumers").await, "consumer_tag"),
        ["mgmt-consumer"]
    );
    assert_eq!(
        names(
            &get_as(&h, "mgmt", "/api/consumers/%2F").await,
            "consumer_tag"
        ),
        ["mgmt-consumer"]
    );
    assert_eq!(
        get_as(&h, "mon", "/api/consumers")
            .await
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // The overview: the monitor's has the node; mgmt's its own connection, its vhost's
    // queues and exchanges, no consumer count and no node details.
    let o = get_as(&h, "mon", "/api/overview").await;
    assert!(o["node"].as_str().unwrap().starts_with("warren@"), "{o}");
    assert!(o["listeners"].is_array());
    assert_eq!(o["object_totals"]["queues"], 2);
    assert_eq!(o["object_totals"]["consumers"], 2);
    assert_eq!(o["object_totals"]["connections"], 2);
    let o = get_as(&h, "mgmt", "/api/overview").await;
    for absent in ["node", "listeners", "contexts"] {
        assert!(o.get(absent).is_none(), "{absent} in {o}");
    }
    assert_eq!(
        o["object_totals"],
        json!({"connections": 1, "channels": 1, "queues": 1, "exchanges": 7})
    );
    h.stop().await;
}

#[path = "tls_support/certs.rs"]
mod certs;

/// Every health check of RabbitMQ 4 under `/api/health/checks/`, with its bodies; the
/// AMQPS listener is listed (`amqp/ssl`) and its certificate checked for expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_as_rabbitmq_4() {
    let ca = certs::Ca::new("health CA");
    let server = ca.server();
    let dir = certs::TempDir::new("warren-health");
    let cert_file = dir.write("server.pem", &server.cert_pem);
    let key_file = dir.write("server.key", &server.key_pem);
    let h = Http::start_with(|c| {
        c.tls.cert_file = Some(cert_file.clone());
        c.tls.key_file = Some(key_file.clone());
        c.tls.listen = "127.0.0.1:0".parse().unwrap();
    })
    .await;
    let ok = json!({"status": "ok"});
    for path in [
        "alarms",
        "local-alarms",
        "virtual-hosts",
        "metadata-store/initialized",
        "metadata-store/initialized/with-data",
        "is-in-service",
        "below-node-connection-limit",
        "ready-to-serve-clients",
        "reached-target-cluster-size",
        "quorum-queues-without-elected-leaders/all-vhosts/",
        "quorum-queues-without-elected-leaders/vhost/%2F/",
        "quorum-queues-without-elected-leaders/vhost/%2F/pattern/.*",
        // rcgen's certificates are valid until 4096.
        "certificate-expiration/1/weeks",
        "certificate-expiration/10/Years",
    ] {
        let v = get_as(&h, "mgmt", &format!("/api/health/checks/{path}")).await;
        assert_eq!(v, ok, "{path}");
    }
    assert_eq!(
        get_as(&h, "mgmt", "/api/health/checks/node-is-quorum-critical").await,
        json!({"status": "ok", "reason": "single node cluster"})
    );
    for (alias, protocol) in [
        ("amqp091", "amqp"),
        ("amqps", "amqp/ssl"),
        ("management", "http"),
    ] {
        assert_eq!(
            get_as(
                &h,
                "mgmt",
                &format!("/api/health/checks/protocol-listener/{alias}")
            )
            .await,
            json!({"status": "ok", "protocol": protocol})
        );
    }
    let tls_port = h.broker.as_ref().unwrap().amqps_addr().unwrap().port();
    assert_eq!(
        get_as(
            &h,
            "mgmt",
            &format!("/api/health/checks/port-listener/{tls_port}")
        )
        .await,
        json!({"status": "ok", "port": tls_port})
    );
    let o = get_as(&h, "admin", "/api/overview").await;
    assert!(
        o["listeners"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["protocol"] == "amqp/ssl" && l["port"] == tls_port),
        "{o}"
    );
    // Failures: 503 with RabbitMQ's body; bad arguments 400.
    let (s, _, v) = h
        .call(
            Method::GET,
            "/api/health/checks/certificate-expiration/3000/years",
            Some("mgmt"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["reason"], "Certificates expiring");
    let expired = &v["expired"][0];
    assert_eq!(expired["protocol"], "amqp/ssl");
    assert_eq!(expired["port"], tls_port);
    assert_eq!(expired["certfile"], cert_file.display().to_string());
    assert_eq!(
        expired["certfile_expires_on"],
        json!(["4096-01-01 0:00:00"])
    );
    assert_eq!(expired["cacertfile_expires_on"], json!([]));
    for (path, reason) in [
        (
            "certificate-expiration/soon/weeks",
            "Invalid expiration value.",
        ),
        (
            "certificate-expiration/1/fortnights",
            "Time unit not recognised. Supported units: days, weeks, months, years.",
        ),
        ("port-listener/http", "Invalid port"),
    ] {
        let (s, _, v) = h
            .call(
                Method::GET,
                &format!("/api/health/checks/{path}"),
                Some("mgmt"),
                None,
            )
            .await;
        assert_eq!(
            (s, v),
            (
                StatusCode::BAD_REQUEST,
                json!({"error": "bad_request", "reason": reason})
            ),
            "{path}"
        );
    }
    h.stop().await;
}

/// The node's connection limit: `below-node-connection-limit` and `ready-to-serve-clients`
/// fail once `amqp.max_connections` connections are open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_health_checks() {
    let h = Http::start_with(|c| c.amqp.max_connections = 1).await;
    let _conn = h.amqp().await;
    let (s, _, v) = h
        .call(
            Method::GET,
            "/api/health/checks/below-node-connection-limit",
            Some("mgmt"),
            None,
        )
        .await;
    assert_eq!(
        (s, v),
        (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "failed", "reason": "node connection limit is reached"})
        )
    );
    let (s, _, v) = h
        .call(
            Method::GET,
            "/api/health/checks/ready-to-serve-clients",
            Some("mgmt"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(v["connections"], 1, "{v}");
    h.stop().await;
}

/// Permissions by vhost and by user, topic permissions per exchange, users without
/// permissions and their bulk deletion, vhost and user limits one by one, the cluster
/// name, a user's connections, and the empty feature-flag lists: RabbitMQ's paths, bodies
/// and status codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissions_limits_and_other_admin_paths() {
    let h = Http::start().await;
    let call = |method: Method, path: &'static str, who: &'static str, body: Option<Value>| {
        let h = &h;
        async move { h.call(method, path, Some(who), body).await }
    };
    admin_ok(&h, Method::PUT, "/api/vhosts/v2", None).await;
    admin_ok(
        &h,
        Method::PUT,
        "/api/users/loner",
        Some(json!({"password": "x", "tags": ""})),
    )
    .await;
    admin_ok(
        &h,
        Method::PUT,
        "/api/permissions/v2/mgmt",
        Some(json!({"configure": "", "write": "^w", "read": "^r"})),
    )
    .await;
    for x in ["amq.topic", "t2"] {
        admin_ok(
            &h,
            Method::PUT,
            "/api/topic-permissions/v2/mgmt",
            Some(json!({"exchange": x, "write": "^a", "read": "^b"})),
        )
        .await;
    }
    // Permissions of one vhost, of one user; by vhost, then user. The administrator who
    // created v2 has full permissions on it (as RabbitMQ grants its creator).
    let v = get_as(&h, "admin", "/api/vhosts/v2/permissions").await;
    assert_eq!(
        v,
        json!([
            {"user": "admin", "vhost": "v2", "configure": ".*", "write": ".*", "read": ".*"},
            {"user": "mgmt", "vhost": "v2", "configure": "", "write": "^w", "read": "^r"}
        ])
    );
    let v = get_as(&h, "admin", "/api/users/mgmt/permissions").await;
    assert_eq!(names(&v, "vhost"), ["/", "v2"]);
    let v = get_as(&h, "admin", "/api/users/mgmt/topic-permissions").await;
    assert_eq!(names(&v, "exchange"), ["amq.topic", "t2"]);
    let v = get_as(
        &h,
        "admin",
        "/api/vhosts/v2/topic-permissions?columns=exchange",
    )
    .await;
    assert_eq!(v, json!([{"exchange": "amq.topic"}, {"exchange": "t2"}]));
    let v = get_as(
        &h,
        "admin",
        "/api/topic-permissions?sort=exchange&sort_reverse=true",
    )
    .await;
    assert_eq!(names(&v, "exchange"), ["t2", "amq.topic"]);
    for path in [
        "/api/vhosts/nope/permissions",
        "/api/users/nope/topic-permissions",
    ] {
        let (s, _, _) = h.call(Method::GET, path, Some("admin"), None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
    }
    let (s, _, _) = call(Method::GET, "/api/vhosts/v2/permissions", "mon", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    // One exchange's topic permissions go; the others stay.
    let (s, _, _) = call(
        Method::DELETE,
        "/api/topic-permissions/v2/mgmt/t2",
        "admin",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let v = get_as(&h, "admin", "/api/topic-permissions/v2/mgmt").await;
    assert_eq!(names(&v, "exchange"), ["amq.topic"]);
    // PUT for a user or vhost that does not exist, or a body without its keys.
    let bad = |reason: &str| json!({"error": "bad_request", "reason": reason});
    for (path, body, reason) in [
        (
            "/api/permissions/v2/nobody",
            json!({"configure": "", "write": "", "read": ""}),
            "vhost_or_user_not_found",
        ),
        (
            "/api/permissions/nowhere/mgmt",
            json!({}),
            "vhost_or_user_not_found",
        ),
        (
            "/api/permissions/v2/mgmt",
            json!({"write": ""}),
            "[{key_missing,configure},{key_missing,read}]",
        ),
        (
            "/api/topic-permissions/v2/nobody",
            json!({"exchange": "x", "write": "", "read": ""}),
            "vhost_or_user_not_found",
        ),
        (
            "/api/topic-permissions/v2/mgmt",
            json!({"write": "", "read": ""}),
            "[{key_missing,exchange}]",
        ),
    ] {
        let (s, _, v) = call(Method::PUT, path, "admin", Some(body)).await;
        assert_eq!((s, v), (StatusCode::BAD_REQUEST, bad(reason)), "{path}");
    }
    // Users without permissions, and a bulk delete (unknown names passed over).
    let v = get_as(&h, "admin", "/api/users/without-permissions").await;
    assert_eq!(names(&v, "name"), ["loner"]);
    let (s, _, _) = call(
        Method::POST,
        "/api/users/bulk-delete",
        "admin",
        Some(json!({"users": ["loner", "ghost"]})),
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, _) = call(Method::GET, "/api/users/loner", "admin", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);

    // Vhost limits, one at a time; a management user lists those of its vhosts.
    for (name, value) in [("max-queues", 10), ("max-connections", 5)] {
        let (s, _, v) = h
            .call(
                Method::PUT,
                &format!("/api/vhost-limits/v2/{name}"),
                Some("admin"),
                Some(json!({"value": value})),
            )
            .await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
    }
    let limits = json!([{"vhost": "v2", "value": {"max-queues": 10, "max-connections": 5}}]);
    assert_eq!(get_as(&h, "admin", "/api/vhost-limits").await, limits);
    assert_eq!(get_as(&h, "mgmt", "/api/vhost-limits/v2").await, limits);
    assert_eq!(
        get_as(&h, "admin", "/api/parameters/vhost-limits/v2/limits").await["value"],
        limits[0]["value"]
    );
    let (s, _, v) = call(
        Method::PUT,
        "/api/vhost-limits/v2/max-queues",
        "admin",
        Some(json!({"value": "ten"})),
    )
    .await;
    assert_eq!(
        (s, v["reason"].clone()),
        (
            StatusCode::BAD_REQUEST,
            json!("Validation failed\n\nmax-queues should be a number, actually was <<\"ten\">>\n")
        )
    );
    let (s, _, v) = call(
        Method::PUT,
        "/api/vhost-limits/nowhere/max-queues",
        "admin",
        Some(json!({"value": 1})),
    )
    .await;
    assert_eq!(
        (s, v),
        (
            StatusCode::NOT_FOUND,
            json!({"error": "not_found", "reason": "vhost_not_found"})
        )
    );
    let (s, _, _) = call(
        Method::PUT,
        "/api/vhost-limits/v2/max-queues",
        "mgmt",
        Some(json!({"value": 1})),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _, _) = call(
        Method::DELETE,
        "/api/vhost-limits/v2/max-connections",
        "admin",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(
        get_as(&h, "admin", "/api/vhost-limits/v2").await,
        json!([{"vhost": "v2", "value": {"max-queues": 10}}])
    );
    // User limits, enforced at the next connection.
    let (s, _, _) = call(
        Method::PUT,
        "/api/user-limits/mgmt/max-connections",
        "admin",
        Some(json!({"value": 1})),
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(
        get_as(&h, "mgmt", "/api/user-limits").await,
        json!([{"user": "mgmt", "value": {"max-connections": 1}}])
    );
    assert_eq!(
        get_as(&h, "admin", "/api/users/mgmt").await["limits"],
        json!({"max-connections": 1})
    );
    let first = h.amqp_as("mgmt", "%2f").await;
    let addr = h.broker.as_ref().unwrap().amqp_addr();
    let second = Connection::connect(
        &format!("amqp://mgmt:mgmt-pw@{addr}/%2f"),
        ConnectionProperties::default(),
    )
    .await;
    assert!(second.is_err(), "the second connection is over the limit");
    let (s, _, v) = call(
        Method::PUT,
        "/api/user-limits/mgmt/max-channels",
        "admin",
        Some(json!({"value": "many"})),
    )
    .await;
    assert_eq!(
        (s, v["reason"].clone()),
        (
            StatusCode::BAD_REQUEST,
            json!("max-channels should be a number, actually was <<\"many\">>")
        )
    );
    let (s, _, _) = call(
        Method::DELETE,
        "/api/user-limits/mgmt/max-connections",
        "admin",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(
        get_as(&h, "admin", "/api/user-limits/mgmt").await,
        json!([])
    );

    // A user's connections: listed for itself and monitors, closed by itself or an admin.
    h.wait_for("/api/connections", |v| {
        v.as_array().is_some_and(|a| a.len() == 1)
    })
    .await;
    let v = get_as(&h, "mgmt", "/api/connections/username/mgmt").await;
    assert_eq!(v[0]["user"], "mgmt");
    assert_eq!(v[0]["vhost"], "/");
    assert!(v[0]["node"].as_str().unwrap().starts_with("warren@"));
    let (s, _, _) = call(Method::GET, "/api/connections/username/admin", "mgmt", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let mut events = first.events_listener();
    let (s, _, _) = call(
        Method::DELETE,
        "/api/connections/username/mgmt",
        "mgmt",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(
        forced_close(&mut events).await,
        (
            320,
            "CONNECTION_FORCED - Closed via management plugin".to_string()
        )
    );

    // The cluster name; memory breakdown; feature flags.
    assert_eq!(
        get_as(&h, "mgmt", "/api/cluster-name").await,
        json!({"name": "warren"})
    );
    let (s, _, _) = call(
        Method::PUT,
        "/api/cluster-name",
        "mgmt",
        Some(json!({"name": "c1"})),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, _, _) = call(
        Method::PUT,
        "/api/cluster-name",
        "admin",
        Some(json!({"name": "c1"})),
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(
        get_as(&h, "mgmt", "/api/overview").await["cluster_name"],
        "c1"
    );
    let node = get_as(&h, "mon", "/api/nodes").await[0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        get_as(&h, "mon", &format!("/api/nodes/{node}/memory")).await,
        json!({"memory": "not_available"})
    );
    for path in [
        "/api/feature-flags",
        "/api/deprecated-features",
        "/api/deprecated-features/used",
    ] {
        assert_eq!(get_as(&h, "mgmt", path).await, json!([]), "{path}");
    }
    h.stop().await;
}

/// RabbitMQ 4's fields: `whoami`'s `is_internal_user`; a vhost's default queue type
/// always and `protected_from_deletion`; the overview's `churn_rates` counting
/// connections, channels and queues; a channel's `messages_unconfirmed`; the definitions
/// export's format fields and user limits; `vhost_not_found`; publish and get name every
/// missing key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_4_fields_and_errors() {
    use lapin::options::QueueDeleteOptions;
    let h = Http::start().await;
    let v = get_as(&h, "admin", "/api/vhosts/%2F").await;
    assert_eq!(v["default_queue_type"], "classic");
    assert_eq!(v["metadata"]["default_queue_type"], "classic");
    // RabbitMQ 3.11's first name of the field is read too.
    admin_ok(
        &h,
        Method::PUT,
        "/api/vhosts/typed",
        Some(json!({"defaultqueuetype": "quorum"})),
    )
    .await;
    let v = get_as(&h, "admin", "/api/vhosts/typed").await;
    assert_eq!(v["default_queue_type"], "quorum");
    assert_eq!(v["protected_from_deletion"], false);

    let conn = h.amqp().await;
    let ch = confirm_channel(&conn).await;
    for q in ["c1", "c2"] {
        within(
            "declare",
            ch.queue_declare(
                q.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .unwrap();
    }
    within(
        "redeclare",
        ch.queue_declare(
            "c1".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    within(
        "delete",
        ch.queue_delete("c2".into(), QueueDeleteOptions::default()),
    )
    .await
    .unwrap();
    within(
        "publish",
        ch.basic_publish(
            "".into(),
            "c1".into(),
            BasicPublishOptions::default(),
            b"m",
            BasicProperties::default(),
        ),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let channels = get_as(&h, "admin", "/api/channels").await;
    assert_eq!(channels[0]["messages_unconfirmed"], 0, "{channels}");
    let churn = get_as(&h, "admin", "/api/overview").await["churn_rates"].clone();
    for (field, n) in [
        ("connection_created", 1),
        ("connection_closed", 0),
        ("channel_created", 1),
        ("channel_closed", 0),
        ("queue_declared", 3),
        ("queue_created", 2),
        ("queue_deleted", 1),
    ] {
        assert_eq!(churn[field], n, "{field}: {churn}");
        assert!(
            churn[format!("{field}_details")]["rate"].is_number(),
            "{churn}"
        );
    }
    conn.close(200, "bye".into()).await.unwrap();
    let o = h
        .wait_for("/api/overview", |o| {
            o["churn_rates"]["connection_closed"] == 1
        })
        .await;
    assert_eq!(o["churn_rates"]["channel_closed"], 1);

    // Publish and get name what their bodies lack.
    for (path, body, reason) in [
        (
            "/api/exchanges/%2F/amq.default/publish",
            json!({"routing_key": "c1", "payload": "x"}),
            "[{key_missing,properties},{key_missing,payload_encoding}]",
        ),
        (
            "/api/queues/%2F/c1/get",
            json!({"count": 1}),
            "[{key_missing,ackmode},{key_missing,encoding}]",
        ),
    ] {
        let (s, _, v) = h.call(Method::POST, path, Some("admin"), Some(body)).await;
        assert_eq!(
            (s, v),
            (
                StatusCode::BAD_REQUEST,
                json!({"error": "bad_request", "reason": reason})
            ),
            "{path}"
        );
    }

    // Definitions: RabbitMQ 4's metadata, user limits kept, `download`, missing vhosts.
    admin_ok(
        &h,
        Method::PUT,
        "/api/user-limits/mgmt/max-channels",
        Some(json!({"value": 7})),
    )
    .await;
    let r = within(
        "export",
        h.client
            .get(format!("{}/api/definitions?download=defs.json", h.base))
            .basic_auth("admin", Some("admin-pw"))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(
        r.headers()["content-disposition"],
        "attachment; filename=defs.json"
    );
    let defs: Value = r.json().await.unwrap();
    assert_eq!(defs["rabbitmq_definition_format"], "cluster");
    assert_eq!(defs["original_cluster_name"], "warren");
    assert_eq!(defs["explanation"], "Definitions of cluster 'warren'");
    let mgmt = defs["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "mgmt")
        .unwrap();
    assert_eq!(mgmt["limits"], json!({"max-channels": 7}));
    let root = &defs["vhosts"][0];
    assert_eq!(
        (root["name"].clone(), root["default_queue_type"].clone()),
        (json!("/"), json!("classic"))
    );
    let one = get_as(&h, "admin", "/api/definitions/%2F").await;
    assert_eq!(one["rabbitmq_definition_format"], "single_virtual_host");
    assert_eq!(one["original_vhost_name"], "/");
    assert_eq!(one["default_queue_type"], "classic");
    let (s, _, v) = h
        .call(Method::GET, "/api/definitions/nowhere", Some("admin"), None)
        .await;
    assert_eq!(
        (s, v),
        (
            StatusCode::BAD_REQUEST,
            json!({"error": "bad_request", "reason": "vhost_not_found"})
        )
    );
    let (s, _, v) = h
        .call(
            Method::POST,
            "/api/definitions/nowhere",
            Some("admin"),
            Some(json!({"queues": []})),
        )
        .await;
    assert_eq!(
        (s, v),
        (
            StatusCode::NOT_FOUND,
            json!({"error": "not_found", "reason": "vhost_not_found"})
        )
    );
    // The user limits come back from the export.
    admin_ok(
        &h,
        Method::DELETE,
        "/api/user-limits/mgmt/max-channels",
        None,
    )
    .await;
    admin_ok(&h, Method::POST, "/api/definitions", Some(defs)).await;
    assert_eq!(
        get_as(&h, "admin", "/api/users/mgmt").await["limits"],
        json!({"max-channels": 7})
    );
    h.stop().await;
}

/// An AMQP connection as admin to `/` whose client properties name it `name` (what
/// `/api/connections` shows as `client_properties.connection_name`).
async fn named_connection(h: &Http, name: &str) -> Connection {
    let addr = h.broker.as_ref().unwrap().amqp_addr();
    within(
        "connect",
        Connection::connect(
            &format!("amqp://admin:admin-pw@{addr}/%2f"),
            ConnectionProperties::default().with_connection_name(name.into()),
        ),
    )
    .await
    .expect("AMQP connection")
}

/// The connection whose client named it `name`, from `GET /api/connections`.
fn connection_named(list: &Value, name: &str) -> Option<Value> {
    list.as_array()?
        .iter()
        .find(|c| c["client_properties"]["connection_name"] == name)
        .cloned()
}

/// `/api/nodes` and `/api/nodes/{name}` give RabbitMQ's resource figures with real values
/// (the process's memory, descriptors, sockets, threads, the data directory's free space)
/// and the alarms' configured limits, with the `_details` rates of the gauges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_show_resource_figures_and_limits() {
    let dir = binary_support::tempdir("mgmt-nodes");
    let data_dir = dir.clone();
    let h = Http::start_with(move |c| {
        c.storage.data_dir = Some(data_dir);
        c.storage.disk_free_limit = warren_server::config::DiskFreeLimit::Bytes(12_345_678);
        c.memory.high_watermark_bytes = 3 << 30;
        c.management.collect_statistics_interval = 200;
    })
    .await;
    let _conn = h.amqp().await;
    let nodes = h.get("/api/nodes").await;
    let n = &nodes[0];
    let u = |k: &str| {
        n[k].as_u64()
            .unwrap_or_else(|| panic!("{k} is not a number: {n}"))
    };
    assert!(u("mem_used") > 1 << 20, "{n}");
    assert_eq!(u("mem_limit"), 3 << 30);
    assert_eq!(n["mem_alarm"], false);
    assert_eq!(n["mem_calculation_strategy"], "rss");
    assert!(u("disk_free") > 0, "{n}");
    assert_eq!(u("disk_free_limit"), 12_345_678);
    assert_eq!(n["disk_free_alarm"], false);
    assert!(u("fd_used") >= 5, "{n}");
    assert!(u("fd_total") >= u("fd_used"), "{n}");
    // The AMQP and HTTP listeners, the AMQP connection both ways, this HTTP request.
    assert!(u("sockets_used") >= 4, "{n}");
    assert_eq!(u("sockets_total"), u("fd_total"));
    assert!(u("proc_used") >= 2, "{n}");
    assert!(u("proc_total") >= u("proc_used"), "{n}");
    assert!(u("run_queue") < u("proc_used"), "{n}");
    assert!(u("processors") >= 1);
    assert!(u("uptime") > 0);
    assert_eq!(n["os_pid"], std::process::id().to_string());
    // Each gauge's rate (per second) once the sampler has two samples of it.
    let nodes = h
        .wait_for("/api/nodes", |v| {
            [
                "mem_used",
                "fd_used",
                "sockets_used",
                "disk_free",
                "proc_used",
            ]
            .iter()
            .all(|k| v[0][format!("{k}_details")]["rate"].is_f64())
        })
        .await;
    let name = nodes[0]["name"].as_str().unwrap().to_string();
    let one = h.get(&format!("/api/nodes/{}", seg(&name))).await;
    assert_eq!(one["name"], name.as_str());
    assert!(one["fd_used"].as_u64().unwrap() > 0);
    assert!(one["mem_used_details"]["rate"].is_f64(), "{one}");
    // More connections, more sockets.
    let before = one["sockets_used"].as_u64().unwrap();
    let more = [h.amqp().await, h.amqp().await, h.amqp().await];
    let after = h.get("/api/nodes").await[0]["sockets_used"]
        .as_u64()
        .unwrap();
    assert!(after >= before + 3, "{before} then {after}");
    drop(more);
    h.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Connection `state` under a resource alarm, as rabbit_reader reports it: `blocking` while
/// the alarm is on and the connection has not published since, `blocked` once it published
/// and is held, `running` again when the alarm clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_state_follows_the_disk_alarm() {
    use warren_server::config::DiskFreeLimit;
    let dir = binary_support::tempdir("mgmt-conn-state");
    let h = Http::start_in(Some(dir.clone())).await;
    let publisher = named_connection(&h, "publisher").await;
    let consumer = named_connection(&h, "consumer").await;
    let pch = within("channel", publisher.create_channel()).await.unwrap();
    let _cch = within("channel", consumer.create_channel()).await.unwrap();
    let states = |v: &Value| {
        (
            connection_named(v, "publisher").map(|c| c["state"].clone()),
            connection_named(v, "consumer").map(|c| c["state"].clone()),
        )
    };
    let running = (Some(json!("running")), Some(json!("running")));
    h.wait_for("/api/connections", |v| states(v) == running)
        .await;

    let broker = h.broker.as_ref().unwrap();
    broker
        .state()
        .set_disk_free_limit(DiskFreeLimit::Bytes(u64::MAX / 2), 0.0);
    let blocking = (Some(json!("blocking")), Some(json!("blocking")));
    h.wait_for("/api/connections", |v| states(v) == blocking)
        .await;
    // The publisher publishes: it is no longer read from (the publish waits).
    let held = {
        let pch = pch.clone();
        tokio::spawn(async move {
            pch.basic_publish(
                "".into(),
                "nowhere".into(),
                BasicPublishOptions::default(),
                b"x",
                BasicProperties::default(),
            )
            .await
        })
    };
    let v = h
        .wait_for("/api/connections", |v| {
            states(v) == (Some(json!("blocked")), Some(json!("blocking")))
        })
        .await;
    let name = connection_named(&v, "publisher").unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let one = h.get(&format!("/api/connections/{}", seg(&name))).await;
    assert_eq!(one["state"], "blocked", "{one}");

    broker
        .state()
        .set_disk_free_limit(DiskFreeLimit::Bytes(0), 0.0);
    h.wait_for("/api/connections", |v| states(v) == running)
        .await;
    within("publish after the alarm", held)
        .await
        .unwrap()
        .unwrap();
    let one = h.get(&format!("/api/connections/{}", seg(&name))).await;
    assert_eq!(one["state"], "running", "{one}");
    drop((publisher, consumer));
    h.stop().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Connections count their socket traffic both ways, handshake included: `recv_oct`,
/// `send_oct` (bytes), `recv_cnt`, `send_cnt` (reads and writes), and the byte rates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_count_socket_bytes_and_rates() {
    use futures_util::StreamExt;
    use lapin::options::BasicConsumeOptions;
    let h = Http::start_with(|c| c.management.collect_statistics_interval = 200).await;
    let conn = named_connection(&h, "io").await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    within(
        "declare",
        ch.queue_declare(
            "io-q".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    let list = h.get("/api/connections").await;
    let c = connection_named(&list, "io").expect("listed");
    let n = |c: &Value, k: &str| {
        c[k].as_u64()
            .unwrap_or_else(|| panic!("{k} is not a number: {c}"))
    };
    // The handshake alone: the protocol header, start-ok, tune-ok, open; start, tune, open-ok.
    assert!(n(&c, "recv_oct") > 100, "{c}");
    assert!(n(&c, "send_oct") > 100, "{c}");
    assert!(n(&c, "recv_cnt") >= 1 && n(&c, "recv_cnt") <= n(&c, "recv_oct"));
    assert!(n(&c, "send_cnt") >= 1 && n(&c, "send_cnt") <= n(&c, "send_oct"));
    assert!(c["recv_oct_details"]["rate"].is_f64(), "{c}");
    assert!(c["send_oct_details"]["rate"].is_f64(), "{c}");
    let name = c["name"].as_str().unwrap().to_string();

    // 100 messages of 1000 bytes in, then out to a consumer.
    for _ in 0..100 {
        within(
            "publish",
            ch.basic_publish(
                "".into(),
                "io-q".into(),
                BasicPublishOptions::default(),
                &[7u8; 1000],
                BasicProperties::default(),
            ),
        )
        .await
        .unwrap();
    }
    h.wait_ready("io-q", 100).await;
    let after_in = h.get(&format!("/api/connections/{}", seg(&name))).await;
    assert!(
        n(&after_in, "recv_oct") >= n(&c, "recv_oct") + 100_000,
        "{c}\n{after_in}"
    );
    let mut consumer = within(
        "consume",
        ch.basic_consume(
            "io-q".into(),
            "io-c".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    for _ in 0..100 {
        within("delivery", consumer.next())
            .await
            .expect("a delivery")
            .expect("delivered");
    }
    let after_out = h.get(&format!("/api/connections/{}", seg(&name))).await;
    assert!(
        n(&after_out, "send_oct") >= n(&after_in, "send_oct") + 100_000,
        "{after_in}\n{after_out}"
    );
    assert!(n(&after_out, "send_cnt") > n(&c, "send_cnt"));
    // The bytes show as rates in the samples that saw them (200 ms apart), and in the list.
    for _ in 0..100 {
        within(
            "publish",
            ch.basic_publish(
                "".into(),
                "io-q".into(),
                BasicPublishOptions::default(),
                &[7u8; 1000],
                BasicProperties::default(),
            ),
        )
        .await
        .unwrap();
    }
    h.wait_for("/api/connections", |v| {
        connection_named(v, "io").is_some_and(|c| {
            num(&c, &["recv_oct_details", "rate"]) > 0.0
                && num(&c, &["send_oct_details", "rate"]) > 0.0
        })
    })
    .await;
    drop(conn);
    h.stop().await;
}

/// `GET /api/channels/{name}` lists what the channel published to each exchange
/// (`publishes`), took from each queue (`deliveries`) and its consumers (`consumer_details`),
/// with the rates of the counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_details_show_publishes_deliveries_and_consumers() {
    use futures_util::StreamExt;
    use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueBindOptions};
    let h = Http::start_with(|c| c.management.collect_statistics_interval = 200).await;
    let conn = h.amqp().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    for q in ["cd-consumed", "cd-got"] {
        within(
            "declare",
            ch.queue_declare(
                q.into(),
                QueueDeclareOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .unwrap();
    }
    within(
        "bind",
        ch.queue_bind(
            "cd-got".into(),
            "amq.direct".into(),
            "k".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    let publish = |x: &'static str, key: &'static str| {
        let ch = ch.clone();
        async move {
            within(
                "publish",
                ch.basic_publish(
                    x.into(),
                    key.into(),
                    BasicPublishOptions::default(),
                    b"m",
                    BasicProperties::default(),
                ),
            )
            .await
            .unwrap();
        }
    };
    for _ in 0..3 {
        publish("", "cd-consumed").await;
    }
    for _ in 0..2 {
        publish("amq.direct", "k").await;
    }
    h.wait_ready("cd-got", 2).await;
    let mut consumer = within(
        "consume",
        ch.basic_consume(
            "cd-consumed".into(),
            "cd-tag".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    for _ in 0..3 {
        let d = within("delivery", consumer.next())
            .await
            .expect("a delivery")
            .expect("delivered");
        within("ack", d.ack(BasicAckOptions::default()))
            .await
            .unwrap();
    }
    let got = within(
        "basic.get",
        ch.basic_get("cd-got".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap();
    assert!(got.is_some());

    let channels = h.get("/api/channels").await;
    let name = channels[0]["name"].as_str().unwrap().to_string();
    // The lists do not carry the details, as RabbitMQ's.
    assert!(channels[0].get("publishes").is_none(), "{channels}");
    let path = format!("/api/channels/{}", seg(&name));
    // Acks arrive after the deliveries: wait until the channel counted all three.
    let v = h
        .wait_for(&path, |v| {
            v["deliveries"].as_array().is_some_and(|d| {
                d.iter()
                    .any(|e| e["queue"]["name"] == "cd-consumed" && e["stats"]["ack"] == 3)
            })
        })
        .await;
    let publishes = v["publishes"].as_array().expect("publishes");
    let by_exchange = |x: &str| {
        publishes
            .iter()
            .find(|p| p["exchange"]["name"] == x)
            .unwrap_or_else(|| panic!("no publishes to '{x}': {v}"))
    };
    let default = by_exchange("");
    assert_eq!(default["exchange"]["vhost"], "/");
    assert_eq!(default["stats"]["publish"], 3);
    assert!(default["stats"]["publish_details"]["rate"].is_f64(), "{v}");
    assert_eq!(by_exchange("amq.direct")["stats"]["publish"], 2);
    let deliveries = v["deliveries"].as_array().expect("deliveries");
    let by_queue = |q: &str| {
        deliveries
            .iter()
            .find(|d| d["queue"]["name"] == q)
            .unwrap_or_else(|| panic!("no deliveries from '{q}': {v}"))
    };
    let consumed = &by_queue("cd-consumed")["stats"];
    assert_eq!(by_queue("cd-consumed")["queue"]["vhost"], "/");
    assert_eq!(consumed["deliver"], 3);
    assert_eq!(consumed["deliver_get"], 3);
    assert_eq!(consumed["deliver_no_ack"], 0);
    assert_eq!(consumed["ack"], 3);
    assert!(consumed["deliver_get_details"]["rate"].is_f64(), "{v}");
    let got = &by_queue("cd-got")["stats"];
    assert_eq!(got["get_no_ack"], 1);
    assert_eq!(got["deliver_get"], 1);
    assert_eq!(got["deliver"], 0);
    let consumers = v["consumer_details"].as_array().expect("consumer_details");
    assert_eq!(consumers.len(), 1, "{v}");
    assert_eq!(consumers[0]["consumer_tag"], "cd-tag");
    assert_eq!(consumers[0]["queue"]["name"], "cd-consumed");
    assert_eq!(consumers[0]["channel_details"]["name"], name.as_str());
    assert_eq!(consumers[0]["ack_required"], true);
    // The same object as /api/consumers shows.
    let all = h.get("/api/consumers").await;
    assert_eq!(all[0], consumers[0]);
    // The counts' rates: non-zero in the samples (200 ms apart) that saw them change.
    for _ in 0..5 {
        publish("amq.direct", "k").await;
    }
    h.wait_for(&path, |v| {
        v["publishes"].as_array().is_some_and(|p| {
            p.iter().any(|p| {
                p["exchange"]["name"] == "amq.direct"
                    && num(p, &["stats", "publish_details", "rate"]) > 0.0
            })
        })
    })
    .await;
    for _ in 0..5 {
        publish("", "cd-consumed").await;
    }
    h.wait_for(&path, |v| {
        v["deliveries"].as_array().is_some_and(|d| {
            d.iter().any(|d| {
                d["queue"]["name"] == "cd-consumed"
                    && num(d, &["stats", "deliver_get_details", "rate"]) > 0.0
            })
        })
    })
    .await;
    drop(conn);
    h.stop().await;
}

/// Queue names longer than an AMQP short string (255 bytes) are refused over HTTP as RabbitMQ
/// 4 refuses them: 400 `bad_request` with rabbit_parameter_validation's text. Exchange names
/// are not checked there, by RabbitMQ or Warren.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_names_longer_than_255_bytes_are_refused_over_http() {
    let h = Http::start().await;
    let long = "q".repeat(256);
    let (s, _, v) = h
        .call(
            Method::PUT,
            &format!("/api/queues/%2F/{long}"),
            Some("admin"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        v,
        json!({"error": "bad_request",
               "reason": "queue should be less than 255 bytes, actually was 256\n"})
    );
    // Bytes, not characters: 128 two-byte characters are 256 bytes.
    let wide = "é".repeat(128);
    let (s, _, v) = h
        .call(
            Method::PUT,
            &format!("/api/queues/%2F/{}", seg(&wide)),
            Some("admin"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(
        v["reason"],
        "queue should be less than 255 bytes, actually was 256\n"
    );
    let (s, _, _) = h
        .call(
            Method::GET,
            &format!("/api/queues/%2F/{long}"),
            Some("admin"),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // 255 bytes is a name AMQP clients can use.
    let longest = "q".repeat(255);
    let (s, _, v) = h
        .call(
            Method::PUT,
            &format!("/api/queues/%2F/{longest}"),
            Some("admin"),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let conn = h.amqp().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    within(
        "passive declare",
        ch.queue_declare(
            longest.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("the 255-byte queue is there");
    drop(conn);
    h.stop().await;
}

/// A consumer on `queue` (prefetch 1) that acks one message every `every`, for as long as
/// the broker delivers: slow, yet never stalled in the sense of publisher flow control.
async fn slow_consumer(conn: &Connection, queue: &str, every: std::time::Duration) {
    use futures_util::StreamExt;
    use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
    let ch = within("channel", conn.create_channel()).await.unwrap();
    within("qos", ch.basic_qos(1, BasicQosOptions::default()))
        .await
        .unwrap();
    let mut consumer = within(
        "consume",
        ch.basic_consume(
            queue.into(),
            "slow".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    tokio::spawn(async move {
        while let Some(Ok(d)) = consumer.next().await {
            tokio::time::sleep(every).await;
            if d.ack(BasicAckOptions::default()).await.is_err() {
                break;
            }
        }
    });
}

/// A publisher that publisher flow control holds (its queue's only consumer is slow but
/// keeps taking messages) is closed through the management API at once, not once the queue
/// next drains (about 3 s here: 32 messages at 10 a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_held_by_flow_control_is_closed_at_once() {
    let (h, dir) = Http::start_with_window("flow-close", 128).await;
    let consumer_conn = h.amqp().await;
    let setup = within("channel", consumer_conn.create_channel())
        .await
        .unwrap();
    within(
        "declare",
        setup.queue_declare(
            "held".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    slow_consumer(
        &consumer_conn,
        "held",
        std::time::Duration::from_millis(100),
    )
    .await;
    let publisher = h.amqp().await;
    let mut events = publisher.events_listener();
    let pch = within("channel", publisher.create_channel()).await.unwrap();
    tokio::spawn(async move {
        loop {
            let sent = pch
                .basic_publish(
                    "".into(),
                    "held".into(),
                    BasicPublishOptions::default(),
                    b"m",
                    BasicProperties::default(),
                )
                .await;
            if sent.is_err() {
                break;
            }
        }
    });
    let conns = h
        .wait_for("/api/connections", |v| {
            v.as_array()
                .is_some_and(|a| a.iter().any(|c| c["state"] == "flow"))
        })
        .await;
    let name = conns
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["state"] == "flow")
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    // Held with the queue at three quarters of its window.
    let q = h.get("/api/queues/%2F/held").await;
    assert!(q["messages_ready"].as_u64().unwrap() >= 64, "{q}");
    let t = std::time::Instant::now();
    let (status, _, _) = h
        .call(
            Method::DELETE,
            &format!("/api/connections/{}", seg(&name)),
            Some("admin"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (code, _) = forced_close(&mut events).await;
    assert_eq!(code, 320);
    h.wait_for("/api/connections", |v| {
        v.as_array()
            .is_some_and(|a| a.iter().all(|c| c["name"] != name.as_str()))
    })
    .await;
    assert!(
        t.elapsed() < std::time::Duration::from_millis(1500),
        "closed after {:?}",
        t.elapsed()
    );
    h.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A queue with a backlog on disk does not hold its publishers while its consumers work
/// through it (RabbitMQ's queues take the publishes on): 300 messages, a window of 8, a
/// consumer taking 10 a second; 20 more confirmed publishes are confirmed at once, not after
/// the 30 s the backlog takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_on_disk_does_not_hold_its_publishers() {
    let (h, dir) = Http::start_with_window("flow-backlog", 8).await;
    let conn = h.amqp().await;
    let ch = confirm_channel(&conn).await;
    within(
        "declare",
        ch.queue_declare(
            "backlog".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    let publish = |n: usize| {
        let ch = ch.clone();
        async move {
            for _ in 0..n {
                within("publish", async {
                    ch.basic_publish(
                        "".into(),
                        "backlog".into(),
                        BasicPublishOptions::default(),
                        &[b'b'; 100],
                        BasicProperties::default(),
                    )
                    .await
                })
                .await
                .unwrap();
            }
            within("confirms", ch.wait_for_confirms()).await.unwrap();
        }
    };
    publish(300).await;
    h.wait_ready("backlog", 300).await;
    let consumer_conn = h.amqp().await;
    slow_consumer(
        &consumer_conn,
        "backlog",
        std::time::Duration::from_millis(100),
    )
    .await;
    h.wait_for("/api/queues/%2F/backlog", |v| v["consumers"] == 1)
        .await;
    let t = std::time::Instant::now();
    publish(20).await;
    assert!(
        t.elapsed() < std::time::Duration::from_secs(3),
        "20 publishes confirmed after {:?}",
        t.elapsed()
    );
    h.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
