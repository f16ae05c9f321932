//! `resources/subscribe` and `resources/unsubscribe`: a subscription is
//! kept by the session that made it (over HTTP, [`crate::http`]'s; over
//! stdio, the process's) and ends with it.
//!
//! What a subscription watches depends on what its URI names:
//!
//! - a handle, or a job that has settled, never changes: the subscription
//!   is accepted and has nothing to send;
//! - a job not settled yet becomes its resource when it settles: the
//!   subscription waits for that on the fleet's notices and then sends
//!   `notifications/resources/updated` once;
//! - a declared resource (`[[resources]]`) is its tool's answer, which
//!   nothing announces: it is read again through its tool every
//!   [`crate::Options::watch_every`], as its subscriber, and each answer
//!   that differs from the last is announced.
//!
//! A request without a session (stateless HTTP) can subscribe only to what
//! never changes: there is nothing to send the updates on. Every URI is
//! checked as `resources/read` checks it, as the caller, so another
//! tenant's or user's resource is refused exactly as an unknown one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{ReadResourceResult, ResourceUpdatedNotificationParam};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, Peer, RoleServer};
use toolfleet_core::Principal;

use crate::resources::{self, Target};
use crate::{ToolServer, declared, internal};

/// Subscriptions one session holds at once, at most.
pub(crate) const MAX_WATCHES: usize = 100;
/// Of them, those to declared resources (each a call of its tool every
/// [`crate::Options::watch_every`]), at most.
pub(crate) const MAX_DECLARED_WATCHES: usize = 10;
/// The longest one wait for a job's outcome lasts before waiting again.
const SETTLE_ROUND: Duration = Duration::from_secs(30);

/// The subscriptions of one session: each URI's watch, stopped when it is
/// unsubscribed or the session ends.
#[derive(Default)]
pub(crate) struct Watches(Mutex<HashMap<String, Watch>>);

/// A running watch, aborted when dropped; `declared` when it reads a
/// declared resource again and again.
struct Watch {
    task: tokio::task::JoinHandle<()>,
    declared: bool,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watch>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a subscribed URI does.
enum Change {
    /// Nothing: it never changes.
    Never,
    /// It becomes readable when the job settles.
    Settles(String),
    /// It is read again and again through its declared tool; the first
    /// answer is the one to compare with.
    Declared(String),
}

impl ToolServer {
    /// `resources/subscribe` of `uri`, as the caller of `context`.
    pub(crate) async fn subscribe_to(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let principal = self.principal(context)?;
        let change = self.change_of(&principal, uri).await?;
        if matches!(change, Change::Never) {
            return Ok(());
        }
        if !self.streams(context) {
            return Err(ErrorData::invalid_request(
                format!(
                    "`{uri}` changes, and this request has no session to send its updates on: \
                     subscribe in a session (initialize over HTTP and send its Mcp-Session-Id)"
                ),
                None,
            ));
        }
        let mut watches = self.watches.lock();
        // A watch that has told its news (a job settled) holds no place.
        watches.retain(|_, watch| !watch.task.is_finished());
        if watches.contains_key(uri) {
            return Ok(());
        }
        if watches.len() >= MAX_WATCHES {
            return Err(ErrorData::invalid_request(
                format!(
                    "a session holds at most {MAX_WATCHES} subscriptions: unsubscribe from one first"
                ),
                None,
            ));
        }
        let declared = matches!(change, Change::Declared(_));
        if declared && watches.values().filter(|w| w.declared).count() >= MAX_DECLARED_WATCHES {
            return Err(ErrorData::invalid_request(
                format!(
                    "a session holds at most {MAX_DECLARED_WATCHES} subscriptions to declared resources: unsubscribe from one first"
                ),
                None,
            ));
        }
        let (server, peer, owned) = (self.clone(), context.peer.clone(), uri.to_owned());
        let task = tokio::spawn(async move {
            server.watch(principal, peer, owned, change).await;
        });
        watches.insert(uri.to_owned(), Watch { task, declared });
        Ok(())
    }

    /// `resources/unsubscribe` of `uri`: its watch stops; a URI not
    /// subscribed to is no error, but one that names no resource is.
    pub(crate) async fn unsubscribe_from(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.principal(context)?;
        if declared::find(&self.options.declared, uri).is_none() {
            resources::parse(uri)?;
        }
        self.watches.lock().remove(uri);
        Ok(())
    }

    /// How `uri` changes, once `principal` may read it; else why not, as
    /// `resources/read` would answer.
    async fn change_of(&self, principal: &Arc<Principal>, uri: &str) -> Result<Change, ErrorData> {
        if let Some((found, args)) = declared::find(&self.options.declared, uri) {
            let contents =
                declared::read(&self.runtime, principal.clone(), found, args, uri).await?;
            return Ok(Change::Declared(fingerprint(contents)));
        }
        let jobs = self.options.jobs.as_deref();
        match resources::parse(uri)? {
            Target::Job(id) => {
                let Some(jobs) = jobs else {
                    return Err(resources::not_found(uri));
                };
                match jobs.job(principal, &id).await {
                    Ok(Some(job)) if job.state.is_settled() => Ok(Change::Never),
                    Ok(Some(job)) => Ok(Change::Settles(job.id)),
                    Ok(None) => Err(resources::not_found(uri)),
                    Err(error) => Err(internal("reading a job", error.message)),
                }
            }
            Target::Handle { .. } => {
                resources::read(&self.runtime, jobs, principal, uri).await?;
                Ok(Change::Never)
            }
        }
    }

    /// Sends `notifications/resources/updated` of `uri` to `peer` each
    /// time it changes, until the session ends or nothing more can change.
    async fn watch(
        self,
        principal: Arc<Principal>,
        peer: Peer<RoleServer>,
        uri: String,
        change: Change,
    ) {
        match change {
            Change::Never => {}
            Change::Settles(id) => {
                let Some(jobs) = self.options.jobs.clone() else {
                    return;
                };
                loop {
                    match jobs.watch_settled(&principal, &id, SETTLE_ROUND).await {
                        Ok(Some(job)) if job.state.is_settled() => {
                            let _ = peer
                                .notify_resource_updated(ResourceUpdatedNotificationParam::new(
                                    uri.clone(),
                                ))
                                .await;
                            return;
                        }
                        Ok(Some(_)) => {}
                        // Gone (deleted) or unreadable: nothing will come.
                        Ok(None) => return,
                        Err(error) => {
                            tracing::warn!(%error, job_id = %id, "mcp: a subscribed job cannot be followed; trying again");
                            tokio::time::sleep(SETTLE_ROUND / 10).await;
                        }
                    }
                    if peer.is_transport_closed() {
                        return;
                    }
                }
            }
            Change::Declared(mut last) => {
                let mut tick = tokio::time::interval(self.options.watch_every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    if peer.is_transport_closed() {
                        return;
                    }
                    let Some((found, args)) = declared::find(&self.options.declared, &uri) else {
                        return;
                    };
                    let read =
                        declared::read(&self.runtime, principal.clone(), found, args, &uri).await;
                    // A read that fails (its tool erred, or was limited) is
                    // no change: the next one tells.
                    let Ok(contents) = read else { continue };
                    let now = fingerprint(contents);
                    if now != last {
                        last = now;
                        if peer
                            .notify_resource_updated(ResourceUpdatedNotificationParam::new(
                                uri.clone(),
                            ))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// What a read answered, to compare with the next.
fn fingerprint(contents: rmcp::model::ResourceContents) -> String {
    serde_json::to_string(&ReadResourceResult::new(vec![contents])).unwrap_or_default()
}
