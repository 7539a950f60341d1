//! The Ferry operator. Filled by the control-plane issue.
