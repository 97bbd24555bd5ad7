//! What the renderers share: the rendered request with its layout, the render errors, the
//! provider tool-name rule and the model's view of one tool result.

use std::borrow::Cow;
use std::ops::Range;

use psych_types::{ContentBlock, JsonObject, Projection, ToolCall, ToolCallId, ToolResult, json};

use crate::image::Budget;

/// Why a prompt cannot be rendered as a request the provider accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RenderError {
    /// A tool definition's name is outside `^[a-zA-Z0-9_-]{1,64}$`, the name rule of both
    /// the Anthropic and the OpenAI API (an MCP name may have dots and 128 characters).
    #[error(
        "tool name {name:?} is not accepted by the provider (allowed: ^[a-zA-Z0-9_-]{{1,64}}$)"
    )]
    ToolName {
        /// The refused name.
        name: String,
    },
    /// Two tools of the surface have the same name.
    #[error("tool name {name:?} appears twice in the tool surface")]
    DuplicateTool {
        /// The repeated name.
        name: String,
    },
    /// The history and the transient message are both empty: the Anthropic API requires at
    /// least one message.
    #[error("the request has no message (empty history and no transient message)")]
    NoMessages,
    /// The tool surface has more tools than the provider accepts (OpenAI: 128). Disclosure
    /// keeps surfaces under the cap; a surface over it is refused rather than sent to be
    /// refused.
    #[error("the tool surface has {count} tools; the provider accepts at most {max}")]
    TooManyTools {
        /// Tools in the surface.
        count: usize,
        /// The provider's cap.
        max: usize,
    },
    /// Native deferral was asked of a wire format that has none (Chat Completions), or with
    /// a search tool the format cannot carry (Anthropic's server-side search on Responses).
    /// [`choose_deferral`](crate::choose_deferral) picks the meta tools there instead.
    #[error("native deferral is not available here: {reason}")]
    NativeDeferralUnsupported {
        /// What is missing.
        reason: &'static str,
    },
    /// An extra request option uses a field the renderer writes itself.
    #[error("request option {key:?} is written by the renderer and cannot be set as an extra")]
    ReservedOption {
        /// The refused key.
        key: String,
    },
}

/// Whether `name` matches `^[a-zA-Z0-9_-]{1,64}$`.
pub(crate) fn provider_name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The longest tool name both providers accept, in bytes.
const MAX_NAME: usize = 64;

/// The prefix of a sanitised call name (see [`call_name`]).
pub(crate) const INVALID_NAME_PREFIX: &str = "invalid_";

/// The name a logged tool call is rendered with: the name as the model gave it when it
/// matches `^[a-zA-Z0-9_-]{1,64}$`, else `invalid_` followed by that name with every
/// character outside `[a-zA-Z0-9_-]` replaced by `_`, cut to 64 bytes. So
/// `github.list_issues` is sent as `invalid_github_list_issues`: the prefix keeps a
/// sanitised name from reading as a real tool of the surface (`github_list_issues` may
/// exist, and the model would then see it fail). A call's name is what the model said,
/// not a tool we declare: a model that invents a name must not make its Run
/// unrenderable. Calls and results pair by id, never by name, so a sanitised call still
/// pairs with its result.
pub(crate) fn call_name(name: &str) -> Cow<'_, str> {
    if provider_name_ok(name) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(INVALID_NAME_PREFIX.len() + name.len());
    out.push_str(INVALID_NAME_PREFIX);
    out.extend(name.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
            c
        } else {
            '_'
        }
    }));
    // Every character is ASCII now, so any byte length is a char boundary.
    out.truncate(MAX_NAME);
    Cow::Owned(out)
}

/// The key under which both renderers send arguments that are not a JSON object.
///
/// Anthropic's `tool_use.input` must be an object, and OpenAI's `function.arguments` must
/// be the text of one (the API refuses text that does not parse). The log keeps arguments
/// that did not parse as a JSON string of their raw text (see
/// [`ToolCall`](psych_types::ToolCall)), and a model may send valid JSON that is not an
/// object; either is sent as the object `{"_raw_arguments": <text>}` (for OpenAI, that
/// object's compact JSON text), the text being the raw string, or the canonical compact JSON
/// of any other value.
pub const RAW_ARGUMENTS_KEY: &str = "_raw_arguments";

/// The text of the error result rendered for a tool call that has no result in the log.
///
/// A Run whose process stopped between logging a call and logging its result has such a
/// call forever (the log is never rewritten), and both providers refuse a call without a
/// result. The renderers send this text as that call's failed result, in the place the
/// result belongs (Anthropic: a `tool_result` with `is_error` in the next user message;
/// OpenAI: a `tool` message whose content starts `Error: `).
///
/// A result logged for such a call *after* a request rendered it missing would change that
/// request's bytes where the substitute stood, breaking the cached prefix. So a runtime
/// resuming a Run logs a failed [`ToolResult`](psych_types::ToolResult) for every call left
/// open before it assembles; a result arriving later is then a duplicate, and duplicates
/// are left out.
pub const MISSING_RESULT: &str = "No result was recorded for this call (the run was interrupted).";

/// The text a user message is rendered with when its text is empty or only whitespace.
///
/// Anthropic refuses text blocks without non-whitespace text and messages without content;
/// dropping the message instead would merge the turns around it and could leave the
/// conversation starting with an assistant message. Both renderers use it, so a Run reads
/// the same to either model.
pub const EMPTY_USER_MESSAGE: &str = "[empty message]";

/// Whether `text` has nothing but whitespace, the empty text included: such text is
/// treated as absent (Anthropic refuses it in a text block). Whitespace is Unicode
/// `White_Space` plus the information separators U+001C–U+001F (which Python's
/// `str.isspace`, a likely server-side check, also counts) and U+FEFF, so nothing a
/// provider may call blank is sent as a text block.
pub(crate) fn is_blank(text: &str) -> bool {
    text.chars()
        .all(|c| c.is_whitespace() || matches!(c, '\u{1C}'..='\u{1F}' | '\u{FEFF}'))
}

/// The text of non-object call arguments: the raw text when the log holds a string, the
/// canonical compact JSON of any other value.
pub(crate) fn raw_arguments(call: &ToolCall) -> Cow<'_, str> {
    match &call.arguments {
        serde_json::Value::String(raw) => Cow::Borrowed(raw),
        other => {
            let mut text = String::new();
            json::write_value(&mut text, other);
            Cow::Owned(text)
        }
    }
}

/// Writes a call's arguments as a JSON object: the arguments when they are one, else
/// `{"_raw_arguments": <text>}` (see [`RAW_ARGUMENTS_KEY`] and [`raw_arguments`]). Anthropic
/// sends these bytes as `input`, OpenAI as the text of `arguments`.
pub(crate) fn write_arguments(out: &mut String, call: &ToolCall) {
    if call.arguments.is_object() {
        json::write_value(out, &call.arguments);
    } else {
        out.push('{');
        json::write_str(out, RAW_ARGUMENTS_KEY);
        out.push(':');
        json::write_str(out, &raw_arguments(call));
        out.push('}');
    }
}

/// Which wire format a request is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Provider {
    /// The Anthropic Messages API (`POST /v1/messages`).
    Anthropic,
    /// The OpenAI Chat Completions API (`POST /v1/chat/completions`).
    OpenAi,
    /// The OpenAI Responses API (`POST /v1/responses`).
    OpenAiResponses,
}

/// Which part of the prompt a span of a rendered request holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Part {
    /// The request fields before the tools (`model`, `max_tokens`, extra options).
    Preamble,
    /// The tool definitions (the start of the provider's cache order).
    Tools,
    /// Zone 1: the static system sections.
    StaticSystem,
    /// Zone 2: the dynamic system tail.
    DynamicSystem,
    /// One message of zone 3 (for OpenAI, a run of `tool` messages counts as one), with the
    /// indices of the history records it renders.
    Message {
        /// Indices into the history slice given to the assembler (empty for a message made
        /// only of substitutes for calls without a logged result).
        records: Range<usize>,
    },
    /// Zone 4: the transient message.
    Transient,
}

/// A part of a rendered request and where it lies in the request's cache stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// What the bytes are.
    pub part: Part,
    /// Byte range in [`RenderedRequest::cache_stream`].
    pub range: Range<usize>,
}

/// A rendered request: the exact body to send, and its layout for cache accounting.
///
/// # The cache stream and the prefix property
///
/// The body is written in the provider's cache order: preamble, `tools`, `system`, then
/// `messages` with the transient message last. Its *cache stream* is the body with every
/// `"cache_control"` member removed (a breakpoint marks where to cache; it is not part of
/// the cached content, and it moves from step to step). The *cacheable prefix* is the cache
/// stream up to the end of the last history message: it leaves out the transient message
/// and the closing brackets.
///
/// The property this crate keeps is: within a turn, the cacheable prefix of step k is a
/// byte prefix of the cache stream of step k+1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedRequest {
    pub(crate) provider: Provider,
    pub(crate) body: String,
    pub(crate) markers: Vec<Range<usize>>,
    pub(crate) spans: Vec<Span>,
    pub(crate) block_ends: Vec<usize>,
    pub(crate) breakpoint_blocks: Vec<usize>,
    pub(crate) nested: Vec<usize>,
    pub(crate) history_end: usize,
    pub(crate) call_ids: Vec<(String, ToolCallId)>,
}

impl RenderedRequest {
    /// The call ids sent in place of logged ids the provider does not accept, each with the
    /// logged id it stands for, in the order they first appear (OpenAI: ids over 40
    /// characters, see [`OPENAI_MAX_CALL_ID`]). Empty when every id was sent as logged.
    pub fn replaced_call_ids(&self) -> &[(String, ToolCallId)] {
        &self.call_ids
    }

    /// The logged call id a sent id stands for: itself unless it is one of
    /// [`RenderedRequest::replaced_call_ids`]. This is the reverse of the mapping.
    pub fn logged_call_id<'a>(&'a self, sent: &'a str) -> &'a str {
        self.call_ids
            .iter()
            .find(|(id, _)| id == sent)
            .map_or(sent, |(_, logged)| logged.as_str())
    }

    /// The provider this request is for.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// The JSON body, exactly as it is to be sent.
    pub fn body(&self) -> &str {
        &self.body
    }

    /// The JSON body, owned.
    pub fn into_body(self) -> String {
        self.body
    }

    /// The body indented two spaces a level, one member or element a line, for review
    /// (snapshot diffs): nothing is reordered or re-encoded, and since the body has no
    /// white space outside strings, removing the added white space gives the body back
    /// byte for byte.
    pub fn pretty_body(&self) -> String {
        json::indent(&self.body)
    }

    /// The body without its `cache_control` members: what the provider's cache compares.
    pub fn cache_stream(&self) -> Cow<'_, str> {
        if self.markers.is_empty() {
            return Cow::Borrowed(&self.body);
        }
        let mut stream = String::with_capacity(self.body.len());
        let mut at = 0;
        for marker in &self.markers {
            stream.push_str(&self.body[at..marker.start]);
            at = marker.end;
        }
        stream.push_str(&self.body[at..]);
        Cow::Owned(stream)
    }

    /// Length of the cacheable prefix: the cache stream up to the end of the history.
    pub fn cacheable_len(&self) -> usize {
        self.history_end
    }

    /// The parts of the request and their byte ranges in the cache stream, in order.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// The span holding cache-stream byte `offset`, if any.
    pub fn part_at(&self, offset: usize) -> Option<&Span> {
        self.spans.iter().find(|span| span.range.contains(&offset))
    }

    /// Where each cacheable block ends in the cache stream, in cache order (Anthropic:
    /// each tool, each system block, each message content block, the transient block last;
    /// OpenAI: each tool and each message).
    pub fn block_ends(&self) -> &[usize] {
        &self.block_ends
    }

    /// The indices (into [`RenderedRequest::block_ends`]) of the blocks carrying a
    /// `cache_control` breakpoint. Always empty for OpenAI.
    pub fn breakpoint_blocks(&self) -> &[usize] {
        &self.breakpoint_blocks
    }

    /// For each block of [`RenderedRequest::block_ends`], how many blocks are nested in it:
    /// the text and image blocks of an Anthropic `tool_result`'s `content`, 0 for every
    /// other block. Anthropic's documentation does not say whether the prompt cache's
    /// lookback counts them as block positions; [`CacheRules`](crate::CacheRules) can count
    /// either way.
    pub fn nested_blocks(&self) -> &[usize] {
        &self.nested
    }
}

/// The `cache_control` member the Anthropic renderer appends to a breakpoint block.
pub(crate) const MARKER: &str = ",\"cache_control\":{\"type\":\"ephemeral\"}";

/// A request being written: the body and its layout, in cache-stream coordinates.
#[derive(Debug, Default)]
pub(crate) struct Out {
    pub(crate) body: String,
    markers: Vec<Range<usize>>,
    marker_bytes: usize,
    spans: Vec<Span>,
    block_ends: Vec<usize>,
    breakpoint_blocks: Vec<usize>,
    nested: Vec<usize>,
    pending_nested: usize,
    open: Option<(Part, usize)>,
    pub(crate) call_ids: Vec<(String, ToolCallId)>,
}

impl Out {
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            body: String::with_capacity(capacity),
            ..Self::default()
        }
    }

    /// The current position in the cache stream.
    pub(crate) fn pos(&self) -> usize {
        self.body.len() - self.marker_bytes
    }

    pub(crate) fn push(&mut self, text: &str) {
        self.body.push_str(text);
    }

    pub(crate) fn str(&mut self, text: &str) {
        json::write_str(&mut self.body, text);
    }

    pub(crate) fn str_body(&mut self, text: &str) {
        json::write_str_body(&mut self.body, text);
    }

    pub(crate) fn object(&mut self, map: &JsonObject) {
        json::write_object(&mut self.body, map);
    }

    pub(crate) fn value(&mut self, value: &serde_json::Value) {
        json::write_value(&mut self.body, value);
    }

    /// Writes a call's arguments as a JSON object (see [`write_arguments`]).
    pub(crate) fn arguments(&mut self, call: &ToolCall) {
        write_arguments(&mut self.body, call);
    }

    /// Starts a span here.
    pub(crate) fn open(&mut self, part: Part) {
        self.close();
        self.open = Some((part, self.pos()));
    }

    /// Ends the open span here.
    pub(crate) fn close(&mut self) {
        if let Some((part, start)) = self.open.take() {
            let end = self.pos();
            self.spans.push(Span {
                part,
                range: start..end,
            });
        }
    }

    /// Ends a cacheable block here, after writing its breakpoint marker when `breakpoint`.
    /// The caller writes the block's closing brace after this call.
    pub(crate) fn end_block(&mut self, breakpoint: bool) {
        if breakpoint {
            let start = self.body.len();
            self.body.push_str(MARKER);
            self.markers.push(start..self.body.len());
            self.marker_bytes += MARKER.len();
            self.breakpoint_blocks.push(self.block_ends.len());
        }
        // The block's closing brace follows; count it in.
        self.block_ends.push(self.pos() + 1);
        self.nested.push(std::mem::take(&mut self.pending_nested));
    }

    /// Records that the block being written nests `count` blocks (see
    /// [`RenderedRequest::nested_blocks`]); taken by the next [`Out::end_block`].
    pub(crate) fn nest(&mut self, count: usize) {
        self.pending_nested = count;
    }

    /// The index the next block will get.
    pub(crate) fn next_block(&self) -> usize {
        self.block_ends.len()
    }

    pub(crate) fn finish(mut self, provider: Provider, history_end: usize) -> RenderedRequest {
        self.close();
        RenderedRequest {
            provider,
            body: self.body,
            markers: self.markers,
            spans: self.spans,
            block_ends: self.block_ends,
            breakpoint_blocks: self.breakpoint_blocks,
            nested: self.nested,
            history_end,
            call_ids: self.call_ids,
        }
    }
}

/// One piece of the model's view of a tool result.
#[derive(Debug)]
pub(crate) enum Piece<'a> {
    /// Text: a projection, or readable text between images.
    Text(Cow<'a, str>),
    /// An image block sent as an image, with its sniffed media type.
    Image {
        media_type: &'static str,
        data: &'a [u8],
    },
}

/// The view of `result` under `projection`, in order: a projection is its text; a whole
/// result is its readable text, except that each image block `budget` admits (see
/// [`crate::image`]) is an image piece instead of its placeholder line, the text around it
/// split there. With no budget, no image is admitted: the whole result is its readable text.
pub(crate) fn pieces<'a>(
    result: &'a ToolResult,
    projection: &'a Projection,
    budget: Option<(&mut Budget, bool)>,
) -> Vec<Piece<'a>> {
    if let Projection::Replaced(text) = projection {
        return vec![Piece::Text(Cow::Borrowed(text))];
    }
    let output = &result.output;
    let Some((budget, gif)) = budget else {
        return vec![Piece::Text(output.readable_text())];
    };
    if !output
        .content
        .iter()
        .any(|block| matches!(block, ContentBlock::Image(_)))
    {
        return vec![Piece::Text(output.readable_text())];
    }
    let mut out = Vec::new();
    let mut text = String::new();
    let mut started = false;
    for (position, block) in output.content.iter().enumerate() {
        if let ContentBlock::Image(media) = block
            && let Some(media_type) = budget.admit(&media.data, gif)
        {
            if started {
                out.push(Piece::Text(Cow::Owned(std::mem::take(&mut text))));
            }
            out.push(Piece::Image {
                media_type,
                data: &media.data,
            });
            started = false;
            continue;
        }
        if started {
            text.push('\n');
        }
        text.push_str(&block.readable_segment(position));
        started = true;
    }
    if started {
        out.push(Piece::Text(Cow::Owned(text)));
    }
    out
}

/// `text` without trailing whitespace (the characters [`is_blank`] counts).
pub(crate) fn trim_end(text: &str) -> &str {
    text.trim_end_matches(|c: char| {
        c.is_whitespace() || matches!(c, '\u{1C}'..='\u{1F}' | '\u{FEFF}')
    })
}

/// The longest tool call id OpenAI accepts, in characters.
pub const OPENAI_MAX_CALL_ID: usize = 40;

/// FNV-1a, 64 bits: a hash whose value is fixed by its definition, the same on every
/// machine and in every Rust version.
pub(crate) fn fnv1a(bytes: &[u8], salt: u64) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64 ^ salt;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Call ids as sent to OpenAI: each logged id as it is when it has at most
/// [`OPENAI_MAX_CALL_ID`] characters, else its first 23 characters, `_` and 16 hex digits of
/// a hash of the whole id (40 characters). Ids are given in history order; an id's sent
/// form depends only on the ids before it, so a prefix renders the same whatever follows.
/// A sent id equal to one already taken (a hash collision, or a logged short id of the same
/// shape) is hashed again with the next salt until it is unique, so two logged ids never
/// share a sent one; [`RenderedRequest::logged_call_id`] maps a sent id back.
#[derive(Debug, Default)]
pub(crate) struct CallIds {
    taken: std::collections::BTreeMap<String, ToolCallId>,
    by_logged: std::collections::BTreeMap<ToolCallId, String>,
    pub(crate) replaced: Vec<(String, ToolCallId)>,
}

impl CallIds {
    /// The sent form of `id`.
    pub(crate) fn sent(&mut self, id: &ToolCallId) -> String {
        if let Some(sent) = self.by_logged.get(id) {
            return sent.clone();
        }
        let text = id.as_str();
        let mut sent = text.to_owned();
        let mut salt = 0u64;
        let fits = text.chars().count() <= OPENAI_MAX_CALL_ID;
        while (!fits && salt == 0) || self.taken.contains_key(&sent) {
            let head: String = text.chars().take(OPENAI_MAX_CALL_ID - 17).collect();
            sent = format!("{head}_{:016x}", fnv1a(text.as_bytes(), salt));
            salt += 1;
        }
        if sent != text {
            self.replaced.push((sent.clone(), id.clone()));
        }
        self.taken.insert(sent.clone(), id.clone());
        self.by_logged.insert(id.clone(), sent.clone());
        sent
    }
}

/// Refuses extra options that collide with fields the renderer writes.
pub(crate) fn check_extra(extra: &JsonObject, reserved: &[&str]) -> Result<(), RenderError> {
    match extra.keys().find(|key| reserved.contains(&key.as_str())) {
        Some(key) => Err(RenderError::ReservedOption { key: key.clone() }),
        None => Ok(()),
    }
}

/// Writes `extra` members (sorted by key), each preceded by a comma.
pub(crate) fn write_extra(out: &mut Out, extra: &JsonObject) {
    let mut keys: Vec<&String> = extra.keys().collect();
    keys.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for key in keys {
        out.push(",");
        out.str(key);
        out.push(":");
        if let Some(value) = extra.get(key) {
            out.value(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_names() {
        assert!(provider_name_ok("API-get-user"));
        assert!(provider_name_ok(&"a".repeat(64)));
        assert!(!provider_name_ok(&"a".repeat(65)));
        assert!(!provider_name_ok(""));
        assert!(!provider_name_ok("browser.navigate"));
        assert!(!provider_name_ok("tööl"));
    }

    #[test]
    fn call_names_are_sanitised_into_the_provider_alphabet() {
        for (name, sent) in [
            ("read_file", "read_file".to_owned()),
            (
                "github.list_issues",
                "invalid_github_list_issues".to_owned(),
            ),
            (
                "multi_tool_use.parallel",
                "invalid_multi_tool_use_parallel".to_owned(),
            ),
            ("tööl", "invalid_t__l".to_owned()),
            ("a b/c:d", "invalid_a_b_c_d".to_owned()),
            ("", "invalid_".to_owned()),
            (&"x.".repeat(40), format!("invalid_{}", "x_".repeat(28))),
        ] {
            let out = call_name(name);
            assert_eq!(out, sent, "{name:?}");
            assert!(provider_name_ok(&out), "{out:?}");
        }
    }

    #[test]
    fn long_call_ids_map_to_unique_short_ones_and_back() {
        let id = |text: &str| ToolCallId::new(text).unwrap();
        let long = id(&format!("call_{}", "a".repeat(60)));
        let mut ids = CallIds::default();
        let sent = ids.sent(&long);
        assert_eq!(sent.chars().count(), OPENAI_MAX_CALL_ID);
        assert!(sent.starts_with("call_aaaa"), "{sent}");
        assert_eq!(ids.sent(&long), sent, "the same id maps the same way");
        assert_eq!(ids.sent(&id("short_1")), "short_1", "short ids are kept");
        // A logged short id equal to a sent form already taken is mapped too.
        let clash = id(&sent);
        let other = ids.sent(&clash);
        assert_ne!(other, sent);
        assert_eq!(other.chars().count(), OPENAI_MAX_CALL_ID);
        // Two long ids with the same first 23 characters differ by their hash.
        let twin = id(&format!("call_{}b", "a".repeat(59)));
        assert_ne!(ids.sent(&twin), sent);
        let pairs: Vec<(String, String)> = ids
            .replaced
            .iter()
            .map(|(s, l)| (s.clone(), l.to_string()))
            .collect();
        assert_eq!(pairs.len(), 3, "{pairs:?}");
        let unique: std::collections::BTreeSet<&String> = pairs.iter().map(|(s, _)| s).collect();
        assert_eq!(unique.len(), 3);
        // Deterministic across runs: FNV-1a is fixed by its definition.
        let mut again = CallIds::default();
        assert_eq!(again.sent(&long), sent);
    }

    #[test]
    fn blank_is_empty_or_whitespace() {
        for text in [
            "",
            " ",
            "\n\n",
            "\t\r\n",
            "\u{a0}\u{2003}",
            "\u{1c}\u{1f}",
            "\u{feff}",
        ] {
            assert!(is_blank(text), "{text:?}");
        }
        for text in ["a", " .", "\n\nx"] {
            assert!(!is_blank(text), "{text:?}");
        }
    }
}
