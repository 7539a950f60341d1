//! The trust bundle: the CA certificates whose node certificates an agent accepts, one CA
//! normally and two while the install's CA is rotated.

use std::sync::Arc;

use rustls::RootCertStore;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::{pem, Error, Result};

/// The largest bundle read. A handful of CA certificates is a few KiB; this bounds what a
/// corrupted ConfigMap can make an agent parse.
pub const MAX_BUNDLE_PEM: usize = 1024 * 1024;

/// The CA certificates an agent trusts, ready for rustls.
#[derive(Debug, Clone)]
pub struct Trust {
    pub(crate) roots: Arc<RootCertStore>,
}

impl Trust {
    /// Reads a bundle of one or more PEM CA certificates. Refuses a bundle over
    /// [`MAX_BUNDLE_PEM`], an empty one, and any certificate in it that is not a CA: a node
    /// certificate as a trust anchor would let its holder vouch for any node.
    pub fn from_pem(bundle_pem: &str) -> Result<Self> {
        pem::bounded("trust bundle", bundle_pem, MAX_BUNDLE_PEM)?;
        let certs = pem::certificates("trust bundle", bundle_pem)?;
        if certs.is_empty() {
            return Err(Error::EmptyBundle);
        }
        let mut roots = RootCertStore::empty();
        for der in certs {
            let (_, cert) = X509Certificate::from_der(&der).map_err(|e| Error::Der {
                what: "trust bundle certificate",
                why: e.to_string(),
            })?;
            if !cert.is_ca() {
                return Err(Error::NotCa {
                    what: "trust bundle certificate",
                    subject: format!(", subject {}", cert.subject()),
                });
            }
            roots.add(der).map_err(|e| Error::Der {
                what: "trust bundle certificate",
                why: e.to_string(),
            })?;
        }
        Ok(Self {
            roots: Arc::new(roots),
        })
    }

    /// How many CA certificates are trusted.
    pub fn len(&self) -> usize {
        self.roots.len()
    }

    /// Never true for a bundle that [`Trust::from_pem`] accepted.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }
}
