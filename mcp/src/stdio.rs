//! A stdio server as a child process: spawned in its own process group, its stderr kept
//! (the last lines, bounded), its exit status watched, and everything it started stopped
//! when it is stopped: its process group, and every process of its tree found by
//! [`tree`] (a grandchild that called `setsid` included), also after a failed start, so
//! that nothing it started (a server behind `bash -c`, `npx`, `uv run`) outlives it.
//!
//! The JSON-RPC transport over its stdin and stdout is ours rather than rmcp's
//! `TokioChildProcess`, for these reasons: rmcp's child transport hides the exit status and
//! signals only the direct child; our reader keeps the raw `result` of each `tools/list`
//! response (rmcp's typed `Tool` drops fields it does not model, such as `execution`, and
//! fails a page on one malformed tool), and likewise of each `tools/call` response (rmcp's
//! typed `CallToolResult` drops fields and block types it does not model); lines that
//! are not JSON-RPC are counted and quoted in error messages instead of disappearing; and
//! an answer it cannot deliver fails its request at once rather than at its deadline:
//!
//! - its `receive` is cancel-safe ([`lines`]): rmcp's loop drops it whenever another event
//!   comes first, and a line half read then is resumed, never lost;
//! - a line over [`JSON_ON_WORKER`] is parsed on a blocking thread, not in rmcp's loop on
//!   an async worker, and the parse survives a dropped `receive` (its handle is kept);
//! - invalid UTF-8 and lone surrogate escapes in an answer are replaced by U+FFFD, said
//!   in the result's `_meta` under `psych/lossy` ([`repair`]);
//! - a line over [`SPILL_AT`] is written to an unnamed file as it is read ([`lines`]:
//!   1 MiB chunks on a blocking thread; about 2 MiB of memory past the first 16 MiB); once
//!   it has ended, an answer to a call awaiting its result has its long texts decoded into
//!   files of their own on a blocking thread ([`spill::split`]) and the rest parsed in
//!   memory, the files kept with the raw result in the [`Tap`] and handed to the caller as
//!   [`psych_types::ToolOutput::spilled`]; any other line that long (an `initialize`
//!   answer, a notification, a server's request) is read past and refused, as an HTTP
//!   event over 16 MiB is ([`MAX_SSE_EVENT_BYTES`](crate::MAX_SSE_EVENT_BYTES));
//! - an answer whose in-memory part is over [`MAX_LINE`], or a line over
//!   [`MAX_SPILLED_ANSWER`] (read past without being kept), fails the request whose `id` it
//!   carries (first or last in the line: [`scan`]) with [`McpError::AnswerTooLarge`]; one
//!   whose in-memory part holds more than
//!   [`MAX_JSON_STRUCTURAL_BYTES`](crate::MAX_JSON_STRUCTURAL_BYTES) brackets, braces,
//!   commas and colons is not parsed and fails it with [`McpError::AnswerTooComplex`]; any
//!   other unreadable line that names a request's `id` fails it with
//!   [`McpError::MalformedAnswer`] (both through the [`Tap`]);
//! - once the server process has exited, what it wrote is read to the end and the output
//!   then ends, even if a descendant still holds the pipe open, so a waiting request fails
//!   with [`McpError::Exited`] at once.
//!
//! stderr is read in bounded memory ([`stderr`]): a line ends at `\n` or `\r`, and of a
//! long line only a preview is kept; a line ended by a bare `\r` (a progress bar's frame)
//! is replaced in the tail by the line after it, as a terminal shows it.

mod lines;
pub(crate) mod repair;
pub(crate) mod scan;
mod stderr;
#[cfg(test)]
mod testing;
mod tree;

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use psych_types::ServerId;
use rmcp::RoleClient;
use rmcp::model::{JsonRpcMessage, ServerNotification};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::McpError;
use crate::budget::Reservation;
use crate::server_requests::ServerRequests;
use crate::spill::{self, MAX_SPILLED_ANSWER, SPILL_AT};
use crate::tap::{AnswerFailure, Tap};
use crate::wire::JSON_ON_WORKER;
use lines::{Line, LineReader, Overflow, SpillTo, SpilledLine};
use tree::{Leader, Tag};

/// How often [`Child::terminate`] looks whether the rest of a server's processes have
/// ended within their grace.
const TREE_POLL: Duration = Duration::from_millis(50);

/// The most of a line held in memory: a line over [`SPILL_AT`] is kept in a file, and
/// what of it is then parsed in memory (all but its long texts) must be within this, else
/// it fails the request it answers ([`McpError::AnswerTooLarge`]).
pub(crate) const MAX_LINE: usize = 64 * 1024 * 1024;
/// How many stderr lines are kept.
const STDERR_LINES: usize = 20;
/// How many stderr bytes are kept, all lines together.
const STDERR_BYTES: usize = 8 * 1024;
/// How much of one stderr line (or one garbage stdout line) is kept.
const LINE_PREVIEW: usize = 400;
/// Once the server process has exited, how long its stdout or stderr may stay silent
/// before it is taken as ended (a descendant may hold the pipe open forever). What the
/// server wrote before exiting is already in the pipe, so this is only the time to read
/// it.
const EXIT_QUIET: Duration = Duration::from_millis(200);
/// The byte order mark some servers write before their first line.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// What a stdio server's process is configured as.
pub(crate) struct Command<'a> {
    pub(crate) command: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) env: &'a std::collections::BTreeMap<String, String>,
    pub(crate) cwd: Option<&'a PathBuf>,
    /// Where an answer too large for memory is kept ([`McpManagerBuilder::spill_dir`](crate::McpManagerBuilder::spill_dir)).
    pub(crate) spill_dir: &'a Path,
    /// What such answers may hold on disk ([`McpManagerBuilder::spill_budget`](crate::McpManagerBuilder::spill_budget)).
    pub(crate) budget: &'a crate::SpillBudget,
}

/// A running (or ended) stdio server process and what it said on stderr.
pub(crate) struct Child {
    /// Its pid (and process group id) and start time, if its pid was known.
    leader: Option<Leader>,
    /// The environment variable its processes carry.
    tag: Tag,
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
    /// The last stderr line ended by a bare `\r`: the next line takes its place.
    open_frame: bool,
    garbage_lines: u64,
    last_garbage: String,
}

impl Diagnostics {
    /// Keeps one stderr line's preview (`cut`: the line was longer). A line after one
    /// ended by a bare `\r` takes that one's place, as on a terminal, so that a progress
    /// bar's frames are one line of the tail; an empty (or blank) line leaves it, as a
    /// terminal does.
    fn push_stderr(&self, line: &[u8], cut: bool, end: stderr::End) {
        let text = String::from_utf8_lossy(line);
        let mut line = preview(text.trim_end());
        if cut && !line.ends_with('…') {
            line.push('…');
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let over_frame = std::mem::replace(&mut inner.open_frame, end == stderr::End::Return);
        if over_frame {
            if line.is_empty() {
                // Nothing drawn over the frame. After a `\n` the frame stays as a line;
                // after a `\r` it is still open.
                return;
            }
            if let Some(frame) = inner.stderr.pop_back() {
                inner.stderr_bytes -= frame.len();
            }
        }
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
    format!("{}…", &text[..text.floor_char_boundary(LINE_PREVIEW)])
}

/// [`preview`] of bytes, without decoding more of them than the preview shows.
fn preview_bytes(line: &[u8]) -> String {
    let head = &line[..line.len().min(LINE_PREVIEW + 4)];
    let text = preview(&String::from_utf8_lossy(head));
    if head.len() < line.len() && !text.ends_with('…') {
        return format!("{text}…");
    }
    text
}

/// How a process ended, in words.
pub(crate) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => format!("ended ({status})"),
    }
}

/// Resolves once the process has exited (never, if its waiter is gone without knowing).
async fn exited(mut exit: watch::Receiver<Option<ExitStatus>>) {
    if exit.wait_for(Option::is_some).await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Child {
    /// Starts the server in its own process group with piped stdio and its [`Tag`] in its
    /// environment.
    pub(crate) fn spawn(
        server: &ServerId,
        spec: &Command<'_>,
    ) -> Result<(Self, ChildTransport), McpError> {
        let tag = Tag::new();
        let mut command = tokio::process::Command::new(spec.command);
        command
            .args(spec.args)
            .envs(spec.env)
            .env(tag.name(), server.as_str())
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
        // Read now, while the process cannot have been reaped: its start time tells it
        // from a later process with the same pid (one small read of `/proc/<pid>/stat`).
        let leader = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(|pid| Leader::new(Pid::from_raw(pid)));
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
        let stderr_exit = exited(exit.clone());
        let reader = tokio::spawn(async move {
            stderr::read_lines(stderr, stderr_exit, EXIT_QUIET, |line, cut, end| {
                tail.push_stderr(line, cut, end);
            })
            .await;
            let _ = stderr_tx.send(true);
        });
        let tap = Arc::new(Tap::new(spec.spill_dir.to_path_buf(), spec.budget.clone()));
        let transport =
            ChildTransport::new(stdout, stdin, exit.clone(), tap, Arc::clone(&diagnostics));
        Ok((
            Self {
                leader,
                tag,
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
        self.leader.map(|leader| leader.pid().as_raw())
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

    /// Waits until no process of the server's group or tree is left, or `until`: looks
    /// through `/proc` (on a thread of its own, at most [`tree::DEADLINE`] each) every
    /// [`TREE_POLL`].
    async fn await_tree(&self, until: tokio::time::Instant) {
        let Some(leader) = self.leader else {
            return;
        };
        loop {
            let now = tokio::time::Instant::now();
            if now >= until {
                return;
            }
            let tag = self.tag.clone();
            // Never past `until` for a look that blocks.
            let within = tree::DEADLINE.min(until - now);
            let left = tree::bounded(within, move || tree::members(leader, &tag)).await;
            if left.is_some_and(|left| left.is_empty()) {
                return;
            }
            tokio::time::sleep_until(until.min(tokio::time::Instant::now() + TREE_POLL)).await;
        }
    }

    /// Sends `signal` to the group and to every process of the server's tree, from a
    /// thread of its own, waiting for it at most [`tree::DEADLINE`].
    async fn signal_tree(&self, signal: Signal) {
        let Some(leader) = self.leader else {
            return;
        };
        let tag = self.tag.clone();
        tree::bounded(tree::DEADLINE, move || tree::signal(leader, &tag, signal)).await;
    }

    /// Stops everything the server started: SIGTERM to its group and tree (also when the
    /// server itself has exited already: what it left running gets it), up to `grace` for
    /// the server to exit and then for the rest of its group and tree (a wrapper such as
    /// `sh -c 'server; echo done'` exits at SIGTERM at once, while the server it runs
    /// cleans up), then SIGKILL to whatever is left of its group and tree (a grandchild in
    /// a session of its own included), looking again until none is left; waits for the
    /// server's exit. Each look through `/proc` runs on a thread of its own and is waited
    /// for at most [`tree::DEADLINE`] (those during the grace no later than its end), so
    /// this returns within about `2 × grace + 3 ×` that deadline whatever the processes do.
    pub(crate) async fn terminate(&self, grace: Duration) {
        if self.reaped.load(Ordering::Acquire) {
            return;
        }
        let mut exit = self.exit.clone();
        let until = tokio::time::Instant::now() + grace;
        self.signal_tree(Signal::SIGTERM).await;
        let _ = tokio::time::timeout_at(until, exit.wait_for(Option::is_some)).await;
        self.await_tree(until).await;
        if exit.borrow().is_none() {
            self.signal_tree(Signal::SIGKILL).await;
            let _ = tokio::time::timeout(grace, exit.wait_for(Option::is_some)).await;
        }
        // Whatever the leader did, anything else of its group or tree goes now.
        if let Some(leader) = self.leader {
            let tag = self.tag.clone();
            tree::bounded(tree::DEADLINE, move || tree::stop(leader, &tag)).await;
        }
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
        if !self.reaped.load(Ordering::Acquire)
            && let Some(leader) = self.leader
        {
            // Dropped without `terminate`: a manager dropped without shutdown, or a process
            // on its way out (a second signal, a shutdown past its deadline), which may
            // exit right after this drop. So the group and every process of the tree found
            // in one look are killed now, before this returns (blocking this thread for
            // that look, a few milliseconds, at most `tree::SWEEP_DEADLINE`); if it found
            // any, or left any it could not tell, a thread looks again (for one that forked
            // meanwhile, or came out of `D`), which happens only if this process lives on.
            let tag = self.tag.clone();
            let sweep = {
                let tag = tag.clone();
                move || tree::sweep(leader, &tag)
            };
            if tree::bounded_blocking(tree::SWEEP_DEADLINE, sweep) != Some(true) {
                tree::detach(move || {
                    tree::stop(leader, &tag);
                });
            }
        }
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// JSON-RPC over a child's stdin and stdout, one message per line.
///
/// The server's own requests (`ping`, sampling, roots) are counted while they are
/// unanswered or their answers are being written ([`ServerRequests`]): past the limit a
/// request is dropped unanswered, so a server that sends requests and never reads its
/// stdin makes psych hold at most that many answers, not one per request.
pub(crate) struct ChildTransport {
    reader: ChildReader<ChildStdout>,
    writer: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    /// The server's requests in flight.
    requests: ServerRequests,
}

impl ChildTransport {
    fn new(
        stdout: ChildStdout,
        stdin: ChildStdin,
        exit: watch::Receiver<Option<ExitStatus>>,
        tap: Arc<Tap>,
        diagnostics: Arc<Diagnostics>,
    ) -> Self {
        Self {
            reader: ChildReader::new(stdout, exit, tap, diagnostics),
            writer: Arc::new(tokio::sync::Mutex::new(Some(stdin))),
            requests: ServerRequests::default(),
        }
    }

    /// The tap that keeps raw listing and call results.
    pub(crate) fn tap(&self) -> Arc<Tap> {
        Arc::clone(&self.reader.parser.tap)
    }
}

/// The reading half of [`ChildTransport`], over any reader (tests use a pipe): lines to
/// JSON-RPC messages, through the tap.
struct ChildReader<R> {
    lines: LineReader<R>,
    exit: watch::Receiver<Option<ExitStatus>>,
    /// Set once the process is known to have exited.
    exited: bool,
    parser: Parser,
    /// The parse of a line over [`JSON_ON_WORKER`], on a blocking thread: kept here so
    /// that a `receive` dropped while it runs loses nothing.
    parsing: Option<JoinHandle<Option<RxJsonRpcMessage<RoleClient>>>>,
    /// Held by a test to keep a blocking parse from finishing.
    #[cfg(test)]
    parse_gate: Arc<tokio::sync::Mutex<()>>,
}

/// What turns lines into messages, shared with the blocking thread that parses a long one.
#[derive(Clone)]
struct Parser {
    tap: Arc<Tap>,
    diagnostics: Arc<Diagnostics>,
}

impl<R: AsyncRead + Unpin> ChildReader<R> {
    fn new(
        reader: R,
        exit: watch::Receiver<Option<ExitStatus>>,
        tap: Arc<Tap>,
        diagnostics: Arc<Diagnostics>,
    ) -> Self {
        Self {
            lines: LineReader::new(reader, SPILL_AT)
                .spilling(SpillTo {
                    dir: tap.spill_dir().to_path_buf(),
                    max: MAX_SPILLED_ANSWER,
                    budget: tap.budget().clone(),
                })
                .noting(Arc::clone(tap.transfer())),
            exit,
            exited: false,
            parser: Parser { tap, diagnostics },
            parsing: None,
            #[cfg(test)]
            parse_gate: Arc::default(),
        }
    }

    /// The next line, `None` at the end of the output: at EOF, at a read error, or once the
    /// process has exited and the pipe has been quiet for [`EXIT_QUIET`] (no byte read and
    /// no write of a line to its file in flight). Cancel-safe.
    async fn next_line(&mut self) -> Option<Line> {
        if !self.exited {
            tokio::select! {
                biased;
                line = self.lines.next() => return line.ok().flatten(),
                Ok(_) = self.exit.wait_for(Option::is_some) => self.exited = true,
            }
        }
        // The process has exited: what it wrote is in the pipe; read on while bytes come.
        loop {
            let before = self.lines.consumed();
            match tokio::time::timeout(EXIT_QUIET, self.lines.next()).await {
                Ok(line) => return line.ok().flatten(),
                // Quiet: nothing taken from the pipe, and no line being written to its file
                // (a write to a slow disk takes no byte from the pipe while it runs).
                Err(_) if self.lines.consumed() == before && !self.lines.is_writing() => {
                    return None;
                }
                Err(_) => {}
            }
        }
    }

    /// The next JSON-RPC message for rmcp. Cancel-safe: the awaits are
    /// [`ChildReader::next_line`] and the parse of a long line (its handle kept in `self`,
    /// so a dropped `receive` finds it again), and a line or parse they return is handled
    /// without another.
    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            let message = if let Some(parsing) = self.parsing.as_mut() {
                let parsed = parsing.await;
                self.parsing = None;
                // A failed task (a panic in serde_json) loses that one line.
                parsed.ok().flatten()
            } else {
                match self.next_line().await? {
                    Line::Whole(line) if line.len() > JSON_ON_WORKER => {
                        self.parse_off_worker(line);
                        continue;
                    }
                    Line::Whole(line) => self.parser.read(&line),
                    Line::TooLong(overflow) => self.parser.too_long(overflow),
                    Line::Spilled(line) => {
                        self.parse_spilled(line);
                        continue;
                    }
                }
            };
            if let Some(message) = message {
                // In the order read: before rmcp has the next message (a result, a page).
                if let JsonRpcMessage::Notification(notification) = &message {
                    match &notification.notification {
                        ServerNotification::ProgressNotification(progress) => {
                            self.parser.tap.progress().deliver(progress.params.clone());
                        }
                        ServerNotification::ToolListChangedNotification(_) => {
                            self.parser.tap.tools_changed();
                        }
                        _ => {}
                    }
                }
                return Some(message);
            }
        }
    }

    /// Starts the parse of a long line on a blocking thread; [`ChildReader::receive`]
    /// awaits it before reading on, so messages keep their order.
    fn parse_off_worker(&mut self, line: Vec<u8>) {
        let parser = self.parser.clone();
        #[cfg(test)]
        let gate = Arc::clone(&self.parse_gate);
        self.parsing = Some(tokio::task::spawn_blocking(move || {
            #[cfg(test)]
            drop(gate.blocking_lock());
            parser.read(&line)
        }));
    }
}

impl<R> ChildReader<R> {
    /// Starts reading a spilled line back (its last chunk written, then its texts split
    /// off on a blocking thread); [`ChildReader::receive`] awaits it as it awaits a parse.
    fn parse_spilled(&mut self, line: SpilledLine) {
        let parser = self.parser.clone();
        #[cfg(test)]
        let gate = Arc::clone(&self.parse_gate);
        self.parsing = Some(tokio::spawn(async move {
            let (bytes, id, has_method) = (line.bytes(), line.id(), line.has_method());
            let file = line.finish().await;
            let read = tokio::task::spawn_blocking(move || {
                #[cfg(test)]
                drop(gate.blocking_lock());
                parser.read_spilled(file, bytes, id, has_method)
            });
            read.await.ok().flatten()
        }));
    }
}

impl Parser {
    /// A line read into a file (over [`SPILL_AT`]). An answer to a request awaiting its
    /// result has its long texts split off into files ([`spill::split`]) and the rest
    /// parsed as [`Parser::read`] parses a line, the texts kept with the result in the
    /// tap; any other line is read past as too long (the request it answers, if any,
    /// fails). Blocks (file reads and writes).
    fn read_spilled(
        &self,
        file: std::io::Result<(std::fs::File, Reservation)>,
        bytes: u64,
        id: Option<String>,
        has_method: bool,
    ) -> Option<RxJsonRpcMessage<RoleClient>> {
        use std::io::Seek as _;
        let unwritable = |error: &std::io::Error| {
            format!(
                "it could not be kept in a file in {}: {error}",
                self.tap.spill_dir().display()
            )
        };
        let (file, held) = match file.and_then(|(mut file, held)| {
            file.rewind()?;
            Ok((file, held))
        }) {
            Ok(kept) => kept,
            Err(error) => {
                return self.too_long(Overflow {
                    bytes,
                    id,
                    has_method,
                    limit: MAX_LINE as u64,
                    unwritable: Some(unwritable(&error)),
                    over_budget: None,
                });
            }
        };
        let answer = id.clone().filter(|id| !has_method && self.tap.is_open(id));
        let Some(key) = answer else {
            // Not an answer psych-mcp reads itself (an `initialize` or `ping` answer, a
            // notification, a server's request): none is kept over `SPILL_AT`, as an HTTP
            // event over 16 MiB is not read, rather than read back into memory.
            drop((file, held));
            return self.too_long(Overflow {
                bytes,
                id,
                has_method,
                limit: SPILL_AT as u64,
                unwritable: None,
                over_budget: None,
            });
        };
        let too_large = Overflow {
            bytes,
            id,
            has_method,
            limit: MAX_LINE as u64,
            unwritable: None,
            over_budget: None,
        };
        match spill::read_answer(file, held, &self.tap) {
            Ok(message) => match serde_json::from_value(message) {
                Ok(message) => Some(message),
                Err(error) => self.fail(
                    key,
                    AnswerFailure::Malformed {
                        reason: format!("not a JSON-RPC message: {error}"),
                    },
                ),
            },
            Err(spill::Refused::TooLarge) => self.too_long(too_large),
            Err(spill::Refused::TooComplex) => self.too_complex(bytes, Some(key)),
            Err(spill::Refused::Malformed(reason)) => {
                let reason = format!("{reason} (in an answer of {bytes} bytes)");
                self.diagnostics
                    .push_garbage(format!("an answer of {bytes} bytes that could not be read"));
                self.fail(key, AnswerFailure::Malformed { reason })
            }
            Err(spill::Refused::Unreadable { rest, error }) => {
                self.unreadable(&rest, &error, Some(Some(key)))
            }
            Err(spill::Refused::Io(error)) => self.too_long(Overflow {
                unwritable: Some(unwritable(&error)),
                ..too_large
            }),
            Err(spill::Refused::OverBudget(refused)) => self.too_long(Overflow {
                over_budget: Some(refused),
                ..too_large
            }),
        }
    }

    /// One line as a message: typed straight from the bytes when no raw result is awaited;
    /// else (or when that fails) through a JSON value the tap may keep the result of, read
    /// a second time with invalid UTF-8 and lone surrogates replaced if need be. `None`
    /// for a blank line or one that is not JSON-RPC (counted and quoted), after failing
    /// the request it names, if it names one.
    fn read(&self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
        let line = line.strip_prefix(BOM).unwrap_or(line).trim_ascii();
        if line.is_empty() {
            return None;
        }
        if crate::wire::too_complex(line) {
            return self.too_complex(line.len() as u64, scan::answer_id(line));
        }
        if !self.tap.is_waiting()
            && let Ok(message) = serde_json::from_slice(line)
        {
            return Some(message);
        }
        let mut value = match repair::parse_or_repair(line) {
            Ok((value, _)) => value,
            Err(error) => return self.unreadable(line, &error.to_string(), None),
        };
        self.tap.keep(&mut value);
        let id = (value.get("method").is_none())
            .then(|| value.get("id").map(Value::to_string))
            .flatten();
        match serde_json::from_value(value) {
            Ok(message) => Some(message),
            Err(error) => {
                self.unreadable(line, &format!("not a JSON-RPC message: {error}"), Some(id))
            }
        }
    }

    /// A line that could not be read as a message: quoted as stdout garbage, and if it
    /// answers a request (a top-level `id`, no `method`; `id` when already known), that
    /// request fails with [`McpError::MalformedAnswer`].
    fn unreadable(
        &self,
        line: &[u8],
        error: &str,
        id: Option<Option<String>>,
    ) -> Option<RxJsonRpcMessage<RoleClient>> {
        let quote = preview_bytes(line);
        let id = id.unwrap_or_else(|| scan::answer_id(line));
        let reason = format!("{error}; it reads: {quote:?}");
        self.diagnostics.push_garbage(quote);
        self.fail(id?, AnswerFailure::Malformed { reason })
    }

    /// A line of `bytes` bytes with more structural bytes than psych-mcp parses: noted as
    /// stdout garbage, and the request it answers (`id`, if it answers one) fails with
    /// [`McpError::AnswerTooComplex`]; anything else is dropped unparsed.
    fn too_complex(&self, bytes: u64, id: Option<String>) -> Option<RxJsonRpcMessage<RoleClient>> {
        self.diagnostics.push_garbage(format!(
            "a line of {bytes} bytes with over {} brackets, braces, commas and colons, not \
             parsed",
            crate::MAX_JSON_STRUCTURAL_BYTES
        ));
        self.fail(id?, AnswerFailure::too_complex(bytes))
    }

    /// A line over a limit (what stays in memory over [`MAX_LINE`], the whole over
    /// [`MAX_SPILLED_ANSWER`]), or one that could not be kept in a file: noted as stdout
    /// garbage, and the request it answers fails with [`McpError::AnswerTooLarge`] (or
    /// [`McpError::MalformedAnswer`] saying why it could not be kept).
    fn too_long(&self, overflow: Overflow) -> Option<RxJsonRpcMessage<RoleClient>> {
        let Overflow {
            bytes,
            id,
            has_method,
            limit,
            unwritable,
            over_budget,
        } = overflow;
        let failure = match (unwritable, over_budget) {
            (_, Some(refused)) => {
                self.diagnostics.push_garbage(format!(
                    "a line of {bytes} bytes dropped: keeping it in files would pass the \
                     spill budget of {} bytes",
                    refused.limit
                ));
                AnswerFailure::over_budget(bytes, refused)
            }
            (Some(why), None) => {
                self.diagnostics
                    .push_garbage(format!("a line of {bytes} bytes dropped: {why}"));
                AnswerFailure::Malformed {
                    reason: format!("the answer is {bytes} bytes and {why}"),
                }
            }
            (None, None) => {
                self.diagnostics.push_garbage(format!(
                    "a line of {bytes} bytes, over the {} MiB limit, dropped",
                    limit / (1024 * 1024)
                ));
                AnswerFailure::TooLarge { bytes, limit }
            }
        };
        let id = id.filter(|_| !has_method)?;
        self.fail(id, failure)
    }

    /// Fails request `id` (JSON text) in the tap and gives rmcp an error answer for it, so
    /// that it stops waiting at once.
    fn fail(&self, id: String, failure: AnswerFailure) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = failure.to_message(serde_json::from_str(&id).ok()?);
        self.tap.fail(&id, failure);
        serde_json::from_value(message).ok()
    }
}

impl rmcp::transport::Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.reader.parser.tap.want_request(&item);
        // An answer's request is in flight until this is done or dropped.
        let answering = self.requests.sending(&item);
        // Serialized here when short; a long one (a call passing results of up to 16 MiB)
        // on a blocking thread, before the writer is waited for.
        let line = crate::wire::line_on_worker(item);
        let writer = Arc::clone(&self.writer);
        async move {
            let _answering = answering;
            let line = match line? {
                Ok(line) => line,
                Err(item) => crate::wire::line_off_worker(item).await?,
            };
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
            let message = self.reader.receive().await?;
            // No await from here on: a dropped `receive` loses nothing it took.
            if !self.requests.received(&message) {
                continue;
            }
            return Some(message);
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

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use rmcp::model::{
        CallToolRequest, CallToolRequestParams, ClientJsonRpcMessage, ClientRequest, RequestId,
    };
    use rmcp::transport::Transport as _;
    use tokio::io::AsyncWriteExt;

    use super::testing::{Rng, poll_once, poll_up_to};
    use super::*;
    use crate::in_flight::MAX_PEER_REQUESTS;

    /// `sh -c script` spawned as the server `name`, with default settings.
    fn spawn_script(name: &str, script: &str) -> (Child, ChildTransport) {
        let args = vec!["-c".to_owned(), script.to_owned()];
        let env = std::collections::BTreeMap::new();
        let budget = crate::SpillBudget::default();
        let dir = std::env::temp_dir();
        let spec = Command {
            command: "sh",
            args: &args,
            env: &env,
            cwd: None,
            spill_dir: &dir,
            budget: &budget,
        };
        let server = ServerId::new(name).unwrap();
        Child::spawn(&server, &spec).unwrap()
    }

    const CHANGED: &[u8] =
        b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/tools/list_changed\"}\n";

    fn reader(
        pipe: tokio::io::DuplexStream,
    ) -> (
        ChildReader<tokio::io::DuplexStream>,
        watch::Sender<Option<ExitStatus>>,
        Arc<Tap>,
    ) {
        let (exit_tx, exit) = watch::channel(None);
        let tap = Arc::new(Tap::default());
        let reader = ChildReader::new(
            pipe,
            exit,
            Arc::clone(&tap),
            Arc::new(Diagnostics::default()),
        );
        (reader, exit_tx, tap)
    }

    /// The data of message `i`: its number, then `len` bytes in all.
    fn data(i: usize, len: usize) -> String {
        let mut data = format!("{i}:");
        let filler = char::from(b'a' + (i % 26) as u8);
        data.extend(std::iter::repeat_n(filler, len.saturating_sub(data.len())));
        data
    }

    /// Finding 1 where rmcp meets it: `receive` futures dropped after a random number of
    /// polls while messages carrying 1 B to 8 MiB of data arrive in chunks of random sizes;
    /// every message arrives whole and in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn messages_arrive_whole_and_in_order_when_receives_are_dropped() {
        const MAX: u64 = 8 * 1024 * 1024;
        for seed in [3, 0x5EED_F00D] {
            let mut rng = Rng(seed);
            let mut sizes: Vec<usize> = (0..24).map(|_| rng.size(MAX) as usize).collect();
            sizes[0] = 1;
            sizes[1] = MAX as usize;
            let (mut writer, pipe) = tokio::io::duplex(64 * 1024);
            let (mut reader, _exit, _) = reader(pipe);
            let written = sizes.clone();
            let mut writer_rng = Rng(rng.next() | 1);
            let writing = tokio::spawn(async move {
                for (i, &len) in written.iter().enumerate() {
                    let line = format!(
                        r#"{{"jsonrpc":"2.0","method":"notifications/psych_test","params":{{"data":"{}"}}}}"#,
                        data(i, len)
                    ) + "\n";
                    let mut rest = line.as_bytes();
                    while !rest.is_empty() {
                        let take = (writer_rng.size(256 * 1024) as usize).min(rest.len());
                        writer.write_all(&rest[..take]).await.unwrap();
                        rest = &rest[take..];
                        if writer_rng.below(4) == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                }
            });
            let mut dropped = 0u64;
            for (i, &len) in sizes.iter().enumerate() {
                let message = loop {
                    let polls = rng.below(6);
                    let mut receive = std::pin::pin!(reader.receive());
                    match poll_up_to(&mut receive, polls).await {
                        Some(message) => break message.expect("a message"),
                        None => dropped += 1,
                    }
                };
                let JsonRpcMessage::Notification(notification) = message else {
                    panic!("seed {seed}: message {i} is not a notification");
                };
                let ServerNotification::CustomNotification(custom) = notification.notification
                else {
                    panic!("seed {seed}: message {i} is not the test's notification");
                };
                let params = custom.params.unwrap_or_default();
                let got = params["data"].as_str().unwrap_or_default();
                assert!(
                    got == data(i, len),
                    "seed {seed}: message {i} of {len} B came as {} B",
                    got.len()
                );
            }
            writing.await.unwrap();
            assert!(
                dropped > 50,
                "seed {seed}: only {dropped} receives were dropped"
            );
        }
    }

    /// The stderr tail of `input`, read as a server's stderr is.
    async fn tail(input: &[u8]) -> Vec<String> {
        let diagnostics = Diagnostics::default();
        stderr::read_lines(
            input,
            std::future::pending(),
            Duration::ZERO,
            |line, cut, end| {
                diagnostics.push_stderr(line, cut, end);
            },
        )
        .await;
        diagnostics
            .inner
            .lock()
            .unwrap()
            .stderr
            .iter()
            .cloned()
            .collect()
    }

    /// Review item 4: a progress bar's `\r` frames after the line that says why the server
    /// stops are one line of the tail, so that line is still there at the exit.
    #[tokio::test]
    async fn progress_frames_are_one_line_of_the_stderr_tail() {
        let mut input = b"starting\nfatal: the catalogue database is locked\n".to_vec();
        for i in 1..=1_000 {
            input.extend_from_slice(format!("retrying {i}/1000\r").as_bytes());
        }
        assert_eq!(
            tail(&input).await,
            [
                "starting",
                "fatal: the catalogue database is locked",
                "retrying 1000/1000"
            ]
        );
        // As a terminal shows it: the line after a frame takes its place (a `\r\n` ends a
        // line, not a frame); an empty one leaves it.
        assert_eq!(
            tail(b"10%\r20%\r\rdone\r\nnext\n30%\r\nlast").await,
            ["done", "next", "30%", "last"]
        );
        assert_eq!(tail(b"a\n\nb\r\n").await, ["a", "", "b"]);
    }

    /// Review item 5: a line over [`JSON_ON_WORKER`] is not parsed inside `receive`'s
    /// poll (on an async worker) but on a blocking thread, and a `receive` dropped while
    /// that parse runs loses nothing: the next one delivers the message.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_line_is_parsed_off_the_worker_and_survives_a_dropped_receive() {
        let text = data(1, 2 * JSON_ON_WORKER);
        let line = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/psych_test","params":{{"data":"{text}"}}}}"#
        ) + "\n";
        let (mut writer, pipe) = tokio::io::duplex(line.len() + 1);
        writer.write_all(line.as_bytes()).await.unwrap();
        let (mut reader, _exit, _) = reader(pipe);
        // The parse cannot finish while the gate is held.
        let gate = Arc::clone(&reader.parse_gate).lock_owned().await;
        {
            let mut receive = std::pin::pin!(reader.receive());
            for _ in 0..16 {
                assert!(
                    poll_once(&mut receive).await.is_pending(),
                    "the line was parsed inside the poll"
                );
                tokio::task::yield_now().await;
            }
        }
        assert!(reader.parsing.is_some(), "the line was not read whole");
        drop(gate);
        let Some(JsonRpcMessage::Notification(notification)) = reader.receive().await else {
            panic!("no message");
        };
        let ServerNotification::CustomNotification(custom) = notification.notification else {
            panic!("not the test's notification");
        };
        assert!(custom.params.unwrap_or_default()["data"] == text.as_str());
        assert!(reader.parsing.is_none());
        // A short line is still read in the poll.
        writer.write_all(CHANGED).await.unwrap();
        assert!(reader.receive().await.is_some());
    }

    /// A line over [`SPILL_AT`] that answers a call has its text kept in a file, with the
    /// result in the tap (rmcp gets the stand-in); an error answer that long reaches rmcp
    /// as it is (it must end the call, not wait out its deadline).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_answer_is_kept_in_files_and_a_long_error_still_ends_its_call() {
        let text = data(1, SPILL_AT + 10);
        let (mut writer, pipe) = tokio::io::duplex(1024 * 1024);
        let (mut reader, _exit, tap) = reader(pipe);
        for id in [1, 2] {
            let request = ClientRequest::CallToolRequest(CallToolRequest::new(
                CallToolRequestParams::new("echo"),
            ));
            tap.want_request(&JsonRpcMessage::request(request, RequestId::Number(id)));
        }
        let (result, error) = (
            tap.claim(RequestId::Number(1)),
            tap.claim(RequestId::Number(2)),
        );
        let lines = format!(
            r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":"{text}"}}]}}}}
{{"jsonrpc":"2.0","id":2,"error":{{"code":-1,"message":"{text}"}}}}
"#
        );
        let writing = tokio::spawn(async move {
            writer.write_all(lines.as_bytes()).await.unwrap();
            writer
        });
        let Some(JsonRpcMessage::Response(response)) = reader.receive().await else {
            panic!("no response");
        };
        assert_eq!(response.id, RequestId::Number(1));
        let Some(Ok(kept)) = result.take() else {
            panic!("nothing kept");
        };
        assert_eq!(kept.spilled.len(), 1);
        let spilled = &kept.spilled[0];
        assert_eq!(spilled.text.len(), text.len() as u64);
        assert!(spilled.text.read_to_string().unwrap() == text);
        assert_eq!(
            kept.value["content"][0]["text"],
            spilled.text.placeholder().as_str()
        );
        let Some(JsonRpcMessage::Error(answer)) = reader.receive().await else {
            panic!("no error");
        };
        assert_eq!(answer.id, Some(RequestId::Number(2)));
        assert_eq!(answer.error.message.len(), text.len());
        drop(error);
        drop(writing.await.unwrap());
    }

    /// A line over [`SPILL_AT`] that answers nothing psych-mcp reads itself (a notification;
    /// the answer to a request rmcp sends, as `ping`) is read past, not read back into
    /// memory, as an HTTP event that long is not read: the request it answers ends at once
    /// with an error saying so, and the next line reads.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_long_line_psych_does_not_read_itself_is_read_past() {
        let text = data(1, SPILL_AT + 10);
        let (mut writer, pipe) = tokio::io::duplex(1024 * 1024);
        let (mut reader, _exit, _tap) = reader(pipe);
        let lines = format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"level":"info","data":"{text}"}}}}
{{"jsonrpc":"2.0","id":9,"result":{{"pad":"{text}"}}}}
"#
        );
        let writing = tokio::spawn(async move {
            writer.write_all(lines.as_bytes()).await.unwrap();
            writer.write_all(CHANGED).await.unwrap();
            writer
        });
        let Some(JsonRpcMessage::Error(answer)) = reader.receive().await else {
            panic!("the long answer is not refused");
        };
        assert_eq!(answer.id, Some(RequestId::Number(9)));
        assert!(
            answer.error.message.contains(&SPILL_AT.to_string()),
            "{}",
            answer.error.message
        );
        assert!(matches!(
            reader.receive().await,
            Some(JsonRpcMessage::Notification(_))
        ));
        drop(writing.await.unwrap());
    }

    /// A server that sends requests and never reads its stdin: past
    /// [`MAX_PEER_REQUESTS`] in flight, its requests are dropped, so psych holds at most
    /// that many answers; an answer written lets the next one in; a request reusing an
    /// unanswered id is dropped; requests that come while `initialize` waits for its
    /// answer (which rmcp ignores) are forgotten when it comes; a cancellation from a
    /// server that answered `initialize` frees its request's place.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_that_sends_requests_and_never_reads_is_answered_a_bounded_number() {
        let script = r#"
            ping() { echo "{\"jsonrpc\":\"2.0\",\"id\":$1,\"method\":\"ping\"}"; }
            ping 1001; ping 1002; ping 1003
            echo '{"jsonrpc":"2.0","id":0,"result":{}}'
            i=0
            while [ $i -lt 100 ]; do i=$((i+1)); ping $i; done
            echo '{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}'
            ping 101; ping 101
            echo '{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}'
            echo '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2}}'
            ping 102
            exec sleep 30
        "#;
        let (child, mut transport) = spawn_script("pinger", script);
        let initialize: ClientJsonRpcMessage = serde_json::from_value(serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            },
        }))
        .unwrap();
        transport.send(initialize).await.unwrap();
        let request_id = |message: JsonRpcMessage<_, _, _>| match message {
            JsonRpcMessage::Request(request) => request.id,
            other => panic!("not a request: {other:?}"),
        };
        for early in 1001..=1003 {
            let id = request_id(transport.receive().await.unwrap());
            assert_eq!(id, RequestId::Number(early));
        }
        assert_eq!(transport.requests.len(), 3);
        let answer = transport.receive().await.unwrap();
        assert!(matches!(answer, JsonRpcMessage::Response(_)), "{answer:?}");
        assert!(
            transport.requests.len() == 0,
            "forgotten at the handshake's answer"
        );
        let mut ids = Vec::new();
        let notification = loop {
            match transport.receive().await.unwrap() {
                JsonRpcMessage::Request(request) => ids.push(request.id),
                other => break other,
            }
        };
        assert!(matches!(notification, JsonRpcMessage::Notification(_)));
        let expected: Vec<_> = (1..=MAX_PEER_REQUESTS as i64)
            .map(RequestId::Number)
            .collect();
        assert_eq!(ids, expected, "the first ones pass, the rest are dropped");
        assert_eq!(transport.requests.len(), MAX_PEER_REQUESTS);
        // One answer written (the pipe takes it, unread) lets ping 101 in; the same id
        // again, unanswered, is dropped.
        let answer = ClientJsonRpcMessage::response(
            rmcp::model::ClientResult::empty(()),
            RequestId::Number(1),
        );
        transport.send(answer).await.unwrap();
        assert_eq!(transport.requests.len(), MAX_PEER_REQUESTS - 1);
        let id = request_id(transport.receive().await.unwrap());
        assert_eq!(id, RequestId::Number(101));
        let next = transport.receive().await.unwrap();
        assert!(matches!(next, JsonRpcMessage::Notification(_)), "{next:?}");
        assert_eq!(transport.requests.len(), MAX_PEER_REQUESTS);
        // The server (of an earlier revision: it answered initialize) cancels ping 2,
        // whose answer rmcp then drops: its place goes to ping 102.
        let cancel = transport.receive().await.unwrap();
        assert!(
            matches!(cancel, JsonRpcMessage::Notification(_)),
            "{cancel:?}"
        );
        assert_eq!(transport.requests.len(), MAX_PEER_REQUESTS - 1);
        let id = request_id(transport.receive().await.unwrap());
        assert_eq!(id, RequestId::Number(102));
        child.terminate(Duration::from_millis(100)).await;
    }

    /// A `server/discover` answered late, after rmcp gave up on it and sent `initialize`,
    /// does not take the place of `initialize`'s answer: that one still says the server is
    /// of an earlier revision, whose cancellations free their requests' places.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_discover_answer_leaves_initialize_to_say_the_revision() {
        let script = r#"
            echo '{"jsonrpc":"2.0","id":0,"result":{}}'
            echo '{"jsonrpc":"2.0","id":1,"result":{}}'
            echo '{"jsonrpc":"2.0","id":5,"method":"ping"}'
            echo '{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5}}'
            exec sleep 30
        "#;
        let (child, mut transport) = spawn_script("late", script);
        for request in [
            serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "server/discover", "params": {}}),
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            }}),
        ] {
            let request: ClientJsonRpcMessage = serde_json::from_value(request).unwrap();
            transport.send(request).await.unwrap();
        }
        assert_eq!(transport.requests.handshakes(), 2);
        for _ in 0..2 {
            let answer = transport.receive().await.unwrap();
            assert!(matches!(answer, JsonRpcMessage::Response(_)), "{answer:?}");
        }
        assert!(
            transport.requests.is_legacy(),
            "initialize's answer says the revision"
        );
        let ping = transport.receive().await.unwrap();
        assert!(matches!(ping, JsonRpcMessage::Request(_)), "{ping:?}");
        assert_eq!(transport.requests.len(), 1);
        let cancel = transport.receive().await.unwrap();
        assert!(
            matches!(cancel, JsonRpcMessage::Notification(_)),
            "{cancel:?}"
        );
        assert_eq!(transport.requests.len(), 0);
        child.terminate(Duration::from_millis(100)).await;
    }

    #[tokio::test]
    async fn after_the_exit_what_was_written_is_read_then_the_output_ends_though_still_open() {
        let (mut writer, pipe) = tokio::io::duplex(1024);
        let (mut reader, exit, _) = reader(pipe);
        writer.write_all(CHANGED).await.unwrap();
        writer.write_all(CHANGED).await.unwrap();
        exit.send(Some(ExitStatus::from_raw(0))).unwrap();
        assert!(reader.receive().await.is_some());
        assert!(reader.receive().await.is_some());
        // The writer (a grandchild holding the pipe) is still there.
        assert!(reader.receive().await.is_none());
        drop(writer);
    }

    #[tokio::test]
    async fn an_unreadable_answer_fails_its_request_in_the_tap_and_ends_it_in_rmcp() {
        let (mut writer, pipe) = tokio::io::duplex(1024);
        let (mut reader, _exit, tap) = reader(pipe);
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("echo"),
        ));
        tap.want_request(&JsonRpcMessage::request(request, RequestId::Number(5)));
        let claim = tap.claim(RequestId::Number(5));
        writer
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{\"content\":[{\"text\":\"cut\n")
            .await
            .unwrap();
        let Some(JsonRpcMessage::Error(error)) = reader.receive().await else {
            panic!("no error answer for rmcp");
        };
        assert_eq!(error.id, Some(RequestId::Number(5)));
        let Some(Err(AnswerFailure::Malformed { reason })) = claim.take() else {
            panic!("no failure in the tap");
        };
        assert!(
            reason.starts_with("EOF while parsing a string")
                && reason.ends_with(r#"it reads: "{\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{\"content\":[{\"text\":\"cut""#),
            "{reason}"
        );
        // A line that names no request is only counted.
        writer.write_all(b"not json\n").await.unwrap();
        writer.write_all(CHANGED).await.unwrap();
        assert!(matches!(
            reader.receive().await,
            Some(JsonRpcMessage::Notification(_))
        ));
        assert!(reader.parser.diagnostics.text().contains("2 line(s)"));
    }
}
