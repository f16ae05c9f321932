//! The fleet: what moves a job between the HTTP edge and the store, in one
//! place. A call of a job tool is submitted here ([`dispatch::Dispatcher`]:
//! the row, then the answer, then the message from the [`outbox`], which
//! also publishes what a process that fell silent left unpublished), every change of a job or ticket is announced
//! from here ([`events`], [`announcer`]), what a crash or a lost message
//! left behind is published again by the [`sweeper`], what settled long ago
//! is deleted by [`retention`], an answered ticket
//! wakes what waits on it ([`tickets`]), and the backends a configuration
//! names are chosen and opened in [`backends`], the one place a backend is
//! chosen.
//!
//! The job's states and transitions are [`toolfleet_core::lifecycle`]'s; the
//! store executes them. This crate decides no state of its own, runs no
//! job (the worker does) and serves no HTTP (the server does): the
//! dispatcher, the worker and the binary only wire what is here.

pub mod announcer;
pub mod backends;
pub mod dead_letters;
pub mod dispatch;
pub mod events;
pub mod handles;
pub mod limits;
pub mod outbox;
pub mod retention;
pub mod runs;
pub mod schedules;
pub mod sweeper;
#[cfg(test)]
mod testing;
pub mod tickets;

pub use announcer::Announcer;
pub use dispatch::{Dispatcher, Fault, StoreAuditSink, StoreCommitLog, store_error};
pub use events::{job_event, ticket_event, ticket_view};
pub use handles::{HandleBounds, StoreHandles};
pub use outbox::{Outbox, run_outbox};
pub use sweeper::{run_sweeper, sweep};
