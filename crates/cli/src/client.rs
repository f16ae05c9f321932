//! The client commands: `toolfleet tools` and `toolfleet call`, over the
//! HTTP API of a running server.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::config::Config;
use crate::keys::DEV_TOKEN_FILE;

/// Where the server is and who we are.
#[derive(clap::Args)]
pub(crate) struct ServerArgs {
    /// The server (default: http:// and the `listen` address of the configuration).
    #[arg(long, env = "TOOLFLEET_URL")]
    server: Option<String>,
    /// The bearer token (default: the development token in the data directory).
    #[arg(long, env = "TOOLFLEET_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    fn new(config: &Config, args: &ServerArgs) -> Result<Client, String> {
        let base = args
            .server
            .clone()
            .unwrap_or_else(|| format!("http://{}", config.listen))
            .trim_end_matches('/')
            .to_owned();
        let token = match &args.token {
            Some(token) => token.clone(),
            None => std::fs::read_to_string(config.data_dir.join(DEV_TOKEN_FILE))
                .map(|t| t.trim().to_owned())
                .map_err(|_| "no token: pass --token or set TOOLFLEET_TOKEN (serve prints a development token at start)".to_owned())?,
        };
        let http = toolfleet_executors::http_client()?;
        Ok(Client { http, base, token })
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, String> {
        let response = request.bearer_auth(&self.token).send().await.map_err(|e| {
            if e.is_connect() {
                format!(
                    "cannot reach toolfleet at {}: is `toolfleet serve` running there?",
                    self.base
                )
            } else {
                format!("request to {} failed: {e}", self.base)
            }
        })?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| format!("reading the answer failed: {e}"))?;
        serde_json::from_str(&text).map_err(|_| {
            format!(
                "the server answered {status} with a body that is not JSON: {}",
                text.chars().take(200).collect::<String>()
            )
        })
    }

    async fn get(&self, path: &str) -> Result<Value, String> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json")
            .body(body.to_string());
        self.send(request).await
    }
}

fn print(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// An `error` envelope as this command's failure.
fn outcome(envelope: &Value) -> Result<(), String> {
    match envelope["status"].as_str() {
        Some("error") => Err(format!(
            "{}: {}",
            envelope["error"]["code"].as_str().unwrap_or("error"),
            envelope["error"]["message"].as_str().unwrap_or("")
        )),
        _ => Ok(()),
    }
}

pub(crate) async fn tools(config: &Config, args: &ServerArgs, format: &str) -> Result<(), String> {
    let client = Client::new(config, args)?;
    let specs = client.get(&format!("/v1/tools?format={format}")).await?;
    print(&specs);
    outcome(&specs)
}

pub(crate) async fn call(
    config: &Config,
    args: &ServerArgs,
    tool: &str,
    json_args: &str,
    wait: bool,
) -> Result<(), String> {
    let parsed: Value =
        serde_json::from_str(json_args).map_err(|e| format!("the arguments are not JSON: {e}"))?;
    let client = Client::new(config, args)?;
    let mut envelope = client
        .post("/v1/calls", &json!({"tool": tool, "args": parsed}))
        .await?;
    if wait && envelope["status"] == "running" {
        envelope = wait_for(&client, &envelope).await?;
    }
    print(&envelope);
    outcome(&envelope)
}

/// Long-polls a job until it settles, with a progress line on stderr.
async fn wait_for(client: &Client, running: &Value) -> Result<Value, String> {
    let job_id = running["job_id"]
        .as_str()
        .ok_or("the running answer has no job_id")?
        .to_owned();
    let started = Instant::now();
    let spinner = ['|', '/', '-', '\\'];
    let mut turn = 0usize;
    loop {
        let envelope = client.get(&format!("/v1/jobs/{job_id}?wait_s=1")).await?;
        if envelope["status"] != "running" {
            eprint!("\r\x1b[2K");
            return Ok(envelope);
        }
        let state = envelope["state"].as_str().unwrap_or("queued");
        let attempts = envelope["attempts"].as_u64().unwrap_or(0);
        eprint!(
            "\r\x1b[2K{} job {job_id}: {state}, attempt {attempts}, {:.0} s",
            spinner[turn % spinner.len()],
            started.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().flush();
        turn += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
