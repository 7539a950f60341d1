//! The `CopyExport` resource: a tenant's consent, in the source cluster, that named readers
//! of trusted peer installs may read one claim or root path of its namespace, read-only,
//! until a time; its status (whether it is served, and the SHA-256 of each credential the
//! agents accept); the reasons that status gives; and the shape of the export Secret the
//! operator writes beside it, which the tenant carries to the reading cluster.
//!
//! The operator writes the Secret and never reads it back: the credential's hash in the
//! status is what the source's agents check a presented credential against, so no agent
//! reads a Secret and the operator reads no tenant's Secret. See
//! `docs/design/between-clusters.md`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The export Secret's type: the `-exports` admission policy lets the operator write no
/// Secret of another type outside its own namespaces.
pub const EXPORT_SECRET_TYPE: &str = "ferry.dev/export";
/// What an export's Secret is named after it: `<export>-ferry-export`.
pub const EXPORT_SECRET_SUFFIX: &str = "-ferry-export";
/// The longest export name whose Secret name is still a valid name (253).
pub const MAX_EXPORT_NAME: usize = 253 - EXPORT_SECRET_SUFFIX.len();
/// The export Secret's keys: the source install's name (as its peering certificates say
/// it) ...
pub const EXPORT_INSTALL_KEY: &str = "install";
/// ... the export's uid ...
pub const EXPORT_UID_KEY: &str = "export";
/// ... the credential (32 random bytes) ...
pub const EXPORT_CREDENTIAL_KEY: &str = "credential";
/// ... the source install's peering CA certificate (PEM), which the reader's server
/// certificate must chain to (and which a FerryPeer of the reading cluster must hold) ...
pub const EXPORT_CA_KEY: &str = "ca.crt";
/// ... when the export expires (RFC 3339), as the source said when it wrote the Secret ...
pub const EXPORT_EXPIRES_KEY: &str = "expires";
/// ... and where readers dial (`host:port`): the peering port of an agent of a node that
/// has the source, as that agent advertises it.
pub const EXPORT_ADDRESS_KEY: &str = "address";
/// Every key an export Secret has, and no other.
pub const EXPORT_SECRET_KEYS: [&str; 6] = [
    EXPORT_INSTALL_KEY,
    EXPORT_UID_KEY,
    EXPORT_CREDENTIAL_KEY,
    EXPORT_CA_KEY,
    EXPORT_EXPIRES_KEY,
    EXPORT_ADDRESS_KEY,
];
/// Annotation on an agent's heartbeat Lease: where its peering port is reached
/// (`<address>:<port>`), what an export's Secret tells readers to dial.
pub const PEERING_ADDRESS_ANNOTATION: &str = "ferry.dev/peering-address";
/// The label naming the export (by uid) on its Secret.
pub const EXPORT_LABEL: &str = "ferry.dev/export";
/// Most readers an export names.
pub const MAX_EXPORT_READERS: usize = 16;

/// The export Secret of export `name`.
pub fn export_secret_name(name: &str) -> String {
    format!("{name}{EXPORT_SECRET_SUFFIX}")
}

wire_enum! {
    /// Reasons of a CopyExport's `Ready` condition.
    pub enum ExportReason {
        /// Served: the Secret holds the current credential and readers may use it until the
        /// export expires.
        Ready,
        /// This install's admin has not turned peering on (the chart's `peering.enabled`):
        /// nothing of this cluster can be read from another. Ask them.
        PeeringOff,
        /// The claim or StorageRoot named in `spec.source` is not there, not bound, or not
        /// open to this namespace; the message says which.
        SourceNotFound,
        /// A reader names a FerryPeer that does not exist, is not Valid, refuses exports
        /// (`exports: Deny`) or does not admit this namespace (its `namespaces`); the
        /// message says which.
        PeerNotTrusted,
        /// The export's time is over (`expires`, or `ttl` since the spec last changed): set a
        /// later `expires`, or change the spec (bump `renew`) to count `ttl` again.
        Expired,
        /// `expires` or `ttl` reaches beyond this install's longest export
        /// (`peering.maxExportTtl`); the message says how long that is.
        TooLong,
        /// The export Secret could not be written (the API server's answer is in the
        /// message): a Secret of that name made by someone else is in the way; delete it.
        SecretNotWritten,
        /// No agent with a peering port runs on a node that has the source (or the source
        /// is a claim of a CSI volume, which is not served yet); the message names the
        /// nodes.
        NoAddress,
    }
}

/// Which volume an export serves: a claim of the export's namespace, or a StorageRoot this
/// namespace may use, and a path inside it. Read-only.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.root), has(self.pvc)].filter(x, x).size() == 1").message("set exactly one of root or pvc"))]
pub struct ExportSource {
    /// Name of a cluster-scoped `StorageRoot` that this namespace may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub root: Option<String>,
    /// Name of a `PersistentVolumeClaim` in the export's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub pvc: Option<String>,
    /// Path inside the root or volume, relative ("" or "." for all of it): readers see
    /// this directory and nothing above it. Absolute paths, `..` components, NUL bytes and
    /// `.ferry` (Ferry's state directory) are refused.
    #[serde(default)]
    #[schemars(length(max = 4096))]
    #[x_kube(validation = Rule::new(crate::api::PATH_RULES).message("path must be relative, without '..' components or NUL bytes"))]
    #[x_kube(validation = Rule::new(crate::api::STATE_DIR_RULE).message("path cannot be in .ferry, the directory where Ferry keeps its state at the top of every root and volume; choose another path"))]
    pub path: String,
}

/// Who may read an export: jobs of one namespace of one peer install.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportReader {
    /// The FerryPeer (of this cluster) naming the reading install.
    #[schemars(length(min = 1, max = 253))]
    pub peer: String,
    /// The namespace, in the reading cluster, of the jobs that may read.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("namespace is a namespace name of the reading cluster (a DNS label)"))]
    pub namespace: String,
}

/// One claim or root path of this namespace that jobs of named namespaces of trusted peer
/// installs may read, read-only, until it expires. The operator writes the export Secret
/// (`<name>-ferry-export`) beside it once it is Ready: carry that Secret to the reading
/// cluster, into the namespace of the job that names it in `source.export`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "CopyExport",
    plural = "copyexports",
    shortname = "cexp",
    namespaced,
    status = "CopyExportStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Expires","type":"date","jsonPath":".status.expiresAt"}"#,
    printcolumn = r#"{"name":"Secret","type":"string","jsonPath":".status.secretName"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("[has(self.expires), has(self.ttl)].filter(x, x).size() == 1").message("set exactly one of expires (a time) or ttl (a duration such as 24h, counted from the last change of the spec)"))]
#[serde(rename_all = "camelCase")]
pub struct CopyExportSpec {
    /// What is exported, read-only.
    pub source: ExportSource,
    /// Who may read it (at least one, at most 16; each peer and namespace once).
    #[schemars(schema_with = "readers_schema")]
    pub readers: Vec<ExportReader>,
    /// When the export ends (RFC 3339). Set this or `ttl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<Time>,
    /// How long the export lasts, counted from the last change of its spec (a duration:
    /// `24h`, `90m`). Set this or `expires`. At most the install's `peering.maxExportTtl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(\\\\.[0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) > duration('0s')").message("ttl is a positive duration such as 24h or 90m (units h, m, s)"))]
    pub ttl: Option<String>,
    /// Bump it to count `ttl` again from now (any change of the spec does): a nightly
    /// replication's tooling renews its export this way.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub renew: i64,
    /// How many reading jobs may hold the export at once (default 1): a second destination
    /// using the same credential gets nothing while the first holds it.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 16))]
    pub max_readers: i32,
    /// Bump it for a new credential: the Secret is rewritten, and the previous credential
    /// stays good for the install's `peering.rotationGrace` (a running job can be handed
    /// the new Secret), then is refused.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub rotate: i64,
    /// The most each reading job gets, in bytes per second (a quantity of at least 1Mi,
    /// e.g. `200Mi`): what the source's disk and network give readers. A reader's own
    /// `transfer.bandwidthLimit` applies too; the lower one holds. Unset: no limit here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).compareTo(quantity('1Mi')) >= 0").message("bandwidthLimit must be a quantity of bytes per second of at least 1Mi, e.g. 200Mi"))]
    pub bandwidth_limit: Option<String>,
}

/// At most [`MAX_EXPORT_READERS`], each once: a list the API server keys by peer and
/// namespace (it refuses a duplicate itself, at no rule cost).
fn readers_schema(gen: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = gen.subschema_for::<Vec<ExportReader>>();
    s.insert("minItems".into(), 1.into());
    s.insert("maxItems".into(), MAX_EXPORT_READERS.into());
    s.insert("x-kubernetes-list-type".into(), "map".into());
    s.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["peer", "namespace"]),
    );
    s
}

fn one() -> i32 {
    1
}

/// A credential the source's agents accept for an export: its SHA-256, never the
/// credential (which only the Secret holds).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportCredential {
    /// SHA-256 of the credential's 32 bytes, lowercase hex.
    pub sha256: String,
    /// The `spec.rotate` it was made for.
    pub rotation: i64,
    /// For a previous credential: when its grace ends and it is refused. None for the
    /// current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Time>,
}

/// What the operator says of a CopyExport. Only the operator writes it (tenants have no
/// grant on `copyexports/status`), and the source's agents trust nothing else of it than
/// what it wrote.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopyExportStatus {
    /// The generation of the spec this status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, with a reason from Ready, PeeringOff, SourceNotFound, PeerNotTrusted,
    /// Expired, TooLong, SecretNotWritten, NoAddress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// When the spec last changed, as the operator first saw it: `ttl` counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<Time>,
    /// When the export ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// The export Secret, in this namespace, once written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    /// Where readers dial (the Secret says it too), and the node whose agent serves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The credentials the source's agents accept: the current one, and the previous one
    /// until its grace ends. Empty while the export is not Ready.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<ExportCredential>,
}

/// The condition type of a CopyExport's status.
pub const EXPORT_READY: &str = "Ready";

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    #[test]
    fn every_export_reason_is_explained_in_the_crd_schema() {
        let crd = serde_json::to_string(&CopyExport::crd()).expect("serialize the CRD");
        for r in ExportReason::ALL {
            assert!(
                crd.contains(r.as_str()),
                "{r} is not in the CRD's descriptions"
            );
        }
    }

    #[test]
    fn an_export_is_namespaced_for_one_reader_by_default() {
        let crd = CopyExport::crd();
        assert_eq!(crd.spec.scope, "Namespaced");
        let spec: CopyExportSpec = serde_json::from_value(serde_json::json!({
            "source": {"pvc": "data"},
            "readers": [{"peer": "dr", "namespace": "shop-dr"}],
            "ttl": "24h",
        }))
        .expect("a spec");
        assert_eq!((spec.max_readers, spec.rotate, spec.renew), (1, 0, 0));
    }

    #[test]
    fn the_secret_name_of_the_longest_export_name_is_a_valid_name() {
        assert_eq!(export_secret_name(&"a".repeat(MAX_EXPORT_NAME)).len(), 253);
        assert_eq!(export_secret_name("db"), "db-ferry-export");
    }
}
