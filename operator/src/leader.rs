//! Leader election through a coordination.k8s.io Lease, so two operator replicas can run
//! and only one reconciles. Optimistic concurrency (the Lease's resourceVersion) decides
//! races; a leader that cannot renew before its lease expires exits, and the other replica
//! takes over once the lease has expired.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// How long a lease is valid without renewal, and how often the leader renews it.
pub const LEASE_SECONDS: i32 = 15;
const RENEW_EVERY: Duration = Duration::from_secs(5);
const RETRY_EVERY: Duration = Duration::from_secs(2);

fn expired(spec: &LeaseSpec) -> bool {
    let (Some(renew), Some(secs)) = (&spec.renew_time, spec.lease_duration_seconds) else {
        return true;
    };
    renew.0.as_second() + i64::from(secs) < Timestamp::now().as_second()
}

fn claim(name: &str, me: &str, previous: Option<&Lease>) -> Lease {
    let now = MicroTime(Timestamp::now());
    let prev_spec = previous.and_then(|l| l.spec.clone()).unwrap_or_default();
    let same_holder = prev_spec.holder_identity.as_deref() == Some(me);
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            resource_version: previous.and_then(|l| l.metadata.resource_version.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(me.into()),
            lease_duration_seconds: Some(LEASE_SECONDS),
            acquire_time: if same_holder {
                prev_spec.acquire_time
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(
                prev_spec.lease_transitions.unwrap_or(0)
                    + i32::from(!same_holder && previous.is_some()),
            ),
            ..Default::default()
        }),
    }
}

/// One attempt to take or keep the lease: `Ok(true)` when we hold it now.
async fn try_acquire(leases: &Api<Lease>, name: &str, me: &str) -> Result<bool, kube::Error> {
    match leases.get_opt(name).await? {
        None => match leases
            .create(&PostParams::default(), &claim(name, me, None))
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        },
        Some(current) => {
            let spec = current.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(me) && !expired(&spec) {
                return Ok(false);
            }
            // resourceVersion makes this a compare-and-swap: one contender wins.
            match leases
                .replace(
                    name,
                    &PostParams::default(),
                    &claim(name, me, Some(&current)),
                )
                .await
            {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// Wait until this replica leads, then keep the lease renewed in the background; if it
/// cannot be renewed in time, the process exits so the other replica can take over.
/// Each successful look at the lease is reported to `lease_checked`: `true` when this
/// replica leads, `false` when it stands by.
pub async fn acquire(
    client: Client,
    namespace: &str,
    name: &str,
    me: &str,
    lease_checked: impl Fn(bool) + Send + 'static,
) {
    let leases = Api::<Lease>::namespaced(client, namespace);
    loop {
        match try_acquire(&leases, name, me).await {
            Ok(true) => {
                lease_checked(true);
                break;
            }
            Ok(false) => lease_checked(false),
            Err(e) => tracing::warn!(error = %crate::error_chain(&e), "leader election"),
        }
        tokio::time::sleep(RETRY_EVERY).await;
    }
    tracing::info!(identity = me, "leading");
    let (name, me) = (name.to_string(), me.to_string());
    tokio::spawn(async move {
        let mut last_renewal = std::time::Instant::now();
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            match try_acquire(&leases, &name, &me).await {
                Ok(true) => {
                    last_renewal = std::time::Instant::now();
                    lease_checked(true);
                }
                Ok(false) => {
                    tracing::error!("lost the leader lease to another replica; exiting");
                    std::process::exit(1);
                }
                Err(e) => tracing::warn!(error = %crate::error_chain(&e), "lease renewal failed"),
            }
            if last_renewal.elapsed() >= Duration::from_secs(LEASE_SECONDS as u64) - RENEW_EVERY {
                tracing::error!("could not renew the leader lease in time; exiting");
                std::process::exit(1);
            }
        }
    });
}
