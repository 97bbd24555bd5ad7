//! The OpenAI Chat Completions renderer (`POST /v1/chat/completions`).
//!
//! Shape, field by field (checked against the published reference, see the crate docs):
//!
//! ```text
//! {"model":…,"prompt_cache_key":…,<extra options, sorted>,
//!  "tools":[{"type":"function","function":{"name":…,"description":…,"parameters":{…}}}, …],
//!  "messages":[
//!    {"role":"system","content":"<zone 1 sections>\n\n<zone 2 tail>"},
//!    {"role":"user","content":…},
//!    {"role":"assistant","content":…,"tool_calls":[{"id":…,"type":"function",
//!        "function":{"name":…,"arguments":"<JSON object as a string>"}}]},
//!    {"role":"tool","tool_call_id":…,"content":…}, …,
//!    {"role":"user","content":<transient>}]}
//! ```
//!
//! One `tool` message answers each call, in call order, right after the assistant message
//! that made the calls. `content` is left out of an assistant message that only calls tools
//! (the reference makes it optional when `tool_calls` is present). Tool messages carry text
//! only: a result's readable text (each non-text block a placeholder line), and the images
//! the budget admits go in one user message after the step's tool messages
//! (`{"role":"user","content":[{"type":"text","text":<TOOL_IMAGES_INTRO>},
//! {"type":"text","text":"[content block #i of the result of call <id>]"},
//! {"type":"image_url","image_url":{"url":"data:<type>;base64,…"}}, …]}`). A failed call's
//! text is prefixed with `Error: ` since the format has no error flag. `arguments` is the
//! call's arguments as canonical compact JSON when they are an object, else the compact JSON
//! of `{"_raw_arguments": <text>}`. More than [`OPENAI_MAX_TOOLS`] tools is a
//! [`RenderError::TooManyTools`]. Call ids longer than
//! [`OPENAI_MAX_CALL_ID`](crate::OPENAI_MAX_CALL_ID) characters are replaced by a 40-character
//! form, the same one in the call and its tool message (see
//! [`RenderedRequest::replaced_call_ids`]). OpenAI caches prefixes automatically; there are
//! no breakpoints, and `prompt_cache_key` is written when set.
//!
//! The same substitutes as for Anthropic keep every log renderable and the two providers'
//! views alike: a call name outside `^[a-zA-Z0-9_-]{1,64}$` is sanitised (`invalid_` and
//! the name with every other character made `_`, cut to 64 bytes); a call without a logged result is answered by a
//! `tool` message `Error: ` + [`MISSING_RESULT`](crate::MISSING_RESULT); a user message whose
//! text is empty or only whitespace is sent as [`EMPTY_USER_MESSAGE`](crate::EMPTY_USER_MESSAGE);
//! an assistant message's whitespace-only text is left out (and the message with it when it
//! calls no tool). Tool message text is sent as it is, whitespace included (the API takes it).

use psych_types::{ContentBlock, Projection};

use crate::NativeDeferral;
use crate::assemble::{Answer, Message, Prompt};
use crate::image::Budget;
use crate::render::{
    CallIds, EMPTY_USER_MESSAGE, MISSING_RESULT, Out, Part, Provider, RenderError, RenderedRequest,
    call_name, check_extra, is_blank, write_arguments, write_extra,
};

/// The most tools an OpenAI Chat Completions request may declare.
pub const OPENAI_MAX_TOOLS: usize = 128;

/// The text that opens the user message carrying the images of a step's tool results (tool
/// messages carry text only).
pub const TOOL_IMAGES_INTRO: &str = "Images from the tool results above:";

/// Request options of the OpenAI renderer.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiOptions {
    pub(crate) model: String,
    pub(crate) prompt_cache_key: Option<String>,
    pub(crate) extra: psych_types::JsonObject,
    pub(crate) native: Option<NativeDeferral>,
}

impl OpenAiOptions {
    /// Options for `model`.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            prompt_cache_key: None,
            extra: psych_types::JsonObject::new(),
            native: None,
        }
    }

    /// Sets `prompt_cache_key`, which OpenAI uses to route requests sharing a prefix to the
    /// same cache (a Run id is a good key).
    #[must_use]
    pub fn prompt_cache_key(mut self, key: impl Into<String>) -> Self {
        self.prompt_cache_key = Some(key.into());
        self
    }

    /// Adds another top-level request field (`temperature`, `tool_choice`,
    /// `max_completion_tokens`, `stream`…), written after `model` in key order.
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

/// Writes the opening of a request body for both OpenAI formats: `{"model":…`,
/// `prompt_cache_key` when set, the extra options.
pub(crate) fn write_preamble(out: &mut Out, options: &OpenAiOptions) {
    out.open(Part::Preamble);
    out.push("{\"model\":");
    out.str(&options.model);
    if let Some(key) = &options.prompt_cache_key {
        out.push(",\"prompt_cache_key\":");
        out.str(key);
    }
    write_extra(out, &options.extra);
}

/// Fields the OpenAI renderer writes itself.
const RESERVED: [&str; 4] = ["model", "prompt_cache_key", "tools", "messages"];

impl Prompt<'_> {
    /// Renders the OpenAI Chat Completions request body.
    ///
    /// # Errors
    ///
    /// [`RenderError`] for a tool of the surface named outside `^[a-zA-Z0-9_-]{1,64}$`,
    /// duplicate tool names, an extra option the renderer owns, or nothing to send (no
    /// system text, no message and no transient message: [`RenderError::NoMessages`]).
    /// What the model wrote never fails a render: call names are sanitised, raw arguments
    /// sent as their text.
    pub fn render_openai(&self, options: &OpenAiOptions) -> Result<RenderedRequest, RenderError> {
        check_extra(&options.extra, &RESERVED)?;
        if options.native.is_some() {
            return Err(RenderError::NativeDeferralUnsupported {
                reason: "the Chat Completions API has no deferred tools",
            });
        }
        self.surface_check()?;
        // No system text, no message and no transient message: `"messages":[]`, which the
        // API refuses.
        if self.static_sections.sections().is_empty()
            && self.dynamic_tail.text().is_none()
            && self.messages.iter().all(Message::renders_empty)
            && self.transient.text().is_none()
        {
            return Err(RenderError::NoMessages);
        }
        if self.tools.len() > OPENAI_MAX_TOOLS {
            return Err(RenderError::TooManyTools {
                count: self.tools.len(),
                max: OPENAI_MAX_TOOLS,
            });
        }

        let mut out = Out::with_capacity(4096);
        write_preamble(&mut out, options);

        if !self.tools.is_empty() {
            out.open(Part::Tools);
            out.push(",\"tools\":[");
            for (i, tool) in self.tools.iter().enumerate() {
                if i > 0 {
                    out.push(",");
                }
                out.push("{\"type\":\"function\",\"function\":{\"name\":");
                out.str(tool.name.as_str());
                if let Some(description) = &tool.description {
                    out.push(",\"description\":");
                    out.str(description);
                }
                out.push(",\"parameters\":");
                out.object(&tool.input_schema);
                out.push("}");
                out.end_block(false);
                out.push("}");
            }
            out.push("]");
        }

        out.open(Part::StaticSystem);
        out.push(",\"messages\":[");
        let system = self.write_system_text(&mut out, "{\"role\":\"system\",\"content\":\"");
        if system {
            out.push("\"");
            out.end_block(false);
            out.push("}");
        }

        let mut ids = CallIds::default();
        let mut budget = Budget::default();
        let history_end = self.write_items(
            &mut out,
            !system,
            "{\"role\":\"user\",\"content\":",
            |out, message, first| self.openai_message(out, message, first, &mut ids, &mut budget),
        );
        out.call_ids = ids.replaced;
        Ok(out.finish(Provider::OpenAi, history_end))
    }

    /// Writes zones 1 and 2 as the body of one JSON string after `open` (the sections, then
    /// the tail in its own span, `\n\n` between), for both OpenAI formats; writes nothing
    /// and returns `false` when both zones are empty.
    pub(crate) fn write_system_text(&self, out: &mut Out, open: &str) -> bool {
        let sections = self.static_sections.sections();
        let tail = self.dynamic_tail.text();
        if sections.is_empty() && tail.is_none() {
            return false;
        }
        out.push(open);
        for (i, section) in sections.iter().enumerate() {
            if i > 0 {
                out.str_body("\n\n");
            }
            out.str_body(section);
        }
        if let Some(tail) = &tail {
            out.open(Part::DynamicSystem);
            if !sections.is_empty() {
                out.str_body("\n\n");
            }
            out.str_body(tail);
        }
        true
    }

    /// Writes the history's messages with `message` (a message that renders as nothing is
    /// left out), then the transient message as an item opening with `transient_open`, and
    /// closes the list and the body, for both OpenAI formats. `first`: whether no item
    /// precedes the history in the list. Returns where the history ends.
    pub(crate) fn write_items(
        &self,
        out: &mut Out,
        mut first: bool,
        transient_open: &str,
        mut message: impl FnMut(&mut Out, &Message<'_>, bool),
    ) -> usize {
        let mut history_end = out.pos();
        for m in &self.messages {
            if !m.renders_empty() {
                message(out, m, first);
                first = false;
                history_end = out.pos();
            }
        }
        if let Some(text) = self.transient.text() {
            out.open(Part::Transient);
            if !first {
                out.push(",");
            }
            out.push(transient_open);
            out.str(&text);
            out.end_block(false);
            out.push("}");
        }
        out.close();
        out.push("]}");
        history_end
    }

    /// Writes one message (or run of tool messages).
    fn openai_message(
        &self,
        out: &mut Out,
        message: &Message<'_>,
        first: bool,
        ids: &mut CallIds,
        budget: &mut Budget,
    ) {
        out.open(Part::Message {
            records: message.records(),
        });
        if !first {
            out.push(",");
        }
        match message {
            Message::User { text, .. } => {
                out.push("{\"role\":\"user\",\"content\":");
                out.str(if is_blank(text) {
                    EMPTY_USER_MESSAGE
                } else {
                    text
                });
                out.end_block(false);
                out.push("}");
            }
            Message::Assistant { message, .. } => {
                out.push("{\"role\":\"assistant\"");
                if !is_blank(&message.text) {
                    out.push(",\"content\":");
                    out.str(&message.text);
                }
                if !message.tool_calls.is_empty() {
                    out.push(",\"tool_calls\":[");
                    let mut arguments = String::new();
                    for (i, call) in message.tool_calls.iter().enumerate() {
                        if i > 0 {
                            out.push(",");
                        }
                        out.push("{\"id\":");
                        out.str(&ids.sent(&call.id));
                        out.push(",\"type\":\"function\",\"function\":{\"name\":");
                        out.str(&call_name(&call.name));
                        out.push(",\"arguments\":");
                        arguments.clear();
                        // Wrapped as for Anthropic when not an object, so the text the API
                        // parses is always an object.
                        write_arguments(&mut arguments, call);
                        out.str(&arguments);
                        out.push("}}");
                    }
                    out.push("]");
                }
                out.end_block(false);
                out.push("}");
            }
            Message::Results { items, .. } => {
                // (call id as sent, block position, media type, bytes) of each image sent.
                let mut images = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(",");
                    }
                    let sent_id = ids.sent(item.call_id());
                    out.push("{\"role\":\"tool\",\"tool_call_id\":");
                    out.str(&sent_id);
                    out.push(",\"content\":\"");
                    match item {
                        Answer::Logged(index, result) => {
                            if result.output.is_error {
                                out.push("Error: ");
                            }
                            match &self.views[*index] {
                                Projection::Replaced(text) => out.str_body(text),
                                Projection::Full => {
                                    out.str_body(&result.output.readable_text());
                                    for (position, block) in
                                        result.output.content.iter().enumerate()
                                    {
                                        if let ContentBlock::Image(media) = block
                                            && let Some(media_type) =
                                                budget.admit(&media.data, false)
                                        {
                                            images.push((
                                                sent_id.clone(),
                                                position,
                                                media_type,
                                                &media.data,
                                            ));
                                        }
                                    }
                                }
                            }
                        }
                        Answer::Missing(_) => {
                            out.push("Error: ");
                            out.str_body(MISSING_RESULT);
                        }
                    }
                    out.push("\"");
                    out.end_block(false);
                    out.push("}");
                }
                if !images.is_empty() {
                    // Tool messages carry text only: the images of this step's results go
                    // in one user message right after them, each after a text part naming
                    // its call and block (the tool message shows that block's placeholder).
                    out.push(",{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":");
                    out.str(TOOL_IMAGES_INTRO);
                    out.push("}");
                    for (call, position, media_type, data) in images {
                        out.push(",{\"type\":\"text\",\"text\":");
                        out.str(&format!(
                            "[content block #{position} of the result of call {call}]"
                        ));
                        out.push("},{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:");
                        out.push(media_type);
                        out.push(";base64,");
                        out.push(&psych_types::encode_base64(data));
                        out.push("\"}}");
                    }
                    out.push("]");
                    out.end_block(false);
                    out.push("}");
                }
            }
        }
    }
}
