//! Output: tables for people (comfy-table), the server's JSON for scripts (`--json`).

use comfy_table::Table;
use serde_json::Value;

/// The tables' look, python rabbitmqadmin's: a border of `-` and `+`, `|` between columns,
/// and under the header one run of `-` per column, broken by `+` where the columns are:
///
/// ```text
/// +------+----------+
/// | name | messages |
/// +------+----------+
/// | q1   | 2        |
/// +------+----------+
/// ```
///
/// (comfy-table's `ASCII_FULL_CONDENSED` with the header line's characters changed: that
/// preset draws it as one unbroken run of `=`.)
const STYLE: &str = "||--+-++|    ++++++";

/// The value at a dotted path (`queue.name`, `message_stats.publish`), if any.
pub fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// A cell: strings as they are, a non-empty array of strings comma-separated (user tags),
/// numbers and booleans as JSON writes them, other objects and arrays as compact JSON (`{}`
/// and `[]` included), missing or null as empty.
pub fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        Some(other) => other.to_string(),
    }
}

/// A table of `rows` (JSON objects) with one column per dotted path in `columns`.
pub fn table(rows: &[Value], columns: &[&str]) -> String {
    let mut t = Table::new();
    t.load_preset(STYLE);
    t.set_header(columns.iter().copied());
    for row in rows {
        t.add_row(columns.iter().map(|c| cell(lookup(row, c))));
    }
    t.to_string()
}

/// A two-column table (`key`, `value`) of an object's scalar leaves, nested keys dotted
/// (`object_totals.queues`); arrays and rate objects (`*_details`) are left out.
pub fn key_value(v: &Value) -> String {
    let mut rows = Vec::new();
    flatten("", v, &mut rows);
    let mut t = Table::new();
    t.load_preset(STYLE);
    t.set_header(["key", "value"]);
    for (k, v) in rows {
        t.add_row([k, v]);
    }
    t.to_string()
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                if k.ends_with("_details") {
                    continue;
                }
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, child, out);
            }
        }
        Value::Array(_) => {}
        other => out.push((prefix.to_string(), cell(Some(other)))),
    }
}

/// The rows of a list reply: the array itself, or a paged reply's `items`.
pub fn rows(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a.clone(),
        Value::Object(m) => match m.get("items") {
            Some(Value::Array(a)) => a.clone(),
            _ => vec![v.clone()],
        },
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn cells_and_lookup() {
        let v = json!({"queue": {"name": "q"}, "n": 3, "b": true, "a": {}, "s": "x"});
        assert_eq!(cell(lookup(&v, "queue.name")), "q");
        assert_eq!(cell(lookup(&v, "n")), "3");
        assert_eq!(cell(lookup(&v, "b")), "true");
        assert_eq!(cell(lookup(&v, "a")), "{}");
        assert_eq!(cell(lookup(&v, "missing.key")), "");
        assert_eq!(
            cell(Some(&json!(["administrator", "monitoring"]))),
            "administrator,monitoring"
        );
        assert_eq!(cell(Some(&json!([]))), "[]");
    }

    #[test]
    fn table_has_header_and_rows() {
        let t = table(
            &[json!({"name": "q1", "messages": 2}), json!({"name": "q2"})],
            &["name", "messages"],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines
            .iter()
            .any(|l| l.contains("name") && l.contains("messages")));
        assert!(lines.iter().any(|l| l.contains("q1") && l.contains('2')));
        assert!(lines.iter().any(|l| l.contains("q2")));
    }

    #[test]
    fn header_underline_breaks_where_the_columns_do() {
        let t = table(
            &[json!({"name": "q1", "messages": 2})],
            &["name", "messages"],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines,
            [
                "+------+----------+",
                "| name | messages |",
                "+------+----------+",
                "| q1   | 2        |",
                "+------+----------+",
            ],
            "{t}"
        );
        // The underline's breaks are where the header's column separators are.
        let header = lines[1];
        let under = lines[2];
        assert_eq!(header.len(), under.len());
        for (h, u) in header.chars().zip(under.chars()) {
            assert_eq!(h == '|', u == '+', "{header}\n{under}");
        }
        let kv = key_value(&json!({"a": 1}));
        assert_eq!(kv.lines().nth(2), Some("+-----+-------+"), "{kv}");
    }

    #[test]
    fn key_value_flattens_and_skips_rates() {
        let t = key_value(&json!({
            "node": "n",
            "object_totals": {"queues": 4},
            "message_stats": {"publish": 1, "publish_details": {"rate": 0.0}},
            "listeners": [{"port": 5672}]
        }));
        assert!(t.contains("object_totals.queues"));
        assert!(t.contains("message_stats.publish"));
        assert!(!t.contains("publish_details"));
        assert!(!t.contains("listeners"));
    }

    #[test]
    fn paged_replies_give_their_items() {
        assert_eq!(rows(&json!({"items": [1, 2], "page": 1})).len(), 2);
        assert_eq!(rows(&json!([1])).len(), 1);
        assert!(rows(&Value::Null).is_empty());
    }
}
