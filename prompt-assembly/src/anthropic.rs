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
//! - a call name outside `^[a-zA-Z0-9_-]{1,64}$` is sanitised (every other character
//!   becomes `_`, cut to 64 bytes);
//! - arguments that are not a JSON object (the raw text of arguments that did not parse)
//!   are sent as `{"_raw_arguments": <text>}` (see [`RAW_ARGUMENTS_KEY`](crate::RAW_ARGUMENTS_KEY));
//! - a call without a logged result is answered by a `tool_result` with `is_error` and the
//!   text [`MISSING_RESULT`](crate::MISSING_RESULT), in its place in call order.
//!
//! Breakpoints (`"cache_control":{"type":"ephemeral"}`), at most four and never on the
//! transient message:
//! 1. the last block of zone 1 (the last static system block; the last tool when zone 1 is
//!    empty), which caches the tools and zone 1 together (the cache order is tools, system,
//!    messages);
//! 2. the zone 2 block, when there is one;
//! 3. the last history block;
//! 4. a lookback anchor, see [`ANCHOR_DISTANCE`].

use crate::assemble::{Answer, Message, Prompt};
use crate::render::{
    EMPTY_USER_MESSAGE, MISSING_RESULT, Out, Part, Provider, RAW_ARGUMENTS_KEY, RenderError,
    RenderedRequest, View, call_name, check_extra, is_blank, provider_name_ok, raw_arguments, view,
    write_extra,
};

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
pub const ANCHOR_DISTANCE: usize = 18;

/// Request options of the Anthropic renderer.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicOptions {
    model: String,
    max_tokens: u32,
    extra: psych_types::JsonObject,
}

impl AnthropicOptions {
    /// Options for `model` with the required `max_tokens`.
    pub fn new(model: impl Into<String>, max_tokens: u32) -> Self {
        Self {
            model: model.into(),
            max_tokens,
            extra: psych_types::JsonObject::new(),
        }
    }

    /// Adds another top-level request field (`temperature`, `tool_choice`, `metadata`,
    /// `stream`…), written after `max_tokens` in key order.
    #[must_use]
    pub fn option(mut self, key: impl Into<String>, value: serde_json::Value) -> Self {
        self.extra.insert(key.into(), value);
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
    /// sanitised, arguments that are not an object are wrapped (see [`RAW_ARGUMENTS_KEY`]).
    pub fn render_anthropic(
        &self,
        options: &AnthropicOptions,
    ) -> Result<RenderedRequest, RenderError> {
        check_extra(&options.extra, &RESERVED)?;
        self.check_tools()?;

        let sections = self.static_sections.sections();
        let tail = self.dynamic_tail.text();
        let message_blocks: Vec<usize> = self.messages.iter().map(blocks).collect();

        // Plan the breakpoints by block index.
        let zone1_end = self.tools.len() + sections.len();
        let history_start = zone1_end + usize::from(tail.is_some());
        let history_blocks: usize = message_blocks.iter().sum();
        let mut breakpoints = Vec::with_capacity(4);
        if zone1_end > 0 {
            breakpoints.push(zone1_end - 1);
        }
        if tail.is_some() {
            breakpoints.push(zone1_end);
        }
        if history_blocks > 0 {
            let last = history_start + history_blocks - 1;
            breakpoints.push(last);
            let newest_assistant = self
                .messages
                .iter()
                .zip(&message_blocks)
                .rposition(|(message, &n)| n > 0 && matches!(message, Message::Assistant { .. }));
            if let Some(j) = newest_assistant {
                let before: usize = message_blocks[..j].iter().sum();
                if before > 0 {
                    let anchor = history_start + before - 1;
                    if last - anchor > ANCHOR_DISTANCE {
                        breakpoints.push(anchor);
                    }
                }
            }
        }

        let mut out = Out::with_capacity(4096);
        out.open(Part::Preamble);
        out.push("{\"model\":");
        out.str(&options.model);
        out.push(",\"max_tokens\":");
        out.push(&options.max_tokens.to_string());
        write_extra(&mut out, &options.extra);

        if !self.tools.is_empty() {
            out.open(Part::Tools);
            out.push(",\"tools\":[");
            for (i, tool) in self.tools.iter().enumerate() {
                if i > 0 {
                    out.push(",");
                }
                out.push("{\"name\":");
                out.str(tool.name.as_str());
                if let Some(description) = &tool.description {
                    out.push(",\"description\":");
                    out.str(description);
                }
                out.push(",\"input_schema\":");
                out.object(&tool.input_schema);
                let bp = breakpoints.contains(&out.next_block());
                out.end_block(bp);
                out.push("}");
            }
            out.push("]");
        }

        out.open(Part::StaticSystem);
        if !sections.is_empty() || tail.is_some() {
            out.push(",\"system\":[");
            let mut first = true;
            for section in &sections {
                if !first {
                    out.push(",");
                }
                first = false;
                text_block(&mut out, section, &breakpoints);
            }
            if let Some(tail) = &tail {
                out.open(Part::DynamicSystem);
                if !first {
                    out.push(",");
                }
                text_block(&mut out, tail, &breakpoints);
            }
            out.push("]");
        }
        out.push(",\"messages\":[");

        let mut history_end = out.pos();
        let mut first = true;
        for (message, &n) in self.messages.iter().zip(&message_blocks) {
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
            self.anthropic_message(&mut out, message, &breakpoints);
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

    fn anthropic_message(&self, out: &mut Out, message: &Message<'_>, breakpoints: &[usize]) {
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
                    text_block(out, &message.text, breakpoints);
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
                    if call.arguments.is_object() {
                        out.value(&call.arguments);
                    } else {
                        out.push("{");
                        out.str(RAW_ARGUMENTS_KEY);
                        out.push(":");
                        out.str(&raw_arguments(call));
                        out.push("}");
                    }
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
                    let (view, is_error) = match item {
                        Answer::Logged(index, result) => (
                            view(result, &self.views[*index], true),
                            result.output.is_error,
                        ),
                        Answer::Missing(_) => (View::Text(MISSING_RESULT.into()), true),
                    };
                    match view {
                        // Whitespace-only text is refused in a text block: no content.
                        View::Text(text) if is_blank(&text) => {}
                        View::Text(text) => {
                            out.push(",\"content\":[{\"type\":\"text\",\"text\":");
                            out.str(&text);
                            out.push("}]");
                        }
                        View::Image { media_type, data } => {
                            out.push(
                                ",\"content\":[{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":",
                            );
                            out.str(media_type);
                            out.push(",\"data\":\"");
                            out.push(&psych_types::base64::encode(data));
                            out.push("\"}}]");
                        }
                    }
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

    /// Checks the tool surface's names against the provider rule and for duplicates. These
    /// names come from our own disclosure, so a bad one is a typed error; call names in the
    /// history come from the model and are sanitised instead (see the renderers).
    pub(crate) fn check_tools(&self) -> Result<(), RenderError> {
        for pair in self.tools.windows(2) {
            if pair[0].name == pair[1].name {
                return Err(RenderError::DuplicateTool {
                    name: pair[0].name.to_string(),
                });
            }
        }
        if let Some(tool) = self
            .tools
            .iter()
            .find(|tool| !provider_name_ok(tool.name.as_str()))
        {
            return Err(RenderError::ToolName {
                name: tool.name.to_string(),
            });
        }
        Ok(())
    }
}
/// Writes `{"type":"text","text":…}` as one block, with a breakpoint if planned.
fn text_block(out: &mut Out, text: &str, breakpoints: &[usize]) {
    out.push("{\"type\":\"text\",\"text\":");
    out.str(text);
    let bp = breakpoints.contains(&out.next_block());
    out.end_block(bp);
    out.push("}");
}
