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
/// The guidance after the handle.
const GUIDANCE_TAIL: &str = "\", paging with offset and limit, or searching with grep.]";

/// How much of an elided or failed result the model sees.
///
/// Counts are in characters (Unicode scalar values). A cut never splits a UTF-8 sequence,
/// and it is moved to keep together what cheaply can be: a character with the combining
/// marks, variation selectors, emoji modifiers and tags that follow it, both sides of a
/// zero-width joiner, and `\r\n`. So a part may be a few characters longer than asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PreviewConfig {
    /// Characters shown from the start of an elided success. Zero shows none.
    pub head_chars: usize,
    /// Characters shown from the end of an elided success. Zero shows none.
    pub tail_chars: usize,
    /// Characters kept from the start of a failure. Zero keeps none: the model then sees
    /// only that the call failed.
    pub failure_chars: usize,
}

impl PreviewConfig {
    /// Default characters from the head of a preview.
    pub const DEFAULT_HEAD_CHARS: usize = 1_500;
    /// Default characters from the tail of a preview.
    pub const DEFAULT_TAIL_CHARS: usize = 500;
    /// Default characters kept of a failure.
    pub const DEFAULT_FAILURE_CHARS: usize = 400;

    /// The preview of an elided success: the head, an ellipsis line saying how much is
    /// omitted, the tail, and guidance naming `read_tool_output` and `handle`.
    ///
    /// The text comes back unchanged (borrowed) when the head and tail would overlap or
    /// meet, and whenever the preview would not be shorter than the text, so a preview
    /// never lengthens or truncates something already small.
    pub fn preview<'a>(&self, text: &'a str, handle: &RecordHandle) -> Cow<'a, str> {
        let head_end = forward_boundary(text, nth_char_start(text, self.head_chars));
        let tail_start = backward_boundary(text, nth_char_from_end(text, self.tail_chars));
        if head_end >= tail_start {
            return Cow::Borrowed(text);
        }
        let (head, middle, tail) = (
            &text[..head_end],
            &text[head_end..tail_start],
            &text[tail_start..],
        );
        let omitted_chars = middle.chars().count();
        let omitted_lines = middle.bytes().filter(|&b| b == b'\n').count();
        let mut out = String::with_capacity(head.len() + tail.len() + 320);
        out.push_str(head);
        if !head.is_empty() && !head.ends_with('\n') {
            out.push('\n');
        }
        // Writing into a String cannot fail.
        let _ = writeln!(
            out,
            "[… {omitted_chars} characters ({omitted_lines} line breaks) omitted, \
             bytes {head_end}..{tail_start} of {} …]",
            text.len()
        );
        out.push_str(tail);
        if !tail.is_empty() && !tail.ends_with('\n') {
            out.push('\n');
        }
        out.push('\n');
        out.push_str(GUIDANCE_HEAD);
        let _ = write!(out, "{handle}");
        out.push_str(GUIDANCE_TAIL);
        if out.len() >= text.len() {
            return Cow::Borrowed(text);
        }
        Cow::Owned(out)
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

    #[test]
    fn guidance_names_the_reader_tool_of_psych_types() {
        let call = format!("call {} with handle", psych_types::READ_TOOL_OUTPUT);
        assert!(GUIDANCE_HEAD.contains(&call), "{GUIDANCE_HEAD}");
    }

    fn config(head: usize, tail: usize) -> PreviewConfig {
        PreviewConfig {
            head_chars: head,
            tail_chars: tail,
            failure_chars: 5,
        }
    }

    #[test]
    fn preview_has_head_ellipsis_tail_and_guidance() {
        let text = "line one\n".repeat(100);
        let out = config(12, 9).preview(&text, &handle());
        assert_eq!(
            out,
            "line one\nlin\n\
             [… 879 characters (98 line breaks) omitted, bytes 12..891 of 900 …]\n\
             line one\n\n\
             [Elided tool result: only its beginning and end are shown above. The full \
             result is kept. To read the rest, call read_tool_output with handle \
             \"run-7:42\", paging with offset and limit, or searching with grep.]"
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
        let crlf = PreviewConfig {
            failure_chars: 1,
            ..config(0, 0)
        };
        assert_eq!(crlf.truncate_failure("\r\nxyz"), "\r\n");
    }

    #[test]
    fn zero_head_or_tail_shows_only_the_other_side() {
        let text = "0123456789".repeat(60);
        let tail_only = config(0, 10).preview(&text, &handle());
        assert!(tail_only.starts_with("[… 590 characters"), "{tail_only}");
        let head_only = config(10, 0).preview(&text, &handle());
        assert!(head_only.starts_with("0123456789\n[… 590"), "{head_only}");
        assert!(head_only.contains("of 600 …]\n\n[Elided"), "{head_only}");
    }
}
