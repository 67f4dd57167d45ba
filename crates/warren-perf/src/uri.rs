//! Minimal `amqp://user:pass@host:port/vhost` parser (no TLS).

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpUri {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub vhost: String,
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .ok_or_else(|| format!("bad percent escape in {s:?}"))?;
            let v =
                u8::from_str_radix(hex, 16).map_err(|_| format!("bad percent escape in {s:?}"))?;
            out.push(v);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("invalid UTF-8 in {s:?}"))
}

pub fn parse(uri: &str) -> Result<AmqpUri, String> {
    let rest = uri
        .strip_prefix("amqp://")
        .ok_or_else(|| format!("unsupported URI {uri:?}: only amqp:// is supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let (user, password) = match userinfo {
        Some(ui) => match ui.find(':') {
            Some(i) => (percent_decode(&ui[..i])?, percent_decode(&ui[i + 1..])?),
            None => (percent_decode(ui)?, String::new()),
        },
        None => ("guest".to_string(), "guest".to_string()),
    };
    let (host, port) = match hostport.rfind(':') {
        Some(i) if !hostport.ends_with(']') => (
            &hostport[..i],
            hostport[i + 1..]
                .parse::<u16>()
                .map_err(|_| format!("bad port in {uri:?}"))?,
        ),
        _ => (hostport, 5672),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    let vhost = match path {
        None => "/".to_string(),
        Some(p) => percent_decode(p)?,
    };
    let vhost = if vhost.is_empty() {
        "/".to_string()
    } else {
        vhost
    };
    Ok(AmqpUri {
        host: host.to_string(),
        port,
        user,
        password,
        vhost,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_uri() {
        let u = parse("amqp://guest:guest@127.0.0.1:5672/%2f").unwrap();
        assert_eq!(u.host, "127.0.0.1");
        assert_eq!(u.port, 5672);
        assert_eq!(u.user, "guest");
        assert_eq!(u.password, "guest");
        assert_eq!(u.vhost, "/");
    }

    #[test]
    fn short_forms() {
        let u = parse("amqp://localhost").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.vhost.as_str()),
            ("localhost", 5672, "/")
        );
        let u = parse("amqp://a:b@h:5673/vh").unwrap();
        assert_eq!(
            (u.user.as_str(), u.password.as_str(), u.port),
            ("a", "b", 5673)
        );
        assert_eq!(u.vhost, "vh");
        assert!(parse("amqps://h").is_err());
    }
}
