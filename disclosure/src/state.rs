//! Why a server has no tools, from its catalogue health, said so that the reason survives:
//! on the deferred line (one capped line in the prompt) and in the answer a model gets
//! when it lists or calls the tools of such a server.
//!
//! Reasons come from whatever reported the failure (psych-mcp's errors, a lister of the
//! caller's own) and are often long: a clause naming the server again (`MCP server "gh"
//! is unreachable: MCP server "gh": …`), then the call and what went wrong, then the
//! server's last stderr lines, one per line (or joined with ` | `). Cut at a fixed width
//! from the front, the repeated clauses and the call eat the line and the telling stderr
//! line never shows. So the clauses that name the server again are dropped (the line
//! starts with its name already), and the most telling of the detail lines is kept.

use psych_types::{Reachability, ServerHealth, ServerId};
use serde::Serialize;

use crate::text::cap_chars;

/// The most characters of a failure's reason in an answer to the model (a listing or a
/// call of a server with no tools): the reason's lines joined, whole up to this.
pub const STATE_REASON_CHARS: usize = 1_000;

/// What a cut reason ends with.
const CUT: &str = "…";

/// Words that make a detail line (a stderr line) the telling one: the last line holding one
/// is kept (a Python traceback ends with its exception, a panic says `panicked`).
const TELLING: [&str; 12] = [
    "error",
    "panic",
    "fail",
    "fatal",
    "not found",
    "no such",
    "denied",
    "cannot",
    "can't",
    "exception",
    "invalid",
    "refused",
];

/// Whether `line` (one line of a failure's detail, such as a stderr line) says what went
/// wrong: it holds an error word (`error`, `panic`, `fail`, `not found`, `refused`, …). The
/// last such line of a stderr tail is the one worth showing when only one fits.
pub fn is_telling(line: &str) -> bool {
    let lower = line.to_lowercase();
    TELLING.iter().any(|word| lower.contains(word))
}

/// Why a server the Surface shows has no permitted tool, when it is not simply that the
/// grant permits none of its tools: from its catalogue health.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ServerState {
    /// No listing has succeeded yet, and none has failed.
    NotListedYet,
    /// Its last listing failed (and none succeeded since).
    ListingFailed {
        /// Why, as reported (see [`STATE_REASON_CHARS`]).
        reason: String,
    },
    /// Its connection is down.
    Unreachable {
        /// Why, as its connection reported (see [`STATE_REASON_CHARS`]).
        reason: String,
    },
}

impl std::fmt::Display for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotListedYet => f.write_str("not listed yet"),
            Self::ListingFailed { reason } => write!(f, "listing failed: {reason}"),
            Self::Unreachable { reason } => write!(f, "unreachable: {reason}"),
        }
    }
}

/// What a server's health says of why it has no tools, with the reason as `reason` shapes
/// it; `None` when it was listed and is reachable (its tools are simply not permitted).
fn state_with(
    health: Option<&ServerHealth>,
    reason: impl Fn(&str) -> String,
) -> Option<ServerState> {
    let Some(health) = health else {
        return Some(ServerState::NotListedYet);
    };
    if let Some(failure) = &health.last_error {
        return Some(ServerState::ListingFailed {
            reason: reason(&failure.message),
        });
    }
    if let Reachability::Unreachable { reason: why } = &health.reachability {
        return Some(ServerState::Unreachable {
            reason: reason(why),
        });
    }
    health
        .last_sync
        .is_none()
        .then_some(ServerState::NotListedYet)
}

/// The state of a server with no permitted tools, its reason whole (lines joined, at most
/// [`STATE_REASON_CHARS`]), for an answer to the model.
pub(crate) fn state(server: &ServerId, health: Option<&ServerHealth>) -> Option<ServerState> {
    state_with(health, |reason| whole_reason(server, reason))
}

/// The state on a deferred line: its reason in at most `max_chars`, the telling detail kept.
/// `"none permitted"` when the server was listed and is reachable.
pub(crate) fn line_state(
    server: &ServerId,
    health: Option<&ServerHealth>,
    max_chars: usize,
) -> String {
    // The reason's budget is what is left once the state's own words are written.
    let words = |state: &ServerState| match state {
        ServerState::NotListedYet => 0,
        ServerState::ListingFailed { .. } => "listing failed: ".len(),
        ServerState::Unreachable { .. } => "unreachable: ".len(),
    };
    let probe = state_with(health, |_| String::new());
    let Some(probe) = probe else {
        return "none permitted".into();
    };
    let budget = max_chars.saturating_sub(words(&probe));
    state_with(health, |reason| short_reason(server, reason, budget))
        .map(|state| state.to_string())
        .unwrap_or_default()
}

/// A server's state for the orientation payload: `unreachable: ` and why when its
/// connection is down; else, for a server with no tools because it could not be listed,
/// why ([`ServerState`]); else `reachable` or `unknown`. The reason whole (lines joined)
/// when `max_chars` is `None`, else the state in at most `max_chars` with the telling
/// detail kept.
pub(crate) fn summary(
    server: &ServerId,
    health: Option<&ServerHealth>,
    no_tools: bool,
    max_chars: Option<usize>,
) -> String {
    let reason = |words: usize, reason: &str| match max_chars {
        None => whole_reason(server, reason),
        Some(max) => short_reason(server, reason, max.saturating_sub(words)),
    };
    if let Some(Reachability::Unreachable { reason: why }) = health.map(|h| &h.reachability) {
        return format!("unreachable: {}", reason("unreachable: ".len(), why));
    }
    if no_tools && let Some(probe) = state_with(health, |_| String::new()) {
        let words = probe.to_string().chars().count();
        return state_with(health, |why| reason(words, why))
            .map(|state| state.to_string())
            .unwrap_or_default();
    }
    match health.map(|h| &h.reachability) {
        Some(Reachability::Reachable) => "reachable".to_owned(),
        _ => "unknown".to_owned(),
    }
}

/// The reason's lines (a line break or ` | ` separates them), whitespace folded, empty
/// lines dropped, the leading clauses that name `server` again removed from the first.
fn reason_lines(server: &ServerId, reason: &str) -> Vec<String> {
    let mut lines: Vec<String> = reason
        .split('\n')
        .flat_map(|line| line.split(" | "))
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|line| !line.is_empty())
        .collect();
    if let Some(first) = lines.first_mut() {
        *first = without_server_clauses(server, first).to_owned();
        if first.is_empty() {
            lines.remove(0);
        }
    }
    lines
}

/// `line` without its leading clauses (each ending `": "`) that name `server`: as
/// `"server"` in quotes, or as the whole clause.
fn without_server_clauses<'a>(server: &ServerId, mut line: &'a str) -> &'a str {
    let quoted = format!("\"{server}\"");
    while let Some((clause, rest)) = line.split_once(": ") {
        if clause == server.as_str() || clause.contains(&quoted) {
            line = rest;
        } else {
            break;
        }
    }
    line
}

/// The whole reason in one line: its lines joined with ` | `, at most
/// [`STATE_REASON_CHARS`] characters. Too long, it is cut in the middle: the first line (at
/// most a third of the cap) and the end of the rest, where a stderr tail says what went
/// wrong.
pub(crate) fn whole_reason(server: &ServerId, reason: &str) -> String {
    let lines = reason_lines(server, reason);
    let joined = lines.join(" | ");
    if joined.chars().count() <= STATE_REASON_CHARS {
        return joined;
    }
    let Some((first, rest)) = lines.split_first() else {
        return joined;
    };
    let joint = " | ";
    let head = cap_chars(first, STATE_REASON_CHARS / 3, CUT);
    let room =
        STATE_REASON_CHARS.saturating_sub(head.chars().count() + joint.len() + CUT.chars().count());
    let rest = rest.join(joint);
    let skip = rest.chars().count().saturating_sub(room);
    let tail: String = rest.chars().skip(skip).collect();
    format!("{head}{joint}{CUT}{tail}")
}

/// The reason in at most `max_chars`: its first line, and the most telling of the lines
/// after it (the last holding an error word; the last line when the first introduces them
/// with a colon), the first line cut before the telling one is.
fn short_reason(server: &ServerId, reason: &str, max_chars: usize) -> String {
    let lines = reason_lines(server, reason);
    // Each line without the clock a log line starts with: the short reason is shown in
    // zone 1 (and in the gateway's tool prefix), whose bytes must not change with each
    // retry's time.
    let lines: Vec<&str> = lines.iter().map(|line| without_clock(line)).collect();
    let Some((head, details)) = lines.split_first() else {
        return String::new();
    };
    let introduces = head.ends_with(':');
    let telling = details
        .iter()
        .rev()
        .find(|line| is_telling(line))
        .or(if introduces { details.last() } else { None });
    let Some(telling) = telling else {
        return cap_chars(head, max_chars, CUT);
    };
    let joint = if introduces { " " } else { " … " };
    // The telling line takes up to two thirds of the budget; the head gets the rest.
    let telling = cap_chars(telling, (max_chars * 2).div_ceil(3).max(1), CUT);
    let head_budget = max_chars
        .saturating_sub(telling.chars().count())
        .saturating_sub(joint.chars().count());
    if head_budget == 0 {
        return cap_chars(&telling, max_chars, CUT);
    }
    format!("{}{joint}{telling}", cap_chars(head, head_budget, CUT))
}

/// `line` without the time it starts with, if it starts with one: an RFC 3339,
/// `YYYY-MM-DD HH:MM:SS` or `YYYY/MM/DD HH:MM:SS` (Go's log) date and time, or a bare
/// `HH:MM:SS`, with a fraction (`.` or `,`), a zone (`Z`, `+HH:MM`, `+HHMM`), and brackets
/// around it or `time=` before it, as loggers write them.
fn without_clock(line: &str) -> &str {
    let text = line.strip_prefix('[').unwrap_or(line);
    let text = text.strip_prefix("time=").unwrap_or(text);
    let b = text.as_bytes();
    let digits = |from: usize, n: usize| {
        b.get(from..from + n)
            .is_some_and(|run| run.iter().all(u8::is_ascii_digit))
    };
    let is = |at: usize, what: &[u8]| b.get(at).is_some_and(|c| what.contains(c));
    let mut i = 0;
    if digits(0, 4) && is(4, b"-/") && digits(5, 2) && is(7, b"-/") && digits(8, 2) {
        if !is(10, b"T ") {
            return line;
        }
        i = 11;
    }
    if !(digits(i, 2) && is(i + 2, b":") && digits(i + 3, 2) && is(i + 5, b":") && digits(i + 6, 2))
    {
        return line;
    }
    i += 8;
    if is(i, b".,") {
        i += 1;
        while digits(i, 1) {
            i += 1;
        }
    }
    if is(i, b"Z") {
        i += 1;
    } else if is(i, b"+-") && digits(i + 1, 2) {
        i += 3;
        if is(i, b":") {
            i += 1;
        }
        if digits(i, 2) {
            i += 2;
        }
    }
    if is(i, b"]") {
        i += 1;
    }
    // Only ASCII was read, so `i` is a character boundary.
    let rest = text.get(i..).unwrap_or_default().trim_start();
    if rest.is_empty() { line } else { rest }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::SyncFailure;

    #[test]
    fn a_log_lines_clock_is_not_kept() {
        for (line, kept) in [
            (
                "2026-12-06T03:00:01.123Z ERROR failed to bind",
                "ERROR failed to bind",
            ),
            (
                "[2026-12-06 03:00:01,5+01:00] error: no token",
                "error: no token",
            ),
            ("03:00:01 Error: ENOENT", "Error: ENOENT"),
            ("2026-12-06T03:00:01+0100 fatal", "fatal"),
            (
                "2026/12/06 03:00:01 listen tcp: address in use",
                "listen tcp: address in use",
            ),
            (
                "time=2026-12-06T03:00:01.5Z level=ERROR msg=boom",
                "level=ERROR msg=boom",
            ),
            ("Error: port 8080 in use", "Error: port 8080 in use"),
            ("2026-12-06 is the day", "2026-12-06 is the day"),
            ("12:30:00", "12:30:00"),
            ("é", "é"),
        ] {
            assert_eq!(without_clock(line), kept, "{line}");
        }
        // Every line of a short reason, its first too.
        let server = ServerId::new("s").unwrap();
        assert_eq!(
            short_reason(&server, "2026-12-06T03:00:01Z ERROR boom", 200),
            "ERROR boom"
        );
    }

    fn id(name: &str) -> ServerId {
        ServerId::new(name).unwrap()
    }

    fn failed(message: &str) -> ServerHealth {
        ServerHealth {
            last_error: Some(SyncFailure {
                at: 1,
                message: message.into(),
            }),
            ..ServerHealth::default()
        }
    }

    /// What psych-mcp reports for a Python server that cannot start, through the freshener.
    const PYTHON: &str = "MCP server \"py\" is unreachable: MCP server \"py\": initialize \
        failed: the server process exited with status 1; its last stderr lines:\n  \
        Traceback (most recent call last):\n  File \"/srv/py/server.py\", line 3, in \
        <module>\n    from mcp.server.fastmcp import FastMCP\n  \
        ModuleNotFoundError: No module named 'mcp'\n  (installed: none)";

    #[test]
    fn the_repeated_clauses_go_and_the_telling_stderr_line_stays() {
        let line = line_state(&id("py"), Some(&failed(PYTHON)), 150);
        assert_eq!(
            line,
            "listing failed: initialize failed: the server process exited with status 1; \
             its last stderr lines: ModuleNotFoundError: No module named 'mcp'"
        );
        assert!(line.chars().count() <= 150);
    }

    #[test]
    fn a_tight_budget_cuts_the_head_before_the_telling_line() {
        let line = line_state(&id("py"), Some(&failed(PYTHON)), 90);
        assert!(line.chars().count() <= 90, "{line}");
        assert!(
            line.starts_with("listing failed: initialize failed"),
            "{line}"
        );
        assert!(
            line.ends_with("… ModuleNotFoundError: No module named 'mcp'"),
            "{line}"
        );
    }

    #[test]
    fn joined_lines_and_plain_reasons_read_well() {
        let joined = ServerHealth {
            reachability: Reachability::Unreachable {
                reason: "the server process exited with status 2; its last stderr lines: \
                         usage: fs --root DIR | error: missing --root"
                    .into(),
            },
            ..ServerHealth::default()
        };
        assert_eq!(
            line_state(&id("fs"), Some(&joined), 200),
            "unreachable: the server process exited with status 2; its last stderr lines: \
             usage: fs --root DIR … error: missing --root"
        );
        // A first line that says it all keeps its bytes; a trailer without an error word
        // is not the telling line.
        let plain = failed("tools/list: connection refused\nstack…");
        assert_eq!(
            line_state(&id("x"), Some(&plain), 200),
            "listing failed: tools/list: connection refused"
        );
        assert_eq!(line_state(&id("x"), None, 200), "not listed yet");
        let listed = ServerHealth {
            last_sync: Some(psych_types::SyncStamp {
                version: psych_types::CatalogVersion(1),
                at: 1,
            }),
            ..ServerHealth::default()
        };
        assert_eq!(line_state(&id("x"), Some(&listed), 200), "none permitted");
        assert_eq!(state(&id("x"), Some(&listed)), None);
    }

    #[test]
    fn the_orientation_summary_keeps_the_telling_line_when_cut() {
        let noisy = format!(
            "MCP server \"py\": initialize failed: exited with status 1; its last stderr \
             lines:\n{}fatal: no config",
            "loading plugin\n".repeat(100)
        );
        let cut = summary(&id("py"), Some(&failed(&noisy)), true, Some(100));
        assert!(cut.chars().count() <= 100, "{cut}");
        assert!(
            cut.starts_with("listing failed: initialize failed"),
            "{cut}"
        );
        assert!(cut.ends_with("stderr lines: fatal: no config"), "{cut}");
        // A server with tools shows its reachability, its reason folded the same way.
        let down = ServerHealth {
            reachability: Reachability::Unreachable {
                reason: noisy.clone(),
            },
            ..ServerHealth::default()
        };
        let whole = summary(&id("py"), Some(&down), false, None);
        assert!(
            whole.starts_with("unreachable: initialize failed"),
            "{whole}"
        );
        assert!(
            whole.ends_with("loading plugin | fatal: no config"),
            "{whole}"
        );
        assert_eq!(summary(&id("py"), None, false, None), "unknown");
    }

    #[test]
    fn the_whole_reason_joins_every_line_and_is_bounded() {
        let state = state(&id("py"), Some(&failed(PYTHON))).unwrap();
        let ServerState::ListingFailed { reason } = &state else {
            panic!("{state:?}")
        };
        assert!(
            reason.starts_with("initialize failed: the server process exited with status 1"),
            "{reason}"
        );
        assert!(
            reason.ends_with("ModuleNotFoundError: No module named 'mcp' | (installed: none)"),
            "{reason}"
        );
        let huge = format!("boom:\n{}fatal: the end", "stderr line\n".repeat(10_000));
        let ServerState::ListingFailed { reason } =
            super::state(&id("x"), Some(&failed(&huge))).unwrap()
        else {
            panic!()
        };
        assert_eq!(reason.chars().count(), STATE_REASON_CHARS);
        assert!(reason.starts_with("boom: | …"), "{reason}");
        assert!(reason.ends_with("stderr line | fatal: the end"), "{reason}");
    }
}
