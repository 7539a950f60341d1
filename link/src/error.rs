//! Why a name, a CSR, a certificate, a bundle or a TLS configuration was refused. Each message
//! says what is wrong and what to change; none carries key material.

/// Everything this crate refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Not a Kubernetes node name.
    #[error(
        "{name:?} is not a Kubernetes node name ({why}); a node name is an RFC 1123 DNS \
         subdomain: lowercase letters, digits, '-' and '.', beginning and ending with a letter \
         or digit, at most 253 bytes"
    )]
    NodeName {
        /// The name as given (cut to a readable length).
        name: String,
        /// The first rule it breaks.
        why: &'static str,
    },

    /// A PEM input larger than this crate reads.
    #[error(
        "the {what} is {len} bytes of PEM, more than the {max} accepted; pass only the {what}"
    )]
    TooLarge {
        /// What the input was meant to be.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },

    /// PEM text without the expected block, or with a block that does not decode.
    #[error("the {what} is not valid PEM ({why}); pass the PEM text that begins with -----BEGIN {label}-----")]
    Pem {
        /// What the input was meant to be.
        what: &'static str,
        /// The PEM label expected.
        label: &'static str,
        /// What the PEM reader said.
        why: String,
    },

    /// DER inside the PEM that does not parse.
    #[error("the {what} does not parse ({why}); pass a certificate or request as PEM, unaltered")]
    Der {
        /// What the input was meant to be.
        what: &'static str,
        /// What the parser said.
        why: String,
    },

    /// A CSR whose self-signature does not verify: altered, or not signed by its own key.
    #[error(
        "the CSR's signature does not verify with the key it carries ({why}): it was altered \
         or signed by another key; generate a fresh key and CSR on the node"
    )]
    CsrSignature {
        /// What the verifier said.
        why: String,
    },

    /// A CSR that asks for other names than its node's one URI.
    #[error(
        "a node CSR must request exactly one subject alternative name, the URI {expected}, and \
         this one requests [{requested}]; generate the CSR for the node the agent runs on, \
         with no other names"
    )]
    CsrNames {
        /// The one URI the CSR should request.
        expected: String,
        /// What it requests, in order.
        requested: String,
    },

    /// A CSR whose public key this CA does not sign.
    #[error("the CSR's public key is of a kind this CA does not sign ({why}); use ECDSA P-256, P-384 or Ed25519")]
    CsrKey {
        /// What the key parser said.
        why: String,
    },

    /// A validity this CA does not grant.
    #[error("cannot sign a certificate valid {why}; {fix}")]
    Validity {
        /// What is wrong with the requested validity.
        why: String,
        /// What to change.
        fix: &'static str,
    },

    /// A certificate that does not name exactly one node by URI.
    #[error(
        "the certificate does not name one Ferry node ({why}); a node certificate carries \
         exactly one subject alternative name, the URI spiffe://ferry.dev/node/<node>, as \
         Ca::sign_node writes it (identity's NODE_URI_PREFIX: a test there checks this says it)"
    )]
    NotANode {
        /// What the certificate carries instead.
        why: String,
    },

    /// A server that is another node than the one dialled.
    #[error(
        "the server is node {presented:?}, not the node {expected:?} this connection was \
         meant for; dial the agent of {expected:?} (its pod IP may have moved to another node)"
    )]
    WrongNode {
        /// The node the client dialled.
        expected: String,
        /// The node the server's certificate names.
        presented: String,
    },

    /// A certificate given as a CA that is not one.
    #[error(
        "the {what} is not a CA certificate (basicConstraints CA:true is missing){subject}; \
         pass CA certificates only (Ca::cert_pem), never node certificates"
    )]
    NotCa {
        /// Where the certificate came from.
        what: &'static str,
        /// Its subject, for finding it in a bundle (empty or `", subject …"`).
        subject: String,
    },

    /// A bundle with no certificate.
    #[error("the trust bundle holds no certificate; pass at least the install CA's certificate (Ca::cert_pem)")]
    EmptyBundle,

    /// A private key that does not belong to the certificate it came with.
    #[error("the private key does not match the {what}'s public key; pass the key that was generated with it")]
    KeyMismatch {
        /// The certificate it was meant for.
        what: &'static str,
    },

    /// A CA name that cannot be a certificate's common name.
    #[error("a CA common name must be 1 to 64 bytes, and this one is {len}; use a short name such as \"ferry install CA\"")]
    CommonName {
        /// Its length.
        len: usize,
    },

    /// The system's random number generator failed.
    #[error("the system random number generator failed; check that the kernel's getrandom works in this container")]
    Random,

    /// A private key rcgen cannot use.
    #[error("the CA private key is not usable ({0}); pass the PKCS#8 PEM written by Ca::key_pem")]
    CaKey(rcgen::Error),

    /// rcgen failed to build or sign a certificate or request.
    #[error(
        "could not build the certificate ({0}); this is a bug in ferry-link or rcgen, report it"
    )]
    Generate(rcgen::Error),

    /// A connection that has no authenticated peer certificate.
    #[error(
        "the connection has no peer certificate: ask for the peer's node only after the \
         handshake completed, on a connection made with server_config or client_config (or \
         their peering_ forms)"
    )]
    NoPeerCertificate,

    /// Not a Ferry install name.
    #[error(
        "{name:?} is not a Ferry install name ({why}); an install name is an RFC 1123 DNS \
         label: 1 to 63 lowercase letters, digits and '-', beginning and ending with a letter \
         or digit"
    )]
    InstallName {
        /// The name as given (cut to a readable length).
        name: String,
        /// The first rule it breaks.
        why: &'static str,
    },

    /// A certificate that does not name exactly one node of one install by URI.
    #[error(
        "the certificate does not name one node of a Ferry install ({why}); a peering \
         certificate carries exactly one subject alternative name, the URI \
         spiffe://ferry.dev/install/<install>/node/<node>, as Ca::sign_peer writes it \
         (peering's PEER_URI_PREFIX: a test there checks this says it)"
    )]
    NotAPeer {
        /// What the certificate carries instead.
        why: String,
    },

    /// A peering server that belongs to another install than the one dialled.
    #[error(
        "the server is a node of install {presented:?}, not of {expected:?} that this \
         connection was meant for; dial the address the export of {expected:?} gives, and \
         check that its CA is not shared with {presented:?}"
    )]
    WrongInstall {
        /// The install the client meant to reach.
        expected: String,
        /// The install the server's certificate names.
        presented: String,
    },

    /// A peering client from an install this one does not trust.
    #[error(
        "install {install:?} is not among the peers this install trusts; an admin of this \
         install adds it, with its peering CA bundle, before its agents can connect"
    )]
    UnknownPeer {
        /// The install the client's certificate names.
        install: String,
    },

    /// The same install twice in a peer set.
    #[error(
        "install {install:?} is listed twice among the peers; give each install one entry, \
         with all its peering CA certificates in one bundle"
    )]
    DuplicatePeer {
        /// The install listed twice.
        install: String,
    },

    /// More peers than a peer set holds.
    #[error("{count} peer installs are listed, more than the {max} accepted; remove peers no longer used")]
    TooManyPeers {
        /// How many were given.
        count: usize,
        /// The bound.
        max: usize,
    },

    /// Two peers trusting the same CA key, which would let either speak for the other.
    #[error(
        "peer installs {first:?} and {second:?} have a CA key in common, so a node of either \
         could claim to be the other; each install has its own peering CA: remove the shared \
         certificate from the bundle of the install it does not belong to"
    )]
    SharedPeerCa {
        /// The install listed first.
        first: String,
        /// The install listed later.
        second: String,
    },

    /// A peer's CA bundle that a trust bundle could not be.
    #[error("the peering CA bundle of install {install:?} is refused: {source}")]
    PeerBundle {
        /// The peer install the bundle was given for.
        install: String,
        /// Why the bundle was refused.
        source: Box<Error>,
    },

    /// An export's CA that a trust bundle could not be.
    #[error("the peering CA in the export is refused: {0}")]
    ExportCa(#[source] Box<Error>),

    /// rustls refused a configuration (certificate chain, key, versions).
    #[error("rustls refused the TLS configuration ({0}); check that the certificate chain and key belong together")]
    Tls(#[from] rustls::Error),

    /// rustls refused to build the client-certificate verifier from the bundle.
    #[error("cannot verify client certificates with this trust bundle ({0}); pass a bundle of CA certificates")]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
