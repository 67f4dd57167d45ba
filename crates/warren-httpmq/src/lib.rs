//! Warren's HTTP queue API, compatible with httpmq and httpsqs: `GET|POST
//! /?name=Q&opt=put|get|view|status|status_json|reset|maxqueue[&...]`, answered with httpsqs's
//! text replies (`HTTPMQ_PUT_OK`, `HTTPMQ_GET_END`, ...) and its `Pos` header, on the broker's
//! own queues: `name=Q` is the AMQP queue `Q` of the configured vhost, so AMQP consumers
//! receive HTTP puts and HTTP gets take AMQP publishes.
//!
//! Unlike httpmq, a put is answered after the message store's fsync (the group commit AMQP
//! publisher confirms use), a get is answered after the store has durably recorded the
//! message's removal, every get takes a message exactly once under any concurrency, and the
//! disk space of consumed messages is reclaimed by the store.
//!
//! While the store cannot write (a full disk), a get answers `HTTPMQ_GET_END` within a
//! bounded wait and leaves the message at its place, and puts are refused while an alarm
//! blocks AMQP publishers (see the README's httpmq section).
//!
//! - [`Node`]: what the embedding server provides (the broker, the loopback rule).
//! - [`Settings`]: the `[httpmq]` configuration.
//! - [`Httpmq`]: the service; [`serve`] runs it on a listener.
//!
//! Every broker call goes through `warren_broker::Ops` with an `Actor`: the user of a request
//! is the Warren user of its HTTP basic authentication, or [`Settings::user`] for requests
//! without one; its permissions are checked as AMQP's are (write on the queue for `put`, read
//! for `get`, `view` and the status reports, configure for `reset` and `maxqueue`, and
//! configure to create a queue on its first put).

mod listener;
pub mod state;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use parking_lot::Mutex;
use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tracing::warn;
use warren_amqp::properties::BasicProperties;
use warren_broker::access::Operation;
use warren_broker::access::Permission;
use warren_broker::queue::{Positions, Queue, Settlement};
use warren_broker::vhost::QueueDeclare;
use warren_broker::{Actor, Ops, VHost};

pub use listener::{BoundedListener, Tls};
use state::{QueueState, StateFile};

/// The largest `maxqueue` a queue may be given (httpsqs's bound).
pub const MAX_MAXQUEUE: u64 = 10_000_000;

/// The connection id of the API's broker calls: it owns no exclusive queue (exclusive queues
/// of AMQP clients are refused to it).
const HTTPMQ_CONNECTION: u64 = u64::MAX - 1;

/// What the embedding server provides besides the configuration.
pub trait Node: Send + Sync + 'static {
    /// The broker model.
    fn broker(&self) -> &warren_broker::Broker;
    /// Users that may only log in from a loopback address (`[auth] loopback_users`).
    fn loopback_users(&self) -> Vec<String>;
    /// True while AMQP publishers are blocked (the memory alarm, the disk alarm, or failing
    /// message store writes: what sends `connection.blocked`); puts are refused meanwhile.
    fn publishers_blocked(&self) -> bool {
        self.broker().store().is_some_and(|s| s.is_failed())
    }
}

/// The longest a get waits for the message store before giving up: for a barrier that shows
/// the store is writing before a message is taken, and for the fsync of the taken message's
/// removal.
const GET_STORE_WAIT: Duration = Duration::from_secs(5);

/// The `[httpmq]` settings the service runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The vhost whose queues `name=` names.
    pub vhost: String,
    /// The password every request must carry as `auth=` (httpmq's `-auth`); `None`: none.
    /// A request with HTTP basic authentication of a Warren user needs no `auth=`.
    pub auth: Option<String>,
    /// The Warren user whose permissions apply to requests without basic authentication.
    /// Without [`Settings::auth`], such requests from other hosts than the local one are
    /// refused when this user is loopback-only (`guest` by default).
    pub user: String,
    /// A queue's maximum number of unread messages until `opt=maxqueue` sets another.
    pub default_maxqueue: u64,
    /// The largest request body, bytes (a larger one gets 413 and nothing is stored).
    pub max_body_bytes: usize,
    /// Most connections open at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// The state file ([`state`]); `None` for an in-memory broker.
    pub state_file: Option<PathBuf>,
    /// How often changed positions are checkpointed to the state file, ms.
    pub checkpoint_ms: u64,
    /// How long a request with wrong credentials (basic authentication or `auth=`) waits
    /// before its `HTTPMQ_AUTH_FAILED`, as AMQP logins do (`auth.login_failure_delay_ms`).
    pub login_failure_delay: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            vhost: "/".into(),
            auth: None,
            user: "guest".into(),
            default_maxqueue: 1_000_000,
            max_body_bytes: 16 * 1024 * 1024,
            max_connections: 10_000,
            state_file: None,
            checkpoint_ms: 1000,
            login_failure_delay: Duration::from_millis(3000),
        }
    }
}

/// The HTTP queue API of one broker.
pub struct Httpmq {
    node: Arc<dyn Node>,
    settings: Settings,
    /// [`Settings::user`] and [`Settings::vhost`], shared by every request's actor.
    user: Arc<str>,
    vhost_name: Arc<str>,
    /// `opt=maxqueue` settings by queue name.
    maxqueue: Mutex<HashMap<String, u64>>,
    /// The last state written, to skip unchanged checkpoints; the lock also orders writes.
    written: tokio::sync::Mutex<StateFile>,
}

/// A reply: httpsqs answers 200 with a text body, plus `Pos` for a put, get or view.
struct Reply {
    body: Bytes,
    pos: Option<u64>,
}

impl Reply {
    fn text(s: &'static str) -> Reply {
        Reply {
            body: Bytes::from_static(s.as_bytes()),
            pos: None,
        }
    }
}

/// Why a request is refused before its operation runs.
const AUTH_FAILED: &str = "HTTPMQ_AUTH_FAILED";

impl Httpmq {
    /// The service for `node` with `settings`; restores the positions and maxima of the state
    /// file (call it once the broker has recovered its queues, before clients publish).
    ///
    /// Errors: the state file exists but cannot be read.
    pub fn new(node: Arc<dyn Node>, settings: Settings) -> std::io::Result<Arc<Httpmq>> {
        let saved = match &settings.state_file {
            Some(p) => StateFile::load(p)?,
            None => StateFile::default(),
        };
        let mut maxqueue = HashMap::new();
        let vhost = node.broker().vhost(&settings.vhost);
        if vhost.is_none() {
            warn!(
                vhost = %settings.vhost,
                "httpmq: the vhost of httpmq.vhost does not exist; every request answers \
                 HTTPMQ_ERROR until it is created"
            );
        }
        if let Some(v) = vhost {
            for (name, s) in &saved.queues {
                if let Some(m) = s.maxqueue {
                    maxqueue.insert(name.clone(), m);
                }
                if let Ok(q) = v.queue(name, HTTPMQ_CONNECTION) {
                    // Exact unless both puts and gets happened after the checkpoint.
                    let ready = q.positions().ready;
                    q.set_put_position(s.putpos.max(s.getpos + ready));
                    v.track_use(&q);
                }
            }
            // Queues with recovered messages that no checkpoint saw (a crash within the
            // first checkpoint interval): as if checkpointed at position 0, their ready
            // messages hold the positions 1 ..= ready.
            for q in v.used_queues() {
                let p = q.positions();
                if !saved.queues.contains_key(q.name()) && p.put < p.ready {
                    q.set_put_position(p.ready);
                }
            }
        }
        Ok(Arc::new(Httpmq {
            node,
            user: settings.user.as_str().into(),
            vhost_name: settings.vhost.as_str().into(),
            settings,
            maxqueue: Mutex::new(maxqueue),
            written: tokio::sync::Mutex::new(saved),
        }))
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn vhost(&self) -> Option<Arc<VHost>> {
        self.node.broker().vhost(&self.settings.vhost)
    }

    fn maxqueue_of(&self, name: &str) -> u64 {
        self.maxqueue
            .lock()
            .get(name)
            .copied()
            .unwrap_or(self.settings.default_maxqueue)
    }

    /// The state to checkpoint now: every queue of the vhost with a position or a maximum.
    /// Visits only the queues that may hold messages ([`VHost::used_queues`]; a queue with a
    /// position is one of them), so that a checkpoint costs nothing for classic queues that
    /// never held a message.
    fn snapshot(&self) -> StateFile {
        let mut out = StateFile::default();
        let maxqueue = {
            // The maximum of a deleted queue goes with it.
            let mut m = self.maxqueue.lock();
            if let Some(v) = self.vhost() {
                m.retain(|name, _| v.queue(name, HTTPMQ_CONNECTION).is_ok());
            }
            m.clone()
        };
        if let Some(v) = self.vhost() {
            for q in v.used_queues() {
                if q.is_deleted() || !q.durable() {
                    continue;
                }
                let p = q.positions();
                if p.put > 0 || maxqueue.contains_key(q.name()) {
                    out.queues.insert(
                        q.name().to_string(),
                        QueueState {
                            putpos: p.put,
                            getpos: p.get(),
                            maxqueue: maxqueue.get(q.name()).copied(),
                        },
                    );
                }
            }
        }
        for (name, m) in maxqueue {
            out.queues.entry(name).or_default().maxqueue = Some(m);
        }
        out
    }

    /// Writes the state file if anything changed since the last write; returns once it is
    /// on disk.
    ///
    /// Errors: the file could not be written.
    pub async fn checkpoint(&self) -> std::io::Result<()> {
        let Some(path) = self.settings.state_file.clone() else {
            return Ok(());
        };
        let mut written = self.written.lock().await;
        let now = self.snapshot();
        if now == *written {
            return Ok(());
        }
        let copy = now.clone();
        tokio::task::spawn_blocking(move || copy.store(&path))
            .await
            .map_err(std::io::Error::other)??;
        *written = now;
        Ok(())
    }

    /// The actor of a request: the basic-auth user, or [`Settings::user`] when the request
    /// has no `Authorization` header and passes the `auth=` password (if one is set).
    /// `Err`: refused (`HTTPMQ_AUTH_FAILED`); [`Refused::Credentials`] for wrong credentials
    /// (a malformed `Authorization` header, a failed login, a wrong `auth=`), which wait
    /// [`Settings::login_failure_delay`] first.
    fn actor(
        &self,
        headers: &HeaderMap,
        params: &Params<'_>,
        peer: SocketAddr,
    ) -> Result<Actor, Refused> {
        let broker = self.node.broker();
        let user = match headers.get(header::AUTHORIZATION) {
            Some(value) => {
                let Some((name, password)) = basic_auth(value) else {
                    return Err(Refused::Credentials(
                        "malformed Authorization header".into(),
                    ));
                };
                let loopback = self.node.loopback_users();
                let source = warren_broker::LoginSource {
                    from_loopback: peer.ip().is_loopback(),
                    loopback_users: &loopback,
                };
                let credentials = warren_broker::Credentials::Password {
                    user: &name,
                    password: &password,
                };
                match broker.login(credentials, source) {
                    Ok(l) => Arc::from(l.user),
                    Err(e) => {
                        return Err(Refused::Credentials(format!(
                            "basic authentication of user '{name}' failed: {e}"
                        )))
                    }
                }
            }
            None => {
                match &self.settings.auth {
                    Some(expected) => {
                        let given = params.get("auth").unwrap_or_default();
                        if !constant_time_eq(given, expected.as_bytes()) {
                            return Err(Refused::Credentials("wrong auth= password".into()));
                        }
                    }
                    // Without a password, a loopback-only user (guest by default) serves
                    // only local clients, as its AMQP logins do.
                    None => {
                        if !peer.ip().is_loopback()
                            && self.node.loopback_users().contains(&self.settings.user)
                        {
                            return Err(Refused::Other);
                        }
                    }
                }
                self.user.clone()
            }
        };
        let tags: Vec<warren_broker::access::UserTag> = broker
            .access()
            .user(&user)
            .map(|u| u.tags.clone())
            .unwrap_or_default();
        Ok(Actor::new(
            user,
            tags,
            self.vhost_name.clone(),
            HTTPMQ_CONNECTION,
            Some(peer),
        ))
    }

    /// Serves one request (method, URI, headers and body as received, from `peer`).
    async fn handle_from(
        &self,
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: Bytes,
        peer: SocketAddr,
    ) -> Response {
        const FORM: &[u8] = b"application/x-www-form-urlencoded";
        let form = headers.get(header::CONTENT_TYPE).is_some_and(|v| {
            let v = v.as_bytes().trim_ascii_start();
            v.len() >= FORM.len() && v[..FORM.len()].eq_ignore_ascii_case(FORM)
        });
        // Parameters borrow from the query and from this (shared) copy of a form body.
        let form_body = (*method == Method::POST && form).then(|| body.clone());
        let mut params = Params::parse(uri.query().unwrap_or("").as_bytes());
        let mut raw_body = None;
        if *method == Method::POST {
            if let Some(form_body) = &form_body {
                // As httpmq (Go's FormValue): the form's fields win over the query's. A
                // form-typed body without a `data` field is the data itself (httpsqs's
                // `curl -d 'text' "http://host/?name=q&opt=put"`).
                let mut fields = Params::parse(form_body);
                if fields.get("data").is_none() && !body.is_empty() {
                    raw_body = Some(body);
                }
                fields.extend_from(params);
                params = fields;
            } else if !body.is_empty() {
                raw_body = Some(body);
            }
        }
        let charset = params
            .get("charset")
            .and_then(|c| std::str::from_utf8(c).ok())
            .filter(|c| is_charset_token(c))
            .map(str::to_string);
        let reply = match self.actor(headers, &params, peer) {
            Err(Refused::Credentials(why)) => {
                static FAILED: warren_broker::log_limit::LogLimit =
                    warren_broker::log_limit::LogLimit::new();
                if let Some(suppressed) = FAILED.admit() {
                    warn!(%peer, suppressed, "httpmq request refused: {why}");
                }
                tokio::time::sleep(self.settings.login_failure_delay).await;
                Reply::text(AUTH_FAILED)
            }
            Err(Refused::Other) => Reply::text(AUTH_FAILED),
            Ok(actor) => self.operate(&actor, &params, raw_body).await,
        };
        respond(reply, charset.as_deref())
    }

    async fn operate(&self, actor: &Actor, params: &Params<'_>, raw_body: Option<Bytes>) -> Reply {
        let name = params
            .get("name")
            .and_then(|n| std::str::from_utf8(n).ok())
            .unwrap_or("");
        let Some(opt) = params.get("opt") else {
            return Reply::text("HTTPMQ_ERROR");
        };
        // An AMQP queue name: at most 255 bytes (a short string). Control characters and
        // Unicode's line and paragraph separators would garble the lines of `opt=status`.
        if name.is_empty()
            || name.len() > 255
            || name
                .chars()
                .any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}')
        {
            return Reply::text("HTTPMQ_ERROR");
        }
        let Some(vhost) = self.vhost() else {
            static MISSING: warren_broker::log_limit::LogLimit =
                warren_broker::log_limit::LogLimit::new();
            if let Some(suppressed) = MISSING.admit() {
                warn!(
                    vhost = %self.settings.vhost,
                    suppressed,
                    "httpmq request refused: the vhost of httpmq.vhost does not exist"
                );
            }
            return Reply::text("HTTPMQ_ERROR");
        };
        match opt {
            b"put" => {
                let data = match raw_body {
                    Some(b) => b,
                    None => Bytes::copy_from_slice(params.get("data").unwrap_or_default()),
                };
                self.put(actor, &vhost, name, data).await
            }
            b"get" => self.get(actor, &vhost, name).await,
            b"view" => self.view(actor, &vhost, name, params),
            b"status" | b"status_json" => {
                let ops = Ops::new(self.node.broker(), &vhost, actor);
                if ops.authorize(&Operation::BasicGet { queue: name }).is_err() {
                    return Reply::text(AUTH_FAILED);
                }
                let p = self.positions(&vhost, name);
                let max = self.maxqueue_of(name);
                let body = if opt == b"status" {
                    status_text(name, max, p)
                } else {
                    status_json(name, max, p)
                };
                Reply {
                    body: Bytes::from(body),
                    pos: None,
                }
            }
            b"reset" => self.reset(actor, &vhost, name).await,
            b"maxqueue" => self.set_maxqueue(actor, &vhost, name, params).await,
            _ => Reply::text("HTTPMQ_ERROR"),
        }
    }

    fn positions(&self, vhost: &VHost, name: &str) -> Positions {
        vhost
            .queue(name, HTTPMQ_CONNECTION)
            .map(|q| q.positions())
            .unwrap_or_default()
    }

    fn may(&self, actor: &Actor, permission: Permission, queue: &str) -> bool {
        self.node
            .broker()
            .access()
            .permissions(&actor.user, &actor.vhost)
            .is_some_and(|p| p.allows(permission, queue))
    }

    /// The queue to put to, declared durable on the first put.
    fn queue_for_put(
        &self,
        actor: &Actor,
        vhost: &Arc<VHost>,
        name: &str,
    ) -> Result<Arc<Queue>, Reply> {
        match vhost.queue(name, HTTPMQ_CONNECTION) {
            // Positions are kept by the node that holds the queue: puts go there.
            Ok(q) if q.owner_node().is_some() => {
                warn!(
                    queue = name,
                    "httpmq put: the queue is held by another node of the cluster; put it there"
                );
                return Err(Reply::text("HTTPMQ_PUT_ERROR"));
            }
            Ok(q) => return Ok(q),
            Err(e) if e.code != 404 => return Err(Reply::text("HTTPMQ_PUT_ERROR")),
            Err(_) => {}
        }
        let d = QueueDeclare {
            name: name.to_string(),
            passive: false,
            durable: true,
            exclusive: false,
            auto_delete: false,
            arguments: Default::default(),
        };
        match Ops::new(self.node.broker(), vhost, actor).declare_queue(&d) {
            Ok(declared) => declared
                .queue
                .ok_or_else(|| Reply::text("HTTPMQ_PUT_ERROR")),
            Err(e) if e.code == 403 => Err(Reply::text(AUTH_FAILED)),
            Err(e) => {
                warn!(queue = name, error = %e.reply_text(), "httpmq put: cannot declare the queue");
                Err(Reply::text("HTTPMQ_PUT_ERROR"))
            }
        }
    }

    async fn put(&self, actor: &Actor, vhost: &Arc<VHost>, name: &str, data: Bytes) -> Reply {
        if data.is_empty() {
            return Reply::text("HTTPMQ_PUT_ERROR");
        }
        if !self.may(actor, Permission::Write, name) {
            return Reply::text(AUTH_FAILED);
        }
        // As AMQP publishers are blocked by an alarm, puts are refused while one is on:
        // nothing is written.
        if self.node.publishers_blocked() {
            return Reply::text("HTTPMQ_PUT_ERROR");
        }
        let q = match self.queue_for_put(actor, vhost, name) {
            Ok(q) => q,
            Err(r) => return r,
        };
        // Concurrent puts may each see room for one more: the maximum is a bound on unread
        // messages that a burst of simultaneous puts can pass by at most their number.
        if q.positions().ready >= self.maxqueue_of(name) {
            return Reply::text("HTTPMQ_PUT_END");
        }
        let (done, stored) = store_ack();
        let (published, msg) = {
            let ops = Ops::new(self.node.broker(), vhost, actor);
            let props = BasicProperties {
                delivery_mode: Some(2),
                ..BasicProperties::default()
            };
            let msg = match ops.prepare_message(
                warren_broker::ops::publish::PublishCheck::default(),
                String::new(),
                name.to_string(),
                props,
                data,
                None,
            ) {
                Ok(m) => m,
                Err(_) => return Reply::text("HTTPMQ_PUT_ERROR"),
            };
            match ops.publish(msg.clone(), Some((done, 0))) {
                Ok(p) => (p, msg),
                Err(e) => {
                    warn!(queue = name, error = %e, "httpmq put refused");
                    return Reply::text("HTTPMQ_PUT_ERROR");
                }
            }
        };
        if published.stored && !stored.await.unwrap_or(false) {
            return Reply::text("HTTPMQ_PUT_ERROR");
        }
        if !published.routed || published.rejected {
            return Reply::text("HTTPMQ_PUT_END");
        }
        match msg.position.get() {
            Some(&pos) => Reply {
                body: Bytes::from_static(b"HTTPMQ_PUT_OK"),
                pos: Some(pos),
            },
            None => Reply::text("HTTPMQ_PUT_ERROR"),
        }
    }

    async fn get(&self, actor: &Actor, vhost: &Arc<VHost>, name: &str) -> Reply {
        let ops = Ops::new(self.node.broker(), vhost, actor);
        if ops.authorize(&Operation::BasicGet { queue: name }).is_err() {
            return Reply::text(AUTH_FAILED);
        }
        let Ok(q) = vhost.queue(name, HTTPMQ_CONNECTION) else {
            return Reply::text("HTTPMQ_GET_END");
        };
        let store = q.store().cloned();
        if store.as_ref().is_some_and(|s| s.is_failed()) {
            // The removal could not be recorded: leave the message where it is.
            return Reply::text("HTTPMQ_GET_END");
        }
        let Some((m, pos)) = q.get_positioned() else {
            return Reply::text("HTTPMQ_GET_END");
        };
        // Until it is acknowledged, a taken message goes back to its place when this future
        // is dropped (the client went away) or the store is not writing.
        let mut taken = Taken {
            queue: q.clone(),
            message: Some(m),
        };
        let durable = taken.message.as_ref().is_some_and(|m| m.stored.is_some());
        if durable {
            let (done, synced) = store_ack();
            let writing = ops.sync((done, 0))
                && matches!(
                    tokio::time::timeout(GET_STORE_WAIT, synced).await,
                    Ok(Ok(true))
                );
            if !writing || store.as_ref().is_some_and(|s| s.is_failed()) {
                warn!(
                    queue = name,
                    "httpmq get: the message store is not writing; message left in the queue"
                );
                return Reply::text("HTTPMQ_GET_END");
            }
        }
        let Some(m) = taken.message.take() else {
            return Reply::text("HTTPMQ_GET_END");
        };
        let body = m.message.body.clone();
        q.settle(
            HTTPMQ_CONNECTION,
            vec![Settlement {
                consumer_tag: None,
                message: m,
                requeue: false,
                rejected: false,
            }],
        );
        if durable {
            // The removal is on disk before the message is handed out: a get answered is
            // never given again after a crash. Should the store fail right now, the wait is
            // bounded and the message still handed out (the store keeps the removal and
            // writes it once it can): it is not lost, only given again after a crash before
            // that.
            let (done, synced) = store_ack();
            if ops.sync((done, 0))
                && !matches!(
                    tokio::time::timeout(GET_STORE_WAIT, synced).await,
                    Ok(Ok(true))
                )
            {
                warn!(
                    queue = name,
                    "httpmq get: the store has not yet recorded the removal"
                );
            }
        }
        Reply {
            body,
            pos: Some(pos),
        }
    }

    /// `opt=view&pos=N`: the ready message at position N wherever the queue holds it (see
    /// `Queue::peek_position`: at most one spill-file entry and one message record read from
    /// disk, as a basic.get reading a paged-out message does), or `HTTPMQ_VIEW_ERROR` for a
    /// position not yet put or already read (taken by a get or delivered over AMQP).
    fn view(&self, actor: &Actor, vhost: &Arc<VHost>, name: &str, params: &Params<'_>) -> Reply {
        let ops = Ops::new(self.node.broker(), vhost, actor);
        if ops.authorize(&Operation::BasicGet { queue: name }).is_err() {
            return Reply::text(AUTH_FAILED);
        }
        let pos = params
            .get("pos")
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|p| p.trim().parse::<u64>().ok())
            .filter(|&p| p >= 1);
        let body = pos.and_then(|pos| {
            let q = vhost.queue(name, HTTPMQ_CONNECTION).ok()?;
            Some((q.peek_position(pos)?, pos))
        });
        match body {
            Some((body, pos)) => Reply {
                body,
                pos: Some(pos),
            },
            None => Reply::text("HTTPMQ_VIEW_ERROR"),
        }
    }

    async fn reset(&self, actor: &Actor, vhost: &Arc<VHost>, name: &str) -> Reply {
        let ops = Ops::new(self.node.broker(), vhost, actor);
        // Configure on the queue (as a declare), and read (as queue.purge).
        let configure = Operation::QueueDeclare {
            queue: name,
            passive: false,
            dead_letter_exchange: None,
        };
        if ops.authorize(&configure).is_err()
            || ops
                .authorize(&Operation::QueuePurge { queue: name })
                .is_err()
        {
            return Reply::text(AUTH_FAILED);
        }
        let queue = vhost.queue(name, HTTPMQ_CONNECTION).ok();
        self.maxqueue.lock().remove(name);
        if let Some(q) = queue {
            q.reset_positions();
            if q.store().is_some() {
                // The purge's acks on disk before the reply, as the new state file is.
                let (done, synced) = store_ack();
                if ops.sync((done, 0)) {
                    let _ = synced.await;
                }
            }
        }
        match self.checkpoint().await {
            Ok(()) => Reply::text("HTTPMQ_RESET_OK"),
            Err(e) => {
                warn!(error = %e, "httpmq reset: cannot write the state file");
                Reply::text("HTTPMQ_RESET_ERROR")
            }
        }
    }

    async fn set_maxqueue(
        &self,
        actor: &Actor,
        vhost: &Arc<VHost>,
        name: &str,
        params: &Params<'_>,
    ) -> Reply {
        let ops = Ops::new(self.node.broker(), vhost, actor);
        let configure = Operation::QueueDeclare {
            queue: name,
            passive: false,
            dead_letter_exchange: None,
        };
        if ops.authorize(&configure).is_err() {
            return Reply::text(AUTH_FAILED);
        }
        let num = params
            .get("num")
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|p| p.trim().parse::<u64>().ok())
            .filter(|n| (1..=MAX_MAXQUEUE).contains(n));
        let Some(num) = num else {
            return Reply::text("HTTPMQ_MAXQUEUE_CANCLE");
        };
        // As httpmq keeps the maximum with the queue's own state: the queue is declared
        // (durable, as on a first put) if it does not exist yet.
        if let Err(r) = self.queue_for_put(actor, vhost, name) {
            return if r.body == AUTH_FAILED {
                r
            } else {
                Reply::text("HTTPMQ_MAXQUEUE_CANCLE")
            };
        }
        let previous = self.maxqueue.lock().insert(name.to_string(), num);
        match self.checkpoint().await {
            Ok(()) => Reply::text("HTTPMQ_MAXQUEUE_OK"),
            Err(e) => {
                warn!(error = %e, "httpmq maxqueue: cannot write the state file");
                let mut m = self.maxqueue.lock();
                match previous {
                    Some(p) => m.insert(name.to_string(), p),
                    None => m.remove(name),
                };
                Reply::text("HTTPMQ_MAXQUEUE_CANCLE")
            }
        }
    }
}

/// A message taken by a get and not yet settled: put back at its place when dropped.
struct Taken {
    queue: Arc<Queue>,
    message: Option<warren_broker::message::QueuedMessage>,
}

impl Drop for Taken {
    fn drop(&mut self) {
        if let Some(m) = self.message.take() {
            self.queue.settle(
                HTTPMQ_CONNECTION,
                vec![Settlement {
                    consumer_tag: None,
                    message: m,
                    requeue: true,
                    rejected: false,
                }],
            );
        }
    }
}

/// httpsqs's `opt=status` report.
fn status_text(name: &str, max: u64, p: Positions) -> String {
    format!(
        "HTTP Simple Queue Service v0.5\n{}\nQueue Name: {name}\nMaximum number of queues: {max}\n\
         Put position of queue (1st lap): {}\nGet position of queue (1st lap): {}\n\
         Number of unread queue: {}\n\n",
        "-".repeat(30),
        p.put,
        p.get(),
        p.ready,
    )
}

/// httpmq's `opt=status_json` report; numbers are integers (httpmq prints `1e+06`).
fn status_json(name: &str, max: u64, p: Positions) -> String {
    // httpmq's key order.
    format!(
        r#"{{"name":{},"maxqueue":{max},"putpos":{},"putlap":1,"getpos":{},"getlap":1,"unread":{}}}"#,
        serde_json::Value::from(name),
        p.put,
        p.get(),
        p.ready
    )
}

/// True for a charset name made of RFC 2978 `mime-charset` characters only (letters, digits
/// and `!#$%&'+-^_`{}~`), so that a `charset=` parameter cannot add anything else to the
/// `Content-Type` of a reply.
fn is_charset_token(c: &str) -> bool {
    !c.is_empty()
        && c.len() <= 64
        && c.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'+-^_`{}~".contains(&b))
}

fn respond(reply: Reply, charset: Option<&str>) -> Response {
    let content_type = match charset {
        Some(c) => HeaderValue::from_str(&format!("text/plain; charset={c}"))
            .unwrap_or(HeaderValue::from_static("text/plain")),
        None => HeaderValue::from_static("text/plain"),
    };
    let mut r = Response::new(Full::new(reply.body));
    r.headers_mut().insert(header::CONTENT_TYPE, content_type);
    r.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if let Some(pos) = reply.pos {
        r.headers_mut().insert("pos", HeaderValue::from(pos));
    }
    r
}

/// Constant-time comparison of a given password with the expected one (the lengths may
/// differ: the comparison still runs over the expected length).
fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    let mut padded = vec![0u8; expected.len()];
    let n = given.len().min(expected.len());
    padded[..n].copy_from_slice(&given[..n]);
    bool::from(padded.ct_eq(expected)) & (given.len() == expected.len())
}

/// Why a request is refused before its operation runs.
enum Refused {
    /// Wrong or malformed credentials (what is logged).
    Credentials(String),
    /// The default user may not serve this client.
    Other,
}

/// The user and password of an `Authorization: Basic` header value; `None` when it is not
/// `Basic` with the base64 of `user:password`.
fn basic_auth(value: &HeaderValue) -> Option<(String, String)> {
    use base64::Engine;
    let v = value.to_str().ok()?;
    let (scheme, rest) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (u, p) = text.split_once(':')?;
    Some((u.to_string(), p.to_string()))
}

/// Query (or form body) parameters, URL-decoded to bytes (borrowed from the request where
/// nothing needs decoding); the first of repeated keys wins.
#[derive(Debug, Default)]
struct Params<'a>(Vec<(Param<'a>, Param<'a>)>);

/// A decoded key or value of [`Params`].
type Param<'a> = Cow<'a, [u8]>;

impl<'a> Params<'a> {
    fn parse(raw: &'a [u8]) -> Params<'a> {
        // A `data=` value is the whole message (512 bytes and more): the scans for `&`, `=`,
        // `+` and `%` are memchr's, not a byte at a time.
        let decode = |s: &'a [u8]| -> Param<'a> {
            if memchr::memchr2(b'+', b'%', s).is_none() {
                return Cow::Borrowed(s);
            }
            let plus: Vec<u8> = s
                .iter()
                .map(|&b| if b == b'+' { b' ' } else { b })
                .collect();
            Cow::Owned(percent_encoding::percent_decode(&plus).collect())
        };
        let mut out = Vec::new();
        let mut rest = raw;
        loop {
            let (kv, next) = match memchr::memchr(b'&', rest) {
                Some(i) => (&rest[..i], Some(&rest[i + 1..])),
                None => (rest, None),
            };
            if !kv.is_empty() {
                out.push(match memchr::memchr(b'=', kv) {
                    Some(i) => (decode(&kv[..i]), decode(&kv[i + 1..])),
                    None => (decode(kv), Cow::Borrowed(&[][..])),
                });
            }
            match next {
                Some(n) => rest = n,
                None => return Params(out),
            }
        }
    }

    fn extend_from(&mut self, other: Params<'a>) {
        self.0.extend(other.0);
    }

    fn get(&self, key: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(k, _)| k.as_ref() == key.as_bytes())
            .map(|(_, v)| v.as_ref())
    }
}

/// A completion for one store wait and the receiver of its outcome (`true` once fsynced).
fn store_ack() -> (
    Arc<dyn warren_broker::Completion>,
    tokio::sync::oneshot::Receiver<bool>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = warren_broker::completion_once(move |ok| {
        let _ = tx.send(ok);
    });
    (done, rx)
}

/// A reply of the API: a complete body (every reply is small or already in memory).
type Response = hyper::Response<Full<Bytes>>;

/// A reply with `status` and no body.
fn status_only(status: StatusCode) -> Response {
    let mut r = Response::new(Full::default());
    *r.status_mut() = status;
    r
}

/// Serves one request from `peer`: answers 405 to a method other than GET and POST; reads
/// its body (at most [`Settings::max_body_bytes`], else 413 and nothing is stored; a body cut
/// short or malformed: 400; within [`BODY_READ_TIMEOUT`], else 408 and the connection is
/// closed), then answers it.
async fn route(
    app: Arc<Httpmq>,
    peer: SocketAddr,
    req: hyper::Request<hyper::body::Incoming>,
) -> Response {
    // httpsqs's API is GET and POST. Any other method (HEAD from a link checker, a CORS
    // preflight's OPTIONS) changes nothing: a HEAD get would consume a message it never shows.
    if req.method() != Method::GET && req.method() != Method::POST {
        let mut r = status_only(StatusCode::METHOD_NOT_ALLOWED);
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, POST"));
        return r;
    }
    let (parts, body) = req.into_parts();
    let limit = app.settings.max_body_bytes;
    // A declared length over the limit is refused before the body is asked for, so a client
    // that sent `Expect: 100-continue` is not told to send it.
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return status_only(StatusCode::PAYLOAD_TOO_LARGE);
    }
    let body =
        match tokio::time::timeout(BODY_READ_TIMEOUT, Limited::new(body, limit).collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                return status_only(StatusCode::PAYLOAD_TOO_LARGE)
            }
            // A body cut short (the client closed its side before its Content-Length) or
            // malformed (a bad chunk size).
            Ok(Err(_)) => return status_only(StatusCode::BAD_REQUEST),
            Err(_) => {
                let mut r = status_only(StatusCode::REQUEST_TIMEOUT);
                r.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                return r;
            }
        };
    app.handle_from(&parts.method, &parts.uri, &parts.headers, body, peer)
        .await
}

/// How long a client may take to send a request's body (as [`HEADER_READ_TIMEOUT`] bounds
/// its headers).
const BODY_READ_TIMEOUT: Duration = HEADER_READ_TIMEOUT;

/// Waits until `rx` turns true (or its sender is gone).
async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves the API on `listener` (at most [`Settings::max_connections`] connections at once,
/// HTTP/1.1 keep-alive, over TLS when `tls` is given) until `shutdown` turns true, then lets
/// requests in progress finish; checkpoints the state file every [`Settings::checkpoint_ms`]
/// while running and once more at the end.
///
/// Header names are sent in title case (`Pos`, `Content-Length`), as httpsqs sends them:
/// httpsqs's own client libraries look for `Pos:` and `Content-Length:` case-sensitively.
///
/// Errors: the listener's address cannot be read.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Arc<Httpmq>,
    tls: Option<Tls>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    use axum::serve::Listener;
    let mut bounded = BoundedListener::new(listener, app.settings.max_connections, tls)?;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.title_case_headers(true)
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let checkpoints = {
        let app = app.clone();
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let every = Duration::from_millis(app.settings.checkpoint_ms.max(10));
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if let Err(e) = app.checkpoint().await {
                            // A full disk fails every tick: once, then every 10 s at most.
                            static CHECKPOINT_FAILED: warren_broker::log_limit::LogLimit =
                                warren_broker::log_limit::LogLimit::new();
                            if let Some(suppressed) = CHECKPOINT_FAILED.admit() {
                                warn!(error = %e, suppressed, "httpmq: cannot checkpoint the state file");
                            }
                        }
                    }
                    _ = stopped(&mut stop) => return,
                }
            }
        })
    };
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (io, peer) = tokio::select! {
            c = bounded.accept() => c,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = stopped(&mut shutdown) => break,
        };
        let app = app.clone();
        let service = hyper::service::service_fn(move |req| {
            let app = app.clone();
            async move { Ok::<_, std::convert::Infallible>(route(app, peer, req).await) }
        });
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(io), service);
        let mut stop = shutdown.clone();
        connections.spawn(async move {
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stopped(&mut stop) => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    drop(bounded);
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
    checkpoints.abort();
    if let Err(e) = app.checkpoint().await {
        warn!(error = %e, "httpmq: cannot write the state file at shutdown");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_decode_bytes_plus_and_first_wins() {
        let p = Params::parse(b"name=a%20b&data=x+y%FF%00&name=c&flag");
        assert_eq!(p.get("name"), Some(&b"a b"[..]));
        assert_eq!(p.get("data"), Some(&b"x y\xff\x00"[..]));
        assert_eq!(p.get("flag"), Some(&b""[..]));
        assert_eq!(p.get("nope"), None);
        // Empty pieces are skipped; a value keeps its own `=`; a key may be empty.
        let p = Params::parse(b"&&opt=put&&data=a=b&=x&");
        assert_eq!(p.0.len(), 3);
        assert_eq!(p.get("opt"), Some(&b"put"[..]));
        assert_eq!(p.get("data"), Some(&b"a=b"[..]));
        assert_eq!(p.get(""), Some(&b"x"[..]));
        assert!(Params::parse(b"").0.is_empty());
        let long = [b'x'; 600];
        let raw = [&b"data="[..], &long[..], b"&opt=get"].concat();
        let p = Params::parse(&raw);
        assert!(
            matches!(p.0[0].1, Cow::Borrowed(_)),
            "nothing to decode: borrowed"
        );
        assert_eq!(p.get("data"), Some(&long[..]));
        assert_eq!(p.get("opt"), Some(&b"get"[..]));
    }

    #[test]
    fn charset_names_only() {
        for ok in ["utf-8", "ISO-8859-1", "x!#$%&'+-^_`{}~9"] {
            assert!(is_charset_token(ok), "{ok}");
        }
        for bad in [
            "",
            "utf-8,text/html",
            "a b",
            "a;b",
            "\"utf-8\"",
            "a\r\nb",
            "é",
        ] {
            assert!(!is_charset_token(bad), "{bad}");
        }
    }

    #[test]
    fn basic_auth_needs_basic_and_user_colon_password() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(
            basic_auth(&v("Basic Z3Vlc3Q6Z3Vlc3Q=")),
            Some(("guest".into(), "guest".into()))
        );
        for bad in [
            "Bearer Z3Vlc3Q6Z3Vlc3Q=",
            "Basic !!",
            "Basic Z3Vlc3Q=",
            "Basic",
        ] {
            assert_eq!(basic_auth(&v(bad)), None, "{bad}");
        }
    }

    #[test]
    fn constant_time_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
        assert!(!constant_time_eq(b"secret1", b"secret"));
        assert!(!constant_time_eq(b"secre", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
    }

    #[test]
    fn status_reports() {
        let p = Positions { put: 45, ready: 39 };
        assert_eq!(
            status_text("xoyo", 1_000_000, p),
            "HTTP Simple Queue Service v0.5\n------------------------------\nQueue Name: xoyo\n\
             Maximum number of queues: 1000000\nPut position of queue (1st lap): 45\n\
             Get position of queue (1st lap): 6\nNumber of unread queue: 39\n\n"
        );
        assert_eq!(
            status_json("xoyo", 1_000_000, p),
            r#"{"name":"xoyo","maxqueue":1000000,"putpos":45,"putlap":1,"getpos":6,"getlap":1,"unread":39}"#
        );
    }
}
