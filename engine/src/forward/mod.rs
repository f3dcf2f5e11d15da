//! The two forwards over one [`Model`](crate::model::Model): the device forward
//! ([`device`], batched, through the HAL) and the reference forward ([`reference`], one
//! token at a time in plain f32, the oracle the device forward is judged against), and
//! the per-op timings of the device forward ([`profile`]).

pub mod device;
pub mod profile;
pub mod reference;

pub use device::*;
pub use reference::Reference;
