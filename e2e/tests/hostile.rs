//! A hostile tenant and a hostile pod on the cluster network, against Ferry on the local
//! control plane with the chart's RBAC and policies (issue 31, "tenant safety, round
//! three"). One module a class of hole; each test shows what the user (or the tenant next
//! door) would check: the operator and agents stay up and bounded, other tenants' copies
//! still finish, nothing is reported verified that was not compared, nothing in a tenant's
//! volume is opened before it is known to be a regular file or directory.
//!
//! The README's security model names the test of each class.

#[path = "hostile/devices.rs"]
mod devices;
#[path = "hostile/holder.rs"]
mod holder;
#[path = "hostile/listeners.rs"]
mod listeners;
#[path = "hostile/pods.rs"]
mod pods;
#[path = "hostile/spec.rs"]
mod spec;
#[path = "hostile/watch.rs"]
mod watch;
