//! Headers exchange matching (AMQP 0-9-1 section 3.1.3.4, RabbitMQ's headers exchange).
//!
//! A binding's arguments are the pattern. `x-match` selects the mode: `all` (the default) needs
//! every pattern entry to match, `any` needs one; RabbitMQ's `all-with-x` and `any-with-x` also
//! compare pattern keys that start with `x-`, which the plain modes ignore. A pattern value of
//! type void (`V`) matches on the key's presence alone. Values compare as RabbitMQ (Erlang `==`)
//! does: numbers by numeric value whatever their width, strings and byte arrays by bytes.

use warren_amqp::table::{FieldTable, FieldValue};

/// The four `x-match` modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchMode {
    /// Every non-`x-` pattern entry must match.
    All,
    /// At least one non-`x-` pattern entry must match.
    Any,
    /// Every pattern entry, `x-` keys included, must match.
    AllWithX,
    /// At least one pattern entry, `x-` keys included, must match.
    AnyWithX,
}

impl MatchMode {
    /// Reads `x-match` from binding arguments; `None` means an invalid value (RabbitMQ refuses
    /// the binding with 406 PRECONDITION_FAILED).
    pub fn from_args(args: &FieldTable) -> Option<MatchMode> {
        match args.get("x-match") {
            None => Some(MatchMode::All),
            Some(v) => match v.as_str()? {
                "all" => Some(MatchMode::All),
                "any" => Some(MatchMode::Any),
                "all-with-x" => Some(MatchMode::AllWithX),
                "any-with-x" => Some(MatchMode::AnyWithX),
                _ => None,
            },
        }
    }
}

/// True when message `headers` match binding arguments `pattern`.
pub fn matches(pattern: &FieldTable, mode: MatchMode, headers: Option<&FieldTable>) -> bool {
    let with_x = matches!(mode, MatchMode::AllWithX | MatchMode::AnyWithX);
    let any = matches!(mode, MatchMode::Any | MatchMode::AnyWithX);
    let empty = FieldTable::default();
    let headers = headers.unwrap_or(&empty);
    for (key, want) in pattern.iter() {
        if key == "x-match" || (!with_x && key.starts_with("x-")) {
            continue;
        }
        let ok = match headers.get(key) {
            None => false,
            Some(have) => matches!(want, FieldValue::Void) || values_equal(want, have),
        };
        if any && ok {
            return true;
        }
        if !any && !ok {
            return false;
        }
    }
    // `all` with nothing to compare matches everything; `any` with nothing matches nothing.
    !any
}

fn values_equal(a: &FieldValue, b: &FieldValue) -> bool {
    use FieldValue::*;
    match (a, b) {
        (LongString(x), LongString(y)) | (ByteArray(x), ByteArray(y)) => x == y,
        (LongString(x), ByteArray(y)) | (ByteArray(x), LongString(y)) => x == y,
        (F32(_) | F64(_), _) | (_, F32(_) | F64(_)) => match (as_f64(a), as_f64(b)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
        _ => match (a.as_i64(), b.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        },
    }
}

fn as_f64(v: &FieldValue) -> Option<f64> {
    match v {
        FieldValue::F32(f) => Some(f64::from(*f)),
        FieldValue::F64(f) => Some(*f),
        other => other.as_i64().map(|i| i as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn s(v: &str) -> FieldValue {
        FieldValue::LongString(Bytes::copy_from_slice(v.as_bytes()))
    }
    fn table(entries: &[(&str, FieldValue)]) -> FieldTable {
        let mut t = FieldTable::new();
        for (k, v) in entries {
            t.insert(*k, v.clone());
        }
        t
    }

    #[test]
    fn all_and_any() {
        let p = table(&[("format", s("pdf")), ("type", s("report"))]);
        let both = table(&[("format", s("pdf")), ("type", s("report")), ("x", s("y"))]);
        let one = table(&[("format", s("pdf")), ("type", s("log"))]);
        assert!(matches(&p, MatchMode::All, Some(&both)));
        assert!(!matches(&p, MatchMode::All, Some(&one)));
        assert!(matches(&p, MatchMode::Any, Some(&one)));
        assert!(!matches(&p, MatchMode::Any, None));
        assert!(!matches(&p, MatchMode::All, None));
    }

    #[test]
    fn x_keys_only_with_x_modes() {
        let p = table(&[("x-match", s("all")), ("x-id", s("1")), ("a", s("b"))]);
        let h = table(&[("a", s("b"))]);
        assert!(matches(&p, MatchMode::All, Some(&h)));
        assert!(!matches(&p, MatchMode::AllWithX, Some(&h)));
        let hx = table(&[("a", s("b")), ("x-id", s("1"))]);
        assert!(matches(&p, MatchMode::AllWithX, Some(&hx)));
        let only_x = table(&[("x-id", s("1"))]);
        let px = table(&[("x-id", s("1")), ("a", s("zzz"))]);
        assert!(!matches(&px, MatchMode::Any, Some(&only_x)));
        assert!(matches(&px, MatchMode::AnyWithX, Some(&only_x)));
    }

    #[test]
    fn void_is_presence_and_numbers_compare_by_value() {
        let p = table(&[("k", FieldValue::Void), ("n", FieldValue::I32(5))]);
        let h = table(&[("k", s("anything")), ("n", FieldValue::I64(5))]);
        assert!(matches(&p, MatchMode::All, Some(&h)));
        let h2 = table(&[("k", s("anything")), ("n", FieldValue::U8(6))]);
        assert!(!matches(&p, MatchMode::All, Some(&h2)));
    }

    #[test]
    fn empty_pattern() {
        let p = table(&[("x-match", s("all"))]);
        assert!(matches(&p, MatchMode::All, None));
        let p = table(&[("x-match", s("any"))]);
        assert!(!matches(&p, MatchMode::Any, None));
    }

    #[test]
    fn mode_parsing() {
        assert_eq!(
            MatchMode::from_args(&FieldTable::new()),
            Some(MatchMode::All)
        );
        assert_eq!(
            MatchMode::from_args(&table(&[("x-match", s("any-with-x"))])),
            Some(MatchMode::AnyWithX)
        );
        assert_eq!(
            MatchMode::from_args(&table(&[("x-match", s("some"))])),
            None
        );
    }
}
