//! Password hashes in RabbitMQ's formats.
//!
//! RabbitMQ stores `salt ++ H(salt ++ password)` with a fresh 4-byte salt, and exports it base64
//! encoded as a user's `password_hash`, next to the `hashing_algorithm` that names `H` by its
//! Erlang module (rabbitmq.com/docs/passwords, "Computing Password Hash"; `rabbit_password.erl`).
//! Keeping the exact format means users exported from RabbitMQ log in to Warren with the
//! passwords they already have, and the other way round.
//!
//! An empty hash is a passwordless user (`rabbitmqctl clear_password`, or a definitions entry with
//! `"password_hash": ""`): no candidate password ever verifies against it.
//!
//! Comparison is constant-time (`subtle`) so the time a refusal takes says nothing about how much
//! of the digest matched. Hashes and cleartext are redacted from `Debug` output so that neither
//! ends up in a log line by accident.

use std::fmt;

use base64::Engine as _;
use md5::Md5;
use rand::RngCore;
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

/// Length of the salt RabbitMQ prepends to every hash, in bytes (`rabbit_password:generate_salt/0`).
pub const SALT_LEN_BYTES: usize = 4;

/// The hash function of a password hash, named as in RabbitMQ's `hashing_algorithm` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HashingAlgorithm {
    /// `rabbit_password_hashing_sha256`, RabbitMQ's default since 3.6.0.
    #[default]
    Sha256,
    /// `rabbit_password_hashing_sha512`.
    Sha512,
    /// `rabbit_password_hashing_md5`, what RabbitMQ before 3.6.0 used; still accepted for imports.
    Md5,
}

impl HashingAlgorithm {
    /// The Erlang module name RabbitMQ uses for this algorithm in definitions files.
    pub fn module_name(self) -> &'static str {
        match self {
            HashingAlgorithm::Sha256 => "rabbit_password_hashing_sha256",
            HashingAlgorithm::Sha512 => "rabbit_password_hashing_sha512",
            HashingAlgorithm::Md5 => "rabbit_password_hashing_md5",
        }
    }

    /// Parses a `hashing_algorithm` value; `None` for a module Warren does not know.
    pub fn from_module_name(name: &str) -> Option<Self> {
        match name {
            "rabbit_password_hashing_sha256" => Some(HashingAlgorithm::Sha256),
            "rabbit_password_hashing_sha512" => Some(HashingAlgorithm::Sha512),
            "rabbit_password_hashing_md5" => Some(HashingAlgorithm::Md5),
            _ => None,
        }
    }

    /// The algorithm RabbitMQ assumes for a definitions file that names none: MD5 for files
    /// written by RabbitMQ 3.0 to 3.5, SHA-256 otherwise (`hashing_algorithm/2` in
    /// `rabbit_auth_backend_internal.erl`). `version` is the file's `rabbitmq_version`.
    pub fn default_for_version(version: Option<&str>) -> Self {
        match version {
            Some(v) if v.starts_with("3.") => {
                let minor = v[2..].split('.').next().unwrap_or("");
                match minor {
                    "0" | "1" | "2" | "3" | "4" | "5" => HashingAlgorithm::Md5,
                    _ => HashingAlgorithm::Sha256,
                }
            }
            _ => HashingAlgorithm::Sha256,
        }
    }

    /// `H(salt ++ password)`.
    fn salted_digest(self, salt: &[u8], password: &[u8]) -> Vec<u8> {
        match self {
            HashingAlgorithm::Sha256 => Sha256::new()
                .chain_update(salt)
                .chain_update(password)
                .finalize()
                .to_vec(),
            HashingAlgorithm::Sha512 => Sha512::new()
                .chain_update(salt)
                .chain_update(password)
                .finalize()
                .to_vec(),
            HashingAlgorithm::Md5 => Md5::new()
                .chain_update(salt)
                .chain_update(password)
                .finalize()
                .to_vec(),
        }
    }
}

impl fmt::Display for HashingAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.module_name())
    }
}

/// Hashes `password` with a fresh random salt: the `salt ++ H(salt ++ password)` bytes RabbitMQ
/// stores (`rabbit_password:hash/2`). Base64 them with [`encode_hash`] for a definitions file.
pub fn hash_password(algorithm: HashingAlgorithm, password: &str) -> Vec<u8> {
    let mut salt = [0u8; SALT_LEN_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut salt);
    hash_password_with_salt(algorithm, salt, password)
}

/// Like [`hash_password`] with a given salt (deterministic; for tests and known vectors).
pub fn hash_password_with_salt(
    algorithm: HashingAlgorithm,
    salt: [u8; SALT_LEN_BYTES],
    password: &str,
) -> Vec<u8> {
    let mut out = salt.to_vec();
    out.extend_from_slice(&algorithm.salted_digest(&salt, password.as_bytes()));
    out
}

/// True when `candidate` is the password `hash` (salt followed by digest, as RabbitMQ stores it)
/// was made from with `algorithm`. A hash shorter than the salt, such as a passwordless user's
/// empty one, never verifies (`user_login_authentication/2` in `rabbit_auth_backend_internal.erl`).
/// The digest comparison takes the same time wherever the first differing byte is.
pub fn verify_password(hash: &[u8], algorithm: HashingAlgorithm, candidate: &str) -> bool {
    if hash.len() < SALT_LEN_BYTES {
        return false;
    }
    let (salt, expected) = hash.split_at(SALT_LEN_BYTES);
    let actual = algorithm.salted_digest(salt, candidate.as_bytes());
    actual.ct_eq(expected).into()
}

/// Base64 (standard alphabet, padded) of a hash, as in a definitions file's `password_hash`.
pub fn encode_hash(hash: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(hash)
}

/// Decodes a definitions file's `password_hash` (standard alphabet; padding optional).
pub fn decode_hash(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    base64::engine::general_purpose::STANDARD_PAD_INDIFFERENT.decode(text)
}

/// A user's stored credential: hash bytes and the algorithm that made them.
///
/// `Debug` shows the algorithm and whether a password is set, never the bytes.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct PasswordHash {
    /// Hash function.
    pub algorithm: HashingAlgorithm,
    /// `salt ++ digest`; empty for a passwordless user.
    pub bytes: Vec<u8>,
}

impl PasswordHash {
    /// Hashes a cleartext password with a fresh salt.
    pub fn from_password(algorithm: HashingAlgorithm, password: &str) -> Self {
        PasswordHash {
            algorithm,
            bytes: hash_password(algorithm, password),
        }
    }

    /// The credential of a passwordless user (RabbitMQ's `password_hash: ""`).
    pub fn none() -> Self {
        PasswordHash::default()
    }

    /// Decodes a definitions file's base64 `password_hash`.
    pub fn from_base64(
        algorithm: HashingAlgorithm,
        text: &str,
    ) -> Result<Self, base64::DecodeError> {
        Ok(PasswordHash {
            algorithm,
            bytes: decode_hash(text)?,
        })
    }

    /// The base64 form for a definitions file.
    pub fn to_base64(&self) -> String {
        encode_hash(&self.bytes)
    }

    /// False for a passwordless user.
    pub fn is_set(&self) -> bool {
        !self.bytes.is_empty()
    }

    /// See [`verify_password`].
    pub fn verify(&self, candidate: &str) -> bool {
        verify_password(&self.bytes, self.algorithm, candidate)
    }
}

impl fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PasswordHash")
            .field("algorithm", &self.algorithm)
            .field("set", &self.is_set())
            .finish()
    }
}

/// A cleartext password on its way to being hashed (from a config file or a definitions file's
/// `password` field). `Debug` and `Display` print `***`, so it cannot leak into a log line; read
/// it with [`Cleartext::expose`]. Serializes as the plain string.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Cleartext(String);

impl Cleartext {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        Cleartext(password.into())
    }

    /// The password itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Cleartext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Cleartext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SALT: [u8; 4] = [0x90, 0x8d, 0xc6, 0x0a];

    /// Vectors: the worked example of rabbitmq.com/docs/passwords (salt `908D C60A`, password
    /// `test12`) for SHA-256, and the same salt through Python's `hashlib` for the others.
    #[test]
    fn known_vectors() {
        let cases = [
            (
                HashingAlgorithm::Sha256,
                "test12",
                "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
            ),
            (
                HashingAlgorithm::Sha256,
                "pässwörd",
                "kI3GClsOFtopbKwdov4/ENvEWw/B0G8pjpMDaFMO74PDffqF",
            ),
            (
                HashingAlgorithm::Sha512,
                "test12",
                "kI3GChuNuIYf8lRbCCxZjgjKwsY19ns6+uFO0zcXRBGA/XGJPYD8OWMy7EB8TaOmAzjP2azv84GbINYwX2cDWb4DHnc=",
            ),
            (
                HashingAlgorithm::Md5,
                "test12",
                "kI3GChNpte2FApYFXScl+0dIluk=",
            ),
            (
                HashingAlgorithm::Md5,
                "pässwörd",
                "kI3GClwwUwdpbaAUQtw8NE0rVIg=",
            ),
        ];
        for (alg, password, expected) in cases {
            let hash = hash_password_with_salt(alg, SALT, password);
            assert_eq!(encode_hash(&hash), expected, "{alg} {password}");
            let decoded = decode_hash(expected).unwrap();
            assert!(verify_password(&decoded, alg, password));
            assert!(!verify_password(&decoded, alg, "test13"));
        }
    }

    #[test]
    fn fresh_salts_differ_and_verify() {
        for alg in [
            HashingAlgorithm::Sha256,
            HashingAlgorithm::Sha512,
            HashingAlgorithm::Md5,
        ] {
            let a = hash_password(alg, "s3cret");
            let b = hash_password(alg, "s3cret");
            assert_ne!(a, b, "two hashes of one password share a salt");
            assert!(verify_password(&a, alg, "s3cret"));
            assert!(verify_password(&b, alg, "s3cret"));
            assert!(!verify_password(&a, alg, "s3cre"));
            assert!(!verify_password(&a, alg, ""));
        }
    }

    #[test]
    fn wrong_algorithm_does_not_verify() {
        let h = hash_password_with_salt(HashingAlgorithm::Sha512, SALT, "test12");
        assert!(!verify_password(&h, HashingAlgorithm::Sha256, "test12"));
        assert!(!verify_password(&h, HashingAlgorithm::Md5, "test12"));
    }

    #[test]
    fn passwordless_and_truncated_hashes_never_verify() {
        for alg in [
            HashingAlgorithm::Sha256,
            HashingAlgorithm::Sha512,
            HashingAlgorithm::Md5,
        ] {
            assert!(!verify_password(&[], alg, ""));
            assert!(!verify_password(&[], alg, "anything"));
            assert!(!verify_password(&SALT[..3], alg, ""));
            // A bare salt: the digest is missing, not empty-and-equal.
            assert!(!verify_password(&SALT, alg, ""));
        }
        assert!(!PasswordHash::none().is_set());
        assert!(!PasswordHash::none().verify(""));
    }

    #[test]
    fn module_names_round_trip() {
        for alg in [
            HashingAlgorithm::Sha256,
            HashingAlgorithm::Sha512,
            HashingAlgorithm::Md5,
        ] {
            assert_eq!(
                HashingAlgorithm::from_module_name(alg.module_name()),
                Some(alg)
            );
        }
        assert_eq!(
            HashingAlgorithm::from_module_name("rabbit_password_hashing_bcrypt"),
            None
        );
    }

    #[test]
    fn default_algorithm_by_exporting_version() {
        use HashingAlgorithm::*;
        assert_eq!(HashingAlgorithm::default_for_version(Some("3.5.7")), Md5);
        assert_eq!(HashingAlgorithm::default_for_version(Some("3.0.0")), Md5);
        assert_eq!(HashingAlgorithm::default_for_version(Some("3.6.0")), Sha256);
        assert_eq!(
            HashingAlgorithm::default_for_version(Some("3.10.8")),
            Sha256
        );
        assert_eq!(HashingAlgorithm::default_for_version(Some("4.1.0")), Sha256);
        assert_eq!(HashingAlgorithm::default_for_version(None), Sha256);
    }

    #[test]
    fn padding_is_optional_on_decode() {
        let padded = "kI3GChNpte2FApYFXScl+0dIluk=";
        assert_eq!(
            decode_hash(padded).unwrap(),
            decode_hash(&padded[..27]).unwrap()
        );
        assert!(decode_hash("not base64!").is_err());
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let h = PasswordHash::from_password(HashingAlgorithm::Sha256, "hunter2");
        let shown = format!("{h:?}");
        assert!(!shown.contains(&h.to_base64()), "{shown}");
        assert!(shown.contains("Sha256"));
        let c = Cleartext::new("hunter2");
        assert_eq!(format!("{c:?} {c}"), "*** ***");
        assert_eq!(c.expose(), "hunter2");
        assert_eq!(serde_json::to_string(&c).unwrap(), "\"hunter2\"");
    }
}
