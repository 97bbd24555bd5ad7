//! The executor: one step's tool calls, routed and logged.
//!
//! Each route is a small function handing off to the crate that owns the policy: the
//! disclosure guard decides what a call means and whether it is permitted now; the reader
//! answers `read_tool_output`; orientation builds its payload; the [`ToolHost`] runs what is
//! forwarded. The executor only orders, bounds and logs.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use psych_disclosure::{Live, OrientationContext, Surface, Validators, Verdict, orientation};
use psych_prompt_assembly::NativeDeferral;
use psych_reader_tool::passing::{PassError, ReferenceError, Referenced};
use psych_reader_tool::{CallError, Limits, Reader, ResultReference};
use psych_record_log::{OpenError, RecordLog, SharedRecordLog};
use psych_types::{
    DynRecordStore, Erased, RecordFailure, RecordSource as _, RecordStore as _, StoreError,
};
use psych_types::{
    HostAnswer, InputRound, LoggedRecord, ProgressSink, READ_TOOL_OUTPUT, Reachability, Record,
    RecordHandle, ServerCatalog, ServerHealth, ServerId, ToolCall, ToolHost, ToolOutput, ToolRef,
    ToolResult,
};
use serde_json::Value;
use tokio::task::{Id, JoinError, JoinSet};

use crate::budget::{PassingBudget, Reserved};
use crate::error::ExecuteError;

/// The default deadline of one forwarded call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The default of [`Executor::max_calls_per_step`]: the most calls of one step that run.
/// Far above what a model makes at once (a few, rarely a dozen), and what bounds a step's
/// memory: each call's answer is held until the step is logged, and the number of calls
/// is the model's to choose.
pub const DEFAULT_MAX_CALLS_PER_STEP: usize = 64;

/// How many tools the [`Executor`] answers that no Surface lists: `read_tool_output`.
///
/// A request that sends them beside a Surface's tools needs their slots in disclosure's
/// tool cap, or a Surface resolved right at the cap makes every request one tool too many
/// (OpenAI refuses more than 128): reserve them with
/// [`SettingsBuilder::reserved_tools`](psych_disclosure::SettingsBuilder::reserved_tools).
/// A [`Run`](crate::Run) does so itself; a caller composing the executor with a Surface
/// of its own (an MCP gateway listing `read_tool_output` to its client) reserves them in
/// the settings it resolves with. Native deferral's search tool needs no slot of its own:
/// it takes the place of the meta tools, which the Surface counts.
pub const EXECUTOR_TOOLS: usize = 1;

/// `settings` with [`EXECUTOR_TOOLS`] reserved in the tool cap on top of the caller's own
/// reserve: what a [`Run`](crate::Run) resolves with, and what a caller listing the
/// executor's tools beside a Surface of its own (psych-gateway, `psych budget`) resolves
/// with, so the request stays within the cap.
///
/// # Errors
///
/// Disclosure's [`SettingsError`](psych_disclosure::SettingsError) when the cap has no room
/// left for the fixed tools.
pub fn reserve_executor_tools(
    settings: &psych_disclosure::Settings,
) -> Result<psych_disclosure::Settings, psych_disclosure::SettingsError> {
    settings
        .to_builder()
        .reserved_tools(settings.reserved_tools().saturating_add(EXECUTOR_TOOLS))
        .build()
}

/// What [`OnDemand::start`] answers: the server's live catalogue once it is started and
/// listed, or why it could not be.
pub type StartFuture<'a> = Pin<
    Box<
        dyn Future<Output = Result<ServerCatalog, Box<dyn std::error::Error + Send + Sync>>>
            + Send
            + 'a,
    >,
>;

/// Servers started only when a call needs them, as the [`Executor`] sees them
/// ([`Executor::on_demand`]). psych-runtime's `LazyStarts` (feature `mcp`) is psych-mcp's
/// lazy servers with the catalogue's freshener.
///
/// Before a step's calls are guarded, every server a permitted call would be forwarded to
/// ([`Surface::call_server`]) that [`needs_start`](Self::needs_start) is started once (and
/// listed, the listing stored in the catalogue), and the step's calls are guarded against
/// that fresh listing: a tool it no longer has is refused as removed, a changed schema
/// validated as changed. A server that cannot be started answers each of its calls with a
/// failed result naming why; the step's other calls are untouched.
pub trait OnDemand: Send + Sync {
    /// Whether a call to `server` must start it first: it is started on demand and is not
    /// running now. Cheap: asked for every forwarded call.
    fn needs_start(&self, server: &ServerId) -> bool;

    /// Starts `server`, lists it and stores the listing in the catalogue; answers the
    /// server's live catalogue as stored then. Dropped part way, the start and its listing
    /// go on without the caller (nothing is lost: the catalogue stores the listing when it
    /// comes).
    fn start<'a>(&'a self, server: &'a ServerId) -> StartFuture<'a>;

    /// The server's state for the orientation payload (say, `known (listed 3 h ago), not
    /// started`), given its health in the catalogue read for the call, or `None` for a
    /// server that is not started on demand (its catalogue's state stands). Asked only for
    /// a server with a kept listing that the catalogue does not report unreachable (the
    /// state that says why stands).
    fn state(&self, server: &ServerId, health: Option<&ServerHealth>) -> Option<String>;
}

/// What starting a step's stopped servers left: the catalogues to guard the step against
/// (`None` when nothing was started), and why each server that could not start did not.
#[derive(Default)]
struct Starts {
    catalogs: Option<Vec<ServerCatalog>>,
    failed: BTreeMap<ServerId, String>,
}

impl Starts {
    /// `live` with the catalogues read after the starts.
    fn live<'a>(&'a self, live: &Live<'a>) -> Live<'a> {
        Live {
            grant: live.grant,
            catalogs: self.catalogs.as_deref().unwrap_or(live.catalogs),
        }
    }

    /// The failed result of `call` when its server could not start: answered before the
    /// guard, so the reason is this start's (not an earlier failure's the catalogue holds).
    fn failure(&self, surface: &Surface, live: &Live<'_>, call: &ToolCall) -> Option<ToolOutput> {
        if self.failed.is_empty() {
            return None;
        }
        let server = surface.call_server(&call.name, &call.arguments, live)?;
        self.failed.get(&server).map(|why| {
            ToolOutput::error(format!(
                "{} was not called: MCP server {server} is started when a call needs it, and \
                 it could not be started: {why}",
                call.name
            ))
        })
    }
}

/// Runs one step's tool calls and logs their results.
///
/// For each call, in the order the model made them: `read_tool_output` goes to
/// psych-reader-tool over the Run's log; any other name goes through
/// [`Surface::guard`] against the grant and catalogues as they are at call time, and its
/// [`Verdict`] decides: an answer (a listing, a description, a search), the orientation
/// payload, a refusal (each through its `to_output()`), or a call forwarded to the
/// [`ToolHost`] under a per-call deadline. Forwarded calls and reads run concurrently; the
/// results are then appended to the log in call order, whole, in one batch (one sync), before
/// anything reads them. A call whose task panicked is answered with a failed result that
/// says so, and the step's other results are logged with it.
///
/// The executor knows nothing of prompts: `psych serve` reuses it for an MCP client.
///
/// Why one batch after every call ends rather than each result as it comes (group commit):
/// a result logged as it completes lands in completion order, and the log's order is the
/// order the model made its calls (so a transcript, and a resumed Run, read the step as it
/// was made). A batch is one `fdatasync` for the step, contiguous and in order; what it costs
/// is that a result finished early is not durable until the slowest call of its step ends:
/// a crash in between loses it and the resumed Run logs it as interrupted.
pub struct Executor<H> {
    host: Arc<H>,
    log: Arc<DynRecordStore>,
    archive: Option<Arc<dyn Archive>>,
    validators: Validators,
    call_timeout: Duration,
    orientation: OrientationContext,
    limits: Limits,
    on_demand: Option<Arc<dyn OnDemand>>,
    passing: Option<PassingBudget>,
    /// The most calls of one step that run ([`Executor::max_calls_per_step`]).
    max_calls: usize,
    /// Whether the guard runs off the async worker ([`Executor::off_worker_guard`]).
    off_worker: bool,
    /// How many of this executor's appends are on the blocking pool (or queued for it):
    /// an execution dropped mid-way leaves its append to run there ([`Executor::settled`]).
    appending: Arc<tokio::sync::watch::Sender<u64>>,
}

/// One append counted in [`Executor::settled`]'s count until it is dropped: moved into the
/// blocking task, so it counts until the append has run, or until the task is dropped
/// unrun (a runtime shutting down).
struct Appending(Arc<tokio::sync::watch::Sender<u64>>);

impl Appending {
    fn start(count: &Arc<tokio::sync::watch::Sender<u64>>) -> Self {
        count.send_modify(|n| *n += 1);
        Self(Arc::clone(count))
    }
}

impl Drop for Appending {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl<H> std::fmt::Debug for Executor<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("run", self.log.run())
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

/// What one call became before it is logged.
enum Pending {
    /// Answered without waiting (an answer, orientation, a refusal).
    Ready(ToolOutput),
    /// Running in the step's task set.
    Running,
    /// Refused: a result reference naming a result the caller may not read
    /// (`invalid_deferred_handle`, as a read's). Logged as a failed result saying so, and
    /// the error returned. With the reference's JSON pointer in the call's arguments.
    Failed(ExecuteError, String),
}

/// What became of a call's result references ([`psych_reader_tool::passing`]).
enum Passing {
    /// Every reference replaced: the call to guard and forward, and the bytes it passed.
    Passed(Passed),
    /// A reference the model must fix (malformed, too large, past the end, not JSON, its
    /// Run's log gone or failing): the call's result says why; nothing is forwarded.
    Refused(ToolOutput),
    /// A reference to a result the caller may not read, at this JSON pointer of the call's
    /// arguments.
    Invalid(ExecuteError, String),
}

/// A call whose references were replaced by `bytes` of results. Freed on a blocking thread
/// when they are over [`FREE_ON_WORKER`]: freeing 16 MiB of small JSON values takes 20 to
/// 50 ms, too long for an async worker.
struct Passed {
    call: ToolCall,
    bytes: u64,
    /// The passing budget's reservation for them, given back once they are freed.
    held: Reserved,
}

/// The most bytes of passed results a call frees on the thread that drops it: 1 MiB.
const FREE_ON_WORKER: u64 = 1024 * 1024;

impl Drop for Passed {
    fn drop(&mut self) {
        // Not awaited: nothing waits for memory to be freed.
        let arguments = std::mem::take(&mut self.call.arguments);
        let held = std::mem::replace(&mut self.held, Reserved::none());
        drop(free_off_worker((arguments, held), self.bytes));
    }
}

/// Frees `passed` (arguments holding `bytes` of passed results, and what else goes with
/// them): on a blocking thread when the bytes are over [`FREE_ON_WORKER`] and a runtime is
/// there, returning that thread's task; else here, returning `None`.
fn free_off_worker<T: Send + 'static>(
    passed: T,
    bytes: u64,
) -> Option<tokio::task::JoinHandle<()>> {
    if bytes <= FREE_ON_WORKER {
        return None;
    }
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    Some(runtime.spawn_blocking(move || drop(passed)))
}

/// The process's budget of passed results stayed busy past the call deadline.
#[derive(Debug, Clone, Copy)]
struct BudgetBusy(Duration);

impl BudgetBusy {
    /// What a call that passes results is answered with.
    fn output(&self, call: &ToolCall) -> ToolOutput {
        ToolOutput::error(format!(
            "{}: nothing was sent: the results passed by other calls filled this process's \
             budget of passed results for {} s; call it again, or pass a smaller slice",
            call.name,
            self.0.as_secs()
        ))
    }
}

/// Whether `call` passes results by reference (a read's arguments are its own).
fn passes_results(call: &ToolCall) -> bool {
    call.name != READ_TOOL_OUTPUT && psych_reader_tool::passing::has_reference(&call.arguments)
}

/// What a task of the step answers: the call's position and its output, or the typed
/// handle error of a read.
type Done = (usize, Result<ToolOutput, ExecuteError>);

impl<H: ToolHost + 'static> Executor<H> {
    /// An executor forwarding to `host` and logging to `log`, with
    /// [`DEFAULT_CALL_TIMEOUT`], an empty orientation context and the reader's default
    /// limits.
    pub fn new(host: Arc<H>, log: Arc<SharedRecordLog>) -> Self {
        Self::on_store(host, Arc::new(Erased(log)))
    }

    /// An executor forwarding to `host` and logging to `store`: any record store (the
    /// record log, the PostgreSQL store), as [`new`](Self::new) otherwise.
    pub fn on_store(host: Arc<H>, log: Arc<DynRecordStore>) -> Self {
        Self {
            host,
            log,
            archive: None,
            validators: Validators::new(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            orientation: OrientationContext::default(),
            limits: Limits::default(),
            on_demand: None,
            passing: None,
            max_calls: DEFAULT_MAX_CALLS_PER_STEP,
            off_worker: false,
            appending: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }

    /// Waits until every append this executor's executions (and a [`Run`](crate::Run)'s
    /// own records) handed to the blocking pool has run, those of executions dropped mid-way
    /// included (an execution dropped after its results went to the log's blocking append
    /// leaves the append to finish there). After it, the log holds all it ever will of the
    /// executions that ended or were dropped before the call; an execution still running may
    /// append more, and what a caller appends to the store itself is not counted.
    /// Cancel-safe.
    pub async fn settled(&self) {
        let mut count = self.appending.subscribe();
        // The sender lives as long as `self`: waiting cannot fail while it is borrowed.
        let _ = count.wait_for(|n| *n == 0).await;
    }

    /// Appends `records` in one batch (on the blocking pool, counted for
    /// [`settled`](Self::settled)).
    pub(crate) async fn append(
        &self,
        records: Vec<Record>,
    ) -> Result<Vec<LoggedRecord>, ExecuteError> {
        append(&self.log, &self.appending, records).await
    }

    /// Shares `budget` with the other executors given it: the replaced arguments of this
    /// executor's calls count against it while they are held (and the
    /// [`read_reference`](Self::read_reference) answers of a caller that reserves them with
    /// [`reserve_passed`](Self::reserve_passed)), an execution waiting until its bound is
    /// free ([`PassingBudget`]), at most the call deadline: past it, its calls that pass
    /// results fail with a result saying the budget was busy, and nothing of them is
    /// forwarded. Without one, each execution is bounded alone
    /// ([`Limits::max_passed_bytes`]). A budget smaller than that bound lowers it.
    pub fn passing_budget(mut self, budget: PassingBudget) -> Self {
        self.passing = Some(budget);
        self
    }

    /// The bound of one execution's passed bytes (and of one
    /// [`read_reference`](Self::read_reference)): the reader's
    /// ([`Limits::max_passed_bytes`]), at most the budget's.
    pub fn passing_bound(&self) -> u64 {
        let bound = self.limits.max_passed_bytes();
        self.passing
            .as_ref()
            .map_or(bound, |budget| bound.min(budget.bytes()))
    }

    /// Reserves `bytes` (at most the budget) in the executor's budget, waiting until they
    /// are free, at most the call deadline (`None` past it); nothing without a budget.
    /// What a caller of [`read_reference`](Self::read_reference) holds, and hands it, while
    /// it holds the text read. Cancel-safe.
    pub async fn reserve_passed(&self, bytes: u64) -> Option<Reserved> {
        match &self.passing {
            Some(budget) => tokio::time::timeout(self.call_timeout, budget.reserve(bytes))
                .await
                .ok(),
            None => Some(Reserved::none()),
        }
    }

    /// Reserves the execution's whole bound in the budget, if there is one and a call of
    /// `calls` passes results; `Err` when the budget stayed busy past the call deadline.
    async fn reserve_passing<'c>(
        &self,
        mut calls: impl Iterator<Item = &'c ToolCall>,
    ) -> Result<Reserved, BudgetBusy> {
        if self.passing.is_none() || !calls.any(passes_results) {
            return Ok(Reserved::none());
        }
        self.reserve_passed(self.passing_bound())
            .await
            .ok_or(BudgetBusy(self.call_timeout))
    }

    /// Starts the servers that are started only when a call needs them before guarding
    /// their calls, and guards those calls against the listing the start stored (see
    /// [`OnDemand`]); the orientation payload shows their states.
    pub fn on_demand(mut self, on_demand: Arc<dyn OnDemand>) -> Self {
        self.on_demand = Some(on_demand);
        self
    }

    /// Sets the deadline of each forwarded call. A call past it is answered with a failed
    /// result naming the server, the tool and the deadline (the host's own deadline, if
    /// shorter, applies first). It bounds the whole call, its answer's transfer included:
    /// with a host that has its own deadline for silence (psych-mcp's `Timeouts`), set it to
    /// that host's longest call (`Timeouts::longest_call`).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets what the orientation payload says of the tenant, user, conventions and state.
    pub fn orientation_context(mut self, context: OrientationContext) -> Self {
        self.orientation = context;
        self
    }

    /// Sets the reader's limits (checked when they were built: `Limits::builder`).
    pub fn reader_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The most calls of one step that run (default [`DEFAULT_MAX_CALLS_PER_STEP`]; at
    /// least 1): the calls past them, in the model's order, are answered with a failed
    /// result saying so, logged like any, and nothing of them is read, started or
    /// forwarded. Each call's answer is held until its step is logged, so this bounds a
    /// step's memory at this many answers (each bounded by the host and by the reader's
    /// [`Limits`]), whatever number of calls a reply makes.
    #[must_use]
    pub fn max_calls_per_step(mut self, calls: usize) -> Self {
        self.max_calls = calls.max(1);
        self
    }

    /// Whether each call's guard runs off the async worker: through
    /// [`tokio::task::block_in_place`] when the executor is polled on a multi-threaded
    /// runtime, so that the worker's other tasks go on meanwhile (in place on a
    /// current-thread runtime). Off by default: the guard is CPU work on the thread that
    /// polls the execution, about 10 µs for a call of a few arguments with its schema
    /// compiled, and up to milliseconds for a tool's first call (its schema compiled), an
    /// orientation payload of a large catalogue, or megabytes of arguments (about 10 ms for
    /// 16 MiB). A native deferral's search tool is answered the same way. Set it when the
    /// executor is polled by tasks of a multi-threaded runtime; never when it may be polled
    /// inside a `LocalSet` on one, where tokio forbids blocking and this panics. `psych
    /// serve` sets it.
    #[must_use]
    pub fn off_worker_guard(mut self, off: bool) -> Self {
        self.off_worker = off;
        self
    }

    /// Reads handles of other Runs from `archive` (the logs of a gateway's earlier
    /// connections, or of a process before a restart). Without one, a handle of another Run
    /// is `invalid_deferred_handle`, as it stays for one the archive does not know.
    pub fn archive(mut self, archive: Arc<dyn Archive>) -> Self {
        self.archive = Some(archive);
        self
    }

    /// Forgets `server`'s compiled input schemas ([`Validators::forget`]), for a server
    /// removed from the Run ([`Run::remove_connection`](crate::Run::remove_connection)):
    /// nothing compiled for it stays behind. A call to it guarded later compiles again.
    pub fn forget_server(&self, server: &psych_types::ServerId) {
        self.validators.forget(server);
    }

    /// The reader's limits: the `read_tool_output` definition a prompt shows must use them.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The store results are appended to.
    pub fn store(&self) -> &Arc<DynRecordStore> {
        &self.log
    }

    /// The host forwarded calls go to.
    pub fn host(&self) -> &Arc<H> {
        &self.host
    }

    /// Executes `calls` (one step's, in the model's order) against `surface` as resolved at
    /// the start of the turn, re-checking each against `live` (the grant and catalogues
    /// now), and returns their results as logged, in call order. Calls past
    /// [`max_calls_per_step`](Self::max_calls_per_step) do not run: each is answered with a
    /// failed result saying so.
    ///
    /// # Errors
    ///
    /// Every call of the step that ran is logged before any error is returned, in call
    /// order, in one batch. [`ExecuteError::InvalidDeferredHandle`] when a read or a
    /// result reference names a result this Run never emitted: the offending call is
    /// logged as a failed result saying so and that nothing was run.
    /// [`ExecuteError::Panicked`] when a call's task
    /// panicked: the call is logged as a failed result saying so. [`ExecuteError::Calls`]
    /// with each of them, in call order, when there is more than one.
    /// [`ExecuteError::Append`] when the log refuses the batch (none of it is acknowledged),
    /// [`ExecuteError::Task`] when the blocking task writing it died.
    pub async fn execute(
        &self,
        surface: &Surface,
        live: &Live<'_>,
        calls: &[ToolCall],
    ) -> Result<Vec<LoggedRecord>, ExecuteError> {
        self.execute_with(surface, live, calls, None, Vec::new())
            .await
    }

    /// [`execute`](Self::execute) for a step whose request deferred tools natively with
    /// `native`: a call of its client search tool is answered here, from disclosure's
    /// ranking of the deferred tools permitted now, as `tool_reference` blocks naming only
    /// tools of `native` (prompt-assembly's `search_answer`), logged like any result. The
    /// tools it loads are called by their qualified names and go through the guard like
    /// direct tools. With `None`, exactly [`execute`](Self::execute).
    ///
    /// # Errors
    ///
    /// As [`execute`](Self::execute).
    pub async fn execute_native(
        &self,
        surface: &Surface,
        live: &Live<'_>,
        calls: &[ToolCall],
        native: Option<&NativeDeferral>,
    ) -> Result<Vec<LoggedRecord>, ExecuteError> {
        self.execute_with(surface, live, calls, native, Vec::new())
            .await
    }

    /// [`execute`](Self::execute), with the progress of forwarded calls: `progress[i]`, when
    /// given, receives what the host reports while `calls[i]` runs upstream
    /// ([`ToolHost::call_tool_with_progress`]); a call without a sink is made with
    /// [`ToolHost::call_tool`].
    ///
    /// Each sink is dropped as soon as its call can report no more: when its forwarded call
    /// ends (answered, failed, past its deadline), and at once for a call that is not
    /// forwarded (a read, an answer, a refusal); sinks past the last call are dropped at
    /// once. So a caller relaying reports from a channel its sink sends into sees it close
    /// with the call, and learns by it that the call has left the host: from then on, what
    /// remains of the execution is logging the results.
    ///
    /// # Errors
    ///
    /// As [`execute`](Self::execute).
    pub async fn execute_with_progress(
        &self,
        surface: &Surface,
        live: &Live<'_>,
        calls: &[ToolCall],
        progress: Vec<Option<ProgressSink>>,
    ) -> Result<Vec<LoggedRecord>, ExecuteError> {
        self.execute_with(surface, live, calls, None, progress)
            .await
    }

    /// The one body of [`execute`](Self::execute), [`execute_native`](Self::execute_native)
    /// and [`execute_with_progress`](Self::execute_with_progress).
    async fn execute_with(
        &self,
        surface: &Surface,
        live: &Live<'_>,
        calls: &[ToolCall],
        native: Option<&NativeDeferral>,
        progress: Vec<Option<ProgressSink>>,
    ) -> Result<Vec<LoggedRecord>, ExecuteError> {
        // The calls past the step's cap are answered below without running: nothing of
        // them is read, started or forwarded.
        let running_calls = &calls[..calls.len().min(self.max_calls)];
        // Result references first, one bound for the whole step (the replaced arguments
        // are held until their calls end), so that a call refused for one starts nothing.
        // The bound is reserved in the process's budget at once (held until the step ends).
        let reserved = self
            .reserve_passing(running_calls.iter().filter(|call| {
                !native.is_some_and(|deferral| crate::native::is_search(deferral, call))
            }))
            .await;
        let held = reserved.clone().unwrap_or_else(|_| Reserved::none());
        let bound = self.passing_bound();
        let mut room = bound;
        let mut passing = Vec::with_capacity(running_calls.len());
        for call in running_calls {
            // A native search tool's call is answered here from its own arguments.
            if native.is_some_and(|deferral| crate::native::is_search(deferral, call)) {
                passing.push(None);
                continue;
            }
            let passed = match &reserved {
                Err(busy) if passes_results(call) => Some(Passing::Refused(busy.output(call))),
                _ => self.pass_results(call, room, &held).await,
            };
            if let Some(Passing::Passed(passed)) = &passed {
                room = room.saturating_sub(passed.bytes);
            }
            passing.push(passed);
        }
        held.keep(bound - room);
        let routed = running_calls
            .iter()
            .zip(&passing)
            .filter_map(|(call, passed)| match passed {
                None => Some(call),
                Some(Passing::Passed(passed)) => Some(&passed.call),
                Some(_) => None,
            });
        // A native search tool's call names no server of the Surface: nothing starts for it.
        let starts = self.start_needed(surface, live, routed).await;
        let live = &starts.live(live);
        let mut pending = Vec::with_capacity(calls.len());
        // The remote tool each forwarded call reached, logged with its result.
        let mut targets: Vec<Option<ToolRef>> = vec![None; calls.len()];
        let mut tasks: JoinSet<Done> = JoinSet::new();
        // Which call each task runs, so a task that panics still answers its call.
        let mut running = BTreeMap::new();
        let mut progress = progress.into_iter();
        let mut passing = passing.into_iter();
        for (index, call) in calls.iter().enumerate() {
            let sink = progress.next().flatten();
            let Some(passing) = passing.next() else {
                pending.push(Pending::Ready(over_cap(call, calls.len(), self.max_calls)));
                continue;
            };
            if let Some(output) =
                native.and_then(|deferral| self.native_answer(surface, live, deferral, call))
            {
                pending.push(Pending::Ready(output));
                continue;
            }
            if call.name == READ_TOOL_OUTPUT {
                let task = self.spawn_read(&mut tasks, index, call);
                running.insert(task, index);
                pending.push(Pending::Running);
                continue;
            }
            let passed;
            let call = match passing {
                None => call,
                Some(Passing::Passed(call)) => {
                    passed = call;
                    &passed.call
                }
                Some(Passing::Refused(output)) => {
                    pending.push(Pending::Ready(output));
                    continue;
                }
                Some(Passing::Invalid(error, at)) => {
                    pending.push(Pending::Failed(error, at));
                    continue;
                }
            };
            // After the references: a call's own refusal comes first, and the server it goes
            // to is read from its replaced arguments, as `start_needed` read it.
            if let Some(output) = starts.failure(surface, live, call) {
                pending.push(Pending::Ready(output));
                continue;
            }
            match self.judge(surface, live, call) {
                Ok(forward) => {
                    targets[index] = Some(forward.target.clone());
                    let task = self.spawn_forward(
                        &mut tasks,
                        index,
                        forward.target,
                        forward.arguments,
                        sink,
                    );
                    running.insert(task, index);
                    pending.push(Pending::Running);
                }
                Err(output) => pending.push(Pending::Ready(output)),
            }
        }
        drop(progress);
        let mut failures = Vec::new();
        let mut outputs: Vec<Option<ToolOutput>> = pending
            .into_iter()
            .enumerate()
            .map(|(index, p)| match p {
                Pending::Ready(output) => Some(output),
                Pending::Running => None,
                Pending::Failed(error, at) => {
                    let output = refused_handle(&calls[index], &error, Some(&at));
                    failures.push((index, error));
                    Some(output)
                }
            })
            .collect();
        while let Some(joined) = tasks.join_next_with_id().await {
            let (index, result) = match joined {
                Ok((_, done)) => done,
                Err(source) => {
                    let Some(&index) = running.get(&source.id()) else {
                        continue;
                    };
                    (index, Err(panicked(&calls[index], source)))
                }
            };
            match result {
                Ok(output) => outputs[index] = Some(output),
                Err(error) => {
                    // Every failure is logged as the call's result, a refused read saying
                    // that nothing was run (not left for the next request to answer as
                    // interrupted, which would say it may have taken effect).
                    outputs[index] = Some(match &error {
                        ExecuteError::InvalidDeferredHandle(_) => {
                            refused_handle(&calls[index], &error, None)
                        }
                        _ => ToolOutput::error(psych_types::error_chain(&error)),
                    });
                    failures.push((index, error));
                }
            }
        }
        let records: Vec<Record> = calls
            .iter()
            .zip(outputs)
            .zip(targets)
            .filter_map(|((call, output), target)| {
                Some(Record::ToolResult(ToolResult {
                    target,
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    output: output?,
                }))
            })
            .collect();
        let logged = self.append(records).await?;
        failures.sort_by_key(|(index, _)| *index);
        let mut failures: Vec<ExecuteError> = failures.into_iter().map(|(_, e)| e).collect();
        match failures.len() {
            0 => Ok(logged),
            1 => Err(failures.remove(0)),
            _ => Err(ExecuteError::Calls(failures)),
        }
    }

    /// Starts, once each, the stopped on-demand servers that `calls` would be forwarded to
    /// (one after the other: a step rarely names more than one), and reads their live
    /// catalogues after. Nothing when there is no [`OnDemand`] or no call needs a start.
    /// A server whose connection was removed since the Surface was resolved is not
    /// started ([`Surface::call_server`] names only connections now), so its calls are
    /// refused as any removed server's are.
    async fn start_needed<'c>(
        &self,
        surface: &Surface,
        live: &Live<'_>,
        calls: impl Iterator<Item = &'c ToolCall>,
    ) -> Starts {
        let Some(on_demand) = &self.on_demand else {
            return Starts::default();
        };
        let servers: BTreeSet<ServerId> = calls
            .filter(|call| call.name != READ_TOOL_OUTPUT)
            .filter_map(|call| surface.call_server(&call.name, &call.arguments, live))
            .filter(|server| on_demand.needs_start(server))
            .collect();
        if servers.is_empty() {
            return Starts::default();
        }
        let mut catalogs = live.catalogs.to_vec();
        let mut failed = BTreeMap::new();
        for server in servers {
            match on_demand.start(&server).await {
                Ok(fresh) => {
                    if let Some(catalog) = catalogs.iter_mut().find(|c| c.server == server) {
                        *catalog = fresh;
                    }
                }
                Err(error) => {
                    failed.insert(server, psych_types::error_chain(&*error));
                }
            }
        }
        Starts {
            catalogs: Some(catalogs),
            failed,
        }
    }

    /// The guard's verdict on one call (disclosure owns the policy): the call to forward,
    /// or what it is answered with in place ([`answer`](Self::answer)). CPU work on the
    /// polling thread, moved off the async worker when [`off_worker_guard`](Self::off_worker_guard)
    /// is set: a tool's first call compiles its schema (measured up to 5 ms for one of the
    /// fixtures'), arguments of 16 MiB (a passed result's) take about 10 ms to validate and
    /// copy into the verdict, and an orientation payload is built from every permitted
    /// tool. Calls guarded at once (by sessions sharing the executor) do not wait for each
    /// other's guards, only briefly for the schema cache's lock (held to look a schema up
    /// or store one).
    fn judge(
        &self,
        surface: &Surface,
        live: &Live<'_>,
        call: &ToolCall,
    ) -> Result<psych_disclosure::Forward, ToolOutput> {
        let judge = || match surface.guard(&call.name, &call.arguments, live, &self.validators) {
            Verdict::Forward(forward) => Ok(forward),
            verdict => Err(self.answer(surface, live, &verdict)),
        };
        if self.off_worker {
            off_the_worker(judge)
        } else {
            judge()
        }
    }

    /// [`crate::native::answer`] (a search over the deferred tools), where the guard runs
    /// ([`Executor::off_worker_guard`]).
    fn native_answer(
        &self,
        surface: &Surface,
        live: &Live<'_>,
        deferral: &NativeDeferral,
        call: &ToolCall,
    ) -> Option<ToolOutput> {
        let answer = || crate::native::answer(surface, live, deferral, call);
        // Only a search is work: any other call is passed over at once.
        if self.off_worker && crate::native::is_search(deferral, call) {
            off_the_worker(answer)
        } else {
            answer()
        }
    }

    /// A verdict answered in place: disclosure's answer, refusal or orientation payload.
    fn answer(&self, surface: &Surface, live: &Live<'_>, verdict: &Verdict) -> ToolOutput {
        match verdict {
            Verdict::Answer(answer) => answer.to_output(),
            Verdict::Refused(refusal) => refusal.to_output(),
            Verdict::Orientation { verbose } => {
                let mut payload = orientation(surface, live, &self.orientation, *verbose);
                if let Some(on_demand) = &self.on_demand {
                    for summary in &mut payload.servers {
                        let health = live
                            .catalogs
                            .iter()
                            .find(|c| c.server == summary.server)
                            .map(|c| &c.health);
                        // A server down, or never listed, keeps the state that says why.
                        let known = health.is_some_and(|h| {
                            h.last_sync.is_some()
                                && !matches!(h.reachability, Reachability::Unreachable { .. })
                        });
                        if known && let Some(state) = on_demand.state(&summary.server, health) {
                            summary.state = state;
                        }
                    }
                }
                payload.to_output()
            }
            // Forward is routed by the caller; a verdict this runtime does not know yet is
            // refused rather than guessed at.
            _ => ToolOutput::error("this call cannot be routed by this runtime"),
        }
    }

    /// Forwards a permitted call to the host under the per-call deadline, with its progress
    /// sink when it has one.
    fn spawn_forward(
        &self,
        tasks: &mut JoinSet<Done>,
        index: usize,
        target: ToolRef,
        arguments: psych_types::JsonObject,
        progress: Option<ProgressSink>,
    ) -> Id {
        let host = Arc::clone(&self.host);
        let timeout = self.call_timeout;
        let task = tasks.spawn(async move {
            let call = async {
                match progress {
                    Some(sink) => host.call_tool_with_progress(&target, arguments, sink).await,
                    None => host.call_tool(&target, arguments).await,
                }
            };
            let output = match tokio::time::timeout(timeout, call).await {
                Ok(Ok(output)) => output,
                Ok(Err(error)) => failed(&target, &error),
                Err(_) => timed_out(&target, timeout),
            };
            (index, Ok(output))
        });
        task.id()
    }

    /// Executes one call as one round of an MCP 2026-07-28 multi-round-trip call: as
    /// [`execute_with_progress`](Self::execute_with_progress) for that one call (the guard
    /// re-checks it against `live`, whatever round it is), except that a forwarded call
    /// carries `round` to the host ([`ToolHost::call_tool_round`]), and an answer that is
    /// not complete ([`Executed::InputRequired`], [`Executed::MissingCapability`]) is
    /// returned without logging anything: only a call's final result is logged.
    ///
    /// `expected` is the target an earlier round of this call went to (a retry's): when
    /// the guard now forwards the call elsewhere (the catalogue changed between rounds), the
    /// call is answered with a logged failed result saying so, and nothing is forwarded.
    ///
    /// Cancel-safe as `execute_with_progress`: dropped before the host answers, the call is
    /// cancelled upstream and nothing is logged; `progress` is dropped when the host's call
    /// ends (at once for a call that is not forwarded).
    ///
    /// # Errors
    ///
    /// As [`execute`](Self::execute), for the one call.
    pub async fn execute_round(
        &self,
        surface: &Surface,
        live: &Live<'_>,
        call: &ToolCall,
        round: InputRound,
        expected: Option<&ToolRef>,
        progress: Option<ProgressSink>,
    ) -> Result<Executed, ExecuteError> {
        if call.name == READ_TOOL_OUTPUT {
            let logged = self
                .execute_with(
                    surface,
                    live,
                    std::slice::from_ref(call),
                    None,
                    vec![progress],
                )
                .await?;
            return one(logged);
        }
        // Result references first: a call refused for one starts nothing. The bound is
        // reserved in the process's budget at once, and what was read held until the end.
        let (held, passing) = match self.reserve_passing(std::iter::once(call)).await {
            Ok(held) => {
                let passing = self.pass_results(call, self.passing_bound(), &held).await;
                (held, passing)
            }
            Err(busy) => (Reserved::none(), Some(Passing::Refused(busy.output(call)))),
        };
        let passed;
        let guarded = match passing {
            None => call,
            Some(Passing::Passed(call)) => {
                held.keep(call.bytes);
                passed = call;
                &passed.call
            }
            Some(Passing::Refused(output)) => {
                drop(progress);
                return self.log_one(call, output, None).await;
            }
            Some(Passing::Invalid(error, at)) => {
                drop(progress);
                // Logged if the log takes it; the caller gets the handle error either way
                // (psych serve answers it as `invalid_deferred_handle`).
                let refused = refused_handle(call, &error, Some(&at));
                let _logged = self.log_one(call, refused, None).await;
                return Err(error);
            }
        };
        let starts = self
            .start_needed(surface, live, std::iter::once(guarded))
            .await;
        let live = &starts.live(live);
        if let Some(output) = starts.failure(surface, live, guarded) {
            drop(progress);
            return self.log_one(call, output, None).await;
        }
        let forward = match self.judge(surface, live, guarded) {
            Ok(forward) => forward,
            Err(output) => {
                drop(progress);
                return self.log_one(call, output, None).await;
            }
        };
        if let Some(expected) = expected
            && *expected != forward.target
        {
            drop(progress);
            let output = ToolOutput::error(format!(
                "this retry's requestState was issued for {}/{}, but {} now calls {}/{}: \
                 call it again without inputResponses and requestState",
                expected.server,
                expected.tool,
                call.name,
                forward.target.server,
                forward.target.tool
            ));
            return self.log_one(call, output, None).await;
        }
        let host = Arc::clone(&self.host);
        let timeout = self.call_timeout;
        let target = forward.target;
        let arguments = forward.arguments;
        // A task of its own, as a step's calls, so that a host that panics fails this call
        // alone; the set is dropped with this future, which aborts the task and with it the
        // upstream request.
        let mut task = JoinSet::new();
        let sent = target.clone();
        task.spawn(async move {
            let sink = progress.unwrap_or_else(|| ProgressSink::new(|_| {}));
            let call = host.call_tool_round(&sent, arguments, round, sink);
            match tokio::time::timeout(timeout, call).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(error)) => HostAnswer::Complete(failed(&sent, &error)),
                Err(_) => HostAnswer::Complete(timed_out(&sent, timeout)),
            }
        });
        let answer = match task.join_next().await {
            Some(Ok(answer)) => answer,
            Some(Err(source)) => {
                let error = panicked(call, source);
                let output = ToolOutput::error(psych_types::error_chain(&error));
                self.log_one(call, output, Some(target)).await?;
                return Err(error);
            }
            None => HostAnswer::Complete(ToolOutput::error("the call's task was lost")),
        };
        match answer {
            HostAnswer::Complete(output) => self.log_one(call, output, Some(target)).await,
            HostAnswer::InputRequired(answer) => Ok(Executed::InputRequired { target, answer }),
            HostAnswer::MissingCapability { message, data } => Ok(Executed::MissingCapability {
                target,
                message,
                data,
            }),
            _ => {
                let output = ToolOutput::error(format!(
                    "the call to {}/{} answered in a way this runtime does not know",
                    target.server, target.tool
                ));
                self.log_one(call, output, Some(target)).await
            }
        }
    }

    /// `call` with its result references replaced ([`psych_reader_tool::passing`]), read
    /// on the blocking pool by the rules of `read_tool_output` (this Run's log, or the
    /// [`Archive`] for another Run's handle), together at most `room` bytes (what is left
    /// of [`Limits::max_passed_bytes`] for the step, or for the one call of
    /// [`execute_round`](Self::execute_round)); `None` when the call has none (or is a
    /// read, whose arguments are its own). The guard then checks the replaced arguments, and the host
    /// gets exactly what a call carrying the content would have sent; the log keeps the
    /// call as the model made it, so nothing is stored twice.
    ///
    /// Cancel-safe: dropped while it reads, nothing was forwarded or logged.
    async fn pass_results(&self, call: &ToolCall, room: u64, held: &Reserved) -> Option<Passing> {
        if !passes_results(call) {
            return None;
        }
        let log = Arc::clone(&self.log);
        let archive = self.archive.clone();
        let limits = self.limits.clone();
        let mut passed = call.clone();
        // Kept with the passed call until it is freed.
        let kept = held.clone();
        // The read keeps the reservation while it runs, even if this future is dropped.
        let held = held.clone();
        let read = tokio::task::spawn_blocking(move || {
            let _held = held;
            let result =
                psych_reader_tool::passing::substitute(&mut passed.arguments, room, |r, left| {
                    referenced(&log, archive.as_deref(), &limits, r, left)
                });
            // A call refused part-way may hold megabytes already passed: freed here.
            result.map(|done| (passed, done))
        })
        .await;
        let result = match read {
            Ok(read) => read,
            Err(source) => {
                return Some(Passing::Refused(ToolOutput::error(
                    psych_types::error_chain(&panicked(call, source)),
                )));
            }
        };
        Some(match result {
            Ok((passed, done)) => Passing::Passed(Passed {
                call: passed,
                bytes: done.bytes,
                held: kept,
            }),
            Err(misplaced) => match *misplaced {
                psych_reader_tool::passing::Misplaced {
                    error: PassError::Call(CallError::InvalidDeferredHandle(error)),
                    at,
                } => Passing::Invalid(ExecuteError::InvalidDeferredHandle(error), at),
                misplaced => Passing::Refused(ToolOutput::error(format!(
                    "{}: nothing was sent: {}",
                    call.name,
                    psych_types::error_chain(&misplaced)
                ))),
            },
        })
    }

    /// What `reference` names, read by the rules of a call's result references (this Run's
    /// log, or the [`Archive`] for another Run's handle), at most `max_bytes` of stored
    /// text, on the blocking pool: what `psych serve` answers `resources/read` of a
    /// result's `resource_link` with. The read holds `held` (the caller's reservation,
    /// [`reserve_passed`](Self::reserve_passed)) until it ends, even if this future is
    /// dropped first.
    ///
    /// # Errors
    ///
    /// [`PassError::Call`] with [`CallError::InvalidDeferredHandle`] for a result the
    /// caller may not read (as a read's), [`PassError::Reference`] for a slice past the end
    /// or over `max_bytes`, [`PassError::Call`] with [`CallError::Source`] when the Run's
    /// records cannot be read ([`Unreadable`] says why); a panicked read task is
    /// [`Unreadable::Task`].
    pub async fn read_reference(
        &self,
        reference: ResultReference,
        max_bytes: u64,
        held: &Reserved,
    ) -> Result<Referenced, PassError<Unreadable>> {
        let log = Arc::clone(&self.log);
        let archive = self.archive.clone();
        let limits = self.limits.clone();
        // The read keeps the reservation while it runs, even if this future is dropped.
        let held = held.clone();
        let read = tokio::task::spawn_blocking(move || {
            let _held = held;
            referenced(&log, archive.as_deref(), &limits, &reference, max_bytes)
        })
        .await;
        match read {
            Ok(read) => read,
            Err(source) => Err(PassError::Call(CallError::Source(Unreadable::Task(source)))),
        }
    }

    /// Logs `output` as `call`'s result, which reached `target` if it was forwarded.
    async fn log_one(
        &self,
        call: &ToolCall,
        output: ToolOutput,
        target: Option<ToolRef>,
    ) -> Result<Executed, ExecuteError> {
        let record = Record::ToolResult(ToolResult {
            target,
            call_id: call.id.clone(),
            name: call.name.clone(),
            output,
        });
        one(self.append(vec![record]).await?)
    }

    /// Answers `read_tool_output` through psych-reader-tool over the log (blocking reads).
    fn spawn_read(&self, tasks: &mut JoinSet<Done>, index: usize, call: &ToolCall) -> Id {
        let log = Arc::clone(&self.log);
        let archive = self.archive.clone();
        let limits = self.limits.clone();
        let arguments = call.arguments.clone();
        let (call, name) = (call.id.clone(), call.name.clone());
        let task = tasks.spawn(async move {
            let read = tokio::task::spawn_blocking(move || {
                read(&log, archive.as_deref(), limits, &arguments)
            })
            .await;
            let result =
                read.unwrap_or_else(|source| Err(ExecuteError::Panicked { call, name, source }));
            (index, result)
        });
        task.id()
    }
}

/// Where `read_tool_output` looks up a handle of a Run other than the executor's own: the
/// logs of earlier Runs that the same caller may still read (a gateway's earlier
/// connections of one identity, a process before its restart).
///
/// [`Archive::find`] is called on the blocking pool, never on an async worker: it may open
/// files. The archive decides whose logs a caller may read; one it does not know is
/// refused as `invalid_deferred_handle`, as a handle of an unknown Run always is.
pub trait Archive: Send + Sync {
    /// What this archive has of `handle`'s Run.
    fn find(&self, handle: &RecordHandle) -> Archived;
}

/// What an [`Archive`] has of a handle's Run.
#[derive(Debug)]
#[non_exhaustive]
pub enum Archived {
    /// The Run's log, open for reading: the handle is read there.
    Log(Arc<RecordLog>),
    /// The Run's records in another store (the PostgreSQL store: a Run another process
    /// wrote), open for reading: the handle is read there.
    Store(Arc<DynRecordStore>),
    /// The Run's log was kept here once and is gone (a retention limit removed it): the
    /// model is answered `why` as a failed result, so it can call the tool again.
    Gone {
        /// What the model is told, in full.
        why: String,
    },
    /// The Run's log is here but could not be opened: the model is told the read failed.
    Failed(OpenError),
    /// The store could not be asked for the Run (unreachable, failed): the model is told
    /// the read failed.
    StoreFailed(StoreError),
    /// The archive never had the Run: the handle is `invalid_deferred_handle`.
    Unknown,
}

/// One read by handle: an answer for the model, or the typed handle error for the caller.
/// A handle of another Run goes to `archive` first, when there is one.
fn read(
    log: &DynRecordStore,
    archive: Option<&dyn Archive>,
    limits: Limits,
    arguments: &Value,
) -> Result<ToolOutput, ExecuteError> {
    let foreign = arguments
        .get("handle")
        .and_then(Value::as_str)
        .and_then(|text| text.parse::<RecordHandle>().ok())
        .filter(|handle| &handle.run != log.run());
    if let (Some(archive), Some(handle)) = (archive, foreign) {
        match archive.find(&handle) {
            Archived::Log(other) => {
                return answer(Reader::with_limits(&*other, limits).call(arguments));
            }
            Archived::Store(other) => {
                return answer(Reader::with_limits(&*other, limits).call(arguments));
            }
            Archived::StoreFailed(error) => {
                return Ok(ToolOutput::error(format!(
                    "read_tool_output failed: the records of {}: {}",
                    handle.run,
                    psych_types::error_chain(&error)
                )));
            }
            Archived::Gone { why } => return Ok(ToolOutput::error(why)),
            Archived::Failed(error) => {
                return Ok(ToolOutput::error(format!(
                    "read_tool_output failed: the log of {}: {error}",
                    handle.run
                )));
            }
            Archived::Unknown => {}
        }
    }
    answer(Reader::with_limits(log, limits).call(arguments))
}

/// Why a result reference's Run could not be read, beside its store's own errors: what the
/// archive answered (the model is told).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Unreadable {
    /// The Run's log could not be opened.
    #[error("the log of {run} could not be opened")]
    Open {
        /// The Run.
        run: psych_types::RunId,
        /// Why.
        #[source]
        source: OpenError,
    },
    /// The Run's store failed.
    #[error("the records of {run} could not be asked")]
    Store {
        /// The Run.
        run: psych_types::RunId,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// The source failed while reading.
    #[error(transparent)]
    Source(Box<dyn std::error::Error + Send + Sync>),
    /// The blocking task reading panicked or was cancelled.
    #[error("the read did not finish")]
    Task(#[source] JoinError),
}

/// One result reference read by the rules of a read: this Run's log, or for another Run's
/// handle the archive's (unknown there: `invalid_deferred_handle`).
fn referenced(
    log: &DynRecordStore,
    archive: Option<&dyn Archive>,
    limits: &Limits,
    reference: &ResultReference,
    room: u64,
) -> Result<Referenced, PassError<Unreadable>> {
    fn boxed<E: std::error::Error + Send + Sync + 'static>(
        error: PassError<E>,
    ) -> PassError<Unreadable> {
        match error {
            PassError::Reference(error) => PassError::Reference(error),
            PassError::Call(CallError::InvalidDeferredHandle(error)) => {
                PassError::Call(CallError::InvalidDeferredHandle(error))
            }
            PassError::Call(CallError::Source(error)) => {
                PassError::Call(CallError::Source(Unreadable::Source(Box::new(error))))
            }
            PassError::Call(CallError::ShortRead { handle, at, len }) => {
                PassError::Call(CallError::ShortRead { handle, at, len })
            }
            PassError::Call(other) => {
                PassError::Call(CallError::Source(Unreadable::Source(Box::new(other))))
            }
            other => PassError::Call(CallError::Source(Unreadable::Source(Box::new(other)))),
        }
    }
    let foreign = reference
        .handle
        .parse::<RecordHandle>()
        .ok()
        .filter(|handle| &handle.run != log.run());
    if let (Some(archive), Some(handle)) = (archive, foreign) {
        let failed = |error| Err(PassError::Call(CallError::Source(error)));
        match archive.find(&handle) {
            Archived::Log(other) => {
                return Reader::with_limits(&*other, limits.clone())
                    .referenced(reference, room)
                    .map_err(boxed);
            }
            Archived::Store(other) => {
                return Reader::with_limits(&*other, limits.clone())
                    .referenced(reference, room)
                    .map_err(boxed);
            }
            Archived::Gone { why } => {
                return Err(PassError::Reference(ReferenceError::Gone(why)));
            }
            Archived::Failed(source) => {
                return failed(Unreadable::Open {
                    run: handle.run,
                    source,
                });
            }
            Archived::StoreFailed(source) => {
                return failed(Unreadable::Store {
                    run: handle.run,
                    source,
                });
            }
            Archived::Unknown => {}
        }
    }
    Reader::with_limits(log, limits.clone())
        .referenced(reference, room)
        .map_err(boxed)
}

/// The failed result logged for a call refused for naming a handle this Run never emitted
/// (a read, or a result reference `at` a JSON pointer of its arguments): the error, and
/// that nothing was run.
fn refused_handle(call: &ToolCall, error: &ExecuteError, at: Option<&str>) -> ToolOutput {
    let at = at.map_or_else(String::new, |at| format!("the argument at {at:?}: "));
    ToolOutput::error(format!(
        "{}: refused, nothing was run: {at}{}",
        call.name,
        psych_types::error_chain(error)
    ))
}

/// The reader's answer for the model, or its typed handle error for the caller.
fn answer<E: std::error::Error>(
    called: Result<psych_reader_tool::Answer, CallError<E>>,
) -> Result<ToolOutput, ExecuteError> {
    match called {
        Ok(answer) => Ok(answer.to_tool_output()),
        Err(CallError::InvalidDeferredHandle(error)) => {
            Err(ExecuteError::InvalidDeferredHandle(error))
        }
        // A storage failure of the log: the model is told the read failed, the log is not
        // touched.
        Err(error) => Ok(ToolOutput::error(format!(
            "read_tool_output failed: {error}"
        ))),
    }
}

/// Appends `records` in one batch off the async threads and returns them as logged.
///
/// A result with spilled text ([`ToolOutput::spilled`]) is stored streamed from its files;
/// if one cannot be (its file unreadable or not what it claims, the log refusing its
/// shape), or a result nests JSON deeper than the log reads back
/// ([`RecordFailure::TooDeep`]), the log acknowledges nothing of the batch, and its records
/// are appended again one by one in call order, the refused one replaced by an error
/// result saying why: the other results of the step are never lost for one bad answer. Once logged, each record's spilled files are
/// let go here, on the blocking thread (closing a multi-GiB unlinked file frees its
/// blocks): the records returned hold the placeholders, and the log the text.
async fn append(
    log: &Arc<DynRecordStore>,
    count: &Arc<tokio::sync::watch::Sender<u64>>,
    records: Vec<Record>,
) -> Result<Vec<LoggedRecord>, ExecuteError> {
    if records.is_empty() {
        return Ok(Vec::new());
    }
    let log = Arc::clone(log);
    let appending = Appending::start(count);
    tokio::task::spawn_blocking(move || {
        let _appending = appending;
        let mut records = records;
        let handles = match log.append_batch(&records) {
            Ok(handles) => handles,
            // Which result the log refused is not said: each is appended alone, and a
            // refused one replaced by an error result saying why (a rare path: one sync
            // per record, in call order).
            Err(error) if refused_alone(error.kind()) => {
                let mut handles = Vec::with_capacity(records.len());
                for record in &mut records {
                    match log.append(record) {
                        Ok(handle) => handles.push(handle),
                        Err(error) if refused_alone(error.kind()) => {
                            if let Record::ToolResult(result) = record {
                                let bytes: u64 =
                                    result.output.spilled.iter().map(|s| s.text.len()).sum();
                                let what = if bytes == 0 {
                                    "the result".to_owned()
                                } else {
                                    format!("the result ({bytes} bytes of text kept in files)")
                                };
                                result.output = ToolOutput::error(format!(
                                    "{what} could not be stored, so it is not shown: {error}"
                                ));
                            }
                            handles.push(log.append(record)?);
                        }
                        Err(error) => return Err(error.into()),
                    }
                }
                handles
            }
            Err(error) => return Err(error.into()),
        };
        Ok(handles
            .into_iter()
            .zip(records)
            .map(|(handle, mut record)| {
                if let Record::ToolResult(result) = &mut record {
                    result.output.spilled.clear();
                }
                LoggedRecord { handle, record }
            })
            .collect())
    })
    .await?
}

/// Whether an append refused for `failure` is one record's fault, which the others of its
/// batch need not share (see [`append`]).
fn refused_alone(failure: RecordFailure) -> bool {
    matches!(failure, RecordFailure::Spill | RecordFailure::TooDeep)
}

/// What [`Executor::execute_round`] made of one call.
#[derive(Debug)]
#[non_exhaustive]
pub enum Executed {
    /// The call's final result, as logged.
    Logged(LoggedRecord),
    /// The server needs the client's input first (MCP 2026-07-28's `InputRequiredResult`):
    /// its result object as sent, and where the call went. Nothing was logged.
    InputRequired {
        /// The tool the call was forwarded to: what a retry must reach again.
        target: ToolRef,
        /// The server's `input_required` result, as sent.
        answer: psych_types::JsonObject,
    },
    /// The server refused the call for a client capability the round did not declare
    /// (JSON-RPC -32021). Nothing was logged.
    MissingCapability {
        /// The tool the call was forwarded to.
        target: ToolRef,
        /// The server's error message.
        message: String,
        /// The error's `data` (its `requiredCapabilities`), as sent.
        data: Option<Value>,
    },
}

/// The one record of a one-call batch, as [`Executed::Logged`].
fn one(logged: Vec<LoggedRecord>) -> Result<Executed, ExecuteError> {
    match logged.into_iter().next() {
        Some(record) => Ok(Executed::Logged(record)),
        // A one-call batch logs its one result; only a refused read logs none, and that is
        // an error already.
        None => Err(ExecuteError::Calls(Vec::new())),
    }
}

/// Runs `work` (CPU work too long to keep an async worker from its other tasks) so that
/// the worker's other tasks go on meanwhile: on a multi-threaded runtime, through
/// [`tokio::task::block_in_place`] (they move to another thread; the future polling this,
/// and what is polled with it, still waits); on a current-thread runtime, or off any
/// runtime, where that cannot be done, in place.
///
/// Panics inside a `LocalSet` on a multi-threaded runtime's `block_on` thread (tokio
/// forbids blocking there), which is why an executor does this only when told
/// ([`Executor::off_worker_guard`]); a caller that cannot know where it runs should not
/// (psych-gateway's log close does, its `serve` documented as needing a multi-threaded
/// runtime outside a `LocalSet`).
///
/// ```
/// let sum = psych_runtime::off_the_worker(|| (1..=1000u64).sum::<u64>());
/// assert_eq!(sum, 500_500);
/// ```
pub fn off_the_worker<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

/// The failed result of a call past its step's cap ([`Executor::max_calls_per_step`]).
fn over_cap(call: &ToolCall, calls: usize, cap: usize) -> ToolOutput {
    ToolOutput::error(format!(
        "{}: not run: this step made {calls} tool calls and at most {cap} of a step run; \
         nothing of this call was sent. Make it again in a later step.",
        call.name
    ))
}

/// The failed result of a forwarded call whose host failed: the error with its causes
/// ([`psych_types::error_chain`]).
fn failed(target: &ToolRef, error: &dyn std::error::Error) -> ToolOutput {
    ToolOutput::error(format!(
        "the call to {}/{} failed: {}",
        target.server,
        target.tool,
        psych_types::error_chain(error)
    ))
}

/// The failed result of a forwarded call past its deadline.
fn timed_out(target: &ToolRef, timeout: Duration) -> ToolOutput {
    ToolOutput::error(format!(
        "the call to {}/{} timed out after {} ms; it was cancelled",
        target.server,
        target.tool,
        timeout.as_millis()
    ))
}

/// What a call whose task did not finish (it panicked) is answered with, and reported as.
fn panicked(call: &ToolCall, source: JoinError) -> ExecuteError {
    ExecuteError::Panicked {
        call: call.id.clone(),
        name: call.name.clone(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::{FREE_ON_WORKER, free_off_worker, off_the_worker};
    use std::time::Duration;

    /// Passed results over 1 MiB are freed by a blocking task where there is a runtime, and
    /// in place where there is none (nothing to keep free) or when they are small.
    #[test]
    fn passed_results_over_a_mib_are_freed_on_a_blocking_thread() {
        let big = || serde_json::Value::String("x".repeat(2 << 20));
        assert!(free_off_worker(big(), 2 << 20).is_none(), "no runtime");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            assert!(free_off_worker(big(), FREE_ON_WORKER).is_none(), "small");
            let freed = free_off_worker(big(), FREE_ON_WORKER + 1).expect("a blocking task");
            assert!(freed.await.is_ok());
        });
    }

    /// On a runtime of one worker, a task's work waiting for another task of that runtime
    /// finishes: the worker's tasks go on elsewhere while it runs (kept on the worker, it
    /// would wait for a task that can never run, and time out).
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn work_off_the_worker_lets_the_workers_other_tasks_run() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (started, ready) = tokio::sync::oneshot::channel::<()>();
        // Both tasks run on the one worker (the test's own body runs on another thread).
        let waiting = tokio::spawn(async move {
            off_the_worker(move || {
                let _ = started.send(());
                rx.recv_timeout(Duration::from_secs(10))
            })
        });
        tokio::spawn(async move {
            // Polled only once the waiting work has started.
            let _ = ready.await;
            let _ = tx.send("from the other task");
        });
        let got = waiting.await.ok();
        assert_eq!(got, Some(Ok("from the other task")));
    }

    /// On a current-thread runtime, in a multi-threaded runtime's `block_on`, and off any
    /// runtime, the work runs (in place), where `block_in_place` alone would panic on the
    /// first.
    #[test]
    fn where_blocking_cannot_move_the_work_runs_in_place() {
        let one = tokio::runtime::Builder::new_current_thread().build();
        let one = one.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(one.block_on(async { off_the_worker(|| 7) }), 7);
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(multi.block_on(async { off_the_worker(|| 8) }), 8);
        let outside = std::thread::spawn(|| off_the_worker(|| 9)).join();
        assert_eq!(outside.ok(), Some(9));
    }
}
