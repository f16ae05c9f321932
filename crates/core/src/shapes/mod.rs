//! The contracts of the shapes that need more than running the executor:
//! the two-step command, the handle kept by the runtime, and the hand-off of
//! jobs, agents and human questions to the fleet.

pub mod command;
pub mod fleet;
pub mod handle;
