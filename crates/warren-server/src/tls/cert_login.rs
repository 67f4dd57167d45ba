//! The user name of a client certificate for SASL EXTERNAL, as RabbitMQ's
//! `rabbitmq_auth_mechanism_ssl` derives it (`rabbit_ssl:peer_cert_auth_name/2`, which formats
//! names with `rabbit_cert_info`).
//!
//! `ssl_cert_login_from = distinguished_name` (the default) gives the subject as RabbitMQ
//! prints it: "RFC 4514-ish", the relative distinguished names in reverse order of the
//! certificate (so the most specific, usually `CN`, first), joined by `,`; the attributes of a
//! multi-valued RDN joined by `+` in certificate order; each `TYPE=value` with RabbitMQ's type
//! names (`CN`, `L`, `ST`, `O`, `OU`, `C`, `SN`, `GIVENNAME`, `INITIALS`, `GENERATIONQUALIFIER`,
//! `TITLE`, `SERIALNUMBER`, `PSEUDONYM`, `DC`, `EMAILADDRESS`, `UID`) and the dotted OID for
//! any other type (`STREET` too: RabbitMQ's table entry for it never matches, so it prints
//! `2.5.4.9=...`). Values are escaped as RFC 4514 asks (`\,` `\+` `\"` `\\` `\<` `\>` `\;`, a
//! leading `#` or space, a trailing space) and every byte outside 32..=125 of the value's UTF-8
//! is written `\XX` in upper-case hex, `~` included (UTF-8 country names and e-mail addresses
//! are escaped by code point: `\XX` up to U+00FF, `\**` above). For example, the subject
//! `C=GB, O=Warren, OU=Ops, CN=client` (certificate order) is `CN=client,OU=Ops,O=Warren,C=GB`,
//! which is also what `openssl x509 -noout -subject -nameopt RFC2253` prints for plain ASCII.
//!
//! `ssl_cert_login_from = common_name` gives the `CN` values, unescaped, in certificate order,
//! joined by `,`.
//!
//! Attribute values are read as Erlang's `public_key` decodes them: the X.520 name types
//! (CN, O, OU, L, ST, ...) as DirectoryString (PrintableString and UTF8String as their bytes,
//! TeletexString as Latin-1, BMPString, UniversalString), `C` as PrintableString or
//! UTF8String, `emailAddress` as IA5String or UTF8String, `DC` as IA5String, `serialNumber` and
//! `dnQualifier` as PrintableString. A value of another ASN.1 type in one of these makes the
//! certificate undecodable for Erlang, so RabbitMQ accepts no login with it, and neither does
//! this module. Types Erlang does not know are tried as a DirectoryString, and otherwise
//! written as RabbitMQ writes them, an Erlang binary of the DER bytes (`<<22,3,102,111,111>>`).
//! RabbitMQ's `subject_alternative_name` mode is not implemented.

use serde::{Deserialize, Serialize};
use x509_parser::asn1_rs::{Any, Class, Tag, ToDer};
use x509_parser::prelude::{FromDer, X509Certificate, X509Name};

/// Where the SASL EXTERNAL user name comes from (RabbitMQ's `ssl_cert_login_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CertLoginFrom {
    /// The whole subject distinguished name (RabbitMQ's default).
    #[default]
    DistinguishedName,
    /// The subject's common name(s).
    CommonName,
}

/// Why no user name can be taken from a certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertLoginError {
    /// The bytes are not an X.509 certificate.
    #[error("the peer certificate cannot be parsed: {0}")]
    Malformed(String),
    /// `common_name` was asked for and the subject has no CN (RabbitMQ refuses the login with
    /// this text).
    #[error("no name found")]
    NoName,
}

/// The user name for SASL EXTERNAL from the client's certificate `der` (the leaf, already
/// verified during the handshake), as `rabbit_ssl:peer_cert_auth_name/2` computes it.
///
/// Errors: [`CertLoginError::Malformed`] when `der` does not parse, or when a name attribute
/// has a value of an ASN.1 type its X.520 type does not allow (Erlang's `public_key` cannot
/// decode such a certificate, so RabbitMQ accepts no login with it either);
/// [`CertLoginError::NoName`] for `common_name` when the subject has no CN. An empty subject
/// gives an empty name with `distinguished_name`, as in RabbitMQ (the login then fails as an
/// unknown user).
pub fn cert_login_name(der: &[u8], from: CertLoginFrom) -> Result<String, CertLoginError> {
    let cert = parse(der)?;
    match from {
        CertLoginFrom::DistinguishedName => format_name(cert.subject()),
        CertLoginFrom::CommonName => {
            let mut cns = Vec::new();
            for a in cert.subject().iter().flat_map(|rdn| rdn.iter()) {
                let oid = a.attr_type().to_id_string();
                if oid == OID_COMMON_NAME {
                    cns.push(chars_to_string(&value_chars(&oid, a.attr_value())?));
                }
            }
            if cns.is_empty() {
                Err(CertLoginError::NoName)
            } else {
                Ok(cns.join(","))
            }
        }
    }
}

/// The certificate's subject as RabbitMQ prints it (`peer_cert_subject`, the
/// `distinguished_name` login).
///
/// Errors: [`CertLoginError::Malformed`], as for [`cert_login_name`].
pub fn subject_dn(der: &[u8]) -> Result<String, CertLoginError> {
    format_name(parse(der)?.subject())
}

/// The certificate's issuer as RabbitMQ prints it (`peer_cert_issuer`).
///
/// Errors: [`CertLoginError::Malformed`], as for [`cert_login_name`].
pub fn issuer_dn(der: &[u8]) -> Result<String, CertLoginError> {
    format_name(parse(der)?.issuer())
}

/// Parses `der`, and checks that every attribute of its subject and issuer can be decoded as
/// Erlang decodes the whole certificate (`public_key:pkix_decode_cert(Der, otp)`).
fn parse(der: &[u8]) -> Result<X509Certificate<'_>, CertLoginError> {
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| CertLoginError::Malformed(e.to_string()))?;
    format_name(cert.issuer())?;
    format_name(cert.subject())?;
    Ok(cert)
}

const OID_COMMON_NAME: &str = "2.5.4.3";
const OID_COUNTRY_NAME: &str = "2.5.4.6";
const OID_EMAIL_ADDRESS: &str = "1.2.840.113549.1.9.1";
const OID_DOMAIN_COMPONENT: &str = "0.9.2342.19200300.100.1.25";

/// RabbitMQ's attribute type names (`rabbit_cert_info:format_rdn/1`), by dotted OID.
const TYPE_NAMES: &[(&str, &str)] = &[
    ("2.5.4.4", "SN"),
    ("2.5.4.42", "GIVENNAME"),
    ("2.5.4.43", "INITIALS"),
    ("2.5.4.44", "GENERATIONQUALIFIER"),
    (OID_COMMON_NAME, "CN"),
    ("2.5.4.7", "L"),
    ("2.5.4.8", "ST"),
    ("2.5.4.10", "O"),
    ("2.5.4.11", "OU"),
    ("2.5.4.12", "TITLE"),
    (OID_COUNTRY_NAME, "C"),
    ("2.5.4.5", "SERIALNUMBER"),
    ("2.5.4.65", "PSEUDONYM"),
    (OID_DOMAIN_COMPONENT, "DC"),
    (OID_EMAIL_ADDRESS, "EMAILADDRESS"),
    ("0.9.2342.19200300.100.1.1", "UID"),
];

/// How Erlang's `public_key` decodes the value of an attribute type it knows
/// (`pubkey_cert_records:attribute_type/1` and its workarounds for UTF-8 country names and
/// e-mail addresses); it leaves the values of other types undecoded.
enum Known {
    /// X.520 DirectoryString: name, surname, givenName, initials, generationQualifier,
    /// commonName, localityName, stateOrProvinceName, organizationName,
    /// organizationalUnitName, title, pseudonym.
    DirectoryString,
    /// PrintableString only: dnQualifier, serialNumber.
    Printable,
    /// countryName: PrintableString, or UTF8String (as a list of code points).
    Country,
    /// emailAddress: IA5String, or UTF8String (as a list of code points).
    Email,
    /// domainComponent: IA5String only.
    DomainComponent,
}

fn known(oid: &str) -> Option<Known> {
    Some(match oid {
        "2.5.4.41" | "2.5.4.4" | "2.5.4.42" | "2.5.4.43" | "2.5.4.44" | OID_COMMON_NAME
        | "2.5.4.7" | "2.5.4.8" | "2.5.4.10" | "2.5.4.11" | "2.5.4.12" | "2.5.4.65" => {
            Known::DirectoryString
        }
        "2.5.4.46" | "2.5.4.5" => Known::Printable,
        OID_COUNTRY_NAME => Known::Country,
        OID_EMAIL_ADDRESS => Known::Email,
        OID_DOMAIN_COMPONENT => Known::DomainComponent,
        _ => return None,
    })
}

/// `rabbit_cert_info:format_rdn_sequence/1`: RDNs last to first, joined by `,`.
fn format_name(name: &X509Name<'_>) -> Result<String, CertLoginError> {
    let mut rdns = Vec::new();
    for rdn in name.iter() {
        let mut attributes = Vec::new();
        for a in rdn.iter() {
            let oid = a.attr_type().to_id_string();
            let value = escape(&value_chars(&oid, a.attr_value())?);
            match TYPE_NAMES.iter().find(|(o, _)| *o == oid) {
                Some((_, short)) => attributes.push(format!("{short}={value}")),
                None => attributes.push(format!("{oid}={value}")),
            }
        }
        rdns.push(attributes.join("+"));
    }
    rdns.reverse();
    Ok(rdns.join(","))
}

/// An attribute value as the Erlang string `rabbit_cert_info:format_asn1_value/1` makes of it:
/// UTF-8 bytes for the string types, code points for UTF-8 country names and e-mail
/// addresses, `<<...>>` for a value that is no string.
fn value_chars(oid: &str, v: &Any<'_>) -> Result<Vec<u32>, CertLoginError> {
    let tag = if v.class() == Class::Universal {
        Some(v.tag())
    } else {
        None
    };
    let bytes = || v.data.iter().map(|&b| u32::from(b)).collect();
    let code_points = || {
        String::from_utf8_lossy(v.data)
            .chars()
            .map(u32::from)
            .collect()
    };
    let undecodable = || {
        CertLoginError::Malformed(format!(
            "name attribute {oid} holds a value of ASN.1 tag {}, which its X.520 type does not allow",
            v.tag()
        ))
    };
    match (known(oid), tag) {
        (Some(Known::DirectoryString), _) => directory_string(v).ok_or_else(undecodable),
        (Some(Known::Printable | Known::Country), Some(Tag::PrintableString)) => Ok(bytes()),
        (Some(Known::Email | Known::DomainComponent), Some(Tag::Ia5String)) => Ok(bytes()),
        (Some(Known::Country | Known::Email), Some(Tag::Utf8String)) => Ok(code_points()),
        (Some(_), _) => Err(undecodable()),
        // Undecoded: RabbitMQ tries it as a DirectoryString, else prints the Erlang binary.
        (None, _) => Ok(directory_string(v).unwrap_or_else(|| erlang_binary(v))),
    }
}

/// The UTF-8 bytes of a DirectoryString (`format_directory_string/2`): PrintableString and
/// UTF8String as they are, TeletexString as Latin-1, BMPString as UCS-2, UniversalString as
/// UCS-4; `None` for any other type.
fn directory_string(v: &Any<'_>) -> Option<Vec<u32>> {
    if v.class() != Class::Universal {
        return None;
    }
    let utf8 = |s: String| s.bytes().map(u32::from).collect();
    match v.tag() {
        Tag::PrintableString | Tag::Utf8String => {
            Some(v.data.iter().map(|&b| u32::from(b)).collect())
        }
        Tag::TeletexString => Some(utf8(v.data.iter().map(|&b| char::from(b)).collect())),
        Tag::BmpString => {
            let units: Vec<u16> = v
                .data
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]))
                .collect();
            Some(utf8(String::from_utf16_lossy(&units)))
        }
        Tag::UniversalString => Some(utf8(
            v.data
                .chunks(4)
                .map(|c| {
                    let mut b = [0u8; 4];
                    b[..c.len()].copy_from_slice(c);
                    char::from_u32(u32::from_be_bytes(b)).unwrap_or(char::REPLACEMENT_CHARACTER)
                })
                .collect(),
        )),
        _ => None,
    }
}

/// An undecoded value as RabbitMQ prints it with `~tp`: an Erlang binary of its DER bytes,
/// `<<22,3,102,111,111>>`. (Erlang's pretty-printer breaks such a binary into lines past 80
/// columns, which is not reproduced here.)
fn erlang_binary(v: &Any<'_>) -> Vec<u32> {
    let der = v.to_der_vec().unwrap_or_else(|_| v.data.to_vec());
    let bytes: Vec<String> = der.iter().map(u8::to_string).collect();
    format!("<<{}>>", bytes.join(","))
        .chars()
        .map(u32::from)
        .collect()
}

/// An Erlang string of bytes (and, rarely, code points) as a Rust string.
fn chars_to_string(chars: &[u32]) -> String {
    if chars.iter().all(|&c| c <= 0xFF) {
        let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    } else {
        chars
            .iter()
            .map(|&c| char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect()
    }
}

/// `rabbit_cert_info:escape_rdn_value/1`: RFC 4514 escapes, and `\XX` for every element
/// outside 32..=125 (Erlang's `~2.16.0B`, which prints `**` for a code point above 0xFF).
fn escape(v: &[u32]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(v.len());
    for (i, &c) in v.iter().enumerate() {
        let first = i == 0;
        let last = i + 1 == v.len();
        let special = [' ', '#'].map(u32::from).contains(&c);
        if (first && special) || (!first && last && c == u32::from(' ')) {
            out.push('\\');
            out.push(char::from_u32(c).unwrap_or(' '));
            continue;
        }
        match char::from_u32(c) {
            Some(ch @ ('"' | '+' | ',' | ';' | '<' | '>' | '\\')) => {
                out.push('\\');
                out.push(ch);
            }
            Some(ch) if (32..126).contains(&c) => out.push(ch),
            _ if c > 0xFF => out.push_str("\\**"),
            _ => {
                let _ = write!(out, "\\{c:02X}");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escape(v: &[u8]) -> String {
        super::escape(&v.iter().map(|&b| u32::from(b)).collect::<Vec<_>>())
    }

    #[test]
    fn escaping_follows_rabbit_cert_info() {
        assert_eq!(escape(b"client"), "client");
        assert_eq!(escape(b"Warren, Inc."), "Warren\\, Inc.");
        assert_eq!(
            escape(b"a+b=c;d<e>f\"g\\h"),
            "a\\+b=c\\;d\\<e\\>f\\\"g\\\\h"
        );
        assert_eq!(escape(b"#tag"), "\\#tag");
        assert_eq!(escape(b"in#side"), "in#side");
        assert_eq!(escape(b" lead"), "\\ lead");
        assert_eq!(escape(b"trail "), "trail\\ ");
        assert_eq!(escape(b" "), "\\ ");
        assert_eq!(escape(b"  "), "\\ \\ ");
        assert_eq!(escape(b"mid dle"), "mid dle");
        assert_eq!(escape("é~\t".as_bytes()), "\\C3\\A9\\7E\\09");
        assert_eq!(escape(b""), "");
        // Code points (UTF-8 country names and e-mail addresses): Erlang's ~2.16.0B.
        assert_eq!(super::escape(&[0xE9, 0x100, u32::from('a')]), "\\E9\\**a");
    }

    #[test]
    fn malformed_certificate_is_an_error() {
        let e = cert_login_name(b"not a certificate", CertLoginFrom::DistinguishedName);
        assert!(matches!(e, Err(CertLoginError::Malformed(_))), "{e:?}");
        assert!(matches!(
            subject_dn(&[0x30, 0x03, 0x02, 0x01]),
            Err(CertLoginError::Malformed(_))
        ));
    }

    #[test]
    fn login_from_names_match_rabbitmq_config_values() {
        let t: toml::Table = "a = \"distinguished_name\"\nb = \"common_name\""
            .parse()
            .unwrap();
        assert_eq!(
            CertLoginFrom::deserialize(t["a"].clone()).unwrap(),
            CertLoginFrom::DistinguishedName
        );
        assert_eq!(
            CertLoginFrom::deserialize(t["b"].clone()).unwrap(),
            CertLoginFrom::CommonName
        );
        assert_eq!(CertLoginFrom::default(), CertLoginFrom::DistinguishedName);
    }
}

#[cfg(test)]
mod certificate_tests {
    use super::*;
    use crate::tls::test_certs::Ca;
    use rcgen::{DistinguishedName, DnType, DnValue};
    use rustls::pki_types::pem::PemObject;

    fn custom(oid: &[u64]) -> DnType {
        DnType::CustomDnType(oid.to_vec())
    }

    /// C, ST, L, O, OU, CN in the usual certificate order.
    pub(super) fn usual_subject() -> DistinguishedName {
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CountryName,
            DnValue::PrintableString("GB".try_into().unwrap()),
        );
        dn.push(DnType::StateOrProvinceName, "England");
        dn.push(DnType::LocalityName, "London");
        dn.push(DnType::OrganizationName, "Warren, Inc.");
        dn.push(DnType::OrganizationalUnitName, "Messaging");
        dn.push(DnType::CommonName, "client-1");
        dn
    }

    /// Every string type, types RabbitMQ names and types it does not, values to escape.
    pub(super) fn unusual_subject() -> DistinguishedName {
        let mut dn = DistinguishedName::new();
        let ia5 = |s: &str| DnValue::Ia5String(s.try_into().unwrap());
        dn.push(custom(&[0, 9, 2342, 19200300, 100, 1, 25]), ia5("com"));
        dn.push(
            custom(&[1, 2, 840, 113549, 1, 9, 1]),
            ia5("ops@example.com"),
        );
        dn.push(
            DnType::OrganizationName,
            DnValue::TeletexString("Teletex~Org".try_into().unwrap()),
        );
        dn.push(
            DnType::OrganizationalUnitName,
            DnValue::BmpString("Opérations".try_into().unwrap()),
        );
        dn.push(
            DnType::LocalityName,
            DnValue::UniversalString("Zürich".try_into().unwrap()),
        );
        dn.push(DnType::StateOrProvinceName, " #lead, \"q\" trail ");
        dn.push(custom(&[0, 9, 2342, 19200300, 100, 1, 1]), "uid-1");
        dn.push(custom(&[2, 5, 4, 9]), "1 Main St");
        dn.push(
            custom(&[2, 5, 4, 5]),
            DnValue::PrintableString("1234".try_into().unwrap()),
        );
        dn.push(
            custom(&[1, 2, 3, 4]),
            DnValue::PrintableString("known type".try_into().unwrap()),
        );
        dn.push(custom(&[1, 2, 3, 5]), ia5("foo"));
        dn.push(DnType::CommonName, "Ünïcode~name");
        dn.push(custom(&[2, 5, 4, 3]), "second-cn");
        dn
    }

    /// A client certificate with `dn` as its subject (one attribute per RDN, in push order).
    fn cert(dn: DistinguishedName) -> Vec<u8> {
        Ca::new("Warren DN CA").client_with_dn(dn).cert_der.to_vec()
    }

    fn one(ty: DnType, v: impl Into<DnValue>) -> Vec<u8> {
        let mut dn = DistinguishedName::new();
        dn.push(ty, v);
        cert(dn)
    }

    const DN: CertLoginFrom = CertLoginFrom::DistinguishedName;
    const CN: CertLoginFrom = CertLoginFrom::CommonName;

    // Every expected string below is what RabbitMQ 3.10.8's rabbit_cert_info (subject/1,
    // issuer/1, subject_items/2 joined as in rabbit_ssl) returns for a certificate with the
    // same subject; the code is unchanged in RabbitMQ 4.x.

    #[test]
    fn several_rdns_in_rabbitmq_order() {
        let der = cert(usual_subject());
        assert_eq!(
            cert_login_name(&der, DN).unwrap(),
            "CN=client-1,OU=Messaging,O=Warren\\, Inc.,L=London,ST=England,C=GB"
        );
        assert_eq!(cert_login_name(&der, CN).unwrap(), "client-1");
        assert_eq!(
            subject_dn(&der).unwrap(),
            cert_login_name(&der, DN).unwrap()
        );
        assert_eq!(issuer_dn(&der).unwrap(), "CN=Warren DN CA,O=Warren tests");
    }

    #[test]
    fn string_types_unknown_types_and_escapes() {
        let der = cert(unusual_subject());
        assert_eq!(
            cert_login_name(&der, DN).unwrap(),
            "CN=second-cn,CN=\\C3\\9Cn\\C3\\AFcode\\7Ename,1.2.3.5=\\<\\<22\\,3\\,102\\,111\\,111\\>\\>,\
             1.2.3.4=known type,SERIALNUMBER=1234,2.5.4.9=1 Main St,UID=uid-1,\
             ST=\\ #lead\\, \\\"q\\\" trail\\ ,L=Z\\C3\\BCrich,OU=Op\\C3\\A9rations,O=Teletex\\7EOrg,\
             EMAILADDRESS=ops@example.com,DC=com"
        );
        // common_name: every CN, unescaped, in certificate order.
        assert_eq!(cert_login_name(&der, CN).unwrap(), "Ünïcode~name,second-cn");
    }

    #[test]
    fn multi_valued_rdns_keep_certificate_order() {
        let pem = include_str!("../../tests/fixtures/multivalued-rdn.pem");
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let expected =
            "CN=client 2+EMAILADDRESS=c2@warren.example,OU=Ops+UID=ops1,O=Warren,DC=warren,DC=org";
        assert_eq!(cert_login_name(&der, DN).unwrap(), expected);
        assert_eq!(issuer_dn(&der).unwrap(), expected);
        assert_eq!(cert_login_name(&der, CN).unwrap(), "client 2");
    }

    #[test]
    fn values_erlang_decodes_leniently() {
        let c = |v: &str| one(DnType::CountryName, v);
        // UTF-8 country names and e-mail addresses become code points, escaped one by one.
        assert_eq!(subject_dn(&c("GB")).unwrap(), "C=GB");
        assert_eq!(subject_dn(&c("ÜÄ")).unwrap(), "C=\\DC\\C4");
        let email = DnType::CustomDnType(vec![1, 2, 840, 113549, 1, 9, 1]);
        assert_eq!(
            subject_dn(&one(email.clone(), "a@b")).unwrap(),
            "EMAILADDRESS=a@b"
        );
        assert_eq!(
            subject_dn(&one(email, "é@ā")).unwrap(),
            "EMAILADDRESS=\\E9@\\**"
        );
        let printable = |s: &str| DnValue::PrintableString(s.try_into().unwrap());
        assert_eq!(
            subject_dn(&one(DnType::CountryName, printable("GBR"))).unwrap(),
            "C=GBR"
        );
        let long = "x".repeat(70);
        assert_eq!(
            subject_dn(&one(DnType::CommonName, long.as_str())).unwrap(),
            format!("CN={long}")
        );
        // Types RabbitMQ has no name for print as dotted OIDs, UID in IA5 as a binary.
        let name = DnType::CustomDnType(vec![2, 5, 4, 41]);
        assert_eq!(subject_dn(&one(name, "nm")).unwrap(), "2.5.4.41=nm");
        let uid = DnType::CustomDnType(vec![0, 9, 2342, 19200300, 100, 1, 1]);
        let ia5 = DnValue::Ia5String("u".try_into().unwrap());
        assert_eq!(
            subject_dn(&one(uid, ia5)).unwrap(),
            "UID=\\<\\<22\\,1\\,117\\>\\>"
        );
        // An empty CN is a name, not a missing one.
        let empty = one(DnType::CommonName, "");
        assert_eq!(cert_login_name(&empty, DN).unwrap(), "CN=");
        assert_eq!(cert_login_name(&empty, CN).unwrap(), "");
    }

    #[test]
    fn values_erlang_cannot_decode_refuse_the_certificate() {
        let ia5 = |s: &str| DnValue::Ia5String(s.try_into().unwrap());
        let printable = |s: &str| DnValue::PrintableString(s.try_into().unwrap());
        let custom = |oid: &[u64]| DnType::CustomDnType(oid.to_vec());
        for der in [
            one(DnType::CommonName, ia5("ia5")),
            one(
                custom(&[0, 9, 2342, 19200300, 100, 1, 25]),
                printable("com"),
            ),
            one(custom(&[2, 5, 4, 46]), "q"),
            one(custom(&[2, 5, 4, 5]), "12"),
        ] {
            for from in [DN, CN] {
                let e = cert_login_name(&der, from).unwrap_err();
                assert!(matches!(e, CertLoginError::Malformed(_)), "{e:?}");
            }
        }
    }

    #[test]
    fn no_common_name_is_no_name_found() {
        let der = one(DnType::OrganizationName, "Warren");
        assert_eq!(cert_login_name(&der, CN), Err(CertLoginError::NoName));
        assert_eq!(CertLoginError::NoName.to_string(), "no name found");
        assert_eq!(cert_login_name(&der, DN).unwrap(), "O=Warren");
    }
}
