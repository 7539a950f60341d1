//! The Ferry operator: validation (the second of three checks: CRD rules at admission,
//! this, the agent at open time), volume resolution, shard scheduling, the CopyJob
//! reconciler and leader election.

pub mod controller;
pub mod leader;
pub mod schedule;
pub mod validate;
pub mod volume;
