//! Running requests: the scheduler that spends each step's token budget
//! ([`scheduler`]), the engine loop that drives it, the model and the samplers
//! ([`engine`]), and the single-sequence generation loop of `flint run` ([`generate`](mod@generate)).

pub mod engine;
pub mod generate;
pub mod scheduler;

pub use engine::*;
pub use generate::*;
pub use scheduler::*;
