//! The OpenAI Responses API renderer (`POST /v1/responses`), which OpenAI recommends over
//! Chat Completions for new work.
//!
//! Shape, field by field (checked against the `openai` SDK's
//! `ResponseCreateParamsNonStreaming`, see the crate docs):
//!
//! ```text
//! {"model":…,"prompt_cache_key":…,<extra options, sorted>,
//!  "tools":[{"type":"function","name":…,"description":…,"parameters":{…},"strict":false}, …],
//!  "instructions":"<zone 1 sections>\n\n<zone 2 tail>",
//!  "input":[
//!    {"type":"message","role":"user","content":…},
//!    {"type":"message","role":"assistant","content":…},
//!    {"type":"function_call","call_id":…,"name":…,"arguments":"<JSON object as a string>"}, …,
//!    {"type":"function_call_output","call_id":…,"output":…}, …,
//!    {"type":"message","role":"user","content":<transient>}]}
//! ```
//!
//! The zones are those of the other renderers: tools, then `instructions` (zone 1, then zone
//! 2 last), then `input` (zone 3), the transient message last; the cache stream is the body
//! (there are no breakpoints), so the prefix property is the body's own. An assistant record
//! is its text as an assistant message item (left out when blank), then one `function_call`
//! item per call; the results follow as one `function_call_output` item per call, in call
//! order, right after them. `strict` is written `false` on every tool: the Responses API
//! takes a function as strict unless told otherwise, and strict mode refuses the schemas
//! MCP servers publish (optional properties, open objects).
//!
//! A result's `output` is its text (the projection, or the readable text) as a string; when
//! images of the result are admitted (see the crate docs; never GIF, which OpenAI takes only
//! when not animated), it is a list of `input_text` parts for the text between images and
//! `input_image` parts (`"image_url":"data:<type>;base64,…"`), in block order, as for
//! Anthropic's `tool_result`. A failed result's text starts `Error: ` (the item has no error
//! flag). The substitutes are those of the Chat Completions renderer: call names sanitised,
//! arguments that are not an object wrapped under
//! [`RAW_ARGUMENTS_KEY`](crate::RAW_ARGUMENTS_KEY), a call without a result answered by
//! `Error: ` + [`MISSING_RESULT`](crate::MISSING_RESULT), a blank user message sent as
//! [`EMPTY_USER_MESSAGE`](crate::EMPTY_USER_MESSAGE), call ids over
//! [`OPENAI_MAX_CALL_ID`](crate::OPENAI_MAX_CALL_ID) characters shortened the same way.
//! More than [`OPENAI_MAX_TOOLS`](crate::OPENAI_MAX_TOOLS) tools is a
//! [`RenderError::TooManyTools`] (the Chat Completions cap, taken to hold here too).

use std::collections::BTreeSet;

use psych_types::{Projection, ToolCallId, ToolDefinition};

use crate::anthropic::check_native_names;
use crate::assemble::{Answer, Message, Prompt};
use crate::deferral::{NO_MATCH, references};
use crate::image::Budget;
use crate::openai::write_preamble;
use crate::render::{
    CallIds, EMPTY_USER_MESSAGE, MISSING_RESULT, Out, Part, Piece, Provider, RenderError,
    RenderedRequest, call_name, check_extra, is_blank, pieces, write_arguments,
};
use crate::{NativeDeferral, OPENAI_MAX_TOOLS, OpenAiOptions, SearchTool};

/// Fields the Responses renderer writes itself.
const RESERVED: [&str; 5] = [
    "model",
    "prompt_cache_key",
    "tools",
    "instructions",
    "input",
];

impl Prompt<'_> {
    /// Renders the OpenAI Responses API request body (`POST /v1/responses`), with the same
    /// options as [`Prompt::render_openai`] (extra options such as `max_output_tokens` or
    /// `store` go through [`OpenAiOptions::option`]).
    ///
    /// # Errors
    ///
    /// [`RenderError`] for a tool of the surface named outside `^[a-zA-Z0-9_-]{1,64}$`,
    /// duplicate tool names, more than [`OPENAI_MAX_TOOLS`] tools, or an extra option the
    /// renderer owns. What the model wrote never fails a render.
    pub fn render_responses(
        &self,
        options: &OpenAiOptions,
    ) -> Result<RenderedRequest, RenderError> {
        check_extra(&options.extra, &RESERVED)?;
        self.surface_check()?;
        let native = options.native.as_ref();
        if let Some(native) = native {
            if !matches!(native.search(), SearchTool::Client { .. }) {
                return Err(RenderError::NativeDeferralUnsupported {
                    reason: "Anthropic's server-side tool search is not a Responses tool",
                });
            }
            check_native_names(self, native)?;
        }
        // Deferred tools are not counted against the cap; the search tool is.
        let count = self.tools.len() + usize::from(native.is_some());
        if count > OPENAI_MAX_TOOLS {
            return Err(RenderError::TooManyTools {
                count,
                max: OPENAI_MAX_TOOLS,
            });
        }

        let mut out = Out::with_capacity(4096);
        write_preamble(&mut out, options);

        if count > 0 {
            out.open(Part::Tools);
            out.push(",\"tools\":[");
            for (i, tool) in self.tools.iter().enumerate() {
                if i > 0 {
                    out.push(",");
                }
                function_tool(&mut out, tool, false, true);
            }
            if let Some(native) = native {
                if let SearchTool::Client {
                    description,
                    input_schema,
                    ..
                } = native.search()
                {
                    if !self.tools.is_empty() {
                        out.push(",");
                    }
                    out.push("{\"type\":\"tool_search\",\"execution\":\"client\",\"description\":");
                    out.str(description);
                    out.push(",\"parameters\":");
                    out.object(input_schema);
                    out.end_block(false);
                    out.push("}");
                }
                for tool in native.tools() {
                    out.push(",");
                    function_tool(&mut out, tool, true, true);
                }
            }
            out.push("]");
        }

        out.open(Part::StaticSystem);
        if self.write_system_text(&mut out, ",\"instructions\":\"") {
            // The closing quote ends the instructions block.
            out.end_block(false);
            out.push("\"");
        }
        out.push(",\"input\":[");

        let mut ids = CallIds::default();
        let mut budget = Budget::default();
        let searches = native
            .map(|native| self.search_answers(native))
            .unwrap_or_default();
        let history_end = self.write_items(
            &mut out,
            true,
            "{\"type\":\"message\",\"role\":\"user\",\"content\":",
            |out, message, first| {
                let state = State {
                    ids: &mut ids,
                    budget: &mut budget,
                    native,
                    searches: &searches,
                };
                self.responses_message(out, message, first, state)
            },
        );
        out.call_ids = ids.replaced;
        Ok(out.finish(Provider::OpenAiResponses, history_end))
    }

    /// The calls of the search tool answered by references to tools of the request's
    /// deferred set (a logged result, shown whole, of `tool_reference` blocks only, naming
    /// at least one such tool): these are sent as `tool_search_call` and
    /// `tool_search_output` items. Any other answer of a search call (an error, a note that
    /// nothing matched, references to no tool of the set, an elided preview, no result) is
    /// text a `tool_search_output` cannot carry, so that call is sent as a `function_call`
    /// answered by a `function_call_output` holding the text ([`NO_MATCH`] for references
    /// to no tool of the set, as Anthropic's `tool_result` says).
    fn search_answers(&self, native: &NativeDeferral) -> BTreeSet<ToolCallId> {
        let mut calls = BTreeSet::new();
        let mut answered = BTreeSet::new();
        for message in &self.messages {
            match message {
                Message::Assistant { message, .. } => calls.extend(
                    message
                        .tool_calls
                        .iter()
                        .filter(|call| call.name == native.search().name())
                        .map(|call| &call.id),
                ),
                Message::Results { items, .. } => {
                    for answer in items {
                        if let Answer::Logged(index, result) = answer
                            && calls.contains(&result.call_id)
                            && self.views[*index] == Projection::Full
                            && references(result, native).is_some_and(|tools| !tools.is_empty())
                        {
                            answered.insert(result.call_id.clone());
                        }
                    }
                }
                Message::User { .. } => {}
            }
        }
        answered
    }

    /// Writes one message's input items.
    fn responses_message(
        &self,
        out: &mut Out,
        message: &Message<'_>,
        first: bool,
        state: State<'_, '_>,
    ) {
        let State {
            ids,
            budget,
            native,
            searches,
        } = state;
        out.open(Part::Message {
            records: message.records(),
        });
        let mut first = first;
        let mut item = |out: &mut Out| {
            if !first {
                out.push(",");
            }
            first = false;
        };
        match message {
            Message::User { text, .. } => {
                item(out);
                out.push("{\"type\":\"message\",\"role\":\"user\",\"content\":");
                out.str(if is_blank(text) {
                    EMPTY_USER_MESSAGE
                } else {
                    text
                });
                out.end_block(false);
                out.push("}");
            }
            Message::Assistant { message, .. } => {
                if !is_blank(&message.text) {
                    item(out);
                    out.push("{\"type\":\"message\",\"role\":\"assistant\",\"content\":");
                    out.str(&message.text);
                    out.end_block(false);
                    out.push("}");
                }
                let mut arguments = String::new();
                for call in &message.tool_calls {
                    item(out);
                    if native.is_some_and(|native| call.name == native.search().name())
                        && searches.contains(&call.id)
                    {
                        // A search call answered by references: a tool_search_call item,
                        // its arguments an object.
                        out.push("{\"type\":\"tool_search_call\",\"call_id\":");
                        out.str(&ids.sent(&call.id));
                        out.push(",\"execution\":\"client\",\"arguments\":");
                        out.arguments(call);
                        out.end_block(false);
                        out.push("}");
                        continue;
                    }
                    out.push("{\"type\":\"function_call\",\"call_id\":");
                    out.str(&ids.sent(&call.id));
                    out.push(",\"name\":");
                    out.str(&call_name(&call.name));
                    out.push(",\"arguments\":");
                    arguments.clear();
                    write_arguments(&mut arguments, call);
                    out.str(&arguments);
                    out.end_block(false);
                    out.push("}");
                }
            }
            Message::Results { items, .. } => {
                for answer in items {
                    item(out);
                    if let Some(native) = native
                        && let Answer::Logged(_, result) = answer
                        && searches.contains(&result.call_id)
                        && let Some(tools) = references(result, native)
                    {
                        // The search's answer: the deferred tools it references (only tools
                        // of the request's deferred set), loaded with their definitions.
                        out.push("{\"type\":\"tool_search_output\",\"call_id\":");
                        out.str(&ids.sent(answer.call_id()));
                        out.push(",\"execution\":\"client\",\"tools\":[");
                        for (k, tool) in tools.into_iter().enumerate() {
                            if k > 0 {
                                out.push(",");
                            }
                            function_tool(out, tool, true, false);
                        }
                        out.push("]");
                        out.end_block(false);
                        out.push("}");
                        continue;
                    }
                    out.push("{\"type\":\"function_call_output\",\"call_id\":");
                    out.str(&ids.sent(answer.call_id()));
                    out.push(",\"output\":");
                    let (view, is_error) = match answer {
                        // References to no tool of the deferred set: nothing to load.
                        Answer::Logged(index, result)
                            if native.is_some_and(|native| {
                                self.views[*index] == Projection::Full
                                    && references(result, native)
                                        .is_some_and(|tools| tools.is_empty())
                            }) =>
                        {
                            (vec![Piece::Text(NO_MATCH.into())], false)
                        }
                        Answer::Logged(index, result) => (
                            pieces(result, &self.views[*index], Some((&mut *budget, false))),
                            result.output.is_error,
                        ),
                        Answer::Missing(_) => (vec![Piece::Text(MISSING_RESULT.into())], true),
                    };
                    write_output(out, &view, is_error);
                    out.end_block(false);
                    out.push("}");
                }
            }
        }
    }
}

/// What the input items of one message need besides the message.
struct State<'s, 'n> {
    ids: &'s mut CallIds,
    budget: &'s mut Budget,
    native: Option<&'n NativeDeferral>,
    /// The ids of the search calls answered by references ([`Prompt::search_answers`]).
    searches: &'s BTreeSet<ToolCallId>,
}

/// Writes a function tool, with `defer_loading` when `deferred`. Inside a
/// `tool_search_output` the same bytes load the tool.
/// `block`: whether it is a block of the request's layout (a tool of `tools`), not a tool
/// inside an input item.
fn function_tool(out: &mut Out, tool: &ToolDefinition, deferred: bool, block: bool) {
    out.push("{\"type\":\"function\",\"name\":");
    out.str(tool.name.as_str());
    if let Some(description) = &tool.description {
        out.push(",\"description\":");
        out.str(description);
    }
    out.push(",\"parameters\":");
    out.object(&tool.input_schema);
    out.push(",\"strict\":false");
    if deferred {
        out.push(",\"defer_loading\":true");
    }
    if block {
        out.end_block(false);
    }
    out.push("}");
}

/// Writes a result's `output`: a string when it is text only, else a list of `input_text`
/// and `input_image` parts (blank text between images left out). A failed result's first
/// text starts `Error: `.
fn write_output(out: &mut Out, view: &[Piece<'_>], is_error: bool) {
    let prefix = if is_error { "Error: " } else { "" };
    if let [Piece::Text(text)] = view {
        out.push("\"");
        out.str_body(prefix);
        out.str_body(text);
        out.push("\"");
        return;
    }
    out.push("[");
    let mut first = true;
    let mut prefixed = false;
    if is_error && !matches!(view.first(), Some(Piece::Text(_))) {
        out.push("{\"type\":\"input_text\",\"text\":\"Error:\"}");
        first = false;
        prefixed = true;
    }
    for piece in view {
        match piece {
            Piece::Text(text) if is_blank(text) && (prefixed || !is_error) => continue,
            _ => {}
        }
        if !first {
            out.push(",");
        }
        first = false;
        match piece {
            Piece::Text(text) => {
                out.push("{\"type\":\"input_text\",\"text\":\"");
                if !prefixed {
                    out.str_body(prefix);
                    prefixed = true;
                }
                out.str_body(text);
                out.push("\"}");
            }
            Piece::Image { media_type, data } => {
                out.push("{\"type\":\"input_image\",\"image_url\":\"data:");
                out.push(media_type);
                out.push(";base64,");
                out.push(&psych_types::encode_base64(data));
                out.push("\"}");
            }
        }
    }
    out.push("]");
}
