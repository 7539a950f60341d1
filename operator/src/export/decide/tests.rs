//! The CopyExport decision, without a cluster, on real peer certificates.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use ferry_crds::{CopyExport, CopyExportSpec, ExportReader, ExportSource, FerryPeer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;

use super::*;

const DAY: Duration = Duration::from_secs(86_400);

fn peer(name: &str, exports: PeerAccess, namespaces: Option<LabelSelector>) -> FerryPeer {
    let ca = ferry_link::Ca::generate(name).expect("a CA");
    let mut p = crate::peering::decide::tests::peer(name, name, ca.cert_pem(), 1_000);
    p.spec.exports = exports;
    p.spec.namespaces = namespaces;
    p
}

fn export(ttl: &str, readers: &[(&str, &str)]) -> CopyExport {
    let mut e = CopyExport::new(
        "db",
        CopyExportSpec {
            source: ExportSource {
                pvc: Some("data".into()),
                ..ExportSource::default()
            },
            readers: readers
                .iter()
                .map(|(p, n)| ExportReader {
                    peer: (*p).into(),
                    namespace: (*n).into(),
                })
                .collect(),
            expires: None,
            ttl: Some(ttl.into()),
            renew: 0,
            max_readers: 1,
            rotate: 0,
            bandwidth_limit: None,
        },
    );
    e.metadata.namespace = Some("shop".into());
    e.metadata.generation = Some(1);
    e
}

struct World {
    peers: Vec<FerryPeer>,
    labels: BTreeMap<String, String>,
    on: bool,
    source: Result<(), String>,
    serving: Result<Serving, String>,
}

impl World {
    fn new() -> Self {
        World {
            peers: vec![peer("west", PeerAccess::Allow, None)],
            labels: BTreeMap::from([("team".to_string(), "shop".to_string())]),
            on: true,
            source: Ok(()),
            serving: Ok(Serving {
                node: "node-a".into(),
                address: "192.0.2.10:7451".into(),
            }),
        }
    }

    fn decide(&self, e: &CopyExport, now: SystemTime, fresh: u8) -> Decision {
        let peers: Vec<&FerryPeer> = self.peers.iter().collect();
        let peering = Peering {
            install: "east",
            ca_pem: "",
            max_ttl: 30 * DAY,
            grace: Duration::from_secs(600),
        };
        decide(
            &Inputs {
                export: e,
                peering: self.on.then_some(peering),
                peers: &peers,
                namespace_labels: &self.labels,
                source: self.source.clone(),
                serving: self.serving.clone(),
                now,
            },
            [fresh; 32],
        )
    }
}

fn reason(d: &Decision) -> (String, bool) {
    let [c] = d.status.conditions.as_slice() else {
        panic!("one condition: {:?}", d.status.conditions);
    };
    (c.reason.clone(), c.status == "True")
}

fn message(d: &Decision) -> &str {
    &d.status.conditions[0].message
}

/// The export as it is once `d`'s status is written.
fn written(mut e: CopyExport, d: &Decision) -> CopyExport {
    e.status = Some(d.status.clone());
    e
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn at(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t).expect("a time")
}

#[test]
fn a_ready_export_gets_a_credential_whose_hash_alone_is_in_the_status() {
    let w = World::new();
    let now = SystemTime::now();
    let e = export("24h", &[("west", "shop-dr")]);
    let d = w.decide(&e, now, 7);
    assert_eq!(reason(&d), ("Ready".into(), true), "{}", message(&d));
    let secret = d.secret.as_ref().expect("a Secret to write");
    assert_eq!(secret.name, "db-ferry-export");
    assert_eq!(secret.credential, [7; 32]);
    let [c] = d.status.credentials.as_slice() else {
        panic!("{:?}", d.status.credentials)
    };
    assert_eq!(c.sha256, ferry_link::credential_hash(&[7; 32]));
    assert_ne!(c.sha256, hex(&[7; 32]), "the hash, not the credential");
    assert_eq!((c.rotation, c.until.is_none()), (0, true));
    let expires = d.status.expires_at.as_ref().expect("an expiry").0;
    assert_eq!(expires, at(now) + SignedDuration::from_hours(24));
    assert_eq!(secret.expires, expires.to_string());
    assert_eq!(d.status.secret_name.as_deref(), Some("db-ferry-export"));
    // Looked at again: nothing new, nothing to write.
    let e = written(e, &d);
    let again = w.decide(&e, now + Duration::from_secs(5), 8);
    assert!(again.secret.is_none() && again.changed_keys.is_empty());
    assert_eq!(secret.address, "192.0.2.10:7451");
    assert_eq!(d.status.address.as_deref(), Some("192.0.2.10:7451"));
    assert_eq!(d.status.node.as_deref(), Some("node-a"));
    assert!(!changed(&e, &again.status), "{:?}", again.status);
}

#[test]
fn a_rotation_keeps_the_previous_credential_for_the_grace_then_drops_it() {
    let w = World::new();
    let now = SystemTime::now();
    let mut e = export("24h", &[("west", "shop-dr")]);
    let first = w.decide(&e, now, 1);
    e = written(e, &first);
    e.spec.rotate = 1;
    e.metadata.generation = Some(2);
    let rotated = w.decide(&e, now + Duration::from_secs(60), 2);
    assert_eq!(rotated.secret.as_ref().map(|s| s.credential), Some([2; 32]));
    let creds = &rotated.status.credentials;
    assert_eq!(creds.len(), 2, "{creds:?}");
    assert_eq!(
        (creds[0].sha256.clone(), creds[0].until.is_none()),
        (ferry_link::credential_hash(&[2; 32]), true)
    );
    assert_eq!(creds[1].sha256, ferry_link::credential_hash(&[1; 32]));
    let until = creds[1].until.as_ref().expect("a grace").0;
    assert_eq!(until, at(now + Duration::from_secs(660)));
    assert!(
        rotated.requeue <= Duration::from_secs(600),
        "woken when the grace ends"
    );
    e = written(e, &rotated);
    let after = w.decide(&e, now + Duration::from_secs(661), 3);
    assert!(after.secret.is_none());
    assert_eq!(
        after.status.credentials.len(),
        1,
        "{:?}",
        after.status.credentials
    );
    assert_eq!(
        after.status.credentials[0].sha256,
        ferry_link::credential_hash(&[2; 32])
    );
}

#[test]
fn a_change_of_the_spec_counts_ttl_again_and_patches_only_the_secrets_expiry() {
    let w = World::new();
    let now = SystemTime::now();
    let mut e = export("24h", &[("west", "shop-dr")]);
    let first = w.decide(&e, now, 1);
    e = written(e, &first);
    e.spec.renew = 1;
    e.metadata.generation = Some(2);
    let later = now + Duration::from_secs(20 * 3600);
    let renewed = w.decide(&e, later, 2);
    assert!(renewed.secret.is_none(), "the same credential");
    let expires = at(later) + SignedDuration::from_hours(24);
    assert_eq!(
        renewed.changed_keys,
        BTreeMap::from([("expires", expires.to_string())])
    );
    assert_eq!(renewed.status.credentials, first.status.credentials);
}

#[test]
fn an_expired_export_is_not_ready_and_keeps_its_credential_for_a_renewal() {
    let w = World::new();
    let now = SystemTime::now();
    let mut e = export("1h", &[("west", "shop-dr")]);
    let first = w.decide(&e, now, 1);
    e = written(e, &first);
    let d = w.decide(&e, now + Duration::from_secs(3601), 2);
    assert_eq!(reason(&d), ("Expired".into(), false));
    assert!(d.secret.is_none());
    assert_eq!(d.status.credentials, first.status.credentials);
    // Renewed: Ready again with the Secret the reader already holds.
    e = written(e, &d);
    e.spec.renew = 1;
    e.metadata.generation = Some(2);
    let back = w.decide(&e, now + Duration::from_secs(3700), 3);
    assert_eq!(reason(&back), ("Ready".into(), true));
    assert!(back.secret.is_none() && back.changed_keys.contains_key("expires"));
}

#[test]
fn an_export_longer_than_the_install_allows_is_refused_saying_the_limit() {
    let w = World::new();
    let now = SystemTime::now();
    let d = w.decide(&export("1000h", &[("west", "shop-dr")]), now, 1);
    assert_eq!(reason(&d), ("TooLong".into(), false));
    assert!(
        message(&d).contains("peering.maxExportTtl"),
        "{}",
        message(&d)
    );
    assert!(d.secret.is_none() && d.status.credentials.is_empty());
    let mut e = export("1h", &[("west", "shop-dr")]);
    e.spec.ttl = None;
    e.spec.expires = Some(Time(at(now + 31 * DAY)));
    assert_eq!(reason(&w.decide(&e, now, 1)).0, "TooLong");
    e.spec.expires = Some(Time(at(now + 29 * DAY)));
    assert_eq!(reason(&w.decide(&e, now, 1)).0, "Ready");
}

#[test]
fn each_untrusted_reader_is_refused_naming_the_peer_and_what_to_change() {
    let now = SystemTime::now();
    let e = export("24h", &[("west", "shop-dr"), ("north", "dr")]);
    let mut w = World::new();
    let d = w.decide(&e, now, 1);
    assert_eq!(reason(&d).0, "PeerNotTrusted");
    assert!(
        message(&d).contains("no FerryPeer \"north\""),
        "{}",
        message(&d)
    );
    w.peers.push(peer("north", PeerAccess::Deny, None));
    let d = w.decide(&e, now, 1);
    assert!(message(&d).contains("exports: Deny"), "{}", message(&d));
    let only_billing = LabelSelector {
        match_labels: Some(BTreeMap::from([("team".into(), "billing".into())])),
        ..LabelSelector::default()
    };
    w.peers[1] = peer("north", PeerAccess::Allow, Some(only_billing));
    let d = w.decide(&e, now, 1);
    assert!(
        message(&d).contains("does not admit this namespace"),
        "{}",
        message(&d)
    );
    w.labels.insert("team".into(), "billing".into());
    assert_eq!(reason(&w.decide(&e, now, 1)).0, "Ready");
    // A peer that is not Valid (here: holding the CA of another).
    w.peers[1].spec.ca_bundle = w.peers[0].spec.ca_bundle.clone();
    let d = w.decide(&e, now, 1);
    assert!(
        message(&d).contains("is not Valid (DuplicatePeer"),
        "{}",
        message(&d)
    );
}

#[test]
fn peering_off_and_a_missing_source_say_so_and_write_nothing() {
    let now = SystemTime::now();
    let e = export("24h", &[("west", "shop-dr")]);
    let mut w = World::new();
    w.on = false;
    let d = w.decide(&e, now, 1);
    assert_eq!(reason(&d), ("PeeringOff".into(), false));
    assert!(d.secret.is_none());
    w.on = true;
    w.source = Err("spec.source.pvc: no PersistentVolumeClaim \"data\"".into());
    let d = w.decide(&e, now, 1);
    assert_eq!(reason(&d).0, "SourceNotFound");
    assert!(message(&d).contains("no PersistentVolumeClaim"));
    assert!(d.secret.is_none());
}

#[test]
fn a_secret_that_could_not_be_written_leaves_the_credentials_as_they_were() {
    let w = World::new();
    let now = SystemTime::now();
    let e = export("24h", &[("west", "shop-dr")]);
    let mut d = w.decide(&e, now, 1);
    not_written(&e, &mut d, "secrets \"db-ferry-export\" is forbidden");
    assert_eq!(reason(&d).0, "SecretNotWritten");
    assert!(d.status.credentials.is_empty() && d.secret.is_none());
    assert!(message(&d).contains("is forbidden"));
}

#[test]
fn an_export_no_agent_serves_is_not_ready_and_a_new_serving_agent_patches_only_the_address() {
    let mut w = World::new();
    let now = SystemTime::now();
    let mut e = export("24h", &[("west", "shop-dr")]);
    let first = w.decide(&e, now, 1);
    e = written(e, &first);
    w.serving = Err("no agent with a peering port runs on node-a".into());
    let d = w.decide(&e, now, 2);
    assert_eq!(reason(&d), ("NoAddress".into(), false));
    assert!(message(&d).contains("node-a"));
    assert!(d.secret.is_none() && d.changed_keys.is_empty());
    assert_eq!(
        d.status.credentials, first.status.credentials,
        "kept for when it is back"
    );
    w.serving = Ok(Serving {
        node: "node-b".into(),
        address: "192.0.2.11:7451".into(),
    });
    let moved = w.decide(&written(e, &d), now, 3);
    assert_eq!(reason(&moved).0, "Ready");
    assert!(moved.secret.is_none(), "the same credential");
    assert_eq!(
        moved.changed_keys,
        BTreeMap::from([("address", "192.0.2.11:7451".to_string())])
    );
    assert_eq!(moved.status.node.as_deref(), Some("node-b"));
}
