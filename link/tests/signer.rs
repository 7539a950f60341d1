//! What the install's CA signs and what it refuses, what a signed node certificate says
//! whatever its CSR asked for, and which trust bundles and CA files are accepted.

use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use ferry_link::{node_of, node_uri, Ca, Error, NodeKey, Trust, CLOCK_SKEW, MAX_CSR_PEM};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// A CSR for `sans`, made with rcgen the way any client could, CA:true if `ca`.
fn csr(sans: Vec<SanType>, ca: bool) -> Result<String> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.subject_alt_names = sans;
    if ca {
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    }
    Ok(params.serialize_request(&key)?.pem()?)
}

fn uri(node: &str) -> Result<SanType> {
    Ok(SanType::URI(node_uri(node).try_into()?))
}

fn der(cert_pem: &str) -> Result<CertificateDer<'static>> {
    Ok(CertificateDer::from_pem_slice(cert_pem.as_bytes())?)
}

/// The CSR names are refused, with a message that says which URI was expected.
fn assert_names_refused(ca: &Ca, csr_pem: &str, node: &str) {
    match ca.sign_node(csr_pem, node, DAY) {
        Err(e @ Error::CsrNames { .. }) => {
            assert!(e.to_string().contains(&node_uri(node)), "{e}");
        }
        other => panic!("expected a refusal of the CSR's names, got {other:?}"),
    }
}

#[test]
fn the_ca_signs_a_nodes_own_csr_and_the_certificate_names_that_node() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let key = NodeKey::generate("node-a")?;
    let cert = ca.sign_node(&key.csr_pem, "node-a", DAY)?;
    assert_eq!(node_of(&der(&cert)?)?, "node-a");
    Ok(())
}

#[test]
fn the_signer_refuses_a_csr_for_another_nodes_uri() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let theirs = NodeKey::generate("node-b")?;
    assert_names_refused(&ca, &theirs.csr_pem, "node-a");
    Ok(())
}

#[test]
fn the_signer_refuses_a_csr_with_an_extra_dns_name() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let csr = csr(
        vec![uri("node-a")?, SanType::DnsName("node-a".try_into()?)],
        false,
    )?;
    assert_names_refused(&ca, &csr, "node-a");
    Ok(())
}

#[test]
fn the_signer_refuses_a_csr_with_two_uris() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let csr = csr(vec![uri("node-a")?, uri("node-b")?], false)?;
    assert_names_refused(&ca, &csr, "node-a");
    // Even the same URI twice: a certificate must mean one thing.
    let csr = csr_twice("node-a")?;
    assert_names_refused(&ca, &csr, "node-a");
    Ok(())
}

fn csr_twice(node: &str) -> Result<String> {
    csr(vec![uri(node)?, uri(node)?], false)
}

#[test]
fn the_signer_refuses_a_csr_without_a_name() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    assert_names_refused(&ca, &csr(vec![], false)?, "node-a");
    Ok(())
}

#[test]
fn the_signer_refuses_a_csr_altered_after_it_was_signed() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let key = NodeKey::generate("node-a")?;
    let mut der = pem::parse(&key.csr_pem)?.into_contents();
    // The subject's common name, inside the signed part: the DER still parses, the signature
    // no longer matches.
    let at = der
        .windows(b"node-a".len())
        .position(|w| w == b"node-a")
        .context("the CSR carries its node name")?;
    der[at + 5] = b'b';
    let tampered = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der));
    match ca.sign_node(&tampered, "node-a", DAY) {
        Err(Error::CsrSignature { .. }) => Ok(()),
        other => bail!("expected a signature refusal, got {other:?}"),
    }
}

#[test]
fn the_signer_refuses_an_oversize_pem_before_parsing_it() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let key = NodeKey::generate("node-a")?;
    // A valid CSR behind padding that a PEM reader would skip: only the size refuses it.
    let padded = format!("{}\n{}", " ".repeat(MAX_CSR_PEM), key.csr_pem);
    match ca.sign_node(&padded, "node-a", DAY) {
        Err(Error::TooLarge { max, .. }) => assert_eq!(max, MAX_CSR_PEM),
        other => bail!("expected a size refusal, got {other:?}"),
    }
    // The same CSR unpadded is fine: the size was the reason.
    ca.sign_node(&key.csr_pem, "node-a", DAY)?;
    Ok(())
}

#[test]
fn the_signer_refuses_names_that_are_not_kubernetes_node_names() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let long = "a".repeat(254);
    for bad in ["Node_A", "", long.as_str(), "a/b"] {
        // The CSR asks for exactly that name, so only the name rule can refuse it.
        let csr = csr(vec![SanType::URI(node_uri(bad).try_into()?)], false)?;
        match ca.sign_node(&csr, bad, DAY) {
            Err(Error::NodeName { .. }) => {}
            other => bail!("{bad:?}: expected a node name refusal, got {other:?}"),
        }
        assert!(matches!(
            NodeKey::generate(bad),
            Err(Error::NodeName { .. })
        ));
    }
    let ok = "a".repeat(253);
    ca.sign_node(&NodeKey::generate(&ok)?.csr_pem, &ok, DAY)?;
    Ok(())
}

#[test]
fn a_csr_asking_to_be_a_ca_still_gets_a_node_certificate() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let csr = csr(vec![uri("node-a")?], true)?;
    let before = SystemTime::now();
    let pem = ca.sign_node(&csr, "node-a", DAY)?;
    let der = der(&pem)?;
    let (_, cert) = X509Certificate::from_der(&der)?;

    let constraints = cert
        .basic_constraints()?
        .context("basic constraints are written out")?;
    assert!(!constraints.value.ca, "CA:false whatever the CSR asked");
    assert!(!cert.is_ca());
    let usage = cert.key_usage()?.context("key usage is set")?.value;
    assert!(usage.digital_signature());
    assert!(!usage.key_cert_sign());
    let eku = cert.extended_key_usage()?.context("EKU is set")?.value;
    assert!(eku.server_auth && eku.client_auth && !eku.any);
    let san = cert.subject_alternative_name()?.context("a SAN")?.value;
    assert_eq!(
        san.general_names,
        vec![GeneralName::URI(&node_uri("node-a"))]
    );

    let not_before = cert.validity().not_before.timestamp();
    let not_after = cert.validity().not_after.timestamp();
    let now = before.duration_since(SystemTime::UNIX_EPOCH)?.as_secs() as i64;
    let skew = CLOCK_SKEW.as_secs() as i64;
    assert!(
        (now - skew - 5..=now - skew + 5).contains(&not_before),
        "notBefore {not_before}, now {now}"
    );
    let day = DAY.as_secs() as i64;
    assert!(
        (now + day - 5..=now + day + 5).contains(&not_after),
        "notAfter {not_after}, now {now}"
    );
    Ok(())
}

#[test]
fn two_certificates_for_the_same_key_get_different_serials() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let key = NodeKey::generate("node-a")?;
    let one = der(&ca.sign_node(&key.csr_pem, "node-a", DAY)?)?;
    let two = der(&ca.sign_node(&key.csr_pem, "node-a", DAY)?)?;
    let (_, one) = X509Certificate::from_der(&one)?;
    let (_, two) = X509Certificate::from_der(&two)?;
    assert_ne!(one.raw_serial(), two.raw_serial());
    Ok(())
}

#[test]
fn node_of_refuses_a_certificate_with_a_dns_name_beside_its_uri() -> Result<()> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![uri("node-a")?, SanType::DnsName("node-a".try_into()?)];
    let cert = params.self_signed(&key)?;
    assert!(matches!(node_of(cert.der()), Err(Error::NotANode { .. })));
    params.subject_alt_names = vec![uri("node-a")?];
    assert_eq!(node_of(params.self_signed(&key)?.der())?, "node-a");
    Ok(())
}

#[test]
fn a_trust_bundle_must_hold_at_least_one_certificate() -> Result<()> {
    assert!(matches!(Trust::from_pem(""), Err(Error::EmptyBundle)));
    let key = NodeKey::generate("node-a")?;
    // PEM, but no certificate in it.
    assert!(matches!(
        Trust::from_pem(&key.key_pem),
        Err(Error::EmptyBundle)
    ));
    Ok(())
}

#[test]
fn a_trust_bundle_refuses_a_node_certificate_even_beside_a_ca() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let key = NodeKey::generate("node-a")?;
    let node_cert = ca.sign_node(&key.csr_pem, "node-a", DAY)?;
    assert!(matches!(
        Trust::from_pem(&node_cert),
        Err(Error::NotCa { .. })
    ));
    let mixed = format!("{}{}", ca.cert_pem(), node_cert);
    assert!(matches!(Trust::from_pem(&mixed), Err(Error::NotCa { .. })));
    assert_eq!(Trust::from_pem(ca.cert_pem())?.len(), 1);
    Ok(())
}

#[test]
fn a_stored_ca_loads_back_and_signs_only_with_its_own_key() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let other = Ca::generate("ferry install CA")?;
    let loaded = Ca::from_pem(ca.cert_pem(), &ca.key_pem())?;
    assert_eq!(loaded.cert_pem(), ca.cert_pem());

    // A certificate signed by the reloaded CA chains to the original's certificate.
    let key = NodeKey::generate("node-a")?;
    let cert_pem = loaded.sign_node(&key.csr_pem, "node-a", DAY)?;
    let (cert_der, issuer_der) = (der(&cert_pem)?, der(ca.cert_pem())?);
    let (_, cert) = X509Certificate::from_der(&cert_der)?;
    let (_, issuer) = X509Certificate::from_der(&issuer_der)?;
    cert.verify_signature(Some(issuer.public_key()))?;

    match Ca::from_pem(ca.cert_pem(), &other.key_pem()) {
        Err(Error::KeyMismatch { .. }) => {}
        other => bail!("expected a key mismatch, got {other:?}"),
    }
    match Ca::from_pem(&cert_pem, &key.key_pem) {
        Err(Error::NotCa { .. }) => {}
        other => bail!("a node certificate loaded as a CA: {other:?}"),
    }
    Ok(())
}

#[test]
fn the_signer_refuses_a_validity_past_its_own() -> Result<()> {
    let ca = Ca::generate("ferry install CA")?;
    let key = NodeKey::generate("node-a")?;
    let refused = ca.sign_node(&key.csr_pem, "node-a", 20 * 365 * DAY);
    assert!(
        matches!(refused, Err(Error::Validity { .. })),
        "{refused:?}"
    );
    let refused = ca.sign_node(&key.csr_pem, "node-a", Duration::ZERO);
    assert!(
        matches!(refused, Err(Error::Validity { .. })),
        "{refused:?}"
    );
    Ok(())
}
