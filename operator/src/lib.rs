//! The Ferry operator: validation (the second of three checks: CRD rules at admission,
//! this, the agent at open time), volume resolution, shard scheduling, the CopyJob
//! reconciler, the CopySchedule controller, the volume populator, claim migrations, the signer of the agents' transfer certificates,
//! leader election, and the metrics and readiness served on `--listen`.
//!
//! Modules depend one way: `controller` (wiring) on `apply` (the finalizer's two sides),
//! which uses `resolve`, `decide`, `status`, `schedule`, `heartbeat` and `ticket`; `copyschedule`
//! (its own wiring and I/O) on `copyschedule::decide`, which uses `cron`, `status` and
//! `validate`; `populator` (its two controllers' wiring and I/O) on `populator::decide`,
//! which knows only the API types and `status`; `migrate` (the ClaimMigration controller's wiring and
//! I/O) on `migrate::decide`, which knows only the API types and `status`; `metrics` (which reads schedules with `cron`) and `leader` know nothing of
//! the controllers (`main` passes what they need in); `signer` stands alone, and so does
//! `peering` (this install's peering CA and the FerryPeer controller, on `peering::decide`),
//! which starts `export` (the CopyExport controller, on `export::decide`, which judges
//! readers with `peering::decide`).

pub mod apply;
pub mod controller;
pub mod copyschedule;
pub mod cron;
pub mod decide;
mod error;
pub mod export;
pub mod heartbeat;
pub mod holder;
pub mod import;
pub mod leader;
pub mod metrics;
pub mod migrate;
pub mod peering;
pub mod populator;
pub mod schedule;
pub mod signer;
pub mod snapshot;
pub mod status;
pub mod ticket;

/// The tenant rules and volume resolution, shared with the agents.
pub use ferry_resolve::{self as resolve, validate, volume};

pub use error::{error_chain, Error};
