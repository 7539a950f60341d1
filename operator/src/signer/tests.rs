//! The signer's decisions, without a cluster: trust bundles, checks, issuing, stages.

use super::*;
use ferry_link::NodeKey;

const NS: &str = "ferry-system";
const SA: &str = "ferry-agent";
const AGENT: &str = "system:serviceaccount:ferry-system:ferry-agent";

fn request(user: &str, nodes: &[&str], csr_for: &str) -> CertificateSigningRequest {
    let key = NodeKey::generate(csr_for).expect("key");
    let mut csr = CertificateSigningRequest::default();
    csr.metadata.name = Some("req".into());
    csr.spec.signer_name = SIGNER_NAME.into();
    csr.spec.request = ByteString(key.csr_pem.into_bytes());
    csr.spec.username = Some(user.into());
    if !nodes.is_empty() {
        csr.spec.extra = Some(BTreeMap::from([(
            NODE_NAME_EXTRA.to_string(),
            nodes.iter().map(|n| (*n).to_string()).collect(),
        )]));
    }
    csr
}

fn ca() -> Ca {
    Ca::generate("test CA").expect("CA")
}

#[test]
fn the_agents_service_account_gets_a_certificate_for_the_node_its_token_is_bound_to() {
    let csr = request(AGENT, &["node-a"], "node-a");
    assert_eq!(check(&csr, NS, SA), Ok("node-a".to_string()));
    let issued = issue(&ca(), &csr, NS, SA).expect("issued");
    assert_eq!(issued.node, "node-a");
    assert_eq!(
        ferry_link::node_of_pem(&issued.cert_pem).expect("node"),
        "node-a"
    );
}

#[test]
fn another_service_account_is_refused_even_with_a_node_bound_token() {
    for user in [
        "system:serviceaccount:ferry-system:ferry-operator",
        "system:serviceaccount:team-a:ferry-agent",
        "system:serviceaccount:ferry-system:ferry-agent-x",
    ] {
        let why = check(&request(user, &["node-a"], "node-a"), NS, SA).expect_err(user);
        assert!(why.contains(user) && why.contains(AGENT), "{why}");
    }
}

#[test]
fn the_admin_is_refused() {
    let why = check(&request("ferry-admin", &[], "node-a"), NS, SA).expect_err("admin");
    assert!(
        why.contains("\"ferry-admin\"") && why.contains(AGENT),
        "{why}"
    );
    let why =
        check(&request("kubernetes-admin", &["node-a"], "node-a"), NS, SA).expect_err("admin");
    assert!(why.contains("kubernetes-admin"), "{why}");
}

#[test]
fn a_token_bound_to_no_node_is_refused() {
    let why = check(&request(AGENT, &[], "node-a"), NS, SA).expect_err("no node");
    assert!(why.contains(NODE_NAME_EXTRA), "{why}");
    let mut csr = request(AGENT, &[], "node-a");
    csr.spec.extra = Some(BTreeMap::from([(
        "authentication.kubernetes.io/credential-id".to_string(),
        vec!["JTI=x".to_string()],
    )]));
    assert!(check(&csr, NS, SA).is_err());
}

#[test]
fn a_token_naming_two_nodes_is_refused() {
    let why = check(&request(AGENT, &["node-a", "node-b"], "node-a"), NS, SA).expect_err("two");
    assert!(why.contains("2 nodes (node-a, node-b)"), "{why}");
}

#[test]
fn a_csr_for_another_node_than_the_tokens_is_refused_naming_both() {
    let csr = request(AGENT, &["node-a"], "node-b");
    assert_eq!(check(&csr, NS, SA), Ok("node-a".to_string()));
    let why = issue(&ca(), &csr, NS, SA).expect_err("another node");
    assert!(
        why.contains("bound to node node-a") && why.contains("spiffe://ferry.dev/node/node-b"),
        "{why}"
    );
}

#[test]
fn another_signers_request_and_a_request_that_is_not_pem_are_refused() {
    let mut csr = request(AGENT, &["node-a"], "node-a");
    csr.spec.signer_name = "kubernetes.io/kube-apiserver-client".into();
    assert!(check(&csr, NS, SA).is_err());
    let mut csr = request(AGENT, &["node-a"], "node-a");
    csr.spec.request = ByteString(vec![0xff, 0xfe]);
    let why = issue(&ca(), &csr, NS, SA).expect_err("not PEM");
    assert!(why.contains("spec.request"), "{why}");
}

#[test]
fn validity_is_the_requested_expiration_within_ten_minutes_and_a_day() {
    assert_eq!(validity(None), MAX_VALIDITY);
    assert_eq!(validity(Some(3600)), Duration::from_secs(3600));
    assert_eq!(validity(Some(60)), MIN_VALIDITY);
    assert_eq!(validity(Some(-5)), MIN_VALIDITY);
    assert_eq!(validity(Some(7 * 86400)), MAX_VALIDITY);
}

#[test]
fn a_request_is_decided_once_and_issued_once() {
    let mut csr = request(AGENT, &["node-a"], "node-a");
    assert_eq!(stage(&csr), Stage::New);
    let approved = new_condition("Approved", APPROVED_REASON, "ok");
    csr = with_condition(&csr, approved);
    assert_eq!(stage(&csr), Stage::ApprovedUnissued);
    csr.status.as_mut().expect("status").certificate = Some(ByteString(b"x".to_vec()));
    assert_eq!(stage(&csr), Stage::Done);
    let by_admin = with_condition(
        &request(AGENT, &["node-a"], "node-a"),
        new_condition("Approved", "KubectlApprove", "ok"),
    );
    assert_eq!(stage(&by_admin), Stage::ApprovedElsewhere);
    let denied = with_condition(
        &request(AGENT, &["node-a"], "node-a"),
        new_condition("Denied", REFUSED_REASON, "no"),
    );
    assert_eq!(stage(&denied), Stage::Done);
}

#[test]
fn finished_requests_are_deleted_after_an_hour_and_pending_ones_never() {
    let now = Timestamp::now();
    let at = |age_secs: i64, csr: CertificateSigningRequest| {
        let mut csr = csr;
        csr.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(now.as_second() - age_secs).expect("time"),
            ));
        csr
    };
    let mut issued = request(AGENT, &["node-a"], "node-a");
    issued.status = Some(Default::default());
    issued.status.as_mut().expect("status").certificate = Some(ByteString(b"x".to_vec()));
    let denied = with_condition(
        &request(AGENT, &["node-a"], "node-a"),
        new_condition("Denied", REFUSED_REASON, "no"),
    );
    let pending = request(AGENT, &["node-a"], "node-a");
    assert!(expired(&at(3601, issued.clone()), now, SIGNER_NAME));
    assert!(expired(&at(7200, denied.clone()), now, SIGNER_NAME));
    assert!(!expired(&at(3000, issued.clone()), now, SIGNER_NAME));
    assert!(!expired(&at(3000, denied), now, SIGNER_NAME));
    assert!(!expired(&at(86400, pending), now, SIGNER_NAME));
    let mut other = at(7200, issued);
    other.spec.signer_name = "example.com/other".into();
    assert!(!expired(&other, now, SIGNER_NAME));
}

const HOUR: u64 = 3600;
const NOW: u64 = 1_800_000_000;

fn cas(n: usize) -> Vec<String> {
    (0..n).map(|_| ca().cert_pem().to_owned()).collect()
}

fn data(entries: &[(u64, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(t, pem)| (key_of(*t), (*pem).to_owned()))
        .collect()
}

#[test]
fn the_first_ca_makes_the_bundle_and_publishing_again_changes_nothing() {
    let pems = cas(1);
    let bundle = trust_data(&BTreeMap::new(), &pems[0], NOW, NOW);
    assert_eq!(bundle.data, data(&[(NOW, &pems[0])]));
    assert!(bundle.dropped.is_empty());
    // A retry an hour later keeps the key the CA already has.
    let again = trust_data(&bundle.data, &pems[0], NOW, NOW + HOUR);
    assert_eq!(again, bundle);
}

#[test]
fn an_older_ca_stays_until_the_newer_one_is_48_hours_old() {
    let pems = cas(3);
    let (a, b) = (NOW - 100 * HOUR, NOW - 47 * HOUR);
    let existing = data(&[(a, &pems[0]), (b, &pems[1])]);
    // b joined 47 hours ago: a's certificates may still be trusted by someone; kept.
    let bundle = trust_data(&existing, &pems[2], NOW, NOW);
    assert_eq!(
        bundle.data,
        data(&[(a, &pems[0]), (b, &pems[1]), (NOW, &pems[2])])
    );
    // Two hours later b is 49 hours old: a goes, b (superseded only just now) stays.
    let bundle = trust_data(&bundle.data, &pems[2], NOW, NOW + 2 * HOUR);
    assert_eq!(bundle.data, data(&[(b, &pems[1]), (NOW, &pems[2])]));
    assert_eq!(
        bundle.dropped,
        vec![(key_of(a), "superseded more than 48 hours ago")]
    );
}

#[test]
fn the_newest_ca_is_never_dropped_however_old() {
    let pems = cas(2);
    let old = NOW - 1000 * HOUR;
    // A clock far ahead of the CA's creation: still the newest, still kept.
    let bundle = trust_data(&data(&[(old, &pems[0])]), &pems[1], old + 1, NOW);
    assert_eq!(bundle.data, data(&[(old + 1, &pems[1])]));
    let bundle = trust_data(&BTreeMap::new(), &pems[1], old, NOW);
    assert_eq!(bundle.data, data(&[(old, &pems[1])]));
}

#[test]
fn malformed_keys_are_dropped() {
    let pems = cas(3);
    let node = {
        let ca = ca();
        let key = NodeKey::generate("node-a").expect("key");
        ca.sign_node(&key.csr_pem, "node-a", MAX_VALIDITY)
            .expect("cert")
    };
    let two = format!("{}{}", pems[0], pems[1]);
    let mut existing = data(&[(NOW - 10, &pems[0])]);
    for (key, value) in [
        ("readme.txt", pems[0].as_str()),
        ("x.crt", pems[0].as_str()),
        ("-5.crt", pems[0].as_str()),
        ("99999999999999999999.crt", pems[0].as_str()),
        ("12.pem", pems[0].as_str()),
        ("13.crt", "not PEM"),
        ("14.crt", node.as_str()),
        ("15.crt", two.as_str()),
    ] {
        existing.insert(key.into(), value.into());
    }
    let bundle = trust_data(&existing, &pems[2], NOW, NOW);
    assert_eq!(bundle.data, data(&[(NOW - 10, &pems[0]), (NOW, &pems[2])]));
    assert_eq!(bundle.dropped.len(), 8, "{:?}", bundle.dropped);
}

#[test]
fn a_ca_made_in_the_same_second_as_another_takes_the_next_free_second() {
    let pems = cas(3);
    let existing = data(&[(NOW, &pems[0]), (NOW + 1, &pems[1])]);
    let bundle = trust_data(&existing, &pems[2], NOW, NOW);
    assert_eq!(
        bundle.data,
        data(&[(NOW, &pems[0]), (NOW + 1, &pems[1]), (NOW + 2, &pems[2])])
    );
}

#[test]
fn at_most_16_cas_are_kept_the_oldest_dropped_first() {
    let pems = cas(MAX_TRUST_KEYS + 2);
    // 17 CAs from the last hour (a crash-looping leader), and a new one.
    let existing: BTreeMap<String, String> = pems[..=MAX_TRUST_KEYS]
        .iter()
        .enumerate()
        .map(|(i, pem)| (key_of(NOW - 100 + i as u64), pem.clone()))
        .collect();
    let own = &pems[MAX_TRUST_KEYS + 1];
    let bundle = trust_data(&existing, own, NOW, NOW);
    assert_eq!(bundle.data.len(), MAX_TRUST_KEYS);
    assert_eq!(bundle.data.get(&key_of(NOW)), Some(own));
    assert_eq!(
        bundle.dropped,
        vec![
            (key_of(NOW - 100), "more than 16 CAs"),
            (key_of(NOW - 99), "more than 16 CAs")
        ]
    );
}

#[test]
fn the_peering_signer_names_the_install_and_node_and_signs_only_its_own_requests() {
    let issuer = Issuer::peering(ca(), "prod-east");
    let mut csr = request(AGENT, &["node-a"], "node-a");
    // A transfer request is not the peering signer's, and the reverse.
    let why = issue_with(&issuer, &csr, NS, SA).expect_err("a transfer request");
    assert!(
        why.contains("signs only signerName ferry.dev/peering"),
        "{why}"
    );
    csr.spec.signer_name = PEERING_SIGNER_NAME.into();
    assert!(check(&csr, NS, SA).is_err());
    let issued = issue_with(&issuer, &csr, NS, SA).expect("issued");
    let peer = ferry_link::peer_of_pem(&issued.cert_pem).expect("a peering certificate");
    assert_eq!(
        (peer.install.as_str(), peer.node.as_str()),
        ("prod-east", "node-a")
    );
    // The same checks of who asks: another node's CSR, another requester.
    let other = {
        let mut r = request(AGENT, &["node-a"], "node-b");
        r.spec.signer_name = PEERING_SIGNER_NAME.into();
        r
    };
    assert!(issue_with(&issuer, &other, NS, SA).is_err());
    let mut admin = request("kubernetes-admin", &["node-a"], "node-a");
    admin.spec.signer_name = PEERING_SIGNER_NAME.into();
    assert!(issue_with(&issuer, &admin, NS, SA).is_err());
}
