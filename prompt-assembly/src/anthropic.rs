//! The Anthropic Messages API renderer (`POST /v1/messages`), with `cache_control`
//! breakpoints.
//!
//! Shape, field by field (checked against the published reference, see the crate docs):
//!
//! ```text
//! {"model":…,"max_tokens":…,<extra options, sorted>,
//!  "tools":[{"name":…,"description":…,"input_schema":{…}}, …],
//!  "system":[{"type":"text","text":…}, …],
//!  "messages":[
//!    {"role":"user","content":[{"type":"text","text":…}]},
//!    {"role":"assistant","content":[{"type":"text","text":…},
//!                                   {"type":"tool_use","id":…,"name":…,"input":{…}}]},
//!    {"role":"user","content":[{"type":"tool_result","tool_use_id":…,
//!                               "content":[{"type":"text","text":…}],"is_error":true}]},
//!    …,
//!    {"role":"user","content":[{"type":"text","text":<transient>}]}]}
//! ```
//!
//! The results answering an assistant message are the whole of the next user message, one
//! `tool_result` per `tool_use` id, in call order, so they always come first in it. The
//! transient message is a separate user message after them (the API merges consecutive
//! user turns; text after the results is allowed).
//!
//! What the log holds is rendered, never refused, when a model or a crash could have put it
//! there:
//! - text that is empty or only whitespace is no text block (the API refuses such blocks):
//!   an assistant message drops it (and is left out when nothing else remains), a
//!   `tool_result` has no `content`, and a user message is sent as
//!   [`EMPTY_USER_MESSAGE`](crate::EMPTY_USER_MESSAGE) (a message needs content);
//! - a call name outside `^[a-zA-Z0-9_-]{1,64}$` is sanitised (`invalid_` and the name
//!   with every other character made `_`, cut to 64 bytes: `github.list_issues` is sent
//!   as `invalid_github_list_issues`, never as a tool of the surface's name);
//! - arguments that are not a JSON object (the raw text of arguments that did not parse)
//!   are sent as `{"_raw_arguments": <text>}` (see [`RAW_ARGUMENTS_KEY`](crate::RAW_ARGUMENTS_KEY));
//! - a call without a logged result is answered by a `tool_result` with `is_error` and the
//!   text [`MISSING_RESULT`](crate::MISSING_RESULT), in its place in call order;
//! - a log whose first message is not a user message gets [`CONVERSATION_START`] as a first
//!   user message; assistant text is sent without trailing whitespace;
//! - a request with no tools writes calls and results as text blocks (the API refuses
//!   `tool_use` blocks without `tools`).
//!
//! A `tool_result`'s content is its pieces in order: text blocks for the readable text
//! between images, and `{"type":"image","source":{"type":"base64","media_type":…,"data":…}}`
//! for each image the budget admits (see the crate docs).
//!
//! Breakpoints (`"cache_control":{"type":"ephemeral"}`), at most four and never on the
//! transient message:
//! 1. the last block of zone 1 (the last static system block; the last tool when zone 1 is
//!    empty), which caches the tools and zone 1 together (the cache order is tools, system,
//!    messages);
//! 2. the zone 2 block, when there is one;
//! 3. the last history block;
//! 4. a lookback anchor: within a turn, on the previous request's end when the lookback
//!    from breakpoint 3 could miss it (see [`ANCHOR_DISTANCE`]); at a turn start, when the
//!    moved boundary elides results of the previous turn, on the end of the last step
//!    before the first of them, the last prefix of that turn still intact (its entry was
//!    written by that turn's request for the step, and is usually out of the lookback's
//!    reach).

use std::borrow::Cow;

use psych_types::TokenEstimator;

use crate::assemble::{Answer, Message, Prompt};
use crate::deferral::{NO_MATCH, references};
use crate::image::Budget;
use crate::render::{
    EMPTY_USER_MESSAGE, MISSING_RESULT, Out, Part, Piece, Provider, RenderError, RenderedRequest,
    call_name, check_extra, is_blank, pieces, provider_name_ok, trim_end, write_extra,
};
use crate::report::prefix_tokens;
use crate::{NativeDeferral, SearchTool};

/// The text of the user message put first when the history's first message is not a user
/// message (a log that starts with an assistant record): the Anthropic API requires the
/// first message to be a user message.
pub const CONVERSATION_START: &str = "[start of conversation]";

/// The anchor rule's distance, in blocks.
///
/// Anthropic looks for an earlier cache entry at most about 20 blocks back from each
/// breakpoint. The previous step's request ended (before its transient message) at the last
/// block before the newest assistant message, and its third breakpoint wrote a cache entry
/// there. When the last history block of this request is more than `ANCHOR_DISTANCE` blocks
/// past that position (a step with many parallel calls adds two blocks per call), the
/// lookback from breakpoint 3 would miss that entry, so a fourth breakpoint goes exactly on
/// that position: its lookup hits the previous entry at distance 0 and breakpoint 3 writes
/// the new tail. We count on 18 of the documented "about 20" blocks, one block of margin
/// with the breakpoint block itself counted.
///
/// The documentation does not say whether the blocks nested in a `tool_result` (its text
/// and image blocks) are positions of their own, so the distance counts them too (an upper
/// bound: two a content block plus one): the anchor is then placed whenever either reading
/// would miss.
///
/// At a turn start the fourth breakpoint has another use: when the moved boundary elides
/// results of the previous turn, it goes on the end of the last step before the first of
/// them (the last prefix of that turn still intact, whose entry that turn's request for the
/// step wrote).
pub const ANCHOR_DISTANCE: usize = 18;

/// Request options of the Anthropic renderer.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicOptions {
    model: String,
    max_tokens: u32,
    extra: psych_types::JsonObject,
    pub(crate) native: Option<NativeDeferral>,
}

impl AnthropicOptions {
    /// Options for `model` with the required `max_tokens`.
    pub fn new(model: impl Into<String>, max_tokens: u32) -> Self {
        Self {
            model: model.into(),
            max_tokens,
            extra: psych_types::JsonObject::new(),
            native: None,
        }
    }

    /// Adds another top-level request field (`temperature`, `tool_choice`, `metadata`,
    /// `stream`…), written after `max_tokens` in key order.
    #[must_use]
    pub fn option(mut self, key: impl Into<String>, value: serde_json::Value) -> Self {
        self.extra.insert(key.into(), value);
        self
    }

    /// Renders deferred servers' tools natively (see [`NativeDeferral`]): they are sent
    /// with `defer_loading: true` beside a search tool. The surface given to the
    /// [`Assembler`](crate::Assembler) is then the one without the meta tools.
    #[must_use]
    pub fn native_deferral(mut self, deferral: NativeDeferral) -> Self {
        self.native = Some(deferral);
        self
    }
}

/// Fields the Anthropic renderer writes itself.
const RESERVED: [&str; 5] = ["model", "max_tokens", "tools", "system", "messages"];

/// Number of content blocks a message renders to (0: the message is left out).
fn blocks(message: &Message<'_>) -> usize {
    match message {
        Message::User { .. } => 1,
        Message::Assistant { message, .. } => {
            usize::from(!is_blank(&message.text)) + message.tool_calls.len()
        }
        Message::Results { items, .. } => items.len(),
    }
}

impl Prompt<'_> {
    /// Renders the Anthropic Messages API request body.
    ///
    /// # Errors
    ///
    /// [`RenderError`] for a tool of the surface named outside `^[a-zA-Z0-9_-]{1,64}$`,
    /// duplicate tool names, an extra option the renderer owns, or a request with no
    /// message at all. What the model wrote never fails a render: call names are
    /// sanitised, arguments that are not an object are wrapped (see [`RAW_ARGUMENTS_KEY`](crate::RAW_ARGUMENTS_KEY)).
    pub fn render_anthropic(
        &self,
        options: &AnthropicOptions,
    ) -> Result<RenderedRequest, RenderError> {
        check_extra(&options.extra, &RESERVED)?;
        self.check_anthropic_tools(options)?;
        let layout = self.layout(options);
        let breakpoints = self.plan_breakpoints(&layout);
        self.write_anthropic(options, &layout, &breakpoints)
    }

    /// Renders the Anthropic request as [`Prompt::render_anthropic`] does, spending no
    /// breakpoint on a prefix shorter than `min_cacheable_tokens` (the model's minimum
    /// cacheable prompt, per Anthropic's prompt caching guide: 1,024 tokens for
    /// Sonnet-class models, 2,048 or 4,096 for others), counted by `estimator` over the
    /// cache stream block by block.
    ///
    /// A prefix below the minimum is never written to the cache, so a breakpoint there
    /// buys nothing. When the zone breakpoints (the end of zone 1, zone 2) fall below it,
    /// they are dropped and one breakpoint goes on the first block whose prefix reaches the
    /// minimum instead, when that block is before the last history block: the longest-lived
    /// prefix the cache can actually hold. The other breakpoints are kept as planned (a
    /// history end below the minimum is the only place a later request can grow from).
    /// Breakpoints never change the cache stream, so every byte property is the same as
    /// [`Prompt::render_anthropic`]'s; the placement depends only on the inputs and the
    /// estimator.
    ///
    /// # Errors
    ///
    /// As [`Prompt::render_anthropic`].
    pub fn render_anthropic_sized(
        &self,
        options: &AnthropicOptions,
        min_cacheable_tokens: u64,
        estimator: &dyn TokenEstimator,
    ) -> Result<RenderedRequest, RenderError> {
        check_extra(&options.extra, &RESERVED)?;
        self.check_anthropic_tools(options)?;
        let layout = self.layout(options);
        let planned = self.plan_breakpoints(&layout);
        let first = self.write_anthropic(options, &layout, &planned)?;
        let zone_blocks = layout.zone1_end() + usize::from(layout.tail.is_some());
        let Some(&last) = planned.iter().max() else {
            return Ok(first);
        };
        let prefix_tokens = prefix_tokens(&first, &first.cache_stream(), estimator);
        let short = |b: usize| {
            prefix_tokens
                .get(b)
                .is_none_or(|&t| t < min_cacheable_tokens)
        };
        let mut breakpoints: Vec<usize> = planned
            .iter()
            .copied()
            .filter(|&b| b >= zone_blocks || b == last || !short(b))
            .collect();
        if breakpoints.len() == planned.len() {
            return Ok(first);
        }
        if let Some(reach) = (0..last).find(|&b| !short(b))
            && !breakpoints.contains(&reach)
        {
            breakpoints.push(reach);
        }
        breakpoints.sort_unstable();
        self.write_anthropic(options, &layout, &breakpoints)
    }

    /// What an Anthropic request is made of, worked out once for planning its breakpoints
    /// and writing it.
    fn layout(&self, options: &AnthropicOptions) -> Layout {
        let message_blocks: Vec<usize> = self.messages.iter().map(blocks).collect();
        // The API requires the first message to be a user message.
        let lead = self
            .messages
            .iter()
            .zip(&message_blocks)
            .find(|(_, n)| **n > 0)
            .is_some_and(|(message, _)| !matches!(message, Message::User { .. }));
        Layout {
            tool_blocks: tool_blocks(self, options),
            sections: self.static_sections.sections(),
            tail: self.dynamic_tail.text(),
            message_blocks,
            lead,
        }
    }

    /// The breakpoints (block indices) of an Anthropic request, as the module docs list
    /// them.
    fn plan_breakpoints(&self, layout: &Layout) -> Vec<usize> {
        let message_blocks = &layout.message_blocks[..];
        // Plan the breakpoints by block index.
        let zone1_end = layout.zone1_end();
        let has_tail = layout.tail.is_some();
        let history_start = zone1_end + usize::from(has_tail) + usize::from(layout.lead);
        let history_blocks: usize = message_blocks.iter().sum();
        let mut breakpoints = Vec::with_capacity(4);
        if zone1_end > 0 {
            breakpoints.push(zone1_end - 1);
        }
        if has_tail {
            breakpoints.push(zone1_end);
        }
        if history_blocks > 0 {
            let last = history_start + history_blocks - 1;
            breakpoints.push(last);
            let block_of = |j: usize| {
                let before: usize = message_blocks[..j].iter().sum();
                (before > 0).then(|| history_start + before - 1)
            };
            if let Some(j) = self.turn_start_anchor(message_blocks) {
                // The end of the last step before the first re-elided result.
                if let Some(anchor) = block_of(j) {
                    breakpoints.push(anchor);
                }
            } else if let Some(j) = self
                .messages
                .iter()
                .zip(message_blocks)
                .rposition(|(message, &n)| n > 0 && matches!(message, Message::Assistant { .. }))
                && let Some(anchor) = block_of(j)
            {
                let nested: usize = self.messages[j..]
                    .iter()
                    .zip(&message_blocks[j..])
                    .filter(|(_, n)| **n > 0)
                    .map(|(message, _)| self.nested_blocks(message))
                    .sum();
                if last - anchor + nested > ANCHOR_DISTANCE {
                    breakpoints.push(anchor);
                }
            }
        }
        breakpoints
    }

    /// Writes the Anthropic request laid out as `layout` with breakpoints on `breakpoints`
    /// (block indices).
    fn write_anthropic(
        &self,
        options: &AnthropicOptions,
        layout: &Layout,
        breakpoints: &[usize],
    ) -> Result<RenderedRequest, RenderError> {
        let Layout {
            sections,
            tail,
            message_blocks,
            lead,
            ..
        } = layout;

        let mut out = Out::with_capacity(4096);
        out.open(Part::Preamble);
        out.push("{\"model\":");
        out.str(&options.model);
        out.push(",\"max_tokens\":");
        out.push(&options.max_tokens.to_string());
        write_extra(&mut out, &options.extra);

        let native = options.native.as_ref();
        if layout.tool_blocks > 0 {
            out.open(Part::Tools);
            out.push(",\"tools\":[");
            let deferred = native.map_or(&[][..], |n| n.tools());
            for (i, tool) in self.tools.iter().copied().enumerate() {
                if i > 0 {
                    out.push(",");
                }
                tool_definition(&mut out, tool, false, breakpoints);
            }
            if let Some(native) = native {
                if !self.tools.is_empty() {
                    out.push(",");
                }
                match native.search() {
                    SearchTool::Client {
                        name,
                        description,
                        input_schema,
                    } => {
                        out.push("{\"name\":");
                        out.str(name.as_str());
                        out.push(",\"description\":");
                        out.str(description);
                        out.push(",\"input_schema\":");
                        out.object(input_schema);
                    }
                    SearchTool::AnthropicRegex => out.push(
                        "{\"type\":\"tool_search_tool_regex_20251119\",\"name\":\"tool_search_tool_regex\"",
                    ),
                    SearchTool::AnthropicBm25 => out.push(
                        "{\"type\":\"tool_search_tool_bm25_20251119\",\"name\":\"tool_search_tool_bm25\"",
                    ),
                }
                let bp = breakpoints.contains(&out.next_block());
                out.end_block(bp);
                out.push("}");
                for tool in deferred {
                    out.push(",");
                    tool_definition(&mut out, tool, true, breakpoints);
                }
            }
            out.push("]");
        }

        out.open(Part::StaticSystem);
        if !sections.is_empty() || tail.is_some() {
            out.push(",\"system\":[");
            let mut first = true;
            for section in sections {
                if !first {
                    out.push(",");
                }
                first = false;
                text_block(&mut out, section, breakpoints);
            }
            if let Some(tail) = tail {
                out.open(Part::DynamicSystem);
                if !first {
                    out.push(",");
                }
                text_block(&mut out, tail, breakpoints);
            }
            out.push("]");
        }
        out.push(",\"messages\":[");

        let mut history_end = out.pos();
        let mut first = true;
        if *lead {
            out.open(Part::Message { records: 0..0 });
            out.push("{\"role\":\"user\",\"content\":[");
            text_block(&mut out, CONVERSATION_START, breakpoints);
            out.push("]}");
            first = false;
            history_end = out.pos();
        }
        let mut budget = Budget::default();
        for (message, &n) in self.messages.iter().zip(message_blocks) {
            if n == 0 {
                continue;
            }
            out.open(Part::Message {
                records: message.records(),
            });
            if !first {
                out.push(",");
            }
            first = false;
            self.anthropic_message(&mut out, message, breakpoints, &mut budget, options);
            history_end = out.pos();
        }

        let transient = self.transient.text();
        if first && transient.is_none() {
            return Err(RenderError::NoMessages);
        }
        if let Some(text) = transient {
            out.open(Part::Transient);
            if !first {
                out.push(",");
            }
            out.push("{\"role\":\"user\",\"content\":[");
            text_block(&mut out, &text, &[]);
            out.push("]}");
        }
        out.close();
        out.push("]}");
        Ok(out.finish(Provider::Anthropic, history_end))
    }

    fn anthropic_message(
        &self,
        out: &mut Out,
        message: &Message<'_>,
        breakpoints: &[usize],
        budget: &mut Budget,
        options: &AnthropicOptions,
    ) {
        // With no tool in the request the API refuses tool_use and tool_result blocks: the
        // calls and results are then written as text (see `transcript_message`).
        if tool_blocks(self, options) == 0 && !matches!(message, Message::User { .. }) {
            self.transcript_message(out, message, breakpoints);
            return;
        }
        match message {
            Message::User { text, .. } => {
                out.push("{\"role\":\"user\",\"content\":[");
                let text = if is_blank(text) {
                    EMPTY_USER_MESSAGE
                } else {
                    text
                };
                text_block(out, text, breakpoints);
                out.push("]}");
            }
            Message::Assistant { message, .. } => {
                out.push("{\"role\":\"assistant\",\"content\":[");
                let mut first = true;
                if !is_blank(&message.text) {
                    // Trailing whitespace goes, always: the API refuses it at the end of a
                    // final assistant message, and trimming every message the same way keeps
                    // a message's bytes the same whether or not it is the last.
                    text_block(out, trim_end(&message.text), breakpoints);
                    first = false;
                }
                for call in &message.tool_calls {
                    if !first {
                        out.push(",");
                    }
                    first = false;
                    out.push("{\"type\":\"tool_use\",\"id\":");
                    out.str(call.id.as_str());
                    out.push(",\"name\":");
                    out.str(&call_name(&call.name));
                    out.push(",\"input\":");
                    out.arguments(call);
                    let bp = breakpoints.contains(&out.next_block());
                    out.end_block(bp);
                    out.push("}");
                }
                out.push("]}");
            }
            Message::Results { items, .. } => {
                out.push("{\"role\":\"user\",\"content\":[");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(",");
                    }
                    out.push("{\"type\":\"tool_result\",\"tool_use_id\":");
                    out.str(item.call_id().as_str());
                    // A search answer in native deferral: its references, each to a tool of
                    // the request's deferred set (any other name is left out).
                    if let (Some(native), Answer::Logged(index, result)) = (&options.native, item)
                        && self.views[*index] == psych_types::Projection::Full
                        && let Some(tools) = references(result, native)
                    {
                        out.push(",\"content\":[");
                        if tools.is_empty() {
                            out.push("{\"type\":\"text\",\"text\":");
                            out.str(NO_MATCH);
                            out.push("}");
                        }
                        for (k, tool) in tools.iter().enumerate() {
                            if k > 0 {
                                out.push(",");
                            }
                            out.push("{\"type\":\"tool_reference\",\"tool_name\":");
                            out.str(tool.name.as_str());
                            out.push("}");
                        }
                        out.push("]");
                        out.nest(tools.len().max(1));
                        let bp = breakpoints.contains(&out.next_block());
                        out.end_block(bp);
                        out.push("}");
                        continue;
                    }
                    let (view, is_error) = match item {
                        Answer::Logged(index, result) => (
                            pieces(result, &self.views[*index], Some((&mut *budget, true))),
                            result.output.is_error,
                        ),
                        Answer::Missing(_) => (vec![Piece::Text(MISSING_RESULT.into())], true),
                    };
                    // Blank text is refused in a text block: it is left out, and a result
                    // with nothing else (a whitespace-only failure) has no content.
                    let mut first_piece = true;
                    for piece in &view {
                        match piece {
                            Piece::Text(text) if is_blank(text) => continue,
                            _ if first_piece => out.push(",\"content\":["),
                            _ => out.push(","),
                        }
                        first_piece = false;
                        match piece {
                            Piece::Text(text) => {
                                out.push("{\"type\":\"text\",\"text\":");
                                out.str(text);
                                out.push("}");
                            }
                            Piece::Image { media_type, data } => {
                                out.push(
                                    "{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":",
                                );
                                out.str(media_type);
                                out.push(",\"data\":\"");
                                out.push(&psych_types::encode_base64(data));
                                out.push("\"}}");
                            }
                        }
                    }
                    if !first_piece {
                        out.push("]");
                    }
                    out.nest(
                        view.iter()
                            .filter(|piece| !matches!(piece, Piece::Text(text) if is_blank(text)))
                            .count(),
                    );
                    if is_error {
                        out.push(",\"is_error\":true");
                    }
                    let bp = breakpoints.contains(&out.next_block());
                    out.end_block(bp);
                    out.push("}");
                }
                out.push("]}");
            }
        }
    }

    /// Writes an assistant message or its results as text blocks, for a request without
    /// tools: the API refuses `tool_use` and `tool_result` blocks when the request declares
    /// no tool. Each call is one text block `[called tool <name> (call <id>) with <arguments
    /// as compact JSON>]`; each result one text block `[result of call <id>]` (or `[failed
    /// result of call <id>]`), a line break, and its view as text (images as their
    /// placeholder lines). A message keeps the number of blocks it has with tools, so the
    /// breakpoint plan is the same. Chosen over declaring a stand-in tool because a tool
    /// list that appears or changes would move every byte after it: this way the history's
    /// bytes depend only on whether the surface is empty.
    fn transcript_message(&self, out: &mut Out, message: &Message<'_>, breakpoints: &[usize]) {
        match message {
            Message::User { .. } => {}
            Message::Assistant { message, .. } => {
                out.push("{\"role\":\"assistant\",\"content\":[");
                let mut first = true;
                if !is_blank(&message.text) {
                    text_block(out, trim_end(&message.text), breakpoints);
                    first = false;
                }
                for call in &message.tool_calls {
                    if !first {
                        out.push(",");
                    }
                    first = false;
                    let mut arguments = String::new();
                    psych_types::json::write_value(&mut arguments, &call.arguments);
                    let line = format!(
                        "[called tool {} (call {}) with {arguments}]",
                        call_name(&call.name),
                        call.id
                    );
                    text_block(out, &line, breakpoints);
                }
                out.push("]}");
            }
            Message::Results { items, .. } => {
                out.push("{\"role\":\"user\",\"content\":[");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(",");
                    }
                    let (text, failed) = match item {
                        Answer::Logged(index, result) => {
                            let text = match &self.views[*index] {
                                psych_types::Projection::Replaced(text) => {
                                    Cow::Borrowed(text.as_str())
                                }
                                psych_types::Projection::Full => result.output.readable_text(),
                            };
                            (text, result.output.is_error)
                        }
                        Answer::Missing(_) => (Cow::Borrowed(MISSING_RESULT), true),
                    };
                    let label = if failed { "failed result" } else { "result" };
                    let block =
                        format!("[{label} of call {}]\n{}", item.call_id(), trim_end(&text));
                    text_block(out, trim_end(&block), breakpoints);
                }
                out.push("]}");
            }
        }
    }

    /// At a turn start (the newest message is the user's), the message index of the
    /// assistant message whose call got the first result of the previous turn that is now
    /// elided, if any.
    ///
    /// The boundary has just moved past the previous turn: its results, whole in that
    /// turn's requests, are elided from now on, so every cache entry written after the
    /// first of them is lost, and the last intact one may be far more than 20 blocks before
    /// the last history block. That turn's request for the step whose results are the first
    /// to be re-elided ended just before the assistant message that made the calls, and its
    /// breakpoint 3 wrote an entry there; earlier turns' projections do not change (the
    /// projector sees one turn at a time). All this is read from the history and the views.
    fn turn_start_anchor(&self, message_blocks: &[usize]) -> Option<usize> {
        let newest = message_blocks.iter().rposition(|&n| n > 0)?;
        if !matches!(self.messages[newest], Message::User { .. }) {
            return None;
        }
        let previous_user = self.messages[..newest]
            .iter()
            .zip(message_blocks)
            .rposition(|(message, &n)| n > 0 && matches!(message, Message::User { .. }))
            .map_or(0, |i| i + 1);
        let results = (previous_user..newest).find(|&j| match &self.messages[j] {
            Message::Results { items, .. } => items.iter().any(|item| {
                matches!(item, Answer::Logged(index, _)
                    if self.views[*index] != psych_types::Projection::Full)
            }),
            _ => false,
        })?;
        self.messages[..results]
            .iter()
            .zip(message_blocks)
            .rposition(|(message, &n)| n > 0 && matches!(message, Message::Assistant { .. }))
    }

    /// An upper bound on the blocks nested in `message`'s top-level blocks (the content of
    /// each `tool_result`: text between images and the images, at most two a block plus
    /// one), for the reading of the lookback that counts them.
    fn nested_blocks(&self, message: &Message<'_>) -> usize {
        match message {
            Message::Results { items, .. } => items
                .iter()
                .map(|item| match item {
                    Answer::Logged(index, result)
                        if self.views[*index] == psych_types::Projection::Full =>
                    {
                        2 * result.output.content.len() + 1
                    }
                    _ => 1,
                })
                .sum(),
            _ => 0,
        }
    }

    /// Checks the tools of an Anthropic request: the surface's (checked once, at assembly:
    /// see [`Prompt::surface_check`]), then, in native deferral, that no deferred tool or the
    /// search tool shares a name with another tool, and that every deferred name is valid.
    fn check_anthropic_tools(&self, options: &AnthropicOptions) -> Result<(), RenderError> {
        self.surface_check()?;
        let Some(native) = &options.native else {
            return Ok(());
        };
        check_native_names(self, native)
    }
}

/// An Anthropic request's parts as [`Prompt::layout`] works them out.
struct Layout {
    /// The blocks of `tools`: the surface's, and with native deferral the search tool and
    /// the deferred tools.
    tool_blocks: usize,
    /// Zone 1's system sections.
    sections: Vec<String>,
    /// Zone 2's text, if any.
    tail: Option<String>,
    /// Each message's content blocks (0: the message is left out).
    message_blocks: Vec<usize>,
    /// Whether a user message must lead (the first message sent is not the user's).
    lead: bool,
}

impl Layout {
    /// The block after zone 1 (the tools and the system sections).
    fn zone1_end(&self) -> usize {
        self.tool_blocks + self.sections.len()
    }
}

/// Tool blocks of an Anthropic request: the surface, plus the search tool and the deferred
/// tools in native deferral.
fn tool_blocks(prompt: &Prompt<'_>, options: &AnthropicOptions) -> usize {
    prompt.tools.len()
        + options
            .native
            .as_ref()
            .map_or(0, |native| 1 + native.tools().len())
}

/// Writes one tool definition as a block, with `defer_loading` when `deferred`.
fn tool_definition(
    out: &mut Out,
    tool: &psych_types::ToolDefinition,
    deferred: bool,
    breakpoints: &[usize],
) {
    out.push("{\"name\":");
    out.str(tool.name.as_str());
    if let Some(description) = &tool.description {
        out.push(",\"description\":");
        out.str(description);
    }
    out.push(",\"input_schema\":");
    out.object(&tool.input_schema);
    if deferred {
        out.push(",\"defer_loading\":true");
    }
    let bp = breakpoints.contains(&out.next_block());
    out.end_block(bp);
    out.push("}");
}

/// Checks the names of a native deferral against the surface: each valid under the
/// provider rule, none shared (a deferred tool named like a surface tool or the search
/// tool would be two tools of one name).
pub(crate) fn check_native_names(
    prompt: &Prompt<'_>,
    native: &NativeDeferral,
) -> Result<(), RenderError> {
    let mut names: std::collections::BTreeSet<&str> =
        prompt.tools.iter().map(|tool| tool.name.as_str()).collect();
    for name in std::iter::once(native.search().name())
        .chain(native.tools().iter().map(|tool| tool.name.as_str()))
    {
        if !provider_name_ok(name) {
            return Err(RenderError::ToolName {
                name: name.to_owned(),
            });
        }
        if !names.insert(name) {
            return Err(RenderError::DuplicateTool {
                name: name.to_owned(),
            });
        }
    }
    Ok(())
}

/// Writes `{"type":"text","text":…}` as one block, with a breakpoint if planned.
fn text_block(out: &mut Out, text: &str, breakpoints: &[usize]) {
    out.push("{\"type\":\"text\",\"text\":");
    out.str(text);
    let bp = breakpoints.contains(&out.next_block());
    out.end_block(bp);
    out.push("}");
}
