//! Prometheus metrics of a dispatcher, in the text format of the official
//! client. Label values come from bounded sets: registered tool names (or
//! `unknown`), envelope statuses and error codes.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use toolfleet_core::Envelope;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: String,
    outcome: String,
}

/// The dispatcher's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    calls: Family<CallLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("toolfleet");
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "calls",
            "Tool calls by tool and outcome (status, or error code)",
            calls.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            calls,
        }
    }
}

impl Metrics {
    /// Counts one call; `tool` must be a registered name or `unknown`.
    pub fn call(&self, tool: &str, envelope: &Envelope) {
        let outcome = envelope
            .error_code()
            .map(|c| c.as_str())
            .unwrap_or_else(|| envelope.status());
        self.calls
            .get_or_create(&CallLabels {
                tool: tool.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        if encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}
