//! The model's view of an elided success (head, ellipsis line, tail, guidance) and of a
//! failure (its top, hard-truncated).

use std::borrow::Cow;
use std::fmt::Write as _;

use psych_types::RecordHandle;
use serde::{Deserialize, Serialize};

/// The guidance after a preview, before the handle. Fixed bytes: once the turn is over the
/// preview sits in the cached prompt prefix, so it must never change between calls.
const GUIDANCE_HEAD: &str = "[Elided tool result: only its beginning and end are shown above. \
The full result is kept. To read the rest, call read_tool_output with handle \"";
/// The guidance after the handle, before the handle again in the grep example.
const GUIDANCE_MIDDLE: &str = "\" and the offset named above (add limit for longer pages); \
to search it, add grep with a literal text, as in {\"handle\": \"";
/// The guidance after the grep example's handle.
const GUIDANCE_TAIL: &str = "\", \"grep\": \"error\"}.]";

/// How far, in characters, a preview's head or tail cut moves to fall on a line break:
/// at most this, and at most half the part asked for.
pub const LINE_SLACK: usize = 100;

/// How much of an elided or failed result the model sees.
///
/// Counts are in characters (Unicode scalar values). A cut never splits a UTF-8 sequence,
/// and it is moved to keep together what cheaply can be: a character with the combining
/// marks, variation selectors, emoji modifiers and tags that follow it, both sides of a
/// zero-width joiner, and `\r\n`. So a part may be a few characters longer than asked.
///
/// Built like [`Thresholds`](crate::Thresholds): [`PreviewConfig::builder`] (every count
/// starting at its default), read through its getters. Its serde form is
/// `{"head_chars", "tail_chars", "failure_chars"}`, each optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PreviewConfig {
    head_chars: usize,
    tail_chars: usize,
    failure_chars: usize,
}

/// Builds a [`PreviewConfig`]; every count starts at its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreviewConfigBuilder {
    config: PreviewConfig,
}

impl PreviewConfigBuilder {
    /// Characters shown from the start of an elided success. Zero shows none. Default:
    /// [`PreviewConfig::DEFAULT_HEAD_CHARS`].
    #[must_use]
    pub fn head_chars(mut self, chars: usize) -> Self {
        self.config.head_chars = chars;
        self
    }

    /// Characters shown from the end of an elided success. Zero shows none. Default:
    /// [`PreviewConfig::DEFAULT_TAIL_CHARS`].
    #[must_use]
    pub fn tail_chars(mut self, chars: usize) -> Self {
        self.config.tail_chars = chars;
        self
    }

    /// Characters kept from the start of a failure. Zero keeps none: the model then sees
    /// only that the call failed. Default: [`PreviewConfig::DEFAULT_FAILURE_CHARS`].
    #[must_use]
    pub fn failure_chars(mut self, chars: usize) -> Self {
        self.config.failure_chars = chars;
        self
    }

    /// The configuration. Every count is valid (zero included), so this cannot fail.
    pub fn build(self) -> PreviewConfig {
        self.config
    }
}

impl PreviewConfig {
    /// A builder starting from the defaults.
    pub fn builder() -> PreviewConfigBuilder {
        PreviewConfigBuilder {
            config: Self::default(),
        }
    }

    /// Characters shown from the start of an elided success.
    pub fn head_chars(&self) -> usize {
        self.head_chars
    }

    /// Characters shown from the end of an elided success.
    pub fn tail_chars(&self) -> usize {
        self.tail_chars
    }

    /// Characters kept from the start of a failure.
    pub fn failure_chars(&self) -> usize {
        self.failure_chars
    }

    /// Default characters from the head of a preview.
    pub const DEFAULT_HEAD_CHARS: usize = 1_500;
    /// Default characters from the tail of a preview.
    pub const DEFAULT_TAIL_CHARS: usize = 500;
    /// Default characters kept of a failure.
    pub const DEFAULT_FAILURE_CHARS: usize = 400;

    /// The preview of an elided success: the head, a marker line naming the omitted lines
    /// and the `read_tool_output` offset (and, when the head ends within a line, the byte
    /// of that line) that continues after the head, the tail, and
    /// guidance naming `read_tool_output`, `handle` and how to grep.
    ///
    /// The head ends at a line break when one lies within [`LINE_SLACK`] characters of its
    /// cut (and within half of `head_chars`), the tail starts after one likewise. The text
    /// comes back unchanged (borrowed) when the head and tail would overlap or meet, and
    /// whenever the preview would not be shorter than the text, so a preview never
    /// lengthens or truncates something already small.
    ///
    /// Only the first [`PreviewConfig::head_window`] and last
    /// [`PreviewConfig::tail_window`] bytes of `text`, and its count of line breaks, decide
    /// the preview: a store can make the same preview from those without reading the rest.
    pub fn preview<'a>(&self, text: &'a str, handle: &RecordHandle) -> Cow<'a, str> {
        let windows = self.windows_of(text);
        match self.preview_windows(&windows, handle) {
            Some(preview) => Cow::Owned(preview),
            None => Cow::Borrowed(text),
        }
    }

    /// Bytes from the start of a text that decide a preview's head.
    pub fn head_window(&self) -> usize {
        window_bytes(self.head_chars)
    }

    /// Bytes from the end of a text that decide a preview's tail.
    pub fn tail_window(&self) -> usize {
        window_bytes(self.tail_chars)
    }

    /// Bytes from the start of a failure's text that decide its truncation.
    pub fn failure_window(&self) -> usize {
        self.failure_chars
            .saturating_add(MAX_CLUSTER_MOVE + 2)
            .saturating_mul(4)
    }

    /// The windows of a whole text, as a store reading only them would get them.
    pub(crate) fn windows_of<'t>(&self, text: &'t str) -> Windows<'t> {
        let (head_window, tail_window) = (self.head_window(), self.tail_window());
        let breaks = psych_types::count_line_breaks(text.as_bytes());
        if text.len() <= head_window.saturating_add(tail_window) {
            return Windows {
                head: text,
                tail: text,
                tail_at: 0,
                len: text.len() as u64,
                breaks,
            };
        }
        let head_end = text.floor_char_boundary(head_window);
        let tail_at = text.ceil_char_boundary(text.len() - tail_window);
        Windows {
            head: &text[..head_end],
            tail: &text[tail_at..],
            tail_at: tail_at as u64,
            len: text.len() as u64,
            breaks,
        }
    }

    /// The preview made from a text's windows, or `None` when the text is to be left as
    /// it is.
    pub(crate) fn preview_windows(
        &self,
        windows: &Windows<'_>,
        handle: &RecordHandle,
    ) -> Option<String> {
        let Windows {
            head,
            tail,
            tail_at,
            len,
            breaks,
        } = *windows;
        let head_cut = forward_boundary(head, nth_char_start(head, self.head_chars));
        let head_end = align_head(head, head_cut, slack(self.head_chars));
        let tail_cut = backward_boundary(tail, nth_char_from_end(tail, self.tail_chars));
        let tail_rel = align_tail(tail, tail_cut, slack(self.tail_chars));
        let tail_start = tail_at + tail_rel as u64;
        if head_end as u64 >= tail_start {
            return None;
        }
        let (head, tail) = (&head[..head_end], &tail[tail_rel..]);
        // Lines counted from 0, as the reader's offset counts them: the first omitted line
        // is the one holding byte `head_end`, the last the one holding byte `tail_start - 1`.
        let first = psych_types::count_line_breaks(head.as_bytes());
        let before_tail = breaks.saturating_sub(psych_types::count_line_breaks(tail.as_bytes()));
        let last = if windows.tail[..tail_rel].ends_with('\n') {
            before_tail.saturating_sub(1)
        } else {
            before_tail
        };
        let mut out = String::with_capacity(head.len() + tail.len() + 480);
        out.push_str(head);
        if !head.is_empty() && !head.ends_with('\n') {
            out.push('\n');
        }
        let lines = if first == last {
            format!("line {}", first + 1)
        } else {
            // Saturating: the line count comes from the stored summary, which a damaged
            // log may overstate.
            format!(
                "lines {}-{}",
                first.saturating_add(1),
                last.max(first).saturating_add(1)
            )
        };
        // Writing into a String cannot fail.
        let _ = write!(
            out,
            "[… {lines} omitted (bytes {head_end}..{tail_start} of {len}); read on with \
             read_tool_output offset={first}"
        );
        // Where the omitted part starts within line `first`, as the reader's `byte` counts.
        let byte = head.len() - head.rfind('\n').map_or(0, |at| at + 1);
        if byte > 0 {
            let _ = write!(out, " byte={byte}");
        }
        out.push_str(" …]\n");
        out.push_str(tail);
        if !tail.is_empty() && !tail.ends_with('\n') {
            out.push('\n');
        }
        out.push('\n');
        out.push_str(GUIDANCE_HEAD);
        let _ = write!(out, "{handle}");
        out.push_str(GUIDANCE_MIDDLE);
        let _ = write!(out, "{handle}");
        out.push_str(GUIDANCE_TAIL);
        if out.len() as u64 >= len {
            return None;
        }
        Some(out)
    }

    /// A failure's text, hard-truncated to its first [`PreviewConfig::failure_chars`]
    /// characters: no marker, no guidance. Unchanged when it is no longer than that.
    pub fn truncate_failure<'a>(&self, text: &'a str) -> &'a str {
        let end = forward_boundary(text, nth_char_start(text, self.failure_chars));
        &text[..end]
    }
}

impl Default for PreviewConfig {
    fn default() -> Self {
        Self {
            head_chars: Self::DEFAULT_HEAD_CHARS,
            tail_chars: Self::DEFAULT_TAIL_CHARS,
            failure_chars: Self::DEFAULT_FAILURE_CHARS,
        }
    }
}

/// What decides a preview of a text: its first and last bytes (each cut to whole
/// characters), its length and its line breaks. For a text no longer than both windows,
/// both are the whole text and `tail_at` is 0.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Windows<'t> {
    /// The text from byte 0.
    pub(crate) head: &'t str,
    /// The text's end, from byte `tail_at`.
    pub(crate) tail: &'t str,
    /// Where `tail` starts in the text.
    pub(crate) tail_at: u64,
    /// The text's length in bytes.
    pub(crate) len: u64,
    /// Line breaks in the whole text.
    pub(crate) breaks: u64,
}

/// Bytes that surely hold `chars` characters plus every move a cut may make.
fn window_bytes(chars: usize) -> usize {
    chars
        .saturating_add(MAX_CLUSTER_MOVE + LINE_SLACK + 2)
        .saturating_mul(4)
}

/// How far a cut of a part of `chars` characters may move to a line break.
fn slack(chars: usize) -> usize {
    LINE_SLACK.min(chars / 2)
}

/// Moves the head's end `at` to just after a line break: the last one within `slack`
/// characters before it, else the first within `slack` characters after it.
fn align_head(text: &str, at: usize, slack: usize) -> usize {
    if at == 0 || text[..at].ends_with('\n') {
        return at;
    }
    if let Some((i, _)) = text[..at]
        .char_indices()
        .rev()
        .take(slack)
        .find(|&(_, c)| c == '\n')
    {
        return i + 1;
    }
    text[at..]
        .char_indices()
        .take(slack)
        .find(|&(_, c)| c == '\n')
        .map_or(at, |(i, _)| at + i + 1)
}

/// Moves the tail's start `at` to just after a line break: the first within `slack`
/// characters after it (keeping the tail non-empty), else the last within `slack`
/// characters before it.
fn align_tail(text: &str, at: usize, slack: usize) -> usize {
    if at == 0 || text[..at].ends_with('\n') {
        return at;
    }
    if let Some((i, _)) = text[at..]
        .char_indices()
        .take(slack)
        .find(|&(i, c)| c == '\n' && at + i + 1 < text.len())
    {
        return at + i + 1;
    }
    text[..at]
        .char_indices()
        .rev()
        .take(slack)
        .find(|&(_, c)| c == '\n')
        .map_or(at, |(i, _)| i + 1)
}

/// Byte offset of the start of character `n` (the end of the first `n` characters), or
/// the text's length if it has no more than `n`.
fn nth_char_start(text: &str, n: usize) -> usize {
    text.char_indices().nth(n).map_or(text.len(), |(at, _)| at)
}

/// Byte offset where the last `n` characters begin (0 if the text has no more than `n`).
fn nth_char_from_end(text: &str, n: usize) -> usize {
    if n == 0 {
        return text.len();
    }
    text.char_indices().rev().nth(n - 1).map_or(0, |(at, _)| at)
}

/// Whether `c` attaches to the character before it (a cheap subset of grapheme Extend:
/// combining marks, variation selectors, emoji modifiers and tags, and the joiner).
fn attaches(c: char) -> bool {
    matches!(
        c,
        '\u{0300}'..='\u{036F}'
            | '\u{1AB0}'..='\u{1AFF}'
            | '\u{1DC0}'..='\u{1DFF}'
            | '\u{200D}'
            | '\u{20D0}'..='\u{20FF}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FE20}'..='\u{FE2F}'
            | '\u{1F3FB}'..='\u{1F3FF}'
            | '\u{E0020}'..='\u{E007F}'
            | '\u{E0100}'..='\u{E01EF}'
    )
}

/// Whether a cut between `before` and `after` would split what should stay together.
fn splits(before: char, after: char) -> bool {
    attaches(after) || before == '\u{200D}' || (before == '\r' && after == '\n')
}

/// How many characters a cut may move to keep a cluster together: Unicode's stream-safe
/// limit of 30 non-starters, plus a little. Past it the text is hostile or degenerate (a
/// letter with 500,000 combining marks) and the cut stays where it was asked, on a
/// character boundary, so a preview or a failure stays bounded whatever it holds.
const MAX_CLUSTER_MOVE: usize = 32;

/// Moves a cut at char boundary `at` forward until it splits nothing, by at most
/// [`MAX_CLUSTER_MOVE`] characters.
fn forward_boundary(text: &str, start: usize) -> usize {
    let mut at = start;
    for _ in 0..=MAX_CLUSTER_MOVE {
        match (text[..at].chars().next_back(), text[at..].chars().next()) {
            (Some(before), Some(after)) if splits(before, after) => at += after.len_utf8(),
            _ => return at,
        }
    }
    start
}

/// Moves a cut at char boundary `at` backward until it splits nothing, by at most
/// [`MAX_CLUSTER_MOVE`] characters.
fn backward_boundary(text: &str, start: usize) -> usize {
    let mut at = start;
    for _ in 0..=MAX_CLUSTER_MOVE {
        match (text[..at].chars().next_back(), text[at..].chars().next()) {
            (Some(before), Some(after)) if splits(before, after) => at -= before.len_utf8(),
            _ => return at,
        }
    }
    start
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::RunId;

    fn handle() -> RecordHandle {
        RecordHandle::new(RunId::new("run-7").unwrap(), 42)
    }

    #[test]
    fn hostile_clusters_do_not_unbound_the_cut() {
        // One letter carrying 500,000 combining marks (1 MB), and a run of joiners.
        let marks = format!("a{}", "\u{301}".repeat(500_000));
        let joiners = format!("x{}y", "\u{200D}".repeat(300_000));
        let config = config(10, 10);
        for text in [&marks, &joiners] {
            let failure = config.truncate_failure(text);
            assert!(
                failure.chars().count() <= 5 + MAX_CLUSTER_MOVE,
                "{}",
                failure.len()
            );
            let preview = config.preview(text, &handle());
            assert!(
                matches!(preview, Cow::Owned(_)),
                "a 1 MB cluster must be elided"
            );
            assert!(preview.len() < 2_000, "{}", preview.len());
        }
        // An ordinary cluster is still kept whole: e + combining acute at the cut.
        let text = format!("{}e\u{301}{}", "a".repeat(4), "b".repeat(50));
        assert_eq!(
            config.truncate_failure(&text),
            format!("{}e\u{301}", "a".repeat(4))
        );
    }

    /// A stored summary may overstate a text's line breaks (a damaged or crafted log):
    /// the preview's line label saturates rather than overflow.
    #[test]
    fn an_overstated_line_count_does_not_overflow_the_label() {
        let config = config(10, 10);
        let text = "x".repeat(10_000);
        let mut windows = config.windows_of(&text);
        windows.breaks = u64::MAX;
        let preview = config.preview_windows(&windows, &handle()).unwrap();
        assert!(preview.contains(&format!("-{}", u64::MAX)), "{preview}");
    }

    #[test]
    fn guidance_names_the_reader_tool_of_psych_types() {
        let call = format!("call {} with handle", psych_types::READ_TOOL_OUTPUT);
        assert!(GUIDANCE_HEAD.contains(&call), "{GUIDANCE_HEAD}");
    }

    fn config(head: usize, tail: usize) -> PreviewConfig {
        PreviewConfig::builder()
            .head_chars(head)
            .tail_chars(tail)
            .failure_chars(5)
            .build()
    }

    #[test]
    fn preview_has_head_ellipsis_tail_and_guidance() {
        let text = "line one\n".repeat(100);
        let out = config(12, 9).preview(&text, &handle());
        // The head's cut (12 characters) moves back to the line break within its slack.
        assert_eq!(
            out,
            "line one\n\
             [… lines 2-99 omitted (bytes 9..891 of 900); read on with read_tool_output \
             offset=1 …]\n\
             line one\n\n\
             [Elided tool result: only its beginning and end are shown above. The full \
             result is kept. To read the rest, call read_tool_output with handle \
             \"run-7:42\" and the offset named above (add limit for longer pages); to \
             search it, add grep with a literal text, as in {\"handle\": \"run-7:42\", \
             \"grep\": \"error\"}.]"
        );
    }

    #[test]
    fn cuts_move_to_line_breaks_within_the_slack_only() {
        // Lines of 30 characters: a head of 40 ends after line 1 (10 back, within 20).
        let text = format!("{}\n", "x".repeat(29)).repeat(40);
        let out = config(40, 40).preview(&text, &handle());
        assert!(
            out.starts_with(&format!("{}\n[… lines 2-", "x".repeat(29))),
            "{out}"
        );
        assert!(out.contains("offset=1 …]\n"), "{out}");
        // The tail starts at a line start: after the marker, one whole line of 29 x.
        assert!(
            out.contains(&format!("…]\n{}\n\n[Elided", "x".repeat(29))),
            "{out}"
        );
        // No line break anywhere: the cuts stay where the counts put them.
        let flat = "y".repeat(2_000);
        let out = config(40, 40).preview(&flat, &handle());
        assert!(
            out.starts_with(&format!(
                "{}\n[… line 1 omitted (bytes 40..1960 of 2000); read on with read_tool_output \
                 offset=0 byte=40 …]",
                "y".repeat(40)
            )),
            "{out}"
        );
    }

    #[test]
    fn a_long_text_is_previewed_from_its_windows() {
        // Text past both windows: the preview is made from the windows alone.
        let c = config(30, 30);
        let text = "é line\n".repeat(5_000);
        let windows = c.windows_of(&text);
        assert!(windows.head.len() <= c.head_window() && windows.tail.len() <= c.tail_window());
        assert_eq!(windows.breaks, 5_000);
        let out = c.preview(&text, &handle());
        assert!(
            out.starts_with("é line\né line\né line\né line\n[… lines 5-4996 omitted"),
            "{out}"
        );
    }

    #[test]
    fn small_or_overlapping_text_is_unchanged() {
        let c = config(10, 10);
        assert!(matches!(
            c.preview("short", &handle()),
            Cow::Borrowed("short")
        ));
        let exactly = "x".repeat(20);
        assert_eq!(c.preview(&exactly, &handle()), exactly.as_str());
        // Not overlapping, but the preview would not be shorter.
        let near = "x".repeat(200);
        assert_eq!(c.preview(&near, &handle()), near.as_str());
    }

    #[test]
    fn cuts_keep_characters_and_clusters_whole() {
        // "e" + combining acute at the head cut; a ZWJ family emoji at the tail cut.
        let text = format!("ab e\u{301}{}👩\u{200D}👧 end", "z".repeat(600));
        let c = config(4, 5);
        let out = c.preview(&text, &handle());
        assert!(out.starts_with("ab e\u{301}\n[…"), "{out}");
        assert!(out.contains("…]\n👩\u{200D}👧 end\n"), "{out}");
        assert_eq!(c.truncate_failure("ab e\u{301}zz"), "ab e\u{301}");
        assert_eq!(c.truncate_failure("日本語のテキストです"), "日本語のテ");
        assert_eq!(c.truncate_failure("a\r\nb"), "a\r\nb");
        assert_eq!(config(0, 0).truncate_failure(""), "");
        let crlf = PreviewConfig::builder()
            .head_chars(0)
            .tail_chars(0)
            .failure_chars(1)
            .build();
        assert_eq!(crlf.truncate_failure("\r\nxyz"), "\r\n");
    }

    #[test]
    fn zero_head_or_tail_shows_only_the_other_side() {
        let text = "0123456789".repeat(60);
        let tail_only = config(0, 10).preview(&text, &handle());
        assert!(
            tail_only.starts_with("[… line 1 omitted (bytes 0..590 of 600); read on with read_tool_output offset=0 …]\n0123456789\n"),
            "{tail_only}"
        );
        let head_only = config(10, 0).preview(&text, &handle());
        assert!(
            head_only.starts_with("0123456789\n[… line 1 omitted (bytes 10..600"),
            "{head_only}"
        );
        // The head ends within line 1: the marker names the byte that reads on in it.
        assert!(
            head_only.contains("offset=0 byte=10 …]\n\n[Elided"),
            "{head_only}"
        );
    }
}
