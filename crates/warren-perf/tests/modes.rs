//! Every warren-perf mode, end to end: the real `warren-perf` binary against a real Warren
//! broker (embedded in this test process, listening on a free port on 127.0.0.1), at small
//! sizes. Each test checks the figures the mode reports against what it must have done.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use warren_server::{Broker, RunningBroker};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = std::env::temp_dir().join(format!(
            "warren-perf-test-{tag}-{}-{nanos}",
            std::process::id()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn broker(dir: &TempDir) -> (RunningBroker, String) {
    let b = Broker::builder()
        .bind("127.0.0.1:0")
        .data_dir(&dir.0)
        .start()
        .await
        .expect("broker starts");
    let uri = format!("amqp://guest:guest@{}/%2f", b.amqp_addr());
    (b, uri)
}

/// Runs warren-perf with `args` (plus `--json`), returns its exit code and JSON report.
async fn perf(args: &[&str]) -> (i32, Value) {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.push("--json".into());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_warren-perf"))
            .args(&all)
            .output()
            .expect("warren-perf runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| {
            panic!(
                "no JSON report; stdout: {stdout}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let v: Value = serde_json::from_str(line).expect("JSON report");
    (out.status.code().unwrap_or(-1), v)
}

fn errors(v: &Value) -> usize {
    v["errors"].as_array().map(|a| a.len()).unwrap_or(0)
}

fn me() -> String {
    std::process::id().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_counts_confirmed_cycles_and_broker_cpu() {
    let dir = TempDir::new("churn");
    let (b, uri) = broker(&dir).await;
    let (code, v) = perf(&[
        "--mode",
        "churn",
        "--uri",
        &uri,
        "--clients",
        "2",
        "--duration",
        "2",
        "--broker-pid",
        &me(),
    ])
    .await;
    assert_eq!(code, 0, "{v}");
    assert_eq!(errors(&v), 0, "{v}");
    assert!(v["cycles"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["failures"], 0);
    // The broker runs in this process, so its CPU is this process's.
    assert!(v["cpu"]["broker_cpu_s"].as_f64().is_some(), "{v}");
    assert!(v["broker_cpu_us_per_cycle"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["cycle_time"]["p99_us"].as_u64().unwrap() > 0);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_queues_declare_check_and_delete() {
    let dir = TempDir::new("queues");
    let (b, uri) = broker(&dir).await;
    let (code, v) = perf(&[
        "--mode",
        "many-queues",
        "--uri",
        &uri,
        "--queues",
        "40",
        "--parallel",
        "4",
        "--rest",
        "1",
        "--broker-pid",
        &me(),
    ])
    .await;
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["declared"], 40, "{v}");
    assert!(v["declares_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["rss_before_kb"].as_u64().is_some());
    assert!(v["rest_cpu"]["broker_cpu_s"].as_f64().is_some());
    let (code, v) = perf(&[
        "--mode",
        "restart-check",
        "--uri",
        &uri,
        "--queues",
        "40",
        "--queue-pattern",
        "warren-perf-mq-%d",
        "--only-last",
    ])
    .await;
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["queues_checked"], 1);
    assert_eq!(v["depths"], serde_json::json!([0]));
    // A queue that does not exist is never found: the check gives up with an error.
    let (code, v) = perf(&[
        "--mode",
        "restart-check",
        "--uri",
        &uri,
        "--queues",
        "41",
        "--queue-pattern",
        "warren-perf-mq-%d",
        "--only-last",
        "--timeout",
        "1",
    ])
    .await;
    assert_eq!(code, 1, "{v}");
    let (code, v) = perf(&[
        "--mode",
        "delete-queues",
        "--uri",
        &uri,
        "--queues",
        "40",
        "--parallel",
        "4",
    ])
    .await;
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["deleted"], 40);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_publish_consume_and_measure_latency() {
    let dir = TempDir::new("conns");
    let (b, uri) = broker(&dir).await;
    let (code, v) = perf(&[
        "--mode",
        "many-connections",
        "--uri",
        &uri,
        "--connections",
        "30",
        "--conn-rate",
        "5",
        "--warmup",
        "1",
        "--duration",
        "2",
        "--broker-pid",
        &me(),
    ])
    .await;
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["opened"], 30, "{v}");
    assert_eq!(v["survived"], 30, "{v}");
    assert!(v["consumed_in_window"].as_u64().unwrap() > 0, "{v}");
    assert!(v["latency"]["count"].as_u64().unwrap() > 0, "{v}");
    assert!(v["rss_bytes_per_conn"].as_f64().is_some());
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_fill_then_check_depths_and_first_get() {
    let dir = TempDir::new("recovery");
    let (b, uri) = broker(&dir).await;
    let (code, v) = perf(&[
        "--mode",
        "recovery-fill",
        "--uri",
        &uri,
        "--queues",
        "4",
        "--messages",
        "2000",
        "--confirm",
        "300",
    ])
    .await;
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["confirmed"], 2000, "{v}");
    assert_eq!(v["published"], 2000, "{v}");
    let (code, v) = perf(&[
        "--mode",
        "restart-check",
        "--uri",
        &uri,
        "--queues",
        "4",
        "--queue-pattern",
        "warren-perf-rec-%d",
        "--messages",
        "2000",
        "--get",
    ])
    .await;
    assert_eq!(code, 0, "{v}");
    // The message taken by basic.get was rejected with requeue: every queue is full again.
    assert_eq!(v["depths"], serde_json::json!([500, 500, 500, 500]), "{v}");
    assert!(v["first_get_ms"].as_f64().is_some());
    // Filling queues that already hold messages is refused.
    let (code, v) = perf(&[
        "--mode",
        "recovery-fill",
        "--uri",
        &uri,
        "--queues",
        "4",
        "--messages",
        "10",
    ])
    .await;
    assert_eq!(code, 1, "{v}");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_frames_transient_persistent_and_fanout() {
    let dir = TempDir::new("raw");
    let (b, uri) = broker(&dir).await;
    let common = [
        "--mode",
        "raw",
        "--uri",
        &uri,
        "--duration",
        "2",
        "--prefetch",
        "500",
        "--multi-ack",
        "50",
    ];
    let (code, v) = perf(&common).await;
    assert_eq!(code, 0, "{v}");
    let published = v["published"].as_u64().unwrap();
    assert!(published > 0);
    assert_eq!(v["delivered"].as_u64().unwrap(), published, "{v}");
    assert_eq!(v["missing"], 0);

    let mut args = common.to_vec();
    args.extend(["--persistent", "--confirm", "500"]);
    let (code, v) = perf(&args).await;
    assert_eq!(code, 0, "{v}");
    let published = v["published"].as_u64().unwrap();
    assert!(published > 0);
    assert_eq!(v["confirmed"].as_u64().unwrap(), published, "{v}");
    assert_eq!(v["delivered"].as_u64().unwrap(), published, "{v}");

    let mut args = common.to_vec();
    args.extend(["--exchange-type", "fanout", "--queues", "3"]);
    let (code, v) = perf(&args).await;
    assert_eq!(code, 0, "{v}");
    let published = v["published"].as_u64().unwrap();
    assert!(published > 0);
    assert_eq!(v["delivered"].as_u64().unwrap(), 3 * published, "{v}");
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_carries_every_frame() {
    let mut relay = Command::new(env!("CARGO_BIN_EXE_warren-perf"))
        .args(["--mode", "relay", "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("relay starts");
    // The relay prints its address once it listens (no probe connection: it pairs them).
    let stdout = relay.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
        line
    });
    let line = tokio::time::timeout(Duration::from_secs(20), line)
        .await
        .expect("relay listens")
        .unwrap();
    let listen = line
        .trim()
        .strip_prefix("relay listening on ")
        .expect("relay's first line")
        .to_string();
    let uri = format!("amqp://guest:guest@{listen}/%2f");
    let (code, v) = perf(&[
        "--mode",
        "raw",
        "--relay",
        "--uri",
        &uri,
        "--duration",
        "2",
        "--broker-pid",
        &relay.id().to_string(),
    ])
    .await;
    let _ = relay.kill();
    let _ = relay.wait();
    assert_eq!(code, 0, "{v}");
    let published = v["published"].as_u64().unwrap();
    assert!(published > 0);
    assert_eq!(v["delivered"].as_u64().unwrap(), published, "{v}");
    assert!(v["cpu"]["broker_cpu_s"].as_f64().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_mode_reports_cpu_and_p999() {
    let dir = TempDir::new("classic");
    let (b, uri) = broker(&dir).await;
    let (code, v) = perf(&[
        "--uri",
        &uri,
        "--rate",
        "500",
        "--duration",
        "2",
        "--prefetch",
        "100",
        "--broker-pid",
        &me(),
    ])
    .await;
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["missing"], 0);
    assert!(v["latency_p999_us"].as_u64().unwrap() >= v["latency_p99_us"].as_u64().unwrap());
    assert!(v["cpu"]["client_cpu_s"].as_f64().is_some());
    assert!(v["cpu"]["broker_cpu_s"].as_f64().is_some());
    b.shutdown().await;
}
