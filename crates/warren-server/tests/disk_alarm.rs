//! The disk alarm (`[storage] disk_free_limit`, RabbitMQ's `disk_free_limit`): with less free
//! space than the limit, publishers get connection.blocked "low on disk" and are not read
//! until space returns, while consumers keep draining.
//!
//! The limit is set above the real free space to raise the alarm, and lowered again while the
//! broker runs (`ServerState::set_disk_free_limit`, what SIGHUP applies) to clear it; a second
//! test moves the real free space of a small tmpfs across the limit (root only, as CI).

mod binary_support;

use futures_util::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{Connection, ConnectionProperties, Event};
use std::time::Duration;
use warren_server::config::DiskFreeLimit;

mod lapin_support;
use lapin_support::{consume, declare_queue, next, within};

/// Publishes one transient message to nowhere: only connections that publish are blocked.
async fn publish_once(conn: &Connection) {
    let ch = within("channel", conn.create_channel()).await.unwrap();
    within(
        "basic.publish",
        ch.basic_publish(
            "".into(),
            "nowhere".into(),
            BasicPublishOptions::default(),
            b"x",
            Default::default(),
        ),
    )
    .await
    .unwrap();
}

/// Waits for connection.blocked (`Some(reason)`) or connection.unblocked (`None`).
async fn next_block_event(
    events: &mut (impl futures_util::Stream<Item = Event> + Unpin),
) -> Option<String> {
    loop {
        match within("a connection.blocked/unblocked event", events.next()).await {
            Some(Event::ConnectionBlocked(reason)) => return Some(reason),
            Some(Event::ConnectionUnblocked) => return None,
            Some(_) => continue,
            None => panic!("connection events ended"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_disk_blocks_publishers_while_consumers_drain() {
    let dir = binary_support::tempdir("disk-alarm");
    let broker = within(
        "broker start",
        warren_server::Broker::builder()
            .bind("127.0.0.1:0")
            .data_dir(&dir)
            .start(),
    )
    .await
    .unwrap();
    let uri = format!("amqp://guest:guest@{}/%2f", broker.amqp_addr());
    let publisher = within(
        "connect",
        Connection::connect(&uri, ConnectionProperties::default()),
    )
    .await
    .unwrap();
    let mut events = Box::pin(publisher.events_listener());
    let pch = within("channel", publisher.create_channel()).await.unwrap();
    within(
        "confirm.select",
        pch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .unwrap();
    let queue = declare_queue(&pch, "disk-alarm").await;
    for _ in 0..10 {
        let pc = within(
            "basic.publish",
            pch.basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                b"before",
                Default::default(),
            ),
        )
        .await
        .unwrap();
        assert!(within("confirm", pc).await.unwrap().is_ack());
    }

    // More free space required than any disk has: the alarm goes off.
    broker
        .state()
        .set_disk_free_limit(DiskFreeLimit::Bytes(u64::MAX / 2), 0.0);
    assert_eq!(
        next_block_event(&mut events).await.as_deref(),
        Some("low on disk")
    );
    assert!(broker.state().disk_alarm());
    // The publish and its confirm, in a task: a blocked client may hold the publish itself.
    let held = {
        let pch = pch.clone();
        let queue = queue.clone();
        tokio::spawn(async move {
            pch.basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                b"while blocked",
                Default::default(),
            )
            .await?
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !held.is_finished(),
        "a publish was confirmed during the disk alarm"
    );
    // A consumer on another connection still drains the queue.
    let consumer_conn = within(
        "connect",
        Connection::connect(&uri, ConnectionProperties::default()),
    )
    .await
    .unwrap();
    let cch = within("channel", consumer_conn.create_channel())
        .await
        .unwrap();
    let mut consumer = consume(&cch, &queue, "drain", true).await;
    for _ in 0..10 {
        assert_eq!(next(&mut consumer).await.data, b"before");
    }

    // Space is back: unblocked, and the held publish goes through.
    broker
        .state()
        .set_disk_free_limit(DiskFreeLimit::Bytes(0), 0.0);
    assert_eq!(next_block_event(&mut events).await, None);
    assert!(within("confirm after the alarm", held)
        .await
        .unwrap()
        .unwrap()
        .is_ack());
    assert_eq!(next(&mut consumer).await.data, b"while blocked");
    drop(consumer_conn);
    drop(publisher);
    within("shutdown", broker.shutdown()).await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The real free space of a small tmpfs crosses the limit both ways; the broker's log says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_free_space_sets_and_clears_the_alarm() {
    use std::process::Command;
    let dir = binary_support::tempdir("disk-alarm-tmpfs");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=32m", "tmpfs"])
        .arg(&dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("skipping: cannot mount a tmpfs here (needs root)");
        return;
    }
    struct Unmount<'a>(&'a std::path::Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&dir);
    let data = dir.join("data");
    let log_dir = binary_support::tempdir("disk-alarm-tmpfs-log");
    let log = log_dir.join("warren.log");
    let server = binary_support::Server::start_logging(
        &data,
        &[("WARREN_STORAGE_DISK_FREE_LIMIT", "16MB")],
        &log,
    );
    let conn = server.connect().await;
    let mut events = Box::pin(conn.events_listener());
    publish_once(&conn).await;
    // 24 MB of the 32 MB taken: 8 MB free, below 16 MB.
    std::fs::write(dir.join("filler"), vec![0u8; 24 << 20]).unwrap();
    assert_eq!(
        next_block_event(&mut events).await.as_deref(),
        Some("low on disk")
    );
    std::fs::remove_file(dir.join("filler")).unwrap();
    assert_eq!(next_block_event(&mut events).await, None);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("free disk space is insufficient"), "{text}");
    assert!(
        text.contains("free disk space is sufficient again"),
        "{text}"
    );
    drop(conn);
    server.kill();
    std::fs::remove_dir_all(&log_dir).unwrap();
}

/// SIGHUP applies a new `disk_free_limit` from the configuration file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_disk_free_limit() {
    let dir = binary_support::tempdir("disk-alarm-hup");
    let config = dir.join("warren.toml");
    std::fs::write(&config, "[storage]\ndisk_free_limit = \"1000PB\"\n").unwrap();
    let port = binary_support::free_port();
    let server = binary_support::Server::start_listening(
        &format!("127.0.0.1:{port}"),
        port,
        &dir.join("data"),
        &[],
        None,
        &["--config", config.to_str().unwrap()],
    );
    let conn = server.connect().await;
    let mut events = Box::pin(conn.events_listener());
    publish_once(&conn).await;
    assert_eq!(
        next_block_event(&mut events).await.as_deref(),
        Some("low on disk")
    );
    std::fs::write(&config, "[storage]\ndisk_free_limit = \"1MB\"\n").unwrap();
    server.signal(libc::SIGHUP);
    assert_eq!(next_block_event(&mut events).await, None);
    drop(conn);
    server.kill();
    std::fs::remove_dir_all(&dir).unwrap();
}
