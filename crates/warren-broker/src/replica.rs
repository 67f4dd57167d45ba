//! Replicated metadata: the hook through which a clustered broker hands its metadata changes
//! to the cluster's metadata group, and the entry points through which the group applies
//! the changes other nodes made.
//!
//! Two kinds of change are replicated, as plain data that every node applies the same way:
//! - the durable topology changes of a vhost ([`TopologyCommand`]s: exchanges, bindings,
//!   policies, queues' declares and deletes), the very records the
//!   vhost writes to its definitions log ([`crate::vhost::log`]), already decided (cascades
//!   listed);
//! - the changes of the access-control database (users, vhosts, permissions, limits, global
//!   parameters): the entries of `access.json` a change added, replaced or removed (see
//!   [`access_delta`] and [`crate::ops::admin`]), so that changes made at the same moment on
//!   two nodes to different entries are all kept.
//!
//! Queues are not copied: a quorum queue's members are declared on their nodes by the queue's
//! own group, and a classic queue lives on the node that declared it; the other nodes (for a
//! quorum queue, those without a member) put a stand-in under its name that reaches it
//! ([`crate::VHost::put_remote_queue`]).
//!
//! A broker without a replicator (alone, not in a cluster) behaves as before.

use crate::vhost::log::TopologyCommand;
use std::sync::{Arc, OnceLock};

/// Called once a replicated change is committed in the cluster (`Ok`), or with the reason it
/// could not be (no majority within the wait).
pub type Done = Box<dyn FnOnce(Result<(), String>) + Send>;

/// Where a broker sends its metadata changes to be replicated (the cluster's metadata group).
/// Calls return at once; `done` learns the outcome.
pub trait MetadataReplicator: Send + Sync {
    /// `commands`, a durable topology change just made in `vhost` on this node (the records
    /// of [`crate::vhost::log`], in the order they were made).
    fn topology(&self, vhost: &str, commands: Vec<TopologyCommand>, done: Done);
    /// The access-control database just changed on this node: `delta` is what changed
    /// (see [`access_delta`]).
    fn access(&self, delta: String, done: Done);
}

/// The broker's replicator, set once when the node joins its cluster, and shared with every
/// vhost.
pub type ReplicatorSlot = Arc<OnceLock<Arc<dyn MetadataReplicator>>>;

/// Whether a replicated topology command is applied by [`crate::VHost::apply_replicated`]:
/// queues are not (the metadata group puts and removes the queues that live on other nodes,
/// see [`crate::VHost::put_remote_queue`]), and a binding to a queue only where that queue
/// exists.
pub(crate) fn replicated_kind(c: &TopologyCommand) -> bool {
    !matches!(
        c,
        TopologyCommand::PutQueue { .. } | TopologyCommand::RemoveQueue { .. }
    )
}

thread_local! {
    static UNREPLICATED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the definitions changes it makes on this thread kept on this node: what a
/// node does at the cluster's request (declaring or deleting its member of a quorum queue,
/// which the declare or delete that caused it replicates already).
pub fn unreplicated<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            UNREPLICATED.with(|u| u.set(self.0));
        }
    }
    let _reset = Reset(UNREPLICATED.with(|u| u.replace(true)));
    f()
}

/// Whether this thread is inside [`unreplicated`].
pub(crate) fn is_unreplicated() -> bool {
    UNREPLICATED.with(|u| u.get())
}

/// The lists of the stored access-control database (`access.json`) and the fields that
/// identify an entry of each.
const ACCESS_LISTS: [(&str, &[&str]); 6] = [
    ("users", &["name"]),
    ("vhosts", &["name"]),
    ("permissions", &["user", "vhost"]),
    ("topic_permissions", &["user", "vhost", "exchange"]),
    ("parameters", &["vhost", "component", "name"]),
    ("global_parameters", &["name"]),
];

fn entry_key(entry: &serde_json::Value, fields: &[&str]) -> serde_json::Value {
    serde_json::Value::Array(
        fields
            .iter()
            .map(|f| entry.get(*f).cloned().unwrap_or(serde_json::Value::Null))
            .collect(),
    )
}

fn entries<'a>(
    doc: &'a serde_json::Value,
    list: &str,
    fields: &[&str],
) -> Vec<(serde_json::Value, &'a serde_json::Value)> {
    doc.get(list)
        .and_then(|v| v.as_array())
        .map(|a| a.iter().map(|e| (entry_key(e, fields), e)).collect())
        .unwrap_or_default()
}

/// What changed from access-control database `before` to `after` (both as stored in
/// `access.json`): per list, the entries added or changed (`upsert`) and the keys of those
/// removed (`remove`), as JSON; `None` when nothing changed. Applied on another node with
/// [`apply_access_delta`], so that changes made at the same moment on two nodes to
/// different users, vhosts or permissions are all kept.
///
/// Errors: either document is not JSON.
pub fn access_delta(before: &str, after: &str) -> Result<Option<String>, String> {
    let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).map_err(|e| e.to_string());
    let (before, after) = (parse(before)?, parse(after)?);
    let mut upsert = serde_json::Map::new();
    let mut remove = serde_json::Map::new();
    for (list, fields) in ACCESS_LISTS {
        let old = entries(&before, list, fields);
        let new = entries(&after, list, fields);
        let changed: Vec<serde_json::Value> = new
            .iter()
            .filter(|(k, e)| !old.iter().any(|(ok, oe)| ok == k && oe == e))
            .map(|(_, e)| (*e).clone())
            .collect();
        let gone: Vec<serde_json::Value> = old
            .iter()
            .filter(|(k, _)| !new.iter().any(|(nk, _)| nk == k))
            .map(|(k, _)| k.clone())
            .collect();
        if !changed.is_empty() {
            upsert.insert(list.to_string(), serde_json::Value::Array(changed));
        }
        if !gone.is_empty() {
            remove.insert(list.to_string(), serde_json::Value::Array(gone));
        }
    }
    if upsert.is_empty() && remove.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        serde_json::json!({ "upsert": upsert, "remove": remove }).to_string(),
    ))
}

/// `current` (an access-control database as stored in `access.json`) with `delta` (from
/// [`access_delta`]) applied: entries removed by key, entries added or replaced.
///
/// Errors: either document is not JSON.
pub fn apply_access_delta(current: &str, delta: &str) -> Result<String, String> {
    let mut doc: serde_json::Value = serde_json::from_str(current).map_err(|e| e.to_string())?;
    let delta: serde_json::Value = serde_json::from_str(delta).map_err(|e| e.to_string())?;
    let Some(obj) = doc.as_object_mut() else {
        return Err("the access-control database is not a JSON object".into());
    };
    for (list, fields) in ACCESS_LISTS {
        let removed: Vec<serde_json::Value> = delta
            .pointer(&format!("/remove/{list}"))
            .and_then(|v| v.as_array())
            .cloned()
            .unwrap_or_default();
        let upserted: Vec<serde_json::Value> = delta
            .pointer(&format!("/upsert/{list}"))
            .and_then(|v| v.as_array())
            .cloned()
            .unwrap_or_default();
        if removed.is_empty() && upserted.is_empty() {
            continue;
        }
        let slot = obj
            .entry(list.to_string())
            .or_insert_with(|| serde_json::Value::Array(Vec::new()));
        if !slot.is_array() {
            *slot = serde_json::Value::Array(Vec::new());
        }
        let arr = slot.as_array_mut().expect("an array");
        arr.retain(|e| {
            let k = entry_key(e, fields);
            !removed.contains(&k) && !upserted.iter().any(|u| entry_key(u, fields) == k)
        });
        arr.extend(upserted);
    }
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_deltas_made_apart_merge() {
        let base = r#"{"users":[{"name":"guest","tags":[]}],"vhosts":[{"name":"/"}],
            "permissions":[{"user":"guest","vhost":"/","configure":".*"}]}"#;
        let a = r#"{"users":[{"name":"guest","tags":[]},{"name":"alice","tags":[]}],
            "vhosts":[{"name":"/"}],"permissions":[{"user":"guest","vhost":"/","configure":".*"}]}"#;
        let b = r#"{"users":[{"name":"guest","tags":["administrator"]}],"vhosts":[{"name":"/"},
            {"name":"shop"}],"permissions":[]}"#;
        let da = access_delta(base, a).unwrap().expect("a changed");
        let db = access_delta(base, b).unwrap().expect("b changed");
        assert_eq!(access_delta(a, a).unwrap(), None);
        // Applied in either order, both changes are kept.
        for (first, second) in [(&da, &db), (&db, &da)] {
            let merged =
                apply_access_delta(&apply_access_delta(base, first).unwrap(), second).unwrap();
            let v: serde_json::Value = serde_json::from_str(&merged).unwrap();
            let users: Vec<&str> = v["users"]
                .as_array()
                .unwrap()
                .iter()
                .map(|u| u["name"].as_str().unwrap())
                .collect();
            assert!(
                users.contains(&"alice") && users.contains(&"guest"),
                "{merged}"
            );
            let guest = v["users"]
                .as_array()
                .unwrap()
                .iter()
                .find(|u| u["name"] == "guest")
                .unwrap();
            assert_eq!(guest["tags"][0], "administrator");
            assert_eq!(v["vhosts"].as_array().unwrap().len(), 2, "{merged}");
            assert!(v["permissions"].as_array().unwrap().is_empty(), "{merged}");
        }
    }
}
