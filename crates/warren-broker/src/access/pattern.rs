//! Permission patterns: regular expressions matched against resource names and routing keys.
//!
//! RabbitMQ's rules (rabbitmq.com/docs/access-control, `check_resource_access/4` in
//! `rabbit_auth_backend_internal.erl`, `rabbit_re.erl`):
//! - A pattern matches anywhere in the name: nothing is anchored, so `.*` matches every name and
//!   `app` matches `myapp.q`; `^$` matches only the empty name, i.e. grants nothing.
//! - The empty pattern `""` is a synonym for `^$`.
//! - A pattern longer than 1024 bytes, or one that does not compile, is refused when set. A
//!   pattern that fails at match time denies.
//!
//! RabbitMQ uses PCRE; Warren uses the `regex` crate, whose syntax is the same for everything
//! permission patterns use in practice (classes, alternation, anchors, quantifiers, escapes). Two
//! differences are bridged here or refused loudly, never silently changed:
//! - PCRE reads a `{` that does not open a counted repetition (`{n}`, `{n,}`, `{n,m}`) as a
//!   literal brace, which matters for topic patterns such as `^{client_id}\.` whose variable
//!   stays unexpanded on AMQP 0-9-1 connections. Such braces are escaped before compiling.
//! - Look-around, back-references and `\Q…\E` do not exist in `regex`: a pattern using them is
//!   refused with the compiler's message when it is set.
//!
//! One difference remains: `regex` matches by Unicode character where RabbitMQ's PCRE matches by
//! byte, so a counted `.` (`^.{3}$`) or `\w` can differ on names with non-ASCII characters.
//!
//! Matching is linear-time in `regex`, so RabbitMQ's PCRE match limit has no counterpart; the
//! compiled size is bounded instead ([`MAX_COMPILED_PATTERN_BYTES`]).

use std::borrow::Cow;
use std::fmt;

use regex::{Regex, RegexBuilder};

/// Longest pattern accepted, in bytes (`MAX_PATTERN_LENGTH` in `rabbit_re.erl`).
pub const MAX_PATTERN_LEN_BYTES: usize = 1024;

/// Bound on one compiled pattern's memory, in bytes.
pub const MAX_COMPILED_PATTERN_BYTES: usize = 1 << 20;

/// A pattern that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Longer than [`MAX_PATTERN_LEN_BYTES`].
    #[error("regular expression is {len} bytes long, more than {MAX_PATTERN_LEN_BYTES}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// Does not compile.
    #[error("regular expression '{pattern}' is invalid: {reason}")]
    Invalid {
        /// The pattern as given.
        pattern: String,
        /// The compiler's explanation.
        reason: String,
    },
}

/// A compiled permission pattern that remembers its source text (what definitions files and
/// `rabbitmqctl list_permissions` show).
#[derive(Clone)]
pub struct Pattern {
    source: String,
    regex: Regex,
}

impl Pattern {
    /// Compiles `source`; `""` means `^$`.
    pub fn new(source: &str) -> Result<Self, PatternError> {
        let regex = compile(source)?;
        Ok(Pattern {
            source: source.to_string(),
            regex,
        })
    }

    /// `.*`: every name.
    pub fn everything() -> Self {
        Pattern::new(".*").expect(".* compiles")
    }

    /// The pattern as given.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// True when the pattern matches somewhere in `name`.
    pub fn is_match(&self, name: &str) -> bool {
        self.regex.is_match(name)
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Pattern {}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({:?})", self.source)
    }
}

/// Compiles a RabbitMQ permission pattern with the rules of the module docs.
pub(crate) fn compile(source: &str) -> Result<Regex, PatternError> {
    if source.len() > MAX_PATTERN_LEN_BYTES {
        return Err(PatternError::TooLong { len: source.len() });
    }
    compile_expanded(source, source)
}

/// Compiles `expanded`, the text of `source` with its variables substituted. The length bound
/// applies to what was set (`source`, checked by [`compile`]), not to the expansion; errors name
/// `source`.
pub(crate) fn compile_expanded(source: &str, expanded: &str) -> Result<Regex, PatternError> {
    let effective = if expanded.is_empty() {
        Cow::Borrowed("^$")
    } else {
        escape_literal_braces(expanded)
    };
    RegexBuilder::new(&effective)
        .size_limit(MAX_COMPILED_PATTERN_BYTES)
        .build()
        .map_err(|e| PatternError::Invalid {
            pattern: source.to_string(),
            reason: e.to_string().lines().last().unwrap_or_default().to_string(),
        })
}

/// Escapes each `{` that PCRE would read as a literal: one not opening `{n}`, `{n,}` or `{n,m}`.
fn escape_literal_braces(pattern: &str) -> Cow<'_, str> {
    let bytes = pattern.as_bytes();
    let mut out = String::with_capacity(pattern.len() + 4);
    let mut changed = false;
    let mut escaped = false;
    for (i, c) in pattern.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '{' && !opens_counted_repetition(&bytes[i..]) {
            out.push_str("\\{");
            changed = true;
            continue;
        }
        out.push(c);
    }
    if changed {
        Cow::Owned(out)
    } else {
        Cow::Borrowed(pattern)
    }
}

/// True for `{n}`, `{n,}` and `{n,m}` at the start of `rest`.
fn opens_counted_repetition(rest: &[u8]) -> bool {
    let digits = |s: &[u8]| s.iter().take_while(|b| b.is_ascii_digit()).count();
    let mut i = 1;
    let n = digits(&rest[i..]);
    if n == 0 {
        return false;
    }
    i += n;
    if rest.get(i) == Some(&b',') {
        i += 1;
        i += digits(&rest[i..]);
    }
    rest.get(i) == Some(&b'}')
}

/// Replaces each `{name}` in `template` by the value of `name` in `vars`, regex-escaped so that
/// the value matches only itself (`expand_topic_permission/2` in
/// `rabbit_auth_backend_internal.erl`; RabbitMQ escapes values since 4.x, 3.x inserted them raw).
/// Unknown `{…}` are left as they are.
pub fn expand_variables(template: &str, vars: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let var = after.find('}').and_then(|close| {
            let name = &after[..close];
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (close, *v))
        });
        match var {
            Some((close, value)) => {
                out.push_str(&regex::escape(value));
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, name: &str) -> bool {
        Pattern::new(p).unwrap().is_match(name)
    }

    #[test]
    fn nothing_is_anchored() {
        assert!(m(".*", ""));
        assert!(m(".*", "anything"));
        assert!(m("app", "myapp.q"));
        assert!(!m("^app", "myapp.q"));
        assert!(m("^(amq\\.gen.*|amq\\.default)$", "amq.gen-abc"));
        assert!(m("^(amq\\.gen.*|amq\\.default)$", "amq.default"));
        assert!(!m("^(amq\\.gen.*|amq\\.default)$", "amq.topic"));
    }

    #[test]
    fn empty_pattern_is_caret_dollar() {
        for p in ["", "^$"] {
            assert!(m(p, ""));
            assert!(!m(p, "q"));
            assert!(!m(p, "amq.default"));
        }
        assert_eq!(Pattern::new("").unwrap().source(), "");
    }

    #[test]
    fn literal_braces_as_in_pcre() {
        assert_eq!(escape_literal_braces("a{2}"), "a{2}");
        assert_eq!(escape_literal_braces("a{2,}b{1,3}"), "a{2,}b{1,3}");
        assert_eq!(
            escape_literal_braces("^{client_id}\\."),
            "^\\{client_id}\\."
        );
        assert_eq!(escape_literal_braces("\\{x}"), "\\{x}");
        assert_eq!(escape_literal_braces("\\\\{x}"), "\\\\\\{x}");
        assert_eq!(escape_literal_braces("é{x}ü"), "é\\{x}ü");
        assert!(m("^{client_id}$", "{client_id}"));
        assert!(m("^a{2}$", "aa"));
        assert!(!m("^a{2}$", "a{2}"));
    }

    #[test]
    fn bad_patterns_are_refused() {
        let long = "a".repeat(MAX_PATTERN_LEN_BYTES + 1);
        assert_eq!(
            Pattern::new(&long).unwrap_err(),
            PatternError::TooLong {
                len: MAX_PATTERN_LEN_BYTES + 1
            }
        );
        assert!(Pattern::new(&"a".repeat(MAX_PATTERN_LEN_BYTES)).is_ok());
        for bad in ["(", "[a", "(?=x)", "a\\1", "\\Qx\\E"] {
            match Pattern::new(bad) {
                Err(PatternError::Invalid { pattern, reason }) => {
                    assert_eq!(pattern, bad);
                    assert!(!reason.is_empty());
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        // A pattern whose compiled form would be huge.
        assert!(Pattern::new("\\w{1000}\\w{1000}").is_err());
    }

    #[test]
    fn variables_expand_escaped() {
        let vars = [("username", "a.b"), ("vhost", "/")];
        assert_eq!(expand_variables("^{username}\\..*", &vars), "^a\\.b\\..*");
        assert_eq!(expand_variables("{vhost}-{username}", &vars), "/-a\\.b");
        assert_eq!(expand_variables("{client_id}{x", &vars), "{client_id}{x");
        // A value that looks like a variable is not expanded again.
        assert_eq!(
            expand_variables("{username}", &[("username", "{vhost}"), ("vhost", "v")]),
            "\\{vhost\\}"
        );
        let p = Pattern::new(&expand_variables("^{username}$", &vars)).unwrap();
        assert!(p.is_match("a.b"));
        assert!(
            !p.is_match("aXb"),
            "the dot of the user name must not be a wildcard"
        );
    }
}
