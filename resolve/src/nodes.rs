//! Which nodes a job can run on: label selectors matched against a namespace's or a
//! node's labels, and the nodes with a live agent that have both of a job's volumes.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::volume::Volume;

/// `matchLabels` and `matchExpressions` (In, NotIn, Exists, DoesNotExist) against labels.
pub fn selector_matches(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|req| {
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" => labels.get(&req.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&req.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&req.key),
            "DoesNotExist" => !labels.contains_key(&req.key),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// Where one endpoint's volume is: the nodes that have it, and those of them whose agent
/// is live (both sorted by name). Says why no node has both endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reachable {
    pub nodes: Vec<String>,
    pub live: Vec<String>,
}

/// Nodes with a live agent that have both volumes (sorted by name), and for each volume
/// where it is ([`Reachable`]), from one listing of the Nodes.
pub async fn eligible_nodes(
    client: &Client,
    live: &BTreeSet<String>,
    volumes: [&Volume; 2],
) -> Result<(Vec<String>, [Reachable; 2]), kube::Error> {
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    let mut reach: [Reachable; 2] = Default::default();
    let mut both = Vec::new();
    for n in &nodes.items {
        let name = n.name_any();
        let has: Vec<bool> = volumes
            .iter()
            .map(|v| v.nodes.matches(&name, n.labels()))
            .collect();
        for (r, has) in reach.iter_mut().zip(&has) {
            if *has {
                r.nodes.push(name.clone());
                if live.contains(&name) {
                    r.live.push(name.clone());
                }
            }
        }
        if has.iter().all(|h| *h) && live.contains(&name) {
            both.push(name);
        }
    }
    both.sort();
    for r in &mut reach {
        r.nodes.sort();
        r.live.sort();
    }
    Ok((both, reach))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selector_matches_labels_and_expressions() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("team", "a")])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(vec!["gold".into(), "silver".into()]),
            }]),
        };
        assert!(selector_matches(
            &sel,
            &labels(&[("team", "a"), ("tier", "gold")])
        ));
        assert!(!selector_matches(
            &sel,
            &labels(&[("team", "a"), ("tier", "bronze")])
        ));
        assert!(!selector_matches(
            &sel,
            &labels(&[("team", "b"), ("tier", "gold")])
        ));
        assert!(!selector_matches(&sel, &labels(&[("tier", "gold")])));
    }
}
