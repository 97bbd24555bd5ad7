//! The writer every renderer writes a request with: the body and its layout (spans, block
//! ends, breakpoints, nested blocks) in cache-stream coordinates, and the caller's extra
//! request options.

use std::ops::Range;

use psych_types::{JsonObject, ToolCall, ToolCallId, json};

use super::substitute::write_arguments;
use super::{Part, Provider, RenderError, RenderedRequest, Span};

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
