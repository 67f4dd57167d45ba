//! Server-generated names: `amq.gen-…` queue names and `amq.ctag-…` consumer tags
//! (RabbitMQ appends 16 random bytes in URL-safe base64 without padding: 22 characters);
//! and [`same`], name equality for the per-publish paths.

use rand::RngCore;

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// Returns `prefix` followed by 22 URL-safe base64 characters of fresh randomness.
pub fn generate(prefix: &str) -> String {
    let mut raw = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut raw);
    let mut out = String::with_capacity(prefix.len() + 22);
    out.push_str(prefix);
    // 128 bits -> 22 sextets (the last one carries 2 bits).
    let mut acc: u32 = 0;
    let mut bits = 0;
    for b in raw {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 0x3f) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 0x3f) as usize] as char);
    }
    out
}

/// A server-named queue name, `amq.gen-` + 22 characters.
pub fn queue_name() -> String {
    generate("amq.gen-")
}

/// A server-generated consumer tag, `amq.ctag-` + 22 characters.
pub fn consumer_tag() -> String {
    generate("amq.ctag-")
}

/// `a == b` for names compared once per message, without calling `memcmp` when both are
/// empty (the default exchange, `""`). An empty `&str` points at a dangling address, and
/// glibc's AVX-512 `memcmp` (`__memcmp_evex_movbe`) reads from it with a masked load even
/// for 0 bytes; on AMD EPYC (Zen 4) that load takes a microcode assist. Two such
/// comparisons per publish to the default exchange were 7% of the broker's CPU in a
/// raw-frame 1p/1c run (docs/profile.md).
#[inline]
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn shapes() {
        let q = super::queue_name();
        assert!(q.starts_with("amq.gen-"));
        assert_eq!(q.len(), 8 + 22);
        assert_ne!(q, super::queue_name());
        assert_eq!(super::consumer_tag().len(), 9 + 22);
    }

    #[test]
    fn same_is_string_equality() {
        for (a, b) in [
            ("", ""),
            ("", "x"),
            ("x", ""),
            ("x", "x"),
            ("x", "y"),
            ("xy", "x"),
        ] {
            assert_eq!(super::same(a, b), a == b, "{a:?} {b:?}");
        }
        let owned = String::new();
        assert!(super::same(&owned, ""));
    }
}
