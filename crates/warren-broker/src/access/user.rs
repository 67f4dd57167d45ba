//! Users of the internal database: name, credential, tags and limits.
//!
//! Tags are free-form strings in RabbitMQ; five of them mean something to the broker and its
//! management API (rabbitmq.com/docs/management#permissions, rabbitmq.com/docs/access-control):
//! `administrator`, `monitoring`, `policymaker`, `management` and `impersonator`. Others are kept
//! and exported unchanged. Definitions files carry them as a list (`["a","b"]`) or, in older files
//! and the management API, as one comma-separated string (`"a,b"`); [`parse_tags`] reads both.

use std::fmt;

use super::limits::UserLimits;
use super::password::PasswordHash;

/// The most tags one user may have (`MAX_USER_TAGS` in `rabbit_auth_backend_internal.erl`).
pub const MAX_USER_TAGS: usize = 32;

/// A user tag.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UserTag {
    /// Everything the management API offers, including users, vhosts and permissions.
    Administrator,
    /// Reads everything: all connections, channels and queues, node metrics.
    Monitoring,
    /// Manages policies and parameters in the vhosts the user can access.
    Policymaker,
    /// Logs in to the management API and sees the vhosts the user can access.
    Management,
    /// May publish messages whose `user_id` property names another user.
    Impersonator,
    /// Any other tag, kept as given.
    Other(String),
}

impl UserTag {
    /// Parses one tag (already trimmed).
    pub fn parse(tag: &str) -> Self {
        match tag {
            "administrator" => UserTag::Administrator,
            "monitoring" => UserTag::Monitoring,
            "policymaker" => UserTag::Policymaker,
            "management" => UserTag::Management,
            "impersonator" => UserTag::Impersonator,
            other => UserTag::Other(other.to_string()),
        }
    }

    /// The tag's name.
    pub fn as_str(&self) -> &str {
        match self {
            UserTag::Administrator => "administrator",
            UserTag::Monitoring => "monitoring",
            UserTag::Policymaker => "policymaker",
            UserTag::Management => "management",
            UserTag::Impersonator => "impersonator",
            UserTag::Other(s) => s,
        }
    }
}

impl fmt::Display for UserTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// More than [`MAX_USER_TAGS`] tags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("too many tags: {count} (at most {MAX_USER_TAGS})")]
pub struct TooManyTags {
    /// How many were given.
    pub count: usize,
}

/// Parses tags given as separate strings; each is trimmed, empty ones are dropped, as
/// `tag_list_from/1` in `rabbit_auth_backend_internal.erl` does.
pub fn parse_tags<'a>(
    tags: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<UserTag>, TooManyTags> {
    let tags: Vec<UserTag> = tags
        .into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(UserTag::parse)
        .collect();
    if tags.len() > MAX_USER_TAGS {
        return Err(TooManyTags { count: tags.len() });
    }
    Ok(tags)
}

/// Parses the comma-separated form (`"administrator, management"`).
pub fn parse_tag_list(csv: &str) -> Result<Vec<UserTag>, TooManyTags> {
    parse_tags(csv.split(','))
}

/// A user of the internal database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    /// Login name.
    pub name: String,
    /// Credential; [`PasswordHash::none`] for a passwordless user.
    pub password: PasswordHash,
    /// Tags, in the order given.
    pub tags: Vec<UserTag>,
    /// Per-user limits (RabbitMQ's "user limits").
    pub limits: UserLimits,
}

impl UserRecord {
    /// A user with a password hashed now with RabbitMQ's default algorithm (SHA-256).
    pub fn with_password(name: impl Into<String>, password: &str, tags: Vec<UserTag>) -> Self {
        UserRecord {
            name: name.into(),
            password: PasswordHash::from_password(Default::default(), password),
            tags,
            limits: UserLimits::default(),
        }
    }

    /// True when the user has `tag`.
    pub fn has_tag(&self, tag: &UserTag) -> bool {
        self.tags.contains(tag)
    }

    /// `administrator` (`is_admin/1` in `rabbit_web_dispatch_access_control.erl`).
    pub fn is_administrator(&self) -> bool {
        self.has_tag(&UserTag::Administrator)
    }

    /// `administrator` or `monitoring` (`is_monitor/1`).
    pub fn is_monitor(&self) -> bool {
        self.is_administrator() || self.has_tag(&UserTag::Monitoring)
    }

    /// `administrator` or `policymaker` (`is_policymaker/1`).
    pub fn is_policymaker(&self) -> bool {
        self.is_administrator() || self.has_tag(&UserTag::Policymaker)
    }

    /// Any of the four tags that open the management API (`is_mgmt_user/1`).
    pub fn is_management_user(&self) -> bool {
        self.is_monitor() || self.is_policymaker() || self.has_tag(&UserTag::Management)
    }

    /// Tags as one comma-separated string, as `rabbitmqctl list_users` shows them.
    pub fn tags_csv(&self) -> String {
        self.tags
            .iter()
            .map(UserTag::as_str)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Why a password login was refused. Clients see only RabbitMQ's generic 403 ACCESS_REFUSED
/// ("Login was refused using authentication mechanism PLAIN..."); this reason, worded as in
/// `rabbit_auth_backend_internal.erl`, is for the broker's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginError {
    /// Unknown user, wrong password, or a passwordless user: deliberately indistinguishable.
    #[error("user '{0}' - invalid credentials")]
    InvalidCredentials(String),
    /// An empty password, which the internal database never accepts.
    #[error(
        "user '{0}' attempted to log in with a blank password, which is prohibited by the \
         internal authN backend. To use TLS/x509 certificate-based authentication, see the \
         rabbitmq_auth_mechanism_ssl plugin and configure the client to use the EXTERNAL \
         authentication mechanism. Alternatively change the password for the user to be non-blank."
    )]
    BlankPassword(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_parse_from_both_forms() {
        let list = parse_tags(["administrator", " monitoring ", "", "custom"]).unwrap();
        let csv = parse_tag_list("administrator, monitoring,,custom").unwrap();
        assert_eq!(list, csv);
        assert_eq!(
            list,
            vec![
                UserTag::Administrator,
                UserTag::Monitoring,
                UserTag::Other("custom".into())
            ]
        );
        assert_eq!(parse_tag_list("").unwrap(), vec![]);
        for t in [
            "administrator",
            "monitoring",
            "policymaker",
            "management",
            "impersonator",
            "x",
        ] {
            assert_eq!(UserTag::parse(t).as_str(), t);
        }
    }

    #[test]
    fn at_most_32_tags() {
        let names: Vec<String> = (0..33).map(|i| format!("t{i}")).collect();
        assert!(parse_tags(names.iter().take(32).map(String::as_str)).is_ok());
        assert_eq!(
            parse_tags(names.iter().map(String::as_str)),
            Err(TooManyTags { count: 33 })
        );
    }

    #[test]
    fn tag_predicates_follow_rabbitmq() {
        let user = |tags: &[&str]| UserRecord {
            name: "u".into(),
            password: PasswordHash::none(),
            tags: parse_tags(tags.iter().copied()).unwrap(),
            limits: UserLimits::default(),
        };
        let admin = user(&["administrator"]);
        assert!(admin.is_administrator() && admin.is_monitor() && admin.is_policymaker());
        assert!(admin.is_management_user());
        let mon = user(&["monitoring"]);
        assert!(!mon.is_administrator() && mon.is_monitor() && !mon.is_policymaker());
        assert!(mon.is_management_user());
        let pm = user(&["policymaker"]);
        assert!(!pm.is_monitor() && pm.is_policymaker() && pm.is_management_user());
        let mgmt = user(&["management"]);
        assert!(!mgmt.is_monitor() && !mgmt.is_policymaker() && mgmt.is_management_user());
        let none = user(&["impersonator", "other"]);
        assert!(!none.is_management_user());
        assert_eq!(none.tags_csv(), "impersonator,other");
    }

    #[test]
    fn login_errors_use_rabbitmq_wording() {
        assert_eq!(
            LoginError::InvalidCredentials("bob".into()).to_string(),
            "user 'bob' - invalid credentials"
        );
        assert!(LoginError::BlankPassword("bob".into())
            .to_string()
            .starts_with("user 'bob' attempted to log in with a blank password"));
    }
}
