//! Connections, channels and consumers (`/api/connections`, `/api/channels`,
//! `/api/consumers` and their per-vhost and per-object paths), read from the broker's read
//! model, and `DELETE /api/connections/{name}`.
//!
//! Who sees what follows rabbit_mgmt_util: monitoring and administrator users see every
//! connection and channel; other management users only their own (`filter_user`), and a
//! single connection or channel of another user is refused with 401 "User not authorised to
//! access object". Consumers likewise: monitors and administrators see all, other users the
//! consumers of their own channels.

use crate::api::{authorize, has, listed, ok_json, require_vhost, App, Need, Peer, Reply, Q, S};
use crate::backend::{
    ChannelSnapshot, ConnectionDetails, ConnectionSnapshot, IoSnapshot, MessageStats, UserInfo,
};
use crate::error::ApiError;
use crate::rates::{Key, Ranges};
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::{json, Value};
use warren_broker::definitions::table_to_json;

/// RabbitMQ's default reason for a connection closed over the API (rabbit_mgmt_wm_connection),
/// replaced by the request's `X-Reason` header when it has one.
pub const DEFAULT_CLOSE_REASON: &str = "Closed via management plugin";

/// `message_stats` as RabbitMQ's management API shows it, counts only; see
/// [`stats_with_rates`] for the `*_details` objects.
pub fn message_stats_json(s: &MessageStats) -> Value {
    json!({
        "publish": s.publish,
        "confirm": s.confirm,
        "deliver": s.deliver,
        "deliver_no_ack": s.deliver_no_ack,
        "get": s.get,
        "get_no_ack": s.get_no_ack,
        "deliver_get": s.deliver_get(),
        "ack": s.ack,
        "redeliver": s.redeliver,
        "return_unroutable": s.return_unroutable,
        "drop_unroutable": s.drop_unroutable,
        "get_empty": s.get_empty,
    })
}

/// `message_stats` with each counter's `<name>_details: {"rate": ...}` (and `samples`,
/// `avg_rate`, `avg` when `ranges` asks) from the samples of `keys` (summed when several).
pub(crate) fn stats_with_rates(
    app: &App,
    s: &MessageStats,
    keys: &[Key],
    ranges: &Ranges,
) -> Value {
    let mut v = message_stats_json(s);
    app.rates.message_stats(&mut v, keys, ranges);
    v
}

/// RabbitMQ's connection `state` (rabbit_reader's `i(state, ...)`): `flow` while flow
/// control holds it (or did within the last 5 s) and no resource alarm is on; `blocked`
/// while a memory or disk alarm holds it (it published while the alarm was on and is not
/// read from); `blocking` while an alarm is on and it has not published since (it will be
/// held at its next publish); `running` otherwise.
fn connection_state(app: &App, io: &IoSnapshot) -> &'static str {
    let n = app.backend.node();
    let alarm = n.memory_alarm() || n.disk_alarm();
    if io.flow && !alarm {
        "flow"
    } else if io.alarm_held {
        "blocked"
    } else if alarm {
        "blocking"
    } else {
        "running"
    }
}

fn connection_json(app: &App, c: &ConnectionSnapshot) -> Value {
    let d = &c.details;
    let props = table_to_json(&d.client_properties);
    let mut out = json!({
        "name": d.name,
        "node": app.node,
        "type": "network",
        "state": connection_state(app, &c.io),
        "vhost": d.vhost,
        "user": d.user,
        "user_who_performed_action": d.user,
        "protocol": d.protocol,
        "auth_mechanism": d.auth_mechanism,
        "host": d.local.ip().to_canonical().to_string(),
        "port": d.local.port(),
        "peer_host": d.peer.ip().to_canonical().to_string(),
        "peer_port": d.peer.port(),
        "ssl": d.tls,
        "client_properties": Value::Object(props),
        "connected_at": d.connected_at_ms,
        "channels": c.channels,
        "channel_max": d.channel_max,
        "frame_max": d.frame_max,
        "timeout": d.heartbeat,
        // Socket traffic since the connection was accepted, handshake included: bytes, and
        // the read and write calls that moved them (RabbitMQ's packet counts).
        "recv_oct": c.io.recv_oct,
        "recv_cnt": c.io.recv_cnt,
        "send_oct": c.io.send_oct,
        "send_cnt": c.io.send_cnt,
    });
    if let Value::Object(m) = &mut out {
        app.rates.connection(m, d.id);
    }
    out
}

fn connection_details_json(d: &ConnectionDetails) -> Value {
    json!({
        "name": d.name,
        "peer_host": d.peer.ip().to_canonical().to_string(),
        "peer_port": d.peer.port(),
    })
}

fn channel_json(app: &App, c: &ChannelSnapshot, ranges: &Ranges) -> Value {
    let d = &c.connection;
    json!({
        "name": c.name(),
        "node": app.node,
        "number": c.number,
        "user": d.user,
        "user_who_performed_action": d.user,
        "vhost": d.vhost,
        "state": "running",
        "connection_details": connection_details_json(d),
        "prefetch_count": c.prefetch_count,
        "global_prefetch_count": c.global_prefetch_count,
        "messages_unacknowledged": c.unacked,
        "messages_unconfirmed": c.unconfirmed,
        "consumer_count": c.consumers.len(),
        "confirm": c.confirm,
        "transactional": c.transactional,
        "message_stats": stats_with_rates(app, &c.stats, &[Key::Channel(c.id)], ranges),
    })
}

fn consumer_items(app: &App, channels: &[ChannelSnapshot]) -> Vec<Value> {
    let mut out = Vec::new();
    for ch in channels {
        let d = &ch.connection;
        for c in &ch.consumers {
            // The acknowledgement timeout that applies, ms; RabbitMQ shows its `undefined`
            // when there is none.
            let timeout = c
                .consumer_timeout
                .map_or_else(|| json!("undefined"), |t| json!(t));
            out.push(json!({
                "consumer_tag": c.tag,
                "queue": {"name": c.queue, "vhost": d.vhost},
                "channel_details": {
                    "name": ch.name(),
                    "number": ch.number,
                    "connection_name": d.name,
                    "peer_host": d.peer.ip().to_canonical().to_string(),
                    "peer_port": d.peer.port(),
                    "user": d.user,
                    "node": app.node,
                },
                "ack_required": c.ack_required,
                "exclusive": c.exclusive,
                "prefetch_count": c.prefetch_count,
                "arguments": Value::Object(table_to_json(&c.arguments)),
                "consumer_timeout": timeout,
                "active": true,
                "activity_status": "up",
            }));
        }
    }
    out
}

/// The connections `user` may see, of `vhost` only when given.
fn visible_connections(
    app: &App,
    user: &crate::backend::UserInfo,
    vhost: Option<&str>,
) -> Vec<ConnectionSnapshot> {
    app.backend
        .connections()
        .into_iter()
        .filter(|c| app.backend.may_view_connection(user, &c.details.user))
        .filter(|c| vhost.is_none_or(|v| c.details.vhost == v))
        .collect()
}

/// A connection by name, refused (401) when it is another user's and the caller may not see
/// it.
fn find_connection(
    app: &App,
    user: &crate::backend::UserInfo,
    name: &str,
) -> Result<ConnectionSnapshot, ApiError> {
    let c = app
        .backend
        .connections()
        .into_iter()
        .find(|c| c.details.name == name)
        .ok_or_else(ApiError::not_found)?;
    if !app.backend.may_view_connection(user, &c.details.user) {
        return Err(ApiError::not_authorised(
            "User not authorised to access object",
        ));
    }
    Ok(c)
}

pub(crate) async fn connections(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let items = visible_connections(&app, &user, None)
        .iter()
        .map(|c| connection_json(&app, c))
        .collect();
    listed(items, &q)
}

pub(crate) async fn vhost_connections(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    require_vhost(&app, &v)?;
    let items = visible_connections(&app, &user, Some(&v))
        .iter()
        .map(|c| connection_json(&app, c))
        .collect();
    listed(items, &q)
}

pub(crate) async fn connection(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let c = find_connection(&app, &user, &name)?;
    ok_json(connection_json(&app, &c))
}

/// `DELETE /api/connections/{name}`: the client gets connection.close 320 CONNECTION_FORCED
/// with the `X-Reason` header's text, or "Closed via management plugin"; 204.
pub(crate) async fn connection_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let reason = headers
        .get("x-reason")
        .and_then(|v| v.to_str().ok())
        .filter(|r| !r.is_empty())
        .unwrap_or(DEFAULT_CLOSE_REASON);
    app.backend.close_connection(&user, &name, reason)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /api/connections/username/{user}`: the user's connections as RabbitMQ's connection
/// tracking lists them (`name`, `vhost`, `user`, `node`); the user itself, monitors and
/// administrators may ask (401 "User not authorised to access object" otherwise).
pub(crate) async fn user_connections(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(username): Path<String>,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    if !app.backend.may_view_connection(&user, &username) {
        return Err(ApiError::not_authorised(
            "User not authorised to access object",
        ));
    }
    let items = app
        .backend
        .connections()
        .iter()
        .filter(|c| c.details.user == username)
        .map(|c| {
            json!({"name": c.details.name, "vhost": c.details.vhost, "user": c.details.user,
                   "node": app.node})
        })
        .collect();
    listed(items, &q)
}

/// `DELETE /api/connections/username/{user}`: closes every connection of the user with
/// 320 CONNECTION_FORCED (the `X-Reason` header's text, or "Closed via management
/// plugin"); the user itself or an administrator; 204.
pub(crate) async fn user_connections_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(username): Path<String>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    if user.name != username && !has(&user.tags, &["administrator"]) {
        return Err(ApiError::not_authorised(
            "User not authorised to access object",
        ));
    }
    let reason = headers
        .get("x-reason")
        .and_then(|v| v.to_str().ok())
        .filter(|r| !r.is_empty())
        .unwrap_or(DEFAULT_CLOSE_REASON);
    for c in app.backend.connections() {
        if c.details.user == username {
            match app.backend.close_connection(&user, &c.details.name, reason) {
                // Gone in the meantime.
                Err(e) if e.status == StatusCode::NOT_FOUND => {}
                r => r?,
            }
        }
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn connection_channels(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let ranges = Ranges::from_query(&q)?;
    let c = find_connection(&app, &user, &name)?;
    let items = app
        .backend
        .channels(Some(&c.details.name))
        .iter()
        .map(|ch| channel_json(&app, ch, &ranges))
        .collect();
    listed(items, &q)
}

fn visible_channels(app: &App, user: &crate::backend::UserInfo) -> Vec<ChannelSnapshot> {
    app.backend
        .channels(None)
        .into_iter()
        .filter(|c| app.backend.may_view_connection(user, &c.connection.user))
        .collect()
}

pub(crate) async fn channels(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let ranges = Ranges::from_query(&q)?;
    let items = visible_channels(&app, &user)
        .iter()
        .map(|c| channel_json(&app, c, &ranges))
        .collect();
    listed(items, &q)
}

pub(crate) async fn vhost_channels(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    let ranges = Ranges::from_query(&q)?;
    require_vhost(&app, &v)?;
    let items = visible_channels(&app, &user)
        .iter()
        .filter(|c| c.connection.vhost == v)
        .map(|c| channel_json(&app, c, &ranges))
        .collect();
    listed(items, &q)
}

/// `GET /api/channels/{name}`: the channel as the lists show it, and, as RabbitMQ's
/// channel page reads them, `publishes` (per exchange published to: `exchange` {name,
/// vhost} and `stats` {publish, publish_details}), `deliveries` (per queue taken from, that
/// still exists: `queue` {name, vhost} and `stats` with deliver, deliver_no_ack, get,
/// get_no_ack, deliver_get, redeliver and ack, each with its `_details`) and
/// `consumer_details` (its consumers in `/api/consumers`' shape).
pub(crate) async fn channel(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let c = app
        .backend
        .channels(None)
        .into_iter()
        .find(|c| c.name() == name)
        .ok_or_else(ApiError::not_found)?;
    if !app.backend.may_view_connection(&user, &c.connection.user) {
        return Err(ApiError::not_authorised(
            "User not authorised to access object",
        ));
    }
    let ranges = Ranges::from_query(&q)?;
    let mut out = channel_json(&app, &c, &ranges);
    let vhost = &c.connection.vhost;
    let publishes: Vec<Value> = c
        .exchanges
        .iter()
        .map(|(x, n)| {
            let mut stats = json!({"publish": n.publish_in});
            app.rates.message_stats(
                &mut stats,
                &[Key::ChannelExchange(c.id, x.clone())],
                &ranges,
            );
            json!({"exchange": {"name": x, "vhost": vhost}, "stats": stats})
        })
        .collect();
    let deliveries: Vec<Value> = c
        .deliveries
        .iter()
        .map(|d| {
            let mut stats = json!({
                "deliver": d.deliver,
                "deliver_no_ack": d.deliver_no_ack,
                "get": d.get,
                "get_no_ack": d.get_no_ack,
                "deliver_get": d.deliver_get(),
                "redeliver": d.redeliver,
                "ack": d.ack,
            });
            app.rates.message_stats(
                &mut stats,
                &[Key::ChannelQueue(c.id, d.queue.clone())],
                &ranges,
            );
            json!({"queue": {"name": d.queue, "vhost": vhost}, "stats": stats})
        })
        .collect();
    // The channel's own consumers, as `/api/consumers` lists them.
    let consumer_details = consumer_items(&app, std::slice::from_ref(&c));
    out["publishes"] = Value::Array(publishes);
    out["deliveries"] = Value::Array(deliveries);
    out["consumer_details"] = Value::Array(consumer_details);
    ok_json(out)
}

/// The consumers on `channels` that `user` may see: all for monitors and administrators,
/// else those of the user's own channels (rabbit_mgmt_wm_consumers' `filter_user`).
fn visible_consumers(app: &App, user: &UserInfo, channels: Vec<ChannelSnapshot>) -> Vec<Value> {
    let channels: Vec<ChannelSnapshot> = if has(&user.tags, &["administrator", "monitoring"]) {
        channels
    } else {
        channels
            .into_iter()
            .filter(|c| c.connection.user == user.name)
            .collect()
    };
    consumer_items(app, &channels)
}

pub(crate) async fn consumers(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let items = visible_consumers(&app, &user, app.backend.channels(None));
    listed(items, &q)
}

/// `GET /api/consumers/{vhost}`: as RabbitMQ, any management user may ask (404 for a
/// missing vhost) and sees the consumers of the vhost it may see.
pub(crate) async fn vhost_consumers(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    require_vhost(&app, &v)?;
    let channels: Vec<ChannelSnapshot> = app
        .backend
        .channels(None)
        .into_iter()
        .filter(|c| c.connection.vhost == v)
        .collect();
    listed(visible_consumers(&app, &user, channels), &q)
}
