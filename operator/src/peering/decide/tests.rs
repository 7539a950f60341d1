//! The FerryPeer decision on real certificates (`ferry_link`'s CA), without a cluster.

use std::time::{Duration, SystemTime};

use ferry_crds::{FerryPeer, FerryPeerSpec, PeerReason, PEERING_PEER_KEY, PEER_VALID};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;

use super::*;

/// A FerryPeer as an admin writes it (both directions allowed, all namespaces), created at
/// `created` (seconds): also the other controllers' tests' peer.
pub(crate) fn peer(name: &str, install: &str, bundle: &str, created: i64) -> FerryPeer {
    FerryPeer {
        metadata: ObjectMeta {
            name: Some(name.into()),
            generation: Some(3),
            creation_timestamp: Some(Time(Timestamp::from_second(created).expect("a timestamp"))),
            ..ObjectMeta::default()
        },
        spec: FerryPeerSpec {
            install: install.into(),
            ca_bundle: bundle.into(),
            exports: Default::default(),
            imports: Default::default(),
            namespaces: None,
        },
        status: None,
    }
}

fn ca(name: &str) -> ferry_link::Ca {
    ferry_link::Ca::generate(name).expect("a CA")
}

/// The one condition's reason, and whether it is True.
fn verdict(status: &FerryPeerStatus) -> (String, bool, String) {
    let [c] = status.conditions.as_slice() else {
        panic!("one condition, got {:?}", status.conditions);
    };
    assert_eq!(c.type_, PEER_VALID);
    (c.reason.clone(), c.status == "True", c.message.clone())
}

#[test]
fn a_peer_ca_is_valid_and_listed_with_the_fingerprint_the_peer_publishes() {
    let west = ca("west peering CA");
    let p = peer("west", "west", west.cert_pem(), 1_000);
    let now = SystemTime::now();
    let (status, requeue) = judge(&p, &[&p], "east", now);
    let (reason, ok, message) = verdict(&status);
    assert_eq!((reason.as_str(), ok), ("Valid", true), "{message}");
    assert_eq!(status.observed_generation, Some(3));
    let published = published("west", west.cert_pem()).expect("published");
    let [c] = status.certificates.as_slice() else {
        panic!("one certificate: {:?}", status.certificates);
    };
    assert_eq!(
        c.fingerprint,
        published[ferry_crds::PEERING_FINGERPRINT_KEY]
    );
    assert_eq!(c.fingerprint.len(), 32 * 3 - 1, "{}", c.fingerprint);
    assert!(c.subject.contains("west peering CA"), "{}", c.subject);
    // Ten years ahead, so the next look is the hourly one.
    assert_eq!(requeue, RECHECK);
    // Judged again with its own status, nothing changes (not even the transition time).
    let mut again = p.clone();
    again.status = Some(status.clone());
    let (second, _) = judge(&again, &[&again], "east", SystemTime::now());
    assert!(!changed(&again, &second));
}

#[test]
fn a_bundle_that_is_not_a_ca_or_not_a_certificate_is_invalid_and_says_what_to_put_there() {
    let west = ca("west");
    let key = ferry_link::NodeKey::generate("node-a").expect("a key");
    let leaf = west
        .sign_node(&key.csr_pem, "node-a", Duration::from_secs(3600))
        .expect("a node certificate");
    let truncated = &west.cert_pem()[..west.cert_pem().len() / 2];
    for bundle in [
        leaf.as_str(),
        truncated,
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    ] {
        let p = peer("west", "west", bundle, 1);
        let (status, _) = judge(&p, &[&p], "east", SystemTime::now());
        let (reason, ok, message) = verdict(&status);
        assert_eq!((reason.as_str(), ok), ("InvalidBundle", false), "{message}");
        assert!(
            message.contains("ca.crt key of its ferry-peering ConfigMap"),
            "{message}"
        );
    }
}

#[test]
fn an_expired_ca_is_refused_and_named_by_its_fingerprint() {
    let west = ca("west");
    let p = peer("west", "west", west.cert_pem(), 1);
    let later = SystemTime::now() + Duration::from_secs(11 * 365 * 24 * 3600);
    let (status, _) = judge(&p, &[&p], "east", later);
    let (reason, ok, message) = verdict(&status);
    assert_eq!((reason.as_str(), ok), ("Expired", false));
    assert!(
        message.contains(&status.certificates[0].fingerprint),
        "{message}"
    );
    // A CA nearing its end is looked at again when it expires, not an hour later.
    let soon = SystemTime::from(status.certificates[0].not_after.0) - Duration::from_secs(90);
    let (_, requeue) = judge(&p, &[&p], "east", soon);
    assert!(requeue <= Duration::from_secs(90), "{requeue:?}");
}

#[test]
fn the_second_peer_for_one_install_is_refused_and_the_first_stays_valid() {
    let (west, other) = (ca("west"), ca("impostor"));
    let first = peer("west", "west", west.cert_pem(), 100);
    let second = peer("west-again", "west", other.cert_pem(), 200);
    let all = [&first, &second];
    let (s1, _) = judge(&first, &all, "east", SystemTime::now());
    let (s2, _) = judge(&second, &all, "east", SystemTime::now());
    assert_eq!(verdict(&s1).0, "Valid");
    let (reason, ok, message) = verdict(&s2);
    assert_eq!((reason.as_str(), ok), ("DuplicatePeer", false));
    assert!(
        message.contains("FerryPeer west already names install \"west\""),
        "{message}"
    );
}

#[test]
fn a_second_install_with_a_ca_another_peer_holds_is_refused() {
    let west = ca("west");
    let first = peer("west", "west", west.cert_pem(), 100);
    let second = peer("south", "south", west.cert_pem(), 200);
    let all = [&first, &second];
    assert_eq!(
        verdict(&judge(&first, &all, "east", SystemTime::now()).0).0,
        "Valid"
    );
    let (reason, ok, message) = verdict(&judge(&second, &all, "east", SystemTime::now()).0);
    assert_eq!((reason.as_str(), ok), ("DuplicatePeer", false));
    assert!(
        message.contains("FerryPeer west holds a CA certificate of this bundle"),
        "{message}"
    );
    // The agents' own set refuses the pair the same way.
    let set = ferry_link::PeerSet::new(vec![
        ("west".into(), west.cert_pem().into()),
        ("south".into(), west.cert_pem().into()),
    ]);
    assert!(set.is_err());
}

#[test]
fn a_peer_naming_this_install_is_refused() {
    let east = ca("east");
    let p = peer("me", "east", east.cert_pem(), 1);
    let (status, _) = judge(&p, &[&p], "east", SystemTime::now());
    assert_eq!(verdict(&status).0, PeerReason::OwnInstall.as_str());
}

#[test]
fn what_an_install_publishes_is_a_peer_the_other_side_can_apply_as_it_is() {
    let east = ca("east");
    let data = published("east-1a2b3c4d", east.cert_pem()).expect("published");
    let applied: FerryPeer =
        serde_yaml::from_str(&data[PEERING_PEER_KEY]).expect("a FerryPeer in YAML");
    assert_eq!(applied.spec.install, "east-1a2b3c4d");
    assert_eq!(applied.spec.ca_bundle, east.cert_pem());
    let (status, _) = judge(&applied, &[&applied], "west", SystemTime::now());
    assert_eq!(verdict(&status).0, "Valid");
}

#[test]
fn a_made_install_name_is_a_dns_label_from_the_namespace_and_random_digits() {
    assert_eq!(
        new_install_name("ferry-system", [0xde, 0xad, 0xbe, 0xef]),
        "ferry-system-deadbeef"
    );
    let long = new_install_name(&"a-".repeat(40), [1, 2, 3, 4]);
    assert!(
        long.len() <= 63 && long.ends_with("-01020304") && !long.contains("--"),
        "{long}"
    );
    assert_eq!(new_install_name("---", [0, 0, 0, 1]), "ferry-00000001");
    for name in [
        new_install_name("ferry-system", [9; 4]),
        long,
        new_install_name("x", [0; 4]),
    ] {
        ferry_link::validate_install_name(&name).expect("a valid install name");
    }
}
