//! Message rates as RabbitMQ's management plugin gives them with `rates_mode = basic`: every
//! counter of a `message_stats` object gets `<name>_details: {"rate": <per second>}`, and a
//! queue's (a vhost's, the overview's `queue_totals`) `messages`, `messages_ready` and
//! `messages_unacknowledged` get theirs.
//!
//! How (rabbit_mgmt_stats in rabbitmq-server): a background sampler reads every counter
//! every `collect_statistics_interval` (RabbitMQ's name; 5000 ms by default) and keeps the
//! samples for a bounded window. A rate is the difference of the last two samples divided by
//! the time between them, shown only while the last sample is live (not older than two
//! intervals; RabbitMQ's `RangePoint` test), else 0.0.
//!
//! The range query parameters `msg_rates_age` / `msg_rates_incr` (for the counters) and
//! `lengths_age` / `lengths_incr` (for the queue lengths), in seconds, add to each
//! `_details` RabbitMQ's `samples` (`[{"sample": count, "timestamp": ms}]`, newest first,
//! one every `incr` seconds over the last `age` seconds, each the last sampled value at or
//! before that point), `avg_rate` (first to last sample, per second) and `avg` (the mean
//! sample), and compute `rate` from the last two points of that list. `age / incr` above
//! 500, or a zero, is 400 `invalid_range_parameters` ("Invalid range parameters: age A,
//! incr I"), as RabbitMQ. Points older than the kept window are left out.
//!
//! The node's churn counters (connections, channels and queues created and closed: the
//! overview's `churn_rates`) are one more series, [`Key::Churn`], with the node's window.
//!
//! Memory: one sample is 14 counters (112 bytes). The node and each vhost keep 605 s of
//! samples (RabbitMQ's first retention tier), each queue, exchange and channel 65 s (what
//! the web console's default "last minute" charts ask for); at most [`MAX_SAMPLES`] per
//! object whatever the interval. Equal consecutive samples are kept once, as a run, with
//! the sweeps' timestamps kept once for all objects: an idle queue or channel costs one
//! sample, not one per sweep of its window, and one that has counted nothing (no message
//! ever) costs none: it reads as zeros. An object that goes away (a queue
//! deleted, a channel closed, a vhost deleted) loses its samples at the next sweep; a queue
//! deleted and declared again, or a counter that goes backwards, starts a new series.
//!
//! Locks: a sweep reads the registry's counters (atomics) and each queue's counts under its
//! own lock, one queue at a time (the same short hold as a `GET /api/queues`), and only then
//! takes the sample store's lock to append; readers take that lock for the time it takes to
//! copy out one object's samples.

use crate::backend::{Backend, MessageStats, SampleSources};
use crate::error::ApiError;
use axum::http::StatusCode;
use serde_json::{json, Map, Value};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

/// RabbitMQ's default `collect_statistics_interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(5000);

/// The most samples one object keeps, whatever the interval.
pub const MAX_SAMPLES: usize = 1000;

/// The window the node and vhosts keep (RabbitMQ's first `sample_retention_policies` tier).
const WIDE_WINDOW_MS: u64 = 605_000;
/// The window queues and channels keep.
const OBJECT_WINDOW_MS: u64 = 65_000;

/// The most points a range may ask for (rabbit_mgmt_util's `MAX_RANGE`).
const MAX_RANGE: u64 = 500;

const PUBLISH: usize = 0;
const CONFIRM: usize = 1;
const DELIVER: usize = 2;
const DELIVER_NO_ACK: usize = 3;
const GET: usize = 4;
const GET_NO_ACK: usize = 5;
const ACK: usize = 6;
const REDELIVER: usize = 7;
const RETURN_UNROUTABLE: usize = 8;
const DROP_UNROUTABLE: usize = 9;
const GET_EMPTY: usize = 10;
const READY: usize = 11;
const UNACKED: usize = 12;
const PUBLISH_OUT: usize = 13;
const FIELDS: usize = 14;

/// One sample: the counters and lengths of an object at one moment.
type Point = [u64; FIELDS];

fn point(s: &MessageStats, ready: u64, unacked: u64) -> Point {
    let mut p = [0; FIELDS];
    p[PUBLISH] = s.publish;
    p[CONFIRM] = s.confirm;
    p[DELIVER] = s.deliver;
    p[DELIVER_NO_ACK] = s.deliver_no_ack;
    p[GET] = s.get;
    p[GET_NO_ACK] = s.get_no_ack;
    p[ACK] = s.ack;
    p[REDELIVER] = s.redeliver;
    p[RETURN_UNROUTABLE] = s.return_unroutable;
    p[DROP_UNROUTABLE] = s.drop_unroutable;
    p[GET_EMPTY] = s.get_empty;
    p[READY] = ready;
    p[UNACKED] = unacked;
    p
}

/// Reads one value out of a sample.
type Slot = fn(&Point) -> u64;

/// Which [`Slot`] a JSON field name stands for (`None`: a field without samples).
type Lookup = fn(&str) -> Option<Slot>;

/// The value a JSON field name stands for in a sample (RabbitMQ's `message_stats` and
/// length field names); `None` for a field without samples.
fn field(name: &str) -> Option<Slot> {
    Some(match name {
        // An exchange's `publish_in` is kept where the others' `publish` is.
        "publish" | "publish_in" => |p| p[PUBLISH],
        "publish_out" => |p| p[PUBLISH_OUT],
        "confirm" => |p| p[CONFIRM],
        "deliver" => |p| p[DELIVER],
        "deliver_no_ack" => |p| p[DELIVER_NO_ACK],
        "get" => |p| p[GET],
        "get_no_ack" => |p| p[GET_NO_ACK],
        "ack" => |p| p[ACK],
        "redeliver" => |p| p[REDELIVER],
        "return_unroutable" => |p| p[RETURN_UNROUTABLE],
        "drop_unroutable" => |p| p[DROP_UNROUTABLE],
        "get_empty" => |p| p[GET_EMPTY],
        "deliver_get" => |p| p[DELIVER] + p[DELIVER_NO_ACK] + p[GET] + p[GET_NO_ACK],
        "messages_ready" => |p| p[READY],
        "messages_unacknowledged" => |p| p[UNACKED],
        "messages" => |p| p[READY] + p[UNACKED],
        _ => return None,
    })
}

/// The churn counters of the overview's `churn_rates`, in the order a [`Key::Churn`]
/// sample keeps them (in the first slots of a [`Point`]).
const CHURN_FIELDS: [&str; 7] = [
    "connection_created",
    "connection_closed",
    "channel_created",
    "channel_closed",
    "queue_declared",
    "queue_created",
    "queue_deleted",
];

fn churn_point(c: &crate::backend::Churn) -> Point {
    let mut p = [0; FIELDS];
    let values = [
        c.connection_created,
        c.connection_closed,
        c.channel_created,
        c.channel_closed,
        c.queue_declared,
        c.queue_created,
        c.queue_deleted,
    ];
    p[..values.len()].copy_from_slice(&values);
    p
}

/// The slot of a churn counter in a [`Key::Churn`] sample.
fn churn_field(name: &str) -> Option<Slot> {
    Some(match CHURN_FIELDS.iter().position(|f| *f == name)? {
        0 => |p| p[0],
        1 => |p| p[1],
        2 => |p| p[2],
        3 => |p| p[3],
        4 => |p| p[4],
        5 => |p| p[5],
        _ => |p| p[6],
    })
}

/// What samples are kept for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// The whole node (the overview of monitors and administrators).
    Node,
    /// The node's churn counters (the overview's `churn_rates`).
    Churn,
    /// A vhost, by name.
    Vhost(String),
    /// A queue, by `QueueInfo::ident`: a queue deleted and declared again under the same
    /// name starts a new series.
    Queue(u64),
    /// A channel, by its process-unique id.
    Channel(u64),
    /// An exchange: (vhost, name).
    Exchange(String, String),
    /// The node's resource gauges (memory, descriptors, sockets, disk, threads).
    Resources,
    /// A channel's publishes to one exchange: (channel id, exchange name).
    ChannelExchange(u64, String),
    /// A channel's deliveries from one queue: (channel id, queue name).
    ChannelQueue(u64, String),
}

impl Key {
    /// Series whose counts only start once the object counts something (queues, channels
    /// and their per-exchange and per-queue counts): their first sample is preceded by a
    /// zero at the previous sweep, so that they have a rate at once.
    fn counts_from_zero(&self) -> bool {
        matches!(
            self,
            Key::Queue(_) | Key::Channel(_) | Key::ChannelExchange(..) | Key::ChannelQueue(..)
        )
    }
}

/// The node's resource gauges, in the order a [`Key::Resources`] sample keeps them.
pub const RESOURCE_FIELDS: [&str; 5] = [
    "mem_used",
    "fd_used",
    "sockets_used",
    "disk_free",
    "proc_used",
];

fn resource_field(name: &str) -> Option<Slot> {
    Some(match RESOURCE_FIELDS.iter().position(|f| *f == name)? {
        0 => |p| p[0],
        1 => |p| p[1],
        2 => |p| p[2],
        3 => |p| p[3],
        _ => |p| p[4],
    })
}

/// The last two samples of a connection's traffic, each (timestamp ms, `recv_oct`,
/// `send_oct`): all that is kept per connection (about 70 bytes; a [`Series`] would take
/// several hundred for every idle connection), so its `_details` have a `rate` only.
#[derive(Debug, Clone, Copy, Default)]
struct TrafficSamples {
    older: (u64, u64, u64),
    newer: (u64, u64, u64),
}

struct Series {
    /// A queue's address (see `Backend::sample_sources`); 0 for other objects.
    addr: usize,
    /// The samples, oldest first, as runs of equal consecutive samples: an idle object
    /// keeps one run however long its window.
    runs: VecDeque<Run>,
    /// The timestamp of the last sweep that sampled the object: a series the last sweep
    /// did not sample is of an object gone.
    sampled: u64,
}

/// Equal samples taken at every sweep from `first` to `last` (timestamps, ms).
struct Run {
    first: u64,
    last: u64,
    point: Point,
}

impl Series {
    /// Adds the sample of the sweep at `ts`; `oldest` is the timestamp of the oldest sweep
    /// this series still covers.
    /// A `gauge` series (the node's resources) may go down; in any other, a counter going
    /// back starts a new series.
    fn push(&mut self, ts: u64, p: Point, oldest: u64, gauge: bool) {
        let went_back = !gauge
            && self.runs.back().is_some_and(|last| {
                (0..FIELDS)
                    .filter(|i| *i != READY && *i != UNACKED)
                    .any(|i| p[i] < last.point[i])
            });
        if went_back {
            self.runs.clear();
        }
        match self.runs.back_mut() {
            Some(last) if last.point == p => last.last = ts,
            _ => self.runs.push_back(Run {
                first: ts,
                last: ts,
                point: p,
            }),
        }
        while self.runs.front().is_some_and(|r| r.last < oldest) {
            self.runs.pop_front();
        }
        if let Some(front) = self.runs.front_mut() {
            front.first = front.first.max(oldest);
        }
    }

    /// The samples, oldest first, given the sweeps' timestamps (oldest first).
    fn samples<'a>(&'a self, sweeps: &'a VecDeque<u64>) -> impl Iterator<Item = (u64, &'a Point)> {
        self.runs.iter().flat_map(move |r| {
            let from = sweeps.partition_point(|t| *t < r.first);
            let to = sweeps.partition_point(|t| *t <= r.last);
            sweeps.range(from..to).map(move |t| (*t, &r.point))
        })
    }
}

/// The samples of every object, and the timestamps of the sweeps that took them.
#[derive(Default)]
struct Store {
    series: HashMap<Key, Series>,
    /// Each open connection's last two traffic samples, by connection id.
    traffic: HashMap<u64, TrafficSamples>,
    /// Every sweep's timestamp (ms, increasing) over the widest window.
    sweeps: VecDeque<u64>,
}

/// A requested range (`<prefix>_age`, `<prefix>_incr`), in ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    first: u64,
    last: u64,
    incr: u64,
}

/// The ranges a request asks for: (message rates, lengths).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ranges {
    msg_rates: Option<Range>,
    lengths: Option<Range>,
}

impl Ranges {
    /// Reads `msg_rates_age`/`msg_rates_incr` and `lengths_age`/`lengths_incr` (seconds).
    /// Errors: 400 `invalid_range_parameters`, as rabbit_mgmt_util.
    pub fn from_query(q: &HashMap<String, String>) -> Result<Ranges, ApiError> {
        Self::at(q, now_ms())
    }

    fn at(q: &HashMap<String, String>, now: u64) -> Result<Ranges, ApiError> {
        Ok(Ranges {
            msg_rates: range(q, "msg_rates", now, false)?,
            lengths: range(q, "lengths", now, true)?,
        })
    }
}

fn range(
    q: &HashMap<String, String>,
    prefix: &str,
    now: u64,
    ceil: bool,
) -> Result<Option<Range>, ApiError> {
    let get = |k: &str| q.get(&format!("{prefix}_{k}"));
    let (Some(age), Some(incr)) = (get("age"), get("incr")) else {
        return Ok(None);
    };
    let invalid = || ApiError {
        status: StatusCode::BAD_REQUEST,
        error: "invalid_range_parameters",
        reason: format!("Invalid range parameters: age {age}, incr {incr}"),
        challenge: false,
    };
    let (Ok(a), Ok(i)) = (age.parse::<u64>(), incr.parse::<u64>()) else {
        // RabbitMQ reads a non-integer as no range at all.
        return Ok(None);
    };
    if a == 0 || i == 0 || a / i > MAX_RANGE {
        return Err(invalid());
    }
    let (age, incr) = (a * 1000, i * 1000);
    let floor = now / incr * incr;
    let last = if ceil && floor != now {
        floor + incr
    } else {
        floor
    };
    Ok(Some(Range {
        first: last.saturating_sub(age),
        last,
        incr,
    }))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The sample store and its sampler's settings.
pub struct Rates {
    interval: Duration,
    store: Mutex<Store>,
}

impl Rates {
    /// A store sampled every `interval` (RabbitMQ's `collect_statistics_interval`).
    pub fn new(interval: Duration) -> Rates {
        Rates {
            interval: interval.max(Duration::from_millis(1)),
            store: Mutex::new(Store::default()),
        }
    }

    /// The sampling interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    fn cap(&self, window_ms: u64) -> usize {
        let interval = self.interval.as_millis().max(1) as u64;
        (window_ms.div_ceil(interval) as usize + 1).clamp(2, MAX_SAMPLES)
    }

    /// Takes one sample of everything `backend` counts, and forgets the objects gone since
    /// the last sweep.
    pub fn sweep(&self, backend: &Backend) {
        let sampled: std::collections::HashSet<usize> = {
            let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            store
                .series
                .values()
                .map(|s| s.addr)
                .filter(|a| *a != 0)
                .collect()
        };
        let src = backend.sample_sources(&sampled);
        self.record(now_ms(), src);
    }

    fn record(&self, ts: u64, src: SampleSources) {
        // (key, a queue's address, sample, window)
        let mut rows: Vec<(Key, usize, Point, u64)> = Vec::with_capacity(src.queues.len() + 8);
        let (mut ready, mut unacked) = (0, 0);
        for v in &src.vhosts {
            ready += v.ready;
            unacked += v.unacked;
        }
        for q in &src.queues {
            rows.push((
                Key::Queue(q.ident),
                q.addr,
                point(&q.stats, q.ready, q.unacked),
                OBJECT_WINDOW_MS,
            ));
        }
        for v in src.vhosts {
            rows.push((
                Key::Vhost(v.name),
                0,
                point(&v.stats, v.ready, v.unacked),
                WIDE_WINDOW_MS,
            ));
        }
        rows.push((
            Key::Node,
            0,
            point(&src.node, ready, unacked),
            WIDE_WINDOW_MS,
        ));
        rows.push((Key::Churn, 0, churn_point(&src.churn), WIDE_WINDOW_MS));
        for (id, stats) in &src.channels {
            rows.push((Key::Channel(*id), 0, point(stats, 0, 0), OBJECT_WINDOW_MS));
        }
        for ((vhost, name), c) in &src.exchanges {
            let mut p = [0; FIELDS];
            p[PUBLISH] = c.publish_in;
            p[PUBLISH_OUT] = c.publish_out;
            rows.push((
                Key::Exchange(vhost.clone(), name.clone()),
                0,
                p,
                OBJECT_WINDOW_MS,
            ));
        }
        for (id, _, exchange, c) in &src.channel_exchanges {
            let mut p = [0; FIELDS];
            p[PUBLISH] = c.publish_in;
            rows.push((
                Key::ChannelExchange(*id, exchange.clone()),
                0,
                p,
                OBJECT_WINDOW_MS,
            ));
        }
        for (id, _, d) in &src.channel_queues {
            let mut p = [0; FIELDS];
            p[DELIVER] = d.deliver;
            p[DELIVER_NO_ACK] = d.deliver_no_ack;
            p[GET] = d.get;
            p[GET_NO_ACK] = d.get_no_ack;
            p[REDELIVER] = d.redeliver;
            p[ACK] = d.ack;
            rows.push((
                Key::ChannelQueue(*id, d.queue.clone()),
                0,
                p,
                OBJECT_WINDOW_MS,
            ));
        }
        if let Some(r) = &src.resources {
            let mut p = [0; FIELDS];
            p[..RESOURCE_FIELDS.len()].copy_from_slice(&r.gauges());
            rows.push((Key::Resources, 0, p, WIDE_WINDOW_MS));
        }
        let widest = self.cap(WIDE_WINDOW_MS);
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let Store {
            series,
            sweeps,
            traffic,
        } = &mut *store;
        // Timestamps keep increasing even if the wall clock steps back.
        let ts = sweeps.back().map_or(ts, |last| ts.max(last + 1));
        sweeps.push_back(ts);
        while sweeps.len() > widest {
            sweeps.pop_front();
        }
        let previous = sweeps.len().checked_sub(2).map(|i| sweeps[i]);
        for (key, addr, p, window) in rows {
            let oldest = sweeps[sweeps.len().saturating_sub(self.cap(window))];
            let gauge = key == Key::Resources;
            let from_zero = key.counts_from_zero();
            let queue = matches!(key, Key::Queue(_));
            let s = match series.entry(key) {
                Entry::Occupied(e) => e.into_mut(),
                // A queue or channel that has counted nothing yet keeps no samples (its
                // rates are 0 either way): idle queues and idle connections' channels cost
                // the store nothing. Its first counts start from a zero sample at the
                // previous sweep, so that they have a rate at once.
                Entry::Vacant(_) if from_zero && p == [0; FIELDS] => {
                    continue;
                }
                Entry::Vacant(e) => {
                    let mut runs = VecDeque::with_capacity(1);
                    if let (true, Some(t)) = (from_zero, previous) {
                        // Counters from zero, and the messages the queue's publishes
                        // explain; those they do not (recovered at start, or counted by
                        // another node) were there already: a queue that appears holding
                        // messages shows no growth it did not have.
                        let mut zero = [0; FIELDS];
                        let held = (p[READY] + p[UNACKED]).saturating_sub(p[PUBLISH]);
                        zero[READY] = p[READY].min(held);
                        zero[UNACKED] = held - zero[READY];
                        // A queue read as zeros over its window while it had no samples:
                        // those zeros stay its history.
                        let first = if queue { oldest.min(t) } else { t };
                        runs.push_back(Run {
                            first,
                            last: t,
                            point: zero,
                        });
                    }
                    // Room for one run: most objects are idle, and their series stays one.
                    e.insert(Series {
                        addr,
                        runs,
                        sampled: ts,
                    })
                }
            };
            s.push(ts, p, oldest, gauge);
            s.sampled = ts;
        }
        series.retain(|_, s| s.sampled == ts);
        // A new connection's traffic counts from zero at the previous sweep (it opened
        // since), so that it has a rate at once.
        traffic.reserve(src.connections.len().saturating_sub(traffic.len()));
        for (id, io) in &src.connections {
            let now = (ts, io.recv_oct, io.send_oct);
            let t = traffic.entry(*id).or_insert_with(|| TrafficSamples {
                older: (previous.unwrap_or(ts), 0, 0),
                newer: (previous.unwrap_or(ts), 0, 0),
            });
            t.older = t.newer;
            t.newer = now;
        }
        // Those not sampled now are closed.
        traffic.retain(|_, t| t.newer.0 == ts);
    }

    /// The samples of `keys` summed by timestamp (the timestamps every key has), oldest
    /// first. A queue without samples has counted nothing: zeros over its window.
    fn samples(&self, keys: &[Key]) -> Vec<(u64, Point)> {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let mut sum: BTreeMap<u64, (usize, Point)> = BTreeMap::new();
        let mut found = 0;
        let object_cap = self.cap(OBJECT_WINDOW_MS);
        let zeros = [0; FIELDS];
        for key in keys {
            let samples: Box<dyn Iterator<Item = (u64, &Point)>> = match store.series.get(key) {
                Some(s) => Box::new(s.samples(&store.sweeps)),
                None if matches!(key, Key::Queue(_)) => {
                    let from = store.sweeps.len().saturating_sub(object_cap);
                    Box::new(store.sweeps.range(from..).map(|t| (*t, &zeros)))
                }
                None => continue,
            };
            found += 1;
            for (ts, p) in samples {
                let e = sum.entry(ts).or_insert((0, [0; FIELDS]));
                e.0 += 1;
                for (sum, v) in e.1.iter_mut().zip(p) {
                    *sum += v;
                }
            }
        }
        drop(store);
        sum.into_iter()
            .filter(|(_, (n, _))| *n == found)
            .map(|(ts, (_, p))| (ts, p))
            .collect()
    }

    /// Adds `<field>_details` to every field of `obj` that has samples (a `message_stats`
    /// object, or a queue with its lengths) among `only` (every one when empty).
    /// `lengths` says which range applies: the lengths' or the message rates'.
    fn decorate(
        &self,
        obj: &mut Map<String, Value>,
        samples: &[(u64, Point)],
        names: &[&str],
        range: Option<Range>,
    ) {
        self.decorate_with(obj, samples, names, range, field);
    }

    /// [`Rates::decorate`] with `lookup` telling which slot of a sample a name is.
    fn decorate_with(
        &self,
        obj: &mut Map<String, Value>,
        samples: &[(u64, Point)],
        names: &[&str],
        range: Option<Range>,
        lookup: Lookup,
    ) {
        let now = now_ms();
        let interval = self.interval.as_millis() as u64;
        for name in names {
            let Some(f) = lookup(name) else { continue };
            if !obj.contains_key(*name) {
                continue;
            }
            let details = match range {
                None => json!({"rate": instant_rate(samples, f, now, interval)}),
                Some(r) => ranged(samples, f, r, interval),
            };
            obj.insert(format!("{name}_details"), details);
        }
    }

    /// Adds the `_details` of every counter in `stats` (a `message_stats` object) for the
    /// object(s) `keys` (several are summed: the overview of a user who sees some vhosts).
    pub fn message_stats(&self, stats: &mut Value, keys: &[Key], ranges: &Ranges) {
        let Value::Object(m) = stats else { return };
        let samples = self.samples(keys);
        let names: Vec<String> = m.keys().cloned().collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        self.decorate(m, &samples, &names, ranges.msg_rates);
    }

    /// The overview's `churn_rates` for `churn` (the counts now): each count with its
    /// `<name>_details` from the node's churn samples (with the lengths' range, as
    /// RabbitMQ picks it for churn).
    pub fn churn_rates(&self, churn: &crate::backend::Churn, ranges: &Ranges) -> Value {
        let p = churn_point(churn);
        let mut m = Map::new();
        for (i, name) in CHURN_FIELDS.iter().enumerate() {
            m.insert((*name).to_string(), Value::from(p[i]));
        }
        let samples = self.samples(&[Key::Churn]);
        self.decorate_with(&mut m, &samples, &CHURN_FIELDS, ranges.lengths, churn_field);
        Value::Object(m)
    }

    /// Adds `<gauge>_details: {"rate": ...}` (change per second) to the node's resource
    /// gauges in `obj` (`mem_used`, `fd_used`, `sockets_used`, `disk_free`, `proc_used`),
    /// from the sampler's samples of them.
    pub fn resources(&self, obj: &mut Map<String, Value>) {
        let samples = self.samples(&[Key::Resources]);
        self.decorate_with(obj, &samples, &RESOURCE_FIELDS, None, resource_field);
    }

    /// Adds `recv_oct_details` and `send_oct_details` (`rate`: bytes per second between
    /// the last two samples, 0.0 once the last is older than two intervals) to `obj`,
    /// connection `id`'s JSON. Only the last two samples of a connection are kept, so
    /// RabbitMQ's `data_rates_age` / `data_rates_incr` ranges are not offered.
    pub fn connection(&self, obj: &mut Map<String, Value>, id: u64) {
        let t = self
            .store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .traffic
            .get(&id)
            .copied();
        let interval = self.interval.as_millis() as u64;
        let (recv, send) = match t {
            Some(TrafficSamples { older, newer })
                if newer.0 > older.0 && now_ms().saturating_sub(newer.0) <= 2 * interval =>
            {
                let ms = newer.0 - older.0;
                (rate(newer.1, older.1, ms), rate(newer.2, older.2, ms))
            }
            _ => (0.0, 0.0),
        };
        obj.insert("recv_oct_details".into(), json!({ "rate": recv }));
        obj.insert("send_oct_details".into(), json!({ "rate": send }));
    }

    /// Adds `messages_details`, `messages_ready_details` and
    /// `messages_unacknowledged_details` to `obj` (a queue, a vhost, the overview's
    /// `queue_totals`) for `keys`.
    pub fn lengths(&self, obj: &mut Value, keys: &[Key], ranges: &Ranges) {
        let Value::Object(m) = obj else { return };
        let samples = self.samples(keys);
        self.decorate(
            m,
            &samples,
            &["messages", "messages_ready", "messages_unacknowledged"],
            ranges.lengths,
        );
    }
}

/// RabbitMQ's instant rate: the last two samples' difference per second, 0.0 when there
/// are fewer than two or the last is stale (older than two intervals).
fn instant_rate(samples: &[(u64, Point)], f: fn(&Point) -> u64, now: u64, interval: u64) -> f64 {
    let n = samples.len();
    if n < 2 {
        return 0.0;
    }
    let (t1, p1) = &samples[n - 1];
    let (t0, p0) = &samples[n - 2];
    if now.saturating_sub(*t1) > 2 * interval || t1 <= t0 {
        return 0.0;
    }
    rate(f(p1), f(p0), t1 - t0)
}

fn rate(newer: u64, older: u64, ms: u64) -> f64 {
    (newer as f64 - older as f64) * 1000.0 / ms as f64
}

/// `_details` for a range: `samples` (newest first), `rate`, `avg_rate`, `avg`.
fn ranged(samples: &[(u64, Point)], f: fn(&Point) -> u64, r: Range, interval: u64) -> Value {
    // One point per `incr` from `first` to `last`, each the last sample at or before it.
    let mut points: Vec<(u64, u64)> = Vec::new();
    let mut t = r.first;
    let mut i = 0;
    while t <= r.last {
        while i < samples.len() && samples[i].0 <= t {
            i += 1;
        }
        if i > 0 {
            points.push((t, f(&samples[i - 1].1)));
        }
        t += r.incr;
    }
    let n = points.len();
    let rate_now = match points.as_slice() {
        [.., (t0, v0), (t1, v1)] if *t1 + interval >= r.last => rate(*v1, *v0, t1 - t0),
        _ => 0.0,
    };
    let list: Vec<Value> = points
        .iter()
        .rev()
        .map(|(ts, v)| json!({"sample": v, "timestamp": ts}))
        .collect();
    let mut out = json!({"rate": rate_now, "samples": list});
    if n > 1 {
        let (t0, v0) = points[0];
        let (t1, v1) = points[n - 1];
        let total: u64 = points.iter().map(|p| p.1).sum();
        out["avg_rate"] = json!(rate(v1, v0, t1 - t0));
        out["avg"] = json!(total as f64 / n as f64);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{QueueSample, VhostSample};

    fn sources(publish: u64, ready: u64, queue_ident: u64) -> SampleSources {
        let stats = MessageStats {
            publish,
            ..MessageStats::default()
        };
        SampleSources {
            node: stats,
            vhosts: vec![VhostSample {
                name: "/".into(),
                stats,
                ready,
                unacked: 0,
            }],
            queues: vec![QueueSample {
                ident: queue_ident,
                addr: queue_ident as usize,
                stats,
                ready,
                unacked: 0,
            }],
            channels: vec![(7, stats)],
            exchanges: vec![(
                ("/".into(), "x".into()),
                crate::backend::ExchangeCounts {
                    publish_in: publish,
                    publish_out: 2 * publish,
                },
            )],
            churn: crate::backend::Churn {
                connection_created: publish,
                queue_deleted: 2 * publish,
                ..Default::default()
            },
            ..SampleSources::default()
        }
    }

    fn rate_of(rates: &Rates, key: Key) -> Value {
        let mut v = json!({"publish": 0, "deliver_get": 0});
        rates.message_stats(&mut v, &[key], &Ranges::default());
        v
    }

    #[test]
    fn rate_is_the_last_two_samples_per_second() {
        let rates = Rates::new(Duration::from_millis(1000));
        let now = now_ms();
        rates.record(now - 1000, sources(100, 10, 1));
        rates.record(now, sources(600, 20, 1));
        let v = rate_of(&rates, Key::Node);
        assert_eq!(v["publish_details"]["rate"], 500.0);
        assert_eq!(v["deliver_get_details"]["rate"], 0.0);
        let mut q = json!({"messages": 20, "messages_ready": 20, "messages_unacknowledged": 0});
        rates.lengths(&mut q, &[Key::Queue(1)], &Ranges::default());
        assert_eq!(q["messages_ready_details"]["rate"], 10.0);
        assert_eq!(q["messages_details"]["rate"], 10.0);
        assert_eq!(
            rate_of(&rates, Key::Channel(7))["publish_details"]["rate"],
            500.0
        );
    }

    #[test]
    fn connection_traffic_rates_from_the_last_two_samples() {
        let rates = Rates::new(Duration::from_millis(1000));
        let now = now_ms();
        let io = |recv, send| crate::backend::IoSnapshot {
            recv_oct: recv,
            send_oct: send,
            ..Default::default()
        };
        let mut src = sources(0, 0, 1);
        rates.record(now - 2000, src.clone());
        // Opened since the last sweep: counted from zero at it.
        src.connections = vec![(3, io(1000, 500))];
        rates.record(now - 1000, src.clone());
        let mut m = Map::new();
        rates.connection(&mut m, 3);
        assert_eq!(m["recv_oct_details"]["rate"], 1000.0, "{m:?}");
        assert_eq!(m["send_oct_details"]["rate"], 500.0, "{m:?}");
        src.connections = vec![(3, io(3000, 4500))];
        rates.record(now, src.clone());
        rates.connection(&mut m, 3);
        assert_eq!(m["recv_oct_details"]["rate"], 2000.0);
        assert_eq!(m["send_oct_details"]["rate"], 4000.0);
        // Gone: forgotten at the next sweep.
        src.connections.clear();
        rates.record(now + 1, src);
        assert!(rates.store.lock().unwrap().traffic.is_empty());
        rates.connection(&mut m, 3);
        assert_eq!(m["recv_oct_details"]["rate"], 0.0);
    }

    #[test]
    fn churn_rates_are_the_counts_with_their_rates() {
        let rates = Rates::new(Duration::from_millis(1000));
        let now = now_ms();
        rates.record(now - 1000, sources(100, 0, 1));
        rates.record(now, sources(600, 0, 1));
        let churn = crate::backend::Churn {
            connection_created: 600,
            queue_deleted: 1200,
            ..Default::default()
        };
        let v = rates.churn_rates(&churn, &Ranges::default());
        assert_eq!(v["connection_created"], 600);
        assert_eq!(v["connection_created_details"]["rate"], 500.0);
        assert_eq!(v["queue_deleted_details"]["rate"], 1000.0);
        assert_eq!(v["channel_closed"], 0);
        assert_eq!(v["channel_closed_details"]["rate"], 0.0);
    }

    #[test]
    fn stale_samples_and_gone_objects() {
        let rates = Rates::new(Duration::from_millis(1000));
        let now = now_ms();
        rates.record(now - 10_000, sources(100, 0, 1));
        rates.record(now - 9_000, sources(200, 0, 1));
        assert_eq!(rate_of(&rates, Key::Node)["publish_details"]["rate"], 0.0);
        // A queue declared again under the same name (another ident) starts over from zero.
        rates.record(now, sources(300, 0, 2));
        let publishes = |rates: &Rates, key: Key| -> Vec<u64> {
            rates
                .samples(&[key])
                .iter()
                .map(|(_, p)| p[PUBLISH])
                .collect()
        };
        // (It read as zeros over its window before: those stay.)
        assert_eq!(publishes(&rates, Key::Queue(2)), [0, 0, 300]);
        let mut gone = sources(400, 0, 2);
        gone.queues.clear();
        gone.channels.clear();
        rates.record(now + 1, gone);
        assert!(!rates
            .store
            .lock()
            .unwrap()
            .series
            .contains_key(&Key::Queue(2)));
        assert!(rates.samples(&[Key::Channel(7)]).is_empty());
    }

    #[test]
    fn windows_are_bounded() {
        let rates = Rates::new(Duration::from_millis(1000));
        for i in 0..2000 {
            rates.record(i * 1000, sources(i, 0, 1));
        }
        let len = |rates: &Rates, key: Key| {
            let store = rates.store.lock().unwrap();
            store.series[&key].samples(&store.sweeps).count()
        };
        assert_eq!(len(&rates, Key::Node), 606);
        assert_eq!(len(&rates, Key::Channel(7)), 66);
        let tiny = Rates::new(Duration::from_millis(1));
        for i in 0..3000 {
            tiny.record(i, sources(i, 0, 1));
        }
        assert_eq!(len(&tiny, Key::Node), MAX_SAMPLES);
    }

    #[test]
    fn idle_objects_keep_one_run() {
        let rates = Rates::new(Duration::from_millis(1000));
        for i in 0..100 {
            rates.record(i * 1000, sources(5, 0, 1));
        }
        rates.record(100_000, sources(6, 0, 1));
        let store = rates.store.lock().unwrap();
        let channel = &store.series[&Key::Channel(7)];
        assert_eq!(channel.runs.len(), 2);
        let samples: Vec<(u64, u64)> = channel
            .samples(&store.sweeps)
            .map(|(ts, p)| (ts, p[PUBLISH]))
            .collect();
        assert_eq!(samples.len(), 66);
        assert_eq!(samples[0], (35_000, 5));
        assert_eq!(samples[64], (99_000, 5));
        assert_eq!(samples[65], (100_000, 6));
    }

    #[test]
    fn idle_queues_keep_no_samples_and_read_as_zeros() {
        let rates = Rates::new(Duration::from_millis(1000));
        let now = now_ms() / 1000 * 1000;
        for i in (1..=3).rev() {
            rates.record(now - i * 1000, sources(0, 0, 1));
        }
        assert!(!rates
            .store
            .lock()
            .unwrap()
            .series
            .contains_key(&Key::Queue(1)));
        let query: HashMap<String, String> = [("lengths_age", "2"), ("lengths_incr", "1")]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let ranges = Ranges::at(&query, now - 1000).unwrap();
        let mut v = json!({"messages": 0, "messages_ready": 0, "messages_unacknowledged": 0});
        rates.lengths(&mut v, &[Key::Queue(1)], &ranges);
        let samples = v["messages_ready_details"]["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 3, "{v}");
        assert!(samples.iter().all(|s| s["sample"] == 0), "{v}");
        // Its first counts start from zero at the previous sweep, and so do the messages
        // its publishes explain.
        rates.record(now, sources(50, 40, 1));
        assert_eq!(
            rate_of(&rates, Key::Queue(1))["publish_details"]["rate"],
            50.0
        );
        let mut q = json!({"messages": 40, "messages_ready": 40, "messages_unacknowledged": 0});
        rates.lengths(&mut q, &[Key::Queue(1)], &Ranges::default());
        assert_eq!(q["messages_ready_details"]["rate"], 40.0, "{q}");
        // The zeros it read as before stay its history, and a range's rate is from them.
        let ranges = Ranges::at(&query, now).unwrap();
        let mut v = json!({"messages": 40, "messages_ready": 40, "messages_unacknowledged": 0});
        rates.lengths(&mut v, &[Key::Queue(1)], &ranges);
        let samples: Vec<&Value> = v["messages_ready_details"]["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| &s["sample"])
            .collect();
        assert_eq!(samples, [40, 0, 0], "{v}");
        assert_eq!(v["messages_ready_details"]["rate"], 40.0, "{v}");
        // The sampler keeps reading a queue with samples when it drains to nothing (as
        // `Backend::sample_sources` does for the addresses it is given): its series goes on.
        rates.record(now + 1000, sources(50, 0, 1));
        let mut q = json!({"messages": 0, "messages_ready": 0, "messages_unacknowledged": 0});
        rates.lengths(&mut q, &[Key::Queue(1)], &Ranges::default());
        assert_eq!(q["messages_ready_details"]["rate"], -40.0, "{q}");
    }

    #[test]
    fn a_recovered_queue_that_drains_keeps_its_series() {
        let rates = Rates::new(Duration::from_millis(1000));
        let now = now_ms();
        rates.record(now - 2000, sources(0, 0, 1));
        // Messages recovered at start: no counter, 30 ready.
        rates.record(now - 1000, sources(0, 30, 1));
        let addrs: Vec<usize> = rates
            .store
            .lock()
            .unwrap()
            .series
            .values()
            .map(|s| s.addr)
            .collect();
        assert!(addrs.contains(&1), "{addrs:?}");
        // Purged: every count is zero again, and the queue still has its samples.
        rates.record(now, sources(0, 0, 1));
        let ready: Vec<u64> = rates
            .samples(&[Key::Queue(1)])
            .iter()
            .map(|(_, p)| p[READY])
            .collect();
        assert_eq!(ready, [30, 30, 0]);
    }

    #[test]
    fn idle_channels_keep_no_samples_until_they_count() {
        let rates = Rates::new(Duration::from_millis(1000));
        let now = now_ms();
        rates.record(now - 2000, sources(0, 0, 1));
        rates.record(now - 1000, sources(0, 0, 1));
        assert!(!rates
            .store
            .lock()
            .unwrap()
            .series
            .contains_key(&Key::Channel(7)));
        assert!(rates.store.lock().unwrap().series.contains_key(&Key::Node));
        rates.record(now, sources(300, 0, 1));
        assert_eq!(
            rate_of(&rates, Key::Channel(7))["publish_details"]["rate"],
            300.0
        );
    }

    #[test]
    fn ranges_give_samples_and_averages() {
        let rates = Rates::new(Duration::from_millis(5000));
        let last = now_ms() / 5000 * 5000;
        for i in 0..5u64 {
            rates.record(last - (4 - i) * 5000, sources(i * 50, 0, 1));
        }
        let q: HashMap<String, String> = [("msg_rates_age", "20"), ("msg_rates_incr", "5")]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let ranges = Ranges::at(&q, last + 10).unwrap();
        let mut v = json!({"publish": 200});
        rates.message_stats(&mut v, &[Key::Node], &ranges);
        let d = &v["publish_details"];
        let samples = d["samples"].as_array().unwrap();
        assert_eq!(samples.len(), 5, "{d}");
        assert_eq!(samples[0]["sample"], 200);
        assert_eq!(samples[4]["sample"], 0);
        assert_eq!(d["rate"], 10.0);
        assert_eq!(d["avg_rate"], 10.0);
        assert_eq!(d["avg"], 100.0);
        let bad: HashMap<String, String> = [("lengths_age", "600"), ("lengths_incr", "1")]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let e = Ranges::from_query(&bad).unwrap_err();
        assert_eq!(e.error, "invalid_range_parameters");
        assert_eq!(e.reason, "Invalid range parameters: age 600, incr 1");
    }
}
