//! The opening handshake: protocol header, connection.start / start-ok with SASL, tune /
//! tune-ok and connection.open, with the login against the broker's users and limits.

use super::*;

/// Reads the next frame during the handshake (before the writer task exists).
pub(super) async fn handshake_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Frame, ConnError> {
    loop {
        match parse_frame(buf, limits) {
            Ok(Some(Frame::Heartbeat { .. })) => continue,
            Ok(Some(f)) => return Ok(f),
            Ok(None) => read_more(rd, buf)
                .await
                .map_err(|e| ConnError::new(constants::CONNECTION_FORCED, e.to_string()))?,
            Err(e) => return Err(ConnError::decode(&e)),
        }
    }
}

pub(super) fn expect_method<T>(
    frame: Frame,
    pick: impl FnOnce(Method) -> Option<T>,
    what: &str,
) -> Result<T, ConnError> {
    match frame {
        Frame::Method { channel: 0, method } => {
            let name = method.name();
            pick(method).ok_or_else(|| {
                ConnError::new(
                    constants::COMMAND_INVALID,
                    format!("expected '{what}', got '{name}'"),
                )
            })
        }
        _ => Err(ConnError::new(
            constants::UNEXPECTED_FRAME,
            format!("expected '{what}' on channel 0"),
        )),
    }
}

pub(super) fn server_properties() -> FieldTable {
    let s = |v: &str| FieldValue::LongString(Bytes::copy_from_slice(v.as_bytes()));
    let mut caps = FieldTable::new();
    for c in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ] {
        caps.insert(c, FieldValue::Bool(true));
    }
    let mut t = FieldTable::new();
    t.insert("capabilities", FieldValue::Table(caps));
    t.insert("cluster_name", s("warren"));
    t.insert("copyright", s("Copyright (c) the Warren developers"));
    t.insert("information", s("Licensed under the MPL 2.0"));
    t.insert("platform", s("Rust"));
    t.insert("product", s("Warren"));
    t.insert("version", s(env!("CARGO_PKG_VERSION")));
    t
}

/// connection.start-ok: the mechanism must be one offered, then the response must name a user
/// the broker lets in. Returns the user's name.
///
/// A refused login is 403 ACCESS_REFUSED with RabbitMQ's generic text whatever the reason
/// (unknown user, wrong password, loopback-only user, unusable certificate), so that the
/// refusal says nothing about which names exist; the reason goes to the log.
pub(super) fn login(
    state: &ServerState,
    start_ok: &ConnectionStartOk,
    offered: &[&str],
    peer: SocketAddr,
    security: &TransportSecurity,
    cap: impl Fn(&str) -> bool,
) -> Result<String, ConnError> {
    let mechanism = start_ok.mechanism.as_str();
    if !offered.contains(&mechanism) {
        let why = if crate::config::KNOWN_MECHANISMS.contains(&mechanism) {
            "invalid"
        } else {
            "unknown"
        };
        return Err(ConnError::new(
            constants::COMMAND_INVALID,
            format!("{why} authentication mechanism '{mechanism}'"),
        ));
    }
    let refused = |reason: &dyn std::fmt::Display| {
        warn!(%peer, mechanism, "{mechanism} login refused: {reason}");
        ConnError {
            login_refused: Some(cap("authentication_failure_close")),
            ..ConnError::new(
                constants::ACCESS_REFUSED,
                format!(
                    "Login was refused using authentication mechanism {mechanism}. For details see the broker logfile."
                ),
            )
        }
    };
    let auth = &state.config.auth;
    let response =
        sasl::decode(mechanism, &start_ok.response, auth, security).map_err(|e| refused(&e))?;
    let credentials = match &response {
        sasl::Response::Password { user, password } => Credentials::Password { user, password },
        sasl::Response::Certificate { user } => Credentials::Verified { user },
        sasl::Response::Anonymous { user } => Credentials::Anonymous { user },
    };
    let source = LoginSource {
        from_loopback: peer.ip().to_canonical().is_loopback(),
        loopback_users: &state.loopback_users,
    };
    let who = state
        .broker
        .login(credentials, source)
        .map_err(|e| refused(&e))?;
    Ok(who.user)
}

/// What the handshake learned about the client.
pub(super) struct Session {
    /// The authenticated user.
    pub(super) user: String,
    /// Counts this connection (and its channels) against the vhost's and the user's limits.
    pub(super) slot: ConnectionSlot,
    /// The client wants basic.cancel when its queue is deleted.
    pub(super) cancel_notify: bool,
    /// The client understands connection.blocked / unblocked.
    pub(super) blocked_notify: bool,
    /// The client's connection.start-ok properties.
    pub(super) client_properties: FieldTable,
    /// The SASL mechanism it logged in with.
    pub(super) mechanism: String,
}

/// The smallest channel_max a client may ask for (RabbitMQ's `?CHANNEL_MIN`).
const CHANNEL_MIN: u32 = 1;

/// A tune-ok value checked as RabbitMQ's rabbit_reader checks it
/// (`validate_negotiated_integer_value`): a non-zero value below `min` is refused, and,
/// since the server's own value is never 0 (the configuration refuses that), so are 0 ("no
/// limit") and anything above the server's value. Refusals are 530 NOT_ALLOWED naming
/// connection.tune, with RabbitMQ's text: `negotiated frame_max = 0 is higher than the
/// maximum allowed value (131072)`, `negotiated channel_max = 0 (no limit) is higher than
/// the maximum allowed value (2047)`, `negotiated frame_max = 1024 is lower than the minimum
/// allowed value (4096)`.
fn negotiated(field: &str, min: u32, server: u32, client: u32) -> Result<u32, ConnError> {
    let refuse = |higher: bool, limit: u32| {
        let detail = if field == "channel_max" && client == 0 {
            " (no limit)"
        } else {
            ""
        };
        let (cmp, bound) = if higher {
            ("higher", "maximum")
        } else {
            ("lower", "minimum")
        };
        Err(ConnError {
            class_id: ConnectionTune::CLASS_ID,
            method_id: ConnectionTune::METHOD_ID,
            ..ConnError::new(
                constants::NOT_ALLOWED,
                format!(
                    "negotiated {field} = {client}{detail} is {cmp} than the {bound} allowed \
                     value ({limit})"
                ),
            )
        })
    };
    if client != 0 && client < min {
        refuse(false, min)
    } else if server != 0 && (client == 0 || client > server) {
        refuse(true, server)
    } else if client == 0 {
        Ok(server)
    } else {
        Ok(client)
    }
}

pub(super) struct Tuned {
    pub(super) frame_max: u32,
    pub(super) channel_max: u16,
    pub(super) heartbeat: u16,
}

/// connection.start → start-ok → tune → tune-ok → open → open-ok. Returns the negotiated
/// tuning, the vhost and whether the client wants basic.cancel notifications.
pub(super) async fn handshake_steps<R, W>(
    state: &ServerState,
    rd: &mut R,
    wr: &mut W,
    rbuf: &mut BytesMut,
    peer: SocketAddr,
    security: &TransportSecurity,
) -> Result<(Tuned, Arc<VHost>, Box<Session>), ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let cfg = &state.config.amqp;
    let io_err = |e: std::io::Error| ConnError::new(constants::CONNECTION_FORCED, e.to_string());
    let limits = Limits {
        frame_max: cfg.frame_max.max(FRAME_MIN_SIZE),
        max_table_depth: cfg.max_table_depth,
    };
    let offered = sasl::offered(&state.config.auth, security);
    let mut out = BytesMut::new();
    encode_method_frame(
        0,
        &Method::ConnectionStart(ConnectionStart {
            version_major: 0,
            version_minor: 9,
            server_properties: server_properties(),
            mechanisms: sasl::mechanisms_field(&offered),
            locales: Bytes::from_static(b"en_US"),
        }),
        &mut out,
    );
    wr.write_all(&out).await.map_err(io_err)?;

    let mut start_ok = expect_method(
        handshake_frame(rd, rbuf, &limits).await?,
        |m| match m {
            Method::ConnectionStartOk(s) => Some(s),
            _ => None,
        },
        "connection.start-ok",
    )?;
    let caps = start_ok
        .client_properties
        .get("capabilities")
        .and_then(|c| c.as_table());
    let cap = |name: &str| {
        caps.and_then(|c| c.get(name))
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    };
    let cancel_notify = cap("consumer_cancel_notify");
    let mechanism = start_ok.mechanism.clone();
    let blocked_notify = cap("connection.blocked");
    let user = login(state, &start_ok, &offered, peer, security, cap)?;
    let client_properties = std::mem::take(&mut start_ok.client_properties);
    out.clear();
    encode_method_frame(
        0,
        &Method::ConnectionTune(ConnectionTune {
            channel_max: cfg.channel_max,
            frame_max: cfg.frame_max,
            heartbeat: cfg.heartbeat,
        }),
        &mut out,
    );
    wr.write_all(&out).await.map_err(io_err)?;
    let tune_ok = expect_method(
        handshake_frame(rd, rbuf, &limits).await?,
        |m| match m {
            Method::ConnectionTuneOk(t) => Some(t),
            _ => None,
        },
        "connection.tune-ok",
    )?;
    let frame_max = negotiated(
        "frame_max",
        FRAME_MIN_SIZE,
        cfg.frame_max,
        tune_ok.frame_max,
    )?;
    let channel_max = negotiated(
        "channel_max",
        CHANNEL_MIN,
        u32::from(cfg.channel_max),
        u32::from(tune_ok.channel_max),
    )?;
    // `negotiated` refused anything above the server's u16 value.
    let channel_max = u16::try_from(channel_max).unwrap_or(cfg.channel_max);
    let tuned = Tuned {
        frame_max,
        channel_max,
        heartbeat: tune_ok.heartbeat,
    };

    let open = expect_method(
        handshake_frame(
            rd,
            rbuf,
            &Limits {
                frame_max,
                ..limits
            },
        )
        .await?,
        |m| match m {
            Method::ConnectionOpen(o) => Some(o),
            _ => None,
        },
        "connection.open",
    )?;
    // connection.open: the vhost, its limits, the user's limits and permissions, in one place
    // (RabbitMQ names connection.open, 10/40, in these closes).
    let open_error = |e: BrokerError| {
        ConnError::from_broker(e, ConnectionOpen::CLASS_ID, ConnectionOpen::METHOD_ID)
    };
    let slot = state
        .sessions
        .open_connection(&state.broker.access(), &user, &open.virtual_host)
        .map_err(open_error)?;
    let vhost = state.broker.vhost(&open.virtual_host).ok_or_else(|| {
        open_error(BrokerError::not_allowed(format!(
            "vhost {} not found",
            open.virtual_host
        )))
    })?;
    out.clear();
    encode_method_frame(
        0,
        &Method::ConnectionOpenOk(ConnectionOpenOk {
            known_hosts: String::new(),
        }),
        &mut out,
    );
    wr.write_all(&out).await.map_err(io_err)?;
    // Boxed: the connection's task holds the result until its frame loop starts; inline,
    // its bytes would stay in the task's future for the connection's lifetime.
    Ok((
        tuned,
        vhost,
        Box::new(Session {
            user,
            slot,
            cancel_notify,
            blocked_notify,
            client_properties,
            mechanism,
        }),
    ))
}
