//! The workspace's own MCP server for tests and demos, built on rmcp's server side, run as
//! the `psych-test-server` binary of the psych-tests crate and as the `psych` command's
//! embedded servers (`psych serve-embedded`). Not published: it is a fixture. It speaks
//! stdio or streamable HTTP (loopback only), and its behaviour is set by a [`Scenario`] (command-line flags or a JSON
//! scenario) and by control tools it exposes:
//!
//! | tool | what it does |
//! |---|---|
//! | `echo {text}` | answers the text |
//! | `add_tool {name}` / `remove_tool {name}` | changes the catalogue and sends `list_changed` |
//! | `large {bytes}` | a text result of that many bytes |
//! | `mixed` | text, a real PNG image made in code, text |
//! | `structured` | `structuredContent` with its text rendering |
//! | `binary` | an embedded blob resource (binary bytes, base64) |
//! | `fail {message}` | a tool error (`isError: true`) |
//! | `crash` | writes to stderr and exits with status 70 mid-call |
//! | `hang` | never answers (until cancelled); with `--announce-hang` and a progress token, first reports progress 0 ("hanging"), so a client knows the call arrived |
//! | `sleep {ms, tag}` | answers `tag` after `ms` milliseconds; with `barrier: N` (an argument its listed schema leaves out, so that listings stay as they are), first waits until N `sleep` calls with a `barrier` have arrived at this server process, itself included, and reports progress 0 ("waiting") as it starts waiting when the call carries a progress token |
//! | `cancellations` | how many calls were cancelled so far |
//! | `progress {steps}` | sends `steps` progress notifications with the call's progress token, then answers |
//! | `garbage {lines}` | writes lines that are not JSON-RPC to stdout, then answers |
//! | `client_info` | the protocol version the client asked for and, over HTTP, its `Authorization` header |
//! | `end_subscriptions` | not listed: ends every open `subscriptions/listen` stream (its final result) |
//! | `subscriptions` | not listed: how many `subscriptions/listen` streams are open and watching for changes |
//! | (HTTP) `cut_stream {bytes}`, `end_stream` | not listed: an event stream cut mid-event, or ended before any answer; and paths under `/moved` redirect (see `raw_http`) |
//! | `exotic {known_only, structured_only}` | [`exotic_result`] as raw JSON: fields and a block type rmcp does not model ([`exotic_known_result`], without the unknown block type, if `known_only` is true; [`exotic_structured_result`], no content block and structured content, if `structured_only` is) |
//! | `confirm {text}` | listed with `--modern-only` only: MCP 2026-07-28's `input_required`, an elicitation under the key `confirm` and the state [`confirm_state`]; retried with an `accept` (`{name}`) and that state byte for byte, "confirmed TEXT by NAME"; -32021 when the call declares no elicitation capability |
//!
//! Over stdio, unlisted `raw_*` tools answer with lines rmcp cannot write (invalid UTF-8,
//! a lone surrogate escape, a line over the client's cap, a line cut short, and
//! `raw_huge {mib, second_mib, lone_surrogate, bad_utf8, pause_ms}`: a text result of any size
//! written as it is made, never held; see [`huge_lines`]): see `stdio_faults.rs`.
//!
//! By default it is a server of the revisions with `initialize` (up to 2025-11-25), as every
//! server from before MCP 2026-07-28: it answers `server/discover` "method not found", and
//! a client of that revision falls back to `initialize`. With [`Scenario::modern_only`]
//! (`--modern-only`) it speaks 2026-07-28 alone, over stdio and HTTP: `server/discover`
//! and per-request `_meta`, `initialize` refused, and `list_changed` only on a
//! `subscriptions/listen` stream.
//!
//! plus [`Scenario::tools`] generated tools of the kind [`Scenario::kind`]
//! ([`synthetic_catalog`]), each answering with its name and
//! arguments, and the tools of a catalogue file ([`Scenario::catalog`], e.g. a real
//! server's `tools/list` captured in `../shared/fixtures/catalogs/`), answering the same way.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientNotification, ClientRequest,
    ContentBlock, CustomResult, DiscoverResult, ErrorData, Implementation, InitializeRequestParams,
    InitializeResult, JsonRpcMessage, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ProtocolVersion, RequestMetaObject, ResourceContents,
    ServerCapabilities, ServerNotification, ServerResult, SubscriptionFilter,
    ToolListChangedNotification,
};
use rmcp::service::{
    NotificationContext, Peer, RequestContext, RxJsonRpcMessage, SubscriptionContext,
    TxJsonRpcMessage,
};
use rmcp::{RoleServer, ServerHandler, Service, ServiceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

mod png;
mod raw_http;
mod stdio_faults;
mod synthetic;

pub use stdio_faults::{
    FORGED_ERROR_MESSAGE, bad_utf8_text, huge_end, huge_line, huge_lines, many_values_answer,
};
pub use synthetic::{SyntheticKind, synthetic_catalog, synthetic_tools};

/// What the test server does, beyond answering its control tools.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "snake_case")]
#[non_exhaustive]
pub struct Scenario {
    /// How many generated tools to serve besides the control tools.
    pub tools: usize,
    /// The kind of server the generated tools look like (`suite` unless set).
    pub kind: crate::SyntheticKind,
    /// Tools per `tools/list` page; `None` serves one page.
    pub page_size: Option<usize>,
    /// Also serve malformed tools: one with no `inputSchema` (`malformed_no_schema`) and
    /// one whose name has a space (`malformed name`).
    pub malformed: bool,
    /// Send `notifications/tools/list_changed` before the initialize response (stdio).
    pub early_list_changed: bool,
    /// Write this to stderr and exit with this status before reading anything.
    pub exit_at_once: Option<i32>,
    /// Write this many lines that are not JSON-RPC to stdout before serving (stdio).
    pub garbage_at_start: usize,
    /// Answer every `tools/list` page with the same `nextCursor`.
    pub repeat_cursor: bool,
    /// Never end a listing: after the last page the tools are served again from the
    /// first, each page under a new `nextCursor` (the tools repeated are duplicates).
    pub endless_listing: bool,
    /// Pad each `nextCursor` with `~` to this many bytes.
    pub cursor_bytes: Option<usize>,
    /// Never answer `initialize`.
    pub hang_initialize: bool,
    /// Answer `initialize` (and, with [`modern_only`](Self::modern_only),
    /// `server/discover`) only after this many milliseconds: a server slow to start.
    pub initialize_delay_ms: Option<u64>,
    /// Never answer `tools/list` (until the client cancels it).
    pub hang_listing: bool,
    /// Answer this many `tools/list` requests, then none (each left waiting counts as
    /// cancelled, in `cancellations`, once the client cancels it).
    pub hang_listing_after: Option<u64>,
    /// The `hang` tool first reports progress 0 ("hanging") when the call carries a
    /// progress token, so a client knows the call reached the server.
    pub announce_hang: bool,
    /// Start a `sleep 600` grandchild in the server's process group (it outlives the
    /// server unless the group is stopped).
    pub grandchild: bool,
    /// A line written to stderr at start.
    pub stderr_banner: Option<String>,
    /// Serve only the generated tools, without the control tools (the `psych` command's
    /// embedded servers, whose catalogues should look like a real server's).
    pub no_control_tools: bool,
    /// Over HTTP, serve statelessly and answer each request with one `application/json`
    /// body (rmcp's `json_response`; a call that sends progress first is answered with an
    /// event stream). Stateless: no session, no `list_changed`, no cancellation.
    pub json_response: bool,
    /// Also serve the tools of this file, a `tools/list` result (`{"tools": [...]}`) served
    /// as it is written (each tool answers with its name and arguments), so a real
    /// server's captured catalogue can stand upstream.
    pub catalog: Option<PathBuf>,
    /// Write this many bytes to stderr without a line break (then one) before serving.
    pub stderr_flood: Option<u64>,
    /// Start a `sleep` in a session of its own (`setsid`, outside the server's process
    /// group) that holds the server's stdout and stderr open, before anything else, and
    /// write its pid to this file.
    pub setsid_grandchild: Option<PathBuf>,
    /// List the raw stdio tools (`raw_bad_utf8`, …) with the others, so that a client
    /// behind a gateway, which reaches only listed tools, can call them.
    pub list_raw_tools: bool,
    /// Speak MCP 2026-07-28 only: `server/discover`, per-request `_meta`, `list_changed` on
    /// `subscriptions/listen` streams; `initialize` (and a request naming another
    /// revision) is refused as an unsupported protocol version.
    pub modern_only: bool,
    /// Declare on the `large` control tool, in its `_meta`, that its results may be this
    /// many characters (`anthropic/maxResultSizeChars`, the hint Claude Code honours).
    pub hint_max_chars: Option<u64>,
    /// Over HTTP, answer `initialize` with a result whose `_meta` holds an array of this
    /// many zeros (and `server/discover` with an error, so a client falls back to
    /// `initialize`): a handshake answer too dense to parse.
    pub dense_initialize: Option<u64>,
}

/// How to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mode {
    /// MCP over standard input and output.
    Stdio,
    /// Streamable HTTP on this loopback address (port 0 picks a free one); the server
    /// prints `listening on http://ADDR/mcp` on stdout once it accepts connections.
    Http(SocketAddr),
}

/// The usage text of the `psych-test-server` binary.
pub const USAGE: &str = "usage: psych-test-server [--http ADDR] [--tools N] \
[--kind notes|files|wiki|forge|suite] [--page-size N] \
[--malformed] [--early-list-changed] [--exit-at-once STATUS] [--garbage-at-start N] \
[--repeat-cursor] [--endless-listing] [--cursor-bytes N] [--hang-initialize] \
[--initialize-delay-ms MS] [--hang-listing] [--hang-listing-after N] [--announce-hang] [--grandchild] [--stderr-banner TEXT] \
[--no-control-tools] [--catalog FILE] [--json-response] [--stderr-flood BYTES] \
[--setsid-grandchild PIDFILE] [--list-raw-tools] [--modern-only] [--hint-max-chars N] \
[--dense-initialize N] \
[--scenario JSON]";

impl Scenario {
    /// Parses the binary's arguments (without the program name).
    ///
    /// # Errors
    ///
    /// A message naming the flag at fault.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<(Self, Mode), String> {
        let mut scenario = Self::default();
        let mut mode = Mode::Stdio;
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let mut value = |what: &str| {
                args.next()
                    .ok_or_else(|| format!("{flag} needs {what}\n{USAGE}"))
            };
            let number = |text: String| {
                text.parse::<usize>()
                    .map_err(|e| format!("{flag}: {text:?} is not a count: {e}"))
            };
            match flag.as_str() {
                "--http" => {
                    let addr = value("an address")?;
                    let addr: SocketAddr = addr
                        .parse()
                        .map_err(|e| format!("--http: {addr:?} is not an address: {e}"))?;
                    if !addr.ip().is_loopback() {
                        return Err(format!("--http: {addr} is not a loopback address"));
                    }
                    mode = Mode::Http(addr);
                }
                "--tools" => scenario.tools = number(value("a count")?)?,
                "--kind" => {
                    let name = value("a kind")?;
                    scenario.kind = crate::SyntheticKind::from_name(&name).ok_or_else(|| {
                        format!("--kind: {name:?} is not one of notes, files, wiki, forge, suite")
                    })?;
                }
                "--page-size" => scenario.page_size = Some(number(value("a count")?)?.max(1)),
                "--malformed" => scenario.malformed = true,
                "--early-list-changed" => scenario.early_list_changed = true,
                "--exit-at-once" => {
                    let status = value("a status")?;
                    scenario.exit_at_once = Some(
                        status
                            .parse()
                            .map_err(|e| format!("--exit-at-once: {status:?}: {e}"))?,
                    );
                }
                "--garbage-at-start" => scenario.garbage_at_start = number(value("a count")?)?,
                "--repeat-cursor" => scenario.repeat_cursor = true,
                "--endless-listing" => scenario.endless_listing = true,
                "--cursor-bytes" => scenario.cursor_bytes = Some(number(value("a count")?)?),
                "--hang-initialize" => scenario.hang_initialize = true,
                "--initialize-delay-ms" => {
                    scenario.initialize_delay_ms = Some(number(value("milliseconds")?)? as u64);
                }
                "--hang-listing" => scenario.hang_listing = true,
                "--hang-listing-after" => {
                    scenario.hang_listing_after = Some(number(value("a count")?)? as u64);
                }
                "--announce-hang" => scenario.announce_hang = true,
                "--grandchild" => scenario.grandchild = true,
                "--stderr-banner" => scenario.stderr_banner = Some(value("a text")?),
                "--no-control-tools" => scenario.no_control_tools = true,
                "--catalog" => scenario.catalog = Some(PathBuf::from(value("a file")?)),
                "--json-response" => scenario.json_response = true,
                "--stderr-flood" => scenario.stderr_flood = Some(number(value("a count")?)? as u64),
                "--hint-max-chars" => {
                    scenario.hint_max_chars = Some(number(value("a count")?)? as u64);
                }
                "--list-raw-tools" => scenario.list_raw_tools = true,
                "--dense-initialize" => {
                    scenario.dense_initialize = Some(number(value("a count")?)? as u64);
                }
                "--modern-only" => scenario.modern_only = true,
                "--setsid-grandchild" => {
                    scenario.setsid_grandchild = Some(PathBuf::from(value("a file")?));
                }
                "--scenario" => {
                    let text = value("JSON")?;
                    scenario = serde_json::from_str(&text)
                        .map_err(|e| format!("--scenario: not a scenario: {e}"))?;
                }
                other => return Err(format!("unknown flag {other:?}\n{USAGE}")),
            }
        }
        Ok((scenario, mode))
    }

    /// The tools of [`Scenario::catalog`], as the file holds them (none without one).
    ///
    /// # Errors
    ///
    /// The file cannot be read, is not JSON, or has no `tools` list (the error names it).
    pub fn catalog_tools(&self) -> std::io::Result<Vec<Value>> {
        let Some(path) = &self.catalog else {
            return Ok(Vec::new());
        };
        let named = |what: String| std::io::Error::other(format!("{}: {what}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| named(e.to_string()))?;
        let value: Value = serde_json::from_str(&text).map_err(|e| named(e.to_string()))?;
        match value {
            Value::Object(mut result) => match result.remove("tools") {
                Some(Value::Array(tools)) => Ok(tools),
                _ => Err(named("no \"tools\" list".to_owned())),
            },
            _ => Err(named("not a tools/list result".to_owned())),
        }
    }

    /// Runs the server until its client goes away (stdio) or forever (HTTP).
    ///
    /// # Errors
    ///
    /// I/O errors of the transport or the listener; a [`Scenario::catalog`] that cannot
    /// be read.
    pub async fn serve(self, mode: Mode) -> std::io::Result<()> {
        match mode {
            Mode::Stdio => serve_stdio(self.start()?).await,
            Mode::Http(addr) => {
                if !addr.ip().is_loopback() {
                    return Err(std::io::Error::other(format!(
                        "{addr} is not a loopback address"
                    )));
                }
                let listener = tokio::net::TcpListener::bind(addr).await?;
                let local = listener.local_addr()?;
                let state = self.start()?;
                let mut stdout = tokio::io::stdout();
                stdout
                    .write_all(format!("listening on http://{local}/mcp\n").as_bytes())
                    .await?;
                stdout.flush().await?;
                serve_http(state, listener).await
            }
        }
    }

    /// Serves streamable HTTP on `listener`, already bound by the caller (so a client may
    /// connect as soon as this is spawned: no address to wait for), forever; prints
    /// nothing. For a test server in the test's own process.
    ///
    /// # Errors
    ///
    /// As [`Scenario::serve`].
    pub async fn serve_on(self, listener: tokio::net::TcpListener) -> std::io::Result<()> {
        serve_http(self.start()?, listener).await
    }

    /// What every transport does first: the scenario's start-up faults, then its state.
    fn start(self) -> std::io::Result<Arc<State>> {
        if let Some(pidfile) = &self.setsid_grandchild {
            stdio_faults::setsid_grandchild(pidfile)?;
        }
        if let Some(bytes) = self.stderr_flood {
            stdio_faults::flood_stderr(bytes)?;
        }
        if let Some(banner) = &self.stderr_banner {
            eprintln!("{banner}");
        }
        if let Some(status) = self.exit_at_once {
            eprintln!("psych-test-server: exiting at once with status {status}, as asked");
            std::process::exit(status);
        }
        if self.grandchild {
            // Left running on purpose: it shows whether the client stops the whole group.
            let _grandchild = std::process::Command::new("sleep").arg("600").spawn()?;
        }
        let catalog = self.catalog_tools()?;
        let state = State::new(self);
        state
            .tools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(catalog);
        Ok(Arc::new(state))
    }
}

/// What every session of one server process shares.
struct State {
    scenario: Scenario,
    tools: Mutex<Vec<Value>>,
    peers: Mutex<Vec<Peer<RoleServer>>>,
    cancellations: AtomicU64,
    /// `tools/list` requests received so far.
    listings: AtomicU64,
    /// Bumped at each change of the tools: every `subscriptions/listen` stream watches it.
    changes: tokio::sync::watch::Sender<u64>,
    /// Bumped by `end_subscriptions`: every `subscriptions/listen` stream then ends.
    ends: tokio::sync::watch::Sender<u64>,
    /// How many `subscriptions/listen` streams are open.
    listening: AtomicU64,
    /// How many `sleep` calls with a `barrier` have arrived: each waits until it reaches
    /// its barrier.
    barrier: tokio::sync::watch::Sender<u64>,
    /// The stdout writer (stdio only), for the garbage tool.
    stdout: Mutex<Option<mpsc::UnboundedSender<stdio_faults::Out>>>,
    /// Over stdio, held by a change of the tools until its `list_changed` is queued for
    /// stdout, and by a page while it is read: a page that shows a change is written after
    /// its announcement, as a careful server does ([`State::announcing`]).
    announcing: tokio::sync::Mutex<()>,
}

impl State {
    fn new(scenario: Scenario) -> Self {
        let mut tools = if scenario.no_control_tools {
            Vec::new()
        } else {
            control_tools()
        };
        if let Some(chars) = scenario.hint_max_chars {
            for tool in tools.iter_mut().filter(|t| t["name"] == "large") {
                tool["_meta"] = json!({ psych_types::MAX_RESULT_SIZE_CHARS: chars });
            }
        }
        tools.extend(
            crate::synthetic_catalog(scenario.kind, scenario.tools)
                .into_iter()
                .filter_map(|tool| serde_json::to_value(tool).ok()),
        );
        if scenario.list_raw_tools {
            tools.extend(stdio_faults::raw_tools());
        }
        if scenario.modern_only && !scenario.no_control_tools {
            tools.push(json!({
                "name": "confirm",
                "description": "Asks the client to confirm the text (MCP 2026-07-28 input_required), then answers who confirmed it.",
                "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
            }));
        }
        if scenario.malformed {
            tools
                .push(json!({"name": "malformed_no_schema", "description": "Has no inputSchema."}));
            tools.push(json!({"name": "malformed name", "description": "Has a space in its name.", "inputSchema": {"type": "object"}}));
        }
        Self {
            scenario,
            tools: Mutex::new(tools),
            peers: Mutex::new(Vec::new()),
            cancellations: AtomicU64::new(0),
            listings: AtomicU64::new(0),
            changes: tokio::sync::watch::Sender::new(0),
            ends: tokio::sync::watch::Sender::new(0),
            listening: AtomicU64::new(0),
            barrier: tokio::sync::watch::Sender::new(0),
            stdout: Mutex::new(None),
            announcing: tokio::sync::Mutex::new(()),
        }
    }

    /// The stdout writer: `Some` over stdio only.
    fn writer(&self) -> Option<mpsc::UnboundedSender<stdio_faults::Out>> {
        self.stdout
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A `tools/list` page, once the change being announced (if one is) has been.
    async fn serve_page(&self, params: Option<&PaginatedRequestParams>) -> Value {
        let _announced = self.announcing().await;
        self.page(params)
    }

    /// Over stdio, the gate of a change and its announcement ([`State::announcing`]);
    /// `None` over HTTP, where the announcement goes on another stream than the page (the
    /// session's GET stream, or a `subscriptions/listen` stream), so no order holds for
    /// the client to read them in, and one session's stalled stream would stall every
    /// session's listing.
    async fn announcing(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        if self.writer().is_some() {
            Some(self.announcing.lock().await)
        } else {
            None
        }
    }

    fn page(&self, params: Option<&PaginatedRequestParams>) -> Value {
        let tools = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
        // A cursor is the offset of the page's first tool, padded with `~`.
        let offset = params
            .and_then(|p| p.cursor.as_deref())
            .and_then(|c| c.split('~').next())
            .and_then(|c| c.parse::<usize>().ok())
            .unwrap_or(0);
        let endless = self.scenario.endless_listing && !tools.is_empty();
        let start = if endless {
            offset % tools.len()
        } else {
            offset.min(tools.len())
        };
        let size = self.scenario.page_size.unwrap_or(usize::MAX);
        let end = start.saturating_add(size).min(tools.len());
        let mut page = json!({"tools": tools[start..end]});
        let next = offset.saturating_add(end - start);
        let cursor = if self.scenario.repeat_cursor {
            Some("1".to_owned())
        } else {
            (end < tools.len() || endless).then(|| next.to_string())
        };
        if let Some(mut cursor) = cursor {
            if let Some(bytes) = self.scenario.cursor_bytes {
                let pad = bytes.saturating_sub(cursor.len());
                cursor.extend(std::iter::repeat_n('~', pad));
            }
            page["nextCursor"] = json!(cursor);
        }
        page
    }

    async fn notify_changed(&self) {
        self.changes.send_modify(|n| *n += 1);
        let peers = self
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for peer in peers {
            let _ = peer.notify_tool_list_changed().await;
        }
    }
}

fn control_tools() -> Vec<Value> {
    let object = |properties: Value, required: Value| json!({"type": "object", "properties": properties, "required": required});
    let none = json!({"type": "object", "properties": {}});
    let tool = |name: &str, description: &str, schema: Value| json!({"name": name, "description": description, "inputSchema": schema});
    vec![
        tool(
            "echo",
            "Answers the text.",
            object(json!({"text": {"type": "string"}}), json!(["text"])),
        ),
        tool(
            "add_tool",
            "Adds a tool and sends list_changed.",
            object(json!({"name": {"type": "string"}}), json!(["name"])),
        ),
        tool(
            "remove_tool",
            "Removes a tool and sends list_changed.",
            object(json!({"name": {"type": "string"}}), json!(["name"])),
        ),
        tool(
            "large",
            "A text result of `bytes` bytes.",
            object(
                json!({"bytes": {"type": "integer", "minimum": 0}}),
                json!(["bytes"]),
            ),
        ),
        tool("mixed", "Text, a PNG image, text.", none.clone()),
        tool(
            "structured",
            "Structured content with its text.",
            none.clone(),
        ),
        tool("binary", "An embedded blob resource.", none.clone()),
        tool(
            "fail",
            "A tool error.",
            object(json!({"message": {"type": "string"}}), json!([])),
        ),
        tool("crash", "Exits the server mid-call.", none.clone()),
        tool("hang", "Never answers.", none.clone()),
        tool(
            "sleep",
            "Answers `tag` after `ms` milliseconds.",
            object(
                json!({"ms": {"type": "integer"}, "tag": {"type": "string"}}),
                json!(["ms"]),
            ),
        ),
        tool(
            "cancellations",
            "How many calls were cancelled.",
            none.clone(),
        ),
        tool(
            "progress",
            "Sends `steps` progress notifications with the call's progress token, then answers.",
            object(
                json!({"steps": {"type": "integer", "minimum": 1}}),
                json!(["steps"]),
            ),
        ),
        tool(
            "garbage",
            "Writes lines that are not JSON-RPC to stdout.",
            object(json!({"lines": {"type": "integer"}}), json!([])),
        ),
        tool(
            "client_info",
            "The client's protocol version and Authorization header.",
            none.clone(),
        ),
        tool(
            "exotic",
            "A result with fields and a block type rmcp does not model.",
            none.clone(),
        ),
        tool(
            "fingerprint",
            "The length and FNV-1a hash of the arguments as received (their JSON) and of `text`.",
            object(json!({"text": {"type": "string"}}), json!(["text"])),
        ),
    ]
}

/// What the `fingerprint` tool answers for `arguments`: the byte length and 64-bit FNV-1a
/// hash of their JSON text as received and of their `text` string, so that two calls can be
/// checked to have carried the same bytes without echoing them back.
pub fn fingerprint(arguments: &serde_json::Map<String, Value>) -> String {
    fn fnv(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
    }
    let json = Value::Object(arguments.clone()).to_string();
    let text = arguments.get("text").and_then(Value::as_str).unwrap_or("");
    format!(
        "arguments {} bytes fnv {:016x}; text {} bytes fnv {:016x}",
        json.len(),
        fnv(json.as_bytes()),
        text.len(),
        fnv(text.as_bytes())
    )
}

/// What the `exotic` tool answers, byte for byte as JSON: a result with a block
/// type MCP does not define yet, unknown fields on a known block and on the result,
/// annotations and `_meta` on blocks, an embedded text resource and a resource link. A
/// client that maps results with nothing dropped gets all of it back.
pub fn exotic_result() -> Value {
    json!({
        "content": [
            {"type": "text", "text": "first", "annotations": {"audience": ["user"], "priority": 0.5},
             "_meta": {"trace": "t-1"}, "futureField": {"kept": true}},
            {"type": "widget", "widget": {"kind": "gauge", "value": 7}},
            {"type": "resource_link", "uri": "file:///tmp/report.txt", "name": "report",
             "mimeType": "text/plain", "size": 1234},
            {"type": "resource", "resource": {"uri": "test://notes.md", "mimeType": "text/markdown",
             "text": "# Notes\n"}},
            {"type": "audio", "data": "AAEC", "mimeType": "audio/wav"}
        ],
        "structuredContent": {"ok": true, "n": 3},
        "_meta": {"server": "psych-test-server"}
    })
}

/// What the `exotic` tool answers with `known_only`: [`exotic_result`] without its block of
/// an unknown type, so that rmcp's typed `CallToolResult` reads it (dropping the unknown
/// fields) rather than falling back to a raw custom result.
pub fn exotic_known_result() -> Value {
    let mut result = exotic_result();
    if let Some(content) = result["content"].as_array_mut() {
        content.retain(|block| block["type"] != "widget");
    }
    result
}

/// What the `exotic` tool answers with `structured_only`: no content block, and structured
/// content (which MCP allows, though it asks for a text rendering too).
pub fn exotic_structured_result() -> Value {
    json!({
        "content": [],
        "structuredContent": {"ok": true, "n": 3},
    })
}

/// The text of `large`: numbered lines, exactly `bytes` long.
pub fn large_text(bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 64);
    let mut n = 0u64;
    while text.len() < bytes {
        n += 1;
        text.push_str(&format!(
            "line {n:06}: the quick brown fox jumps over the lazy dog\n"
        ));
    }
    text.truncate(bytes);
    text
}

/// One session's service (every session of an HTTP server shares the [`State`]).
#[derive(Clone)]
struct TestServer {
    state: Arc<State>,
}

/// Counts an open `subscriptions/listen` stream while it lives.
struct Listening<'a>(&'a State);

impl<'a> Listening<'a> {
    fn new(state: &'a State) -> Self {
        state.listening.fetch_add(1, Ordering::SeqCst);
        Self(state)
    }
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        self.0.listening.fetch_sub(1, Ordering::SeqCst);
    }
}

impl State {
    /// A `tools/list` request arriving: with `--hang-listing`, or past the first
    /// `--hang-listing-after` requests, goes on only once the client cancels it (counted
    /// in `cancellations`).
    async fn listing(&self, context: RequestContext<RoleServer>) {
        let seen = self.listings.fetch_add(1, Ordering::SeqCst);
        let hang = self.scenario.hang_listing
            || self
                .scenario
                .hang_listing_after
                .is_some_and(|after| seen >= after);
        if hang {
            let _count = CountCancelled {
                state: self,
                ct: context.clone(),
            };
            // Until the client cancels it (then counted; the page served after it is
            // dropped by the client, which no longer waits for it).
            context.ct.cancelled().await;
        }
    }
}

/// Counts a call as cancelled if it is dropped (or finishes) after cancellation.
struct CountCancelled<'a> {
    state: &'a State,
    ct: rmcp::service::RequestContext<RoleServer>,
}

impl Drop for CountCancelled<'_> {
    fn drop(&mut self) {
        if self.ct.ct.is_cancelled() {
            self.state.cancellations.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl TestServer {
    fn info(&self) -> InitializeResult {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new(
            "psych-test-server",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    async fn call(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let args = params.arguments.unwrap_or_default();
        let text_arg = |key: &str| {
            args.get(key)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let number_arg = |key: &str| args.get(key).and_then(Value::as_u64).unwrap_or(0);
        let state = &self.state;
        let result = match params.name.as_ref() {
            "echo" => CallToolResult::success(vec![ContentBlock::text(text_arg("text"))]),
            "fingerprint" => CallToolResult::success(vec![ContentBlock::text(fingerprint(&args))]),
            // Replaced by the raw result on its way out: over stdio by `RawListing`, over
            // HTTP by the session's transport or in the JSON body.
            "exotic" => CallToolResult::success(vec![ContentBlock::text(raw_http::marker(&args))]),
            "add_tool" | "remove_tool" => {
                let name = text_arg("name");
                // Over stdio, no page is read until the change is announced. (A call cancelled
                // between the change and its announcement leaves it unannounced.)
                let announcing = state.announcing().await;
                {
                    let mut tools = state.tools.lock().unwrap_or_else(PoisonError::into_inner);
                    tools.retain(|tool| tool["name"] != name.as_str());
                    if params.name == "add_tool" {
                        tools.push(json!({"name": name, "description": "Added at runtime.", "inputSchema": {"type": "object"}}));
                    }
                }
                state.notify_changed().await;
                drop(announcing);
                CallToolResult::success(vec![ContentBlock::text(format!("{} {name}", params.name))])
            }
            "large" => {
                let bytes = usize::try_from(number_arg("bytes")).unwrap_or(usize::MAX);
                CallToolResult::success(vec![ContentBlock::text(large_text(bytes))])
            }
            "mixed" => CallToolResult::success(vec![
                ContentBlock::text("Here is the chart:"),
                ContentBlock::image(
                    psych_types::encode_base64(&crate::png::gradient(16, 16)),
                    "image/png",
                ),
                ContentBlock::text("End of chart."),
            ]),
            "structured" => {
                let value =
                    json!({"temperature": 21.5, "unit": "celsius", "readings": [20, 21, 23]});
                let mut result = CallToolResult::structured(value);
                result.is_error = Some(false);
                result
            }
            "binary" => {
                let bytes: Vec<u8> = (0..=255u8).chain([0xFF, 0xFE, 0x00]).collect();
                CallToolResult::success(vec![ContentBlock::resource(
                    ResourceContents::BlobResourceContents {
                        uri: "test://binary/bytes.bin".into(),
                        mime_type: Some("application/octet-stream".into()),
                        blob: psych_types::encode_base64(&bytes),
                        meta: None,
                    },
                )])
            }
            "fail" => {
                let message = text_arg("message");
                let message = if message.is_empty() {
                    "failed as asked".to_owned()
                } else {
                    message
                };
                CallToolResult::error(vec![ContentBlock::text(message)])
            }
            "crash" => {
                eprintln!("psych-test-server: crashing on request");
                std::process::exit(70);
            }
            "hang" => {
                let _count = CountCancelled {
                    state,
                    ct: context.clone(),
                };
                if state.scenario.announce_hang {
                    announce(params.meta.as_ref(), &context, "hanging").await;
                }
                context.ct.cancelled().await;
                return Err(ErrorData::internal_error("cancelled", None));
            }
            "sleep" => {
                let _count = CountCancelled {
                    state,
                    ct: context.clone(),
                };
                if let Some(barrier) = args.get("barrier").and_then(Value::as_u64) {
                    // Counted before it says it waits: a call the client sends once it heard
                    // that finds this one counted.
                    state.barrier.send_modify(|arrived| *arrived += 1);
                    let mut arrived = state.barrier.subscribe();
                    announce(params.meta.as_ref(), &context, "waiting").await;
                    tokio::select! {
                        _ = arrived.wait_for(|arrived| *arrived >= barrier) => {}
                        () = context.ct.cancelled() => {
                            return Err(ErrorData::internal_error("cancelled", None));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(number_arg("ms"))).await;
                CallToolResult::success(vec![ContentBlock::text(text_arg("tag"))])
            }
            "end_subscriptions" => {
                state.ends.send_modify(|n| *n += 1);
                CallToolResult::success(vec![ContentBlock::text("subscriptions ended")])
            }
            "subscriptions" => CallToolResult::success(vec![ContentBlock::text(
                state.listening.load(Ordering::SeqCst).to_string(),
            )]),
            "client_info" => {
                // The session's revision, or (2026-07-28) the request's own.
                let version = context
                    .peer
                    .peer_info()
                    .map(|info| info.protocol_version.clone())
                    .or_else(|| context.meta.protocol_version())
                    .map(|version| version.to_string());
                let authorization = context
                    .extensions
                    .get::<http::request::Parts>()
                    .and_then(|parts| parts.headers.get("authorization"))
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned);
                let info = json!({"protocolVersion": version, "authorization": authorization});
                CallToolResult::success(vec![ContentBlock::text(info.to_string())])
            }
            "progress" => {
                let steps = number_arg("steps").max(1);
                let token = params
                    .meta
                    .as_ref()
                    .and_then(RequestMetaObject::get_progress_token)
                    .or_else(|| context.meta.get_progress_token());
                let Some(token) = token else {
                    return Ok(CallToolResult::error(vec![ContentBlock::text(
                        "progress: the call carried no progress token",
                    )]));
                };
                for step in 1..=steps {
                    let mut note = ProgressNotificationParam::new(token.clone(), step as f64);
                    note.total = Some(steps as f64);
                    note.message = Some(format!("step {step} of {steps}"));
                    let _ = context.peer.notify_progress(note).await;
                }
                CallToolResult::success(vec![ContentBlock::text(format!("{steps} steps reported"))])
            }
            "cancellations" => CallToolResult::success(vec![ContentBlock::text(
                state.cancellations.load(Ordering::SeqCst).to_string(),
            )]),
            "garbage" => {
                let lines = number_arg("lines").max(1);
                match state.writer() {
                    Some(writer) => {
                        for i in 0..lines {
                            let _ = writer.send(stdio_faults::Out::Bytes(
                                format!("garbage line {i}: not json\n").into_bytes(),
                            ));
                        }
                        CallToolResult::success(vec![ContentBlock::text(format!(
                            "wrote {lines} garbage lines"
                        ))])
                    }
                    None => CallToolResult::error(vec![ContentBlock::text("garbage needs stdio")]),
                }
            }
            name => {
                let known = state
                    .tools
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                    .any(|tool| tool["name"] == name);
                if !known {
                    return Err(ErrorData::invalid_params(format!("no tool {name:?}"), None));
                }
                CallToolResult::success(vec![ContentBlock::text(format!(
                    "{name} called with {}",
                    Value::Object(args.clone())
                ))])
            }
        };
        Ok(result)
    }
}

/// The `requestState` the `confirm` tool answers for `text`: with `+`, `/` and `=`, so that
/// a client (a gateway) that does not echo it byte for byte is caught.
pub fn confirm_state(text: &str) -> String {
    format!("confirm:{text}:+/=")
}

/// The `confirm` tool (MCP 2026-07-28 only: rmcp refuses `input_required` to earlier
/// peers). Without input: an elicitation asking for a name, and [`confirm_state`]; retried
/// with the state byte for byte and an `accept`, the final answer; -32021 when the call
/// declares no elicitation capability.
fn confirm(
    request: CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, ErrorData> {
    let text = request
        .arguments
        .as_ref()
        .and_then(|args| args.get("text"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let can_elicit = context
        .client_capabilities()
        .is_some_and(|capabilities| capabilities.elicitation.is_some());
    if !can_elicit {
        return Err(ErrorData::new(
            rmcp::model::ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
            "confirm needs the elicitation capability",
            Some(json!({"requiredCapabilities": {"elicitation": {}}})),
        ));
    }
    let Some(responses) = request.input_responses else {
        let ask = json!({"method": "elicitation/create", "params": {
            "mode": "form",
            "message": format!("Confirm {text:?}?"),
            "requestedSchema": {"type": "object",
                "properties": {"name": {"type": "string"}}, "required": ["name"]},
        }});
        let ask: rmcp::model::InputRequest = serde_json::from_value(ask)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let requests = std::iter::once(("confirm".to_owned(), ask)).collect();
        return Ok(CallToolResponse::from(
            rmcp::model::InputRequiredResult::new(Some(requests), Some(confirm_state(&text))),
        ));
    };
    if request.request_state.as_deref() != Some(confirm_state(&text).as_str()) {
        return Err(ErrorData::invalid_params(
            format!(
                "confirm: requestState {:?} is not the one sent ({:?})",
                request.request_state,
                confirm_state(&text)
            ),
            None,
        ));
    }
    let answer = responses.get("confirm").cloned().unwrap_or(Value::Null);
    let result = match answer.get("action").and_then(Value::as_str) {
        Some("accept") => {
            let name = answer
                .pointer("/content/name")
                .and_then(Value::as_str)
                .unwrap_or("nobody");
            CallToolResult::success(vec![ContentBlock::text(format!(
                "confirmed {text} by {name}"
            ))])
        }
        _ => CallToolResult::error(vec![ContentBlock::text(format!("not confirmed: {answer}"))]),
    };
    Ok(CallToolResponse::from(result))
}

/// One progress report, progress 0 with `message`, when the call carries a progress token:
/// the `hang` tool's under `--announce-hang` ("hanging"), a `sleep` call's at its barrier
/// ("waiting"). A client then knows the call reached the server and waits there.
async fn announce(
    meta: Option<&RequestMetaObject>,
    context: &RequestContext<RoleServer>,
    message: &str,
) {
    let token = meta
        .and_then(RequestMetaObject::get_progress_token)
        .or_else(|| context.meta.get_progress_token());
    if let Some(token) = token {
        let mut note = ProgressNotificationParam::new(token, 0.0);
        note.message = Some(message.to_owned());
        let _ = context.peer.notify_progress(note).await;
    }
}

impl ServerHandler for TestServer {
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        if self.state.scenario.hang_initialize {
            std::future::pending::<()>().await;
        }
        if let Some(delay) = self.state.scenario.initialize_delay_ms {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        self.state
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(context.peer.clone());
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.state.listing(context).await;
        serde_json::from_value(self.state.serve_page(request.as_ref()).await)
            .map_err(|e| ErrorData::internal_error(format!("malformed listing: {e}"), None))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if request.name == "confirm" && self.state.scenario.modern_only {
            return confirm(request, &context);
        }
        self.call(request, context)
            .await
            .map(CallToolResponse::from)
    }

    fn get_info(&self) -> InitializeResult {
        self.info()
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        if self.state.scenario.modern_only {
            std::borrow::Cow::Owned(vec![ProtocolVersion::V_2026_07_28])
        } else {
            std::borrow::Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
        }
    }

    /// `server/discover` with [`Scenario::modern_only`]; otherwise "method not found", as a
    /// server from before 2026-07-28 answers it.
    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        if let Some(delay) = self.state.scenario.initialize_delay_ms
            && self.state.scenario.modern_only
        {
            tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        }
        if !self.state.scenario.modern_only {
            return Err(ErrorData::method_not_found::<
                rmcp::model::DiscoverRequestMethod,
            >());
        }
        Ok(DiscoverResult::from_server_info(
            ServerHandler::supported_protocol_versions(self).into_owned(),
            self.info(),
        ))
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::default();
        accepted.tools_list_changed = requested.tools_list_changed;
        Some(accepted)
    }

    /// One `subscriptions/listen` stream: `tools/list_changed` at each change of the tools,
    /// until the client cancels it or `end_subscriptions` ends it (the final result).
    ///
    /// rmcp acknowledges the stream before this runs, so a change made just after the
    /// acknowledgment may come before the stream watches: a test that needs the stream
    /// ready waits until `subscriptions` counts it (counted once it watches).
    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let mut changes = self.state.changes.subscribe();
        let mut ends = self.state.ends.subscribe();
        let _open = Listening::new(&self.state);
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                _ = ends.changed() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                }
            }
            if context.sink().notify_tool_list_changed().await.is_err() {
                return Ok(());
            }
        }
    }
}

/// Over stdio, `tools/list` and the `exotic` tool are answered as raw JSON, so that a
/// malformed tool or an unmodelled field reaches the client as it is (rmcp's typed `Tool`
/// and `CallToolResult` could not carry one); everything else is the [`ServerHandler`]'s
/// (with `exotic`'s marker answer replaced as over HTTP).
struct RawListing(TestServer);

impl Service<RoleServer> for RawListing {
    async fn handle_request(
        &self,
        request: ClientRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        if let ClientRequest::ListToolsRequest(request) = &request {
            self.0.state.listing(context.clone()).await;
            return Ok(ServerResult::CustomResult(CustomResult(
                self.0.state.serve_page(request.params.as_ref()).await,
            )));
        }
        if let Some(marker) = stdio_faults::marker(&request) {
            return Ok(marker);
        }
        let mut result = Service::handle_request(&self.0, request, context).await?;
        raw_http::replace_marker_result(&mut result);
        Ok(result)
    }

    async fn handle_notification(
        &self,
        notification: ClientNotification,
        context: NotificationContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Service::handle_notification(&self.0, notification, context).await
    }

    fn get_info(&self) -> InitializeResult {
        self.0.info()
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        ServerHandler::supported_protocol_versions(&self.0)
    }
}

/// Our stdio transport: every write goes through one writer task, so the garbage tool and
/// the early notification interleave with messages only between whole lines.
struct Stdio {
    lines: tokio::io::Lines<BufReader<tokio::io::Stdin>>,
    out: mpsc::UnboundedSender<stdio_faults::Out>,
    early_list_changed: bool,
}

impl rmcp::transport::Transport<RoleServer> for Stdio {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let mut bytes = Vec::new();
        if self.early_list_changed
            && matches!(&item, JsonRpcMessage::Response(r) if matches!(r.result, ServerResult::InitializeResult(_)))
        {
            let early: TxJsonRpcMessage<RoleServer> = JsonRpcMessage::notification(
                ServerNotification::ToolListChangedNotification(ToolListChangedNotification {
                    method: Default::default(),
                    extensions: Default::default(),
                }),
            );
            if serde_json::to_writer(&mut bytes, &early).is_ok() {
                bytes.push(b'\n');
            }
        }
        if let Some(huge) = stdio_faults::huge(&item) {
            let out = self.out.clone();
            return futures_util::future::Either::Left(async move {
                out.send(stdio_faults::Out::Huge(huge)).map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout closed")
                })
            });
        }
        let written = match stdio_faults::raw_line(&item) {
            Some(raw) => {
                bytes.extend_from_slice(&raw);
                Ok(())
            }
            None => serde_json::to_writer(&mut bytes, &item).map(|()| bytes.push(b'\n')),
        };
        let out = self.out.clone();
        futures_util::future::Either::Right(async move {
            written.map_err(std::io::Error::other)?;
            out.send(stdio_faults::Out::Bytes(bytes))
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "stdout closed"))
        })
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            // Cancel-safe (tokio's `Lines::next_line` keeps its buffer in itself). A line
            // that is not UTF-8 is skipped, as a line that is not JSON is.
            let line = match self.lines.next_line().await {
                Ok(line) => line?,
                Err(error) if error.kind() == std::io::ErrorKind::InvalidData => continue,
                Err(_) => return None,
            };
            if line.trim().is_empty() {
                continue;
            }
            if let Ok(message) = serde_json::from_str(&line) {
                return Some(message);
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

async fn serve_stdio(state: Arc<State>) -> std::io::Result<()> {
    let (out, mut rx) = mpsc::unbounded_channel::<stdio_faults::Out>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(item) = rx.recv().await {
            let written = match item {
                stdio_faults::Out::Bytes(bytes) => stdout.write_all(&bytes).await,
                stdio_faults::Out::Huge(huge) => huge.write(&mut stdout).await,
            };
            if written.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    for i in 0..state.scenario.garbage_at_start {
        let _ = out.send(stdio_faults::Out::Bytes(
            format!("psych-test-server: startup noise {i}\n").into_bytes(),
        ));
    }
    *state.stdout.lock().unwrap_or_else(PoisonError::into_inner) = Some(out.clone());
    let transport = Stdio {
        lines: BufReader::new(tokio::io::stdin()).lines(),
        out,
        early_list_changed: state.scenario.early_list_changed,
    };
    let server = RawListing(TestServer {
        state: Arc::clone(&state),
    });
    let result = match server.serve(transport).await {
        Ok(running) => running
            .waiting()
            .await
            .map(|_| ())
            .map_err(std::io::Error::other),
        Err(error) => Err(std::io::Error::other(error)),
    };
    state
        .stdout
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    state
        .peers
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clear();
    let _ = writer.await;
    result
}

async fn serve_http(state: Arc<State>, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    use hyper_util::rt::TokioIo;
    use rmcp::transport::StreamableHttpService;
    use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

    let dense = state.scenario.dense_initialize;
    let mut config = StreamableHttpServerConfig::default();
    // A server of 2026-07-28 only keeps no sessions (rmcp serves that revision's requests
    // without one anyway).
    config.legacy_session_mode = !state.scenario.json_response && !state.scenario.modern_only;
    config.json_response = state.scenario.json_response;
    let service = StreamableHttpService::new(
        move || {
            Ok(TestServer {
                state: Arc::clone(&state),
            })
        },
        raw_http::RawSessions(LocalSessionManager::default()).into(),
        config,
    );
    // A JSON body is written by rmcp's service itself, not by a session transport.
    // Set by `forget_sessions`, for this server only (several may run in one process).
    let forgot = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let service = hyper::service::service_fn(move |request| {
        let service = service.clone();
        let forgot = Arc::clone(&forgot);
        async move {
            let request = match raw_http::fault(request, &forgot, dense).await {
                raw_http::Fault::Answer(response) => {
                    return Ok::<_, std::convert::Infallible>(response);
                }
                raw_http::Fault::Pass(request) => request,
            };
            let response = service.handle(request).await;
            Ok::<_, std::convert::Infallible>(raw_http::replace_marker_in_body(response).await)
        }
    });
    loop {
        let (stream, _) = listener.accept().await?;
        let service = service.clone();
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn flags_and_scenarios_parse() {
        let (scenario, mode) = Scenario::from_args(args(
            "--tools 40 --page-size 7 --malformed --http 127.0.0.1:0",
        ))
        .unwrap();
        assert_eq!(
            (scenario.tools, scenario.page_size, scenario.malformed),
            (40, Some(7), true)
        );
        assert_eq!(mode, Mode::Http("127.0.0.1:0".parse().unwrap()));
        let (scenario, _) =
            Scenario::from_args(["--scenario".into(), r#"{"repeat_cursor": true}"#.into()])
                .unwrap();
        assert!(scenario.repeat_cursor);
        let (scenario, _) = Scenario::from_args(args("--tools 3 --no-control-tools")).unwrap();
        assert!(scenario.no_control_tools);
        let served = State::new(scenario).tools.into_inner().unwrap();
        assert_eq!(served.len(), 3, "only the generated tools");
        assert!(
            Scenario::from_args(args("--http 10.0.0.1:80"))
                .unwrap_err()
                .contains("loopback")
        );
        assert!(
            Scenario::from_args(args("--bogus"))
                .unwrap_err()
                .starts_with("unknown flag")
        );
        assert!(Scenario::from_args(["--scenario".into(), r#"{"nope": 1}"#.into()]).is_err());
        let (scenario, _) = Scenario::from_args(args("--kind wiki --tools 2")).unwrap();
        assert_eq!(scenario.kind, crate::SyntheticKind::Wiki);
        let served = State::new(scenario).tools.into_inner().unwrap();
        assert_eq!(served.last().unwrap()["name"], "API-patch-a-database");
        let (scenario, _) =
            Scenario::from_args(["--scenario".into(), r#"{"kind": "forge"}"#.into()]).unwrap();
        assert_eq!(scenario.kind, crate::SyntheticKind::Forge);
        assert!(
            Scenario::from_args(args("--kind office"))
                .unwrap_err()
                .contains("not one of")
        );
    }

    #[test]
    fn a_catalogue_file_is_served_as_written() {
        let dir = std::env::temp_dir().join(format!("psych-catalog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tools.json");
        let tools = json!([{"name": "read_graph", "inputSchema": {"type": "object"}, "x": 1}]);
        std::fs::write(&path, json!({ "tools": tools }).to_string()).unwrap();
        let (scenario, _) = Scenario::from_args([
            "--catalog".to_owned(),
            path.display().to_string(),
            "--no-control-tools".to_owned(),
        ])
        .unwrap();
        assert_eq!(Value::Array(scenario.catalog_tools().unwrap()), tools);
        std::fs::write(&path, r#"{"items": []}"#).unwrap();
        let error = scenario.catalog_tools().unwrap_err().to_string();
        assert!(
            error.contains("tools.json") && error.contains("no \"tools\""),
            "{error}"
        );
        let missing = Scenario {
            catalog: Some(dir.join("absent.json")),
            ..Scenario::default()
        };
        assert!(
            missing
                .catalog_tools()
                .unwrap_err()
                .to_string()
                .contains("absent.json")
        );
        assert!(Scenario::default().catalog_tools().unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pages_cover_the_catalogue_once() {
        let state = State::new(Scenario {
            tools: 20,
            page_size: Some(6),
            ..Scenario::default()
        });
        let mut names = Vec::new();
        let mut cursor = None;
        loop {
            let params =
                cursor.map(|c: String| PaginatedRequestParams::default().with_cursor(Some(c)));
            let page = state.page(params.as_ref());
            names.extend(
                page["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["name"].clone()),
            );
            match page.get("nextCursor") {
                Some(next) => cursor = Some(next.as_str().unwrap().to_owned()),
                None => break,
            }
        }
        assert_eq!(names.len(), 20 + control_tools().len());
    }

    #[test]
    fn large_text_is_exactly_that_long() {
        assert_eq!(large_text(0), "");
        assert_eq!(large_text(100_001).len(), 100_001);
        assert!(large_text(30).starts_with("line 000001: the quick"));
    }
}
