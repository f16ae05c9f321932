//! The `exec` executor: a tool whose work is done by a program.
//!
//! It owns one run of the program per attempt: the arguments as JSON on
//! standard input, one JSON document expected on standard output, the exit
//! status read as success, a retryable failure (75, `EX_TEMPFAIL`) or a
//! final one. It must never wait past its timeout nor hold more than
//! `max_output_bytes` of output.
//!
//! While it runs, a program may report to a caller that listens (an MCP
//! client) with lines on standard error that start with [`EVENT_PREFIX`]
//! and carry one JSON object: `{"progress": 50, "total": 100, "message":
//! "..."}` (total and message optional) or `{"log": "info", "message":
//! "..."}` (a syslog level). Such lines are reports, not error text: they
//! are left out of the excerpt a failure quotes. Anything else after the
//! prefix, or a line longer than [`MAX_EVENT_LINE`], is ordinary text.
//!
//! # What a program sees
//!
//! A program starts with an empty environment plus only: `PATH`, `HOME`,
//! `LANG` and `TZ` as toolfleet has them (`PATH` is [`DEFAULT_PATH`] when
//! toolfleet has none); the variables its executor names in `pass_env`,
//! copied from toolfleet's environment where set there; the literal values
//! of its `env`; and the call's own [`CALL_ENV`] (idempotency key, run, call
//! and tenant). Nothing else of toolfleet's environment reaches it: not its
//! database URL, confirm or webhook secret, nor a model's API key. An
//! operator who names such a variable in `pass_env` or `env` gives it to the
//! program on purpose; that is allowed. Names are checked when the
//! configuration is bound ([`ExecExecutor::with_environment`]).
//!
//! # Its process tree dies with the attempt
//!
//! When an attempt times out, prints too much or is abandoned, every process
//! the program started is killed, not only the program. On Linux:
//!
//! - The program is made a child subreaper (`PR_SET_CHILD_SUBREAPER`, set
//!   between fork and exec and kept across exec), so a descendant orphaned
//!   by its parent's exit is adopted by the program rather than by init:
//!   while the program lives, every process it started, even one that left
//!   its session with `setsid` or daemonized with a double fork, is below it
//!   in the parent links of `/proc`. toolfleet itself adopts nothing, so
//!   tokio's own reaping of its children is untouched.
//! - The killer freezes before it kills: it stops the program's process
//!   group and the program with `SIGSTOP`, then reads `/proc` for the
//!   descendants of the program and stops each new one, again and again
//!   until a reading finds no new process and all are stopped (a stopped
//!   process cannot fork; the rounds are bounded). Then it sends `SIGKILL`
//!   to the group and to every process found. Killing before freezing would
//!   orphan the grandchildren first and lose their trail.
//!
//! Elsewhere on Unix the program's process group is killed, as it runs in a
//! group of its own. A program that exits of its own accord ends the attempt;
//! what it left running is its own (toolfleet kills nothing then).
//!
//! Processes orphaned after the program exits are adopted by the nearest
//! subreaper or init, which must reap them: where toolfleet is PID 1 (a
//! container), an init runs in front of it (the image's `tini`), as
//! toolfleet reaps only its own children.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use futures_util::future::{BoxFuture, try_join3};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use toolfleet_core::{CallCtx, CallEvent, ErrorCode, Executor, Json, LogLevel, ToolError};

use crate::{DEFAULT_MAX_RESULT_BYTES, EXCERPT_BYTES, idempotency_key, quoted};

/// The exit status (sysexits.h) by which a program says "try again later".
pub const EX_TEMPFAIL: i32 = 75;

/// What starts a line of standard error that reports progress or a log message.
pub const EVENT_PREFIX: &str = "toolfleet-event: ";
/// The longest report line read as one, in bytes.
pub const MAX_EVENT_LINE: usize = 4096;

/// The variables of toolfleet's environment every program gets, where set.
pub const BASE_ENV: [&str; 4] = ["PATH", "HOME", "LANG", "TZ"];

/// A program's `PATH` when toolfleet's environment has none.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The variables toolfleet sets for each call, which configuration may not name.
pub const CALL_ENV: [&str; 4] = [
    "TOOLFLEET_IDEMPOTENCY_KEY",
    "TOOLFLEET_RUN_ID",
    "TOOLFLEET_CALL_ID",
    "TOOLFLEET_TENANT",
];

/// The most variables an executor's `env` and `pass_env` name together.
pub const MAX_ENV_VARS: usize = 64;
/// The longest variable name, in bytes.
pub const MAX_ENV_NAME: usize = 128;
/// The longest value of an `env` variable, in bytes.
pub const MAX_ENV_VALUE: usize = 32 * 1024;

/// Runs a program with a call's arguments on standard input.
#[derive(Debug, Clone)]
pub struct ExecExecutor {
    program: String,
    args: Vec<String>,
    timeout: Duration,
    max_output_bytes: usize,
    /// Variables set to a literal value.
    env: Vec<(String, String)>,
    /// Variables copied from toolfleet's environment.
    pass_env: Vec<String>,
}

/// What a finished program left behind.
struct Finished {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl ExecExecutor {
    /// An executor for `program` (a path, or a name looked up in `PATH`)
    /// with command-line `args`. It starts with [`crate::DEFAULT_TIMEOUT`]
    /// and [`DEFAULT_MAX_RESULT_BYTES`].
    pub fn new(program: impl Into<String>, args: Vec<String>) -> Result<Self, String> {
        let program = program.into();
        if program.trim().is_empty() {
            return Err("program must name a program to run, got an empty string".to_owned());
        }
        Ok(ExecExecutor {
            program,
            args,
            timeout: crate::DEFAULT_TIMEOUT,
            max_output_bytes: DEFAULT_MAX_RESULT_BYTES,
            env: Vec::new(),
            pass_env: Vec::new(),
        })
    }

    /// The program's own variables beyond [`BASE_ENV`]: `env`, set to
    /// these values, and `pass_env`, copied from toolfleet's environment
    /// when the program starts (left out where toolfleet has none). A name
    /// must be 1 to [`MAX_ENV_NAME`] bytes without `=` or NUL, named once,
    /// and not one of [`CALL_ENV`]; at most [`MAX_ENV_VARS`] in all. An
    /// `env` value names `PATH`, say, to replace toolfleet's. Values are
    /// never quoted back: they are often credentials.
    pub fn with_environment(
        mut self,
        env: BTreeMap<String, String>,
        pass_env: Vec<String>,
    ) -> Result<Self, String> {
        let count = env.len() + pass_env.len();
        if count > MAX_ENV_VARS {
            return Err(format!(
                "env and pass_env name {count} variables; at most {MAX_ENV_VARS} are allowed"
            ));
        }
        let mut passed = BTreeSet::new();
        for name in &pass_env {
            check_env_name("pass_env", name)?;
            if !passed.insert(name.as_str()) {
                return Err(format!("pass_env names `{}` twice", shown(name)));
            }
        }
        for (name, value) in &env {
            check_env_name("env", name)?;
            if passed.contains(name.as_str()) {
                return Err(format!(
                    "`{}` is both in env and in pass_env; keep one",
                    shown(name)
                ));
            }
            if value.contains('\0') {
                return Err(format!(
                    "the value of env `{}` contains a NUL character",
                    shown(name)
                ));
            }
            if value.len() > MAX_ENV_VALUE {
                return Err(format!(
                    "the value of env `{}` is longer than {MAX_ENV_VALUE} bytes",
                    shown(name)
                ));
            }
        }
        self.env = env.into_iter().collect();
        self.pass_env = pass_env;
        Ok(self)
    }

    /// The wall time of one run, from start to exit.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The largest standard output accepted as a result.
    pub fn with_max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// The program it runs.
    pub fn program(&self) -> &str {
        &self.program
    }

    /// How long one run may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn call(self, ctx: CallCtx, args: Value) -> Result<Json, ToolError> {
        let input = serde_json::to_vec(&args).map_err(|e| {
            ToolError::failed(format!("the arguments could not be encoded: {e}"), false)
        })?;
        let mut child = self.spawn(&ctx)?;
        let ctx = &ctx;
        // Declared after `child`, so dropped first: on every early return,
        // and when the caller abandons the call, the tree dies.
        let tree = TreeKiller::of(&child);
        let finished = tokio::time::timeout(self.timeout, self.converse(&mut child, input, ctx))
            .await
            .map_err(|_| self.timed_out())??;
        tree.disarm();
        self.judge(finished)
    }

    fn spawn(&self, ctx: &CallCtx) -> Result<Child, ToolError> {
        let [key, run, call, tenant] = CALL_ENV;
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .env_clear()
            .envs(program_env(&self.env, &self.pass_env, |name| {
                std::env::var_os(name)
            }))
            .env(key, idempotency_key(ctx))
            .env(run, &ctx.run_id)
            .env(call, &ctx.call_id)
            .env(tenant, ctx.tenant())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        #[cfg(unix)]
        command.process_group(0);
        #[cfg(target_os = "linux")]
        // SAFETY: the closure runs in the child between fork and exec, where
        // only async-signal-safe calls are allowed: prctl(2) is a plain
        // system call that allocates nothing and takes no lock. Should it
        // fail (a kernel before 3.4), the killer still finds what has not
        // been orphaned, and the group.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0);
                Ok(())
            });
        }
        command.spawn().map_err(|e| self.spawn_error(e))
    }

    /// Feeds standard input while reading both outputs, all at once: a
    /// program that writes before it has read everything must not block.
    async fn converse(
        &self,
        child: &mut Child,
        input: Vec<u8>,
        ctx: &CallCtx,
    ) -> Result<Finished, ToolError> {
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        let write = feed(stdin, input);
        let stdout = async {
            let (bytes, complete) = read_bounded(stdout, self.max_output_bytes).await;
            if complete {
                Ok(bytes)
            } else {
                Err(self.too_large())
            }
        };
        let stderr = async { Ok(read_stderr(stderr, ctx).await) };
        let ((), stdout, stderr) = try_join3(write, stdout, stderr).await?;
        let status = child.wait().await.map_err(|e| {
            ToolError::failed(
                format!("program `{}` could not be waited for: {e}", self.program),
                true,
            )
        })?;
        Ok(Finished {
            status,
            stdout,
            stderr,
        })
    }

    fn judge(&self, finished: Finished) -> Result<Json, ToolError> {
        let Finished {
            status,
            stdout,
            stderr,
        } = finished;
        match status.code() {
            Some(0) => self.parse_result(&stdout),
            Some(code) => Err(ToolError::failed(
                format!(
                    "program `{}` exited with status {code}{}",
                    self.program,
                    quoted(&stderr)
                ),
                code == EX_TEMPFAIL,
            )),
            None => Err(ToolError::failed(
                format!(
                    "program `{}` was {}{}",
                    self.program,
                    killed_by(status),
                    quoted(&stderr)
                ),
                false,
            )),
        }
    }

    fn parse_result(&self, stdout: &[u8]) -> Result<Json, ToolError> {
        let problem = match std::str::from_utf8(stdout) {
            Err(_) => "printed output that is not UTF-8 text".to_owned(),
            Ok(text) if text.trim().is_empty() => "printed nothing".to_owned(),
            Ok(text) => match Json::parse(text) {
                Ok(json) => return Ok(json),
                Err(e) => format!("printed something that is not one JSON document ({e})"),
            },
        };
        Err(ToolError::failed(
            format!(
                "program `{}` exited 0 but {problem} on standard output, where its result belongs{}",
                self.program,
                quoted(stdout)
            ),
            false,
        ))
    }

    fn spawn_error(&self, error: io::Error) -> ToolError {
        let why = match error.kind() {
            io::ErrorKind::NotFound => "there is no such program".to_owned(),
            io::ErrorKind::PermissionDenied => {
                "it is not executable (permission denied)".to_owned()
            }
            _ => error.to_string(),
        };
        ToolError::failed(
            format!("program `{}` could not be started: {why}", self.program),
            false,
        )
    }

    fn timed_out(&self) -> ToolError {
        ToolError::new(
            ErrorCode::Timeout,
            format!(
                "program `{}` did not finish within {:?} and was killed",
                self.program, self.timeout
            ),
        )
    }

    fn too_large(&self) -> ToolError {
        ToolError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "program `{}` printed more than {} bytes and was killed",
                self.program, self.max_output_bytes
            ),
        )
        .retryable(false)
    }
}

impl Executor for ExecExecutor {
    fn execute(&self, ctx: CallCtx, args: Value) -> BoxFuture<'static, Result<Json, ToolError>> {
        Box::pin(self.clone().call(ctx, args))
    }
}

/// The environment of a program but the call's variables: [`BASE_ENV`] and
/// `pass_env` as `lookup` (toolfleet's environment) has them, `PATH`
/// defaulting to [`DEFAULT_PATH`], then the literal `env`, which wins.
fn program_env(
    env: &[(String, String)],
    pass_env: &[String],
    lookup: impl Fn(&str) -> Option<OsString>,
) -> BTreeMap<OsString, OsString> {
    let mut vars = BTreeMap::new();
    vars.insert("PATH".into(), DEFAULT_PATH.into());
    let passed = BASE_ENV
        .iter()
        .copied()
        .chain(pass_env.iter().map(String::as_str));
    for name in passed {
        if let Some(value) = lookup(name) {
            vars.insert(name.into(), value);
        }
    }
    for (name, value) in env {
        vars.insert(name.into(), value.into());
    }
    vars
}

/// Why `name`, in `env` or `pass_env` (`key`), cannot name a variable.
fn check_env_name(key: &str, name: &str) -> Result<(), String> {
    let problem = if name.is_empty() {
        "is empty".to_owned()
    } else if name.len() > MAX_ENV_NAME {
        format!("is longer than {MAX_ENV_NAME} bytes")
    } else if name.contains('=') {
        "contains `=`".to_owned()
    } else if name.contains('\0') {
        "contains a NUL character".to_owned()
    } else if CALL_ENV.contains(&name) {
        return Err(format!(
            "{key}: `{name}` is set by toolfleet itself for every call; remove it"
        ));
    } else {
        return Ok(());
    };
    Err(format!(
        "{key}: variable name `{}` {problem}; a name is 1 to {MAX_ENV_NAME} bytes without `=` or NUL",
        shown(name)
    ))
}

/// A name for a message: escaped and, when long, cut.
fn shown(name: &str) -> String {
    let escaped = name.escape_debug().to_string();
    match escaped.char_indices().nth(40) {
        Some((cut, _)) => format!("{}…", &escaped[..cut]),
        None => escaped,
    }
}

/// Writes the arguments and closes standard input. A program may exit
/// without reading them; its exit status, not a broken pipe, decides.
async fn feed(stdin: Option<ChildStdin>, input: Vec<u8>) -> Result<(), ToolError> {
    if let Some(mut stdin) = stdin {
        let _ = stdin.write_all(&input).await;
    }
    Ok(())
}

/// Reads at most `limit` bytes; `false` when the stream had more. A read
/// error ends the stream: the exit status tells what went wrong.
async fn read_bounded<R: AsyncRead + Unpin>(stream: Option<R>, limit: usize) -> (Vec<u8>, bool) {
    let mut bytes = Vec::new();
    if let Some(stream) = stream {
        let bound = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
        let _ = stream.take(bound).read_to_end(&mut bytes).await;
    }
    let complete = bytes.len() <= limit;
    bytes.truncate(limit);
    (bytes, complete)
}

/// The start of standard error, report lines taken out and passed to the
/// call's listener, then the rest drained (reports still read) so that a
/// chatty program never blocks on a full pipe.
async fn read_stderr<R: AsyncRead + Unpin>(stream: Option<R>, ctx: &CallCtx) -> Vec<u8> {
    let Some(mut stream) = stream else {
        return Vec::new();
    };
    let mut excerpt = Vec::new();
    // The line being read; `long` once it has outgrown a report.
    let mut line = Vec::new();
    let mut long = false;
    let mut chunk = [0u8; 4096];
    let keep = |text: &[u8], excerpt: &mut Vec<u8>| {
        let room = EXCERPT_BYTES.saturating_sub(excerpt.len());
        excerpt.extend_from_slice(&text[..text.len().min(room)]);
    };
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for piece in chunk[..n].split_inclusive(|b| *b == b'\n') {
            if long {
                keep(piece, &mut excerpt);
            } else {
                line.extend_from_slice(piece);
                if line.len() > MAX_EVENT_LINE {
                    keep(&line, &mut excerpt);
                    line.clear();
                    long = true;
                }
            }
            if piece.ends_with(b"\n") {
                if !long && !report(&line, ctx) {
                    keep(&line, &mut excerpt);
                }
                line.clear();
                long = false;
            }
        }
    }
    if !long && !report(&line, ctx) {
        keep(&line, &mut excerpt);
    }
    excerpt
}

/// Passes a report line to the call's listener; false when `line` is not one.
fn report(line: &[u8], ctx: &CallCtx) -> bool {
    let Some(event) = parse_event(line) else {
        return false;
    };
    ctx.report(event);
    true
}

/// The event a line of standard error reports, if it is a report.
pub fn parse_event(line: &[u8]) -> Option<CallEvent> {
    let text = std::str::from_utf8(line).ok()?;
    let json = text.strip_prefix(EVENT_PREFIX)?.trim_end();
    let Value::Object(object) = serde_json::from_str::<Value>(json).ok()? else {
        return None;
    };
    let message = match object.get("message") {
        None | Some(Value::Null) => None,
        Some(Value::String(message)) => Some(message.clone()),
        Some(_) => return None,
    };
    if let Some(level) = object.get("log") {
        let level: LogLevel = serde_json::from_value(level.clone()).ok()?;
        return Some(CallEvent::Log {
            level,
            message: message.unwrap_or_default(),
        });
    }
    let progress = object.get("progress")?.as_f64()?;
    let total = match object.get("total") {
        None | Some(Value::Null) => None,
        Some(total) => Some(total.as_f64()?),
    };
    Some(CallEvent::Progress {
        progress,
        total,
        message,
    })
}

#[cfg(unix)]
fn killed_by(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status.signal() {
        Some(signal) => format!("killed by signal {signal}"),
        None => "stopped without an exit status".to_owned(),
    }
}

#[cfg(not(unix))]
fn killed_by(_status: ExitStatus) -> String {
    "stopped without an exit status".to_owned()
}

/// Kills a program's whole process tree when dropped, unless disarmed once
/// the program has exited of its own accord.
struct TreeKiller {
    root: Option<i32>,
}

impl TreeKiller {
    fn of(child: &Child) -> Self {
        // Pids 0 and 1 would name our own group or init: never signal those.
        let root = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .filter(|&pid| pid > 1);
        TreeKiller { root }
    }

    fn disarm(mut self) {
        self.root = None;
    }
}

impl Drop for TreeKiller {
    fn drop(&mut self) {
        if let Some(root) = self.root {
            kill_tree(root);
        }
    }
}

/// Sends `signal` to `pid` (a process group when negative), never to init,
/// to every process (-1) nor to our own process or group.
#[cfg(unix)]
fn signal(pid: i32, signal: i32) {
    // SAFETY: getpid(2) and getpgrp(2) only read our own ids.
    let (us, our_group) = unsafe { (libc::getpid(), libc::getpgrp()) };
    if matches!(pid, -1..=1) || pid == us || pid == -our_group {
        return;
    }
    // SAFETY: kill(2) only sends a signal; it reads and writes no memory of ours.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Stops the program's group and every descendant found in `/proc` until
/// none is new and all are stopped, then kills them all (see the module
/// documentation).
#[cfg(target_os = "linux")]
fn kill_tree(root: i32) {
    /// Readings of `/proc` before the killing starts anyway.
    const MAX_ROUNDS: usize = 100;
    signal(-root, libc::SIGSTOP);
    signal(root, libc::SIGSTOP);
    let mut tree = BTreeSet::from([root]);
    for _ in 0..MAX_ROUNDS {
        let table = processes();
        let mut grew = false;
        for pid in descendants(&table, root) {
            if tree.insert(pid) {
                signal(pid, libc::SIGSTOP);
                grew = true;
            }
        }
        // Stopped (T), traced (t), dead (Z, X) or gone: none can fork.
        let frozen = tree.iter().all(|pid| {
            table
                .get(pid)
                .is_none_or(|&(_, state)| matches!(state, b'T' | b't' | b'Z' | b'X'))
        });
        if frozen && !grew {
            break;
        }
        if !grew {
            // A stop is on its way; give the processes a moment to take it.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    signal(-root, libc::SIGKILL);
    for pid in tree {
        signal(pid, libc::SIGKILL);
    }
}

#[cfg(all(unix, not(target_os = "linux")))]
fn kill_tree(root: i32) {
    // The program leads a process group of its own.
    signal(-root, libc::SIGKILL);
}

#[cfg(not(unix))]
fn kill_tree(_root: i32) {
    // Elsewhere `kill_on_drop` kills the program itself, without its children.
}

/// Every process of `/proc`: its parent and its state letter, by pid.
#[cfg(target_os = "linux")]
fn processes() -> BTreeMap<i32, (i32, u8)> {
    let mut table = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return table;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some(process) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| parse_stat(&stat))
        {
            table.insert(pid, process);
        }
    }
    table
}

/// The parent pid and state of a `/proc/<pid>/stat` line, read after the
/// command's closing parenthesis (a command may hold spaces and parentheses).
#[cfg(target_os = "linux")]
fn parse_stat(stat: &str) -> Option<(i32, u8)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    let parent = fields.next()?.parse().ok()?;
    Some((parent, state))
}

/// The processes below `root` in `table`, by their parent links.
#[cfg(target_os = "linux")]
fn descendants(table: &BTreeMap<i32, (i32, u8)>, root: i32) -> BTreeSet<i32> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for (&pid, &(parent, _)) in table {
        children.entry(parent).or_default().push(pid);
    }
    let mut found = BTreeSet::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        for &child in children.get(&pid).map(Vec::as_slice).unwrap_or_default() {
            if found.insert(child) {
                next.push(child);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_the_base_the_passed_and_the_set() {
        let outside = BTreeMap::from([
            ("HOME", "/home/t"),
            ("TZ", "UTC"),
            ("TOOL_TOKEN", "tok"),
            ("TOOLFLEET_CONFIRM_SECRET", "s3cret"),
        ]);
        let lookup = |name: &str| outside.get(name).map(OsString::from);
        let env = [
            ("MODE".to_owned(), "fast".to_owned()),
            ("HOME".to_owned(), "/srv/tool".to_owned()),
        ];
        let pass = ["TOOL_TOKEN".to_owned(), "UNSET_HERE".to_owned()];
        let vars = program_env(&env, &pass, lookup);
        let expected: BTreeMap<OsString, OsString> = [
            ("PATH", DEFAULT_PATH),
            ("HOME", "/srv/tool"),
            ("TZ", "UTC"),
            ("TOOL_TOKEN", "tok"),
            ("MODE", "fast"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
        assert_eq!(vars, expected);
        let with_path = program_env(&[], &[], |name| {
            (name == "PATH").then(|| OsString::from("/opt/bin"))
        });
        assert_eq!(
            with_path.get(&OsString::from("PATH")),
            Some(&"/opt/bin".into())
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn stat_lines_are_read_past_odd_commands() {
        assert_eq!(parse_stat("42 (a) b (c)) S 7 42 42 0 -1"), Some((7, b'S')));
        assert_eq!(parse_stat("42 (sh) Z 1 42"), Some((1, b'Z')));
        assert_eq!(parse_stat("42 (sh"), None);
        assert_eq!(parse_stat("42 (sh) S x"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn descendants_follow_parent_links_to_any_depth() {
        let table = BTreeMap::from([
            (10, (1, b'S')),
            (11, (10, b'S')),
            (12, (11, b'S')),
            (13, (10, b'Z')),
            (20, (1, b'S')),
            (21, (20, b'S')),
        ]);
        assert_eq!(descendants(&table, 10), BTreeSet::from([11, 12, 13]));
        assert_eq!(descendants(&table, 12), BTreeSet::new());
    }
}
