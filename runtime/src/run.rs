//! [`Run`]: one agent Run, driven turn by turn by its caller, who makes the model calls.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use psych_catalog::Catalog;
use psych_disclosure::pinning::{PinSettings, Pins, ToolUsage};
use psych_disclosure::{Inputs, Live, OrientationContext, Settings, Surface, SurfaceCache};
use psych_elision::{Elider, Estimator};
use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CurrentTime, DeferralMode, DynamicTail, NativeDeferral,
    OpenAiOptions, ProjectionCache, Provider, RenderedRequest, SearchTool, StaticSections,
    StepHistory, Transient, choose_deferral,
};
use psych_reader_tool::{Limits, tool_definition};
use psych_record_log::{RecordLog, Recovery, SharedRecordLog, SyncPolicy};
use psych_types::OutputLimits;
use psych_types::{
    AssistantMessage, History, HistoryItem, LoggedRecord, PermissionGrant, Record, RunId,
    ServerCatalog, TokenEstimator, ToolCall, ToolCallId, ToolDefinition, ToolHost, ToolOutput,
    ToolResult, Usage, UserMessage,
};

use crate::error::{ExecuteError, RunError, TurnState};
use crate::executor::Executor;
use crate::usage::Spent;
use psych_types::{
    ConnectionSpec, DynRecordStore, Erased, RecordHandle, RecordSource as _, RecordStore as _,
    RecordStores,
};

/// The text of the failed result logged for a call that has none when a Run is reopened
/// (or continued after a step that did not finish): the call may or may not have run.
pub const INTERRUPTED: &str = "interrupted: the run stopped before this call's result was \
logged; the call may or may not have taken effect";

/// The provider a request is rendered for, with its options.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Target {
    /// The Anthropic Messages API.
    Anthropic(AnthropicOptions),
    /// The OpenAI Chat Completions API.
    OpenAi(OpenAiOptions),
    /// The OpenAI Responses API.
    Responses(OpenAiOptions),
}

impl Target {
    /// The wire format the target renders.
    pub fn provider(&self) -> Provider {
        match self {
            Target::Anthropic(_) => Provider::Anthropic,
            Target::OpenAi(_) => Provider::OpenAi,
            Target::Responses(_) => Provider::OpenAiResponses,
        }
    }
}

/// What the model answered to one request, as the caller's LLM client received it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelReply {
    /// The text the model wrote (may be empty when it only called tools).
    pub text: String,
    /// The tool calls, in the order the model made them. For OpenAI, ids are the model's
    /// own (only ids the runtime sent are ever shortened, see
    /// [`RenderedRequest::logged_call_id`]).
    pub tool_calls: Vec<ToolCall>,
    /// The token usage the provider reported for this call; logged as a
    /// [`Record::Usage`], the only source of every spent figure ([`Run::spent`]).
    pub usage: Option<Usage>,
}

/// What the caller does after handing over a reply.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Next {
    /// The model made tool calls; their results are logged. Send this request next.
    Request(RenderedRequest),
    /// The model answered without calls: the turn is over.
    Done {
        /// The model's final text of the turn.
        text: String,
    },
}

/// The zones and tools of the current turn: resolved once at its start, fixed for its steps
/// (so each step's request extends the last).
#[derive(Debug)]
struct Turn {
    surface: Arc<Surface>,
    zone1: StaticSections,
    tools: Vec<ToolDefinition>,
    /// With [`DeferralMode::Native`] and deferred tools: what the turn sends instead of
    /// `tools` where the provider defers natively.
    native: Option<NativeTurn>,
}

/// A turn's tools in native deferral: the Surface's tools less the meta tools (plus the
/// reader), and the deferred tools with the search tool.
#[derive(Debug)]
struct NativeTurn {
    tools: Vec<ToolDefinition>,
    deferral: NativeDeferral,
}

/// The caller's clock, in Unix seconds (the transient message's time).
type ClockFn = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The Run's one token estimator ([`RunBuilder::estimator`]), shared by disclosure's
/// costs, the log's stored estimates and elision.
type RunEstimator = Arc<dyn TokenEstimator + Send + Sync>;

/// An agent Run over real MCP servers (or any [`ToolHost`]): the model call stays with the
/// caller.
///
/// A turn: [`user`](Self::user) logs the message, resolves the Surface from the catalogue
/// *now* (every connection's live tools, the grant, disclosure's settings), and assembles
/// the request (the Surface's tools plus `read_tool_output`, deferred-server lines as
/// capability notes, the history from the log with elision as the projector) rendered for
/// the [`Target`]. The caller sends it and hands the model's answer to
/// [`reply`](Self::reply): usage and the assistant message are logged, the calls run through
/// the [`Executor`] (re-checked against the grant and catalogue at call time, results logged
/// whole in call order), and the next request comes back, until the model answers without
/// calls ([`Next::Done`]).
///
/// Nothing is cached across turns but the catalogue: a connection added with
/// [`add_connection`](Self::add_connection) (its server connected and synced) is on the
/// next turn's Surface, and a [`set_grant`](Self::set_grant) holds at the next call.
///
/// Opening a Run whose log exists resumes it: every call left without a result gets a
/// logged failed result ([`INTERRUPTED`]) before anything is assembled, and
/// [`request`](Self::request) gives the request that continues the interrupted turn.
///
/// A step costs what the model is sent, not what the log holds: the Run keeps its
/// [`History`] (tool results as the summaries the log stores, with the token estimate
/// computed when each was appended), projects each earlier turn's results once (a preview
/// reads only its head and tail from the log), and reads whole only the results it sends
/// whole.
///
/// Each call ([`user`](Self::user), [`request`](Self::request), [`reply`](Self::reply))
/// may be dropped at any await, by a caller's timeout or `select!`: what it logged stays
/// logged, the tool calls it had not finished are cancelled, and the next call first waits
/// for the appends it left on the blocking pool, then reads the history and the spent tokens
/// back from the log whole. Go on as after a step that ended in an error:
/// [`request`](Self::request) closes the calls left without a result ([`INTERRUPTED`]) and
/// gives the request as the log stands, or [`user`](Self::user) starts the next turn (a
/// `reply` dropped once under way is not taken again: [`RunError::OutOfTurn`]). A call that
/// fails (other than out of turn) is followed the same way. Until that next call,
/// [`history`](Self::history) and [`spent`](Self::spent) may be behind the log.
pub struct Run<H> {
    /// The records as prompt assembly reads them, extended from the log after each append.
    history: History,
    /// The views of earlier turns' results, by handle: each turn is projected once.
    projections: ProjectionCache,
    /// The logged usage records, summed as they are appended.
    spent: Spent,
    /// How the last call ([`user`](Self::user), [`request`](Self::request),
    /// [`reply`](Self::reply)) left the Run: what the next call must read back from the log
    /// first ([`Run::recover`]).
    left: Left,
    /// The Run's record log, when its records are in a file (the executor appends to it
    /// through the record-store seam, [`Executor::store`]).
    log: Option<Arc<SharedRecordLog>>,
    executor: Executor<H>,
    catalog: Catalog,
    connections: Vec<ConnectionSpec>,
    grant: PermissionGrant,
    settings: Settings,
    /// The last Surface and each server's prepared part, kept across turns.
    surfaces: Arc<Mutex<SurfaceCache<RunEstimator>>>,
    elider: Elider<RunEstimator>,
    instructions: String,
    dynamic_tail: DynamicTail,
    target: Target,
    deferral: DeferralMode,
    clock: ClockFn,
    turn: Option<Arc<Turn>>,
    /// A request was handed out and its reply is awaited.
    awaiting: bool,
    recovery: Recovery,
    /// What learned pinning chose when the Run opened (none without it).
    pins: Pins,
}

impl<H> std::fmt::Debug for Run<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("records", &self.history.len())
            .field("connections", &self.connections.len())
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Run`]: where its log lives, its catalogue and host, and the knobs with their
/// defaults. [`open`](Self::open) opens (or resumes) it.
pub struct RunBuilder<H> {
    dir: PathBuf,
    run: RunId,
    catalog: Catalog,
    host: Arc<H>,
    connections: Vec<ConnectionSpec>,
    grant: PermissionGrant,
    settings: Settings,
    elider: Elider,
    estimator: Arc<dyn TokenEstimator + Send + Sync>,
    instructions: String,
    dynamic_tail: DynamicTail,
    target: Target,
    deferral: DeferralMode,
    clock: ClockFn,
    sync: SyncPolicy,
    call_timeout: Duration,
    orientation: OrientationContext,
    limits: Limits,
    on_demand: Option<Arc<dyn crate::OnDemand>>,
    /// Where the records go instead of `<dir>/<run>.plog`, and the Run's identity there.
    stores: Option<(Arc<dyn RecordStores>, String)>,
    /// Learned pinning: the usage of earlier Runs and what it may pin.
    pinning: Option<(ToolUsage, PinSettings)>,
    /// Output limits per server and tool.
    output_limits: OutputLimits,
    /// The passed-text budget shared with other Runs, if any.
    passing: Option<crate::PassingBudget>,
    /// The most calls of one step that run.
    max_calls: usize,
    /// Whether the guard runs off the async worker.
    off_worker: bool,
}

impl<H> std::fmt::Debug for RunBuilder<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunBuilder")
            .field("dir", &self.dir)
            .field("run", &self.run)
            .finish_non_exhaustive()
    }
}

impl<H: ToolHost + 'static> Run<H> {
    /// A builder for the Run `run` whose log is `<dir>/<run>.plog`, reading tools from
    /// `catalog`, forwarding calls to `host` and rendering requests for `target` (the
    /// provider and model are the caller's choice: the runtime names none). Defaults: no
    /// instructions ([`RunBuilder::instructions`]), no connection, an empty grant,
    /// disclosure's and elision's default settings, psych-elision's estimator, the meta
    /// tools for deferred servers ([`DeferralMode::MetaTools`]), the system clock,
    /// [`SyncPolicy::EveryAppend`], a 60 s call deadline, at most 64 calls of a step run.
    pub fn builder(
        dir: impl Into<PathBuf>,
        run: RunId,
        catalog: Catalog,
        host: Arc<H>,
        target: Target,
    ) -> RunBuilder<H> {
        RunBuilder {
            dir: dir.into(),
            run,
            catalog,
            host,
            connections: Vec::new(),
            grant: PermissionGrant::none(),
            settings: Settings::default(),
            elider: Elider::default(),
            estimator: Arc::new(Estimator::new()),
            instructions: String::new(),
            dynamic_tail: DynamicTail::new(),
            target,
            deferral: DeferralMode::MetaTools,
            clock: Arc::new(system_seconds),
            sync: SyncPolicy::EveryAppend,
            call_timeout: crate::DEFAULT_CALL_TIMEOUT,
            orientation: OrientationContext::default(),
            limits: Limits::default(),
            on_demand: None,
            stores: None,
            pinning: None,
            output_limits: OutputLimits::new(),
            passing: None,
            max_calls: crate::DEFAULT_MAX_CALLS_PER_STEP,
            off_worker: false,
        }
    }

    /// Starts a turn: logs `text` as the user's message, resolves the Surface now and returns
    /// the turn's first request.
    ///
    /// # Errors
    ///
    /// [`RunError::OutOfTurn`] while a request's reply is awaited; otherwise the log, the
    /// catalogue, disclosure or assembly failing.
    pub async fn user(&mut self, text: impl Into<String>) -> Result<RenderedRequest, RunError> {
        self.recover().await?;
        let request = self.start_turn(text.into()).await;
        self.left = Left::after(&request);
        request
    }

    /// [`user`](Self::user)'s work.
    async fn start_turn(&mut self, text: String) -> Result<RenderedRequest, RunError> {
        if self.awaiting {
            return Err(RunError::OutOfTurn(TurnState::AwaitingReply));
        }
        // The last turn's Surface is not this one's, whatever happens below: a turn that
        // fails to resolve leaves none, and `request` resolves it again.
        self.turn = None;
        self.close_unanswered().await?;
        let record = Record::User(UserMessage { text });
        self.log_records(vec![record]).await?;
        self.turn = Some(Arc::new(self.resolve_turn().await?));
        self.next_request().await
    }

    /// The request for the Run as it stands, to continue a turn after a resume or after a
    /// step that ended in an error: unanswered calls are closed first ([`INTERRUPTED`]);
    /// the Surface is resolved now if no turn is under way.
    ///
    /// # Errors
    ///
    /// As [`user`](Self::user), except out of turn.
    pub async fn request(&mut self) -> Result<RenderedRequest, RunError> {
        self.recover().await?;
        let request = self.continue_turn().await;
        self.left = Left::after(&request);
        request
    }

    /// [`request`](Self::request)'s work.
    async fn continue_turn(&mut self) -> Result<RenderedRequest, RunError> {
        self.close_unanswered().await?;
        if self.turn.is_none() {
            self.turn = Some(Arc::new(self.resolve_turn().await?));
        }
        self.next_request().await
    }

    /// Hands over the model's reply to the last request: logs its usage and the assistant
    /// message, executes its tool calls (results logged whole, in call order) and returns
    /// the next request, or [`Next::Done`] when the model made no call.
    ///
    /// Providers give each call an id of its own, and a request's history needs them
    /// unique; some OpenAI-compatible servers start again at `call_0` in each response. A
    /// call whose id the Run's history (or an earlier call of the same reply) already holds
    /// is logged and answered under a fresh one: the id with `_2`, `_3`… after it (its
    /// start cut to keep within 128 characters), the first not yet used. A call whose
    /// arguments nest deeper than the log could read back (over 63 levels of arrays and
    /// objects, [`psych_types::json::MAX_DEPTH`] with room for the record around them) is
    /// logged with its arguments as their JSON text, as arguments that did not parse are,
    /// and answered as a call whose arguments are not an object.
    ///
    /// # Errors
    ///
    /// [`RunError::OutOfTurn`] when no request is waiting for a reply;
    /// [`RunError::Execute`] with [`ExecuteError::InvalidDeferredHandle`] when a read (or a
    /// result reference) named a handle this Run never emitted (every result is logged, the
    /// refused call's saying that nothing was run; continue with
    /// [`request`](Self::request) or [`user`](Self::user)); the log, the catalogue or
    /// assembly failing.
    pub async fn reply(&mut self, reply: ModelReply) -> Result<Next, RunError> {
        self.recover().await?;
        let next = self.step(reply).await;
        self.left = Left::after(&next);
        next
    }

    /// [`reply`](Self::reply)'s work.
    async fn step(&mut self, reply: ModelReply) -> Result<Next, RunError> {
        // A request is handed out only within a turn, so a reply awaited has its turn.
        let surface = match (&self.turn, self.awaiting) {
            (Some(turn), true) => Arc::clone(&turn.surface),
            _ => return Err(RunError::OutOfTurn(TurnState::NoRequestWaiting)),
        };
        self.awaiting = false;
        let ModelReply {
            text,
            mut tool_calls,
            usage,
        } = reply;
        fresh_call_ids(&self.history, &mut tool_calls);
        storable_arguments(&mut tool_calls);
        let mut records = Vec::with_capacity(2);
        if let Some(usage) = usage {
            records.push(Record::Usage(usage));
        }
        records.push(Record::Assistant(AssistantMessage {
            text: text.clone(),
            tool_calls: tool_calls.clone(),
        }));
        self.log_records(records).await?;
        if tool_calls.is_empty() {
            self.turn = None;
            return Ok(Next::Done { text });
        }
        let catalogs = self.live_catalogs().await?;
        let live = Live {
            grant: &self.grant,
            catalogs: &catalogs,
        };
        let native = self
            .turn
            .as_ref()
            .and_then(|turn| native_in_force(turn, self.deferral, &self.target))
            .map(|native| native.deferral.clone());
        let executed = self
            .executor
            .execute_native(&surface, &live, &tool_calls, native.as_ref())
            .await;
        // Whatever was logged (all of the step's results, or what came before an error) is
        // read into the history, so the history is the log's.
        self.sync_history().await?;
        executed?;
        self.next_request().await.map(Next::Request)
    }

    /// Adds a connection (a server already connected and whose catalogue is synced), or
    /// replaces the one of the same server. It is on the next turn's Surface.
    pub fn add_connection(&mut self, connection: ConnectionSpec) {
        self.connections.retain(|c| c.server != connection.server);
        self.connections.push(connection);
    }

    /// Removes a server's connection; it is gone from the next turn's Surface, and its calls
    /// are refused from now on by the guard if its tools leave the grant or catalogue. The
    /// input schemas compiled for its calls are dropped.
    pub fn remove_connection(&mut self, server: &psych_types::ServerId) {
        self.connections.retain(|c| &c.server != server);
        self.executor.forget_server(server);
    }

    /// The connections the next turn resolves.
    pub fn connections(&self) -> &[ConnectionSpec] {
        &self.connections
    }

    /// Replaces the grant. It holds at the next call (the guard re-checks every call) and
    /// shapes the next turn's Surface.
    pub fn set_grant(&mut self, grant: PermissionGrant) {
        self.grant = grant;
    }

    /// The grant in force.
    pub fn grant(&self) -> &PermissionGrant {
        &self.grant
    }

    /// Renders later requests for another provider (the next request already).
    pub fn set_target(&mut self, target: Target) {
        self.target = target;
    }

    /// The Surface of the turn under way, if any.
    pub fn surface(&self) -> Option<&Surface> {
        self.turn.as_ref().map(|t| &*t.surface)
    }

    /// Every record of the Run in log order, as prompt assembly reads it: messages and
    /// usage whole, each tool result as its stored summary (call id, name, kind, length,
    /// error flag, token estimate), its content left in the log. Read results whole with
    /// [`records`](Self::records), or a slice of one through [`log`](Self::log) as the
    /// reader does.
    pub fn history(&self) -> &History {
        &self.history
    }

    /// The records of the Run from sequence number `from` on, read whole from the log
    /// (every result's content with them: this reads as much as they hold). Blocking I/O.
    ///
    /// # Errors
    ///
    /// [`RunError::Read`] when a record does not read back ([`RunError::Store`] for a Run in
    /// another store).
    pub fn records(&self, from: u64) -> Result<Vec<LoggedRecord>, RunError> {
        if let Some(log) = &self.log {
            return log
                .iter_from(from)
                .map(|record| record.map_err(RunError::from))
                .collect();
        }
        // Up to the first sequence number without a record: handles are dense, and records
        // another process appended since this one counted are read too.
        let store = self.executor.store();
        let mut records = Vec::new();
        for seq in from.. {
            let handle = RecordHandle::new(store.run().clone(), seq);
            match store.record(&handle)? {
                Some(record) => records.push(LoggedRecord { handle, record }),
                None => break,
            }
        }
        Ok(records)
    }

    /// The Run's record log (for a reader, a transcript, `psych read`); `None` when its
    /// records are in another store ([`RunBuilder::records_in`]: read them through
    /// [`store`](Self::store)).
    pub fn log(&self) -> Option<&Arc<SharedRecordLog>> {
        self.log.as_ref()
    }

    /// The store the Run's records are in, whichever it is.
    pub fn store(&self) -> &Arc<DynRecordStore> {
        self.executor.store()
    }

    /// What opening the log found and repaired.
    pub fn recovery(&self) -> &Recovery {
        &self.recovery
    }

    /// The tokens spent so far: the sum of the logged provider-reported usage records, and
    /// nothing else.
    pub fn spent(&self) -> Spent {
        self.spent
    }

    /// What learned pinning chose when the Run opened ([`RunBuilder::learned_pinning`]);
    /// empty without it.
    pub fn pins(&self) -> &Pins {
        &self.pins
    }

    /// What the Run fixes when it first opens, and keeps at `path` (beside its log) so that
    /// a resume keeps it: the output-limit hints its servers' catalogues declare then, and
    /// (with `pinning`) the learned pins. A Run opened again takes them from the file
    /// whatever `pinning` or the catalogues are now; a Run resumed without a file (nothing
    /// was kept when it first opened, or a Run of an older build) takes neither, so its
    /// earlier turns and its tool prefix do not change. Off the async workers (file,
    /// catalogue and log reads).
    async fn settle(
        &mut self,
        limits: OutputLimits,
        pinning: Option<(ToolUsage, PinSettings)>,
        estimator: RunEstimator,
        path: PathBuf,
    ) -> Result<(), RunError> {
        let first_open = self.history.entries.is_empty();
        let catalog = self.catalog.clone();
        let connections = self.connections.clone();
        let grant = self.grant.clone();
        let disclosure = self.settings.clone();
        let opened = tokio::task::spawn_blocking(move || {
            if let Some(kept) = crate::pinning::kept_opened(&path)? {
                return Ok(kept);
            }
            if !first_open {
                return Ok(crate::pinning::Opened::default());
            }
            let catalogs = live_of(&catalog, &connections)?;
            let hints = OutputLimits::new()
                .with_declared_hints(&catalogs)
                .hints()
                .map(|(tool, tokens)| (tool.clone(), tokens))
                .collect();
            let pins = match pinning {
                Some((usage, settings)) => Some(crate::pinning::choose_pins(
                    &catalogs,
                    &connections,
                    &grant,
                    &disclosure,
                    estimator.as_ref(),
                    &usage,
                    &settings,
                )?),
                None => None,
            };
            let opened = crate::pinning::Opened { pins, hints };
            if !opened.is_empty() {
                crate::pinning::keep_opened(&path, &opened)?;
            }
            Ok::<_, RunError>(opened)
        })
        .await
        .map_err(RunError::Task)??;
        let limits = opened
            .hints
            .into_iter()
            .fold(limits, |limits, (tool, tokens)| limits.hinted(tool, tokens));
        self.elider = self.elider.with_limits(limits);
        if let Some(pins) = opened.pins {
            pins.apply(&mut self.connections);
            self.pins = pins;
        }
        Ok(())
    }

    /// Renders the request for the history as it stands (a request is then awaited).
    async fn next_request(&mut self) -> Result<RenderedRequest, RunError> {
        // Called with a turn under way; without one there is no request to give.
        let Some(turn) = self.turn.clone() else {
            return Err(RunError::OutOfTurn(TurnState::NoRequestWaiting));
        };
        let now = CurrentTime::utc((self.clock)()).map_err(psych_prompt_assembly::Error::from)?;
        let transient = Transient::at(now);
        // Reading the results sent whole, and the head and tail of a turn's results when
        // the boundary has just passed them, is I/O; assembling and rendering the history
        // (up to the window, hundreds of KB) is milliseconds of CPU: both off the async
        // threads.
        let log = Arc::clone(self.executor.store());
        let elider = self.elider.clone();
        let (deferral, target, tail) = (
            self.deferral,
            self.target.clone(),
            self.dynamic_tail.clone(),
        );
        let history = std::mem::take(&mut self.history);
        let mut projections = std::mem::take(&mut self.projections);
        let rendered = tokio::task::spawn_blocking(move || {
            let request = StepHistory::load(&history, &log, &elider, &mut projections)
                .map_err(psych_prompt_assembly::Error::from)
                .and_then(|step| {
                    let native = native_in_force(&turn, deferral, &target);
                    assemble_request(&turn, native, &tail, &step, &transient, &target)
                });
            (history, projections, request)
        })
        .await;
        let request = match rendered {
            Ok((history, projections, request)) => {
                self.history = history;
                self.projections = projections;
                request?
            }
            Err(e) => {
                self.lost_history();
                return Err(RunError::Task(e));
            }
        };
        self.awaiting = true;
        Ok(request)
    }

    /// Reads into the history the records the log holds past it (each one's header and
    /// metadata, not a result's content) and adds the usage records among them to
    /// [`spent`](Self::spent).
    async fn sync_history(&mut self) -> Result<(), RunError> {
        let log = Arc::clone(self.executor.store());
        let mut history = std::mem::take(&mut self.history);
        let from = history.len();
        let read = tokio::task::spawn_blocking(move || {
            let read = log.extend_history(&mut history);
            (history, read)
        })
        .await;
        match read {
            Ok((history, read)) => {
                self.history = history;
                self.spent.tally(&self.history.entries[from..]);
                read.map_err(RunError::from)
            }
            Err(e) => {
                self.lost_history();
                Err(RunError::Task(e))
            }
        }
    }

    /// After a blocking task holding the history failed: starts again from an empty
    /// history (and no spent tokens, no projections), which the next
    /// [`sync_history`](Self::sync_history) reads back from the log whole.
    fn lost_history(&mut self) {
        self.history = History::default();
        self.projections = ProjectionCache::new();
        self.spent = Spent::default();
    }

    /// Before a call, after one that did not end well: waits for the appends the last call
    /// left on the blocking pool (the log then holds all it ever will of them), then reads
    /// what the history has not: after a failure, the records past it (an append may have
    /// failed part-way; a blocking task's failure already emptied the history); after a
    /// drop, the history, the spent tokens and the projections whole, since the call may
    /// have held them in a blocking task that never gave them back. Nothing to do after a
    /// call that ended well. Cancel-safe: dropped itself, the next call reads all back.
    /// Leaves the Run marked [`Left::Dropped`] either way, for the call that follows to
    /// say how it ended.
    async fn recover(&mut self) -> Result<(), RunError> {
        let left = std::mem::replace(&mut self.left, Left::Dropped);
        if left != Left::Settled {
            self.executor.settled().await;
            if left == Left::Dropped {
                self.lost_history();
            }
            self.sync_history().await?;
        }
        Ok(())
    }

    /// Resolves this turn's Surface from the catalogue now, and its zone 1 and tools: on a
    /// blocking thread, as the Surface is (a catalogue of thousands of tools is copied into
    /// the turn's tools, and with native deferral into its deferred ones). Dropped mid-way,
    /// the blocking task still finishes and leaves the Surface cache consistent.
    async fn resolve_turn(&self) -> Result<Turn, RunError> {
        let resolve = self.surface_resolver();
        let instructions = self.instructions.clone();
        let reader = tool_definition(self.executor.limits());
        let deferral = self.deferral;
        tokio::task::spawn_blocking(move || {
            let surface = resolve()?;
            Ok(Self::turn_of(surface, instructions, reader, deferral))
        })
        .await
        .map_err(RunError::Task)?
    }

    /// A turn's zone 1 and tools from its Surface.
    fn turn_of(
        surface: Arc<Surface>,
        instructions: String,
        reader: ToolDefinition,
        deferral: DeferralMode,
    ) -> Turn {
        let zone1 = surface
            .deferred_lines()
            .iter()
            .fold(StaticSections::new(instructions), |zone, line| {
                zone.capability_note(line.clone())
            });
        let mut tools = surface.tools().to_vec();
        tools.push(reader.clone());
        let native = match deferral {
            DeferralMode::Native => {
                let deferred = surface.deferred_tools();
                (!deferred.is_empty()).then(|| {
                    let mut tools = surface.native_tools();
                    tools.push(reader);
                    NativeTurn {
                        tools,
                        deferral: NativeDeferral::new(deferred, SearchTool::client()),
                    }
                })
            }
            _ => None,
        };
        Turn {
            surface,
            zone1,
            tools,
            native,
        }
    }

    /// What reads every connected server's live catalogue and resolves their Surface through
    /// the Run's [`SurfaceCache`] (an unchanged setup answers the last turn's Surface; a
    /// changed one prepares only the servers that changed), with its search indexes built:
    /// redb reads and CPU work, run on a blocking thread ([`Run::resolve_turn`]).
    fn surface_resolver(&self) -> impl FnOnce() -> Result<Arc<Surface>, RunError> + Send + 'static {
        let catalog = self.catalog.clone();
        let cache = Arc::clone(&self.surfaces);
        let connections = self.connections.clone();
        let grant = self.grant.clone();
        let settings = self.settings.clone();
        move || {
            let catalogs = live_of(&catalog, &connections)?;
            let inputs = Inputs {
                connections: &connections,
                catalogs: &catalogs,
                grant: &grant,
            };
            let surface = cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .resolve(&inputs, &settings)?;
            surface.prepare_search();
            Ok::<_, RunError>(surface)
        }
    }

    /// The live catalogue of every connected server, read now (off the async threads).
    async fn live_catalogs(&self) -> Result<Vec<ServerCatalog>, RunError> {
        let catalog = self.catalog.clone();
        let connections = self.connections.clone();
        tokio::task::spawn_blocking(move || live_of(&catalog, &connections))
            .await
            .map_err(RunError::Task)?
            .map_err(RunError::from)
    }

    /// Appends records in one batch and reads them into the history.
    async fn log_records(&mut self, records: Vec<Record>) -> Result<(), RunError> {
        if records.is_empty() {
            return Ok(());
        }
        self.executor.append(records).await.map_err(|e| match e {
            ExecuteError::Append(e) => RunError::Append(e),
            ExecuteError::Store(e) => RunError::Store(e),
            other => RunError::Execute(other),
        })?;
        self.sync_history().await
    }

    /// Logs a failed [`INTERRUPTED`] result for every call of the last assistant message
    /// that has none, in call order.
    async fn close_unanswered(&mut self) -> Result<(), RunError> {
        let records: Vec<Record> = unanswered(&self.history)
            .into_iter()
            .map(|call| {
                Record::ToolResult(ToolResult {
                    target: None,
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    output: ToolOutput::error(INTERRUPTED),
                })
            })
            .collect();
        self.log_records(records).await
    }
}

impl<H: ToolHost + 'static> RunBuilder<H> {
    /// The servers the Run starts with (each connected, its catalogue synced).
    pub fn connections(mut self, connections: impl IntoIterator<Item = ConnectionSpec>) -> Self {
        self.connections = connections.into_iter().collect();
        self
    }

    /// The grant: which servers and tools the model may reach.
    pub fn grant(mut self, grant: PermissionGrant) -> Self {
        self.grant = grant;
        self
    }

    /// Disclosure's settings (budgets, tiers, the tool cap). The Run reserves in the tool
    /// cap the tools it adds to every Surface ([`EXECUTOR_TOOLS`](crate::EXECUTOR_TOOLS),
    /// on top of any [`reserved_tools`](psych_disclosure::SettingsBuilder::reserved_tools)
    /// already set), so a request never carries more than the cap.
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The projector of results before the elision boundary: its thresholds and preview
    /// settings. Results are sized with the Run's [`estimator`](Self::estimator), not the
    /// elider's.
    pub fn elider(mut self, elider: Elider) -> Self {
        self.elider = elider;
        self
    }

    /// The token estimator of the Run, set once for every estimate it makes: disclosure's
    /// cost of each server's tools (the auto budget, the direct tier, a facade's index
    /// line), the estimate the log stores with each result, and elision's sizing of
    /// results against its thresholds (from those stored estimates). Default:
    /// psych-elision's [`Estimator`]. An estimate never feeds metering: spent tokens are
    /// the provider's usage ([`Run::spent`]).
    ///
    /// A Run reopened with another estimator keeps the estimates its log already stores
    /// for the results logged before.
    pub fn estimator(mut self, estimator: impl TokenEstimator + Send + Sync + 'static) -> Self {
        self.estimator = Arc::new(estimator);
        self
    }

    /// Zone 1's instructions, the system prompt (the deferred lines are added after them
    /// each turn). Default: none; zone 1 then holds only the deferred lines.
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = instructions.into();
        self
    }

    /// Zone 2: memories and other per-user text.
    pub fn dynamic_tail(mut self, tail: DynamicTail) -> Self {
        self.dynamic_tail = tail;
        self
    }

    /// How deferred servers' tools reach the model: Psych's meta tools (the default), or
    /// [`DeferralMode::Native`]: the deferred tools sent with `defer_loading` and Psych's
    /// search tool ([`SearchTool::client`]), whose calls the executor answers. Native
    /// deferral applies where [`choose_deferral`] allows it (Anthropic Messages and OpenAI
    /// Responses, at most
    /// [`MAX_DEFERRED_TOOLS`](psych_prompt_assembly::MAX_DEFERRED_TOOLS)); elsewhere the
    /// turn falls back to the meta tools.
    pub fn deferral(mut self, mode: DeferralMode) -> Self {
        self.deferral = mode;
        self
    }

    /// The clock of the transient message, in Unix seconds (fix it for snapshots).
    pub fn clock(mut self, clock: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// When the log's appends are acknowledged.
    pub fn sync_policy(mut self, sync: SyncPolicy) -> Self {
        self.sync = sync;
        self
    }

    /// The deadline of each forwarded call (default
    /// [`DEFAULT_CALL_TIMEOUT`](crate::DEFAULT_CALL_TIMEOUT)). It bounds the whole call, its answer's transfer included: with a host that has its
    /// own deadline for silence (psych-mcp's `Timeouts`), set it to that host's longest call
    /// (`Timeouts::longest_call`), so that a large answer still arriving is not cut here.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// What the orientation payload says of tenant, user, conventions and state.
    pub fn orientation_context(mut self, context: OrientationContext) -> Self {
        self.orientation = context;
        self
    }

    /// The reader's limits (`read_tool_output`).
    pub fn reader_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Servers started only when a call needs them: a call to one that is not running
    /// starts it and is guarded against the listing its start stored
    /// ([`Executor::on_demand`]); with psych-mcp, `LazyStarts` (feature `mcp`) over the
    /// manager whose lazy servers the Run calls. Without it, every server is called as it
    /// is (a stopped lazy server is still started by its call, but against the kept
    /// listing).
    pub fn on_demand(mut self, on_demand: Arc<dyn crate::OnDemand>) -> Self {
        self.on_demand = Some(on_demand);
        self
    }

    /// Learned pinning: when the Run first opens, the tools of its deferred servers that
    /// `usage` (earlier Runs: [`usage_in_logs`](crate::usage_in_logs) reads a folder's)
    /// shows most used are chosen within `settings` ([`choose_pins`](crate::choose_pins),
    /// on the Surface the Run's connections resolve to then) and added to their
    /// connections' eager tools for the Run's whole life: each is a direct tool from the
    /// first request, and the tool prefix does not change inside the Run. [`Run::pins`]
    /// says what was chosen and why.
    ///
    /// The choice is kept beside the log, in `<dir>/<run>.opened.json`, and a Run opened
    /// again (resumed) takes it from there whatever `usage` is now; a Run resumed that had
    /// no pins when it first opened gets none. (With [`records_in`](Self::records_in) the
    /// file is still in `dir`: a worker on another machine resuming the Run has no file,
    /// and so no pins.)
    #[must_use]
    pub fn learned_pinning(mut self, usage: ToolUsage, settings: PinSettings) -> Self {
        self.pinning = Some((usage, settings));
        self
    }

    /// Output limits per server and tool (what an `mcpServers` file's `output` entries set:
    /// `McpConfig::output_limits` in psych-mcp): a tool's successful results are elided at
    /// its own per-result threshold and previewed with its own head and tail. The hints the
    /// connected servers declare (`anthropic/maxResultSizeChars` in a tool's `_meta`, at 4
    /// characters a token) are taken from their catalogues when the Run first opens, kept
    /// in `<dir>/<run>.opened.json` for its resumes, and only raise a threshold the user
    /// did not set. Fixed for the Run's life, like every threshold, so earlier turns'
    /// views never change (a Run resumed without that file takes no hint). These limits
    /// replace any an [`Elider`] given to [`elider`](Self::elider) holds. Checked when the
    /// Run opens: a per-result threshold over the elider's per-batch one is
    /// [`RunError::Limits`].
    #[must_use]
    pub fn output_limits(mut self, limits: OutputLimits) -> Self {
        self.output_limits = limits;
        self
    }

    /// Shares `budget` with the other Runs (and executors) given it: the result text this
    /// Run's steps pass by reference counts against it while their calls hold it
    /// ([`PassingBudget`](crate::PassingBudget)), so many Runs of one process hold at most
    /// the budget together. Without one, each step is bounded alone
    /// ([`reader_limits`](Self::reader_limits)' `max_passed_bytes`).
    #[must_use]
    pub fn passing_budget(mut self, budget: crate::PassingBudget) -> Self {
        self.passing = Some(budget);
        self
    }

    /// The most calls of one reply that run (default
    /// [`DEFAULT_MAX_CALLS_PER_STEP`](crate::DEFAULT_MAX_CALLS_PER_STEP)); the rest are
    /// answered with a failed result saying so
    /// ([`Executor::max_calls_per_step`](crate::Executor::max_calls_per_step)).
    #[must_use]
    pub fn max_calls_per_step(mut self, calls: usize) -> Self {
        self.max_calls = calls;
        self
    }

    /// Whether each call's guard runs off the async worker
    /// ([`Executor::off_worker_guard`](crate::Executor::off_worker_guard); off by default).
    /// Set it when the Run is polled by tasks of a multi-threaded runtime, never inside a
    /// `LocalSet` on one.
    #[must_use]
    pub fn off_worker_guard(mut self, off: bool) -> Self {
        self.off_worker = off;
        self
    }

    /// Keeps the Run's records in `stores` (the PostgreSQL store,
    /// `psych_store_postgres::PgBlocking`) as Run `run` of `identity`, instead of
    /// `<dir>/<run>.plog`: a worker on another machine opening the same Run of the same
    /// identity resumes it, its handles included. The sync policy does not apply (the
    /// store commits each append durably).
    ///
    /// One worker at a time: unlike the record log's file, nothing locks the Run against a
    /// second worker opening it while the first still runs it (that worker would close the
    /// first one's calls in flight as interrupted). Fencing an earlier writer is not built
    /// yet; the caller that hands Runs to workers must keep them apart.
    #[must_use]
    pub fn records_in(
        mut self,
        stores: Arc<dyn RecordStores>,
        identity: impl Into<String>,
    ) -> Self {
        self.stores = Some((stores, identity.into()));
        self
    }

    /// Opens the Run's log (creating it, or resuming it: a torn tail is cut back and
    /// reported in [`Run::recovery`], every call left without a result gets a logged
    /// [`INTERRUPTED`] result).
    ///
    /// # Errors
    ///
    /// [`RunError::Settings`] when the tool cap has no room for the Run's own tools,
    /// [`RunError::Open`] for a log that does not open (corrupt in the middle, locked,
    /// a sync policy out of bounds), [`RunError::Read`] for a record that does not read
    /// back, [`RunError::Append`] when the repair cannot be logged; [`RunError::Store`] for
    /// any of these in a store given by [`records_in`](RunBuilder::records_in).
    pub async fn open(self) -> Result<Run<H>, RunError> {
        // The tools every turn sends beside the Surface's are reserved in its tool cap.
        let settings = crate::reserve_executor_tools(&self.settings)?;
        self.output_limits
            .check(self.elider.thresholds().per_batch())?;
        let (dir, run, sync, stores) = (self.dir, self.run, self.sync, self.stores);
        let opened_path = crate::pinning::opened_path(&dir, &run);
        // One estimator for disclosure, the log and elision. Results are logged with its
        // estimate, so projecting them later needs no pass over their content.
        let estimator: RunEstimator = self.estimator;
        let elider = Elider::builder()
            .estimator(estimator.clone())
            .thresholds(*self.elider.thresholds())
            .preview(*self.elider.preview_config())
            .build();
        let logged = Arc::clone(&estimator);
        let pin_estimator = Arc::clone(&estimator);
        let (log, store, history, recovery) = tokio::task::spawn_blocking(move || {
            if let Some((stores, identity)) = stores {
                // Resumed wherever it was written: the store holds only acknowledged
                // records, whole (nothing to cut back).
                let store = stores.open(&identity, &run, logged)?;
                let mut history = History::default();
                store.extend_history(&mut history)?;
                let recovery = Recovery {
                    records: store.len(),
                    tail: None,
                };
                return Ok::<_, RunError>((None, store, history, recovery));
            }
            let (mut log, recovery) = RecordLog::open(&dir, &run, sync)?;
            log.set_estimator(logged);
            let history = log.history()?;
            let log = Arc::new(SharedRecordLog::new(log));
            let store: Arc<DynRecordStore> = Arc::new(Erased(Arc::clone(&log)));
            Ok((Some(log), store, history, recovery))
        })
        .await
        .map_err(RunError::Task)??;
        let mut executor = Executor::on_store(self.host, store)
            .call_timeout(self.call_timeout)
            .orientation_context(self.orientation)
            .reader_limits(self.limits)
            .max_calls_per_step(self.max_calls)
            .off_worker_guard(self.off_worker);
        if let Some(on_demand) = self.on_demand {
            executor = executor.on_demand(on_demand);
        }
        if let Some(budget) = self.passing {
            executor = executor.passing_budget(budget);
        }
        let mut spent = Spent::default();
        spent.tally(&history.entries);
        let mut run = Run {
            history,
            projections: ProjectionCache::new(),
            left: Left::Settled,
            spent,
            log,
            executor,
            catalog: self.catalog,
            connections: self.connections,
            grant: self.grant,
            settings,
            surfaces: Arc::new(Mutex::new(SurfaceCache::new(estimator))),
            elider,
            instructions: self.instructions,
            dynamic_tail: self.dynamic_tail,
            target: self.target,
            deferral: self.deferral,
            clock: self.clock,
            turn: None,
            awaiting: false,
            recovery,
            pins: Pins::default(),
        };
        run.settle(self.output_limits, self.pinning, pin_estimator, opened_path)
            .await?;
        run.close_unanswered().await?;
        Ok(run)
    }
}

/// The turn's native deferral, when it has one and the target's provider takes it
/// ([`choose_deferral`]).
fn native_in_force<'t>(
    turn: &'t Turn,
    mode: DeferralMode,
    target: &Target,
) -> Option<&'t NativeTurn> {
    turn.native.as_ref().filter(|native| {
        choose_deferral(mode, target.provider(), native.deferral.tools().len())
            == DeferralMode::Native
    })
}

/// The one call into prompt-assembly: the turn's zones and tools (natively deferred when
/// `native` is given), the step's history (its earlier turns projected by elision), the
/// transient message; rendered for the target.
fn assemble_request(
    turn: &Turn,
    native: Option<&NativeTurn>,
    dynamic_tail: &DynamicTail,
    step: &StepHistory,
    transient: &Transient,
    target: &Target,
) -> Result<RenderedRequest, psych_prompt_assembly::Error> {
    let tools = native.map_or(&turn.tools, |native| &native.tools);
    let prompt =
        Assembler::new(&turn.zone1, dynamic_tail, tools).assemble_history(step, transient)?;
    let deferral = native.map(|native| native.deferral.clone());
    Ok(match (target, deferral) {
        (Target::Anthropic(options), Some(deferral)) => {
            prompt.render_anthropic(&options.clone().native_deferral(deferral))?
        }
        (Target::Anthropic(options), None) => prompt.render_anthropic(options)?,
        (Target::OpenAi(options), _) => prompt.render_openai(options)?,
        (Target::Responses(options), Some(deferral)) => {
            prompt.render_responses(&options.clone().native_deferral(deferral))?
        }
        (Target::Responses(options), None) => prompt.render_responses(options)?,
    })
}

/// How a call left the Run ([`Run::recover`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Left {
    /// As its log says: the call ended well, or was refused out of turn before it did
    /// anything.
    Settled,
    /// It failed: the history may be behind the log.
    Failed,
    /// It is under way, or was dropped before it ended: the history, the projections and
    /// the spent tokens may be lost.
    Dropped,
}

impl Left {
    /// How a call that answered `result` left the Run.
    fn after<T>(result: &Result<T, RunError>) -> Self {
        match result {
            Ok(_) | Err(RunError::OutOfTurn(_)) => Self::Settled,
            Err(_) => Self::Failed,
        }
    }
}

/// Gives each of `calls` whose id `history` or an earlier one of `calls` already holds a
/// fresh id (see [`Run::reply`]), so that every call of the Run has its own.
fn fresh_call_ids(history: &History, calls: &mut [ToolCall]) {
    let mut used: BTreeSet<String> = history
        .entries
        .iter()
        .flat_map(|entry| match &entry.item {
            HistoryItem::Record(Record::Assistant(message)) => message
                .tool_calls
                .iter()
                .map(|call| call.id.as_str().to_owned())
                .collect(),
            _ => Vec::new(),
        })
        .collect();
    for call in calls {
        if used.insert(call.id.as_str().to_owned()) {
            continue;
        }
        let id = call.id.as_str();
        let fresh = (2u64..)
            .map(|n| {
                let suffix = format!("_{n}");
                // Ids are ASCII (`[A-Za-z0-9_-]`), so any byte is a cut point.
                let keep = id.len().min(MAX_CALL_ID - suffix.len());
                format!("{}{suffix}", id.get(..keep).unwrap_or(id))
            })
            .find(|candidate| !used.contains(candidate));
        if let Some(fresh) = fresh
            && let Ok(fresh_id) = ToolCallId::new(fresh.clone())
        {
            used.insert(fresh);
            call.id = fresh_id;
        }
    }
}

/// Keeps as their JSON text (a [`Value::String`](serde_json::Value::String), as arguments
/// that did not parse are kept) the arguments of each call that nest deeper than
/// [`MAX_ARGUMENT_DEPTH`]: nested deeper than the log reads back with the record around
/// them, they would make the Run's history unreadable (see [`Run::reply`]).
fn storable_arguments(calls: &mut [ToolCall]) {
    for call in calls {
        if psych_types::json::nests_deeper(&call.arguments, MAX_ARGUMENT_DEPTH) {
            call.arguments =
                serde_json::Value::String(psych_types::json::to_compact(&call.arguments));
        }
    }
}

/// The deepest a call's arguments may nest and be logged as they are: half of
/// [`psych_types::json::MAX_DEPTH`], the rest left for the record around them (a few
/// levels) with room to spare.
const MAX_ARGUMENT_DEPTH: usize = psych_types::json::MAX_DEPTH / 2;

/// The longest [`ToolCallId`].
const MAX_CALL_ID: usize = 128;

/// The calls of the last assistant message that no later record answers.
fn unanswered(history: &History) -> Vec<&ToolCall> {
    let entries = &history.entries;
    let Some(last) = entries
        .iter()
        .rposition(|e| matches!(e.item, HistoryItem::Record(Record::Assistant(_))))
    else {
        return Vec::new();
    };
    let HistoryItem::Record(Record::Assistant(message)) = &entries[last].item else {
        return Vec::new();
    };
    let answered: BTreeSet<&str> = entries[last + 1..]
        .iter()
        .filter_map(|e| match &e.item {
            HistoryItem::Result(stored) => Some(stored.info.call_id.as_str()),
            HistoryItem::Record(Record::ToolResult(result)) => Some(result.call_id.as_str()),
            _ => None,
        })
        .collect();
    message
        .tool_calls
        .iter()
        .filter(|call| !answered.contains(call.id.as_str()))
        .collect()
}

/// The system clock in Unix seconds.
fn system_seconds() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The live catalogue of each connection's server, read now, in the connections' order.
/// Blocks (catalogue reads): call it off the async workers.
fn live_of(
    catalog: &Catalog,
    connections: &[ConnectionSpec],
) -> Result<Vec<ServerCatalog>, psych_catalog::CatalogError> {
    connections
        .iter()
        .map(|connection| catalog.live(&connection.server))
        .collect()
}
