//! A node's identity in a certificate: the Kubernetes node name rules, the one URI SAN that
//! carries it (`spiffe://ferry.dev/node/<node>`), and reading it back from a certificate or
//! from an authenticated connection.

use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::{Error, Result};

/// What every node URI begins with; the node name follows.
pub const NODE_URI_PREFIX: &str = "spiffe://ferry.dev/node/";

/// Kubernetes' bound on a DNS subdomain, and so on a node name.
const MAX_NODE_NAME: usize = 253;

/// The URI SAN that names `node` in its certificate. The name is not checked here; signing
/// and reading a certificate do check it.
pub fn node_uri(node: &str) -> String {
    format!("{NODE_URI_PREFIX}{node}")
}

/// Checks that `node` is a Kubernetes node name: an RFC 1123 DNS subdomain as Kubernetes'
/// `IsDNS1123Subdomain` has it (lowercase alphanumerics, '-' and '.', each dot-separated part
/// beginning and ending with an alphanumeric, at most 253 bytes). Anything else could not be
/// a node, and a '/' or '#' would change what the URI means.
pub fn validate_node_name(node: &str) -> Result<()> {
    let refuse = |why| Error::NodeName {
        name: shorten(node),
        why,
    };
    if node.is_empty() {
        return Err(refuse("it is empty"));
    }
    if node.len() > MAX_NODE_NAME {
        return Err(refuse("it is longer than 253 bytes"));
    }
    for part in node.split('.') {
        dns_label_rules(part).map_err(|fault| {
            refuse(match fault {
                LabelFault::Empty => "it has an empty part between dots",
                LabelFault::Character => {
                    "it has a character other than a lowercase letter, a digit, '-' or '.'"
                }
                LabelFault::Hyphen => "a part begins or ends with '-'",
            })
        })?;
    }
    Ok(())
}

/// The first RFC 1123 DNS label rule a label breaks, in the order they are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LabelFault {
    /// It has no byte at all.
    Empty,
    /// It has a byte other than a lowercase ASCII letter, a digit or '-'.
    Character,
    /// It begins or ends with '-'.
    Hyphen,
}

/// Checks the rules a DNS label (a node name's dot-separated part, an install name) obeys
/// whatever its length bound: not empty, lowercase alphanumerics and '-' only, beginning and
/// ending with an alphanumeric. Each caller words the fault for its own kind of name.
pub(crate) fn dns_label_rules(label: &str) -> std::result::Result<(), LabelFault> {
    let bytes = label.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return Err(LabelFault::Empty);
    };
    if !bytes
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
    {
        return Err(LabelFault::Character);
    }
    if *first == b'-' || *last == b'-' {
        return Err(LabelFault::Hyphen);
    }
    Ok(())
}

/// The node a certificate names: its subject alternative names must be exactly one URI,
/// `spiffe://ferry.dev/node/<node>` with a valid node name. Anything more (a DNS name, an IP,
/// a second URI) is refused rather than ignored, so that a certificate never means two things.
pub fn node_of(cert_der: &CertificateDer<'_>) -> Result<String> {
    uri_san_of(cert_der, |why| Error::NotANode { why }, node_of_names)
}

/// Parses a certificate (nothing may follow it), reads its subject alternative names and
/// hands them to `parse`: the one reading of a certificate's URI SAN that node and peering
/// certificates share. What `parse` refuses, and a missing or unparsable SAN extension, is
/// `not_a(why)`; a certificate that does not parse is [`Error::Der`].
pub(crate) fn uri_san_of<T>(
    cert_der: &CertificateDer<'_>,
    not_a: fn(String) -> Error,
    parse: impl Fn(&[GeneralName<'_>]) -> std::result::Result<T, String>,
) -> Result<T> {
    let (rest, cert) = X509Certificate::from_der(cert_der).map_err(|e| Error::Der {
        what: "certificate",
        why: e.to_string(),
    })?;
    if !rest.is_empty() {
        return Err(Error::Der {
            what: "certificate",
            why: "bytes follow the certificate".into(),
        });
    }
    // Errors on a repeated SAN extension, which is what we want.
    let san = cert
        .subject_alternative_name()
        .map_err(|e| not_a(format!("its subject alternative names do not parse: {e}")))?
        .ok_or_else(|| not_a("it has no subject alternative name".into()))?;
    parse(&san.value.general_names).map_err(not_a)
}

/// The node that `names` (a certificate's or a CSR's SANs) name, or what they hold instead.
pub(crate) fn node_of_names(names: &[GeneralName<'_>]) -> std::result::Result<String, String> {
    match names {
        [GeneralName::URI(uri)] => {
            let node = uri
                .strip_prefix(NODE_URI_PREFIX)
                .ok_or_else(|| format!("its URI {uri:?} does not begin with {NODE_URI_PREFIX}"))?;
            validate_node_name(node).map_err(|e| e.to_string())?;
            Ok(node.to_owned())
        }
        _ => Err(format!("its names are [{}]", describe(names))),
    }
}

/// `names` for a message: each kind and value, long ones cut.
pub(crate) fn describe(names: &[GeneralName<'_>]) -> String {
    names
        .iter()
        .map(|n| shorten(&n.to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The node the first certificate of a PEM chain names (a node's own certificate).
pub fn node_of_pem(chain_pem: &str) -> Result<String> {
    first_of_pem("node certificate chain", chain_pem, node_of)
}

/// What `read` makes of the first certificate of the PEM chain `chain_pem` (`what`, in
/// errors).
pub(crate) fn first_of_pem<T>(
    what: &'static str,
    chain_pem: &str,
    read: impl Fn(&CertificateDer<'_>) -> Result<T>,
) -> Result<T> {
    let chain = crate::pem::certificates(what, chain_pem)?;
    match chain.first() {
        Some(leaf) => read(leaf),
        None => Err(crate::Error::Pem {
            what,
            label: "CERTIFICATE",
            why: "no CERTIFICATE block found".into(),
        }),
    }
}

/// The node of the authenticated peer of a connection made with [`crate::server_config`] or
/// [`crate::client_config`], from its end-entity certificate: on the server, the node that
/// connected; on the client, the node that answered (already checked to be the expected one).
/// Valid once the handshake has completed; rustls has verified the chain by then.
pub fn peer_node(conn: &rustls::CommonState) -> Result<String> {
    let end_entity = conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .ok_or(Error::NoPeerCertificate)?;
    node_of(end_entity)
}

/// `text` cut to a length a message can carry: names come from untrusted input.
pub(crate) fn shorten(text: &str) -> String {
    const KEEP: usize = 80;
    match text.char_indices().nth(KEEP) {
        Some((cut, _)) => format!("{}… ({} bytes)", &text[..cut], text.len()),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_not_a_node_message_names_the_uri_prefix() {
        let e = Error::NotANode { why: "none".into() }.to_string();
        assert!(e.contains(&format!("{NODE_URI_PREFIX}<node>")), "{e}");
    }

    #[test]
    fn node_names_follow_kubernetes_dns_subdomain_rules() {
        for good in [
            "node-a",
            "a",
            "0",
            "ip-10-0-0-1.ec2.internal",
            &"a".repeat(253),
        ] {
            assert!(validate_node_name(good).is_ok(), "{good:?} should pass");
        }
        for bad in [
            "",
            "Node_A",
            "NODE",
            "a/b",
            "a#b",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "a.-b",
            "é",
            &"a".repeat(254),
        ] {
            assert!(
                validate_node_name(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn the_node_uri_reads_back_as_its_node_and_nothing_else_does() {
        let uri = node_uri("node-a");
        assert_eq!(
            node_of_names(&[GeneralName::URI(&uri)]).as_deref(),
            Ok("node-a")
        );
        assert!(node_of_names(&[]).is_err());
        assert!(node_of_names(&[GeneralName::URI("spiffe://other.dev/node/node-a")]).is_err());
        assert!(node_of_names(&[GeneralName::URI(&node_uri("a/b"))]).is_err());
        assert!(node_of_names(&[GeneralName::DNSName("node-a")]).is_err());
        assert!(node_of_names(&[GeneralName::URI(&uri), GeneralName::URI(&uri)]).is_err());
    }
}
