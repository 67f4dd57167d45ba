//! The query parameters of list endpoints, as rabbit_mgmt_util applies them: `sort` (a
//! dotted key), `sort_reverse`, `columns` (dotted keys to keep), and with `page` (and
//! `page_size`, 1..=500, default 100) a page object instead of a list, filtered by `name`
//! (a substring, or a regex with `use_regex=true`). Errors carry RabbitMQ's bodies
//! (`invalid_pagination_parameters`, `page_out_of_range`, both 400).

use crate::error::ApiError;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Largest `page_size` RabbitMQ accepts.
pub const MAX_PAGE_SIZE: u64 = 500;

fn dotted<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    key.split('.').try_fold(v, |v, k| v.get(k))
}

fn compare(a: Option<&Value>, b: Option<&Value>) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a, b) {
        (Some(Value::Number(x)), Some(Value::Number(y))) => x
            .as_f64()
            .partial_cmp(&y.as_f64())
            .unwrap_or(Ordering::Equal),
        (Some(Value::String(x)), Some(Value::String(y))) => x.cmp(y),
        (Some(Value::Bool(x)), Some(Value::Bool(y))) => x.cmp(y),
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (x, y) => x.map(|v| v.to_string()).cmp(&y.map(|v| v.to_string())),
    }
}

fn keep_columns(item: &Value, columns: &[&str]) -> Value {
    let mut out = Value::Object(Map::new());
    for c in columns {
        let Some(v) = dotted(item, c) else { continue };
        let mut at = &mut out;
        let parts: Vec<&str> = c.split('.').collect();
        for (i, p) in parts.iter().enumerate() {
            let obj = at.as_object_mut().expect("built as objects");
            if i + 1 == parts.len() {
                obj.insert((*p).to_string(), v.clone());
                break;
            }
            at = obj
                .entry((*p).to_string())
                .or_insert_with(|| Value::Object(Map::new()));
        }
    }
    out
}

fn pagination_error(error: &'static str, reason: String) -> ApiError {
    ApiError {
        error,
        ..ApiError::bad_request(reason)
    }
}

/// Applies the list parameters in `q` to `items` (already in their default order).
pub fn apply(mut items: Vec<Value>, q: &HashMap<String, String>) -> Result<Value, ApiError> {
    let total = items.len() as u64;
    if let Some(sort) = q.get("sort").filter(|s| !s.is_empty()) {
        items.sort_by(|a, b| compare(dotted(a, sort), dotted(b, sort)));
    }
    if q.get("sort_reverse").is_some_and(|v| v == "true") {
        items.reverse();
    }
    let columns: Vec<&str> = q
        .get("columns")
        .map(|c| c.split(',').filter(|c| !c.is_empty()).collect())
        .unwrap_or_default();
    let keep = |items: Vec<Value>| -> Vec<Value> {
        if columns.is_empty() {
            items
        } else {
            items.iter().map(|i| keep_columns(i, &columns)).collect()
        }
    };
    let Some(page) = q.get("page") else {
        return Ok(Value::Array(keep(items)));
    };
    let invalid = || ApiError::bad_request("Pagination parameters are invalid");
    let page: u64 = page.parse().map_err(|_| invalid())?;
    let page_size: u64 = match q.get("page_size") {
        Some(p) => p.parse().map_err(|_| invalid())?,
        None => 100,
    };
    if page == 0 || page_size == 0 || page_size > MAX_PAGE_SIZE {
        return Err(pagination_error(
            "invalid_pagination_parameters",
            format!(
                "Invalid pagination parameters: page number {page}, page size {}",
                q.get("page_size").map_or("undefined", |s| s.as_str())
            ),
        ));
    }
    if let Some(name) = q.get("name").filter(|n| !n.is_empty()) {
        let name_of = |i: &Value| i.get("name").and_then(|n| n.as_str()).map(str::to_string);
        if q.get("use_regex").is_some_and(|v| v == "true") {
            let re = regex::Regex::new(name)
                .map_err(|e| ApiError::bad_request(format!("invalid regex '{name}': {e}")))?;
            items.retain(|i| name_of(i).is_some_and(|n| re.is_match(&n)));
        } else {
            items.retain(|i| name_of(i).is_some_and(|n| n.contains(name.as_str())));
        }
    }
    let filtered = items.len() as u64;
    let page_count = filtered.div_ceil(page_size);
    if page > page_count.max(1) {
        return Err(pagination_error(
            "page_out_of_range",
            format!("Page out of range, page: {page} page size: {page_size}, len: {filtered}"),
        ));
    }
    let start = ((page - 1) * page_size) as usize;
    let page_items: Vec<Value> = items
        .into_iter()
        .skip(start)
        .take(page_size as usize)
        .collect();
    let item_count = page_items.len();
    Ok(serde_json::json!({
        "filtered_count": filtered,
        "item_count": item_count,
        "items": keep(page_items),
        "page": page,
        "page_count": page_count,
        "page_size": page_size,
        "total_count": total,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn sort_columns_and_pages() {
        let items = vec![
            json!({"name": "b", "messages": 2, "x": {"y": 1}}),
            json!({"name": "a", "messages": 10, "x": {"y": 2}}),
            json!({"name": "c", "messages": 1, "x": {"y": 3}}),
        ];
        let r = apply(
            items.clone(),
            &q(&[("sort", "messages"), ("columns", "name,x.y")]),
        )
        .unwrap();
        assert_eq!(
            r,
            json!([{"name":"c","x":{"y":3}},{"name":"b","x":{"y":1}},{"name":"a","x":{"y":2}}])
        );
        let r = apply(
            items.clone(),
            &q(&[
                ("sort", "name"),
                ("sort_reverse", "true"),
                ("page", "2"),
                ("page_size", "2"),
            ]),
        )
        .unwrap();
        assert_eq!(
            r["items"],
            json!([{"name": "a", "messages": 10, "x": {"y": 2}}])
        );
        assert_eq!(r["page_count"], 2);
        assert_eq!(r["total_count"], 3);
        let e = apply(items.clone(), &q(&[("page", "3"), ("page_size", "2")])).unwrap_err();
        assert_eq!(e.error, "page_out_of_range");
        assert_eq!(e.reason, "Page out of range, page: 3 page size: 2, len: 3");
        let e = apply(items.clone(), &q(&[("page", "1"), ("page_size", "501")])).unwrap_err();
        assert_eq!(e.error, "invalid_pagination_parameters");
        assert_eq!(
            e.reason,
            "Invalid pagination parameters: page number 1, page size 501"
        );
        let e = apply(items.clone(), &q(&[("page", "x")])).unwrap_err();
        assert_eq!(e.reason, "Pagination parameters are invalid");
        // `name` filters pages only, as in RabbitMQ; `use_regex` makes it a regex.
        let r = apply(items.clone(), &q(&[("name", "a")])).unwrap();
        assert_eq!(r.as_array().unwrap().len(), 3);
        let r = apply(items.clone(), &q(&[("page", "1"), ("name", "a")])).unwrap();
        assert_eq!(r["filtered_count"], 1);
        let r = apply(
            items,
            &q(&[("page", "1"), ("name", "^[bc]$"), ("use_regex", "true")]),
        )
        .unwrap();
        assert_eq!(r["filtered_count"], 2);
    }
}
