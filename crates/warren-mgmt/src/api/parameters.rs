//! Runtime parameters: `/api/parameters[/{component}[/{vhost}[/{name}]]]` and
//! `/api/global-parameters[/{name}]`, as a RabbitMQ 4.x node without the shovel and
//! federation plugins answers them (rabbit_mgmt_wm_parameter(s),
//! rabbit_mgmt_wm_global_parameter(s), rabbit_runtime_parameters).
//!
//! Components such a node knows, and what they are in Warren:
//! - `vhost-limits`: a vhost's `max-connections` / `max-queues`, under the name `limits`
//!   (the vhost's limits themselves, durable with the access-control database). Other names
//!   are refused with 400 (RabbitMQ stores them but never reads them).
//! - `operator_policy`: the vhost's operator policies, value `{"pattern", "definition",
//!   "priority", "apply-to"}` (PUT and DELETE change them as `/api/operator-policies` does).
//! - `policy`: the vhost's policies, listed only when asked for by name (as RabbitMQ);
//!   PUT sets one; DELETE is refused with 400 "policies may not be cleared using this
//!   method" (RabbitMQ's refusal; use `/api/policies`).
//!
//! Any other component: PUT is 400 `Validation failed\n\ncomponent <c> not found\n`, a list
//! of it is empty, one parameter of it 404.
//!
//! Who may: vhost parameters need `administrator`, or `policymaker` with access to the vhost
//! (a list without a vhost shows the vhosts the user may see); operator policies
//! `administrator`; global parameters `policymaker` or `administrator`, else 401 "User not
//! authorised to access object". A PUT takes `{"value": <any JSON>}` (400
//! `[{key_missing,value}]` without it) and answers 201 when it created the parameter, 204
//! when it replaced one; DELETE 204, or 404 when there is none. Global parameters are any
//! JSON under any name, durable; `cluster_name` also names the cluster in `/api/overview`.

use super::{authorize, created_or_not, listed, member_vhosts, ok_json, Need, Peer, Reply, Q, S};
use crate::admin::blocking;
use crate::backend::UserInfo;
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use serde_json::Value;
use std::sync::Arc;
use warren_broker::access::VhostLimits;
use warren_broker::definitions::VHOST_LIMITS_COMPONENT;

const POLICY: &str = "policy";
const OPERATOR_POLICY: &str = "operator_policy";

/// The routes, to merge into the API's router.
pub(super) fn routes() -> Router<Arc<super::App>> {
    Router::new()
        .route("/api/parameters", get(list_all))
        .route("/api/parameters/{component}", get(list_component))
        .route("/api/parameters/{component}/{v}", get(list_vhost))
        .route(
            "/api/parameters/{component}/{v}/{name}",
            get(show).put(put).delete(delete),
        )
        .route("/api/global-parameters", get(global_list))
        .route(
            "/api/global-parameters/{name}",
            get(global_show).put(global_put).delete(global_delete),
        )
}

/// rabbit_mgmt_util's `is_authorized_policies`: administrator, or policymaker (with access
/// to `vhost` when there is one).
fn check(
    app: &super::App,
    headers: &HeaderMap,
    peer: std::net::SocketAddr,
    vhost: Option<&str>,
) -> Result<UserInfo, ApiError> {
    let user = authorize(app, headers, peer, Need::Management, vhost)?;
    if !super::has(&user.tags, &["administrator", "policymaker"]) {
        return Err(ApiError::not_authorised(
            "User not authorised to access object",
        ));
    }
    Ok(user)
}

/// The parameters of `component` (all but policies with `None`) in the vhosts `user` sees.
fn visible(app: &super::App, user: &UserInfo, component: Option<&str>) -> Vec<Value> {
    let vhosts = member_vhosts(app, user);
    app.backend
        .runtime_parameters(component)
        .into_iter()
        .filter(|p| {
            p["vhost"]
                .as_str()
                .is_some_and(|v| vhosts.iter().any(|x| x == v))
        })
        .collect()
}

async fn list_all(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    let user = check(&app, &headers, peer, None)?;
    listed(visible(&app, &user, None), &q)
}

async fn list_component(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(component): Path<String>,
    q: Q,
) -> Reply {
    let user = check(&app, &headers, peer, None)?;
    listed(visible(&app, &user, Some(&component)), &q)
}

async fn list_vhost(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((component, v)): Path<(String, String)>,
    q: Q,
) -> Reply {
    let user = check(&app, &headers, peer, Some(&v))?;
    super::require_vhost(&app, &v)?;
    let items = visible(&app, &user, Some(&component))
        .into_iter()
        .filter(|p| p["vhost"] == v.as_str())
        .collect();
    listed(items, &q)
}

fn find(app: &super::App, component: &str, v: &str, name: &str) -> Option<Value> {
    app.backend
        .runtime_parameters(Some(component))
        .into_iter()
        .find(|p| p["vhost"] == v && p["name"] == name)
}

async fn show(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((component, v, name)): Path<(String, String, String)>,
) -> Reply {
    check(&app, &headers, peer, Some(&v))?;
    super::require_vhost(&app, &v)?;
    find(&app, &component, &v, &name).map_or_else(|| Err(ApiError::not_found()), ok_json)
}

/// The `value` of a PUT body. Errors: 400 not JSON, or no `value`.
fn value_of(body: &Bytes) -> Result<Value, ApiError> {
    let mut b = super::body_json(body)?;
    b.remove("value")
        .ok_or_else(|| ApiError::bad_request("[{key_missing,value}]"))
}

/// rabbit_runtime_parameters' refusal of a value: `Validation failed\n\n<reason>\n`.
fn validation_failed(reason: &str) -> ApiError {
    ApiError::bad_request(format!("Validation failed\n\n{reason}\n"))
}

/// A JSON value as Erlang prints the term RabbitMQ decodes it to (`~tp`), for the
/// validation messages: strings are binaries, objects maps.
fn erlang_term(v: &Value) -> String {
    match v {
        Value::String(s) => format!("<<\"{s}\">>"),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(erlang_term).collect::<Vec<_>>().join(",")
        ),
        Value::Object(m) => format!(
            "#{{{}}}",
            m.iter()
                .map(|(k, v)| format!("<<\"{k}\">> => {}", erlang_term(v)))
                .collect::<Vec<_>>()
                .join(",")
        ),
        other => other.to_string(),
    }
}

/// Validates a `vhost-limits` value as rabbit_vhost_limit (optional integer
/// `max-connections` and `max-queues`; a negative one is no limit).
pub(super) fn vhost_limits(name: &str, value: &Value) -> Result<VhostLimits, ApiError> {
    let Value::Object(m) = value else {
        return Err(validation_failed(&format!(
            "{name} not a list {}",
            erlang_term(value)
        )));
    };
    let mut limits = VhostLimits::default();
    let mut unknown = Vec::new();
    for (k, v) in m {
        let slot = match k.as_str() {
            "max-connections" => &mut limits.max_connections,
            "max-queues" => &mut limits.max_queues,
            _ => {
                unknown.push(format!("{{<<\"{k}\">>,{}}}", erlang_term(v)));
                continue;
            }
        };
        let n = v.as_i64().ok_or_else(|| {
            validation_failed(&format!(
                "{k} should be a number, actually was {}",
                erlang_term(v)
            ))
        })?;
        *slot = u64::try_from(n).ok();
    }
    if !unknown.is_empty() {
        return Err(validation_failed(&format!(
            "Unrecognised terms [{}] in {name}",
            unknown.join(",")
        )));
    }
    Ok(limits)
}

async fn put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((component, v, name)): Path<(String, String, String)>,
    body: Bytes,
) -> Reply {
    let user = check(&app, &headers, peer, Some(&v))?;
    super::require_vhost(&app, &v)?;
    let value = value_of(&body)?;
    match component.as_str() {
        VHOST_LIMITS_COMPONENT => {
            if name != "limits" {
                return Err(validation_failed(&format!(
                    "Warren keeps vhost limits under the name limits only, not {name}"
                )));
            }
            let limits = vhost_limits(&name, &value)?;
            let created = blocking(move || app.backend.set_vhost_limits(&user, &v, limits)).await?;
            Ok(created_or_not(created))
        }
        POLICY | OPERATOR_POLICY => {
            let body = Bytes::from(value.to_string());
            let operator = component == OPERATOR_POLICY;
            if operator && !super::has(&user.tags, &["administrator"]) {
                return Err(ApiError::not_authorised(
                    "User not authorised to access object",
                ));
            }
            super::policies::put(&app, &user, &v, &name, operator, &body)
        }
        _ => Err(validation_failed(&format!(
            "component {component} not found"
        ))),
    }
}

async fn delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((component, v, name)): Path<(String, String, String)>,
) -> Reply {
    let user = check(&app, &headers, peer, Some(&v))?;
    super::require_vhost(&app, &v)?;
    if find(&app, &component, &v, &name).is_none() {
        return Err(ApiError::not_found());
    }
    match component.as_str() {
        VHOST_LIMITS_COMPONENT => {
            blocking(move || app.backend.clear_vhost_limits(&user, &v)).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        OPERATOR_POLICY => super::policies::delete(&app, &user, &v, &name, true),
        POLICY => Err(ApiError::bad_request(
            "policies may not be cleared using this method",
        )),
        _ => Err(ApiError::not_found()),
    }
}

/// rabbit_mgmt_util's `is_authorized_global_parameters`: policymaker (or administrator).
fn check_global(
    app: &super::App,
    headers: &HeaderMap,
    peer: std::net::SocketAddr,
) -> Result<UserInfo, ApiError> {
    check(app, headers, peer, None)
}

async fn global_list(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    check_global(&app, &headers, peer)?;
    listed(app.backend.global_parameters(), &q)
}

async fn global_show(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Reply {
    check_global(&app, &headers, peer)?;
    match app.backend.global_parameter(&name) {
        Some(value) => ok_json(serde_json::json!({"name": name, "value": value})),
        None => Err(ApiError::not_found()),
    }
}

async fn global_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Reply {
    let user = check_global(&app, &headers, peer)?;
    let value = value_of(&body)?;
    let created = blocking(move || app.backend.set_global_parameter(&user, &name, value)).await?;
    Ok(created_or_not(created))
}

async fn global_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Reply {
    let user = check_global(&app, &headers, peer)?;
    blocking(move || app.backend.clear_global_parameter(&user, &name)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
