//! The peering port's decision on a hello, on exports as the operator's status leaves them.

use ferry_crds::{CopyExportSpec, CopyExportStatus, ExportCredential, ExportReader, ExportSource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::*;

const CREDENTIAL: [u8; 32] = [3; 32];
const JOB: &[u8] = b"9a2b7c4d-1e3f-4a5b-8c6d-7e8f9a0b1c2d";

fn now() -> Timestamp {
    Timestamp::from_second(2_000_000_000).expect("a time")
}

fn at(secs_from_now: i64) -> Time {
    Time(now() + k8s_openapi::jiff::SignedDuration::from_secs(secs_from_now))
}

/// A Ready export for reader west/shop-dr, expiring in an hour, with `credentials`.
fn export(credentials: Vec<ExportCredential>) -> CopyExport {
    let mut e = CopyExport::new(
        "db",
        CopyExportSpec {
            source: ExportSource {
                pvc: Some("data".into()),
                ..ExportSource::default()
            },
            readers: vec![ExportReader {
                peer: "west".into(),
                namespace: "shop-dr".into(),
            }],
            expires: None,
            ttl: Some("1h".into()),
            renew: 0,
            max_readers: 1,
            rotate: 0,
            bandwidth_limit: None,
        },
    );
    e.metadata.namespace = Some("shop".into());
    e.metadata.generation = Some(2);
    e.status = Some(CopyExportStatus {
        observed_generation: Some(2),
        conditions: vec![condition("True", "Ready")],
        renewed_at: Some(at(-60)),
        expires_at: Some(at(3600)),
        secret_name: Some("db-ferry-export".into()),
        address: Some("192.0.2.10:7451".into()),
        node: Some("node-a".into()),
        credentials,
    });
    e
}

fn condition(status: &str, reason: &str) -> Condition {
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: format!("{reason} here"),
        last_transition_time: at(-60),
        observed_generation: Some(2),
    }
}

fn current() -> ExportCredential {
    ExportCredential {
        sha256: ferry_link::credential_hash(&CREDENTIAL),
        rotation: 0,
        until: None,
    }
}

fn hello(credential: [u8; 32], namespace: &str) -> ExportHello {
    ExportHello {
        version: ferry_transfer::frame::VERSION,
        export: b"uid".to_vec(),
        credential,
        job: JOB.to_vec(),
        namespace: namespace.as_bytes().to_vec(),
        shard: 0,
        epoch: 1,
        path: Vec::new(),
        bandwidth_limit: 0,
    }
}

fn why(r: Result<(), Refusal>) -> Option<Why> {
    r.err().map(|r| r.reason)
}

fn ask(e: &CopyExport, h: &ExportHello, peer: Option<&str>) -> Option<Why> {
    why(check(e, h, "west-install", peer, now()))
}

#[test]
fn the_current_credential_from_a_listed_reader_is_served() {
    let e = export(vec![current()]);
    assert_eq!(ask(&e, &hello(CREDENTIAL, "shop-dr"), Some("west")), None);
}

#[test]
fn a_stolen_guess_a_rotated_credential_past_its_grace_and_an_empty_status_get_nothing() {
    let e = export(vec![current()]);
    assert_eq!(
        ask(&e, &hello([4; 32], "shop-dr"), Some("west")),
        Some(Why::BadCredential)
    );
    // Rotated: the previous one is good until its grace ends, then not.
    let mut previous = current();
    previous.rotation = 0;
    let fresh = ExportCredential {
        sha256: ferry_link::credential_hash(&[9; 32]),
        rotation: 1,
        until: None,
    };
    previous.until = Some(at(60));
    let e = export(vec![fresh.clone(), previous.clone()]);
    assert_eq!(ask(&e, &hello(CREDENTIAL, "shop-dr"), Some("west")), None);
    previous.until = Some(at(-1));
    let e = export(vec![fresh, previous]);
    assert_eq!(
        ask(&e, &hello(CREDENTIAL, "shop-dr"), Some("west")),
        Some(Why::BadCredential)
    );
    assert_eq!(
        ask(
            &export(Vec::new()),
            &hello(CREDENTIAL, "shop-dr"),
            Some("west")
        ),
        Some(Why::BadCredential)
    );
}

#[test]
fn only_a_listed_peer_and_namespace_may_read_and_a_bad_credential_learns_not_even_that() {
    let e = export(vec![current()]);
    assert_eq!(
        ask(&e, &hello(CREDENTIAL, "other"), Some("west")),
        Some(Why::NotAReader)
    );
    assert_eq!(
        ask(&e, &hello(CREDENTIAL, "shop-dr"), Some("north")),
        Some(Why::NotAReader)
    );
    assert_eq!(
        ask(&e, &hello(CREDENTIAL, "shop-dr"), None),
        Some(Why::NotAReader)
    );
    assert_eq!(
        ask(&e, &hello([0; 32], "other"), Some("north")),
        Some(Why::BadCredential)
    );
}

#[test]
fn a_deleted_unready_stale_or_expired_export_is_refused_saying_which() {
    let h = hello(CREDENTIAL, "shop-dr");
    let mut e = export(vec![current()]);
    e.metadata.deletion_timestamp = Some(at(-1));
    assert_eq!(ask(&e, &h, Some("west")), Some(Why::Deleted));
    let mut e = export(vec![current()]);
    e.status.as_mut().expect("status").conditions = vec![condition("False", "SourceNotFound")];
    assert_eq!(ask(&e, &h, Some("west")), Some(Why::NotReady));
    let mut e = export(vec![current()]);
    e.metadata.generation = Some(3);
    assert_eq!(
        ask(&e, &h, Some("west")),
        Some(Why::NotReady),
        "a spec the operator has not judged"
    );
    let mut e = export(vec![current()]);
    e.status.as_mut().expect("status").conditions = vec![condition("False", "Expired")];
    assert_eq!(ask(&e, &h, Some("west")), Some(Why::Expired));
    // The clock passed the expiry before the operator said so.
    let mut e = export(vec![current()]);
    e.status.as_mut().expect("status").expires_at = Some(at(-1));
    assert_eq!(ask(&e, &h, Some("west")), Some(Why::Expired));
}

#[test]
fn a_second_job_gets_nothing_while_the_first_holds_the_only_slot() {
    let e = export(vec![current()]);
    let holders = std::sync::Arc::new(Holders::default());
    let h = hello(CREDENTIAL, "shop-dr");
    assert_eq!(ask(&e, &h, Some("west")), None);
    let first = holders.take(&e, &h).expect("the first job's slot");
    // The same job again (its second connection) is let in; another job is not.
    let again = holders
        .take(&e, &h)
        .expect("the same job's second connection");
    let mut other = h.clone();
    other.job = b"another-job".to_vec();
    assert_eq!(
        ask(&e, &other, Some("west")),
        None,
        "all but the slot is fine"
    );
    assert_eq!(
        holders.take(&e, &other).map(drop).map_err(|r| r.reason),
        Err(Why::InUse)
    );
    // Held until its last connection ends.
    drop(first);
    assert!(holders.take(&e, &other).is_err());
    drop(again);
    assert!(holders.take(&e, &other).is_ok());
}

#[test]
fn a_reader_gets_paths_beneath_the_export_and_never_the_roots_state_directory() {
    let ok = |e: &str, a: &str| served_path(e, a.as_bytes()).expect("served");
    assert_eq!(ok("db", ""), "db");
    assert_eq!(ok("db", "2026/jan"), "db/2026/jan");
    assert_eq!(ok("", "2026"), "2026");
    assert_eq!(ok(".", ""), "");
    // A whole root exported: its .ferry is still not served, however it is named.
    for asked in [".ferry", ".ferry/journal", "./.ferry", ".//.ferry/x"] {
        let r = served_path("", asked.as_bytes()).expect_err(asked);
        assert_eq!(r.reason, Why::PathOutsideExport, "{asked}");
    }
    // Beneath a subdirectory, a name .ferry is the tenant's own.
    assert_eq!(ok("db", ".ferry"), "db/.ferry");
    assert!(served_path("db", &[0xff]).is_err());
}

#[test]
fn a_reader_is_served_no_faster_than_the_lower_of_the_exports_limit_and_its_own() {
    let rate = |own: Option<&str>, theirs: u64| {
        let mut e = export(vec![current()]);
        e.spec.bandwidth_limit = own.map(str::to_string);
        let mut h = hello(CREDENTIAL, "shop-dr");
        h.bandwidth_limit = theirs;
        served_rate(&e, &h).map_err(|r| r.reason)
    };
    assert_eq!(rate(None, 0), Ok(None));
    assert_eq!(rate(Some("200Mi"), 0), Ok(Some(200 << 20)));
    assert_eq!(rate(None, 8 << 20), Ok(Some(8 << 20)));
    assert_eq!(rate(Some("2Mi"), 8 << 20), Ok(Some(2 << 20)));
    assert_eq!(rate(Some("64Mi"), 8 << 20), Ok(Some(8 << 20)));
    // A reader cannot ask for a crawl that holds the export's slot: 1 MiB/s at least.
    assert_eq!(rate(None, 1), Ok(Some(1 << 20)));
    assert_eq!(rate(Some("fast"), 0), Err(Why::NotReady));
}
