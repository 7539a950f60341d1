//! The Ferry node agent. `cli` parses the command line; `copy_cmd` is `ferry-agent copy`;
//! `daemon` is `ferry-agent run`, the per-node agent; `serve` its /metrics, /healthz and
//! /readyz endpoints; `flush` the `syncfs` that shards finishing together share.

pub mod cli;
pub mod copy_cmd;
pub mod daemon;
pub mod flush;
pub mod serve;
