//! Which agents see a CopyJob. The operator labels a job with one label a node for every
//! node that runs or serves one of its shards (finished ones too: an agent keeps a job's
//! per-job metrics, with their final values, as long as the job exists), and each agent
//! watches only the jobs labelled for its node: an agent holds the jobs it works or worked
//! on, not every job of the cluster (40 refused jobs in another namespace once grew an
//! uninvolved agent by ~50 MiB). The label only narrows what an agent is sent; what it runs is still decided by
//! the shard assignment in the status and its own checks. The chart's admission policy
//! lets no one but the operator set or change these labels.

/// The prefix of the node labels.
pub const NODE_LABEL_PREFIX: &str = "node.ferry.dev/";

/// The label that makes `node`'s agent see a job: `node.ferry.dev/<node>`, or, for a node
/// name too long for a label's name part (63 characters), `node.ferry.dev/h-` and 128
/// bits of its SHA-256 in hex. A node name (a DNS subdomain: lowercase letters, digits,
/// `-` and `.`, alphanumeric at both ends) is a valid name part as it is.
pub fn node_label(node: &str) -> String {
    if node.len() <= 63 {
        return format!("{NODE_LABEL_PREFIX}{node}");
    }
    let hex = crate::digest::sha256_128_hex(node.as_bytes());
    format!("{NODE_LABEL_PREFIX}h-{hex}")
}

/// The node labels a job with these shards should have: the nodes (and senders) its shards
/// are assigned to (not another install's, which serves an export). A shard given to
/// another node takes its label away from the first.
pub fn node_labels(shards: &[crate::ShardStatus]) -> std::collections::BTreeSet<String> {
    shards
        .iter()
        .flat_map(|s| std::iter::once(&s.node).chain(&s.sender))
        // Another install's agent (an export's sender) watches nothing here.
        .filter(|n| !n.is_empty() && *n != crate::EXPORT_SENDER)
        .map(|n| node_label(n))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_label_is_a_valid_label_key_for_any_node_name() {
        assert_eq!(node_label("node-a"), "node.ferry.dev/node-a");
        let dotted = "ip-10-0-0-1.eu-west-1.compute.internal";
        assert_eq!(node_label(dotted), format!("node.ferry.dev/{dotted}"));
        let long = "n".repeat(64);
        let l = node_label(&long);
        let name = l.strip_prefix(NODE_LABEL_PREFIX).expect("prefix");
        assert!(name.len() <= 63 && name.starts_with("h-"), "{l}");
        assert_eq!(l, node_label(&long), "stable");
        assert_ne!(l, node_label(&"m".repeat(64)));
    }
}
