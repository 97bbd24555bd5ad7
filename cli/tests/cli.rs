//! The `psych` binary run as a process: every command's `--json` output and human text,
//! snapshotted, against the embedded servers and against a configuration naming the test
//! server, a command that does not exist and a server that exits at once.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on bad data")]

use std::path::Path;
use std::process::Command;

use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{Record, RunId, ToolCallId, ToolOutput, ToolResult};

/// Runs `psych` with `args` in `dir`; returns stdout, stderr and the exit status.
fn psych(dir: &Path, args: &[&str]) -> (String, String, i32) {
    let out = Command::new(env!("CARGO_BIN_EXE_psych"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
        out.status.code().unwrap_or(-1),
    )
}

/// Replaces volatile text (temporary paths, the executable's path, a kept listing's age)
/// with fixed markers.
fn redact(text: &str, dir: &Path) -> String {
    let exe = env!("CARGO_BIN_EXE_psych");
    let text = text
        .replace(exe, "[psych]")
        .replace(&dir.display().to_string(), "[dir]");
    // `listed 12 s ago`, `listed 3 min ago`: the age of a listing kept by an earlier command.
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(at) = rest.find("listed ") {
        out.push_str(&rest[..at + "listed ".len()]);
        rest = &rest[at + "listed ".len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let unit = rest[digits..].strip_prefix(' ').and_then(|r| {
            ["s ago", "min ago", "h ago", "d ago"]
                .into_iter()
                .find(|u| r.starts_with(u))
        });
        if let (true, Some(unit)) = (digits > 0, unit) {
            out.push_str("[age] ago");
            rest = &rest[digits + 1 + unit.len()..];
        }
    }
    out.push_str(rest);
    out
}

/// One command: its output (redacted) and exit status, snapshotted under `name`.
fn check(name: &str, dir: &Path, args: &[&str], status: i32) -> String {
    let (stdout, stderr, code) = psych(dir, args);
    assert_eq!(
        code, status,
        "{args:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stderr.is_empty() || status != 0,
        "no progress off a terminal: {stderr}"
    );
    let out = redact(&stdout, dir);
    insta::assert_snapshot!(name, out);
    out
}

fn bad_config(dir: &Path) -> std::path::PathBuf {
    let server = env!("CARGO_BIN_EXE_psych");
    let text = serde_json::json!({"mcpServers": {
        "good": {"command": server, "args": ["serve-embedded", "--tools", "30", "--no-control-tools"],
                 "description": "The workspace's test server, 30 generated tools."},
        "missing": {"command": "/nonexistent/psych-no-such-server"},
        "quits": {"command": server, "args": ["serve-embedded", "--exit-at-once", "9",
                  "--stderr-banner", "quits: out of cheese"]}
    }});
    let path = dir.join("mcp.json");
    std::fs::write(&path, text.to_string()).unwrap();
    path
}

#[test]
fn budget_of_the_embedded_servers() {
    let dir = tempfile::tempdir().unwrap();
    let table = check("budget_embedded_table", dir.path(), &["budget"], 0);
    for line in table.lines() {
        assert!(
            line.chars().count() <= 80,
            "wider than 80 columns: {line:?}"
        );
    }
    let json = check("budget_embedded_json", dir.path(), &["budget", "--json"], 0);
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let totals = &report["totals"];
    assert!(totals["with_psych_bytes"].as_u64() < totals["all_schemas_bytes"].as_u64());
    assert!(dir.path().join(".psych/catalog.redb").is_file());
}

#[test]
fn budget_reports_bad_servers_and_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let config = bad_config(dir.path());
    let config = config.to_str().unwrap();
    let table = check(
        "budget_bad_table",
        dir.path(),
        &["budget", "--config", config],
        1,
    );
    assert!(table.contains("FAILED missing"), "{table}");
    assert!(table.contains("FAILED quits"), "{table}");
    let json = check(
        "budget_bad_json",
        dir.path(),
        &["budget", "--config", config, "--json"],
        1,
    );
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["servers"][0]["tools"], 30);
    assert_eq!(report["totals"]["servers_failed"], 2);
}

/// Each server's `start` in a `psych budget --json` report, in the report's order.
fn starts(report: &serde_json::Value) -> Vec<&str> {
    report["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["start"].as_str().unwrap())
        .collect()
}

/// Issue 30: `psych budget` says how `psych serve` would start each server (on demand
/// once its listing is kept; at once with `"lazy": false`), `--lazy` measures what that
/// saves, and `psych orient` shows a known server as the model would see it before its
/// first call.
#[test]
fn budget_and_orient_show_how_serve_would_start_each_server() {
    let dir = tempfile::tempdir().unwrap();
    let server = env!("CARGO_BIN_EXE_psych");
    let text = serde_json::json!({"mcpServers": {
        "one": {"command": server, "args": ["serve-embedded", "--tools", "30"]},
        "two": {"command": server, "args": ["serve-embedded", "--tools", "5"]},
        "pinned": {"command": server, "args": ["serve-embedded", "--tools", "3"], "lazy": false},
    }});
    let config = dir.path().join("mcp.json");
    std::fs::write(&config, text.to_string()).unwrap();
    let config = config.to_str().unwrap();
    // Nothing kept yet: every server starts at once.
    let (first, _, code) = psych(dir.path(), &["budget", "--config", config, "--json"]);
    assert_eq!(code, 0, "{first}");
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(
        starts(&first),
        [
            "at once (no kept listing)",
            "at once (\"lazy\": false)",
            "at once (no kept listing)"
        ]
    );
    assert!(first.get("lazy").is_none(), "only with --lazy");

    let (second, _, code) = psych(
        dir.path(),
        &["budget", "--config", config, "--lazy", "--json"],
    );
    assert_eq!(code, 0, "{second}");
    let second: serde_json::Value = serde_json::from_str(&redact(&second, dir.path())).unwrap();
    assert_eq!(
        starts(&second),
        [
            "on demand (listed [age] ago)",
            "at once (\"lazy\": false)",
            "on demand (listed [age] ago)"
        ]
    );
    let lazy = &second["lazy"];
    assert_eq!(
        (lazy["servers"].as_u64(), lazy["not_started"].as_u64()),
        (Some(3), Some(2))
    );
    assert!(
        lazy["not_started_rss_kib"].as_u64().unwrap() > 1024,
        "{lazy}"
    );
    assert!(
        lazy["eager_first_answer_ms"].as_u64().unwrap() > 0,
        "{lazy}"
    );
    let table = redact(
        &psych(dir.path(), &["budget", "--config", config, "--lazy"]).0,
        dir.path(),
    );
    assert!(
        table.contains(
            "psych serve starts these on demand, known from their kept listings: one, two."
        ),
        "{table}"
    );
    assert!(
        table.contains("Lazy start (measured in this run): 2 of 3 servers not started"),
        "{table}"
    );
    for line in table.lines() {
        assert!(
            line.chars().count() <= 80,
            "wider than 80 columns: {line:?}"
        );
    }

    let (oriented, _, code) = psych(dir.path(), &["orient", "--config", config, "--json"]);
    assert_eq!(code, 0, "{oriented}");
    let oriented: serde_json::Value = serde_json::from_str(&redact(&oriented, dir.path())).unwrap();
    let state = |name: &str| {
        oriented["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["server"] == name)
            .unwrap()["state"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        state("one"),
        "known (listed [age] ago), not started: starts at its first call"
    );
    assert_eq!(state("pinned"), "reachable");
}

#[test]
fn search_ranks_every_catalogue() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["search", "create a pull request", "--limit", "5"];
    let text = check("search_text", dir.path(), &args, 0);
    assert!(text.contains("forge/create_pull_request"), "{text}");
    check(
        "search_json",
        dir.path(),
        &[&args[..], &["--json"]].concat(),
        0,
    );
    // A weak answer says so and names the servers closest to the query.
    let weak = [
        "search",
        "bake a birthday cake for the team party",
        "--limit",
        "3",
    ];
    let text = check("search_weak", dir.path(), &weak, 0);
    assert!(text.contains("weak matches"), "{text}");
}

/// A server's `allowTools` narrows what `psych search` ranks, as it narrows what `psych
/// serve` lists and searches. (Before, every tool of the catalogue was searched: a tool the
/// file withholds came first.)
#[test]
fn search_ranks_only_the_tools_the_file_permits() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mcp.json");
    let server = env!("CARGO_BIN_EXE_psych");
    std::fs::write(
        &config,
        serde_json::json!({"mcpServers": {"forge": {
            "command": server,
            "args": ["serve-embedded", "--kind", "forge", "--tools", "117", "--no-control-tools"],
            "allowTools": ["list_pull_request", "list_issues"],
        }}})
        .to_string(),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let (stdout, stderr, code) = psych(
        dir.path(),
        &[
            "search",
            "create a pull request",
            "--config",
            config,
            "--json",
        ],
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["indexed"], 2, "the two tools permitted: {stdout}");
    let hits: Vec<&str> = report["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|hit| hit["tool"].as_str().unwrap())
        .collect();
    assert_eq!(hits.first(), Some(&"forge/list_pull_request"), "{stdout}");
    assert!(!hits.contains(&"forge/create_pull_request"), "{stdout}");
}

#[test]
fn orient_prints_the_payload() {
    let dir = tempfile::tempdir().unwrap();
    let text = check("orient_text", dir.path(), &["orient"], 0);
    assert!(!text.contains("tool_map"), "the map is verbose only");
    check("orient_json", dir.path(), &["orient", "--json"], 0);
    let (verbose, _, code) = psych(dir.path(), &["orient", "--verbose", "--json"]);
    assert_eq!(code, 0);
    assert!(verbose.contains("tool_map"));
}

/// A record log `<dir>/run-7.plog` holding one tool result of `text`: its handle.
fn logged_result(dir: &Path, text: String) -> String {
    let run = RunId::new("run-7").unwrap();
    let (mut log, _) = RecordLog::open(dir, &run, SyncPolicy::EveryAppend).unwrap();
    log.append(&Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new("call_1").unwrap(),
        name: "fetch_logs".into(),
        output: ToolOutput::text(text),
    }))
    .unwrap()
    .to_string()
}

#[test]
fn read_pages_a_stored_result() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (1..=40)
        .map(|i| format!("line {i}{}\n", if i % 10 == 0 { " ERROR" } else { "" }))
        .collect();
    let handle = logged_result(dir.path(), text);
    let file = "run-7.plog";
    check(
        "read_grep",
        dir.path(),
        &["read", file, &handle, "--grep", "ERROR"],
        0,
    );
    check(
        "read_page",
        dir.path(),
        &["read", file, &handle, "--offset", "35", "--limit", "3"],
        0,
    );
    check(
        "read_past_end",
        dir.path(),
        &["read", file, &handle, "--offset", "99"],
        0,
    );
    let (_, stderr, code) = psych(dir.path(), &["read", file, "run-8:0"]);
    assert_eq!(code, 3);
    insta::assert_snapshot!("read_foreign_handle", stderr);
}

/// Arguments clap lets through but the command cannot use exit 2, as clap's refusals do:
/// a handle that does not parse, a log not named `<run>.plog` (before, `run-7.log` read
/// `run-7.plog` beside it), a name `serve-token` cannot give, `--max-sessions 0` (before,
/// accepted: every HTTP session was then refused). (Before, the first three exited 3.)
#[test]
fn unusable_arguments_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let handle = logged_result(dir.path(), "one line\n".to_owned());
    std::fs::write(dir.path().join("run-7.log"), "not a record log").unwrap();
    let (_, stderr, code) = psych(dir.path(), &["read", "run-7.plog", "not-a-handle"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("invalid_deferred_handle"), "{stderr}");
    let (stdout, stderr, code) = psych(dir.path(), &["read", "run-7.log", &handle]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(stdout.is_empty(), "nothing of run-7.plog is read: {stdout}");
    assert!(stderr.contains("not a record log's file name"), "{stderr}");
    let (stdout, stderr, code) = psych(dir.path(), &["serve-token", "not a name"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stdout.is_empty(),
        "no token for a name the file refuses: {stdout}"
    );
    let (_, stderr, code) = psych(
        dir.path(),
        &["serve", "--http", "127.0.0.1:0", "--max-sessions", "0"],
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--max-sessions"), "{stderr}");
}

/// Output to a pipe whose reader is gone (`psych search … | head -1`) ends quietly:
/// the command's own exit status, no panic. (Before, `println!` panicked on the closed
/// pipe: "failed printing to stdout", exit 101.)
#[test]
fn a_closed_stdout_ends_the_output_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_psych"))
        .args(["search", "create a pull request", "--limit", "50"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes before anything is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn serve_help_documents_the_auto_budget_and_its_default() {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, _, code) = psych(dir.path(), &["serve", "--help"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("--auto-budget <TOKENS>"), "{stdout}");
    assert!(stdout.contains("[default: 1000]"), "{stdout}");
    assert!(stdout.contains("0 defers every `auto` server"), "{stdout}");
}

/// A context window of 0 is a bad argument (2), not a settings failure (3).
#[test]
fn a_context_window_of_zero_is_a_bad_argument() {
    let dir = tempfile::tempdir().unwrap();
    let (_, stderr, code) = psych(dir.path(), &["budget", "--context-window", "0"]);
    assert_eq!(code, 2, "{stderr}");
}
