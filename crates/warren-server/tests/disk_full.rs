//! A full disk: the real `warren` binary on a small tmpfs. Publishes that cannot be written are
//! nacked (never confirmed), publishers get connection.blocked, nothing already confirmed is
//! damaged, and once space is back the broker confirms again by itself.
//!
//! Mounting a tmpfs needs root (as in CI); elsewhere the test says so and does nothing.

mod binary_support;

use binary_support::{declare_durable, persistent, tempdir, within, Server};
use lapin::options::{BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

struct Mount<'a>(&'a Path);

impl Drop for Mount<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0).status();
    }
}

/// Fills `path` with a file of at most `bytes` (less if the filesystem runs out).
fn filler(path: &Path, bytes: usize) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        if f.write_all(&chunk[..n]).is_err() {
            break;
        }
        left -= n;
    }
    let _ = f.sync_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_nacks_blocks_and_recovers() {
    let dir = tempdir("diskfull");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
        .arg(&dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("skipping: cannot mount a tmpfs here (needs root)");
        return;
    }
    let _mount = Mount(&dir);
    let data = dir.join("data");
    let env = [("WARREN_STORAGE_SEGMENT_SIZE", "1048576")];
    let server = Server::start(&data, &env);
    // Leave about 6 MB free.
    filler(&dir.join("filler"), 18 << 20);

    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    declare_durable(&ch, "full").await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .unwrap();

    // 24 MB of 64 KB messages into 6 MB of space, without waiting for each confirm.
    let body = |i: u32| {
        let mut b = vec![b'.'; 64 * 1024];
        b[..4].copy_from_slice(&i.to_be_bytes());
        b
    };
    let mut pending = Vec::new();
    for i in 0..384u32 {
        let pc = within(
            "publish",
            ch.basic_publish(
                "".into(),
                "full".into(),
                BasicPublishOptions::default(),
                &body(i),
                persistent(),
            ),
        )
        .await
        .unwrap();
        pending.push((i, pc));
    }
    // Free the space while confirms are outstanding; the store retries on its own.
    tokio::time::sleep(Duration::from_secs(2)).await;
    std::fs::remove_file(dir.join("filler")).unwrap();
    let mut acked = Vec::new();
    let mut nacked = Vec::new();
    for (i, pc) in pending {
        match within("confirm", pc).await.unwrap() {
            c if c.is_ack() => acked.push(i),
            _ => nacked.push(i),
        }
    }
    eprintln!(
        "{} confirmed, {} nacked while the disk was full",
        acked.len(),
        nacked.len()
    );
    assert!(!nacked.is_empty(), "a full disk nacked nothing");
    assert!(!acked.is_empty(), "nothing was confirmed");

    // Space is back: new publishes are confirmed again.
    for i in 1000..1010u32 {
        let pc = within(
            "publish",
            ch.basic_publish(
                "".into(),
                "full".into(),
                BasicPublishOptions::default(),
                &body(i),
                persistent(),
            ),
        )
        .await
        .unwrap();
        assert!(
            within("confirm", pc).await.unwrap().is_ack(),
            "{i} nacked after recovery"
        );
        acked.push(i);
    }
    server.kill();
    drop(conn);

    // Everything confirmed survived, in order; nothing nacked was stored.
    let server = Server::start(&data, &env);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let mut got = Vec::new();
    while let Some(m) = within(
        "basic.get",
        ch.basic_get("full".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap()
    {
        let d = &m.delivery.data;
        assert_eq!(d.len(), 64 * 1024, "damaged body");
        assert!(d[4..].iter().all(|b| *b == b'.'), "damaged body");
        got.push(u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
    }
    assert_eq!(
        got, acked,
        "recovered messages differ from the confirmed ones"
    );
    drop(conn);
    server.kill();
}
