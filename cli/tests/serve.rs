//! `psych serve` as a process, driven by a real MCP client (rmcp's client side) over stdio,
//! in front of the workspace's test servers (`psych serve-embedded`, real processes): the
//! listing under each tier (direct, facade, search pair, deferred with the meta tools), a
//! deferred tool reached through list → describe → call, a large result elided and read
//! back by handle with grep (one minted by another connection too), a handle never minted refused with the typed error, a
//! tool outside the grant refused through every tier, an upstream `list_changed` reaching
//! the client (unchanged tools keep their bytes and order), an upstream crash answered
//! as a tool error while the other servers keep working, Psych's own answers carrying
//! their structured content as a text block too, an upstream result with unmodelled
//! fields and block types passed through whole, a call the client cancels cancelled
//! upstream (once the upstream announced it) and logged as cancelled, the upstream's
//! progress reaching the client under the client's token, identical calls in flight each
//! getting only their own progress (read by a raw JSON-RPC client, which sees the
//! gateway's messages in order), and
//! `--auto-budget` deciding which `auto` servers stay direct, and lines that are not a
//! message (a batch, invalid JSON, nesting 100,000 deep, a line over 4 MiB) answered each
//! with its JSON-RPC error while the session goes on.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::path::Path;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, CustomResult,
    ProgressNotificationParam, ServerResult, Tool,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support::{announced_hang, expect_handle, handle_in};

const PSYCH: &str = env!("CARGO_BIN_EXE_psych");

/// A client that forwards each `tools/list_changed` and each progress notification to a
/// channel.
struct Client {
    changed: mpsc::UnboundedSender<()>,
    progress: mpsc::UnboundedSender<ProgressNotificationParam>,
}

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.changed.send(());
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.progress.send(params);
    }
}

/// What a client's handler received.
struct Received {
    changed: mpsc::UnboundedReceiver<()>,
    progress: mpsc::UnboundedReceiver<ProgressNotificationParam>,
}

type Session = RunningService<RoleClient, Client>;

/// The names `psych serve-embedded --tools n` generates, plus the control tool `echo`: a
/// grant that leaves out `large`, `crash` and the other control tools.
fn generated_and_echo(n: usize) -> Value {
    let mut names: Vec<Value> = psych_test_server::synthetic_tools(n)
        .into_iter()
        .map(|t| json!(t.name.as_str()))
        .collect();
    names.push(json!("echo"));
    Value::Array(names)
}

fn embedded(tools: usize, extra: Value) -> Value {
    let mut server = json!({
        "command": PSYCH,
        "args": ["serve-embedded", "--tools", tools.to_string()],
    });
    if let Value::Object(extra) = extra {
        server.as_object_mut().unwrap().extend(extra);
    }
    server
}

/// Writes the configuration: every tier, a narrowed grant on each, and a server to crash.
/// `small` and `crashy` (with the control tools, about 1,300 to 1,600 tokens each) are
/// pinned direct: under `psych serve`'s 1,000-token auto budget they would be deferred;
/// `narrow` (only `echo`) fits it and stays `auto`.
fn write_config(dir: &Path) -> std::path::PathBuf {
    let config = json!({"mcpServers": {
        "small": embedded(3, json!({
            "preload": true,
            "args": ["serve-embedded", "--tools", "3", "--announce-hang"],
        })),
        "narrow": embedded(3, json!({"allowTools": ["echo"]})),
        "mid": embedded(40, json!({"preload": true, "allowTools": generated_and_echo(40)})),
        "huge": embedded(400, json!({"preload": true, "allowTools": generated_and_echo(400)})),
        "big": embedded(117, json!({
            "preload": false,
            "description": "A forge sized like github.",
            "allowTools": generated_and_echo(117),
        })),
        "crashy": embedded(2, json!({"preload": true})),
    }});
    let path = dir.join("mcp.json");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

async fn connect(config: &Path, dir: &Path) -> (Session, Received) {
    connect_with(config, dir, &[]).await
}

/// [`connect`] with more flags for `psych serve`.
async fn connect_with(config: &Path, dir: &Path, flags: &[&str]) -> (Session, Received) {
    let transport = crate::support::stdio_gateway(config, dir, flags);
    let (changed, changed_rx) = mpsc::unbounded_channel();
    let (progress, progress_rx) = mpsc::unbounded_channel();
    let session = Client { changed, progress }.serve(transport).await.unwrap();
    let mut received = Received {
        changed: changed_rx,
        progress: progress_rx,
    };
    ready(&session, &mut received.changed).await;
    (session, received)
}

/// Waits until every upstream server has been listed: `psych serve` answers `initialize`
/// at once, and each server reaches the client through `list_changed` as it connects (its
/// deferred line says "not listed yet" until then).
async fn ready(session: &Session, changed: &mut mpsc::UnboundedReceiver<()>) {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let tools = session.list_all_tools().await.unwrap();
            if !serde_json::to_string(&tools)
                .unwrap()
                .contains("not listed yet")
            {
                return;
            }
            changed.recv().await.unwrap();
        }
    })
    .await
    .expect("every upstream is listed");
}

async fn call(session: &Session, name: &str, arguments: Value) -> CallToolResult {
    let Value::Object(arguments) = arguments else {
        panic!("arguments are an object");
    };
    session
        .call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(arguments))
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The result's text blocks, or its structured content's JSON when it has no text.
fn text(result: &CallToolResult) -> String {
    let text: String = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    match (&result.structured_content, text.is_empty()) {
        (Some(structured), true) => structured.to_string(),
        _ => text,
    }
}

fn names(tools: &[Tool]) -> Vec<String> {
    tools.iter().map(|t| t.name.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psych_serve_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let (session, received) = connect(&config, dir.path()).await;
    let Received {
        mut changed,
        mut progress,
    } = received;

    // tools/list under each tier.
    let tools = session.list_all_tools().await.unwrap();
    let listed = names(&tools);
    let has = |name: &str| listed.iter().any(|n| n == name);
    for name in [
        "small__echo",
        "small__large",
        "narrow__echo",
        "mid",
        "huge__search_tools",
        "huge__call_tool",
        "psych_list_tools",
        "psych_describe_tool",
        "psych_call_tool",
        "psych_orientation",
        "read_tool_output",
        "crashy__crash",
    ] {
        assert!(has(name), "{name} is listed: {listed:?}");
    }
    for name in ["narrow__large", "narrow__crash", "mid__echo", "huge__echo"] {
        assert!(!has(name), "{name} is not listed: {listed:?}");
    }
    assert!(
        !listed.iter().any(|n| n.starts_with("big")),
        "the deferred server has no tool of its own: {listed:?}"
    );
    let list_meta = tools.iter().find(|t| t.name == "psych_list_tools").unwrap();
    let description = list_meta.description.as_deref().unwrap_or_default();
    assert!(
        description.contains("big: deferred MCP server") && description.contains("A forge"),
        "the deferred line is in the list meta tool's description: {description}"
    );
    let info = session.peer_info().unwrap();
    let instructions = info.instructions.as_deref().unwrap_or_default();
    assert!(
        instructions.contains("big: deferred MCP server"),
        "{instructions}"
    );
    let bytes = serde_json::to_string(&tools).unwrap().len();
    assert!(bytes < 40_000, "the listing stays small: {bytes} bytes");

    // The orientation tool answers, its structured content also as a text block (a client
    // that shows only `content` sees it); so do the meta tools' own answers, and a facade's
    // and a search pair's descriptions (once `content: []`).
    let oriented = call(&session, "psych_orientation", json!({})).await;
    assert_ne!(oriented.is_error, Some(true));
    let payload = serde_json::to_string(&oriented).unwrap();
    assert!(payload.contains("big"), "{payload}");
    for answer in [
        oriented,
        call(&session, "psych_list_tools", json!({"server": "big"})).await,
        call(&session, "mid", json!({"tool": "echo"})).await,
        call(&session, "huge__call_tool", json!({"tool": "echo"})).await,
    ] {
        let [block] = answer.content.as_slice() else {
            panic!("one text block: {answer:?}");
        };
        let shown: Value = serde_json::from_str(&block.as_text().unwrap().text).unwrap();
        assert_eq!(Some(shown), answer.structured_content);
    }
    // An upstream result passes through as it was sent: a block type and fields rmcp does
    // not model are kept (read raw here, since rmcp's typed result would refuse it).
    let raw = session
        .peer()
        .send_request(ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("small__exotic"),
        )))
        .await
        .unwrap();
    let ServerResult::CustomResult(CustomResult(raw)) = raw else {
        panic!("the exotic result arrives raw: {raw:?}");
    };
    assert_eq!(raw, psych_test_server::exotic_result());
    // One with no content block passes through without one: structured content is shown
    // as a text block in Psych's own answers only, never added to an upstream's.
    let answer = call(&session, "small__exotic", json!({"structured_only": true})).await;
    assert!(answer.content.is_empty(), "no block added: {answer:?}");
    assert_eq!(
        answer.structured_content,
        Some(psych_test_server::exotic_structured_result()["structuredContent"].clone())
    );

    // A call the client cancels is cancelled upstream: cancelled once the upstream said
    // it arrived (`--announce-hang`: progress 0 under the client's token), so it is the
    // upstream's call that is cancelled, however slowly the call got there.
    let (hang, note) = announced_hang(session.peer(), &mut progress, "small__hang").await;
    assert_eq!(
        (&note.progress_token, note.message.as_deref()),
        (&hang.progress_token, Some("hanging"))
    );
    hang.cancel(Some("the test stops waiting".into()))
        .await
        .unwrap();
    let mut cancelled = String::new();
    for _ in 0..100 {
        cancelled = text(&call(&session, "small__cancellations", json!({})).await);
        if cancelled != "0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(cancelled, "1", "the upstream saw the cancellation");

    // The upstream's progress reaches the client under the client's own token (rmcp's
    // client gives every request one), before the result; directly and through a meta tool.
    for (name, arguments) in [
        ("small__progress", json!({"steps": 3})),
        (
            "psych_call_tool",
            json!({"server": "small", "tool": "progress", "arguments": {"steps": 3}}),
        ),
    ] {
        let params = CallToolRequestParams::new(name.to_owned())
            .with_arguments(arguments.as_object().unwrap().clone());
        let handle = session
            .peer()
            .send_cancellable_request(
                ClientRequest::CallToolRequest(CallToolRequest::new(params)),
                PeerRequestOptions::no_options(),
            )
            .await
            .unwrap();
        let token = handle.progress_token.clone();
        let ServerResult::CallToolResult(done) = handle.await_response().await.unwrap() else {
            panic!("{name}: a tools/call result");
        };
        assert_eq!(text(&done), "3 steps reported", "{name}");
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let note = tokio::time::timeout(Duration::from_secs(10), progress.recv())
                .await
                .unwrap_or_else(|_| panic!("{name}: progress reaches the client: {seen:?}"))
                .unwrap();
            seen.push((note.progress_token, note.progress, note.total, note.message));
        }
        // rmcp's client runs each notification's handler as its own task: sorted here.
        seen.sort_by(|a, b| a.1.total_cmp(&b.1));
        let expected: Vec<_> = (1..=3)
            .map(|n| {
                let message = Some(format!("step {n} of 3"));
                (token.clone(), f64::from(n), Some(3.0), message)
            })
            .collect();
        assert_eq!(seen, expected, "{name}");
    }

    // A deferred tool through list → describe → call.
    // Every page of the listing: the grant's tools are there, the tool outside it is not.
    let mut listing = String::new();
    for n in 1..=10 {
        let page = call(
            &session,
            "psych_list_tools",
            json!({"server": "big", "page": n}),
        )
        .await;
        assert_ne!(page.is_error, Some(true), "{}", text(&page));
        let page = text(&page);
        if page.contains("\"tools\":[]") {
            break;
        }
        listing.push_str(&page);
    }
    assert!(listing.contains("\"name\":\"echo\""), "{listing}");
    assert!(!listing.contains("crash"), "{listing}");
    let described = call(
        &session,
        "psych_describe_tool",
        json!({"server": "big", "tool": "echo"}),
    )
    .await;
    assert!(
        text(&described).contains("Answers the text"),
        "{}",
        text(&described)
    );
    let echoed = call(
        &session,
        "psych_call_tool",
        json!({"server": "big", "tool": "echo", "arguments": {"text": "hello, deferred"}}),
    )
    .await;
    assert_eq!(text(&echoed), "hello, deferred");
    assert_ne!(echoed.is_error, Some(true));

    // A large result elided, then read back by handle with grep.
    let large = call(&session, "small__large", json!({"bytes": 200_000})).await;
    let shown = text(&large);
    assert!(shown.len() < 10_000, "elided: {} bytes shown", shown.len());
    assert!(
        shown.starts_with("line 000001: the quick brown fox"),
        "{shown}"
    );
    let handle = expect_handle(&shown);
    let read = call(
        &session,
        "read_tool_output",
        json!({"handle": handle, "grep": "line 002345:"}),
    )
    .await;
    assert!(
        text(&read).contains("line 002345: the quick brown fox jumps over the lazy dog"),
        "{}",
        text(&read)
    );
    assert!(!text(&read).contains("line 002346"), "{}", text(&read));
    // A small result passes through as it was.
    let small = call(&session, "small__echo", json!({"text": "as is"})).await;
    assert_eq!(text(&small), "as is");

    // A handle minted by another connection of the same identity (another `psych serve`
    // process on the same --dir: both are `stdio`) reads back here, from that process's
    // live segment; a handle never minted is the typed error, never a tool result.
    let (other, _) = connect(&config, dir.path()).await;
    let large = call(&other, "small__large", json!({"bytes": 200_000})).await;
    let theirs = handle_in(&text(&large)).unwrap().to_owned();
    assert_ne!(theirs, handle);
    let read = call(
        &session,
        "read_tool_output",
        json!({"handle": theirs, "grep": "line 002345:"}),
    )
    .await;
    assert!(
        text(&read).contains("line 002345: the quick brown fox"),
        "{}",
        text(&read)
    );
    other.cancel().await.unwrap();
    let never = format!("{}:0", "h".repeat(27));
    let refused = session
        .call_tool(
            CallToolRequestParams::new("read_tool_output")
                .with_arguments(json!({"handle": never}).as_object().unwrap().clone()),
        )
        .await
        .expect_err("a handle never minted is refused");
    assert!(
        refused.to_string().contains("invalid_deferred_handle"),
        "{refused}"
    );

    // A tool outside the grant, through every tier: refused, and the upstream never runs it.
    for (name, arguments) in [
        ("narrow__large", json!({"bytes": 10})),
        (
            "psych_call_tool",
            json!({"server": "narrow", "tool": "large"}),
        ),
        ("mid", json!({"tool": "crash", "input": {}})),
        ("huge__call_tool", json!({"tool": "crash", "input": {}})),
        ("psych_call_tool", json!({"server": "big", "tool": "crash"})),
        (
            "psych_describe_tool",
            json!({"server": "big", "tool": "crash"}),
        ),
    ] {
        let refused = call(&session, name, arguments.clone()).await;
        assert_eq!(
            refused.is_error,
            Some(true),
            "{name} {arguments}: {}",
            text(&refused)
        );
    }
    let searched = call(&session, "huge__search_tools", json!({"query": "crash"})).await;
    let hits = serde_json::from_str::<Value>(&text(&searched)).unwrap()["hits"].to_string();
    assert!(!hits.contains("\"crash\""), "{hits}");

    // An upstream list_changed reaches the client; unchanged tools keep bytes and order.
    while changed.try_recv().is_ok() {}
    let added = call(&session, "small__add_tool", json!({"name": "fresh_tool"})).await;
    assert_ne!(added.is_error, Some(true), "{}", text(&added));
    tokio::time::timeout(Duration::from_secs(20), changed.recv())
        .await
        .expect("list_changed reaches the client")
        .unwrap();
    let after = session.list_all_tools().await.unwrap();
    assert!(names(&after).iter().any(|n| n == "small__fresh_tool"));
    let kept: Vec<&Tool> = after
        .iter()
        .filter(|t| t.name != "small__fresh_tool")
        .collect();
    assert_eq!(
        serde_json::to_string(&kept).unwrap(),
        serde_json::to_string(&tools).unwrap(),
        "every tool that did not change keeps its bytes and its place"
    );

    // An upstream crash is a tool error naming the server; the others keep working.
    let crashed = call(&session, "crashy__crash", json!({})).await;
    assert_eq!(crashed.is_error, Some(true));
    assert!(text(&crashed).contains("crashy"), "{}", text(&crashed));
    let still = call(&session, "small__echo", json!({"text": "still here"})).await;
    assert_eq!(text(&still), "still here");
    let listed = names(&session.list_all_tools().await.unwrap());
    assert!(listed.iter().any(|n| n == "crashy__echo"), "{listed:?}");

    session.cancel().await.unwrap();
    // One record log segment per process, in the stdio identity's folder.
    let folder = dir.path().join("serve/stdio");
    let logs: Vec<_> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(logs.len(), 2, "{logs:?}");
    // The logs hold a result for every call, the cancelled one too.
    let results: Vec<(String, String)> = logs
        .iter()
        .flat_map(|name| session_results(&folder, name))
        .collect();
    let hung: Vec<&String> = results
        .iter()
        .filter(|(name, _)| name == "small__hang")
        .map(|(_, text)| text)
        .collect();
    assert_eq!(hung.len(), 1, "one result for the cancelled call: {hung:?}");
    assert!(
        hung[0].starts_with("cancelled by the client"),
        "{:?}",
        hung[0]
    );
}

/// `--auto-budget` decides which `auto` servers stay direct: by default (1,000 tokens) a
/// server small enough to fit (one permitted tool) stays direct and the larger ones are
/// deferred; 0 defers every `auto` server, so no upstream tool is listed directly; a large
/// budget keeps them all direct and needs no meta tools. A pinned server takes no share.
/// `psych budget --serve` with the same budget decides the same for the same file (its
/// `allowTools` included): its Surface is what `psych serve` lists, `read_tool_output`
/// aside, and its kept `auto` servers' costs add up to at most the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_auto_budget_flag_decides_which_auto_servers_stay_direct() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mcp.json");
    let servers = json!({"mcpServers": {
        "tiny": embedded(3, json!({"allowTools": ["echo"]})),
        "two": embedded(2, json!({})),
        "three": embedded(3, json!({})),
        "pinned": embedded(2, json!({"preload": true})),
    }});
    std::fs::write(&config, servers.to_string()).unwrap();
    let own = |name: &str| name.starts_with("psych_") || name == "read_tool_output";
    for (flags, direct, deferred) in [
        (&[][..], &["tiny", "pinned"][..], &["two", "three"][..]),
        (
            &["--auto-budget", "0"][..],
            &["pinned"][..],
            &["tiny", "two", "three"][..],
        ),
        (
            &["--auto-budget", "100000"][..],
            &["tiny", "two", "three", "pinned"][..],
            &[][..],
        ),
    ] {
        let (session, _) = connect_with(&config, dir.path(), flags).await;
        let listed = names(&session.list_all_tools().await.unwrap());
        let budget = budget_as_served(&config, dir.path(), flags);
        let mut surface: Vec<String> =
            serde_json::from_value(budget["surface_tools"].clone()).unwrap();
        surface.push("read_tool_output".to_owned());
        assert_eq!(
            surface, listed,
            "{flags:?}: psych budget --serve and psych serve"
        );
        let kept: u64 = budget["servers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["why"] == "size")
            .map(|s| s["cost_tokens_est"].as_u64().unwrap())
            .sum();
        assert_eq!(budget["auto_kept_tokens_est"], kept, "{flags:?}");
        assert!(
            kept <= budget["auto_budget_tokens"].as_u64().unwrap(),
            "{flags:?}: {budget}"
        );
        let instructions = session
            .peer_info()
            .and_then(|info| info.instructions.clone())
            .unwrap_or_default();
        session.cancel().await.unwrap();
        let servers: std::collections::BTreeSet<&str> = listed
            .iter()
            .filter(|name| !own(name))
            .map(|name| {
                name.split_once("__")
                    .map_or(name.as_str(), |(server, _)| server)
            })
            .collect();
        let expected: std::collections::BTreeSet<&str> = direct.iter().copied().collect();
        assert_eq!(servers, expected, "{flags:?}: {listed:?}");
        assert!(listed.iter().any(|n| n == "tiny__echo") == direct.contains(&"tiny"));
        assert_eq!(
            listed.iter().any(|n| n == "psych_list_tools"),
            !deferred.is_empty(),
            "{flags:?}: {listed:?}"
        );
        for server in deferred {
            assert!(
                instructions.contains(&format!("- {server}: deferred MCP server")),
                "{flags:?}: {instructions}"
            );
        }
    }
}

/// `psych budget --serve --json` for `config` with `psych serve`'s `flags` (its auto
/// budget), the catalogue in `dir`.
fn budget_as_served(config: &Path, dir: &Path, flags: &[&str]) -> Value {
    let output = std::process::Command::new(PSYCH)
        .arg("budget")
        .arg("--serve")
        .args(flags)
        .arg("--json")
        .arg("--config")
        .arg(config)
        .arg("--store")
        .arg(dir.join("budget.redb"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The tool results of the session log `file` in `dir`: (tool name, readable text).
fn session_results(dir: &Path, file: &std::ffi::OsStr) -> Vec<(String, String)> {
    let run = Path::new(file).file_stem().unwrap().to_str().unwrap();
    let run = psych_types::RunId::new(run).unwrap();
    let (log, _) = psych_record_log::RecordLog::open_read_only(dir, &run).unwrap();
    log.iter()
        .filter_map(|logged| match logged.unwrap().record {
            psych_types::Record::ToolResult(result) => {
                Some((result.name, result.output.readable_text().into_owned()))
            }
            _ => None,
        })
        .collect()
}

/// A JSON-RPC client of `psych serve` over stdio that sees every message in the order the
/// gateway wrote it (rmcp's client runs each notification's handler as a task of its own,
/// so the order of progress and results is lost there).
struct RawClient {
    _child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl RawClient {
    /// Starts `psych serve` and makes the initialize handshake.
    async fn start(config: &Path, dir: &Path) -> Self {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(PSYCH)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--dir")
            .arg(dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut client = Self {
            _child: child,
            stdin,
            lines,
        };
        client
            .send(
                json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"},
                }}),
            )
            .await;
        while client.next().await.get("id") != Some(&json!(0)) {}
        client
            .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        // Every upstream listed (see [`ready`]).
        let mut id = 1_000_000;
        loop {
            id += 1;
            client
                .send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}))
                .await;
            let mut changed = false;
            let listing = loop {
                let message = client.next().await;
                if message["method"] == "notifications/tools/list_changed" {
                    changed = true;
                } else if message.get("id") == Some(&json!(id)) {
                    break message;
                }
            };
            if !listing.to_string().contains("not listed yet") {
                break;
            }
            while !changed {
                changed = client.next().await["method"] == "notifications/tools/list_changed";
            }
        }
        client
    }

    async fn send(&mut self, message: Value) {
        use tokio::io::AsyncWriteExt;
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.unwrap();
    }

    /// Sends `line` as it is, and its `\n`.
    async fn send_line(&mut self, line: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.stdin.write_all(line).await.unwrap();
        self.stdin.write_all(b"\n").await.unwrap();
    }

    /// The next answer (a message without a `method`), past any notification.
    async fn next_answer(&mut self) -> Value {
        loop {
            let message = self.next().await;
            if message.get("method").is_none() {
                return message;
            }
        }
    }

    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(30), self.lines.next_line())
            .await
            .expect("the gateway answers")
            .unwrap()
            .expect("the gateway is running");
        serde_json::from_str(&line).unwrap()
    }
}

/// A client of 2025-06-18 takes only an object as a tool's `outputSchema`: a tool whose
/// schema is an array (as MCP 2026-07-28, which psych speaks upstream first, allows) is
/// listed without it, the way rmcp shapes its own results for that revision. (Before, the
/// raw listing put it back, and the TypeScript SDK refused the whole listing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_client_is_listed_no_schema_its_revision_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = dir.path().join("rows.json");
    let tools = json!({"tools": [
        {"name": "rows", "description": "Rows as a list.", "inputSchema": {"type": "object"},
         "outputSchema": {"type": "array", "items": {"type": "string"}}},
        {"name": "row", "description": "One row.", "inputSchema": {"type": "object"},
         "outputSchema": {"type": "object", "properties": {"id": {"type": "string"}}}},
    ]});
    std::fs::write(&catalog, tools.to_string()).unwrap();
    let config = dir.path().join("mcp.json");
    let server = json!({
        "command": PSYCH,
        "args": ["serve-embedded", "--tools", "0", "--no-control-tools", "--catalog",
                 catalog.to_str().unwrap()],
        "preload": true,
    });
    std::fs::write(&config, json!({"mcpServers": {"db": server}}).to_string()).unwrap();
    let mut client = RawClient::start(&config, dir.path()).await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .await;
    let listing = client.next_answer().await;
    let tools = listing["result"]["tools"].as_array().unwrap();
    let tool = |name: &str| {
        tools
            .iter()
            .find(|tool| tool["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {listing}"))
    };
    assert_eq!(tool("db__rows").get("outputSchema"), None, "{listing}");
    assert_eq!(tool("db__row")["outputSchema"]["type"], "object");
    assert_eq!(listing["result"].get("resultType"), None);
}

/// Identical calls in flight at once, each with its own progress token: each token gets
/// exactly its own call's reports, all of them before its result and none after. (Before
/// the call carried its progress sink through the executor, the gateway guessed which
/// upstream call was whose by `(target, arguments)`, so identical calls could swap
/// streams: a result came before its token's reports, or reports after it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_calls_in_flight_each_get_only_their_own_progress() {
    const CALLS: u64 = 40;
    const STEPS: u64 = 5;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mcp.json");
    let servers = json!({"mcpServers": {"small": embedded(3, json!({"preload": true}))}});
    std::fs::write(&config, servers.to_string()).unwrap();
    let mut client = RawClient::start(&config, dir.path()).await;
    for round in 0..6 {
        let ids: Vec<u64> = (1..=CALLS).map(|n| round * 100 + n).collect();
        for id in &ids {
            client
                .send(
                    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                        "name": "small__progress",
                        "arguments": {"steps": STEPS},
                        "_meta": {"progressToken": format!("token-{id}")},
                    }}),
                )
                .await;
        }
        let mut reports = std::collections::BTreeMap::<String, Vec<f64>>::new();
        let mut answered = std::collections::BTreeSet::new();
        while answered.len() < ids.len() {
            let message = client.next().await;
            if message["method"] == "notifications/progress" {
                let token = message["params"]["progressToken"]
                    .as_str()
                    .unwrap()
                    .to_owned();
                let id: u64 = token["token-".len()..].parse().unwrap();
                assert!(
                    !answered.contains(&id),
                    "round {round}: a report of {token} after its result: {message}"
                );
                let progress = message["params"]["progress"].as_f64().unwrap();
                reports.entry(token).or_default().push(progress);
            } else if let Some(id) = message.get("id").and_then(Value::as_u64) {
                let text = message["result"]["content"][0]["text"].as_str();
                let done = format!("{STEPS} steps reported");
                assert_eq!(text, Some(done.as_str()), "round {round}: {message}");
                let seen = reports.get(&format!("token-{id}")).cloned();
                let expected: Vec<f64> = (1..=STEPS).map(|n| n as f64).collect();
                assert_eq!(
                    seen,
                    Some(expected),
                    "round {round}: call {id}'s result comes after its own reports, all of them"
                );
                answered.insert(id);
            }
        }
    }
}

/// Lines `psych serve` cannot take as a message are answered, each with its JSON-RPC error
/// and no `id`, and the session goes on (`tools/list` still answers after each): a batch
/// (-32600), invalid JSON and 100,000 nested arrays (-32700, serde_json's recursion limit,
/// no stack overflow), a line of 5 MiB, over the 4 MiB a line may take (-32600). Through
/// rmcp's stdio transport only the batch was answered; the client waited forever for an
/// answer to each of the others (issue 29).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lines_that_are_not_messages_are_answered_and_the_session_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mcp.json");
    let servers = json!({"mcpServers": {"small": embedded(3, json!({"preload": true}))}});
    std::fs::write(&config, servers.to_string()).unwrap();
    let mut client = RawClient::start(&config, dir.path()).await;
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
    ]);
    let large = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "small__echo",
        "arguments": {"text": "a".repeat(5 * 1024 * 1024)},
    }});
    // A line over 4 MiB is answered for its id, read as the line goes by.
    let lines = [
        (
            batch.to_string(),
            json!({"code": -32600, "message": "invalid request: batches are not supported"}),
            None,
        ),
        (
            "{not json".to_owned(),
            json!({"code": -32700, "message": "parse error: not JSON"}),
            None,
        ),
        (
            "[".repeat(100_000),
            json!({"code": -32700, "message": "parse error: not JSON"}),
            None,
        ),
        (
            large.to_string(),
            json!({"code": -32600, "message": "request too large"}),
            Some(3),
        ),
    ];
    for (n, (line, error, id)) in lines.into_iter().enumerate() {
        client.send_line(line.as_bytes()).await;
        let answer = client.next_answer().await;
        let mut expected = json!({"jsonrpc": "2.0", "error": error});
        if let Some(id) = id {
            expected["id"] = json!(id);
        }
        assert_eq!(answer, expected, "line {n} ({} B)", line.len());
        let id = 100 + n;
        client
            .send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}))
            .await;
        let listing = client.next_answer().await;
        assert_eq!(listing["id"], json!(id), "after line {n}: {listing}");
        let tools = listing["result"]["tools"].as_array().unwrap();
        assert!(!tools.is_empty(), "after line {n}: {listing}");
    }
}
