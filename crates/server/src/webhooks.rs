//! Webhooks: when a job settles or a ticket is answered, the call's
//! `callback_url` gets the final envelope plus `event`, `run_id` and
//! `tenant`, signed with `Toolfleet-Signature: t=<unix seconds>,v1=<hex
//! HMAC-SHA256 of "t.body">` under its tenant's key, named by
//! `Toolfleet-Delivery: <id>` (the same on every attempt), and retried with
//! backoff until it answers 2xx.
//!
//! This module sends only to URLs stored with a job or ticket, whose
//! allow-list was checked when the call was accepted; each attempt checks
//! the URL again against its tenant's allow-list ([`crate::callbacks`]) and
//! connects only to the addresses that passed, without redirects or a
//! proxy. A URL the allow-list now refuses is given up at once.
//!
//! Each attempt is counted in `toolfleet_webhook_deliveries_total{outcome}`
//! (delivered, failed or refused), and a notice given up in
//! `toolfleet_webhook_abandoned_total`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use toolfleet_broker::{Event, EventKind, EventState, Notices, RunNotice, TicketState};
use toolfleet_core::Metrics;
use toolfleet_store::{ClaimNotice, SettleNotice, Store, StoreError};

use crate::callbacks::{self, AllowRule, Destination, Refusal};
use toolfleet_core::now_ms;
use toolfleet_fleet::dispatch::POLL_AFTER_S;
use toolfleet_fleet::{job_event, ticket_event};

/// Attempts per delivery before it is given up (and logged).
const MAX_ATTEMPTS: usize = 12;
/// How long one dispatcher holds a notice before another may send it.
const CLAIM_MS: i64 = 30 * 60 * 1000;
/// How long a notice's record is kept, claimed or sent: neither a
/// redelivered event nor a search of the store sends it again in that time.
const KEEP_MS: i64 = 24 * 3600 * 1000;

/// The signature header value of `body` at `t`.
pub fn signature(key: &[u8], t: u64, body: &str) -> String {
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    mac.update(format!("{t}.{body}").as_bytes());
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// The webhook settings of one tenant: what its `callback_url`s may reach
/// and the key its notices are signed with.
#[derive(Clone)]
pub struct HookSettings {
    /// Which `callback_url`s the tenant's calls may name.
    pub allow: Arc<[AllowRule]>,
    /// The key the tenant's notices are signed with.
    pub key: Arc<[u8]>,
}

/// Every tenant's webhook settings: its own where the configuration gives
/// them (`[tenants.<name>.webhooks]`), else the global ones.
#[derive(Clone)]
pub struct Webhooks {
    global: HookSettings,
    tenants: HashMap<String, HookSettings>,
}

impl Webhooks {
    /// Every tenant on `global`.
    pub fn new(global: HookSettings) -> Self {
        Webhooks {
            global,
            tenants: HashMap::new(),
        }
    }

    /// `tenant` on settings of its own.
    pub fn with_tenant(mut self, tenant: impl Into<String>, settings: HookSettings) -> Self {
        self.tenants.insert(tenant.into(), settings);
        self
    }

    /// The settings of `tenant`.
    pub fn of(&self, tenant: &str) -> &HookSettings {
        self.tenants.get(tenant).unwrap_or(&self.global)
    }

    /// Whether some tenant's calls may name a callback: an allow-list has
    /// an entry.
    pub fn admit_any(&self) -> bool {
        !self.global.allow.is_empty() || self.tenants.values().any(|s| !s.allow.is_empty())
    }
}

/// Makes the builder of one delivery attempt's HTTP client with its TLS
/// and user agent; the attempt adds the rest (its checked addresses, no
/// redirects, no proxy).
pub type ClientBase = Arc<dyn Fn() -> reqwest::ClientBuilder + Send + Sync>;

/// The callback of an event's job or ticket, if the call named one.
async fn callback_of(store: &dyn Store, event: &Event) -> Option<String> {
    if !event.callback {
        return None;
    }
    match (event.kind, event.state) {
        (EventKind::Job, _) if event.is_settled_job() => {
            store
                .job_by_id(&event.id)
                .await
                .ok()
                .flatten()?
                .callback_url
        }
        (EventKind::Ticket, EventState::Ticket(TicketState::Answered)) => {
            store
                .ticket(&event.tenant, &event.id)
                .await
                .ok()
                .flatten()?
                .callback_url
        }
        (EventKind::Run, EventState::Run(notice)) if notice != RunNotice::Step => {
            store
                .run(&event.tenant, &event.id)
                .await
                .ok()
                .flatten()?
                .callback_url
        }
        _ => None,
    }
}

/// The body of a notice: the final envelope plus `event`, `run_id` and
/// `tenant`.
pub fn notice_body(event: &Event) -> Value {
    let mut body = match event.body.as_ref() {
        Value::Object(map) => Value::Object(map.clone()),
        other => json!({ "body": other }),
    };
    body["event"] = match event.state {
        EventState::Run(notice) => json!(format!("run.{}", notice.name())),
        state => json!(format!("{}.{}", event.kind, state)),
    };
    body["run_id"] = json!(event.run_id);
    body["tenant"] = json!(event.tenant);
    match event.kind {
        EventKind::Ticket => body["ticket"] = json!(event.id),
        EventKind::Job => body["job_id"] = json!(event.id),
        // A run's entries are for its event stream; the notice is the run.
        EventKind::Run => {
            if let Some(map) = body.as_object_mut() {
                map.remove("entries");
            }
        }
    }
    body
}

/// Sends notices until `stopped` turns true, counting them in `metrics`:
/// each settled job or answered ticket whose event this process hears (its
/// subscription made again, with backoff, whenever it fails or ends), and
/// (every `CATCH_UP_EVERY`, ten seconds) each settled job and answered
/// ticket with a callback whose notice nobody claimed, found in the store:
/// an event that every dispatcher missed (all were down, or reconnecting to
/// the notices) still gets its webhook. The commit log keeps every notice
/// to one sender, and records it delivered or given up. Not covered: a
/// notice whose sender died while it held the claim (30 minutes), which
/// only a dispatcher starting within the hour after finds.
pub async fn deliver(
    store: Arc<dyn Store>,
    notices: Arc<dyn Notices>,
    webhooks: Arc<Webhooks>,
    client: ClientBase,
    metrics: Arc<Metrics>,
    mut stopped: watch::Receiver<bool>,
) {
    let sender = Arc::new(Sender {
        store,
        client,
        webhooks,
        metrics,
    });
    tokio::spawn(catch_up(sender.clone(), stopped.clone()));
    // No allow-list has an entry: no call can name a callback, and the
    // notice of one an earlier configuration let through would be refused
    // (the store's search still finds it and says so). Not listening keeps
    // outcomes from being routed here: over RabbitMQ, while nobody else
    // waits for a job's outcome, its event is not even made.
    if !sender.webhooks.admit_any() {
        return;
    }
    let pauses = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(10))
        .with_jitter()
        .without_max_times();
    loop {
        let Some(mut events) = subscribe(notices.as_ref(), pauses, &mut stopped).await else {
            return;
        };
        loop {
            let event = tokio::select! {
                event = events.next() => event,
                _ = stopped.changed() => return,
            };
            // Ended (the notices closed for now): subscribe again.
            let Some(event) = event else { break };
            let Some(url) = callback_of(sender.store.as_ref(), &event).await else {
                continue;
            };
            sender.notify(&event, url).await;
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = stopped.changed() => return,
        }
    }
}

/// The webhooks' subscription, to outcomes alone (see `callback_of`):
/// tried again after `pauses` while the notices refuse it (the store's
/// unsent notices are still sent meanwhile); `None` once `stopped` or once
/// the notices are closed for good.
async fn subscribe(
    notices: &dyn Notices,
    pauses: ExponentialBuilder,
    stopped: &mut watch::Receiver<bool>,
) -> Option<Box<dyn toolfleet_broker::Subscription>> {
    let mut pauses = pauses.build();
    loop {
        if *stopped.borrow() {
            return None;
        }
        let error = match notices.subscribe_settled().await {
            Ok(events) => return Some(events),
            Err(toolfleet_broker::BrokerError::Closed) => return None,
            Err(error) => error,
        };
        let pause = pauses.next().unwrap_or(Duration::from_secs(10));
        tracing::warn!(%error, ?pause, "webhooks: cannot subscribe to events yet; sending what the store shows unsent meanwhile");
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stopped.changed() => return None,
        }
    }
}

/// How often the store is searched for notices nobody sent.
const CATCH_UP_EVERY: Duration = Duration::from_secs(10);
/// How long after a job settles (or a ticket is answered) its notice is
/// left to the event's listeners before the store search takes it.
const CATCH_UP_GRACE_MS: i64 = 10_000;
/// How far each search reaches back over the last one's range: a job's
/// settling time comes from its worker's clock and its commit may come
/// later, so a job can appear behind a range already searched. Searching
/// again costs a walk of the settled jobs with callbacks in this span.
const CATCH_UP_OVERLAP_MS: i64 = 60_000;
/// How far back a search looks at most: the first one, for notices of jobs
/// settled while no dispatcher ran, and any after searches that failed.
/// Well within the day a sent notice's record is kept, so none is sent
/// twice.
const CATCH_UP_LOOKBACK_MS: i64 = 3_600_000;
/// Jobs or tickets taken per page of a search.
const CATCH_UP_PAGE: u32 = 200;
/// The key of the notice of `event`. Every dispatcher hears every event;
/// the first to claim the key sends the notice. A run waits and resumes
/// many times: each of its versions has a notice of its own. So has each
/// life of a job put back, named past its first
/// (`webhook:job:<id>:<state>:<life>`, from `Event::life`, the life the
/// event was made in, so a retry made meanwhile does not move the key),
/// and its new outcome is announced under a `Toolfleet-Delivery` of its
/// own.
fn notice_key(event: &Event) -> String {
    let life = event.life;
    match event.kind {
        EventKind::Run => format!(
            "webhook:run:{}:{}:{}",
            event.id,
            event.state,
            event.body["version"].as_i64().unwrap_or(0)
        ),
        _ if life > 0 => format!("webhook:{}:{}:{}:{life}", event.kind, event.id, event.state),
        _ => format!("webhook:{}:{}:{}", event.kind, event.id, event.state),
    }
}

/// The commit-log key prefix of a job's notice: `webhook:job:<id>:<state>`
/// (and `:<life>` once it was put back).
const JOB_NOTICE: &str = "webhook:job:";
/// The commit-log key prefix of a ticket's notice:
/// `webhook:ticket:<id>:answered`.
const TICKET_NOTICE: &str = "webhook:ticket:";

/// What a store search for notices nobody sent looks at.
#[derive(Clone, Copy, Debug)]
enum Unsent {
    /// Settled jobs, by the time they settled.
    Jobs,
    /// Answered tickets, by the time they were answered.
    Tickets,
}

/// Sends the notices of settled jobs and answered tickets that nobody
/// claimed, oldest first, until `stopped`; each kind's search goes on from
/// where its own last one ended.
async fn catch_up(sender: Arc<Sender>, mut stopped: watch::Receiver<bool>) {
    let start = now_ms() - CATCH_UP_LOOKBACK_MS;
    let (mut jobs, mut tickets) = (start, start);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(CATCH_UP_EVERY) => {}
            _ = stopped.changed() => return,
        }
        let now = now_ms();
        jobs = sender.catch_up_once(Unsent::Jobs, jobs, now).await;
        tickets = sender.catch_up_once(Unsent::Tickets, tickets, now).await;
    }
}

impl Sender {
    /// One search at `now` for notices of `kind` nobody claimed, from
    /// `since` (or the lookback before `now`, if later) until the grace
    /// before `now`, page after page, each notice claimed and sent;
    /// answers where the next search of that kind starts. A search that
    /// failed, or a page whose notices could not be claimed (the commit log
    /// failed), leaves `since` where it was, so nothing behind it is
    /// skipped.
    async fn catch_up_once(&self, kind: Unsent, since: i64, now: i64) -> i64 {
        let since = since.max(now - CATCH_UP_LOOKBACK_MS);
        let until = now - CATCH_UP_GRACE_MS;
        let store = self.store.as_ref();
        let done = match kind {
            Unsent::Jobs => {
                self.catch_up_pages(|| async {
                    let jobs = store
                        .unnotified_jobs(toolfleet_store::Unnotified {
                            notice_prefix: JOB_NOTICE,
                            since,
                            until,
                            limit: CATCH_UP_PAGE,
                        })
                        .await?;
                    Ok(jobs
                        .iter()
                        .map(|job| (job_event(job, POLL_AFTER_S), job.callback_url.clone()))
                        .collect())
                })
                .await
            }
            Unsent::Tickets => {
                self.catch_up_pages(|| async {
                    let tickets = store
                        .unnotified_tickets(toolfleet_store::Unnotified {
                            notice_prefix: TICKET_NOTICE,
                            since,
                            until,
                            limit: CATCH_UP_PAGE,
                        })
                        .await?;
                    Ok(tickets
                        .iter()
                        .map(|ticket| (ticket_event(ticket), ticket.callback_url.clone()))
                        .collect())
                })
                .await
            }
        };
        if done {
            since.max(until - CATCH_UP_OVERLAP_MS)
        } else {
            since
        }
    }

    /// Claims and sends the notices of each page `search` finds (the events
    /// of settled jobs or answered tickets with their callbacks) until a
    /// page is short; true when every one found was claimed. A claimed
    /// notice leaves the search's answers, so each page is the same search
    /// again.
    async fn catch_up_pages<F, Fut>(&self, search: F) -> bool
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Vec<(Event, Option<String>)>, StoreError>>,
    {
        loop {
            let found = match search().await {
                Ok(found) => found,
                Err(error) => {
                    tracing::warn!(%error, "webhooks: cannot search the store for unsent notices");
                    return false;
                }
            };
            let mut claimed = true;
            for (event, url) in &found {
                let Some(url) = url.clone() else { continue };
                tracing::info!(kind = %event.kind, id = %event.id, state = %event.state, "webhooks: sending a notice no listener sent");
                claimed &= self.notify(event, url).await;
            }
            if !claimed {
                return false;
            }
            if found.len() < CATCH_UP_PAGE as usize {
                return true;
            }
        }
    }
}

/// What sending a notice needs.
struct Sender {
    store: Arc<dyn Store>,
    client: ClientBase,
    webhooks: Arc<Webhooks>,
    metrics: Arc<Metrics>,
}

impl Sender {
    /// Claims the notice of `event` and, if no one else has, sends it to
    /// `url` in a task of its own, recording the outcome. False when the
    /// store's notices could not be asked (the notice is sent all the same).
    async fn notify(&self, event: &Event, url: String) -> bool {
        let claim = notice_key(event);
        // A claim abandoned by a dispatcher that stopped is taken over: a
        // notice may be sent twice, never lost for that.
        let now = now_ms();
        let notice = ClaimNotice {
            key: &claim,
            now,
            lease_ms: CLAIM_MS,
            keep_until: now + KEEP_MS,
        };
        let claimed = match self.store.claim_notice(notice).await {
            Ok(true) => true,
            Ok(false) => return true,
            Err(error) => {
                tracing::warn!(%error, "webhooks: cannot claim a notice; sending it anyway");
                false
            }
        };
        let notice = Notice {
            url,
            body: notice_body(event).to_string(),
            id: delivery_id(&claim),
            settings: self.webhooks.of(&event.tenant).clone(),
        };
        let sent = send(self.client.clone(), notice, backoff(), self.metrics.clone());
        let store = self.store.clone();
        tokio::spawn(async move {
            let delivered = sent.await;
            // Recorded whether delivered or given up after its last
            // attempt, and kept a day, so neither a redelivered event nor a
            // search of the store sends it again in that time.
            let sent = SettleNotice {
                key: &claim,
                delivered,
                keep_until: now_ms() + KEEP_MS,
            };
            if let Err(error) = store.settle_notice(sent).await {
                tracing::warn!(%error, "webhooks: cannot record a delivered notice");
            }
        });
        claimed
    }
}

/// The delays between attempts: up to [`MAX_ATTEMPTS`] retries.
fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(120))
        .with_jitter()
        .with_max_times(MAX_ATTEMPTS)
}

/// The `Toolfleet-Delivery` of the notice claimed as `claim`
/// (`webhook:<kind>:<id>:<state>`): a UUID made of its SHA-256, the same
/// on every attempt and whichever dispatcher sends it.
pub fn delivery_id(claim: &str) -> String {
    let digest = Sha256::digest(claim.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// One notice on its way.
struct Notice {
    url: String,
    body: String,
    /// Its `Toolfleet-Delivery`.
    id: String,
    /// Its tenant's allow-list and key.
    settings: HookSettings,
}

/// How one attempt went.
enum Attempt {
    /// A 2xx answer.
    Delivered,
    /// Anything else, worth another attempt.
    Failed,
    /// The allow-list refuses the URL now: no attempt will pass.
    Refused(String),
}

/// Sends until a 2xx (true), the last attempt `backoff` allows, or an
/// attempt the allow-list refuses (false).
async fn send(
    client: ClientBase,
    notice: Notice,
    backoff: ExponentialBuilder,
    metrics: Arc<Metrics>,
) -> bool {
    let mut delays = backoff.build();
    let mut attempts = 0usize;
    let url = notice.url.as_str();
    loop {
        attempts += 1;
        match attempt(&client, &notice).await {
            Attempt::Delivered => {
                metrics.webhook_attempt(true);
                return true;
            }
            Attempt::Failed => metrics.webhook_attempt(false),
            Attempt::Refused(why) => {
                metrics.webhook_refused();
                metrics.webhook_abandoned();
                tracing::error!(%url, delivery = %notice.id, "webhook given up: {why}");
                return false;
            }
        }
        match delays.next() {
            Some(delay) => tokio::time::sleep(delay).await,
            None => {
                tracing::error!(%url, delivery = %notice.id, "webhook given up after {attempts} attempts");
                metrics.webhook_abandoned();
                return false;
            }
        }
    }
}

/// One attempt: the URL checked against the tenant's allow-list now, and
/// the notice posted to the addresses that passed.
async fn attempt(client: &ClientBase, notice: &Notice) -> Attempt {
    let url = notice.url.as_str();
    let destination = match callbacks::check(url, &notice.settings.allow).await {
        Ok(destination) => destination,
        Err(Refusal::Refused(why)) => return Attempt::Refused(why),
        Err(Refusal::Unresolved(why)) => {
            tracing::warn!(%url, "webhook failed: {why}");
            return Attempt::Failed;
        }
    };
    let client = match pinned_client(client, &destination) {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%url, %error, "webhook failed: no HTTP client");
            return Attempt::Failed;
        }
    };
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let sent = client
        .post(destination.url)
        .header("Content-Type", "application/json")
        .header("Toolfleet-Delivery", &notice.id)
        .header(
            "Toolfleet-Signature",
            signature(&notice.settings.key, t, &notice.body),
        )
        .timeout(Duration::from_secs(10))
        .body(notice.body.clone())
        .send()
        .await;
    match sent {
        Ok(response) if response.status().is_success() => Attempt::Delivered,
        Ok(response) => {
            tracing::warn!(%url, status = %response.status(), "webhook refused");
            Attempt::Failed
        }
        Err(error) => {
            tracing::warn!(%url, %error, "webhook failed");
            Attempt::Failed
        }
    }
}

/// The HTTP client of one attempt to `destination`: it connects only to
/// the checked addresses (TLS still verifies the URL's host name), follows
/// no redirect and uses no proxy.
fn pinned_client(
    base: &ClientBase,
    destination: &Destination,
) -> Result<reqwest::Client, reqwest::Error> {
    base()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Pinned {
            name: destination.name.clone(),
            addrs: destination.addrs.clone(),
        })
        .build()
}

/// A resolver of one name, to the addresses checked for it; any other
/// name is refused.
struct Pinned {
    name: Option<String>,
    addrs: Vec<SocketAddr>,
}

impl reqwest::dns::Resolve for Pinned {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let found: Result<reqwest::dns::Addrs, _> = match &self.name {
            Some(own) if own.eq_ignore_ascii_case(name.as_str()) => {
                Ok(Box::new(self.addrs.clone().into_iter()))
            }
            _ => Err(format!(
                "`{}` was not checked against the webhook allow-list",
                name.as_str()
            )
            .into()),
        };
        Box::pin(std::future::ready(found))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolfleet_core::{Envelope, Json};
    use toolfleet_store::Succeed;

    #[test]
    fn signatures_are_hmac_of_t_dot_body() {
        // HMAC-SHA256("key", "1.{}") computed independently.
        let sig = signature(b"key", 1, "{}");
        assert_eq!(
            sig,
            "t=1,v1=1ba6b8171186efc613e8bcc0cbdab2748f24984d7c5a84faa2637afa0e40d224"
        );
        assert_ne!(signature(b"key", 2, "{}"), sig);
        assert_ne!(signature(b"other", 1, "{}"), sig);
    }

    /// Settings allowing `allow`, signing with `key`.
    fn settings(allow: &[&str], key: &[u8]) -> HookSettings {
        let allow: Vec<AllowRule> = allow
            .iter()
            .map(|entry| entry.parse().expect("an entry"))
            .collect();
        HookSettings {
            allow: allow.into(),
            key: key.into(),
        }
    }

    /// Every tenant allowed any port of 127.0.0.1, signing with `key`.
    fn loopback_hooks() -> Arc<Webhooks> {
        Arc::new(Webhooks::new(settings(&["127.0.0.1:*"], b"key")))
    }

    /// Clients on one TLS configuration made once (trusting no root: the
    /// tests speak plain HTTP), as the binary's are.
    fn plain_client() -> ClientBase {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        Arc::new(move || reqwest::Client::builder().tls_backend_preconfigured(tls.clone()))
    }

    /// A sender of notices recorded in `store`, signed with a test key.
    fn sender_to(store: &Arc<dyn Store>) -> Sender {
        Sender {
            store: store.clone(),
            client: plain_client(),
            webhooks: loopback_hooks(),
            metrics: Arc::new(Metrics::new()),
        }
    }

    /// A notice of `{}` to `url` allowed by `allow`.
    fn notice_to(url: String, allow: &[&str]) -> Notice {
        Notice {
            url,
            body: "{}".into(),
            id: delivery_id("webhook:job:j1:succeeded"),
            settings: settings(allow, b"key"),
        }
    }

    /// The delays of one attempt and no retry.
    fn once() -> ExponentialBuilder {
        ExponentialBuilder::default().with_max_times(0)
    }

    /// A settled job of `store` with a callback to `url`, settled at `at`.
    async fn settled_at(store: &dyn Store, url: &str, at: i64) -> String {
        let job = crate::testing::new_job(Some(url), at - 1);
        let id = job.id.clone();
        store.insert_job(job).await.expect("insert");
        let claimed = store
            .claim(toolfleet_store::ClaimJob {
                id: &id,
                worker: "w",
                now: at - 1,
                lease_ms: 30_000,
            })
            .await
            .expect("claim");
        let lease = claimed.and_then(|job| job.lease_ref()).expect("claimed");
        let result = Json::from(json!({}));
        let done = Succeed {
            lease: &lease,
            result: &result,
            now: at,
            claimed: None,
        };
        let done = store.succeed(done).await.expect("succeed");
        assert!(done.is_some(), "settled");
        id
    }

    /// A search takes every notice nobody claimed, page after page, and the
    /// next search starts an overlap behind the last one's end: a job that
    /// appears there later (its commit was late) is taken by the next
    /// search, and one settled within the grace is left to the listeners.
    #[tokio::test]
    async fn a_search_pages_through_every_unsent_notice_and_the_next_overlaps_it() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = crate::testing::memory_store().await;
        // Nobody listens there: the sends fail in the background, after
        // the claims this test looks at.
        let url = "http://127.0.0.1:9/hook";
        let base = 1_700_000_000_000;
        let backlog = 2 * CATCH_UP_PAGE as usize + 50;
        for n in 0..backlog {
            settled_at(store.as_ref(), url, base + n as i64).await;
        }
        let sender = sender_to(&store);
        let unsent = || {
            store.unnotified_jobs(toolfleet_store::Unnotified {
                notice_prefix: JOB_NOTICE,
                since: 0,
                until: i64::MAX,
                limit: 1000,
            })
        };
        let now = base + 100_000;
        let next = sender.catch_up_once(Unsent::Jobs, base - 1, now).await;
        assert_eq!(unsent().await.expect("search").len(), 0, "every page taken");
        assert_eq!(next, now - CATCH_UP_GRACE_MS - CATCH_UP_OVERLAP_MS);
        // Settled behind the last search's end, within the overlap.
        let late = settled_at(store.as_ref(), url, next + 5).await;
        // Settled within the next search's grace.
        let later = now + 10_000;
        let fresh = settled_at(store.as_ref(), url, later - CATCH_UP_GRACE_MS + 1).await;
        sender.catch_up_once(Unsent::Jobs, next, later).await;
        let left: Vec<String> = unsent()
            .await
            .expect("search")
            .into_iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(
            left,
            [fresh],
            "the late one was taken, the fresh one left: {late}"
        );
    }

    fn sample(metrics: &Metrics, series: &str) -> Option<f64> {
        metrics
            .render()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[tokio::test]
    async fn every_attempt_is_counted_and_a_notice_given_up_too() {
        // A port nobody listens on: every attempt fails at once.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let _ = rustls::crypto::ring::default_provider().install_default();
        let metrics = Arc::new(Metrics::new());
        let quick = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(1))
            .with_max_delay(Duration::from_millis(2))
            .with_max_times(2);
        let notice = notice_to(format!("http://{closed}/hook"), &["127.0.0.1:*"]);
        let delivered = send(plain_client(), notice, quick, metrics.clone()).await;
        assert!(!delivered);
        let failed = r#"toolfleet_webhook_deliveries_total{outcome="failed"}"#;
        assert_eq!(sample(&metrics, failed), Some(3.0));
        let ok = r#"toolfleet_webhook_deliveries_total{outcome="delivered"}"#;
        assert_eq!(sample(&metrics, ok), Some(0.0));
        assert_eq!(
            sample(&metrics, "toolfleet_webhook_abandoned_total"),
            Some(1.0)
        );
    }

    /// Notices that refuse the first `refusals` subscriptions, then hand
    /// out `endings` that end at once, then work.
    struct Refusing {
        inner: toolfleet_broker::memory::MemoryNotices,
        refusals: std::sync::atomic::AtomicUsize,
        endings: std::sync::atomic::AtomicUsize,
    }

    struct Ended;

    #[async_trait::async_trait]
    impl toolfleet_broker::Subscription for Ended {
        async fn next(&mut self) -> Option<Event> {
            None
        }
    }

    #[async_trait::async_trait]
    impl Notices for Refusing {
        async fn publish(&self, event: &Event) -> Result<(), toolfleet_broker::BrokerError> {
            self.inner.publish(event).await
        }

        async fn subscribe(
            &self,
        ) -> Result<Box<dyn toolfleet_broker::Subscription>, toolfleet_broker::BrokerError>
        {
            use std::sync::atomic::Ordering;
            let refuse = self
                .refusals
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            let end = || {
                self.endings
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            };
            match refuse {
                Ok(_) => Err(toolfleet_broker::BrokerError::Unavailable(
                    "refusing, for the test".into(),
                )),
                Err(_) if end() => Ok(Box::new(Ended)),
                Err(_) => self.inner.subscribe().await,
            }
        }
    }

    /// Notices that count the subscriptions made of them.
    #[derive(Default)]
    struct Counting {
        inner: toolfleet_broker::memory::MemoryNotices,
        subscriptions: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Notices for Counting {
        async fn publish(&self, event: &Event) -> Result<(), toolfleet_broker::BrokerError> {
            self.inner.publish(event).await
        }

        async fn subscribe(
            &self,
        ) -> Result<Box<dyn toolfleet_broker::Subscription>, toolfleet_broker::BrokerError>
        {
            self.subscriptions
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.inner.subscribe().await
        }
    }

    /// Where no allow-list has an entry, no call can name a callback: the
    /// webhooks never subscribe to outcomes (so none need be routed to
    /// them), while with an entry they do.
    #[tokio::test]
    async fn webhooks_no_allow_list_admits_listen_for_nothing() {
        let store = crate::testing::memory_store().await;
        let closed = Arc::new(Webhooks::new(settings(&[], b"key")));
        for (webhooks, listens) in [(closed, false), (loopback_hooks(), true)] {
            assert_eq!(webhooks.admit_any(), listens);
            let counting = Arc::new(Counting::default());
            let (stop, stopped) = watch::channel(false);
            let delivering = tokio::spawn(deliver(
                store.clone(),
                counting.clone(),
                webhooks,
                plain_client(),
                Arc::new(Metrics::new()),
                stopped,
            ));
            let subscriptions = || {
                counting
                    .subscriptions
                    .load(std::sync::atomic::Ordering::SeqCst)
            };
            // Listening, they run until stopped; else they end on their own.
            if listens {
                tokio::time::timeout(Duration::from_secs(5), async {
                    while subscriptions() == 0 {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
                .await
                .expect("subscribed within 5 s");
                stop.send_replace(true);
            }
            tokio::time::timeout(Duration::from_secs(5), delivering)
                .await
                .expect("the webhooks end")
                .expect("without a panic");
            assert_eq!(subscriptions(), usize::from(listens));
            drop(stop);
        }
    }

    /// One HTTP endpoint answering 200 to everything; each request's
    /// text goes to the channel.
    async fn hooks() -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        answering("HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").await
    }

    /// One HTTP endpoint answering `reply` to everything; each request's
    /// text goes to the channel.
    async fn answering(
        reply: &'static str,
    ) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let url = format!("http://{}/hook", listener.local_addr().expect("an address"));
        let (heard, hooks) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let heard = heard.clone();
                tokio::spawn(async move {
                    let mut request = vec![0u8; 64 * 1024];
                    let mut read = 0;
                    while let Ok(n) = stream.read(&mut request[read..]).await {
                        if n == 0 {
                            return;
                        }
                        read += n;
                        let text = String::from_utf8_lossy(&request[..read]).into_owned();
                        if text.contains("\r\n\r\n{") && text.trim_end().ends_with('}') {
                            let _ = heard.send(text);
                            let _ = stream.write_all(reply.as_bytes()).await;
                            return;
                        }
                    }
                });
            }
        });
        (url, hooks)
    }

    /// Notices that refuse the webhooks' first subscriptions, then give
    /// them one that ends at once, do not leave them deaf: they subscribe
    /// again, and a settled job's event heard afterwards is sent.
    #[tokio::test]
    async fn webhooks_subscribe_again_until_the_notices_take_them() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = crate::testing::memory_store().await;
        let refusing = Arc::new(Refusing {
            inner: toolfleet_broker::memory::MemoryNotices::new(),
            refusals: 2.into(),
            endings: 1.into(),
        });
        let (url, mut hooks) = hooks().await;
        let id = settled_at(store.as_ref(), &url, now_ms()).await;
        let job = store.job_by_id(&id).await.expect("read").expect("the job");
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(deliver(
            store.clone(),
            refusing.clone(),
            loopback_hooks(),
            plain_client(),
            Arc::new(Metrics::new()),
            stopped,
        ));
        // Announced until heard: the first announcements find nobody
        // subscribed, and the notice is claimed once, so it is sent once.
        // Within the store search's grace: only the event can send it.
        let heard = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                assert_eq!(
                    refusing.publish(&job_event(&job, POLL_AFTER_S)).await,
                    Ok(())
                );
                tokio::select! {
                    heard = hooks.recv() => return heard,
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        })
        .await
        .expect("a notice within 5 s")
        .expect("a request");
        assert!(heard.contains(&id), "{heard}");
        assert_eq!(
            refusing.refusals.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "subscribed only after both refusals"
        );
        assert_eq!(
            refusing.endings.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "and after the subscription that ended"
        );
        stop.send_replace(true);
    }

    /// A ticket answered while nobody listened is found by the store
    /// search, its notice sent once and claimed, so the next search leaves
    /// it.
    #[tokio::test]
    async fn a_search_sends_the_notice_of_a_ticket_answered_unheard() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = crate::testing::memory_store().await;
        let (url, mut hooks) = hooks().await;
        let answered = now_ms() - 60_000;
        let ticket = crate::testing::new_ticket(Some(&url), answered - 1);
        let id = store.insert_ticket(ticket).await.expect("insert").id;
        store
            .answer_ticket(toolfleet_store::AnswerTicket {
                tenant: "acme",
                id: &id,
                answer: &json!("travel"),
                now: answered,
            })
            .await
            .expect("answer")
            .expect("answered");
        let sender = sender_to(&store);
        let now = now_ms();
        sender
            .catch_up_once(Unsent::Tickets, answered - 1, now)
            .await;
        let heard = tokio::time::timeout(Duration::from_secs(5), hooks.recv())
            .await
            .expect("a notice within 5 s")
            .expect("a request");
        assert!(heard.contains(&id) && heard.contains("answered"), "{heard}");
        let unsent = store
            .unnotified_tickets(toolfleet_store::Unnotified {
                notice_prefix: TICKET_NOTICE,
                since: 0,
                until: i64::MAX,
                limit: 10,
            })
            .await
            .expect("search");
        assert!(unsent.is_empty(), "the notice is claimed");
        sender
            .catch_up_once(Unsent::Tickets, answered - 1, now)
            .await;
        let again = tokio::time::timeout(Duration::from_millis(300), hooks.recv()).await;
        assert!(again.is_err(), "sent twice: {again:?}");
    }

    #[test]
    fn a_delivery_id_is_a_uuid_stable_for_its_notice() {
        let id = delivery_id("webhook:job:j1:succeeded");
        assert_eq!(id, delivery_id("webhook:job:j1:succeeded"));
        assert_ne!(id, delivery_id("webhook:job:j1:failed"));
        assert_ne!(id, delivery_id("webhook:job:j2:succeeded"));
        let uuid = uuid::Uuid::parse_str(&id).expect("a UUID");
        assert_eq!(uuid.get_version_num(), 8);
    }

    /// Each life of a job put back has notices of its own, and so
    /// deliveries of their own; its first life keeps the key it always had.
    #[test]
    fn each_life_of_a_job_has_its_own_notice() {
        let event = Event::job(
            "j1",
            ("acme", "alice"),
            "quick",
            toolfleet_core::JobState::Failed,
            "run-1",
            &Envelope::ok(Json::from(json!({"n": 1})), ""),
        );
        let later = Event {
            life: 1,
            ..event.clone()
        };
        assert_eq!(notice_key(&event), "webhook:job:j1:failed");
        assert_eq!(notice_key(&later), "webhook:job:j1:failed:1");
        assert_ne!(
            delivery_id(&notice_key(&event)),
            delivery_id(&notice_key(&later))
        );
        // A job's event carries the life it was made in.
        let mut job = crate::testing::record_of(crate::testing::new_job(None, 1));
        job.state = toolfleet_core::JobState::Failed;
        job.requeues = 2;
        assert_eq!(
            notice_key(&job_event(&job, 5)),
            format!("webhook:job:{}:failed:2", job.id)
        );
    }

    #[test]
    fn a_notice_names_its_tenant() {
        let event = Event::job(
            "j1",
            ("globex", "mallory"),
            "quick",
            toolfleet_core::JobState::Succeeded,
            "run-1",
            &Envelope::ok(Json::from(json!({"n": 1})), ""),
        );
        let body = notice_body(&event);
        assert_eq!(body["tenant"], "globex", "{body}");
        assert_eq!(
            (&body["event"], &body["job_id"], &body["run_id"]),
            (&json!("job.succeeded"), &json!("j1"), &json!("run-1")),
            "{body}"
        );
        assert_eq!(body["result"], json!({"n": 1}), "{body}");
    }

    /// A name the allow-list opens only by name, resolving to loopback, is
    /// refused before any connection and given up at once; opened by its
    /// address, the attempt connects to the checked address and names the
    /// delivery.
    #[tokio::test]
    async fn each_attempt_is_checked_and_connects_to_the_checked_address() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (url, mut heard) = hooks().await;
        let by_name = url.replace("127.0.0.1", "localhost");
        let metrics = Arc::new(Metrics::new());
        let refused = notice_to(by_name.clone(), &["localhost:*"]);
        assert!(!send(plain_client(), refused, backoff(), metrics.clone()).await);
        let outcome = |o: &str| format!(r#"toolfleet_webhook_deliveries_total{{outcome="{o}"}}"#);
        assert_eq!(sample(&metrics, &outcome("refused")), Some(1.0));
        assert_eq!(sample(&metrics, &outcome("failed")), Some(0.0));
        assert_eq!(
            sample(&metrics, "toolfleet_webhook_abandoned_total"),
            Some(1.0)
        );
        assert!(heard.try_recv().is_err(), "nothing was sent");
        let opened = notice_to(by_name, &["localhost:*", "127.0.0.0/8:*"]);
        let id = opened.id.clone();
        assert!(send(plain_client(), opened, once(), metrics.clone()).await);
        let request = heard.try_recv().expect("the request").to_ascii_lowercase();
        assert!(
            request.contains(&format!("toolfleet-delivery: {id}")),
            "{request}"
        );
        assert!(request.contains("host: localhost:"), "{request}");
    }

    /// An attempt connects to the addresses its check passed, never to what
    /// its name resolves to when the connection is made (DNS rebinding): a
    /// name that resolves nowhere (`.invalid`) reaches the checked address,
    /// and a name the check did not pass reaches nothing.
    #[tokio::test]
    async fn the_connection_goes_to_the_checked_address_only() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (url, mut heard) = hooks().await;
        let checked: SocketAddr = url
            .trim_start_matches("http://")
            .trim_end_matches("/hook")
            .parse()
            .expect("the receiver's address");
        let port = checked.port();
        let destination = Destination {
            url: reqwest::Url::parse(&format!("http://rebound.invalid:{port}/hook"))
                .expect("a URL"),
            name: Some("rebound.invalid".to_owned()),
            addrs: vec![checked],
        };
        let client = pinned_client(&plain_client(), &destination).expect("a client");
        let answer = client
            .post(destination.url.clone())
            .body("{}")
            .send()
            .await
            .expect("sent to the checked address");
        assert!(answer.status().is_success(), "{answer:?}");
        let request = heard.try_recv().expect("the request").to_ascii_lowercase();
        assert!(request.contains("host: rebound.invalid:"), "{request}");
        let unchecked = client
            .post(format!("http://localhost:{port}/hook"))
            .body("{}")
            .send()
            .await;
        assert!(unchecked.is_err(), "an unchecked name was reached");
        assert!(
            heard.try_recv().is_err(),
            "nothing more reached the receiver"
        );
    }

    /// A redirect is an answer that is not a 2xx: it is not followed.
    #[tokio::test]
    async fn redirects_are_not_followed() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (target, mut reached) = hooks().await;
        let reply: &'static str = Box::leak(
            format!(
                "HTTP/1.1 307 Temporary Redirect\r\nlocation: {target}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            )
            .into_boxed_str(),
        );
        let (url, mut heard) = answering(reply).await;
        let metrics = Arc::new(Metrics::new());
        let notice = notice_to(url, &["127.0.0.1:*"]);
        assert!(!send(plain_client(), notice, once(), metrics.clone()).await);
        assert!(heard.try_recv().is_ok(), "the callback was asked");
        assert!(reached.try_recv().is_err(), "the redirect was followed");
    }
}
