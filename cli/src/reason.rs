//! A failed server's reason in one line, for the budget table and the deferred line the
//! model reads; the full reason (every stderr line psych-mcp kept) stays in `--json`.

/// How psych-mcp introduces the stderr tail of a failed server (multi-line in its errors,
/// `a | b` joined in a reachability reason).
const STDERR_MARK: &str = "; its last stderr lines:";

/// The longest one-line reason, in characters.
pub(crate) const REASON_CHARS: usize = 160;

/// `reason` in one line of at most [`REASON_CHARS`] characters: without the `MCP server
/// "name": ` prefix (the report names the server already), whitespace collapsed, and when
/// psych-mcp appended the server's last stderr lines, the most telling of them as
/// `(stderr: …)` instead of the whole tail.
pub(crate) fn one_line(server: &str, reason: &str) -> String {
    let reason = reason
        .strip_prefix(&format!("MCP server \"{server}\": "))
        .unwrap_or(reason);
    let (head, tail) = match reason.split_once(STDERR_MARK) {
        Some((head, tail)) => (head, Some(tail)),
        None => (reason, None),
    };
    let mut line = collapse(head);
    let telling = tail.and_then(|tail| {
        let lines: Vec<&str> = tail
            .split(['\n', '|'])
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        lines
            .iter()
            .rev()
            // The last line that says what went wrong (disclosure's rule, the one the
            // deferred line uses), else the last line.
            .find(|l| psych_disclosure::is_telling(l))
            .or(lines.last())
            .copied()
    });
    if let Some(telling) = telling {
        line = format!("{line} (stderr: {})", collapse(telling));
    }
    crate::truncate(&line, REASON_CHARS)
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `error` and each of its sources, `: ` between them: a typed error as one line.
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    psych_types::error_chain(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_tail_is_kept_as_its_telling_line() {
        let reason = "MCP server \"quits\": initialize failed: the server process exited with \
                      status 9; its last stderr lines:\n  quits: out of cheese\n  \
                      psych-test-server: exiting at once with status 9, as asked";
        assert_eq!(
            one_line("quits", reason),
            "initialize failed: the server process exited with status 9 (stderr: \
             psych-test-server: exiting at once with status 9, as asked)"
        );
        let traceback = "MCP server \"py\": initialize failed: the server process exited with \
                         status 1; its last stderr lines:\n  Traceback (most recent call last):\n  \
                         File \"server.py\", line 3, in <module>\n  \
                         ModuleNotFoundError: No module named 'mcp'\n  done";
        assert_eq!(
            one_line("py", traceback),
            "initialize failed: the server process exited with status 1 (stderr: \
             ModuleNotFoundError: No module named 'mcp')"
        );
        // A reachability reason joins the lines with `|`.
        let joined = "the server process exited with status 2; its last stderr lines: \
                      usage: fs --root DIR | error: missing --root";
        assert_eq!(
            one_line("fs", joined),
            "the server process exited with status 2 (stderr: error: missing --root)"
        );
    }

    #[test]
    fn a_reason_without_stderr_is_collapsed_and_capped() {
        let missing = "MCP server \"missing\": cannot start \"/nonexistent/x\": No such file \
                       or directory (os error 2)";
        assert_eq!(
            one_line("missing", missing),
            "cannot start \"/nonexistent/x\": No such file or directory (os error 2)"
        );
        let long = format!("listing failed:\n{}", "word ".repeat(100));
        let line = one_line("s", &long);
        assert_eq!(line.chars().count(), REASON_CHARS);
        assert!(line.starts_with("listing failed: word word"), "{line}");
        assert!(line.ends_with('…') && !line.contains('\n'), "{line}");
    }
}
