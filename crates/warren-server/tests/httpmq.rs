//! The httpmq/httpsqs HTTP queue API over real sockets: an embedded broker with a data
//! directory and its httpmq listener, a real HTTP client (reqwest), lapin on the AMQP side,
//! and the `warren` binary killed with SIGKILL. Every opt and every error reply, the exact
//! status reports, positions (also after a restart), auth by password and by Warren users
//! with their permissions, AMQP interoperation, concurrency and crash durability.

mod binary_support;
mod tls_support;

use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use reqwest::StatusCode;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use warren_server::config::{PermissionConfig, UserConfig};
use warren_server::{Config, RunningBroker};

const WAIT: Duration = Duration::from_secs(30);

async fn within<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-httpmq-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One HTTP answer.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    content_type: String,
    pos: Option<u64>,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap_or("<binary>")
    }
}

struct Mq {
    broker: Option<RunningBroker>,
    base: String,
    amqp: std::net::SocketAddr,
    client: reqwest::Client,
}

impl Mq {
    async fn start(dir: &Path) -> Mq {
        Self::start_with(dir, |_| {}).await
    }

    async fn start_with(dir: &Path, tweak: impl FnOnce(&mut Config)) -> Mq {
        let mut config = Config::default();
        config.storage.data_dir = Some(dir.to_path_buf());
        config.httpmq.listen = "127.0.0.1:0".parse().unwrap();
        tweak(&mut config);
        let broker = within(
            "broker start",
            warren_server::Broker::builder()
                .config(config)
                .bind("127.0.0.1:0")
                .httpmq(true)
                .start(),
        )
        .await
        .expect("broker starts");
        let base = format!("http://{}", broker.httpmq_addrs()[0]);
        Mq {
            amqp: broker.amqp_addr(),
            broker: Some(broker),
            base,
            client: reqwest::Client::new(),
        }
    }

    async fn stop(mut self) {
        if let Some(b) = self.broker.take() {
            within("shutdown", b.shutdown()).await;
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Answer {
        let r = within("HTTP reply", req.send()).await.expect("HTTP reply");
        let status = r.status();
        let content_type = r
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let pos = r
            .headers()
            .get("pos")
            .map(|v| v.to_str().unwrap().parse().expect("Pos is an integer"));
        let body = r.bytes().await.expect("body").to_vec();
        Answer {
            status,
            content_type,
            pos,
            body,
        }
    }

    async fn get(&self, query: &str) -> Answer {
        self.send(self.client.get(format!("{}/?{query}", self.base)))
            .await
    }

    async fn post(&self, query: &str, content_type: Option<&str>, body: Vec<u8>) -> Answer {
        let mut req = self
            .client
            .post(format!("{}/?{query}", self.base))
            .body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        self.send(req).await
    }

    async fn connect(&self) -> Connection {
        within(
            "AMQP connect",
            Connection::connect(
                &format!("amqp://guest:guest@{}/%2f", self.amqp),
                ConnectionProperties::default(),
            ),
        )
        .await
        .expect("connect")
    }
}

fn ok_put(a: &Answer, pos: u64) {
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.text(), "HTTPMQ_PUT_OK");
    assert_eq!(a.pos, Some(pos), "{a:?}");
}

fn plain(a: &Answer, text: &str) {
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.text(), text, "{a:?}");
    assert_eq!(a.pos, None, "{a:?}");
}

fn user(name: &str) -> UserConfig {
    UserConfig {
        name: name.into(),
        password: Some(warren_broker::access::Cleartext::new(format!("{name}-pw"))),
        password_hash: None,
        hashing_algorithm: None,
        tags: Vec::new(),
        loopback_only: false,
        max_connections: None,
        max_channels: None,
    }
}

fn permission(user: &str, configure: &str, write: &str, read: &str) -> PermissionConfig {
    PermissionConfig {
        user: user.into(),
        vhost: "/".into(),
        configure: configure.into(),
        write: write.into(),
        read: read.into(),
    }
}

#[tokio::test]
async fn puts_of_every_form_are_got_in_order_byte_for_byte_with_their_positions() {
    let dir = tempdir("forms");
    let mq = Mq::start(&dir).await;
    let binary: Vec<u8> = (0..=255u8).collect();
    let big: Vec<u8> = (0..64 * 1024).map(|i| (i * 7 % 251) as u8).collect();
    ok_put(&mq.get("name=q&opt=put&data=hello%20world+!").await, 1);
    ok_put(
        &mq.post("name=q&opt=put", None, b"raw body".to_vec()).await,
        2,
    );
    ok_put(
        &mq.post(
            "name=q&opt=put",
            Some("application/x-www-form-urlencoded"),
            b"data=form%26field&other=1".to_vec(),
        )
        .await,
        3,
    );
    ok_put(
        &mq.post(
            "name=q&opt=put",
            Some("application/octet-stream"),
            binary.clone(),
        )
        .await,
        4,
    );
    ok_put(&mq.post("name=q&opt=put", None, big.clone()).await, 5);
    ok_put(&mq.get("name=q&opt=put&data=%FF%00%80").await, 6);
    let expected: Vec<Vec<u8>> = vec![
        b"hello world !".to_vec(),
        b"raw body".to_vec(),
        b"form&field".to_vec(),
        binary,
        big,
        vec![0xff, 0x00, 0x80],
    ];
    for (i, want) in expected.iter().enumerate() {
        let a = mq.get("name=q&opt=get").await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.content_type, "text/plain");
        assert_eq!(a.pos, Some(i as u64 + 1));
        assert_eq!(&a.body, want, "message {}", i + 1);
    }
    plain(&mq.get("name=q&opt=get").await, "HTTPMQ_GET_END");
    // A queue never put to is empty too.
    plain(&mq.get("name=never&opt=get").await, "HTTPMQ_GET_END");
    // No data, empty data, an empty body, an empty form field: nothing is stored.
    plain(&mq.get("name=q&opt=put").await, "HTTPMQ_PUT_ERROR");
    plain(&mq.get("name=q&opt=put&data=").await, "HTTPMQ_PUT_ERROR");
    plain(
        &mq.post("name=q&opt=put", None, Vec::new()).await,
        "HTTPMQ_PUT_ERROR",
    );
    plain(
        &mq.post(
            "name=q&opt=put",
            Some("application/x-www-form-urlencoded"),
            b"data=".to_vec(),
        )
        .await,
        "HTTPMQ_PUT_ERROR",
    );
    plain(&mq.get("name=q&opt=get").await, "HTTPMQ_GET_END");
    ok_put(&mq.get("name=q&opt=put&data=next").await, 7);
    mq.stop().await;
}

#[tokio::test]
async fn status_reports_byte_for_byte_and_view_without_consuming() {
    let dir = tempdir("status");
    let mq = Mq::start(&dir).await;
    for m in ["one", "two", "three"] {
        mq.get(&format!("name=s&opt=put&data={m}")).await;
    }
    assert_eq!(mq.get("name=s&opt=get").await.text(), "one");
    let status = mq.get("name=s&opt=status").await;
    assert_eq!(status.status, StatusCode::OK);
    assert_eq!(status.pos, None);
    assert_eq!(
        status.text(),
        "HTTP Simple Queue Service v0.5\n------------------------------\nQueue Name: s\n\
         Maximum number of queues: 1000000\nPut position of queue (1st lap): 3\n\
         Get position of queue (1st lap): 1\nNumber of unread queue: 2\n\n"
    );
    plain(
        &mq.get("name=s&opt=status_json").await,
        r#"{"name":"s","maxqueue":1000000,"putpos":3,"putlap":1,"getpos":1,"getlap":1,"unread":2}"#,
    );
    // A queue that does not exist: zeros and the default maximum.
    plain(
        &mq.get("name=nothing&opt=status_json").await,
        r#"{"name":"nothing","maxqueue":1000000,"putpos":0,"putlap":1,"getpos":0,"getlap":1,"unread":0}"#,
    );
    // view: the message at a position, not consumed.
    for _ in 0..2 {
        let a = mq.get("name=s&opt=view&pos=3").await;
        assert_eq!((a.text(), a.pos), ("three", Some(3)));
    }
    let a = mq.get("name=s&opt=view&pos=2").await;
    assert_eq!((a.text(), a.pos), ("two", Some(2)));
    for bad in ["pos=1", "pos=4", "pos=0", "pos=-1", "pos=abc", "pos=", ""] {
        plain(
            &mq.get(&format!("name=s&opt=view&{bad}")).await,
            "HTTPMQ_VIEW_ERROR",
        );
    }
    plain(
        &mq.get("name=nothing&opt=view&pos=1").await,
        "HTTPMQ_VIEW_ERROR",
    );
    assert_eq!(mq.get("name=s&opt=get").await.text(), "two");
    assert_eq!(mq.get("name=s&opt=get").await.text(), "three");
    mq.stop().await;
}

#[tokio::test]
async fn maxqueue_bounds_unread_messages_and_reset_restores_everything() {
    let dir = tempdir("maxqueue");
    let mq = Mq::start(&dir).await;
    for bad in [
        "num=0",
        "num=-1",
        "num=abc",
        "num=",
        "",
        "num=10000001",
        "num=1.5",
        "num=99999999999999999999999",
    ] {
        plain(
            &mq.get(&format!("name=m&opt=maxqueue&{bad}")).await,
            "HTTPMQ_MAXQUEUE_CANCLE",
        );
    }
    plain(
        &mq.get("name=m&opt=maxqueue&num=10000000").await,
        "HTTPMQ_MAXQUEUE_OK",
    );
    plain(
        &mq.get("name=m&opt=maxqueue&num=1").await,
        "HTTPMQ_MAXQUEUE_OK",
    );
    plain(
        &mq.get("name=m&opt=maxqueue&num=2").await,
        "HTTPMQ_MAXQUEUE_OK",
    );
    ok_put(&mq.get("name=m&opt=put&data=a").await, 1);
    ok_put(&mq.get("name=m&opt=put&data=b").await, 2);
    plain(&mq.get("name=m&opt=put&data=c").await, "HTTPMQ_PUT_END");
    plain(
        &mq.post("name=m&opt=put", None, b"d".to_vec()).await,
        "HTTPMQ_PUT_END",
    );
    assert!(mq
        .get("name=m&opt=status")
        .await
        .text()
        .contains("Maximum number of queues: 2\n"));
    assert_eq!(mq.get("name=m&opt=get").await.text(), "a");
    ok_put(&mq.get("name=m&opt=put&data=e").await, 3);
    // reset: empty, positions 0, maximum back to the default.
    plain(&mq.get("name=m&opt=reset").await, "HTTPMQ_RESET_OK");
    plain(
        &mq.get("name=m&opt=status_json").await,
        r#"{"name":"m","maxqueue":1000000,"putpos":0,"putlap":1,"getpos":0,"getlap":1,"unread":0}"#,
    );
    plain(&mq.get("name=m&opt=get").await, "HTTPMQ_GET_END");
    ok_put(&mq.get("name=m&opt=put&data=f").await, 1);
    let a = mq.get("name=m&opt=get").await;
    assert_eq!((a.text(), a.pos), ("f", Some(1)));
    // Resetting a queue that does not exist is fine too.
    plain(&mq.get("name=nothing&opt=reset").await, "HTTPMQ_RESET_OK");
    mq.stop().await;
}

#[tokio::test]
async fn malformed_requests_get_httpmq_error_and_charset_sets_the_content_type() {
    let dir = tempdir("errors");
    let mq = Mq::start(&dir).await;
    for q in [
        "",
        "opt=put&data=x",
        "name=&opt=get",
        "name=q",
        "name=q&opt=",
        "name=q&opt=bogus",
        &format!("name={}&opt=put&data=x", "n".repeat(256)),
        "name=a%0Ab&opt=put&data=x",
        "name=a%0Ab&opt=status",
        "name=a%09b&opt=get",
        "name=a%7Fb&opt=put&data=x",
        "name=%C2%85&opt=put&data=x",
        "name=a%E2%80%A8b&opt=status",
    ] {
        plain(&mq.get(q).await, "HTTPMQ_ERROR");
    }
    let a = mq.get("name=c&opt=put&data=x&charset=utf-8").await;
    assert_eq!(a.content_type, "text/plain; charset=utf-8");
    let a = mq.get("name=c&opt=get&charset=gbk").await;
    assert_eq!(a.content_type, "text/plain; charset=gbk");
    assert_eq!(a.text(), "x");
    let a = mq.get("charset=utf-8").await;
    assert_eq!(
        (a.text(), a.content_type.as_str()),
        ("HTTPMQ_ERROR", "text/plain; charset=utf-8")
    );
    // Any path is the API, as in httpsqs.
    let a = mq
        .send(
            mq.client
                .get(format!("{}/any/path?name=c&opt=status_json", mq.base)),
        )
        .await;
    assert!(a.text().starts_with(r#"{"name":"c""#), "{a:?}");
    mq.stop().await;
}

#[tokio::test]
async fn queues_are_independent() {
    let dir = tempdir("independent");
    let mq = Mq::start(&dir).await;
    for i in 1..=11 {
        ok_put(&mq.get(&format!("name=a&opt=put&data=a-{i}")).await, i);
    }
    ok_put(&mq.get("name=a1&opt=put&data=a1-1").await, 1);
    let a = mq.get("name=a1&opt=get").await;
    assert_eq!((a.text(), a.pos), ("a1-1", Some(1)));
    plain(&mq.get("name=a1&opt=get").await, "HTTPMQ_GET_END");
    let a = mq.get("name=a&opt=view&pos=11").await;
    assert_eq!((a.text(), a.pos), ("a-11", Some(11)));
    plain(
        &mq.get("name=a1&opt=view&pos=11").await,
        "HTTPMQ_VIEW_ERROR",
    );
    let a = mq.get("name=a&opt=get").await;
    assert_eq!((a.text(), a.pos), ("a-1", Some(1)));
    mq.stop().await;
}

#[tokio::test]
async fn a_request_over_the_size_limit_gets_413_and_stores_nothing() {
    let dir = tempdir("too-large");
    let mq = Mq::start_with(&dir, |c| c.httpmq.max_body_bytes = 1024).await;
    let a = mq.post("name=big&opt=put", None, vec![b'x'; 2048]).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE);
    // Without a declared length (chunked), the limit is found while reading; a malformed
    // body is a bad request. Neither stores anything.
    let over = format!(
        "POST /?name=big&opt=put HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n{}\r\n0\r\n\r\n",
        "x".repeat(2048)
    );
    let bad =
        "POST /?name=big&opt=put HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
            .to_string();
    for (request, status) in [(over, "HTTP/1.1 413"), (bad, "HTTP/1.1 400")] {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = mq.base.trim_start_matches("http://").to_string();
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut reply = vec![0u8; 1024];
        let n = within("the reply", s.read(&mut reply)).await.unwrap();
        let text = String::from_utf8_lossy(&reply[..n]);
        assert!(text.starts_with(status), "{status}: {text}");
    }
    ok_put(
        &mq.post("name=big&opt=put", None, vec![b'y'; 1024]).await,
        1,
    );
    let a = mq.get("name=big&opt=get").await;
    assert_eq!(a.body, vec![b'y'; 1024]);
    plain(&mq.get("name=big&opt=get").await, "HTTPMQ_GET_END");
    mq.stop().await;
}

#[tokio::test]
async fn the_auth_password_is_checked_first_and_warren_users_log_in_with_basic_auth() {
    let dir = tempdir("auth");
    let mq = Mq::start_with(&dir, |c| {
        c.httpmq.auth = Some("s3cret".into());
        c.auth.login_failure_delay_ms = 10;
    })
    .await;
    for q in [
        "name=p&opt=put&data=x",
        "name=p&opt=put&data=x&auth=wrong",
        "name=p&opt=put&data=x&auth=s3cre",
        "name=p&opt=put&data=x&auth=s3cret1",
        "name=p&opt=put&data=x&auth=",
        // Checked before the request itself.
        "",
        "name=p&opt=bogus",
    ] {
        plain(&mq.get(q).await, "HTTPMQ_AUTH_FAILED");
    }
    ok_put(&mq.get("name=p&opt=put&data=x&auth=s3cret").await, 1);
    // A form body may carry it too.
    ok_put(
        &mq.post(
            "name=p&opt=put",
            Some("application/x-www-form-urlencoded"),
            b"data=y&auth=s3cret".to_vec(),
        )
        .await,
        2,
    );
    // A Warren user by basic auth instead of the password.
    let a = mq
        .send(
            mq.client
                .get(format!("{}/?name=p&opt=get", mq.base))
                .basic_auth("guest", Some("guest")),
        )
        .await;
    assert_eq!((a.text(), a.pos), ("x", Some(1)));
    let a = mq
        .send(
            mq.client
                .get(format!("{}/?name=p&opt=get&auth=s3cret", mq.base))
                .basic_auth("guest", Some("wrong")),
        )
        .await;
    plain(&a, "HTTPMQ_AUTH_FAILED");
    mq.stop().await;
}

#[tokio::test]
async fn warren_permissions_decide_put_get_reset_and_maxqueue() {
    let dir = tempdir("permissions");
    let mq = Mq::start_with(&dir, |c| {
        let mut guest = user("guest");
        guest.password = Some(warren_broker::access::Cleartext::new("guest".to_string()));
        c.users = vec![guest, user("producer"), user("reader"), user("nobody")];
        c.permissions = vec![
            permission("guest", ".*", ".*", ".*"),
            permission("producer", "^jobs$", "^jobs$", "^$"),
            permission("reader", "^$", "^$", "^jobs$"),
        ];
    })
    .await;
    let as_user = |name: &str, q: &str| {
        mq.client
            .get(format!("{}/?{q}", mq.base))
            .basic_auth(name, Some(format!("{name}-pw")))
    };
    ok_put(
        &mq.send(as_user("producer", "name=jobs&opt=put&data=j1"))
            .await,
        1,
    );
    // Write on the queue is not enough to create another.
    plain(
        &mq.send(as_user("producer", "name=other&opt=put&data=x"))
            .await,
        "HTTPMQ_AUTH_FAILED",
    );
    plain(
        &mq.send(as_user("producer", "name=jobs&opt=get")).await,
        "HTTPMQ_AUTH_FAILED",
    );
    plain(
        &mq.send(as_user("producer", "name=jobs&opt=view&pos=1"))
            .await,
        "HTTPMQ_AUTH_FAILED",
    );
    plain(
        &mq.send(as_user("reader", "name=jobs&opt=put&data=x")).await,
        "HTTPMQ_AUTH_FAILED",
    );
    plain(
        &mq.send(as_user("reader", "name=jobs&opt=reset")).await,
        "HTTPMQ_AUTH_FAILED",
    );
    plain(
        &mq.send(as_user("reader", "name=jobs&opt=maxqueue&num=5"))
            .await,
        "HTTPMQ_AUTH_FAILED",
    );
    plain(
        &mq.send(as_user("nobody", "name=jobs&opt=status")).await,
        "HTTPMQ_AUTH_FAILED",
    );
    plain(
        &mq.send(as_user("producer", "name=jobs&opt=maxqueue&num=5"))
            .await,
        "HTTPMQ_MAXQUEUE_OK",
    );
    let a = mq.send(as_user("reader", "name=jobs&opt=view&pos=1")).await;
    assert_eq!((a.text(), a.pos), ("j1", Some(1)));
    let a = mq.send(as_user("reader", "name=jobs&opt=get")).await;
    assert_eq!((a.text(), a.pos), ("j1", Some(1)));
    // Without basic auth, requests act as [httpmq] user (guest here, full permissions).
    ok_put(&mq.get("name=jobs&opt=put&data=j2").await, 2);
    mq.stop().await;
}

#[tokio::test]
async fn http_puts_reach_amqp_consumers_and_amqp_publishes_reach_http_gets() {
    let dir = tempdir("interop");
    let mq = Mq::start(&dir).await;
    ok_put(&mq.get("name=interop&opt=put&data=from-http").await, 1);
    let conn = mq.connect().await;
    let ch = conn.create_channel().await.unwrap();
    // The put declared the queue durable: an equivalent AMQP declare passes.
    within(
        "queue.declare",
        ch.queue_declare(
            "interop".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("the put declared a durable queue");
    let got = within(
        "basic.get",
        ch.basic_get("interop".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap()
    .expect("a message");
    assert_eq!(got.delivery.data, b"from-http");
    assert_eq!(got.delivery.properties.delivery_mode(), &Some(2));
    assert_eq!(got.delivery.routing_key.as_str(), "interop");
    // AMQP publishes count positions and are got over HTTP, without their properties.
    for body in [&b"from-amqp-1"[..], b"from-amqp-2"] {
        within(
            "basic.publish",
            ch.basic_publish(
                "".into(),
                "interop".into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default()
                    .with_content_type("application/json".into())
                    .with_delivery_mode(2),
            ),
        )
        .await
        .unwrap();
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    let a = loop {
        let a = mq.get("name=interop&opt=get").await;
        if a.text() != "HTTPMQ_GET_END" {
            break a;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "AMQP publish not seen"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!((a.text(), a.pos), ("from-amqp-1", Some(2)));
    assert_eq!(a.content_type, "text/plain");
    let a = mq.get("name=interop&opt=get").await;
    assert_eq!((a.text(), a.pos), ("from-amqp-2", Some(3)));
    ok_put(&mq.get("name=interop&opt=put&data=again").await, 4);
    conn.close(200, "bye".into()).await.ok();
    mq.stop().await;
}

#[tokio::test]
async fn positions_and_maxima_survive_a_restart() {
    let dir = tempdir("restart");
    let mq = Mq::start(&dir).await;
    for m in ["m1", "m2", "m3"] {
        mq.get(&format!("name=r&opt=put&data={m}")).await;
    }
    assert_eq!(mq.get("name=r&opt=get").await.text(), "m1");
    plain(
        &mq.get("name=r&opt=maxqueue&num=5").await,
        "HTTPMQ_MAXQUEUE_OK",
    );
    ok_put(&mq.get("name=r2&opt=put&data=other").await, 1);
    mq.stop().await;

    let mq = Mq::start(&dir).await;
    plain(
        &mq.get("name=r&opt=status_json").await,
        r#"{"name":"r","maxqueue":5,"putpos":3,"putlap":1,"getpos":1,"getlap":1,"unread":2}"#,
    );
    let a = mq.get("name=r&opt=view&pos=3").await;
    assert_eq!((a.text(), a.pos), ("m3", Some(3)));
    let a = mq.get("name=r&opt=get").await;
    assert_eq!((a.text(), a.pos), ("m2", Some(2)));
    ok_put(&mq.get("name=r&opt=put&data=m4").await, 4);
    ok_put(&mq.get("name=r2&opt=put&data=other2").await, 2);
    mq.stop().await;
}

#[tokio::test]
async fn fifty_putters_and_fifty_getters_at_once_lose_and_duplicate_nothing() {
    const CLIENTS: usize = 50;
    const EACH: usize = 20;
    let dir = tempdir("concurrency");
    let mq = Arc::new(Mq::start(&dir).await);
    let got_count = Arc::new(AtomicUsize::new(0));
    let mut putters = Vec::new();
    for c in 0..CLIENTS {
        let mq = mq.clone();
        putters.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut answered = Vec::new();
            for i in 0..EACH {
                let body = format!("p{c}-{i}");
                let r = client
                    .post(format!("{}/?name=cc&opt=put", mq.base))
                    .body(body.clone())
                    .send()
                    .await
                    .expect("put answered");
                let pos = r.headers().get("pos").is_some();
                let text = r.text().await.unwrap();
                assert_eq!(text, "HTTPMQ_PUT_OK");
                assert!(pos);
                answered.push(body);
            }
            answered
        }));
    }
    let mut getters = Vec::new();
    for _ in 0..CLIENTS {
        let mq = mq.clone();
        let got_count = got_count.clone();
        getters.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut got = Vec::new();
            while got_count.load(Ordering::SeqCst) < CLIENTS * EACH {
                let r = client
                    .get(format!("{}/?name=cc&opt=get", mq.base))
                    .send()
                    .await
                    .expect("get answered");
                let pos: Option<u64> = r
                    .headers()
                    .get("pos")
                    .map(|p| p.to_str().unwrap().parse().unwrap());
                let text = r.text().await.unwrap();
                if text == "HTTPMQ_GET_END" {
                    assert_eq!(pos, None);
                    // Wait for puts to come in (bounded by the test's overall timeout).
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                assert!(pos.is_some(), "a got message has its position");
                got_count.fetch_add(1, Ordering::SeqCst);
                got.push(text);
            }
            got
        }));
    }
    let mut put_set = HashSet::new();
    within("putters", async {
        for p in putters {
            for body in p.await.unwrap() {
                assert!(put_set.insert(body));
            }
        }
    })
    .await;
    let mut got_all = Vec::new();
    within("getters", async {
        for g in getters {
            got_all.extend(g.await.unwrap());
        }
    })
    .await;
    let got_set: HashSet<String> = got_all.iter().cloned().collect();
    assert_eq!(got_all.len(), got_set.len(), "a message was got twice");
    assert_eq!(got_set, put_set, "every answered put is got exactly once");
    plain(
        &mq.get("name=cc&opt=status_json").await,
        r#"{"name":"cc","maxqueue":1000000,"putpos":1000,"putlap":1,"getpos":1000,"getlap":1,"unread":0}"#,
    );
    match Arc::try_unwrap(mq) {
        Ok(mq) => mq.stop().await,
        Err(_) => panic!("a client still holds the broker"),
    }
}

/// The `warren` binary killed with SIGKILL while clients put and get: every answered put is
/// there after the restart, except those answered to a get, which never come back.
#[tokio::test]
async fn answered_puts_survive_kill_9_and_answered_gets_do_not_come_back() {
    const CLIENTS: usize = 10;
    let dir = tempdir("kill9");
    let port = binary_support::free_port();
    let http_port = binary_support::free_port();
    let http = format!("127.0.0.1:{http_port}");
    let server = binary_support::Server::start_listening(
        &format!("127.0.0.1:{port}"),
        port,
        &dir,
        &[],
        None,
        &["--httpmq-listen", &http],
    );
    let base = format!("http://{http}");
    // Wait for the HTTP listener.
    let client = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while client.get(format!("{base}/")).send().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "no httpmq listener");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let base = base.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let (mut put, mut got) = (Vec::new(), Vec::new());
            // Gets sent whose answer was lost to the kill: each may have taken a message.
            let mut unanswered_gets = 0usize;
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                let body = format!("k{c}-{i}");
                i += 1;
                match client
                    .post(format!("{base}/?name=k&opt=put"))
                    .body(body.clone())
                    .send()
                    .await
                {
                    Ok(r) => match r.text().await {
                        Ok(t) if t == "HTTPMQ_PUT_OK" => put.push(body),
                        _ => break,
                    },
                    Err(_) => break,
                }
                if i % 3 == 0 {
                    match client.get(format!("{base}/?name=k&opt=get")).send().await {
                        Ok(r) => match r.text().await {
                            Ok(t) if t.starts_with('k') => got.push(t),
                            Ok(_) => {}
                            Err(_) => {
                                unanswered_gets += 1;
                                break;
                            }
                        },
                        Err(_) => {
                            unanswered_gets += 1;
                            break;
                        }
                    }
                }
            }
            (put, got, unanswered_gets)
        }));
    }
    // Let some requests through, then kill the broker while they run.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = client
            .get(format!("{base}/?name=k&opt=status_json"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        if v["putpos"].as_u64().unwrap() >= 300 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "puts too slow: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.kill();
    stop.store(true, Ordering::SeqCst);
    let (mut put, mut got, mut unanswered) = (HashSet::new(), HashSet::new(), 0);
    for t in tasks {
        let (p, g, u) = within("clients", t).await.unwrap();
        put.extend(p);
        got.extend(g);
        unanswered += u;
    }
    assert!(put.len() >= 100, "{} puts answered", put.len());

    let server = binary_support::Server::start_listening(
        &format!("127.0.0.1:{port}"),
        port,
        &dir,
        &[],
        None,
        &["--httpmq-listen", &http],
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while client.get(format!("{base}/")).send().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "no httpmq listener");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut after = HashSet::new();
    loop {
        let t = within("get", client.get(format!("{base}/?name=k&opt=get")).send())
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if t == "HTTPMQ_GET_END" {
            break;
        }
        assert!(after.insert(t.clone()), "{t} got twice after the restart");
    }
    // A get the kill cut off may have taken a message whose answer never arrived; every
    // other answered put is there.
    let missing: Vec<&String> = put
        .iter()
        .filter(|p| !got.contains(*p) && !after.contains(*p))
        .collect();
    assert!(
        missing.len() <= unanswered,
        "answered puts lost by kill -9: {missing:?} ({unanswered} gets unanswered)"
    );
    for a in &after {
        assert!(a.starts_with('k'), "{a} was never put");
    }
    for g in &got {
        assert!(
            !after.contains(g),
            "{g} was got before the crash and came back"
        );
    }
    server.terminate();
}

/// A crash before the first checkpoint: the queue is in no state file, yet its recovered
/// messages keep their positions and the next put takes the one after them.
#[tokio::test]
async fn positions_no_checkpoint_saw_survive_kill_9() {
    let dir = tempdir("kill9-positions");
    let port = binary_support::free_port();
    let http = format!("127.0.0.1:{}", binary_support::free_port());
    let base = format!("http://{http}");
    // No checkpoint within the test.
    let env = [("WARREN_HTTPMQ_CHECKPOINT_MS", "600000")];
    let start = || {
        binary_support::Server::start_listening(
            &format!("127.0.0.1:{port}"),
            port,
            &dir,
            &env,
            None,
            &["--httpmq-listen", &http],
        )
    };
    let client = reqwest::Client::new();
    let text = |q: String| {
        let client = client.clone();
        async move {
            let deadline = tokio::time::Instant::now() + WAIT;
            loop {
                if let Ok(r) = client.get(&q).send().await {
                    let pos = r
                        .headers()
                        .get("pos")
                        .map(|p| p.to_str().unwrap().to_string());
                    return (r.text().await.unwrap(), pos);
                }
                assert!(tokio::time::Instant::now() < deadline, "no httpmq listener");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let server = start();
    for i in 1..=5 {
        let (t, pos) = text(format!("{base}/?name=crashpos&opt=put&data=m{i}")).await;
        assert_eq!((t.as_str(), pos), ("HTTPMQ_PUT_OK", Some(i.to_string())));
    }
    assert!(
        !dir.join("httpmq").join("state.json").exists(),
        "checkpointed"
    );
    server.kill();

    let server = start();
    let (status, _) = text(format!("{base}/?name=crashpos&opt=status_json")).await;
    assert_eq!(
        status,
        r#"{"name":"crashpos","maxqueue":1000000,"putpos":5,"putlap":1,"getpos":0,"getlap":1,"unread":5}"#
    );
    let (t, pos) = text(format!("{base}/?name=crashpos&opt=get")).await;
    assert_eq!((t.as_str(), pos.as_deref()), ("m1", Some("1")));
    let (t, pos) = text(format!("{base}/?name=crashpos&opt=put&data=m6")).await;
    assert_eq!((t.as_str(), pos.as_deref()), ("HTTPMQ_PUT_OK", Some("6")));
    server.terminate();
}

/// An address of this machine that is not loopback, if it has one.
fn non_loopback_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("10.255.255.255:1").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[tokio::test]
async fn without_a_password_the_loopback_only_default_user_serves_local_clients_only() {
    let Some(ip) = non_loopback_ip() else {
        eprintln!("no non-loopback address on this machine: nothing to check");
        return;
    };
    let dir = tempdir("loopback");
    let mut mq = Mq::start_with(&dir, |c| c.httpmq.listen = "0.0.0.0:0".parse().unwrap()).await;
    let port = mq.broker.as_ref().unwrap().httpmq_addrs()[0].port();
    ok_put(&mq.get("name=l&opt=put&data=local").await, 1);
    let local_base = std::mem::replace(&mut mq.base, format!("http://{ip}:{port}"));
    // From another address: guest (loopback-only) does not serve it...
    plain(&mq.get("name=l&opt=get").await, "HTTPMQ_AUTH_FAILED");
    plain(
        &mq.get("name=l&opt=put&data=remote").await,
        "HTTPMQ_AUTH_FAILED",
    );
    // ...a Warren user with basic auth does (guest itself is loopback-only there too).
    let a = mq
        .send(
            mq.client
                .get(format!("{}/?name=l&opt=status_json", mq.base))
                .basic_auth("guest", Some("guest")),
        )
        .await;
    plain(&a, "HTTPMQ_AUTH_FAILED");
    mq.base = local_base;
    let a = mq.get("name=l&opt=get").await;
    assert_eq!((a.text(), a.pos), ("local", Some(1)));
    mq.stop().await;

    // With a password, remote clients that carry it are served.
    let dir = tempdir("loopback-auth");
    let mut mq = Mq::start_with(&dir, |c| {
        c.httpmq.listen = "0.0.0.0:0".parse().unwrap();
        c.httpmq.auth = Some("pw".into());
    })
    .await;
    let port = mq.broker.as_ref().unwrap().httpmq_addrs()[0].port();
    mq.base = format!("http://{ip}:{port}");
    plain(&mq.get("name=l&opt=put&data=x").await, "HTTPMQ_AUTH_FAILED");
    ok_put(&mq.get("name=l&opt=put&data=x&auth=pw").await, 1);
    mq.stop().await;
}

#[tokio::test]
async fn with_httpmq_tls_the_listener_speaks_https_with_the_tls_settings() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = tls_support::certs::Ca::new("httpmq test CA");
    let files = tls_support::ServerFiles::new(&ca.server(), None);
    let dir = tempdir("tls");
    let mq = Mq::start_with(&dir, |c| {
        c.tls = files.settings.clone();
        c.tls.listen = "127.0.0.1:0".parse().unwrap();
        c.httpmq.tls = true;
    })
    .await;
    let addr = mq.broker.as_ref().unwrap().httpmq_addrs()[0];
    let connector =
        tokio_rustls::TlsConnector::from(tls_support::certs::client_config(&[ca.der()], None, &[]));
    let request =
        |q: &str| format!("GET /?{q} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let mut replies = Vec::new();
    for q in ["name=t&opt=put&data=secure", "name=t&opt=get"] {
        let tcp = within("connect", tokio::net::TcpStream::connect(addr))
            .await
            .unwrap();
        let mut tls = within(
            "TLS handshake",
            connector.connect(tls_support::certs::localhost(), tcp),
        )
        .await
        .expect("TLS handshake with the [tls] certificate");
        tls.write_all(request(q).as_bytes()).await.unwrap();
        let mut reply = Vec::new();
        // The server may close without close_notify once the reply is sent.
        let _ = within("reply", tls.read_to_end(&mut reply)).await;
        replies.push(String::from_utf8_lossy(&reply).to_lowercase());
    }
    assert!(replies[0].starts_with("http/1.1 200"), "{}", replies[0]);
    assert!(replies[0].contains("\r\npos: 1\r\n"), "{}", replies[0]);
    assert!(
        replies[0].ends_with("\r\n\r\nhttpmq_put_ok"),
        "{}",
        replies[0]
    );
    assert!(replies[1].ends_with("\r\n\r\nsecure"), "{}", replies[1]);
    // Plain HTTP is not served there.
    let plain = mq
        .client
        .get(format!("http://{addr}/?name=t&opt=status"))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    mq.stop().await;
}

/// httpsqs's own clients read the reply headers case-sensitively (`Pos:`, `Content-Length:`),
/// as httpsqs writes them.
#[tokio::test]
async fn reply_headers_are_written_in_httpsqs_case() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempdir("header-case");
    let mq = Mq::start(&dir).await;
    let addr = mq.broker.as_ref().unwrap().httpmq_addrs()[0];
    let mut replies = Vec::new();
    for q in ["name=h&opt=put&data=hello", "name=h&opt=get"] {
        let mut s = within("connect", tokio::net::TcpStream::connect(addr))
            .await
            .unwrap();
        s.write_all(
            format!("GET /?{q} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut reply = Vec::new();
        within("reply", s.read_to_end(&mut reply)).await.unwrap();
        replies.push(String::from_utf8(reply).unwrap());
    }
    assert!(
        replies[0].starts_with("HTTP/1.1 200 OK\r\n"),
        "{}",
        replies[0]
    );
    assert!(replies[0].contains("\r\nPos: 1\r\n"), "{}", replies[0]);
    assert!(
        replies[0].contains("\r\nContent-Length: 13\r\n"),
        "{}",
        replies[0]
    );
    assert!(
        replies[0].contains("\r\nContent-Type: text/plain\r\n"),
        "{}",
        replies[0]
    );
    assert!(
        replies[0].ends_with("\r\n\r\nHTTPMQ_PUT_OK"),
        "{}",
        replies[0]
    );
    assert!(replies[1].contains("\r\nPos: 1\r\n"), "{}", replies[1]);
    assert!(
        replies[1].contains("\r\nContent-Length: 5\r\n"),
        "{}",
        replies[1]
    );
    assert!(replies[1].ends_with("\r\n\r\nhello"), "{}", replies[1]);
    mq.stop().await;
}

/// Unmounts a tmpfs when dropped.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Mounts a tmpfs of `size` at a new directory; `None` without the right to (not root).
fn small_disk(name: &str, size: &str) -> Option<Mount> {
    let dir = tempdir(name);
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("skipping: cannot mount a tmpfs here (needs root)");
        return None;
    }
    Some(Mount(dir))
}

/// Writes `path` until the file system is full.
fn fill(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}

#[tokio::test]
async fn a_get_on_a_full_disk_answers_promptly_and_loses_no_message() {
    let Some(mount) = small_disk("getfull", "20m") else {
        return;
    };
    let mq = Mq::start_with(&mount.0.join("data"), |c| {
        // Small segments: the removal of a message is written to a new segment file, which
        // the full disk refuses. No disk alarm: this is about writes that fail.
        c.storage.segment_size = 4096;
        c.storage.disk_free_limit = warren_server::config::DiskFreeLimit::Bytes(0);
    })
    .await;
    let body = |i: u8| vec![b'a' + i; 8192];
    for i in 0..3u8 {
        ok_put(
            &mq.post("name=full&opt=put", None, body(i)).await,
            u64::from(i) + 1,
        );
    }
    fill(&mount.0.join("filler"));
    let mut got: Vec<Vec<u8>> = Vec::new();
    // Each get answers within the bound (5 s waits, well under the 30 s of `within`),
    // with a message or HTTPMQ_GET_END while the store cannot write.
    let mut ends = 0;
    for _ in 0..3 {
        let a = mq.get("name=full&opt=get").await;
        assert_eq!(a.status, StatusCode::OK);
        if a.text() == "HTTPMQ_GET_END" {
            ends += 1;
        } else {
            got.push(a.body);
        }
    }
    assert!(ends > 0, "the full disk refused nothing: {} got", got.len());
    std::fs::remove_file(mount.0.join("filler")).unwrap();
    // Once space returns (the store retries every second), the rest comes, each once.
    within("the remaining messages", async {
        while got.len() < 3 {
            let a = mq.get("name=full&opt=get").await;
            if a.text() != "HTTPMQ_GET_END" {
                got.push(a.body);
            } else {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    })
    .await;
    got.sort();
    assert_eq!(got, (0..3u8).map(body).collect::<Vec<_>>());
    plain(&mq.get("name=full&opt=get").await, "HTTPMQ_GET_END");
    mq.stop().await;
}

#[tokio::test]
async fn a_get_whose_client_goes_away_leaves_the_message_in_the_queue() {
    let Some(mount) = small_disk("getgone", "20m") else {
        return;
    };
    let mq = Mq::start_with(&mount.0.join("data"), |c| {
        c.storage.segment_size = 4096;
        c.storage.disk_free_limit = warren_server::config::DiskFreeLimit::Bytes(0);
    })
    .await;
    ok_put(
        &mq.post("name=gone&opt=put", None, vec![b'x'; 8192]).await,
        1,
    );
    fill(&mount.0.join("filler"));
    // A client that gives up after 200 ms, while the get waits for the store.
    let r = mq
        .client
        .get(format!("{}/?name=gone&opt=get", mq.base))
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    drop(r);
    std::fs::remove_file(mount.0.join("filler")).unwrap();
    let a = within("the message", async {
        loop {
            let a = mq.get("name=gone&opt=get").await;
            if a.text() != "HTTPMQ_GET_END" {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(a.body, vec![b'x'; 8192]);
    mq.stop().await;
}

#[tokio::test]
async fn puts_are_refused_while_the_memory_alarm_is_on() {
    let dir = tempdir("memalarm");
    // A watermark of one byte: the alarm is on from the broker's first health check.
    let mq = Mq::start_with(&dir, |c| c.memory.high_watermark_bytes = 1).await;
    within("the alarm to refuse a put", async {
        loop {
            let a = mq.get("name=alarm&opt=put&data=x").await;
            if a.text() == "HTTPMQ_PUT_ERROR" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    plain(
        &mq.post("name=alarm&opt=put", None, b"y".to_vec()).await,
        "HTTPMQ_PUT_ERROR",
    );
    // Gets still work (consumers are never blocked): whatever got in before the alarm was
    // seen, and then nothing.
    let mut n = 0;
    while mq.get("name=alarm&opt=get").await.text() == "x" {
        n += 1;
    }
    assert!(n <= 1, "{n} puts got through");
    mq.stop().await;
}

#[tokio::test]
async fn puts_are_refused_while_the_disk_alarm_is_on() {
    let dir = tempdir("diskalarm");
    // More free space than any disk has: the alarm is on from the first check.
    let mq = Mq::start_with(&dir, |c| {
        c.storage.disk_free_limit = warren_server::config::DiskFreeLimit::Bytes(u64::MAX / 2)
    })
    .await;
    within("the alarm to refuse a put", async {
        loop {
            let a = mq.get("name=dalarm&opt=put&data=x").await;
            if a.text() == "HTTPMQ_PUT_ERROR" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    plain(
        &mq.get("name=dalarm&opt=put&data=y").await,
        "HTTPMQ_PUT_ERROR",
    );
    mq.stop().await;
}

#[tokio::test]
async fn charset_takes_only_charset_names_and_replies_are_nosniff() {
    let dir = tempdir("charset");
    let mq = Mq::start(&dir).await;
    let a = mq
        .get("name=cs&opt=put&data=%3Cscript%3E&charset=utf-8,text/html")
        .await;
    assert_eq!(a.text(), "HTTPMQ_PUT_OK");
    assert_eq!(a.content_type, "text/plain");
    for bad in ["utf-8;x=1", "a%20b", "utf-8%0d%0aX:1", "%22utf-8%22", "a/b"] {
        let a = mq.get(&format!("name=cs&opt=status&charset={bad}")).await;
        assert_eq!(a.content_type, "text/plain", "{bad}");
    }
    let a = mq.get("name=cs&opt=get&charset=ISO-8859-1").await;
    assert_eq!(a.content_type, "text/plain; charset=ISO-8859-1");
    let r = within(
        "reply",
        mq.client
            .get(format!("{}/?name=cs&opt=view&pos=1", mq.base))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    let r = within("reply", mq.client.get(format!("{}/", mq.base)).send())
        .await
        .unwrap();
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    mq.stop().await;
}

#[tokio::test]
async fn a_form_body_without_data_is_the_data_and_form_fields_win_over_the_query() {
    let dir = tempdir("formraw");
    let mq = Mq::start(&dir).await;
    let form = Some("application/x-www-form-urlencoded");
    // httpsqs's documented `curl -d 'some text' "http://host/?name=q&opt=put"`.
    ok_put(
        &mq.post("name=fr&opt=put", form, b"some text".to_vec())
            .await,
        1,
    );
    ok_put(
        &mq.post("name=fr&opt=put&data=query", form, b"data=form".to_vec())
            .await,
        2,
    );
    assert_eq!(mq.get("name=fr&opt=get").await.text(), "some text");
    assert_eq!(mq.get("name=fr&opt=get").await.text(), "form");
    plain(&mq.get("name=fr&opt=get").await, "HTTPMQ_GET_END");
    mq.stop().await;
}

#[tokio::test]
async fn wrong_credentials_wait_the_login_failure_delay_and_malformed_basic_auth_is_refused() {
    let dir = tempdir("authdelay");
    let mq = Mq::start_with(&dir, |c| {
        c.httpmq.auth = Some("pw".into());
        c.auth.login_failure_delay_ms = 1000;
    })
    .await;
    let delay = Duration::from_millis(1000);
    let t = std::time::Instant::now();
    plain(
        &mq.get("name=d&opt=put&data=x&auth=no").await,
        "HTTPMQ_AUTH_FAILED",
    );
    assert!(t.elapsed() >= delay, "{:?}", t.elapsed());
    let t = std::time::Instant::now();
    let a = mq
        .send(
            mq.client
                .get(format!("{}/?name=d&opt=get", mq.base))
                .basic_auth("guest", Some("wrong")),
        )
        .await;
    plain(&a, "HTTPMQ_AUTH_FAILED");
    assert!(t.elapsed() >= delay, "{:?}", t.elapsed());
    mq.stop().await;

    // Without a password, a malformed Authorization header is not the default user.
    let dir = tempdir("authmalformed");
    let mq = Mq::start_with(&dir, |c| c.auth.login_failure_delay_ms = 10).await;
    for value in ["Bearer abc", "Basic !!!", "Basic Z3Vlc3Q=", "Basic"] {
        let a = mq
            .send(
                mq.client
                    .get(format!("{}/?name=d&opt=put&data=x", mq.base))
                    .header("authorization", value),
            )
            .await;
        plain(&a, "HTTPMQ_AUTH_FAILED");
    }
    ok_put(&mq.get("name=d&opt=put&data=x").await, 1);
    mq.stop().await;
}

#[tokio::test]
async fn methods_other_than_get_and_post_change_nothing() {
    let dir = tempdir("methods");
    let mq = Mq::start(&dir).await;
    ok_put(&mq.get("name=m&opt=put&data=kept").await, 1);
    for method in ["HEAD", "OPTIONS", "PUT", "DELETE", "PATCH"] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        for opt in ["get", "put&data=x", "reset"] {
            let r = mq
                .client
                .request(method.clone(), format!("{}/?name=m&opt={opt}", mq.base))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED, "{method} {opt}");
            assert_eq!(r.headers()["allow"], "GET, POST", "{method} {opt}");
        }
    }
    let a = mq.get("name=m&opt=get").await;
    assert_eq!(a.text(), "kept");
    plain(&mq.get("name=m&opt=get").await, "HTTPMQ_GET_END");
    mq.stop().await;
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_answered_408_and_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempdir("slowbody");
    let mq = Mq::start(&dir).await;
    let addr = mq.base.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"POST /?name=slow&opt=put HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab")
        .await
        .unwrap();
    // The body never completes: the server answers within its 30 s body timeout (plus
    // slack), and the connection closes.
    let mut reply = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut reply)).await;
    assert!(read.is_ok(), "no answer to a body that never arrives");
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    plain(&mq.get("name=slow&opt=get").await, "HTTPMQ_GET_END");
    mq.stop().await;
}

#[tokio::test]
async fn maxqueue_declares_its_queue_and_goes_when_the_queue_is_deleted() {
    let dir = tempdir("maxqueue-state");
    let mq = Mq::start_with(&dir, |c| c.httpmq.checkpoint_ms = 20).await;
    plain(
        &mq.get("name=mq1&opt=maxqueue&num=2").await,
        "HTTPMQ_MAXQUEUE_OK",
    );
    // The queue exists (declared durable, as by a first put).
    let conn = mq.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    within(
        "passive declare",
        ch.queue_declare("mq1".into(), passive, FieldTable::default()),
    )
    .await
    .expect("maxqueue declared the queue");
    within(
        "queue.delete",
        ch.queue_delete("mq1".into(), Default::default()),
    )
    .await
    .unwrap();
    // Its maximum went with it: the state file forgets it, a new queue of that name has
    // the default.
    let state = dir.join("httpmq").join("state.json");
    within("the state file to forget mq1", async {
        loop {
            let text = std::fs::read_to_string(&state).unwrap_or_default();
            if !text.contains("mq1") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    for i in 1..=3 {
        ok_put(&mq.get("name=mq1&opt=put&data=x").await, i);
    }
    let _ = conn.close(200, "bye".into()).await;
    mq.stop().await;
}

/// `opt=view` of positions far beyond the in-memory window (`queue_window` 10: nearly all
/// of the queue paged out to disk), binary bodies byte for byte, before and after a
/// restart: views change neither the status nor what gets return next, consumed positions
/// (also one delivered to an AMQP client and not yet acknowledged) answer
/// `HTTPMQ_VIEW_ERROR`, and a requeued message is viewable again at its place.
#[tokio::test]
async fn view_reads_positions_paged_out_to_disk_and_after_a_restart_without_consuming() {
    let dir = tempdir("view-paged");
    let small_window = |c: &mut Config| c.storage.queue_window = 10;
    let mq = Mq::start_with(&dir, small_window).await;
    // 1500 binary messages of different lengths (more than the 1024 a spill file buffers in
    // memory, so most are read from the file), one of 64 KiB.
    let body = |i: usize| -> Vec<u8> {
        let len = if i == 777 { 64 * 1024 } else { 1 + i % 300 };
        (0..len).map(|k| ((i * 31 + k * 7) % 256) as u8).collect()
    };
    for i in 1..=1500 {
        ok_put(&mq.post("name=v&opt=put", None, body(i)).await, i as u64);
    }
    let status = mq.get("name=v&opt=status_json").await.text().to_string();
    let view = |pos: usize| {
        let mq = &mq;
        async move { mq.get(&format!("name=v&opt=view&pos={pos}")).await }
    };
    let check = |a: Answer, pos: usize| {
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.pos, Some(pos as u64), "{a:?}");
        assert!(a.body == body(pos), "position {pos}: wrong body");
    };
    for pos in [1500, 1, 10, 11, 12, 777, 1024, 1025, 1499, 600] {
        check(view(pos).await, pos);
    }
    plain(&view(1501).await, "HTTPMQ_VIEW_ERROR");
    assert_eq!(mq.get("name=v&opt=status_json").await.text(), status);
    // Gets still return the messages in order, from the head.
    for pos in 1..=400 {
        let a = mq.get("name=v&opt=get").await;
        assert_eq!(a.pos, Some(pos as u64));
        assert!(a.body == body(pos), "get {pos}: wrong body");
    }
    for pos in [1, 200, 400] {
        plain(&view(pos).await, "HTTPMQ_VIEW_ERROR");
    }
    for pos in [401, 777, 1100, 1500] {
        check(view(pos).await, pos);
    }
    // Delivered over AMQP and not yet acknowledged: read (getpos counts it), not viewable.
    {
        let conn = mq.connect().await;
        let ch = conn.create_channel().await.unwrap();
        let got = ch
            .basic_get("v".into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
            .expect("a message");
        assert_eq!(got.delivery.data, body(401));
        plain(&view(401).await, "HTTPMQ_VIEW_ERROR");
        check(view(402).await, 402);
        // Closing the channel requeues it at its place: viewable again.
        ch.close(200, "bye".into()).await.unwrap();
        conn.close(200, "bye".into()).await.unwrap();
    }
    check(view(401).await, 401);
    let status = mq.get("name=v&opt=status_json").await.text().to_string();
    assert_eq!(
        status,
        r#"{"name":"v","maxqueue":1000000,"putpos":1500,"putlap":1,"getpos":400,"getlap":1,"unread":1100}"#
    );
    mq.stop().await;

    // After a restart (the queue recovered from the store, its window refilled and the rest
    // paged out again), the same positions hold the same messages.
    let mq = Mq::start_with(&dir, small_window).await;
    let view = |pos: usize| {
        let mq = &mq;
        async move { mq.get(&format!("name=v&opt=view&pos={pos}")).await }
    };
    assert_eq!(mq.get("name=v&opt=status_json").await.text(), status);
    plain(&view(400).await, "HTTPMQ_VIEW_ERROR");
    for pos in [401, 410, 411, 777, 1024, 1500, 1200] {
        check(view(pos).await, pos);
    }
    assert_eq!(mq.get("name=v&opt=status_json").await.text(), status);
    for pos in 401..=1500 {
        let a = mq.get("name=v&opt=get").await;
        assert_eq!(a.pos, Some(pos as u64));
        assert!(a.body == body(pos), "get {pos} after restart: wrong body");
    }
    plain(&mq.get("name=v&opt=get").await, "HTTPMQ_GET_END");
    for pos in [401, 1500] {
        plain(&view(pos).await, "HTTPMQ_VIEW_ERROR");
    }
    mq.stop().await;
}
