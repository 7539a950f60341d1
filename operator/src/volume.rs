//! Endpoints resolved to what an agent needs: the host directory of a StorageRoot or a
//! PersistentVolume, and which nodes have it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume};

/// Which nodes have a volume.
#[derive(Debug, Clone, PartialEq)]
pub enum Nodes {
    /// Nodes whose labels include all of these (a StorageRoot's nodeSelector).
    Labels(BTreeMap<String, String>),
    /// A PersistentVolume's required node affinity: any term matches (terms are ORed).
    Terms(Vec<NodeSelectorTerm>),
    /// Every node (a shared StorageRoot without a selector).
    All,
}

/// A resolved endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Volume {
    /// Absolute path on the host of the root or volume (the endpoint's `path` is inside it).
    pub host_path: String,
    pub nodes: Nodes,
}

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if req.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

impl Nodes {
    /// Whether the node with this name and these labels has the volume.
    pub fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Nodes::All => true,
            Nodes::Labels(sel) => sel.iter().all(|(k, v)| labels.get(k) == Some(v)),
            Nodes::Terms(terms) => terms.iter().any(|t| {
                let exprs = t
                    .match_expressions
                    .iter()
                    .flatten()
                    .all(|r| requirement_matches(r, labels.get(&r.key)));
                // The only field a node selector may name is metadata.name.
                let name = name.to_string();
                let fields = t
                    .match_fields
                    .iter()
                    .flatten()
                    .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(&name)));
                exprs && fields
            }),
        }
    }
}

/// The host path and nodes of a `local` or `hostPath` PersistentVolume, or why not.
pub fn from_pv(pv: &PersistentVolume) -> Result<Volume, String> {
    let spec = pv.spec.as_ref().ok_or("the PersistentVolume has no spec")?;
    let host_path = match (&spec.local, &spec.host_path) {
        (Some(local), _) => local.path.clone(),
        (None, Some(hp)) => hp.path.clone(),
        (None, None) => {
            return Err("only local and hostPath volumes are supported by this operator version (CSI volumes come later)".into())
        }
    };
    let terms = spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default();
    if terms.is_empty() {
        return Err(
            "the PersistentVolume has no required node affinity, so its node is unknown".into(),
        );
    }
    Ok(Volume {
        host_path,
        nodes: Nodes::Terms(terms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(key: &str, op: &str, values: &[&str]) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            match_fields: None,
        }
    }

    #[test]
    fn node_affinity_terms_are_ored_and_expressions_anded() {
        let labels: BTreeMap<String, String> =
            [("kubernetes.io/hostname".to_string(), "node-b".to_string())].into();
        let nodes = Nodes::Terms(vec![
            term("kubernetes.io/hostname", "In", &["node-a"]),
            term("kubernetes.io/hostname", "In", &["node-b"]),
        ]);
        assert!(nodes.matches("node-b", &labels));
        let nodes = Nodes::Terms(vec![term("kubernetes.io/hostname", "In", &["node-a"])]);
        assert!(!nodes.matches("node-b", &labels));
        assert!(!Nodes::Terms(vec![]).matches("node-b", &labels));
    }
}
