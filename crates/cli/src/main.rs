//! The toolfleet binary: parses flags and hands over to the crates that do
//! the work. Nothing depends on it.

mod bench;
mod client;
mod config;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
        tool: String,
        /// The arguments, as a JSON object.
        #[arg(default_value = "{}")]
        args: String,
        /// For a job: wait until it settles and print the final envelope.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        server: client::ServerArgs,
    },
    /// Run no-op jobs through the HTTP path and print throughput and latency.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TOOLFLEET_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
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
    let outcome = runtime.block_on(async {
        let config = config::Config::load(cli.config.as_deref())?;
        match cli.command {
            Command::Serve => serve::serve(config).await,
            Command::Tools { format, server } => client::tools(&config, &server, &format).await,
            Command::Call {
                tool,
                args,
                wait,
                server,
            } => client::call(&config, &server, &tool, &args, wait).await,
            Command::Bench(args) => bench::bench(config, args).await,
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("toolfleet: {message}");
            ExitCode::FAILURE
        }
    }
}
