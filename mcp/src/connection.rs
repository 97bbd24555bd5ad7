//! One live session with one server: connect (stdio child or streamable HTTP), list every
//! page raw, call a tool, notice the connection is lost, close.
//!
//! Every request carries a deadline from [`Timeouts`]; every failure becomes an
//! [`McpError`] naming the server, the call and the reason.
//!
//! # Revisions
//!
//! A session starts with rmcp's `Auto` lifecycle ([`lifecycle`]): `server/discover` asking
//! for MCP 2026-07-28 first, and when the server answers it with an error (a JSON-RPC error,
//! or over HTTP a 4xx: every server from before 2026-07-28), `initialize` at 2025-11-25 on
//! the same connection. Against such a server that is one more round trip at connect, and
//! nothing logged; a server that never answers `server/discover` costs rmcp's 10 s probe
//! deadline before `initialize` (within [`Timeouts::connect`]).
//!
//! A server of 2026-07-28 sends `list_changed` only on a `subscriptions/listen` stream: the
//! session opens one before its first listing (so no change falls between the two) and
//! keeps it open ([`listen`]), reopened with a bounded backoff when it ends, each reopening
//! announced as [`ChangeCause::Resubscribed`] so the catalogue lists again what changed
//! while it was down.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use psych_types::{InputRound, ProgressSink, ServerId};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotification, CancelledNotificationParam,
    ClientCapabilities, ClientConfig, ClientNotification, ClientRequest, CustomRequest, ErrorCode,
    Implementation, ProtocolVersion, RequestId, RequestMetaObject, ServerNotification,
    ServerResult, SubscriptionFilter,
};
use rmcp::service::{
    ClientInitializeError, ClientLifecycleMode, ClientServiceExt, NotificationContext, Peer,
    PeerRequestOptions, RunningService, ServiceError, Subscription,
};
use rmcp::{ClientHandler, RoleClient};
use serde_json::Value;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::budget::SpillBudget;
use crate::ending::{Ended, Ending, answered};
use crate::events::{ChangeCause, EventQueue, McpEvent};
use crate::listing::{Listing, ListingBound, MAX_CURSOR_BYTES, MAX_LISTING_PAGES, read_page};
use crate::remote;
use crate::stdio::{self, Child};
use crate::tap::{AnswerFailure, Kept, Tap};
use crate::{McpError, Timeouts, Transport};

/// The protocol version psych-mcp asks for in `initialize`, with a server that does not
/// speak 2026-07-28 (rmcp 3.11's default would be 2026-07-28 itself).
pub(crate) const PROTOCOL_VERSION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// The revision without `initialize` that psych-mcp asks for first, with `server/discover`.
pub(crate) const MODERN_VERSION: ProtocolVersion = ProtocolVersion::V_2026_07_28;

/// The request `_meta` key of the client capabilities a request of MCP 2026-07-28 declares.
const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// How a session starts: `server/discover` for [`MODERN_VERSION`], falling back to
/// `initialize` at [`PROTOCOL_VERSION`] when the server does not know it.
pub(crate) fn lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto {
        preferred_versions: vec![MODERN_VERSION],
        legacy_version: Some(PROTOCOL_VERSION),
    }
}

/// The first wait before a `subscriptions/listen` stream that ended or failed is opened
/// again; it doubles up to [`LISTEN_RETRY_MAX`], and starts over after a stream that
/// stayed open that long.
const LISTEN_RETRY_FIRST: Duration = Duration::from_millis(100);

/// The longest wait between two attempts to open a `subscriptions/listen` stream.
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(5);

/// How long to wait for a process that lost its connection to report its exit status.
const EXIT_REPORT_WAIT: Duration = Duration::from_millis(500);

/// The most times one listing is walked again because the server announced a change of
/// its tools while it was walked ([`Session::list`]): 2. A server that changes its tools
/// faster than it can be listed is listed as its last walk found it; the notifications
/// are its caller's to act on, as any.
const MAX_REWALKS: usize = 2;

/// rmcp's client handler: forwards `notifications/tools/list_changed`. (Progress is
/// delivered by our transports through the [`Tap`], in the order read: rmcp runs this
/// handler's notifications as tasks that a call's response can overtake.)
#[derive(Clone)]
pub(crate) struct Handler {
    server: ServerId,
    events: Arc<EventQueue>,
}

impl ClientHandler for Handler {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        self.events.push(McpEvent::ToolsChanged {
            server: self.server.clone(),
            cause: ChangeCause::Notified,
        });
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("psych", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(PROTOCOL_VERSION)
    }
}

/// A connected server.
pub(crate) struct Session {
    server: ServerId,
    timeouts: Timeouts,
    /// The most JSON a listing may hold ([`DEFAULT_MAX_LISTING_BYTES`](crate::DEFAULT_MAX_LISTING_BYTES)).
    max_listing_bytes: u64,
    peer: Peer<RoleClient>,
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, Handler>>>,
    child: Option<Child>,
    /// Sees every message of the transport: keeps raw results, routes progress, counts
    /// tools changes.
    tap: Arc<Tap>,
    /// Whether rmcp's serve loop is over: the server's output ended (the loop ends with
    /// it), or rmcp has begun to close the transport, or dropped it. A request still
    /// waiting then is answered by nothing. Said before rmcp's request queue closes
    /// (`is_transport_closed`), which comes only after the close, and a close may wait:
    /// up to 5 s before it for answers to the server's own requests, and a stdio server's
    /// stdin is closed only once a send blocked on it gives it up. (A loop psych cancels,
    /// closing the session, says so only as the close begins, after a drain of up to 2 s.)
    ended: Ended,
    /// Why the session is lost, once a request found it gone (shared with a probe's task).
    lost: Arc<Lost>,
    /// The `subscriptions/listen` task of a server of 2026-07-28 (none for an earlier one):
    /// aborted on close and when the session is dropped.
    listener: Mutex<Option<AbortOnDrop>>,
}

/// Why a session is lost, once known, and the signal that it now is.
#[derive(Debug, Default)]
struct Lost {
    reason: Mutex<Option<String>>,
    signal: Notify,
}

impl Lost {
    /// Marks the session lost for `reason` (the first reason given stands).
    fn mark(&self, reason: &str) {
        let mut lost = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if lost.is_none() {
            *lost = Some(reason.to_owned());
        }
        drop(lost);
        // Every waiter: a session's loss may be awaited in more than one place at once
        // (its supervisor, a lazy request that found it lost at its start).
        self.signal.notify_waiters();
    }

    /// The reason, once the session is lost.
    fn reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Resolves once `stop` says true; never if its sender is gone first (nothing can stop the
/// attempt then: a supervisor holds its slot, and so the sender, while it connects).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    if stop.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// A task aborted when this is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Session {
    /// Starts or reaches the server, completes `server/discover` or `initialize` (see
    /// [`lifecycle`]) and lists its tools once (always: a `list_changed` sent before the
    /// initialize response is dropped by rmcp, so the notification alone can never be
    /// trusted to announce the first tools); with a server of 2026-07-28, its
    /// `subscriptions/listen` stream is opened just before that listing.
    ///
    /// Once `stop` says true (the server removed or replaced, the manager shut down) the
    /// attempt ends with [`McpError::ShutDown`], a stdio server started for it stopped as
    /// [`Session::close`] stops one (SIGTERM, its grace, then SIGKILL) rather than killed
    /// where this future is dropped (which blocks the thread for a look through `/proc`).
    pub(crate) async fn connect(
        server: &ServerId,
        transport: &Transport,
        (timeouts, max_listing_bytes): (Timeouts, u64),
        events: Arc<EventQueue>,
        (spill_dir, budget): (&Path, &SpillBudget),
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<(Arc<Self>, Listing), McpError> {
        let handler = Handler {
            server: server.clone(),
            events: Arc::clone(&events),
        };
        let (service, child, tap, ended) = match transport {
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let spec = stdio::Command {
                    command,
                    args,
                    env,
                    cwd: cwd.as_ref(),
                    spill_dir,
                    budget,
                };
                // A slot stopped before the attempt began starts no process.
                if *stop.borrow() {
                    return Err(McpError::ShutDown);
                }
                let (child, transport) = Child::spawn(server, &spec)?;
                let tap = transport.tap();
                let (transport, ended) = Ending::new(transport);
                let served = tokio::select! {
                    served = tokio::time::timeout(
                        timeouts.connect,
                        handler.serve_with_lifecycle(transport, lifecycle()),
                    ) => served,
                    () = stopped(&mut stop) => {
                        child.terminate(timeouts.shutdown_grace).await;
                        return Err(McpError::ShutDown);
                    }
                };
                match served {
                    Ok(Ok(service)) => (service, Some(child), tap, ended),
                    Ok(Err(error)) => {
                        let error = init_error(server, error, Some(&child)).await;
                        child.terminate(timeouts.shutdown_grace).await;
                        return Err(error);
                    }
                    Err(_) => {
                        let stderr = child.diagnostics();
                        child.terminate(timeouts.shutdown_grace).await;
                        return Err(McpError::Timeout {
                            server: server.clone(),
                            call: "initialize".into(),
                            after: timeouts.connect,
                            stderr,
                        });
                    }
                }
            }
            Transport::Http { url, headers } => {
                let tap = Arc::new(Tap::new(spill_dir.to_path_buf(), budget.clone()));
                let client = remote::shared_client(server).await?;
                let transport = remote::transport(server, url, headers, client, Arc::clone(&tap))?;
                // The server's own requests are bounded as a stdio server's are.
                let transport = crate::server_requests::Counted::new(transport);
                let (transport, ended) = Ending::new(transport);
                let served = tokio::select! {
                    served = tokio::time::timeout(
                        timeouts.connect,
                        handler.serve_with_lifecycle(transport, lifecycle()),
                    ) => served,
                    () = stopped(&mut stop) => return Err(McpError::ShutDown),
                };
                match served {
                    Ok(Ok(service)) => (service, None, tap, ended),
                    Ok(Err(error)) => return Err(init_error(server, error, None).await),
                    Err(_) => {
                        return Err(McpError::Timeout {
                            server: server.clone(),
                            call: "initialize".into(),
                            after: timeouts.connect,
                            stderr: String::new(),
                        });
                    }
                }
            }
        };
        let session = Arc::new(Self {
            server: server.clone(),
            timeouts,
            max_listing_bytes,
            peer: service.peer().clone(),
            service: tokio::sync::Mutex::new(Some(service)),
            child,
            tap,
            ended,
            lost: Arc::default(),
            listener: Mutex::new(None),
        });
        // With a server of 2026-07-28, the listen stream is opened before the first
        // listing, so that no change falls between the two: one made before the stream is
        // acknowledged is in the listing, one made after it is notified. A stream that
        // cannot be opened does not fail the connection: the task keeps trying.
        // Only a server that says it sends `tools/list_changed` is listened to: one that
        // does not would refuse every stream, or accept and never send.
        let first_listing = async {
            let first = if session.is_modern() && session.announces_tool_changes() {
                match open_listen(&session.peer, timeouts.page).await {
                    Listen::Open(subscription) => Some(Some(*subscription)),
                    Listen::Retry => Some(None),
                    Listen::Refused => None,
                }
            } else {
                None
            };
            (first, session.list().await)
        };
        let (first, listed) = tokio::select! {
            done = first_listing => done,
            () = stopped(&mut stop) => {
                session.close().await;
                return Err(McpError::ShutDown);
            }
        };
        match listed {
            Ok(listing) => {
                if let Some(first) = first {
                    let task = tokio::spawn(listen(
                        session.peer.clone(),
                        session.ended.clone(),
                        server.clone(),
                        events,
                        first,
                        timeouts.page,
                    ));
                    *session
                        .listener
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = Some(AbortOnDrop(task));
                }
                Ok((session, listing))
            }
            Err(error) => {
                session.close().await;
                Err(error)
            }
        }
    }

    /// The revision agreed with the server: 2026-07-28 through `server/discover`, or the
    /// one its `initialize` answer named.
    pub(crate) fn protocol_version(&self) -> Option<ProtocolVersion> {
        self.peer
            .peer_info()
            .map(|info| info.protocol_version.clone())
    }

    /// Whether the server speaks a revision without `initialize` (2026-07-28), whose
    /// `list_changed` comes only on a `subscriptions/listen` stream.
    fn is_modern(&self) -> bool {
        self.protocol_version()
            .is_some_and(|version| !version.has_initialize())
    }

    /// Whether the server's capabilities say it sends `tools/list_changed`.
    fn announces_tool_changes(&self) -> bool {
        self.peer.peer_info().and_then(|info| {
            info.capabilities
                .tools
                .as_ref()
                .and_then(|t| t.list_changed)
        }) == Some(true)
    }

    /// The process group of a stdio server.
    pub(crate) fn pgid(&self) -> Option<i32> {
        self.child.as_ref().and_then(Child::pgid)
    }

    /// Every tool of the server, page by page to the end, each page and the whole under
    /// their deadlines, the whole within the listing's bounds (its bytes, at most
    /// [`MAX_LISTING_PAGES`] pages, cursors of at most [`MAX_CURSOR_BYTES`]); malformed
    /// tools are set aside by name.
    ///
    /// A listing of several pages during which the server announced a change of its tools
    /// (a `notifications/tools/list_changed` read between its first request and its last
    /// answer) is walked again, at most [`MAX_REWALKS`] times: its pages may come from two
    /// catalogues, and a server whose cursor is an offset skips or repeats a tool there
    /// (one it did not change). A listing of one page is one answer, never walked again.
    ///
    /// Over stdio every change announced before a page is answered is seen: the transport
    /// reads the notification, and counts it, before the page. Over HTTP the notification
    /// comes on another stream than the page (the session's GET stream, or a 2026-07-28
    /// `subscriptions/listen` stream), read at its own pace, so one may be seen only
    /// after the walk it concerns: the walk is then kept, and the notification is the
    /// caller's to list again for, as without this.
    ///
    /// The walks again all end within half the listing deadline, counted from the first
    /// walk's start (one is cut there), so that a walk again never makes a listing outlast
    /// a caller's own wait on a slow server; one starts only when it can end in time at
    /// the pace of the walk before it. A walk again that fails (cut, an error, a bound
    /// passed) returns the walk before it, as the listing without it would have; while it
    /// runs that walk is held too, so a listing holds at most twice the listing bound.
    pub(crate) async fn list(&self) -> Result<Listing, McpError> {
        let started = tokio::time::Instant::now();
        let mut changes = self.tap.tool_changes();
        let (mut listing, pages) = self.walk(started, self.timeouts.listing).await?;
        if pages == 1 {
            return Ok(listing);
        }
        let again_within = self.timeouts.listing / 2;
        let mut walked = started.elapsed();
        for _ in 0..MAX_REWALKS {
            let now = self.tap.tool_changes();
            let spent = started.elapsed();
            if now == changes || spent.saturating_add(walked) > again_within {
                break;
            }
            changes = now;
            match self.walk(started, again_within).await {
                Ok((again, _)) => listing = again,
                Err(_) => break,
            }
            walked = started.elapsed().saturating_sub(spent);
        }
        Ok(listing)
    }

    /// One walk of [`Session::list`] (a page of more than [`TOOLS_ON_WORKER`] tools, or of
    /// over a MiB of JSON, read on a blocking thread), ending by `within` from `started` (else
    /// [`McpError::Timeout`] naming that time): the listing and how many pages it took.
    async fn walk(
        &self,
        started: tokio::time::Instant,
        within: Duration,
    ) -> Result<(Listing, usize), McpError> {
        let mut listing = Listing::default();
        let mut names = HashSet::new();
        let mut cursors = HashSet::new();
        let mut cursor: Option<String> = None;
        let mut bytes = 0u64;
        let mut page = 0usize;
        loop {
            page += 1;
            let call = format!("tools/list page {page}");
            let left = within.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(McpError::Timeout {
                    server: self.server.clone(),
                    call: "tools/list".into(),
                    after: within,
                    stderr: self.diagnostics(),
                });
            }
            let deadline = self.timeouts.page.min(left);
            let params = cursor
                .take()
                .map(|cursor| serde_json::json!({ "cursor": cursor }));
            let request = ClientRequest::CustomRequest(CustomRequest::new("tools/list", params));
            let handle = match self
                .peer
                .send_request_with_option(request, PeerRequestOptions::with_timeout(deadline))
                .await
            {
                Ok(handle) => handle,
                Err(error) => return Err(self.fault(&call, error).await),
            };
            let claim = self.tap.claim(handle.id.clone());
            // A listing dropped while it waits (its caller's own deadline, a freshener
            // shutting down) tells the server, as a dropped call does, rather than leaving
            // it working and rmcp holding the request until it answers. Disarmed once the
            // page has its outcome (rmcp cancels a page past its own deadline itself).
            let mut guard = CancelOnDrop {
                peer: Some(self.peer.clone()),
                ended: self.ended.clone(),
                id: handle.id.clone(),
                reason: "listing abandoned by the caller",
            };
            let result = answered(handle.await_response(), self.ended.clone()).await;
            guard.peer = None;
            let raw = match claim.take() {
                // An answer came that the transport could not deliver (over its memory
                // cap, or unreadable): rmcp's error for it is a stand-in.
                Some(Err(failure)) => return Err(failure.into_error(&self.server, &call)),
                // (A listing has no text blocks to keep in files.)
                Some(Ok(raw)) => Some(raw.value),
                None => None,
            };
            let result = match result {
                Ok(result) => result,
                Err(error) => return Err(self.fault(&call, error).await),
            };
            let raw = match raw {
                Some(raw) => raw,
                // Not seen by the tap (no transport of ours lets an answer by since HTTP
                // JSON bodies go through it too): rmcp's typed page, re-serialized, or raw
                // if rmcp could not type it.
                None => match result {
                    ServerResult::CustomResult(custom) => custom.0,
                    other => serde_json::to_value(other).unwrap_or(Value::Null),
                },
            };
            let left = self.max_listing_bytes.saturating_sub(bytes);
            // Typing and checking each tool of a large page (a REST API's 1,223 tools, 2 MB)
            // takes milliseconds: on a blocking thread, the walk's state with it. (Dropped
            // while it runs, the walk loses only its own listing.)
            let large = raw
                .get("tools")
                .and_then(Value::as_array)
                .is_some_and(|tools| tools.len() > TOOLS_ON_WORKER)
                || crate::wire::value_past_worker_bound(&raw);
            let (mut moved_names, mut moved) =
                (std::mem::take(&mut names), std::mem::take(&mut listing));
            let (read, moved_names, moved) = crate::wire::off_worker_if(large, move || {
                let read = read_page(raw, page, &mut moved_names, &mut moved, left);
                (read, moved_names, moved)
            })
            .await
            .map_err(|source| McpError::Task {
                server: self.server.clone(),
                call: call.clone(),
                source,
            })?;
            (names, listing) = (moved_names, moved);
            let read = read.map_err(|message| McpError::Protocol {
                server: self.server.clone(),
                call: call.clone(),
                message,
            })?;
            bytes = bytes.saturating_add(read.bytes);
            let over = |bound| McpError::ListingTooLarge {
                server: self.server.clone(),
                page,
                bound,
            };
            if bytes > self.max_listing_bytes {
                return Err(over(ListingBound::Bytes {
                    bytes,
                    limit: self.max_listing_bytes,
                }));
            }
            match read.next_cursor {
                None => return Ok((listing, page)),
                Some(next) if next.len() > MAX_CURSOR_BYTES => {
                    return Err(over(ListingBound::Cursor {
                        bytes: next.len(),
                        limit: MAX_CURSOR_BYTES,
                    }));
                }
                Some(_) if page >= MAX_LISTING_PAGES => {
                    return Err(over(ListingBound::Pages {
                        limit: MAX_LISTING_PAGES,
                    }));
                }
                Some(next) => {
                    if !cursors.insert(next.clone()) {
                        return Err(McpError::RepeatedCursor {
                            server: self.server.clone(),
                            page,
                            cursor: next,
                        });
                    }
                    cursor = Some(next);
                }
            }
        }
    }

    /// Calls a tool with a deadline; when it passes, or when the returned future is dropped
    /// first, `notifications/cancelled` goes to the server. With `progress`, the call
    /// carries a progress token and the server's progress for it goes to that sink. The
    /// result's text blocks too large to hold in memory come in files, with it.
    ///
    /// `round` is MCP 2026-07-28's retry (`inputResponses` and `requestState` in the
    /// params, the state byte for byte) and the client capabilities the call declares in
    /// its `_meta` (a server of 2026-07-28 only: an earlier one read psych's at
    /// `initialize`, which declare none). The answer is whatever result the server sent,
    /// an `input_required` one too: the caller reads its `resultType`.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: psych_types::JsonObject,
        round: &InputRound,
        deadline: Duration,
        progress: Option<ProgressSink>,
    ) -> Result<Kept, McpError> {
        let call = format!("tools/call {tool}");
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        params.input_responses = round
            .input_responses
            .as_ref()
            .map(|responses| responses.clone().into_iter().collect());
        params.request_state.clone_from(&round.request_state);
        // No deadline of rmcp's: ours below is one for silence once the answer arrives.
        let mut options = PeerRequestOptions::no_options();
        if self.is_modern()
            && let Some(capabilities) = &round.client_capabilities
        {
            // Put after rmcp's own stamp (psych's capabilities: none), so it wins.
            let mut meta = RequestMetaObject::new();
            meta.insert(
                CLIENT_CAPABILITIES.to_owned(),
                Value::Object(capabilities.clone()),
            );
            options = options.with_meta(meta);
        }
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let started = Instant::now();
        let handle = match self.peer.send_request_with_option(request, options).await {
            Ok(handle) => handle,
            Err(error) => return Err(self.fault(&call, error).await),
        };
        // Both made before the first await, so that a caller giving up (dropping this
        // future) cancels the call on the server and frees its slot in the tap.
        let claim = self.tap.claim(handle.id.clone());
        // Held to the end of the call: dropping it drops the sink.
        let _route = progress.map(|sink| {
            self.tap
                .progress()
                .route(handle.progress_token.clone(), sink)
        });
        let mut guard = CancelOnDrop {
            peer: Some(self.peer.clone()),
            ended: self.ended.clone(),
            id: handle.id.clone(),
            reason: "request abandoned by the caller",
        };
        let response = answered(handle.await_response(), self.ended.clone());
        tokio::pin!(response);
        let mut until = self.call_deadline(started, deadline);
        let result = loop {
            match tokio::time::timeout_at(until, &mut response).await {
                Ok(result) => {
                    guard.peer = None;
                    break result;
                }
                Err(_) => {
                    until = self.call_deadline(started, deadline);
                    if until > Instant::now() {
                        // Bytes of an answer arrived since: the deadline moved on.
                        continue;
                    }
                    // The guard, dropped on return, cancels the call on the server.
                    guard.reason = REQUEST_TIMEOUT_REASON;
                    // Whole milliseconds: a deadline moved by a transfer is not a round one.
                    let waited = until.saturating_duration_since(started);
                    let timeout = Duration::from_millis(
                        u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                    );
                    break Err(ServiceError::Timeout { timeout });
                }
            }
        };
        // Taken whatever the outcome, so that a failed call leaves nothing in the tap.
        let raw = match claim.take() {
            // An answer came that the transport could not deliver (see `list`).
            Some(Err(failure)) => return Err(failure.into_error(&self.server, &call)),
            Some(Ok(raw)) => Some(raw),
            None => None,
        };
        let result = match result {
            Ok(result) => result,
            Err(error) => return Err(self.fault(&call, error).await),
        };
        if let Some(raw) = raw {
            // The result exactly as the server wrote it (stdio, or HTTP: an event or a
            // JSON body).
            return Ok(raw);
        }
        // Not seen by the tap (see `list`): rmcp's typed result, or raw if rmcp could not
        // type it.
        let value = match result {
            ServerResult::CallToolResult(result) => {
                serde_json::to_value(result).map_err(|e| McpError::Protocol {
                    server: self.server.clone(),
                    call,
                    message: format!("the tools/call result does not serialize: {e}"),
                })?
            }
            ServerResult::InputRequiredResult(result) => {
                serde_json::to_value(result).map_err(|e| McpError::Protocol {
                    server: self.server.clone(),
                    call,
                    message: format!("the input_required result does not serialize: {e}"),
                })?
            }
            ServerResult::CustomResult(custom) => custom.0,
            other => {
                return Err(McpError::Protocol {
                    server: self.server.clone(),
                    call,
                    message: format!("the answer is not a tools/call result: {other:?}"),
                });
            }
        };
        Ok(Kept {
            value,
            spilled: Vec::new(),
        })
    }

    /// When a call started at `started` with `deadline` ends unanswered: `deadline` after
    /// its start, or after the last bytes of an unfinished message this connection read
    /// (an answer still arriving; see [`Timeouts::call`]), but no later than
    /// [`Timeouts::transfer`] after its start.
    fn call_deadline(&self, started: Instant, deadline: Duration) -> Instant {
        let mut until = later(started, deadline);
        if let Some(last) = self.tap.transfer().last()
            && last > started
        {
            until = until.max(later(last, deadline));
        }
        until.min(later(started, self.timeouts.transfer.max(deadline)))
    }

    fn diagnostics(&self) -> String {
        self.child
            .as_ref()
            .map(Child::diagnostics)
            .unwrap_or_default()
    }

    /// An rmcp error as ours. A lost connection marks the session lost (the supervisor
    /// then reconnects); for a stdio server it waits briefly for the exit status and the
    /// stderr tail, which say why.
    async fn fault(&self, call: &str, error: ServiceError) -> McpError {
        let call = call.to_owned();
        let server = self.server.clone();
        match error {
            ServiceError::Timeout { timeout } => McpError::Timeout {
                server,
                call,
                after: timeout,
                stderr: self.diagnostics(),
            },
            // Not the server's answer: psych-mcp's stdio transport saying why an answer
            // could not be read.
            ServiceError::McpError(data)
                if let Some(failure) = AnswerFailure::from_error_data(&data) =>
            {
                failure.into_error(&server, &call)
            }
            // Not the server's answer: psych-mcp's HTTP transport saying why none came.
            ServiceError::McpError(data) if let Some(reason) = remote::fault_of(&data) => {
                McpError::Protocol {
                    server,
                    call,
                    message: reason,
                }
            }
            // MCP 2026-07-28: the server needs a client capability the call did not
            // declare; typed, so that a gateway can pass it to its own client.
            ServiceError::McpError(data)
                if data.code == ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY =>
            {
                McpError::MissingCapability {
                    server,
                    call,
                    message: server_words(&data.message),
                    data: data.data,
                }
            }
            ServiceError::McpError(data) => McpError::Protocol {
                server,
                call,
                message: server_error(&data),
            },
            ServiceError::TransportClosed | ServiceError::TransportSend(_) => match &self.child {
                Some(child) => {
                    let (status, stderr) = child.describe_end(EXIT_REPORT_WAIT).await;
                    let mut reason = format!("the server process {status}");
                    if !stderr.is_empty() {
                        reason.push_str("; its last stderr lines: ");
                        reason.push_str(&stderr.replace('\n', " | "));
                    }
                    self.mark_lost(&reason);
                    McpError::Exited {
                        server,
                        call,
                        status,
                        stderr,
                    }
                }
                None => {
                    let reason = transport_reason(&error.to_string());
                    let (reason, refusal) = match &error {
                        ServiceError::TransportSend(inner) => {
                            (remote::with_causes(reason, inner), remote::refusal(inner))
                        }
                        _ => (reason, None),
                    };
                    let lost = format!("{call} failed: {reason}");
                    // The server refused this request's POST: rmcp failed that request
                    // alone and its session goes on, so this one does too when the refusal
                    // was a 429 or the session still answers a ping (the probe marks it
                    // lost itself when it does not).
                    if let Some(refusal) = refusal
                        && !self.ended.is_ended()
                        && (refusal.rate_limited || self.probe(&lost).await)
                    {
                        return McpError::Protocol {
                            server,
                            call,
                            message: format!("{reason}{}", refusal.retry_after),
                        };
                    }
                    self.mark_lost(&lost);
                    McpError::Closed {
                        server,
                        call,
                        reason,
                    }
                }
            },
            other => McpError::Protocol {
                server,
                call,
                message: other.to_string(),
            },
        }
    }

    /// Whether the server answers a `ping` on this session within the connect deadline (at
    /// most 10 s): asked after a refused POST, to tell a refusal of that request from a
    /// session the server no longer has. When it does not, the session is marked lost
    /// with `reason`.
    ///
    /// Cancel safety: the ping and its verdict run in a task of their own, so a caller
    /// that gives up during the ping (its future dropped by a deadline or a `select!`)
    /// loses nothing: a session that no longer answers is still marked lost, and the
    /// supervisor reconnects (`tests::a_probe_dropped_mid_ping_still_marks_the_session_lost`).
    async fn probe(&self, reason: &str) -> bool {
        let wait = self.timeouts.connect.min(Duration::from_secs(10));
        let peer = self.peer.clone();
        let lost = Arc::clone(&self.lost);
        let reason = reason.to_owned();
        let ended = self.ended.clone();
        let verdict = tokio::spawn(async move {
            #[cfg(test)]
            tests::probe_gate().await;
            let ping = ClientRequest::PingRequest(rmcp::model::PingRequest::default());
            let pong = match peer
                .send_request_with_option(ping, PeerRequestOptions::with_timeout(wait))
                .await
            {
                Ok(handle) => answered(handle.await_response(), ended).await.is_ok(),
                Err(_) => false,
            };
            if !pong {
                lost.mark(&reason);
            }
            pong
        });
        verdict.await.unwrap_or(false)
    }

    fn mark_lost(&self, reason: &str) {
        self.lost.mark(reason);
    }

    /// Whether the connection is known lost now (a request found it gone, or rmcp's serve
    /// loop is over), before [`Session::lost`] has said why.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.reason().is_some() || self.ended.is_ended()
    }

    /// Resolves when the connection is lost, with the reason: the process exited, the
    /// transport closed, or a request found it gone. Woken by each of the three, not
    /// polled.
    pub(crate) async fn lost(&self) -> String {
        let mut exit = self.child.as_ref().map(Child::exit_watch);
        let mut ended = self.ended.clone();
        loop {
            // Listening before the look: a mark between the two still wakes this.
            let marked = self.lost.signal.notified();
            let mut marked = std::pin::pin!(marked);
            marked.as_mut().enable();
            if let Some(reason) = self.lost.reason() {
                return reason;
            }
            let exited = exit.as_ref().and_then(|exit| *exit.borrow());
            if let Some(status) = exited {
                let (_, stderr) = match &self.child {
                    Some(child) => child.describe_end(EXIT_REPORT_WAIT).await,
                    None => (String::new(), String::new()),
                };
                let mut reason = format!("the server process {}", stdio::describe(status));
                if !stderr.is_empty() {
                    reason.push_str("; its last stderr lines: ");
                    reason.push_str(&stderr.replace('\n', " | "));
                }
                return reason;
            }
            if self.ended.is_ended() {
                // A stdio server's output closes as it exits, and the two are seen in
                // either order: its exit status, when it comes within EXIT_REPORT_WAIT,
                // says more than the closed pipe (the next turn of the loop reports it).
                let exits = match exit.as_mut() {
                    Some(exit) => {
                        tokio::time::timeout(EXIT_REPORT_WAIT, exit.wait_for(Option::is_some))
                            .await
                            .is_ok_and(|exited| exited.is_ok())
                    }
                    None => false,
                };
                if !exits {
                    // A request may have found the session gone meanwhile, and said why.
                    return self
                        .lost
                        .reason()
                        .unwrap_or_else(|| "the connection closed".to_owned());
                }
                continue;
            }
            tokio::select! {
                () = marked => {}
                () = ended.wait() => {}
                Some(()) = async {
                    match exit.as_mut() {
                        Some(exit) => exit.changed().await.ok(),
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    /// Closes the session: the MCP shutdown (stdin closed, or the HTTP session ended),
    /// then the stdio server's whole process group is stopped.
    pub(crate) async fn close(&self) {
        let listener = self
            .listener
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(listener);
        let service = self.service.lock().await.take();
        if let Some(mut service) = service {
            let _ = service
                .close_with_timeout(self.timeouts.shutdown_grace)
                .await;
        }
        if let Some(child) = &self.child {
            child.terminate(self.timeouts.shutdown_grace).await;
        }
    }
}

/// What an attempt to open a listen stream came to.
enum Listen {
    /// The stream is open (boxed: it is large, the other answers are nothing).
    Open(Box<Subscription>),
    /// Not now (no acknowledgment in time, a transport error): try again later.
    Retry,
    /// The server refuses the method or its parameters: asking again would be refused
    /// again.
    Refused,
}

/// Opens a `subscriptions/listen` stream for `tools/list_changed`, waiting at most
/// `deadline` for its acknowledgment (a stream not acknowledged by then is cancelled).
async fn open_listen(peer: &Peer<RoleClient>, deadline: Duration) -> Listen {
    let filter = SubscriptionFilter::builder().tools_list_changed().build();
    match tokio::time::timeout(deadline, peer.listen(filter)).await {
        Ok(Ok(subscription)) => Listen::Open(Box::new(subscription)),
        Ok(Err(rmcp::ServiceError::McpError(error)))
            if error.code == rmcp::model::ErrorCode::METHOD_NOT_FOUND
                || error.code == rmcp::model::ErrorCode::INVALID_PARAMS =>
        {
            Listen::Refused
        }
        Ok(Err(_)) | Err(_) => Listen::Retry,
    }
}

/// Keeps a `subscriptions/listen` stream for `tools/list_changed` open to a server of
/// 2026-07-28 for as long as the session lives (its owner aborts it), turning each
/// notification into the [`McpEvent`] a legacy `list_changed` gives. It starts with
/// `first`, the stream opened before the first listing (or none, if that failed). When the
/// stream ends (the server closed it, an HTTP stream was cut) or cannot be opened (each
/// attempt waits at most `deadline` for the acknowledgment), it is opened again after a
/// wait that doubles from [`LISTEN_RETRY_FIRST`] to [`LISTEN_RETRY_MAX`]; each stream
/// opened after the first listing is announced as [`ChangeCause::Resubscribed`] once
/// acknowledged, so a listing made after it sees every change made while none was open.
/// Ends when a stream has ended and rmcp's serve loop is over (`ended`, looked at between
/// streams: the server's output ended or rmcp began to close the transport; the session
/// is then lost, and a new one listens), and is aborted with its session.
///
/// Cancel-safe at every await: rmcp cancels a subscription dropped while it is being
/// established and one dropped while open (`notifications/cancelled` to the server).
async fn listen(
    peer: Peer<RoleClient>,
    ended: Ended,
    server: ServerId,
    events: Arc<EventQueue>,
    first: Option<Subscription>,
    deadline: Duration,
) {
    let mut wait = LISTEN_RETRY_FIRST;
    // The first stream, opened before the first listing, needs no announcement.
    let mut announce = first.is_none();
    let mut next = first;
    loop {
        let subscription = match next.take() {
            Some(subscription) => Some(subscription),
            None => match open_listen(&peer, deadline).await {
                Listen::Open(subscription) => Some(*subscription),
                Listen::Retry => None,
                // Changes are then caught by the catalogue's freshness sweeps alone.
                Listen::Refused => return,
            },
        };
        if let Some(mut subscription) = subscription {
            let opened = tokio::time::Instant::now();
            if announce {
                events.push(McpEvent::ToolsChanged {
                    server: server.clone(),
                    cause: ChangeCause::Resubscribed,
                });
            }
            while let Ok(Some(notification)) = subscription.next().await {
                if matches!(
                    notification,
                    ServerNotification::ToolListChangedNotification(_)
                ) {
                    events.push(McpEvent::ToolsChanged {
                        server: server.clone(),
                        cause: ChangeCause::Notified,
                    });
                }
            }
            if opened.elapsed() >= LISTEN_RETRY_MAX {
                wait = LISTEN_RETRY_FIRST;
            }
        }
        announce = true;
        if ended.is_ended() {
            return;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(LISTEN_RETRY_MAX);
    }
}

/// The most of a server's error message an [`McpError`] quotes, in bytes.
const SERVER_WORDS: usize = 4096;

/// The most tools of a listing's page typed and checked on an async worker (well under a
/// millisecond for tools of usual size); a larger page, or one of over a MiB of JSON (a
/// generated server's few tools of large schemas), is read on a blocking thread.
const TOOLS_ON_WORKER: usize = 64;

/// A server's error message as an [`McpError`] quotes it: whole up to [`SERVER_WORDS`]
/// bytes, else its start and its length. The error is kept in the server's reachability,
/// cloned into every subscriber's event and every later call's error, so its size is
/// ours to bound, not the server's.
fn server_words(message: &str) -> String {
    display_words(&message)
}

/// A server's JSON-RPC error as an [`McpError`] says it: its code and its message
/// ([`server_words`]).
fn server_error(data: &rmcp::model::ErrorData) -> String {
    format!(
        "the server answered error {}: {}",
        data.code.0,
        server_words(&data.message)
    )
}

/// rmcp's transport errors name the transport's Rust type
/// (`Transport [rmcp::transport::worker::WorkerTransport<…>] error: …`); a person needs
/// only what follows, bounded as [`server_words`] (it may quote a body the server sent).
fn transport_reason(message: &str) -> String {
    match message.split_once("] error: ") {
        Some((_, reason)) => server_words(reason),
        None => server_words(message),
    }
}

/// Sends `notifications/cancelled` for a call whose future is dropped before its answer.
/// What a call cancelled at its deadline tells the server (rmcp's words for it).
const REQUEST_TIMEOUT_REASON: &str =
    rmcp::service::RequestHandle::<RoleClient>::REQUEST_TIMEOUT_REASON;

/// `at + by`, or a year after `at` where that is past what an [`Instant`] holds (a deadline
/// of `Duration::MAX` meaning none).
fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .unwrap_or_else(|| at + Duration::from_secs(365 * 24 * 3600))
}

struct CancelOnDrop {
    peer: Option<Peer<RoleClient>>,
    /// The session's end: the notification's send is given up then (it could otherwise
    /// wait for good, holding the session's queue; see [`crate::ending`]).
    ended: Ended,
    id: RequestId,
    /// What the notification tells the server.
    reason: &'static str,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(peer) = self.peer.take() else {
            return;
        };
        let id = self.id.clone();
        let reason = self.reason;
        let mut ended = self.ended.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let notification = CancelledNotification::new(CancelledNotificationParam::new(
                    Some(id),
                    Some(reason.into()),
                ));
                let send =
                    peer.send_notification(ClientNotification::CancelledNotification(notification));
                tokio::select! {
                    biased;
                    _ = send => {}
                    () = ended.wait() => {}
                }
            });
        }
    }
}

/// An rmcp initialize failure as ours; for a child that closed its output, with its exit
/// status and stderr. When `server/discover` failed and `initialize` after it (rmcp's error
/// for the two names neither cause), the second failure says why, and a protocol error
/// also says the first unless it was the "method not found" of a server from before
/// 2026-07-28 (a server of 2026-07-28 only may refuse `initialize` for its revision while
/// its real trouble was `server/discover`'s).
async fn init_error(
    server: &ServerId,
    error: ClientInitializeError,
    child: Option<&Child>,
) -> McpError {
    let call = "initialize".to_owned();
    match (error, child) {
        (ClientInitializeError::LegacyFallbackFailed { discover, fallback }, child) => {
            match (
                Box::pin(init_error(server, *fallback, child)).await,
                *discover,
            ) {
                (
                    McpError::Protocol {
                        server,
                        call,
                        message,
                    },
                    ClientInitializeError::JsonRpcError(data),
                ) if data.code != ErrorCode::METHOD_NOT_FOUND
                    // An answer our transport could not deliver is not the server's error.
                    && AnswerFailure::from_error_data(&data).is_none() =>
                {
                    McpError::Protocol {
                        server,
                        call,
                        message: format!(
                            "{message}; server/discover before it: {}",
                            server_error(&data)
                        ),
                    }
                }
                (error, _) => error,
            }
        }
        (ClientInitializeError::ConnectionClosed(_), Some(child))
        | (ClientInitializeError::TransportError { .. }, Some(child)) => {
            let (status, stderr) = child.describe_end(EXIT_REPORT_WAIT).await;
            McpError::Exited {
                server: server.clone(),
                call,
                status,
                stderr,
            }
        }
        (ClientInitializeError::JsonRpcError(data), _) => {
            match AnswerFailure::from_error_data(&data) {
                // An answer the transport could not deliver (the tap does not follow
                // `initialize`, so the failure travels in rmcp's error).
                Some(failure) => failure.into_error(server, &call),
                None => McpError::Protocol {
                    server: server.clone(),
                    call,
                    message: server_error(&data),
                },
            }
        }
        (
            error @ (ClientInitializeError::ConnectionClosed(_)
            | ClientInitializeError::TransportError { .. }),
            None,
        ) => {
            let reason = transport_reason(&error.to_string());
            let reason = match &error {
                ClientInitializeError::TransportError { error: inner, .. } => {
                    remote::with_causes(reason, inner)
                }
                _ => reason,
            };
            McpError::Closed {
                server: server.clone(),
                call,
                reason,
            }
        }
        // rmcp's words for these may quote the server's whole answer (an `initialize`
        // answered by another result, formatted with `{:?}`): cut as a server's words are.
        (other, _) => McpError::Protocol {
            server: server.clone(),
            call,
            message: display_words(&other),
        },
    }
}

/// `value` as displayed, whole up to [`SERVER_WORDS`] bytes, else its start and its length
/// ([`server_words`] for a server's own words), without building the whole text: what it
/// keeps is bounded however long the text would be.
fn display_words(value: &impl std::fmt::Display) -> String {
    /// Keeps the first [`SERVER_WORDS`] bytes (and a few more, to cut at a character)
    /// and counts the rest.
    struct Capped {
        kept: String,
        total: usize,
    }
    impl std::fmt::Write for Capped {
        fn write_str(&mut self, text: &str) -> std::fmt::Result {
            self.total = self.total.saturating_add(text.len());
            let room = (SERVER_WORDS + 4).saturating_sub(self.kept.len());
            if room > 0 {
                let end = text.floor_char_boundary(room.min(text.len()));
                self.kept.push_str(&text[..end]);
            }
            Ok(())
        }
    }
    let mut capped = Capped {
        kept: String::new(),
        total: 0,
    };
    let _ = std::fmt::Write::write_fmt(&mut capped, format_args!("{value}"));
    if capped.total <= SERVER_WORDS {
        return capped.kept;
    }
    let end = capped.kept.floor_char_boundary(SERVER_WORDS);
    format!("{}… ({} bytes in all)", &capped.kept[..end], capped.total)
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use std::collections::BTreeMap;

    use super::*;
    use psych_test_server::Scenario;

    const GIVEN_UP: usize = 20;

    /// When `server/discover` and then `initialize` fail, the error is `initialize`'s, and
    /// says `server/discover`'s too unless that was an older server's "method not found".
    #[tokio::test]
    async fn a_failed_fallback_says_why_initialize_failed_and_discover_when_it_matters() {
        use rmcp::model::ErrorData;
        let server = ServerId::new("s").unwrap();
        let failed = |discover: ErrorData| ClientInitializeError::LegacyFallbackFailed {
            discover: Box::new(ClientInitializeError::JsonRpcError(discover)),
            fallback: Box::new(ClientInitializeError::JsonRpcError(ErrorData::new(
                ErrorCode::INVALID_PARAMS,
                "unsupported protocol version",
                None,
            ))),
        };
        let older = ErrorData::new(ErrorCode::METHOD_NOT_FOUND, "no such method", None);
        let error = init_error(&server, failed(older), None).await;
        assert_eq!(
            error.to_string(),
            "MCP server \"s\": initialize failed: the server answered error -32602: \
             unsupported protocol version"
        );
        let real = ErrorData::internal_error("the database is down", None);
        let error = init_error(&server, failed(real), None).await;
        assert_eq!(
            error.to_string(),
            "MCP server \"s\": initialize failed: the server answered error -32602: \
             unsupported protocol version; server/discover before it: the server answered \
             error -32603: the database is down"
        );
    }

    fn timeouts() -> Timeouts {
        Timeouts::uniform(Duration::from_secs(5)).with_shutdown_grace(Duration::from_millis(300))
    }

    /// Calls that never get an answer, each given up by its caller (the future dropped, as
    /// a caller's own deadline or a cancelled Run does) or ended by the call deadline, then
    /// the tap's count, which must be back to zero; the connection still answers.
    async fn given_up_calls_leave_the_tap_empty(session: &Session, hang: &str) {
        let tap = &session.tap;
        let first = InputRound::default();
        for _ in 0..GIVEN_UP {
            let call = session.call(
                hang,
                JsonObject::new(),
                &first,
                Duration::from_secs(30),
                None,
            );
            let given_up = tokio::time::timeout(Duration::from_millis(20), call).await;
            assert!(given_up.is_err(), "the call was answered: {given_up:?}");
        }
        for _ in 0..3 {
            let error = session
                .call(
                    hang,
                    JsonObject::new(),
                    &InputRound::default(),
                    Duration::from_millis(20),
                    None,
                )
                .await
                .unwrap_err();
            assert!(matches!(error, McpError::Timeout { .. }), "{error}");
        }
        assert_eq!(tap.len(), 0, "slots left behind by calls given up");
        assert!(!tap.is_waiting());
    }

    type JsonObject = psych_types::JsonObject;

    /// A session to `server` over `transport`, with its first listing (of at most
    /// `max_listing_bytes`).
    async fn connect(
        server: &str,
        transport: &Transport,
        timeouts: Timeouts,
        max_listing_bytes: u64,
    ) -> (Arc<Session>, Listing) {
        Session::connect(
            &ServerId::new(server).unwrap(),
            transport,
            (timeouts, max_listing_bytes),
            Arc::new(EventQueue::default()),
            (&std::env::temp_dir(), &SpillBudget::default()),
            tokio::sync::watch::channel(false).1,
        )
        .await
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_stdio_calls_given_up_leave_no_slot_in_the_tap() {
        // A stdio server from before 2026-07-28 that answers the first listing, then reads
        // and never answers: every call hangs.
        let transport = paged_server(&[page(&["hang"], None)]);
        let (session, listing) = connect(
            "mute",
            &transport,
            timeouts(),
            crate::DEFAULT_MAX_LISTING_BYTES,
        )
        .await;
        assert_eq!(listing.tools.len(), 1);
        given_up_calls_leave_the_tap_empty(&session, "hang").await;
        session.close().await;
    }

    /// A session, as `server`, with the test server over HTTP on a port of its own: the
    /// session and the serving task (abort it at the end).
    async fn over_http(server: &str) -> (Arc<Session>, JoinHandle<std::io::Result<()>>) {
        // Bound here, before the server is spawned: the first connection attempt finds it
        // listening, however loaded the machine.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let serving = tokio::spawn(Scenario::default().serve_on(listener));
        let transport = Transport::Http {
            url: format!("http://{addr}/mcp"),
            headers: BTreeMap::new(),
        };
        let (session, _) = connect(
            server,
            &transport,
            timeouts(),
            crate::DEFAULT_MAX_LISTING_BYTES,
        )
        .await;
        (session, serving)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_http_calls_given_up_leave_no_slot_in_the_tap() {
        let (session, serving) = over_http("web").await;
        given_up_calls_leave_the_tap_empty(&session, "hang").await;
        let mut arguments = JsonObject::new();
        arguments.insert("text".into(), "still here".into());
        let echo = session
            .call(
                "echo",
                arguments,
                &InputRound::default(),
                Duration::from_secs(5),
                None,
            )
            .await
            .unwrap();
        assert_eq!(echo.value["content"][0]["text"], "still here");
        assert_eq!(session.tap.len(), 0);
        session.close().await;
        serving.abort();
    }

    /// While set, a probe's task says it has started (the first `Notify`) and waits for
    /// the second before it pings.
    static PROBE_GATE: Mutex<Option<Arc<(Notify, Notify)>>> = Mutex::new(None);

    /// Where a probe's task stops while a test holds it ([`PROBE_GATE`]).
    pub(super) async fn probe_gate() {
        let gate = PROBE_GATE
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(gate) = gate {
            gate.0.notify_one();
            gate.1.notified().await;
        }
    }

    /// A call whose POST is refused is dropped (as a deadline or a `select!` drops it)
    /// while its probe pings: the server that no longer has the session is still found
    /// out, and the session marked lost, for the supervisor to reconnect.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_probe_dropped_mid_ping_still_marks_the_session_lost() {
        let (session, serving) = over_http("forgetful").await;
        let gate = Arc::new((Notify::new(), Notify::new()));
        *PROBE_GATE.lock().unwrap() = Some(Arc::clone(&gate));
        // `forget_sessions` is refused with a 400, and so is everything after it.
        let round = InputRound::default();
        let call = session.call(
            "forget_sessions",
            JsonObject::new(),
            &round,
            Duration::from_secs(30),
            None,
        );
        tokio::select! {
            answer = call => panic!("the call ended before its probe: {answer:?}"),
            () = gate.0.notified() => {}
        }
        // The call's future is dropped: its probe's task goes on.
        *PROBE_GATE.lock().unwrap() = None;
        gate.1.notify_one();
        let reason = tokio::time::timeout(Duration::from_secs(10), session.lost())
            .await
            .expect("the session is marked lost");
        assert!(
            reason.contains("tools/call forget_sessions failed"),
            "{reason}"
        );
        session.close().await;
        serving.abort();
    }

    /// A stdio server that closes its output while a send to it is blocked (it reads no
    /// more, and its stdin's pipe is full) and lives on. rmcp's serve loop ends, but its
    /// close of the transport waits for the blocked send, and its request queue stays
    /// open until the close is done: the session is still seen lost, with no request to
    /// find it out, so that its supervisor reconnects.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_whose_close_waits_for_a_blocked_send_is_seen_lost() {
        // After its listing it reads one line (the call to `hold`) and no more; once
        // `blocked` exists it closes its output and sleeps, its stdin open.
        let dir = tempfile::tempdir().unwrap();
        let blocked = dir.path().join("blocked");
        let transport = scripted_server(
            &[page(&["hold", "big"], None)],
            &format!(
                "read -r line\nwhile [ ! -e '{}' ]; do sleep 0.05; done\nexec 1>&-\nexec sleep 600\n",
                blocked.display()
            ),
        );
        let (session, _) = connect(
            "stuck",
            &transport,
            timeouts(),
            crate::DEFAULT_MAX_LISTING_BYTES,
        )
        .await;
        let round = InputRound::default();
        let held = session
            .call(
                "hold",
                JsonObject::new(),
                &round,
                Duration::from_millis(200),
                None,
            )
            .await;
        assert!(matches!(held, Err(McpError::Timeout { .. })), "{held:?}");
        // A MiB the server never reads: the send blocks on the full pipe, holding stdin,
        // after its caller has given up.
        let mut arguments = JsonObject::new();
        arguments.insert("text".into(), "x".repeat(1 << 20).into());
        let big = session
            .call("big", arguments, &round, Duration::from_millis(300), None)
            .await;
        assert!(matches!(big, Err(McpError::Timeout { .. })), "{big:?}");
        // A wait for the loss given up while the server still holds its output open (as a
        // `select!` drops it): nothing of it is left to lose.
        let early = tokio::time::timeout(Duration::from_millis(100), session.lost()).await;
        assert!(early.is_err(), "not lost yet: {early:?}");
        std::fs::write(&blocked, b"").unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(20), session.lost())
            .await
            .expect("the session is seen lost with no request to find it");
        assert_eq!(reason, "the connection closed");
        assert!(session.is_lost());
        // What the test is about: rmcp's close is still waiting for the blocked send, so
        // its request queue is open, and that alone would not say the session is lost.
        assert!(!session.peer.is_transport_closed());
        session.close().await;
    }

    /// One `tools/list` answer of [`paged_server`]: the tools on the page (`a`, `b`, …),
    /// with the cursor `next`, or a JSON-RPC error, after a `list_changed` when `announce`
    /// (and after `slow` seconds).
    struct Page {
        announce: bool,
        slow: Option<&'static str>,
        answer: Result<(&'static [&'static str], Option<&'static str>), ()>,
    }

    /// A page of `tools` with the cursor `next`, not announced.
    fn page(tools: &'static [&'static str], next: Option<&'static str>) -> Page {
        Page {
            announce: false,
            slow: None,
            answer: Ok((tools, next)),
        }
    }

    impl Page {
        /// A JSON-RPC error, not announced.
        fn failing() -> Self {
            Self {
                announce: false,
                slow: None,
                answer: Err(()),
            }
        }

        /// This page after a `list_changed`.
        fn announced(self) -> Self {
            Self {
                announce: true,
                ..self
            }
        }

        /// This page after `seconds` (a `sleep` argument).
        fn after(self, seconds: &'static str) -> Self {
            Self {
                slow: Some(seconds),
                ..self
            }
        }
    }

    /// A stdio server from before 2026-07-28 that says it sends `list_changed` and answers
    /// the `tools/list` requests with `pages` in turn (the first of them the connection's
    /// listing), then reads and never answers.
    fn paged_server(pages: &[Page]) -> Transport {
        scripted_server(pages, "while read -r line; do :; done\n")
    }

    /// As [`paged_server`], then runs `rest` (shell).
    fn scripted_server(pages: &[Page], rest: &str) -> Transport {
        let mut script = String::from(
            r#"
            answer() { read -r line; id=$(printf '%s' "$line" | sed 's/.*"id":\([0-9]*\).*/\1/'); }
            answer
            printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"Method not found"}}\n' "$id"
            answer
            printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":true}},"serverInfo":{"name":"paged","version":"1"}}}\n' "$id"
            read -r initialized
            "#,
        );
        for page in pages {
            script.push_str("answer\n");
            if let Some(seconds) = page.slow {
                script.push_str(&format!("sleep {seconds}\n"));
            }
            if page.announce {
                script.push_str(
                    r#"printf '{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n'"#,
                );
                script.push('\n');
            }
            let result = match page.answer {
                Ok((tools, next)) => {
                    let tools: Vec<Value> = tools
                        .iter()
                        .map(|name| serde_json::json!({"name": name, "inputSchema": {"type": "object"}}))
                        .collect();
                    let mut result = serde_json::json!({ "tools": tools });
                    if let Some(next) = next {
                        result["nextCursor"] = next.into();
                    }
                    format!(r#""result":{result}"#)
                }
                Err(()) => r#""error":{"code":-32603,"message":"listing failed"}"#.to_owned(),
            };
            script.push_str(&format!(
                "printf '{{\"jsonrpc\":\"2.0\",\"id\":%s,{result}}}\\n' \"$id\"\n"
            ));
        }
        script.push_str(rest);
        Transport::Stdio {
            command: "sh".into(),
            args: vec!["-c".into(), script],
            env: BTreeMap::new(),
            cwd: None,
        }
    }

    /// A listing deadline no walk of these tests comes near, however loaded the machine.
    const ROOMY: Duration = Duration::from_secs(60);

    /// The names of the connection's first listing of `transport`, with a listing deadline
    /// of `listing` (the walks again end within half of it).
    async fn first_listing(transport: &Transport, listing: Duration) -> Vec<String> {
        first_listing_within(transport, listing, crate::DEFAULT_MAX_LISTING_BYTES).await
    }

    /// [`first_listing`] with a listing bound of `bytes`.
    async fn first_listing_within(
        transport: &Transport,
        listing: Duration,
        bytes: u64,
    ) -> Vec<String> {
        let timeouts = timeouts().with_listing(listing, listing);
        let (session, listing) = connect("paged", transport, timeouts, bytes).await;
        session.close().await;
        listing
            .tools
            .iter()
            .map(|tool| tool.name.as_str().to_owned())
            .collect()
    }

    /// `a` is removed after page 1 of `a b` and before page 2, announced before page 2,
    /// which starts at offset 2 of `b c d`: `c` is skipped. The listing is walked again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_listing_the_server_changed_mid_walk_is_walked_again() {
        let mid_walk = page(&["d"], None).announced();
        let transport = paged_server(&[
            page(&["a", "b"], Some("2")),
            mid_walk,
            page(&["b", "c"], Some("2")),
            page(&["d"], None),
        ]);
        assert_eq!(first_listing(&transport, ROOMY).await, ["b", "c", "d"]);
    }

    /// A server that changes during every walk is walked three times in all, and listed as
    /// its last walk found it; one whose walk again fails is listed as its first walk
    /// found it; a listing of one page is one answer, never walked again; a walk that took
    /// too long for another is not walked again, and a walk again is cut at half the
    /// listing deadline.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn walks_again_are_bounded_and_never_fail_a_listing() {
        let changed = |tools| page(tools, None).announced();
        let always = paged_server(&[
            page(&["a", "b"], Some("2")),
            changed(&["c"]),
            page(&["a", "b"], Some("2")),
            changed(&["d"]),
            page(&["a", "b"], Some("2")),
            changed(&["e"]),
            // Never asked for: a fourth walk would find this.
            page(&["z"], None),
        ]);
        assert_eq!(first_listing(&always, ROOMY).await, ["a", "b", "e"]);

        let fails_again = paged_server(&[
            page(&["a", "b"], Some("2")),
            changed(&["c"]),
            Page::failing(),
        ]);
        assert_eq!(first_listing(&fails_again, ROOMY).await, ["a", "b", "c"]);

        let one_page = paged_server(&[changed(&["a", "b"]), page(&["z"], None)]);
        assert_eq!(first_listing(&one_page, ROOMY).await, ["a", "b"]);

        // A walk of 1.5 s, then another, would end past half the 5 s listing deadline.
        let slow = changed(&["c"]).after("1.5");
        let too_slow = paged_server(&[page(&["a", "b"], Some("2")), slow, page(&["z"], None)]);
        let five = Duration::from_secs(5);
        assert_eq!(first_listing(&too_slow, five).await, ["a", "b", "c"]);

        // A walk again whose first page stalls is cut at half the listing deadline, and the
        // first walk is the listing.
        // A walk again past the listing bound (five tools where four fit) leaves the first.
        let one = crate::listing::cost(
            &serde_json::json!({"name": "a", "inputSchema": {"type": "object"}}),
        );
        let over = paged_server(&[
            page(&["a", "b"], Some("2")),
            changed(&["c"]),
            page(&["a", "b", "c", "d"], Some("4")),
            page(&["e"], None),
        ]);
        assert_eq!(
            first_listing_within(&over, ROOMY, 4 * one + 64).await,
            ["a", "b", "c"]
        );

        let stalls = page(&["z"], None).after("60");
        let stalled = paged_server(&[page(&["a", "b"], Some("2")), changed(&["c"]), stalls]);
        let started = tokio::time::Instant::now();
        let twenty = Duration::from_secs(20);
        assert_eq!(first_listing(&stalled, twenty).await, ["a", "b", "c"]);
        // Cut at 10 s; left to the listing deadline, it would end at 20 (5 s each way for
        // a loaded machine).
        let took = started.elapsed();
        assert!(took < Duration::from_secs(15), "{took:?}");
    }

    #[test]
    fn a_server_message_is_quoted_up_to_its_bound() {
        assert_eq!(super::server_words("short"), "short");
        let long = "é".repeat(super::SERVER_WORDS);
        let quoted = super::server_words(&long);
        assert!(quoted.len() < super::SERVER_WORDS + 40, "{}", quoted.len());
        assert!(quoted.ends_with(&format!("… ({} bytes in all)", long.len())));
    }

    /// rmcp's words for a failed `initialize` that quote the server's answer (4 MiB here,
    /// written in many pieces as `{:?}` writes) are cut the same way, and never held
    /// whole. (Before, the whole text was the reason, kept and cloned into every event and
    /// error while the server stayed unreachable.)
    #[test]
    fn rmcps_words_for_a_failed_initialize_are_cut_as_a_servers() {
        struct Quoting(usize);
        impl std::fmt::Display for Quoting {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("expect initialized result, but received: Some(")?;
                for _ in 0..self.0 {
                    f.write_str("é")?;
                }
                f.write_str(")")
            }
        }
        assert_eq!(super::display_words(&"short"), "short");
        let exact = "x".repeat(super::SERVER_WORDS);
        assert_eq!(super::display_words(&exact), exact);
        let quoting = Quoting(2 << 20);
        let total = quoting.to_string().len();
        let words = super::display_words(&quoting);
        assert!(words.len() < super::SERVER_WORDS + 40, "{}", words.len());
        assert!(words.starts_with("expect initialized result, but received: Some(é"));
        assert!(
            words.ends_with(&format!("… ({total} bytes in all)")),
            "{words:.80}"
        );
    }
}
