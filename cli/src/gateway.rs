//! `psych serve`: Psych's disclosure for any MCP client, as one MCP server.
//!
//! The gateway connects the upstream servers of an `mcpServers` file (psych-mcp's
//! [`McpManager`]), keeps their catalogues fresh in an in-memory catalogue (the runtime's
//! [`CatalogSync`]: sync on connect, `list_changed`, reachability) and answers its one MCP
//! client (stdio) or each of its clients (`--http`) with what disclosure decides:
//!
//! - `tools/list` resolves the Surface from the catalogue as it is *now* (direct tools,
//!   facades, search pairs, the meta tools, the orientation tool) plus `read_tool_output`,
//!   with the gateway's own auto budget (`--auto-budget`, by default
//!   [`crate::setup::SERVE_AUTO_BUDGET`] tokens of whole tool definitions shared by the
//!   `auto` servers, smallest first), so the listing stays small however many servers the
//!   file names.
//!   The deferred-server lines go in the initialize result's `instructions` and at the end of
//!   the list meta tool's description, where a client that hides `instructions` still shows
//!   them to its model.
//! - `tools/call` goes through the runtime's [`Executor`] (the guard re-checked at call time
//!   against the grant and the live catalogues, meta tools, orientation, the reader, the
//!   forwarded call under a deadline); the result is logged whole in this session's record
//!   log (`<dir>/serve/<session>.plog`) and the client gets psych-elision's projection of it
//!   (the per-result threshold, failures truncated). A result that is not elided passes
//!   through as the upstream sent it (images stay images, unknown block types and fields
//!   are kept), over stdio and over HTTP ([`raw`]); Psych's own answers (meta tools,
//!   search, orientation, the reader) carry their structured content as a text block too.
//! - A call the client cancels is dropped, which cancels the upstream request, and its
//!   result is logged as cancelled by the client, so the log holds a result for every call.
//!   The upstream's progress reaches the client under the client's progress token: the
//!   call carries its own progress sink through the executor to the upstream call
//!   ([`progress`]).
//! - A handle from another session is the JSON-RPC error `invalid_deferred_handle`, never a
//!   tool result.
//! - When what `tools/list` would answer changes (an upstream `list_changed`, a server
//!   connecting late or going down), the client gets `notifications/tools/list_changed`.
//!   Resolution is deterministic, so unchanged tools keep their bytes and their order.
//!
//! Grants come from the file: each server entry may carry Psych's `allowTools` key (a list of
//! tool names); without it every tool of the server is permitted.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use psych_catalog::{Catalog, Freshener, FreshenerConfig};
use psych_disclosure::{Exposed, Inputs, LIST_TOOLS, Live, MetaTool, Settings, Surface, resolve};
use psych_elision::{Elider, Estimator};
use psych_mcp::{McpConfig, McpManager};
use psych_reader_tool::tool_definition;
use psych_record_log::{RecordLog, SharedRecordLog, SyncPolicy};
use psych_runtime::{CatalogSync, Connected, ExecuteError, Executor};
use psych_types::{
    ConnectionSpec, ContentBlock, LoggedRecord, PermissionGrant, Projection, READ_TOOL_OUTPUT,
    Record, ResultProjector, ResultRef, RunId, ServerCatalog, ToolCall, ToolCallId, ToolDefinition,
    ToolName, ToolOutput, ToolRef, ToolResult,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientNotification, ClientRequest,
    CustomResult, DiscoverResult, ErrorCode, ErrorData, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, RequestMetaObject,
    ServerCapabilities, ServerResult,
};
use rmcp::service::{NotificationContext, Peer, RequestContext};
use rmcp::{RoleServer, ServerHandler, Service, ServiceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

mod progress;
mod raw;

/// The key of a server entry that narrows its grant to the tools named.
pub(crate) const ALLOW_TOOLS: &str = "allowTools";

/// How often a session compares the catalogue's versions and health with what its client
/// last saw.
const WATCH_EVERY: Duration = Duration::from_millis(200);

/// The code of the JSON-RPC error answering a handle this session never emitted.
pub(crate) const INVALID_DEFERRED_HANDLE: &str = "invalid_deferred_handle";

/// What a call the client cancelled is answered with, and how its logged result begins.
pub(crate) const CANCELLED_BY_CLIENT: &str = "cancelled by the client";

/// What every session shares: the upstream connections, the catalogue kept fresh from
/// them, the connections and grant from the file, and disclosure's and elision's settings.
struct Shared {
    manager: McpManager,
    freshener: Arc<Freshener<McpManager>>,
    connections: Vec<ConnectionSpec>,
    grant: PermissionGrant,
    settings: Settings,
    elider: Elider,
    logs: PathBuf,
    sessions: AtomicU64,
    /// The last Surface resolved, with the [`fingerprint`] of the catalogues it was
    /// resolved from.
    resolved: Mutex<Option<(String, Arc<Surface>)>>,
    /// Raw answers waiting for the HTTP transport (see [`raw`]).
    raw: Arc<raw::RawAnswers>,
}

/// The grant the file gives: every server whole, or the tools its `allowTools` names.
pub(crate) fn grant_from(config: &McpConfig) -> Result<PermissionGrant, String> {
    let mut grant = PermissionGrant::none();
    for (server, entry) in &config.servers {
        match entry.extra.get(ALLOW_TOOLS) {
            None => grant = grant.allow_server(server.clone()),
            Some(Value::Array(names)) => {
                for name in names {
                    let name = name
                        .as_str()
                        .ok_or_else(|| format!("{server}: {ALLOW_TOOLS} holds a non-string"))?;
                    let tool =
                        ToolName::new(name).map_err(|e| format!("{server}: {ALLOW_TOOLS}: {e}"))?;
                    grant = grant.allow_tool(ToolRef::new(server.clone(), tool));
                }
            }
            Some(_) => return Err(format!("{server}: {ALLOW_TOOLS} must be a list of names")),
        }
    }
    Ok(grant)
}

/// What a client's `tools/list` gets for `surface`: its tools, the deferred lines at the end
/// of the list meta tool's description, and `read_tool_output` with the reader's `limits`.
pub(crate) fn client_tools(
    surface: &Surface,
    limits: &psych_reader_tool::Limits,
) -> Vec<ToolDefinition> {
    let mut tools = surface.tools().to_vec();
    let lines = surface.deferred_lines();
    if !lines.is_empty()
        && let Some(list) = tools.iter_mut().find(|t| t.name.as_str() == LIST_TOOLS)
    {
        let mut description = list.description.take().unwrap_or_default();
        description.push_str("\n\nDeferred servers:");
        for line in lines {
            description.push_str("\n- ");
            description.push_str(line);
        }
        list.description = Some(description);
    }
    tools.push(tool_definition(limits));
    tools
}

impl Shared {
    /// Every connected server's live catalogue, read now.
    fn catalogs(&self) -> Result<Vec<ServerCatalog>, ErrorData> {
        self.connections
            .iter()
            .map(|c| self.freshener.catalog().live(&c.server))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ErrorData::internal_error(format!("reading the catalogue: {e}"), None))
    }

    /// Every connected server's live catalogue, read now, and their Surface. Disclosure is
    /// a function of the catalogues, the connections, the grant and the settings, and only
    /// the catalogues change: the Surface is resolved again only when a server's set
    /// version or health (the [`fingerprint`]) differs from the last resolution's, not on
    /// every call and listing of every session.
    fn current(&self) -> Result<(Vec<ServerCatalog>, Arc<Surface>), ErrorData> {
        let catalogs = self.catalogs()?;
        let key = fingerprint(&catalogs);
        let mut resolved = self.resolved.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((seen, surface)) = resolved.as_ref()
            && *seen == key
        {
            return Ok((catalogs, Arc::clone(surface)));
        }
        let inputs = Inputs {
            connections: &self.connections,
            catalogs: &catalogs,
            grant: &self.grant,
        };
        let surface = resolve(&inputs, &self.settings, &Estimator::new()).map_err(|e| {
            ErrorData::internal_error(format!("resolving the tool surface: {e}"), None)
        })?;
        let surface = Arc::new(surface);
        *resolved = Some((key, Arc::clone(&surface)));
        Ok((catalogs, surface))
    }

    /// The `instructions` of the initialize result: the deferred lines.
    fn instructions(&self) -> Option<String> {
        let (_, surface) = self.current().ok()?;
        let lines = surface.deferred_lines();
        if lines.is_empty() {
            return Some(
                "Psych gateway: call psych_orientation first for the shape of the toolkit."
                    .to_owned(),
            );
        }
        let mut text = String::from(
            "Psych gateway. Call psych_orientation first. These MCP servers are deferred: \
             their tools are reached through the meta tools (list, describe, call).",
        );
        for line in lines {
            text.push_str("\n- ");
            text.push_str(line);
        }
        Some(text)
    }

    /// The [`fingerprint`] of the catalogues now.
    fn fingerprint(&self) -> String {
        match self.catalogs() {
            Ok(catalogs) => fingerprint(&catalogs),
            Err(error) => error.message.into_owned(),
        }
    }
}

/// What decides whether the Surface, and so the listing, can have changed: each server's
/// set version and health.
fn fingerprint(catalogs: &[ServerCatalog]) -> String {
    catalogs
        .iter()
        .map(|c| format!("{}@{:?}/{:?};", c.server, c.version, c.health))
        .collect()
}

/// Whether a call named `name` is answered by Psych itself (a meta tool's listing or
/// description, a search, the orientation payload, the reader) rather than forwarded to an
/// upstream server, whose result passes through as it was sent.
fn answered_here(surface: &Surface, name: &str) -> bool {
    match surface.exposed(name) {
        Some(
            Exposed::Direct { .. }
            | Exposed::Deferred { .. }
            | Exposed::Facade { .. }
            | Exposed::SearchCall { .. },
        ) => false,
        Some(Exposed::Meta { tool }) => *tool != MetaTool::CallTool,
        Some(_) => true,
        None => name == READ_TOOL_OUTPUT,
    }
}

/// `output` with its structured content also as one text block when it has no content
/// block: MCP says a tool returning structured content should also return it serialized in
/// a text block, and a client that shows only `content` would otherwise show nothing.
fn with_text_block(mut output: ToolOutput) -> ToolOutput {
    if output.content.is_empty()
        && let Some(structured) = &output.structured_content
    {
        output
            .content
            .push(ContentBlock::text(structured.to_string()));
    }
    output
}

/// One client session: its own record log (one Run per connection) and executor.
struct Session {
    shared: Arc<Shared>,
    executor: Executor<McpManager>,
    calls: AtomicU64,
    watcher: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Session {
    fn drop(&mut self) {
        let watcher = self
            .watcher
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = watcher {
            task.abort();
        }
        // A session that logged nothing (a probe the gateway refused, a client that left
        // at once) leaves no file behind.
        let log = self.executor.log();
        if log.is_empty() {
            let _ = std::fs::remove_file(log.path());
        }
    }
}

/// How a call's execution ended.
enum Ended {
    /// It ran to its logged result.
    Done(Result<Vec<LoggedRecord>, ExecuteError>),
    /// The client cancelled it; `logged` when its own result was logged all the same (it had
    /// left the host when the cancellation came).
    Cancelled { logged: bool },
}

impl Session {
    /// A session with a fresh record log under the shared log folder.
    fn open(shared: Arc<Shared>) -> std::io::Result<Self> {
        let n = shared.sessions.fetch_add(1, Ordering::Relaxed);
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        let run = RunId::new(format!("serve-{secs}-{}-{n}", std::process::id()))
            .map_err(std::io::Error::other)?;
        std::fs::create_dir_all(&shared.logs)?;
        // No fdatasync per call: measured, it was most of a proxied call's added latency
        // (a call 2.1 ms through the gateway against 0.24 ms direct; one write+fdatasync
        // on that disk about 3 ms). The log is the session's own: its handles are read
        // back only by this session, which ends with this process, so a record needs to
        // survive the process being killed (the OS page cache does that), not a power loss.
        let (log, _) = RecordLog::open(&shared.logs, &run, SyncPolicy::OsBuffered)
            .map_err(std::io::Error::other)?;
        let executor = Executor::new(
            Arc::new(shared.manager.clone()),
            Arc::new(SharedRecordLog::new(log)),
        );
        Ok(Self {
            shared,
            executor,
            calls: AtomicU64::new(0),
            watcher: Mutex::new(None),
        })
    }

    /// The `tools/list` result, as JSON.
    fn listing(&self) -> Result<Value, ErrorData> {
        let (_, surface) = self.shared.current()?;
        let tools = client_tools(&surface, self.executor.limits());
        Ok(json!({ "tools": tools }))
    }

    /// One `tools/call`: through the executor, which carries the call's progress sink to
    /// the upstream call (its progress reaches the client under the client's token, when
    /// the client sent one); logged whole; projected by elision.
    ///
    /// A call the client cancels while it is upstream (or before it got there) is dropped,
    /// which cancels the upstream request, and its result is logged as cancelled by the
    /// client; one cancelled after it left the host keeps its own result in the log. Either
    /// way the log holds one result for every call, and the client is answered with the
    /// cancellation.
    async fn call_or_cancel(
        &self,
        params: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<Value, ErrorData> {
        let token = params
            .meta
            .as_ref()
            .and_then(RequestMetaObject::get_progress_token)
            .or_else(|| context.meta.get_progress_token());
        let client = token.map(|token| progress::ClientProgress {
            peer: context.peer.clone(),
            token,
        });
        let (catalogs, surface) = self.shared.current()?;
        let live = Live {
            grant: &self.shared.grant,
            catalogs: &catalogs,
        };
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        let id = ToolCallId::new(format!("call-{n}"))
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let call = ToolCall {
            id,
            name: params.name.into_owned(),
            arguments: Value::Object(params.arguments.unwrap_or_default()),
        };
        let (sink, relay, watch) = progress::sink(client);
        let ended = {
            let execution = async {
                let calls = std::slice::from_ref(&call);
                let execution =
                    self.executor
                        .execute_with_progress(&surface, &live, calls, vec![Some(sink)]);
                // The relay ends when the sink is dropped: every report is sent before the
                // result is.
                let (logged, ()) = tokio::join!(execution, relay.run());
                logged
            };
            let mut execution = std::pin::pin!(execution);
            tokio::select! {
                logged = &mut execution => Ended::Done(logged),
                () = context.ct.cancelled() => {
                    let logged = watch.left_host();
                    if logged {
                        // Answered (or never forwarded): what remains is logging it.
                        let _ = execution.await;
                    }
                    // Otherwise the execution is dropped here, before it logged anything,
                    // and the upstream request with it.
                    Ended::Cancelled { logged }
                }
            }
        };
        let logged = match ended {
            Ended::Done(logged) => logged,
            Ended::Cancelled { logged } => {
                if !logged {
                    self.log_cancelled(call).await?;
                }
                return Err(ErrorData::new(
                    ErrorCode::INVALID_REQUEST,
                    CANCELLED_BY_CLIENT,
                    None,
                ));
            }
        };
        let logged = match logged {
            Ok(logged) => logged,
            Err(ExecuteError::InvalidDeferredHandle(error)) => {
                return Err(ErrorData::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("{INVALID_DEFERRED_HANDLE}: {error}"),
                    Some(json!({ "code": INVALID_DEFERRED_HANDLE })),
                ));
            }
            Err(error) => return Err(ErrorData::internal_error(error.to_string(), None)),
        };
        // The logged record is ours: its output is moved to the client, not copied.
        let Some(LoggedRecord {
            handle,
            record: Record::ToolResult(result),
        }) = logged.into_iter().next()
        else {
            return Err(ErrorData::internal_error("the call logged no result", None));
        };
        let view = self.shared.elider.project(&[ResultRef {
            handle: &handle,
            output: &result.output,
        }]);
        let output = match view.as_slice() {
            [Projection::Replaced(text)] => {
                let mut shown = ToolOutput::text(text);
                shown.is_error = result.output.is_error;
                shown
            }
            _ if answered_here(&surface, &call.name) => with_text_block(result.output),
            _ => result.output,
        };
        serde_json::to_value(&output)
            .map_err(|e| ErrorData::internal_error(format!("encoding the result: {e}"), None))
    }

    /// Logs `call`'s result as cancelled by the client (it was dropped before it had one).
    async fn log_cancelled(&self, call: ToolCall) -> Result<(), ErrorData> {
        let record = Record::ToolResult(ToolResult {
            call_id: call.id,
            name: call.name,
            output: ToolOutput::error(format!(
                "{CANCELLED_BY_CLIENT} before it had a result; its upstream request, if it \
                 had been sent, was cancelled"
            )),
        });
        let log = Arc::clone(self.executor.log());
        let appended = tokio::task::spawn_blocking(move || log.append(&record)).await;
        match appended {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(ErrorData::internal_error(
                format!("{CANCELLED_BY_CLIENT}; logging that failed: {error}"),
                None,
            )),
            Err(error) => Err(ErrorData::internal_error(error.to_string(), None)),
        }
    }

    /// Starts telling `peer` when its listing changes.
    fn watch(&self, peer: Peer<RoleServer>) {
        let shared = Arc::clone(&self.shared);
        let limits = self.executor.limits().clone();
        let listing = move |shared: &Shared| -> Option<String> {
            let (_, surface) = shared.current().ok()?;
            serde_json::to_string(&client_tools(&surface, &limits)).ok()
        };
        let task = tokio::spawn(async move {
            let mut seen = shared.fingerprint();
            let mut last = listing(&shared);
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                let now = shared.fingerprint();
                if now == seen {
                    continue;
                }
                seen = now;
                let current = listing(&shared);
                if current != last {
                    last = current;
                    if peer.notify_tool_list_changed().await.is_err() {
                        break;
                    }
                }
            }
        });
        let previous = self
            .watcher
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(task);
        if let Some(previous) = previous {
            previous.abort();
        }
    }
}

/// Refuses a request of MCP 2026-07-28's per-request lifecycle (its `_meta` names a protocol
/// version) as an unsupported version, naming the revisions with `initialize`.
///
/// The gateway is a session per client: its record log (whose handles `read_tool_output`
/// reads back), its `list_changed` watcher, and over HTTP the session transport that sends
/// results raw ([`raw`]). rmcp serves a per-request request with a handler of its own and a
/// one-shot transport: such a client would get typed results (unknown fields dropped) and a
/// new session, so a foreign handle, on every request. Only the handler path needs this
/// (HTTP); over stdio the [`Gateway`] answers raw and the process is the session.
fn per_request(context: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
    match context.meta.protocol_version() {
        Some(requested) => Err(ErrorData::unsupported_protocol_version(
            requested,
            ProtocolVersion::known_up_to(&ProtocolVersion::LATEST_WITH_INITIALIZE),
        )),
        None => Ok(()),
    }
}

/// Over stdio, [`Gateway`] answers `tools/list` and `tools/call` as raw JSON and the rest
/// is this handler's. Over streamable HTTP (whose server takes only a handler) the two
/// answer with typed placeholders that [`raw::RawTransport`] replaces with the raw JSON on
/// the way out.
impl ServerHandler for Session {
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        per_request(&context)?;
        let raw = self.listing()?;
        let mut typed: ListToolsResult = serde_json::from_value(raw.clone())
            .map_err(|e| ErrorData::internal_error(format!("encoding the listing: {e}"), None))?;
        self.shared.raw.stash(raw, &mut typed.meta);
        Ok(typed)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        per_request(&context)?;
        let raw = self.call_or_cancel(request, &context).await?;
        // What rmcp can type of the result: sent only if the raw answer cannot be.
        let mut typed = serde_json::from_value::<CallToolResult>(raw.clone()).unwrap_or_else(|e| {
            CallToolResult::error(vec![rmcp::model::ContentBlock::text(format!(
                "the result cannot be sent typed: {e}"
            ))])
        });
        self.shared.raw.stash(raw, &mut typed.meta);
        Ok(CallToolResponse::from(typed))
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.watch(context.peer);
    }

    /// `server/discover` is not found, as on every server from before 2026-07-28: a client
    /// of that revision then connects with `initialize`, as its backward-compatibility rule
    /// says (rmcp's client does so in its `Auto` lifecycle). See [`per_request`].
    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        Err(ErrorData::new(
            ErrorCode::METHOD_NOT_FOUND,
            "server/discover: psych serve keeps a session per client (its record log and \
             handles); connect with initialize",
            None,
        ))
    }

    fn get_info(&self) -> InitializeResult {
        let info = InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("psych", env!("CARGO_PKG_VERSION")));
        match self.shared.instructions() {
            Some(text) => info.with_instructions(text),
            None => info,
        }
    }
}

/// `tools/list` and `tools/call` are answered as raw JSON, over stdio and streamable HTTP
/// alike: the tool definitions and the upstream's result exactly as stored (unknown fields
/// and block types kept, which rmcp's typed `CallToolResult` would drop or refuse); the rest
/// is rmcp's [`ServerHandler`].
struct Gateway(Session);

impl Service<RoleServer> for Gateway {
    async fn handle_request(
        &self,
        request: ClientRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        match request {
            ClientRequest::ListToolsRequest(_) => {
                Ok(ServerResult::CustomResult(CustomResult(self.0.listing()?)))
            }
            ClientRequest::CallToolRequest(request) => Ok(ServerResult::CustomResult(
                CustomResult(self.0.call_or_cancel(request.params, &context).await?),
            )),
            other => Service::handle_request(&self.0, other, context).await,
        }
    }

    async fn handle_notification(
        &self,
        notification: ClientNotification,
        context: NotificationContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Service::handle_notification(&self.0, notification, context).await
    }

    fn get_info(&self) -> InitializeResult {
        ServerHandler::get_info(&self.0)
    }
}

/// Where `psych serve` listens.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Listen {
    /// One client on stdin/stdout.
    Stdio,
    /// Streamable HTTP on this loopback address, one session per client.
    Http(SocketAddr),
}

/// Runs the gateway for `config` until its client leaves (stdio) or the process is stopped
/// (HTTP), resolving with `settings` (`psych serve`'s own auto budget,
/// [`crate::setup::SERVE_AUTO_BUDGET`] by default). Logs go under `<dir>/serve/`.
pub(crate) fn run(
    config: McpConfig,
    dir: &Path,
    listen: Listen,
    settings: Settings,
) -> Result<u8, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(serve(config, dir, listen, settings))
}

async fn serve(
    config: McpConfig,
    dir: &Path,
    listen: Listen,
    settings: Settings,
) -> Result<u8, String> {
    let grant = grant_from(&config)?;
    let connections: Vec<ConnectionSpec> = config
        .servers
        .values()
        .map(|entry| entry.connection.clone())
        .collect();
    let manager = McpManager::builder(config.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let catalog = Catalog::in_memory().map_err(|e| format!("the catalogue: {e}"))?;
    let fresh = FreshenerConfig::builder()
        .build()
        .map_err(|e| format!("the catalogue's freshener: {e}"))?;
    let Connected {
        sync,
        freshener,
        failures,
        ..
    } = CatalogSync::connect(&manager, catalog, fresh)
        .await
        .map_err(|e| format!("the catalogue's freshener: {e}"))?;
    for (server, error) in failures {
        eprintln!("psych serve: {server}: {error}");
    }
    let shared = Arc::new(Shared {
        manager: manager.clone(),
        freshener: Arc::clone(&freshener),
        connections,
        grant,
        settings,
        elider: Elider::default(),
        logs: dir.join("serve"),
        sessions: AtomicU64::new(0),
        resolved: Mutex::new(None),
        raw: Arc::default(),
    });
    let served = match listen {
        Listen::Stdio => serve_stdio(shared).await,
        Listen::Http(addr) => serve_http(shared, addr).await,
    };
    sync.stop().await;
    freshener.shutdown().await;
    manager.shutdown().await;
    served.map(|()| 0)
}

async fn serve_stdio(shared: Arc<Shared>) -> Result<(), String> {
    let session = Session::open(shared).map_err(|e| format!("the session's record log: {e}"))?;
    let running = Gateway(session)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("serving stdio: {e}"))?;
    running
        .waiting()
        .await
        .map(|_| ())
        .map_err(|e| format!("serving stdio: {e}"))
}

async fn serve_http(shared: Arc<Shared>, addr: SocketAddr) -> Result<(), String> {
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    use rmcp::transport::StreamableHttpService;
    use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;

    if !addr.ip().is_loopback() {
        return Err(format!("--http: {addr} is not a loopback address"));
    }
    let raw = Arc::clone(&shared.raw);
    let service = TowerToHyperService::new(StreamableHttpService::new(
        move || Session::open(Arc::clone(&shared)),
        raw::RawSessions::new(raw).into(),
        StreamableHttpServerConfig::default(),
    ));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("--http {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    eprintln!("psych serve: listening on http://{local}/mcp");
    println!("listening on http://{local}/mcp");
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = accepted.map_err(|e| format!("--http {addr}: {e}"))?;
                let service = service.clone();
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> McpConfig {
        McpConfig::parse(text, |_| None).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn allow_tools_narrows_the_grant_and_its_absence_grants_the_server() {
        let config = config(
            r#"{"mcpServers": {
                "a": {"command": "x", "allowTools": ["echo", "large"]},
                "b": {"command": "y"}
            }}"#,
        );
        let grant = grant_from(&config).unwrap_or_else(|e| panic!("{e}"));
        let permits = |s: &str, t: &str| {
            let pair = ToolRef::parse(s, t).unwrap_or_else(|e| panic!("{e}"));
            grant.permits(&pair.server, &pair.tool)
        };
        assert!(permits("a", "echo"));
        assert!(permits("a", "large"));
        assert!(!permits("a", "crash"));
        assert!(permits("b", "anything"));
    }

    #[test]
    fn a_malformed_allow_list_is_refused_with_the_server_named() {
        for bad in [r#""echo""#, r#"[1]"#, r#"["no spaces allowed"]"#] {
            let text =
                format!(r#"{{"mcpServers": {{"a": {{"command": "x", "allowTools": {bad}}}}}}}"#);
            let error = grant_from(&config(&text)).err().unwrap_or_default();
            assert!(error.starts_with("a: allowTools"), "{bad}: {error}");
        }
    }

    /// The real catalogues (one github capture), each as the `tools/list` result a client
    /// connected to it directly receives: (server, result text, tools).
    fn fixtures() -> Vec<(String, String, Vec<ToolDefinition>)> {
        let dir = match std::env::var_os("PSYCH_FIXTURES") {
            Some(dir) => std::path::PathBuf::from(dir).join("catalogs"),
            None => Path::new(env!("CARGO_MANIFEST_DIR"))
                .ancestors()
                .map(|dir| dir.join("shared/fixtures/catalogs"))
                .find(|dir| dir.is_dir())
                .unwrap_or_else(|| panic!("no shared/fixtures/catalogs")),
        };
        let files = [
            ("github", "github.tools.full.json"),
            ("notion", "notion.tools.json"),
            ("playwright", "playwright.tools.json"),
            ("filesystem", "server-filesystem.tools.json"),
            ("memory", "server-memory.tools.json"),
        ];
        files
            .iter()
            .map(|(server, file)| {
                let text = std::fs::read_to_string(dir.join(file))
                    .unwrap_or_else(|e| panic!("{file}: {e}"));
                let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
                let tools = serde_json::from_value(value["tools"].clone())
                    .unwrap_or_else(|e| panic!("{file}: {e}"));
                ((*server).to_owned(), text, tools)
            })
            .collect()
    }

    /// The gateway's `tools/list` result over the fixtures, with every server's preload set
    /// to `preload`, under `psych serve`'s default settings: its text.
    fn gateway_listing(preload: psych_types::Preload) -> String {
        use psych_types::ServerId;
        let catalog = Catalog::in_memory().unwrap_or_else(|e| panic!("{e}"));
        let mut connections = Vec::new();
        let mut grant = PermissionGrant::none();
        let mut catalogs = Vec::new();
        for (server, _, tools) in fixtures() {
            let server = ServerId::new(server).unwrap_or_else(|e| panic!("{e}"));
            catalog
                .refresh(&server, &tools)
                .unwrap_or_else(|e| panic!("{e}"));
            catalogs.push(catalog.live(&server).unwrap_or_else(|e| panic!("{e}")));
            connections.push(ConnectionSpec::new(server.clone()).with_preload(preload));
            grant = grant.allow_server(server);
        }
        let settings = crate::setup::serve_settings(crate::setup::SERVE_AUTO_BUDGET)
            .unwrap_or_else(|e| panic!("{e}"));
        let inputs = Inputs {
            connections: &connections,
            catalogs: &catalogs,
            grant: &grant,
        };
        let surface =
            resolve(&inputs, &settings, &Estimator::new()).unwrap_or_else(|e| panic!("{e}"));
        let tools = client_tools(&surface, &psych_reader_tool::Limits::default());
        json!({ "tools": tools }).to_string()
    }

    /// What `psych serve` saves a client of the five real catalogues: the bytes and estimated
    /// tokens of its `tools/list` against the five results of connecting each server
    /// directly. Printed with `cargo test -p psych-cli --bin psych fixture_listing --
    /// --nocapture`.
    #[test]
    fn fixture_listing_through_serve_against_every_server_directly() {
        use psych_types::{Preload, TokenEstimator};
        let estimator = Estimator::new();
        let fixtures = fixtures();
        let direct_bytes: usize = fixtures.iter().map(|(_, text, _)| text.len()).sum();
        let direct_tokens: u64 = fixtures
            .iter()
            .map(|(_, text, _)| estimator.estimate_text(text))
            .sum();
        let tools: usize = fixtures.iter().map(|(_, _, tools)| tools.len()).sum();
        eprintln!("directly: {tools} tools, {direct_bytes} B, {direct_tokens} ~tok");
        let mut ratios = Vec::new();
        for (label, preload) in [("auto", Preload::Auto), ("deferred", Preload::Deferred)] {
            let listing = gateway_listing(preload);
            let tokens = estimator.estimate_text(&listing);
            let ratio = direct_bytes as f64 / listing.len() as f64;
            let token_ratio = direct_tokens as f64 / tokens as f64;
            eprintln!(
                "psych serve, preload {label}: {} B, {tokens} ~tok: {ratio:.1}x bytes, \
                 {token_ratio:.1}x tokens",
                listing.len()
            );
            ratios.push((ratio, token_ratio));
        }
        // The default: the Auto servers share 1,000 tokens, so the listing is the meta
        // tools, orientation, the reader and at most that much more.
        assert!(ratios[0].0 >= 30.0 && ratios[0].1 >= 30.0, "{ratios:?}");
        // Every server deferred: the listing is the meta tools, orientation and the reader.
        assert!(ratios[1].0 >= 30.0 && ratios[1].1 >= 30.0, "{ratios:?}");
    }
}
