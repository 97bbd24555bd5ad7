//! The workspace's cross-crate properties with the real parts, as proptests.
//!
//! Random multi-turn, multi-step conversations (parallel calls whose results are shaped like
//! real tool answers: a `list_issues` JSON array, a server log, a stack-trace failure as text
//! or JSON, small texts, an occasional PNG, sized below and above small elision thresholds,
//! and `read_tool_output` calls answered by the real reader over the log being written)
//! are appended to a real `psych_record_log::RecordLog` in a temporary folder, read back with
//! its iterator before every model call, assembled by psych-prompt-assembly with the real
//! `psych_elision::Elider` as the projector, and rendered for Anthropic and OpenAI. A second
//! Run's log in the same folder holds the same records, so a handle carried across Runs
//! always names a tool result there too.
//!
//! 1. **Prefix:** within a turn, the cacheable prefix of step k is a byte prefix of step
//!    k+1's cache stream, for both providers, and every request renders to the same bytes
//!    again (from the same prompt, and from a second read of the log).
//! 2. **The log holds everything:** after each turn, the log reads back exactly what was
//!    appended; every tool result is whole by handle, and paging it with
//!    `psych_reader_tool` (by `next_offset`) rebuilds `readable_bytes` of text and JSON
//!    results exactly; every handle shown in an elided preview resolves in its own Run and
//!    is `invalid_deferred_handle` in the other Run's log.
//! 3. **A view changes at most once:** the rendered bytes of each tool result are the same at
//!    every call of its own turn (where it is whole) and the same at every later call (where
//!    it is what the elider makes of its turn's batch).
//!
//! Each check returns the first violation as text, so the tests at the end can show that each
//! one catches a broken part: a projector that varies with the step, a log that stores a
//! trimmed result, a handle resolved in its own Run instead of another.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::cell::Cell;
use std::collections::BTreeSet;

use proptest::prelude::*;
use psych_elision::{Elider, Estimator, PreviewConfig, Thresholds};
use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CurrentTime, DynamicTail, OpenAiOptions, ProjectionCache,
    RenderedRequest, StaticSections, StepHistory, Transient,
};
use psych_reader_tool::{Limits, Reader};
use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{
    AssistantMessage, ContentBlock, History, LoggedRecord, Projection, Record, RecordHandle,
    RecordSource, ResultProjector, ResultRef, ToolCall, ToolCallId, ToolDefinition, ToolName,
    ToolOutput, ToolResult, UserMessage, readable_bytes,
};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::common::{open, preview_handles, read_back};

use psych_test_support::rules;

/// The Run under test and the other Run sharing its folder.
const OWN_RUN: &str = "run-own";
const OTHER_RUN: &str = "run-other";

// ---------------------------------------------------------------------------------------
// Scripts: what the model calls and what the tools answer.
// ---------------------------------------------------------------------------------------

/// The shape of one tool result.
#[derive(Debug, Clone)]
enum Shape {
    /// A GitHub `list_issues` answer: a JSON array of issue objects.
    Issues { count: usize, seed: u32 },
    /// A server log, one request a line.
    Log {
        lines: usize,
        trailing_newline: bool,
        seed: u32,
    },
    /// A failed test run with its stack trace, as text or as a JSON error.
    Trace { frames: usize, json: bool },
    /// A short answer (some empty or blank, some not ASCII).
    Small { pick: usize },
    /// A screenshot: a caption, a real PNG of about `extra` bytes, the page title.
    Png { extra: usize },
    /// The model reads a stored result back with `read_tool_output`: one the last request
    /// showed elided when there is one (else any text result so far), from line `offset`
    /// or grepping; the answer is the real reader's over the real log.
    Reread { grep: bool, offset: u64 },
}

/// One step: the parallel calls the model makes, and whether their results come back in
/// reverse order (as parallel calls may).
#[derive(Debug, Clone)]
struct Step {
    results: Vec<Shape>,
    reversed: bool,
}

/// One turn: a user message (after a new memory, maybe), tool steps, a final reply; with
/// `reopen`, the log is closed and opened again after the turn.
#[derive(Debug, Clone)]
struct Turn {
    new_memory: bool,
    steps: Vec<Step>,
    reopen: bool,
}

/// A conversation and the elider it is assembled with.
#[derive(Debug, Clone)]
struct Script {
    per_result: u64,
    per_batch: u64,
    preview: PreviewConfig,
    turns: Vec<Turn>,
}

impl Script {
    fn elider(&self) -> Elider {
        Elider::builder()
            .thresholds(
                Thresholds::builder()
                    .per_result(self.per_result)
                    .per_batch(self.per_batch)
                    .build()
                    .unwrap(),
            )
            .preview(self.preview)
            .build()
    }
}

const SMALL: [&str; 7] = [
    "OK",
    "No matches found.",
    "Wrote 3 files — café ✓, 日本語のファイル名 included.",
    "",
    "  \n",
    "Deployed build 8f3c2a1 to staging in 41 s.\n",
    "C:\\Users\\ci\\psych> cargo test -- --nocapture",
];

const TITLES: [&str; 6] = [
    "Flaky test in the record log",
    "Elided preview cuts a UTF-8 character",
    "Path \"C:\\temp\" breaks the reader",
    "Catalogue refresh leaves removed tools live",
    "Anthropic rejects a blank text block",
    "Group commit waits longer than max_wait",
];

const LOGINS: [&str; 4] = ["octocat", "ferris", "marie-k", "dependabot[bot]"];

fn issues(count: usize, seed: u32) -> Value {
    let seed = seed as usize;
    Value::Array(
        (0..count)
            .map(|i| {
                let k = seed.wrapping_add(i);
                let area = ["tests", "ux", "perf"][k % 3];
                json!({
                    "number": 4000 + k % 1000,
                    "title": TITLES[k % TITLES.len()],
                    "state": if k % 3 == 0 { "closed" } else { "open" },
                    "labels": [{"name": "bug"}, {"name": area}],
                    "user": {"login": LOGINS[k % LOGINS.len()], "site_admin": false},
                    "comments": k % 13,
                    "created_at": format!("2026-11-{:02}T{:02}:{:02}:00Z", 1 + k % 28, k % 24, k % 60),
                    "html_url": format!("https://github.com/psych-rs/psych/issues/{}", 4000 + k % 1000),
                    "score": (k % 100) as f64 / 8.0,
                })
            })
            .collect(),
    )
}

fn server_log(lines: usize, trailing_newline: bool, seed: u32) -> String {
    let seed = seed as usize;
    let mut text = (0..lines)
        .map(|i| {
            let k = seed.wrapping_mul(31).wrapping_add(i);
            let level = if k % 41 == 0 { "ERROR" } else { "INFO " };
            format!(
                "2026-11-30T12:{:02}:{:02}.{:03}Z {level} server::http: GET /api/jobs/{} {} in {} ms",
                i / 60 % 60,
                i % 60,
                k % 1000,
                k % 9973,
                if k % 41 == 0 { 500 } else { 200 },
                3 + k % 17
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    if trailing_newline {
        text.push('\n');
    }
    text
}

fn trace(frames: usize, as_json: bool) -> ToolOutput {
    let frame = |i: usize| {
        format!(
            "  {i}: psych_record_log::log::RecordLog::append_batch\n             at ./record-log/src/log.rs:{}:{}",
            500 + 7 * i,
            9 + i % 30
        )
    };
    let head = "thread 'log::append_survives_a_full_disk' panicked at record-log/src/log.rs:542:9:\n\
                called `Result::unwrap()` on an `Err` value: Io(Os { code: 28, kind: StorageFull, message: \"No space left on device\" })";
    if as_json {
        ToolOutput {
            is_error: true,
            ..ToolOutput::json(
                json!({"error": {"code": -32603, "message": head, "data": {"backtrace": (0..frames).map(frame).collect::<Vec<_>>()}}}),
            )
        }
    } else {
        let frames: String = (0..frames).map(|i| format!("\n{}", frame(i))).collect();
        ToolOutput::error(format!("{head}\nstack backtrace:{frames}"))
    }
}

/// A screenshot result as a browser server returns it: a caption, a real PNG, the page title.
fn screenshot(extra: usize) -> ToolOutput {
    // About `extra` bytes of pixels: 16 px wide rows of 49 bytes.
    let png = rules::images::png(16, 1 + (extra / 49) as u32, extra as u8);
    ToolOutput::from_blocks(vec![
        ContentBlock::text(format!(
            "Screenshot of http://localhost:8080/jobs ({extra})"
        )),
        ContentBlock::image("image/png", png),
        ContentBlock::text("Page title: Jobs · Psych"),
    ])
}

/// The tool name, arguments and output of a call with this shape.
fn call_of(shape: &Shape, n: usize) -> (&'static str, Value, ToolOutput) {
    match shape {
        Shape::Issues { count, seed } => (
            "list_issues",
            json!({"owner": "psych-rs", "repo": "psych", "state": "open", "per_page": count}),
            ToolOutput::json(issues(*count, *seed)),
        ),
        Shape::Log {
            lines,
            trailing_newline,
            seed,
        } => (
            "read_text_file",
            json!({"path": format!("logs/server-{n}.log")}),
            ToolOutput::text(server_log(*lines, *trailing_newline, *seed)),
        ),
        Shape::Trace { frames, json } => (
            "run_tests",
            json!({"package": "psych-record-log", "filter": "append"}),
            trace(*frames, *json),
        ),
        Shape::Small { pick } => (
            "get_status",
            json!({}),
            ToolOutput::text(SMALL[pick % SMALL.len()]),
        ),
        Shape::Png { extra } => (
            "take_screenshot",
            json!({"url": "http://localhost:8080/jobs", "full_page": extra % 2 == 0}),
            screenshot(*extra),
        ),
        // Played by `Conversation::reread`, which needs the log; without a result to read
        // the model asks for the status instead.
        Shape::Reread { .. } => call_of(&Shape::Small { pick: n }, n),
    }
}

fn object(value: Value) -> psych_types::JsonObject {
    match value {
        Value::Object(map) => map,
        _ => unreachable!("schemas here are objects"),
    }
}

/// The tool surface: one tool per shape and the real reader tool.
fn tools() -> Vec<ToolDefinition> {
    let string = json!({"type": "string"});
    let tool = |name: &str, description: &str, properties: Value| {
        ToolDefinition::new(
            ToolName::new(name).unwrap(),
            description,
            object(json!({"type": "object", "properties": properties})),
        )
    };
    vec![
        tool(
            "take_screenshot",
            "Screenshot a page.",
            json!({"url": string, "full_page": {"type": "boolean"}}),
        ),
        tool(
            "list_issues",
            "List issues of a GitHub repository.",
            json!({"owner": string, "repo": string, "state": {"enum": ["open", "closed", "all"]}, "per_page": {"type": "integer"}}),
        ),
        tool(
            "read_text_file",
            "Read a text file.",
            json!({"path": string}),
        ),
        tool(
            "run_tests",
            "Run a package's tests.",
            json!({"package": string, "filter": string}),
        ),
        tool("get_status", "Report the deployment status.", json!({})),
        psych_reader_tool::tool_definition(&Limits::default()),
    ]
}

fn zone1() -> StaticSections {
    StaticSections::new("You are Psych, a careful operations assistant. Read before you guess.")
        .skill("triage", "Sort new issues by area and severity")
        .subagent("reviewer", "Reviews a diff and reports problems")
        .capability_note(
            "github (deferred, 117 tools): reach it with deferred_list_tools and deferred_call_tool.",
        )
}

// ---------------------------------------------------------------------------------------
// Playing a script against the real parts.
// ---------------------------------------------------------------------------------------

/// A tool result as it was appended.
struct Appended {
    handle: RecordHandle,
    result: ToolResult,
    turn: usize,
}

/// One model call: what was sent, and the same request assembled again from a second read of
/// the log.
struct CallTrace {
    turn: usize,
    step: usize,
    anthropic: RenderedRequest,
    openai: RenderedRequest,
    /// Bodies rendered a second time from the same prompt, then from a new read of the log.
    again: [String; 4],
    views: Vec<(RecordHandle, Projection)>,
}

/// What a broken store would keep instead of a record (the identity for the real log).
type Store = fn(&Record) -> Record;

/// A Run being played: its log and another Run's in one folder, what was appended, and
/// every model call made so far.
struct Conversation<'p> {
    dir: TempDir,
    own: Option<RecordLog>,
    other: RecordLog,
    /// Every record appended to the own Run, in order.
    appended: Vec<Record>,
    results: Vec<Appended>,
    calls: Vec<CallTrace>,
    projector: &'p dyn ResultProjector,
    store: Store,
    zone1: StaticSections,
    tools: Vec<ToolDefinition>,
    memories: Vec<String>,
    clock: i64,
    next_call: usize,
    /// When set, every model call is also assembled lazily (from the log's `History`,
    /// with a projection cache kept across calls) and must give the same bytes.
    lazy: Option<(History, ProjectionCache)>,
}

impl<'p> Conversation<'p> {
    fn new(projector: &'p dyn ResultProjector, store: Store) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let own = open(dir.path(), OWN_RUN, SyncPolicy::OsBuffered);
        let other = open(dir.path(), OTHER_RUN, SyncPolicy::OsBuffered);
        Self {
            dir,
            own: Some(own),
            other,
            appended: Vec::new(),
            results: Vec::new(),
            calls: Vec::new(),
            projector,
            store,
            zone1: zone1(),
            tools: tools(),
            memories: vec!["The user runs the server on Linux.".into()],
            clock: 1_796_041_497,
            next_call: 0,
            lazy: None,
        }
    }

    fn own(&self) -> &RecordLog {
        self.own.as_ref().unwrap()
    }

    /// Appends records to both Runs' logs (one record alone, several as one batch).
    fn append(&mut self, records: &[Record]) -> Vec<RecordHandle> {
        let stored: Vec<Record> = records.iter().map(self.store).collect();
        let own = self.own.as_mut().unwrap();
        let handles = match stored.as_slice() {
            [one] => vec![own.append(one).unwrap()],
            many => own.append_batch(many).unwrap(),
        };
        self.other.append_batch(records).unwrap();
        self.appended.extend_from_slice(records);
        handles
    }

    fn history(&self) -> Vec<LoggedRecord> {
        self.own().iter().collect::<Result<_, _>>().unwrap()
    }

    /// One model call: reads the history back from the log, assembles and renders.
    fn model_call(&mut self, turn: usize, step: usize) {
        self.clock += 11;
        let tail = self
            .memories
            .iter()
            .fold(DynamicTail::new(), |tail, m| tail.memory(m.clone()));
        let transient = Transient::at(CurrentTime::utc(self.clock).unwrap());
        let anthropic_options = AnthropicOptions::new("claude-sonnet-4-5", 4096);
        let openai_options = OpenAiOptions::new("gpt-4.1").prompt_cache_key(OWN_RUN);
        let assembler = Assembler::new(&self.zone1, &tail, &self.tools);

        let history = self.history();
        let prompt = assembler
            .assemble(&history, self.projector, &transient)
            .unwrap();
        let anthropic = prompt.render_anthropic(&anthropic_options).unwrap();
        let openai = prompt.render_openai(&openai_options).unwrap();
        if let Some((lazy, cache)) = &mut self.lazy {
            // The lazy path, against the whole-record path as the oracle.
            let own = self.own.as_ref().unwrap();
            own.extend_history(lazy).unwrap();
            let step = StepHistory::load(lazy, own, self.projector, cache).unwrap();
            let prompt = assembler.assemble_history(&step, &transient).unwrap();
            let lazy_anthropic = prompt.render_anthropic(&anthropic_options).unwrap();
            assert_eq!(lazy_anthropic.body(), anthropic.body());
            let lazy_openai = prompt.render_openai(&openai_options).unwrap();
            assert_eq!(lazy_openai.body(), openai.body());
        }
        // The rule checker on every body the property renders.
        assert_eq!(rules::check_anthropic_body(anthropic.body(), true), Ok(()));
        assert_eq!(rules::check_openai_body(openai.body()), Ok(()));
        let views = prompt
            .result_views()
            .map(|(handle, view)| (handle.clone(), view.clone()))
            .collect();
        let same_prompt = [
            prompt
                .render_anthropic(&anthropic_options)
                .unwrap()
                .into_body(),
            prompt.render_openai(&openai_options).unwrap().into_body(),
        ];
        let reread = self.history();
        let prompt = assembler
            .assemble(&reread, self.projector, &transient)
            .unwrap();
        let [a, b] = same_prompt;
        let again = [
            a,
            b,
            prompt
                .render_anthropic(&anthropic_options)
                .unwrap()
                .into_body(),
            prompt.render_openai(&openai_options).unwrap().into_body(),
        ];
        self.calls.push(CallTrace {
            turn,
            step,
            anthropic,
            openai,
            again,
            views,
        });
    }

    /// A `read_tool_output` call on a result the last request showed elided (else on any
    /// text result so far) and the real reader's answer, or `None` without such a result.
    fn reread(&self, grep: bool, offset: u64) -> Option<(&'static str, Value, ToolOutput)> {
        let textual = |handle: &RecordHandle| {
            self.results
                .iter()
                .any(|a| &a.handle == handle && !a.result.output.is_error)
        };
        let elided: Vec<&RecordHandle> = self
            .calls
            .last()
            .into_iter()
            .flat_map(|call| &call.views)
            .filter(|(handle, view)| matches!(view, Projection::Replaced(_)) && textual(handle))
            .map(|(handle, _)| handle)
            .collect();
        let candidates = if elided.is_empty() {
            self.results
                .iter()
                .map(|a| &a.handle)
                .filter(|handle| textual(handle))
                .collect()
        } else {
            elided
        };
        let handle = candidates.get(offset as usize % candidates.len().max(1))?;
        let arguments = if grep {
            json!({"handle": handle.to_string(), "grep": "ERROR", "limit": 20})
        } else {
            json!({"handle": handle.to_string(), "offset": offset, "limit": 40})
        };
        let answer = Reader::new(self.own()).call(&arguments).unwrap();
        Some((
            psych_types::READ_TOOL_OUTPUT,
            arguments,
            answer.to_tool_output(),
        ))
    }

    fn play_turn(&mut self, t: usize, turn: &Turn) {
        if turn.new_memory {
            self.memories
                .push(format!("Learned in turn {t}: the user wants file paths."));
        }
        self.append(&[Record::User(UserMessage {
            text: format!("Turn {t}: what broke on the server, and is there an issue for it?"),
        })]);
        for (s, step) in turn.steps.iter().enumerate() {
            self.model_call(t, s);
            let mut calls: Vec<(ToolCall, ToolOutput)> = Vec::new();
            for shape in &step.results {
                self.next_call += 1;
                let (name, arguments, output) = match shape {
                    Shape::Reread { grep, offset } => self
                        .reread(*grep, *offset)
                        .unwrap_or_else(|| call_of(shape, self.next_call)),
                    _ => call_of(shape, self.next_call),
                };
                let call = ToolCall {
                    id: ToolCallId::new(format!("toolu_{:04}", self.next_call)).unwrap(),
                    name: name.into(),
                    arguments,
                };
                calls.push((call, output));
            }
            self.append(&[Record::Assistant(AssistantMessage {
                text: if s == 0 {
                    format!("Checking (turn {t}).")
                } else {
                    String::new()
                },
                tool_calls: calls.iter().map(|(call, _)| call.clone()).collect(),
            })]);
            let mut results: Vec<ToolResult> = calls
                .into_iter()
                .map(|(call, output)| ToolResult {
                    target: None,
                    call_id: call.id,
                    name: call.name,
                    output,
                })
                .collect();
            if step.reversed {
                results.reverse();
            }
            let records: Vec<Record> = results.iter().cloned().map(Record::ToolResult).collect();
            let handles = self.append(&records);
            for (handle, result) in handles.into_iter().zip(results) {
                self.results.push(Appended {
                    handle,
                    result,
                    turn: t,
                });
            }
        }
        self.model_call(t, turn.steps.len());
        self.append(&[Record::Assistant(AssistantMessage {
            text: format!("Here is what I found in turn {t}."),
            tool_calls: Vec::new(),
        })]);
        if turn.reopen {
            drop(self.own.take());
            self.own = Some(open(self.dir.path(), OWN_RUN, SyncPolicy::OsBuffered));
        }
    }
}

// ---------------------------------------------------------------------------------------
// The checks. Each returns the first violation.
// ---------------------------------------------------------------------------------------

/// The cacheable prefix of a request.
fn cacheable(request: &RenderedRequest) -> String {
    let mut stream = request.cache_stream().into_owned();
    stream.truncate(request.cacheable_len());
    stream
}

fn providers(call: &CallTrace) -> [(&'static str, &RenderedRequest); 2] {
    [("anthropic", &call.anthropic), ("openai", &call.openai)]
}

/// Property 1: within a turn each request's cacheable prefix starts the next request's
/// cache stream, and every request renders to the same bytes again. Returns how many
/// consecutive pairs were compared.
fn check_prefixes(calls: &[CallTrace]) -> Result<usize, String> {
    let mut pairs = 0;
    for call in calls {
        let bodies = [call.anthropic.body(), call.openai.body()];
        for (k, again) in call.again.iter().enumerate() {
            if again != bodies[k % 2] {
                return Err(format!(
                    "turn {} step {}: rendering again ({}) gave other bytes",
                    call.turn,
                    call.step,
                    ["same prompt", "new read of the log"][k / 2]
                ));
            }
        }
    }
    for pair in calls.windows(2) {
        let [prev, next] = pair else { unreachable!() };
        if prev.turn != next.turn {
            continue;
        }
        pairs += 1;
        for ((name, a), (_, b)) in providers(prev).into_iter().zip(providers(next)) {
            let prefix = cacheable(a);
            let stream = b.cache_stream();
            if !stream.starts_with(&prefix) {
                let at = prefix
                    .bytes()
                    .zip(stream.bytes())
                    .take_while(|(x, y)| x == y)
                    .count();
                return Err(format!(
                    "{name}: turn {} step {}: the prefix of step {} ({} bytes) breaks at byte {at}: {:?} vs {:?}",
                    next.turn,
                    next.step,
                    prev.step,
                    prefix.len(),
                    prefix.get(at..(at + 80).min(prefix.len())),
                    stream.get(at..(at + 80).min(stream.len())),
                ));
            }
        }
    }
    Ok(pairs)
}

/// A reader that reads the source a few hundred bytes at a time, so lines straddle chunks.
fn small_chunk_reader<S: RecordSource>(source: &S) -> Reader<&S> {
    Reader::with_limits(source, Limits::builder().chunk_bytes(777).build().unwrap())
}

/// What property 2 saw, so tests can tell it was not vacuous.
#[derive(Debug, Default)]
struct LogStats {
    results: usize,
    previews: usize,
    refused: usize,
}

/// Property 2, after a turn: the log reads back what was appended; every result is whole by
/// handle and through the reader; every handle shown in the previews of `calls` (the calls
/// of the turn) resolves in its own Run and is `invalid_deferred_handle` in `other`.
fn check_log_holds_everything<O: RecordSource>(
    conversation: &Conversation<'_>,
    calls: &[CallTrace],
    other: &O,
) -> Result<LogStats, String>
where
    O::Error: std::fmt::Debug,
{
    let own = conversation.own();
    let mut stats = LogStats::default();
    let history = conversation.history();
    if history.len() != conversation.appended.len() {
        return Err(format!(
            "the log holds {} records, {} were appended",
            history.len(),
            conversation.appended.len()
        ));
    }
    for (seq, (logged, record)) in history.iter().zip(&conversation.appended).enumerate() {
        if logged.handle != RecordHandle::new(own.run().clone(), seq as u64) {
            return Err(format!("record {seq} has handle {}", logged.handle));
        }
        if &logged.record != record {
            return Err(format!("record {} reads back changed", logged.handle));
        }
    }
    let reader = Reader::new(own);
    let small = small_chunk_reader(own);
    let current = calls.first().map(|c| c.turn);
    for appended in &conversation.results {
        let handle = &appended.handle;
        let text = handle.to_string();
        stats.results += 1;
        let stored = own.record(handle).map_err(|e| e.to_string())?;
        if stored.as_ref() != Some(&Record::ToolResult(appended.result.clone())) {
            return Err(format!("{text} is not the result appended"));
        }
        let full = readable_bytes(&appended.result.output).into_owned();
        let info = own
            .output_info(handle)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{text} has no output info"))?;
        if info.len != full.len() as u64 {
            return Err(format!(
                "{text}: {} bytes stored, {} appended",
                info.len,
                full.len()
            ));
        }
        // Every turn with the default reader, and with small chunks and small pages in the
        // turn the result was appended.
        let mut reads = vec![read_back(&reader, &text, 200)?];
        if Some(appended.turn) == current {
            reads.push(read_back(&small, &text, 13)?);
        }
        if reads.iter().any(|bytes| *bytes != full) {
            return Err(format!(
                "{text} does not read back whole through the reader"
            ));
        }
        // Every block, binary data included, by position.
        for (position, block) in appended.result.output.content.iter().enumerate() {
            let back = own
                .content_block(handle, position)
                .map_err(|e| e.to_string())?;
            if back.as_ref() != Some(block) {
                return Err(format!("{text}: block {position} does not come back whole"));
            }
        }
    }

    let other_reader = Reader::new(other);
    for call in calls {
        // The handles the previews must show: the elided successes that are text or JSON
        // (failures are cut without guidance, binary output has no remedy to point to).
        let expected: BTreeSet<String> = call
            .views
            .iter()
            .filter(|(handle, view)| {
                matches!(view, Projection::Replaced(_))
                    && conversation.results.iter().any(|a| {
                        a.handle == *handle
                            && !a.result.output.is_error
                            && a.result.output.binary_blocks().next().is_none()
                    })
            })
            .map(|(handle, _)| handle.to_string())
            .collect();
        for (name, request) in providers(call) {
            let shown = preview_handles(request.body())?;
            let unique: BTreeSet<String> = shown.iter().cloned().collect();
            if unique != expected || unique.len() != shown.len() {
                return Err(format!(
                    "{name}: turn {} step {}: previews show {shown:?}, elided {expected:?}",
                    call.turn, call.step
                ));
            }
            for text in &shown {
                stats.previews += 1;
                let handle: RecordHandle = text.parse().map_err(|e| format!("{text}: {e}"))?;
                let Some(appended) = conversation.results.iter().find(|a| a.handle == handle)
                else {
                    return Err(format!("{text} names no result of this Run"));
                };
                let full = readable_bytes(&appended.result.output).into_owned();
                if read_back(&reader, text, 1000)? != full {
                    return Err(format!("{text} does not resolve whole in its own Run"));
                }
                for arguments in [
                    json!({"handle": text}),
                    json!({"handle": text, "grep": "ERROR"}),
                ] {
                    match other_reader.call(&arguments) {
                        Err(err) if err.code() == "invalid_deferred_handle" => {}
                        Err(err) => return Err(format!("{text} in another Run: {err:?}")),
                        Ok(answer) => {
                            return Err(format!("{text} resolved in another Run: {answer:?}"));
                        }
                    }
                }
                if other
                    .record(&handle)
                    .map_err(|e| format!("{e:?}"))?
                    .is_some()
                {
                    return Err(format!("{text} names a record of another Run's source"));
                }
                stats.refused += 1;
            }
        }
    }
    Ok(stats)
}

/// The bytes of the tool result answering `call_id` in a request's cache stream: the whole
/// `tool_result` block (Anthropic) or `tool` message (OpenAI).
fn result_bytes(request: &RenderedRequest, name: &str, call_id: &str) -> Result<String, String> {
    let stream = request.cache_stream();
    let id = serde_json::to_string(call_id).unwrap();
    let opening = match name {
        "anthropic" => format!("{{\"type\":\"tool_result\",\"tool_use_id\":{id}"),
        _ => format!("{{\"role\":\"tool\",\"tool_call_id\":{id}"),
    };
    let mut found = stream.match_indices(&opening).map(|(at, _)| at);
    let (Some(start), None) = (found.next(), found.next()) else {
        return Err(format!(
            "{name}: the result of {call_id} is not rendered exactly once"
        ));
    };
    // The end of the object starting at `start`, strings skipped.
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, b) in stream.bytes().enumerate().skip(start) {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Ok(stream[start..=i].to_owned());
                }
            }
            _ => {}
        }
    }
    Err(format!("{name}: the result of {call_id} is not closed"))
}

/// What property 3 saw.
#[derive(Debug, Default)]
struct ViewStats {
    changed: usize,
    unchanged: usize,
}

/// Property 3: each result's rendered bytes are the same at every call of its own turn and
/// the same at every later call, so they change at most once, when its turn stops being the
/// current one. Its view is whole in its own turn and, later, what the projector makes of
/// its turn's batch; an elided view is what is rendered.
fn check_views_change_at_most_once(conversation: &Conversation<'_>) -> Result<ViewStats, String> {
    let mut stats = ViewStats::default();
    for (index, appended) in conversation.results.iter().enumerate() {
        let call_id = appended.result.call_id.as_str();
        let handle = &appended.handle;
        // The projector's view of the result's turn, asked once on its own.
        let batch: Vec<&Appended> = conversation
            .results
            .iter()
            .filter(|a| a.turn == appended.turn)
            .collect();
        let refs: Vec<ResultRef<'_>> = batch
            .iter()
            .map(|a| ResultRef {
                handle: &a.handle,
                output: &a.result.output,
                target: a.result.target.as_ref(),
            })
            .collect();
        let projected = conversation.projector.project(&refs);
        let position = batch.iter().position(|a| a.handle == *handle).unwrap();
        let later_view = &projected[position];

        for name in ["anthropic", "openai"] {
            let mut own_turn: Option<String> = None;
            let mut later: Option<String> = None;
            let mut seen = false;
            for call in &conversation.calls {
                let Some((_, view)) = call.views.iter().find(|(h, _)| h == handle) else {
                    continue;
                };
                seen = true;
                let request = if name == "anthropic" {
                    &call.anthropic
                } else {
                    &call.openai
                };
                let bytes = result_bytes(request, name, call_id)?;
                let at = format!(
                    "{name}: {handle} ({call_id}) at turn {} step {}",
                    call.turn, call.step
                );
                let (slot, expected_view) = if call.turn == appended.turn {
                    (&mut own_turn, &Projection::Full)
                } else {
                    (&mut later, later_view)
                };
                if view != expected_view {
                    return Err(format!(
                        "{at}: the view is {view:?}, expected {expected_view:?}"
                    ));
                }
                if let Projection::Replaced(text) = view {
                    let escaped = serde_json::to_string(text).unwrap();
                    if !bytes.contains(&escaped[1..escaped.len() - 1]) {
                        return Err(format!("{at}: the elided view is not what is rendered"));
                    }
                }
                match slot {
                    Some(first) if *first != bytes => {
                        return Err(format!(
                            "{at}: the rendered result changed again: {first} then {bytes}"
                        ));
                    }
                    Some(_) => {}
                    None => *slot = Some(bytes),
                }
            }
            if !seen {
                return Err(format!("result {index} ({handle}) was never sent"));
            }
            match (&own_turn, &later) {
                (Some(a), Some(b)) if a != b => {
                    if matches!(later_view, Projection::Full) {
                        return Err(format!("{name}: {handle} is whole, yet its bytes changed"));
                    }
                    stats.changed += 1;
                }
                (Some(_), Some(_)) => stats.unchanged += 1,
                _ => {}
            }
        }
    }
    Ok(stats)
}

// ---------------------------------------------------------------------------------------
// Strategies and the properties.
// ---------------------------------------------------------------------------------------

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        3 => (0usize..24, any::<u32>()).prop_map(|(count, seed)| Shape::Issues { count, seed }),
        3 => (1usize..90, any::<bool>(), any::<u32>())
            .prop_map(|(lines, trailing_newline, seed)| Shape::Log { lines, trailing_newline, seed }),
        2 => (1usize..40, prop::bool::weighted(0.3))
            .prop_map(|(frames, json)| Shape::Trace { frames, json }),
        3 => (0usize..SMALL.len()).prop_map(|pick| Shape::Small { pick }),
        1 => (0usize..2500).prop_map(|extra| Shape::Png { extra }),
        2 => (any::<bool>(), 0u64..50).prop_map(|(grep, offset)| Shape::Reread { grep, offset }),
    ]
}

fn script() -> impl Strategy<Value = Script> {
    let step = (prop::collection::vec(shape(), 1..4), any::<bool>())
        .prop_map(|(results, reversed)| Step { results, reversed });
    let turn = (
        any::<bool>(),
        prop::collection::vec(step, 0..4),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(new_memory, steps, reopen)| Turn {
            new_memory,
            steps,
            reopen,
        });
    (
        100u64..700,
        0u64..1500,
        (40usize..300, 0usize..150, 20usize..300),
        prop::collection::vec(turn, 2..5),
    )
        .prop_map(|(per_result, extra, (head, tail, failure), turns)| Script {
            per_result,
            per_batch: per_result + extra,
            preview: PreviewConfig::builder()
                .head_chars(head)
                .tail_chars(tail)
                .failure_chars(failure)
                .build(),
            turns,
        })
}

/// Plays a whole script.
fn play<'p>(script: &Script, projector: &'p dyn ResultProjector, store: Store) -> Conversation<'p> {
    let mut conversation = Conversation::new(projector, store);
    for (t, turn) in script.turns.iter().enumerate() {
        conversation.play_turn(t, turn);
    }
    conversation
}

fn keep(record: &Record) -> Record {
    record.clone()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Property 1: within a turn, step k's cacheable prefix is a byte prefix of step k+1's
    /// cache stream, for both providers, and rendering is deterministic.
    #[test]
    fn within_a_turn_each_request_extends_the_previous_one(script in script()) {
        let elider = script.elider();
        let conversation = play(&script, &elider, keep);
        if let Err(violation) = check_prefixes(&conversation.calls) {
            return Err(TestCaseError::fail(violation));
        }
    }

    /// Property 2: after each turn the log holds every tool result in full, whatever was
    /// elided, and the handles in the previews resolve only in their own Run.
    #[test]
    fn the_log_holds_every_result_whole_and_handles_stay_in_their_run(script in script()) {
        let elider = script.elider();
        let mut conversation = Conversation::new(&elider, keep);
        for (t, turn) in script.turns.iter().enumerate() {
            let first = conversation.calls.len();
            conversation.play_turn(t, turn);
            let result = check_log_holds_everything(
                &conversation,
                &conversation.calls[first..],
                &conversation.other,
            );
            if let Err(violation) = result {
                return Err(TestCaseError::fail(format!("after turn {t}: {violation}")));
            }
        }
    }

    /// Property 4: assembling each call from the log's lazy `History` (tool results read
    /// from their metadata, previews from a few bytes of head and tail, projections cached
    /// per handle across calls) gives exactly the bytes of assembling the whole records read
    /// with the log's iterator: the old path is the oracle. The log stores estimates until
    /// its first reopen, and none after, so both a stored and a computed estimate are used.
    #[test]
    fn the_lazy_history_assembles_to_the_same_bytes(script in script()) {
        let elider = script.elider();
        let mut conversation = Conversation::new(&elider, keep);
        conversation.own.as_mut().unwrap().set_estimator(std::sync::Arc::new(Estimator::new()));
        conversation.lazy = Some((History::default(), ProjectionCache::new()));
        for (t, turn) in script.turns.iter().enumerate() {
            conversation.play_turn(t, turn);
        }
        prop_assert!(!conversation.calls.is_empty());
    }

    /// Property 3: a result's rendered bytes change at most once over the conversation, when
    /// its turn stops being the current one.
    #[test]
    fn a_result_view_changes_at_most_once(script in script()) {
        let elider = script.elider();
        let conversation = play(&script, &elider, keep);
        if let Err(violation) = check_views_change_at_most_once(&conversation) {
            return Err(TestCaseError::fail(violation));
        }
    }
}

// ---------------------------------------------------------------------------------------
// A fixed script, and proof that each check catches a broken part.
// ---------------------------------------------------------------------------------------

/// Two turns of several steps whose first turn has large results of every kind, so that at
/// turn 2 they are elided, truncated or replaced, then a third turn.
fn telling_script() -> Script {
    let step = |results: Vec<Shape>| Step {
        results,
        reversed: true,
    };
    Script {
        per_result: 300,
        per_batch: 900,
        preview: PreviewConfig::builder()
            .head_chars(120)
            .tail_chars(80)
            .failure_chars(100)
            .build(),
        turns: vec![
            Turn {
                new_memory: false,
                steps: vec![
                    step(vec![
                        Shape::Log {
                            lines: 60,
                            trailing_newline: false,
                            seed: 1,
                        },
                        Shape::Issues { count: 12, seed: 3 },
                    ]),
                    step(vec![
                        Shape::Trace {
                            frames: 20,
                            json: false,
                        },
                        Shape::Png { extra: 2000 },
                        Shape::Small { pick: 2 },
                    ]),
                ],
                reopen: true,
            },
            Turn {
                new_memory: true,
                steps: vec![
                    step(vec![Shape::Small { pick: 0 }]),
                    step(vec![Shape::Reread {
                        grep: false,
                        offset: 0,
                    }]),
                    step(vec![Shape::Issues { count: 2, seed: 9 }]),
                ],
                reopen: false,
            },
            Turn {
                new_memory: false,
                steps: vec![step(vec![Shape::Trace {
                    frames: 3,
                    json: true,
                }])],
                reopen: false,
            },
        ],
    }
}

#[test]
fn the_telling_script_holds_every_property_and_exercises_each_check() {
    let script = telling_script();
    let elider = script.elider();
    let mut conversation = Conversation::new(&elider, keep);
    let mut previews = 0;
    for (t, turn) in script.turns.iter().enumerate() {
        let first = conversation.calls.len();
        conversation.play_turn(t, turn);
        let stats = check_log_holds_everything(
            &conversation,
            &conversation.calls[first..],
            &conversation.other,
        )
        .unwrap();
        assert_eq!(stats.refused, stats.previews);
        previews += stats.previews;
    }
    // The log and the issues of turn 0, shown at the 4 calls of turn 1 and the 2 of turn 2,
    // and turn 1's read of those issues (40 lines) at the 2 calls of turn 2, for both providers.
    assert_eq!(previews, (2 * 6 + 2) * 2);
    assert_eq!(check_prefixes(&conversation.calls), Ok(6));
    let views = check_views_change_at_most_once(&conversation).unwrap();
    // Turn 0's log, issues, trace and screenshot change, and turn 1's read; turn 0's small
    // text and turn 1's others do not, for both providers; except that the screenshot's
    // OpenAI tool message stays the same (its placeholder text; only the user message with
    // the image after it goes). Turn 2's result is never seen later.
    assert_eq!((views.changed, views.unchanged), (9, 7));
    // The read is the real reader's page of the first elided result, turn 0's issues.
    let read = &conversation.results[6].result;
    assert_eq!(read.name, psych_types::READ_TOOL_OUTPUT);
    let text = read.output.readable_text();
    assert!(
        text.starts_with("[read_tool_output run-own:2 · tool \"list_issues\" · json"),
        "{text}"
    );
    assert!(text.contains("\n     1\t[\n     2\t  {\n"), "{text}");
    assert_eq!(text.matches('\t').count(), 40, "{text}");
}

/// The real elider, with every replaced view marked by how many batches it has projected:
/// a projector that varies with the step.
struct StepVarying {
    inner: Elider,
    calls: Cell<usize>,
}

impl ResultProjector for StepVarying {
    fn project(&self, batch: &[ResultRef<'_>]) -> Vec<Projection> {
        let mut out = self.inner.project(batch);
        let n = self.calls.get();
        self.calls.set(n + 1);
        for view in out.iter_mut() {
            if let Projection::Replaced(text) = view {
                text.push_str(&format!(" (projection {n})"));
            }
        }
        out
    }
}

#[test]
fn a_projector_that_varies_with_the_step_fails_the_prefix_and_view_checks() {
    let script = telling_script();
    let projector = StepVarying {
        inner: script.elider(),
        calls: Cell::new(0),
    };
    let mut conversation = play(&script, &projector, keep);
    let violation = check_views_change_at_most_once(&conversation).unwrap_err();
    assert!(violation.contains("turn 1 step 0"), "{violation}");
    let violation = check_prefixes(&conversation.calls).unwrap_err();
    assert!(violation.contains("rendering again"), "{violation}");
    // Even with each request rendered once, the prefix breaks at turn 1's second call.
    for call in &mut conversation.calls {
        call.again = [
            call.anthropic.body().to_owned(),
            call.openai.body().to_owned(),
            call.anthropic.body().to_owned(),
            call.openai.body().to_owned(),
        ];
    }
    let violation = check_prefixes(&conversation.calls).unwrap_err();
    assert!(violation.contains("turn 1 step 1"), "{violation}");
}

/// The cheaper design the spec rejects: large text results trimmed before they are stored.
fn trim_before_storing(record: &Record) -> Record {
    match record {
        Record::ToolResult(result) => match result.output.content.as_slice() {
            [ContentBlock::Text(text)] if text.text.len() > 500 => Record::ToolResult(ToolResult {
                target: None,
                output: ToolOutput {
                    is_error: result.output.is_error,
                    ..ToolOutput::text(text.text.chars().take(200).collect::<String>())
                },
                ..result.clone()
            }),
            _ => record.clone(),
        },
        _ => record.clone(),
    }
}

#[test]
fn a_log_that_stores_trimmed_results_fails_the_log_check() {
    let script = telling_script();
    let elider = script.elider();
    let mut conversation = Conversation::new(&elider, trim_before_storing);
    conversation.play_turn(0, &script.turns[0]);
    let violation =
        check_log_holds_everything(&conversation, &conversation.calls, &conversation.other)
            .unwrap_err();
    assert!(violation.contains("reads back changed"), "{violation}");
}

#[test]
fn resolving_a_preview_handle_in_its_own_run_fails_the_log_check() {
    let script = telling_script();
    let elider = script.elider();
    let mut conversation = Conversation::new(&elider, keep);
    conversation.play_turn(0, &script.turns[0]);
    conversation.play_turn(1, &script.turns[1]);
    // Turn 1's calls show turn 0's previews; ask the own log in place of another Run's.
    let first = conversation.calls.iter().position(|c| c.turn == 1).unwrap();
    let violation = check_log_holds_everything(
        &conversation,
        &conversation.calls[first..],
        conversation.own(),
    )
    .unwrap_err();
    assert!(violation.contains("resolved in another Run"), "{violation}");
}
