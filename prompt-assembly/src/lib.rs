//! Prompt assembly in four cache-stable zones, the elision boundary, and byte-stable
//! renderers to the Anthropic Messages, OpenAI Chat Completions and OpenAI Responses wire
//! formats.
//!
//! The main type is [`Assembler`]: it holds zone 1 ([`StaticSections`]: instructions, the
//! skills index, the subagent roster, capability notes such as deferred-server lines), zone
//! 2 ([`DynamicTail`]: memories and other per-user, mutable text) and the tool surface, and
//! turns a history (zone 3, the record log's [`LoggedRecord`](psych_types::LoggedRecord)s)
//! plus a [`Transient`] message (zone 4) into a [`Prompt`]. The prompt renders to a
//! [`RenderedRequest`] for each wire format ([`Prompt::render_anthropic`],
//! [`Prompt::render_openai`], [`Prompt::render_responses`]); a [`CacheReport`] over a sequence of requests
//! estimates the tokens each provider's prompt cache reads and writes under its documented
//! rules ([`CacheRules`]), with tokens counted through the
//! [`TokenEstimator`](psych_types::TokenEstimator) seam.
//!
//! A Run assembles each step lazily: [`StepHistory::load`] takes the log's
//! [`History`](psych_types::History) (tool results as stored summaries, no content), projects
//! the turns behind the boundary with
//! [`ResultProjector::project_stored`](psych_types::ResultProjector::project_stored) (kept per
//! handle in a [`ProjectionCache`] between steps) and reads whole only the results sent
//! whole; [`Assembler::assemble_history`] gives the same bytes [`Assembler::assemble`] gives
//! for the whole records, at a cost that follows what the model sees, not what the log holds.
//!
//! What the crate guarantees:
//!
//! - **The clock lives only in zone 4.** [`CurrentTime`] is accepted by [`Transient::at`]
//!   and by nothing else; the crate has no clock of its own.
//! - **The elision boundary is the last user message.** Tool results strictly before it go
//!   through the [`ResultProjector`](psych_types::ResultProjector) (implemented by
//!   psych-elision), one batch per turn (a turn starts at a user message); results at or
//!   after it are sent whole. A result's view therefore changes at most once, when its turn
//!   stops being the current one, and stays byte-stable for every step of a turn. The
//!   records are only read.
//! - **Deterministic bytes.** Tools are rendered sorted by name, the skills index and
//!   subagent roster sorted by name, JSON objects from the records (schemas, arguments) with
//!   keys in sorted byte order whatever map type serde_json was built with, numbers in
//!   serde_json's formatting; no hash-map order reaches the output.
//! - **The prefix property.** Each request is written in the provider's cache order (tools,
//!   system, messages, the transient message last). Its cache stream is the body without
//!   `cache_control` members; its cacheable prefix is that stream up to the end of the
//!   history. Within a turn, the cacheable prefix of step k is a byte prefix of the cache
//!   stream of step k+1 (see [`RenderedRequest`]).
//! - **Accepted as-is.** Calls and results pair up exactly (one result per call id, right
//!   after the assistant message, results first); tool names of the surface outside
//!   `^[a-zA-Z0-9_-]{1,64}$` are a [`RenderError`], never a request the provider would
//!   refuse. Anthropic breakpoints: at most four, never on the transient message, with a
//!   lookback anchor for wide steps (see [`ANCHOR_DISTANCE`]) and, at a turn start whose
//!   moved boundary elides the previous turn's results, on the end of the last step before
//!   the first of them: the last prefix still intact, whose entry that turn wrote.
//! - **Every real log renders.** The log is never rewritten, so anything a model or a crash
//!   can leave in it is rendered with a fixed, documented substitute rather than refused
//!   (a refusal would fail every later request of the Run): a call name outside the
//!   provider alphabet is sanitised (`invalid_` and the name with every other character
//!   made `_`, cut to 64 bytes);
//!   arguments that are not a JSON object go as `{"_raw_arguments": <text>}`
//!   ([`RAW_ARGUMENTS_KEY`]); a call without a logged result is
//!   answered by a failed result reading [`MISSING_RESULT`]; a repeated or late result is
//!   left out; text that is empty or only whitespace is no text block, and a user message
//!   made of it reads [`EMPTY_USER_MESSAGE`]. Only logs no real Run produces are an
//!   [`AssembleError`]: a call id used twice, a result for a call never made.
//!
//! - **No request a provider refuses.** Beyond the pairing rules: Anthropic's first message
//!   is a user message ([`CONVERSATION_START`] is put first when the log starts otherwise);
//!   assistant text is sent without trailing whitespace (the API refuses it at the end of a
//!   final assistant message; every message is trimmed alike so its bytes do not depend on
//!   its place); with no tool in the request, calls and results are written as text blocks
//!   (the API refuses `tool_use` blocks in a request without `tools`); a failure whose text
//!   is blank is a `tool_result` without content. OpenAI: more than [`OPENAI_MAX_TOOLS`]
//!   tools is a [`RenderError::TooManyTools`]; arguments that are not an object are sent as
//!   the text of `{"_raw_arguments": <text>}`; a call id over [`OPENAI_MAX_CALL_ID`]
//!   characters is sent as a short deterministic form (a prefix and a hash), reversible
//!   through [`RenderedRequest::logged_call_id`].
//!
//! - **Native deferral where a provider has it.** With a [`NativeDeferral`] in the options
//!   (the caller's [`DeferralMode`] per Run, [`choose_deferral`] falling back to the meta
//!   tools), deferred servers' tools are sent with `defer_loading: true` after the surface's
//!   tools, sorted, beside a search tool (Psych's own, [`SearchTool::client`], whose calls'
//!   arguments [`SearchArguments::parse`] reads, as psych-reader-tool does for
//!   `read_tool_output`); a logged search answer ([`search_answer`]) becomes
//!   `tool_reference` blocks (Anthropic) or a `tool_search_output` (Responses), naming only
//!   tools of the deferred set; a search answered by text (an error, a note that nothing
//!   matched) is sent as that text, to Responses as a `function_call_output`. Anthropic documents tool search as a public beta behind the
//!   `anthropic-beta: advanced-tool-use-2025-11-20` header, which the caller sends.
//!
//! Tool results are rendered from their content blocks, in order (see
//! [`ToolOutput::readable_text`](psych_types::ToolOutput::readable_text)): text blocks as
//! text, each other block as its placeholder line, except images. An image block is sent as
//! an image only when its bytes sniff as PNG, JPEG, GIF or WebP, its header gives its size,
//! and it fits the limits ([`MAX_IMAGE_BASE64`] of base64, [`MAX_SIDE`] pixels a side,
//! [`MAX_IMAGES`] per request and [`MANY_IMAGES_MAX_SIDE`] once more than [`MANY_IMAGES`],
//! [`MAX_TOTAL_BASE64`] per request), decided image by image in request order so a prefix
//! never changes; it is sent with its sniffed media type. For Anthropic the images sit in the
//! `tool_result` content between the text around them; OpenAI's tool messages carry text
//! only (the placeholder line stands in the text), so the images of one step's results go in
//! one user message right after its tool messages, opened by [`TOOL_IMAGES_INTRO`], each
//! after a text part naming its call and block (GIF is not sent to OpenAI, which takes only
//! non-animated GIF). A projection (a preview, a truncated failure) always replaces the
//! output with its text. A result that is only `structuredContent` is its JSON text view.
//!
//! # What blocks
//!
//! Nothing of this crate's own: assembling and rendering are CPU work over memory, with no
//! I/O, lock or clock. [`StepHistory::load`] reads stored results through the
//! [`OutputAccess`](psych_types::OutputAccess) it is given (and projects through
//! [`ResultProjector::project_stored`](psych_types::ResultProjector::project_stored)), so it
//! blocks as that store does; from async code, call it off the async threads
//! (`spawn_blocking`). [`Assembler::assemble`] over whole records only calls the projector.
//!
//! # Errors
//!
//! The umbrella [`Error`] gathers three families:
//!
//! - [`AssembleError`]: a history no real Run produces (a call id used twice, a result for
//!   a call never made), or, on the lazy path, a stored result the source could not read.
//!   What a model or a crash can leave in a log is never an error (see above).
//! - [`RenderError`]: a request the provider would refuse, found before it is sent: a tool
//!   of the surface named outside the provider rule or twice (checked once, at assembly),
//!   too many tools, no message at all, native deferral where the format has none, an extra
//!   option that collides with a field the renderer writes.
//! - [`TimeError`]: a [`CurrentTime`] outside the years 0000-9999, or a UTC offset beyond
//!   ±23:59.
//!
//! # Configuration
//!
//! Zones are built with [`StaticSections`] and [`DynamicTail`] (one method per section),
//! the tool surface is a slice of tool definitions, the clock a [`Transient`]. Each wire
//! format has its options: [`AnthropicOptions`] (model, `max_tokens`, native deferral,
//! extra members) and [`OpenAiOptions`] (model, `prompt_cache_key`, native deferral for
//! Responses, extra members). [`choose_deferral`] picks native deferral or the meta tools
//! from a [`DeferralMode`]; [`CacheRules`] sets the cache report's billing rules.
//!
//! # Sources checked for the wire formats
//!
//! Checked field by field while writing the renderers (searched in November 2026):
//!
//! - Anthropic, "Prompt caching" (docs.anthropic.com / platform.claude.com
//!   `build-with-claude/prompt-caching`): the cache prefix is built in the order `tools`,
//!   `system`, `messages`; `cache_control: {"type": "ephemeral"}`; at most 4 breakpoints;
//!   automatic prefix checking looks back about 20 blocks before each explicit breakpoint.
//! - Anthropic, "Handle tool calls" (platform.claude.com
//!   `agents-and-tools/tool-use/handle-tool-calls`): `tool_result` blocks with
//!   `tool_use_id`, optional `content` (a string or text/image blocks) and `is_error`; they
//!   go in the user message right after the assistant's `tool_use`, first in its content,
//!   one per id; the API's own 400 message says each `tool_use` must have a `tool_result`
//!   in the next message.
//! - Anthropic, "Tool use with prompt caching" (platform.claude.com
//!   `agents-and-tools/tool-use/tool-use-with-prompt-caching`): a breakpoint on the last
//!   tool caches the tool definitions; the Messages API tool schema (`name` must match
//!   `^[a-zA-Z0-9_-]{1,64}$`, `description`, `input_schema`); image blocks
//!   `{"type":"image","source":{"type":"base64","media_type","data"}}` for JPEG, PNG, GIF,
//!   WebP.
//! - OpenAI, "Prompt caching" guide (developers.openai.com `api/docs/guides/prompt-caching`):
//!   exact-prefix matching, static content (tools included) first, automatic from 1024
//!   tokens, `prompt_cache_key` to route requests that share a prefix.
//! - OpenAI, Chat Completions API reference (platform.openai.com
//!   `docs/api-reference/chat/create`): message roles `system`, `user`, `assistant`, `tool`;
//!   assistant `tool_calls: [{id, type: "function", function: {name, arguments}}]` with
//!   `arguments` a JSON string; `content` optional when `tool_calls` is present; tool
//!   messages `{role: "tool", tool_call_id, content}`; `tools: [{type: "function",
//!   function: {name, description, parameters}}]`; function names `^[a-zA-Z0-9_-]{1,64}$`
//!   (the API's own validation error, quoted by error libraries); top-level
//!   `prompt_cache_key` (string).
//! - OpenAI, Responses API (`POST /v1/responses`), as the official `openai` Python SDK
//!   types it (`responses.response_create_params.ResponseCreateParamsNonStreaming`, read in
//!   December 2026): `instructions` (string), `input` items `message` (`role`, `content`),
//!   `function_call` (`call_id`, `name`, `arguments` as JSON text), `function_call_output`
//!   (`call_id`, `output` a string or a list of `input_text` / `input_image` parts);
//!   function tools `{type: "function", name, description, parameters, strict}` with
//!   `strict` required (and `defer_loading` optional); `prompt_cache_key`.
//!
//! # Example
//!
//! ```
//! use psych_prompt_assembly::{
//!     AnthropicOptions, Assembler, CurrentTime, DynamicTail, OpenAiOptions, StaticSections,
//!     Transient,
//! };
//! use psych_types::{
//!     LoggedRecord, Projection, Record, RecordHandle, ResultProjector, ResultRef, RunId,
//!     ToolDefinition, ToolName, UserMessage,
//! };
//!
//! /// Leaves every result whole (psych-elision provides the real projector).
//! struct Whole;
//! impl ResultProjector for Whole {
//!     fn project(&self, batch: &[ResultRef<'_>]) -> Vec<Projection> {
//!         vec![Projection::Full; batch.len()]
//!     }
//! }
//!
//! let zone1 = StaticSections::new("You are a careful assistant.")
//!     .skill("pdf", "Read and fill PDF forms")
//!     .capability_note("Server `github` is connected but deferred: list its tools first.");
//! let zone2 = DynamicTail::new().memory("The user prefers metric units.");
//! let tools = vec![ToolDefinition::new(
//!     ToolName::new("read_file")?,
//!     "Read a file",
//!     serde_json::from_str(r#"{"type":"object","properties":{"path":{"type":"string"}}}"#)?,
//! )];
//! let history = vec![LoggedRecord {
//!     handle: RecordHandle::new(RunId::new("run-1")?, 0),
//!     record: Record::User(UserMessage { text: "What is in notes.txt?".into() }),
//! }];
//! let now = Transient::at(CurrentTime::utc(1_796_041_497)?);
//!
//! let prompt = Assembler::new(&zone1, &zone2, &tools).assemble(&history, &Whole, &now)?;
//! let anthropic = prompt.render_anthropic(&AnthropicOptions::new("claude-sonnet-4-5", 1024))?;
//! let openai = prompt.render_openai(&OpenAiOptions::new("gpt-4.1").prompt_cache_key("run-1"))?;
//!
//! assert!(anthropic.body().starts_with(r#"{"model":"claude-sonnet-4-5","max_tokens":1024,"tools":[{"name":"read_file""#));
//! assert_eq!(anthropic.breakpoint_blocks().len(), 3); // zone 1, zone 2, last history block
//! // The clock is in the transient message, after everything that is cached.
//! let clock = anthropic.body().find("2026-11-30T12:24:57Z").expect("the clock is rendered");
//! assert!(clock > anthropic.body().find("What is in notes.txt?").expect("the history is rendered"));
//! assert!(openai.body().contains(r#""prompt_cache_key":"run-1""#));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod anthropic;
mod assemble;
mod deferral;
mod error;
mod image;
mod lazy;
mod openai;
mod render;
mod report;
mod responses;
mod zones;

pub use anthropic::{ANCHOR_DISTANCE, AnthropicOptions, CONVERSATION_START};
pub use assemble::{AssembleError, Assembler, Prompt};
pub use deferral::{
    DEFAULT_SEARCH_LIMIT, DeferralMode, MAX_DEFERRED_TOOLS, MAX_SEARCH_LIMIT, NO_MATCH,
    NativeDeferral, SEARCH_TOOL_NAME, SearchArguments, SearchArgumentsError, SearchTool,
    TOOL_REFERENCE, choose_deferral, search_answer,
};
pub use error::Error;
pub use image::{
    MANY_IMAGES, MANY_IMAGES_MAX_SIDE, MAX_IMAGE_BASE64, MAX_IMAGES, MAX_SIDE, MAX_TOTAL_BASE64,
};
pub use lazy::{ProjectionCache, StepHistory};
pub use openai::{OPENAI_MAX_TOOLS, OpenAiOptions, TOOL_IMAGES_INTRO};
pub use render::{
    EMPTY_USER_MESSAGE, MISSING_RESULT, OPENAI_MAX_CALL_ID, Part, Provider, RAW_ARGUMENTS_KEY,
    RenderError, RenderedRequest, Span,
};
pub use report::{
    ANTHROPIC_LOOKBACK, BlockReading, CacheReport, CacheRow, CacheRules, OPENAI_CACHE_INCREMENT,
    OPENAI_MIN_CACHED,
};
pub use zones::{CurrentTime, DynamicTail, StaticSections, TimeError, Transient};
