//! Reading the PEM text callers hand in: bounded before it is parsed, one label per input,
//! errors that name the input. Private to the crate.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateSigningRequestDer, PrivateKeyDer};

use crate::{Error, Result};

/// Refuses `text` if it is longer than `max` bytes, before anything parses it.
pub(crate) fn bounded(what: &'static str, text: &str, max: usize) -> Result<()> {
    if text.len() > max {
        return Err(Error::TooLarge {
            what,
            len: text.len(),
            max,
        });
    }
    Ok(())
}

/// Every `CERTIFICATE` block in `text`, in order (other labels are skipped, as openssl does).
pub(crate) fn certificates(what: &'static str, text: &str) -> Result<Vec<CertificateDer<'static>>> {
    CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(what, "CERTIFICATE", e))
}

/// The first private key in `text` (PKCS#8, SEC1 or PKCS#1).
pub(crate) fn private_key(what: &'static str, text: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(text.as_bytes()).map_err(|e| pem_error(what, "PRIVATE KEY", e))
}

/// The first `CERTIFICATE REQUEST` block in `text`.
pub(crate) fn csr(text: &str) -> Result<CertificateSigningRequestDer<'static>> {
    CertificateSigningRequestDer::from_pem_slice(text.as_bytes())
        .map_err(|e| pem_error("CSR", "CERTIFICATE REQUEST", e))
}

fn pem_error(what: &'static str, label: &'static str, e: rustls::pki_types::pem::Error) -> Error {
    let why = match e {
        rustls::pki_types::pem::Error::NoItemsFound => format!("no {label} block found"),
        other => other.to_string(),
    };
    Error::Pem { what, label, why }
}
