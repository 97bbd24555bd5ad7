//! The small traits at the seams between crates.
//!
//! The core crates never depend on each other; where one needs another's work, it names one
//! of these traits and the runtime plugs an implementation in:
//!
//! - [`TokenEstimator`]: implemented by elision, used wherever a size trigger is needed.
//! - [`ResultProjector`]: implemented by elision, called by prompt assembly for tool results
//!   before the elision boundary.
//! - [`RecordSource`]: implemented by the record log (and [`MemoryRecords`]), read by the
//!   reader tool.
//! - [`ToolLister`] / [`ToolHost`]: implemented by live MCP connections, used by the catalogue
//!   and the runtime's executor; a call can carry a [`ProgressSink`] for its progress
//!   ([`ToolHost::call_tool_with_progress`]), and one round of an MCP 2026-07-28
//!   multi-round-trip call ([`InputRound`] in, [`HostAnswer`] out:
//!   [`ToolHost::call_tool_round`]).

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;

use serde_json::Value;

use crate::{
    BlockLines, CatalogVersion, ContentBlock, Diff, JsonObject, LoggedRecord, ProgressSink, Record,
    RecordHandle, Refresh, RunId, ServerCatalog, ServerHealth, ServerId, ToolCallId,
    ToolDefinition, ToolOutput, ToolRef, UnixMillis,
};

/// A cheap estimate of how many tokens content costs in a prompt.
///
/// It is a trigger for thresholds, not a meter: it must be fast, deterministic, and never
/// decrease when text is appended or prepended (what a threshold needs: a result that
/// grows at either end is never estimated smaller). It need not be monotone in length: a
/// real tokenizer is not, and neither is elision's (`0123456789` is 3 tokens to it,
/// `abcdefghijkl` 1). Nothing may use it for cost; cost comes from provider-reported usage.
pub trait TokenEstimator {
    /// Estimated tokens of `text`.
    fn estimate_text(&self, text: &str) -> u64;

    /// Estimated tokens of `len` bytes of binary content of the given MIME type.
    fn estimate_binary(&self, mime_type: &str, len: u64) -> u64;

    /// Estimated tokens of a tool output: its readable text
    /// ([`ToolOutput::readable_text`], placeholders included) plus, for each binary block
    /// (image, audio, blob resource), [`TokenEstimator::estimate_binary`] of its bytes, the
    /// cost of sending them base64-encoded. It keeps its parts' guarantees: text appended
    /// or prepended to the readable text never lowers its part, nor does a larger binary
    /// block lower its own.
    fn estimate_output(&self, output: &ToolOutput) -> u64 {
        let binary = output.binary_blocks().fold(0u64, |sum, (_, block)| {
            sum.saturating_add(self.estimate_binary(block.mime_type, block.data.len() as u64))
        });
        self.estimate_text(&output.readable_text())
            .saturating_add(binary)
    }
}

/// A shared estimator estimates as the one it holds: one estimator set once can be handed to
/// disclosure, the record log and elision alike (`Arc<dyn TokenEstimator + Send + Sync>`).
impl<T: TokenEstimator + ?Sized> TokenEstimator for std::sync::Arc<T> {
    fn estimate_text(&self, text: &str) -> u64 {
        (**self).estimate_text(text)
    }

    fn estimate_binary(&self, mime_type: &str, len: u64) -> u64 {
        (**self).estimate_binary(mime_type, len)
    }

    fn estimate_output(&self, output: &ToolOutput) -> u64 {
        (**self).estimate_output(output)
    }
}

/// One tool result handed to a [`ResultProjector`].
#[derive(Debug, Clone, Copy)]
pub struct ResultRef<'a> {
    /// Where the full result lives, for the model to read back.
    pub handle: &'a RecordHandle,
    /// The full result.
    pub output: &'a ToolOutput,
    /// The remote tool the result came from ([`ToolResult::target`](crate::ToolResult::target)),
    /// whose output limits apply to it; `None` for Psych's own answers.
    pub target: Option<&'a crate::ToolRef>,
}

/// What the model is shown of one tool result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Projection {
    /// The output as it is.
    Full,
    /// This text instead of the output (a preview with guidance, a truncated failure).
    Replaced(String),
}

/// Decides the model's view of one turn's tool results (the batch).
///
/// Prompt assembly calls it for results strictly before the last user message; the record
/// log is never changed by it.
///
/// Both methods return one view per result of the batch, in batch order. A caller shows a
/// result the projector gave no view for whole ([`Projection::Full`]) and ignores views
/// past the end of the batch, so a short or long answer never fails an assembly.
pub trait ResultProjector {
    /// The views of `batch`'s results. The same batch must always give the same views.
    fn project(&self, batch: &[ResultRef<'_>]) -> Vec<Projection>;

    /// The same views as [`project`](Self::project) would give for the whole outputs of
    /// `batch`, from their [`StoredResult`](crate::StoredResult)s, reading content through
    /// `source` only where the view needs it.
    ///
    /// The default reads every output whole and calls `project`; a projector that can
    /// decide from the stored summary and a few bytes of head and tail (elision's) overrides
    /// it, so that a step's cost does not grow with the size of results it does not show.
    ///
    /// # Errors
    ///
    /// A [`SourceError`](crate::SourceError) when `source` cannot read a result the view
    /// needs, or a handle of the batch names no tool result of `source`.
    fn project_stored(
        &self,
        batch: &[crate::StoredRef<'_>],
        source: &dyn crate::OutputAccess,
    ) -> Result<Vec<Projection>, crate::SourceError> {
        crate::history::project_loaded(self, batch, source)
    }
}

/// What the readable text of a stored tool result is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutputKind {
    /// Content blocks: their text, with one placeholder line for each non-text block.
    Text,
    /// Only structured content: its JSON text view (pretty, keys sorted).
    Json,
}

impl OutputKind {
    /// The kind of `output`'s readable text.
    pub fn of(output: &ToolOutput) -> Self {
        if output.shows_structured_content() {
            OutputKind::Json
        } else {
            OutputKind::Text
        }
    }
}

/// What a [`RecordSource`] knows of a stored tool result without reading its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputInfo {
    /// What the readable text is made of.
    pub kind: OutputKind,
    /// Length in bytes of the readable text ([`ToolOutput::readable_text`]).
    pub len: u64,
    /// Whether the call failed.
    pub is_error: bool,
    /// The call the result answers.
    pub call_id: ToolCallId,
    /// The tool name of that call.
    pub name: String,
}

/// A place in a stored result's readable text to count lines from: byte `at`, with
/// `breaks_before` line breaks (`\n` bytes) in the bytes before it.
///
/// What [`RecordSource::line_mark`] answers, so that a reader looking for line `N` of a
/// large result counts from a nearby mark instead of from byte 0. [`LineMark::START`] is
/// always a valid answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LineMark {
    /// Byte offset in the readable text; at most its length.
    pub at: u64,
    /// The number of `\n` bytes in the readable text before `at`.
    pub breaks_before: u64,
}

impl LineMark {
    /// The start of the text: nothing before it.
    pub const START: LineMark = LineMark {
        at: 0,
        breaks_before: 0,
    };
}

/// Read access to one Run's records, by handle, without loading a large result whole.
///
/// A source serves exactly one Run. A handle naming another Run, or a record that is not a
/// tool result, does not resolve (`Ok(None)` / zero bytes): the source never reads across
/// Runs.
pub trait RecordSource {
    /// Failures of the underlying storage.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The Run this source serves.
    fn run(&self) -> &RunId;

    /// The record at `handle`, or `None` if it does not resolve in this Run.
    ///
    /// # Errors
    ///
    /// Storage failures only; an unknown handle is `Ok(None)`.
    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, Self::Error>;

    /// What is stored at `handle` if it is a tool result of this Run, else `None`.
    ///
    /// # Errors
    ///
    /// Storage failures only.
    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, Self::Error>;

    /// Copies readable text of the tool result at `handle`, starting at byte `offset`,
    /// into `buf`. Returns the number of bytes copied: `0` at or past the end, or when the
    /// handle does not resolve to a tool result of this Run. Like [`std::io::Read::read`],
    /// a source may copy fewer bytes than `buf` holds before the end; callers loop until
    /// they have what they need or get `0`.
    ///
    /// # Errors
    ///
    /// Storage failures only.
    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Self::Error>;

    /// The content block at `position` (from 0, the number its placeholder line shows) of
    /// the tool result at `handle`, whole: binary data included. `None` when the handle does
    /// not resolve to a tool result of this Run or the result has no such block.
    ///
    /// The default reads the whole record; a store that can read one block alone (the
    /// record log) overrides it.
    ///
    /// # Errors
    ///
    /// Storage failures only.
    fn content_block(
        &self,
        handle: &RecordHandle,
        position: usize,
    ) -> Result<Option<ContentBlock>, Self::Error> {
        Ok(match self.record(handle)? {
            Some(Record::ToolResult(result)) => result.output.content.into_iter().nth(position),
            _ => None,
        })
    }

    /// Where to start counting to reach line `line` (0-based; line `line` starts right
    /// after the `line`-th `\n`) of the readable text of the tool result at `handle`: a
    /// [`LineMark`] at or before that line's start (at or before the text's end when it
    /// has fewer lines) whose `breaks_before` is below `line`, so that the line's start
    /// is found by counting forward from the mark. [`LineMark::START`] for line 0, or when
    /// the handle does not resolve to a tool result of this Run.
    ///
    /// The default is [`LineMark::START`]: a reader counts from byte 0, reading the text
    /// up to the line. A store that keeps a sparse index of its results' line breaks (the
    /// record log) overrides it, so that reading at line `N` costs about what reading at
    /// line 0 costs. A reader checks what it can of the answer (`at` within the text,
    /// `breaks_before` below `line` and at most `at`) and counts from byte 0 otherwise.
    ///
    /// # Errors
    ///
    /// Storage failures only.
    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, Self::Error> {
        let _ = (handle, line);
        Ok(LineMark::START)
    }

    /// The blocks other than text of the tool result at `handle`, as its preview lists them
    /// ([`BlockLines`]); `None` when the handle does not resolve to a tool result.
    ///
    /// The default reads the record whole. A store that keeps each block's shape apart from
    /// its bulk (the record log) overrides it, so that previewing a result that mixes an
    /// image with a text of gigabytes does not read the text.
    ///
    /// # Errors
    ///
    /// Storage failures only.
    fn block_lines(&self, handle: &RecordHandle) -> Result<Option<BlockLines>, Self::Error> {
        Ok(match self.record(handle)? {
            Some(Record::ToolResult(result)) => Some(BlockLines::of(&result.output)),
            _ => None,
        })
    }
}

/// A shared reference to a source is a source, so readers can borrow or own one.
impl<S: RecordSource + ?Sized> RecordSource for &S {
    type Error = S::Error;

    fn run(&self) -> &RunId {
        (**self).run()
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, Self::Error> {
        (**self).record(handle)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, Self::Error> {
        (**self).output_info(handle)
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Self::Error> {
        (**self).read_output(handle, offset, buf)
    }

    fn content_block(
        &self,
        handle: &RecordHandle,
        position: usize,
    ) -> Result<Option<ContentBlock>, Self::Error> {
        (**self).content_block(handle, position)
    }

    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, Self::Error> {
        (**self).line_mark(handle, line)
    }

    fn block_lines(&self, handle: &RecordHandle) -> Result<Option<BlockLines>, Self::Error> {
        (**self).block_lines(handle)
    }
}

/// An in-memory [`RecordSource`] over one Run's records, for tests and for callers that keep
/// records themselves.
#[derive(Debug, Clone)]
pub struct MemoryRecords {
    run: RunId,
    records: Vec<Record>,
    /// The readable bytes of each tool result, rendered once (`None` for other records).
    contents: Vec<Option<Vec<u8>>>,
}

impl MemoryRecords {
    /// An empty log for `run`.
    pub fn new(run: RunId) -> Self {
        Self {
            run,
            records: Vec::new(),
            contents: Vec::new(),
        }
    }

    /// Appends a record and returns its handle.
    pub fn push(&mut self, record: Record) -> RecordHandle {
        let content = match &record {
            Record::ToolResult(result) => Some(readable_bytes(&result.output).into_owned()),
            _ => None,
        };
        let handle = RecordHandle::new(self.run.clone(), self.records.len() as u64);
        self.records.push(record);
        self.contents.push(content);
        handle
    }

    /// Every record with its handle, in order.
    pub fn records(&self) -> Vec<LoggedRecord> {
        self.records
            .iter()
            .enumerate()
            .map(|(seq, record)| LoggedRecord {
                handle: RecordHandle::new(self.run.clone(), seq as u64),
                record: record.clone(),
            })
            .collect()
    }

    fn index(&self, handle: &RecordHandle) -> Option<usize> {
        if handle.run != self.run {
            return None;
        }
        usize::try_from(handle.seq)
            .ok()
            .filter(|&i| i < self.records.len())
    }
}

/// The bytes [`RecordSource::read_output`] serves for an output: the UTF-8 of its
/// [`readable text`](ToolOutput::readable_text). Borrowed for a result of one text block.
/// Stores keep exactly these bytes so that a reader serves what the model was shown.
pub fn readable_bytes(output: &ToolOutput) -> Cow<'_, [u8]> {
    match output.readable_text() {
        Cow::Borrowed(text) => Cow::Borrowed(text.as_bytes()),
        Cow::Owned(text) => Cow::Owned(text.into_bytes()),
    }
}

impl RecordSource for MemoryRecords {
    type Error = Infallible;

    fn run(&self) -> &RunId {
        &self.run
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, Infallible> {
        Ok(self.index(handle).map(|i| self.records[i].clone()))
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, Infallible> {
        let Some(i) = self.index(handle) else {
            return Ok(None);
        };
        let (Record::ToolResult(result), Some(content)) = (&self.records[i], &self.contents[i])
        else {
            return Ok(None);
        };
        Ok(Some(OutputInfo {
            kind: OutputKind::of(&result.output),
            len: content.len() as u64,
            is_error: result.output.is_error,
            call_id: result.call_id.clone(),
            name: result.name.clone(),
        }))
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Infallible> {
        let Some(content) = self.index(handle).and_then(|i| self.contents[i].as_deref()) else {
            return Ok(0);
        };
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(content.len());
        let n = buf.len().min(content.len() - start);
        buf[..n].copy_from_slice(&content[start..start + n]);
        Ok(n)
    }
}

/// Lists the tools of a server (MCP `tools/list`, every page).
pub trait ToolLister: Send + Sync {
    /// Failures of the connection or the server.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Every tool `server` declares now.
    fn list_tools(
        &self,
        server: &ServerId,
    ) -> impl Future<Output = Result<Vec<ToolDefinition>, Self::Error>> + Send;
}

/// Calls tools on servers (MCP `tools/call`). The caller has already checked permission.
pub trait ToolHost: ToolLister {
    /// Calls `tool` with `arguments` and returns its output. A tool that ran and failed is
    /// `Ok` with [`ToolOutput::is_error`] set; `Err` is for the connection failing.
    fn call_tool(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
    ) -> impl Future<Output = Result<ToolOutput, Self::Error>> + Send;

    /// [`call_tool`](Self::call_tool), reporting the call's progress (MCP's
    /// `notifications/progress` for this call alone) to `progress` while it runs.
    ///
    /// The host drops `progress` when the call ends (answered, failed, or its future
    /// dropped), never keeping it for another call, so a caller relaying the reports knows
    /// when no more can come. Deadlines, cancellation and errors are as
    /// [`call_tool`](Self::call_tool)'s.
    ///
    /// The default reports nothing: it drops the sink and makes the plain call. A host whose
    /// calls can report progress overrides it.
    fn call_tool_with_progress(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
        progress: ProgressSink,
    ) -> impl Future<Output = Result<ToolOutput, Self::Error>> + Send {
        drop(progress);
        self.call_tool(tool, arguments)
    }

    /// One round of a call that may need the client's input first (MCP 2026-07-28's
    /// multi-round-trip requests): [`call_tool_with_progress`](Self::call_tool_with_progress)
    /// carrying `round` (the retry's responses and state, the capabilities declared), whose
    /// answer may be [`HostAnswer::InputRequired`] instead of an output. Progress,
    /// deadlines, cancellation and errors are as `call_tool_with_progress`'s.
    ///
    /// The default knows no rounds: it makes the call with progress, without `round`, and
    /// answers [`HostAnswer::Complete`]. Such a host never asks for input, so a caller has
    /// no state of it to retry with. A host that speaks MCP 2026-07-28 overrides it.
    fn call_tool_round(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
        round: InputRound,
        progress: ProgressSink,
    ) -> impl Future<Output = Result<HostAnswer, Self::Error>> + Send {
        let _ = round;
        async move {
            self.call_tool_with_progress(tool, arguments, progress)
                .await
                .map(HostAnswer::Complete)
        }
    }
}

/// One round of an MCP 2026-07-28 multi-round-trip call (MRTR): what a retry carries after
/// the server answered `input_required`, and the client capabilities the call declares.
///
/// [`InputRound::default`] is a first call declaring no capability. The fields are raw JSON
/// passed through as they came: the host checks none of them, the server does.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InputRound {
    /// `inputResponses`: the client's answer to each input request of the previous round
    /// (an `ElicitResult`, a `CreateMessageResult`, a `ListRootsResult`), by its key.
    pub input_responses: Option<JsonObject>,
    /// `requestState`: the server's state from the previous round, byte for byte. `None`
    /// when the server sent none (the client then must send none).
    pub request_state: Option<String>,
    /// The client capabilities the call declares to the server (the value of `_meta`'s
    /// `io.modelcontextprotocol/clientCapabilities`); `None` declares none. Only a server
    /// of 2026-07-28 reads capabilities per request; an earlier one has those of its
    /// `initialize`.
    pub client_capabilities: Option<JsonObject>,
}

impl InputRound {
    /// Whether this round retries an earlier one (it carries responses or state).
    pub fn is_retry(&self) -> bool {
        self.input_responses.is_some() || self.request_state.is_some()
    }
}

/// What a host answers for one round of a call ([`ToolHost::call_tool_round`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum HostAnswer {
    /// The call is complete: its output (a tool that ran and failed too).
    Complete(ToolOutput),
    /// The server needs the client's input before the tool can run (MCP 2026-07-28's
    /// `InputRequiredResult`): the result object exactly as the server sent it
    /// (`resultType`, `inputRequests`, `requestState`, `_meta`). It is not a tool result:
    /// nothing should log it or show it to a model as one. The caller answers the input
    /// requests and calls again with an [`InputRound`] carrying the responses and the
    /// state.
    InputRequired(JsonObject),
    /// The server refused the call for a client capability the round did not declare
    /// (JSON-RPC error -32021, `MissingRequiredClientCapabilityError`): the server's
    /// message and `data` (its `requiredCapabilities`), for the client to see.
    MissingCapability {
        /// The server's error message.
        message: String,
        /// The error's `data`, as sent.
        data: Option<Value>,
    },
}

/// What kind of failure a [`RecordStore`]'s append error is: what a caller does next
/// depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordFailure {
    /// A spilled text could not be read whole as UTF-8: this record cannot be stored as it
    /// is (nothing of its batch was acknowledged); others can.
    Spill,
    /// The record nests JSON deeper than the store could read back
    /// ([`json::MAX_DEPTH`](crate::json::MAX_DEPTH), counted with the store's own wrapping):
    /// this record cannot be stored as it is (nothing of its batch was acknowledged); others
    /// can.
    TooDeep,
    /// The store cannot be reached now (a lost connection, a database restarting, no pooled
    /// connection in time): nothing of the batch was acknowledged; trying again later may
    /// succeed.
    Unavailable,
    /// The store failed otherwise (storage, damaged data, a store that must be reopened),
    /// or cannot say whether the batch was stored (a database connection lost while its
    /// commit was under way: a read tells).
    Store,
}

/// One Run's records on a store that keeps them durably: appended in batches, read back by
/// handle. The seam the record log (psych-record-log's `SharedRecordLog`) and the
/// PostgreSQL store implement alike, proved by one conformance suite
/// (psych-store-conformance's `records_conformance!`).
///
/// - A batch is one write: every record of it is acknowledged (its handle returned) only
///   once all of it is durable, and a failed batch acknowledges none (file: one
///   `fdatasync`; PostgreSQL: one transaction). Handles are `RUN:0`, `RUN:1`, … in the order
///   of acknowledgement.
/// - A tool result is stored whole, whatever its size: spilled texts
///   ([`ToolOutput::spilled`]) are stored in their blocks' places, and the result reads
///   back as the same result held in memory would. Reads by handle
///   ([`RecordSource`]) cost about what they return, not the result's size.
/// - The store serves its own Run only: a handle of another Run does not resolve.
///
/// Every method blocks the calling thread (file I/O and `fdatasync`, a database round
/// trip): call them off the async workers.
pub trait RecordStore: RecordSource + Send + Sync + std::fmt::Debug {
    /// The error of a failed append.
    type AppendError: std::error::Error + Send + Sync + 'static;

    /// What kind of failure `error` (one of this store's) is.
    fn failure(&self, error: &Self::AppendError) -> RecordFailure;

    /// Appends `records` as one write and returns their handles, in order, once all of
    /// them are durable.
    ///
    /// # Errors
    ///
    /// The store's error; nothing of the batch is acknowledged. When the failure's kind
    /// is [`RecordFailure::Spill`], [`RecordFailure::TooDeep`] or
    /// [`RecordFailure::Unavailable`], nothing of it is
    /// stored either and the next append takes the handle the batch's first record would
    /// have had; [`RecordFailure::Store`] may also mean the store cannot tell whether the
    /// batch was stored (a database connection lost during its commit).
    fn append_batch(&self, records: &[Record]) -> Result<Vec<RecordHandle>, Self::AppendError>;

    /// Appends one record (a batch of one).
    ///
    /// # Errors
    ///
    /// As [`append_batch`](Self::append_batch).
    fn append(&self, record: &Record) -> Result<RecordHandle, Self::AppendError> {
        let mut handles = self.append_batch(std::slice::from_ref(record))?;
        // A batch of one acknowledged gives one handle.
        Ok(handles.swap_remove(0))
    }

    /// The number of records acknowledged so far.
    fn len(&self) -> u64;

    /// Whether no record is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes this Run's records take in the store (what rotation and retention count).
    fn size_bytes(&self) -> u64;

    /// Appends to `history` the records stored past its last entry, tool results as
    /// [`StoredResult`](crate::StoredResult)s read without their content. `history` must
    /// have been read from this store (its entries are its first records).
    ///
    /// # Errors
    ///
    /// Storage failures; `history` keeps the entries read before the error.
    fn extend_history(&self, history: &mut crate::History) -> Result<(), Self::Error>;

    /// What the history holds of the tool result at `handle` (without its content); `None`
    /// when `handle` names no tool result of this Run.
    ///
    /// # Errors
    ///
    /// Storage failures only.
    fn stored_result(
        &self,
        handle: &RecordHandle,
    ) -> Result<Option<crate::StoredResult>, Self::Error>;
}

/// A record store's failure with its kind, the store's own typed error kept inside: what
/// callers holding any store ([`DynRecordStore`]) get. Its message and sources are the
/// store's error's (it is transparent); [`get_ref`](Self::get_ref) downcasts to it.
#[derive(Debug)]
pub struct StoreError {
    kind: RecordFailure,
    inner: Box<dyn std::error::Error + Send + Sync>,
}

impl StoreError {
    /// `inner`, of kind `kind`.
    pub fn new(kind: RecordFailure, inner: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self {
            kind,
            inner: Box::new(inner),
        }
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> RecordFailure {
        self.kind
    }

    /// The store's own error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.inner
    }

    /// The store's own error, owned.
    pub fn into_inner(self) -> Box<dyn std::error::Error + Send + Sync> {
        self.inner
    }

    /// The store's own error if it is an `E`; else this error, unchanged.
    ///
    /// # Errors
    ///
    /// `self` when the store's error is not an `E`.
    pub fn downcast<E: std::error::Error + Send + Sync + 'static>(self) -> Result<E, Self> {
        let kind = self.kind;
        match self.inner.downcast::<E>() {
            Ok(error) => Ok(*error),
            Err(inner) => Err(Self { kind, inner }),
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.inner, f)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source()
    }
}

/// Any Run's record store, its errors erased to [`StoreError`]: what a caller that works
/// with the record log or the PostgreSQL store alike holds (`Arc<DynRecordStore>`; wrap a
/// store with [`Erased`]).
pub type DynRecordStore = dyn RecordStore<Error = StoreError, AppendError = StoreError>;

/// A store with its errors erased: a record store's to [`StoreError`] (reads' failures are
/// [`RecordFailure::Store`]), a catalogue store's to [`CatalogStoreError`]; it stores and
/// reads exactly as `S` does.
#[derive(Debug, Clone)]
pub struct Erased<S>(pub S);

impl<S: RecordStore> Erased<S> {
    fn read_error(error: S::Error) -> StoreError {
        StoreError::new(RecordFailure::Store, error)
    }
}

impl<S: RecordStore> RecordSource for Erased<S> {
    type Error = StoreError;

    fn run(&self) -> &RunId {
        self.0.run()
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, StoreError> {
        self.0.record(handle).map_err(Self::read_error)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, StoreError> {
        self.0.output_info(handle).map_err(Self::read_error)
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, StoreError> {
        self.0
            .read_output(handle, offset, buf)
            .map_err(Self::read_error)
    }

    fn content_block(
        &self,
        handle: &RecordHandle,
        position: usize,
    ) -> Result<Option<ContentBlock>, StoreError> {
        self.0
            .content_block(handle, position)
            .map_err(Self::read_error)
    }

    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, StoreError> {
        self.0.line_mark(handle, line).map_err(Self::read_error)
    }

    fn block_lines(&self, handle: &RecordHandle) -> Result<Option<BlockLines>, StoreError> {
        self.0.block_lines(handle).map_err(Self::read_error)
    }
}

impl<S: RecordStore> RecordStore for Erased<S> {
    type AppendError = StoreError;

    fn failure(&self, error: &StoreError) -> RecordFailure {
        error.kind()
    }

    fn append_batch(&self, records: &[Record]) -> Result<Vec<RecordHandle>, StoreError> {
        self.0.append_batch(records).map_err(|error| {
            let kind = self.0.failure(&error);
            StoreError::new(kind, error)
        })
    }

    fn append(&self, record: &Record) -> Result<RecordHandle, StoreError> {
        self.0.append(record).map_err(|error| {
            let kind = self.0.failure(&error);
            StoreError::new(kind, error)
        })
    }

    fn len(&self) -> u64 {
        self.0.len()
    }

    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }

    fn extend_history(&self, history: &mut crate::History) -> Result<(), StoreError> {
        self.0.extend_history(history).map_err(Self::read_error)
    }

    fn stored_result(
        &self,
        handle: &RecordHandle,
    ) -> Result<Option<crate::StoredResult>, StoreError> {
        self.0.stored_result(handle).map_err(Self::read_error)
    }
}

/// A shared source or store is one (clones of the `Arc` read, and append to, the same Run).
impl<S: RecordSource + ?Sized> RecordSource for std::sync::Arc<S> {
    type Error = S::Error;

    fn run(&self) -> &RunId {
        (**self).run()
    }

    fn record(&self, handle: &RecordHandle) -> Result<Option<Record>, Self::Error> {
        (**self).record(handle)
    }

    fn output_info(&self, handle: &RecordHandle) -> Result<Option<OutputInfo>, Self::Error> {
        (**self).output_info(handle)
    }

    fn read_output(
        &self,
        handle: &RecordHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, Self::Error> {
        (**self).read_output(handle, offset, buf)
    }

    fn content_block(
        &self,
        handle: &RecordHandle,
        position: usize,
    ) -> Result<Option<ContentBlock>, Self::Error> {
        (**self).content_block(handle, position)
    }

    fn line_mark(&self, handle: &RecordHandle, line: u64) -> Result<LineMark, Self::Error> {
        (**self).line_mark(handle, line)
    }

    fn block_lines(&self, handle: &RecordHandle) -> Result<Option<BlockLines>, Self::Error> {
        (**self).block_lines(handle)
    }
}

impl<S: RecordStore + ?Sized> RecordStore for std::sync::Arc<S> {
    type AppendError = S::AppendError;

    fn failure(&self, error: &S::AppendError) -> RecordFailure {
        (**self).failure(error)
    }

    fn append_batch(&self, records: &[Record]) -> Result<Vec<RecordHandle>, S::AppendError> {
        (**self).append_batch(records)
    }

    fn append(&self, record: &Record) -> Result<RecordHandle, S::AppendError> {
        (**self).append(record)
    }

    fn len(&self) -> u64 {
        (**self).len()
    }

    fn size_bytes(&self) -> u64 {
        (**self).size_bytes()
    }

    fn extend_history(&self, history: &mut crate::History) -> Result<(), S::Error> {
        (**self).extend_history(history)
    }

    fn stored_result(
        &self,
        handle: &RecordHandle,
    ) -> Result<Option<crate::StoredResult>, S::Error> {
        (**self).stored_result(handle)
    }
}

/// Where Runs' record stores come from when they are not files of this machine's disk (the
/// PostgreSQL store): what lets several processes (gateway replicas, workers) write Runs
/// and read each other's handles. Every method blocks.
pub trait RecordStores: Send + Sync + std::fmt::Debug {
    /// Opens Run `run` of `identity` for appending (created on first use), storing each
    /// tool result's estimate by `estimator`.
    ///
    /// # Errors
    ///
    /// The store's failure (an identity it refuses, the store unreachable).
    fn open(
        &self,
        identity: &str,
        run: &RunId,
        estimator: std::sync::Arc<dyn TokenEstimator + Send + Sync>,
    ) -> Result<std::sync::Arc<DynRecordStore>, StoreError>;

    /// The store of `identity`'s Run `run` if the store has one (records written by any
    /// process), for reading its handles; `None` when `identity` has no such Run.
    ///
    /// # Errors
    ///
    /// The store's failure.
    fn find(
        &self,
        identity: &str,
        run: &RunId,
    ) -> Result<Option<std::sync::Arc<DynRecordStore>>, StoreError>;

    /// Deletes whole Runs, of every identity, last written longer ago than `max_age`, and
    /// the oldest of each identity's Runs past `max_bytes` of its records (the newest kept
    /// first), never a Run a process holds open for writing (a store may say so by a lease
    /// the process renews: one stalled past it may lose the Run); their handles then answer that
    /// they expired ([`expired`](Self::expired)). Returns what went. A store without
    /// retention keeps everything, the default.
    ///
    /// # Errors
    ///
    /// The store's failure (what was deleted before it stays deleted).
    fn sweep(&self, max_age: std::time::Duration, max_bytes: u64) -> Result<SweptRuns, StoreError> {
        let _ = (max_age, max_bytes);
        Ok(SweptRuns::default())
    }

    /// What the results of recent Runs reached, for learned pinning: for each of the
    /// `recent` most recently written Runs of the identities `whose` accepts (written by
    /// any process), newest first (ties by identity, then Run), how many of its results
    /// reached each remote tool
    /// ([`ToolResult::target`](crate::ToolResult::target)). A Run whose records do not read
    /// (damaged) is passed over for the next most recent one: usage is advice. A store that
    /// cannot say answers none, the default.
    ///
    /// # Errors
    ///
    /// The store's failure.
    fn recent_targets(
        &self,
        whose: &Identities,
        recent: usize,
    ) -> Result<Vec<std::collections::BTreeMap<ToolRef, u64>>, StoreError> {
        let _ = (whose, recent);
        Ok(Vec::new())
    }

    /// Why `identity`'s Run `run` was deleted by [`sweep`](Self::sweep) (`age` or `size`),
    /// if it was (and the store still remembers it); `None` otherwise, the default.
    ///
    /// # Errors
    ///
    /// The store's failure.
    fn expired(&self, identity: &str, run: &RunId) -> Result<Option<String>, StoreError> {
        let _ = (identity, run);
        Ok(None)
    }
}

/// Whose Runs a [`RecordStores::recent_targets`] counts: named identities, or every
/// identity but named ones (a store then needs no list of its identities).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identities {
    /// These identities only.
    Only(Vec<String>),
    /// Every identity but these (every identity when empty).
    AllBut(Vec<String>),
}

impl Identities {
    /// Whether `identity`'s Runs are counted.
    #[must_use]
    pub fn accepts(&self, identity: &str) -> bool {
        match self {
            Self::Only(named) => named.iter().any(|n| n == identity),
            Self::AllBut(named) => !named.iter().any(|n| n == identity),
        }
    }
}

/// What a [`RecordStores::sweep`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweptRuns {
    /// Runs deleted.
    pub runs: u64,
    /// Bytes their records held.
    pub bytes: u64,
}

/// What kind of failure a [`CatalogStore`]'s error is: the ones every store must tell apart
/// (a refused request) from the store failing, so that callers, and one conformance suite for
/// every store, can act on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CatalogFailure {
    /// A listing named a tool twice; nothing was stored.
    DuplicateTool,
    /// A read asked for a catalogue version not reached yet.
    VersionAhead,
    /// The store cannot be reached now (a lost connection, a database restarting, no pooled
    /// connection in time): nothing was stored; trying again later may succeed.
    Unavailable,
    /// The store failed otherwise (storage, damaged data).
    Store,
}

/// A server's failure `message` as a catalogue store keeps it: a NUL (which a server's
/// error may carry and PostgreSQL's text cannot hold) becomes U+FFFD, so every store reads
/// back the same text. Borrowed when there is none.
pub fn failure_message(message: &str) -> std::borrow::Cow<'_, str> {
    if message.contains('\0') {
        std::borrow::Cow::Owned(message.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(message)
    }
}

/// A versioned catalogue of MCP tools that never hard-deletes: the seam the redb catalogue
/// (psych-catalog's `Catalog`) and the PostgreSQL store implement alike, proved by one
/// conformance suite (psych-store-conformance).
///
/// - [`refresh`](Self::refresh) makes exactly the listing the server's live set, in one
///   transaction: a new or changed tool gets a row at a new catalogue version, a tool no
///   longer listed is marked removed at it, an unchanged listing takes no version (only
///   the sync stamp moves), and the server's last error is cleared; a listing naming a tool
///   twice is refused whole ([`CatalogFailure::DuplicateTool`]).
/// - Every version the catalogue went through reads as it was ([`tools_at`](Self::tools_at),
///   [`diff`](Self::diff)); one version counter for the whole catalogue.
///
/// A server's health holds its reachability as this process knows it
/// ([`Reachability::Unknown`](crate::Reachability::Unknown) where a store does not track it:
/// it describes this process's connection, not the catalogue).
///
/// Every method blocks the calling thread (a redb transaction, a database round trip): call
/// them off the async workers.
pub trait CatalogStore: Send + Sync + std::fmt::Debug {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// What kind of failure `error` (one of this store's) is.
    fn failure(&self, error: &Self::Error) -> CatalogFailure;

    /// The store's clock, in milliseconds since the Unix epoch (what sync stamps hold).
    fn now(&self) -> UnixMillis;

    /// Makes `tools` exactly the live set of `server`.
    ///
    /// # Errors
    ///
    /// The store's; nothing is stored on error.
    fn refresh(&self, server: &ServerId, tools: &[ToolDefinition]) -> Result<Refresh, Self::Error>;

    /// Records that listing `server` failed with `message`: its tools stay, its health shows
    /// the failure until the next successful refresh. The message is kept as
    /// [`failure_message`] gives it (a NUL as U+FFFD), in every store alike.
    ///
    /// # Errors
    ///
    /// The store's.
    fn record_failure(&self, server: &ServerId, message: &str) -> Result<(), Self::Error>;

    /// The catalogue's current version (0 before any change).
    ///
    /// # Errors
    ///
    /// The store's.
    fn version(&self) -> Result<CatalogVersion, Self::Error>;

    /// The live tools of `server`, ordered by name, with its set version and health (version
    /// 0 and no tools for a server never listed).
    ///
    /// # Errors
    ///
    /// The store's.
    fn live(&self, server: &ServerId) -> Result<ServerCatalog, Self::Error>;

    /// Every server the store knows (listed or failed), ordered by name.
    ///
    /// # Errors
    ///
    /// The store's.
    fn servers(&self) -> Result<Vec<ServerId>, Self::Error>;

    /// The health of `server`: last successful sync, last error.
    ///
    /// # Errors
    ///
    /// The store's.
    fn health(&self, server: &ServerId) -> Result<ServerHealth, Self::Error>;

    /// The tools of `server` live at catalogue version `version`, ordered by name.
    ///
    /// # Errors
    ///
    /// [`CatalogFailure::VersionAhead`] for a version not reached; the store's otherwise.
    fn tools_at(
        &self,
        server: &ServerId,
        version: CatalogVersion,
    ) -> Result<Vec<ToolDefinition>, Self::Error>;

    /// What changed in `server`'s tools from version `from` to version `to` (either order).
    ///
    /// # Errors
    ///
    /// As [`tools_at`](Self::tools_at), for either version.
    fn diff(
        &self,
        server: &ServerId,
        from: CatalogVersion,
        to: CatalogVersion,
    ) -> Result<Diff, Self::Error>;

    /// Whether several processes share this store (so a listing one of them stores is every
    /// one's, and [`lease`](Self::lease) and [`watch`](Self::watch) matter). False for a
    /// local store, the default.
    fn is_shared(&self) -> bool {
        false
    }

    /// Asked before listing `server` for a trigger raised at `since` (by [`now`](Self::now)):
    /// [`Lease::Proceed`] to list it now, holding the server's refresh lease until the
    /// guard drops (drop it after the listing is stored); [`Lease::Satisfied`] when a
    /// listing that started after `since` is already stored by another process sharing the
    /// store, so this one need not list; [`Lease::Busy`] when another process is listing it
    /// now (ask again later). One process lists a server at a time. A local store always
    /// answers `Proceed` with an empty guard, the default.
    ///
    /// # Errors
    ///
    /// The store's.
    fn lease(&self, server: &ServerId, since: UnixMillis) -> Result<Lease, Self::Error> {
        let _ = (server, since);
        Ok(Lease::Proceed(LeaseGuard::none()))
    }

    /// Calls `wake` each time another process sharing the store changes it (a listing or a
    /// failure stored), and once after a lost feed of such changes is restored (one may
    /// have been missed). Changes this process makes are not reported. Local stores never
    /// call it, the default. Wake-ups are only hints: reads are right without them.
    fn watch(&self, wake: std::sync::Arc<dyn Fn() + Send + Sync>) {
        let _ = wake;
    }
}

/// A shared catalogue store is one (`Arc<DynCatalogStore>` included).
impl<S: CatalogStore + ?Sized> CatalogStore for std::sync::Arc<S> {
    type Error = S::Error;

    fn failure(&self, error: &S::Error) -> CatalogFailure {
        (**self).failure(error)
    }

    fn now(&self) -> UnixMillis {
        (**self).now()
    }

    fn refresh(&self, server: &ServerId, tools: &[ToolDefinition]) -> Result<Refresh, S::Error> {
        (**self).refresh(server, tools)
    }

    fn record_failure(&self, server: &ServerId, message: &str) -> Result<(), S::Error> {
        (**self).record_failure(server, message)
    }

    fn version(&self) -> Result<CatalogVersion, S::Error> {
        (**self).version()
    }

    fn live(&self, server: &ServerId) -> Result<ServerCatalog, S::Error> {
        (**self).live(server)
    }

    fn servers(&self) -> Result<Vec<ServerId>, S::Error> {
        (**self).servers()
    }

    fn health(&self, server: &ServerId) -> Result<ServerHealth, S::Error> {
        (**self).health(server)
    }

    fn tools_at(
        &self,
        server: &ServerId,
        version: CatalogVersion,
    ) -> Result<Vec<ToolDefinition>, S::Error> {
        (**self).tools_at(server, version)
    }

    fn diff(
        &self,
        server: &ServerId,
        from: CatalogVersion,
        to: CatalogVersion,
    ) -> Result<Diff, S::Error> {
        (**self).diff(server, from, to)
    }

    fn is_shared(&self) -> bool {
        (**self).is_shared()
    }

    fn lease(&self, server: &ServerId, since: UnixMillis) -> Result<Lease, S::Error> {
        (**self).lease(server, since)
    }

    fn watch(&self, wake: std::sync::Arc<dyn Fn() + Send + Sync>) {
        (**self).watch(wake);
    }
}

/// The answer to [`CatalogStore::lease`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Lease {
    /// List the server now; the lease is held until the guard drops.
    Proceed(LeaseGuard),
    /// Another process sharing the store stored a listing of the server that started after
    /// the trigger: the server's set version it stored.
    Satisfied(CatalogVersion),
    /// Another process is listing the server now.
    Busy,
}

/// Holds a server's refresh lease ([`CatalogStore::lease`]) until dropped.
pub struct LeaseGuard(Option<Box<dyn Send + Sync>>);

impl LeaseGuard {
    /// A guard that holds nothing (a local store's).
    pub fn none() -> Self {
        Self(None)
    }

    /// A guard that releases the lease when `held` drops.
    pub fn holding(held: impl Send + Sync + 'static) -> Self {
        Self(Some(Box::new(held)))
    }
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LeaseGuard")
            .field(&if self.0.is_some() { "held" } else { "none" })
            .finish()
    }
}

/// A catalogue store's failure with its kind, the store's own typed error kept inside: what
/// callers holding any catalogue store ([`DynCatalogStore`]) get. Its message and sources are
/// the store's error's (it is transparent); [`get_ref`](Self::get_ref) downcasts to it.
#[derive(Debug)]
pub struct CatalogStoreError {
    kind: CatalogFailure,
    inner: Box<dyn std::error::Error + Send + Sync>,
}

impl CatalogStoreError {
    /// `inner`, of kind `kind`.
    pub fn new(
        kind: CatalogFailure,
        inner: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            inner: Box::new(inner),
        }
    }

    /// What kind of failure it is.
    pub fn kind(&self) -> CatalogFailure {
        self.kind
    }

    /// The store's own error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.inner
    }
}

impl std::fmt::Display for CatalogStoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.inner, f)
    }
}

impl std::error::Error for CatalogStoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner.source()
    }
}

/// Any catalogue store, its errors erased to [`CatalogStoreError`]: what a caller that works
/// with the redb catalogue or the PostgreSQL store alike holds (`Arc<DynCatalogStore>`;
/// wrap a store with [`Erased`]).
pub type DynCatalogStore = dyn CatalogStore<Error = CatalogStoreError>;

impl<S: CatalogStore> Erased<S> {
    fn catalog_error(&self, error: S::Error) -> CatalogStoreError {
        CatalogStoreError::new(self.0.failure(&error), error)
    }
}

/// A catalogue store with its errors erased to [`CatalogStoreError`] (the kind the store
/// gives); it stores and reads exactly as `S` does.
impl<S: CatalogStore> CatalogStore for Erased<S> {
    type Error = CatalogStoreError;

    fn failure(&self, error: &CatalogStoreError) -> CatalogFailure {
        error.kind()
    }

    fn now(&self) -> UnixMillis {
        self.0.now()
    }

    fn refresh(
        &self,
        server: &ServerId,
        tools: &[ToolDefinition],
    ) -> Result<Refresh, CatalogStoreError> {
        self.0
            .refresh(server, tools)
            .map_err(|e| self.catalog_error(e))
    }

    fn record_failure(&self, server: &ServerId, message: &str) -> Result<(), CatalogStoreError> {
        self.0
            .record_failure(server, message)
            .map_err(|e| self.catalog_error(e))
    }

    fn version(&self) -> Result<CatalogVersion, CatalogStoreError> {
        self.0.version().map_err(|e| self.catalog_error(e))
    }

    fn live(&self, server: &ServerId) -> Result<ServerCatalog, CatalogStoreError> {
        self.0.live(server).map_err(|e| self.catalog_error(e))
    }

    fn servers(&self) -> Result<Vec<ServerId>, CatalogStoreError> {
        self.0.servers().map_err(|e| self.catalog_error(e))
    }

    fn health(&self, server: &ServerId) -> Result<ServerHealth, CatalogStoreError> {
        self.0.health(server).map_err(|e| self.catalog_error(e))
    }

    fn tools_at(
        &self,
        server: &ServerId,
        version: CatalogVersion,
    ) -> Result<Vec<ToolDefinition>, CatalogStoreError> {
        self.0
            .tools_at(server, version)
            .map_err(|e| self.catalog_error(e))
    }

    fn diff(
        &self,
        server: &ServerId,
        from: CatalogVersion,
        to: CatalogVersion,
    ) -> Result<Diff, CatalogStoreError> {
        self.0
            .diff(server, from, to)
            .map_err(|e| self.catalog_error(e))
    }

    fn is_shared(&self) -> bool {
        self.0.is_shared()
    }

    fn lease(&self, server: &ServerId, since: UnixMillis) -> Result<Lease, CatalogStoreError> {
        self.0
            .lease(server, since)
            .map_err(|e| self.catalog_error(e))
    }

    fn watch(&self, wake: std::sync::Arc<dyn Fn() + Send + Sync>) {
        self.0.watch(wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ToolResult, UserMessage};
    use std::sync::Arc;

    /// Counts bytes, and prices binary content apart, overriding the output's sum.
    struct Counted;

    impl TokenEstimator for Counted {
        fn estimate_text(&self, text: &str) -> u64 {
            text.len() as u64
        }

        fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
            len * 2
        }

        fn estimate_output(&self, _output: &ToolOutput) -> u64 {
            7
        }
    }

    #[test]
    fn a_shared_estimator_estimates_as_the_one_it_holds() {
        let shared: Arc<dyn TokenEstimator + Send + Sync> = Arc::new(Counted);
        assert_eq!(shared.estimate_text("abcd"), 4);
        assert_eq!(shared.estimate_binary("image/png", 5), 10);
        // Its own override, not the trait's default sum.
        assert_eq!(shared.estimate_output(&ToolOutput::text("abcd")), 7);
    }

    /// A host whose calls answer at once with the tool's name.
    struct Plain;

    impl ToolLister for Plain {
        type Error = Infallible;

        async fn list_tools(&self, _server: &ServerId) -> Result<Vec<ToolDefinition>, Infallible> {
            Ok(Vec::new())
        }
    }

    impl ToolHost for Plain {
        async fn call_tool(
            &self,
            tool: &ToolRef,
            _arguments: JsonObject,
        ) -> Result<ToolOutput, Infallible> {
            Ok(ToolOutput::text(tool.tool.as_str()))
        }
    }

    #[test]
    fn a_host_without_progress_makes_the_plain_call_and_drops_the_sink_at_once() {
        let held = Arc::new(());
        let sink = crate::progress::tests::holding(&held);
        let tool = ToolRef::parse("fs", "read_file").unwrap();
        let call = Plain.call_tool_with_progress(&tool, JsonObject::new(), sink);
        assert_eq!(Arc::strong_count(&held), 1, "dropped before the call runs");
        let mut call = std::pin::pin!(call);
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        let std::task::Poll::Ready(Ok(output)) = call.as_mut().poll(&mut context) else {
            panic!("the plain call answers at once");
        };
        assert_eq!(output.readable_text(), "read_file");
    }

    #[test]
    fn a_host_without_rounds_answers_a_round_complete() {
        let tool = ToolRef::parse("fs", "read_file").unwrap();
        let round = InputRound {
            request_state: Some("s".into()),
            ..InputRound::default()
        };
        assert!(round.is_retry() && !InputRound::default().is_retry());
        let held = Arc::new(());
        let call = Plain.call_tool_round(
            &tool,
            JsonObject::new(),
            round,
            crate::progress::tests::holding(&held),
        );
        let mut call = std::pin::pin!(call);
        let mut context = std::task::Context::from_waker(std::task::Waker::noop());
        let std::task::Poll::Ready(Ok(HostAnswer::Complete(output))) =
            call.as_mut().poll(&mut context)
        else {
            panic!("the plain call answers at once, complete");
        };
        assert_eq!(output.readable_text(), "read_file");
    }

    fn result(text: &str) -> Record {
        Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new("call_1").unwrap(),
            name: "read_file".into(),
            output: ToolOutput::text(text),
        })
    }

    #[test]
    fn memory_records_serve_only_their_run() {
        let mut log = MemoryRecords::new(RunId::new("a").unwrap());
        let user = log.push(Record::User(UserMessage { text: "hi".into() }));
        let out = log.push(result("hello world"));
        assert_eq!(out.to_string(), "a:1");
        assert!(
            log.output_info(&user).unwrap().is_none(),
            "a user message is not output"
        );
        let info = log.output_info(&out).unwrap().unwrap();
        assert_eq!((info.len, info.kind), (11, OutputKind::Text));

        let mut buf = [0u8; 5];
        assert_eq!(log.read_output(&out, 6, &mut buf).unwrap(), 5);
        assert_eq!(&buf, b"world");
        assert_eq!(log.read_output(&out, 60, &mut buf).unwrap(), 0);

        let foreign = RecordHandle::new(RunId::new("b").unwrap(), 1);
        assert!(log.output_info(&foreign).unwrap().is_none());
        assert!(log.record(&foreign).unwrap().is_none());
        assert_eq!(log.read_output(&foreign, 0, &mut buf).unwrap(), 0);
        let unissued = RecordHandle::new(RunId::new("a").unwrap(), 2);
        assert!(log.record(&unissued).unwrap().is_none());
    }

    #[test]
    fn a_source_without_a_line_index_marks_every_line_from_the_start() {
        let mut log = MemoryRecords::new(RunId::new("a").unwrap());
        let out = log.push(result("one\ntwo\nthree\n"));
        for line in [0, 1, 2, 99] {
            assert_eq!(log.line_mark(&out, line).unwrap(), LineMark::START);
            let borrowed: &MemoryRecords = &log;
            assert_eq!(
                RecordSource::line_mark(&borrowed, &out, line).unwrap(),
                LineMark::START
            );
        }
        assert_eq!(LineMark::default(), LineMark::START);
    }

    #[test]
    fn json_output_reads_as_its_text_view() {
        let mut log = MemoryRecords::new(RunId::new("a").unwrap());
        let value = serde_json::json!({"b": 1, "a": [true]});
        let handle = log.push(Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new("c").unwrap(),
            name: "t".into(),
            output: ToolOutput::json(value),
        }));
        let info = log.output_info(&handle).unwrap().unwrap();
        let mut buf = vec![0u8; info.len as usize];
        log.read_output(&handle, 0, &mut buf).unwrap();
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "{\n  \"a\": [\n    true\n  ],\n  \"b\": 1\n}"
        );
    }
}
