//! Psych's disclosure for any MCP client, as one MCP server: the library behind
//! `psych serve`, embeddable in a program of your own ([`serve`]: an `mcpServers` file, a
//! [`Listener`], [`GatewaySettings`], and a shutdown signal the caller owns).
//!
//! # Example
//!
//! ```
//! use psych_gateway::{GatewaySettings, Listener, serve};
//! use psych_mcp::McpConfig;
//!
//! let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None)?;
//! let dir = tempfile::tempdir()?;
//! let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
//! runtime.block_on(async {
//!     // Bound by the caller (port 0: any free one), on loopback: without tokens
//!     // (`GatewaySettings::tokens`) the gateway refuses any other address.
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//!     println!("MCP clients connect to http://{}/mcp", listener.local_addr()?);
//!     let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//!     let settings = GatewaySettings::new(dir.path())?;
//!     let gateway = tokio::spawn(serve(config, Listener::Http(listener), settings, async {
//!         let _ = stopped.await;
//!     }));
//!     // ... the program's own work; then:
//!     let _ = stop.send(());
//!     gateway.await??;
//!     Ok::<(), Box<dyn std::error::Error>>(())
//! })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The gateway connects the upstream servers of an `mcpServers` file (psych-mcp's
//! [`McpManager`]), keeps their catalogues fresh (the runtime's [`CatalogSync`]: sync on
//! connect, `list_changed`, reachability) in a catalogue kept in `<dir>/catalog.redb`
//! ([`GatewaySettings::catalog`]) or in a store replicas share
//! ([`GatewaySettings::catalog_in`]), and answers its one MCP client (stdio) or each
//! of its clients (`--http`) with what disclosure decides:
//!
//! - **Servers start when they are needed.** A server whose listing the catalogue kept and
//!   is younger than its listing TTL, and that is configured as it was when listed, is
//!   known from it without being started (psych-runtime's `start_at`):
//!   its deferred line, `psych_list_tools`, `psych_describe_tool`, search and orientation
//!   answer from the kept listing. Its first call starts it (once for concurrent calls),
//!   lists it, and is guarded against that fresh listing (a tool it no longer has refused
//!   as removed, a changed schema validated as changed; the change reaches every client as
//!   `list_changed`); it stops after its idle time with no call in flight, and the next
//!   call starts it again. Starting and stopping never change the listing's bytes; a start
//!   that fails answers the call with a tool error naming why (and the orientation then
//!   says the server is unreachable until a start succeeds). The file's `"lazy": false`, or
//!   [`GatewaySettings::eager`], starts a server at once; a server never listed, or listed
//!   longer ago than its TTL, starts at once (psych-mcp's
//!   [`StartPolicy`](psych_mcp::StartPolicy)). A second gateway on the same `dir` finds the
//!   catalogue held, keeps one in memory and starts every server at once.
//! - `tools/list` resolves the Surface from the catalogue as it is *now* (direct tools,
//!   facades, search pairs, the meta tools, the orientation tool) plus `read_tool_output`,
//!   with the gateway's own auto budget ([`disclosure_settings`], by default
//!   [`DEFAULT_AUTO_BUDGET`] tokens of whole tool definitions shared by the
//!   `auto` servers, smallest first), so the listing stays small however many servers the
//!   file names.
//!   The deferred-server lines go in the initialize result's `instructions` and at the end of
//!   the list meta tool's description, where a client that hides `instructions` still shows
//!   them to its model.
//! - `tools/call` goes through the runtime's [`Executor`] (the guard re-checked at call time
//!   against the grant and the live catalogues, meta tools, orientation, the reader, the
//!   forwarded call under a deadline); the result is logged whole in its identity's record
//!   log (`<dir>/serve/<identity>/<run>.plog`) and the client gets psych-elision's projection of it
//!   (the per-result threshold, failures truncated). A result that is not elided passes
//!   through as the upstream sent it (images stay images, unknown block types and fields
//!   are kept), over stdio and over HTTP (the `raw` module), but for a failure holding
//!   binary data, which is its readable text (each such block named by a line); Psych's
//!   own answers (meta tools, search, orientation, the reader) carry their structured
//!   content as a text block too.
//! - A call the client cancels is dropped, which cancels the upstream request, and its
//!   result is logged as cancelled by the client, so the log holds a result for every call.
//!   The upstream's progress reaches the client under the client's progress token: the
//!   call carries its own progress sink through the executor to the upstream call
//!   (the `progress` module).
//! - A handle belongs to an identity (the `tenant` module): it reads back on any later
//!   request, connection or session of the same identity and after a restart on the same
//!   `dir`; another identity's handle, or one never minted, is the JSON-RPC error
//!   `invalid_deferred_handle`, never a tool result (the gateway's log holds the call as
//!   refused, nothing run). Over stdio the identity is `stdio`;
//!   over HTTP it is the one a bearer token of [`GatewaySettings::tokens`] names (401
//!   without one), or `loopback` when there are no tokens. Retention
//!   ([`GatewaySettings::retention`]) deletes whole log segments by age and size; a handle
//!   of a deleted one answers that it expired.
//! - When what `tools/list` would answer changes (an upstream `list_changed`, a server
//!   connecting late or going down), the client gets `notifications/tools/list_changed`.
//!   Resolution is deterministic, so unchanged tools keep their bytes and their order.
//!   Sessions are woken by the catalogue ([`Catalog::changes`]), never by a timer: one
//!   resolver task resolves the Surface again off the async workers when the catalogue
//!   changes, and each session compares the new listing's bytes with its client's.
//! - `initialize` is answered at once from what is known: the upstream servers connect in
//!   the background, so one that never answers delays nobody. A server still connecting is
//!   a deferred server with no tools ("not listed yet", disclosure's own line for a server
//!   without a listing); its tools reach the client through `list_changed` when its first
//!   listing commits.
//! - The shutdown signal (`psych serve`: SIGTERM or SIGINT) stops the gateway gracefully
//!   within [`SHUTDOWN_WITHIN`]: every call in flight is cancelled upstream and logged as
//!   [`CANCELLED_BY_SHUTDOWN`], the sessions are closed, the catalogue's tasks stopped, and
//!   every upstream process group stopped (SIGTERM, grace, SIGKILL). A caller that stops
//!   polling [`serve`] instead (`psych serve` on a second signal) still has the upstream
//!   groups killed, as the manager is dropped.
//! - A stdio client that closes stdin with calls in flight ends the gateway the same way,
//!   by one path: rmcp waits up to 5 s for their answers, then the calls still in flight
//!   are cancelled upstream and logged as [`CANCELLED_BY_CLIENT`], and the gateway waits
//!   for every one of them to be logged before it stops the upstreams and exits.
//! - Over HTTP at most [`GatewaySettings::max_sessions`] ([`MAX_SESSIONS`] by default)
//!   sessions are open at once; one more is refused (503 Service Unavailable, `Retry-After:
//!   1`) with an error for the request's id saying so (plain text for `server/discover`
//!   and for a body over 4 KiB). With tokens, one identity holds at most
//!   [`GatewaySettings::max_sessions_per_identity`] of them (half by default), refused
//!   the same way past it; and while other identities are refused for want of room, one
//!   at its fair share (the cap over the identities active now) takes no more until they
//!   have theirs ([`FAIR_WINDOW`]).
//!   A session ends when its client deletes it or after [`SESSION_IDLE`] (or
//!   [`GatewaySettings::session_idle`]) without a message or an HTTP request for it and
//!   with no request in flight, and its slot is freed.
//! - What a client holds in the gateway at once is bounded: a stdio client at most 64
//!   requests in flight (one more is answered at once with an error, -32000); over HTTP at
//!   most [`MAX_CONNECTIONS`] connections (more wait to be accepted; one whose client
//!   reads nothing it is sent for [`WRITE_WITHIN`], its socket's buffers full, is closed),
//!   [`MAX_REQUESTS`] POSTs in flight in all and [`MAX_REQUESTS_PER_SESSION`] in one
//!   session (one more is answered `429 Too Many Requests`), [`MAX_STREAMS`] event streams
//!   (GETs) in all, [`MAX_LISTENS`] in one session and two per session one identity may
//!   hold (at least [`MAX_LISTENS`]),
//!   each POST's body at most
//!   4 MiB and [`MAX_REQUEST_STRUCTURAL_BYTES`] structural bytes (past either, `413
//!   Payload Too Large`, with an error for the request's id when its first 4 KiB show one).
//!
//! Grants come from the file ([`McpConfig::grant`]): each server entry may carry Psych's
//! `allowTools` key (a list of tool names); without it every tool of the server is
//! permitted. The listing and the `instructions` are disclosure's
//! ([`Surface::client_tools`], [`Surface::client_instructions`]).

#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use psych_catalog::{Catalog, FreshenerConfig};
use psych_disclosure::pinning::PinSettings;
use psych_disclosure::{Budget, CostBasis, Inputs, Live, Settings, Surface, SurfaceCache};
use psych_elision::{Elider, Estimator};
use psych_mcp::{McpConfig, McpManager, SpillBudget};
use psych_reader_tool::{Limits, tool_definition};
use psych_record_log::{RecordLog, SharedRecordLog, SyncPolicy};
use psych_runtime::{
    Archive, CatalogSync, ExecuteError, Executed, Executor, LazyStarts, ListingSources, OnDemand,
    PassingBudget, StartAt, Started, start_at,
};
use psych_types::{
    ConnectionSpec, ContentBlock, DynRecordStore, Erased, InputRound, JsonObject, LoggedRecord,
    PermissionGrant, Projection, READ_TOOL_OUTPUT, Record, RecordHandle, RecordStore as _,
    RecordStores, ResultProjector, ServerCatalog, StoredRef, TokenEstimator, ToolCall, ToolCallId,
    ToolDefinition, ToolOutput, ToolRef, ToolResult,
};
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, DiscoverResult, ErrorCode,
    ErrorData, Implementation, InitializeRequestParams, InitializeResult, InputRequiredResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, RequestMetaObject, ResultType,
    ServerCapabilities, SubscriptionFilter,
};
use rmcp::service::{NotificationContext, Peer, RequestContext, SubscriptionContext};
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

mod admit;
mod mrtr;
mod pinning;
mod progress;
mod raw;
mod resources;
mod stdio;
mod tenant;
mod tokens;

pub use admit::{
    BODY_WITHIN, MAX_CONNECTIONS, MAX_REQUESTS, MAX_REQUESTS_PER_SESSION, MAX_STREAMS, PEEK,
    WRITE_WITHIN,
};
pub use pinning::{learned_pins, serve_usage, store_usage};
pub use resources::{RESULT_URI_PREFIX, result_uri};
pub use tenant::{DEFAULT_RETAIN, DEFAULT_RETAIN_BYTES, Retention};
pub use tokens::{RESERVED_IDENTITIES, Tokens, TokensError, new_token, token_digest};

/// How long a graceful shutdown may take, from the first SIGTERM or SIGINT to the exit:
/// the calls in flight cancelled and logged, the sessions closed, the catalogue's tasks
/// stopped, every upstream process group stopped (each SIGTERM, psych-mcp's 2 s grace,
/// then SIGKILL; all servers at once). Past it the gateway exits anyway, and the upstream
/// groups are killed as the manager is dropped.
pub const SHUTDOWN_WITHIN: Duration = Duration::from_secs(10);

/// How many HTTP sessions may be open at once by default (`--max-sessions`). Each holds a
/// record log, a watcher task and rmcp's session worker; a client opening sessions in a
/// loop is refused past it instead of exhausting memory and file descriptors.
pub const MAX_SESSIONS: usize = 64;

/// How long an identity refused a session for want of room is owed its fair share of
/// [`GatewaySettings::max_sessions`] (see [`SessionRefused::IdentityShare`]): 10 s, ten of
/// the retries `Retry-After: 1` asks for. An identity that stops asking is owed nothing
/// once it has passed.
pub const FAIR_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// An identity at or above its fair share of the sessions, and the slots it must leave
/// free for the identities waiting ([`Shared::identity_room`]).
#[derive(Debug, Clone, Copy)]
struct Owed {
    /// The sessions the identity holds.
    held: usize,
    /// Its fair share now.
    fair: usize,
    /// The slots owed to identities refused within [`FAIR_WINDOW`].
    slots: usize,
}

/// How many of [`GatewaySettings::max_sessions`] one identity of a tokens file naming
/// `identities` may hold by default (`--max-sessions-per-identity`): half (at least one)
/// when it names several, so that one identity's clients opening sessions in a loop leave
/// the others room; all of them when it names one.
pub fn default_max_sessions_per_identity(max_sessions: usize, identities: usize) -> usize {
    if identities <= 1 {
        max_sessions
    } else {
        (max_sessions / 2).max(1)
    }
}

/// How much of a gateway's budget of passed result text (`passing_budget`, calls passing
/// results of at most `max_passed` bytes each) one identity of a tokens file naming
/// `identities` may hold at once: half (at least one call's bound) when it names several,
/// so that one identity's slow calls holding passed results leave the others room, as
/// [`default_max_sessions_per_identity`] does for sessions; all of it when it names one.
///
/// ```
/// use psych_gateway::default_passing_share;
/// const MIB: u64 = 1 << 20;
/// assert_eq!(default_passing_share(64 * MIB, 16 * MIB, 1), 64 * MIB);
/// assert_eq!(default_passing_share(64 * MIB, 16 * MIB, 3), 32 * MIB);
/// // Never less than one call's bound, never more than the whole.
/// assert_eq!(default_passing_share(24 * MIB, 16 * MIB, 2), 16 * MIB);
/// assert_eq!(default_passing_share(16 * MIB, 16 * MIB, 2), 16 * MIB);
/// ```
pub fn default_passing_share(passing_budget: u64, max_passed: u64, identities: usize) -> u64 {
    if identities <= 1 {
        passing_budget
    } else {
        (passing_budget / 2).max(max_passed).min(passing_budget)
    }
}

/// The most `subscriptions/listen` streams (MCP 2026-07-28) one identity may hold open at
/// once (each also holds a session slot while open): one more is refused, so one
/// identity's idle streams cannot take every slot. Also the most event streams (GETs) one
/// session of the `initialize` lifecycle may hold ([`MAX_STREAMS`]).
pub const MAX_LISTENS: usize = 8;

/// The most structural bytes (`[`, `{`, `,` and `:` outside strings) one message of a
/// client may hold, over stdio or HTTP: 262,144. A message past it is refused unparsed:
/// over stdio with error -32600 (`request too complex: …`, with the request's `id` when it
/// can be read), over HTTP with `413 Payload Too Large` (the same error as JSON when the
/// `id` is in the body's first 4 KiB) as soon as its body passes it.
///
/// A message's bytes are bounded (4 MiB), but what it takes parsed grows with its values:
/// a 4 MiB line of `[0,0,…]` holds 2 Mi values, about 65 MiB as a `serde_json::Value` and
/// four times that while rmcp types it (psych-mcp's measure,
/// [`MAX_JSON_STRUCTURAL_BYTES`](psych_mcp::MAX_JSON_STRUCTURAL_BYTES)), held for the
/// call, 64 calls in flight per session. At this bound a message parses to about 8 MiB
/// plus its strings' bytes (32 MiB while typed): within a few times its own size. A tool's
/// arguments of 10,000 rows of 10 values hold about 110,000.
pub const MAX_REQUEST_STRUCTURAL_BYTES: u64 = 256 * 1024;

/// How long an HTTP connection may go without sending a whole request head (idle between
/// requests included) before it is closed.
const HEADER_WITHIN: Duration = Duration::from_secs(30);

/// How long the HTTP listener pauses after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// How often retention runs while the gateway serves (besides at start and rotation).
const SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// How long an upstream call may go without an answer: 60 s with no answer, or with no
/// byte of one still arriving; an answer that keeps arriving may take up to 30 min
/// ([`psych_mcp::Timeouts::call`] and [`psych_mcp::Timeouts::transfer`]).
fn call_timeouts() -> psych_mcp::Timeouts {
    psych_mcp::Timeouts::default()
        .with_call(Duration::from_secs(60))
        .with_transfer(Duration::from_secs(30 * 60))
}

/// What the executor's own deadline adds to the longest call psych-mcp allows: it is only a
/// backstop (psych-mcp's deadline, which cancels the call upstream, comes first).
const BACKSTOP: Duration = Duration::from_secs(5);

/// How long an HTTP session may go without a message or an HTTP request for it (an event
/// stream reopened counts), and with no request in flight, before it is closed and its
/// slot freed, by default ([`GatewaySettings::session_idle`]): a client that vanished
/// without deleting its session holds it no longer than this after its last answer.
pub const SESSION_IDLE: Duration = Duration::from_secs(300);

/// The code of the JSON-RPC error answering a handle the caller's identity never had (one
/// never minted, or another identity's).
pub const INVALID_DEFERRED_HANDLE: &str = "invalid_deferred_handle";

/// What a call the client cancelled is answered with, and how its logged result begins.
pub const CANCELLED_BY_CLIENT: &str = "cancelled by the client";

/// What a call in flight when the gateway shut down is answered with, and how its logged
/// result begins.
pub const CANCELLED_BY_SHUTDOWN: &str = "cancelled: the gateway shut down";

/// What the Surface is resolved from: the catalogue, and the connections and grant from
/// the file with disclosure's settings (only the catalogue changes).
struct Basis {
    catalog: Catalog,
    connections: Vec<ConnectionSpec>,
    grant: PermissionGrant,
    settings: Settings,
    /// The reader's limits: the `read_tool_output` definition listed, and every session's.
    limits: Limits,
    /// The last Surface and each server's prepared part: a change resolves what changed.
    surfaces: Mutex<SurfaceCache<SharedEstimator>>,
}

/// The Surface resolved from the catalogue at one moment, with what is derived from it.
struct View {
    /// Every connected server's live catalogue, as the Surface was resolved from them.
    catalogs: Vec<ServerCatalog>,
    surface: Arc<Surface>,
    /// The `tools/list` result.
    listing: Value,
    /// Its bytes: what a session's watcher compares with what its client last saw.
    bytes: String,
}

/// What the resolver publishes: the [`View`] resolved at a count of the catalogue's
/// changes ([`Catalog::changes`], read before the catalogues were), or why it failed.
struct Resolved {
    at: u64,
    view: Result<Arc<View>, String>,
}

/// The Surface as one grant sees it: what it is resolved from, and its resolver's
/// publications. The file's grant has one lane; each identity whose tokens entry narrows
/// it (`allowTools`) has its own, so its listing is its own and stable.
struct Lane {
    basis: Arc<Basis>,
    /// The catalogue's change count (see [`Catalog::changes`]).
    changes: watch::Receiver<u64>,
    /// The resolver's latest [`Resolved`].
    resolved: watch::Receiver<Option<Arc<Resolved>>>,
}

impl Lane {
    /// The Surface as the catalogue is *now*: waits (without blocking a worker) until the
    /// resolver has resolved every catalogue change made before this call, which is at
    /// most one resolution, shared with every session waiting for it. So permission is
    /// checked against the catalogues as they were when the call came, not as they were at
    /// the last listing.
    async fn current(&self) -> Result<Arc<View>, ErrorData> {
        let at = *self.changes.borrow();
        let mut resolved = self.resolved.clone();
        let view = resolved
            .wait_for(|r| r.as_ref().is_some_and(|r| r.at >= at))
            .await
            .map_err(|_| ErrorData::internal_error("the gateway is shutting down", None))?
            .as_ref()
            .map(|r| r.view.clone());
        match view {
            Some(Ok(view)) => Ok(view),
            Some(Err(error)) => Err(ErrorData::internal_error(error, None)),
            None => Err(ErrorData::internal_error(
                "the tool surface is not resolved yet",
                None,
            )),
        }
    }

    /// The last Surface resolved, without waiting: what `initialize` answers from.
    fn latest(&self) -> Option<Arc<View>> {
        self.resolved
            .borrow()
            .as_ref()
            .and_then(|r| r.view.as_ref().ok().cloned())
    }
}

impl Basis {
    /// Reads every server's live catalogue now and resolves their Surface through the
    /// cache, with its search indexes. Blocks (redb reads, and resolution of the servers
    /// that changed, milliseconds at thousands of tools): run off the async workers.
    fn view(&self) -> Result<View, String> {
        let catalogs = self
            .connections
            .iter()
            .map(|c| self.catalog.live(&c.server))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("reading the catalogue: {e}"))?;
        let inputs = Inputs {
            connections: &self.connections,
            catalogs: &catalogs,
            grant: &self.grant,
        };
        let surface = self
            .surfaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .resolve(&inputs, &self.settings)
            .map_err(|e| format!("resolving the tool surface: {e}"))?;
        surface.prepare_search();
        let tools = client_tools(&surface, &self.limits);
        let bytes = serde_json::to_string(&tools).map_err(|e| format!("the listing: {e}"))?;
        Ok(View {
            catalogs,
            surface,
            listing: json!({ "tools": tools }),
            bytes,
        })
    }
}

/// The one task that resolves the Surface: once at start, then each time the catalogue
/// changes, off the async workers; sessions wait for it instead of resolving themselves
/// (single flight: a change is resolved once, whatever the number of sessions).
///
/// It runs until aborted: calls cut short by a shutdown still read the Surface.
async fn resolver(basis: Arc<Basis>, published: watch::Sender<Option<Arc<Resolved>>>) {
    let mut changes = basis.catalog.changes();
    loop {
        let at = *changes.borrow_and_update();
        let basis = Arc::clone(&basis);
        // Dropped mid-way (shutdown), the blocking work finishes alone and is discarded.
        let view = match tokio::task::spawn_blocking(move || basis.view()).await {
            Ok(view) => view.map(Arc::new),
            Err(error) => Err(format!("resolving the tool surface: {error}")),
        };
        published.send_replace(Some(Arc::new(Resolved { at, view })));
        if changes.changed().await.is_err() {
            return;
        }
    }
}

/// What the gateway counts to shut down in order: whether it is closing (and why: the
/// stdio client left, or a signal), the calls in flight, and the sessions open.
#[derive(Debug, Clone, Copy, Default)]
struct Gauge {
    closing: Option<Cut>,
    calls: usize,
    sessions: usize,
}

/// Resolves once the gateway is closing (or its state is gone).
async fn closing(state: &mut watch::Receiver<Gauge>) {
    let _ = state.wait_for(|g| g.closing.is_some()).await;
}

/// A call in flight, counted until it is dropped.
struct InFlight(watch::Sender<Gauge>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|g| g.calls -= 1);
    }
}

/// An open session's slot, freed when it is dropped.
struct SessionSlot(watch::Sender<Gauge>);

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.0.send_modify(|g| g.sessions -= 1);
    }
}

tokio::task_local! {
    /// Why the last session rmcp asked for while handling an HTTP request could not open
    /// ([`Session::open`] notes it, and clears it when one opens): rmcp 3.11 answers a
    /// failed session factory with a 500 at once (its one lookup that swallows the
    /// failure, of a tool's schema, is not reached from this gateway's routes), which
    /// [`refusing`] replaces with the gateway's own 503 saying why.
    static REFUSED: std::cell::RefCell<Option<SessionRefused>>;
    /// The identity the HTTP request being handled presents (its bearer token's), when the
    /// gateway has tokens: [`Session::open`] counts the session against it.
    static PRESENTED: Option<String>;
}

/// What every session shares: the upstream connections, the Surface resolved from the
/// catalogue kept fresh from them, elision's settings, and the gateway's state.
struct Shared {
    manager: McpManager,
    /// The file's grant's lane: every identity's but those the tokens file narrows.
    lane: Arc<Lane>,
    /// The lanes of the identities whose tokens entry narrows the grant.
    narrowed: BTreeMap<String, Arc<Lane>>,
    /// The reader's limits: the `read_tool_output` definition listed, and every log's.
    limits: Limits,
    /// What every identity's calls and `resources/read` answers hold of passed result text
    /// at once ([`GatewaySettings::passing_budget`]).
    passing: PassingBudget,
    /// The most of `passing` one identity holds ([`default_passing_share`]).
    passing_share: u64,
    elider: Elider<SharedEstimator>,
    /// `<dir>/serve/`: a folder per identity ([`tenant`]).
    logs: PathBuf,
    /// Where records go instead of files under `logs`, when set
    /// ([`GatewaySettings::records_in`]).
    stores: Option<Arc<dyn RecordStores>>,
    retention: Retention,
    /// Every identity that has made a request, each with its log and archive. Bounded by
    /// the identities there can be: `stdio`, `loopback`, or the tokens file's names.
    tenants: Mutex<BTreeMap<String, Arc<Tenant>>>,
    /// The identity of a request that presents none: `stdio`, or `loopback` over HTTP.
    default_identity: &'static str,
    /// Over HTTP, the tokens a request must present (`None`: no authorization, loopback).
    tokens: Option<Arc<Tokens>>,
    state: watch::Sender<Gauge>,
    /// The most sessions open at once (`None`: no cap, stdio's one session).
    max_sessions: Option<usize>,
    /// The most sessions one identity of the tokens file holds at once.
    max_identity_sessions: usize,
    /// Raw answers waiting for the HTTP transport (see [`raw`]).
    raw: Arc<raw::RawAnswers>,
    /// Seals the `requestState` of MCP 2026-07-28's rounds (see [`mrtr`]).
    sealer: mrtr::Sealer,
    /// The servers started only when a call needs them, for every identity's executor.
    on_demand: Option<Arc<dyn OnDemand>>,
    /// Set once the stdio client's input has ended: rmcp then sends no more notifications
    /// (its loop only collects the answers of the requests in flight, for 5 s), so a
    /// call's progress relay stops sending rather than hold the call's answer.
    input_ended: watch::Sender<bool>,
}

/// What a client's `tools/list` gets for `surface`: disclosure's client listing
/// ([`Surface::client_tools`]: the deferred lines at the end of the list meta tool's
/// description), then `read_tool_output` with the reader's `limits`.
fn client_tools(surface: &Surface, limits: &psych_reader_tool::Limits) -> Vec<ToolDefinition> {
    let mut tools = surface.client_tools();
    tools.push(tool_definition(limits));
    for tool in &mut tools {
        sendable_icons(tool);
    }
    tools
}

/// Drops an icon's `theme` that is neither `"light"` nor `"dark"`, the two MCP names: a
/// client typing the listing (rmcp's and the SDKs' types are that enum) would refuse the
/// whole listing for one upstream tool's `"auto"`. The icon itself is kept, and the
/// catalogue keeps the upstream's value.
fn sendable_icons(tool: &mut ToolDefinition) {
    for icon in tool.icons.iter_mut().flatten() {
        if icon
            .theme
            .as_deref()
            .is_some_and(|theme| theme != "light" && theme != "dark")
        {
            icon.theme = None;
        }
    }
}

impl Shared {
    /// The part of the gateway of the identity `name`, made on its first request. No I/O:
    /// its folder and log are made on its first call.
    fn tenant(&self, name: &str) -> Arc<Tenant> {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        let tenant = tenants.entry(name.to_owned()).or_insert_with(|| {
            let dir = self.logs.join(name);
            let lane = Arc::clone(self.narrowed.get(name).unwrap_or(&self.lane));
            let archive: Arc<dyn Archive> = match &self.stores {
                Some(stores) => Arc::new(tenant::InStore::new(
                    Arc::clone(stores),
                    name,
                    self.retention,
                )),
                None => Arc::new(tenant::Kept::new(dir.clone(), self.retention)),
            };
            Arc::new(Tenant {
                name: name.to_owned(),
                lane,
                // One identity's calls hold at most its share of the process's budget.
                passing: self.passing.share(self.passing_share),
                archive,
                dir,
                log: Mutex::new(None),
                calls: tenant::Calls::default(),
                listens: Arc::default(),
                sessions: Arc::default(),
                refused_at: Mutex::new(None),
            })
        });
        Arc::clone(tenant)
    }

    /// Counts a call in flight until the guard is dropped.
    fn enter_call(&self) -> InFlight {
        self.state.send_modify(|g| g.calls += 1);
        InFlight(self.state.clone())
    }

    /// What `asking`, holding `held` sessions besides the one it opens (counted as it took
    /// its place under its cap, so that two opens of one identity at once see each
    /// other), must leave free for the other identities' fair shares
    /// ([`GatewaySettings::max_sessions_per_identity`] is checked apart):
    /// `None` when nothing, else its share and the slots owed
    /// ([`Shared::take_session_slot`] refuses it unless more are free).
    ///
    /// The identities active now (holding a session, refused one for want of room within
    /// [`FAIR_WINDOW`], or asking) share [`Shared::max_sessions`] evenly: the fair share.
    /// Below it an identity takes any free slot; at or above it, only a slot the
    /// identities refused within the window are not owed (each is owed what it lacks of
    /// its share), so that the slots busy identities give back go to those waiting, while
    /// an identity alone, or beside others that want no more, uses every slot its cap
    /// allows. Without a cap on sessions (stdio) there is nothing to share.
    fn identity_room(&self, asking: &Tenant, held: usize) -> Option<Owed> {
        use std::sync::atomic::Ordering;
        let total = self.max_sessions?;
        let now = std::time::Instant::now();
        let mut active = 1usize;
        let mut waiting = Vec::new();
        for tenant in self
            .tenants
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
        {
            if std::ptr::eq(&**tenant, asking) {
                continue;
            }
            let theirs = tenant.sessions.load(Ordering::Relaxed);
            let wanting = tenant.wanting(now);
            if theirs > 0 || wanting {
                active += 1;
            }
            if wanting {
                waiting.push(theirs);
            }
        }
        let fair = (total / active).max(1);
        if held < fair {
            return None;
        }
        let slots: usize = waiting
            .iter()
            .map(|theirs| fair.min(self.max_identity_sessions).saturating_sub(*theirs))
            .sum();
        (slots > 0).then_some(Owed { held, fair, slots })
    }

    /// Takes a session's slot, or says why not: [`Shared::max_sessions`] open already, the
    /// slots left owed to other identities (`owed`, [`Shared::identity_room`]: checked
    /// against the count under the same lock as the take, so two opens at once cannot
    /// both take the last slot not owed), or the gateway closing.
    fn take_session_slot(&self, owed: Option<Owed>) -> Result<SessionSlot, SessionRefused> {
        let mut refused = None;
        self.state.send_if_modified(|g| {
            if g.closing.is_some() {
                refused = Some(SessionRefused::Closing);
                return false;
            }
            if let Some(max) = self.max_sessions {
                if g.sessions >= max {
                    refused = Some(SessionRefused::Full { max });
                    return false;
                }
                if let Some(Owed { held, fair, slots }) = owed
                    && g.sessions + slots >= max
                {
                    refused = Some(SessionRefused::IdentityShare { held, fair });
                    return false;
                }
            }
            g.sessions += 1;
            true
        });
        match refused {
            Some(why) => Err(why),
            None => Ok(SessionSlot(self.state.clone())),
        }
    }

    /// Starts closing because of `why` (the first reason given stands): new sessions are
    /// refused, and every call in flight cancels itself and logs `why`.
    fn close(&self, why: Cut) {
        self.state.send_if_modified(|g| {
            let first = g.closing.is_none();
            g.closing.get_or_insert(why);
            first
        });
    }

    /// Waits until `done` holds of the gateway's state.
    async fn settled(&self, done: impl FnMut(&Gauge) -> bool) {
        let _ = self.state.subscribe().wait_for(done).await;
    }
}

/// Refuses a list request's cursor: the gateway answers every list on one page and gives
/// no cursor, so any cursor is one it never gave (MCP: an invalid cursor is -32602),
/// rather than answering the first page again as if it were the next.
fn no_cursor(request: Option<&PaginatedRequestParams>) -> Result<(), ErrorData> {
    match request.and_then(|request| request.cursor.as_deref()) {
        None => Ok(()),
        Some(cursor) => {
            let shown: String = cursor.chars().take(64).collect();
            Err(ErrorData::invalid_params(
                format!(
                    "cursor {shown:?} is not one psych serve gave: its lists are whole, on one \
                     page, with no nextCursor"
                ),
                None,
            ))
        }
    }
}

/// Whether `output`, whose readable text is `stored_len` bytes as stored, holds over
/// [`JSON_ON_WORKER`](psych_mcp::wire::JSON_ON_WORKER) bytes: its text as stored (a
/// spilled text is a placeholder in memory) with its binary blocks' bytes, or else all it
/// holds as JSON, `_meta` and unknown fields included (serialized only as far as the
/// bound: a binary block is encoded whole before it is counted, so the binary blocks are
/// summed first).
fn past_worker_bound(output: &ToolOutput, stored_len: u64) -> bool {
    let binary: u64 = output
        .binary_blocks()
        .map(|(_, block)| block.data.len() as u64)
        .sum();
    stored_len.saturating_add(binary) > psych_mcp::wire::JSON_ON_WORKER as u64
        || psych_mcp::wire::serialized_past_worker_bound(output)
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
            .push(ContentBlock::text(psych_types::json::to_compact(
                structured,
            )));
    }
    output
}

/// A session's executor over its record log. Dropped (with the last session or opening
/// task holding it), an empty log leaves no file behind: a session whose client listed
/// and left logged nothing. What its drop does to files (the log's end mark and lock,
/// removing an empty file) blocks, so a drop on a worker of a multi-threaded runtime (the
/// last call of a rotated segment ending) does it in `block_in_place`
/// ([`psych_runtime::off_the_worker`]): done when the drop returns, as before (so the logs
/// are closed when [`serve`] returns), while the worker's other tasks move to another
/// thread.
struct SessionLog(Option<LogParts>);

/// What a [`SessionLog`] holds until it is dropped.
struct LogParts {
    executor: Executor<McpManager>,
    /// The segment's file, when the records are in files (not in a shared store).
    file: Option<PathBuf>,
}

impl SessionLog {
    fn new(executor: Executor<McpManager>, file: Option<PathBuf>) -> Self {
        Self(Some(LogParts { executor, file }))
    }

    /// The executor (there until the log is dropped).
    fn executor(&self) -> Option<&Executor<McpManager>> {
        self.0.as_ref().map(|parts| &parts.executor)
    }

    /// The executor, or the error a request gets (never: a log held is not dropped).
    fn serving(&self) -> Result<&Executor<McpManager>, ErrorData> {
        self.executor()
            .ok_or_else(|| ErrorData::internal_error("the identity's record log is closed", None))
    }
}

impl Drop for SessionLog {
    fn drop(&mut self) {
        let Some(parts) = self.0.take() else {
            return;
        };
        // Unwinding, nothing more that could panic: the drop blocks where it is.
        if std::thread::panicking() {
            drop(parts);
        } else {
            psych_runtime::off_the_worker(move || drop(parts));
        }
    }
}

impl Drop for LogParts {
    fn drop(&mut self) {
        if let Some(file) = &self.file
            && self.executor.store().is_empty()
        {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// The outcome of opening an identity's record log segment, published by the task opening it:
/// `None` while it opens.
type LogOpening = watch::Receiver<Option<Result<Arc<SessionLog>, String>>>;

/// One identity's part of the gateway (see [`tenant`]): this process's segment of its log,
/// opened on its first call, the archive its handles of other segments are read from, and
/// its calls counted (each call's id in the log).
struct Tenant {
    /// The identity's name.
    name: String,
    /// The Surface as the identity's grant sees it.
    lane: Arc<Lane>,
    /// `<dir>/serve/<identity>/`.
    dir: PathBuf,
    /// The opening of the live segment, once the first call started it
    /// ([`Tenant::executor`]); replaced by the opening of a fresh one at rotation.
    log: Mutex<Option<LogOpening>>,
    calls: tenant::Calls,
    /// Where the identity's handles of other segments (or, on a shared store, of other
    /// replicas' Runs) are read.
    archive: Arc<dyn Archive>,
    /// The identity's `subscriptions/listen` streams open now (at most [`MAX_LISTENS`]).
    listens: Arc<std::sync::atomic::AtomicUsize>,
    /// The identity's share of the process's budget of passed results, for every segment's
    /// executor ([`default_passing_share`]).
    passing: PassingBudget,
    /// The HTTP sessions the identity opened with its token that are open now (at most
    /// [`GatewaySettings::max_sessions_per_identity`]).
    sessions: Arc<std::sync::atomic::AtomicUsize>,
    /// When a session of the identity was last refused for want of room (every slot taken,
    /// or the free ones owed to others; not at its own cap, nor with the gateway closing):
    /// for [`FAIR_WINDOW`] after it, the identity is owed its fair share
    /// ([`Shared::identity_room`]).
    refused_at: Mutex<Option<std::time::Instant>>,
}

/// One of an identity's listen streams or sessions, counted until it is dropped.
struct Counted(Arc<std::sync::atomic::AtomicUsize>);

impl Counted {
    /// Counts one more in `count`, unless `max` are counted already.
    fn take(count: &Arc<std::sync::atomic::AtomicUsize>, max: usize) -> Option<Self> {
        Self::take_counting(count, max).map(|(counted, _)| counted)
    }

    /// [`Counted::take`], with how many were counted before this one.
    fn take_counting(
        count: &Arc<std::sync::atomic::AtomicUsize>,
        max: usize,
    ) -> Option<(Self, usize)> {
        use std::sync::atomic::Ordering;
        count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|before| (Self(Arc::clone(count)), before))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Tenant {
    /// Counts one more listen stream of the identity, unless [`MAX_LISTENS`] are open.
    fn listening(&self) -> Option<Counted> {
        Counted::take(&self.listens, MAX_LISTENS)
    }

    /// Notes that a session of the identity was refused for want of room now.
    fn refused(&self) {
        *self
            .refused_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(std::time::Instant::now());
    }

    /// Whether a session of the identity was refused for want of room within
    /// [`FAIR_WINDOW`] before `now`.
    fn wanting(&self, now: std::time::Instant) -> bool {
        self.refused_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| now.saturating_duration_since(at) < FAIR_WINDOW)
    }
}

/// One client session: the identity it belongs to, its `list_changed` watcher.
struct Session {
    shared: Arc<Shared>,
    /// The identity of the request that opened the session (with tokens), else of its
    /// first request; a request presenting another is refused.
    tenant: Mutex<Option<(String, Arc<Tenant>)>>,
    /// What the client was shown at `initialize`: the watcher's first baseline.
    shown: Mutex<Option<Arc<View>>>,
    watcher: Mutex<Option<JoinHandle<()>>>,
    _slot: SessionSlot,
    /// The session counted against the identity that opened it, with tokens.
    _identity_slot: Option<Counted>,
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
        // The log, if one was opened, goes with the last holder of its `SessionLog`.
    }
}

/// Why a call ended without its own result (and why the gateway closes).
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// The client cancelled it (or, over stdio, left: it closed stdin).
    Client,
    /// The gateway is shutting down.
    Shutdown,
}

impl Cut {
    /// How the call's logged result begins, and what the client is answered.
    fn reason(self) -> &'static str {
        match self {
            Self::Client => CANCELLED_BY_CLIENT,
            Self::Shutdown => CANCELLED_BY_SHUTDOWN,
        }
    }
}

/// How a call's execution ended.
enum Ended {
    /// It ran to its logged result, or to an upstream answer that is not complete.
    Done(Box<Result<Executed, ExecuteError>>),
    /// It was cut short; `logged` when its own result was logged all the same (it had
    /// left the host when the cancellation came).
    Cancelled { logged: bool, why: Cut },
}

impl Tenant {
    /// The identity's executor, its live segment opened on first use, once. Cancel-safe:
    /// the log is opened by a task of its own (the file created, locked and its header
    /// written in the blocking pool), started by the first caller and awaited by every
    /// caller through a watch, so a caller dropped while it opens (a client cancelling its
    /// first call) leaves the opening running for the next, never a second opening of the
    /// same file (which would find it locked).
    async fn executor(&self, shared: &Shared) -> Result<Arc<SessionLog>, ErrorData> {
        let mut opening = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert_with(|| self.open_log(shared))
            .clone();
        let opened = opening
            .wait_for(Option::is_some)
            .await
            .map_err(|_| {
                ErrorData::internal_error(
                    "the identity's record log: its opening was cut short",
                    None,
                )
            })?
            .clone();
        match opened {
            Some(Ok(log)) => {
                if log.executor().is_some_and(|executor| {
                    executor.store().size_bytes() >= shared.retention.rotate_at()
                }) {
                    self.rotate(shared, &opening);
                }
                Ok(log)
            }
            Some(Err(error)) => {
                self.forget(&opening);
                Err(ErrorData::internal_error(
                    format!("the identity's record log: {error}"),
                    None,
                ))
            }
            None => Err(ErrorData::internal_error(
                "the identity's record log is not open",
                None,
            )),
        }
    }

    /// Starts the task that opens the identity's log: what [`Tenant::executor`] awaits.
    /// The task runs to its end whoever waits for it; if the session is gone by then, the
    /// log it opened is dropped with it (and its empty file removed).
    fn open_log(&self, shared: &Shared) -> LogOpening {
        let (published, opening) = watch::channel(None);
        let logs = self.dir.clone();
        let manager = shared.manager.clone();
        let on_demand = shared.on_demand.clone();
        let limits = shared.limits.clone();
        let passing = self.passing.clone();
        let estimator = Arc::clone(shared.elider.estimator());
        let archive: Arc<dyn Archive> = self.archive.clone();
        let retention = shared.retention;
        let stores = shared.stores.clone();
        let identity = self.name.clone();
        tokio::spawn(async move {
            // No fdatasync per call: measured, it was most of a proxied call's added
            // latency (a call 2.1 ms through the gateway against 0.24 ms direct; one
            // write+fdatasync on that disk about 3 ms). A record survives the process
            // being killed and a restart (the OS page cache holds it), not a power loss:
            // the README says so.
            let opened = tokio::task::spawn_blocking(move || {
                let run = tenant::fresh_run()?;
                // Each result's estimate is stored as it is appended: what the projection
                // plans with, so no result is estimated twice or read whole to be sized.
                let (store, file): (Arc<DynRecordStore>, _) = match stores {
                    // A shared store (PostgreSQL): a Run of the identity's there, which
                    // every replica on the store reads handles of.
                    Some(stores) => (
                        stores
                            .open(&identity, &run, estimator)
                            .map_err(|e| psych_types::error_chain(&e))?,
                        None,
                    ),
                    None => {
                        create_private_dir(&logs).map_err(|e| e.to_string())?;
                        // A segment opens at the identity's first call and at each
                        // rotation: the identity's folder is brought within its limits then
                        // too, so a busy identity does not write past them until the
                        // hourly sweep.
                        tenant::sweep_folder(&logs, retention);
                        let (mut log, _) = RecordLog::open(&logs, &run, SyncPolicy::OsBuffered)
                            .map_err(|e| e.to_string())?;
                        log.set_estimator(estimator);
                        let file = log.path().to_path_buf();
                        (
                            Arc::new(Erased(SharedRecordLog::new(log))) as Arc<DynRecordStore>,
                            Some(file),
                        )
                    }
                };
                // psych-mcp's deadlines decide (one for silence once an answer arrives);
                // the executor's is a backstop past the longest call they allow.
                let mut executor = Executor::on_store(Arc::new(manager), store)
                    .call_timeout(call_timeouts().longest_call().saturating_add(BACKSTOP))
                    .reader_limits(limits)
                    .passing_budget(passing)
                    .archive(archive)
                    // Polled by rmcp's handler tasks on the multi-threaded runtime `serve`
                    // runs on (never in a LocalSet): one identity's calls, from any of its
                    // sessions, share this executor and its compiled schemas.
                    .off_worker_guard(true);
                if let Some(on_demand) = on_demand {
                    executor = executor.on_demand(on_demand);
                }
                Ok(Arc::new(SessionLog::new(executor, file)))
            })
            .await
            .unwrap_or_else(|error| Err(error.to_string()));
            published.send_replace(Some(opened));
        });
        opening
    }

    /// Starts a fresh segment in place of the one `full` opened (unless another call did
    /// already): the full segment's calls in flight end in it, and its handles stay
    /// readable through the archive until retention (the next sweep) removes it.
    fn rotate(&self, shared: &Shared, full: &LogOpening) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if log
            .as_ref()
            .is_some_and(|current| current.same_channel(full))
        {
            *log = Some(self.open_log(shared));
        }
    }

    /// Forgets the opening `failed` (unless another call replaced it already), so the
    /// next call opens the log again rather than failing for good.
    fn forget(&self, failed: &LogOpening) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if log
            .as_ref()
            .is_some_and(|current| current.same_channel(failed))
        {
            *log = None;
        }
    }
}

impl Session {
    /// A session of `shared`, in one of its session slots. No I/O: its record log is
    /// opened on the first call.
    ///
    /// # Errors
    ///
    /// Why no slot is free ([`Shared::take_session_slot`]), or the identity the HTTP
    /// request presents holds as many sessions as it may
    /// ([`GatewaySettings::max_sessions_per_identity`]).
    fn open(shared: Arc<Shared>) -> Result<Self, SessionRefused> {
        // With tokens, the session is its opener's (the HTTP layer records it so, and
        // refuses another identity's requests in it), so it is bound and counted now.
        // The identity's own bound first, so that one at it takes no global slot even for
        // a moment (another identity's open could be refused by it); a closing gateway
        // before both, so that it says it is closing rather than to retry.
        let presented = PRESENTED.try_with(Clone::clone).ok().flatten();
        let closing = shared.state.borrow().closing.is_some();
        let identity = match presented {
            _ if closing => Err(SessionRefused::Closing),
            Some(name) => {
                let tenant = shared.tenant(&name);
                let max = shared.max_identity_sessions;
                match Counted::take_counting(&tenant.sessions, max) {
                    Some((counted, held)) => {
                        let owed = shared.identity_room(&tenant, held);
                        Ok(Some(((name, tenant), counted, owed)))
                    }
                    None => Err(SessionRefused::IdentityFull { max }),
                }
            }
            None => Ok(None),
        };
        let taken = identity.and_then(|identity| {
            let owed = identity.as_ref().and_then(|(_, _, owed)| *owed);
            match shared.take_session_slot(owed) {
                Ok(slot) => Ok((slot, identity.map(|(tenant, counted, _)| (tenant, counted)))),
                Err(refused) => {
                    // Refused for want of room: owed its share for a while. (Not at its own
                    // cap, nor with the gateway closing.)
                    if let Some(((_, tenant), _, _)) = &identity
                        && matches!(
                            refused,
                            SessionRefused::Full { .. } | SessionRefused::IdentityShare { .. }
                        )
                    {
                        tenant.refused();
                    }
                    Err(refused)
                }
            }
        });
        // Noted for the HTTP request being handled, if any (not over stdio).
        let _ = REFUSED.try_with(|refused| {
            if let Ok(mut refused) = refused.try_borrow_mut() {
                *refused = taken.as_ref().err().copied();
            }
        });
        let (slot, identity) = taken?;
        let (tenant, counted) = identity.unzip();
        Ok(Self {
            shared,
            tenant: Mutex::new(tenant),
            shown: Mutex::new(None),
            watcher: Mutex::new(None),
            _slot: slot,
            _identity_slot: counted,
        })
    }

    /// The identity of the request in `context` (the one its authorization names, or the
    /// gateway's default), bound to the session when it opened (with tokens) or by its
    /// first request.
    ///
    /// # Errors
    ///
    /// A request presenting another identity than the session's.
    fn tenant(&self, context: &RequestContext<RoleServer>) -> Result<Arc<Tenant>, ErrorData> {
        let name = identity_of(context).unwrap_or(self.shared.default_identity);
        let mut bound = self.tenant.lock().unwrap_or_else(PoisonError::into_inner);
        match &*bound {
            Some((held, tenant)) if held == name => Ok(Arc::clone(tenant)),
            Some(_) => Err(ErrorData::invalid_request(
                "this session belongs to another identity: start a session of your own",
                None,
            )),
            None => {
                let tenant = self.shared.tenant(name);
                *bound = Some((name.to_owned(), Arc::clone(&tenant)));
                Ok(tenant)
            }
        }
    }

    /// The lane of the session's identity when it is bound, else of the gateway's default
    /// identity: what `initialize` answers from (its request binds the identity first,
    /// when the session's opening did not).
    fn lane(&self) -> Arc<Lane> {
        let bound = self.tenant.lock().unwrap_or_else(PoisonError::into_inner);
        match &*bound {
            Some((_, tenant)) => Arc::clone(&tenant.lane),
            None => Arc::clone(&self.shared.lane),
        }
    }

    /// The `tools/list` result for the identity of `context`, as JSON.
    async fn listing(&self, context: &RequestContext<RoleServer>) -> Result<Value, ErrorData> {
        let tenant = self.tenant(context)?;
        Ok(tenant.lane.current().await?.listing.clone())
    }

    /// One `tools/call`: through the executor, which carries the call's progress sink to
    /// the upstream call (its progress reaches the client under the client's token, when
    /// the client sent one); logged whole; projected by elision.
    ///
    /// A call the client cancels while it is upstream (or before it got there) is dropped,
    /// which cancels the upstream request, and its result is logged as cancelled by the
    /// client; one cancelled after it left the host keeps its own result in the log. A call
    /// in flight when the gateway shuts down is cut short the same way, logged as
    /// [`CANCELLED_BY_SHUTDOWN`]. Either way the log holds one result for every call, and
    /// the client is answered with the cancellation.
    ///
    /// `round` is carried to the upstream call (MCP 2026-07-28's retry, and the client's
    /// capabilities); `expected` is where the sealed state of a retry says the call went.
    /// An upstream answer that is not complete comes back as it is ([`Answer`]), neither
    /// logged nor projected; a call cancelled after such an answer is logged as cancelled.
    async fn call_or_cancel(
        &self,
        params: CallToolRequestParams,
        round: InputRound,
        expected: Option<ToolRef>,
        context: &RequestContext<RoleServer>,
    ) -> Result<Answer, ErrorData> {
        // Counted until it returns: the shutdown waits for every call to be logged.
        let _in_flight = self.shared.enter_call();
        let token = params
            .meta
            .as_ref()
            .and_then(RequestMetaObject::get_progress_token)
            .or_else(|| context.meta.get_progress_token());
        // Every progress notification echoes the token, and rmcp keeps the last ones of
        // each request: a token is bounded as a request id is.
        if let Some(rmcp::model::ProgressToken(rmcp::model::NumberOrString::String(text))) = &token
            && text.len() > psych_mcp::MAX_REQUEST_ID_BYTES
        {
            return Err(ErrorData::invalid_params(
                format!(
                    "a progress token may be at most {} bytes, as a request id",
                    psych_mcp::MAX_REQUEST_ID_BYTES
                ),
                None,
            ));
        }
        let client = token.map(|token| progress::ClientProgress {
            peer: context.peer.clone(),
            token,
            input_ended: self.shared.input_ended.subscribe(),
            cancelled: Box::pin(context.ct.clone().cancelled_owned()),
        });
        let tenant = self.tenant(context)?;
        let view = tenant.lane.current().await?;
        let log = tenant.executor(&self.shared).await?;
        let executor = log.serving()?;
        let live = Live {
            grant: &tenant.lane.basis.grant,
            catalogs: &view.catalogs,
        };
        let n = tenant.calls.next();
        let id = ToolCallId::new(format!("call-{n}"))
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let call = ToolCall {
            id,
            name: params.name.into_owned(),
            arguments: Value::Object(params.arguments.unwrap_or_default()),
        };
        let (sink, relay, watch) = progress::sink(client);
        let mut state = self.shared.state.subscribe();
        let ended = {
            let execution = async {
                let execution = executor.execute_round(
                    &view.surface,
                    &live,
                    &call,
                    round,
                    expected.as_ref(),
                    Some(sink),
                );
                // The relay ends when the sink is dropped: every report is sent before the
                // result is.
                let (logged, ()) = tokio::join!(execution, relay.run());
                logged
            };
            let mut execution = std::pin::pin!(execution);
            // Closing first: once the gateway closes, no call goes upstream. A call cut
            // short because its stdio client left is logged as the client's cancellation.
            let why = tokio::select! {
                biased;
                () = closing(&mut state) => Ok(state.borrow().closing.unwrap_or(Cut::Shutdown)),
                () = context.ct.cancelled() => Ok(Cut::Client),
                logged = &mut execution => Err(logged),
            };
            match why {
                Err(logged) => Ended::Done(Box::new(logged)),
                Ok(why) => {
                    let mut logged = watch.left_host();
                    if logged {
                        // Answered (or never forwarded): what remains is logging it, unless
                        // the upstream asked for input, which logs nothing.
                        logged = !matches!(
                            execution.await,
                            Ok(Executed::InputRequired { .. } | Executed::MissingCapability { .. })
                        );
                    }
                    // Otherwise the execution is dropped here, before it logged anything,
                    // and the upstream request with it.
                    Ended::Cancelled { logged, why }
                }
            }
        };
        let logged = match ended {
            Ended::Done(logged) => *logged,
            Ended::Cancelled { logged, why } => {
                if !logged {
                    self.log_cancelled(executor, call, why).await?;
                }
                let code = match why {
                    Cut::Client => ErrorCode::INVALID_REQUEST,
                    Cut::Shutdown => ErrorCode::INTERNAL_ERROR,
                };
                return Err(ErrorData::new(code, why.reason(), None));
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
            Err(error) => {
                return Err(ErrorData::internal_error(
                    psych_types::error_chain(&error),
                    None,
                ));
            }
        };
        // The logged record is ours: its output is moved to the client, not copied.
        let (handle, result) = match logged {
            Executed::Logged(LoggedRecord {
                handle,
                record: Record::ToolResult(result),
            }) => (handle, result),
            Executed::InputRequired { target, answer } => {
                return Ok(Answer::InputRequired { target, answer });
            }
            Executed::MissingCapability {
                target,
                message,
                data,
            } => {
                return Ok(Answer::MissingCapability {
                    target,
                    message,
                    data,
                });
            }
            _ => return Err(ErrorData::internal_error("the call logged no result", None)),
        };
        let (view_of, stored_len) = self
            .project(executor, &handle, result.target.as_ref())
            .await?;
        // An elided success links the whole result, for clients that know the block, when
        // a `resources/read` may answer any of it (`--max-passed-mib 0` refuses every read).
        let max_read = executor.limits().max_passed_bytes();
        let links = resources::links_known(context) && max_read > 0;
        // A result of over a MiB (its text as stored, or all it holds as JSON: binary
        // blocks, structured content, `_meta`) is shaped, freed and encoded on a blocking
        // thread.
        let large = past_worker_bound(&result.output, stored_len);
        let shape = move || Self::shown(result, view_of, &handle, stored_len, links, max_read);
        psych_mcp::wire::off_worker_if(large, shape)
            .await
            .map_err(|e| ErrorData::internal_error(format!("encoding the result: {e}"), None))?
    }

    /// What the client is answered for the logged `result` its projection made `view_of`,
    /// encoded; the whole output it replaces is freed here.
    fn shown(
        result: ToolResult,
        view_of: Projection,
        handle: &RecordHandle,
        stored_len: u64,
        links: bool,
        max_read: u64,
    ) -> Result<Answer, ErrorData> {
        // Whether the output in memory is not the whole result: its text was spilled to
        // files, stored streamed, and what remains here is the placeholder (the log holds
        // the text). Only text blocks are spilled, so a result of structured content alone
        // is never rendered to learn it. Asked only of a result shown whole: with the
        // gateway's per-batch threshold (30,000 tokens) one too large to hold in memory is
        // always elided, so this is a defence, not a path a served call reaches (its unit
        // test calls this directly).
        let partial = |output: &ToolOutput| {
            !output.content.is_empty() && output.readable_text().len() as u64 != stored_len
        };
        let mut whole = None;
        let output = match view_of {
            // An elided success also links the whole result, for a client that opens
            // resources itself (`resources/read`); a failure's cut text is not a preview.
            Projection::Replaced(text) if !result.output.is_error && links => {
                let mut shown = ToolOutput::text(text);
                shown
                    .content
                    .push(resources::link(handle, stored_len, max_read));
                whole = Some(result.output);
                shown
            }
            Projection::Replaced(text) => {
                let mut shown = ToolOutput::text(text);
                shown.is_error = result.output.is_error;
                whole = Some(result.output);
                shown
            }
            // Shown whole, yet too large to hold in memory: only thresholds set past any
            // sensible size get here. The placeholder says how large; the handle, where.
            Projection::Full if partial(&result.output) => {
                let mut shown = ToolOutput::text(format!(
                    "{} Read it with {READ_TOOL_OUTPUT}, handle {handle}.",
                    result.output.readable_text()
                ));
                if links && !result.output.is_error {
                    shown
                        .content
                        .push(resources::link(handle, stored_len, max_read));
                }
                shown.is_error = result.output.is_error;
                whole = Some(result.output);
                shown
            }
            // Answered by Psych itself (a meta tool, a search, the orientation payload, the
            // reader, a refusal: logged without an upstream target), not an upstream's
            // result, which passes through as it was sent.
            Projection::Full if result.output.content.is_empty() && result.target.is_none() => {
                with_text_block(result.output)
            }
            Projection::Full => result.output,
        };
        drop(whole);
        serde_json::to_value(&output)
            .map(Answer::Result)
            .map_err(|e| ErrorData::internal_error(format!("encoding the result: {e}"), None))
    }

    /// The client's view of the result just logged at `handle`, and the length of its
    /// readable text as stored: elision's projection made
    /// from what the log stored (its estimate, line breaks, and a head and tail read back),
    /// on a blocking thread. From the log rather than from the output in memory, so that a
    /// result too large to hold in memory (spilled to a file by the transport, streamed
    /// into the log) is previewed like any other, and each result is estimated once, when
    /// it is appended.
    async fn project(
        &self,
        executor: &Executor<McpManager>,
        handle: &RecordHandle,
        target: Option<&ToolRef>,
    ) -> Result<(Projection, u64), ErrorData> {
        let log = Arc::clone(executor.store());
        let shared = Arc::clone(&self.shared);
        let handle = handle.clone();
        // The hint the target tool declares now (`anthropic/maxResultSizeChars`), from the
        // catalogue the listing was resolved from: its one definition looked up (tools are
        // ordered by name), an elider made only for a tool that has one.
        let hinted = target.and_then(|target| {
            let view = self.lane().latest()?;
            let catalog = view.catalogs.iter().find(|c| c.server == target.server)?;
            let at = catalog
                .tools
                .binary_search_by(|tool| tool.name.cmp(&target.tool))
                .ok()?;
            let tokens = psych_types::OutputLimits::declared_tokens(&catalog.tools[at])?;
            let limits = shared
                .elider
                .limits()
                .clone()
                .hinted(target.clone(), tokens);
            Some(shared.elider.with_limits(limits))
        });
        let projected = tokio::task::spawn_blocking(move || {
            let stored = log
                .stored_result(&handle)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("{handle} is not a tool result of the session's log"))?;
            let views = hinted
                .as_ref()
                .unwrap_or(&shared.elider)
                .project_stored(
                    &[StoredRef {
                        handle: &handle,
                        stored: &stored,
                    }],
                    &log,
                )
                .map_err(|e| e.to_string())?;
            let view = views.into_iter().next().unwrap_or(Projection::Full);
            Ok::<_, String>((view, stored.info.len))
        })
        .await;
        match projected {
            Ok(Ok(view)) => Ok(view),
            Ok(Err(error)) => Err(ErrorData::internal_error(
                format!("previewing the logged result: {error}"),
                None,
            )),
            Err(error) => Err(ErrorData::internal_error(error.to_string(), None)),
        }
    }

    /// Logs `call`'s result as cut short by `why` (it was dropped before it had one).
    async fn log_cancelled(
        &self,
        executor: &Executor<McpManager>,
        call: ToolCall,
        why: Cut,
    ) -> Result<(), ErrorData> {
        let reason = why.reason();
        let record = Record::ToolResult(ToolResult {
            target: None,
            call_id: call.id,
            name: call.name,
            output: ToolOutput::error(format!(
                "{reason} before it had a result; its upstream request, if it had been sent, \
                 was cancelled"
            )),
        });
        let log = Arc::clone(executor.store());
        let appended = tokio::task::spawn_blocking(move || log.append(&record)).await;
        match appended {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(ErrorData::internal_error(
                format!("{reason}; logging that failed: {error}"),
                None,
            )),
            Err(error) => Err(ErrorData::internal_error(error.to_string(), None)),
        }
    }

    /// The `input_required` answer for a client of 2026-07-28: the upstream's result as it
    /// sent it (its `inputRequests` untouched), its `requestState` replaced by the
    /// gateway's seal of it (one even when the upstream sent none), passed raw as any
    /// result.
    async fn input_required(
        &self,
        binding: &mrtr::Binding<'_>,
        target: &ToolRef,
        mut answer: JsonObject,
    ) -> Result<CallToolResponse, ErrorData> {
        let upstream = match answer.remove("requestState") {
            None => None,
            Some(Value::String(state)) => Some(state),
            Some(_) => {
                return Err(ErrorData::internal_error(
                    format!(
                        "{}/{} answered input_required with a requestState that is not a \
                         string",
                        target.server, target.tool
                    ),
                    None,
                ));
            }
        };
        let upstream_len = upstream.as_deref().map_or(0, str::len);
        // Up to about 500 KiB of the upstream's state to seal: a large one on a blocking
        // thread.
        let large = upstream_len > mrtr::DIGEST_ON_WORKER;
        let (sealer, parts, reached) =
            (self.shared.sealer.clone(), binding.owned(), target.clone());
        let now = psych_catalog::Clock::now(&psych_catalog::SystemClock);
        let sealed = psych_mcp::wire::off_worker_if(large, move || {
            sealer.seal(
                &mrtr::Binding::of(&parts),
                &reached,
                upstream.as_deref(),
                now,
            )
        })
        .await
        .map_err(|e| ErrorData::internal_error(format!("sealing the state: {e}"), None))?;
        // A state the gateway would refuse on the retry is not handed out: the call fails
        // now, naming the upstream, rather than at its retry for the gateway's own state.
        if sealed.len() > mrtr::MAX_STATE {
            return Err(ErrorData::internal_error(
                format!(
                    "{}/{} answered input_required with a requestState of {} bytes: sealed \
                     by the gateway it would be {} bytes, over the {} the gateway reads back \
                     (an upstream state of up to about 500 KiB fits, less when it holds \
                     characters JSON escapes)",
                    target.server,
                    target.tool,
                    upstream_len,
                    sealed.len(),
                    mrtr::MAX_STATE
                ),
                None,
            ));
        }
        answer.insert("requestState".to_owned(), Value::String(sealed.clone()));
        let mut typed = InputRequiredResult::from_request_state(sealed);
        self.shared
            .raw
            .stash(Value::Object(answer), &mut typed.meta);
        Ok(CallToolResponse::from(typed))
    }

    /// Starts telling `peer` when its listing changes: woken by the resolver (so by the
    /// catalogue), never by a timer; compares the listing's bytes with what the client
    /// last saw, starting from what it was shown at `initialize`.
    fn watch(&self, peer: Peer<RoleServer>) {
        let lane = self.lane();
        let mut resolved = lane.resolved.clone();
        let shown = self
            .shown
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .or_else(|| lane.latest());
        let task = tokio::spawn(async move {
            let mut last = shown;
            while resolved.changed().await.is_ok() {
                let now = resolved
                    .borrow_and_update()
                    .as_ref()
                    .and_then(|r| r.view.as_ref().ok().cloned());
                let Some(now) = now else { continue };
                if last.as_ref().is_some_and(|last| last.bytes == now.bytes) {
                    continue;
                }
                last = Some(now);
                if peer.notify_tool_list_changed().await.is_err() {
                    break;
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

/// The identity a request presents: set by the HTTP layer that checked its authorization,
/// `None` over stdio and for tokenless HTTP (the gateway's default identity).
fn identity_of(context: &RequestContext<RoleServer>) -> Option<&str> {
    context
        .extensions
        .get::<hyper::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Identity>())
        .map(|identity| identity.0.as_str())
}

/// What a call's execution answers the handler: a result for the client, or an upstream
/// answer that is not complete (MCP 2026-07-28), neither logged nor projected.
enum Answer {
    /// The result for the client, as JSON (logged, projected).
    Result(Value),
    /// The upstream needs the client's input first: its `input_required` result as sent.
    InputRequired {
        /// The upstream tool the call reached.
        target: ToolRef,
        /// The upstream's result object.
        answer: JsonObject,
    },
    /// The upstream refused for a client capability the call did not declare (-32021).
    MissingCapability {
        /// The upstream tool the call reached.
        target: ToolRef,
        /// The upstream's message.
        message: String,
        /// The error's `data`.
        data: Option<Value>,
    },
}

/// Whether the request in `context` is of MCP 2026-07-28 or later (no `initialize`): its
/// client can answer `input_required` itself.
fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| !version.has_initialize())
}

/// The request `_meta` key of the client capabilities (MCP 2026-07-28).
const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// The capabilities psych passes on: what lets an upstream ask the client for input.
const INPUT_CAPABILITIES: [&str; 3] = ["elicitation", "sampling", "roots"];

/// The client capabilities of a request of 2026-07-28 that an upstream may ask for input
/// through (elicitation, sampling, roots), as the client sent them; the others (tasks,
/// extensions) are psych's to answer, not the upstream's.
fn client_capabilities(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Option<JsonObject> {
    let declared = request
        .meta
        .as_ref()
        .and_then(|meta| meta.get(CLIENT_CAPABILITIES))
        .or_else(|| context.meta.get(CLIENT_CAPABILITIES))?
        .as_object()?;
    Some(
        declared
            .iter()
            .filter(|(key, _)| INPUT_CAPABILITIES.contains(&key.as_str()))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
    )
}

/// The capability a request of an `input_required` result asks the client for, by its
/// method: the three MCP 2026-07-28 lets a server send.
fn capability_of(method: &str) -> Option<&'static str> {
    match method {
        "elicitation/create" => Some("elicitation"),
        "sampling/createMessage" => Some("sampling"),
        "roots/list" => Some("roots"),
        _ => None,
    }
}

/// The first request of an upstream's `input_required` `answer` that its client cannot
/// be sent (a method outside the three, or a capability the client did not declare in
/// `declared`), described; `None` when every one may go (as when there are none).
fn undeclared_request(answer: &JsonObject, declared: Option<&JsonObject>) -> Option<String> {
    let requests = answer.get("inputRequests")?;
    let Some(requests) = requests.as_object() else {
        return Some("inputRequests that is not an object".to_owned());
    };
    requests.iter().find_map(|(key, request)| {
        let method = request.get("method").and_then(Value::as_str).unwrap_or("");
        match capability_of(method) {
            Some(capability) if declared.is_some_and(|d| d.contains_key(capability)) => None,
            Some(capability) => Some(format!("{key:?}: {method}, which needs {capability}")),
            None => Some(format!(
                "{key:?}: {method:?}, not a request a server may send"
            )),
        }
    })
}

/// The tool error a client of a revision with sessions gets when the upstream needs input
/// (its `answer`, when it said which) or a capability: it names the tool and what to do.
/// Not logged: it is not the tool's result, and the tool did not run.
fn needs_modern(
    target: &ToolRef,
    context: &RequestContext<RoleServer>,
    answer: Option<&JsonObject>,
) -> Value {
    let asks: Vec<String> = answer
        .and_then(|answer| answer.get("inputRequests"))
        .and_then(Value::as_object)
        .map(|requests| {
            requests
                .values()
                .map(|request| {
                    let method = request
                        .get("method")
                        .and_then(Value::as_str)
                        .unwrap_or("a request");
                    match request
                        .get("params")
                        .and_then(|p| p.get("message"))
                        .and_then(Value::as_str)
                    {
                        Some(message) => format!("{method}: {message:?}"),
                        None => method.to_owned(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let asks = if asks.is_empty() {
        String::new()
    } else {
        format!(" ({})", asks.join("; "))
    };
    let version = context
        .protocol_version()
        .map_or_else(|| "an earlier revision".to_owned(), |v| v.to_string());
    let text = format!(
        "{}/{} needs input from the client before it runs{asks}, which psych passes only to \
         an MCP 2026-07-28 client; this client speaks {version}. Connect with MCP 2026-07-28 \
         to answer it.",
        target.server, target.tool
    );
    serde_json::to_value(ToolOutput::error(text)).unwrap_or(Value::Null)
}

/// The identity an HTTP request's authorization named, put in its extensions by the
/// gateway's authorization layer.
#[derive(Debug, Clone)]
struct Identity(String);

/// Makes `dir` and its parents; on Unix, `dir` itself is readable by its owner only (an
/// identity's results are its own).
fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

impl Session {
    /// A call, or one round of it (MCP 2026-07-28's multi-round-trip calls, the `mrtr`
    /// module): a retry's `requestState` is opened first (-32602 when it is not this
    /// process's, another identity's, another call's or expired), and an upstream's
    /// `input_required` reaches a client of 2026-07-28 with the gateway's sealed state in
    /// place of the upstream's, and any other client as a tool error ([`needs_modern`]).
    async fn call(
        &self,
        mut request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let identity = identity_of(context).unwrap_or(self.shared.default_identity);
        let modern = is_modern(context);
        // A round (a `requestState` to open, an `input_required` to seal) is bound to the
        // call's arguments by their digest, made before they go upstream so that the call
        // alone holds them. Only a client of 2026-07-28 is sealed rounds (a `requestState`
        // sent by another is opened all the same). Digesting costs about 10 ms a MiB:
        // arguments past `mrtr::DIGEST_ON_WORKER` are digested on a blocking thread.
        let arguments = if modern || request.request_state.is_some() {
            let given = request.arguments.take();
            let was_given = given.is_some();
            let arguments = Value::Object(given.unwrap_or_default());
            let large = psych_mcp::wire::value_past(&arguments, mrtr::DIGEST_ON_WORKER);
            let (arguments, digest) = psych_mcp::wire::off_worker_if(large, move || {
                let digest = mrtr::digest(&arguments);
                (arguments, digest)
            })
            .await
            .map_err(|e| ErrorData::internal_error(format!("binding the call: {e}"), None))?;
            if let (true, Value::Object(arguments)) = (was_given, arguments) {
                request.arguments = Some(arguments);
            }
            digest
        } else {
            String::new()
        };
        let name = request.name.to_string();
        let binding = mrtr::Binding {
            identity,
            name: &name,
            arguments,
        };
        let opened = match request.request_state.take() {
            Some(state) => {
                // Up to 1 MiB of hex to check and read: a large one on a blocking thread.
                let large = state.len() > mrtr::DIGEST_ON_WORKER;
                let (sealer, parts) = (self.shared.sealer.clone(), binding.owned());
                let now = psych_catalog::Clock::now(&psych_catalog::SystemClock);
                let opened = psych_mcp::wire::off_worker_if(large, move || {
                    sealer.open(&state, &mrtr::Binding::of(&parts), now)
                })
                .await
                .map_err(|e| ErrorData::internal_error(format!("opening the state: {e}"), None))?;
                Some(opened.map_err(|e| ErrorData::invalid_params(e.to_string(), None))?)
            }
            // Answers to a round the gateway cannot check (no sealed state with them) are
            // not passed on: the binding would mean nothing.
            None if request.input_responses.is_some() => {
                return Err(ErrorData::invalid_params(
                    mrtr::StateError::Missing.to_string(),
                    None,
                ));
            }
            None => None,
        };
        let (expected, request_state) = match opened {
            Some(opened) => (Some(opened.target), opened.upstream),
            None => (None, None),
        };
        let declared = if modern {
            client_capabilities(&request, context)
        } else {
            // A client of a revision with sessions cannot answer input through psych
            // (psych does not bridge its session's requests): psych declares nothing for
            // it, and a conforming upstream does not ask.
            None
        };
        let round = InputRound {
            input_responses: request
                .input_responses
                .take()
                .map(|responses| responses.into_iter().collect()),
            request_state,
            client_capabilities: declared.clone(),
        };
        let answer = self
            .call_or_cancel(request, round, expected, context)
            .await?;
        let raw = match answer {
            Answer::Result(raw) => raw,
            Answer::InputRequired { target, answer } if modern => {
                match undeclared_request(&answer, declared.as_ref()) {
                    None => return self.input_required(&binding, &target, answer).await,
                    // The gateway is the server to its client: it does not relay what the
                    // spec forbids a server to send.
                    Some(asked) => json!({
                        "content": [{"type": "text", "text": format!(
                            "{}/{} asked the client for input it did not declare it can \
                             give ({asked}); nothing was passed on",
                            target.server, target.tool
                        )}],
                        "isError": true,
                    }),
                }
            }
            Answer::MissingCapability { message, data, .. } if modern => {
                return Err(ErrorData::new(
                    ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY,
                    message,
                    data,
                ));
            }
            Answer::InputRequired { target, answer } => {
                needs_modern(&target, context, Some(&answer))
            }
            Answer::MissingCapability { target, .. } => needs_modern(&target, context, None),
        };
        // What rmcp can type of the result: sent only if the raw answer cannot be. Read
        // from a reference: the raw answer itself goes to the stash, uncopied. Typing copies
        // every text: a large answer is typed on a blocking thread.
        let type_it = |raw: &Value| {
            <CallToolResult as serde::Deserialize>::deserialize(raw).unwrap_or_else(|e| {
                CallToolResult::error(vec![rmcp::model::ContentBlock::text(format!(
                    "the result cannot be sent typed: {e}"
                ))])
            })
        };
        let large = psych_mcp::wire::value_past_worker_bound(&raw);
        let (raw, mut typed) = psych_mcp::wire::off_worker_if(large, move || {
            let typed = type_it(&raw);
            (raw, typed)
        })
        .await
        .map_err(|e| ErrorData::internal_error(format!("typing the result: {e}"), None))?;
        typed.result_type = Some(ResultType::COMPLETE);
        self.shared.raw.stash(raw, &mut typed.meta);
        Ok(CallToolResponse::from(typed))
    }

    /// One `subscriptions/listen` stream ([`ServerHandler::listen`]).
    async fn listen_for_changes(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let tenant = self.tenant(context.request_context())?;
        let Some(_listening) = tenant.listening() else {
            return Err(ErrorData::invalid_request(
                format!(
                    "this identity has {MAX_LISTENS} listen streams open, the most the gateway \
                     allows: close one first"
                ),
                None,
            ));
        };
        let lane = Arc::clone(&tenant.lane);
        let mut resolved = lane.resolved.clone();
        let mut last = lane.latest().map(|view| view.bytes.clone());
        let mut state = self.shared.state.subscribe();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                () = closing(&mut state) => return Ok(()),
                changed = resolved.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                }
            }
            let now = resolved
                .borrow_and_update()
                .as_ref()
                .and_then(|r| r.view.as_ref().ok().map(|view| view.bytes.clone()));
            let Some(now) = now else { continue };
            if last.as_ref() == Some(&now) {
                continue;
            }
            last = Some(now);
            if context.sink().notify_tool_list_changed().await.is_err() {
                return Ok(());
            }
        }
    }
}

/// `tools/list` and `tools/call` answer with typed placeholders, and the raw JSON (the
/// tool definitions and the upstream's result exactly as stored: unknown fields and block
/// types kept, which rmcp's typed `CallToolResult` would drop or refuse) takes their place
/// on the way out, with the protocol fields rmcp gave them for the client's revision: by
/// [`raw::RawTransport`] over stdio and in an HTTP session, by [`raw::raw_http`] for MCP
/// 2026-07-28's requests over HTTP, which have no session.
impl ServerHandler for Session {
    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        answered("tools/list", async {
            no_cursor(request.as_ref())?;
            let raw = self.listing(&context).await?;
            // The raw listing takes the placeholder's place on the way out; a listing rmcp
            // cannot type (a field of a tool its types refuse) is sent all the same, from
            // an empty placeholder.
            let mut typed =
                <ListToolsResult as serde::Deserialize>::deserialize(&raw).unwrap_or_default();
            // Complete, as every answer of the gateway's: rmcp strips it for a client of
            // an earlier revision, and the swap copies it onto the raw answer.
            typed.result_type = Some(ResultType::COMPLETE);
            self.shared.raw.stash(raw, &mut typed.meta);
            Ok(typed)
        })
        .await
    }

    /// A call ([`Session::call`]).
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        answered("tools/call", self.call(request, &context)).await
    }

    /// Binds the session to the identity of its `initialize` request first (or checks the
    /// binding made when it opened), so the `instructions` are that identity's.
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        answered("initialize", async {
            self.tenant(&context)?;
            context.peer.set_peer_info(request.clone());
            self.negotiate_initialize(&request)
        })
        .await
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.watch(context.peer);
    }

    /// `server/discover` (MCP 2026-07-28): the revisions served, the capabilities, and the
    /// instructions as they are now. It may be cached by the client only privately (the
    /// listing differs by identity) and not at all in time (`ttlMs` 0: the deferred lines
    /// change as servers connect).
    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        answered("server/discover", async {
            let view = self.tenant(&context)?.lane.latest();
            Ok(DiscoverResult::from_server_info(
                ServerHandler::supported_protocol_versions(self).into_owned(),
                info(view.as_deref()),
            )
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
        })
        .await
    }

    /// `subscriptions/listen` (MCP 2026-07-28) for `tools/list_changed`, the one
    /// notification the gateway sends.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        let mut accepted = SubscriptionFilter::default();
        accepted.tools_list_changed = requested.tools_list_changed;
        Some(accepted)
    }

    /// One `subscriptions/listen` stream: `tools/list_changed` each time what `tools/list`
    /// answers changes from what it answered when the stream opened, woken by the resolver
    /// (so by the catalogue), never by a timer. Ends when the client closes it, and
    /// gracefully (the final result) when the gateway shuts down.
    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        answered("subscriptions/listen", self.listen_for_changes(context)).await
    }

    /// No resource is listed: results are not enumerated, only linked from their previews
    /// (and named by the one template).
    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        no_cursor(request.as_ref())?;
        Ok(ListResourcesResult::with_all_items(Vec::new()))
    }

    /// The one template: a logged result by its handle (`psych://result/{handle}`).
    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        no_cursor(request.as_ref())?;
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            resources::template(),
        ]))
    }

    /// A logged result's text (or a page of it) by the URI its preview's `resource_link`
    /// gave: this identity's results only, as `read_tool_output` reads them.
    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        answered("resources/read", self.read_result(request, &context))
            .await
            .map(Into::into)
    }

    fn get_info(&self) -> InitializeResult {
        // What is known now, without waiting for any upstream server: also the baseline
        // of the session's `list_changed` watcher.
        let view = self.lane().latest();
        let info = info(view.as_deref());
        *self.shown.lock().unwrap_or_else(PoisonError::into_inner) = view;
        info
    }
}

/// `handler`'s answer, or an internal error (-32603) if it panics. rmcp runs each request's
/// handler in a task of its own and answers nothing when that task panics, so the client
/// would wait for good and its request would hold its place in flight (64 such wedge a
/// stdio client). The gateway's handlers do not panic on input; this is the net under a
/// bug, not a path: the panic is still printed to stderr by the panic hook.
async fn answered<T>(
    method: &str,
    handler: impl Future<Output = Result<T, ErrorData>>,
) -> Result<T, ErrorData> {
    let mut handler = std::pin::pin!(handler);
    let unwound = std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.as_mut().poll(cx))) {
            Ok(std::task::Poll::Ready(answer)) => std::task::Poll::Ready(Ok(answer)),
            Ok(std::task::Poll::Pending) => std::task::Poll::Pending,
            Err(panic) => std::task::Poll::Ready(Err(panic)),
        }
    })
    .await;
    unwound.unwrap_or_else(|_| {
        Err(ErrorData::internal_error(
            format!("the gateway failed to answer {method}: a bug (a panic, on its stderr)"),
            None,
        ))
    })
}

/// The gateway's `initialize` and `server/discover` answer for the Surface of `view`:
/// tools with `list_changed`, Psych's name and version, and the deferred servers' lines as
/// the instructions (none before the first resolution).
fn info(view: Option<&View>) -> InitializeResult {
    let info = InitializeResult::new(
        ServerCapabilities::builder()
            .enable_tools()
            .enable_tool_list_changed()
            .enable_resources()
            .build(),
    )
    .with_server_info(Implementation::new("psych", env!("CARGO_PKG_VERSION")));
    match view {
        Some(view) => info.with_instructions(view.surface.client_instructions()),
        None => info,
    }
}

/// Where the gateway listens.
#[derive(Debug)]
#[non_exhaustive]
pub enum Listener {
    /// One client on this process's stdin and stdout (the client started the process).
    /// The gateway ends when the client closes stdin.
    ///
    /// tokio reads stdin on a thread of its blocking pool, and that read does not end while
    /// the client keeps stdin open: a program that stops the gateway with its own signal
    /// must not wait for that thread when it drops its runtime (use
    /// `Runtime::shutdown_timeout`, as `psych serve` does), or it waits for the client.
    Stdio,
    /// Streamable HTTP at `/mcp` on a listener the caller bound (on a loopback address,
    /// unless [`GatewaySettings::tokens`] authorizes every request): a session per client
    /// that initializes, each request of MCP 2026-07-28 served alone, at most
    /// [`GatewaySettings::max_sessions`] of either at once.
    Http(tokio::net::TcpListener),
}

/// How the gateway resolves and serves, beyond the `mcpServers` file: where its logs go,
/// disclosure's settings, the session cap, and who hears of upstream failures.
pub struct GatewaySettings {
    dir: PathBuf,
    disclosure: Settings,
    max_sessions: usize,
    max_sessions_per_identity: Option<usize>,
    report: Arc<dyn Fn(&str) + Send + Sync>,
    estimator: SharedEstimator,
    ready: Option<Box<dyn FnOnce() + Send>>,
    retention: Retention,
    tokens: Option<Arc<Tokens>>,
    spill_budget: SpillBudget,
    eager: bool,
    stores: Option<Arc<dyn RecordStores>>,
    catalog: Option<Arc<psych_types::DynCatalogStore>>,
    max_passed_bytes: u64,
    passing_budget: u64,
    pinning: Option<PinSettings>,
    state_key: Option<[u8; 32]>,
    session_idle: Duration,
}

/// The one token estimator of a gateway, shared by disclosure, the record logs and
/// elision (cheap to clone).
type SharedEstimator = Arc<dyn TokenEstimator + Send + Sync>;

impl std::fmt::Debug for GatewaySettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatewaySettings")
            .field("dir", &self.dir)
            .field("disclosure", &self.disclosure)
            .field("max_sessions", &self.max_sessions)
            .field("max_sessions_per_identity", &self.max_sessions_per_identity)
            .finish_non_exhaustive()
    }
}

impl GatewaySettings {
    /// Settings keeping logs under `dir`: a folder per identity in `<dir>/serve/`
    /// (nothing else goes there), and the unnamed files holding an answer too large for
    /// memory until it is logged in `<dir>/spill/` (on the disk that will hold the result
    /// anyway, not a `/tmp` that may be a small tmpfs). Disclosure resolves with
    /// [`disclosure_settings`]`(`[`DEFAULT_AUTO_BUDGET`]`)`, at most [`MAX_SESSIONS`] HTTP
    /// sessions are open at once, and upstream failures are reported to nobody (they are in
    /// the deferred lines the client's model reads either way).
    ///
    /// # Errors
    ///
    /// Disclosure's [`SettingsError`](psych_disclosure::SettingsError), never in practice:
    /// the default settings are valid.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, psych_disclosure::SettingsError> {
        Ok(Self {
            dir: dir.into(),
            disclosure: disclosure_settings(DEFAULT_AUTO_BUDGET)?,
            max_sessions: MAX_SESSIONS,
            max_sessions_per_identity: None,
            report: Arc::new(|_: &str| {}),
            estimator: Arc::new(Estimator::new()),
            ready: None,
            retention: Retention::default(),
            tokens: None,
            spill_budget: SpillBudget::default(),
            eager: false,
            stores: None,
            catalog: None,
            max_passed_bytes: psych_reader_tool::DEFAULT_MAX_PASSED_BYTES,
            passing_budget: DEFAULT_PASSING_BUDGET,
            pinning: None,
            state_key: None,
            session_idle: SESSION_IDLE,
        })
    }

    /// Seals the `requestState` of MCP 2026-07-28's multi-round calls with `key` rather
    /// than a key drawn at start: gateways given the same key (replicas behind one address)
    /// open each other's, so a client's retry may reach any of them. Without it a state
    /// opens only on the process that sealed it, and a retry reaching another replica, or
    /// the same one after a restart, is refused with -32602 (the client then calls again
    /// from the start). `psych serve --store` takes the key from the store
    /// (`PgStore::shared_key`), so its replicas share one. Keep the key as secret as the
    /// tokens: whoever has it can seal a state for any identity's call of a tool it names.
    #[must_use]
    pub fn request_state_key(mut self, key: [u8; 32]) -> Self {
        self.state_key = Some(key);
        self
    }

    /// Learned pinning: when the gateway starts, the tools of deferred servers that the
    /// most recent sessions in its logs called most ([`serve_usage`]) are listed as direct
    /// tools (their servers' eager tools), within `settings`, until the process ends; the
    /// choice goes to the report ([`report`](Self::report)). Off by default. The usage is
    /// read from the files under [`logs`](Self::logs), or with
    /// [`records_in`](Self::records_in) from the store
    /// ([`RecordStores::recent_targets`]: every replica's sessions, so replicas started
    /// together pin alike).
    #[must_use]
    pub fn learned_pinning(mut self, settings: PinSettings) -> Self {
        self.pinning = Some(settings);
        self
    }

    /// Starts every upstream server at once (`true`), whatever its entry says, instead of
    /// starting a server whose kept listing is fresh only when a call needs it (the
    /// default; see [`serve`] and psych-mcp's
    /// [`StartPolicy`](psych_mcp::StartPolicy)). `psych serve --eager`.
    #[must_use]
    pub fn eager(mut self, eager: bool) -> Self {
        self.eager = eager;
        self
    }

    /// Called once, when the gateway has started (its folders made, the upstream servers
    /// connecting, the first Surface resolved) and is about to answer its clients: the
    /// moment to tell a waiting script or test that it is ready (`psych serve --http`
    /// prints `listening on http://ADDR/mcp` then). Not called if the start fails before
    /// that; over stdio, the client's own initialization comes after it (and may still
    /// fail). Runs on an async worker: it must not block.
    #[must_use]
    pub fn on_ready(mut self, ready: impl FnOnce() + Send + 'static) -> Self {
        self.ready = Some(Box::new(ready));
        self
    }

    /// The token estimator, set once for every estimate the gateway makes: disclosure's
    /// cost of each server's tools (what the auto budget compares), the estimate each
    /// record log stores with a result, and elision's sizing of results against its
    /// thresholds (from those stored estimates). Default: psych-elision's [`Estimator`],
    /// as psych-runtime's `RunBuilder::estimator`.
    #[must_use]
    pub fn estimator(mut self, estimator: impl TokenEstimator + Send + Sync + 'static) -> Self {
        self.estimator = Arc::new(estimator);
        self
    }

    /// Resolves with `settings` instead ([`disclosure_settings`] builds the gateway's own
    /// for another auto budget).
    #[must_use]
    pub fn disclosure(mut self, settings: Settings) -> Self {
        self.disclosure = settings;
        self
    }

    /// Over HTTP, at most `max` sessions open at once; one more is refused with an error
    /// saying so. A session ends when its client deletes it or when it is idle past
    /// [`session_idle`](Self::session_idle). Stdio has its one session.
    #[must_use]
    pub fn max_sessions(mut self, max: usize) -> Self {
        self.max_sessions = max;
        self
    }

    /// Over HTTP, a session of the `initialize` lifecycle is closed (its slot freed) once
    /// it has gone `idle` without a message either way or an HTTP request for it (an event
    /// stream reopened counts), and with no request in flight: a call running longer,
    /// with no progress to report, keeps its session. A client that
    /// vanished without deleting its session holds it no longer than this after its last
    /// answer. [`SESSION_IDLE`] by default; `psych serve --session-idle-secs`. At least
    /// 1 s (less would close a session between a client's requests).
    #[must_use]
    pub fn session_idle(mut self, idle: Duration) -> Self {
        self.session_idle = idle.max(Duration::from_secs(1));
        self
    }

    /// Over HTTP with [`tokens`](Self::tokens), at most `max` (at least 1) sessions open
    /// at once for one identity (all its tokens together; a 2026-07-28 request holds one
    /// while it runs), within [`max_sessions`](Self::max_sessions); one more is refused
    /// with an error saying so. By default [`default_max_sessions_per_identity`]: half of
    /// `max_sessions`, or all of them for a tokens file of one identity. Within it, while
    /// other identities are refused sessions for want of room, an identity at its fair
    /// share of `max_sessions` takes no more until they have theirs
    /// ([`SessionRefused::IdentityShare`]). Without tokens every client is the one
    /// loopback identity, and only `max_sessions` applies.
    #[must_use]
    pub fn max_sessions_per_identity(mut self, max: usize) -> Self {
        self.max_sessions_per_identity = Some(max.max(1));
        self
    }

    /// Where an upstream server's failed first connection or listing is reported, one line
    /// each, `server: why` (`psych serve` prints them on stderr).
    #[must_use]
    pub fn report(mut self, report: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.report = Arc::new(report);
        self
    }

    /// Bounds what answers too large for memory hold at once in [`spill`](Self::spill),
    /// across every upstream and call (default
    /// [`DEFAULT_SPILL_BUDGET`](psych_mcp::DEFAULT_SPILL_BUDGET), 10 GiB, shared by every
    /// identity): a result whose files would pass it is not kept, and its call answers a
    /// tool error naming the budget (the upstream and every other call go on). A result
    /// needs about twice its size while its texts are split off; each is also bounded by
    /// [`MAX_SPILLED_ANSWER`](psych_mcp::MAX_SPILLED_ANSWER).
    #[must_use]
    pub fn spill_budget(mut self, budget: SpillBudget) -> Self {
        self.spill_budget = budget;
        self
    }

    /// Keeps the records in `stores` (the PostgreSQL store,
    /// `psych_store_postgres::PgBlocking`) instead of files under `<dir>/serve/`: every
    /// gateway on the same store (replicas behind one address) reads the handles the others
    /// minted for the same identity, each replica writing Runs of its own. The catalogue
    /// stays this gateway's (`<dir>/catalog.redb`) unless [`catalog_in`](Self::catalog_in)
    /// says otherwise. [`retention`](Self::retention) applies to the store's Runs too (every
    /// identity's, in one replica at a time; never a Run a live replica holds open); segments
    /// rotate at the same size.
    #[must_use]
    pub fn records_in(mut self, stores: Arc<dyn RecordStores>) -> Self {
        self.stores = Some(stores);
        self
    }

    /// Keeps the catalogue in `store` (the PostgreSQL store's catalogue, erased:
    /// `Arc::new(Erased(PgCatalog))`) instead of `<dir>/catalog.redb`: every gateway on the
    /// same store (replicas behind one address) lists the same tools. One of them lists an
    /// upstream server at a time and the others use the listing it stored (the store's
    /// refresh lease); a change one stores reaches every replica's sessions, which tell
    /// their clients (`notifications/tools/list_changed`). The sources of the kept listings
    /// ([`sources`](Self::sources)) stay in this gateway's folder. Replicas should have the
    /// same upstream servers: each lists its own connections, and the last listing stored
    /// is every replica's.
    #[must_use]
    pub fn catalog_in(mut self, store: Arc<psych_types::DynCatalogStore>) -> Self {
        self.catalog = Some(store);
        self
    }

    /// Keeps each identity's results for `retention` (default [`DEFAULT_RETAIN`] and
    /// [`DEFAULT_RETAIN_BYTES`]): whole log segments past either limit are deleted at
    /// start and hourly, and their handles answer that they expired. A live segment
    /// rotates at an eighth of the size limit (at most 256 MiB).
    #[must_use]
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// The most stored text one call's result references (`{"$psych_result": ...}`) may
    /// pass together, and one `resources/read` answer may hold, in bytes (default
    /// [`psych_reader_tool::DEFAULT_MAX_PASSED_BYTES`], 16 MiB; 0 refuses every reference).
    /// The replaced arguments of every call in flight are held in memory until the call
    /// ends, all calls together within [`passing_budget`](Self::passing_budget).
    #[must_use]
    pub fn max_passed_bytes(mut self, bytes: u64) -> Self {
        self.max_passed_bytes = bytes;
        self
    }

    /// The most bytes of passed result text all calls and `resources/read` answers of the
    /// process hold at once, every identity together (default [`DEFAULT_PASSING_BUDGET`],
    /// 64 MiB: four calls at the default bound). A call passing results reserves its
    /// whole bound ([`max_passed_bytes`](Self::max_passed_bytes)) before it reads any,
    /// waiting while the budget cannot give it (at most the call deadline: then it fails
    /// with a result saying so, nothing forwarded), and gives back what it did not read
    /// when it has read them; the rest is held until it ends, and until its reads end if
    /// it is cancelled first. A `resources/read` holds what it read until its answer has
    /// been written out over stdio; over HTTP until rmcp has queued it for the request's
    /// stream, or built it for a stateless request of MCP 2026-07-28 (rmcp writes it out
    /// after: see the `resources` module). A budget equal to the bound runs passing calls
    /// one at a time. It must be at least the per-call bound: [`serve`] refuses less
    /// ([`ServeError::PassingBudget`]). With [`tokens`](Self::tokens) naming several
    /// identities, one identity holds at most [`default_passing_share`] of it (half, at
    /// least one call's bound): with a budget of two calls' bounds or more, one identity's
    /// slow calls leave the others at least half; below that, one call's bound is all an
    /// identity can be given, and the others may wait.
    #[must_use]
    pub fn passing_budget(mut self, bytes: u64) -> Self {
        self.passing_budget = bytes;
        self
    }

    /// Over HTTP, every request must present one of `tokens` (`Authorization: Bearer
    /// TOKEN`; without one it is answered 401), and its results and handles are its
    /// identity's. With tokens the listener may be beyond loopback; without, the gateway
    /// refuses any but a loopback one, and every HTTP request is the identity `loopback`.
    /// Stdio has the one identity `stdio`.
    #[must_use]
    pub fn tokens(mut self, tokens: Tokens) -> Self {
        self.tokens = Some(Arc::new(tokens));
        self
    }

    /// Where the record logs go: `<dir>/serve/`, a folder per identity
    /// (`<dir>/serve/<identity>/<run>.plog`).
    pub fn logs(&self) -> PathBuf {
        self.dir.join("serve")
    }

    /// Where answers too large for memory wait until they are logged: `<dir>/spill/`.
    pub fn spill(&self) -> PathBuf {
        self.dir.join("spill")
    }

    /// The kept catalogue: `<dir>/catalog.redb`, every upstream server's listings,
    /// versioned and never hard-deleted, with when each was last listed (what lets a server
    /// be known without being started).
    pub fn catalog(&self) -> PathBuf {
        self.dir.join("catalog.redb")
    }

    /// Over which connection each kept listing was made ([`ListingSources`]):
    /// `<dir>/catalog.sources.json`, beside [`catalog`](Self::catalog).
    pub fn sources(&self) -> PathBuf {
        ListingSources::beside(&self.catalog())
    }
}

/// The bytes of passed result text a gateway's calls hold at once unless the caller gives
/// another budget ([`GatewaySettings::passing_budget`]): four calls at the default bound.
pub const DEFAULT_PASSING_BUDGET: u64 = 4 * psych_reader_tool::DEFAULT_MAX_PASSED_BYTES;

/// The gateway's auto budget unless the caller gives another: 1,000 tokens for the direct,
/// facade and search tools of every `Auto` server together.
///
/// The runtime and `psych budget` give the Auto servers 5% of the model's window, since
/// they know the window and the rest of the prompt. A gateway knows neither: its listing
/// rides on every request of a client whose window and other tools it cannot see, so it
/// keeps the listing small whatever is configured. Psych's own tools in that listing (the
/// meta tools, orientation, the reader) cost about 850 tokens; with 1,000 for the servers
/// kept out of deferral the listing stays near 2,000 tokens however many servers there
/// are, and a server small enough to fit stays direct (no extra round trip).
pub const DEFAULT_AUTO_BUDGET: u64 = 1_000;

/// Disclosure's settings for a gateway: an auto budget of `tokens` (the Auto servers'
/// share, [`DEFAULT_AUTO_BUDGET`] by default) counted on whole tool definitions
/// ([`CostBasis::Definition`]: the client receives every field of a direct tool, output
/// schema and annotations included, so the listing's size is what the budget bounds), the
/// other knobs at their defaults. ([`serve`] reserves the slot of `read_tool_output` on
/// top: [`listing_settings`].)
///
/// # Errors
///
/// Disclosure's [`SettingsError`](psych_disclosure::SettingsError) if it refuses them (it
/// does not for any `tokens`).
pub fn disclosure_settings(tokens: u64) -> Result<Settings, psych_disclosure::SettingsError> {
    Settings::builder()
        .auto_budget(Budget::Tokens(tokens))
        .cost_basis(CostBasis::Definition)
        .build()
}

/// The settings the gateway resolves with, given the caller's `settings`: the same, with
/// the slot of `read_tool_output` (which the gateway lists beside the Surface's tools,
/// [`EXECUTOR_TOOLS`](psych_runtime::EXECUTOR_TOOLS)) reserved in the tool cap on top of
/// the caller's own reserve, so the listing stays within the cap. `psych budget --serve`
/// resolves with the same, and so shows the same Surface.
///
/// # Errors
///
/// Disclosure's [`SettingsError`](psych_disclosure::SettingsError) when the cap has no room
/// left for the fixed tools.
pub fn listing_settings(settings: &Settings) -> Result<Settings, psych_disclosure::SettingsError> {
    psych_runtime::reserve_executor_tools(settings)
}

/// Why the gateway could not start, or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The tool cap of the settings has no room for the gateway's own tool
    /// ([`listing_settings`]).
    #[error("the gateway's disclosure settings")]
    Settings(#[source] psych_disclosure::SettingsError),
    /// The file's grant is malformed (an `allowTools` that is not a list of tool names).
    #[error("the grant of the MCP config")]
    Grant(#[source] psych_mcp::ConfigError),
    /// An `output` entry of the file is malformed.
    #[error("the output limits of the MCP config")]
    Output(#[source] psych_mcp::ConfigError),
    /// An `output` entry sets a per-result threshold over the gateway's per-batch one.
    #[error("the output limits of the MCP config")]
    Limits(#[source] psych_types::LimitError),
    /// The passing budget is below one call's bound: a call could never reserve it.
    #[error(
        "the passing budget ({budget} bytes) is below one call's bound on passed results ({per_call} bytes)"
    )]
    PassingBudget {
        /// [`GatewaySettings::passing_budget`].
        budget: u64,
        /// [`GatewaySettings::max_passed_bytes`].
        per_call: u64,
    },
    /// An identity's `allowTools` in the tokens file names a server the MCP config does
    /// not grant.
    #[error(
        "the tokens file: identity {identity:?} allows tools of server {server:?}, which the \
         MCP config does not grant"
    )]
    IdentityGrant {
        /// The identity.
        identity: String,
        /// The server.
        server: String,
    },
    /// A folder under the gateway's `dir` could not be created.
    #[error("cannot create {}", path.display())]
    CreateDir {
        /// The folder.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The MCP manager refused the file.
    #[error("the MCP servers")]
    Manager(#[source] psych_mcp::BuildError),
    /// The kept catalogue could not be opened (nor, when another gateway holds it, an
    /// in-memory one created).
    #[error("the catalogue")]
    Catalog(#[source] psych_catalog::OpenError),
    /// The catalogue's freshener could not start.
    #[error("the catalogue's freshener")]
    Freshener(#[source] psych_catalog::ConfigError),
    /// A blocking task of the start (creating the catalogue) panicked or was cancelled.
    #[error("a task starting the gateway did not finish")]
    Task(#[source] tokio::task::JoinError),
    /// The system's random source failed to give the key that seals the `requestState`
    /// of MCP 2026-07-28's rounds.
    #[error("the system's random source (the key sealing requestState)")]
    Random(#[source] getrandom::Error),
    /// The HTTP listener is not on a loopback address and there are no tokens
    /// ([`GatewaySettings::tokens`]) to authorize its requests.
    #[error("{0} is not a loopback address")]
    NotLoopback(SocketAddr),
    /// Reading the listener's address failed. (A failed accept does not end the gateway:
    /// the listener pauses and goes on.)
    #[error("the HTTP listener")]
    Listen(#[source] std::io::Error),
    /// The stdio session could not open (the gateway was already closing).
    #[error("the stdio session")]
    Session(#[source] SessionRefused),
    /// The stdio client's initialization failed (rmcp's error, kept as the source without
    /// making rmcp's type part of this crate's API).
    #[error("serving stdio")]
    Stdio(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The task serving stdio panicked or was cancelled.
    #[error("serving stdio")]
    StdioTask(#[source] tokio::task::JoinError),
    /// Shutting down, the sessions did not close within [`SHUTDOWN_WITHIN`].
    #[error("the sessions did not close within {} s", SHUTDOWN_WITHIN.as_secs())]
    SessionsOpen,
    /// Shutting down, the calls in flight did not log their results within
    /// [`SHUTDOWN_WITHIN`].
    #[error("the calls in flight did not log their results within {} s", SHUTDOWN_WITHIN.as_secs())]
    CallsUnlogged,
    /// Shutting down, the upstream servers did not stop within [`SHUTDOWN_WITHIN`] (their
    /// process groups are killed as the manager is dropped).
    #[error(
        "the upstream servers did not stop within {} s; killing their process groups",
        SHUTDOWN_WITHIN.as_secs()
    )]
    UpstreamsRunning,
}

/// Why a session could not open.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[non_exhaustive]
pub enum SessionRefused {
    /// The gateway is shutting down.
    #[error("the gateway is shutting down")]
    Closing,
    /// As many sessions are open as [`GatewaySettings::max_sessions`] allows.
    #[error(
        "the gateway: {max} {} open, the most it allows (psych serve: --max-sessions); end \
         one (a client deleting its session, or leaving it idle: psych serve \
         --session-idle-secs) or raise the cap",
        if *max == 1 { "session is" } else { "sessions are" }
    )]
    Full {
        /// The cap.
        max: usize,
    },
    /// The identity the request presents holds as many sessions as
    /// [`GatewaySettings::max_sessions_per_identity`] allows.
    #[error(
        "the gateway: this identity has {max} {} open, the most it allows one identity (psych \
         serve: --max-sessions-per-identity); end one (a client deleting its session, or \
         leaving it idle) or raise the cap",
        if *max == 1 { "session" } else { "sessions" }
    )]
    IdentityFull {
        /// The cap.
        max: usize,
    },
    /// The identity the request presents holds its fair share of
    /// [`GatewaySettings::max_sessions`] or more, and the free sessions are owed to other
    /// identities refused one within [`FAIR_WINDOW`].
    #[error(
        "the gateway: this identity has {held} {} open, its fair share of {fair} while other \
         identities wait for one; end one (a client deleting its session, or leaving it \
         idle) or retry",
        if *held == 1 { "session" } else { "sessions" }
    )]
    IdentityShare {
        /// The sessions the identity holds.
        held: usize,
        /// Its fair share now: the cap on sessions over the identities active now.
        fair: usize,
    },
}

/// Serves Psych's disclosure of the servers of `config` on `listener` until its client
/// leaves (stdio) or `shutdown` resolves, then shuts down in order within
/// [`SHUTDOWN_WITHIN`]: every call in flight cancelled upstream and logged, the sessions
/// closed, its own tasks, the catalogue's sync and freshener stopped, and every upstream
/// process group stopped. The caller owns the signal: `psych serve` resolves `shutdown` on
/// SIGTERM or SIGINT; a program embedding the gateway on whatever ends its own work.
///
/// The upstream servers connect in the background: a client's `initialize` is answered at
/// once from what is known, and a call that reaches a server still making its first
/// connection attempt waits for that attempt.
///
/// Run it on a multi-threaded tokio runtime (`psych serve`'s), not inside a `LocalSet`:
/// the guard of a large call and the closing of a log move their blocking work off the
/// worker with `block_in_place` ([`psych_runtime::off_the_worker`]), which tokio refuses
/// (a panic) under a `LocalSet` on the runtime's `block_on` thread.
///
/// # Errors
///
/// [`ServeError`]: the settings, the file's grant, the folders under the settings' `dir`, the
/// listener (not loopback, failing), and a shutdown that did not finish in time.
pub async fn serve(
    config: McpConfig,
    listener: Listener,
    settings: GatewaySettings,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    // Before anything starts: without its key the gateway could not seal a round.
    let sealer = match settings.state_key {
        Some(key) => mrtr::Sealer::with_key(key),
        None => mrtr::Sealer::new().map_err(ServeError::Random)?,
    };
    if let Listener::Http(listener) = &listener {
        let addr = listener.local_addr().map_err(ServeError::Listen)?;
        if !addr.ip().is_loopback() && settings.tokens.is_none() {
            return Err(ServeError::NotLoopback(addr));
        }
    }
    let spill = settings.spill();
    // Off the async workers: creating folders blocks.
    let created = spill.clone();
    tokio::task::spawn_blocking(move || std::fs::create_dir_all(&created))
        .await
        .map_err(ServeError::Task)?
        .map_err(|source| ServeError::CreateDir {
            path: spill.clone(),
            source,
        })?;
    let disclosure = listing_settings(&settings.disclosure).map_err(ServeError::Settings)?;
    if settings.passing_budget < settings.max_passed_bytes {
        return Err(ServeError::PassingBudget {
            budget: settings.passing_budget,
            per_call: settings.max_passed_bytes,
        });
    }
    let grant = config.grant().map_err(ServeError::Grant)?;
    // Every result is projected alone (a batch of one): the default thresholds' per-batch
    // bound is what a tool's per-result threshold may reach.
    let output_limits = config.output_limits().map_err(ServeError::Output)?;
    output_limits
        .check(psych_elision::Thresholds::default().per_batch())
        .map_err(ServeError::Limits)?;
    // Every identity's narrowed grant, checked before anything starts.
    let mut narrowings = Vec::new();
    if let Some(tokens) = &settings.tokens {
        for (identity, narrowing) in tokens.narrowings() {
            let narrowed =
                narrow(&grant, narrowing).map_err(|server| ServeError::IdentityGrant {
                    identity: identity.to_owned(),
                    server,
                })?;
            narrowings.push((identity.to_owned(), narrowed));
        }
    }
    // Retention, before any upstream starts and any request is answered (so no handle of a
    // segment due for deletion is read first), then hourly; off the async workers.
    let (logs, retention) = (settings.logs(), settings.retention);
    let (first, stores, report) = (
        logs.clone(),
        settings.stores.clone(),
        Arc::clone(&settings.report),
    );
    let sweep_all = move |logs: &std::path::Path| {
        tenant::sweep(logs, retention);
        if let Some(stores) = &stores {
            tenant::sweep_store(stores.as_ref(), retention, report.as_ref());
        }
    };
    // A shared store's Runs are swept in the background from the start (below): another
    // replica may be sweeping them, and reading a handle due for deletion meanwhile is
    // harmless. The folder's segments are swept before any request.
    tokio::task::spawn_blocking(move || tenant::sweep(&first, retention))
        .await
        .map_err(ServeError::Task)?;
    let connections: Vec<ConnectionSpec> = config
        .servers
        .values()
        .map(|entry| entry.connection.clone())
        .collect();
    // The kept catalogue (opening it reads and may commit: off the async workers). Held by
    // another gateway on the same folder, an in-memory one serves and every server starts.
    let kept = settings.catalog();
    let report = Arc::clone(&settings.report);
    let shared = settings.catalog.clone();
    let sources = settings.sources();
    let opened = tokio::task::spawn_blocking(move || match shared {
        Some(store) => Ok((Catalog::shared(store), Some(ListingSources::load(sources)))),
        None => ListingSources::open_kept(&kept, |path| {
            report(&format!(
                "the catalogue {} is held by another psych serve on the same --dir; this one \
                 keeps its catalogue in memory and starts every server at once",
                path.display()
            ));
        }),
    })
    .await
    .map_err(ServeError::Task)?
    .map_err(ServeError::Catalog)?;
    let (catalog, sources) = opened;
    // Identities narrowed alike share one lane: one resolution per distinct grant.
    let mut groups: Vec<(PermissionGrant, Vec<String>)> = Vec::new();
    for (identity, narrowed_grant) in narrowings {
        match groups.iter_mut().find(|(g, _)| *g == narrowed_grant) {
            Some((_, identities)) => identities.push(identity),
            None => groups.push((narrowed_grant, vec![identity])),
        }
    }
    // Learned pins, chosen once now per lane, before any listing is answered.
    let held = sources.is_none() && settings.catalog.is_none();
    let mut lane_connections = pinning::lane_connections(
        pinning::Learning::of(&settings),
        &catalog,
        held,
        &connections,
        &groups,
        &grant,
        &disclosure,
    )
    .await
    .map_err(ServeError::Task)?
    .into_iter();
    let mut builder = McpManager::builder(config.clone())
        .spill_dir(spill)
        .spill_budget(settings.spill_budget.clone())
        .timeouts(call_timeouts());
    if let Some(sources) = &sources
        && !settings.eager
    {
        let (known, sources, config) = (catalog.clone(), sources.clone(), config.clone());
        let starts = tokio::task::spawn_blocking(move || start_at(&config, &known, &sources))
            .await
            .map_err(ServeError::Task)?;
        for (server, start) in starts {
            if let StartAt::OnDemand { idle, .. } = start {
                builder = builder.lazy(server, idle);
            }
        }
    }
    let manager = builder.build().map_err(ServeError::Manager)?;
    // A listing gets psych-mcp's deadline for a whole listing (every page, and a walk
    // again when the server changed its tools during one), as the other commands' do
    // (`budget`, `search`, `orient`: the CLI's `setup::listing_freshener`): the
    // freshener's own default (30 s) would give up on a listing the manager still allows.
    // A lazy server's start is listed under it too, so a stalled one fails its first
    // call after 60 s (on a shared catalogue, after up to 120 s of lease wait besides).
    let fresh = FreshenerConfig::builder()
        .list_timeout(call_timeouts().listing)
        .build()
        .map_err(ServeError::Freshener)?;
    // The servers connect in the background: `initialize` is answered from what is known.
    let Started {
        sync,
        freshener,
        connecting,
        ..
    } = CatalogSync::start_connecting(&manager, catalog, fresh).map_err(ServeError::Freshener)?;
    let limits = Limits::builder()
        .max_passed_bytes(settings.max_passed_bytes)
        .build()
        .unwrap_or_default();
    let mut tasks = JoinSet::new();
    if let Some(sources) = sources {
        let report = Arc::clone(&settings.report);
        tasks.spawn(record_sources(
            Arc::new(config),
            freshener.catalog().clone(),
            sources,
            report,
        ));
    }
    // One lane (a resolver and its cache) per grant: the file's, and each narrowed one.
    let mut lane = |grant: PermissionGrant, connections: Vec<ConnectionSpec>| {
        let basis = Arc::new(Basis {
            catalog: freshener.catalog().clone(),
            connections,
            grant,
            settings: disclosure.clone(),
            limits: limits.clone(),
            surfaces: Mutex::new(SurfaceCache::new(settings.estimator.clone())),
        });
        let (published, resolved) = watch::channel(None);
        tasks.spawn(resolver(Arc::clone(&basis), published));
        Arc::new(Lane {
            changes: basis.catalog.changes(),
            basis,
            resolved,
        })
    };
    let mut narrowed: BTreeMap<String, Arc<Lane>> = BTreeMap::new();
    for (narrowed_grant, identities) in groups {
        let pinned = lane_connections
            .next()
            .unwrap_or_else(|| connections.clone());
        let lane = lane(narrowed_grant, pinned);
        for identity in identities {
            narrowed.insert(identity, Arc::clone(&lane));
        }
    }
    let lane = lane(
        grant,
        lane_connections
            .next()
            .unwrap_or_else(|| connections.clone()),
    );
    if let Some(stores) = settings.stores.clone() {
        let report = Arc::clone(&settings.report);
        tasks.spawn(async move {
            let _ = tokio::task::spawn_blocking(move || {
                tenant::sweep_store(stores.as_ref(), retention, report.as_ref());
            })
            .await;
        });
    }
    tasks.spawn(async move {
        let start = tokio::time::Instant::now() + SWEEP_EVERY;
        let mut hourly = tokio::time::interval_at(start, SWEEP_EVERY);
        loop {
            hourly.tick().await;
            let (logs, sweep) = (logs.clone(), sweep_all.clone());
            let _ = tokio::task::spawn_blocking(move || sweep(&logs)).await;
        }
    });
    let report = Arc::clone(&settings.report);
    tasks.spawn(async move {
        for (server, error) in connecting.finish().await {
            report(&format!("{server}: {error}"));
        }
    });
    let on_demand: Arc<dyn OnDemand> =
        Arc::new(LazyStarts::new(manager.clone(), Arc::clone(&freshener)));
    let http = matches!(listener, Listener::Http(_));
    let shared = Arc::new(Shared {
        manager: manager.clone(),
        lane,
        narrowed,
        limits,
        passing: PassingBudget::new(settings.passing_budget),
        passing_share: default_passing_share(
            settings.passing_budget,
            settings.max_passed_bytes,
            settings.tokens.as_ref().map_or(0, |t| t.identities()),
        ),
        elider: Elider::builder()
            .estimator(settings.estimator.clone())
            .limits(output_limits)
            .build(),
        logs: settings.logs(),
        stores: settings.stores.clone(),
        retention: settings.retention,
        tenants: Mutex::default(),
        default_identity: if http { "loopback" } else { "stdio" },
        tokens: settings.tokens.clone(),
        state: watch::Sender::new(Gauge::default()),
        max_sessions: http.then_some(settings.max_sessions),
        max_identity_sessions: settings.max_sessions_per_identity.unwrap_or_else(|| {
            let identities = settings.tokens.as_ref().map_or(0, |t| t.identities());
            default_max_sessions_per_identity(settings.max_sessions, identities)
        }),
        raw: Arc::default(),
        sealer,
        on_demand: Some(on_demand),
        input_ended: watch::Sender::new(false),
    });
    // The first resolution of every lane, of whatever the catalogue holds now (most
    // likely nothing).
    for lane in std::iter::once(&shared.lane).chain(shared.narrowed.values()) {
        let _ = lane.resolved.clone().wait_for(Option::is_some).await;
    }
    let session_idle = settings.session_idle;
    if let Some(ready) = settings.ready {
        ready();
    }

    let serving = async {
        match listener {
            Listener::Stdio => serve_stdio(Arc::clone(&shared)).await,
            Listener::Http(listener) => {
                serve_http(Arc::clone(&shared), listener, session_idle).await
            }
        }
    };
    let mut serving = std::pin::pin!(serving);
    let mut shutdown = std::pin::pin!(shutdown);
    let (served, deadline) = tokio::select! {
        served = &mut serving => (served, tokio::time::Instant::now() + SHUTDOWN_WITHIN),
        () = &mut shutdown => {
            let deadline = tokio::time::Instant::now() + SHUTDOWN_WITHIN;
            shared.close(Cut::Shutdown);
            let served = tokio::time::timeout_at(deadline, serving)
                .await
                .unwrap_or(Err(ServeError::SessionsOpen));
            (served, deadline)
        }
    };
    // One path for both transports and both ends (the stdio client leaving, a signal):
    // rmcp does not await its request handlers (when its input ends it cancels them and
    // returns), so the calls in flight are awaited here, each logging its result, before
    // the upstreams and the runtime are stopped.
    shared.close(Cut::Shutdown);
    let logged = tokio::time::timeout_at(deadline, shared.settled(|g| g.calls == 0)).await;
    let stopped = tokio::time::timeout_at(deadline, async {
        // The resolver, and the report of the first attempts (which aborts them).
        tasks.shutdown().await;
        sync.stop().await;
        freshener.shutdown().await;
        manager.shutdown().await;
    })
    .await;
    match (served, logged, stopped) {
        (Err(error), ..) => Err(error),
        (Ok(()), Err(_), _) => Err(ServeError::CallsUnlogged),
        (Ok(()), Ok(()), Err(_)) => Err(ServeError::UpstreamsRunning),
        (Ok(()), Ok(()), Ok(())) => Ok(()),
    }
}

/// Records, as each server's listing is stored by this gateway, over which connection it was
/// made ([`ListingSources`]), so that the next start serves a kept listing only for a
/// server configured the same. Ends once every server's source is recorded (or the
/// catalogue is gone). Cancel-safe: a write in flight finishes on the blocking pool (a
/// temporary file renamed over the last one).
async fn record_sources(
    config: Arc<McpConfig>,
    catalog: Catalog,
    mut sources: ListingSources,
    report: Arc<dyn Fn(&str) + Send + Sync>,
) {
    let since = catalog.now();
    let mut changes = catalog.changes();
    let mut pending: Vec<psych_types::ServerId> = config
        .servers
        .iter()
        .filter(|(server, entry)| !sources.matches(server, entry))
        .map(|(server, _)| server.clone())
        .collect();
    while !pending.is_empty() {
        // Shared, not copied, at each wake-up.
        let (config_now, catalog_now) = (Arc::clone(&config), catalog.clone());
        // redb reads and a file write: off the async workers.
        let checked = tokio::task::spawn_blocking(move || {
            let mut wrote = Ok(());
            let before = pending.len();
            pending.retain(|server| {
                let listed = catalog_now
                    .health(server)
                    .ok()
                    .and_then(|h| h.last_sync)
                    .is_some_and(|sync| sync.at >= since);
                match config_now.servers.get(server) {
                    Some(entry) if listed => {
                        sources.record(server, entry);
                        false
                    }
                    _ => true,
                }
            });
            if pending.len() < before {
                wrote = sources.save();
            }
            (sources, pending, wrote)
        })
        .await;
        let Ok((kept, left, wrote)) = checked else {
            return;
        };
        if let Err(error) = wrote {
            report(&format!(
                "cannot record which connection each kept listing came from in {}: {error}; \
                 the servers listed will start at once next time",
                kept.path().display()
            ));
        }
        (sources, pending) = (kept, left);
        if pending.is_empty() || changes.changed().await.is_err() {
            return;
        }
    }
}

/// Serves the one stdio client until it leaves or the gateway closes; when closing, waits
/// for every call in flight to cancel itself and log its result before ending the session.
/// When the client leaves (closes stdin), the gateway closes as cancelled by the client:
/// the calls still in flight (rmcp cancels them and returns without awaiting them) log
/// [`CANCELLED_BY_CLIENT`], and [`serve`] awaits them.
async fn serve_stdio(shared: Arc<Shared>) -> Result<(), ServeError> {
    let session = Session::open(Arc::clone(&shared)).map_err(ServeError::Session)?;
    let mut state = shared.state.subscribe();
    let running = tokio::select! {
        // Psych's own transport (rmcp's leaves a line it cannot parse unanswered), with
        // the raw answers put in place of their placeholders.
        running = session.serve(raw::RawTransport::new(
            stdio::StdioTransport::new(tokio::io::stdin(), tokio::io::stdout()).on_end({
                let shared = Arc::clone(&shared);
                move || {
                    shared.input_ended.send_replace(true);
                }
            }),
            Arc::clone(&shared.raw),
        )) => {
            running.map_err(|e| ServeError::Stdio(Box::new(e)))?
        }
        () = closing(&mut state) => return Ok(()),
    };
    let stop = running.cancellation_token();
    let mut waiting = std::pin::pin!(running.waiting());
    tokio::select! {
        quit = &mut waiting => {
            shared.close(Cut::Client);
            return quit.map(|_| ()).map_err(ServeError::StdioTask);
        }
        () = closing(&mut state) => {}
    }
    shared.settled(|g| g.calls == 0).await;
    stop.cancel();
    waiting.await.map(|_| ()).map_err(ServeError::StdioTask)
}

/// `grant` narrowed to what an identity's tokens entry allows (`allowTools`): only the
/// servers it names, each to the tools both grant (`"*"`: all the file grants).
///
/// # Errors
///
/// The name of a server the entry names that the file does not grant, or that is no
/// server name.
fn narrow(
    grant: &PermissionGrant,
    narrowing: &tokens::Narrowing,
) -> Result<PermissionGrant, String> {
    use psych_types::{ServerId, ToolName, ToolScope};
    let mut narrowed = PermissionGrant::none();
    for (server, tools) in narrowing {
        let id = ServerId::new(server.clone()).map_err(|_| server.clone())?;
        let Some(scope) = grant.scope(&id) else {
            return Err(server.clone());
        };
        let scope = match (scope, tools) {
            (scope, None) => scope.clone(),
            (ToolScope::All, Some(tools)) => ToolScope::Only(
                tools
                    .iter()
                    .filter_map(|t| ToolName::new(t.clone()).ok())
                    .collect(),
            ),
            (ToolScope::Only(set), Some(tools)) => ToolScope::Only(
                set.iter()
                    .filter(|t| tools.iter().any(|n| n == t.as_str()))
                    .cloned()
                    .collect(),
            ),
        };
        narrowed = narrowed.allow_scope(id, scope);
    }
    Ok(narrowed)
}

/// Which identity made each open HTTP session (with tokens only): a request naming a
/// session of another identity, or one not open, is answered as if the session did not
/// exist.
///
/// Kept by the session manager ([`raw::RawSessions`]): a session is open from its creation
/// until rmcp closes it (its client deletes it, it idles out, the gateway shuts down), and
/// its owner is known from its `initialize` answer until then, never forgotten sooner.
/// Bounded by the sessions open: each holds one of `--max-sessions` slots while its worker
/// runs, and rmcp closes it as its worker ends. (Before, a fixed table of 256 owners
/// dropped its oldest, open sessions included, and only a deletion removed one: past 256
/// sessions made, an open session answered 404.)
#[derive(Debug, Default)]
pub(crate) struct Owners(Mutex<HashMap<String, Option<String>>>);

impl Owners {
    /// Each open session, with its owner once its `initialize` was answered.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Option<String>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `session` was created (rmcp's session manager made it).
    pub(crate) fn opened(&self, session: &str) {
        self.lock().insert(session.to_owned(), None);
    }

    /// `session` was closed: nobody's from now on.
    pub(crate) fn closed(&self, session: &str) {
        self.lock().remove(session);
    }

    /// `identity` made `session` (its `initialize` was answered); nothing when the session
    /// is closed already.
    fn record(&self, session: &str, identity: String) {
        if let Some(owner) = self.lock().get_mut(session) {
            *owner = Some(identity);
        }
    }

    /// Whether `session` is open and was made by `identity`. A session not known here
    /// (never made, or closed) is nobody's: its client starts another.
    fn owned_by(&self, session: &str, identity: &str) -> bool {
        self.lock()
            .get(session)
            .is_some_and(|owner| owner.as_deref() == Some(identity))
    }
}

/// A small HTTP answer of the gateway's own (not rmcp's): `status` with `body` of `kind`.
fn http_answer(
    status: hyper::StatusCode,
    kind: &'static str,
    body: String,
) -> hyper::Response<raw::HttpBody> {
    use http_body_util::BodyExt;
    let mut response =
        hyper::Response::new(http_body_util::Full::new(hyper::body::Bytes::from(body)).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(kind),
    );
    response
}

/// The answer to a request naming a session of another identity: as to a session that
/// does not exist.
fn not_found_session() -> hyper::Response<raw::HttpBody> {
    http_answer(
        hyper::StatusCode::NOT_FOUND,
        "text/plain",
        "Not Found: Session not found".to_owned(),
    )
}

/// rmcp's answer to an HTTP request (`handled`, whose body showed `seen`), except when a
/// session it needed could not open ([`REFUSED`]): then, in place of rmcp's 500, the
/// gateway's own 503 saying why ([`no_session`]); and when its body was refused past
/// [`MAX_REQUEST_STRUCTURAL_BYTES`] or its bytes past 4 MiB: then 413 ([`refused_body`]).
async fn refusing(
    handled: impl Future<Output = hyper::Response<raw::HttpBody>>,
    seen: &Mutex<admit::Seen>,
    presented: Option<String>,
) -> hyper::Response<raw::HttpBody> {
    let handled = PRESENTED.scope(presented, handled);
    let (response, refused) = REFUSED
        .scope(std::cell::RefCell::new(None), async {
            let response = handled.await;
            let refused = REFUSED.with(|refused| refused.borrow_mut().take());
            (response, refused)
        })
        .await;
    if response.status() != hyper::StatusCode::INTERNAL_SERVER_ERROR {
        return response;
    }
    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
    match (refused, seen.refused) {
        (Some(why), _) => no_session(&why, admit::request_id(&seen.head)),
        (None, Some(admit::Unread::TooComplex)) => refused_body(
            &seen.head,
            stdio::TOO_COMPLEX,
            json!({"maxStructuralBytes": MAX_REQUEST_STRUCTURAL_BYTES}),
        ),
        (None, Some(admit::Unread::TooLarge)) => refused_body(
            &seen.head,
            TOO_LARGE,
            json!({"maxBodyBytes": admit::BODY_BYTES}),
        ),
        (None, None) => response,
    }
}

/// What a POST whose body is over 4 MiB is told (over stdio, a line that long is told
/// "request too large", for its request's id, found as the line goes by; a notification
/// that long is dropped).
const TOO_LARGE: &str = "request too large: over 4194304 bytes, more than the gateway reads";

/// The answer to a POST whose body (beginning with `head`) was refused unparsed, past
/// [`MAX_REQUEST_STRUCTURAL_BYTES`] or 4 MiB: 413, with a JSON-RPC error (-32600, as over
/// stdio) saying `message` with `data` for the request's `id` when `head` shows a request
/// (its `method` and `id` both in it), else plain text (as rmcp's own 413): an answer's
/// id is not the client's to wait on.
fn refused_body(head: &[u8], message: &str, data: Value) -> hyper::Response<raw::HttpBody> {
    let status = hyper::StatusCode::PAYLOAD_TOO_LARGE;
    let shape = psych_mcp::wire::message_shape(head);
    match shape
        .request_id()
        .and_then(|id| serde_json::from_str::<Value>(id).ok())
    {
        Some(id) => admit::error_answer(
            status,
            ErrorCode::INVALID_REQUEST,
            Some(id),
            message.to_owned(),
            data,
        ),
        None => http_answer(
            status,
            "text/plain",
            format!("Payload Too Large: {message}"),
        ),
    }
}

/// The answer to a request whose session could not open: 503 saying why, and
/// `Retry-After: 1` when sessions are full (one ends when its client deletes it or it
/// idles out). For a request whose `id` is known ([`admit::request_id`]), a JSON-RPC error
/// (-32000) with that id and what the status said in its `data`, which rmcp's client
/// gives its caller as the request's error; else plain text, as rmcp's own HTTP errors (an
/// error without the `id` a client waits for would be dropped by it).
fn no_session(refused: &SessionRefused, id: Option<Value>) -> hyper::Response<raw::HttpBody> {
    let status = hyper::StatusCode::SERVICE_UNAVAILABLE;
    let response = match id {
        Some(id) => {
            // What the status and `Retry-After` said, for clients that show only the error.
            let data = match refused {
                SessionRefused::Full { max } => json!({"maxSessions": max, "retryAfter": 1}),
                SessionRefused::IdentityFull { max } => {
                    json!({"maxSessionsPerIdentity": max, "retryAfter": 1})
                }
                SessionRefused::IdentityShare { fair, .. } => {
                    json!({"fairShare": fair, "retryAfter": 1})
                }
                SessionRefused::Closing => json!({"closing": true}),
            };
            admit::busy_error(status, Some(id), refused.to_string(), data)
        }
        None => http_answer(
            status,
            "text/plain",
            format!("Service Unavailable: {refused}"),
        ),
    };
    match refused {
        SessionRefused::Full { .. }
        | SessionRefused::IdentityFull { .. }
        | SessionRefused::IdentityShare { .. } => admit::retry_after(response),
        SessionRefused::Closing => response,
    }
}

/// The answer to an HTTP request without a known bearer token.
fn unauthorized() -> hyper::Response<raw::HttpBody> {
    let body = json!({
        "error": "unauthorized",
        "error_description": "psych serve needs Authorization: Bearer TOKEN, a token of its --tokens file",
    });
    let mut response = http_answer(
        hyper::StatusCode::UNAUTHORIZED,
        "application/json",
        body.to_string(),
    );
    response.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Bearer realm=\"psych\""),
    );
    // Its connection is closed once it is sent: requests without a token hold no place
    // of MAX_CONNECTIONS (one such request per connection every few seconds held them all).
    response.headers_mut().insert(
        hyper::header::CONNECTION,
        hyper::header::HeaderValue::from_static("close"),
    );
    response
}

/// Serves streamable HTTP on `listener` until the gateway closes; then stops accepting, waits
/// for every call in flight to cancel itself and log its result, ends every session, and
/// lets each connection finish what it is sending.
async fn serve_http(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    session_idle: Duration,
) -> Result<(), ServeError> {
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use rmcp::transport::StreamableHttpService;
    use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;

    let raw = Arc::clone(&shared.raw);
    let answers = Arc::clone(&shared.raw);
    // MCP 2026-07-28's per-request answers as one JSON body when nothing (progress) comes
    // before the result. With tokens every request is authorized, so the Host check
    // against DNS rebinding (loopback names only) gives way to the operator's own names.
    let mut config = StreamableHttpServerConfig::default()
        .with_json_response(true)
        .with_max_request_body_bytes(admit::BODY_BYTES);
    if shared.tokens.is_some() {
        config = config.disable_allowed_hosts();
    }
    // Cancelling it ends every session rmcp serves (their workers and event streams).
    let sessions = config.cancellation_token.clone();
    let factory = Arc::clone(&shared);
    let owners = Arc::new(Owners::default());
    let managed = Arc::new(raw::RawSessions::new(
        raw,
        session_idle,
        Arc::clone(&owners),
    ));
    let rmcp = StreamableHttpService::new(
        move || Session::open(Arc::clone(&factory)).map_err(std::io::Error::other),
        Arc::clone(&managed),
        config,
    );
    // Owned here: dropped with this future (a shutdown past its deadline), it stops.
    let reaper = AbortOnDrop(tokio::spawn(close_idle_sessions(managed)));
    let tokens = shared.tokens.clone();
    let admission = admit::Admission::new();
    let posts = Arc::clone(&admission);
    let peeks = admit::Admission::peeks();
    let streams = admit::Admission::streams(shared.max_identity_sessions);
    // Authorization first: a request without a known token never reaches rmcp; one with
    // carries its identity in its extensions, which rmcp hands the handler. A request in
    // a session (its stream, its deletion included) must be the session's identity's.
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        let rmcp = rmcp.clone();
        let tokens = tokens.clone();
        let answers = Arc::clone(&answers);
        let owners = Arc::clone(&owners);
        let admission = Arc::clone(&admission);
        let peeks = Arc::clone(&peeks);
        let streams = Arc::clone(&streams);
        async move {
            let mut identity = None;
            if let Some(tokens) = &tokens {
                let header = request
                    .headers()
                    .get(hyper::header::AUTHORIZATION)
                    .map(|value| value.as_bytes());
                match tokens.identify_header(header) {
                    Some(name) => {
                        identity = Some(name.to_owned());
                        request.extensions_mut().insert(Identity(name.to_owned()));
                    }
                    None => return Ok::<_, std::convert::Infallible>(unauthorized()),
                }
            }
            let session = request
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if let (Some(identity), Some(session)) = (&identity, &session)
                && !owners.owned_by(session, identity)
            {
                return Ok(not_found_session());
            }
            // An event stream's place, held until its body is sent or dropped (see the
            // admit module): rmcp would keep up to 33 per session.
            let stream = if request.method() == hyper::Method::GET {
                match streams.admit(admit::keys(session.as_deref(), identity.as_deref())) {
                    Ok(admitted) => Some(admitted),
                    Err(refused) => return Ok(admit::too_many_streams(refused)),
                }
            } else {
                None
            };
            // A POST answered without a session transport (MCP 2026-07-28's requests,
            // whatever headers they carry: rmcp routes by the message) has its answer
            // patched here; in a session the transport has done it, and nothing is left
            // to patch.
            let per_request = request.method() == hyper::Method::POST;
            // A POST's place is taken before its body is read, and held until its answer
            // has been sent: under its session, and (with tokens) its identity.
            // Its body must arrive within its deadline, whoever reads it.
            // A POST's first bytes are kept as rmcp reads them, to answer it with its `id`
            // if a session it needs cannot open, and its structure counted, to refuse it
            // before rmcp parses it past the bound.
            let seen = Arc::new(Mutex::new(admit::Seen::default()));
            let request = request.map(|body| {
                let body = admit::Deadline::new(body, admit::BODY_WITHIN);
                // Any POST: rmcp routes by the message, so one of 2026-07-28 that names a
                // session is served by a session of its own too.
                if per_request {
                    body.recording(Arc::clone(&seen))
                } else {
                    body
                }
            });
            let admitted = if per_request {
                match admission.admit(admit::keys(session.as_deref(), identity.as_deref())) {
                    Ok(admitted) => Some(admitted),
                    // A refused POST that is a notification or an answer (a cancellation,
                    // an elicitation's answer) still passes, so that a client at its bound
                    // can end what holds its places: at most `MAX_PEEKS` read at once,
                    // `PEEKS_PER_KEY` of one session or identity, each read and handled
                    // within `PASS_WITHIN`.
                    Err(refused) => {
                        let keys = admit::keys(session.as_deref(), identity.as_deref());
                        let Ok(_peek) = peeks.admit(keys) else {
                            return Ok(admit::too_many(refused));
                        };
                        let passed = tokio::time::timeout(admit::PASS_WITHIN, async {
                            match admit::not_a_request(request).await {
                                Some(request) => Some(
                                    refusing(rmcp.handle(request), &seen, identity.clone()).await,
                                ),
                                None => None,
                            }
                        });
                        return Ok(match passed.await {
                            Ok(Some(response)) => response,
                            Ok(None) | Err(_) => admit::too_many(refused),
                        });
                    }
                }
            } else {
                None
            };
            let response = refusing(rmcp.handle(request), &seen, identity.clone()).await;
            // A session just made (its initialize): its identity is the creator's. (A
            // deleted one is forgotten as rmcp closes it.)
            if let (Some(identity), None, Some(made)) =
                (identity, &session, response.headers().get("mcp-session-id"))
                && let Ok(made) = made.to_str()
            {
                owners.record(made, identity);
            }
            let response = if per_request {
                raw::raw_http(answers, response).await
            } else {
                response
            };
            Ok(match admitted.or(stream) {
                Some(admitted) => admit::hold(response, admitted),
                None => response,
            })
        }
    });
    let mut state = shared.state.subscribe();
    let mut connections = JoinSet::new();
    let open = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let accepted = loop {
        // A connection's place is taken before it is accepted: past the bound, the next
        // waits in the listen backlog until one closes.
        let place = tokio::select! {
            place = Arc::clone(&open).acquire_owned() => place,
            () = closing(&mut state) => break Ok(()),
        };
        let Ok(place) = place else {
            break Ok(());
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = closing(&mut state) => break Ok(()),
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            // A failed accept is one connection's (aborted before it was taken: the
            // listener goes on at once) or the process's (out of file descriptors or
            // memory: it goes on after a pause, so that a lasting failure does not spin).
            Err(error) => {
                drop(place);
                if is_connection_error(&error) {
                    continue;
                }
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_PAUSE) => continue,
                    () = closing(&mut state) => break Ok(()),
                }
            }
        };
        while connections.try_join_next().is_some() {}
        let service = service.clone();
        let mut state = shared.state.subscribe();
        connections.spawn(async move {
            let _place = place;
            // A connection that sends no request head within the deadline, idle between
            // requests included, is closed, so idle connections do not keep their places;
            // so is one whose client stops reading what it is sent.
            let stream = admit::WriteDeadline::new(stream, admit::WRITE_WITHIN);
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_WITHIN)
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = closing(&mut state) => {
                    // Finishes the response being sent (a call's cancellation, an event
                    // stream until its session ends), then closes.
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    };
    drop(listener);
    drop(reaper);
    shared.close(Cut::Shutdown);
    shared.settled(|g| g.calls == 0).await;
    // The calls' cancellation answers are on their way out (through a session's worker to
    // its POST's event stream, or a 2026-07-28 POST's own answer): each POST's place is
    // held until its answer's body is sent, so they are let out, within 2 s (a
    // listen stream's POST holds its place as long as it is open), before every session
    // and stream ends.
    let _ = tokio::time::timeout(ANSWERS_OUT_WITHIN, posts.drained()).await;
    sessions.cancel();
    shared.settled(|g| g.sessions == 0).await;
    while connections.join_next().await.is_some() {}
    accepted
}

/// Closes each HTTP session idle past its limit ([`raw::RawSessions::idle`]: no message or
/// HTTP request for it, and no request in flight), as its client deleting it would, until
/// aborted. Each close runs apart (its worker may be slow to take it), looked at again
/// just before and taken in the same step ([`raw::RawSessions::reap`]): a request arriving
/// at that very moment either keeps its session or is answered 404 (a client then opens a
/// new one), not cut with a session closed under it (provided the session's worker takes
/// the request within the idle limit, after which it counts as in flight).
async fn close_idle_sessions(sessions: Arc<raw::RawSessions>) {
    use rmcp::transport::streamable_http_server::session::SessionManager;
    let mut closing = JoinSet::new();
    loop {
        tokio::time::sleep(sessions.sweep_every()).await;
        while closing.try_join_next().is_some() {}
        for id in sessions.idle(std::time::Instant::now()) {
            let sessions = Arc::clone(&sessions);
            closing.spawn(async move {
                if sessions.reap(&id, std::time::Instant::now()) {
                    let _ = tokio::time::timeout(SESSION_CLOSE_WITHIN, sessions.close_session(&id))
                        .await;
                }
            });
        }
    }
}

/// How long a shutdown waits, once every call has ended, for the POSTs' answers on their
/// way out to be sent before it ends the sessions and streams.
const ANSWERS_OUT_WITHIN: Duration = Duration::from_secs(2);

/// How long the gateway waits for an idle session's worker to take its close.
const SESSION_CLOSE_WITHIN: Duration = Duration::from_secs(10);

/// A task aborted when this is dropped: its owner's lifetime is the task's.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Whether a failed accept was one connection's rather than the process's.
fn is_connection_error(error: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        error.kind(),
        ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionRefused
            | ErrorKind::Interrupted
            | ErrorKind::HostUnreachable
            | ErrorKind::NetworkUnreachable
            | ErrorKind::NetworkDown
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A result is large by its stored text, its binary blocks, its structured content or
    /// its `_meta`.
    #[test]
    fn a_result_past_a_mib_is_known_by_its_text_binaries_or_structure() {
        let mib = psych_mcp::wire::JSON_ON_WORKER;
        let small = ToolOutput::text("x".repeat(1000));
        assert!(!past_worker_bound(&small, 1000));
        assert!(
            past_worker_bound(&small, mib as u64 + 1),
            "its text as stored"
        );
        let image = ToolOutput::from_blocks(vec![
            ContentBlock::text("a screenshot"),
            ContentBlock::image("image/png", vec![0; mib + 1]),
        ]);
        assert!(past_worker_bound(&image, 12));
        let mut structured = ToolOutput::text("rows");
        structured.structured_content = Some(json!({"rows": vec![0; mib]}));
        assert!(past_worker_bound(&structured, 4));
        let mut meta = ToolOutput::text("one line");
        meta.meta = Some(serde_json::Map::from_iter([(
            "trace".to_owned(),
            json!("t".repeat(mib)),
        )]));
        assert!(past_worker_bound(&meta, 8));
    }

    /// A result shown whole whose text was spilled to a file (too large for memory, stored
    /// whole in the log) is answered with the placeholder that says how large it is and the
    /// handle to read it by, and a link to it for a client that opens them (not for a
    /// failure); never with the placeholder alone, as if it were the result.
    #[test]
    fn a_spilled_result_shown_whole_says_where_to_read_it() {
        let text = "a line of the result\n".repeat(100);
        // As the executor hands it on once logged: the placeholder in the text block, the
        // files dropped (the log holds the text), known by its length as stored.
        let placeholder =
            psych_types::SpilledText::new(tempfile::tempfile().unwrap(), text.len() as u64)
                .placeholder();
        let output = ToolOutput::text(placeholder.clone());
        let result = |output: ToolOutput| ToolResult {
            call_id: ToolCallId::new("c").unwrap(),
            name: "fetch".to_owned(),
            output,
            target: Some(ToolRef::new(
                psych_types::ServerId::new("web").unwrap(),
                psych_types::ToolName::new("fetch").unwrap(),
            )),
        };
        let handle = RecordHandle::new(psych_types::RunId::new("r").unwrap(), 3);
        let stored = text.len() as u64;
        let answered = |output: ToolOutput, links: bool| {
            let Ok(Answer::Result(json)) = Session::shown(
                result(output),
                Projection::Full,
                &handle,
                stored,
                links,
                1 << 20,
            ) else {
                panic!("not answered with a result");
            };
            json
        };

        let shown = answered(output.clone(), true);
        let read_it = format!("{placeholder} Read it with {READ_TOOL_OUTPUT}, handle {handle}.");
        assert_eq!(shown["content"][0]["text"], read_it);
        assert_eq!(shown["content"][1]["type"], "resource_link");
        assert_eq!(shown["content"][1]["uri"], resources::result_uri(&handle));
        assert_eq!(shown["content"][1]["size"], stored);
        assert_eq!(shown["content"].as_array().map(Vec::len), Some(2));
        assert_ne!(shown["isError"], true, "not a failure");

        let shown = answered(output.clone(), false);
        assert_eq!(shown["content"][0]["text"], read_it);
        assert_eq!(
            shown["content"].as_array().map(Vec::len),
            Some(1),
            "no link"
        );

        let mut failed = output;
        failed.is_error = true;
        let shown = answered(failed, true);
        assert_eq!(shown["content"][0]["text"], read_it);
        assert_eq!(
            shown["content"].as_array().map(Vec::len),
            Some(1),
            "no link"
        );
        assert_eq!(shown["isError"], true);

        // A result held whole in memory passes as it came.
        let shown = Session::shown(
            result(ToolOutput::text(text.clone())),
            Projection::Full,
            &handle,
            stored,
            true,
            1 << 20,
        );
        let Ok(Answer::Result(shown)) = shown else {
            panic!("not answered with a result");
        };
        assert_eq!(shown["content"][0]["text"], text);
        assert_eq!(shown["content"].as_array().map(Vec::len), Some(1));
    }

    #[test]
    fn a_list_cursor_is_refused_as_invalid_params() {
        assert!(no_cursor(None).is_ok());
        assert!(no_cursor(Some(&PaginatedRequestParams::default())).is_ok());
        let request = PaginatedRequestParams::default().with_cursor(Some("é".repeat(100)));
        let error = no_cursor(Some(&request)).unwrap_err();
        assert_eq!(error.code, rmcp::model::ErrorCode::INVALID_PARAMS);
        assert!(error.message.len() < 300, "{}", error.message);
    }

    #[test]
    fn an_icon_theme_outside_the_mcp_names_is_not_sent_and_the_listing_types() {
        let mut tool: ToolDefinition = serde_json::from_value(json!({
            "name": "draw", "inputSchema": {"type": "object"},
            "icons": [
                {"src": "a.png", "theme": "auto"},
                {"src": "b.png", "theme": "dark"},
                {"src": "c.png"}
            ]
        }))
        .unwrap();
        let listing = json!({ "tools": [tool.clone()] });
        assert!(serde_json::from_value::<ListToolsResult>(listing).is_err());
        sendable_icons(&mut tool);
        let themes: Vec<Option<&str>> = tool
            .icons
            .iter()
            .flatten()
            .map(|icon| icon.theme.as_deref())
            .collect();
        assert_eq!(themes, [None, Some("dark"), None]);
        let listing = json!({ "tools": [tool] });
        let typed: ListToolsResult = serde_json::from_value(listing).unwrap();
        assert_eq!(typed.tools[0].icons.as_ref().map(Vec::len), Some(3));
    }

    /// rmcp's 500 for a session that could not open becomes the gateway's 503 saying why
    /// (with `Retry-After` when the sessions are full, not when shutting down): a JSON-RPC
    /// error with the request's id when its body was read whole, else plain text; any other
    /// answer, and a 500 for anything else, passes as rmcp gave it.
    #[tokio::test]
    async fn a_session_that_could_not_open_is_answered_503() {
        use http_body_util::BodyExt;
        let answer = |status| http_answer(status, "text/plain", "rmcp's".to_owned());
        let failed = |why: SessionRefused| async move {
            let _ = REFUSED.try_with(|refused| *refused.borrow_mut() = Some(why));
            answer(hyper::StatusCode::INTERNAL_SERVER_ERROR)
        };
        let head = |body: &[u8]| {
            Mutex::new(admit::Seen {
                head: body.to_vec(),
                ..admit::Seen::default()
            })
        };
        let nothing = head(b"");
        let text = async |response: hyper::Response<raw::HttpBody>| {
            String::from_utf8(
                response
                    .into_body()
                    .collect()
                    .await
                    .unwrap()
                    .to_bytes()
                    .to_vec(),
            )
            .unwrap()
        };
        // Without a request's id: plain text.
        let full = refusing(failed(SessionRefused::Full { max: 2 }), &nothing, None).await;
        assert_eq!(full.status(), hyper::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(full.headers()[hyper::header::RETRY_AFTER], "1");
        assert_eq!(full.headers()[hyper::header::CONTENT_TYPE], "text/plain");
        let body = text(full).await;
        assert!(
            body.starts_with("Service Unavailable: the gateway: 2 sessions are open"),
            "{body}"
        );
        // A request read whole: its id, in a JSON-RPC error.
        let call = head(br#"{"jsonrpc":"2.0","id":"c-7","method":"tools/call","params":{}}"#);
        let full = refusing(failed(SessionRefused::Full { max: 1 }), &call, None).await;
        assert_eq!(full.status(), hyper::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            full.headers()[hyper::header::CONTENT_TYPE],
            "application/json"
        );
        let body: Value = serde_json::from_str(&text(full).await).unwrap();
        assert_eq!(body["id"], "c-7");
        assert_eq!(body["error"]["code"], -32000);
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("the gateway: 1 session is open, the most it allows"),
            "{body}"
        );
        // An identity at its own bound: the same answer, naming that bound.
        let full = refusing(failed(SessionRefused::IdentityFull { max: 3 }), &call, None).await;
        assert_eq!(full.status(), hyper::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(full.headers()[hyper::header::RETRY_AFTER], "1");
        let body: Value = serde_json::from_str(&text(full).await).unwrap();
        assert_eq!(body["error"]["data"]["maxSessionsPerIdentity"], 3, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("the gateway: this identity has 3 sessions open"),
            "{body}"
        );
        // An identity at its fair share while others wait: the same, naming the share.
        let share = refusing(
            failed(SessionRefused::IdentityShare { held: 2, fair: 2 }),
            &call,
            None,
        )
        .await;
        assert_eq!(share.status(), hyper::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(share.headers()[hyper::header::RETRY_AFTER], "1");
        let body: Value = serde_json::from_str(&text(share).await).unwrap();
        assert_eq!(body["error"]["data"]["fairShare"], 2, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("the gateway: this identity has 2 sessions open, its fair share"),
            "{body}"
        );
        // Not whole, not a request, or a null id: plain text.
        let mut long = br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"a":""#.to_vec();
        long.resize(admit::HEAD + 1, b'x');
        let notification = br#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#;
        let null = br#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#;
        for other in [&long[..], notification, null] {
            let answered = refusing(failed(SessionRefused::Closing), &head(other), None).await;
            assert_eq!(
                answered.headers()[hyper::header::CONTENT_TYPE],
                "text/plain"
            );
        }
        let closing = refusing(failed(SessionRefused::Closing), &nothing, None).await;
        assert_eq!(closing.status(), hyper::StatusCode::SERVICE_UNAVAILABLE);
        assert!(!closing.headers().contains_key(hyper::header::RETRY_AFTER));
        let other = refusing(
            async { answer(hyper::StatusCode::INTERNAL_SERVER_ERROR) },
            &call,
            None,
        )
        .await;
        assert_eq!(other.status(), hyper::StatusCode::INTERNAL_SERVER_ERROR);
        // A body refused past the structural bound: 413, with the error for its id when
        // its head shows one (cut short included), else as plain text.
        let complex = |body: &[u8]| {
            Mutex::new(admit::Seen {
                head: body.to_vec(),
                refused: Some(admit::Unread::TooComplex),
            })
        };
        let failed_read = async || answer(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        let refused = refusing(failed_read(), &complex(&long), None).await;
        assert_eq!(refused.status(), hyper::StatusCode::PAYLOAD_TOO_LARGE);
        let body: Value = serde_json::from_str(&text(refused).await).unwrap();
        assert_eq!(body["id"], 1, "{body}");
        assert_eq!(body["error"]["code"], -32600, "{body}");
        assert_eq!(body["error"]["message"], stdio::TOO_COMPLEX, "{body}");
        // A notification, or an answer (its id is the gateway's own request's): plain.
        let answer_head = br#"{"jsonrpc":"2.0","id":3,"result":{"a":[0,0"#;
        for head in [&notification[..], &answer_head[..]] {
            let refused = refusing(failed_read(), &complex(head), None).await;
            assert_eq!(refused.status(), hyper::StatusCode::PAYLOAD_TOO_LARGE);
            assert_eq!(refused.headers()[hyper::header::CONTENT_TYPE], "text/plain");
        }
        let served = refusing(async { answer(hyper::StatusCode::OK) }, &call, None).await;
        assert_eq!(served.status(), hyper::StatusCode::OK);
        let noted_but_served = refusing(
            async {
                let _ = REFUSED
                    .try_with(|refused| *refused.borrow_mut() = Some(SessionRefused::Closing));
                answer(hyper::StatusCode::NOT_FOUND)
            },
            &call,
            None,
        )
        .await;
        assert_eq!(noted_but_served.status(), hyper::StatusCode::NOT_FOUND);
        // A body refused past 4 MiB: 413 the same way, saying so.
        let large = Mutex::new(admit::Seen {
            head: long.clone(),
            refused: Some(admit::Unread::TooLarge),
        });
        let refused = refusing(failed_read(), &large, None).await;
        assert_eq!(refused.status(), hyper::StatusCode::PAYLOAD_TOO_LARGE);
        let body: Value = serde_json::from_str(&text(refused).await).unwrap();
        assert_eq!(body["id"], 1, "{body}");
        assert_eq!(body["error"]["code"], -32600, "{body}");
        assert_eq!(body["error"]["message"], TOO_LARGE, "{body}");
        assert_eq!(
            body["error"]["data"]["maxBodyBytes"],
            admit::BODY_BYTES,
            "{body}"
        );
        assert!(TOO_LARGE.contains(&format!("over {} bytes", admit::BODY_BYTES)));
    }

    /// A handler that panics (a bug: none does on input) is answered with an internal
    /// error rather than never, after it has been pending, and one that does not is
    /// answered as it answers.
    #[tokio::test]
    async fn a_handler_that_panics_is_answered_with_an_internal_error() {
        let panicked: Result<(), ErrorData> = answered("tools/call", async {
            tokio::task::yield_now().await;
            panic!("a bug");
        })
        .await;
        let error = panicked.unwrap_err();
        assert_eq!(error.code, ErrorCode::INTERNAL_ERROR);
        assert_eq!(
            error.message,
            "the gateway failed to answer tools/call: a bug (a panic, on its stderr)"
        );
        let answer = answered("tools/list", async {
            tokio::task::yield_now().await;
            Ok::<_, ErrorData>(7)
        })
        .await;
        assert_eq!(answer.unwrap(), 7);
    }

    #[test]
    fn only_requests_the_client_declared_go_to_it() {
        let object = |value: Value| value.as_object().cloned().unwrap();
        let declared = object(json!({"elicitation": {"form": {}}}));
        let asks = |requests: Value| object(json!({"inputRequests": requests}));
        let elicit = json!({"method": "elicitation/create", "params": {"message": "ok?"}});
        let sample = json!({"method": "sampling/createMessage", "params": {}});
        assert_eq!(
            undeclared_request(&asks(json!({"a": elicit})), Some(&declared)),
            None
        );
        assert_eq!(
            undeclared_request(&object(json!({"requestState": "s"})), None),
            None
        );
        assert_eq!(
            undeclared_request(&asks(json!({"a": elicit, "b": sample})), Some(&declared)),
            Some("\"b\": sampling/createMessage, which needs sampling".to_owned())
        );
        assert_eq!(
            undeclared_request(&asks(json!({"a": elicit})), None),
            Some("\"a\": elicitation/create, which needs elicitation".to_owned())
        );
        assert!(
            undeclared_request(
                &asks(json!({"a": {"method": "tools/call"}})),
                Some(&declared)
            )
            .is_some_and(|why| why.contains("not a request a server may send"))
        );
        assert!(undeclared_request(&asks(json!([elicit])), Some(&declared)).is_some());
    }
    use psych_disclosure::resolve;
    use std::path::Path;

    fn config(text: &str) -> McpConfig {
        McpConfig::parse(text, |_| None).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A gateway's shared state with no upstream server, its session logs under `logs`.
    fn shared_without_servers(logs: PathBuf) -> Arc<Shared> {
        let manager = McpManager::builder(config(r#"{"mcpServers": {}}"#))
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let catalog = Catalog::in_memory().unwrap_or_else(|e| panic!("{e}"));
        let basis = Arc::new(Basis {
            catalog,
            connections: Vec::new(),
            grant: PermissionGrant::none(),
            settings: disclosure_settings(DEFAULT_AUTO_BUDGET).unwrap_or_else(|e| panic!("{e}")),
            limits: Limits::default(),
            surfaces: Mutex::new(SurfaceCache::new(Arc::new(Estimator::new()))),
        });
        let (_, resolved) = watch::channel(None);
        let lane = Arc::new(Lane {
            changes: basis.catalog.changes(),
            basis,
            resolved,
        });
        Arc::new(Shared {
            manager,
            lane,
            narrowed: BTreeMap::new(),
            limits: Limits::default(),
            passing: PassingBudget::new(DEFAULT_PASSING_BUDGET),
            passing_share: DEFAULT_PASSING_BUDGET,
            elider: Elider::builder()
                .estimator(Arc::new(Estimator::new()) as SharedEstimator)
                .build(),
            logs,
            stores: None,
            retention: Retention::default(),
            tenants: Mutex::default(),
            default_identity: "stdio",
            tokens: None,
            state: watch::Sender::new(Gauge::default()),
            max_sessions: None,
            max_identity_sessions: 1,
            raw: Arc::default(),
            sealer: mrtr::Sealer::new().unwrap_or_else(|e| panic!("{e}")),
            on_demand: None,
            input_ended: watch::Sender::new(false),
        })
    }

    /// A first caller dropped while an identity's log opens (a client cancelling its first
    /// call at once) leaves the opening to the next caller, which gets the log. (Before,
    /// the next caller started a second opening of the same file while the first still
    /// held its lock, and failed with "the session's record log: … locked" in most rounds.)
    #[test]
    fn a_caller_dropped_while_the_log_opens_leaves_it_to_the_next() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let shared = shared_without_servers(dir.path().join("serve"));
        runtime.block_on(async {
            for round in 0..100 {
                // A new identity each round: its log is opened by the first call.
                let tenant = shared.tenant(&format!("round-{round}"));
                // Polled once (the opening starts), then dropped (unless the log opened
                // within that one poll, which the opening task on another worker may do).
                let _ = tokio::time::timeout(Duration::ZERO, tenant.executor(&shared)).await;
                let second = tenant.executor(&shared).await;
                assert!(second.is_ok(), "round {round}: {:?}", second.err());
            }
        });
    }

    /// An open session stays its identity's however many others are made and closed; a
    /// closed one is nobody's at once, and leaves nothing behind; an owner recorded after
    /// its session closed is not kept. (Before, past 256 sessions made the oldest open
    /// ones were forgotten and answered 404.)
    #[test]
    fn an_open_session_stays_its_owners_and_a_closed_one_is_nobodys() {
        let owners = Owners::default();
        owners.opened("kept");
        owners.record("kept", "alice".into());
        for n in 0..4 * MAX_SESSIONS + 10 {
            let session = format!("s{n}");
            owners.opened(&session);
            owners.record(&session, format!("id{}", n % 2));
            owners.closed(&session);
        }
        assert!(owners.owned_by("kept", "alice"));
        assert!(!owners.owned_by("kept", "bob"), "another identity's");
        assert!(!owners.owned_by("s0", "id0"), "closed: nobody's");
        assert!(!owners.owned_by("never", "id0"));
        assert_eq!(owners.lock().len(), 1, "the closed ones leave nothing");
        owners.closed("kept");
        assert!(!owners.owned_by("kept", "alice"));
        // Closed between its creation and its `initialize` answer: not recorded.
        owners.opened("short");
        owners.closed("short");
        owners.record("short", "alice".into());
        assert!(!owners.owned_by("short", "alice"));
        assert!(owners.lock().is_empty());
    }

    /// An identity holds at most [`MAX_LISTENS`] listen streams; a closed one frees its
    /// place.
    #[test]
    fn an_identity_holds_at_most_max_listens_streams() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let shared = shared_without_servers(dir.path().join("serve"));
        let tenant = shared.tenant("alice");
        let held: Vec<Counted> = (0..MAX_LISTENS)
            .map(|_| tenant.listening().unwrap_or_else(|| panic!("a free place")))
            .collect();
        assert!(tenant.listening().is_none(), "one more is refused");
        assert!(shared.tenant("bob").listening().is_some(), "per identity");
        drop(held);
        assert!(tenant.listening().is_some());
    }

    /// Identities share the sessions fairly only while one waits: alone or beside
    /// identities that want no more, one uses every slot its cap allows; once another is
    /// refused for want of room, one at its fair share (the cap over the identities active
    /// now) takes no more, and the slot it gives back goes to the one waiting.
    #[test]
    fn a_slot_given_back_goes_to_the_identity_waiting_for_its_share() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut shared = shared_without_servers(dir.path().join("serve"));
        {
            let shared = Arc::get_mut(&mut shared).unwrap_or_else(|| panic!("not shared yet"));
            shared.max_sessions = Some(6);
            shared.max_identity_sessions = 4;
        }
        let open = |name: &str| {
            PRESENTED.sync_scope(Some(name.to_owned()), || Session::open(Arc::clone(&shared)))
        };
        let mut alice: Vec<Session> = (0..3)
            .map(|_| open("alice").unwrap_or_else(|e| panic!("{e}")))
            .collect();
        let bob = open("bob").unwrap_or_else(|e| panic!("{e}"));
        // Past her fair share (6 over 2 identities), with no one waiting: a free slot.
        alice.push(open("alice").unwrap_or_else(|e| panic!("{e}")));
        assert!(matches!(
            open("alice"),
            Err(SessionRefused::IdentityFull { max: 4 })
        ));
        let carol = open("carol").unwrap_or_else(|e| panic!("{e}"));
        // Full: bob is refused, and waits.
        assert!(matches!(open("bob"), Err(SessionRefused::Full { max: 6 })));
        drop(alice.pop());
        // Alice (3) is over her share (6 over 3 identities is 2) and the free slot is
        // owed to bob (1 of his 2).
        assert!(matches!(
            open("alice"),
            Err(SessionRefused::IdentityShare { held: 3, fair: 2 })
        ));
        let bob_again = open("bob").unwrap_or_else(|e| panic!("{e}"));
        // Carol, below her share, takes the next slot given back.
        drop(alice.pop());
        let carol_again = open("carol").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(shared.state.borrow().sessions, 6);
        drop((alice, bob, bob_again, carol, carol_again));
        assert_eq!(shared.state.borrow().sessions, 0);
    }

    /// A session opened for a request presenting an identity counts against it (at most
    /// `max_identity_sessions`, 1 here) and is bound to it at once; one without an identity
    /// (no tokens) counts against no one; a closed one frees its place; a closing gateway
    /// refuses every identity as closing.
    #[test]
    fn an_identity_holds_at_most_its_sessions_and_each_is_bound_at_open() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let shared = shared_without_servers(dir.path().join("serve"));
        let open = |name: &str| {
            PRESENTED.sync_scope(Some(name.to_owned()), || Session::open(Arc::clone(&shared)))
        };
        let bound = |session: &Session| {
            let tenant = session
                .tenant
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            tenant.as_ref().map(|(name, _)| name.clone())
        };
        let alice = open("alice").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bound(&alice).as_deref(), Some("alice"));
        assert!(matches!(
            open("alice"),
            Err(SessionRefused::IdentityFull { max: 1 })
        ));
        let bob = open("bob").unwrap_or_else(|e| panic!("{e}"));
        let anyone = Session::open(Arc::clone(&shared)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            bound(&anyone),
            None,
            "bound by its first request, as before"
        );
        drop(alice);
        let again = open("alice").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(shared.state.borrow().sessions, 3);
        // Closing, the gateway says so, to an identity at its bound too (not "retry").
        shared.close(Cut::Shutdown);
        assert!(matches!(open("alice"), Err(SessionRefused::Closing)));
        assert!(matches!(open("carol"), Err(SessionRefused::Closing)));
        drop((again, bob, anyone));
        assert_eq!(shared.state.borrow().sessions, 0);
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
        let settings = disclosure_settings(DEFAULT_AUTO_BUDGET).unwrap_or_else(|e| panic!("{e}"));
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
