//! The KV cache: the manager of block pools and block tables by group ([`manager`]) and
//! the paged forward that reads and writes each layer's cache through them ([`paged`]).

pub mod manager;
pub mod paged;

pub use manager::*;
pub use paged::*;
