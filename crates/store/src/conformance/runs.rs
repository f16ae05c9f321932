//! The conformance suite's behaviours of runs, their waits, and the inbox
//! of tickets (see the [parent module](super)). The sweeps that read the
//! whole store (expiry, unsettled tickets, stale runs) work in time ranges
//! of their own, so they find the rows of no other test but their own
//! leftovers, which they tell apart by tenant.

use serde_json::json;
use toolfleet_core::{AnsweredBy, Envelope, new_id};

use super::{BASE, FOREVER, outcome, tenant, ticket_for};
use crate::{
    AnswerTicket, Answered, Answerer, ListRuns, ListTickets, NewRun, NewTicket, RunFilter,
    RunInserted, RunRecord, RunState, RunWait, SettleTicket, StaleRuns, Store, StoreError,
    TicketKind, TicketRecord, TicketShown, UpdateRun, WaitFor,
};

/// Where the test of ticket expiry works: no other ticket expires there.
const EXPIRY: i64 = BASE + 3_000_000_000;
/// Where the tests of unsettled tickets and stale runs work: before every
/// other test's times.
const EARLY: i64 = BASE - 1_000_000_000_000;

// Fixtures.

fn run_for(tenant: &str) -> NewRun {
    NewRun {
        id: format!("run_{}", new_id()),
        tenant: tenant.to_owned(),
        user: "alice".to_owned(),
        agent: Some("expenses".to_owned()),
        checkpoint: Some(json!({"step": 0})),
        callback_url: None,
        idempotency_key: None,
        scopes: vec!["expenses:write".to_owned()],
        now: BASE,
    }
}

async fn new_run(store: &dyn Store, run: NewRun) -> RunRecord {
    match store.insert_run(run).await.expect("insert_run") {
        RunInserted::Created(run) => run,
        other => panic!("expected a new run, got {other:?}"),
    }
}

async fn update(store: &dyn Store, update: UpdateRun<'_>) -> Option<RunRecord> {
    store.update_run(update).await.expect("update_run")
}

async fn read_run(store: &dyn Store, id: &str) -> Option<RunRecord> {
    store.run_by_id(id).await.expect("run_by_id")
}

async fn waiting_on(store: &dyn Store, item: &str) -> Vec<String> {
    let runs = store.waiting_runs(item).await.expect("waiting_runs");
    runs.into_iter().map(|r| r.id).collect()
}

/// Every run of `filter` in `tenant`, page by page of `limit`, checking
/// each page's size and that a cursor is given exactly when more follow.
async fn all_runs(store: &dyn Store, tenant: &str, filter: &RunFilter, limit: u32) -> Vec<String> {
    let (mut ids, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let page = store
            .list_runs(ListRuns {
                tenant,
                filter,
                limit,
                cursor: cursor.as_deref(),
            })
            .await
            .expect("list_runs");
        assert!(page.runs.len() <= limit as usize, "{page:?}");
        ids.extend(page.runs.iter().map(|r| r.id.clone()));
        match page.next_cursor {
            Some(next) => {
                assert_eq!(page.runs.len(), limit as usize, "a full page before a next");
                cursor = Some(next);
            }
            None => return ids,
        }
    }
}

async fn insert_ticket(store: &dyn Store, ticket: NewTicket) -> TicketRecord {
    store.insert_ticket(ticket).await.expect("insert_ticket")
}

async fn answer(store: &dyn Store, tenant: &str, id: &str, now: i64) -> Option<Answered> {
    store
        .answer_ticket(AnswerTicket {
            tenant,
            id,
            answer: &json!("yes"),
            now,
        })
        .await
        .expect("answer_ticket")
}

async fn settle(
    store: &dyn Store,
    tenant: &str,
    id: &str,
    outcome: &Envelope,
) -> Option<TicketRecord> {
    store
        .settle_ticket(SettleTicket {
            tenant,
            id,
            outcome,
            now: BASE + 100,
        })
        .await
        .expect("settle_ticket")
}

/// Every ticket `answerer` sees of `tenant`, page by page of `limit`.
async fn inbox(
    store: &dyn Store,
    tenant: &str,
    answerer: &Answerer,
    (shown, kind): (Option<TicketShown>, Option<TicketKind>),
    limit: u32,
) -> Vec<String> {
    let (mut ids, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let page = store
            .list_tickets(ListTickets {
                tenant,
                answerer,
                shown,
                kind,
                limit,
                cursor: cursor.as_deref(),
            })
            .await
            .expect("list_tickets");
        assert!(page.tickets.len() <= limit as usize, "{page:?}");
        ids.extend(page.tickets.iter().map(|t| t.id.clone()));
        match page.next_cursor {
            Some(next) => {
                assert_eq!(
                    page.tickets.len(),
                    limit as usize,
                    "a full page before a next"
                );
                cursor = Some(next);
            }
            None => return ids,
        }
    }
}

fn user(name: &str, scopes: &[&str]) -> Answerer {
    Answerer::User {
        user: name.to_owned(),
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// The ids of `tickets`, newest first.
fn newest_first<'a>(tickets: impl IntoIterator<Item = &'a TicketRecord>) -> Vec<String> {
    let mut ids: Vec<String> = tickets.into_iter().map(|t| t.id.clone()).collect();
    ids.sort();
    ids.reverse();
    ids
}

/// Running or waiting -> waiting on `wait`.
fn park<'a>(id: &'a str, wait: &'a RunWait, now: i64) -> UpdateRun<'a> {
    UpdateRun {
        wait: Some(wait),
        ..UpdateRun::new(
            id,
            &[RunState::Running, RunState::Waiting],
            RunState::Waiting,
            now,
        )
    }
}

// Runs.

/// A run is recorded running at version 1, as given; the same tenant, user
/// and key answer it again, and nothing else does.
pub async fn a_run_is_recorded_once_per_key(store: &dyn Store) {
    let t = tenant();
    let new = NewRun {
        idempotency_key: Some("key-1".to_owned()),
        callback_url: Some("http://127.0.0.1:9/runs".to_owned()),
        ..run_for(&t)
    };
    let created = new_run(store, new.clone()).await;
    let expected = RunRecord {
        id: new.id.clone(),
        tenant: t.clone(),
        user: "alice".to_owned(),
        agent: Some("expenses".to_owned()),
        state: RunState::Running,
        checkpoint: Some(json!({"step": 0})),
        wait: None,
        resumed: None,
        answer: None,
        error: None,
        usage: None,
        callback_url: new.callback_url.clone(),
        idempotency_key: Some("key-1".to_owned()),
        scopes: vec!["expenses:write".to_owned()],
        version: 1,
        created_at: BASE,
        updated_at: BASE,
    };
    assert_eq!(created, expected);
    assert_eq!(store.run(&t, &new.id).await, Ok(Some(expected.clone())));

    let again = NewRun {
        id: format!("run_{}", new_id()),
        now: BASE + 5,
        ..new.clone()
    };
    let again_id = again.id.clone();
    assert_eq!(
        store.insert_run(again).await,
        Ok(RunInserted::Existing(expected.clone()))
    );
    assert_eq!(read_run(store, &again_id).await, None, "no second run");

    // The key is per tenant and per user.
    for other in [
        NewRun {
            id: format!("run_{}", new_id()),
            user: "bob".to_owned(),
            ..new.clone()
        },
        NewRun {
            id: format!("run_{}", new_id()),
            tenant: tenant(),
            ..new.clone()
        },
    ] {
        let made = new_run(store, other.clone()).await;
        assert_eq!((made.id, made.version), (other.id, 1));
    }

    // A run its caller drives: no agent, no checkpoint, running too.
    let driven = NewRun {
        agent: None,
        checkpoint: None,
        scopes: Vec::new(),
        ..run_for(&t)
    };
    let made = new_run(store, driven.clone()).await;
    assert_eq!(
        (made.agent, made.checkpoint, made.state, made.scopes),
        (None, None, RunState::Running, Vec::new())
    );
    // Without a key, a second run is a run of its own; its id is not.
    let unkeyed = run_for(&t);
    new_run(store, unkeyed.clone()).await;
    new_run(
        store,
        NewRun {
            id: format!("run_{}", new_id()),
            ..unkeyed.clone()
        },
    )
    .await;
    assert!(matches!(
        store.insert_run(unkeyed).await,
        Err(StoreError::Conflict(_))
    ));
}

/// A run reads back to its tenant only; by id alone for the runtime; a
/// run that does not exist is moved by no update.
pub async fn another_tenants_run_reads_as_missing(store: &dyn Store) {
    let (t, other) = (tenant(), tenant());
    let run = new_run(store, run_for(&t)).await;
    assert_eq!(store.run(&t, &run.id).await, Ok(Some(run.clone())));
    assert_eq!(store.run(&other, &run.id).await, Ok(None));
    assert_eq!(read_run(store, &run.id).await, Some(run.clone()));
    let missing = format!("run_{}", new_id());
    assert_eq!(store.run(&t, &missing).await, Ok(None));
    assert_eq!(read_run(store, &missing).await, None);
    assert!(
        all_runs(store, &other, &RunFilter::default(), 10)
            .await
            .is_empty(),
        "another tenant lists none of them"
    );
    let all = RunState::ALL;
    let moved = UpdateRun::new(&missing, &all, RunState::Cancelled, BASE + 1);
    assert_eq!(update(store, moved).await, None);
    assert_eq!(read_run(store, &missing).await, None, "nothing was made");
    assert_eq!(read_run(store, &run.id).await, Some(run), "nor changed");
}

/// update_run moves a run only at the version and from the states it
/// names, bumping the version; of two writers of one version, one wins.
pub async fn update_run_is_a_compare_and_set(store: &dyn Store) {
    let t = tenant();
    let run = new_run(store, run_for(&t)).await;
    let wait = RunWait {
        wait_for: WaitFor::All,
        jobs: vec![new_id()],
        tickets: Vec::new(),
    };
    let waiting = update(
        store,
        UpdateRun {
            version: Some(1),
            wait: Some(&wait),
            ..UpdateRun::new(&run.id, &[RunState::Running], RunState::Waiting, BASE + 1)
        },
    )
    .await
    .expect("moved at its version");
    assert_eq!(
        (waiting.state, waiting.version, waiting.wait.as_ref()),
        (RunState::Waiting, 2, Some(&wait))
    );
    assert_eq!((waiting.created_at, waiting.updated_at), (BASE, BASE + 1));

    let stale = UpdateRun {
        version: Some(1),
        ..UpdateRun::new(&run.id, &[RunState::Waiting], RunState::Answered, BASE + 2)
    };
    assert_eq!(update(store, stale).await, None, "a stale version");
    let wrong = UpdateRun::new(&run.id, &[RunState::Running], RunState::Answered, BASE + 2);
    assert_eq!(update(store, wrong).await, None, "a state not among from");
    assert_eq!(read_run(store, &run.id).await, Some(waiting.clone()));

    let answered = update(
        store,
        UpdateRun {
            answer: Some("Line 14 is travel."),
            ..UpdateRun::new(
                &run.id,
                &[RunState::Running, RunState::Waiting],
                RunState::Answered,
                BASE + 3,
            )
        },
    )
    .await
    .expect("any version, from one of its states");
    assert_eq!(
        (answered.state, answered.version, answered.wait.as_ref()),
        (RunState::Answered, 3, None)
    );
    assert_eq!(answered.answer.as_deref(), Some("Line 14 is travel."));

    let from = [RunState::Answered];
    let racing = |now: i64| UpdateRun {
        version: Some(3),
        ..UpdateRun::new(&run.id, &from, RunState::Running, now)
    };
    let answers = futures_util::future::join_all(
        [racing(BASE + 4), racing(BASE + 5)].map(|u| store.update_run(u)),
    )
    .await;
    let won: Vec<RunRecord> = answers
        .into_iter()
        .filter_map(|answer| answer.expect("update_run"))
        .collect();
    assert_eq!(won.len(), 1, "{won:?}");
    assert_eq!(won[0].version, 4);
    assert_eq!(read_run(store, &run.id).await, Some(won[0].clone()));
}

/// A waiting run is found by each job and ticket it waits on, and by them
/// alone: a new wait replaces its items, and a run that moved out of
/// waiting is found by none.
pub async fn a_waiting_run_is_found_by_each_item_it_waits_on(store: &dyn Store) {
    let t = tenant();
    let (run, other) = (
        new_run(store, run_for(&t)).await,
        new_run(store, run_for(&t)).await,
    );
    let (j1, j2, j3) = (new_id(), new_id(), new_id());
    let ticket = format!("t_{}", new_id());
    let wait = RunWait {
        wait_for: WaitFor::Any,
        jobs: vec![j1.clone(), j2.clone()],
        tickets: vec![ticket.clone()],
    };
    update(store, park(&run.id, &wait, BASE + 1))
        .await
        .expect("waiting");
    for item in [&j1, &j2, &ticket] {
        assert_eq!(waiting_on(store, item).await, [run.id.as_str()], "{item}");
    }
    let only_j1 = RunWait {
        jobs: vec![j1.clone()],
        ..RunWait::default()
    };
    update(store, park(&other.id, &only_j1, BASE + 1))
        .await
        .expect("waiting");
    let mut both = vec![run.id.clone(), other.id.clone()];
    both.sort();
    assert_eq!(waiting_on(store, &j1).await, both);
    assert_eq!(waiting_on(store, &j2).await, [run.id.as_str()]);
    assert!(waiting_on(store, &new_id()).await.is_empty());

    // A new wait replaces the items of the old.
    let on_j3 = RunWait {
        jobs: vec![j3.clone()],
        ..RunWait::default()
    };
    update(store, park(&run.id, &on_j3, BASE + 2))
        .await
        .expect("waiting again");
    assert_eq!(waiting_on(store, &j1).await, [other.id.as_str()]);
    assert!(waiting_on(store, &j2).await.is_empty());
    assert!(waiting_on(store, &ticket).await.is_empty());
    assert_eq!(waiting_on(store, &j3).await, [run.id.as_str()]);

    // Waiting on, without a new wait: the wait and its items are kept.
    let step = json!({"step": 2});
    let kept = update(
        store,
        UpdateRun {
            checkpoint: Some(&step),
            ..UpdateRun::new(&run.id, &[RunState::Waiting], RunState::Waiting, BASE + 3)
        },
    )
    .await
    .expect("still waiting");
    assert_eq!(kept.wait.as_ref(), Some(&on_j3));
    assert_eq!(waiting_on(store, &j3).await, [run.id.as_str()]);

    // Out of waiting: found by none, its wait cleared.
    let resumed = update(
        store,
        UpdateRun::new(&run.id, &[RunState::Waiting], RunState::Running, BASE + 4),
    )
    .await
    .expect("resumed");
    assert_eq!(resumed.wait, None);
    assert!(waiting_on(store, &j3).await.is_empty());
    assert_eq!(waiting_on(store, &j1).await, [other.id.as_str()]);
    let cancelled = UpdateRun::new(
        &other.id,
        &[RunState::Waiting],
        RunState::Cancelled,
        BASE + 5,
    );
    update(store, cancelled).await.expect("cancelled");
    assert!(waiting_on(store, &j1).await.is_empty());
}

/// Fields an update does not give keep their values; the wait alone is
/// cleared out of waiting.
pub async fn update_run_keeps_the_fields_it_is_not_given(store: &dyn Store) {
    let t = tenant();
    let run = new_run(
        store,
        NewRun {
            callback_url: Some("http://127.0.0.1:9/runs".to_owned()),
            ..run_for(&t)
        },
    )
    .await;
    let (checkpoint, resumed) = (json!({"step": 3}), json!({"jobs": {"j": "ok"}}));
    let (error, usage) = (json!({"code": "tool_failed"}), json!({"steps": 3}));
    let written = update(
        store,
        UpdateRun {
            checkpoint: Some(&checkpoint),
            resumed: Some(&resumed),
            answer: Some("so far"),
            error: Some(&error),
            usage: Some(&usage),
            ..UpdateRun::new(&run.id, &[RunState::Running], RunState::Running, BASE + 1)
        },
    )
    .await
    .expect("written");
    let fields = |r: &RunRecord| {
        (
            r.checkpoint.clone(),
            r.resumed.clone(),
            r.answer.clone(),
            r.error.clone(),
            r.usage.clone(),
        )
    };
    let given = (
        Some(checkpoint),
        Some(resumed),
        Some("so far".to_owned()),
        Some(error),
        Some(usage),
    );
    assert_eq!(fields(&written), given);
    let moved = update(
        store,
        UpdateRun::new(&run.id, &[RunState::Running], RunState::Failed, BASE + 2),
    )
    .await
    .expect("moved");
    assert_eq!(fields(&moved), given, "kept when not given");
    let unchanged = RunRecord {
        state: RunState::Failed,
        version: 3,
        updated_at: BASE + 2,
        ..written
    };
    assert_eq!(moved, unchanged);
    assert_eq!(
        (&moved.agent, &moved.callback_url, &moved.scopes),
        (&run.agent, &run.callback_url, &run.scopes)
    );
    assert_eq!(read_run(store, &run.id).await, Some(moved));
}

/// The run list is a tenant's, newest first, filtered by state, agent and
/// user (alone or together), paged by its cursor.
pub async fn list_runs_filters_and_pages_newest_first(store: &dyn Store) {
    let t = tenant();
    let mut made = Vec::new();
    for n in 0..7 {
        let run = new_run(
            store,
            NewRun {
                user: if n % 2 == 0 { "alice" } else { "bob" }.to_owned(),
                agent: (n % 3 == 0).then(|| "expenses".to_owned()),
                ..run_for(&t)
            },
        )
        .await;
        let run = if n % 3 == 1 || n == 6 {
            let to_wait = UpdateRun::new(&run.id, &[RunState::Running], RunState::Waiting, BASE);
            update(store, to_wait).await.expect("waiting")
        } else {
            run
        };
        made.push(run);
    }
    new_run(store, run_for(&tenant())).await;
    let filters = [
        RunFilter::default(),
        RunFilter {
            state: Some(RunState::Waiting),
            ..RunFilter::default()
        },
        RunFilter {
            agent: Some("expenses".to_owned()),
            ..RunFilter::default()
        },
        RunFilter {
            user: Some("bob".to_owned()),
            ..RunFilter::default()
        },
        RunFilter {
            state: Some(RunState::Waiting),
            agent: Some("expenses".to_owned()),
            user: Some("alice".to_owned()),
        },
        RunFilter {
            state: Some(RunState::Answered),
            ..RunFilter::default()
        },
    ];
    for filter in &filters {
        let expected: Vec<String> = made
            .iter()
            .rev()
            .filter(|r| filter.state.is_none_or(|s| r.state == s))
            .filter(|r| filter.agent.is_none() || r.agent == filter.agent)
            .filter(|r| filter.user.as_ref().is_none_or(|u| &r.user == u))
            .map(|r| r.id.clone())
            .collect();
        for limit in [2, 100] {
            assert_eq!(
                all_runs(store, &t, filter, limit).await,
                expected,
                "{filter:?} by {limit}"
            );
        }
    }
    let first = store
        .list_runs(ListRuns {
            tenant: &t,
            filter: &RunFilter::default(),
            limit: 0,
            cursor: None,
        })
        .await
        .expect("list_runs");
    assert_eq!(first.runs.len(), 1, "a limit of 0 is a page of one");
    assert_eq!(first.runs[0].id, made[6].id);
}

/// stale_runs answers the runs left in a state since before a time, the
/// longest left first, at most the limit.
pub async fn stale_runs_are_those_left_in_a_state_oldest_first(store: &dyn Store) {
    let t = tenant();
    let at = |now: i64| NewRun { now, ..run_for(&t) };
    let a = new_run(store, at(EARLY + 3)).await;
    let b = new_run(store, at(EARLY + 1)).await;
    let c = new_run(store, at(EARLY + 2)).await;
    let recent = new_run(store, at(EARLY + 20)).await;
    let parked = new_run(store, at(EARLY + 1)).await;
    let parked = update(
        store,
        UpdateRun::new(
            &parked.id,
            &[RunState::Running],
            RunState::Waiting,
            EARLY + 4,
        ),
    )
    .await
    .expect("waiting");
    let stale = |state: RunState, before: i64, limit: u32| async move {
        let runs = store
            .stale_runs(StaleRuns {
                state,
                before,
                limit,
            })
            .await
            .expect("stale_runs");
        assert!(runs.len() <= limit as usize);
        assert!(
            runs.iter()
                .all(|r| r.state == state && r.updated_at < before)
        );
        assert!(
            runs.windows(2).all(|w| w[0].updated_at <= w[1].updated_at),
            "oldest first: {runs:?}"
        );
        runs
    };
    let mine = |runs: Vec<RunRecord>| -> Vec<String> {
        runs.into_iter()
            .filter(|r| r.tenant == t)
            .map(|r| r.id)
            .collect()
    };
    assert_eq!(
        mine(stale(RunState::Running, EARLY + 10, 1000).await),
        [b.id.clone(), c.id.clone(), a.id.clone()]
    );
    assert_eq!(
        mine(stale(RunState::Waiting, EARLY + 10, 1000).await),
        [parked.id.as_str()]
    );
    assert!(
        mine(stale(RunState::Waiting, EARLY + 4, 1000).await).is_empty(),
        "written at the time given is not stale"
    );
    assert_eq!(stale(RunState::Running, EARLY + 10, 1).await.len(), 1);
    // Moved on, out of the range, so later runs of the suite do not find them.
    for id in [&a.id, &b.id, &c.id, &recent.id, &parked.id] {
        let from = [RunState::Running, RunState::Waiting];
        let done = UpdateRun::new(id, &from, RunState::Cancelled, BASE);
        update(store, done).await.expect("cancelled");
    }
    assert!(mine(stale(RunState::Running, EARLY + 30, 1000).await).is_empty());
}

// Tickets.

/// A ticket keeps its kind, plan, scopes and expiry; it starts open,
/// neither expired nor settled.
pub async fn a_ticket_keeps_its_kind_plan_scopes_and_expiry(store: &dyn Store) {
    let t = tenant();
    let new = NewTicket {
        kind: TicketKind::Approval,
        plan: Some(json!({"rows": 3, "total": 812.4})),
        scopes: vec!["expenses:write".to_owned(), "expenses:read".to_owned()],
        expires_at: Some(FOREVER),
        ..ticket_for(&t)
    };
    let written = insert_ticket(store, new.clone()).await;
    assert_eq!(
        (
            written.kind,
            &written.plan,
            &written.scopes,
            written.expires_at
        ),
        (TicketKind::Approval, &new.plan, &new.scopes, Some(FOREVER))
    );
    assert_eq!((written.expired_at, &written.outcome), (None, &None));
    assert!(written.is_open());
    assert_eq!(store.ticket(&t, &new.id).await, Ok(Some(written)));

    let question = insert_ticket(store, ticket_for(&t)).await;
    assert_eq!(
        (
            question.kind,
            question.plan,
            question.scopes,
            question.expires_at
        ),
        (TicketKind::Question, None, Vec::new(), None)
    );
}

/// An operator's inbox holds every ticket of the tenant; a user's, the
/// tickets they opened that their caller answers and those a scope they
/// hold answers, never another user's own.
pub async fn list_tickets_shows_each_answerer_their_inbox(store: &dyn Store) {
    let t = tenant();
    let by = |scope: &str| AnsweredBy::Scope {
        scope: scope.to_owned(),
    };
    let open = |user: &str, answered_by: AnsweredBy| NewTicket {
        user: user.to_owned(),
        answered_by,
        ..ticket_for(&t)
    };
    let alices = insert_ticket(store, open("alice", AnsweredBy::Caller)).await;
    let bobs = insert_ticket(store, open("bob", AnsweredBy::Caller)).await;
    let approve = insert_ticket(store, open("bob", by("expenses:approve"))).await;
    let audit = insert_ticket(store, open("alice", by("expenses:audit"))).await;
    insert_ticket(store, ticket_for(&tenant())).await;
    let both = (None, None);
    assert_eq!(
        inbox(store, &t, &Answerer::Operator, both, 10).await,
        newest_first([&alices, &bobs, &approve, &audit])
    );
    assert_eq!(
        inbox(store, &t, &user("alice", &["expenses:approve"]), both, 10).await,
        newest_first([&alices, &approve]),
        "her own, and those of a scope she holds"
    );
    assert_eq!(
        inbox(store, &t, &user("bob", &[]), both, 10).await,
        newest_first([&bobs]),
        "not his own a scope answers"
    );
    assert_eq!(
        inbox(
            store,
            &t,
            &user("carol", &["expenses:audit", "expenses:approve"]),
            both,
            1
        )
        .await,
        newest_first([&approve, &audit]),
        "paged"
    );
    assert!(
        inbox(store, &t, &user("carol", &[]), both, 10)
            .await
            .is_empty()
    );
    assert!(
        inbox(
            store,
            &tenant(),
            &user("alice", &["expenses:approve"]),
            both,
            10
        )
        .await
        .is_empty()
    );
}

/// The inbox shows open or answered tickets, of one kind or both, newest
/// first, paged by its cursor.
pub async fn list_tickets_filters_open_answered_and_kind(store: &dyn Store) {
    let t = tenant();
    let mut made = Vec::new();
    for n in 0..6 {
        let kind = if n % 2 == 0 {
            TicketKind::Question
        } else {
            TicketKind::Approval
        };
        let ticket = insert_ticket(
            store,
            NewTicket {
                kind,
                ..ticket_for(&t)
            },
        )
        .await;
        made.push(ticket);
    }
    for n in [1, 2, 5] {
        let Some(Answered::Now(answered)) = answer(store, &t, &made[n].id, BASE + 1).await else {
            panic!("ticket {n} is open");
        };
        made[n] = answered;
    }
    let user = user("alice", &[]);
    for shown in [None, Some(TicketShown::Open), Some(TicketShown::Answered)] {
        for kind in [None, Some(TicketKind::Question), Some(TicketKind::Approval)] {
            let expected = newest_first(made.iter().filter(|t| {
                let shows = match shown {
                    None => true,
                    Some(TicketShown::Open) => t.is_open(),
                    Some(TicketShown::Answered) => !t.is_open(),
                };
                shows && kind.is_none_or(|k| t.kind == k)
            }));
            for (answerer, limit) in [(&Answerer::Operator, 2), (&user, 1), (&user, 100)] {
                assert_eq!(
                    inbox(store, &t, answerer, (shown, kind), limit).await,
                    expected,
                    "{shown:?} {kind:?} by {limit}"
                );
            }
        }
    }
}

/// expire_tickets expires the open tickets whose expiry passed, at most
/// the limit, once; an expired ticket is answered no more, shows among the
/// answered, and may be settled.
pub async fn expired_tickets_are_no_longer_answered(store: &dyn Store) {
    let t = tenant();
    let expiring = |at: Option<i64>| NewTicket {
        expires_at: at,
        ..ticket_for(&t)
    };
    let due = insert_ticket(store, expiring(Some(EXPIRY + 1))).await;
    let due_too = insert_ticket(store, expiring(Some(EXPIRY + 10))).await;
    let later = insert_ticket(store, expiring(Some(EXPIRY + 1000))).await;
    let never = insert_ticket(store, expiring(None)).await;
    let answered = insert_ticket(store, expiring(Some(EXPIRY + 1))).await;
    answer(store, &t, &answered.id, BASE + 1)
        .await
        .expect("answered");

    let now = EXPIRY + 10;
    let mut expired = Vec::new();
    loop {
        let batch = store.expire_tickets(now, 1).await.expect("expire_tickets");
        assert!(batch.len() <= 1, "at most the limit: {batch:?}");
        if batch.is_empty() {
            break;
        }
        expired.extend(batch.into_iter().filter(|x| x.tenant == t));
    }
    assert_eq!(newest_first(&expired), newest_first([&due, &due_too]));
    for ticket in &expired {
        assert_eq!((ticket.expired_at, &ticket.answer), (Some(now), &None));
        assert!(!ticket.is_open());
    }
    let again = store.expire_tickets(now, 1000).await.expect("expire again");
    assert!(
        again.iter().all(|x| x.tenant != t),
        "expired once: {again:?}"
    );

    let read = store.ticket(&t, &due.id).await.expect("ticket");
    let expired_due = read.expect("kept");
    assert_eq!(expired_due.expired_at, Some(now));
    assert_eq!(
        answer(store, &t, &due.id, now + 1).await,
        Some(Answered::Already(expired_due.clone())),
        "an expired ticket is not answered"
    );
    assert_eq!(store.ticket(&t, &due.id).await, Ok(Some(expired_due)));
    assert!(matches!(
        answer(store, &t, &later.id, now + 1).await,
        Some(Answered::Now(_))
    ));
    assert!(matches!(
        answer(store, &t, &never.id, now + 1).await,
        Some(Answered::Now(_))
    ));
    let both = (None, None);
    let open = inbox(
        store,
        &t,
        &Answerer::Operator,
        (Some(TicketShown::Open), None),
        10,
    )
    .await;
    assert!(open.is_empty(), "{open:?}");
    assert_eq!(
        inbox(
            store,
            &t,
            &Answerer::Operator,
            (Some(TicketShown::Answered), None),
            10
        )
        .await,
        inbox(store, &t, &Answerer::Operator, both, 10).await
    );
    let settled = settle(store, &t, &due_too.id, &outcome()).await;
    assert_eq!(settled.and_then(|s| s.outcome), Some(outcome()));
}

/// A ticket answered (or expired) gets one outcome: the first is kept; an
/// open ticket, another tenant's or a missing one gets none.
pub async fn a_ticket_is_settled_once(store: &dyn Store) {
    let t = tenant();
    let ticket = insert_ticket(store, ticket_for(&t)).await;
    assert_eq!(
        settle(store, &t, &ticket.id, &outcome()).await,
        None,
        "open"
    );
    assert_eq!(
        store
            .ticket(&t, &ticket.id)
            .await
            .expect("ticket")
            .and_then(|t| t.outcome),
        None
    );
    let Some(Answered::Now(answered)) = answer(store, &t, &ticket.id, BASE + 1).await else {
        panic!("an open ticket is answered");
    };
    assert_eq!(settle(store, &tenant(), &ticket.id, &outcome()).await, None);
    assert_eq!(settle(store, &t, &new_id(), &outcome()).await, None);
    let first = settle(store, &t, &ticket.id, &outcome())
        .await
        .expect("settled");
    assert_eq!(
        first,
        TicketRecord {
            outcome: Some(outcome()),
            ..answered
        }
    );
    let rejected = Envelope::ok(
        toolfleet_core::Json::from(json!({"rejected": true})),
        "call-2",
    );
    assert_eq!(
        settle(store, &t, &ticket.id, &rejected).await,
        Some(first.clone()),
        "the first outcome is kept"
    );
    assert_eq!(store.ticket(&t, &ticket.id).await, Ok(Some(first)));
}

/// unsettled_tickets answers the answered tickets without an outcome,
/// answered before a time, oldest first, at most the limit.
pub async fn unsettled_tickets_are_answered_tickets_without_an_outcome(store: &dyn Store) {
    let t = tenant();
    let mut made = Vec::new();
    for _ in 0..4 {
        made.push(insert_ticket(store, ticket_for(&t)).await);
    }
    // Answered out of their order of making; the last stays open.
    for (n, at) in [(0, EARLY + 3), (1, EARLY + 1), (2, EARLY + 2)] {
        answer(store, &t, &made[n].id, at).await.expect("answered");
    }
    let unsettled = |before: i64, limit: u32| async move {
        let tickets = store
            .unsettled_tickets(before, limit)
            .await
            .expect("unsettled_tickets");
        assert!(tickets.len() <= limit as usize);
        assert!(tickets.iter().all(|x| {
            x.answer.is_some() && x.outcome.is_none() && x.answered_at.is_some_and(|a| a < before)
        }));
        assert!(
            tickets
                .windows(2)
                .all(|w| w[0].answered_at <= w[1].answered_at),
            "oldest first: {tickets:?}"
        );
        tickets
    };
    let mine = |tickets: Vec<TicketRecord>| -> Vec<String> {
        tickets
            .into_iter()
            .filter(|x| x.tenant == t)
            .map(|x| x.id)
            .collect()
    };
    let ids = |ns: &[usize]| -> Vec<String> { ns.iter().map(|&n| made[n].id.clone()).collect() };
    assert_eq!(mine(unsettled(EARLY + 10, 1000).await), ids(&[1, 2, 0]));
    assert_eq!(mine(unsettled(EARLY + 3, 1000).await), ids(&[1, 2]));
    assert_eq!(unsettled(EARLY + 10, 1).await.len(), 1);
    settle(store, &t, &made[2].id, &outcome())
        .await
        .expect("settled");
    assert_eq!(mine(unsettled(EARLY + 10, 1000).await), ids(&[1, 0]));
    // Settled, so later runs of the suite do not find them.
    for n in [0, 1] {
        settle(store, &t, &made[n].id, &outcome())
            .await
            .expect("settled");
    }
    assert!(mine(unsettled(EARLY + 10, 1000).await).is_empty());
}

// Retention.

/// `prune` deletes, of each kind, what settled before its time and nothing
/// else: settled jobs (freeing their idempotency keys), answered and
/// expired tickets, stopped runs, audit records; never an unsettled job, an
/// open ticket or a running run, nor anything settled since. At most its
/// limit a call, oldest first. Works before every other test's times.
pub async fn prune_deletes_only_what_settled_before_its_time(store: &dyn Store) {
    use crate::{Prune, Retained};
    let t = tenant();
    let old = EARLY - 10_000;
    let cut = EARLY;
    let prune = |kind: Retained, limit: u32| async move {
        store
            .prune(Prune {
                kind,
                before: cut,
                limit,
            })
            .await
            .expect("prune")
    };

    // Jobs: two settled long ago (one keyed), one settled after the cut,
    // one never settled.
    let job = |key: Option<&str>| super::job_for(&t, "ocr", json!({}), key, old);
    let keyed = super::insert(store, job(Some("nightly"))).await;
    let other = super::insert(store, job(None)).await;
    for (done, at) in [(&keyed, old + 1), (&other, old + 2)] {
        super::claim(store, &done.id, "w1", at)
            .await
            .expect("claimed");
        super::succeed(
            store,
            &super::lease(&done.id, "w1", 1),
            &super::result_doc(),
            at,
        )
        .await;
    }
    let recent = super::insert(store, job(None)).await;
    super::claim(store, &recent.id, "w1", old)
        .await
        .expect("claimed");
    super::succeed(
        store,
        &super::lease(&recent.id, "w1", 1),
        &super::result_doc(),
        cut + 1,
    )
    .await;
    let waiting = super::insert(store, job(None)).await;
    // Settled long ago, but a run still waits on it: it stays.
    let awaited = super::insert(store, job(None)).await;
    super::claim(store, &awaited.id, "w1", old)
        .await
        .expect("claimed");
    let held = super::lease(&awaited.id, "w1", 1);
    super::succeed(store, &held, &super::result_doc(), old).await;
    let wait = RunWait {
        wait_for: WaitFor::All,
        jobs: vec![awaited.id.clone()],
        tickets: vec![format!("t_{}", new_id())],
    };
    let run_waiting = new_run(store, run_for(&t)).await;
    update(store, park(&run_waiting.id, &wait, old + 5))
        .await
        .expect("waiting");
    assert_eq!(
        prune(Retained::Jobs, 1).await,
        1,
        "one a call at a limit of 1"
    );
    assert_eq!(read_job(store, &keyed.id).await, None, "the oldest first");
    assert!(read_job(store, &other.id).await.is_some());
    assert_eq!(prune(Retained::Jobs, 1000).await, 1);
    assert_eq!(prune(Retained::Jobs, 1000).await, 0, "nothing more");
    assert_eq!(read_job(store, &other.id).await, None);
    assert!(read_job(store, &recent.id).await.is_some(), "settled since");
    assert!(
        read_job(store, &waiting.id).await.is_some(),
        "never settled"
    );
    assert!(
        read_job(store, &awaited.id).await.is_some(),
        "a waiting run names it"
    );
    // The key names nothing now: the same key makes a new job.
    let again = store
        .insert_job(job(Some("nightly")))
        .await
        .expect("insert_job");
    assert!(matches!(again, crate::Inserted::Created(_)), "{again:?}");

    // Tickets: answered and expired long ago, answered since, still open.
    let ticket = |expires_at: Option<i64>| NewTicket {
        expires_at,
        now: old,
        ..ticket_for(&t)
    };
    let answered = insert_ticket(store, ticket(None)).await;
    answer(store, &t, &answered.id, old + 1)
        .await
        .expect("answered");
    let expired = insert_ticket(store, ticket(Some(old + 1))).await;
    let gone = store
        .expire_tickets(old + 2, 1000)
        .await
        .expect("expire_tickets");
    assert!(gone.iter().any(|g| g.id == expired.id), "{gone:?}");
    let later = insert_ticket(store, ticket(None)).await;
    answer(store, &t, &later.id, cut + 1)
        .await
        .expect("answered");
    let open = insert_ticket(store, ticket(None)).await;
    assert_eq!(prune(Retained::Tickets, 1000).await, 2);
    let tenant_id = t.as_str();
    let read = |id: String| async move { store.ticket(tenant_id, &id).await.expect("ticket") };
    assert!(read(answered.id.clone()).await.is_none());
    assert!(read(expired.id.clone()).await.is_none());
    assert!(read(later.id.clone()).await.is_some(), "answered since");
    assert!(read(open.id.clone()).await.is_some(), "open");

    // Runs: stopped long ago in each way, stopped since, still running.
    let run = || NewRun {
        now: old,
        ..run_for(&t)
    };
    let mut stopped = Vec::new();
    for state in RunState::STOPPED {
        let made = new_run(store, run()).await;
        update(
            store,
            UpdateRun::new(&made.id, &[RunState::Running], state, old + 1),
        )
        .await
        .expect("stopped");
        stopped.push(made.id);
    }
    let since = new_run(store, run()).await;
    update(
        store,
        UpdateRun::new(&since.id, &[RunState::Running], RunState::Failed, cut + 1),
    )
    .await
    .expect("stopped");
    let running = new_run(store, run()).await;
    assert_eq!(
        prune(Retained::Runs, 1000).await,
        RunState::STOPPED.len() as u64
    );
    for id in &stopped {
        assert_eq!(read_run(store, id).await, None, "{id}");
    }
    assert!(read_run(store, &since.id).await.is_some(), "stopped since");
    assert!(read_run(store, &running.id).await.is_some(), "running");

    // Audit records: before the cut and after.
    let at = u64::try_from(old).expect("after 1970");
    let first = super::audit_record(&t, at, "ok", None);
    let kept = super::audit_record(&t, u64::try_from(cut).expect("after 1970"), "ok", None);
    store
        .append_audit(&[first, kept.clone()])
        .await
        .expect("append_audit");
    assert_eq!(prune(Retained::Audit, 1000).await, 1);
    assert_eq!(store.audit(&t, 10).await.expect("audit"), vec![kept]);
}

async fn read_job(store: &dyn Store, id: &str) -> Option<crate::JobRecord> {
    store.job_by_id(id).await.expect("job_by_id")
}

// Rate limits.

/// `take_token` lets a burst through, then one call each interval, and
/// says how long a refused call waits; buckets are their own; concurrent
/// takes never pass more than the bucket holds.
pub async fn a_token_bucket_lets_its_burst_then_its_rate_through(store: &dyn Store) {
    use crate::TakeToken;
    let key = format!("[\"{}\",\"ocr\"]", tenant());
    let take = |key: String, now: i64| async move {
        store
            .take_token(TakeToken {
                key: &key,
                now,
                interval: 1_000,
                burst: 3,
            })
            .await
            .expect("take_token")
    };
    for _ in 0..3 {
        assert_eq!(take(key.clone(), BASE).await, None, "the burst");
    }
    assert_eq!(
        take(key.clone(), BASE).await,
        Some(1_000),
        "one interval to wait"
    );
    assert_eq!(take(key.clone(), BASE + 400).await, Some(600));
    assert_eq!(
        take(key.clone(), BASE + 1_000).await,
        None,
        "one more an interval later"
    );
    assert_eq!(take(key.clone(), BASE + 1_000).await, Some(1_000));
    let other = format!("[\"{}\",\"ocr\"]", tenant());
    assert_eq!(take(other, BASE).await, None, "another bucket is full");

    let shared = format!("[\"{}\",\"mail\"]", tenant());
    let takes = (0..20).map(|_| take(shared.clone(), BASE));
    let passed = futures_util::future::join_all(takes)
        .await
        .into_iter()
        .filter(Option::is_none)
        .count();
    assert_eq!(passed, 3, "at once, no more than the burst");
}

/// A schedule's record is made once, moves on only from the tick its
/// mover read (one of several movers wins each tick), keeps its last job
/// across a skipped tick, and takes no tick while paused; resumed, it
/// counts from then.
pub async fn a_schedule_moves_one_tick_at_a_time_by_compare_and_set(store: &dyn Store) {
    use crate::AdvanceSchedule;
    let name = format!("nightly_{}", new_id());
    let advance = |from: Option<i64>, to: i64, job: Option<&'static str>| {
        let name = name.clone();
        async move {
            store
                .advance_schedule(AdvanceSchedule {
                    name: &name,
                    from,
                    to,
                    job,
                    now: to + 5,
                })
                .await
                .expect("advance_schedule")
        }
    };
    let record = |name: String| async move {
        store
            .schedules()
            .await
            .expect("schedules")
            .into_iter()
            .find(|s| s.name == name)
    };
    assert_eq!(
        record(name.clone()).await,
        None,
        "no record before it is seen"
    );
    assert!(advance(None, BASE, None).await, "the first sight makes it");
    assert!(!advance(None, BASE + 7, None).await, "made once");
    let first = record(name.clone()).await.expect("the record");
    assert_eq!(
        (first.last_tick, first.last_job.as_deref(), first.paused),
        (BASE, None, false)
    );

    let movers = (0..8).map(|_| advance(Some(BASE), BASE + 1_000, Some("j_tick1")));
    let moved = futures_util::future::join_all(movers)
        .await
        .into_iter()
        .filter(|moved| *moved)
        .count();
    assert_eq!(moved, 1, "one of several movers wins a tick");
    assert!(
        !advance(Some(BASE), BASE + 2_000, None).await,
        "from a tick gone by"
    );
    assert!(
        advance(Some(BASE + 1_000), BASE + 2_000, None).await,
        "a tick skipped"
    );
    let skipped = record(name.clone()).await.expect("the record");
    assert_eq!(skipped.last_tick, BASE + 2_000);
    assert_eq!(
        skipped.last_job.as_deref(),
        Some("j_tick1"),
        "a skip keeps the last job"
    );
    assert_eq!(skipped.updated_at, BASE + 2_005);

    let paused = store
        .pause_schedule(&name, true, BASE + 2_500)
        .await
        .expect("pause");
    assert!(paused.paused);
    assert_eq!(
        paused.last_tick,
        BASE + 2_000,
        "pausing keeps the last tick"
    );
    assert!(
        !advance(Some(BASE + 2_000), BASE + 3_000, Some("j_tick3")).await,
        "no tick while paused"
    );
    let resumed = store
        .pause_schedule(&name, false, BASE + 9_000)
        .await
        .expect("resume");
    assert!(!resumed.paused);
    assert_eq!(
        resumed.last_tick,
        BASE + 9_000,
        "resumed, it counts from then"
    );
    assert_eq!(resumed.last_job.as_deref(), Some("j_tick1"));
    assert!(advance(Some(BASE + 9_000), BASE + 10_000, Some("j_tick10")).await);

    let unseen = format!("weekly_{}", new_id());
    let made = store
        .pause_schedule(&unseen, true, BASE)
        .await
        .expect("pause of a schedule never seen");
    assert_eq!(
        (made.last_tick, made.paused, made.last_job),
        (BASE, true, None)
    );
    let moved = store
        .advance_schedule(AdvanceSchedule {
            name: &unseen,
            from: Some(BASE),
            to: BASE + 1_000,
            job: None,
            now: BASE + 1_000,
        })
        .await
        .expect("advance_schedule");
    assert!(!moved, "a schedule paused before it was seen takes no tick");
}
