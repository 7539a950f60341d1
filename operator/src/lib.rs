//! The Ferry operator: validation (the second of three checks: CRD rules at admission,
//! this, the agent at open time), volume resolution, shard scheduling, the CopyJob
//! reconciler, leader election, and the metrics and readiness served on `--listen`.

pub mod controller;
pub mod heartbeat;
pub mod leader;
pub mod metrics;
pub mod schedule;
pub mod validate;
pub mod volume;
