//! The public request types: the rendered request with its layout for cache accounting,
//! the provider and part tags of its spans, and the render errors.

use std::borrow::Cow;
use std::ops::Range;

use psych_types::{ToolCallId, json};

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
    /// least one message, and Chat Completions at least one of any role (so there, only
    /// with no system text either).
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
    /// characters, see [`OPENAI_MAX_CALL_ID`](crate::OPENAI_MAX_CALL_ID)). Empty when every
    /// id was sent as logged.
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
