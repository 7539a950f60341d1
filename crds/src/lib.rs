//! Ferry API types (`CopyJob`, `StorageRoot`). Filled by the control-plane issue; this crate does no I/O.
