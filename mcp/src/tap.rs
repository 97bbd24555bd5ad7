//! The raw `result` of each `tools/list` and `tools/call` response, kept by request id for
//! the request's sender, whatever the transport (stdio or streamable HTTP).
//!
//! rmcp types every answer before handing it on: its `Tool` drops fields it does not model
//! (such as `execution`) and fails a whole page on one malformed tool; its `CallToolResult`
//! drops fields and block types it does not model. So each transport of ours shows the tap
//! the outgoing request ([`Tap::want_request`]) and every incoming message
//! ([`Tap::keep`]) before rmcp sees it: the result is kept here, and rmcp gets a small
//! stand-in of the same shape.
//!
//! A transport that reads an answer it cannot deliver (a line over its memory cap, or one
//! that does not parse but names the request's `id`) puts an [`AnswerFailure`] in the slot
//! with [`Tap::fail`] and hands rmcp a JSON-RPC error for the same id
//! ([`AnswerFailure::to_message`]), so the request ends at once and its sender reads the
//! typed failure from the slot rather than rmcp's error. Such an error carries this
//! process's [`nonce`], so that an error a server wrote with the same `data` (by mistake or
//! on purpose) is reported as the server's error, never as one of ours.
//!
//! A slot lives from the request's sending to its sender's [`Claim::take`]. A sender that
//! gives up (its future dropped: a caller's deadline, a cancelled Run) drops its [`Claim`],
//! which forgets the slot; if the request had not reached the transport yet, the claim
//! leaves a tombstone that the transport's `want` consumes instead of opening a slot.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use psych_types::{ServerId, SpilledBlock};
use rmcp::model::{
    ClientJsonRpcMessage, ClientRequest, ErrorData, JsonRpcMessage, ProgressNotificationParam,
    RequestId,
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::McpError;
use crate::budget::{OverBudget, SpillBudget};
use crate::progress::ProgressRoutes;

/// The method of a progress notification.
const PROGRESS: &str = "notifications/progress";

/// The method of the notification that a server's tools changed.
const TOOLS_CHANGED: &str = "notifications/tools/list_changed";

/// Raw results by request id (the id's JSON text, as it appears on the wire).
pub(crate) struct Tap {
    slots: Mutex<Slots>,
    /// Where an answer too large for memory is kept while it is read.
    spill_dir: PathBuf,
    /// What such answers may hold on disk, shared by the manager's connections.
    budget: SpillBudget,
    /// Where progress notifications go, delivered by our transports (stdio, and HTTP
    /// through [`Tap::offer`]) in the order they were read (rmcp runs each notification's
    /// handler as its own task, which a call's response can overtake, so progress sent just
    /// before the result would be lost there).
    progress: Arc<ProgressRoutes>,
    /// When the connection's transports last read bytes of an unfinished message.
    transfer: Arc<TransferClock>,
    /// How many `notifications/tools/list_changed` the transports have read, counted as
    /// each is read (stdio, and HTTP through [`Tap::offer`]): before any later message of
    /// the same stream reaches rmcp, which rmcp's handler task does not promise. A listing
    /// of several pages compares it before and after its walk ([`Tap::tool_changes`]).
    tool_changes: AtomicU64,
}

/// When a connection last read bytes of a message that had not ended yet (a long answer
/// arriving): what moves a call's deadline on while its answer arrives
/// ([`Timeouts::call`](crate::Timeouts::call)). One atomic; noting costs a clock read.
#[derive(Debug)]
pub(crate) struct TransferClock {
    origin: Instant,
    /// Nanoseconds from `origin` to the last note, plus one; 0 before the first.
    last: AtomicU64,
}

impl Default for TransferClock {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last: AtomicU64::new(0),
        }
    }
}

impl TransferClock {
    /// Notes that bytes of an unfinished message were read now.
    pub(crate) fn note(&self) {
        let nanos = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        self.last.fetch_max(nanos + 1, Ordering::Relaxed);
    }

    /// When bytes of an unfinished message were last read, if ever.
    pub(crate) fn last(&self) -> Option<Instant> {
        match self.last.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(self.origin + std::time::Duration::from_nanos(nanos - 1)),
        }
    }
}

/// Why an answer that arrived could not be delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AnswerFailure {
    /// The answer's line is longer than the transport keeps in memory.
    TooLarge {
        /// The line's length.
        bytes: u64,
        /// The transport's cap.
        limit: u64,
    },
    /// The answer holds more structural bytes than psych-mcp parses.
    TooComplex {
        /// The whole answer's size.
        bytes: u64,
        /// [`MAX_JSON_STRUCTURAL_BYTES`](crate::MAX_JSON_STRUCTURAL_BYTES).
        limit: u64,
    },
    /// The answer does not parse, or is not a JSON-RPC response.
    Malformed {
        /// What is wrong, with a bounded quote of the answer.
        reason: String,
    },
    /// Keeping the answer in files would pass the [`SpillBudget`]: it was not kept.
    OverBudget {
        /// The answer's bytes read when the budget refused more (a JSON body or event
        /// refused before its end: at least this long).
        bytes: u64,
        /// The bytes the answer held itself then (its file, its texts so far).
        held: u64,
        /// The bytes other answers held then.
        others: u64,
        /// The budget.
        limit: u64,
    },
}

impl AnswerFailure {
    /// The failure of an answer of `bytes` bytes too complex to parse.
    pub(crate) fn too_complex(bytes: u64) -> Self {
        Self::TooComplex {
            bytes,
            limit: crate::MAX_JSON_STRUCTURAL_BYTES,
        }
    }

    /// The failure of an answer of `bytes` bytes (so far) refused by the budget.
    pub(crate) fn over_budget(bytes: u64, refused: OverBudget) -> Self {
        Self::OverBudget {
            bytes,
            held: refused.own,
            others: refused.others(),
            limit: refused.limit,
        }
    }
}

/// The key of the `data` of the JSON-RPC error a transport gives rmcp in place of an answer
/// it could not deliver.
const FAILURE_DATA_KEY: &str = "psych/answer";
/// The key of the [`nonce`] in that `data`.
const NONCE_KEY: &str = "nonce";

/// A random value drawn once per process, carried by the errors our transports make up
/// (here and in [`remote`](crate::remote)) and required on the way back in: a server never
/// sees it (these errors go from our transport to rmcp only), so an error of its own that
/// imitates ours is taken for what it is. Drawn from the standard library's randomly
/// keyed hasher (OS randomness), with the process id and the time mixed in.
pub(crate) fn nonce() -> &'static str {
    static NONCE: OnceLock<String> = OnceLock::new();
    NONCE.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        let mut halves = [0u64; 2];
        for (i, half) in halves.iter_mut().enumerate() {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_usize(i);
            hasher.write_u32(std::process::id());
            hasher.write_u128(now);
            *half = hasher.finish();
        }
        format!("{:016x}{:016x}", halves[0], halves[1])
    })
}

impl AnswerFailure {
    /// The error for `call` to `server`.
    pub(crate) fn into_error(self, server: &ServerId, call: &str) -> McpError {
        match self {
            Self::TooLarge { bytes, limit } => McpError::AnswerTooLarge {
                server: server.clone(),
                call: call.to_owned(),
                bytes,
                limit,
            },
            Self::TooComplex { bytes, limit } => McpError::AnswerTooComplex {
                server: server.clone(),
                call: call.to_owned(),
                bytes,
                limit,
            },
            Self::Malformed { reason } => McpError::MalformedAnswer {
                server: server.clone(),
                call: call.to_owned(),
                reason,
            },
            Self::OverBudget {
                bytes,
                held,
                others,
                limit,
            } => McpError::SpillBudget {
                server: server.clone(),
                call: call.to_owned(),
                bytes,
                held,
                others,
                limit,
            },
        }
    }

    /// The JSON-RPC error response (as JSON) that ends request `id` in rmcp: parse error
    /// (-32700), the failure in words, and the failure itself in `data` with the
    /// [`nonce`], so that a request the tap does not follow (`initialize`) still gets the
    /// typed error ([`AnswerFailure::from_error_data`]).
    pub(crate) fn to_message(&self, id: Value) -> Value {
        let (message, data) = match self {
            Self::TooLarge { bytes, limit } => (
                format!("the answer is {bytes} bytes, over the {limit} bytes read into memory"),
                json!({"bytes": bytes, "limit": limit, NONCE_KEY: nonce()}),
            ),
            Self::TooComplex { bytes, limit } => (
                crate::error::too_complex(*bytes, *limit),
                json!({"bytes": bytes, "structure_limit": limit, NONCE_KEY: nonce()}),
            ),
            Self::Malformed { reason } => (
                format!("the answer could not be read: {reason}"),
                json!({"reason": reason, NONCE_KEY: nonce()}),
            ),
            Self::OverBudget {
                bytes,
                held,
                others,
                limit,
            } => (
                format!(
                    "the answer (at least {bytes} bytes) was not kept: keeping it in files \
                     would pass the spill budget of {limit} bytes ({held} held for it, \
                     {others} by other answers)"
                ),
                json!({"bytes": bytes, "held": held, "others": others, "budget": limit,
                       NONCE_KEY: nonce()}),
            ),
        };
        json!({"jsonrpc": "2.0", "id": id, "error": {
            "code": -32700, "message": message, "data": {FAILURE_DATA_KEY: data}}})
    }

    /// The failure carried by an error made by [`AnswerFailure::to_message`] in this
    /// process (its [`nonce`]); `None` for any other error, one a server wrote in the same
    /// shape included.
    pub(crate) fn from_error_data(error: &ErrorData) -> Option<Self> {
        let data = error.data.as_ref()?.get(FAILURE_DATA_KEY)?;
        if data.get(NONCE_KEY).and_then(Value::as_str) != Some(nonce()) {
            return None;
        }
        if let Some(reason) = data.get("reason").and_then(Value::as_str) {
            return Some(Self::Malformed {
                reason: reason.to_owned(),
            });
        }
        if let Some(limit) = data.get("structure_limit").and_then(Value::as_u64) {
            return Some(Self::TooComplex {
                bytes: data.get("bytes")?.as_u64()?,
                limit,
            });
        }
        if let Some(limit) = data.get("budget").and_then(Value::as_u64) {
            return Some(Self::OverBudget {
                bytes: data.get("bytes")?.as_u64()?,
                held: data.get("held")?.as_u64()?,
                others: data.get("others")?.as_u64()?,
                limit,
            });
        }
        Some(Self::TooLarge {
            bytes: data.get("bytes")?.as_u64()?,
            limit: data.get("limit")?.as_u64()?,
        })
    }
}

/// The most requests given up unsent a tap remembers (about 50 bytes each).
const MAX_ABANDONED: usize = 1024;

/// A slot's content.
enum Answer {
    /// Sent, no answer yet.
    Pending,
    /// The raw result, with its texts kept in files if it was too large to hold.
    Result(Value, Vec<SpilledBlock>),
    /// An answer arrived that could not be delivered.
    Failed(AnswerFailure),
}

#[derive(Default)]
struct Slots {
    /// Requests sent and not yet taken.
    wanted: HashMap<String, Answer>,
    /// Requests whose sender gave up before the transport sent them, each with the number
    /// it was given up as: a request rmcp drops unsent (its HTTP worker skips one cancelled
    /// while queued) never consumes its entry.
    abandoned: HashMap<String, u64>,
    /// The same, oldest first, with entries consumed since (sent late) left in place until
    /// they reach the front: at most [`MAX_ABANDONED`], so at most that many are remembered.
    given_up: VecDeque<(u64, String)>,
    /// How many requests were given up unsent: the next one's number.
    given_up_count: u64,
}

fn id_key(id: &RequestId) -> String {
    serde_json::to_string(id).unwrap_or_default()
}

impl Default for Tap {
    /// A tap spilling into [`std::env::temp_dir`], within a budget of its own of
    /// [`DEFAULT_SPILL_BUDGET`](crate::DEFAULT_SPILL_BUDGET).
    fn default() -> Self {
        Self::new(std::env::temp_dir(), SpillBudget::default())
    }
}

impl Tap {
    /// A tap whose connection keeps answers too large for memory in `spill_dir`, within
    /// `budget`.
    pub(crate) fn new(spill_dir: PathBuf, budget: SpillBudget) -> Self {
        Self {
            slots: Mutex::default(),
            spill_dir,
            budget,
            progress: Arc::default(),
            transfer: Arc::default(),
            tool_changes: AtomicU64::new(0),
        }
    }

    /// Counts a `notifications/tools/list_changed` a transport has just read.
    pub(crate) fn tools_changed(&self) {
        self.tool_changes.fetch_add(1, Ordering::SeqCst);
    }

    /// How many `notifications/tools/list_changed` the transports have read so far.
    pub(crate) fn tool_changes(&self) -> u64 {
        self.tool_changes.load(Ordering::SeqCst)
    }

    /// The clock the connection's transports note a long message's bytes on.
    pub(crate) fn transfer(&self) -> &Arc<TransferClock> {
        &self.transfer
    }

    /// Where the connection keeps answers too large for memory.
    pub(crate) fn spill_dir(&self) -> &Path {
        &self.spill_dir
    }

    /// What the connection's answers kept in files may hold on disk.
    pub(crate) fn budget(&self) -> &SpillBudget {
        &self.budget
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens a slot for `message` if it is a `tools/list` (sent as a custom request, so
    /// that rmcp does not type the answer) or `tools/call` request; says whether it is one.
    pub(crate) fn want_request(&self, message: &ClientJsonRpcMessage) -> bool {
        let JsonRpcMessage::Request(request) = message else {
            return false;
        };
        let tapped = match &request.request {
            ClientRequest::CustomRequest(custom) => custom.method == "tools/list",
            ClientRequest::CallToolRequest(_) => true,
            _ => false,
        };
        if tapped {
            self.want(&request.id);
        }
        tapped
    }

    fn want(&self, id: &RequestId) {
        let key = id_key(id);
        let mut slots = self.slots();
        if slots.abandoned.remove(&key).is_none() {
            slots.wanted.insert(key, Answer::Pending);
        }
    }

    /// Offers a message the server wrote (HTTP: a JSON body or an event's data): a progress
    /// notification goes to its call's channel now, in the order read, a tools change is
    /// counted ([`Tap::tools_changed`]) and left for rmcp, and a result with an open slot is
    /// kept as [`Tap::keep`] does. Says whether `message` was rewritten.
    pub(crate) fn offer(&self, message: &mut Value) -> bool {
        match message.get("method").and_then(Value::as_str) {
            Some(PROGRESS) => {
                if let Some(params) = message.get("params")
                    && let Ok(params) = ProgressNotificationParam::deserialize(params)
                {
                    self.progress.deliver(params);
                }
                false
            }
            Some(TOOLS_CHANGED) => {
                self.tools_changed();
                false
            }
            _ => self.keep(message),
        }
    }

    /// Whether [`Tap::offer`] would look at a message whose text is `text`: a result is
    /// awaited, or `text` may be a progress or tools-change notification.
    pub(crate) fn wants(&self, text: &[u8]) -> bool {
        // One scan for the methods' common start.
        self.is_waiting()
            || memchr::memmem::find_iter(text, "notifications/").any(|at| {
                let from = &text[at..];
                from.starts_with(PROGRESS.as_bytes()) || from.starts_with(TOOLS_CHANGED.as_bytes())
            })
    }

    /// Where the progress notifications our transports read go: the connection's calls.
    pub(crate) fn progress(&self) -> &Arc<ProgressRoutes> {
        &self.progress
    }

    /// Whether request `key` (JSON text) awaits its result.
    pub(crate) fn is_open(&self, key: &str) -> bool {
        matches!(self.slots().wanted.get(key), Some(Answer::Pending))
    }

    /// Whether request `id` awaits its result.
    pub(crate) fn awaits(&self, id: &RequestId) -> bool {
        self.is_open(&id_key(id))
    }

    /// Whether any slot is open (when none is, incoming messages need not be looked at).
    pub(crate) fn is_waiting(&self) -> bool {
        !self.slots().wanted.is_empty()
    }

    /// Keeps the `result` of `message` (a JSON-RPC message as the server wrote it) if it
    /// answers a request with an open slot, and puts a small stand-in of the same shape in
    /// its place, so that rmcp does not deserialize (and possibly refuse) a large answer a
    /// second time. Says whether it was kept.
    pub(crate) fn keep(&self, message: &mut Value) -> bool {
        self.keep_spilled(message, Vec::new())
    }

    /// [`Tap::keep`] for a result whose text blocks `spilled` are in files (their `text`
    /// in `message` is the placeholder): the files are kept with the result until its
    /// sender takes it, and go when the slot does (taken, given up, or the connection
    /// dropped). The slots are the requests in flight, so what is kept is bounded by them.
    /// Says whether it was kept (if not, the files go now).
    pub(crate) fn keep_spilled(&self, message: &mut Value, spilled: Vec<SpilledBlock>) -> bool {
        let Some(key) = message.get("id").map(Value::to_string) else {
            return false;
        };
        let Some(result) = message.get_mut("result") else {
            return false;
        };
        {
            let mut slots = self.slots();
            // Only an answer awaited: a second answer with the same id (a server's
            // mistake, or a kept answer's stand-in offered again) leaves the first.
            let Some(slot @ Answer::Pending) = slots.wanted.get_mut(&key) else {
                return false;
            };
            let stand_in = if result.get("tools").is_some() {
                serde_json::json!({"tools": []})
            } else {
                serde_json::json!({"content": []})
            };
            *slot = Answer::Result(std::mem::replace(result, stand_in), spilled);
        }
        true
    }

    /// Records that the answer to the request whose id is `key` (JSON text, as on the wire)
    /// arrived and could not be delivered; says whether the request has a slot. Replaces a
    /// result kept for it (its message turned out unreadable as a whole).
    pub(crate) fn fail(&self, key: &str, failure: AnswerFailure) -> bool {
        let replaced = match self.slots().wanted.get_mut(key) {
            Some(slot) => std::mem::replace(slot, Answer::Failed(failure)),
            None => return false,
        };
        // A result kept for it is freed after the lock, off the worker (not awaited).
        drop(free_answer(replaced));
        true
    }

    /// A claim on request `id`'s slot, taken by the request's sender once the request is
    /// sent; dropping it unredeemed forgets the slot.
    pub(crate) fn claim(self: &Arc<Self>, id: RequestId) -> Claim {
        Claim {
            tap: Some(Arc::clone(self)),
            id,
        }
    }

    fn take(&self, id: &RequestId) -> Option<Result<Kept, AnswerFailure>> {
        match self.slots().wanted.remove(&id_key(id))? {
            Answer::Pending => None,
            Answer::Result(value, spilled) => Some(Ok(Kept { value, spilled })),
            Answer::Failed(failure) => Some(Err(failure)),
        }
    }

    fn forget(&self, id: &RequestId) {
        let key = id_key(id);
        let removed = {
            let mut slots = self.slots();
            let removed = slots.wanted.remove(&key);
            if removed.is_none() {
                if slots.given_up.len() == MAX_ABANDONED
                    && let Some((number, oldest)) = slots.given_up.pop_front()
                    && slots.abandoned.get(&oldest) == Some(&number)
                {
                    // Requests are sent in order: one given up before 1,024 later ones were
                    // was sent, or dropped unsent, long ago.
                    slots.abandoned.remove(&oldest);
                }
                let number = slots.given_up_count;
                slots.given_up_count += 1;
                slots.given_up.push_back((number, key.clone()));
                slots.abandoned.insert(key, number);
            }
            removed
        };
        // A result that came and was not taken (its call dropped meanwhile) is freed after
        // the lock, which the transport's readers take for every answer, and off the worker.
        if let Some(answer) = removed {
            drop(free_answer(answer));
        }
    }

    /// Open slots and tombstones: zero when no request is in flight.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let slots = self.slots();
        slots.wanted.len() + slots.abandoned.len()
    }
}

/// Frees an answer no one will take. A kept result may be up to the transport's 16 MiB of
/// JSON values and spilled files of any size (closing an unlinked file frees its blocks):
/// freed on a blocking thread when a runtime is there (returning that thread's task), else
/// here.
fn free_answer(answer: Answer) -> Option<tokio::task::JoinHandle<()>> {
    if !matches!(answer, Answer::Result(..)) {
        return None;
    }
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    Some(runtime.spawn_blocking(move || drop(answer)))
}

/// A raw result taken from the tap.
#[derive(Debug, PartialEq)]
pub(crate) struct Kept {
    /// The `result` as the server wrote it (a spilled text's `text` is its placeholder).
    pub(crate) value: Value,
    /// The text blocks kept in files, in block order.
    pub(crate) spilled: Vec<SpilledBlock>,
}

/// A request sender's hold on its slot in a [`Tap`]: [`Claim::take`] returns the raw
/// result and closes the slot; dropping the claim without taking (the sender gave up)
/// closes it too.
pub(crate) struct Claim {
    tap: Option<Arc<Tap>>,
    id: RequestId,
}

impl Claim {
    /// The raw result, or why the answer that arrived could not be delivered; `None` if
    /// nothing arrived. The slot is closed either way.
    pub(crate) fn take(mut self) -> Option<Result<Kept, AnswerFailure>> {
        self.tap.take().and_then(|tap| tap.take(&self.id))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(tap) = self.tap.take() {
            tap.forget(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on bad data")]

    use super::*;
    use rmcp::model::{CallToolRequest, CallToolRequestParams};
    use serde_json::json;

    fn call(id: i64) -> ClientJsonRpcMessage {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("echo"),
        ));
        JsonRpcMessage::request(request, RequestId::Number(id))
    }

    #[test]
    fn a_result_is_kept_whole_and_rmcp_gets_a_stand_in() {
        let tap = Arc::new(Tap::default());
        tap.want_request(&call(7));
        let claim = tap.claim(RequestId::Number(7));
        let result = json!({"content": [{"type": "widget", "x": 1}], "extra": true});
        let mut message = json!({"jsonrpc": "2.0", "id": 7, "result": result.clone()});
        assert!(tap.keep(&mut message));
        assert_eq!(message["result"], json!({"content": []}));
        assert_eq!(
            claim.take(),
            Some(Ok(Kept {
                value: result,
                spilled: Vec::new()
            }))
        );
        assert_eq!(tap.len(), 0);
    }

    #[test]
    fn a_failure_replaces_the_answer_and_travels_through_rmcps_error() {
        let tap = Arc::new(Tap::default());
        tap.want_request(&call(4));
        let claim = tap.claim(RequestId::Number(4));
        let mut answer = json!({"jsonrpc": "2.0", "id": 4, "result": {"content": []}});
        assert!(tap.keep(&mut answer));
        let failure = AnswerFailure::TooLarge {
            bytes: 70_000_000,
            limit: 64 << 20,
        };
        assert!(tap.fail("4", failure.clone()));
        assert!(!tap.fail("5", failure.clone()), "no slot for 5");
        assert_eq!(claim.take(), Some(Err(failure.clone())));
        assert_eq!(tap.len(), 0);

        let message = failure.to_message(json!(4));
        let error: ErrorData = serde_json::from_value(message["error"].clone()).unwrap();
        assert_eq!(AnswerFailure::from_error_data(&error), Some(failure));
        let malformed = AnswerFailure::Malformed {
            reason: "EOF while parsing a string".into(),
        };
        let message = malformed.to_message(json!("a"));
        let error: ErrorData = serde_json::from_value(message["error"].clone()).unwrap();
        assert_eq!(AnswerFailure::from_error_data(&error), Some(malformed));
        let over = AnswerFailure::OverBudget {
            bytes: 30 << 20,
            held: 16 << 20,
            others: 50 << 20,
            limit: 64 << 20,
        };
        let message = over.to_message(json!(7));
        let error: ErrorData = serde_json::from_value(message["error"].clone()).unwrap();
        assert_eq!(AnswerFailure::from_error_data(&error), Some(over));
        let dense = AnswerFailure::too_complex(8 << 20);
        let message = dense.to_message(json!(8));
        let error: ErrorData = serde_json::from_value(message["error"].clone()).unwrap();
        assert_eq!(AnswerFailure::from_error_data(&error), Some(dense));
        let plain = ErrorData::internal_error("no", None);
        assert_eq!(AnswerFailure::from_error_data(&plain), None);
    }

    /// Review item 3: a server's own error in the shape of ours (without our nonce, or
    /// with another) is not taken for one of ours.
    #[test]
    fn an_error_in_our_shape_without_our_nonce_is_the_servers() {
        assert_eq!(nonce().len(), 32);
        assert_eq!(nonce(), nonce(), "drawn once");
        for data in [
            json!({FAILURE_DATA_KEY: {"bytes": 1, "limit": 2}}),
            json!({FAILURE_DATA_KEY: {"reason": "forged"}}),
            json!({FAILURE_DATA_KEY: {"reason": "forged", NONCE_KEY: "0123"}}),
            json!({FAILURE_DATA_KEY: {"bytes": 1, "limit": 2, NONCE_KEY: true}}),
        ] {
            let forged = ErrorData::parse_error("forged", Some(data.clone()));
            assert_eq!(AnswerFailure::from_error_data(&forged), None, "{data}");
        }
    }

    #[test]
    fn other_messages_pass_untouched() {
        let tap = Arc::new(Tap::default());
        tap.want_request(&call(1));
        for mut message in [
            json!({"jsonrpc": "2.0", "id": 2, "result": {"content": []}}),
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "no"}}),
            json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}),
        ] {
            let before = message.clone();
            assert!(!tap.keep(&mut message));
            assert_eq!(message, before);
        }
        let initialize = JsonRpcMessage::request(
            ClientRequest::PingRequest(Default::default()),
            RequestId::Number(3),
        );
        tap.want_request(&initialize);
        assert_eq!(tap.len(), 1, "only tools/list and tools/call are tapped");
    }

    /// HTTP's messages reach the tap as they are read: a tools change is counted there and
    /// left for rmcp (which turns it into the event), whether or not an answer is awaited.
    #[test]
    fn a_tools_change_is_counted_as_it_is_offered_and_passes_on() {
        let tap = Tap::default();
        let changed = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
        assert!(
            tap.wants(changed.to_string().as_bytes()),
            "looked at unawaited"
        );
        assert!(!tap.wants(br#"{"jsonrpc":"2.0","method":"notifications/message"}"#));
        let mut message = changed.clone();
        assert!(!tap.offer(&mut message));
        assert_eq!(message, changed, "rmcp still gets it");
        for mut progress in [
            json!({"jsonrpc": "2.0", "method": "notifications/progress",
                "params": {"progressToken": 1, "progress": 1}}),
            json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": "bad"}),
        ] {
            assert!(!tap.offer(&mut progress));
        }
        assert_eq!(tap.tool_changes(), 1);
    }

    #[test]
    fn a_dropped_claim_closes_its_slot_before_or_after_the_answer() {
        let tap = Arc::new(Tap::default());
        tap.want_request(&call(1));
        drop(tap.claim(RequestId::Number(1)));
        assert_eq!(tap.len(), 0, "given up while waiting");

        tap.want_request(&call(2));
        let claim = tap.claim(RequestId::Number(2));
        let mut answer = json!({"jsonrpc": "2.0", "id": 2, "result": {"content": []}});
        assert!(tap.keep(&mut answer));
        drop(claim);
        assert_eq!(tap.len(), 0, "given up after the answer arrived");
    }

    /// Requests given up and never sent (rmcp's HTTP worker skips one cancelled while
    /// queued) leave at most `MAX_ABANDONED` entries, the newest: one of those sent late
    /// still opens no slot.
    #[test]
    fn requests_given_up_and_never_sent_are_remembered_within_a_bound() {
        let tap = Arc::new(Tap::default());
        let more = MAX_ABANDONED as i64 + 100;
        for id in 0..more {
            drop(tap.claim(RequestId::Number(id)));
        }
        assert_eq!(tap.len(), MAX_ABANDONED);
        tap.want_request(&call(more - 1));
        assert_eq!(tap.len(), MAX_ABANDONED - 1, "the newest is still known");
        assert!(!tap.is_waiting());
        // The oldest were forgotten: one sent after all opens a slot.
        tap.want_request(&call(0));
        assert!(tap.is_waiting());
        assert_eq!(tap.len(), MAX_ABANDONED);
    }

    /// A result no one takes is freed on a blocking thread where there is a runtime, and
    /// in place where there is none; a slot without a result frees nothing.
    #[test]
    fn an_untaken_result_is_freed_on_a_blocking_thread() {
        let kept = || Answer::Result(json!({"content": [{"type": "text", "text": "x"}]}), vec![]);
        assert!(free_answer(kept()).is_none(), "no runtime");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            assert!(free_answer(Answer::Pending).is_none());
            let freed = free_answer(kept()).expect("a blocking task");
            assert!(freed.await.is_ok());
        });
    }

    #[test]
    fn a_claim_dropped_before_the_transport_sends_leaves_no_slot() {
        let tap = Arc::new(Tap::default());
        drop(tap.claim(RequestId::Number(5)));
        assert_eq!(tap.len(), 1, "a tombstone until the transport sends");
        tap.want_request(&call(5));
        assert_eq!(tap.len(), 0);
        assert!(!tap.is_waiting());
    }
}
