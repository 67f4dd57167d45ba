//! `GET /metrics` and `GET /metrics/per-object` in the Prometheus text format, with
//! rabbitmq_prometheus's metric names, types and labels where Warren has the equivalent
//! (rabbitmq.com/docs/prometheus): aggregated over all queues on `/metrics` as its default
//! endpoint does, one series per queue (labels `vhost`, `queue`) on `/metrics/per-object`.
//! Built with the `prometheus` crate's registry and text encoder on each scrape, from the
//! same snapshots the JSON API reads.
//!
//! Warren's own families, besides rabbitmq_prometheus's: the message store's (`warren_store_*`,
//! only for a broker with a data directory: bytes and segment files held, bytes and records
//! written, fsyncs, compactions, and two histograms, fsync latency and records per group
//! commit, built from the store's bucket counters by [`SnapshotHistogram`]) and the ready
//! messages paged out to spill files (`warren_queue_messages_paged_out`, the same value as
//! rabbitmq_prometheus's `rabbitmq_queue_messages_paged_out`).

use crate::api::{App, RABBITMQ_VERSION};
use crate::backend::{HistogramSnapshot, QueueInfo, StoreStats};
use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::{
    Encoder, Gauge, GaugeVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder,
};
use std::collections::HashMap;

fn gauge(r: &Registry, name: &str, help: &str, value: f64) -> Result<(), String> {
    let g = Gauge::with_opts(Opts::new(name, help)).map_err(|e| e.to_string())?;
    g.set(value);
    r.register(Box::new(g)).map_err(|e| e.to_string())
}

fn counter(r: &Registry, name: &str, help: &str, value: u64) -> Result<(), String> {
    let c = IntCounter::with_opts(Opts::new(name, help)).map_err(|e| e.to_string())?;
    c.inc_by(value);
    r.register(Box::new(c)).map_err(|e| e.to_string())
}

/// A Prometheus histogram read from counters kept elsewhere (the store's atomic buckets):
/// a [`Collector`] yielding one histogram [`MetricFamily`] with those cumulative buckets,
/// sum and count, which the text encoder renders as `_bucket{le=...}`, `_sum` and `_count`.
pub struct SnapshotHistogram {
    desc: Desc,
    family: MetricFamily,
}

impl SnapshotHistogram {
    /// The histogram `name` with `help` holding `h`. Errors: an invalid metric name.
    pub fn new(name: &str, help: &str, h: &HistogramSnapshot) -> Result<Self, String> {
        let desc = Desc::new(name.into(), help.into(), Vec::new(), HashMap::new())
            .map_err(|e| e.to_string())?;
        let buckets = h
            .buckets
            .iter()
            .map(|&(le, n)| {
                let mut b = proto::Bucket::default();
                b.set_upper_bound(le);
                b.set_cumulative_count(n);
                b
            })
            .collect();
        let mut hist = proto::Histogram::default();
        hist.set_bucket(buckets);
        hist.set_sample_count(h.count);
        hist.set_sample_sum(h.sum);
        let mut m = proto::Metric::default();
        m.set_histogram(hist);
        let mut family = MetricFamily::default();
        family.set_name(name.into());
        family.set_help(help.into());
        family.set_field_type(MetricType::HISTOGRAM);
        family.set_metric(vec![m]);
        Ok(SnapshotHistogram { desc, family })
    }
}

impl Collector for SnapshotHistogram {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        vec![self.family.clone()]
    }
}

/// The message store's families (see the module docs).
fn store_metrics(r: &Registry, s: &StoreStats) -> Result<(), String> {
    gauge(
        r,
        "warren_store_bytes",
        "Bytes in the message store's segment files, as on disk (with the zeros written ahead of the open segment's records)",
        s.bytes as f64,
    )?;
    gauge(
        r,
        "warren_store_segments",
        "Segment files in the message store",
        s.segments as f64,
    )?;
    counter(
        r,
        "warren_store_written_bytes_total",
        "Bytes written to the message store's segment files and fsynced, compaction's copies included",
        s.written_bytes,
    )?;
    counter(
        r,
        "warren_store_records_written_total",
        "Records (messages, acknowledgements, delivery marks, compaction's copies) written to the message store and fsynced",
        s.records_written,
    )?;
    counter(
        r,
        "warren_store_fsyncs_total",
        "fdatasync calls on the message store's segment files",
        s.fsyncs,
    )?;
    counter(
        r,
        "warren_store_compactions_total",
        "Message store segments compacted: live records copied to the head of the log, then the file deleted",
        s.compactions,
    )?;
    let h = SnapshotHistogram::new(
        "warren_store_fsync_seconds",
        "Latency of the message store's fsyncs, seconds",
        &s.fsync_seconds,
    )?;
    r.register(Box::new(h)).map_err(|e| e.to_string())?;
    let h = SnapshotHistogram::new(
        "warren_store_group_commit_batch_records",
        "Records written and covered by one group commit (one observation per batch), records",
        &s.batch_records,
    )?;
    r.register(Box::new(h)).map_err(|e| e.to_string())
}

fn info(r: &Registry, name: &str, help: &str, labels: &[(&str, &str)]) -> Result<(), String> {
    let mut opts = Opts::new(name, help);
    for (k, v) in labels {
        opts = opts.const_label(*k, *v);
    }
    let g = Gauge::with_opts(opts).map_err(|e| e.to_string())?;
    g.set(1.0);
    r.register(Box::new(g)).map_err(|e| e.to_string())
}

/// Renders the metrics; `per_object` gives one series per queue.
pub fn render(app: &App, per_object: bool) -> Result<String, String> {
    let r = Registry::new();
    let b = &app.backend;
    let n = b.node();
    let queues = b.queues(None);
    info(
        &r,
        "rabbitmq_build_info",
        "RabbitMQ & Erlang/OTP version info",
        &[
            ("rabbitmq_version", RABBITMQ_VERSION),
            ("product_name", "Warren"),
            ("product_version", env!("CARGO_PKG_VERSION")),
            ("prometheus_plugin_version", env!("CARGO_PKG_VERSION")),
            ("prometheus_client_version", "rust-prometheus-0.14"),
            ("erlang_version", "none"),
        ],
    )?;
    info(
        &r,
        "rabbitmq_identity_info",
        "RabbitMQ node & cluster identity info",
        &[
            ("rabbitmq_node", &app.node),
            ("rabbitmq_cluster", &crate::api::cluster_name(app)),
            ("rabbitmq_cluster_permanent_id", "warren"),
        ],
    )?;
    gauge(
        &r,
        "rabbitmq_connections",
        "Connections currently open",
        b.connections().len() as f64,
    )?;
    gauge(
        &r,
        "rabbitmq_channels",
        "Channels currently open",
        b.channel_count() as f64,
    )?;
    // rabbitmq_prometheus's churn counters (its connection_churn_metrics group).
    let c = b.churn();
    for (name, help, value) in [
        (
            "rabbitmq_connections_opened_total",
            "Total number of connections opened",
            c.connection_created,
        ),
        (
            "rabbitmq_connections_closed_total",
            "Total number of connections closed or terminated",
            c.connection_closed,
        ),
        (
            "rabbitmq_channels_opened_total",
            "Total number of channels opened",
            c.channel_created,
        ),
        (
            "rabbitmq_channels_closed_total",
            "Total number of channels closed",
            c.channel_closed,
        ),
        (
            "rabbitmq_queues_declared_total",
            "Total number of queues declared",
            c.queue_declared,
        ),
        (
            "rabbitmq_queues_created_total",
            "Total number of queues created",
            c.queue_created,
        ),
        (
            "rabbitmq_queues_deleted_total",
            "Total number of queues deleted",
            c.queue_deleted,
        ),
    ] {
        counter(&r, name, help, value)?;
    }
    // rabbitmq_prometheus's global counters (protocol label as it sets it for AMQP 0-9-1).
    let g = b.global_stats();
    let globals: [(&str, &str, u64); 13] = [
        (
            "rabbitmq_global_messages_get_empty_total",
            "Total number of times basic.get operations fetched no message",
            g.get_empty,
        ),
        (
            "rabbitmq_global_messages_routed_total",
            "Total number of messages routed to queues or streams",
            g.publish
                .saturating_sub(g.drop_unroutable)
                .saturating_sub(g.return_unroutable),
        ),
        (
            "rabbitmq_global_messages_unroutable_dropped_total",
            "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
            g.drop_unroutable,
        ),
        (
            "rabbitmq_global_messages_delivered_consume_manual_ack_total",
            "Total number of messages delivered to consumers using manual acknowledgement mode",
            g.deliver,
        ),
        (
            "rabbitmq_global_messages_delivered_consume_auto_ack_total",
            "Total number of messages delivered to consumers using automatic acknowledgement mode",
            g.deliver_no_ack,
        ),
        (
            "rabbitmq_global_messages_delivered_get_auto_ack_total",
            "Total number of messages delivered to consumers using basic.get with automatic acknowledgment mode",
            g.get_no_ack,
        ),
        (
            "rabbitmq_global_messages_received_total",
            "Total number of messages received from publishers",
            g.publish,
        ),
        (
            "rabbitmq_global_messages_confirmed_total",
            "Total number of messages confirmed to publishers",
            g.confirm,
        ),
        (
            "rabbitmq_global_messages_delivered_total",
            "Total number of messages delivered to consumers",
            g.deliver_get(),
        ),
        (
            "rabbitmq_global_messages_delivered_get_manual_ack_total",
            "Total number of messages delivered to consumers using basic.get with manual acknowledgment mode",
            g.get,
        ),
        (
            "rabbitmq_global_messages_redelivered_total",
            "Total number of messages redelivered to consumers",
            g.redeliver,
        ),
        (
            "rabbitmq_global_messages_acknowledged_total",
            "Total number of messages acknowledged by consumers",
            g.ack,
        ),
        (
            "rabbitmq_global_messages_unroutable_returned_total",
            "Total number of messages published as mandatory into an exchange and returned to the publisher as unroutable",
            g.return_unroutable,
        ),
    ];
    for (name, help, value) in globals {
        let c =
            IntCounterVec::new(Opts::new(name, help), &["protocol"]).map_err(|e| e.to_string())?;
        c.with_label_values(&["amqp091"]).inc_by(value);
        r.register(Box::new(c)).map_err(|e| e.to_string())?;
    }
    gauge(
        &r,
        "rabbitmq_queues",
        "Queues available",
        queues.len() as f64,
    )?;
    gauge(
        &r,
        "rabbitmq_consumers",
        "Consumers currently connected",
        queues.iter().map(|q| q.consumers).sum::<u64>() as f64,
    )?;
    gauge(
        &r,
        "rabbitmq_alarms_memory_used_watermark",
        "is 1 if VM memory watermark alarm is in effect",
        u8::from(n.memory_alarm()).into(),
    )?;
    gauge(
        &r,
        "rabbitmq_alarms_free_disk_space_watermark",
        "is 1 if free disk space watermark alarm is in effect",
        u8::from(n.disk_alarm()).into(),
    )?;
    if let Some(rss) = resident_memory() {
        gauge(
            &r,
            "rabbitmq_process_resident_memory_bytes",
            "Memory used in bytes",
            rss as f64,
        )?;
    }
    // The node's resources, as rabbitmq_prometheus names them (the same figures as
    // /api/nodes; a limit that is not known is left out).
    let res = crate::resources::NodeResources::read(n);
    let optional: [(&str, &str, Option<u64>); 3] = [
        (
            "rabbitmq_resident_memory_limit_bytes",
            "Memory high watermark in bytes",
            res.mem_limit,
        ),
        (
            "rabbitmq_disk_space_available_bytes",
            "Disk space available in bytes",
            res.disk_free,
        ),
        (
            "rabbitmq_disk_space_available_limit_bytes",
            "Free disk space low watermark in bytes",
            res.disk_free_limit,
        ),
    ];
    for (name, help, value) in optional {
        if let Some(v) = value {
            gauge(&r, name, help, v as f64)?;
        }
    }
    let counts: [(&str, &str, u64); 4] = [
        (
            "rabbitmq_process_open_fds",
            "Open file descriptors",
            res.fd_used,
        ),
        (
            "rabbitmq_process_max_fds",
            "Open file descriptors limit",
            res.fd_total,
        ),
        (
            "rabbitmq_process_open_tcp_sockets",
            "Open TCP sockets",
            res.sockets_used,
        ),
        (
            "rabbitmq_process_max_tcp_sockets",
            "Open TCP sockets limit",
            res.sockets_total,
        ),
    ];
    for (name, help, value) in counts {
        gauge(&r, name, help, value as f64)?;
    }
    type Series = (&'static str, &'static str, fn(&QueueInfo) -> u64);
    let series: [Series; 7] = [
        (
            "rabbitmq_queue_messages_ready",
            "Messages ready to be delivered to consumers",
            |q| q.ready,
        ),
        (
            "rabbitmq_queue_messages_unacked",
            "Messages delivered to consumers but not yet acknowledged",
            |q| q.unacked,
        ),
        (
            "rabbitmq_queue_messages",
            "Sum of ready and unacknowledged messages - total queue depth",
            |q| q.ready + q.unacked,
        ),
        ("rabbitmq_queue_consumers", "Consumers on a queue", |q| {
            q.consumers
        }),
        (
            "rabbitmq_queue_process_memory_bytes",
            "Memory in bytes used by the Erlang queue process",
            |q| q.memory,
        ),
        (
            "rabbitmq_queue_messages_paged_out",
            "Messages paged out to disk",
            |q| q.paged_out,
        ),
        (
            "warren_queue_messages_paged_out",
            "Ready messages paged out to the queues' spill files, their bodies on disk only, messages",
            |q| q.paged_out,
        ),
    ];
    for (name, help, f) in series {
        if per_object {
            let v = GaugeVec::new(Opts::new(name, help), &["vhost", "queue"])
                .map_err(|e| e.to_string())?;
            for q in &queues {
                v.with_label_values(&[q.vhost.as_str(), q.name.as_str()])
                    .set(f(q) as f64);
            }
            r.register(Box::new(v)).map_err(|e| e.to_string())?;
        } else {
            gauge(&r, name, help, queues.iter().map(f).sum::<u64>() as f64)?;
        }
    }
    // Warren's own: deliveries to consumers (RabbitMQ's deliver plus deliver_no_ack; no
    // rabbitmq_prometheus metric counts exactly these).
    let (name, help) = (
        "warren_queue_consumer_deliveries_total",
        "Messages delivered to consumers since the queue was created",
    );
    if per_object {
        let v = IntCounterVec::new(Opts::new(name, help), &["vhost", "queue"])
            .map_err(|e| e.to_string())?;
        for q in &queues {
            v.with_label_values(&[q.vhost.as_str(), q.name.as_str()])
                .inc_by(q.deliveries);
        }
        r.register(Box::new(v)).map_err(|e| e.to_string())?;
    } else {
        let c = IntCounter::with_opts(Opts::new(name, help)).map_err(|e| e.to_string())?;
        c.inc_by(queues.iter().map(|q| q.deliveries).sum());
        r.register(Box::new(c)).map_err(|e| e.to_string())?;
    }
    if let Some(s) = b.store_stats() {
        store_metrics(&r, &s)?;
    }
    let mut out = Vec::new();
    TextEncoder::new()
        .encode(&r.gather(), &mut out)
        .map_err(|e| e.to_string())?;
    String::from_utf8(out).map_err(|e| e.to_string())
}

fn resident_memory() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}
