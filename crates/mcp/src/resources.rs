//! MCP resources: what a caller made that is too large or too late for a
//! tool's answer, read by URI.
//!
//! - `toolfleet://handles/{handle}`: a handle tool's whole (redacted)
//!   result, kept in the runtime's handle store; `?offset=N&limit=M` reads
//!   one page of it, as `read_handle` does (items of a list, else characters
//!   of its JSON text), the page saying `next_offset` while more remain.
//! - `toolfleet://jobs/{job_id}`: a settled job's final envelope, as
//!   `get_job` answers it (a job not settled yet is not a resource yet).
//!
//! Each is its caller's: another tenant's or user's handle or job reads
//! exactly as an unknown one (`-32002`, resource not found). Both never
//! change once they exist, so a subscription to one is accepted and never
//! has an update to send. `resources/list` names the caller's handles,
//! newest first, and on its first page its most recently made jobs that
//! settled. This module must never read anything but through the runtime's
//! handle store and the [`Jobs`] the server was given, both of which check
//! the owner.

use rmcp::ErrorData;
use rmcp::model::{Resource, ResourceContents, ResourceTemplate};
use serde_json::{Value, json};
use toolfleet_core::{
    HANDLE_URI_PREFIX, Principal, handle_uri, is_handle_id, is_job_id, read_page,
};

use crate::jobs::Jobs;

/// What every job's resource URI starts with.
pub const JOB_URI_PREFIX: &str = "toolfleet://jobs/";

/// The longest resource URI read (anything longer names no resource).
const MAX_URI: usize = 512;

/// The resource a URI names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A page of a handle: from `offset`, at most `limit` (the store's
    /// default when absent).
    Handle {
        /// The handle.
        handle: String,
        /// Where the page starts.
        offset: usize,
        /// How much it holds at most.
        limit: Option<usize>,
    },
    /// A settled job's envelope.
    Job(String),
}

/// The resource `uri` names, or why it names none (a message for `-32002`
/// or `-32602`).
pub fn parse(uri: &str) -> Result<Target, ErrorData> {
    let unknown = || not_found(uri);
    if uri.len() > MAX_URI {
        return Err(ErrorData::invalid_params(
            format!("a resource URI is at most {MAX_URI} characters"),
            None,
        ));
    }
    if let Some(rest) = uri.strip_prefix(HANDLE_URI_PREFIX) {
        let (handle, query) = rest.split_once('?').unwrap_or((rest, ""));
        if !is_handle_id(handle) {
            return Err(unknown());
        }
        let (mut offset, mut limit) = (0, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number = value.parse::<usize>().map_err(|_| {
                ErrorData::invalid_params(
                    format!(
                        "`{key}` of a handle's URI must be a whole number, not `{}`",
                        short(value)
                    ),
                    None,
                )
            })?;
            match key {
                "offset" => offset = number,
                "limit" if number > 0 => limit = Some(number),
                "limit" => {
                    return Err(ErrorData::invalid_params(
                        "`limit` must be at least 1",
                        None,
                    ));
                }
                other => {
                    return Err(ErrorData::invalid_params(
                        format!(
                            "a handle's URI takes `offset` and `limit`, not `{}`",
                            short(other)
                        ),
                        None,
                    ));
                }
            }
        }
        return Ok(Target::Handle {
            handle: handle.to_owned(),
            offset,
            limit,
        });
    }
    if let Some(id) = uri.strip_prefix(JOB_URI_PREFIX)
        && is_job_id(id)
    {
        return Ok(Target::Job(id.to_owned()));
    }
    Err(unknown())
}

fn short(text: &str) -> String {
    text.chars().take(40).collect()
}

/// `-32002`, the same for a resource that does not exist and one that is
/// another's. `uri` is at most [`MAX_URI`] long ([`parse`] checked it).
pub fn not_found(uri: &str) -> ErrorData {
    let uri: String = uri.chars().take(MAX_URI).collect();
    ErrorData::resource_not_found(
        format!(
            "no resource `{uri}` for this caller (a handle may have expired; a job is a resource once it settled)"
        ),
        Some(json!({ "uri": uri })),
    )
}

/// The templates of the resources toolfleet serves.
pub fn templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new(
            format!("{HANDLE_URI_PREFIX}{{handle}}{{?offset,limit}}"),
            "handle",
        )
        .with_title("A kept result")
        .with_description(
            "The whole result a handle tool kept (its answer gave the handle): one page per read, \
             items of a list or characters of its JSON text from `offset`, at most `limit`; \
             read again from `next_offset` until it is absent.",
        )
        .with_mime_type("application/json"),
        ResourceTemplate::new(format!("{JOB_URI_PREFIX}{{job_id}}"), "job")
            .with_title("A settled job")
            .with_description(
                "A job's final envelope once it settled, as get_job answers it: `ok` with its \
                 result, or `error`.",
            )
            .with_mime_type("application/json"),
    ]
}

/// A page of handle resources and, on the first page, recent settled jobs.
pub struct Listed {
    /// The resources of this page.
    pub resources: Vec<Resource>,
    /// The cursor of the next page, if any.
    pub next_cursor: Option<String>,
}

/// `principal`'s resources: its handles newest first from `cursor` (a
/// handle), `page` at most, and on the first page its jobs of the latest
/// `page` made that settled.
pub async fn list(
    runtime: &toolfleet_core::Runtime,
    jobs: Option<&dyn Jobs>,
    principal: &Principal,
    cursor: Option<&str>,
    page: usize,
) -> Result<Listed, ErrorData> {
    if let Some(cursor) = cursor
        && !is_handle_id(cursor)
    {
        return Err(ErrorData::invalid_params(
            "not a cursor this server gave; start again without one",
            None,
        ));
    }
    let handles = runtime
        .handles()
        .list(&principal.tenant, &principal.user, cursor, page)
        .await
        .map_err(|e| {
            ErrorData::internal_error(format!("the kept results cannot be read: {e}"), None)
        })?;
    let next_cursor = (handles.len() == page)
        .then(|| handles.last().map(|h| h.handle.clone()))
        .flatten();
    let mut resources: Vec<Resource> = handles
        .into_iter()
        .map(|meta| {
            Resource::new(handle_uri(&meta.handle), meta.handle.clone())
                .with_title(format!("The result of {}", meta.tool))
                .with_description(format!(
                    "Kept until {}; read in pages with ?offset=N&limit=M.",
                    toolfleet_core::iso8601(meta.expires_at_ms)
                ))
                .with_mime_type("application/json")
                .with_size(meta.size_bytes)
        })
        .collect();
    if cursor.is_none()
        && let Some(jobs) = jobs
    {
        let limit = u32::try_from(page).unwrap_or(u32::MAX);
        let recent = jobs.list(principal, None, limit).await.map_err(|e| {
            ErrorData::internal_error(format!("the jobs cannot be read: {e}"), None)
        })?;
        resources.extend(
            recent
                .jobs
                .into_iter()
                .filter(|j| j.state.is_settled())
                .map(|job| {
                    Resource::new(format!("{JOB_URI_PREFIX}{}", job.id), job.id.clone())
                        .with_title(format!("A {} job of {}", job.state, job.tool))
                        .with_mime_type("application/json")
                }),
        );
    }
    Ok(Listed {
        resources,
        next_cursor,
    })
}

/// Reads the resource `uri` names as `principal`.
pub async fn read(
    runtime: &toolfleet_core::Runtime,
    jobs: Option<&dyn Jobs>,
    principal: &Principal,
    uri: &str,
) -> Result<ResourceContents, ErrorData> {
    let text = match parse(uri)? {
        Target::Handle {
            handle,
            offset,
            limit,
        } => {
            let kept = runtime
                .handles()
                .get(&principal.tenant, &principal.user, &handle)
                .await
                .map_err(|e| {
                    ErrorData::internal_error(format!("the kept result cannot be read: {e}"), None)
                })?
                .ok_or_else(|| not_found(uri))?;
            read_page(&handle, &kept.value, offset, limit).to_string()
        }
        Target::Job(id) => {
            let jobs = jobs.ok_or_else(|| not_found(uri))?;
            let job = jobs
                .job(principal, &id)
                .await
                .map_err(|e| {
                    ErrorData::internal_error(format!("the job cannot be read: {e}"), None)
                })?
                .filter(|job| job.state.is_settled())
                .ok_or_else(|| not_found(uri))?;
            serde_json::to_value(&job.envelope)
                .unwrap_or_else(|_| Value::String(job.envelope.to_json()))
                .to_string()
        }
    };
    Ok(ResourceContents::TextResourceContents {
        uri: uri.to_owned(),
        mime_type: Some("application/json".into()),
        text,
        meta: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_handles_pages_and_jobs_and_nothing_else() {
        let handle = toolfleet_core::new_handle_id();
        assert_eq!(
            parse(&handle_uri(&handle)).unwrap(),
            Target::Handle {
                handle: handle.clone(),
                offset: 0,
                limit: None
            }
        );
        assert_eq!(
            parse(&format!("{}?offset=20&limit=5", handle_uri(&handle))).unwrap(),
            Target::Handle {
                handle: handle.clone(),
                offset: 20,
                limit: Some(5)
            }
        );
        let job = toolfleet_core::new_id();
        assert_eq!(
            parse(&format!("{JOB_URI_PREFIX}{job}")).unwrap(),
            Target::Job(job)
        );
        for bad in [
            "toolfleet://handles/h_nothex",
            "toolfleet://jobs/not-a-job",
            "file:///etc/passwd",
            "",
        ] {
            assert_eq!(parse(bad).unwrap_err().code.0, -32002, "{bad}");
        }
        for bad in ["?offset=x", "?limit=0", "?limit=-1", "?page=2"] {
            let uri = format!("{}{bad}", handle_uri(&handle));
            assert_eq!(parse(&uri).unwrap_err().code.0, -32602, "{bad}");
        }
        let long = format!("{}?offset={}", handle_uri(&handle), "1".repeat(600));
        assert_eq!(parse(&long).unwrap_err().code.0, -32602);
    }
}
