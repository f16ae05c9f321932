//! How a stored job reads to a client: the envelope `get_job` answers.

use toolfleet_core::{Envelope, ErrorCode, JobState, ToolError};

use crate::JobRecord;

impl JobRecord {
    /// The `get_job` envelope: `running` (with state, attempts and progress)
    /// until the job settles, then `ok` with the result or `error` with the
    /// final error and state. The lineage and the checkpoint are the
    /// fleet's own bookkeeping and never appear in it.
    pub fn envelope(&self, poll_after_s: u32) -> Envelope {
        match self.state {
            JobState::Succeeded => Envelope::ok(
                self.result
                    .clone()
                    .unwrap_or_else(|| serde_json::Value::Null.into()),
                self.call_id.clone(),
            ),
            JobState::Failed | JobState::Cancelled => Envelope::Error {
                error: self.error.clone().unwrap_or_else(|| {
                    let code = if self.state == JobState::Cancelled {
                        ErrorCode::Cancelled
                    } else {
                        ErrorCode::ToolFailed
                    };
                    ToolError::new(code, format!("job {} ended {}", self.id, self.state))
                }),
                state: Some(self.state),
            },
            state => Envelope::Running {
                job_id: self.id.clone(),
                poll_after_s,
                state: Some(state.shown()),
                attempts: Some(self.attempts),
                progress: self.progress.clone(),
                run_at: (state == JobState::Scheduled)
                    .then(|| toolfleet_core::iso8601(self.run_at)),
                waiting_for: None,
            },
        }
    }
}
