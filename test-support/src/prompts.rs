//! Shared test helpers: a deterministic test projector, scripted sessions (turns of steps
//! with parallel calls, large, failing and binary results, memories changing between turns,
//! a clock advancing every call, and what models and crashes leave in a log: invented call
//! names, unparsable arguments, calls without a result, whitespace-only texts), the naive assembly used as a baseline, the prefix check and
//! a simulator of Anthropic's breakpoint lookup.

#![allow(
    dead_code,
    unreachable_pub,
    reason = "a helper module shared by test crates; each uses a different part"
)]

use std::collections::BTreeSet;

pub mod billing;
pub use crate::rules;
#[allow(unused_imports, reason = "not every test crate checks bodies")]
pub use rules::{check_anthropic_body, check_openai_body, check_responses_body};

use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CurrentTime, DynamicTail, OpenAiOptions, Part, Prompt,
    RenderedRequest, StaticSections, Transient,
};
use psych_types::{
    AssistantMessage, ContentBlock, LoggedRecord, Projection, Record, RecordHandle,
    ResultProjector, ResultRef, RunId, ToolCall, ToolCallId, ToolDefinition, ToolName, ToolOutput,
    ToolResult, UserMessage,
};

/// A user record.
pub fn user(text: &str) -> Record {
    Record::User(UserMessage { text: text.into() })
}

/// An assistant record with `text` and `calls`, each `(id, name, arguments)`.
pub fn assistant(text: &str, calls: &[(&str, &str, serde_json::Value)]) -> Record {
    Record::Assistant(AssistantMessage {
        text: text.into(),
        tool_calls: calls
            .iter()
            .map(|(id, name, arguments)| ToolCall {
                id: ToolCallId::new(*id).unwrap(),
                name: (*name).into(),
                arguments: arguments.clone(),
            })
            .collect(),
    })
}

/// The result of call `id` of the tool `t`.
pub fn result(id: &str, output: ToolOutput) -> Record {
    result_of(id, "t", output)
}

/// The result of call `id` of the tool `name`.
pub fn result_of(id: &str, name: &str, output: ToolOutput) -> Record {
    Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new(id).unwrap(),
        name: name.into(),
        output,
    })
}

/// A small deterministic stand-in for psych-elision: sizes in bytes, two thresholds, the
/// batch algorithm of the spec, a head+tail preview with the handle, failures truncated.
pub struct TestProjector {
    /// A result larger than this many bytes is elided.
    pub per_result: usize,
    /// The results of one batch together may take this many bytes; larger ones are elided
    /// first until they fit.
    pub per_batch: usize,
}

impl Default for TestProjector {
    fn default() -> Self {
        Self {
            per_result: 400,
            per_batch: 800,
        }
    }
}

fn size(output: &ToolOutput) -> usize {
    output.readable_text().len()
        + output
            .binary_blocks()
            .map(|(_, b)| b.data.len())
            .sum::<usize>()
}

impl ResultProjector for TestProjector {
    fn project(&self, batch: &[ResultRef<'_>]) -> Vec<Projection> {
        let sizes: Vec<usize> = batch.iter().map(|r| size(r.output)).collect();
        let mut total: usize = sizes.iter().sum();
        if total < self.per_result {
            return vec![Projection::Full; batch.len()];
        }
        let mut elide = vec![false; batch.len()];
        for (i, &s) in sizes.iter().enumerate() {
            if s >= self.per_result {
                elide[i] = true;
                total -= s;
            }
        }
        let mut rest: Vec<usize> = (0..batch.len()).filter(|&i| !elide[i]).collect();
        rest.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
        for i in rest {
            if total < self.per_batch {
                break;
            }
            elide[i] = true;
            total -= sizes[i];
        }
        (0..batch.len())
            .map(|i| match elide[i] {
                true => Projection::Replaced(preview(batch[i])),
                false => Projection::Full,
            })
            .collect()
    }
}

fn preview(result: ResultRef<'_>) -> String {
    let text = result.output.readable_text();
    if result.output.is_error {
        return text.chars().take(120).collect::<String>();
    }
    let chars: Vec<char> = text.chars().collect();
    let head: String = chars.iter().take(60).collect();
    let tail: String = chars[chars.len().saturating_sub(60)..].iter().collect();
    format!(
        "{head}\n[... {} bytes elided; read the rest with read_tool_output(\"{}\") ...]\n{tail}",
        text.len(),
        result.handle
    )
}

/// Leaves every result whole.
pub struct Whole;

impl ResultProjector for Whole {
    fn project(&self, batch: &[ResultRef<'_>]) -> Vec<Projection> {
        vec![Projection::Full; batch.len()]
    }
}

/// What one tool call returns in a script.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A short text result.
    Small,
    /// A text result of about this many bytes.
    Large(usize),
    /// A failed call whose error text is about this many bytes.
    Fail(usize),
    /// A result with structured content.
    Json,
    /// A result with one image.
    Image,
    /// A result with an embedded PDF resource.
    Pdf,
    /// The process stopped before the result was logged: the call has none.
    Missing,
    /// The model invented a tool name outside the provider alphabet; the call failed.
    BadName(usize),
    /// The model's arguments did not parse; the log keeps their raw text; the call failed.
    RawArguments,
    /// A screenshot tool returning `count` real PNGs whose headers say `side` px square
    /// (past 2000 and 8000 px, and past 20 images, the limits bite).
    Images {
        /// How many images.
        count: usize,
        /// Each image's width and height, in pixels.
        side: u32,
    },
    /// An image of more than 5 MB of base64.
    HugeImage,
    /// A call whose id (from another provider) is longer than OpenAI's 40 characters.
    LongId,
}

/// Names a model invents (outside `^[a-zA-Z0-9_-]{1,64}$`).
pub const BAD_NAMES: [&str; 4] = [
    "github.list_issues",
    "multi_tool_use.parallel",
    "tööl",
    "a.very.long.namespaced.tool.name.that.goes.on.and.on.past.the.sixty.four.byte.limit",
];

/// One step of a turn: the parallel calls the model makes.
#[derive(Debug, Clone)]
pub struct Step {
    /// What each call of the step returns, in call order.
    pub calls: Vec<Outcome>,
}

/// One turn: a user message, optionally a memory change before it, tool steps, a final reply.
/// With `blank_texts`, the user message and the assistant texts are only whitespace.
#[derive(Debug, Clone)]
pub struct Turn {
    /// Whether the memory (the dynamic tail) changes before the turn.
    pub new_memory: bool,
    /// The tool steps, in order, before the final reply.
    pub steps: Vec<Step>,
    /// Whether the user message and the assistant texts are only whitespace.
    pub blank_texts: bool,
}

/// One model call of a session: the history it sees and the inputs that vary.
#[derive(Debug, Clone)]
pub struct Call {
    /// The turn, from 0.
    pub turn: usize,
    /// The step within the turn, from 0.
    pub step: usize,
    /// How many records of the session's history the call sees.
    pub history_len: usize,
    /// The dynamic tail (memories) at the call.
    pub tail: DynamicTail,
    /// The clock at the call.
    pub time: CurrentTime,
}

/// A played-out script: the full history and every model call made along it.
pub struct Session {
    /// Every record logged, in order.
    pub history: Vec<LoggedRecord>,
    /// Every model call made, in order.
    pub calls: Vec<Call>,
}

/// The tools the scripted model calls, by name.
pub const TOOL_NAMES: [&str; 4] = [
    "read_file",
    "search_code",
    "take_screenshot",
    "deferred_call",
];

fn pseudo_text(seed: usize, len: usize) -> String {
    const WORDS: [&str; 8] = [
        "alpha", "beta", "gamma", "delta", "line", "fn", "{}", "\"q\"\n",
    ];
    let mut out = String::with_capacity(len + 8);
    let mut i = seed;
    while out.len() < len {
        out.push_str(WORDS[i % WORDS.len()]);
        out.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out
}

fn output(outcome: &Outcome, seed: usize) -> ToolOutput {
    match outcome {
        Outcome::Small => ToolOutput::text(format!("ok {seed}")),
        Outcome::Large(len) => ToolOutput::text(pseudo_text(seed, *len)),
        Outcome::Fail(len) => ToolOutput::error(format!(
            "Traceback (most recent call last): {}",
            pseudo_text(seed, *len)
        )),
        Outcome::Json => ToolOutput::json(serde_json::json!({
            "z": seed, "a": [1.5, "x", null], "m": {"b": true, "a": -3}
        })),
        Outcome::Image => ToolOutput::from_blocks(vec![
            ContentBlock::text(format!("screenshot {seed}:")),
            ContentBlock::image("image/png", rules::images::png(4, 3, seed as u8)),
            ContentBlock::text("done"),
        ]),
        Outcome::Pdf => ToolOutput::from_blocks(vec![ContentBlock::from_object(
            serde_json::json!({"type": "resource", "resource": {
                "uri": format!("file:///reports/{seed}.pdf"),
                "mimeType": "application/pdf",
                "blob": psych_types::encode_base64(&vec![b'%'; 300 + seed % 7]),
            }})
            .as_object()
            .cloned()
            .unwrap_or_default(),
        )]),
        Outcome::BadName(i) => {
            ToolOutput::error(format!("unknown tool {}", BAD_NAMES[i % BAD_NAMES.len()]))
        }
        Outcome::RawArguments => ToolOutput::error("arguments are not valid JSON"),
        Outcome::Images { count, side } => {
            let mut blocks = vec![ContentBlock::text(format!("{count} screenshots:"))];
            for k in 0..*count {
                let mut png = rules::images::png(2, 2, (seed + k) as u8);
                png[16..20].copy_from_slice(&side.to_be_bytes());
                png[20..24].copy_from_slice(&side.to_be_bytes());
                blocks.push(ContentBlock::image("image/png", png));
            }
            ToolOutput::from_blocks(blocks)
        }
        Outcome::HugeImage => {
            let mut png = rules::images::png(1, 1, seed as u8);
            png.resize(4_000_000, 0);
            ToolOutput::from_blocks(vec![ContentBlock::image("image/png", png)])
        }
        Outcome::LongId => ToolOutput::text(format!("answered a long id {seed}")),
        // Never logged.
        Outcome::Missing => ToolOutput::text(String::new()),
    }
}

/// The name and arguments of call `i` (id `id`) with this outcome.
fn call_of(outcome: &Outcome, i: usize, id: &str) -> (String, serde_json::Value) {
    let name = match outcome {
        Outcome::BadName(k) => BAD_NAMES[k % BAD_NAMES.len()].to_owned(),
        _ => TOOL_NAMES[i % TOOL_NAMES.len()].to_owned(),
    };
    let arguments = match outcome {
        Outcome::RawArguments => {
            serde_json::Value::String(format!("{{\"path\": \"src/{id}.rs\", \"n\": {i}"))
        }
        _ => serde_json::json!({"path": format!("src/{id}.rs"), "n": i}),
    };
    (name, arguments)
}

/// Plays a script: records are appended as a runtime would, and a call is made before each
/// assistant record.
pub fn play(turns: &[Turn]) -> Session {
    let run = RunId::new("run-1").unwrap();
    let mut history: Vec<LoggedRecord> = Vec::new();
    let mut calls = Vec::new();
    let mut memories = vec!["The user writes Rust.".to_owned()];
    let mut clock = 1_796_041_497_i64;
    let mut call_id = 0;
    let push = |history: &mut Vec<LoggedRecord>, record: Record| {
        let handle = RecordHandle::new(run.clone(), history.len() as u64);
        history.push(LoggedRecord { handle, record });
    };
    for (t, turn) in turns.iter().enumerate() {
        if turn.new_memory {
            memories.push(format!("Learned in turn {t}: prefers short answers."));
        }
        let tail = memories
            .iter()
            .fold(DynamicTail::new(), |tail, m| tail.memory(m.clone()));
        push(
            &mut history,
            Record::User(UserMessage {
                text: if turn.blank_texts {
                    " \n".to_owned()
                } else {
                    format!("Question {t}: look at the repository, please.")
                },
            }),
        );
        for (s, step) in turn.steps.iter().enumerate() {
            clock += 7;
            calls.push(Call {
                turn: t,
                step: s,
                history_len: history.len(),
                tail: tail.clone(),
                time: CurrentTime::utc(clock).unwrap(),
            });
            let ids: Vec<String> = step
                .calls
                .iter()
                .map(|outcome| {
                    call_id += 1;
                    if matches!(outcome, Outcome::LongId) {
                        format!("call_from_another_provider_{call_id:04}_{}", "x".repeat(30))
                    } else {
                        format!("toolu_{call_id:04}")
                    }
                })
                .collect();
            push(
                &mut history,
                Record::Assistant(AssistantMessage {
                    text: if turn.blank_texts {
                        "\n\n".to_owned()
                    } else if s == 0 {
                        format!("Let me check (turn {t}).")
                    } else {
                        String::new()
                    },
                    tool_calls: ids
                        .iter()
                        .zip(&step.calls)
                        .enumerate()
                        .map(|(i, (id, outcome))| {
                            let (name, arguments) = call_of(outcome, i, id);
                            ToolCall {
                                id: ToolCallId::new(id.clone()).unwrap(),
                                name,
                                arguments,
                            }
                        })
                        .collect(),
                }),
            );
            // Results arrive in reverse call order, as parallel calls may.
            for (i, (outcome, id)) in step.calls.iter().zip(&ids).enumerate().rev() {
                if matches!(outcome, Outcome::Missing) {
                    continue;
                }
                push(
                    &mut history,
                    Record::ToolResult(ToolResult {
                        target: None,
                        call_id: ToolCallId::new(id.clone()).unwrap(),
                        name: call_of(outcome, i, id).0,
                        output: output(outcome, t * 100 + s * 10 + i),
                    }),
                );
            }
        }
        clock += 7;
        calls.push(Call {
            turn: t,
            step: turn.steps.len(),
            history_len: history.len(),
            tail: tail.clone(),
            time: CurrentTime::utc(clock).unwrap(),
        });
        push(
            &mut history,
            Record::Assistant(AssistantMessage {
                text: if turn.blank_texts {
                    " ".to_owned()
                } else {
                    format!("Here is what I found in turn {t}.")
                },
                tool_calls: vec![],
            }),
        );
    }
    Session { history, calls }
}

/// The tool surface of the scripts (given in reverse name order; rendering sorts it).
pub fn tools() -> Vec<ToolDefinition> {
    TOOL_NAMES
        .iter()
        .rev()
        .map(|name| {
            ToolDefinition::new(
                ToolName::new(*name).unwrap(),
                format!("The {name} tool."),
                serde_json::from_str(
                    r#"{"type":"object","properties":{"path":{"type":"string"},"n":{"type":"integer"}},"required":["path"]}"#,
                )
                .unwrap(),
            )
        })
        .collect()
}

/// The static system sections every scripted session uses.
pub fn zone1() -> StaticSections {
    StaticSections::new("You are a careful coding assistant.")
        .skill("pdf", "Read and fill PDF forms")
        .skill("changelog", "Write a changelog entry")
        .subagent("reviewer", "Reviews a diff")
        .capability_note("Server `github` is connected but deferred: call deferred_list first.")
}

/// The Anthropic options every scripted session renders with.
pub fn anthropic() -> AnthropicOptions {
    AnthropicOptions::new("claude-sonnet-4-5", 1024)
}

/// The OpenAI options every scripted session renders with.
pub fn openai() -> OpenAiOptions {
    OpenAiOptions::new("gpt-4.1").prompt_cache_key("run-1")
}

/// Both renderings of one call.
pub struct Rendered {
    /// The Anthropic Messages request.
    pub anthropic: RenderedRequest,
    /// The OpenAI Chat Completions request.
    pub openai: RenderedRequest,
    /// (history index, elided?) for each result.
    pub views: Vec<(usize, bool)>,
    /// The elision boundary: the history index before which results were projected.
    pub boundary: Option<usize>,
}

/// The Anthropic rendering of `r` (a function, to pass where a provider is chosen).
pub fn pick_anthropic(r: &Rendered) -> &RenderedRequest {
    &r.anthropic
}

/// The OpenAI rendering of `r` (a function, to pass where a provider is chosen).
pub fn pick_openai(r: &Rendered) -> &RenderedRequest {
    &r.openai
}

fn views(prompt: &Prompt<'_>, history: &[LoggedRecord]) -> Vec<(usize, bool)> {
    prompt
        .result_views()
        .map(|(handle, view)| {
            let index = history.iter().position(|l| &l.handle == handle).unwrap();
            (index, *view != Projection::Full)
        })
        .collect()
}

/// Renders every call of a session with this crate.
pub fn render_session(session: &Session, static_sections: &StaticSections) -> Vec<Rendered> {
    let tools = tools();
    let projector = TestProjector::default();
    session
        .calls
        .iter()
        .map(|call| {
            let transient = Transient::at(call.time);
            let history = &session.history[..call.history_len];
            let prompt = Assembler::new(static_sections, &call.tail, &tools)
                .assemble(history, &projector, &transient)
                .unwrap();
            Rendered {
                anthropic: prompt.render_anthropic(&anthropic()).unwrap(),
                openai: prompt.render_openai(&openai()).unwrap(),
                views: views(&prompt, history),
                boundary: prompt.boundary(),
            }
        })
        .collect()
}

/// The Anthropic requests of every call of a session, rendered with
/// `render_anthropic_sized` (no breakpoint below `min_tokens` as `estimator` counts).
pub fn render_session_sized(
    session: &Session,
    static_sections: &StaticSections,
    min_tokens: u64,
    estimator: &dyn psych_types::TokenEstimator,
) -> Vec<RenderedRequest> {
    render_each(session, static_sections, |prompt| {
        prompt.render_anthropic_sized(&anthropic(), min_tokens, estimator)
    })
}

/// The OpenAI Responses requests of every call of a session.
pub fn render_session_responses(
    session: &Session,
    static_sections: &StaticSections,
) -> Vec<RenderedRequest> {
    render_each(session, static_sections, |prompt| {
        prompt.render_responses(&openai())
    })
}

/// Every call of a session assembled with the test projector and rendered by `render`.
fn render_each(
    session: &Session,
    static_sections: &StaticSections,
    render: impl Fn(&Prompt<'_>) -> Result<RenderedRequest, psych_prompt_assembly::RenderError>,
) -> Vec<RenderedRequest> {
    let tools = tools();
    let projector = TestProjector::default();
    session
        .calls
        .iter()
        .map(|call| {
            let transient = Transient::at(call.time);
            let history = &session.history[..call.history_len];
            let prompt = Assembler::new(static_sections, &call.tail, &tools)
                .assemble(history, &projector, &transient)
                .unwrap();
            render(&prompt).unwrap()
        })
        .collect()
}

/// The naive assembly the crate exists to avoid, emulated through the public API: the date
/// at the top of the system prompt and/or tool results elided per step (everything but the
/// newest step's results goes through the projector, one batch per step).
pub fn render_naive(
    session: &Session,
    clock_in_zone1: bool,
    elide_per_step: bool,
) -> Vec<Rendered> {
    let tools = tools();
    let projector = TestProjector::default();
    session
        .calls
        .iter()
        .map(|call| {
            let history = &session.history[..call.history_len];
            let static_sections = if clock_in_zone1 {
                StaticSections::new(format!(
                    "Today is {}. You are a careful coding assistant.",
                    call.time
                ))
                .skill("pdf", "Read and fill PDF forms")
                .skill("changelog", "Write a changelog entry")
                .subagent("reviewer", "Reviews a diff")
                .capability_note(
                    "Server `github` is connected but deferred: call deferred_list first.",
                )
            } else {
                zone1()
            };
            let transient = if clock_in_zone1 {
                Transient::new()
            } else {
                Transient::at(call.time)
            };
            let rewritten = if elide_per_step {
                elide_before_newest_step(history, &projector)
            } else {
                history.to_vec()
            };
            // Per-step elision already projected the history; otherwise the crate's own
            // boundary applies, with the same projector as `render_session`.
            let boundary_projector: &dyn ResultProjector =
                if elide_per_step { &Whole } else { &projector };
            let prompt = Assembler::new(&static_sections, &call.tail, &tools)
                .assemble(&rewritten, boundary_projector, &transient)
                .unwrap();
            Rendered {
                anthropic: prompt.render_anthropic(&anthropic()).unwrap(),
                openai: prompt.render_openai(&openai()).unwrap(),
                views: views(&prompt, &rewritten),
                boundary: prompt.boundary(),
            }
        })
        .collect()
}

/// Replaces the outputs of every result but the newest step's with their projection.
fn elide_before_newest_step(
    history: &[LoggedRecord],
    projector: &dyn ResultProjector,
) -> Vec<LoggedRecord> {
    let newest_assistant = history
        .iter()
        .rposition(|l| matches!(l.record, Record::Assistant(_)))
        .unwrap_or(0);
    let mut out = history.to_vec();
    let mut start = 0;
    while start < newest_assistant {
        let end = (start + 1..newest_assistant)
            .find(|&i| !matches!(history[i].record, Record::ToolResult(_)))
            .unwrap_or(newest_assistant);
        let indices: Vec<usize> = (start..end)
            .filter(|&i| matches!(history[i].record, Record::ToolResult(_)))
            .collect();
        if !indices.is_empty() {
            let batch: Vec<ResultRef<'_>> = indices
                .iter()
                .filter_map(|&i| match &history[i].record {
                    Record::ToolResult(r) => Some(ResultRef {
                        handle: &history[i].handle,
                        output: &r.output,
                        target: r.target.as_ref(),
                    }),
                    _ => None,
                })
                .collect();
            for (&i, view) in indices.iter().zip(projector.project(&batch)) {
                if let (Projection::Replaced(text), Record::ToolResult(r)) =
                    (view, &mut out[i].record)
                {
                    r.output = ToolOutput {
                        is_error: r.output.is_error,
                        ..ToolOutput::text(text)
                    };
                }
            }
        }
        start = end;
    }
    out
}

/// The cacheable prefix of a request (its cache stream without the transient message).
pub fn cacheable(request: &RenderedRequest) -> String {
    let mut stream = request.cache_stream().into_owned();
    stream.truncate(request.cacheable_len());
    stream
}

/// Checks the prefix property for consecutive calls of the same turn; returns the first
/// violation.
pub fn check_turn_prefixes(
    calls: &[Call],
    rendered: &[Rendered],
    pick: fn(&Rendered) -> &RenderedRequest,
) -> Result<(), String> {
    for k in 1..calls.len() {
        if calls[k].turn != calls[k - 1].turn {
            continue;
        }
        let prev = cacheable(pick(&rendered[k - 1]));
        let next = pick(&rendered[k]).cache_stream();
        if !next.starts_with(&prev) {
            let at = prev
                .bytes()
                .zip(next.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            return Err(format!(
                "turn {} step {}: the previous cacheable prefix ({} bytes) breaks at byte {at}: {:?} vs {:?}",
                calls[k].turn,
                calls[k].step,
                prev.len(),
                prev.get(at..(at + 60).min(prev.len())),
                next.get(at..(at + 60).min(next.len())),
            ));
        }
    }
    Ok(())
}

/// Stream offset where the zone 2 span of a request starts.
pub fn zone2_start(request: &RenderedRequest) -> Option<usize> {
    request
        .spans()
        .iter()
        .find(|s| s.part == Part::DynamicSystem)
        .map(|s| s.range.start)
}

/// The start of the message span holding history record `index`.
pub fn message_start(request: &RenderedRequest, index: usize) -> Option<usize> {
    request.spans().iter().find_map(|s| match &s.part {
        Part::Message { records } if records.contains(&index) => Some(s.range.start),
        _ => None,
    })
}

/// Replays Anthropic's cache lookup over a sequence of requests: each breakpoint looks for
/// an entry at its own block and up to `window - 1` blocks before it, then writes an entry
/// for its block. Returns, per request, the end (in stream bytes) of the longest prefix
/// found in the cache.
pub fn simulate_anthropic_cache(requests: &[&RenderedRequest], window: usize) -> Vec<usize> {
    let mut cache: BTreeSet<String> = BTreeSet::new();
    requests
        .iter()
        .map(|request| {
            let stream = request.cache_stream();
            let ends = request.block_ends();
            let mut best = 0;
            for &q in request.breakpoint_blocks() {
                for j in (q.saturating_sub(window - 1)..=q).rev() {
                    if cache.contains(&stream[..ends[j]]) {
                        best = best.max(ends[j]);
                        break;
                    }
                }
            }
            for &q in request.breakpoint_blocks() {
                cache.insert(stream[..ends[q]].to_owned());
            }
            best
        })
        .collect()
}

/// Replays the cache over one session's Anthropic requests (20-block lookback) and checks
/// that every request of a turn after its first finds the entry the previous request wrote
/// at its last history block.
pub fn check_lookback(calls: &[Call], requests: &[&RenderedRequest]) -> Result<(), String> {
    let found = simulate_anthropic_cache(requests, 20);
    for k in 1..requests.len() {
        if calls[k].turn != calls[k - 1].turn {
            continue;
        }
        let prev = requests[k - 1];
        let last_history_block = prev
            .block_ends()
            .iter()
            .copied()
            .filter(|&end| end <= prev.cacheable_len())
            .max()
            .ok_or_else(|| format!("request {} has no history block", k - 1))?;
        if found[k] != last_history_block {
            return Err(format!(
                "request {k} found the cache up to byte {}, not the previous request's last \
                 history block at byte {last_history_block}",
                found[k]
            ));
        }
    }
    Ok(())
}

/// Twenty turns of zero to three steps, one to three parallel calls each, with large
/// results, failures, a JSON and a binary result, and memories changing at turns 5 and 12.
pub fn twenty_turns() -> Vec<Turn> {
    let mut next = lcg(0x5eed);
    (0..20)
        .map(|t| Turn {
            new_memory: t == 5 || t == 12,
            blank_texts: false,
            steps: (0..next(4))
                .map(|_| Step {
                    calls: (0..1 + next(3))
                        .map(|_| match next(10) {
                            0..=3 => Outcome::Small,
                            4..=6 => Outcome::Large(1000 + 500 * next(8) as usize),
                            7 => Outcome::Fail(700),
                            8 => Outcome::Json,
                            _ => Outcome::Pdf,
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect()
}

/// A wide session: twelve turns of two to four steps, each of 1 to 14 parallel calls, a
/// large result in every step, a memory change at turn 6.
pub fn wide_turns() -> Vec<Turn> {
    let mut next = lcg(0x1de);
    (0..12)
        .map(|t| Turn {
            new_memory: t == 6,
            blank_texts: false,
            steps: (0..2 + next(3))
                .map(|_| {
                    let n = 1 + next(14) as usize;
                    Step {
                        calls: (0..n)
                            .map(|i| match (i, next(10)) {
                                (0, _) | (_, 0..=2) => {
                                    Outcome::Large(1500 + 500 * next(8) as usize)
                                }
                                (_, 3..=6) => Outcome::Small,
                                (_, 7) => Outcome::Fail(700),
                                (_, 8) => Outcome::Json,
                                _ => Outcome::Pdf,
                            })
                            .collect(),
                    }
                })
                .collect(),
        })
        .collect()
}

/// A small deterministic generator: `next(n)` is in `0..n`.
fn lcg(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut state = seed;
    move |n: u64| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) % n
    }
}
