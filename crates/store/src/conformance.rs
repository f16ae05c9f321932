//! The conformance suite: what every [`Store`] must do, proven by the same
//! tests for each implementation (`tests/sqlite.rs` and `tests/postgres.rs`).
//!
//! Each behaviour is a public async function taking `&dyn Store`;
//! [`store_conformance!`](crate::store_conformance) turns them into one
//! `#[tokio::test]` each. Every test makes its own tenants, ids and keys, so
//! tests may share one database, run in parallel and run again on a database
//! that earlier runs left behind. Times are explicit milliseconds near
//! [`BASE`], so nothing depends on the wall clock; the tests whose queries
//! reach beyond their own rows (due jobs, outcome expiry, and in `runs`
//! ticket expiry, unsettled tickets and stale runs) work in time ranges of
//! their own. This module must never hold state between
//! tests or assume a table is empty.

use serde_json::{Value, json};
use toolfleet_core::lifecycle::{Transition, after_failure};
use toolfleet_core::tool::{Budget, Lineage};
use toolfleet_core::{
    AnsweredBy, AuditRecord, Envelope, ErrorCode, JobState, Json, ToolError, TraceContext, new_id,
};

use crate::{
    Answered, ClaimCommit, CommitClaim, Fail, HandleOwner, Heartbeat, Inserted, JobFilter,
    JobRecord, Lease, LeaseRef, NewHandle, NewJob, NewTicket, Park, Responded, SaveCheckpoint,
    SetProgress, Store, StoreError, Succeed, TicketRecord,
};

mod runs;

pub use runs::*;

/// The time the tests start at (November 2023), in Unix milliseconds.
pub const BASE: i64 = 1_700_000_000_000;
/// The lease the tests take, in milliseconds.
pub const LEASE: i64 = 30_000;
/// Where the test of outcome expiry works: after every other test's times.
const LATER: i64 = BASE + 1_000_000_000_000;
/// How long the other tests keep outcomes: past [`LATER`], because a store
/// may prune every expired outcome when a claim names a later time.
const FOREVER: i64 = LATER * 2;

/// Expands to one `#[tokio::test]` per behaviour of the suite. `$make` is an
/// expression, evaluated inside each async test, whose value is a store (a
/// reference to it must coerce to `&dyn Store`); the calling crate needs
/// tokio with the `rt` and `macros` features.
///
/// ```ignore
/// toolfleet_store::store_conformance!(SqliteStore::open_in_memory().await.unwrap());
/// ```
#[macro_export]
macro_rules! store_conformance {
    ($make:expr) => {
        $crate::store_conformance!(@tests $make;
            ping_answers,
            insert_records_a_queued_job,
            an_insert_answers_the_stored_row,
            the_same_key_returns_the_same_job,
            the_same_key_with_other_args_is_a_conflict,
            keys_are_per_tenant_and_per_tool,
            another_tenants_job_reads_as_missing,
            claim_takes_a_due_job_only,
            a_held_lease_blocks_another_claim,
            an_expired_lease_is_claimed_again,
            a_job_claimed_again_by_its_own_worker_is_held_by_the_new_attempt_only,
            a_job_claimed_again_by_another_worker_is_held_by_the_new_attempt_only,
            heartbeat_extends_the_lease_of_its_holder_only,
            progress_is_recorded_for_the_holder_only,
            succeed_settles_once_for_the_holder_only,
            a_success_given_its_claimed_record_answers_the_stored_row,
            a_settled_job_is_never_claimed_again,
            fail_with_a_retry_waits_for_run_at,
            the_last_attempt_fails_for_good,
            cancel_stops_queued_retrying_and_running_jobs,
            cancel_leaves_a_settled_job_as_it_is,
            a_dead_letter_fails_only_a_job_no_attempt_holds,
            each_failed_attempt_is_logged_with_its_times_and_error,
            queue_stats_count_a_tenants_jobs_by_pool_state_and_minute,
            the_job_list_takes_the_jobs_made_within_a_time_window,
            due_jobs_lists_what_should_run_oldest_first,
            due_jobs_read_a_backlog_a_page_at_a_time,
            a_scheduled_job_waits_for_its_time,
            a_failed_or_cancelled_job_is_put_back_as_new,
            requeue_many_puts_back_what_its_filter_names,
            a_silent_dispatchers_queued_jobs_are_found_until_it_is_forgotten,
            unnotified_jobs_are_settled_jobs_with_callbacks_nobody_notified,
            unnotified_tickets_are_answered_tickets_with_callbacks_nobody_notified,
            list_jobs_pages_newest_first,
            list_jobs_filters_by_state_and_tool,
            list_jobs_clamps_the_limit,
            list_jobs_filters_by_user,
            a_ticket_keeps_who_may_answer_it,
            an_input_ticket_is_answered_key_by_key,
            concurrent_answers_to_an_input_ticket_are_all_kept,
            job_counts_count_each_state_once,
            tickets_are_read_by_their_tenant_only,
            a_ticket_is_answered_once,
            audit_reads_newest_first_within_a_tenant,
            a_commit_runs_once_while_pending,
            a_settled_commit_answers_its_envelope,
            releasing_a_commit_lets_it_run_again,
            an_expired_commit_claim_is_taken_over,
            an_abandoned_commit_claim_is_never_run_again,
            a_settled_commit_expires_after_keep_until,
            concurrent_claims_of_one_job_give_it_to_one_worker,
            concurrent_inserts_with_one_key_make_one_job,
            many_jobs_at_once_each_get_their_own_answer,
            a_parked_job_waits_for_its_ticket,
            a_parked_job_can_be_cancelled_and_stays_so,
            lineage_travels_with_the_job,
            many_jobs_at_once_keep_their_own_lineage,
            the_trace_context_travels_with_the_job,
            many_jobs_at_once_keep_their_own_trace_context,
            a_checkpoint_is_saved_for_the_current_attempt_only,
            a_checkpoint_outlives_claims_and_retries,
            audit_keeps_the_parent_run_id,
            every_transition_moves_only_from_its_states,
            a_notice_is_claimed_by_one_sender_and_kept_once_sent,
            a_parked_job_is_listed_and_counted_as_it_is_shown,
            a_run_is_recorded_once_per_key,
            another_tenants_run_reads_as_missing,
            update_run_is_a_compare_and_set,
            a_waiting_run_is_found_by_each_item_it_waits_on,
            update_run_keeps_the_fields_it_is_not_given,
            list_runs_filters_and_pages_newest_first,
            stale_runs_are_those_left_in_a_state_oldest_first,
            a_ticket_keeps_its_kind_plan_scopes_and_expiry,
            list_tickets_shows_each_answerer_their_inbox,
            list_tickets_filters_open_answered_and_kind,
            expired_tickets_are_no_longer_answered,
            a_ticket_is_settled_once,
            unsettled_tickets_are_answered_tickets_without_an_outcome,
            prune_deletes_only_what_settled_before_its_time,
            a_token_bucket_lets_its_burst_then_its_rate_through,
            claim_next_takes_the_highest_priority_first_then_in_order,
            claim_next_holds_each_concurrency_key_to_its_limit,
            fair_turns_let_a_newcomer_in_within_a_turn,
            a_deferred_job_gives_its_attempt_back_and_waits,
            a_schedule_moves_one_tick_at_a_time_by_compare_and_set,
            a_handle_is_read_by_its_owner_alone_until_it_expires,
            a_tenants_handles_are_bounded_oldest_first,
            handles_are_listed_newest_first_in_pages,
            expired_handles_are_pruned,
        );
    };
    (@tests $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $name() {
                let store = $make;
                $crate::conformance::$name(&store).await;
            }
        )*
    };
}

// Fixtures.

fn tenant() -> String {
    format!("tenant-{}", new_id())
}

fn job_for(tenant: &str, tool: &str, args: Value, key: Option<&str>, now: i64) -> NewJob {
    NewJob {
        id: new_id(),
        tenant: tenant.to_owned(),
        user: "alice".to_owned(),
        tool: tool.to_owned(),
        pool: "default".to_owned(),
        args,
        idempotency_key: key.map(str::to_owned),
        run_id: new_id(),
        call_id: new_id(),
        callback_url: Some("http://127.0.0.1:9/done".to_owned()),
        lineage: None,
        scopes: Vec::new(),
        trace: None,
        max_attempts: 3,
        timeout_ms: 60_000,
        now,
        run_at: None,
        priority: None,
        concurrency_key: None,
        concurrency_limit: None,

        fair_rank: 0,
        origin: None,
    }
}

fn ocr_job(tenant: &str) -> NewJob {
    job_for(tenant, "start_receipt_ocr", json!({"line": 7}), None, BASE)
}

async fn insert(store: &dyn Store, job: NewJob) -> JobRecord {
    match store.insert_job(job).await.expect("insert_job") {
        Inserted::Created(job) => job,
        other => panic!("expected a new job, got {other:?}"),
    }
}

async fn queued(store: &dyn Store, tenant: &str) -> JobRecord {
    insert(store, ocr_job(tenant)).await
}

/// A job accepted at [`BASE`] to start at `run_at`.
async fn scheduled(store: &dyn Store, tenant: &str, run_at: i64) -> JobRecord {
    let job = NewJob {
        run_at: Some(run_at),
        ..ocr_job(tenant)
    };
    insert(store, job).await
}

/// A job claimed by `worker` at [`BASE`] for [`LEASE`].
async fn running(store: &dyn Store, tenant: &str, worker: &str) -> JobRecord {
    let job = queued(store, tenant).await;
    claim(store, &job.id, worker, BASE)
        .await
        .expect("a queued job is claimable")
}

async fn claim(store: &dyn Store, id: &str, worker: &str, now: i64) -> Option<JobRecord> {
    store
        .claim(crate::ClaimJob {
            id,
            worker,
            now,
            lease_ms: LEASE,
        })
        .await
        .expect("claim")
}

/// Attempt `attempt` of `worker` on job `id`, whether it holds the job or not.
fn lease(id: &str, worker: &str, attempt: u32) -> LeaseRef {
    LeaseRef {
        job_id: id.to_owned(),
        worker: worker.to_owned(),
        attempt,
    }
}

/// The attempt that holds `job`, as its claim answered it.
fn holder(job: &JobRecord) -> LeaseRef {
    job.lease_ref().expect("a running job has a holder")
}

async fn heartbeat(store: &dyn Store, lease: &LeaseRef, now: i64) -> Lease {
    let beat = Heartbeat {
        lease,
        now,
        lease_ms: LEASE,
    };
    store.heartbeat(beat).await.expect("heartbeat")
}

async fn set_progress(store: &dyn Store, lease: &LeaseRef, progress: &Value, now: i64) -> bool {
    let report = SetProgress {
        lease,
        progress,
        now,
    };
    store.set_progress(report).await.expect("set_progress")
}

async fn succeed(
    store: &dyn Store,
    lease: &LeaseRef,
    result: &Json,
    now: i64,
) -> Option<JobRecord> {
    let done = Succeed {
        lease,
        result,
        now,
        claimed: None,
    };
    store.succeed(done).await.expect("succeed")
}

/// A success of its holder given `claimed` as the claim's record.
async fn succeed_claimed(
    store: &dyn Store,
    lease: &LeaseRef,
    claimed: &JobRecord,
    now: i64,
) -> JobRecord {
    let done = Succeed {
        lease,
        result: &result_doc(),
        now,
        claimed: Some(claimed),
    };
    let done = store.succeed(done).await.expect("succeed");
    done.expect("the holder settles")
}

async fn fail(
    store: &dyn Store,
    lease: &LeaseRef,
    error: &ToolError,
    retry_at: Option<i64>,
    now: i64,
) -> Option<JobRecord> {
    let failed = Fail {
        lease,
        error,
        retry_at,
        now,
    };
    store.fail(failed).await.expect("fail")
}

async fn park(store: &dyn Store, lease: &LeaseRef, ticket: &str, now: i64) -> Option<JobRecord> {
    let park = Park { lease, ticket, now };
    store.park(park).await.expect("park")
}

/// The checkpoint of job `id`, as the agent loop reads it.
async fn checkpoint_of(store: &dyn Store, id: &str) -> Option<Value> {
    store.checkpoint(id).await.expect("checkpoint")
}

async fn reread(store: &dyn Store, job: &JobRecord) -> JobRecord {
    store
        .job(&job.tenant, &job.id)
        .await
        .expect("job")
        .expect("the job exists")
}

fn failure(message: &str) -> ToolError {
    ToolError::failed(message, true)
}

fn result_doc() -> Json {
    Json::from(json!({"amounts": [12.5, 40], "currency": "EUR"}))
}

// Basics and insertion.

/// The backend answers.
pub async fn ping_answers(store: &dyn Store) {
    store.ping().await.expect("ping");
}

/// A new job is stored queued, due now, with everything it was given.
pub async fn insert_records_a_queued_job(store: &dyn Store) {
    let t = tenant();
    let new = job_for(
        &t,
        "start_receipt_ocr",
        json!({"b": [1, 2], "a": "x"}),
        Some("k1"),
        BASE,
    );
    let job = insert(store, new.clone()).await;
    assert_eq!(
        (job.id.as_str(), job.tenant.as_str(), job.tool.as_str()),
        (new.id.as_str(), t.as_str(), new.tool.as_str())
    );
    assert_eq!((job.user.as_str(), job.pool.as_str()), ("alice", "default"));
    assert_eq!(job.args, new.args);
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(
        (job.attempts, job.max_attempts, job.timeout_ms),
        (0, 3, 60_000)
    );
    assert_eq!(
        (job.run_at, job.created_at, job.updated_at),
        (BASE, BASE, BASE)
    );
    assert_eq!((job.lease_owner.as_deref(), job.lease_until), (None, None));
    assert_eq!(
        (&job.progress, &job.result, &job.error),
        (&None, &None, &None)
    );
    assert_eq!(job.idempotency_key.as_deref(), Some("k1"));
    assert_eq!(
        (&job.run_id, &job.call_id, &job.callback_url),
        (&new.run_id, &new.call_id, &new.callback_url)
    );
    assert_eq!(
        store.job(&t, &job.id).await.expect("job"),
        Some(job.clone())
    );
    assert_eq!(
        store.job_by_id(&job.id).await.expect("job_by_id"),
        Some(job)
    );
}

/// What an insert answers is the row it stored, every field given
/// included (key, callback, lineage, scopes, trace, priority, concurrency
/// key, fair turn, a later start), alone and many at once. Works four
/// months before [`BASE`].
pub async fn an_insert_answers_the_stored_row(store: &dyn Store) {
    use futures_util::future::join_all;
    let t = tenant();
    let t0 = BASE - 120 * 24 * 3_600_000;
    let full = |n: usize| NewJob {
        idempotency_key: Some(format!("key-{n}")),
        callback_url: Some(format!("https://hooks.example/{n}")),
        lineage: Some(lineage(1)),
        scopes: vec!["ledger:write".to_owned(), "expenses:read".to_owned()],
        trace: Some(trace(n.is_multiple_of(2))),
        priority: Some(3),
        concurrency_key: Some(format!("acct-{n}")),
        concurrency_limit: Some(2),
        fair_rank: 40 + n as i64,
        // Every third job starts later than any test looks: recorded
        // scheduled, and never due for another test's `due_jobs`.
        run_at: n.is_multiple_of(3).then_some(FOREVER),
        origin: Some("dispatcher-a".to_owned()),
        ..job_for(&t, "ocr", json!({"z": n, "a": [1.5, "x"]}), None, t0)
    };
    let alone = insert(store, full(1)).await;
    assert_eq!(alone, reread(store, &alone).await);
    let scheduled = insert(store, full(3)).await;
    assert_eq!(scheduled.state, JobState::Scheduled);
    assert_eq!(scheduled, reread(store, &scheduled).await);

    let many = join_all((10..40).map(|n| insert(store, full(n)))).await;
    for job in &many {
        assert_eq!(*job, reread(store, job).await);
    }
    // A job a batch did not insert (its key taken) answers the first one.
    let again = store.insert_job(full(12)).await.expect("insert_job");
    assert_eq!(again, Inserted::Existing(many[2].clone()));
}

/// The same tenant, tool, key and arguments (in any member order) is the
/// same job, however often it is sent.
pub async fn the_same_key_returns_the_same_job(store: &dyn Store) {
    let t = tenant();
    let first = insert(
        store,
        job_for(
            &t,
            "ocr",
            json!({"a": 1, "b": {"x": 1, "y": 2}}),
            Some("k"),
            BASE,
        ),
    )
    .await;
    let args: Value = serde_json::from_str(r#"{"b": {"y": 2, "x": 1}, "a": 1}"#).expect("json");
    for now in [BASE + 1, BASE + 2] {
        let again = store
            .insert_job(job_for(&t, "ocr", args.clone(), Some("k"), now))
            .await;
        assert_eq!(
            again.expect("insert_job"),
            Inserted::Existing(first.clone())
        );
    }
}

/// The same key with other arguments is refused with a message that names
/// the tool and says what to do.
pub async fn the_same_key_with_other_args_is_a_conflict(store: &dyn Store) {
    let t = tenant();
    let first = insert(
        store,
        job_for(&t, "start_receipt_ocr", json!({"line": 1}), Some("k"), BASE),
    )
    .await;
    let other = store
        .insert_job(job_for(
            &t,
            "start_receipt_ocr",
            json!({"line": 2}),
            Some("k"),
            BASE,
        ))
        .await;
    match other {
        Err(StoreError::Conflict(message)) => {
            assert!(message.contains("start_receipt_ocr"), "{message}");
            assert!(message.contains("new key"), "{message}");
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(reread(store, &first).await, first);
}

/// Keys belong to a tenant and a tool; jobs without a key never merge.
pub async fn keys_are_per_tenant_and_per_tool(store: &dyn Store) {
    let (t1, t2) = (tenant(), tenant());
    let args = json!({"line": 1});
    let a = insert(store, job_for(&t1, "ocr", args.clone(), Some("k"), BASE)).await;
    let b = insert(store, job_for(&t2, "ocr", args.clone(), Some("k"), BASE)).await;
    let c = insert(store, job_for(&t1, "mail", args.clone(), Some("k"), BASE)).await;
    let d = insert(store, job_for(&t1, "ocr", args.clone(), None, BASE)).await;
    let e = insert(store, job_for(&t1, "ocr", args, None, BASE)).await;
    let mut ids = vec![a.id, b.id, c.id, d.id, e.id];
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 5);
}

/// Another tenant's job reads, lists and cancels exactly as a missing one.
pub async fn another_tenants_job_reads_as_missing(store: &dyn Store) {
    let (owner, other) = (tenant(), tenant());
    let job = queued(store, &owner).await;
    let missing = new_id();
    assert_eq!(store.job(&other, &job.id).await.expect("job"), None);
    assert_eq!(store.job(&other, &missing).await.expect("job"), None);
    assert_eq!(store.job_by_id(&missing).await.expect("job_by_id"), None);
    let page = store
        .list_jobs(crate::ListJobs {
            tenant: &other,
            filter: &JobFilter::default(),
            limit: 100,
            cursor: None,
        })
        .await
        .expect("list_jobs");
    assert!(
        page.jobs.is_empty() && page.next_cursor.is_none(),
        "{page:?}"
    );
    assert_eq!(
        store
            .cancel(crate::CancelJob {
                tenant: &other,
                id: &job.id,
                now: BASE + 1
            })
            .await
            .expect("cancel"),
        None
    );
    assert_eq!(
        store
            .cancel(crate::CancelJob {
                tenant: &other,
                id: &missing,
                now: BASE + 1
            })
            .await
            .expect("cancel"),
        None
    );
    assert_eq!(reread(store, &job).await, job);
}

// The lifecycle.

/// A queued job is claimed once it is due; a missing one never.
pub async fn claim_takes_a_due_job_only(store: &dyn Store) {
    let t = tenant();
    let later = insert(store, job_for(&t, "ocr", json!({}), None, BASE + 1_000)).await;
    assert_eq!(claim(store, &later.id, "w1", BASE + 999).await, None);
    let job = claim(store, &later.id, "w1", BASE + 1_000)
        .await
        .expect("due now");
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.attempts, 1);
    assert_eq!(job.lease_owner.as_deref(), Some("w1"));
    assert_eq!(job.lease_until, Some(BASE + 1_000 + LEASE));
    assert_eq!(job.updated_at, BASE + 1_000);
    assert_eq!(reread(store, &job).await, job);
    assert_eq!(claim(store, &new_id(), "w1", BASE).await, None);
}

/// While a lease holds, nobody claims the job, its holder included.
pub async fn a_held_lease_blocks_another_claim(store: &dyn Store) {
    let job = running(store, &tenant(), "w1").await;
    for (worker, now) in [("w2", BASE + 1), ("w2", BASE + LEASE), ("w1", BASE + 1)] {
        assert_eq!(
            claim(store, &job.id, worker, now).await,
            None,
            "{worker} at {now}"
        );
    }
    assert_eq!(reread(store, &job).await, job);
}

/// A lease that ran out is claimed by the next worker as a new attempt,
/// runnable since the lease ended (its queue wait starts there, not at its
/// first run), and the first worker can no longer touch the job.
pub async fn an_expired_lease_is_claimed_again(store: &dyn Store) {
    let job = running(store, &tenant(), "w1").await;
    assert_eq!(job.lease_until, Some(BASE + LEASE));
    let now = BASE + LEASE + 1;
    let again = claim(store, &job.id, "w2", now)
        .await
        .expect("the lease expired");
    assert_eq!(
        (again.attempts, again.lease_owner.as_deref()),
        (2, Some("w2"))
    );
    assert_eq!(again.lease_until, Some(now + LEASE));
    assert_eq!(again.run_at, BASE + LEASE, "runnable since the lease ended");
    assert_eq!(
        heartbeat(store, &lease(&job.id, "w1", 1), now).await,
        Lease::Lost
    );
    assert!(!set_progress(store, &lease(&job.id, "w1", 1), &json!(1), now).await);
    assert_eq!(
        succeed(store, &lease(&job.id, "w1", 1), &result_doc(), now).await,
        None
    );
    assert_eq!(
        fail(store, &lease(&job.id, "w1", 1), &failure("x"), None, now).await,
        None
    );
    let done = succeed(store, &lease(&job.id, "w2", 2), &result_doc(), now + 1).await;
    assert_eq!(done.map(|j| j.state), Some(JobState::Succeeded));
}

/// Every operation of `stale`, an attempt that no longer holds its job,
/// answers that it does not and changes nothing: neither the job nor its
/// checkpoint.
async fn a_stale_attempt_changes_nothing(store: &dyn Store, stale: &LeaseRef, now: i64) {
    let job = store
        .job_by_id(&stale.job_id)
        .await
        .expect("job_by_id")
        .expect("the job exists");
    let saved = checkpoint_of(store, &job.id).await;
    assert_eq!(heartbeat(store, stale, now).await, Lease::Lost, "{stale:?}");
    assert!(!set_progress(store, stale, &json!({"done": 9}), now).await);
    assert!(!save_checkpoint(store, stale, &json!({"stale": true})).await);
    let ticket = format!("t_{}", new_id());
    assert_eq!(park(store, stale, &ticket, now).await, None, "{stale:?}");
    let late = Json::from(json!({"late": true}));
    assert_eq!(succeed(store, stale, &late, now).await, None, "{stale:?}");
    let error = failure("stale");
    for retry_at in [None, Some(now)] {
        assert_eq!(fail(store, stale, &error, retry_at, now).await, None);
    }
    assert_eq!(reread(store, &job).await, job, "{stale:?} changed the job");
    assert_eq!(checkpoint_of(store, &job.id).await, saved);
}

/// A worker whose lease expired and that claimed the same job again holds
/// it as its new attempt only: the first attempt (same lease owner, older
/// attempt) can neither heartbeat, report, checkpoint, park nor settle it,
/// while the new one can.
pub async fn a_job_claimed_again_by_its_own_worker_is_held_by_the_new_attempt_only(
    store: &dyn Store,
) {
    let job = running(store, &tenant(), "w1").await;
    let first = holder(&job);
    assert_eq!(first, lease(&job.id, "w1", 1));
    let now = BASE + LEASE + 1;
    let again = claim(store, &job.id, "w1", now)
        .await
        .expect("the lease expired");
    let second = holder(&again);
    assert_eq!(second, lease(&job.id, "w1", 2));
    a_stale_attempt_changes_nothing(store, &first, now + 1).await;

    assert_eq!(heartbeat(store, &second, now + 2).await, Lease::Held);
    assert!(set_progress(store, &second, &json!({"done": 1}), now + 2).await);
    assert!(save_checkpoint(store, &second, &json!({"step": 2})).await);
    let done = succeed(store, &second, &result_doc(), now + 3)
        .await
        .expect("the new attempt settles");
    assert_eq!((done.state, done.attempts), (JobState::Succeeded, 2));
    assert_eq!(heartbeat(store, &first, now + 4).await, Lease::Lost);
    assert_eq!(heartbeat(store, &second, now + 4).await, Lease::Lost);
}

/// The same across workers: once another worker claimed the job again,
/// neither the first worker's attempt nor the new worker under an older
/// attempt number changes anything; the new attempt fails it as its holder.
pub async fn a_job_claimed_again_by_another_worker_is_held_by_the_new_attempt_only(
    store: &dyn Store,
) {
    let job = running(store, &tenant(), "w1").await;
    let now = BASE + LEASE + 1;
    let again = claim(store, &job.id, "w2", now)
        .await
        .expect("the lease expired");
    let second = holder(&again);
    assert_eq!(second, lease(&job.id, "w2", 2));
    for stale in [
        holder(&job),
        lease(&job.id, "w2", 1),
        lease(&job.id, "w1", 2),
    ] {
        a_stale_attempt_changes_nothing(store, &stale, now + 1).await;
    }
    assert_eq!(heartbeat(store, &second, now + 2).await, Lease::Held);
    let retrying = fail(store, &second, &failure("flaky"), Some(now + 10), now + 3)
        .await
        .expect("the new attempt fails it");
    assert_eq!((retrying.state, retrying.attempts), (JobState::Retrying, 2));
    a_stale_attempt_changes_nothing(store, &second, now + 4).await;
}

/// A heartbeat extends the holder's lease; anyone else is told the lease is
/// lost, and everyone is told when the job was cancelled.
pub async fn heartbeat_extends_the_lease_of_its_holder_only(store: &dyn Store) {
    let t = tenant();
    let job = running(store, &t, "w1").await;
    let beat = BASE + LEASE - 1;
    assert_eq!(
        heartbeat(store, &lease(&job.id, "w1", 1), beat).await,
        Lease::Held
    );
    assert_eq!(reread(store, &job).await.lease_until, Some(beat + LEASE));
    assert_eq!(claim(store, &job.id, "w2", BASE + LEASE + 1).await, None);
    assert_eq!(
        heartbeat(store, &lease(&job.id, "w2", 1), beat).await,
        Lease::Lost
    );
    assert_eq!(
        heartbeat(store, &lease(&new_id(), "w1", 1), beat).await,
        Lease::Lost
    );
    store
        .cancel(crate::CancelJob {
            tenant: &t,
            id: &job.id,
            now: beat + 1,
        })
        .await
        .expect("cancel");
    assert_eq!(
        heartbeat(store, &lease(&job.id, "w1", 1), beat + 2).await,
        Lease::Cancelled
    );
}

/// Progress is recorded only by the worker that holds the job.
pub async fn progress_is_recorded_for_the_holder_only(store: &dyn Store) {
    let job = running(store, &tenant(), "w1").await;
    let progress = json!({"done": 3, "of": 6});
    assert!(set_progress(store, &lease(&job.id, "w1", 1), &progress, BASE + 1).await);
    assert!(
        !set_progress(
            store,
            &lease(&job.id, "w2", 1),
            &json!({"done": 0}),
            BASE + 2
        )
        .await
    );
    let seen = reread(store, &job).await;
    assert_eq!((seen.progress, seen.updated_at), (Some(progress), BASE + 1));
    succeed(store, &lease(&job.id, "w1", 1), &result_doc(), BASE + 3).await;
    assert!(!set_progress(store, &lease(&job.id, "w1", 1), &json!(1), BASE + 4).await);
}

/// Only the holder settles a job, and only once.
pub async fn succeed_settles_once_for_the_holder_only(store: &dyn Store) {
    let job = running(store, &tenant(), "w1").await;
    assert_eq!(
        succeed(store, &lease(&job.id, "w2", 1), &result_doc(), BASE + 1).await,
        None
    );
    let done = succeed(store, &lease(&job.id, "w1", 1), &result_doc(), BASE + 2).await;
    let done = done.expect("the holder settles");
    assert_eq!(done.state, JobState::Succeeded);
    assert_eq!(done.result, Some(result_doc()));
    assert_eq!(
        (
            done.lease_owner.as_deref(),
            done.lease_until,
            done.updated_at
        ),
        (None, None, BASE + 2)
    );
    let other = Json::from(json!({"other": true}));
    assert_eq!(
        succeed(store, &lease(&job.id, "w1", 1), &other, BASE + 3).await,
        None
    );
    assert_eq!(reread(store, &job).await, done);
}

/// A success given the record its claim answered answers exactly the row
/// it stored, what changed under the lease (progress, heartbeats) included,
/// whether alone or many at once; a record of another attempt is not used.
pub async fn a_success_given_its_claimed_record_answers_the_stored_row(store: &dyn Store) {
    let t = tenant();
    let job = running(store, &t, "w1").await;
    let held = lease(&job.id, "w1", 1);
    assert!(set_progress(store, &held, &json!({"done": 3, "of": 4}), BASE + 1).await);
    assert_eq!(heartbeat(store, &held, BASE + 2).await, Lease::Held);
    let done = succeed_claimed(store, &held, &job, BASE + 3).await;
    assert_eq!(done.progress, Some(json!({"done": 3, "of": 4})));
    assert_eq!(done, reread(store, &job).await);

    // A record of an earlier attempt: the store answers the row as it is.
    let other = running(store, &t, "w1").await;
    let stale = JobRecord {
        attempts: 7,
        args: json!({"not": "these"}),
        ..other.clone()
    };
    let done = succeed_claimed(store, &lease(&other.id, "w1", 1), &stale, BASE + 3).await;
    assert_eq!(done.args, other.args);
    assert_eq!(done, reread(store, &other).await);

    // Many at once, each with its own record.
    let jobs = futures_util::future::join_all((0..20).map(|_| running(store, &t, "w2"))).await;
    let leases: Vec<LeaseRef> = jobs.iter().map(|j| lease(&j.id, "w2", 1)).collect();
    let result = result_doc();
    let settled = futures_util::future::join_all(jobs.iter().zip(&leases).map(|(job, held)| {
        store.succeed(Succeed {
            lease: held,
            result: &result,
            now: BASE + 4,
            claimed: Some(job),
        })
    }))
    .await;
    for (job, done) in jobs.iter().zip(settled) {
        let done = done.expect("succeed").expect("the holder settles");
        assert_eq!(done.id, job.id);
        assert_eq!(done, reread(store, job).await);
    }
}

/// Succeeded, failed and cancelled jobs stay so: a duplicate delivery,
/// however late, never runs them again.
pub async fn a_settled_job_is_never_claimed_again(store: &dyn Store) {
    let t = tenant();
    let succeeded = running(store, &t, "w1").await;
    succeed(
        store,
        &lease(&succeeded.id, "w1", 1),
        &result_doc(),
        BASE + 1,
    )
    .await;
    let failed = running(store, &t, "w1").await;
    fail(
        store,
        &lease(&failed.id, "w1", 1),
        &failure("broken"),
        None,
        BASE + 1,
    )
    .await;
    let cancelled = queued(store, &t).await;
    store
        .cancel(crate::CancelJob {
            tenant: &t,
            id: &cancelled.id,
            now: BASE + 1,
        })
        .await
        .expect("cancel");
    let late = BASE + 1_000 * LEASE;
    for job in [&succeeded, &failed, &cancelled] {
        let before = reread(store, job).await;
        assert!(before.state.is_settled(), "{before:?}");
        assert_eq!(claim(store, &job.id, "w2", late).await, None, "{before:?}");
        assert_eq!(reread(store, job).await, before);
    }
    let due = first_due(store, late, late, 1000).await;
    assert!(due.iter().all(|j| j.tenant != t), "{due:?}");
}

/// A failure with a retry time waits until then, keeps its error, and is
/// claimed again as the next attempt.
pub async fn fail_with_a_retry_waits_for_run_at(store: &dyn Store) {
    let job = running(store, &tenant(), "w1").await;
    let error = failure("the OCR service timed out");
    let retry_at = BASE + 5_000;
    let retrying = fail(
        store,
        &lease(&job.id, "w1", 1),
        &error,
        Some(retry_at),
        BASE + 100,
    )
    .await;
    let retrying = retrying.expect("the holder fails it");
    assert_eq!(
        (retrying.state, retrying.run_at, retrying.attempts),
        (JobState::Retrying, retry_at, 1)
    );
    assert_eq!(
        (retrying.lease_owner.as_deref(), retrying.lease_until),
        (None, None)
    );
    assert_eq!(
        (retrying.error.as_ref(), retrying.updated_at),
        (Some(&error), BASE + 100)
    );
    assert_eq!(claim(store, &job.id, "w2", retry_at - 1).await, None);
    let again = claim(store, &job.id, "w2", retry_at)
        .await
        .expect("due at run_at");
    assert_eq!(
        (again.state, again.attempts, again.lease_owner.as_deref()),
        (JobState::Running, 2, Some("w2"))
    );
}

/// After its last attempt the lifecycle fails a job rather than retry it,
/// and so does a failure without a retry time: the failure is final and
/// keeps the last error.
pub async fn the_last_attempt_fails_for_good(store: &dyn Store) {
    let t = tenant();
    let mut new = ocr_job(&t);
    new.max_attempts = 2;
    let job = insert(store, new).await;
    claim(store, &job.id, "w1", BASE).await.expect("claim");
    fail(
        store,
        &lease(&job.id, "w1", 1),
        &failure("first"),
        Some(BASE + 10),
        BASE + 1,
    )
    .await;
    claim(store, &job.id, "w1", BASE + 10)
        .await
        .expect("claim the retry");
    let last = failure("second");
    let next = after_failure(2, job.max_attempts, last.retryable);
    assert_eq!(next, Transition::Fail, "no attempt remains");
    let retry_at = (next == Transition::Retry).then_some(BASE + 20);
    let failed = fail(store, &lease(&job.id, "w1", 2), &last, retry_at, BASE + 11).await;
    let failed = failed.expect("the holder fails it");
    assert_eq!(
        (failed.state, failed.attempts, failed.error),
        (JobState::Failed, 2, Some(last))
    );
    assert_eq!(claim(store, &job.id, "w1", BASE + 20).await, None);

    let once = running(store, &t, "w1").await;
    let error = failure("not retryable").retryable(false);
    let failed = fail(store, &lease(&once.id, "w1", 1), &error, None, BASE + 1).await;
    let failed = failed.expect("the holder fails it");
    assert_eq!(
        (failed.state, failed.attempts, failed.error),
        (JobState::Failed, 1, Some(error))
    );
}

/// Cancelling moves a queued, retrying or running job to cancelled with a
/// `cancelled` error, and its worker can no longer settle it.
pub async fn cancel_stops_queued_retrying_and_running_jobs(store: &dyn Store) {
    let t = tenant();
    let queued_job = queued(store, &t).await;
    let running_job = running(store, &t, "w1").await;
    let retrying_job = running(store, &t, "w1").await;
    fail(
        store,
        &lease(&retrying_job.id, "w1", 1),
        &failure("x"),
        Some(BASE + 50),
        BASE + 1,
    )
    .await;
    for job in [&queued_job, &running_job, &retrying_job] {
        let cancelled = store
            .cancel(crate::CancelJob {
                tenant: &t,
                id: &job.id,
                now: BASE + 2,
            })
            .await
            .expect("cancel")
            .expect("the tenant's job");
        assert_eq!(
            (cancelled.state, cancelled.updated_at),
            (JobState::Cancelled, BASE + 2)
        );
        assert_eq!(cancelled.error.map(|e| e.code), Some(ErrorCode::Cancelled));
        assert_eq!((cancelled.lease_owner, cancelled.lease_until), (None, None));
    }
    assert_eq!(
        heartbeat(store, &lease(&running_job.id, "w1", 1), BASE + 3).await,
        Lease::Cancelled
    );
    assert_eq!(
        succeed(
            store,
            &lease(&running_job.id, "w1", 1),
            &result_doc(),
            BASE + 3
        )
        .await,
        None
    );
    assert_eq!(reread(store, &running_job).await.state, JobState::Cancelled);
}

/// [`Store::dead_letter`] of `id` at `now`, with the error the reconciler
/// gives.
async fn dead_letter(store: &dyn Store, id: &str, now: i64) -> Option<JobRecord> {
    dead_letter_of(store, id, now, None).await
}

/// [`dead_letter`] of a letter the broker says died at `died_at`.
async fn dead_letter_of(
    store: &dyn Store,
    id: &str,
    now: i64,
    died_at: Option<i64>,
) -> Option<JobRecord> {
    let error = ToolError::new(ErrorCode::DeadLettered, "the broker gave up on its message");
    store
        .dead_letter(crate::DeadLetter {
            id,
            error: &error,
            now,
            died_at,
        })
        .await
        .expect("dead_letter")
}

/// A dead letter fails a waiting job (of whichever tenant) and a running
/// one whose lease ran out, keeping the error; a job a live lease holds, a
/// settled one, a missing id and a job written since the letter died are
/// left as they are, and the holder of a lease that ran out can no longer
/// settle it.
pub async fn a_dead_letter_fails_only_a_job_no_attempt_holds(store: &dyn Store) {
    let t = tenant();
    let waiting = queued(store, &t).await;
    let failed = dead_letter(store, &waiting.id, BASE + 1)
        .await
        .expect("a queued job fails");
    assert_eq!(failed.state, JobState::Failed);
    let error = failed.error.as_ref().expect("its error is kept");
    assert_eq!(error.code, ErrorCode::DeadLettered);
    assert_eq!(
        dead_letter(store, &waiting.id, BASE + 2).await,
        None,
        "settled"
    );
    assert_eq!(reread(store, &failed).await, failed, "left as it was");

    let held = running(store, &t, "w1").await;
    assert_eq!(
        dead_letter(store, &held.id, BASE + 1).await,
        None,
        "a live lease holds it: the dead letter was a duplicate"
    );
    assert_eq!(reread(store, &held).await.state, JobState::Running);
    let out = dead_letter(store, &held.id, LEASES_OUT)
        .await
        .expect("a lease that ran out holds nothing");
    assert_eq!(out.state, JobState::Failed);
    assert_eq!(out.lease_owner, None);
    let late = succeed(
        store,
        &lease(&held.id, "w1", 1),
        &result_doc(),
        LEASES_OUT + 1,
    )
    .await;
    assert_eq!(late, None, "the old holder settles nothing");
    assert_eq!(
        dead_letter(store, &format!("j_{}", new_id()), BASE).await,
        None
    );

    // A letter that died before the job was last written (put back by a
    // retry since) is of an earlier life: the job is left as it is.
    let again = queued(store, &t).await;
    let before = again.updated_at - 1;
    let stale = dead_letter_of(store, &again.id, BASE + 1, Some(before)).await;
    assert_eq!(stale, None);
    assert_eq!(reread(store, &again).await.state, JobState::Queued);
    let after = again.updated_at;
    let failed = dead_letter_of(store, &again.id, BASE + 1, Some(after)).await;
    assert_eq!(failed.map(|j| j.state), Some(JobState::Failed));
}

/// A claim records when its attempt started; each failed attempt, retried
/// or final, is logged with its number, start, end and error; a success
/// logs nothing; a requeue starts a new log.
pub async fn each_failed_attempt_is_logged_with_its_times_and_error(store: &dyn Store) {
    let t = tenant();
    let first = running(store, &t, "w1").await;
    assert_eq!(first.started_at, Some(BASE));
    assert_eq!(first.attempts_log, None);
    let retrying = fail(
        store,
        &holder(&first),
        &failure("flaky"),
        Some(BASE + 100),
        BASE + 50,
    )
    .await
    .expect("held");
    let second = claim(store, &first.id, "w2", BASE + 200)
        .await
        .expect("due");
    assert_eq!(second.started_at, Some(BASE + 200));
    let failed = fail(
        store,
        &holder(&second),
        &failure("broken"),
        None,
        BASE + 300,
    )
    .await
    .expect("held");
    assert_eq!(failed.state, JobState::Failed);
    let log = failed.attempts_log.expect("a log");
    let entries = log.as_array().expect("an array");
    assert_eq!(entries.len(), 2, "{log}");
    assert_eq!(entries[0]["attempt"], 1);
    assert_eq!(entries[0]["started_at"], BASE);
    assert_eq!(entries[0]["ended_at"], BASE + 50);
    assert_eq!(
        entries[0]["error"]["message"],
        retrying.error.expect("kept").message
    );
    assert_eq!(entries[1]["attempt"], 2);
    assert_eq!(
        (
            entries[1]["started_at"].as_i64(),
            entries[1]["ended_at"].as_i64()
        ),
        (Some(BASE + 200), Some(BASE + 300))
    );
    let again = store
        .requeue(crate::Requeue {
            tenant: &t,
            id: &first.id,
            now: BASE + 400,
        })
        .await
        .expect("requeue")
        .expect("put back");
    assert_eq!(
        (again.attempts_log, again.started_at),
        (None, None),
        "a new life"
    );
    let ok = running(store, &t, "w1").await;
    let done = succeed(store, &holder(&ok), &result_doc(), BASE + 10)
        .await
        .expect("held");
    assert_eq!(done.attempts_log, None, "a success logs nothing");
}

/// The job list within a time window: a job's id begins with the
/// millisecond it was made, so `made_since` and `made_before` bound the
/// ids, with a state or without, and with the cursor.
pub async fn the_job_list_takes_the_jobs_made_within_a_time_window(store: &dyn Store) {
    let t = tenant();
    let made_at = |ms: u64| {
        let tail = new_id();
        let hex = format!("{ms:012x}");
        format!("{}-{}-{}", &hex[..8], &hex[8..], &tail[14..])
    };
    let mut ids = Vec::new();
    for ms in [1_000_000u64, 2_000_000, 3_000_000] {
        let job = NewJob {
            id: made_at(ms),
            ..ocr_job(&t)
        };
        ids.push(insert(store, job).await.id);
    }
    let listed = |since: Option<i64>, before: Option<i64>, state: Option<JobState>| {
        let filter = JobFilter {
            state,
            made_since: since,
            made_before: before,
            ..JobFilter::default()
        };
        let t = t.clone();
        async move {
            let page = store
                .list_jobs(crate::ListJobs {
                    tenant: &t,
                    filter: &filter,
                    limit: 10,
                    cursor: None,
                })
                .await
                .expect("list");
            page.jobs.into_iter().map(|j| j.id).collect::<Vec<_>>()
        }
    };
    let (a, b, c) = (ids[0].clone(), ids[1].clone(), ids[2].clone());
    assert_eq!(
        listed(Some(2_000_000), None, None).await,
        [c.clone(), b.clone()]
    );
    assert_eq!(
        listed(None, Some(3_000_000), None).await,
        [b.clone(), a.clone()]
    );
    assert_eq!(
        listed(Some(2_000_000), Some(3_000_000), None).await,
        std::slice::from_ref(&b)
    );
    let queued = Some(JobState::Queued);
    assert_eq!(listed(Some(1_500_000), Some(2_500_000), queued).await, [b]);
    assert!(listed(Some(4_000_000), None, None).await.is_empty());
}

/// A tenant's queues: its jobs not settled by pool and state with the
/// earliest due, its jobs settled since a time by pool, state and minute;
/// never another tenant's, nor what settled before.
pub async fn queue_stats_count_a_tenants_jobs_by_pool_state_and_minute(store: &dyn Store) {
    let (t, other) = (tenant(), tenant());
    let in_pool = |pool: &str, now: i64| NewJob {
        pool: pool.to_owned(),
        ..job_for(&t, "ocr", json!({}), None, now)
    };
    insert(store, in_pool("crawl", BASE + 5)).await;
    insert(store, in_pool("crawl", BASE + 3)).await;
    insert(store, in_pool("mail", BASE + 4)).await;
    queued(store, &other).await;
    let early = running(store, &t, "w1").await;
    succeed(store, &holder(&early), &result_doc(), BASE + 10)
        .await
        .expect("held");
    let late = running(store, &t, "w1").await;
    let minute = BASE + 120_000;
    succeed(store, &holder(&late), &result_doc(), minute + 5)
        .await
        .expect("held");
    let mut rows = store
        .queue_stats(&t, BASE + 60_000)
        .await
        .expect("queue_stats");
    rows.sort_by(|a, b| (&a.pool, a.state.as_str()).cmp(&(&b.pool, b.state.as_str())));
    let row = |pool: &str, state, count, earliest, minute| crate::PoolRow {
        pool: pool.to_owned(),
        state,
        count,
        earliest,
        minute,
        waited: 0,
        wait_total_ms: 0,
        wait_max_ms: None,
    };
    let settled_minute = (minute + 5) / 60_000 * 60_000;
    // The late job was due at BASE and started when `running` claimed it.
    let wait = late.started_at.unwrap_or_default() - late.run_at;
    let settled = crate::PoolRow {
        waited: 1,
        wait_total_ms: wait,
        wait_max_ms: Some(wait),
        ..row(
            "default",
            JobState::Succeeded,
            1,
            None,
            Some(settled_minute),
        )
    };
    assert_eq!(
        rows,
        [
            row("crawl", JobState::Queued, 2, Some(BASE + 3), None),
            settled,
            row("mail", JobState::Queued, 1, Some(BASE + 4), None),
        ]
    );
}

/// Cancelling a settled job answers it unchanged.
pub async fn cancel_leaves_a_settled_job_as_it_is(store: &dyn Store) {
    let t = tenant();
    let job = running(store, &t, "w1").await;
    let done = succeed(store, &lease(&job.id, "w1", 1), &result_doc(), BASE + 1)
        .await
        .expect("held");
    assert_eq!(
        store
            .cancel(crate::CancelJob {
                tenant: &t,
                id: &job.id,
                now: BASE + 2
            })
            .await
            .expect("cancel"),
        Some(done.clone())
    );
    let cancelled = queued(store, &t).await;
    let first = store
        .cancel(crate::CancelJob {
            tenant: &t,
            id: &cancelled.id,
            now: BASE + 1,
        })
        .await
        .expect("cancel");
    assert_eq!(
        store
            .cancel(crate::CancelJob {
                tenant: &t,
                id: &cancelled.id,
                now: BASE + 2
            })
            .await
            .expect("cancel"),
        first
    );
    assert_eq!(reread(store, &job).await, done);
}

/// Due jobs are the queued, the retrying whose time came and the running
/// whose lease ran out, oldest first.
///
/// A dispatcher that answers before it publishes beats; once silent, its
/// queued jobs of a time range are found by id, page by page, and it is
/// forgotten unless it beat again. Another dispatcher's jobs, jobs no
/// longer queued and older ones are not its queued jobs.
///
/// This test's dispatchers beat in a range of times of their own, far
/// after every other test's; it forgets them at the end.
pub async fn a_silent_dispatchers_queued_jobs_are_found_until_it_is_forgotten(store: &dyn Store) {
    let t0 = LATER + 500_000_000_000;
    let (quiet, alive) = (format!("o_{}", new_id()), format!("o_{}", new_id()));
    store.beat_dispatcher(&quiet, t0).await.expect("beat");
    store.beat_dispatcher(&alive, t0).await.expect("beat");
    store
        .beat_dispatcher(&alive, t0 + 5_000)
        .await
        .expect("beat");
    // A late beat never moves a dispatcher back in time.
    store.beat_dispatcher(&alive, t0 + 1).await.expect("beat");
    let silent = store
        .silent_dispatchers(t0 + 1_000, 1000)
        .await
        .expect("silent");
    let silent: Vec<_> = silent
        .into_iter()
        .filter(|s| s.origin == quiet || s.origin == alive)
        .collect();
    assert_eq!(
        silent,
        vec![crate::SilentDispatcher {
            origin: quiet.clone(),
            seen_at: t0
        }]
    );

    let t = tenant();
    let made = |n: i64, origin: &str| NewJob {
        origin: Some(origin.to_owned()),
        ..job_for(&t, "ocr", json!({ "n": n }), None, t0 - 10_000 + n)
    };
    let mut theirs = Vec::new();
    for n in 0..5 {
        theirs.push(insert(store, made(n, &quiet)).await.id);
    }
    let older = insert(store, made(-20_000, &quiet)).await;
    let others = insert(store, made(1, &alive)).await;
    let held = insert(store, made(6, &quiet)).await;
    claim(store, &held.id, "worker-1", t0)
        .await
        .expect("claimed");
    theirs.sort();

    let page = |after: Option<String>, limit: u32| {
        let quiet = quiet.clone();
        async move {
            store
                .queued_from(crate::QueuedFrom {
                    origin: &quiet,
                    since: t0 - 10_000,
                    after: after.as_deref(),
                    limit,
                })
                .await
                .expect("queued_from")
                .into_iter()
                .map(|job| job.id)
                .collect::<Vec<_>>()
        }
    };
    let first = page(None, 3).await;
    assert_eq!(first, theirs[..3]);
    let rest = page(first.last().cloned(), 3).await;
    assert_eq!(rest, theirs[3..]);
    let all = page(None, 100).await;
    assert!(!all.contains(&older.id) && !all.contains(&others.id) && !all.contains(&held.id));

    // Forgotten once, while silent; one that beat since is kept.
    assert!(
        !store
            .forget_dispatcher(&alive, t0 + 1_000)
            .await
            .expect("forget")
    );
    assert!(
        store
            .forget_dispatcher(&quiet, t0 + 1_000)
            .await
            .expect("forget")
    );
    assert!(
        !store
            .forget_dispatcher(&quiet, t0 + 1_000)
            .await
            .expect("forget")
    );
    let silent = store
        .silent_dispatchers(t0 + 1_000, 1000)
        .await
        .expect("silent");
    assert!(
        silent
            .iter()
            .all(|s| s.origin != quiet && s.origin != alive)
    );
    assert!(
        store
            .forget_dispatcher(&alive, i64::MAX)
            .await
            .expect("forget")
    );
    for id in theirs.iter().chain([&older.id, &others.id, &held.id]) {
        let cancel = crate::CancelJob {
            tenant: &t,
            id,
            now: t0,
        };
        store.cancel(cancel).await.expect("cancel");
    }
}

/// A job given a start time is `scheduled` until then: no claim takes it
/// early, `due_jobs` names it only from a `due_by` that reaches it, the
/// envelope and the list show its state and time, and a cancel stops it
/// before it is due. One given a time already past is `queued` at once.
/// Works two months before [`BASE`], where no other test's job is due.
pub async fn a_scheduled_job_waits_for_its_time(store: &dyn Store) {
    let t = tenant();
    let t0 = BASE - 60 * 24 * 3_600_000;
    let at = t0 + 60_000;
    let make = |run_at: i64| NewJob {
        run_at: Some(run_at),
        ..job_for(&t, "ocr", json!({}), None, t0)
    };
    let job = insert(store, make(at)).await;
    assert_eq!((job.state, job.run_at), (JobState::Scheduled, at));
    assert_eq!(job.attempts, 0);
    match job.envelope(5) {
        Envelope::Running { state, run_at, .. } => {
            assert_eq!(state, Some(JobState::Scheduled));
            assert_eq!(run_at, Some(toolfleet_core::iso8601(at)));
        }
        other => panic!("a scheduled job reads as running: {other:?}"),
    }
    let past = insert(store, make(t0 - 1)).await;
    assert_eq!((past.state, past.run_at), (JobState::Queued, t0));
    assert_eq!(
        claim(store, &job.id, "w1", at - 1).await,
        None,
        "not before its time"
    );
    assert_eq!(reread(store, &job).await.state, JobState::Scheduled);

    let id = job.id.as_str();
    let due = |now: i64, due_by: i64| async move {
        let due = first_due(store, now, due_by, 1000).await;
        due.iter().any(|j| j.id == id)
    };
    assert!(!due(t0 + 1, t0 + 1).await, "not due yet");
    assert!(!due(t0 + 1, at - 1).await, "not due within the window");
    assert!(due(t0 + 1, at).await, "due within a window that reaches it");
    // A backlog of queued jobs, all due before it, does not hide it.
    let mut backlog = Vec::new();
    for _ in 0..3 {
        backlog.push(insert(store, job_for(&t, "ocr", json!({}), None, t0 - 1_000)).await);
    }
    let few = first_due(store, t0 + 1, at, 2).await;
    assert!(few.iter().any(|j| j.id == job.id), "{few:?}");
    assert!(due(at, at).await, "due at its time");

    let filter = JobFilter {
        state: Some(JobState::Scheduled),
        ..JobFilter::default()
    };
    let page = store
        .list_jobs(crate::ListJobs {
            tenant: &t,
            filter: &filter,
            limit: 10,
            cursor: None,
        })
        .await
        .expect("list");
    let listed: Vec<&str> = page.jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(listed, [job.id.as_str()], "listed under its state");
    let counts = store.job_counts().await.expect("counts");
    assert!(
        counts
            .iter()
            .any(|(s, n)| *s == JobState::Scheduled && *n >= 1),
        "{counts:?}"
    );

    let stopped = insert(store, make(at)).await;
    let cancelled = store
        .cancel(crate::CancelJob {
            tenant: &t,
            id: &stopped.id,
            now: t0 + 2,
        })
        .await
        .expect("cancel")
        .expect("the job");
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert_eq!(
        claim(store, &stopped.id, "w1", at).await,
        None,
        "a cancelled job never runs"
    );

    let claimed = claim(store, &job.id, "w1", at)
        .await
        .expect("claimed at its time");
    assert_eq!((claimed.state, claimed.attempts), (JobState::Running, 1));
    let left = backlog.iter().map(|j| &j.id);
    for id in [&job.id, &past.id].into_iter().chain(left) {
        let cancel = crate::CancelJob {
            tenant: &t,
            id,
            now: at,
        };
        store.cancel(cancel).await.expect("cancel");
    }
}

/// A failed or cancelled job put back is queued and due again, its
/// attempts counted anew and its last outcome gone, one more requeue on
/// its count; it runs and settles like a new job. A job in any other
/// state, another tenant's and a missing one are not put back.
pub async fn a_failed_or_cancelled_job_is_put_back_as_new(store: &dyn Store) {
    let t = tenant();
    let back = |tenant: String, id: String, now: i64| async move {
        store
            .requeue(crate::Requeue {
                tenant: &tenant,
                id: &id,
                now,
            })
            .await
            .expect("requeue")
    };
    let job = running(store, &t, "w1").await;
    assert_eq!(
        back(t.clone(), job.id.clone(), BASE + 1).await,
        None,
        "running"
    );
    let failed = fail(store, &holder(&job), &failure("broken"), None, BASE + 2)
        .await
        .expect("failed");
    assert_eq!(
        back(tenant(), failed.id.clone(), BASE + 3).await,
        None,
        "another tenant's"
    );
    assert_eq!(back(t.clone(), new_id(), BASE + 3).await, None, "missing");
    let again = back(t.clone(), failed.id.clone(), BASE + 3)
        .await
        .expect("put back");
    assert_eq!(
        (again.state, again.attempts, again.requeues, again.run_at),
        (JobState::Queued, 0, 1, BASE + 3)
    );
    assert!(again.error.is_none() && again.result.is_none(), "{again:?}");
    assert_eq!(reread(store, &again).await.state, JobState::Queued);
    assert_eq!(
        back(t.clone(), failed.id.clone(), BASE + 4).await,
        None,
        "queued now"
    );
    let claimed = claim(store, &again.id, "w2", BASE + 5)
        .await
        .expect("claimed");
    assert_eq!((claimed.attempts, claimed.requeues), (1, 1));
    let done = succeed(store, &holder(&claimed), &result_doc(), BASE + 6)
        .await
        .expect("settled");
    assert_eq!(done.state, JobState::Succeeded);
    assert_eq!(
        back(t.clone(), done.id.clone(), BASE + 7).await,
        None,
        "succeeded"
    );

    let stopped = queued(store, &t).await;
    let cancel = crate::CancelJob {
        tenant: &t,
        id: &stopped.id,
        now: BASE + 8,
    };
    store.cancel(cancel).await.expect("cancel");
    let revived = back(t.clone(), stopped.id.clone(), BASE + 9)
        .await
        .expect("a cancelled job is put back");
    assert_eq!((revived.state, revived.requeues), (JobState::Queued, 1));
}

/// `requeue_many` puts back the failed and cancelled jobs its filter
/// names (user, tool, state, error code, settled in a time range), oldest
/// settled first and at most its limit, and no other. Works three months
/// before [`BASE`].
pub async fn requeue_many_puts_back_what_its_filter_names(store: &dyn Store) {
    let t = tenant();
    let t0 = BASE - 90 * 24 * 3_600_000 - 500_000;
    let settle = |tool: &'static str, code: ErrorCode, at: i64| {
        let t = t.clone();
        async move {
            let job = insert(store, job_for(&t, tool, json!({}), None, at)).await;
            let held = claim(store, &job.id, "w1", at).await.expect("claimed");
            let error = ToolError::new(code, "no");
            fail(store, &holder(&held), &error, None, at + 1)
                .await
                .expect("failed")
        }
    };
    let a = settle("ocr", ErrorCode::Timeout, t0).await;
    let b = settle("ocr", ErrorCode::ToolFailed, t0 + 10).await;
    let c = settle("mail", ErrorCode::Timeout, t0 + 20).await;
    let late = settle("ocr", ErrorCode::Timeout, t0 + 1_000).await;
    let ok = insert(store, job_for(&t, "ocr", json!({}), None, t0)).await;
    let failed = [JobState::Failed, JobState::Cancelled];
    let many = |tool: Option<&'static str>, code: Option<&'static str>, limit: u32| {
        let t = t.clone();
        async move {
            let put = store
                .requeue_many(crate::RequeueMany {
                    tenant: &t,
                    user: None,
                    tool,
                    states: &failed,
                    error_code: code,
                    since: t0,
                    until: t0 + 500,
                    limit,
                    now: t0 + 2_000,
                })
                .await
                .expect("requeue_many");
            put.into_iter().map(|j| j.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(
        many(Some("ocr"), Some("timeout"), 10).await,
        [a.id.as_str()]
    );
    assert_eq!(
        many(None, None, 1).await,
        [b.id.as_str()],
        "oldest first, at its limit"
    );
    assert_eq!(many(None, None, 10).await, [c.id.as_str()]);
    assert!(many(None, None, 10).await.is_empty(), "each once");
    assert_eq!(
        reread(store, &late).await.state,
        JobState::Failed,
        "outside the range"
    );
    assert_eq!(reread(store, &ok).await.state, JobState::Queued);
    let other = store
        .requeue_many(crate::RequeueMany {
            tenant: &t,
            user: Some("bob"),
            tool: None,
            states: &failed,
            error_code: None,
            since: t0,
            until: t0 + 2_000,
            limit: 10,
            now: t0 + 3_000,
        })
        .await
        .expect("requeue_many");
    assert!(other.is_empty(), "only the named user's");
    for job in [a, b, c, late, ok] {
        let cancel = crate::CancelJob {
            tenant: &t,
            id: &job.id,
            now: t0 + 4_000,
        };
        store.cancel(cancel).await.expect("cancel");
    }
}

/// This test works a month before [`BASE`], where no other test's job is
/// due, and cancels its jobs at the end so later runs do not see them.
pub async fn due_jobs_lists_what_should_run_oldest_first(store: &dyn Store) {
    let t = tenant();
    let t0 = BASE - 30 * 24 * 3_600_000;
    let now = t0 + 500;
    let add = |at: i64| insert(store, job_for(&t, "ocr", json!({}), None, at));
    let queued_due = add(t0).await;
    let held = add(t0).await;
    store
        .claim(crate::ClaimJob {
            id: &held.id,
            worker: "w1",
            now: t0 + 2,
            lease_ms: 1_000,
        })
        .await
        .expect("claim");
    let abandoned = add(t0).await;
    store
        .claim(crate::ClaimJob {
            id: &abandoned.id,
            worker: "w1",
            now: t0 + 2,
            lease_ms: 100,
        })
        .await
        .expect("claim");
    let waiting = add(t0).await;
    store
        .claim(crate::ClaimJob {
            id: &waiting.id,
            worker: "w1",
            now: t0 + 2,
            lease_ms: 100,
        })
        .await
        .expect("claim");
    fail(
        store,
        &lease(&waiting.id, "w1", 1),
        &failure("x"),
        Some(now + 1),
        t0 + 3,
    )
    .await;
    let retry_due = add(t0).await;
    store
        .claim(crate::ClaimJob {
            id: &retry_due.id,
            worker: "w1",
            now: t0 + 2,
            lease_ms: 100,
        })
        .await
        .expect("claim");
    fail(
        store,
        &lease(&retry_due.id, "w1", 1),
        &failure("x"),
        Some(now),
        t0 + 3,
    )
    .await;
    let done = add(t0).await;
    store
        .claim(crate::ClaimJob {
            id: &done.id,
            worker: "w1",
            now: t0 + 2,
            lease_ms: 100,
        })
        .await
        .expect("claim");
    succeed(store, &lease(&done.id, "w1", 1), &result_doc(), t0 + 3).await;
    let not_yet = add(now + 1).await;

    let due = first_due(store, now, now, 1000).await;
    let mine: Vec<&str> = due
        .iter()
        .filter(|j| j.tenant == t)
        .map(|j| j.id.as_str())
        .collect();
    let expected = [
        queued_due.id.as_str(),
        abandoned.id.as_str(),
        retry_due.id.as_str(),
    ];
    assert_eq!(mine, expected);
    // At most the limit of each kind: one waiting, one expired.
    assert_eq!(first_due(store, now, now, 1).await.len(), 2);

    for job in [queued_due, held, abandoned, waiting, retry_due, not_yet] {
        store
            .cancel(crate::CancelJob {
                tenant: &t,
                id: &job.id,
                now,
            })
            .await
            .expect("cancel");
    }
}

/// The first page of [`Store::due_jobs`]: at most `limit` of each kind.
async fn first_due(store: &dyn Store, now: i64, due_by: i64, limit: u32) -> Vec<JobRecord> {
    let after = crate::DueAfter::default();
    let due = crate::DueJobs {
        now,
        due_by,
        after: &after,
        limit,
    };
    store.due_jobs(due).await.expect("due_jobs").jobs
}

/// A backlog longer than a page is read whole, a page at a time: each kind
/// in its own order (many jobs of one `run_at` by id), at most the limit of
/// each kind a page, every due job named, none twice within its kind, and
/// the last page says there is no next one.
pub async fn due_jobs_read_a_backlog_a_page_at_a_time(store: &dyn Store) {
    let t = tenant();
    // Later than the times other tests read due jobs at before BASE (a
    // store may be shared): none of these is due for them.
    let t0 = BASE - 20 * 24 * 3_600_000;
    // Past every lease taken at t0.
    let now = t0 + LEASE + 10_000;
    let mut waiting = Vec::new();
    for at in [t0, t0, t0, t0, t0 + 1, t0, t0 + 1] {
        waiting.push(insert(store, job_for(&t, "ocr", json!({}), None, at)).await);
    }
    // Later than every waiting job: the waiting kind reaches them last.
    let mut scheduled = Vec::new();
    for _ in 0..3 {
        let job = NewJob {
            run_at: Some(t0 + 5_000),
            ..job_for(&t, "ocr", json!({}), None, t0)
        };
        scheduled.push(insert(store, job).await);
    }
    let mut expired = Vec::new();
    for at in [t0, t0, t0] {
        let job = insert(store, job_for(&t, "ocr", json!({}), None, at)).await;
        expired.push(claim(store, &job.id, "w1", at).await.expect("claimable"));
    }
    let not_yet = insert(store, job_for(&t, "ocr", json!({}), None, now + 1)).await;
    // The order of each kind: by key, then id.
    let by_key = |jobs: &mut Vec<JobRecord>, key: fn(&JobRecord) -> i64| {
        jobs.sort_by(|a, b| (key(a), &a.id).cmp(&(key(b), &b.id)));
        jobs.iter().map(|j| j.id.clone()).collect::<Vec<_>>()
    };
    let waiting = by_key(&mut waiting, |j| j.run_at);
    let scheduled = by_key(&mut scheduled, |j| j.run_at);
    let expired = by_key(&mut expired, |j| j.lease_until.unwrap_or_default());

    let limit = 2;
    let mut after = crate::DueAfter::default();
    let (mut read, mut pages) = (Vec::new(), 0);
    loop {
        pages += 1;
        assert!(pages <= 100_000, "the pages never end: {after:?}");
        let due = crate::DueJobs {
            now,
            due_by: now,
            after: &after,
            limit,
        };
        let page = store.due_jobs(due).await.expect("due_jobs");
        let mine: Vec<JobRecord> = page.jobs.into_iter().filter(|j| j.tenant == t).collect();
        let ids: Vec<&str> = mine.iter().map(|j| j.id.as_str()).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted, "a page is by id");
        let count = |state: JobState| mine.iter().filter(|j| j.state == state).count();
        assert!(count(JobState::Queued) <= limit as usize, "{ids:?}");
        assert!(count(JobState::Running) <= limit as usize, "{ids:?}");
        read.push(mine);
        match page.next {
            Some(next) => after = next,
            None => break,
        }
    }
    // Each kind in its order across the pages, whole: within a page by its
    // key, then id.
    let key = |j: &JobRecord| match j.state {
        JobState::Running => (j.lease_until.unwrap_or_default(), j.id.clone()),
        _ => (j.run_at, j.id.clone()),
    };
    let named = |kind: &[String], pages: &[Vec<JobRecord>]| -> Vec<String> {
        let mut named = Vec::new();
        for page in pages {
            let mut here: Vec<&JobRecord> = page.iter().filter(|j| kind.contains(&j.id)).collect();
            here.sort_by_key(|j| key(j));
            named.extend(here.into_iter().map(|j| j.id.clone()));
        }
        named
    };
    assert_eq!(
        named(&waiting, &read),
        waiting,
        "the waiting, once each, by run_at and id"
    );
    assert_eq!(
        named(&expired, &read),
        expired,
        "the expired, once each, by lease and id"
    );
    // The scheduled kind, read on its own from the first page, is not
    // hidden behind the waiting backlog: its first two pages name all three.
    let first = &read[..read.len().min(2)];
    assert_eq!(
        named(&scheduled, first),
        scheduled,
        "the scheduled, by run_at and id"
    );
    // A scheduled job is due as waiting too: named by both kinds, at most.
    let times = named(&scheduled, &read);
    for id in &scheduled {
        let n = times.iter().filter(|named| *named == id).count();
        assert!((1..=2).contains(&n), "scheduled {id} named {n} times");
    }
    assert!(
        read.iter().flatten().all(|j| j.id != not_yet.id),
        "not due yet"
    );
    assert!(
        pages >= 4,
        "seven waiting jobs take four pages of two: {pages}"
    );

    let mut jobs: Vec<String> = waiting;
    jobs.extend(scheduled);
    jobs.extend(expired);
    jobs.push(not_yet.id);
    for id in jobs {
        store
            .cancel(crate::CancelJob {
                tenant: &t,
                id: &id,
                now,
            })
            .await
            .expect("cancel");
    }
}

// Listing and counting.

/// A tenant's jobs come newest first, a page at a time, with a cursor that
/// is absent on the last page.
pub async fn list_jobs_pages_newest_first(store: &dyn Store) {
    let t = tenant();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(queued(store, &t).await.id);
    }
    ids.reverse();
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for expected_len in [2, 2, 1] {
        let page = store
            .list_jobs(crate::ListJobs {
                tenant: &t,
                filter: &JobFilter::default(),
                limit: 2,
                cursor: cursor.as_deref(),
            })
            .await
            .expect("list_jobs");
        assert_eq!(page.jobs.len(), expected_len, "{page:?}");
        seen.extend(page.jobs.into_iter().map(|j| j.id));
        cursor = page.next_cursor;
    }
    assert_eq!((seen, cursor), (ids, None));
    let all = store
        .list_jobs(crate::ListJobs {
            tenant: &t,
            filter: &JobFilter::default(),
            limit: 5,
            cursor: None,
        })
        .await
        .expect("list_jobs");
    assert_eq!((all.jobs.len(), all.next_cursor), (5, None));
}

/// The state and tool filters narrow the list, together and with a cursor.
pub async fn list_jobs_filters_by_state_and_tool(store: &dyn Store) {
    let owned_tenant = tenant();
    let t = owned_tenant.as_str();
    let add = |tool: &'static str| insert(store, job_for(t, tool, json!({}), None, BASE));
    let ocr1 = add("ocr").await;
    let ocr2 = add("ocr").await;
    let ocr_running = add("ocr").await;
    claim(store, &ocr_running.id, "w1", BASE)
        .await
        .expect("claim");
    let mail = add("mail").await;
    let list = |state: Option<JobState>, tool: Option<&str>, cursor: Option<String>| {
        let filter = JobFilter {
            state,
            tool: tool.map(str::to_owned),
            ..JobFilter::default()
        };
        async move {
            store
                .list_jobs(crate::ListJobs {
                    tenant: t,
                    filter: &filter,
                    limit: 100,
                    cursor: cursor.as_deref(),
                })
                .await
                .expect("list_jobs")
        }
    };
    let ids = |page: crate::JobPage| page.jobs.into_iter().map(|j| j.id).collect::<Vec<_>>();
    let queued_ids = vec![mail.id.clone(), ocr2.id.clone(), ocr1.id.clone()];
    assert_eq!(
        ids(list(Some(JobState::Queued), None, None).await),
        queued_ids
    );
    let ocr_ids = vec![ocr_running.id.clone(), ocr2.id.clone(), ocr1.id.clone()];
    assert_eq!(ids(list(None, Some("ocr"), None).await), ocr_ids);
    assert_eq!(
        ids(list(Some(JobState::Queued), Some("ocr"), None).await),
        vec![ocr2.id.clone(), ocr1.id.clone()]
    );
    assert_eq!(
        ids(list(Some(JobState::Queued), Some("ocr"), Some(ocr2.id.clone())).await),
        vec![ocr1.id]
    );
    assert!(
        list(Some(JobState::Succeeded), None, None)
            .await
            .jobs
            .is_empty()
    );
    assert!(list(None, Some("nope"), None).await.jobs.is_empty());
}

/// A limit of 0 is read as 1 and one above 100 as 100.
pub async fn list_jobs_clamps_the_limit(store: &dyn Store) {
    let t = tenant();
    for _ in 0..101 {
        queued(store, &t).await;
    }
    let filter = JobFilter::default();
    let one = store
        .list_jobs(crate::ListJobs {
            tenant: &t,
            filter: &filter,
            limit: 0,
            cursor: None,
        })
        .await
        .expect("list_jobs");
    assert_eq!(one.jobs.len(), 1);
    assert!(one.next_cursor.is_some());
    let most = store
        .list_jobs(crate::ListJobs {
            tenant: &t,
            filter: &filter,
            limit: 1000,
            cursor: None,
        })
        .await
        .expect("list_jobs");
    assert_eq!(most.jobs.len(), 100);
    let rest = store
        .list_jobs(crate::ListJobs {
            tenant: &t,
            filter: &filter,
            limit: 1000,
            cursor: most.next_cursor.as_deref(),
        })
        .await
        .expect("list_jobs");
    assert_eq!((rest.jobs.len(), rest.next_cursor), (1, None));
}

/// Counts name each state at most once and follow the jobs that settle.
/// Settled counts only grow, so the check holds beside other tests.
pub async fn job_counts_count_each_state_once(store: &dyn Store) {
    let count = |counts: &[(JobState, u64)], state: JobState| {
        counts
            .iter()
            .filter(|(s, _)| *s == state)
            .map(|(_, n)| *n)
            .sum::<u64>()
    };
    let before = store.job_counts().await.expect("job_counts");
    let t = tenant();
    let job = running(store, &t, "w1").await;
    succeed(store, &lease(&job.id, "w1", 1), &result_doc(), BASE + 1).await;
    let job = queued(store, &t).await;
    store
        .cancel(crate::CancelJob {
            tenant: &t,
            id: &job.id,
            now: BASE + 1,
        })
        .await
        .expect("cancel");
    let after = store.job_counts().await.expect("job_counts");
    let mut states: Vec<&str> = after.iter().map(|(s, _)| s.as_str()).collect();
    states.sort_unstable();
    let listed = states.len();
    states.dedup();
    assert_eq!(states.len(), listed, "{after:?}");
    for state in [JobState::Succeeded, JobState::Cancelled] {
        assert!(
            count(&after, state) > count(&before, state),
            "{state}: {before:?} -> {after:?}"
        );
    }
}

// Tickets.

fn ticket_for(tenant: &str) -> NewTicket {
    NewTicket {
        id: new_id(),
        tenant: tenant.to_owned(),
        user: "alice".to_owned(),
        tool: "ask_user".to_owned(),
        question: "Is line 14 travel or meals?".to_owned(),
        options: vec!["travel".to_owned(), "meals".to_owned()],
        args: json!({"line": 14}),
        run_id: new_id(),
        call_id: new_id(),
        callback_url: None,
        answered_by: AnsweredBy::Caller,
        kind: crate::TicketKind::Question,
        plan: None,
        scopes: Vec::new(),
        expires_at: None,
        input_requests: None,
        now: BASE,
    }
}

/// Who may answer a ticket is kept with it: the caller alone, or holders
/// of a scope.
pub async fn a_ticket_keeps_who_may_answer_it(store: &dyn Store) {
    let t = tenant();
    let by_scope = AnsweredBy::Scope {
        scope: "expenses:approve".to_owned(),
    };
    for who in [AnsweredBy::Caller, by_scope] {
        let new = NewTicket {
            answered_by: who.clone(),
            ..ticket_for(&t)
        };
        let written = store.insert_ticket(new.clone()).await.expect("insert");
        assert_eq!(written.answered_by, who);
        let read = store.ticket(&t, &new.id).await.expect("ticket");
        assert_eq!(read.map(|r| r.answered_by), Some(who.clone()));
        let answered = store
            .answer_ticket(crate::AnswerTicket {
                tenant: &t,
                id: &new.id,
                answer: &json!("travel"),
                now: BASE + 1,
            })
            .await
            .expect("answer");
        let Some(Answered::Now(answered)) = answered else {
            panic!("expected an answer, got {answered:?}");
        };
        assert_eq!(answered.answered_by, who);
    }
}

/// An input ticket of two requests.
fn input_ticket_for(tenant: &str, keys: &[&str]) -> NewTicket {
    let requests: serde_json::Map<String, Value> = keys
        .iter()
        .map(|key| {
            let request = json!({"method": "elicitation/create", "params": {"message": key}});
            ((*key).to_owned(), request)
        })
        .collect();
    NewTicket {
        tool: "confirm_delete".to_owned(),
        question: "asks its client".to_owned(),
        options: Vec::new(),
        kind: crate::TicketKind::Input,
        input_requests: Some(Value::Object(requests)),
        ..ticket_for(tenant)
    }
}

fn responses(pairs: &[(&str, Value)]) -> serde_json::Map<String, Value> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), value.clone()))
        .collect()
}

/// An input ticket keeps its requests; answers are recorded key by key
/// (keys it does not ask, or answered before, left out: the first answer
/// stands), the answer to its last pending key answers it with every
/// answer, and nothing is recorded after that, nor for another tenant, nor
/// on a ticket of another kind.
pub async fn an_input_ticket_is_answered_key_by_key(store: &dyn Store) {
    let t = tenant();
    let new = input_ticket_for(&t, &["a", "b"]);
    let written = store.insert_ticket(new.clone()).await.expect("insert");
    assert_eq!(written.kind, crate::TicketKind::Input);
    assert_eq!(written.input_requests, new.input_requests);
    assert_eq!(written.input_responses, None);
    assert_eq!(
        written.pending_inputs().keys().collect::<Vec<_>>(),
        ["a", "b"]
    );
    let respond = |tenant: &'static str, given: serde_json::Map<String, Value>, now: i64| {
        let (t, id) = (t.clone(), new.id.clone());
        async move {
            let tenant = if tenant.is_empty() {
                t
            } else {
                tenant.to_owned()
            };
            store
                .respond_ticket(crate::RespondTicket {
                    tenant: &tenant,
                    id: &id,
                    responses: &given,
                    now,
                })
                .await
                .expect("respond_ticket")
        }
    };
    // Another tenant's reads as missing and records nothing.
    let theirs = respond(
        "another-tenant",
        responses(&[("a", json!({"x": 0}))]),
        BASE + 1,
    );
    assert_eq!(theirs.await, None);
    // An unknown key alone records nothing.
    let Some(Responded::Recorded(same)) =
        respond("", responses(&[("zzz", json!({"x": 9}))]), BASE + 1).await
    else {
        panic!("an unknown key is recorded as nothing");
    };
    assert_eq!(same.input_responses, None);
    // The first key: recorded, the ticket still open with `b` pending.
    let given = responses(&[("a", json!({"x": 1})), ("zzz", json!({"x": 9}))]);
    let Some(Responded::Recorded(partly)) = respond("", given, BASE + 2).await else {
        panic!("a partial answer leaves the ticket open");
    };
    assert!(partly.is_open());
    assert_eq!(partly.input_responses, Some(json!({"a": {"x": 1}})));
    assert_eq!(partly.pending_inputs().keys().collect::<Vec<_>>(), ["b"]);
    // `a` again: the first answer stands.
    let Some(Responded::Recorded(again)) =
        respond("", responses(&[("a", json!({"x": 2}))]), BASE + 3).await
    else {
        panic!("a key answered before records nothing");
    };
    assert_eq!(again.input_responses, Some(json!({"a": {"x": 1}})));
    // The last key answers the ticket with every answer.
    let Some(Responded::Answered(done)) =
        respond("", responses(&[("b", json!({"y": 1}))]), BASE + 4).await
    else {
        panic!("the last key answers the ticket");
    };
    assert!(!done.is_open());
    assert_eq!(done.answer, Some(json!({"a": {"x": 1}, "b": {"y": 1}})));
    assert_eq!(done.answered_at, Some(BASE + 4));
    assert!(done.pending_inputs().is_empty());
    // Answered: nothing more is recorded.
    let Some(Responded::Recorded(after)) =
        respond("", responses(&[("b", json!({"y": 2}))]), BASE + 5).await
    else {
        panic!("an answered ticket records nothing");
    };
    assert_eq!(after.answer, done.answer);
    let read = store
        .ticket(&t, &new.id)
        .await
        .expect("ticket")
        .expect("kept");
    assert_eq!(read, done);
    // A question is not answered this way.
    let question = store.insert_ticket(ticket_for(&t)).await.expect("insert");
    let given = responses(&[("a", json!({"x": 1}))]);
    let untouched = store
        .respond_ticket(crate::RespondTicket {
            tenant: &t,
            id: &question.id,
            responses: &given,
            now: BASE + 6,
        })
        .await
        .expect("respond_ticket");
    assert_eq!(untouched, Some(Responded::Recorded(question)));
    // Listed with its kind.
    let page = store
        .list_tickets(crate::ListTickets {
            tenant: &t,
            answerer: &crate::Answerer::Operator,
            shown: None,
            kind: Some(crate::TicketKind::Input),
            limit: 10,
            cursor: None,
        })
        .await
        .expect("list_tickets");
    assert_eq!(page.tickets, vec![done]);
}

/// Answers to different keys of one input ticket given at once are all
/// kept, and exactly one of them answers the ticket.
pub async fn concurrent_answers_to_an_input_ticket_are_all_kept(store: &dyn Store) {
    let t = tenant();
    let keys: Vec<String> = (0..8).map(|n| format!("k{n}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let new = input_ticket_for(&t, &key_refs);
    store.insert_ticket(new.clone()).await.expect("insert");
    let answers = keys.iter().map(|key| {
        let given = responses(&[(key.as_str(), json!({"key": key}))]);
        let (t, id) = (t.clone(), new.id.clone());
        async move {
            store
                .respond_ticket(crate::RespondTicket {
                    tenant: &t,
                    id: &id,
                    responses: &given,
                    now: BASE + 1,
                })
                .await
                .expect("respond_ticket")
        }
    });
    let done = futures_util::future::join_all(answers).await;
    let answered = done
        .iter()
        .filter(|r| matches!(r, Some(Responded::Answered(_))))
        .count();
    assert_eq!(answered, 1, "{done:?}");
    let read = store
        .ticket(&t, &new.id)
        .await
        .expect("ticket")
        .expect("kept");
    let expected: serde_json::Map<String, Value> = keys
        .iter()
        .map(|key| (key.clone(), json!({"key": key})))
        .collect();
    assert_eq!(read.answer, Some(Value::Object(expected)));
}

/// A user's own list holds that user's jobs alone, with the state and tool
/// filters and the cursor as the tenant's list has them.
pub async fn list_jobs_filters_by_user(store: &dyn Store) {
    let t = tenant();
    let mut mine = Vec::new();
    for n in 0..6 {
        let user = if n % 2 == 0 { "alice" } else { "bob" };
        let job = insert(
            store,
            NewJob {
                user: user.to_owned(),
                ..job_for(&t, "ocr", json!({ "n": n }), None, BASE)
            },
        )
        .await;
        if user == "bob" {
            mine.push(job.id);
        }
    }
    mine.reverse();
    let bobs = |cursor: Option<String>, limit: u32| {
        let t = t.clone();
        async move {
            let filter = JobFilter {
                user: Some("bob".to_owned()),
                ..JobFilter::default()
            };
            store
                .list_jobs(crate::ListJobs {
                    tenant: &t,
                    filter: &filter,
                    limit,
                    cursor: cursor.as_deref(),
                })
                .await
                .expect("list_jobs")
        }
    };
    let first = bobs(None, 2).await;
    let second = bobs(first.next_cursor.clone(), 2).await;
    let ids: Vec<String> = first
        .jobs
        .iter()
        .chain(&second.jobs)
        .map(|j| j.id.clone())
        .collect();
    assert_eq!(ids, mine);
    assert_eq!(second.next_cursor, None);
    assert!(
        first
            .jobs
            .iter()
            .chain(&second.jobs)
            .all(|j| j.user == "bob")
    );
    let nobody = JobFilter {
        user: Some("carol".to_owned()),
        ..JobFilter::default()
    };
    let none = store
        .list_jobs(crate::ListJobs {
            tenant: &t,
            filter: &nobody,
            limit: 10,
            cursor: None,
        })
        .await
        .expect("list");
    assert!(none.jobs.is_empty());
    let everyone = store
        .list_jobs(crate::ListJobs {
            tenant: &t,
            filter: &JobFilter::default(),
            limit: 10,
            cursor: None,
        })
        .await
        .expect("list");
    assert_eq!(everyone.jobs.len(), 6);
}

/// A ticket reads back as written, to its tenant only.
pub async fn tickets_are_read_by_their_tenant_only(store: &dyn Store) {
    let t = tenant();
    let new = ticket_for(&t);
    let ticket = store
        .insert_ticket(new.clone())
        .await
        .expect("insert_ticket");
    assert_eq!(
        (&ticket.id, &ticket.tenant, &ticket.user, &ticket.tool),
        (&new.id, &new.tenant, &new.user, &new.tool)
    );
    assert_eq!(
        (&ticket.question, &ticket.options, &ticket.args),
        (&new.question, &new.options, &new.args)
    );
    assert_eq!(
        (&ticket.run_id, &ticket.call_id, &ticket.callback_url),
        (&new.run_id, &new.call_id, &new.callback_url)
    );
    assert_eq!(
        (&ticket.answer, ticket.created_at, ticket.answered_at),
        (&None, BASE, None)
    );
    assert_eq!(
        store.ticket(&t, &new.id).await.expect("ticket"),
        Some(ticket)
    );
    assert_eq!(
        store.ticket(&tenant(), &new.id).await.expect("ticket"),
        None
    );
    assert_eq!(store.ticket(&t, &new_id()).await.expect("ticket"), None);
}

/// The first answer wins; a later one is told the first answer; another
/// tenant cannot answer at all.
pub async fn a_ticket_is_answered_once(store: &dyn Store) {
    let t = tenant();
    let new = ticket_for(&t);
    store
        .insert_ticket(new.clone())
        .await
        .expect("insert_ticket");
    let answer = |tenant: String, value: Value, now: i64| {
        let id = new.id.clone();
        async move {
            store
                .answer_ticket(crate::AnswerTicket {
                    tenant: &tenant,
                    id: &id,
                    answer: &value,
                    now,
                })
                .await
                .expect("answer_ticket")
        }
    };
    assert_eq!(answer(tenant(), json!("meals"), BASE + 1).await, None);
    let first = match answer(t.clone(), json!("travel"), BASE + 2).await {
        Some(Answered::Now(ticket)) => ticket,
        other => panic!("expected the first answer, got {other:?}"),
    };
    assert_eq!(
        (first.answer.clone(), first.answered_at),
        (Some(json!("travel")), Some(BASE + 2))
    );
    assert_eq!(
        answer(t.clone(), json!("meals"), BASE + 3).await,
        Some(Answered::Already(first.clone()))
    );
    assert_eq!(
        store.ticket(&t, &new.id).await.expect("ticket"),
        Some(first)
    );
    let missing = store
        .answer_ticket(crate::AnswerTicket {
            tenant: &t,
            id: &new_id(),
            answer: &json!("x"),
            now: BASE,
        })
        .await
        .expect("answer_ticket");
    assert_eq!(missing, None);
}

// Audit.

fn audit_record(
    tenant: &str,
    at_ms: u64,
    status: &'static str,
    error_code: Option<ErrorCode>,
) -> AuditRecord {
    AuditRecord {
        at_ms,
        tool: "find_expenses".to_owned(),
        tenant: tenant.to_owned(),
        user: "alice".to_owned(),
        run_id: new_id(),
        call_id: new_id(),
        parent_run_id: None,
        args: json!({"month": "2026-09", "token": "***"}),
        status,
        error_code,
        duration_us: 1_234,
    }
}

/// Audit records read back whole, newest first (ties in append order
/// reversed), and only the tenant's own.
pub async fn audit_reads_newest_first_within_a_tenant(store: &dyn Store) {
    let (t, other) = (tenant(), tenant());
    let at = BASE as u64;
    let r1 = audit_record(&t, at, "ok", None);
    let r2 = audit_record(&t, at + 1, "error", Some(ErrorCode::Forbidden));
    let r3 = audit_record(&t, at + 2, "running", None);
    let r4 = audit_record(&t, at + 2, "suspended", None);
    let foreign = audit_record(&other, at + 3, "ok", None);
    store
        .append_audit(&[r1.clone(), r2.clone(), foreign.clone()])
        .await
        .expect("append_audit");
    store
        .append_audit(&[r3.clone(), r4.clone()])
        .await
        .expect("append_audit");
    store.append_audit(&[]).await.expect("append_audit");
    assert_eq!(
        store.audit(&t, 10).await.expect("audit"),
        vec![r4.clone(), r3.clone(), r2, r1]
    );
    assert_eq!(store.audit(&t, 2).await.expect("audit"), vec![r4, r3]);
    assert_eq!(store.audit(&other, 10).await.expect("audit"), vec![foreign]);
}

// Command outcomes.

fn outcome() -> Envelope {
    Envelope::ok(
        Json::from(json!({"report_id": "r-1", "total": 812.4})),
        "call-1",
    )
}

/// A claim of `key` at `now` as a command's commit makes it: held for
/// [`LEASE`], kept until [`FOREVER`], never taking over an abandoned claim.
async fn claim_commit(store: &dyn Store, key: &str, now: i64) -> CommitClaim {
    let claim = ClaimCommit {
        key,
        now,
        lease_ms: LEASE,
        keep_until: FOREVER,
        take_over: false,
    };
    store.claim_commit(claim).await.expect("claim_commit")
}

/// A claim of `key` at `now` as a webhook's notice makes it: one that
/// takes over a claim abandoned past its lease.
/// The claim of webhook notice `key` at `now`, kept for good.
fn a_notice(key: &str, now: i64) -> crate::ClaimNotice<'_> {
    crate::ClaimNotice {
        key,
        now,
        lease_ms: LEASE,
        keep_until: FOREVER,
    }
}

fn notice_claim(key: &str, now: i64) -> ClaimCommit<'_> {
    ClaimCommit {
        key,
        now,
        lease_ms: LEASE,
        keep_until: FOREVER,
        take_over: true,
    }
}

/// The first claim runs the command; others wait while it is pending.
pub async fn a_commit_runs_once_while_pending(store: &dyn Store) {
    let key = new_id();
    assert_eq!(claim_commit(store, &key, BASE).await, CommitClaim::Run);
    assert_eq!(
        claim_commit(store, &key, BASE + 1).await,
        CommitClaim::Pending
    );
    assert_eq!(
        claim_commit(store, &key, BASE + LEASE).await,
        CommitClaim::Pending
    );
}

/// Once settled, every claim answers the recorded envelope; a late second
/// outcome or release does not replace it.
pub async fn a_settled_commit_answers_its_envelope(store: &dyn Store) {
    let key = new_id();
    let keep = FOREVER;
    assert_eq!(claim_commit(store, &key, BASE).await, CommitClaim::Run);
    store
        .settle_commit(crate::SettleCommit {
            key: &key,
            outcome: Some(&outcome()),
            keep_until: keep,
        })
        .await
        .expect("settle_commit");
    for now in [BASE + 1, BASE + 2 * LEASE] {
        assert_eq!(
            claim_commit(store, &key, now).await,
            CommitClaim::Settled(outcome())
        );
    }
    let late = Envelope::error(ToolError::new(ErrorCode::Timeout, "late"));
    store
        .settle_commit(crate::SettleCommit {
            key: &key,
            outcome: Some(&late),
            keep_until: keep,
        })
        .await
        .expect("settle_commit");
    store
        .settle_commit(crate::SettleCommit {
            key: &key,
            outcome: None,
            keep_until: keep,
        })
        .await
        .expect("settle_commit");
    assert_eq!(
        claim_commit(store, &key, BASE + 3).await,
        CommitClaim::Settled(outcome())
    );
}

/// Settling with no outcome releases the claim: the commit may run again.
pub async fn releasing_a_commit_lets_it_run_again(store: &dyn Store) {
    let key = new_id();
    assert_eq!(claim_commit(store, &key, BASE).await, CommitClaim::Run);
    store
        .settle_commit(crate::SettleCommit {
            key: &key,
            outcome: None,
            keep_until: BASE + LEASE,
        })
        .await
        .expect("settle_commit");
    assert_eq!(claim_commit(store, &key, BASE + 1).await, CommitClaim::Run);
    assert_eq!(
        claim_commit(store, &key, BASE + 2).await,
        CommitClaim::Pending
    );
}

/// A pending claim whose lease ran out (its process died) is taken over by
/// a claim that says to (a notice, safe to send twice).
pub async fn an_expired_commit_claim_is_taken_over(store: &dyn Store) {
    let key = new_id();
    let claim = |now| store.claim_commit(notice_claim(&key, now));
    assert_eq!(claim(BASE).await, Ok(CommitClaim::Run));
    assert_eq!(claim(BASE + LEASE + 1).await, Ok(CommitClaim::Run));
    assert_eq!(claim(BASE + LEASE + 2).await, Ok(CommitClaim::Pending));
}

/// A pending claim whose lease ran out, claimed by a command's commit
/// (which never takes one over), is abandoned: every later claim is told
/// so, none runs the command again, and an outcome recorded late is
/// answered after all.
pub async fn an_abandoned_commit_claim_is_never_run_again(store: &dyn Store) {
    let key = new_id();
    assert_eq!(claim_commit(store, &key, BASE).await, CommitClaim::Run);
    assert_eq!(
        claim_commit(store, &key, BASE + LEASE).await,
        CommitClaim::Pending
    );
    for now in [BASE + LEASE + 1, BASE + 2 * LEASE] {
        assert_eq!(claim_commit(store, &key, now).await, CommitClaim::Abandoned);
    }
    store
        .settle_commit(crate::SettleCommit {
            key: &key,
            outcome: Some(&outcome()),
            keep_until: FOREVER,
        })
        .await
        .expect("settle_commit");
    assert_eq!(
        claim_commit(store, &key, BASE + 3 * LEASE).await,
        CommitClaim::Settled(outcome())
    );
}

/// An outcome is kept until `keep_until` and not after; so is a claim
/// abandoned past its lease (its token has expired by then).
///
/// This test works at `LATER`, after every time other tests use and
/// before their `keep_until`, so expiring records here expires none of
/// theirs; and in one test, because a claim may prune every record expired
/// by its time.
pub async fn a_settled_commit_expires_after_keep_until(store: &dyn Store) {
    let key = new_id();
    assert_eq!(claim_commit(store, &key, LATER).await, CommitClaim::Run);
    store
        .settle_commit(crate::SettleCommit {
            key: &key,
            outcome: Some(&outcome()),
            keep_until: LATER + 5_000,
        })
        .await
        .expect("settle_commit");
    assert_eq!(
        claim_commit(store, &key, LATER + 5_000).await,
        CommitClaim::Settled(outcome())
    );
    assert_eq!(
        claim_commit(store, &key, LATER + 5_001).await,
        CommitClaim::Run
    );

    let abandoned = new_id();
    let start = LATER + 10_000;
    let keep_until = start + 3 * LEASE;
    let claim = |now| {
        store.claim_commit(ClaimCommit {
            key: &abandoned,
            now,
            lease_ms: LEASE,
            keep_until,
            take_over: false,
        })
    };
    assert_eq!(claim(start).await, Ok(CommitClaim::Run));
    assert_eq!(claim(start + LEASE + 1).await, Ok(CommitClaim::Abandoned));
    assert_eq!(claim(keep_until).await, Ok(CommitClaim::Abandoned));
    assert_eq!(claim(keep_until + 1).await, Ok(CommitClaim::Run));
}

// Many callers at once: an implementation may group concurrent operations
// into shared statements, and must still answer each caller as if alone.

/// Twenty workers claiming one job at the same moment: one gets it.
pub async fn concurrent_claims_of_one_job_give_it_to_one_worker(store: &dyn Store) {
    let job = queued(store, &tenant()).await;
    let workers: Vec<String> = (0..20).map(|n| format!("w{n}")).collect();
    let claims = workers.iter().map(|worker| {
        store.claim(crate::ClaimJob {
            id: &job.id,
            worker,
            now: BASE,
            lease_ms: LEASE,
        })
    });
    let answers = futures_util::future::join_all(claims).await;
    let won: Vec<(usize, JobRecord)> = answers
        .into_iter()
        .enumerate()
        .filter_map(|(n, answer)| answer.expect("claim").map(|job| (n, job)))
        .collect();
    assert_eq!(won.len(), 1, "one claim wins, got {won:?}");
    let (n, claimed) = &won[0];
    assert_eq!(claimed.lease_owner.as_deref(), Some(workers[*n].as_str()));
    assert_eq!(claimed.attempts, 1);
    assert_eq!(reread(store, &job).await, *claimed);
}

/// Twenty calls with one key at the same moment make one job; a call with
/// the same key and other arguments is a conflict, even among them.
pub async fn concurrent_inserts_with_one_key_make_one_job(store: &dyn Store) {
    let t = tenant();
    let key = format!("key-{}", new_id());
    let mut jobs: Vec<NewJob> = (0..20)
        .map(|_| {
            job_for(
                &t,
                "submit_report",
                json!({"month": "2024-05"}),
                Some(&key),
                BASE,
            )
        })
        .collect();
    jobs.push(job_for(
        &t,
        "submit_report",
        json!({"month": "2024-06"}),
        Some(&key),
        BASE,
    ));
    let answers =
        futures_util::future::join_all(jobs.into_iter().map(|job| store.insert_job(job))).await;
    let (mut ids, mut created, mut conflicts) = (Vec::new(), 0, 0);
    for answer in answers {
        match answer {
            Ok(Inserted::Created(job)) => {
                created += 1;
                ids.push(job.id);
            }
            Ok(Inserted::Existing(job)) => ids.push(job.id),
            Err(StoreError::Conflict(_)) => conflicts += 1,
            Err(other) => panic!("insert_job: {other}"),
        }
    }
    ids.dedup();
    // The odd one out conflicts unless it came first; then the twenty do.
    assert!(
        (created, conflicts, ids.len()) == (1, 1, 1)
            || (created, conflicts, ids.len()) == (1, 20, 1),
        "created {created}, conflicts {conflicts}, ids {ids:?}"
    );
}

/// Two hundred jobs recorded, claimed and settled at once: every caller
/// gets its own job back, with its own result.
pub async fn many_jobs_at_once_each_get_their_own_answer(store: &dyn Store) {
    use futures_util::future::join_all;
    let t = tenant();
    let jobs: Vec<NewJob> = (0..200)
        .map(|n| job_for(&t, "start_receipt_ocr", json!({"line": n}), None, BASE))
        .collect();
    let ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
    let inserted = join_all(jobs.into_iter().map(|job| store.insert_job(job))).await;
    for (n, answer) in inserted.into_iter().enumerate() {
        match answer.expect("insert_job") {
            Inserted::Created(job) => {
                assert_eq!(
                    (job.id.as_str(), &job.args),
                    (ids[n].as_str(), &json!({"line": n}))
                );
            }
            other => panic!("expected job {n} to be new, got {other:?}"),
        }
    }
    let claims = ids.iter().enumerate().map(|(n, id)| async move {
        (
            n,
            store
                .claim(crate::ClaimJob {
                    id,
                    worker: &format!("w{n}"),
                    now: BASE,
                    lease_ms: LEASE,
                })
                .await,
        )
    });
    for (n, answer) in join_all(claims).await {
        let job = answer.expect("claim").expect("each job is claimable");
        assert_eq!(job.id, ids[n]);
        assert_eq!(job.lease_owner, Some(format!("w{n}")));
    }
    let results: Vec<Json> = (0..200).map(|n| Json::from(json!({"n": n}))).collect();
    let settles = ids.iter().enumerate().map(|(n, id)| {
        let result = &results[n];
        async move {
            (
                n,
                store
                    .succeed(Succeed {
                        lease: &lease(id, &format!("w{n}"), 1),
                        result,
                        now: BASE + 1,
                        claimed: None,
                    })
                    .await,
            )
        }
    });
    for (n, answer) in join_all(settles).await {
        let job = answer.expect("succeed").expect("each holder settles");
        assert_eq!(
            (job.id.as_str(), job.state),
            (ids[n].as_str(), JobState::Succeeded)
        );
        assert_eq!(job.result.as_ref(), Some(&results[n]));
    }
}

// Sub-agents: lineage, checkpoints and the parent run id.

fn lineage(depth: u32) -> Lineage {
    Lineage {
        parent_run_id: new_id(),
        depth,
        budget: Budget {
            max_steps: 12,
            // Beyond what an i64 or a double holds exactly, so a store that
            // reads numbers loosely is caught.
            max_tokens: u64::MAX - 1,
            max_wall_ms: 90_000,
        },
    }
}

/// A job made by a sub-agent's call keeps its lineage through insert,
/// claim, progress, settling and every read; a job made without one reads
/// back without one.
pub async fn lineage_travels_with_the_job(store: &dyn Store) {
    let t = tenant();
    let given = lineage(2);
    let mut new = ocr_job(&t);
    new.lineage = Some(given.clone());
    new.scopes = vec!["expenses:read".to_owned(), "ledger:write".to_owned()];
    let job = insert(store, new.clone()).await;
    assert_eq!(job.lineage.as_ref(), Some(&given));
    assert_eq!(job.scopes, new.scopes, "the caller's scopes travel too");
    assert_eq!(reread(store, &job).await.scopes, new.scopes);
    let plain = insert(store, ocr_job(&tenant())).await;
    assert!(reread(store, &plain).await.scopes.is_empty());
    assert_eq!(reread(store, &job).await.lineage.as_ref(), Some(&given));
    let by_id = store.job_by_id(&job.id).await.expect("job_by_id");
    assert_eq!(by_id.and_then(|j| j.lineage), Some(given.clone()));
    let claimed = claim(store, &job.id, "w1", BASE).await.expect("claimable");
    assert_eq!(claimed.lineage.as_ref(), Some(&given));
    let listed = store
        .list_jobs(crate::ListJobs {
            tenant: &t,
            filter: &JobFilter::default(),
            limit: 10,
            cursor: None,
        })
        .await
        .expect("list_jobs");
    assert_eq!(
        listed
            .jobs
            .iter()
            .map(|j| j.lineage.clone())
            .collect::<Vec<_>>(),
        vec![Some(given.clone())]
    );
    let done = succeed(store, &lease(&job.id, "w1", 1), &result_doc(), BASE + 1)
        .await
        .expect("held");
    assert_eq!(done.lineage.as_ref(), Some(&given));
    assert_eq!(reread(store, &job).await.lineage, Some(given.clone()));

    // The key's second call finds the first job, lineage and all.
    let mut keyed = job_for(&t, "ocr", json!({"a": 1}), Some("k"), BASE);
    keyed.lineage = Some(given.clone());
    let first = insert(store, keyed.clone()).await;
    keyed.id = new_id();
    match store.insert_job(keyed).await.expect("insert_job") {
        Inserted::Existing(existing) => assert_eq!(existing, first),
        other => panic!("expected the first job, got {other:?}"),
    }

    let plain = queued(store, &t).await;
    assert_eq!(plain.lineage, None);
    assert_eq!(reread(store, &plain).await.lineage, None);
}

/// Jobs recorded, claimed and settled together keep each its own lineage,
/// those without one included.
pub async fn many_jobs_at_once_keep_their_own_lineage(store: &dyn Store) {
    use futures_util::future::join_all;
    let t = tenant();
    let jobs: Vec<NewJob> = (0..50u32)
        .map(|n| {
            let mut job = job_for(&t, "ocr", json!({"n": n}), None, BASE);
            job.lineage = (n % 3 != 0).then(|| lineage(n));
            job
        })
        .collect();
    let expected: Vec<Option<Lineage>> = jobs.iter().map(|j| j.lineage.clone()).collect();
    let ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
    let inserted = join_all(jobs.into_iter().map(|job| store.insert_job(job))).await;
    for (n, answer) in inserted.into_iter().enumerate() {
        let job = answer.expect("insert_job");
        assert_eq!(job.job().lineage, expected[n], "job {n}");
    }
    let claims = ids.iter().map(|id| {
        store.claim(crate::ClaimJob {
            id,
            worker: "w1",
            now: BASE,
            lease_ms: LEASE,
        })
    });
    for (n, answer) in join_all(claims).await.into_iter().enumerate() {
        let job = answer.expect("claim").expect("claimable");
        assert_eq!((&job.id, &job.lineage), (&ids[n], &expected[n]));
    }
    let result = result_doc();
    let leases: Vec<LeaseRef> = ids.iter().map(|id| lease(id, "w1", 1)).collect();
    let settles = leases.iter().map(|lease| {
        store.succeed(Succeed {
            lease,
            result: &result,
            now: BASE + 1,
            claimed: None,
        })
    });
    for (n, answer) in join_all(settles).await.into_iter().enumerate() {
        let job = answer.expect("succeed").expect("held");
        assert_eq!((&job.id, &job.lineage), (&ids[n], &expected[n]));
    }
}

/// A trace context of a new trace, with a `tracestate` when `state`.
fn trace(state: bool) -> TraceContext {
    let root = TraceContext::new_root();
    let tracestate = state.then(|| "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7".to_owned());
    TraceContext::from_ids(
        root.trace_id_bytes(),
        root.span_id_bytes(),
        true,
        tracestate,
    )
    .expect("non-zero ids")
}

/// The trace context a job was made with (the enqueuing span's) reads back
/// unchanged through insert, claim, retry, settling and every read, so a
/// republished or retried job continues the same trace; a job made without
/// one reads back without one.
pub async fn the_trace_context_travels_with_the_job(store: &dyn Store) {
    // Two months before BASE, where no other test's job is due; the job
    // ends settled, so later runs do not see it either.
    let t0 = BASE - 60 * 24 * 3_600_000;
    let t = tenant();
    let given = trace(true);
    let mut new = job_for(&t, "start_receipt_ocr", json!({"line": 7}), None, t0);
    new.trace = Some(given.clone());
    let job = insert(store, new).await;
    assert_eq!(job.trace.as_ref(), Some(&given));
    assert_eq!(reread(store, &job).await.trace.as_ref(), Some(&given));
    let by_id = store.job_by_id(&job.id).await.expect("job_by_id");
    assert_eq!(by_id.and_then(|j| j.trace), Some(given.clone()));
    let listed = store
        .list_jobs(crate::ListJobs {
            tenant: &t,
            filter: &JobFilter::default(),
            limit: 10,
            cursor: None,
        })
        .await
        .expect("list_jobs");
    assert_eq!(listed.jobs[0].trace.as_ref(), Some(&given));
    // The sweeper republishes what due_jobs names, context and all.
    let due = first_due(store, t0 + 1, t0 + 1, 1000).await;
    let found = due.iter().find(|j| j.id == job.id).expect("the job is due");
    assert_eq!(found.trace.as_ref(), Some(&given));

    let claimed = claim(store, &job.id, "w1", t0 + 1)
        .await
        .expect("claimable");
    assert_eq!(claimed.trace.as_ref(), Some(&given));
    let retrying = fail(
        store,
        &lease(&job.id, "w1", 1),
        &failure("flaky"),
        Some(t0 + 10),
        t0 + 2,
    )
    .await
    .expect("held");
    assert_eq!(retrying.state, JobState::Retrying);
    assert_eq!(retrying.trace.as_ref(), Some(&given));
    let again = claim(store, &job.id, "w2", t0 + 10)
        .await
        .expect("due again");
    assert_eq!(again.trace.as_ref(), Some(&given));
    let done = succeed(store, &lease(&job.id, "w2", 2), &result_doc(), t0 + 11)
        .await
        .expect("held");
    assert_eq!(done.trace.as_ref(), Some(&given));

    // Without tracestate, and without any context at all.
    let bare = trace(false);
    let mut new = ocr_job(&t);
    new.trace = Some(bare.clone());
    let job = insert(store, new).await;
    assert_eq!(reread(store, &job).await.trace, Some(bare));
    let plain = queued(store, &t).await;
    assert_eq!(plain.trace, None);
    assert_eq!(reread(store, &plain).await.trace, None);
}

/// Jobs recorded and claimed together keep each its own trace context,
/// those without one included.
pub async fn many_jobs_at_once_keep_their_own_trace_context(store: &dyn Store) {
    use futures_util::future::join_all;
    let t = tenant();
    let jobs: Vec<NewJob> = (0..40u32)
        .map(|n| {
            let mut job = job_for(&t, "ocr", json!({"n": n}), None, BASE);
            job.trace = (n % 4 != 0).then(|| trace(n % 2 == 0));
            job
        })
        .collect();
    let expected: Vec<Option<TraceContext>> = jobs.iter().map(|j| j.trace.clone()).collect();
    let ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
    let inserted = join_all(jobs.into_iter().map(|job| store.insert_job(job))).await;
    for (n, answer) in inserted.into_iter().enumerate() {
        let job = answer.expect("insert_job");
        assert_eq!(job.job().trace, expected[n], "job {n}");
    }
    let claims = ids.iter().map(|id| {
        store.claim(crate::ClaimJob {
            id,
            worker: "w1",
            now: BASE,
            lease_ms: LEASE,
        })
    });
    for (n, answer) in join_all(claims).await.into_iter().enumerate() {
        let job = answer.expect("claim").expect("claimable");
        assert_eq!((&job.id, &job.trace), (&ids[n], &expected[n]));
    }
}

async fn save_checkpoint(store: &dyn Store, lease: &LeaseRef, checkpoint: &Value) -> bool {
    let save = SaveCheckpoint {
        lease,
        checkpoint,
        now: BASE + 10,
    };
    store.save_checkpoint(save).await.expect("save_checkpoint")
}

/// A checkpoint is written only on a running job, by its current attempt:
/// not on a queued or settled job, not by a stale attempt, not on another
/// id. Each save replaces the last.
pub async fn a_checkpoint_is_saved_for_the_current_attempt_only(store: &dyn Store) {
    let t = tenant();
    let step = |n: u32| json!({"step": n, "messages": [{"role": "user", "content": "go"}]});

    let waiting = queued(store, &t).await;
    assert!(!save_checkpoint(store, &lease(&waiting.id, "w1", 0), &step(1)).await);
    assert!(!save_checkpoint(store, &lease(&waiting.id, "w1", 1), &step(1)).await);
    assert_eq!(checkpoint_of(store, &waiting.id).await, None);

    let job = running(store, &t, "w1").await;
    assert_eq!(checkpoint_of(store, &job.id).await, None);
    assert!(!save_checkpoint(store, &lease(&job.id, "w1", 0), &step(1)).await);
    assert!(!save_checkpoint(store, &lease(&job.id, "w1", 2), &step(1)).await);
    assert!(!save_checkpoint(store, &lease(&job.id, "w2", 1), &step(1)).await);
    assert!(!save_checkpoint(store, &lease(&new_id(), "w1", 1), &step(1)).await);
    assert!(save_checkpoint(store, &lease(&job.id, "w1", 1), &step(1)).await);
    let seen = reread(store, &job).await;
    assert_eq!(
        (checkpoint_of(store, &seen.id).await, seen.updated_at),
        (Some(step(1)), BASE + 10)
    );
    assert!(save_checkpoint(store, &lease(&job.id, "w1", 1), &step(2)).await);
    assert_eq!(checkpoint_of(store, &job.id).await, Some(step(2)));
    // JSON null is a checkpoint like any other, not its absence.
    let other = running(store, &t, "w1").await;
    assert!(save_checkpoint(store, &lease(&other.id, "w1", 1), &Value::Null).await);
    assert_eq!(checkpoint_of(store, &other.id).await, Some(Value::Null));

    let done = succeed(store, &lease(&job.id, "w1", 1), &result_doc(), BASE + 11)
        .await
        .expect("held");
    assert_eq!(checkpoint_of(store, &done.id).await, Some(step(2)));
    assert!(!save_checkpoint(store, &lease(&job.id, "w1", 1), &step(3)).await);
    let failed = running(store, &t, "w1").await;
    fail(
        store,
        &lease(&failed.id, "w1", 1),
        &failure("x"),
        None,
        BASE + 1,
    )
    .await;
    assert!(!save_checkpoint(store, &lease(&failed.id, "w1", 1), &step(1)).await);
    let cancelled = running(store, &t, "w1").await;
    store
        .cancel(crate::CancelJob {
            tenant: &t,
            id: &cancelled.id,
            now: BASE + 1,
        })
        .await
        .expect("cancel");
    assert!(!save_checkpoint(store, &lease(&cancelled.id, "w1", 1), &step(1)).await);
    for settled in [&job, &failed, &cancelled] {
        let seen = reread(store, settled).await;
        assert!(seen.state.is_settled(), "{seen:?}");
    }
    assert_eq!(checkpoint_of(store, &job.id).await, Some(step(2)));
    assert_eq!(checkpoint_of(store, &failed.id).await, None);
    assert_eq!(checkpoint_of(store, &cancelled.id).await, None);
}

/// The checkpoint stays on the job when its lease runs out and another
/// worker claims it (the new attempt reads it, the old one can no longer
/// write it), and when a failure is retried; `get_job`'s envelope never
/// shows it, nor the lineage.
pub async fn a_checkpoint_outlives_claims_and_retries(store: &dyn Store) {
    let t = tenant();
    let mut new = ocr_job(&t);
    new.lineage = Some(lineage(1));
    let job = insert(store, new).await;
    claim(store, &job.id, "w1", BASE).await.expect("claimable");
    let saved = json!({"step": 4, "secret": "chain-of-thought-7f3a"});
    assert!(save_checkpoint(store, &lease(&job.id, "w1", 1), &saved).await);

    let now = BASE + LEASE + 1;
    let again = claim(store, &job.id, "w2", now)
        .await
        .expect("the lease expired");
    assert_eq!(
        (
            again.attempts,
            checkpoint_of(store, &again.id).await.as_ref()
        ),
        (2, Some(&saved))
    );
    // The first worker lost the job: its late save is refused and the new
    // holder's checkpoint stands.
    assert!(!save_checkpoint(store, &lease(&job.id, "w1", 1), &json!({"step": 5})).await);
    assert_eq!(checkpoint_of(store, &job.id).await, Some(saved.clone()));
    let later = json!({"step": 6, "secret": "chain-of-thought-7f3a"});
    assert!(save_checkpoint(store, &lease(&job.id, "w2", 2), &later).await);

    let envelope = reread(store, &job).await.envelope(5);
    let text = envelope.to_json();
    for hidden in ["chain-of-thought", "checkpoint", "lineage", "parent_run_id"] {
        assert!(!text.contains(hidden), "{hidden} in {text}");
    }

    let retrying = fail(
        store,
        &lease(&job.id, "w2", 2),
        &failure("model overloaded"),
        Some(now + 10),
        now + 1,
    )
    .await
    .expect("held");
    assert_eq!(
        (
            retrying.state,
            checkpoint_of(store, &retrying.id).await.as_ref()
        ),
        (JobState::Retrying, Some(&later))
    );
    assert!(!save_checkpoint(store, &lease(&job.id, "w2", 2), &json!({"step": 7})).await);
    let third = claim(store, &job.id, "w3", now + 10)
        .await
        .expect("due again");
    assert_eq!(
        (
            third.attempts,
            checkpoint_of(store, &third.id).await.as_ref()
        ),
        (3, Some(&later))
    );
    assert_eq!(third.lineage, job.lineage);
    let done = succeed(store, &lease(&job.id, "w3", 3), &result_doc(), now + 11)
        .await
        .expect("held");
    let text = done.envelope(5).to_json();
    assert!(!text.contains("chain-of-thought"), "{text}");
}

/// An audit record of a sub-agent's step keeps the parent run id beside
/// its own; one without reads back without.
pub async fn audit_keeps_the_parent_run_id(store: &dyn Store) {
    let t = tenant();
    let at = BASE as u64 + 100;
    let parent = new_id();
    let mut step = audit_record(&t, at, "ok", None);
    step.parent_run_id = Some(parent.clone());
    let mut failed = audit_record(&t, at + 1, "error", Some(ErrorCode::Timeout));
    failed.parent_run_id = Some(parent);
    let plain = audit_record(&t, at + 2, "ok", None);
    store
        .append_audit(&[step.clone(), failed.clone(), plain.clone()])
        .await
        .expect("append_audit");
    assert_eq!(
        store.audit(&t, 10).await.expect("audit"),
        vec![plain, failed, step]
    );
}

/// A parked job gives its worker back until its ticket is answered: not
/// claimable however late, unleased, its attempt given back; woken, it is
/// due again with its checkpoint.
pub async fn a_parked_job_waits_for_its_ticket(store: &dyn Store) {
    let job = running(store, &tenant(), "w1").await;
    let saved = json!({"step": 3});
    assert!(save_checkpoint(store, &holder(&job), &saved).await);
    let ticket = format!("t_{}", new_id());
    for stale in [lease(&job.id, "w1", 2), lease(&job.id, "w2", 1)] {
        let parked = park(store, &stale, &ticket, BASE + 2).await;
        assert_eq!(parked, None, "another attempt cannot park it: {stale:?}");
    }
    let parked = park(store, &holder(&job), &ticket, BASE + 2)
        .await
        .expect("the running attempt parks it");
    assert_eq!(
        (parked.state, parked.attempts, parked.lease_owner.as_deref()),
        (JobState::Parked, 0, None)
    );
    assert_eq!(
        claim(store, &job.id, "w2", LATER).await,
        None,
        "never due while parked"
    );
    let other = store.wake(&format!("t_{}", new_id()), BASE + 3).await;
    assert!(
        other.expect("wake").is_empty(),
        "another ticket wakes nothing"
    );
    let woken = store.wake(&ticket, BASE + 4).await.expect("wake");
    assert_eq!(woken.len(), 1);
    assert_eq!(
        (woken[0].id.as_str(), woken[0].run_at),
        (job.id.as_str(), BASE + 4)
    );
    assert!(
        store
            .wake(&ticket, BASE + 5)
            .await
            .expect("wake")
            .is_empty()
    );
    let again = claim(store, &job.id, "w2", BASE + 5)
        .await
        .expect("due once woken");
    assert_eq!(again.attempts, 1, "waiting for a person cost no attempt");
    assert_eq!(checkpoint_of(store, &again.id).await, Some(saved));
}

/// Cancelling a parked job settles it; its ticket's answer does not revive it.
pub async fn a_parked_job_can_be_cancelled_and_stays_so(store: &dyn Store) {
    let t = tenant();
    let job = running(store, &t, "w1").await;
    let ticket = format!("t_{}", new_id());
    park(store, &holder(&job), &ticket, BASE + 1)
        .await
        .expect("parked");
    let cancelled = store
        .cancel(crate::CancelJob {
            tenant: &t,
            id: &job.id,
            now: BASE + 2,
        })
        .await
        .expect("cancel")
        .expect("the job");
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert!(
        store
            .wake(&ticket, BASE + 3)
            .await
            .expect("wake")
            .is_empty()
    );
    assert_eq!(reread(store, &job).await.state, JobState::Cancelled);
}

/// The settled jobs with a callback whose notice key has no commit record,
/// in a range of update times, oldest first: a settled job not yet
/// notified is listed until its notice is claimed; running jobs, jobs
/// without a callback, others' keys and times outside the range are not.
///
/// This test works two months before [`BASE`], where no other test's job
/// settles, and looks only at its own tenant's jobs.
pub async fn unnotified_jobs_are_settled_jobs_with_callbacks_nobody_notified(store: &dyn Store) {
    const PREFIX: &str = "webhook:job:";
    let t = tenant();
    let t0 = BASE - 60 * 24 * 3_600_000;
    let add = |callback: bool| {
        let mut job = job_for(&t, "ocr", json!({}), None, t0);
        if !callback {
            job.callback_url = None;
        }
        insert(store, job)
    };
    let settle = |id: String, at: i64| async move {
        store
            .claim(crate::ClaimJob {
                id: &id,
                worker: "w1",
                now: t0 + 1,
                lease_ms: LEASE,
            })
            .await
            .expect("claim");
        succeed(store, &lease(&id, "w1", 1), &result_doc(), at)
            .await
            .expect("settled");
    };
    let first = add(true).await;
    settle(first.id.clone(), t0 + 10).await;
    let notified = add(true).await;
    store
        .claim(crate::ClaimJob {
            id: &notified.id,
            worker: "w1",
            now: t0 + 1,
            lease_ms: LEASE,
        })
        .await
        .expect("claim");
    fail(
        store,
        &lease(&notified.id, "w1", 1),
        &failure("x"),
        None,
        t0 + 20,
    )
    .await;
    let key = format!("{PREFIX}{}:failed", notified.id);
    assert_eq!(store.claim_notice(a_notice(&key, t0 + 21)).await, Ok(true));
    let cancelled = add(true).await;
    store
        .cancel(crate::CancelJob {
            tenant: &t,
            id: &cancelled.id,
            now: t0 + 30,
        })
        .await
        .expect("cancel")
        .expect("cancelled");
    let running = add(true).await;
    store
        .claim(crate::ClaimJob {
            id: &running.id,
            worker: "w1",
            now: t0 + 1,
            lease_ms: LEASE,
        })
        .await
        .expect("claim");
    let silent = add(false).await;
    settle(silent.id.clone(), t0 + 40).await;
    let late = add(true).await;
    settle(late.id.clone(), t0 + 200).await;

    let mine = |jobs: Vec<JobRecord>| -> Vec<(String, JobState)> {
        jobs.into_iter()
            .filter(|j| j.tenant == t)
            .map(|j| (j.id, j.state))
            .collect()
    };
    let listed = store
        .unnotified_jobs(crate::Unnotified {
            notice_prefix: PREFIX,
            since: t0,
            until: t0 + 100,
            limit: 1000,
        })
        .await
        .expect("unnotified jobs");
    assert_eq!(
        mine(listed),
        [
            (first.id.clone(), JobState::Succeeded),
            (cancelled.id.clone(), JobState::Cancelled)
        ],
        "settled, with a callback, not yet notified, in the range, oldest first"
    );
    let one = store
        .unnotified_jobs(crate::Unnotified {
            notice_prefix: PREFIX,
            since: t0,
            until: t0 + 100,
            limit: 1,
        })
        .await
        .expect("unnotified jobs");
    assert_eq!(one.len(), 1, "at most the limit");
    // Another prefix's record is not this notice's.
    let other = format!("other:{}:succeeded", first.id);
    assert_eq!(
        store.claim_notice(a_notice(&other, t0 + 50)).await,
        Ok(true)
    );
    let key = format!("{PREFIX}{}:succeeded", first.id);
    assert_eq!(store.claim_notice(a_notice(&key, t0 + 50)).await, Ok(true));
    let listed = store
        .unnotified_jobs(crate::Unnotified {
            notice_prefix: PREFIX,
            since: t0,
            until: t0 + 100,
            limit: 1000,
        })
        .await
        .expect("unnotified jobs");
    assert_eq!(
        mine(listed),
        [(cancelled.id.clone(), JobState::Cancelled)],
        "a claimed notice is no longer listed"
    );
    // Put back and failed again, the job's new outcome has a notice of its
    // own, under the key of its second life.
    let again = store
        .requeue(crate::Requeue {
            tenant: &t,
            id: &notified.id,
            now: t0 + 55,
        })
        .await
        .expect("requeue")
        .expect("put back");
    claim(store, &again.id, "w2", t0 + 56)
        .await
        .expect("claimed");
    fail(
        store,
        &lease(&again.id, "w2", 1),
        &failure("x"),
        None,
        t0 + 60,
    )
    .await;
    let unsent = || {
        store.unnotified_jobs(crate::Unnotified {
            notice_prefix: PREFIX,
            since: t0,
            until: t0 + 100,
            limit: 1000,
        })
    };
    let listed = mine(unsent().await.expect("unnotified jobs"));
    assert!(
        listed.contains(&(notified.id.clone(), JobState::Failed)),
        "{listed:?}"
    );
    let second = format!("{PREFIX}{}:failed:1", notified.id);
    assert_eq!(
        store.claim_notice(a_notice(&second, t0 + 61)).await,
        Ok(true)
    );
    let listed = mine(unsent().await.expect("unnotified jobs"));
    assert!(
        !listed.iter().any(|(id, _)| *id == notified.id),
        "{listed:?}"
    );
}

/// The answered tickets with a callback whose notice key has no commit
/// record, in a range of answer times, oldest first: an answered ticket not
/// yet notified is listed until its notice is claimed; open tickets,
/// tickets without a callback and answers outside the range are not.
///
/// This test works three months before [`BASE`], where no other test's
/// ticket is answered, and looks only at its own tenant's tickets.
pub async fn unnotified_tickets_are_answered_tickets_with_callbacks_nobody_notified(
    store: &dyn Store,
) {
    const PREFIX: &str = "webhook:ticket:";
    let t = tenant();
    let t0 = BASE - 90 * 24 * 3_600_000;
    let add = |callback: bool| {
        let mut new = ticket_for(&t);
        new.now = t0;
        new.callback_url = callback.then(|| "http://127.0.0.1:9/hook".to_owned());
        async move { store.insert_ticket(new).await.expect("insert_ticket") }
    };
    let answer = |id: String, at: i64| {
        let t = t.clone();
        async move {
            store
                .answer_ticket(crate::AnswerTicket {
                    tenant: &t,
                    id: &id,
                    answer: &json!("travel"),
                    now: at,
                })
                .await
                .expect("answer")
                .expect("answered");
        }
    };
    let second = add(true).await;
    answer(second.id.clone(), t0 + 20).await;
    let first = add(true).await;
    answer(first.id.clone(), t0 + 10).await;
    let notified = add(true).await;
    answer(notified.id.clone(), t0 + 30).await;
    let key = format!("{PREFIX}{}:answered", notified.id);
    assert_eq!(store.claim_notice(a_notice(&key, t0 + 31)).await, Ok(true));
    let _open = add(true).await;
    let silent = add(false).await;
    answer(silent.id.clone(), t0 + 40).await;
    let late = add(true).await;
    answer(late.id.clone(), t0 + 200).await;

    let mine = |tickets: Vec<TicketRecord>| -> Vec<String> {
        tickets
            .into_iter()
            .filter(|r| r.tenant == t)
            .map(|r| r.id)
            .collect()
    };
    let listed = store
        .unnotified_tickets(crate::Unnotified {
            notice_prefix: PREFIX,
            since: t0,
            until: t0 + 100,
            limit: 1000,
        })
        .await
        .expect("unnotified tickets");
    assert_eq!(
        mine(listed),
        [first.id.clone(), second.id.clone()],
        "answered, with a callback, not yet notified, in the range, oldest first"
    );
    let one = store
        .unnotified_tickets(crate::Unnotified {
            notice_prefix: PREFIX,
            since: t0,
            until: t0 + 100,
            limit: 1,
        })
        .await
        .expect("unnotified tickets");
    assert_eq!(one.len(), 1, "at most the limit");
    let key = format!("{PREFIX}{}:answered", first.id);
    assert_eq!(store.claim_notice(a_notice(&key, t0 + 50)).await, Ok(true));
    let listed = store
        .unnotified_tickets(crate::Unnotified {
            notice_prefix: PREFIX,
            since: t0,
            until: t0 + 100,
            limit: 1000,
        })
        .await
        .expect("unnotified tickets");
    assert_eq!(
        mine(listed),
        [second.id],
        "a claimed notice is no longer listed"
    );
}

// The lifecycle: every transition tried from every state.

/// When the transition tests act: the retrying job is due (at
/// [`BASE`] + 1,000) and every lease taken at [`BASE`] still holds.
const DUE_NOW: i64 = BASE + 2_000;
/// When every lease taken at [`BASE`] has run out.
const LEASES_OUT: i64 = BASE + LEASE + 1;

/// A job of `tenant` in `state`, reached through legal transitions only,
/// with the last attempt that held it (a running job's holder) and the
/// ticket a parked one waits on.
async fn job_in(store: &dyn Store, tenant: &str, state: JobState) -> (JobRecord, LeaseRef, String) {
    let ticket = format!("t_{}", new_id());
    if state == JobState::Queued {
        let job = queued(store, tenant).await;
        let never = lease(&job.id, "w1", 1);
        return (job, never, ticket);
    }
    if state == JobState::Scheduled {
        let job = scheduled(store, tenant, BASE + 1_000).await;
        let never = lease(&job.id, "w1", 1);
        return (job, never, ticket);
    }
    let job = running(store, tenant, "w1").await;
    let held = holder(&job);
    let now = BASE + 1;
    let moved = match state {
        JobState::Queued | JobState::Scheduled | JobState::Running => Some(job),
        JobState::Retrying => fail(store, &held, &failure("flaky"), Some(BASE + 1_000), now).await,
        JobState::Parked => park(store, &held, &ticket, now).await,
        JobState::Succeeded => succeed(store, &held, &result_doc(), now).await,
        JobState::Failed => fail(store, &held, &failure("broken"), None, now).await,
        JobState::Cancelled => store
            .cancel(crate::CancelJob {
                tenant,
                id: &job.id,
                now,
            })
            .await
            .expect("cancel"),
    };
    let job = moved.unwrap_or_else(|| panic!("a job reaches {state}"));
    assert_eq!(job.state, state, "reached through legal transitions");
    (job, held, ticket)
}

/// Runs the store operation of `transition` on `job` as its caller would,
/// with every guard but the state holding (the holder's lease, the job's
/// ticket and tenant, a time when it is due or its lease ran out): the job
/// as it moved, or `None` when the store refused.
async fn apply(
    store: &dyn Store,
    transition: Transition,
    job: &JobRecord,
    last: &LeaseRef,
    ticket: &str,
) -> Option<JobRecord> {
    match transition {
        Transition::Enqueue => Some(queued(store, &job.tenant).await),
        Transition::Schedule => Some(scheduled(store, &job.tenant, LATER).await),
        Transition::Claim => claim(store, &job.id, "w2", DUE_NOW).await,
        Transition::TakeOver => claim(store, &job.id, "w2", LEASES_OUT).await,
        Transition::Heartbeat => match heartbeat(store, last, DUE_NOW).await {
            Lease::Held => Some(reread(store, job).await),
            Lease::Cancelled | Lease::Lost => None,
        },
        Transition::Park => park(store, last, ticket, DUE_NOW).await,
        Transition::Defer => store
            .defer(crate::Defer {
                lease: last,
                until: DUE_NOW + 1_000,
                now: DUE_NOW,
            })
            .await
            .expect("defer"),
        Transition::Wake => {
            let woken = store.wake(ticket, DUE_NOW).await.expect("wake");
            woken.into_iter().find(|j| j.id == job.id)
        }
        Transition::Succeed => succeed(store, last, &result_doc(), DUE_NOW).await,
        Transition::Retry => {
            let retry_at = Some(DUE_NOW + 1_000);
            fail(store, last, &failure("flaky"), retry_at, DUE_NOW).await
        }
        Transition::Fail => fail(store, last, &failure("broken"), None, DUE_NOW).await,
        Transition::Requeue => store
            .requeue(crate::Requeue {
                tenant: &job.tenant,
                id: &job.id,
                now: DUE_NOW,
            })
            .await
            .expect("requeue"),
        Transition::DeadLetter => dead_letter(store, &job.id, LEASES_OUT).await,
        Transition::Cancel => {
            let now = store
                .cancel(crate::CancelJob {
                    tenant: &job.tenant,
                    id: &job.id,
                    now: DUE_NOW,
                })
                .await;
            now.expect("cancel")
                .filter(|j| j.state != job.state || j.updated_at != job.updated_at)
        }
    }
}

/// Every transition of [`toolfleet_core::lifecycle`] from every state: it
/// applies exactly where the lifecycle says it leaves that state, moves
/// the job to the state the lifecycle names, and where it does not apply
/// leaves the job as it was. The claim is tried twice: at a time when only
/// waiting jobs are due (`claim`), and once every lease ran out
/// (`claim` or `take_over`).
pub async fn every_transition_moves_only_from_its_states(store: &dyn Store) {
    let t = tenant();
    for state in JobState::ALL {
        for transition in Transition::ALL {
            let (job, last, ticket) = job_in(store, &t, state).await;
            let moved = apply(store, transition, &job, &last, &ticket).await;
            let expected = match transition {
                Transition::Enqueue | Transition::Schedule => true,
                // A claim once leases ran out also claims what `claim` would.
                Transition::TakeOver => transition.leaves(state) || Transition::Claim.leaves(state),
                other => other.leaves(state),
            };
            let what = format!("{transition} from {state}");
            match moved {
                Some(moved) => {
                    assert!(expected, "{what} applied: {moved:?}");
                    let to = match transition {
                        Transition::TakeOver if state != JobState::Running => {
                            Transition::Claim.to()
                        }
                        other => other.to(),
                    };
                    assert_eq!(moved.state, to, "{what}");
                    assert_eq!(reread(store, &moved).await.state, to, "{what}, stored");
                }
                None => {
                    assert!(!expected, "{what} was refused");
                    let now = reread(store, &job).await;
                    assert_eq!(
                        (now.state, now.attempts, now.updated_at),
                        (job.state, job.attempts, job.updated_at),
                        "{what} was refused and changed the job"
                    );
                }
            }
        }
    }
}

/// A parked job is stored as `parked`, answers the `get_job` envelope of a
/// `retrying` one, is listed under the `retrying` filter and counted where
/// the lifecycle counts it; woken, it is `retrying` and due.
pub async fn a_parked_job_is_listed_and_counted_as_it_is_shown(store: &dyn Store) {
    let t = tenant();
    let (parked, _, ticket) = job_in(store, &t, JobState::Parked).await;
    match parked.envelope(5) {
        Envelope::Running { state, .. } => assert_eq!(state, Some(JobState::Retrying)),
        other => panic!("a parked job reads as running: {other:?}"),
    }
    let list = |state: JobState| JobFilter {
        state: Some(state),
        ..JobFilter::default()
    };
    let page = store
        .list_jobs(crate::ListJobs {
            tenant: &t,
            filter: &list(JobState::Retrying),
            limit: 10,
            cursor: None,
        })
        .await
        .expect("list");
    assert_eq!(
        page.jobs.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        [parked.id.as_str()],
        "retrying lists the parked job"
    );
    for other in [JobState::Queued, JobState::Running, JobState::Succeeded] {
        let page = store
            .list_jobs(crate::ListJobs {
                tenant: &t,
                filter: &list(other),
                limit: 10,
                cursor: None,
            })
            .await
            .expect("list");
        assert!(page.jobs.iter().all(|j| j.id != parked.id), "{other}");
    }
    let counts = store.job_counts().await.expect("counts");
    let of = |state: JobState| counts.iter().find(|(s, _)| *s == state).map(|(_, n)| *n);
    assert!(of(JobState::Parked).is_some_and(|n| n >= 1), "{counts:?}");
    assert_eq!(
        claim(store, &parked.id, "w2", LATER).await,
        None,
        "a parked job is never due"
    );
    let woken = store.wake(&ticket, DUE_NOW).await.expect("wake");
    assert_eq!(
        woken
            .iter()
            .map(|j| (j.id.as_str(), j.state, j.run_at))
            .collect::<Vec<_>>(),
        [(parked.id.as_str(), JobState::Retrying, DUE_NOW)]
    );
}

// Webhook notices.

/// A notice is claimed by one sender while it sends, by another once the
/// first's lease ran out (its dispatcher stopped), and by none once it was
/// recorded as sent, until its record expires; the notices are apart from
/// the commit log of confirm tokens, whose keys they never answer.
pub async fn a_notice_is_claimed_by_one_sender_and_kept_once_sent(store: &dyn Store) {
    let key = format!("webhook:job:{}:succeeded", new_id());
    assert_eq!(store.claim_notice(a_notice(&key, BASE)).await, Ok(true));
    assert_eq!(
        store.claim_notice(a_notice(&key, BASE + 1)).await,
        Ok(false)
    );
    assert_eq!(
        store.claim_notice(a_notice(&key, BASE + LEASE + 1)).await,
        Ok(true),
        "taken over once the sender's lease ran out"
    );
    let sent = crate::SettleNotice {
        key: &key,
        delivered: true,
        keep_until: LATER,
    };
    store.settle_notice(sent).await.expect("settle_notice");
    for now in [BASE + LEASE + 2, BASE + 10 * LEASE, LATER - 1] {
        assert_eq!(
            store.claim_notice(a_notice(&key, now)).await,
            Ok(false),
            "a sent notice is kept until its keep_until"
        );
    }
    // The commit log knows nothing of it.
    assert_eq!(claim_commit(store, &key, BASE + 2).await, CommitClaim::Run);
    // Given up counts as sent; an expired record may be claimed again.
    let other = format!("webhook:ticket:t_{}:answered", new_id());
    assert_eq!(store.claim_notice(a_notice(&other, BASE)).await, Ok(true));
    let given_up = crate::SettleNotice {
        key: &other,
        delivered: false,
        keep_until: BASE + 5,
    };
    store.settle_notice(given_up).await.expect("settle_notice");
    assert_eq!(
        store.claim_notice(a_notice(&other, BASE + 4)).await,
        Ok(false)
    );
    assert_eq!(
        store.claim_notice(a_notice(&other, BASE + 6)).await,
        Ok(true)
    );
}

/// The next job of ordered pool `pool` claimed by `w1` at `now`.
async fn claim_next(store: &dyn Store, pool: &str, now: i64) -> Option<JobRecord> {
    let claim = crate::ClaimNext {
        pool,
        worker: "w1",
        now,
        lease_ms: LEASE,
    };
    store.claim_next(claim).await.expect("claim_next")
}

/// `claim_next` takes, of an ordered pool's claimable jobs, the highest
/// priority first and equal priorities in the order they came due; it
/// never takes a job of the pool that carries no priority, a scheduled job
/// before its time or a job whose lease holds, and takes over one whose
/// lease expired.
pub async fn claim_next_takes_the_highest_priority_first_then_in_order(store: &dyn Store) {
    let tenant = tenant();
    let pool = format!("ordered-{}", new_id());
    let make = |priority: Option<i16>, now: i64, run_at: Option<i64>| NewJob {
        pool: pool.clone(),
        priority,
        run_at,
        ..job_for(&tenant, "rank", json!({}), None, now)
    };
    let mut ids = std::collections::HashMap::new();
    for (name, priority, now) in [
        ("a", Some(0), BASE + 1),
        ("b", Some(5), BASE + 2),
        ("c", Some(0), BASE + 3),
        ("d", Some(5), BASE + 4),
        ("e", Some(-3), BASE + 5),
        ("unordered", None, BASE),
    ] {
        ids.insert(insert(store, make(priority, now, None)).await.id, name);
    }
    let later = insert(store, make(Some(9), BASE, Some(BASE + 100))).await;
    ids.insert(later.id.clone(), "later");
    let next = |now: i64| claim_next(store, &pool, now);
    let mut order = Vec::new();
    while let Some(job) = next(BASE + 10).await {
        assert_eq!(job.state, JobState::Running);
        assert_eq!(job.lease_owner.as_deref(), Some("w1"));
        order.push(ids[&job.id]);
    }
    assert_eq!(
        order,
        ["b", "d", "a", "c", "e"],
        "higher first, then in order; the scheduled and the unordered wait"
    );
    let due = next(BASE + 100).await.expect("the scheduled job, due");
    assert_eq!(
        (due.id.as_str(), due.priority, due.attempts),
        (later.id.as_str(), Some(9), 1)
    );
    assert!(next(BASE + 101).await.is_none(), "every lease holds");
    let taken = next(BASE + 100 + LEASE + 1)
        .await
        .expect("taken over, the highest priority first");
    assert_eq!((taken.id, taken.attempts), (later.id, 2));
    let unordered = ids
        .iter()
        .find(|(_, name)| **name == "unordered")
        .unwrap()
        .0;
    let left = store.job_by_id(unordered).await.unwrap().unwrap();
    assert_eq!((left.state, left.priority), (JobState::Queued, None));
}

/// `claim_next` takes a job with a concurrency key only while fewer than
/// its limit of its key run with a lease that holds: the others wait,
/// queued and in order, and are taken when a job of their key settles or
/// when a holder's lease expires; other keys and jobs without a key are
/// taken meanwhile.
pub async fn claim_next_holds_each_concurrency_key_to_its_limit(store: &dyn Store) {
    let tenant = tenant();
    let pool = format!("keyed-{}", new_id());
    let key = format!("sync\u{1f}{tenant}\u{1f}\"acct-1\"");
    let other = format!("sync\u{1f}{tenant}\u{1f}\"acct-2\"");
    let make = |k: Option<(&str, u32)>, now: i64| NewJob {
        pool: pool.clone(),
        priority: Some(0),
        concurrency_key: k.map(|(key, _)| key.to_owned()),
        concurrency_limit: k.map(|(_, limit)| limit),
        ..job_for(&tenant, "sync", json!({}), None, now)
    };
    let mut names = std::collections::HashMap::new();
    for (name, k, now) in [
        ("k1", Some((key.as_str(), 2)), BASE + 1),
        ("k2", Some((key.as_str(), 2)), BASE + 2),
        ("k3", Some((key.as_str(), 2)), BASE + 3),
        ("k4", Some((key.as_str(), 2)), BASE + 4),
        ("m1", Some((other.as_str(), 1)), BASE + 5),
        ("m2", Some((other.as_str(), 1)), BASE + 6),
        ("free", None, BASE + 7),
    ] {
        let job = insert(store, make(k, now)).await;
        assert_eq!(job.concurrency_key.as_deref(), k.map(|(key, _)| key));
        assert_eq!(job.concurrency_limit, k.map(|(_, limit)| limit));
        names.insert(job.id, name);
    }
    let next = |now: i64| claim_next(store, &pool, now);
    let mut held = Vec::new();
    while let Some(job) = next(BASE + 10).await {
        held.push(job);
    }
    let order: Vec<&str> = held.iter().map(|job| names[&job.id]).collect();
    assert_eq!(order, ["k1", "k2", "m1", "free"], "each key to its limit");
    let running = |k: String, now: i64| async move {
        store
            .running_with_key(&k, now)
            .await
            .expect("running_with_key")
    };
    assert_eq!(running(key.clone(), BASE + 10).await, 2);
    assert_eq!(running(other.clone(), BASE + 10).await, 1);
    let k3 = names.iter().find(|(_, n)| **n == "k3").unwrap().0.clone();
    let waiting = store.job_by_id(&k3).await.unwrap().unwrap();
    assert_eq!(
        waiting.state,
        JobState::Queued,
        "waiting for its key, queued"
    );

    succeed(store, &holder(&held[0]), &result_doc(), BASE + 20)
        .await
        .expect("k1 settles");
    let freed = next(BASE + 20).await.expect("k1's slot is free");
    assert_eq!(names[&freed.id], "k3", "the next of its key, in order");
    assert!(
        next(BASE + 20).await.is_none(),
        "k4 and m2 wait for their keys"
    );

    // Every lease expires: the holders are taken over first (the earliest
    // due), and the keys' limits hold among the new attempts.
    let later = BASE + 20 + LEASE + 1;
    assert_eq!(
        running(key.clone(), later).await,
        0,
        "an expired lease frees its slot"
    );
    let mut again = Vec::new();
    while let Some(job) = next(later).await {
        again.push((names[&job.id], job.attempts));
    }
    assert_eq!(
        again,
        [("k2", 2), ("k3", 2), ("m1", 2), ("free", 2)],
        "taken over, each key to its limit again"
    );
}

/// In a fair pool each tenant's jobs take turns: a tenant's next turn is
/// one past its last and past the pool's clock (the turn claimed last), so
/// a tenant that comes while another has a backlog is taken within a turn;
/// a higher priority still comes first.
pub async fn fair_turns_let_a_newcomer_in_within_a_turn(store: &dyn Store) {
    let pool = format!("fair-{}", new_id());
    let (a, b) = (tenant(), tenant());
    let mut names = std::collections::HashMap::new();
    let mut now = BASE;
    let mut add = |tenant: &str, name: &str, priority: i16| {
        now += 1;
        let (tenant, name, pool, at) = (tenant.to_owned(), name.to_owned(), pool.clone(), now);
        async move {
            let rank = store.fair_turn(&pool, &tenant).await.expect("fair_turn");
            let job = NewJob {
                pool,
                priority: Some(priority),
                fair_rank: rank,
                ..job_for(&tenant, "crawl", json!({}), None, at)
            };
            (insert(store, job).await, name, rank)
        }
    };
    let mut ranks = Vec::new();
    for n in 1..=6 {
        let (job, name, rank) = add(&a, &format!("a{n}"), 0).await;
        names.insert(job.id, name);
        ranks.push(rank);
    }
    assert_eq!(
        ranks,
        [1, 2, 3, 4, 5, 6],
        "a tenant's turns follow each other"
    );
    let next = || claim_next(store, &pool, BASE + 100);
    let mut order = Vec::new();
    for _ in 0..2 {
        order.push(names[&next().await.expect("a job").id].clone());
    }
    // b comes with a's backlog of four: its turns start at the clock's.
    for n in 1..=2 {
        let (job, name, rank) = add(&b, &format!("b{n}"), 0).await;
        assert_eq!(rank, 2 + n, "past the clock, not behind a's backlog");
        names.insert(job.id, name);
    }
    let (urgent, name, _) = add(&b, "urgent", 5).await;
    names.insert(urgent.id, name);
    while let Some(job) = next().await {
        order.push(names[&job.id].clone());
    }
    assert_eq!(
        order,
        ["a1", "a2", "urgent", "a3", "b1", "a4", "b2", "a5", "a6"],
        "turns alternate within a priority"
    );
}

/// `defer` gives the attempt back and waits: the job is retrying, due when
/// the defer says, with the attempts it had before the claim, and a claim
/// before then takes nothing; a stale attempt defers nothing.
pub async fn a_deferred_job_gives_its_attempt_back_and_waits(store: &dyn Store) {
    let job = running(store, &tenant(), "w1").await;
    assert_eq!(job.attempts, 1);
    let held = holder(&job);
    let deferred = store
        .defer(crate::Defer {
            lease: &held,
            until: BASE + 5_000,
            now: BASE + 10,
        })
        .await
        .expect("defer")
        .expect("the holder defers");
    assert_eq!(
        (
            deferred.state,
            deferred.attempts,
            deferred.run_at,
            deferred.lease_owner
        ),
        (JobState::Retrying, 0, BASE + 5_000, None)
    );
    assert!(
        claim(store, &job.id, "w2", BASE + 4_999).await.is_none(),
        "not before"
    );
    let again = claim(store, &job.id, "w2", BASE + 5_000)
        .await
        .expect("due");
    assert_eq!(again.attempts, 1, "the deferred attempt was not counted");
    let stale = store
        .defer(crate::Defer {
            lease: &held,
            until: BASE + 9_000,
            now: BASE + 5_001,
        })
        .await
        .expect("defer");
    assert!(
        stale.is_none(),
        "an attempt that lost the job defers nothing"
    );
}

// Handles.

/// A handle of `tenant` and alice, made at `now`, expiring an hour later,
/// in a tenant bound of `max` handles and `max_bytes`.
fn new_handle<'a>(
    id: &'a str,
    tenant: &'a str,
    value: &'a str,
    now: i64,
    max: u32,
    max_bytes: i64,
) -> NewHandle<'a> {
    NewHandle {
        id,
        tenant,
        user: "alice",
        tool: "export_ledger",
        value,
        now,
        expires_at: now + 3_600_000,
        max_per_tenant: max,
        max_bytes_per_tenant: max_bytes,
    }
}

fn handle_id() -> String {
    toolfleet_core::new_handle_id()
}

fn owner<'a>(tenant: &'a str, user: &'a str, now: i64) -> HandleOwner<'a> {
    HandleOwner { tenant, user, now }
}

/// A handle reads back whole for its tenant and user, and as missing for
/// another user, another tenant, an unknown id, and once it expired.
pub async fn a_handle_is_read_by_its_owner_alone_until_it_expires(store: &dyn Store) {
    let (t, other) = (tenant(), tenant());
    let id = handle_id();
    let value = json!({"rows": (0..50).collect::<Vec<_>>()}).to_string();
    let gone = store
        .put_handle(new_handle(&id, &t, &value, BASE, 100, 1 << 20))
        .await
        .unwrap();
    assert_eq!(gone, 0);
    let read = store
        .handle(owner(&t, "alice", BASE + 1), &id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.value, value);
    assert_eq!(read.info.id, id);
    assert_eq!(read.info.tool, "export_ledger");
    assert_eq!(read.info.size_bytes, value.len() as i64);
    assert_eq!(read.info.created_at, BASE);
    assert_eq!(read.info.expires_at, BASE + 3_600_000);
    for (tenant, user) in [(t.as_str(), "bob"), (other.as_str(), "alice")] {
        let read = store
            .handle(owner(tenant, user, BASE + 1), &id)
            .await
            .unwrap();
        assert_eq!(read, None, "{tenant}/{user} must not read alice's handle");
    }
    let unknown = store
        .handle(owner(&t, "alice", BASE + 1), &handle_id())
        .await
        .unwrap();
    assert_eq!(unknown, None);
    let expired = store
        .handle(owner(&t, "alice", BASE + 3_600_000), &id)
        .await
        .unwrap();
    assert_eq!(expired, None, "an expired handle is not read");
}

/// Past its bound in number or in bytes, a tenant loses its oldest
/// handles, and no other tenant's.
pub async fn a_tenants_handles_are_bounded_oldest_first(store: &dyn Store) {
    let (t, other) = (tenant(), tenant());
    let value = "x".repeat(100);
    let theirs = handle_id();
    store
        .put_handle(new_handle(&theirs, &other, &value, BASE, 3, 10_000))
        .await
        .unwrap();
    let ids: Vec<String> = (0..5).map(|_| handle_id()).collect();
    let mut evicted = 0;
    for id in &ids {
        evicted += store
            .put_handle(new_handle(id, &t, &value, BASE, 3, 10_000))
            .await
            .unwrap();
    }
    assert_eq!(evicted, 2, "five handles in a bound of three");
    let kept = |ids: &[String]| {
        let ids = ids.to_vec();
        let t = t.clone();
        async move {
            let mut kept = Vec::new();
            for id in &ids {
                if store
                    .handle(owner(&t, "alice", BASE), id)
                    .await
                    .unwrap()
                    .is_some()
                {
                    kept.push(id.clone());
                }
            }
            kept
        }
    };
    assert_eq!(kept(&ids).await, ids[2..].to_vec(), "the oldest two went");
    // Bytes: 250 bytes in a bound of 300 keeps the newest only.
    let big = "y".repeat(250);
    let newest = handle_id();
    let gone = store
        .put_handle(new_handle(&newest, &t, &big, BASE, 3, 300))
        .await
        .unwrap();
    assert_eq!(gone, 3);
    assert_eq!(kept(&ids).await, Vec::<String>::new());
    assert!(
        store
            .handle(owner(&t, "alice", BASE), &newest)
            .await
            .unwrap()
            .is_some()
    );
    let read = store
        .handle(owner(&other, "alice", BASE), &theirs)
        .await
        .unwrap();
    assert!(read.is_some(), "another tenant's handle stays");
}

/// A user's unexpired handles, newest first, paged by the last id.
pub async fn handles_are_listed_newest_first_in_pages(store: &dyn Store) {
    let t = tenant();
    let ids: Vec<String> = (0..5).map(|_| handle_id()).collect();
    for (n, id) in ids.iter().enumerate() {
        let mut handle = new_handle(id, &t, "[1,2,3]", BASE + n as i64, 100, 1 << 20);
        if n == 0 {
            handle.expires_at = BASE + 10;
        }
        store.put_handle(handle).await.unwrap();
    }
    let bob = handle_id();
    let mut of_bob = new_handle(&bob, &t, "[]", BASE, 100, 1 << 20);
    of_bob.user = "bob";
    store.put_handle(of_bob).await.unwrap();
    let first = store
        .list_handles(owner(&t, "alice", BASE + 10), None, 2)
        .await
        .unwrap();
    let first_ids: Vec<&str> = first.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(first_ids, [ids[4].as_str(), ids[3].as_str()]);
    assert_eq!(first[0].size_bytes, 7);
    assert_eq!(first[0].tool, "export_ledger");
    let rest = store
        .list_handles(owner(&t, "alice", BASE + 10), Some(&ids[3]), 10)
        .await
        .unwrap();
    let rest_ids: Vec<&str> = rest.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(
        rest_ids,
        [ids[2].as_str(), ids[1].as_str()],
        "the expired one is not listed"
    );
    let bobs = store
        .list_handles(owner(&t, "bob", BASE), None, 10)
        .await
        .unwrap();
    assert_eq!(bobs.len(), 1);
    assert_eq!(bobs[0].id, bob);
}

/// Pruning deletes expired handles, and none that is still readable.
pub async fn expired_handles_are_pruned(store: &dyn Store) {
    let t = tenant();
    // Far past every other test's times, so other tests' handles are not
    // what this one counts.
    let at = LATER + 5_000_000;
    let (old, fresh) = (handle_id(), handle_id());
    let mut handle = new_handle(&old, &t, "1", at, 100, 1 << 20);
    handle.expires_at = at + 10;
    store.put_handle(handle).await.unwrap();
    store
        .put_handle(new_handle(&fresh, &t, "2", at, 100, 1 << 20))
        .await
        .unwrap();
    let mut pruned = 0;
    loop {
        let gone = store.prune_handles(at + 10, 10_000).await.unwrap();
        pruned += gone;
        if gone == 0 {
            break;
        }
    }
    assert!(pruned >= 1);
    assert!(
        store
            .handle(owner(&t, "alice", at), &old)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .handle(owner(&t, "alice", at), &fresh)
            .await
            .unwrap()
            .is_some()
    );
}
