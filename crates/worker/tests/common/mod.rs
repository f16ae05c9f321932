//! What the in-process flow-control tests share: a store, broker and
//! notices of their own, a runtime whose jobs go to them, and a worker of
//! a pool on them.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use toolfleet_broker::memory::{MemoryBroker, MemoryNotices};
use toolfleet_core::{JobState, Runtime, RuntimeConfig};
use toolfleet_fleet::Dispatcher;
use toolfleet_store::sqlite::SqliteStore;
use toolfleet_store::{JobRecord, Store};
use toolfleet_worker::{Worker, WorkerConfig};

/// An in-process fleet: SQLite in memory, the in-process queue and notices.
pub(crate) struct Rig {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) broker: MemoryBroker,
    pub(crate) notices: MemoryNotices,
}

impl Rig {
    pub(crate) async fn new() -> Rig {
        Rig {
            store: Arc::new(SqliteStore::open_in_memory().await.expect("sqlite")),
            broker: MemoryBroker::new(),
            notices: MemoryNotices::new(),
        }
    }

    /// A runtime of `config` whose jobs are submitted to this fleet.
    pub(crate) fn runtime(&self, config: RuntimeConfig) -> Runtime {
        let dispatcher = Dispatcher::new(
            self.store.clone(),
            Arc::new(self.broker.clone()),
            Arc::new(self.notices.clone()),
        );
        Runtime::builder()
            .config(config)
            .fleet(Arc::new(dispatcher))
            .build()
    }

    /// A worker of `config` on this fleet.
    pub(crate) fn worker(&self, config: WorkerConfig, runtime: &Arc<Runtime>) -> Arc<Worker> {
        Worker::new(
            config,
            runtime.clone(),
            self.store.clone(),
            Arc::new(self.broker.clone()),
            Arc::new(self.notices.clone()),
        )
    }

    /// Runs `worker` until the sender answered is dropped or sent `true`.
    pub(crate) fn start(&self, worker: &Arc<Worker>) -> watch::Sender<bool> {
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(worker.clone().run(stopped, Duration::from_secs(1)));
        stop
    }

    /// Waits (at most `limit`) until job `id` is in `state`; never in a
    /// state it cannot leave for it.
    pub(crate) async fn until(&self, id: &str, state: JobState, limit: Duration) -> JobRecord {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let job = self.store.job_by_id(id).await.unwrap().expect("the job");
            if job.state == state {
                return job;
            }
            assert!(
                tokio::time::Instant::now() < deadline && job.state != JobState::Failed,
                "job never reached {state} within {limit:?}: {job:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
