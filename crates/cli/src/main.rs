//! The toolfleet binary: parses flags and hands over to the crates that do
//! the work. Nothing depends on it.

mod bench;
mod client;
mod config;
mod files;
mod keys;
mod serve;
mod tools;

/// mimalloc: every call, job and event allocates and frees many small
/// values across the runtime's threads, where it costs a fraction of the
/// system allocator's time. Built without transparent huge pages (its
/// `no_thp` feature), and the process refuses them too (see
/// [`without_huge_pages`]).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::json;

#[derive(Parser)]
#[command(
    name = "toolfleet",
    version,
    about = "A runtime for LLM tools: serve, call and measure them"
)]
struct Cli {
    /// The configuration file (default: ./toolfleet.toml, or TOOLFLEET_CONFIG).
    #[arg(long, global = true, env = "TOOLFLEET_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run dispatcher, workers and webhooks in one process.
    Serve,
    /// Run the HTTP API, webhooks and the sweeper (several may share a fleet).
    Dispatcher,
    /// Run workers against the configured store and broker.
    Worker {
        /// The pool to work (repeat for several; default: every pool).
        #[arg(long = "pool")]
        pools: Vec<String>,
        /// Jobs run at once per pool.
        #[arg(long)]
        concurrency: Option<usize>,
    },
    /// Apply the store's migrations (PostgreSQL with database_url, else SQLite).
    Migrate,
    /// Print the tool specs in a provider's format.
    Tools {
        /// neutral, openai, openai-responses, anthropic, gemini or mcp.
        #[arg(long, default_value = "neutral")]
        format: String,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Call a tool: `toolfleet call find_expenses '{"month": "2026-09"}'`.
    Call {
        /// The tool (none with `--batch`).
        #[arg(required_unless_present = "batch")]
        tool: Option<String>,
        /// The arguments, as a JSON object.
        #[arg(default_value = "{}")]
        args: String,
        /// For a job: wait until it settles and print the final envelope.
        #[arg(long, conflicts_with = "batch")]
        wait: bool,
        /// For a job: start it at this RFC 3339 time, not at once.
        #[arg(long, value_name = "TIME", conflicts_with_all = ["batch", "delay_s"])]
        run_at: Option<String>,
        /// For a job: start it this many seconds from now.
        #[arg(long, value_name = "SECONDS", conflicts_with = "batch")]
        delay_s: Option<f64>,
        /// For a job of an ordered pool: its priority, higher first (-100
        /// to 100; default: its tool's).
        #[arg(
            long,
            value_name = "N",
            conflicts_with = "batch",
            allow_negative_numbers = true
        )]
        priority: Option<i16>,
        /// Make every call of FILE (a JSON array of `{"tool", "args",
        /// "idempotency_key"?, "run_id"?, "callback_url"?, "run_at"?,
        /// "delay_s"?, "priority"?}`, or one such
        /// object a line), 1,000 a request, and print each envelope a line.
        #[arg(long, value_name = "FILE", conflicts_with = "tool")]
        batch: Option<std::path::PathBuf>,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// List the tickets you may answer or see: questions, approvals and the
    /// questions jobs put to their MCP clients, newest first.
    Inbox {
        /// Only the open or only the answered tickets.
        #[arg(long, value_parser = ["open", "answered"])]
        state: Option<String>,
        /// Only questions, only approvals or only a job's questions to its
        /// MCP client (answered by that client, with tasks/update).
        #[arg(long, value_parser = ["question", "approval", "input"])]
        kind: Option<String>,
        /// Print the tickets as one JSON list.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Answer a question: `toolfleet answer t_... travel`.
    Answer {
        ticket: String,
        /// The answer: JSON, or else taken as a string.
        #[arg(allow_hyphen_values = true)]
        answer: String,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Approve the commit an approval ticket holds (it runs once, now).
    Approve {
        ticket: String,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Reject the commit an approval ticket holds.
    Reject {
        ticket: String,
        /// Why, for the one who asked (at most 2,000 characters).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Start a run of an assistant: `toolfleet run expense_assistant "submit my September expenses"`.
    Run {
        agent: String,
        /// The user's message.
        input: String,
        /// Print the run's steps as they happen until it answers or stops.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Look at jobs and act on them: `toolfleet jobs list --state failed`,
    /// `show`, `retry`, `cancel`.
    Jobs {
        #[command(subcommand)]
        action: JobsAction,
    },
    /// Run no-op jobs through the HTTP path and print throughput and latency;
    /// `bench runs`: park runs on jobs and tickets, then resume them.
    Bench(bench::BenchArgs),
    /// Print the OpenAPI 3.1 document of the HTTP API this configuration
    /// serves (what `GET /v1/openapi.json` answers), for generating clients.
    Openapi,
    /// Serve MCP over stdin and stdout, as the principal of TOOLFLEET_TOKEN,
    /// with this process's own runtime and workers on the configured backends.
    Mcp,
}

#[derive(Subcommand)]
enum JobsAction {
    /// Your jobs, newest first (the tenant's, for `fleet:read` or `fleet:operate`).
    List {
        /// queued, scheduled, running, retrying, succeeded, failed or cancelled.
        #[arg(long)]
        state: Option<String>,
        /// Only this tool's jobs.
        #[arg(long)]
        tool: Option<String>,
        /// How many, 1 to 100 (default 20).
        #[arg(long)]
        limit: Option<u32>,
        /// Print the API's page as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// A job's envelope: its state, attempts, progress, result or error.
    Show {
        job_id: String,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Put a failed or cancelled job back (same id, attempts anew), or,
    /// without JOB_ID, every one the filters name (at most --limit).
    Retry {
        #[arg(conflicts_with_all = ["tool", "state", "error_code", "since", "until", "limit"])]
        job_id: Option<String>,
        /// Only this tool's jobs.
        #[arg(long)]
        tool: Option<String>,
        /// failed or cancelled (default both).
        #[arg(long)]
        state: Option<String>,
        /// Only jobs whose error has this code (`timeout`, `tool_failed`, ...).
        #[arg(long)]
        error_code: Option<String>,
        /// Only jobs settled at or after this Unix millisecond.
        #[arg(long)]
        since: Option<i64>,
        /// Only jobs settled before this Unix millisecond.
        #[arg(long)]
        until: Option<i64>,
        /// How many at most, 1 to 1,000 (default 100).
        #[arg(long)]
        limit: Option<u32>,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Cancel a job that has not settled.
    Cancel {
        job_id: String,
        #[command(flatten)]
        server: client::ServerArgs,
    },
}

/// Runs `toolfleet jobs ACTION`.
async fn jobs(config: &config::Config, action: JobsAction) -> Result<(), String> {
    match action {
        JobsAction::List {
            state,
            tool,
            limit,
            json,
            server,
        } => {
            let (state, tool) = (state.as_deref(), tool.as_deref());
            client::jobs_list(config, &server, state, tool, limit, json).await
        }
        JobsAction::Show { job_id, server } => client::job_show(config, &server, &job_id).await,
        JobsAction::Cancel { job_id, server } => client::job_cancel(config, &server, &job_id).await,
        JobsAction::Retry {
            job_id,
            tool,
            state,
            error_code,
            since,
            until,
            limit,
            server,
        } => {
            let what = client::RetryWhat {
                job_id: job_id.as_deref(),
                tool: tool.as_deref(),
                state: state.as_deref(),
                error_code: error_code.as_deref(),
                since,
                until,
                limit,
            };
            client::jobs_retry(config, &server, what).await
        }
    }
}

/// Separate dispatchers and workers share work only through PostgreSQL and RabbitMQ.
fn distributed(config: &config::Config) -> Result<(), String> {
    if config.database_url.is_none() || config.broker_url.is_none() {
        return Err("dispatcher and worker run as separate processes, so they need database_url (PostgreSQL) and broker_url (RabbitMQ); on one machine, `toolfleet serve` runs both in one process".to_owned());
    }
    Ok(())
}

/// The process's logs (`log_format`, `TOOLFLEET_LOG`) and, with
/// `otlp_endpoint`, its span exporter, named after its role unless
/// `OTEL_SERVICE_NAME` names it.
fn telemetry(
    config: &config::Config,
    command: &Command,
    runtime: &tokio::runtime::Handle,
) -> Result<toolfleet_telemetry::Telemetry, String> {
    let role = match command {
        Command::Dispatcher => "toolfleet-dispatcher",
        Command::Worker { .. } => "toolfleet-worker",
        _ => "toolfleet",
    };
    let otlp = match &config.otlp_endpoint {
        Some(endpoint) => Some(toolfleet_telemetry::Otlp {
            endpoint: endpoint.clone(),
            service_name: std::env::var("OTEL_SERVICE_NAME")
                .ok()
                .filter(|name| !name.trim().is_empty())
                .unwrap_or_else(|| role.to_owned()),
            client: toolfleet_executors::http_client()?,
            runtime: runtime.clone(),
        }),
        None => None,
    };
    toolfleet_telemetry::Telemetry::init(config.log_format, otlp.as_ref())
}

/// Turns transparent huge pages off for this process (Linux). The first
/// touch of a huge page zeroes 2 MiB where a small page zeroes 4 KiB, and an
/// allocator that returns freed memory and takes it back again pays that
/// each time: measured on a worker draining a backlog, it was more than
/// half its processor time at start and a third afterwards
/// (`deploy/bench/fleet.py`). mimalloc is built not to ask for them; this
/// also covers hosts whose kernel gives them unasked
/// (`transparent_hugepage/enabled` set to `always`). Programs that `exec`
/// tools start inherit the setting, which only changes how their memory is
/// paged.
fn without_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and changes
    // nothing but the process's paging; a refusal (an old kernel) is harmless.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn main() -> ExitCode {
    without_huge_pages();
    let cli = Cli::parse();
    // Read first: it says how to log.
    let config = match config::Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(message) => {
            eprintln!("toolfleet: {message}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("toolfleet: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    let telemetry = match telemetry(&config, &cli.command, runtime.handle()) {
        Ok(telemetry) => telemetry,
        Err(message) => {
            eprintln!("toolfleet: {message}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Serve => serve::run(config, serve::Roles::all()).await,
            Command::Dispatcher => {
                distributed(&config)?;
                let roles = serve::Roles {
                    dispatcher: true,
                    pools: None,
                    no_workers: true,
                    http: true,
                };
                serve::run(config, roles).await
            }
            Command::Worker { pools, concurrency } => {
                distributed(&config)?;
                let mut config = config;
                if let Some(n) = concurrency {
                    config.concurrency = n;
                }
                let pools = (!pools.is_empty()).then_some(pools);
                serve::run(
                    config,
                    serve::Roles {
                        dispatcher: false,
                        pools,
                        no_workers: false,
                        http: false,
                    },
                )
                .await
            }
            Command::Migrate => serve::migrate(&config).await,
            Command::Openapi => {
                let limits = config.limits.api(config.max_body_bytes)?;
                let metrics_on_api = config.metrics_listen.is_none();
                let document = toolfleet_server::openapi::document(&limits, metrics_on_api);
                let text = serde_json::to_string_pretty(&document).map_err(|e| e.to_string())?;
                println!("{text}");
                Ok(())
            }
            Command::Tools { format, server } => client::tools(&config, &server, &format).await,
            Command::Call {
                tool,
                args,
                wait,
                run_at,
                delay_s,
                priority,
                batch,
                server,
            } => match (batch, tool) {
                (Some(file), _) => client::call_batch(&config, &server, &file).await,
                (None, Some(tool)) => {
                    let mut call = json!({"tool": tool});
                    if let Some(at) = run_at {
                        call["run_at"] = json!(at);
                    }
                    if let Some(delay) = delay_s {
                        if !delay.is_finite() {
                            return Err(format!(
                                "--delay-s must be a number of seconds: got {delay}"
                            ));
                        }
                        call["delay_s"] = json!(delay);
                    }
                    if let Some(priority) = priority {
                        call["priority"] = json!(priority);
                    }
                    client::call(&config, &server, call, &args, wait).await
                }
                (None, None) => Err("name a tool, or --batch FILE".to_owned()),
            },
            Command::Inbox {
                state,
                kind,
                json,
                server,
            } => client::inbox(&config, &server, state.as_deref(), kind.as_deref(), json).await,
            Command::Answer {
                ticket,
                answer,
                server,
            } => client::answer(&config, &server, &ticket, &answer).await,
            Command::Approve { ticket, server } => client::approve(&config, &server, &ticket).await,
            Command::Reject {
                ticket,
                reason,
                server,
            } => client::reject(&config, &server, &ticket, reason.as_deref()).await,
            Command::Run {
                agent,
                input,
                wait,
                server,
            } => client::run(&config, &server, &agent, &input, wait).await,
            Command::Jobs { action } => jobs(&config, action).await,
            Command::Bench(args) => bench::bench(config, args).await,
            Command::Mcp => serve::mcp_stdio(config).await,
        }
    });
    // The spans still buffered go out while the runtime still runs.
    if let Err(message) = telemetry.shutdown() {
        eprintln!("toolfleet: {message}");
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("toolfleet: {message}");
            ExitCode::FAILURE
        }
    }
}
