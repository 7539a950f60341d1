//! The Ferry operator. Today: the validation a CopyJob goes through in the controller (the
//! second of three checks: CRD rules at admission, this, the agent at open time). The
//! reconciler, resolution and placement come with the control-plane issue.

pub mod validate;
