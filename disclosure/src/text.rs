//! Small text helpers shared by the deferred lines, listings, the facade index and the
//! orientation payload: one-line summaries and caps with an explicit marker.

/// What a capped text ends with, so a reader can tell a cut from an ending.
pub(crate) const TRUNCATION_MARKER: &str = "…[truncated]";

/// `text` cut to at most `max_chars` characters. When it is cut, it ends with `marker`, and
/// the marker is counted in the cap. A `max_chars` smaller than the marker yields the marker
/// cut to `max_chars` characters.
pub(crate) fn cap_chars(text: &str, max_chars: usize, marker: &str) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let marker_chars = marker.chars().count();
    let keep = max_chars.saturating_sub(marker_chars);
    let mut out: String = text.chars().take(keep).collect();
    // A cut lands after trimmed whitespace so the marker is not preceded by a space run.
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    out.extend(marker.chars().take(max_chars - out.chars().count()));
    out
}

/// The first non-empty line of `text`, with runs of whitespace folded to one space.
pub(crate) fn first_line(text: &str) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .unwrap_or("");
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A one-line summary of a tool: its description's first line, else its title, else empty.
pub(crate) fn tool_summary(tool: &psych_types::ToolDefinition) -> String {
    let line = first_line(tool.description_or_empty());
    if !line.is_empty() {
        return line;
    }
    tool.title
        .as_deref()
        .or_else(|| tool.annotations.as_ref().and_then(|a| a.title.as_deref()))
        .map(first_line)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_unchanged() {
        assert_eq!(cap_chars("abc", 3, TRUNCATION_MARKER), "abc");
    }

    #[test]
    fn long_text_ends_with_the_marker_inside_the_cap() {
        let capped = cap_chars(&"é".repeat(300), 200, TRUNCATION_MARKER);
        assert_eq!(capped.chars().count(), 200);
        assert!(capped.ends_with(TRUNCATION_MARKER));
        let tiny = cap_chars("abcdefghijklmnopqrstuvwxyz", 4, TRUNCATION_MARKER);
        assert_eq!(tiny, "…[tr");
    }

    #[test]
    fn cuts_do_not_leave_trailing_spaces() {
        let capped = cap_chars("word word word word", 16, "…");
        assert_eq!(capped, "word word word…");
    }

    #[test]
    fn first_line_skips_blank_lines_and_folds_spaces() {
        assert_eq!(first_line("\n\n  Read   a\tfile \nmore"), "Read a file");
        assert_eq!(first_line(""), "");
    }
}
