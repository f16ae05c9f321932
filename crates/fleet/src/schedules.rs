//! Schedules: `[[schedules]]` start a job of a tool at each tick of a cron
//! expression, read in an IANA time zone, as the principal the schedule
//! names.
//!
//! Every dispatching process runs [`run_schedules`]; exactly one job is
//! made per tick however many run it:
//! - the job a tick starts is keyed by the schedule and the tick
//!   (`schedule:<name>:<tick ms>`), so two processes starting one tick get
//!   the same job from the store;
//! - the store's record of the schedule ([`ScheduleRecord`]) moves from one
//!   tick to the next by compare-and-set ([`Store::advance_schedule`]), so
//!   one process records each tick, and none handles a tick twice;
//! - the job is made before the record moves, so a process that stops
//!   between the two leaves the tick to the next one, which finds the job
//!   made.
//!
//! A tick is on time for [`GRACE`] after it; one older was missed (every
//! dispatcher was down, or the store was): `catch_up = "last"` starts the
//! latest missed tick once, `"none"` starts none of them. With `overlap =
//! "skip"`, a tick whose previous job has not settled starts nothing. Ticks
//! follow the time zone's clock: a time a daylight-saving change skips
//! runs at the first time after the change, and a time it repeats runs
//! once (croner's rules; an expression of every minute or second runs in
//! both repeated hours).

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use croner::Cron;
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::sync::watch;
use toolfleet_core::{CallCtx, Envelope, Principal, Runtime, new_id, now_ms};
use toolfleet_store::{AdvanceSchedule, ScheduleRecord, Store, StoreError};

/// How late a tick may be started and still be on time; an older one was
/// missed, and `catch_up` decides.
pub const GRACE: Duration = Duration::from_secs(10);
/// The longest a dispatcher waits between two looks at its schedules.
pub const LOOK: Duration = Duration::from_secs(1);
/// The longest schedule name.
pub const MAX_NAME: usize = 64;
/// Ticks one pass handles per schedule at most (on-time ticks pile up only
/// for expressions of every second with the store slow).
const MAX_STEPS: usize = 64;

/// What a tick does while the previous tick's job has not settled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Start nothing: the tick is skipped.
    #[default]
    Skip,
    /// Start the tick's job anyway.
    Allow,
}

/// What is started of the ticks missed while every dispatcher was down.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatchUp {
    /// The latest missed tick, once.
    #[default]
    Last,
    /// None of them.
    None,
}

/// Who a schedule's jobs run as: `principal = { tenant, user, scopes }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalSpec {
    /// The tenant its jobs belong to.
    pub tenant: String,
    /// The user they are made by.
    pub user: String,
    /// The scopes the calls hold.
    #[serde(default)]
    pub scopes: Vec<String>,
}

/// One `[[schedules]]` entry, as configured.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Unique among the schedules: letters, digits, `_`, `-` and `.`.
    pub name: String,
    /// A cron expression of 5 fields, or 6 with seconds first (croner's
    /// syntax, with `L`, `W`, `#` and `@daily`-style nicknames).
    pub cron: String,
    /// The IANA time zone the expression is read in.
    #[serde(default = "utc")]
    pub timezone: String,
    /// The job or agent tool each tick calls.
    pub tool: String,
    /// The arguments of each call.
    #[serde(default = "empty_args")]
    pub args: Value,
    /// Who the calls are made as.
    pub principal: PrincipalSpec,
    /// What a tick does while the previous job runs.
    #[serde(default)]
    pub overlap: Overlap,
    /// What is started of ticks missed while every dispatcher was down.
    #[serde(default)]
    pub catch_up: CatchUp,
}

fn utc() -> String {
    "UTC".to_owned()
}

fn empty_args() -> Value {
    Value::Object(Map::new())
}

/// A schedule ready to tick: its spec, its expression and its time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// As configured.
    pub spec: ScheduleSpec,
    /// Who its jobs run as.
    pub principal: Arc<Principal>,
    cron: Cron,
    zone: chrono_tz::Tz,
}

impl Schedule {
    /// The schedule `spec` describes, or what is wrong with it, naming the
    /// field.
    pub fn new(spec: ScheduleSpec) -> Result<Schedule, String> {
        let name = spec.name.clone();
        let good_name = !name.is_empty()
            && name.len() <= MAX_NAME
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !good_name {
            return Err(format!(
                "schedules: name {name:?} must be 1 to {MAX_NAME} letters, digits, `_`, `-` or `.`"
            ));
        }
        let cron = Cron::from_str(&spec.cron).map_err(|e| {
            format!(
                "schedules.{name}.cron: {:?} is not a cron expression ({e}); give 5 fields \
                 (minute hour day month weekday) or 6 with seconds first",
                spec.cron
            )
        })?;
        let zone = chrono_tz::Tz::from_str(&spec.timezone).map_err(|_| {
            format!(
                "schedules.{name}.timezone: {:?} is not an IANA time zone (such as \
                 \"Europe/Berlin\" or \"UTC\")",
                spec.timezone
            )
        })?;
        if !spec.args.is_object() {
            return Err(format!(
                "schedules.{name}.args: the arguments must be a table"
            ));
        }
        let principal = &spec.principal;
        if principal.tenant.is_empty() || principal.user.is_empty() {
            return Err(format!(
                "schedules.{name}.principal: tenant and user must not be empty"
            ));
        }
        let principal = Arc::new(Principal::new(
            &principal.tenant,
            &principal.user,
            principal.scopes.iter().cloned(),
        ));
        let schedule = Schedule {
            spec,
            principal,
            cron,
            zone,
        };
        if schedule.next_after(now_ms()).is_none() {
            let cron = &schedule.spec.cron;
            return Err(format!("schedules.{name}.cron: {cron:?} never ticks"));
        }
        Ok(schedule)
    }

    /// The schedule's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// `ms` in the schedule's time zone, to the whole second (ticks fall
    /// on whole seconds).
    fn local(&self, ms: i64) -> Option<DateTime<chrono_tz::Tz>> {
        Utc.timestamp_opt(ms.div_euclid(1_000), 0)
            .single()
            .map(|t| t.with_timezone(&self.zone))
    }

    /// The first tick strictly after `ms` (Unix milliseconds).
    pub fn next_after(&self, ms: i64) -> Option<i64> {
        let after = self.local(ms)?;
        let next = self.cron.find_next_occurrence(&after, false).ok()?;
        Some(next.timestamp_millis())
    }

    /// The latest tick at or before `ms`.
    pub fn latest_at_or_before(&self, ms: i64) -> Option<i64> {
        let before = self.local(ms)?;
        let latest = self.cron.find_previous_occurrence(&before, true).ok()?;
        Some(latest.timestamp_millis())
    }

    /// The next `n` ticks after `ms`.
    pub fn upcoming(&self, ms: i64, n: usize) -> Vec<i64> {
        let mut ticks = Vec::with_capacity(n);
        let mut at = ms;
        while ticks.len() < n {
            match self.next_after(at) {
                Some(next) => {
                    ticks.push(next);
                    at = next;
                }
                None => break,
            }
        }
        ticks
    }

    /// What to do next with this schedule, whose record is `record`, at
    /// `now`; `None`: nothing until a later tick.
    pub fn step(&self, record: Option<&ScheduleRecord>, now: i64) -> Option<Step> {
        let Some(record) = record else {
            return Some(Step::Begin);
        };
        if record.paused {
            return None;
        }
        let next = self.next_after(record.last_tick)?;
        if next > now {
            return None;
        }
        let grace = i64::try_from(GRACE.as_millis()).unwrap_or(i64::MAX);
        if now - next <= grace {
            return Some(Step::Run(next));
        }
        // Missed: the latest missed tick stands for all of them.
        let latest = self
            .latest_at_or_before(now - grace)
            .unwrap_or(next)
            .max(next);
        Some(match self.spec.catch_up {
            CatchUp::Last => Step::Run(latest),
            CatchUp::None => Step::Skip(latest),
        })
    }

    /// The idempotency key of the job tick `tick` makes.
    pub fn key(&self, tick: i64) -> String {
        format!("schedule:{}:{tick}", self.spec.name)
    }
}

/// What [`Schedule::step`] decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The schedule has no record: make one, its ticks counting from now.
    Begin,
    /// Start the job of this tick.
    Run(i64),
    /// Move past this tick (and every one before it) starting nothing.
    Skip(i64),
}

/// What a pass did with one tick of one schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ticked {
    /// The tick started this job (or found it started).
    Started {
        /// The schedule.
        schedule: String,
        /// The tick, in Unix milliseconds.
        tick: i64,
        /// The job.
        job_id: String,
    },
    /// The tick started nothing: missed with `catch_up = "none"`, its
    /// previous job still running with `overlap = "skip"`, or its call
    /// refused.
    Skipped {
        /// The schedule.
        schedule: String,
        /// The tick, in Unix milliseconds.
        tick: i64,
        /// Why.
        reason: String,
    },
}

/// The schedules of a configuration, and where they tick.
pub struct Ticker {
    /// The store their records and jobs are in.
    pub store: Arc<dyn Store>,
    /// The runtime their calls go through.
    pub runtime: Arc<Runtime>,
    /// The schedules.
    pub schedules: Arc<[Schedule]>,
}

impl Ticker {
    /// One look at every schedule at `now`: starts what is due, moves each
    /// record on, and says what it did. A schedule whose store call failed
    /// is left for the next look.
    pub async fn pass(&self, now: i64) -> Result<Vec<Ticked>, StoreError> {
        let mut records: HashMap<String, ScheduleRecord> = self
            .store
            .schedules()
            .await?
            .into_iter()
            .map(|record| (record.name.clone(), record))
            .collect();
        let mut done = Vec::new();
        for schedule in self.schedules.iter() {
            let mut record = records.remove(schedule.name());
            for _ in 0..MAX_STEPS {
                let Some(step) = schedule.step(record.as_ref(), now) else {
                    break;
                };
                match self.take(schedule, record.as_ref(), step, now).await {
                    Ok(Taken::Done(ticked)) => done.extend(ticked),
                    // The call may succeed later: the next look tries again.
                    Ok(Taken::Later) => break,
                    Err(error) => {
                        tracing::warn!(schedule = %schedule.name(), %error, "a schedule's tick waits for the store");
                        break;
                    }
                }
                record = self.record(schedule.name()).await?;
            }
        }
        Ok(done)
    }

    /// The record of schedule `name`, read again.
    async fn record(&self, name: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        Ok(self
            .store
            .schedules()
            .await?
            .into_iter()
            .find(|record| record.name == name))
    }

    /// Takes `step` of `schedule`, whose record was `record`.
    async fn take(
        &self,
        schedule: &Schedule,
        record: Option<&ScheduleRecord>,
        step: Step,
        now: i64,
    ) -> Result<Taken, StoreError> {
        let from = record.map(|r| r.last_tick);
        let name = schedule.name();
        let skipped = |tick: i64, reason: &str| Ticked::Skipped {
            schedule: name.to_owned(),
            tick,
            reason: reason.to_owned(),
        };
        let (tick, job, ticked) = match step {
            Step::Begin => (now, None, None),
            Step::Skip(tick) => (tick, None, Some(skipped(tick, "missed"))),
            Step::Run(tick) => match self.start(schedule, record, tick).await? {
                Start::Started(job_id) => {
                    let ticked = Ticked::Started {
                        schedule: name.to_owned(),
                        tick,
                        job_id: job_id.clone(),
                    };
                    (tick, Some(job_id), Some(ticked))
                }
                Start::Overlapping => (tick, None, Some(skipped(tick, "overlap"))),
                Start::Refused(reason) => (tick, None, Some(skipped(tick, &reason))),
                Start::Later => return Ok(Taken::Later),
            },
        };
        let moved = self
            .store
            .advance_schedule(AdvanceSchedule {
                name,
                from,
                to: tick,
                job: job.as_deref(),
                now: now_ms(),
            })
            .await?;
        if moved {
            match &ticked {
                Some(Ticked::Started { job_id, .. }) => {
                    tracing::info!(schedule = %name, tick, job_id = %job_id, "schedule ticked");
                }
                Some(Ticked::Skipped { reason, .. }) => {
                    tracing::info!(schedule = %name, tick, %reason, "schedule tick skipped");
                }
                None => {}
            }
            return Ok(Taken::Done(ticked));
        }
        // Another process moved it first. If it skipped this very tick while
        // this one started its job, the record names the job, so that the
        // next tick's overlap sees it.
        if let (Some(job_id), Some(now_at)) = (&job, self.record(name).await?)
            && now_at.last_tick == tick
            && now_at.last_job.as_deref() != Some(job_id)
        {
            self.store
                .advance_schedule(AdvanceSchedule {
                    name,
                    from: Some(tick),
                    to: tick,
                    job: Some(job_id),
                    now: now_ms(),
                })
                .await?;
        }
        Ok(Taken::Done(None))
    }

    /// Starts the job of `tick` unless its previous one overlaps.
    async fn start(
        &self,
        schedule: &Schedule,
        record: Option<&ScheduleRecord>,
        tick: i64,
    ) -> Result<Start, StoreError> {
        let tenant = &schedule.principal.tenant;
        if schedule.spec.overlap == Overlap::Skip
            && let Some(last) = record.and_then(|r| r.last_job.as_deref())
            && let Some(job) = self.store.job(tenant, last).await?
            && !job.state.is_settled()
        {
            return Ok(Start::Overlapping);
        }
        let mut ctx =
            CallCtx::new(schedule.principal.clone()).with_idempotency_key(schedule.key(tick));
        ctx.run_id = new_id();
        let spec = &schedule.spec;
        match self
            .runtime
            .invoke(&spec.tool, spec.args.clone(), &ctx)
            .await
        {
            Envelope::Running { job_id, .. } => Ok(Start::Started(job_id)),
            Envelope::Error { error, .. } if error.retryable => {
                tracing::warn!(schedule = %spec.name, tick, code = %error.code, message = %error.message, "a schedule's call will be made again");
                Ok(Start::Later)
            }
            Envelope::Error { error, .. } => {
                tracing::warn!(schedule = %spec.name, tick, code = %error.code, message = %error.message, "a schedule's call was refused; the tick is skipped");
                Ok(Start::Refused(format!("{}: {}", error.code, error.message)))
            }
            other => Ok(Start::Refused(format!(
                "`{}` answered {} instead of starting a job",
                spec.tool,
                other.status()
            ))),
        }
    }

    /// How long to wait before the next look: until the soonest tick of a
    /// schedule not paused, at most [`LOOK`].
    async fn wait(&self, now: i64) -> Duration {
        let soonest = self
            .schedules
            .iter()
            .filter_map(|schedule| schedule.next_after(now))
            .min();
        let until = soonest.map_or(LOOK, |tick| {
            Duration::from_millis(u64::try_from(tick - now).unwrap_or(0))
        });
        until.clamp(Duration::from_millis(5), LOOK)
    }
}

/// What taking a step came to.
enum Taken {
    /// Done (by this process or another): what this one did, if anything.
    Done(Option<Ticked>),
    /// The tick's call failed in a way a later one may not: the schedule
    /// waits for the next look.
    Later,
}

/// What starting a tick's job came to.
enum Start {
    Started(String),
    Overlapping,
    Refused(String),
    /// The call failed in a way a later call may not: the tick waits.
    Later,
}

/// Looks at `ticker`'s schedules at each tick (at least every [`LOOK`])
/// until `shutdown` turns.
pub async fn run_schedules(ticker: Ticker, mut shutdown: watch::Receiver<bool>) {
    if ticker.schedules.is_empty() {
        return;
    }
    loop {
        if *shutdown.borrow() {
            return;
        }
        if let Err(error) = ticker.pass(now_ms()).await {
            tracing::warn!(%error, "schedules wait for the store");
        }
        let wait = ticker.wait(now_ms()).await;
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    fn spec(cron: &str, timezone: &str) -> ScheduleSpec {
        ScheduleSpec {
            name: "nightly".to_owned(),
            cron: cron.to_owned(),
            timezone: timezone.to_owned(),
            tool: "report".to_owned(),
            args: empty_args(),
            principal: PrincipalSpec {
                tenant: "acme".to_owned(),
                user: "scheduler".to_owned(),
                scopes: vec![],
            },
            overlap: Overlap::Skip,
            catch_up: CatchUp::Last,
        }
    }

    fn at(zone: chrono_tz::Tz, y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        let naive = NaiveDate::from_ymd_opt(y, mo, d)
            .and_then(|day| day.and_hms_opt(h, mi, 0))
            .expect("a date");
        zone.from_local_datetime(&naive)
            .earliest()
            .expect("a local time")
            .timestamp_millis()
    }

    fn utc_ms(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> i64 {
        at(chrono_tz::UTC, y, mo, d, h, mi)
    }

    fn record(last_tick: i64, paused: bool) -> ScheduleRecord {
        ScheduleRecord {
            name: "nightly".to_owned(),
            last_tick,
            last_job: None,
            paused,
            updated_at: last_tick,
        }
    }

    #[test]
    fn a_bad_spec_is_refused_naming_its_field() {
        let refused = |spec: ScheduleSpec| Schedule::new(spec).expect_err("refused");
        assert!(refused(spec("every day", "UTC")).contains("schedules.nightly.cron"));
        assert!(refused(spec("61 * * * *", "UTC")).contains("schedules.nightly.cron"));
        assert!(refused(spec("0 3 * * *", "Mars/Olympus")).contains("schedules.nightly.timezone"));
        assert!(refused(spec("0 0 30 2 *", "UTC")).contains("never ticks"));
        let mut bad_name = spec("0 3 * * *", "UTC");
        bad_name.name = "a b".to_owned();
        assert!(refused(bad_name).contains("name"));
        let mut bad_args = spec("0 3 * * *", "UTC");
        bad_args.args = Value::from(3);
        assert!(refused(bad_args).contains("schedules.nightly.args"));
        assert!(
            Schedule::new(spec("*/5 * * * * *", "UTC")).is_ok(),
            "seconds first"
        );
    }

    #[test]
    fn ticks_follow_the_time_zone_across_daylight_saving_changes() {
        let berlin = chrono_tz::Europe::Berlin;
        let daily = Schedule::new(spec("30 2 * * *", "Europe/Berlin")).expect("a schedule");
        // 29 March 2026: 02:00 becomes 03:00 in Berlin; 02:30 does not
        // exist and the tick comes at the first time after the change.
        let before = at(berlin, 2026, 3, 28, 12, 0);
        assert_eq!(daily.next_after(before), Some(utc_ms(2026, 3, 29, 1, 0)));
        // 25 October 2026: 03:00 becomes 02:00 again; 02:30 comes twice and
        // ticks once.
        let before = at(berlin, 2026, 10, 24, 12, 0);
        let ticks = daily.upcoming(before, 2);
        assert_eq!(
            ticks,
            vec![utc_ms(2026, 10, 25, 0, 30), utc_ms(2026, 10, 26, 1, 30)],
            "once on the day the hour repeats, then at 02:30 winter time"
        );
        // In UTC, 02:30 every day.
        let utc = Schedule::new(spec("30 2 * * *", "UTC")).expect("a schedule");
        assert_eq!(
            utc.next_after(utc_ms(2026, 3, 28, 12, 0)),
            Some(utc_ms(2026, 3, 29, 2, 30))
        );
    }

    #[test]
    fn a_step_runs_on_time_ticks_and_catches_up_as_told() {
        let minutely = Schedule::new(spec("* * * * *", "UTC")).expect("a schedule");
        let t0 = utc_ms(2026, 6, 1, 12, 0);
        assert_eq!(minutely.step(None, t0), Some(Step::Begin), "first seen");
        let seen = record(t0, false);
        assert_eq!(minutely.step(Some(&seen), t0 + 59_000), None, "not due");
        assert_eq!(
            minutely.step(Some(&seen), t0 + 60_000 + 4_000),
            Some(Step::Run(t0 + 60_000)),
            "late within the grace: on time"
        );
        assert_eq!(
            minutely.step(Some(&record(t0, true)), t0 + 600_000),
            None,
            "paused"
        );
        // Down for an hour: the latest missed tick, once.
        let back = t0 + 3_600_000 + 30_000;
        assert_eq!(
            minutely.step(Some(&seen), back),
            Some(Step::Run(t0 + 3_600_000)),
            "catch_up = last"
        );
        let mut none = spec("* * * * *", "UTC");
        none.catch_up = CatchUp::None;
        let none = Schedule::new(none).expect("a schedule");
        assert_eq!(
            none.step(Some(&seen), back),
            Some(Step::Skip(t0 + 3_600_000)),
            "catch_up = none"
        );
        assert_eq!(minutely.key(t0), format!("schedule:nightly:{t0}"));
    }
}
