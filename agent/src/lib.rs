//! The Ferry node agent. `cli` parses the command line; `copy_cmd` is `ferry-agent copy`.

pub mod cli;
pub mod copy_cmd;
