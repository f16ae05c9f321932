//! Webhooks: when a job settles or a ticket is answered, the call's
//! `callback_url` gets the final envelope plus `event` and `run_id`, signed
//! with `Toolfleet-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
//! "t.body">`, and retried with backoff until it answers 2xx.
//!
//! The allow-list was checked when the call was accepted; this module sends
//! only to URLs stored with a job or ticket.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::sync::watch;
use toolfleet_broker::{Event, Notices};
use toolfleet_store::Store;

/// Attempts per delivery before it is given up (and logged).
const MAX_ATTEMPTS: usize = 12;

/// The signature header value of `body` at `t`.
pub fn signature(key: &[u8], t: u64, body: &str) -> String {
    // HMAC takes keys of any length.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
    mac.update(format!("{t}.{body}").as_bytes());
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// The callback of an event's job or ticket, if the call named one.
async fn callback_of(store: &dyn Store, event: &Event) -> Option<String> {
    match event.kind.as_str() {
        "job" if event.is_settled_job() => {
            store
                .job_by_id(&event.id)
                .await
                .ok()
                .flatten()?
                .callback_url
        }
        "ticket" if event.state == "answered" => {
            store
                .ticket(&event.tenant, &event.id)
                .await
                .ok()
                .flatten()?
                .callback_url
        }
        _ => None,
    }
}

/// The body of a notice: the final envelope plus `event` and `run_id`.
pub fn notice_body(event: &Event) -> Value {
    let mut body = match &event.body {
        Value::Object(map) => Value::Object(map.clone()),
        other => json!({ "body": other }),
    };
    body["event"] = json!(format!("{}.{}", event.kind, event.state));
    body["run_id"] = json!(event.run_id);
    if event.kind == "ticket" {
        body["ticket"] = json!(event.id);
    } else {
        body["job_id"] = json!(event.id);
    }
    body
}

/// Sends notices until `stopped` turns true.
pub async fn deliver(
    store: Arc<dyn Store>,
    notices: Arc<dyn Notices>,
    client: reqwest::Client,
    key: Vec<u8>,
    mut stopped: watch::Receiver<bool>,
) {
    let Ok(mut events) = notices.subscribe().await else {
        tracing::warn!("webhooks: cannot subscribe to events");
        return;
    };
    let key = Arc::new(key);
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = stopped.changed() => None,
        };
        let Some(event) = event else { return };
        let Some(url) = callback_of(store.as_ref(), &event).await else {
            continue;
        };
        let body = notice_body(&event).to_string();
        tokio::spawn(send(client.clone(), key.clone(), url, body));
    }
}

async fn send(client: reqwest::Client, key: Arc<Vec<u8>>, url: String, body: String) {
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(120))
        .with_jitter()
        .with_max_times(MAX_ATTEMPTS)
        .build();
    loop {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let sent = client
            .post(&url)
            .header("Content-Type", "application/json")
            .header("Toolfleet-Signature", signature(&key, t, &body))
            .timeout(Duration::from_secs(10))
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => return,
            Ok(response) => tracing::warn!(%url, status = %response.status(), "webhook refused"),
            Err(error) => tracing::warn!(%url, %error, "webhook failed"),
        }
        match delays.next() {
            Some(delay) => tokio::time::sleep(delay).await,
            None => {
                tracing::error!(%url, "webhook given up after {MAX_ATTEMPTS} attempts");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
