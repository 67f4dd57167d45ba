//! `warren ctl` end to end: an embedded broker with its management listener, the real
//! `warren` binary running `ctl` commands against it, and lapin on the AMQP side. Checks
//! what the commands print (tables and `--json`), what they do to the broker, and their exit
//! status and standard error on failure (the server's `reason`).

mod lapin_support;

use lapin::options::{BasicConsumeOptions, BasicGetOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use lapin_support::within;
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use warren_server::config::{ManagementConfig, UserConfig};
use warren_server::{Config, RunningBroker};

/// What one `warren ctl` run left: exit code, standard output, standard error.
#[derive(Debug)]
struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Out {
    /// Asserts exit status 0 and returns standard output.
    fn ok(self) -> String {
        assert_eq!(self.code, Some(0), "warren ctl failed: {self:?}");
        self.stdout
    }

    /// Asserts exit status 1 and returns standard error.
    fn failed(self) -> String {
        assert_eq!(
            self.code,
            Some(1),
            "warren ctl should have failed: {self:?}"
        );
        assert!(
            self.stderr.starts_with("warren ctl: "),
            "no reason on stderr: {self:?}"
        );
        self.stderr
    }

    fn json(self) -> Value {
        let text = self.ok();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }
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

/// An embedded broker with the management API on an ephemeral port and the users `admin`
/// (administrator) and `plain` (no tags), passwords `<name>-pw`.
struct Env {
    broker: Option<RunningBroker>,
    port: u16,
}

impl Env {
    async fn start() -> Env {
        Self::start_with(|_| {}).await
    }

    async fn start_with(adjust: impl FnOnce(&mut Config)) -> Env {
        // `..default()`: the management section grows keys on other branches.
        #[allow(clippy::needless_update)]
        let management = ManagementConfig {
            enabled: true,
            listen: "127.0.0.1:0".parse().unwrap(),
            ..ManagementConfig::default()
        };
        let mut config = Config {
            users: vec![user("admin", &["administrator"]), user("plain", &[])],
            management,
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
        let port = broker.management_addrs()[0].port();
        Env {
            broker: Some(broker),
            port,
        }
    }

    fn broker(&self) -> &RunningBroker {
        self.broker.as_ref().expect("running")
    }

    async fn amqp(&self) -> Connection {
        let addr = self.broker().amqp_addr();
        within(
            "connect",
            Connection::connect(
                &format!("amqp://admin:admin-pw@{addr}/%2f"),
                ConnectionProperties::default(),
            ),
        )
        .await
        .expect("AMQP connection")
    }

    /// `warren ctl` as admin.
    async fn ctl(&self, args: &[&str]) -> Out {
        self.ctl_as("admin", "admin-pw", args).await
    }

    /// `warren ctl -u USER -p PASSWORD ARGS...` against this broker.
    async fn ctl_as(&self, user: &str, password: &str, args: &[&str]) -> Out {
        let port = self.port.to_string();
        let mut all = vec!["-H", "127.0.0.1", "-P", &port, "-u", user, "-p", password];
        all.extend_from_slice(args);
        run_ctl(&all, &[], None).await
    }

    async fn stop(mut self) {
        if let Some(b) = self.broker.take() {
            within("broker shutdown", b.shutdown()).await;
        }
    }
}

/// Runs `warren ctl ARGS...` with only `env` among the WARREN_* variables, `stdin` as its
/// standard input (empty when `None`), bounded by [`lapin_support::WAIT`].
async fn run_ctl(args: &[&str], env: &[(&str, &str)], stdin: Option<PathBuf>) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warren"));
    cmd.arg("ctl").args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("WARREN_") {
            cmd.env_remove(&k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    match stdin {
        Some(p) => cmd.stdin(std::fs::File::open(p).expect("stdin file")),
        None => cmd.stdin(std::process::Stdio::null()),
    };
    let out = within(
        "warren ctl",
        tokio::task::spawn_blocking(move || cmd.output()),
    )
    .await
    .expect("joined")
    .expect("warren ctl runs");
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The rows of a table as `warren ctl` prints it (python rabbitmqadmin's look: borders and
/// the header's underline are `+---+---+` lines, rows `| a | b |`): the header's cells are
/// the keys.
fn table(text: &str) -> Vec<HashMap<String, String>> {
    for l in text.lines().filter(|l| l.starts_with('+')) {
        assert!(
            l.chars().all(|c| c == '+' || c == '-'),
            "a border or underline of dash runs: {l}\n{text}"
        );
    }
    let mut lines = text.lines().filter(|l| l.starts_with('|')).map(|l| {
        l.trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect::<Vec<_>>()
    });
    let header = lines.next().unwrap_or_else(|| panic!("no table in {text}"));
    lines
        .map(|row| header.iter().cloned().zip(row).collect())
        .collect()
}

/// The table row whose `key` column is `value`.
fn row<'a>(
    rows: &'a [HashMap<String, String>],
    key: &str,
    value: &str,
) -> &'a HashMap<String, String> {
    rows.iter()
        .find(|r| r.get(key).map(String::as_str) == Some(value))
        .unwrap_or_else(|| panic!("no row with {key} = {value} in {rows:?}"))
}

/// The object of a JSON array whose `name` is `name`.
fn named<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_array()
        .expect("a JSON array")
        .iter()
        .find(|o| o["name"] == name)
}

async fn channel(conn: &Connection) -> Channel {
    let ch = within("channel.open", conn.create_channel())
        .await
        .expect("channel");
    lapin_support::confirm_select(&ch).await;
    ch
}

/// Publishes `body` to the default exchange with confirms: once confirmed, it is in the queue.
async fn publish(ch: &Channel, queue: &str, body: &str) {
    lapin_support::publish(ch, "", queue, body.as_bytes()).await;
}

/// Every body left in `queue`, in order (basic.get, no-ack).
async fn drain(ch: &Channel, queue: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(body) = lapin_support::get(ch, queue).await {
        out.push(body);
        assert!(out.len() < 1000, "{queue} never drains");
    }
    out
}

/// Waits (bounded) until `list queues --json` shows `n` ready messages in queue `q` of `/`.
async fn wait_ready(env: &Env, q: &str, n: u64) {
    let deadline = Instant::now() + lapin_support::WAIT;
    loop {
        let list = env
            .ctl(&["list", "queues", "--vhost", "/", "--json"])
            .await
            .json();
        let ready = named(&list, q).and_then(|o| o["messages_ready"].as_u64());
        if ready == Some(n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "queue {q}: messages_ready {ready:?}, expected {n}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-ctl-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_declare_list_get_purge_delete() {
    let env = Env::start().await;
    let out = env
        .ctl(&[
            "declare",
            "queue",
            "--name",
            "ctl-q",
            "--durable",
            "false",
            "--arguments",
            r#"{"x-max-length": 100}"#,
        ])
        .await
        .ok();
    assert_eq!(out.trim(), "queue declared");

    // Declared over HTTP, used over AMQP.
    let conn = env.amqp().await;
    let ch = channel(&conn).await;
    for i in 0..3 {
        publish(&ch, "ctl-q", &format!("m{i}")).await;
    }

    // The table shows the depth.
    let rows = table(&env.ctl(&["list", "queues"]).await.ok());
    let q = row(&rows, "name", "ctl-q");
    assert_eq!(q["vhost"], "/");
    assert_eq!(q["durable"], "false");
    assert_eq!(q["messages_ready"], "3", "{rows:?}");
    assert_eq!(q["messages"], "3");
    assert_eq!(q["consumers"], "0");
    // So does the JSON, with the arguments given.
    let list = env.ctl(&["list", "queues", "--json"]).await.json();
    let q = named(&list, "ctl-q").expect("listed");
    assert_eq!(q["messages_ready"], 3);
    assert_eq!(q["durable"], false);
    assert_eq!(q["arguments"]["x-max-length"], 100);
    // Chosen columns.
    let rows = table(
        &env.ctl(&["list", "queues", "--columns", "name,messages"])
            .await
            .ok(),
    );
    assert_eq!(row(&rows, "name", "ctl-q").len(), 2);
    assert_eq!(row(&rows, "name", "ctl-q")["messages"], "3");

    // get requeues by default: the first two, and they stay.
    let rows = table(
        &env.ctl(&["get", "--queue", "ctl-q", "--count", "2"])
            .await
            .ok(),
    );
    let payloads: Vec<&str> = rows.iter().map(|r| r["payload"].as_str()).collect();
    assert_eq!(payloads, ["m0", "m1"]);
    assert_eq!(rows[0]["payload_bytes"], "2");
    wait_ready(&env, "ctl-q", 3).await;
    // ack-requeue-false takes one away.
    let got = env
        .ctl(&[
            "get",
            "--queue",
            "ctl-q",
            "--ackmode",
            "ack-requeue-false",
            "--json",
        ])
        .await
        .json();
    assert_eq!(got[0]["payload"], "m0");
    assert_eq!(got[0]["redelivered"], true);
    assert_eq!(got[0]["message_count"], 2);
    wait_ready(&env, "ctl-q", 2).await;

    // purge empties it: AMQP sees nothing.
    assert_eq!(
        env.ctl(&["purge", "queue", "--name", "ctl-q"])
            .await
            .ok()
            .trim(),
        "queue purged"
    );
    wait_ready(&env, "ctl-q", 0).await;
    let empty = within(
        "basic.get",
        ch.basic_get("ctl-q".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .expect("basic.get");
    assert!(empty.is_none());

    // delete removes it; a second delete is a 404 with the server's reason.
    assert_eq!(
        env.ctl(&["delete", "queue", "--name", "ctl-q"])
            .await
            .ok()
            .trim(),
        "queue deleted"
    );
    let list = env.ctl(&["list", "queues", "--json"]).await.json();
    assert!(named(&list, "ctl-q").is_none(), "{list}");
    let err = env
        .ctl(&["delete", "queue", "--name", "ctl-q"])
        .await
        .failed();
    assert!(err.contains("Not Found") && err.contains("404"), "{err}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_objects_and_refusals_exit_non_zero_with_the_reason() {
    let env = Env::start().await;
    for args in [
        &["purge", "queue", "--name", "nope"][..],
        &["get", "--queue", "nope"],
        &["delete", "exchange", "--name", "nope"],
        &["list", "queues", "--vhost", "no-such-vhost"],
        &["publish", "--exchange", "nope", "--payload", "x"],
    ] {
        let out = env.ctl(args).await;
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
        let err = out.failed();
        assert!(err.contains("404"), "{args:?}: {err}");
    }
    // An inequivalent redeclare: 400 with RabbitMQ's reason.
    env.ctl(&["declare", "queue", "--name", "d", "--durable", "true"])
        .await
        .ok();
    let err = env
        .ctl(&["declare", "queue", "--name", "d", "--durable", "false"])
        .await
        .failed();
    assert!(
        err.contains("inequivalent arg 'durable'") && err.contains("HTTP 400"),
        "{err}"
    );
    // A standard exchange cannot be deleted.
    let err = env
        .ctl(&["delete", "exchange", "--name", "amq.direct"])
        .await
        .failed();
    assert!(err.contains("Access refused"), "{err}");
    // --if-empty: refused while the queue has a message, and the queue stays.
    let conn = env.amqp().await;
    let ch = channel(&conn).await;
    publish(&ch, "d", "x").await;
    let err = env
        .ctl(&["delete", "queue", "--name", "d", "--if-empty"])
        .await
        .failed();
    assert!(err.contains("HTTP 400"), "{err}");
    wait_ready(&env, "d", 1).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_and_missing_tags_exit_non_zero_with_the_reason() {
    let env = Env::start().await;
    let out = env.ctl_as("admin", "wrong", &["list", "queues"]).await;
    assert!(out.stdout.is_empty());
    let err = out.failed();
    assert!(
        err.contains("Not_Authorized") && err.contains("HTTP 401"),
        "{err}"
    );
    let err = env.ctl_as("nobody", "x", &["overview"]).await.failed();
    assert!(err.contains("Not_Authorized"), "{err}");
    // A user without a management tag.
    let err = env
        .ctl_as("plain", "plain-pw", &["list", "queues"])
        .await
        .failed();
    assert!(err.contains("Not management user"), "{err}");
    // Nothing listening: the transport error, exit status 1.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let err = run_ctl(&["-H", "127.0.0.1", "-P", &port, "overview"], &[], None)
        .await
        .failed();
    assert!(
        err.contains(&format!("GET http://127.0.0.1:{port}/api/overview")),
        "{err}"
    );
    // Bad input is refused before anything is sent; a usage error exits with 2.
    let err = env
        .ctl(&["declare", "queue", "--name", "x", "--arguments", "[1]"])
        .await
        .failed();
    assert!(err.contains("--arguments must be a JSON object"), "{err}");
    let list = env.ctl(&["list", "queues", "--json"]).await.json();
    assert!(named(&list, "x").is_none());
    let out = env.ctl(&["list", "things"]).await;
    assert_eq!(out.code, Some(2), "{out:?}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn environment_variables_name_the_server_and_user() {
    let env = Env::start().await;
    let url = format!("http://127.0.0.1:{}", env.port);
    let out = run_ctl(
        &["overview", "--json"],
        &[
            ("WARREN_CTL_URL", &url),
            ("WARREN_CTL_USERNAME", "admin"),
            ("WARREN_CTL_PASSWORD", "admin-pw"),
        ],
        None,
    )
    .await
    .json();
    assert_eq!(out["product_name"], "Warren");
    // The same variables with a wrong password: refused.
    let err = run_ctl(
        &["overview"],
        &[
            ("WARREN_CTL_URL", &url),
            ("WARREN_CTL_USERNAME", "admin"),
            ("WARREN_CTL_PASSWORD", "nope"),
        ],
        None,
    )
    .await
    .failed();
    assert!(err.contains("Not_Authorized"), "{err}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exchanges_bindings_and_publish() {
    let env = Env::start().await;
    env.ctl(&["declare", "queue", "--name", "bq", "--durable", "false"])
        .await
        .ok();
    let out = env
        .ctl(&[
            "declare",
            "exchange",
            "--name",
            "ctl.x",
            "--type",
            "topic",
            "--durable",
            "false",
        ])
        .await
        .ok();
    assert_eq!(out.trim(), "exchange declared");
    let out = env
        .ctl(&[
            "declare",
            "binding",
            "--source",
            "ctl.x",
            "--destination",
            "bq",
            "--routing-key",
            "a.#",
        ])
        .await
        .ok();
    assert_eq!(out.trim(), "binding declared");

    let rows = table(&env.ctl(&["list", "exchanges"]).await.ok());
    assert_eq!(row(&rows, "name", "ctl.x")["type"], "topic");
    let rows = table(&env.ctl(&["list", "bindings", "--vhost", "/"]).await.ok());
    let b = row(&rows, "source", "ctl.x");
    assert_eq!(b["destination"], "bq");
    assert_eq!(b["routing_key"], "a.#");

    // Published with ctl through the binding, read with lapin with its properties.
    let out = env
        .ctl(&[
            "publish",
            "--exchange",
            "ctl.x",
            "--routing-key",
            "a.b",
            "--payload",
            "through ctl",
            "--properties",
            r#"{"content_type": "text/plain", "delivery_mode": 2, "headers": {"k": "v"}}"#,
        ])
        .await;
    assert!(out.stderr.is_empty(), "{out:?}");
    assert_eq!(out.ok().trim(), "message published and routed");
    let conn = env.amqp().await;
    let ch = channel(&conn).await;
    let msg = within(
        "basic.get",
        ch.basic_get("bq".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .expect("basic.get")
    .expect("a message");
    assert_eq!(msg.delivery.data, b"through ctl");
    assert_eq!(msg.delivery.exchange.as_str(), "ctl.x");
    assert_eq!(msg.delivery.routing_key.as_str(), "a.b");
    let props = &msg.delivery.properties;
    assert_eq!(
        props.content_type().as_ref().map(|s| s.as_str()),
        Some("text/plain")
    );
    assert_eq!(*props.delivery_mode(), Some(2));
    let headers = props.headers().as_ref().expect("headers");
    assert!(matches!(
        headers.inner().get("k"),
        Some(AMQPValue::LongString(s)) if s.to_string() == "v"
    ));

    // A body that is not UTF-8, from a file: sent as base64, arrives byte for byte.
    let dir = temp_dir("publish");
    let file = dir.join("body.bin");
    let body: Vec<u8> = vec![0, 159, 146, 150, 255, b'x'];
    std::fs::write(&file, &body).unwrap();
    env.ctl(&[
        "publish",
        "--routing-key",
        "bq",
        "--payload-file",
        file.to_str().unwrap(),
    ])
    .await
    .ok();
    // And from standard input.
    let stdin = dir.join("stdin.txt");
    std::fs::write(&stdin, "from stdin").unwrap();
    let port = env.port.to_string();
    run_ctl(
        &[
            "-P",
            &port,
            "-u",
            "admin",
            "-p",
            "admin-pw",
            "publish",
            "--routing-key",
            "bq",
        ],
        &[],
        Some(stdin),
    )
    .await
    .ok();
    let got = drain(&ch, "bq").await;
    assert_eq!(got, [body, b"from stdin".to_vec()]);

    // Unroutable: exit status 0, said on stderr.
    let out = env
        .ctl(&[
            "publish",
            "--exchange",
            "ctl.x",
            "--routing-key",
            "zzz",
            "--payload",
            "x",
        ])
        .await;
    assert_eq!(out.code, Some(0));
    assert!(out.stderr.contains("NOT routed"), "{out:?}");

    // Deleting the binding by routing key: publishes no longer reach the queue.
    let out = env
        .ctl(&[
            "delete",
            "binding",
            "--source",
            "ctl.x",
            "--destination",
            "bq",
            "--routing-key",
            "a.#",
        ])
        .await
        .ok();
    assert_eq!(out.trim(), "binding deleted");
    let list = env.ctl(&["list", "bindings", "--json"]).await.json();
    assert!(
        !list
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["source"] == "ctl.x"),
        "{list}"
    );
    let out = env
        .ctl(&[
            "publish",
            "--exchange",
            "ctl.x",
            "--routing-key",
            "a.b",
            "--payload",
            "x",
            "--json",
        ])
        .await;
    assert_eq!(out.code, Some(0));
    assert!(out.stderr.contains("NOT routed"));
    assert_eq!(
        serde_json::from_str::<Value>(&out.stdout).unwrap()["routed"],
        false
    );
    // A binding that is not there.
    let err = env
        .ctl(&[
            "delete",
            "binding",
            "--source",
            "ctl.x",
            "--destination",
            "bq",
            "--routing-key",
            "a.#",
        ])
        .await
        .failed();
    assert!(err.contains("no binding from exchange 'ctl.x'"), "{err}");

    // Exchange-to-exchange binding, then the exchange goes.
    env.ctl(&["declare", "exchange", "--name", "ctl.y", "--type", "fanout"])
        .await
        .ok();
    env.ctl(&[
        "declare",
        "binding",
        "--source",
        "ctl.y",
        "--destination",
        "ctl.x",
        "--destination-type",
        "exchange",
    ])
    .await
    .ok();
    let list = env.ctl(&["list", "bindings", "--json"]).await.json();
    assert!(list
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["source"] == "ctl.y"
            && b["destination"] == "ctl.x"
            && b["destination_type"] == "exchange"));
    env.ctl(&["delete", "exchange", "--name", "ctl.y"])
        .await
        .ok();
    let list = env.ctl(&["list", "exchanges", "--json"]).await.json();
    assert!(named(&list, "ctl.y").is_none());
    assert!(named(&list, "ctl.x").is_some());
    let _ = std::fs::remove_dir_all(dir);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_health_checks_and_read_only_lists() {
    let env = Env::start().await;
    let o = env.ctl(&["overview", "--json"]).await.json();
    assert_eq!(o["product_name"], "Warren");
    let rows = table(&env.ctl(&["overview"]).await.ok());
    assert_eq!(row(&rows, "key", "product_name")["value"], "Warren");
    assert!(rows.iter().any(|r| r["key"] == "object_totals.queues"));

    for check in [
        &["health-check", "alarms"][..],
        &["health-check", "local-alarms"],
        &["health-check", "virtual-hosts"],
        &["health-check", "protocol-listener", "amqp"],
        &["health-check", "aliveness"],
        &["health-check", "is-in-service"],
        &["health-check", "ready-to-serve-clients"],
        &["health-check", "below-node-connection-limit"],
        &["health-check", "node-is-quorum-critical"],
        &["health-check", "quorum-queues-without-elected-leaders"],
        &[
            "health-check",
            "quorum-queues-without-elected-leaders",
            "--all-vhosts",
            "--pattern",
            "^orders",
        ],
        // No TLS listener: no certificate to expire.
        &["health-check", "certificate-expiration", "4", "weeks"],
    ] {
        assert_eq!(env.ctl(check).await.ok().trim(), "ok", "{check:?}");
    }
    let amqp_port = env.broker().amqp_addr().port().to_string();
    assert_eq!(
        env.ctl(&["health-check", "port-listener", &amqp_port])
            .await
            .ok()
            .trim(),
        "ok"
    );
    let out = env
        .ctl(&["health-check", "port-listener", "1", "--json"])
        .await;
    let err = out.failed();
    assert!(
        err.contains("No active listener") && err.contains("HTTP 503"),
        "{err}"
    );
    let err = env
        .ctl(&["health-check", "certificate-expiration", "4", "fortnights"])
        .await
        .failed();
    assert!(err.contains("Time unit not recognised"), "{err}");

    let users = env.ctl(&["list", "users", "--json"]).await.json();
    assert!(named(&users, "admin").is_some(), "{users}");
    let rows = table(&env.ctl(&["list", "users"]).await.ok());
    assert_eq!(row(&rows, "name", "admin")["tags"], "administrator");
    let rows = table(&env.ctl(&["list", "vhosts"]).await.ok());
    row(&rows, "name", "/");
    let rows = table(&env.ctl(&["list", "permissions", "--vhost", "/"]).await.ok());
    let p = row(&rows, "user", "admin");
    assert_eq!(p["configure"], ".*");
    let perms = env
        .ctl(&["list", "permissions", "--vhost", "other", "--json"])
        .await
        .json();
    assert_eq!(perms, Value::Array(vec![]));
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_definitions_load_into_a_new_broker() {
    let env = Env::start().await;
    env.ctl(&["declare", "queue", "--name", "exp-q"]).await.ok();
    env.ctl(&["declare", "exchange", "--name", "exp-x", "--type", "fanout"])
        .await
        .ok();
    env.ctl(&[
        "declare",
        "binding",
        "--source",
        "exp-x",
        "--destination",
        "exp-q",
    ])
    .await
    .ok();
    let dir = temp_dir("export");
    let file = dir.join("defs.json");
    let out = env
        .ctl(&["export", "definitions", "--file", file.to_str().unwrap()])
        .await
        .ok();
    assert!(out.contains("exported definitions to"), "{out}");
    let from_file: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    // Standard output carries the same document.
    let from_stdout = env.ctl(&["export", "definitions"]).await.json();
    assert_eq!(from_file, from_stdout);
    assert!(
        named(&from_file["queues"], "exp-q").is_some(),
        "{from_file}"
    );
    assert!(named(&from_file["exchanges"], "exp-x").is_some());
    env.stop().await;

    // A new broker loads the file: the ctl's export is a valid definitions file.
    let defs = file.clone();
    let env = Env::start_with(move |c| c.definitions.load_file = Some(defs)).await;
    let list = env.ctl(&["list", "queues", "--json"]).await.json();
    assert!(named(&list, "exp-q").is_some(), "{list}");
    let list = env.ctl(&["list", "bindings", "--json"]).await.json();
    assert!(list
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["source"] == "exp-x" && b["destination"] == "exp-q"));
    env.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_refuses_what_is_not_a_definitions_document() {
    let env = Env::start().await;
    let dir = temp_dir("import-bad");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{ not json").unwrap();
    let err = env
        .ctl(&["import", "definitions", "--file", bad.to_str().unwrap()])
        .await
        .failed();
    assert!(err.contains("not valid JSON"), "{err}");
    let err = env
        .ctl(&["import", "definitions", "--file", "/nonexistent/defs.json"])
        .await
        .failed();
    assert!(err.contains("cannot read /nonexistent/defs.json"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
    env.stop().await;
}

/// Export from one broker, import into a fresh one with `import definitions` (a file, then
/// standard input), export again: the same queues, exchanges and bindings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_export_import_round_trip() {
    let a = Env::start().await;
    a.ctl(&[
        "declare",
        "queue",
        "--name",
        "rt-q",
        "--arguments",
        r#"{"x-max-length": 5}"#,
    ])
    .await
    .ok();
    a.ctl(&["declare", "exchange", "--name", "rt-x", "--type", "topic"])
        .await
        .ok();
    a.ctl(&[
        "declare",
        "binding",
        "--source",
        "rt-x",
        "--destination",
        "rt-q",
        "--routing-key",
        "k.*",
    ])
    .await
    .ok();
    let dir = temp_dir("roundtrip");
    let file = dir.join("defs.json");
    a.ctl(&["export", "definitions", "--file", file.to_str().unwrap()])
        .await
        .ok();
    let exported: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    a.stop().await;

    let pick = |defs: &Value| {
        let names = |k: &str| {
            let mut v: Vec<String> = defs[k]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.to_string())
                .collect();
            v.sort();
            v
        };
        (names("queues"), names("exchanges"), names("bindings"))
    };
    for from_stdin in [false, true] {
        let b = Env::start().await;
        let out = if from_stdin {
            let port = b.port.to_string();
            run_ctl(
                &[
                    "-P",
                    &port,
                    "-u",
                    "admin",
                    "-p",
                    "admin-pw",
                    "import",
                    "definitions",
                ],
                &[],
                Some(file.clone()),
            )
            .await
        } else {
            b.ctl(&["import", "definitions", "--file", file.to_str().unwrap()])
                .await
        };
        assert_eq!(out.ok().trim(), "imported definitions");
        let again = b.ctl(&["export", "definitions"]).await.json();
        assert_eq!(pick(&again), pick(&exported));
        let list = b.ctl(&["list", "queues", "--json"]).await.json();
        assert_eq!(
            named(&list, "rt-q").unwrap()["arguments"]["x-max-length"],
            5
        );
        b.stop().await;
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Connections, channels and consumers of a lapin client, then the connection closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_channels_consumers_and_close() {
    let env = Env::start().await;
    env.ctl(&["declare", "queue", "--name", "cq", "--durable", "false"])
        .await
        .ok();
    let conn = env.amqp().await;
    let ch = channel(&conn).await;
    within(
        "basic.qos",
        ch.basic_qos(7, lapin::options::BasicQosOptions::default()),
    )
    .await
    .unwrap();
    let _consumer = within(
        "basic.consume",
        ch.basic_consume(
            "cq".into(),
            "ctl-tag".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("basic.consume");

    let conns = env.ctl(&["list", "connections", "--json"]).await.json();
    let c = conns
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["user"] == "admin")
        .unwrap_or_else(|| panic!("no connection of admin in {conns}"));
    let name = c["name"].as_str().unwrap().to_string();
    let rows = table(&env.ctl(&["list", "connections"]).await.ok());
    assert_eq!(row(&rows, "name", &name)["vhost"], "/");
    let rows = table(&env.ctl(&["list", "connections", "--vhost", "/"]).await.ok());
    row(&rows, "name", &name);

    let chans = env.ctl(&["list", "channels", "--json"]).await.json();
    let chan = chans
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["connection_details"]["name"] == name.as_str())
        .unwrap_or_else(|| panic!("no channel of {name} in {chans}"));
    assert_eq!(chan["prefetch_count"], 7);
    assert_eq!(chan["consumer_count"], 1);
    let rows = table(&env.ctl(&["list", "channels"]).await.ok());
    assert_eq!(
        row(&rows, "name", chan["name"].as_str().unwrap())["consumer_count"],
        "1"
    );

    let rows = table(&env.ctl(&["list", "consumers"]).await.ok());
    let c = row(&rows, "consumer_tag", "ctl-tag");
    assert_eq!(c["queue.name"], "cq");
    assert_eq!(c["queue.vhost"], "/");
    let rows = table(&env.ctl(&["list", "consumers", "--vhost", "/"]).await.ok());
    row(&rows, "consumer_tag", "ctl-tag");

    // Closing it: lapin sees the connection end, the list no longer has it.
    let out = env
        .ctl(&[
            "close",
            "connection",
            "--name",
            &name,
            "--reason",
            "ctl test",
        ])
        .await
        .ok();
    assert_eq!(out.trim(), "connection closed");
    let deadline = Instant::now() + lapin_support::WAIT;
    while conn.status().connected() {
        assert!(Instant::now() < deadline, "connection still open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The broker forgets the connection once its side has finished, a moment after the
    // client has seen close-ok.
    loop {
        let conns = env.ctl(&["list", "connections", "--json"]).await.json();
        let listed = conns
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == name.as_str());
        if !listed {
            break;
        }
        assert!(Instant::now() < deadline, "connection still listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = env
        .ctl(&["close", "connection", "--name", &name])
        .await
        .failed();
    assert!(err.contains("404"), "{err}");
    env.stop().await;
}

/// A vhost, a user and a permission created with ctl, used by the new user, then deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vhosts_users_and_permissions() {
    let env = Env::start().await;
    assert_eq!(
        env.ctl(&[
            "declare",
            "vhost",
            "--name",
            "ctl-vh",
            "--description",
            "made by ctl"
        ])
        .await
        .ok()
        .trim(),
        "vhost declared"
    );
    assert_eq!(
        env.ctl(&[
            "declare",
            "user",
            "--name",
            "ctl-user",
            "--password",
            "s3cret",
            "--tags",
            "management,policymaker",
        ])
        .await
        .ok()
        .trim(),
        "user declared"
    );
    env.ctl(&[
        "declare",
        "permission",
        "--vhost",
        "ctl-vh",
        "--user",
        "ctl-user",
        "--configure",
        "^ctl-",
        "--write",
        ".*",
        "--read",
        ".*",
    ])
    .await
    .ok();

    let rows = table(&env.ctl(&["list", "vhosts"]).await.ok());
    assert_eq!(row(&rows, "name", "ctl-vh")["description"], "made by ctl");
    let users = env.ctl(&["list", "users", "--json"]).await.json();
    let u = named(&users, "ctl-user").unwrap_or_else(|| panic!("{users}"));
    let tags = u["tags"].to_string();
    assert!(
        tags.contains("management") && tags.contains("policymaker"),
        "{u}"
    );
    let rows = table(
        &env.ctl(&["list", "permissions", "--vhost", "ctl-vh"])
            .await
            .ok(),
    );
    assert_eq!(row(&rows, "user", "ctl-user")["configure"], "^ctl-");

    // The new user logs in to the API and works within its permissions.
    env.ctl_as(
        "ctl-user",
        "s3cret",
        &["declare", "queue", "--vhost", "ctl-vh", "--name", "ctl-q"],
    )
    .await
    .ok();
    let err = env
        .ctl_as(
            "ctl-user",
            "s3cret",
            &["declare", "queue", "--vhost", "ctl-vh", "--name", "other"],
        )
        .await
        .failed();
    assert!(err.contains("HTTP 401"), "{err}");
    // And over AMQP.
    let addr = env.broker().amqp_addr();
    let conn = within(
        "connect as ctl-user",
        Connection::connect(
            &format!("amqp://ctl-user:s3cret@{addr}/ctl-vh"),
            ConnectionProperties::default(),
        ),
    )
    .await
    .expect("ctl-user logs in");
    let ch = within("channel", conn.create_channel()).await.unwrap();
    within(
        "publish",
        ch.basic_publish(
            "".into(),
            "ctl-q".into(),
            BasicPublishOptions::default(),
            b"hi",
            BasicProperties::default(),
        ),
    )
    .await
    .unwrap();
    let _ = conn.close(200, "bye".into()).await;

    env.ctl(&[
        "delete",
        "permission",
        "--vhost",
        "ctl-vh",
        "--user",
        "ctl-user",
    ])
    .await
    .ok();
    let perms = env
        .ctl(&["list", "permissions", "--vhost", "ctl-vh", "--json"])
        .await
        .json();
    // Only the administrator who created the vhost (RabbitMQ grants its creator) is left.
    let users: Vec<&str> = perms
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["user"].as_str())
        .collect();
    assert_eq!(users, ["admin"], "{perms}");
    env.ctl(&["delete", "user", "--name", "ctl-user"])
        .await
        .ok();
    let err = env
        .ctl_as("ctl-user", "s3cret", &["overview"])
        .await
        .failed();
    assert!(err.contains("Not_Authorized"), "{err}");
    env.ctl(&["delete", "vhost", "--name", "ctl-vh"]).await.ok();
    let vhosts = env.ctl(&["list", "vhosts", "--json"]).await.json();
    assert!(named(&vhosts, "ctl-vh").is_none());
    let err = env
        .ctl(&["delete", "vhost", "--name", "ctl-vh"])
        .await
        .failed();
    assert!(err.contains("404"), "{err}");
    env.stop().await;
}

/// A policy set with ctl applies to an existing queue (its `policy` field, and max-length
/// taking effect), is listed, and goes away with delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies() {
    let env = Env::start().await;
    env.ctl(&["declare", "queue", "--name", "pol-q", "--durable", "false"])
        .await
        .ok();
    let out = env
        .ctl(&[
            "declare",
            "policy",
            "--name",
            "cap",
            "--pattern",
            "^pol-",
            "--definition",
            r#"{"max-length": 1}"#,
            "--apply-to",
            "queues",
            "--priority",
            "3",
        ])
        .await
        .ok();
    assert_eq!(out.trim(), "policy declared");
    let rows = table(&env.ctl(&["list", "policies"]).await.ok());
    let p = row(&rows, "name", "cap");
    assert_eq!(p["pattern"], "^pol-");
    assert_eq!(p["apply-to"], "queues");
    assert_eq!(p["priority"], "3");
    let rows = table(&env.ctl(&["list", "policies", "--vhost", "/"]).await.ok());
    row(&rows, "name", "cap");

    let deadline = Instant::now() + lapin_support::WAIT;
    loop {
        let list = env.ctl(&["list", "queues", "--json"]).await.json();
        if named(&list, "pol-q").unwrap()["policy"] == "cap" {
            break;
        }
        assert!(Instant::now() < deadline, "policy not applied: {list}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let conn = env.amqp().await;
    let ch = channel(&conn).await;
    publish(&ch, "pol-q", "a").await;
    publish(&ch, "pol-q", "b").await;
    wait_ready(&env, "pol-q", 1).await;

    env.ctl(&["delete", "policy", "--name", "cap"]).await.ok();
    let list = env.ctl(&["list", "policies", "--json"]).await.json();
    assert!(named(&list, "cap").is_none(), "{list}");
    let err = env
        .ctl(&["delete", "policy", "--name", "cap"])
        .await
        .failed();
    assert!(err.contains("404"), "{err}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_parameters_are_listed() {
    let env = Env::start().await;
    let dir = std::env::temp_dir().join(format!("warren-ctl-params-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("params.json");
    std::fs::write(
        &file,
        serde_json::json!({
            "parameters": [{"vhost": "/", "component": "vhost-limits", "name": "limits",
                            "value": {"max-queues": 9}}],
            "global_parameters": [{"name": "cluster_name", "value": "ctl-cluster"}]
        })
        .to_string(),
    )
    .unwrap();
    env.ctl(&["import", "definitions", "--file", file.to_str().unwrap()])
        .await
        .ok();
    let rows = table(&env.ctl(&["list", "parameters"]).await.ok());
    let p = row(&rows, "component", "vhost-limits");
    assert_eq!(p["vhost"], "/");
    assert_eq!(p["name"], "limits");
    assert!(p["value"].contains("max-queues"), "{p:?}");
    let list = env
        .ctl(&["list", "parameters", "--vhost", "other", "--json"])
        .await
        .json();
    assert_eq!(list, serde_json::json!([]));
    let list = env
        .ctl(&["list", "global-parameters", "--json"])
        .await
        .json();
    assert_eq!(
        list,
        serde_json::json!([{"name": "cluster_name", "value": "ctl-cluster"}])
    );
    let _ = std::fs::remove_dir_all(dir);
    env.stop().await;
}
