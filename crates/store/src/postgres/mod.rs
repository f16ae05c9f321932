//! The PostgreSQL store: the distributed backend, shared by every dispatcher
//! and worker of a fleet.
//!
//! This module owns the SQL of every transition of a job, ticket, run and
//! command outcome for PostgreSQL, the connection pool (deadpool-postgres, with a
//! bounded wait so calls during an outage answer promptly) and the schema:
//! migrations embedded from `migrations/postgres`, applied only by
//! [`migrate`] (`toolfleet migrate`), and checked by [`PgStore::connect`],
//! which refuses a schema it does not know. It must never read a job and
//! then write it: each transition is one conditional `UPDATE ... RETURNING`
//! (or `INSERT ... ON CONFLICT`), so two workers or two processes cannot both
//! win. It must never migrate on connect, and never panic on what it reads:
//! a row it cannot decode is a
//! [`StoreError::Unavailable`](crate::StoreError::Unavailable) naming the row.
//!
//! Every connection, the pool's and `toolfleet migrate`'s, honours the URL's
//! `sslmode` and `sslrootcert` as libpq does (or [`PgConnectOptions::ca_file`]
//! for the CA), through rustls: see `toolfleet_tls::postgres`.
//!
//! Its parts: `statements`, the SQL text; `schema`, connecting, the pool and
//! the schema; `rows`, reading rows and binding records; `store`, the
//! operations of [`Store`](crate::Store); `groups`, the operations grouped
//! into shared commits.

use std::sync::Arc;

use deadpool_postgres::Pool;

mod groups;
mod rows;
mod schema;
mod statements;
mod store;

pub use schema::{PgConnectOptions, migrate, migrate_in_schema, migrate_with};

/// The PostgreSQL implementation of [`Store`](crate::Store).
pub struct PgStore {
    pool: Pool,
    /// Where the store is, for messages: host, port, database and schema,
    /// never the password.
    place: Arc<str>,
    /// The operations every job pays for, grouped into shared commits.
    groups: groups::Groups,
}
