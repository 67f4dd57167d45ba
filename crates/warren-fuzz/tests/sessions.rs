//! The `connection` target's harness reaches the server's real connection code: seed sessions
//! get past the handshake and get the answers a client would (deliveries, confirms, returns,
//! the reply codes of refusals), and the byte encoding of sessions is exact.

use warren_fuzz::seeds::sessions;
use warren_fuzz::session::{run, Report, Session};

fn seed(name: &str) -> Report {
    let (_, s) = sessions()
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no seed {name}"));
    run(&s)
}

#[test]
fn session_bytes_round_trip() {
    for (name, s) in sessions() {
        assert_eq!(Session::decode(&s.encode()), s, "seed {name}");
    }
    // Any input decodes to a session whose encoding decodes to the same session.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for len in 0..400 {
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let s = Session::decode(&data);
        assert_eq!(Session::decode(&s.encode()), s, "input {data:?}");
    }
}

#[test]
fn publish_get_and_ack() {
    let r = seed("declare-publish-get-ack");
    let c = &r.connections[0];
    assert!(c.opened, "{r:?}");
    assert_eq!(c.deliveries, 1, "{r:?}");
    assert_eq!(c.connection_close, None);
    assert_eq!(r.queues, vec![("q0".to_string(), 0)]);
}

#[test]
fn consume_and_ack() {
    let r = seed("consume-ack");
    assert_eq!(r.connections[0].deliveries, 3, "{r:?}");
    assert!(r.connections[0].channel_closes.is_empty(), "{r:?}");
    assert_eq!(r.queues, vec![("q0".to_string(), 0)]);
}

#[test]
fn confirms_and_mandatory_return() {
    let r = seed("confirms-mandatory-return");
    let c = &r.connections[0];
    assert_eq!(c.confirms, 2, "{r:?}");
    assert_eq!(c.returns, 1, "{r:?}");
    assert_eq!(r.queues, vec![("q1".to_string(), 1)]);
}

#[test]
fn nack_requeue_then_reject_and_recover() {
    let r = seed("nack-reject-recover");
    // Three deliveries, the nacked one again, then recover redelivers what is unacked
    // (messages 1 and 3) on the same channel: tags keep counting.
    assert!(r.connections[0].deliveries >= 4, "{r:?}");
    assert_eq!(r.queues, vec![("q0".to_string(), 2)]);
}

#[test]
fn transaction_commits_one_and_rolls_back_one() {
    let r = seed("tx-commit-rollback");
    assert_eq!(r.connections[0].deliveries, 1, "{r:?}");
    assert_eq!(r.queues, vec![("q0".to_string(), 0)]);
}

#[test]
fn ttl_dead_letters_to_dlq() {
    let r = seed("ttl-dead-letter");
    assert_eq!(r.connections[0].deliveries, 1, "{r:?}");
    let dlq = r.queues.iter().find(|(n, _)| n == "dlq").expect("dlq");
    let q0 = r.queues.iter().find(|(n, _)| n == "q0").expect("q0");
    assert_eq!((dlq.1, q0.1), (1, 0), "{r:?}");
}

#[test]
fn max_length_reject_publish_nacks() {
    let r = seed("max-length-reject-publish");
    assert_eq!(r.connections[0].confirms, 3, "{r:?}");
    assert!(r.queues.is_empty(), "{r:?}");
}

#[test]
fn content_split_into_small_frames() {
    let r = seed("content-split-small-frames");
    assert_eq!(r.connections[0].deliveries, 2, "{r:?}");
}

#[test]
fn content_out_of_order_is_refused() {
    let r = seed("content-out-of-order");
    // A body frame where a header was expected: 505 UNEXPECTED_FRAME closes the connection.
    assert_eq!(r.connections[0].connection_close, Some(505), "{r:?}");
}

#[test]
fn channel_error_then_reopen() {
    let r = seed("channel-error-reopen");
    let c = &r.connections[0];
    assert_eq!(c.channel_closes, vec![404], "{r:?}");
    assert_eq!(c.connection_close, None);
    assert_eq!(r.queues, vec![("q2".to_string(), 0)]);
}

#[test]
fn disconnect_returns_unacked_messages() {
    let r = seed("disconnect-with-unacked");
    assert_eq!(r.connections[0].deliveries, 2, "{r:?}");
    assert_eq!(r.queues, vec![("q0".to_string(), 2)]);
}

#[test]
fn exclusive_queue_across_two_connections() {
    let r = seed("two-connections-exclusive");
    assert_eq!(r.connections.len(), 2);
    // 405 RESOURCE_LOCKED for the other connection's consume.
    assert_eq!(r.connections[1].channel_closes, vec![405], "{r:?}");
    assert_eq!(r.connections[0].deliveries, 0, "{r:?}");
    // The exclusive queue went with its connection; q1 stays.
    assert_eq!(r.queues, vec![("q1".to_string(), 0)]);
}

#[test]
fn handshake_refusals() {
    assert_eq!(seed("bad-login").connections[0].connection_close, Some(403));
    assert_eq!(
        seed("unknown-mechanism").connections[0].connection_close,
        Some(503)
    );
    assert_eq!(
        seed("unknown-vhost").connections[0].connection_close,
        Some(530)
    );
    assert!(seed("bad-header").connections[0].protocol_header);
    assert!(seed("handshake-amqplain").connections[0].opened);
}
