//! An export Secret judged as the reading operator judges it, on real peering CAs.

use std::collections::BTreeMap;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::ByteString;

use super::*;

fn peer(name: &str, install: &str, bundle: &str) -> FerryPeer {
    crate::peering::decide::tests::peer(name, install, bundle, 1_000)
}

fn secret(ca: &str) -> Secret {
    let data: BTreeMap<String, ByteString> = [
        ("install", b"east".to_vec()),
        ("export", b"3e4f5a6b-7c8d-4e9f-8a0b-1c2d3e4f5a6b".to_vec()),
        ("credential", vec![9; 32]),
        ("ca.crt", ca.as_bytes().to_vec()),
        ("expires", b"2027-01-01T00:00:00Z".to_vec()),
        ("address", b"192.0.2.10:7451".to_vec()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v)))
    .collect();
    Secret {
        type_: Some(EXPORT_SECRET_TYPE.into()),
        data: Some(data),
        ..Secret::default()
    }
}

struct World {
    east: String,
    peers: Vec<FerryPeer>,
    labels: BTreeMap<String, String>,
}

impl World {
    fn new() -> Self {
        let east = ferry_link::Ca::generate("east")
            .expect("a CA")
            .cert_pem()
            .to_string();
        World {
            peers: vec![peer("east", "east", &east)],
            east,
            labels: BTreeMap::from([("team".into(), "shop".into())]),
        }
    }

    fn judge(&self, s: &Secret) -> Result<ExportTicket, Blocked> {
        let peers: Vec<&FerryPeer> = self.peers.iter().collect();
        judge(
            "db-ferry-export",
            s,
            &peers,
            &self.labels,
            SystemTime::now(),
        )
    }
}

fn refusal(r: Result<ExportTicket, Blocked>) -> (Reason, String) {
    let b = r.expect_err("refused");
    (b.reason, b.message)
}

#[test]
fn an_export_secret_of_a_trusted_install_gives_the_receiver_what_it_dials_with() {
    let w = World::new();
    let t = w.judge(&secret(&w.east)).expect("judged");
    assert_eq!(
        (t.install.as_str(), t.address.as_str()),
        ("east", "192.0.2.10:7451")
    );
    assert_eq!(t.credential, "09".repeat(32));
    assert_eq!(t.ca, w.east);
    assert!(
        !format!("{t:?}").contains("0909"),
        "the credential in {t:?}"
    );
}

#[test]
fn a_secret_not_in_an_export_secrets_shape_is_refused_naming_what_is_wrong() {
    let w = World::new();
    type Change = Box<dyn Fn(&mut Secret)>;
    let cases: Vec<(&str, Change, &str)> = vec![
        (
            "another type",
            Box::new(|s| s.type_ = Some("Opaque".into())),
            "of type \"Opaque\"",
        ),
        (
            "no credential",
            Box::new(|s| {
                s.data.as_mut().map(|d| d.remove("credential"));
            }),
            "has no key credential",
        ),
        (
            "a short credential",
            Box::new(|s| {
                s.data
                    .as_mut()
                    .map(|d| d.insert("credential".into(), ByteString(vec![1; 31])));
            }),
            "credential is not 32 bytes",
        ),
        (
            "a hostname for an address",
            Box::new(|s| {
                s.data.as_mut().map(|d| {
                    d.insert(
                        "address".into(),
                        ByteString(b"ferry.example.com:7451".to_vec()),
                    )
                });
            }),
            "is not an address:port",
        ),
        (
            "a bad install name",
            Box::new(|s| {
                s.data
                    .as_mut()
                    .map(|d| d.insert("install".into(), ByteString(b"East_1".to_vec())));
            }),
            "key install",
        ),
        (
            "an overlong uid",
            Box::new(|s| {
                s.data
                    .as_mut()
                    .map(|d| d.insert("export".into(), ByteString(vec![b'a'; 129])));
            }),
            "key export is 129 bytes",
        ),
        (
            "no CA",
            Box::new(|s| {
                s.data
                    .as_mut()
                    .map(|d| d.insert("ca.crt".into(), ByteString(b"not PEM".to_vec())));
            }),
            "key ca.crt",
        ),
    ];
    for (what, change, says) in cases {
        let mut s = secret(&w.east);
        change(&mut s);
        let (reason, message) = refusal(w.judge(&s));
        assert_eq!(reason, Reason::ExportNotFound, "{what}: {message}");
        assert!(message.contains(says), "{what}: {message}");
    }
}

#[test]
fn a_ca_no_ferrypeer_holds_for_that_install_or_a_closed_peer_is_not_trusted() {
    let mut w = World::new();
    // The tenant's own CA, for a trusted install's name.
    let own = ferry_link::Ca::generate("east")
        .expect("a CA")
        .cert_pem()
        .to_string();
    let (reason, message) = refusal(w.judge(&secret(&own)));
    assert_eq!(reason, Reason::PeerNotTrusted);
    assert!(
        message.contains("is not in FerryPeer \"east\"'s caBundle"),
        "{message}"
    );
    // An install no FerryPeer names.
    let mut s = secret(&w.east);
    s.data
        .as_mut()
        .map(|d| d.insert("install".into(), ByteString(b"north".to_vec())));
    assert!(refusal(w.judge(&s))
        .1
        .contains("no FerryPeer of this cluster names"));
    // A second, newer FerryPeer for the same install does not take the first's place.
    let mut dup = peer("east-again", "east", &own);
    dup.metadata.creation_timestamp = Some(Time(Timestamp::from_second(2_000).expect("a time")));
    w.peers.insert(0, dup);
    assert!(w.judge(&secret(&w.east)).is_ok(), "the older peer counts");
    w.peers.remove(0);
    w.peers[0].spec.imports = PeerAccess::Deny;
    assert!(refusal(w.judge(&secret(&w.east)))
        .1
        .contains("imports: Deny"));
    w.peers[0].spec.imports = PeerAccess::Allow;
    w.peers[0].spec.namespaces = Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("team".into(), "billing".into())])),
        ..LabelSelector::default()
    });
    assert!(refusal(w.judge(&secret(&w.east)))
        .1
        .contains("does not admit this namespace"));
    w.labels.insert("team".into(), "billing".into());
    assert!(w.judge(&secret(&w.east)).is_ok());
}

#[test]
fn the_operators_account_is_read_from_the_api_servers_refusal() {
    let m = "secrets \"db\" is forbidden: User \"system:serviceaccount:ferry-system:ferry-operator\" cannot get resource";
    assert_eq!(operator_account(m), "ferry-system:ferry-operator");
    assert!(operator_account("forbidden").starts_with('<'));
}
