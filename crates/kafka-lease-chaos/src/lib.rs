//! The pieces of the fault tests that need no cluster: the history format and its checker.
//! The binary (`main.rs`) brings the cluster up, runs the workload and the nemesis, and
//! writes the history these read.

pub mod checker;
pub mod history;
