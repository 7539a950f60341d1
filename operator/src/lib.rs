//! The Ferry operator: validation (the second of three checks: CRD rules at admission,
//! this, the agent at open time) and the CopyJob reconciler. Placement, shard assignment
//! and leader election come with the rest of the control-plane issue.

pub mod controller;
pub mod leader;
pub mod validate;
pub mod volume;
