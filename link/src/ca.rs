//! The install's certificate authority and the nodes' keys: generating and loading the CA,
//! the agent's key and CSR, and signing a node's CSR into a node certificate or (by the
//! peering CA) a peering certificate, where the CA alone decides what the certificate says
//! (only the public key and the checked node name come from the CSR).

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber, SubjectPublicKeyInfo,
};
use ring::rand::{SecureRandom, SystemRandom};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{OID_PKCS9_EXTENSION_REQUEST, OID_X509_EXT_SUBJECT_ALT_NAME};
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::identity::{describe, node_of_names, node_uri, validate_node_name};
use crate::peering::{peer_uri, validate_install_name};
use crate::{pem, Error, Result};

/// How far in the past a node certificate's notBefore is put, so that a peer whose clock is a
/// little behind the operator's accepts a certificate signed a moment ago.
pub const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// The largest CSR PEM read. An ECDSA CSR is under 1 KiB; nothing larger is parsed.
pub const MAX_CSR_PEM: usize = 16 * 1024;

/// The CA's own lifetime: long, because rotating it takes a bundle update on every agent.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// The largest CA certificate or key PEM read by [`Ca::from_pem`].
const MAX_CA_PEM: usize = 64 * 1024;

/// X.520's bound on a common name.
const MAX_COMMON_NAME: usize = 64;

/// The install's certificate authority: its certificate and private key. Only the operator
/// holds one; agents see its certificate in the trust bundle.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    subject: String,
    not_after: SystemTime,
}

impl fmt::Debug for Ca {
    // Never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ca")
            .field("subject", &self.subject)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// A new self-signed CA named `common_name`: ECDSA P-256, `CA:true` with path length 0
    /// (it signs node certificates, never another CA), `keyCertSign` and `cRLSign`, valid
    /// from [`CLOCK_SKEW`] ago for ten years.
    pub fn generate(common_name: &str) -> Result<Ca> {
        if common_name.is_empty() || common_name.len() > MAX_COMMON_NAME {
            return Err(Error::CommonName {
                len: common_name.len(),
            });
        }
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(Error::Generate)?;
        let now = SystemTime::now();
        let not_after = later(now, CA_VALIDITY)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name_dn(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.not_before = earlier(now, CLOCK_SKEW).into();
        params.not_after = not_after.into();
        params.serial_number = Some(random_serial()?);
        let cert = params.self_signed(&key).map_err(Error::Generate)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            subject: format!("CN={common_name}"),
            not_after,
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA stored by the operator: its certificate (exactly one, a CA) and the PKCS#8 key
    /// that belongs to it.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca> {
        pem::bounded("CA certificate", cert_pem, MAX_CA_PEM)?;
        pem::bounded("CA private key", key_pem, MAX_CA_PEM)?;
        let certs = pem::certificates("CA certificate", cert_pem)?;
        let [der] = certs.as_slice() else {
            return Err(Error::Pem {
                what: "CA certificate",
                label: "CERTIFICATE",
                why: format!("{} CERTIFICATE blocks, where one is expected", certs.len()),
            });
        };
        let (_, cert) = X509Certificate::from_der(der).map_err(|e| Error::Der {
            what: "CA certificate",
            why: e.to_string(),
        })?;
        if !cert.is_ca() {
            return Err(Error::NotCa {
                what: "CA certificate",
                subject: format!(", subject {}", cert.subject()),
            });
        }
        // rcgen parses the key's PEM itself; a PEM error is reported like any other.
        let key = KeyPair::from_pem(key_pem).map_err(Error::CaKey)?;
        if key.public_key_raw() != cert.public_key().subject_public_key.data.as_ref() {
            return Err(Error::KeyMismatch {
                what: "CA certificate",
            });
        }
        let not_after = UNIX_EPOCH
            .checked_add(Duration::from_secs(
                u64::try_from(cert.validity().not_after.timestamp()).unwrap_or(0),
            ))
            .unwrap_or(UNIX_EPOCH);
        let subject = cert.subject().to_string();
        let issuer = Issuer::from_ca_cert_der(der, key).map_err(|e| Error::Der {
            what: "CA certificate",
            why: e.to_string(),
        })?;
        Ok(Ca {
            issuer,
            cert_pem: cert_pem.trim().to_owned() + "\n",
            subject,
            not_after,
        })
    }

    /// The CA certificate, PEM: what goes into the agents' trust bundle.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, PKCS#8 PEM: for the operator's Secret, nowhere else.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Signs `node`'s CSR: a certificate valid from [`CLOCK_SKEW`] ago until `validity` from
    /// now. See [`Ca::sign_node_at`] for what is checked and what the certificate says.
    pub fn sign_node(&self, csr_pem: &str, node: &str, validity: Duration) -> Result<String> {
        let (not_before, not_after) = window(validity)?;
        self.sign_node_at(csr_pem, node, not_before, not_after)
    }

    /// Signs `node`'s CSR into a peering certificate of `install`, for connections between
    /// installs: called on the install's peering CA, never its transfer CA. The CSR is the
    /// one [`NodeKey::generate`] makes (it requests [`node_uri`]`(node)`, checked exactly as
    /// [`Ca::sign_node_at`] checks it), so that an agent needs no second kind of request; the
    /// certificate's one URI SAN is [`crate::peer_uri`]`(install, node)` instead, and every
    /// other rule (extensions, lifetime from [`CLOCK_SKEW`] ago until `validity` from now, not
    /// past the CA's own expiry) is `sign_node`'s. Refused as well: an `install` that is not
    /// an install name ([`crate::validate_install_name`]).
    pub fn sign_peer(
        &self,
        csr_pem: &str,
        install: &str,
        node: &str,
        validity: Duration,
    ) -> Result<String> {
        validate_install_name(install)?;
        validate_node_name(node)?;
        let (not_before, not_after) = window(validity)?;
        self.sign_at(
            csr_pem,
            node,
            peer_uri(install, node),
            not_before,
            not_after,
        )
    }

    /// Signs `node`'s CSR with an explicit validity period. [`Ca::sign_node`] is what the
    /// operator calls; this exists so that tests can make certificates that are expired or not
    /// yet valid.
    ///
    /// Refused: a node name that is not one, a PEM over [`MAX_CSR_PEM`] (before parsing), a CSR
    /// that does not parse or whose self-signature does not verify, a CSR whose requested SANs
    /// are anything but exactly the one URI [`node_uri`]`(node)`, a key rcgen cannot place in
    /// a certificate, `not_after` not after `not_before`, and `not_after` past the CA's own.
    ///
    /// Everything else the CSR requests (its subject, basic constraints, key usages, other
    /// extensions) is ignored: the certificate says `CN=<node>`, the one URI SAN, CA:false,
    /// `digitalSignature`, serverAuth + clientAuth, with a random serial.
    pub fn sign_node_at(
        &self,
        csr_pem: &str,
        node: &str,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<String> {
        validate_node_name(node)?;
        self.sign_at(csr_pem, node, node_uri(node), not_before, not_after)
    }

    /// What [`Ca::sign_node_at`] and [`Ca::sign_peer`] share: `csr_pem` checked to request
    /// exactly [`node_uri`]`(node)` (`node` already validated), signed into a certificate
    /// whose one SAN is `uri`. The URI is the only thing the two kinds differ in, so that a
    /// rule added for one cannot be forgotten for the other.
    fn sign_at(
        &self,
        csr_pem: &str,
        node: &str,
        uri: String,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<String> {
        pem::bounded("CSR", csr_pem, MAX_CSR_PEM)?;
        let der = pem::csr(csr_pem)?;
        let (rest, csr) = X509CertificationRequest::from_der(&der).map_err(|e| Error::Der {
            what: "CSR",
            why: e.to_string(),
        })?;
        if !rest.is_empty() {
            return Err(Error::Der {
                what: "CSR",
                why: "bytes follow the request".into(),
            });
        }
        csr.verify_signature()
            .map_err(|e| Error::CsrSignature { why: e.to_string() })?;
        let requested = requested_names(&csr)?;
        if node_of_names(&requested).as_deref() != Ok(node) {
            return Err(Error::CsrNames {
                expected: node_uri(node),
                requested: describe(&requested),
            });
        }
        let public_key =
            SubjectPublicKeyInfo::from_der(csr.certification_request_info.subject_pki.raw)
                .map_err(|e| Error::CsrKey { why: e.to_string() })?;
        if not_after <= not_before {
            return Err(Error::Validity {
                why: "until before it begins".into(),
                fix: "ask for notAfter after notBefore",
            });
        }
        if not_after > self.not_after {
            return Err(Error::Validity {
                why: format!("past the CA's own expiry ({:?})", self.not_after),
                fix: "rotate the CA (a new CA in the bundle beside this one) and sign with the new one",
            });
        }

        let mut params = CertificateParams::default();
        params.distinguished_name = common_name_dn(node);
        let uri = uri
            .try_into()
            .map_err(|e: rcgen::Error| Error::Generate(e))?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        // Written out rather than left absent, so that no reader has to assume.
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        params.serial_number = Some(random_serial()?);
        // Tells verifiers which CA signed it when two CAs of a rotation share a name.
        params.use_authority_key_identifier_extension = true;
        let cert = params
            .signed_by(&public_key, &self.issuer)
            .map_err(Error::Generate)?;
        Ok(cert.pem())
    }
}

/// A node's private key and its CSR, made by the agent at start (and at each renewal). The
/// key stays in the agent's memory; the CSR goes to the operator.
pub struct NodeKey {
    /// The ECDSA P-256 private key, PKCS#8 PEM.
    pub key_pem: String,
    /// The CSR for the node's URI, PEM, signed by `key_pem`.
    pub csr_pem: String,
}

impl fmt::Debug for NodeKey {
    // Never the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeKey")
            .field("csr_pem", &self.csr_pem)
            .finish_non_exhaustive()
    }
}

impl NodeKey {
    /// A fresh ECDSA P-256 key and a CSR requesting `CN=<node>` and the one URI SAN
    /// [`node_uri`]`(node)`, as [`Ca::sign_node`] accepts.
    pub fn generate(node: &str) -> Result<NodeKey> {
        validate_node_name(node)?;
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(Error::Generate)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name_dn(node);
        let uri = node_uri(node)
            .try_into()
            .map_err(|e: rcgen::Error| Error::Generate(e))?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        let csr = params.serialize_request(&key).map_err(Error::Generate)?;
        Ok(NodeKey {
            key_pem: key.serialize_pem(),
            csr_pem: csr.pem().map_err(Error::Generate)?,
        })
    }
}

/// Every subject alternative name the CSR requests, across all its extension requests (a CSR
/// may carry more than one; a name hidden in a second must not go unseen).
fn requested_names<'a>(csr: &'a X509CertificationRequest<'_>) -> Result<Vec<GeneralName<'a>>> {
    let malformed = |why: &str| Error::Der {
        what: "CSR",
        why: why.to_owned(),
    };
    let mut names = Vec::new();
    for attribute in csr.certification_request_info.iter_attributes() {
        if attribute.oid != OID_PKCS9_EXTENSION_REQUEST {
            continue;
        }
        let ParsedCriAttribute::ExtensionRequest(request) = attribute.parsed_attribute() else {
            return Err(malformed("its extension request does not parse"));
        };
        for extension in &request.extensions {
            if extension.oid != OID_X509_EXT_SUBJECT_ALT_NAME {
                continue;
            }
            let ParsedExtension::SubjectAlternativeName(san) = extension.parsed_extension() else {
                return Err(malformed("its subject alternative names do not parse"));
            };
            names.extend(san.general_names.iter().cloned());
        }
    }
    Ok(names)
}

fn common_name_dn(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// A positive 16-byte random serial: unique per certificate, unlike rcgen's default (a hash of the
/// public key), which would repeat when a key is signed twice.
fn random_serial() -> Result<SerialNumber> {
    let mut bytes = [0u8; 16];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| Error::Random)?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

/// The validity of a certificate signed now for `validity`: from [`CLOCK_SKEW`] ago until
/// `validity` from now.
fn window(validity: Duration) -> Result<(SystemTime, SystemTime)> {
    if validity.is_zero() {
        return Err(Error::Validity {
            why: "for no time".into(),
            fix: "ask for a positive validity (node certificates live 24 hours)",
        });
    }
    let now = SystemTime::now();
    Ok((earlier(now, CLOCK_SKEW), later(now, validity)?))
}

fn earlier(t: SystemTime, by: Duration) -> SystemTime {
    t.checked_sub(by).unwrap_or(UNIX_EPOCH)
}

fn later(t: SystemTime, by: Duration) -> Result<SystemTime> {
    t.checked_add(by).ok_or_else(|| Error::Validity {
        why: format!("for {by:?}"),
        fix: "ask for a validity of days, not centuries",
    })
}
