//! Schedules through the in-process path, at times the test names: each
//! tick makes one job however many dispatchers look at once, a tick whose
//! previous job runs is skipped or not as `overlap` says, ticks missed
//! while every dispatcher was down are caught up as `catch_up` says, a
//! paused schedule makes nothing, and a call the tool refuses skips its
//! tick.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use toolfleet_broker::memory::{MemoryBroker, MemoryNotices};
use toolfleet_core::{CallCtx, Runtime, ToolDecl, ToolError};
use toolfleet_fleet::Dispatcher;
use toolfleet_fleet::schedules::{
    CatchUp, Overlap, PrincipalSpec, Schedule, ScheduleSpec, Ticked, Ticker,
};
use toolfleet_store::sqlite::SqliteStore;
use toolfleet_store::{JobFilter, ListJobs, Store};

const TENANT: &str = "acme";
/// 1 June 2026, 12:00 UTC: a whole minute.
const T0: i64 = 1_780_315_200_000;

fn spec(name: &str, cron: &str, overlap: Overlap, catch_up: CatchUp) -> ScheduleSpec {
    ScheduleSpec {
        name: name.to_owned(),
        cron: cron.to_owned(),
        timezone: "UTC".to_owned(),
        tool: "report".to_owned(),
        args: json!({"day": "today"}),
        principal: PrincipalSpec {
            tenant: TENANT.to_owned(),
            user: "scheduler".to_owned(),
            scopes: vec![],
        },
        overlap,
        catch_up,
    }
}

/// `n` tickers of `specs` over one store, each with a dispatcher of its own:
/// the tool `report` is a job no worker runs, so its jobs stay queued.
async fn tickers(n: usize, specs: Vec<ScheduleSpec>) -> (Arc<dyn Store>, Vec<Ticker>) {
    tickers_limited(n, specs, None).await
}

/// As [`tickers`], `report` limited to `limit` calls a minute when given.
async fn tickers_limited(
    n: usize,
    specs: Vec<ScheduleSpec>,
    limit: Option<u32>,
) -> (Arc<dyn Store>, Vec<Ticker>) {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().await.unwrap());
    let schedules: Arc<[Schedule]> = specs
        .into_iter()
        .map(|spec| Schedule::new(spec).expect("a schedule"))
        .collect();
    let tickers = (0..n)
        .map(|_| {
            let dispatcher = Dispatcher::new(
                store.clone(),
                Arc::new(MemoryBroker::new()),
                Arc::new(MemoryNotices::new()),
            );
            let mut runtime = Runtime::builder().fleet(Arc::new(dispatcher)).build();
            let report = ToolDecl::job("report")
                .input_schema(json!({
                    "type": "object",
                    "properties": {"day": {"type": "string"}},
                    "required": ["day"],
                    "additionalProperties": false
                }))
                .run(|_ctx: CallCtx, _args: Value| async move { Ok::<_, ToolError>(json!({})) });
            let report = match limit {
                Some(max) => report.rate_limit(toolfleet_core::RateLimit {
                    max,
                    per: std::time::Duration::from_secs(60),
                }),
                None => report,
            };
            runtime.register(report).expect("the tool registers");
            Ticker {
                store: store.clone(),
                runtime: Arc::new(runtime),
                schedules: schedules.clone(),
            }
        })
        .collect();
    (store, tickers)
}

/// Every job of the tenant: its idempotency key's tick, counted.
async fn jobs_per_tick(store: &dyn Store) -> BTreeMap<i64, usize> {
    let page = store
        .list_jobs(ListJobs {
            tenant: TENANT,
            filter: &JobFilter::default(),
            limit: 1_000,
            cursor: None,
        })
        .await
        .expect("list_jobs");
    let mut ticks = BTreeMap::new();
    for job in page.jobs {
        let key = job.idempotency_key.expect("a schedule's job has a key");
        let tick: i64 = key.rsplit(':').next().unwrap().parse().expect("a tick");
        *ticks.entry(tick).or_insert(0) += 1;
    }
    ticks
}

fn started(ticked: &[Ticked]) -> Vec<i64> {
    ticked
        .iter()
        .filter_map(|t| match t {
            Ticked::Started { tick, .. } => Some(*tick),
            Ticked::Skipped { .. } => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_dispatchers_looking_at_once_make_one_job_per_tick() {
    let every_second = spec("pulse", "* * * * * *", Overlap::Allow, CatchUp::Last);
    let (store, tickers) = tickers(3, vec![every_second]).await;
    for second in 0..=20 {
        let now = T0 + second * 1_000 + 300;
        let looks = tickers.iter().map(|ticker| ticker.pass(now));
        for ticked in futures_util::future::join_all(looks).await {
            ticked.expect("a pass");
        }
    }
    let ticks = jobs_per_tick(store.as_ref()).await;
    let expected: BTreeMap<i64, usize> = (1..=20).map(|s| (T0 + s * 1_000, 1)).collect();
    assert_eq!(
        ticks, expected,
        "one job for each tick after the first look"
    );
    let record = &store.schedules().await.unwrap()[0];
    assert_eq!(record.last_tick, T0 + 20_000);
    assert!(record.last_job.is_some());
}

#[tokio::test]
async fn a_tick_whose_previous_job_runs_is_skipped_unless_overlap_is_allowed() {
    let skip = spec("skip", "* * * * *", Overlap::Skip, CatchUp::Last);
    let allow = spec("allow", "* * * * *", Overlap::Allow, CatchUp::Last);
    let (_store, tickers) = tickers(1, vec![skip, allow]).await;
    let ticker = &tickers[0];
    ticker.pass(T0).await.unwrap();
    let first = ticker.pass(T0 + 60_500).await.unwrap();
    assert_eq!(
        started(&first),
        vec![T0 + 60_000, T0 + 60_000],
        "both start their first tick"
    );
    let second = ticker.pass(T0 + 120_500).await.unwrap();
    assert_eq!(
        started(&second),
        vec![T0 + 120_000],
        "only `allow` starts while the job waits"
    );
    assert!(
        second.iter().any(|t| matches!(t,
            Ticked::Skipped { schedule, reason, .. } if schedule == "skip" && reason == "overlap")),
        "{second:?}"
    );
}

#[tokio::test]
async fn ticks_missed_while_every_dispatcher_was_down_are_caught_up_as_configured() {
    let last = spec("last", "* * * * *", Overlap::Allow, CatchUp::Last);
    let none = spec("none", "* * * * *", Overlap::Allow, CatchUp::None);
    let (store, tickers) = tickers(1, vec![last, none]).await;
    let ticker = &tickers[0];
    ticker.pass(T0).await.unwrap();
    // Back an hour and 30 seconds later.
    let back = ticker.pass(T0 + 3_630_000).await.unwrap();
    assert_eq!(
        started(&back),
        vec![T0 + 3_600_000],
        "`last` starts the latest missed tick once"
    );
    assert!(
        back.iter().any(|t| matches!(t,
            Ticked::Skipped { schedule, tick, reason } if schedule == "none" && *tick == T0 + 3_600_000 && reason == "missed")),
        "{back:?}"
    );
    let records = store.schedules().await.unwrap();
    assert!(
        records.iter().all(|r| r.last_tick == T0 + 3_600_000),
        "{records:?}"
    );
    // The next tick is on time for both.
    let next = ticker.pass(T0 + 3_660_200).await.unwrap();
    assert_eq!(started(&next), vec![T0 + 3_660_000, T0 + 3_660_000]);
}

#[tokio::test]
async fn a_paused_schedule_makes_nothing_and_resumed_counts_from_then() {
    let minutely = spec("minutely", "* * * * *", Overlap::Allow, CatchUp::Last);
    let (store, tickers) = tickers(1, vec![minutely]).await;
    let ticker = &tickers[0];
    ticker.pass(T0).await.unwrap();
    store
        .pause_schedule("minutely", true, T0 + 1_000)
        .await
        .unwrap();
    for minute in 1..=5 {
        let ticked = ticker.pass(T0 + minute * 60_000 + 100).await.unwrap();
        assert!(ticked.is_empty(), "paused: {ticked:?}");
    }
    store
        .pause_schedule("minutely", false, T0 + 300_500)
        .await
        .unwrap();
    let ticked = ticker.pass(T0 + 300_600).await.unwrap();
    assert!(
        ticked.is_empty(),
        "the ticks while paused are not made up: {ticked:?}"
    );
    let ticked = ticker.pass(T0 + 360_100).await.unwrap();
    let records = store.schedules().await.unwrap();
    assert_eq!(
        started(&ticked),
        vec![T0 + 360_000],
        "{records:?} {ticked:?}"
    );
    assert_eq!(jobs_per_tick(store.as_ref()).await.len(), 1);
}

#[tokio::test]
async fn a_call_the_tool_refuses_skips_its_tick_saying_why() {
    let mut bad = spec("bad", "* * * * *", Overlap::Allow, CatchUp::Last);
    bad.args = json!({"day": 3});
    let (store, tickers) = tickers(1, vec![bad]).await;
    let ticker = &tickers[0];
    ticker.pass(T0).await.unwrap();
    let ticked = ticker.pass(T0 + 60_100).await.unwrap();
    match ticked.as_slice() {
        [Ticked::Skipped { tick, reason, .. }] => {
            assert_eq!(*tick, T0 + 60_000);
            assert!(reason.starts_with("invalid_arguments"), "{reason}");
        }
        other => panic!("one skipped tick: {other:?}"),
    }
    assert_eq!(store.schedules().await.unwrap()[0].last_tick, T0 + 60_000);
    assert!(jobs_per_tick(store.as_ref()).await.is_empty());
}

/// A tick whose call is refused for now (`rate_limited`) is not skipped:
/// the record stays, the pass makes that one call and stops, and a later
/// look makes the call again.
#[tokio::test]
async fn a_tick_refused_for_now_is_tried_again_at_the_next_look() {
    let minutely = spec("limited", "* * * * *", Overlap::Allow, CatchUp::Last);
    let (store, tickers) = tickers_limited(1, vec![minutely], Some(1)).await;
    let ticker = &tickers[0];
    ticker.pass(T0).await.unwrap();
    assert_eq!(
        started(&ticker.pass(T0 + 60_100).await.unwrap()),
        vec![T0 + 60_000]
    );
    let refused = ticker.pass(T0 + 120_100).await.unwrap();
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(
        store.schedules().await.unwrap()[0].last_tick,
        T0 + 60_000,
        "not skipped"
    );
    let calls = ticker.runtime.metrics().render();
    let limited = calls
        .lines()
        .find(|l| l.starts_with("toolfleet_calls_total") && l.contains("rate_limited"))
        .unwrap_or_else(|| panic!("a refused call is counted: {calls}"));
    assert!(limited.ends_with(" 1"), "one call a pass: {limited}");
}
