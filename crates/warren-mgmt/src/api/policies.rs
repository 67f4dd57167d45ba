//! `/api/policies` and `/api/operator-policies` (RabbitMQ's `rabbit_mgmt_wm_policies`,
//! `rabbit_mgmt_wm_policy` and their operator-policy twins): list, show, put and delete the
//! policies of a vhost ([`warren_broker::policy`]). The lists are open to any management
//! user, showing the vhosts the user may use (all for administrators); showing, setting and
//! deleting one policy need the `policymaker` or `administrator` tag and access to the
//! vhost, one operator policy `administrator`; a change goes through the broker's
//! operations layer, which decides access again.

use super::{authorize, created_or_not, listed, member_vhosts, ok_json, Need, Peer, Reply, Q, S};
use crate::backend::{broker_error, UserInfo};
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use serde_json::Value;
use std::sync::Arc;
use warren_broker::policy::Policy;
use warren_broker::Ops;

/// The routes, to merge into the API's router.
pub(super) fn routes() -> Router<Arc<super::App>> {
    Router::new()
        .route("/api/policies", get(list_all_user))
        .route("/api/policies/{v}", get(list_vhost_user))
        .route(
            "/api/policies/{v}/{name}",
            get(show_user).put(put_user).delete(delete_user),
        )
        .route("/api/operator-policies", get(list_all_operator))
        .route("/api/operator-policies/{v}", get(list_vhost_operator))
        .route(
            "/api/operator-policies/{v}/{name}",
            get(show_operator).put(put_operator).delete(delete_operator),
        )
}

/// The tags a request needs: policymaker (or administrator) for policies, administrator for
/// operator policies (RabbitMQ answers 401 with these reasons).
fn check(
    app: &super::App,
    headers: &HeaderMap,
    peer: std::net::SocketAddr,
    operator: bool,
    vhost: Option<&str>,
) -> Result<UserInfo, ApiError> {
    if operator {
        return authorize(app, headers, peer, Need::Admin, vhost);
    }
    let user = authorize(app, headers, peer, Need::Management, vhost)?;
    if !super::has(&user.tags, &["administrator", "policymaker"]) {
        return Err(ApiError::not_authorised(
            "User not authorised to access object",
        ));
    }
    Ok(user)
}

fn policy_json(vhost: &str, p: &Policy) -> Value {
    let mut v = p.to_json();
    if let Value::Object(m) = &mut v {
        m.insert("vhost".into(), Value::from(vhost));
    }
    v
}

fn vhost_policies(app: &super::App, vhost: &str, operator: bool) -> Vec<Value> {
    app.backend
        .node()
        .broker()
        .vhost(vhost)
        .map(|v| {
            v.policies(operator)
                .iter()
                .map(|p| policy_json(vhost, p))
                .collect()
        })
        .unwrap_or_default()
}

fn list(app: &super::App, user: &UserInfo, vhost: Option<&str>, operator: bool, q: &Q) -> Reply {
    let vhosts = match vhost {
        Some(v) => {
            super::require_vhost(app, v)?;
            vec![v.to_string()]
        }
        None => member_vhosts(app, user),
    };
    let mut items = Vec::new();
    for v in vhosts {
        items.extend(vhost_policies(app, &v, operator));
    }
    // RabbitMQ lists policies by priority (a stable sort: by vhost and name within one).
    items.sort_by_key(|p| p.get("priority").and_then(Value::as_i64).unwrap_or(0));
    listed(items, &q.0)
}

fn show(app: &super::App, vhost: &str, name: &str, operator: bool) -> Reply {
    super::require_vhost(app, vhost)?;
    let found = vhost_policies(app, vhost, operator)
        .into_iter()
        .find(|p| p.get("name").and_then(Value::as_str) == Some(name));
    match found {
        Some(p) => ok_json(p),
        None => Err(ApiError::not_found()),
    }
}

pub(super) fn put(
    app: &super::App,
    user: &UserInfo,
    vhost: &str,
    name: &str,
    operator: bool,
    body: &Bytes,
) -> Reply {
    super::require_vhost(app, vhost)?;
    let body: Value =
        serde_json::from_slice(body).map_err(|_| ApiError::bad_request("not_json"))?;
    if !body.is_object() {
        return Err(ApiError::bad_request("not_json"));
    }
    let policy = Policy::from_json(name, &body, operator).map_err(ApiError::bad_request)?;
    let broker = app.backend.node().broker();
    let v = broker.vhost(vhost).ok_or_else(ApiError::not_found)?;
    let existed = v.policies(operator).iter().any(|p| p.name == name);
    let actor = app.backend.actor(user, vhost);
    Ops::new(broker, &v, &actor)
        .set_policy(operator, policy)
        .map_err(broker_error)?;
    Ok(created_or_not(!existed))
}

pub(super) fn delete(
    app: &super::App,
    user: &UserInfo,
    vhost: &str,
    name: &str,
    operator: bool,
) -> Reply {
    super::require_vhost(app, vhost)?;
    let broker = app.backend.node().broker();
    let v = broker.vhost(vhost).ok_or_else(ApiError::not_found)?;
    let actor = app.backend.actor(user, vhost);
    let removed = Ops::new(broker, &v, &actor)
        .clear_policy(operator, name)
        .map_err(broker_error)?;
    if !removed {
        return Err(ApiError::not_found());
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

macro_rules! handlers {
    ($operator:expr, $all:ident, $vhost:ident, $show:ident, $put:ident, $delete:ident) => {
        // Lists are open to any management user (rabbit_mgmt_wm_policies'
        // `is_authorized_vhost`), showing the vhosts the user may use.
        async fn $all(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
            let user = authorize(&app, &headers, peer, Need::Management, None)?;
            list(&app, &user, None, $operator, &q)
        }

        async fn $vhost(
            State(app): S,
            ConnectInfo(peer): Peer,
            headers: HeaderMap,
            Path(v): Path<String>,
            q: Q,
        ) -> Reply {
            let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
            list(&app, &user, Some(&v), $operator, &q)
        }

        async fn $show(
            State(app): S,
            ConnectInfo(peer): Peer,
            headers: HeaderMap,
            Path((v, name)): Path<(String, String)>,
        ) -> Reply {
            check(&app, &headers, peer, $operator, Some(&v))?;
            show(&app, &v, &name, $operator)
        }

        async fn $put(
            State(app): S,
            ConnectInfo(peer): Peer,
            headers: HeaderMap,
            Path((v, name)): Path<(String, String)>,
            body: Bytes,
        ) -> Reply {
            let user = check(&app, &headers, peer, $operator, Some(&v))?;
            put(&app, &user, &v, &name, $operator, &body)
        }

        async fn $delete(
            State(app): S,
            ConnectInfo(peer): Peer,
            headers: HeaderMap,
            Path((v, name)): Path<(String, String)>,
        ) -> Reply {
            let user = check(&app, &headers, peer, $operator, Some(&v))?;
            delete(&app, &user, &v, &name, $operator)
        }
    };
}

handlers!(
    false,
    list_all_user,
    list_vhost_user,
    show_user,
    put_user,
    delete_user
);
handlers!(
    true,
    list_all_operator,
    list_vhost_operator,
    show_operator,
    put_operator,
    delete_operator
);
