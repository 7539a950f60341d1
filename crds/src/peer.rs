//! The `FerryPeer` resource: another Ferry install this one trusts for copies between
//! clusters (an admin's object, cluster-scoped), with its status (whether its CA bundle is
//! usable, and the fingerprint of each certificate in it), the reasons that status gives,
//! and the names of what an install publishes about itself for its peers' admins.
//!
//! Peering is off unless the chart turns it on (`peering.enabled`); with it off no
//! FerryPeer is looked at. See `docs/design/between-clusters.md`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The Secret, in the release namespace, that holds this install's peering CA (`tls.crt`,
/// `tls.key`) and its install name (`install`); made by the operator at its first start
/// with peering on, unless the admin names their own (`peering.caSecret`). Only the
/// operator reads it.
pub const PEERING_CA_SECRET: &str = "ferry-peering-ca";
/// The ConfigMap, in the release namespace, where the operator publishes what another
/// install's admin needs to trust this one: [`PEERING_INSTALL_KEY`], [`PEERING_CA_KEY`],
/// [`PEERING_FINGERPRINT_KEY`] and [`PEERING_PEER_KEY`].
pub const PEERING_CONFIGMAP: &str = "ferry-peering";
/// This install's name, as its peering certificates say it.
pub const PEERING_INSTALL_KEY: &str = "install";
/// This install's peering CA certificate (PEM).
pub const PEERING_CA_KEY: &str = "ca.crt";
/// Its SHA-256 fingerprint, as `openssl x509 -fingerprint -sha256` prints it: what two
/// admins compare before they trust each other's installs.
pub const PEERING_FINGERPRINT_KEY: &str = "fingerprint";
/// A `FerryPeer` for this install, ready for the other install's admin to apply.
pub const PEERING_PEER_KEY: &str = "ferrypeer.yaml";
/// The longest CA bundle a FerryPeer holds (a few certificates are a few KiB).
pub const MAX_PEER_BUNDLE: usize = 64 * 1024;

wire_enum! {
    /// Reasons of a FerryPeer's `Valid` condition.
    pub enum PeerReason {
        /// The bundle parses, every certificate in it is a CA, none has expired; copies
        /// with this install may use it.
        Valid,
        /// The bundle does not parse, is empty, or holds a certificate that is not a CA; the
        /// message says which and what to change.
        InvalidBundle,
        /// A certificate in the bundle has expired or is not valid yet: put the peer's
        /// current peering CA certificate in `caBundle`.
        Expired,
        /// An older FerryPeer names the same install (one object per install says how far
        /// it is trusted), or holds a CA certificate of this bundle (one install's CA would
        /// vouch for the other's nodes); delete one of them.
        DuplicatePeer,
        /// The FerryPeer names this install itself.
        OwnInstall,
    }
}

wire_enum! {
    /// Whether copies in one direction with a peer are allowed.
    #[derive(Default)]
    pub enum PeerAccess {
        /// Allowed (within what the exports and jobs say).
        #[default]
        Allow,
        /// Refused, whatever the exports and jobs say.
        Deny,
    }
}

/// Another Ferry install this one trusts, for copies between clusters: its name and its
/// peering CA certificate(s). One object per install. Its agents may read this install's
/// exports (`exports`) and jobs here may read its exports (`imports`), each only in the
/// namespaces `namespaces` selects, and only within what each export allows. Read by the
/// operator only when the chart turns peering on (`peering.enabled`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "FerryPeer",
    plural = "ferrypeers",
    shortname = "fpeer",
    status = "FerryPeerStatus",
    printcolumn = r#"{"name":"Install","type":"string","jsonPath":".spec.install"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Exports","type":"string","jsonPath":".spec.exports"}"#,
    printcolumn = r#"{"name":"Imports","type":"string","jsonPath":".spec.imports"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct FerryPeerSpec {
    /// The other install's name, as its peering certificates say it: the `install` key of
    /// its `ferry-peering` ConfigMap (in its release namespace). A DNS label.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("install is a DNS label (lowercase letters, digits and '-', starting and ending with a letter or digit): copy it from the peer's ferry-peering ConfigMap, key install"))]
    pub install: String,
    /// The other install's peering CA certificate(s), PEM: the `ca.crt` key of its
    /// `ferry-peering` ConfigMap. During a rotation of its CA, both certificates. Not its
    /// in-cluster transfer CA, which changes with every operator leader.
    #[schemars(length(min = 1, max = 65536))]
    #[x_kube(validation = Rule::new("self.contains('-----BEGIN CERTIFICATE-----')").message("caBundle holds PEM certificates (-----BEGIN CERTIFICATE-----): copy the ca.crt key of the peer's ferry-peering ConfigMap"))]
    pub ca_bundle: String,
    /// Whether the peer's agents may read this install's exports (default Allow).
    #[serde(default)]
    pub exports: PeerAccess,
    /// Whether jobs in this install may read the peer's exports (default Allow).
    #[serde(default)]
    pub imports: PeerAccess,
    /// Which of this install's namespaces may export to or import from the peer (default:
    /// all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<LabelSelector>,
}

/// One certificate of a FerryPeer's bundle, as admins compare it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeerCertificate {
    /// SHA-256 of the certificate, as `openssl x509 -fingerprint -sha256` prints it.
    pub fingerprint: String,
    /// Its subject.
    pub subject: String,
    /// When it expires.
    pub not_after: Time,
}

/// What the operator found in a FerryPeer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FerryPeerStatus {
    /// The generation of the spec this status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Valid`: whether copies with this install may use the bundle, with a reason from
    /// Valid, InvalidBundle, Expired, DuplicatePeer, OwnInstall.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Each certificate of the bundle (at most 16).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<PeerCertificate>,
}

/// The condition type of a FerryPeer's status.
pub const PEER_VALID: &str = "Valid";

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    #[test]
    fn every_peer_reason_is_explained_in_the_crd_schema() {
        let crd = serde_json::to_string(&FerryPeer::crd()).expect("serialize the CRD");
        for r in PeerReason::ALL {
            assert!(
                crd.contains(r.as_str()),
                "{r} is not in the CRD's descriptions"
            );
        }
    }

    #[test]
    fn a_peer_is_cluster_scoped_and_both_directions_default_to_allow() {
        let crd = FerryPeer::crd();
        assert_eq!(crd.spec.scope, "Cluster");
        let spec: FerryPeerSpec =
            serde_json::from_value(serde_json::json!({"install": "east", "caBundle": "x"}))
                .expect("a spec");
        assert_eq!(
            (spec.exports, spec.imports),
            (PeerAccess::Allow, PeerAccess::Allow)
        );
    }
}
