//! A stdio server as a child process: spawned in its own process group, its stderr kept
//! (the last lines, bounded), its exit status watched, and the whole group signalled when it
//! is stopped, so that nothing it started (a server behind `bash -c`, `npx`, `uv run`)
//! outlives it.
//!
//! The JSON-RPC transport over its stdin and stdout is ours rather than rmcp's
//! `TokioChildProcess`, for three reasons: rmcp's child transport hides the exit status and
//! signals only the direct child; our reader keeps the raw `result` of each `tools/list`
//! response (rmcp's typed `Tool` drops fields it does not model, such as `execution`, and
//! fails a page on one malformed tool), and likewise of each `tools/call` response (rmcp's
//! typed `CallToolResult` drops fields and block types it does not model); and lines that
//! are not JSON-RPC are counted and quoted in error messages instead of disappearing.

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use psych_types::ServerId;
use rmcp::RoleClient;
use rmcp::model::{JsonRpcMessage, ServerNotification};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::McpError;
use crate::tap::Tap;

/// The longest line read from a server's stdout; a longer one is dropped and reported.
const MAX_LINE: usize = 64 * 1024 * 1024;
/// How many stderr lines are kept.
const STDERR_LINES: usize = 20;
/// How many stderr bytes are kept, all lines together.
const STDERR_BYTES: usize = 8 * 1024;
/// How much of one stderr line (or one garbage stdout line) is kept.
const LINE_PREVIEW: usize = 400;

/// What a stdio server's process is configured as.
pub(crate) struct Command<'a> {
    pub(crate) command: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) env: &'a std::collections::BTreeMap<String, String>,
    pub(crate) cwd: Option<&'a PathBuf>,
}

/// A running (or ended) stdio server process and what it said on stderr.
pub(crate) struct Child {
    pgid: Option<Pid>,
    exit: watch::Receiver<Option<ExitStatus>>,
    diagnostics: Arc<Diagnostics>,
    stderr_done: watch::Receiver<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// Set once the group has been killed, so that drop does not signal a reused id.
    reaped: AtomicBool,
}

/// The last stderr lines and the stdout lines that were not JSON-RPC.
#[derive(Default)]
pub(crate) struct Diagnostics {
    inner: Mutex<DiagnosticsInner>,
}

#[derive(Default)]
struct DiagnosticsInner {
    stderr: VecDeque<String>,
    stderr_bytes: usize,
    garbage_lines: u64,
    last_garbage: String,
}

impl Diagnostics {
    fn push_stderr(&self, line: &str) {
        let line = preview(line.trim_end());
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.stderr_bytes += line.len();
        inner.stderr.push_back(line);
        while inner.stderr.len() > STDERR_LINES || inner.stderr_bytes > STDERR_BYTES {
            let Some(old) = inner.stderr.pop_front() else {
                break;
            };
            inner.stderr_bytes -= old.len();
        }
    }

    fn push_garbage(&self, line: String) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.garbage_lines += 1;
        inner.last_garbage = line;
    }

    /// The stderr tail, then a note on stdout garbage if there was any.
    pub(crate) fn text(&self) -> String {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut text = inner.stderr.iter().cloned().collect::<Vec<_>>().join("\n");
        if inner.garbage_lines > 0 {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(&format!(
                "({} line(s) on stdout were not JSON-RPC; the last: {:?})",
                inner.garbage_lines, inner.last_garbage
            ));
        }
        text
    }
}

fn preview(text: &str) -> String {
    if text.len() <= LINE_PREVIEW {
        return text.to_owned();
    }
    let mut end = LINE_PREVIEW;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// How a process ended, in words.
pub(crate) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => format!("ended ({status})"),
    }
}

impl Child {
    /// Starts the server in its own process group with piped stdio.
    pub(crate) fn spawn(
        server: &ServerId,
        spec: &Command<'_>,
    ) -> Result<(Self, ChildTransport), McpError> {
        let mut command = tokio::process::Command::new(spec.command);
        command
            .args(spec.args)
            .envs(spec.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        if let Some(cwd) = spec.cwd {
            command.current_dir(cwd);
        }
        let spawn_error = |source| McpError::Spawn {
            server: server.clone(),
            command: spec.command.to_owned(),
            source,
        };
        let mut child = command.spawn().map_err(spawn_error)?;
        let pgid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw);
        let missing = || spawn_error(std::io::Error::other("a standard stream was not piped"));
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let stderr = child.stderr.take().ok_or_else(missing)?;

        let diagnostics = Arc::new(Diagnostics::default());
        let (exit_tx, exit) = watch::channel(None);
        let (stderr_tx, stderr_done) = watch::channel(false);
        let waiter = tokio::spawn(async move {
            if let Ok(status) = child.wait().await {
                let _ = exit_tx.send(Some(status));
            }
        });
        let tail = Arc::clone(&diagnostics);
        let reader = tokio::spawn(async move {
            let mut lines = BufReader::new(stderr);
            let mut line = Vec::new();
            loop {
                line.clear();
                match lines.read_until(b'\n', &mut line).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => tail.push_stderr(&String::from_utf8_lossy(&line)),
                }
            }
            let _ = stderr_tx.send(true);
        });
        let transport = ChildTransport {
            reader: BufReader::new(stdout),
            writer: Arc::new(tokio::sync::Mutex::new(Some(stdin))),
            tap: Arc::new(Tap::default()),
            diagnostics: Arc::clone(&diagnostics),
            line: Vec::new(),
        };
        Ok((
            Self {
                pgid,
                exit,
                diagnostics,
                stderr_done,
                tasks: vec![waiter, reader],
                reaped: AtomicBool::new(false),
            },
            transport,
        ))
    }

    /// The process group id (the server's pid), if it was known.
    pub(crate) fn pgid(&self) -> Option<i32> {
        self.pgid.map(Pid::as_raw)
    }

    /// A receiver that changes when the process exits.
    pub(crate) fn exit_watch(&self) -> watch::Receiver<Option<ExitStatus>> {
        self.exit.clone()
    }

    /// How the process ended, waiting up to `wait` for it to end and for its stderr to be
    /// read to the end; `closed its output` if it has not exited by then. Returns that
    /// and the diagnostics text.
    pub(crate) async fn describe_end(&self, wait: Duration) -> (String, String) {
        let mut exit = self.exit.clone();
        let status = tokio::time::timeout(wait, exit.wait_for(Option::is_some))
            .await
            .ok()
            .and_then(|r| r.ok().and_then(|s| *s));
        if status.is_some() {
            let mut done = self.stderr_done.clone();
            let _ = tokio::time::timeout(wait, done.wait_for(|d| *d)).await;
        }
        let status =
            status.map_or_else(|| "closed its output without exiting".to_owned(), describe);
        (status, self.diagnostics.text())
    }

    /// The diagnostics so far (stderr tail, stdout garbage).
    pub(crate) fn diagnostics(&self) -> String {
        self.diagnostics.text()
    }

    fn signal(&self, signal: Signal) {
        if let Some(pgid) = self.pgid {
            // ESRCH (the group is already gone) is the expected outcome after an exit.
            let _ = killpg(pgid, signal);
        }
    }

    /// Stops the whole process group: SIGTERM, up to `grace` for the server to exit, then
    /// SIGKILL to every process left in the group, and waits for the server's exit.
    pub(crate) async fn terminate(&self, grace: Duration) {
        if self.reaped.load(Ordering::Acquire) {
            return;
        }
        let mut exit = self.exit.clone();
        if exit.borrow().is_none() {
            self.signal(Signal::SIGTERM);
            let _ = tokio::time::timeout(grace, exit.wait_for(Option::is_some)).await;
        }
        // Whatever the leader did, anything else in its group goes now.
        self.signal(Signal::SIGKILL);
        let _ = tokio::time::timeout(grace, exit.wait_for(Option::is_some)).await;
        self.reaped.store(true, Ordering::Release);
        let mut done = self.stderr_done.clone();
        let _ = tokio::time::timeout(Duration::from_millis(200), done.wait_for(|d| *d)).await;
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped.load(Ordering::Acquire) {
            // Dropped without `terminate` (a manager dropped without shutdown): kill the
            // group now, synchronously, so no server outlives its owner.
            self.signal(Signal::SIGKILL);
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// JSON-RPC over a child's stdin and stdout, one message per line.
pub(crate) struct ChildTransport {
    reader: BufReader<ChildStdout>,
    writer: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    tap: Arc<Tap>,
    diagnostics: Arc<Diagnostics>,
    line: Vec<u8>,
}

impl ChildTransport {
    /// The tap that keeps raw listing and call results.
    pub(crate) fn tap(&self) -> Arc<Tap> {
        Arc::clone(&self.tap)
    }

    /// Reads one line into `self.line` (without its newline). `Ok(false)` at the end of
    /// output. A line over [`MAX_LINE`] is dropped and reported, and reading goes on.
    async fn read_line(&mut self) -> std::io::Result<bool> {
        self.line.clear();
        let mut too_long = false;
        loop {
            let available = self.reader.fill_buf().await?;
            if available.is_empty() {
                return Ok(!self.line.is_empty());
            }
            let (chunk, consumed, end) = match memchr::memchr(b'\n', available) {
                Some(i) => (&available[..i], i + 1, true),
                None => (available, available.len(), false),
            };
            if !too_long && self.line.len() + chunk.len() <= MAX_LINE {
                self.line.extend_from_slice(chunk);
            } else {
                too_long = true;
                self.line.clear();
            }
            self.reader.consume(consumed);
            if end {
                if too_long {
                    self.diagnostics.push_garbage(format!(
                        "a line over {} MiB, dropped",
                        MAX_LINE / (1024 * 1024)
                    ));
                    too_long = false;
                    continue;
                }
                return Ok(true);
            }
        }
    }

    fn parse(&self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = self.decode(line)?;
        if let JsonRpcMessage::Notification(notification) = &message
            && let ServerNotification::ProgressNotification(progress) = &notification.notification
        {
            self.tap.progress().deliver(progress.params.clone());
        }
        Some(message)
    }

    fn decode(&self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
        if self.tap.is_waiting() {
            let mut value: Value = serde_json::from_slice(line).ok()?;
            self.tap.keep(&mut value);
            serde_json::from_value(value).ok()
        } else {
            serde_json::from_slice(line).ok()
        }
    }
}

impl rmcp::transport::Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.tap.want_request(&item);
        let line = serde_json::to_vec(&item).map(|mut line| {
            line.push(b'\n');
            line
        });
        let writer = Arc::clone(&self.writer);
        async move {
            let line = line.map_err(std::io::Error::other)?;
            let mut writer = writer.lock().await;
            let Some(stdin) = writer.as_mut() else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "the server's stdin is closed",
                ));
            };
            stdin.write_all(&line).await?;
            stdin.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            match self.read_line().await {
                Ok(true) => {}
                Ok(false) | Err(_) => return None,
            }
            let line = self
                .line
                .strip_prefix(b"\xEF\xBB\xBF")
                .unwrap_or(&self.line);
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            match self.parse(line) {
                Some(message) => return Some(message),
                None => {
                    let text = preview(&String::from_utf8_lossy(line));
                    self.diagnostics.push_garbage(text);
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // Closing stdin is the MCP stdio shutdown signal; the process group is stopped by
        // `Child::terminate`.
        if let Some(mut stdin) = self.writer.lock().await.take() {
            let _ = stdin.shutdown().await;
        }
        Ok(())
    }
}
