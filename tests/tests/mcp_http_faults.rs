//! psych-mcp against a streamable HTTP server that misbehaves the way servers and the
//! proxies in front of them do: redirects (same origin, another origin, a loop), event
//! streams cut mid-event or ended before the answer, an answer larger than the event
//! limit, and tools whose input schema no provider takes. Each is the real
//! `psych-test-server` process over loopback HTTP.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use psych_mcp::{
    Backoff, ChangeCause, McpConfig, McpError, McpEvent, McpEvents, McpManager, ServerConfig,
    SpillBudget, Timeouts, Transport,
};
use psych_types::{ConnectionSpec, JsonObject, Reachability, ServerId, ToolHost, ToolRef};
use serde_json::{Value, json};

use crate::mcp_common::HttpServer;

fn id(name: &str) -> ServerId {
    ServerId::new(name).unwrap()
}

fn http_config(name: &str, url: &str) -> ServerConfig {
    ServerConfig {
        transport: Transport::Http {
            url: url.to_owned(),
            headers: BTreeMap::new(),
        },
        connection: ConnectionSpec::new(id(name)),
        extra: JsonObject::new(),
    }
}

/// Deadlines far longer than any answer here takes: a fault must be reported at once,
/// not when a deadline passes, and the tests check that against these.
fn patient() -> Timeouts {
    Timeouts::uniform(Duration::from_secs(60)).with_shutdown_grace(Duration::from_millis(500))
}

/// A manager with one server at `url`, after its first connection attempt.
async fn connect(name: &str, url: &str) -> (McpManager, Reachability) {
    connect_spilling(name, url, &std::env::temp_dir(), SpillBudget::default()).await
}

/// [`connect`], keeping answers too large for memory in `spill_dir`, within `budget`.
async fn connect_spilling(
    name: &str,
    url: &str,
    spill_dir: &std::path::Path,
    budget: SpillBudget,
) -> (McpManager, Reachability) {
    let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap();
    let manager = McpManager::builder(config)
        .spill_dir(spill_dir)
        .spill_budget(budget)
        .timeouts(patient())
        .backoff(Backoff::new(
            Duration::from_secs(30),
            Duration::from_secs(60),
        ))
        .build()
        .unwrap();
    let reachability = manager
        .add_server(id(name), http_config(name, url))
        .await
        .unwrap();
    (manager, reachability)
}

fn args(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => panic!("not an object"),
    }
}

async fn echo(manager: &McpManager, server: &str, text: &str) -> String {
    let output = manager
        .call_tool(
            &ToolRef::parse(server, "echo").unwrap(),
            args(json!({"text": text})),
        )
        .await
        .unwrap();
    serde_json::to_value(&output).unwrap()["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Waits for an event matching `want` (generously: the deadline only decides how long a
/// failing test takes).
async fn wait_for(events: &McpEvents, what: &str, want: impl Fn(&McpEvent) -> bool) {
    tokio::time::timeout(Duration::from_secs(20), async {
        while !want(&events.next().await) {}
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: the event did not come"));
}

/// `url` with its path replaced by `path`.
fn at(url: &str, path: &str) -> String {
    format!("{}{path}", url.strip_suffix("/mcp").unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_origin_307_and_308_redirects_are_followed_with_the_body() {
    let server = HttpServer::start(&[]);
    for path in ["/moved", "/moved/permanently", "/moved/absolute"] {
        let (manager, reachability) = connect("web", &at(&server.url, path)).await;
        assert_eq!(reachability, Reachability::Reachable, "{path}");
        let events = manager.events();
        // Every POST (initialize, the listing, a call) went through the redirect whole.
        assert!(manager.list(&id("web")).await.unwrap().tools.len() > 10);
        assert_eq!(echo(&manager, "web", "through").await, "through", "{path}");
        // The notification stream (a GET) is redirected too: list_changed arrives (this
        // subscriber, made after the connection, sees only what comes after it).
        manager
            .call_tool(
                &ToolRef::parse("web", "add_tool").unwrap(),
                args(json!({"name": "fresh"})),
            )
            .await
            .unwrap();
        wait_for(&events, path, |e| {
            matches!(
                e,
                McpEvent::ToolsChanged {
                    cause: ChangeCause::Notified,
                    ..
                }
            )
        })
        .await;
        manager.shutdown().await;
    }
    // A stateless server answering with JSON bodies, behind the same redirect.
    let json = HttpServer::start(&["--json-response"]);
    let (manager, reachability) = connect("web", &at(&json.url, "/moved")).await;
    assert_eq!(reachability, Reachability::Reachable);
    assert_eq!(echo(&manager, "web", "json").await, "json");
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cross_origin_redirect_or_a_loop_is_an_error_naming_it() {
    let server = HttpServer::start(&[]);
    let port = server.url.rsplit_once(':').unwrap().1;
    let (manager, reachability) = connect("web", &at(&server.url, "/moved/away")).await;
    let Reachability::Unreachable { reason } = reachability else {
        panic!("{reachability:?}")
    };
    assert!(
        reason.contains(&format!(
            "redirect to another origin (http://localhost:{port}"
        )),
        "{reason}"
    );
    manager.shutdown().await;

    let (manager, reachability) = connect("web", &at(&server.url, "/moved/loop")).await;
    let Reachability::Unreachable { reason } = reachability else {
        panic!("{reachability:?}")
    };
    assert!(reason.contains("more than 5 redirects"), "{reason}");
    manager.shutdown().await;
}

/// Calls `web`'s `large` for a text of `bytes` bytes, which must succeed.
async fn call_large(manager: &McpManager, bytes: u64) -> psych_types::ToolOutput {
    manager
        .call_tool(
            &ToolRef::parse("web", "large").unwrap(),
            args(json!({"bytes": bytes})),
        )
        .await
        .unwrap()
}

/// Calls `tool` and expects a failure at once (well within the 60 s deadline).
async fn fails_at_once(manager: &McpManager, tool: &str, arguments: Value) -> McpError {
    let started = Instant::now();
    // Not `unwrap_err`: a result wrongly read may be megabytes long to print.
    let Err(error) = manager
        .call_tool(&ToolRef::parse("web", tool).unwrap(), args(arguments))
        .await
    else {
        panic!("{tool} succeeded");
    };
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{tool} failed only after {:?}: {error}",
        started.elapsed()
    );
    error
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_event_stream_says_how_it_ended() {
    let server = HttpServer::start(&[]);
    let (manager, reachability) = connect("web", &server.url).await;
    assert_eq!(reachability, Reachability::Reachable);
    let error = fails_at_once(&manager, "cut_stream", json!({"bytes": 100_000})).await;
    assert!(
        error.to_string().starts_with(
            "MCP server \"web\": tools/call cut_stream failed: the server's event stream \
             ended in the middle of an event (100"
        ),
        "{error}"
    );
    let error = fails_at_once(&manager, "end_stream", json!({})).await;
    assert_eq!(
        error.to_string(),
        "MCP server \"web\": tools/call end_stream failed: the server's event stream \
         ended before the answer"
    );
    // A stream cut is that answer's loss, not the session's: the connection stays.
    assert_eq!(echo(&manager, "web", "still here").await, "still here");
    manager.shutdown().await;
}

/// An answer holding more JSON values than psych-mcp parses fails its call at once with a
/// typed error, as a JSON body or an event, read in memory (4 MiB) or kept in a file for
/// its size (20 MiB), and the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_of_too_many_values_fails_its_call_unparsed_over_http() {
    let server = HttpServer::start(&[]);
    let (manager, reachability) = connect("web", &server.url).await;
    assert_eq!(reachability, Reachability::Reachable);
    let max = psych_mcp::MAX_JSON_STRUCTURAL_BYTES;
    for json in [true, false] {
        for count in [max, 10 * 1024 * 1024] {
            let arguments = json!({"count": count, "json": json});
            let error = fails_at_once(&manager, "many_values", arguments).await;
            assert!(
                matches!(&error, McpError::AnswerTooComplex { bytes, limit, .. }
                    if *limit == max && *bytes > 2 * count && *bytes < 2 * count + 200),
                "json {json}, {count} values: {error:?}"
            );
            assert_eq!(echo(&manager, "web", "still here").await, "still here");
        }
    }
    manager.shutdown().await;
}

/// rmcp reads the answer to `initialize` itself, unchecked: one of 4 MiB (zeros, too dense
/// to parse) is refused for its size, over the 2 MiB such answers are held to, before it is
/// parsed, and the connection fails saying so (it used to be parsed whole: 2 million
/// values).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_rmcp_reads_itself_is_held_to_two_mib() {
    let count = psych_mcp::MAX_JSON_STRUCTURAL_BYTES.to_string();
    let server = HttpServer::start(&["--json-response", "--dense-initialize", &count]);
    let (manager, reachability) = connect("web", &server.url).await;
    let Reachability::Unreachable { reason } = &reachability else {
        panic!("connected: {reachability:?}");
    };
    assert!(
        reason.contains("exceeded the maximum size of 2097152 bytes"),
        "{reason}"
    );
    manager.shutdown().await;
    // A small one connects (the same server, a handshake of ten values).
    let server = HttpServer::start(&["--json-response", "--dense-initialize", "10"]);
    let (manager, reachability) = connect("web", &server.url).await;
    assert_eq!(reachability, Reachability::Reachable);
    assert_eq!(echo(&manager, "web", "still here").await, "still here");
    manager.shutdown().await;
}

/// A POST the server rate-limits (a 429 with `Retry-After`), or its proxy refuses with a
/// 502 page while the server still answers a `ping` on the session, fails that call alone,
/// saying so; rmcp's session goes on, and so does the connection: no reconnection, no call
/// in flight lost. A server that refuses the ping too (here: answering every POST with a
/// 400, as one restarted without its sessions does) has lost the session: it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_post_fails_alone_while_the_session_answers_a_ping() {
    let server = HttpServer::start(&[]);
    let (manager, reachability) = connect("web", &server.url).await;
    assert_eq!(reachability, Reachability::Reachable);
    let error = fails_at_once(&manager, "rate_limited", json!({})).await;
    assert!(matches!(error, McpError::Protocol { .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.ends_with("HTTP 429 (Retry-After: 7)"), "{text}");
    assert_eq!(
        manager.reachability(&id("web")),
        Some(Reachability::Reachable)
    );
    // The backoff is 30 s: a session marked lost would fail this call as unreachable.
    assert_eq!(echo(&manager, "web", "still here").await, "still here");
    let error = fails_at_once(&manager, "bad_gateway", json!({})).await;
    assert!(matches!(error, McpError::Protocol { .. }), "{error:?}");
    assert!(error.to_string().contains("502"), "{error}");
    assert_eq!(echo(&manager, "web", "still here").await, "still here");
    let error = fails_at_once(&manager, "forget_sessions", json!({})).await;
    assert!(matches!(error, McpError::Closed { .. }), "{error:?}");
    assert!(error.to_string().contains("400"), "{error}");
    manager.shutdown().await;
}

/// Issue 27: an event over the 16 MiB held in memory that answers a call has its data
/// written to a file as it arrives and its text reaches `call_tool` kept in a file; the
/// connection stays. (An event over the limit that answers nothing awaited is refused, as
/// rmcp refuses it: `remote::tests::a_cut_event_and_an_event_over_the_limit_are_said`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_over_the_limit_arrives_with_its_text_in_a_file_and_the_connection_stays() {
    let server = HttpServer::start(&[]);
    let (manager, reachability) = connect("web", &server.url).await;
    assert_eq!(reachability, Reachability::Reachable);
    // 50 MB in one event, more than the 16 MiB bound (psych-mcp's MAX_SSE_EVENT_BYTES).
    assert_eq!(psych_mcp::MAX_SSE_EVENT_BYTES, 16 * 1024 * 1024);
    let bytes = 50_000_000;
    let output = call_large(&manager, bytes).await;
    assert_eq!(output.spilled.len(), 1, "{output:?}");
    assert_eq!(output.spilled[0].text.len(), bytes);
    assert_eq!(echo(&manager, "web", "still here").await, "still here");
    manager.shutdown().await;
}

/// Issue 27: a JSON body over the 16 MiB the transport reads into memory is written to a
/// file as it arrives, and its text reaches `call_tool` kept in a file (spilled), whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_body_over_the_limit_arrives_with_its_text_in_a_file() {
    let server = HttpServer::start(&["--json-response"]);
    let (manager, reachability) = connect("web", &server.url).await;
    assert_eq!(reachability, Reachability::Reachable);
    // 20 MB in one JSON body, more than the 16 MiB bound (MAX_JSON_BODY_BYTES).
    assert_eq!(psych_mcp::MAX_JSON_BODY_BYTES, 16 * 1024 * 1024);
    let bytes = 20_000_000;
    let output = call_large(&manager, bytes).await;
    assert_eq!(output.spilled.len(), 1, "{output:?}");
    let text = &output.spilled[0].text;
    assert_eq!((output.spilled[0].block, text.len()), (0, bytes));
    assert!(text.read_to_string().unwrap() == psych_test_server::large_text(bytes as usize));
    assert_eq!(echo(&manager, "web", "still here").await, "still here");
    manager.shutdown().await;
}

/// The answers too large for memory go where the manager's `spill_dir` says: a folder that
/// cannot hold them fails the call that needed one, saying where, at once; the connection
/// and the calls that fit in memory go on. Over both kinds of answer (a JSON body, an
/// event).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_too_large_for_memory_go_to_the_spill_dir_given() {
    let missing = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("http-faults-no-such-dir-{}", std::process::id()));
    for flags in [&["--json-response"][..], &[]] {
        let server = HttpServer::start(flags);
        let (manager, reachability) =
            connect_spilling("web", &server.url, &missing, SpillBudget::default()).await;
        assert_eq!(reachability, Reachability::Reachable);
        let error = fails_at_once(&manager, "large", json!({"bytes": 20_000_000})).await;
        assert!(
            error.to_string().contains(&*missing.to_string_lossy()),
            "{flags:?}: {error}"
        );
        assert_eq!(echo(&manager, "web", "still here").await, "still here");
        manager.shutdown().await;
    }
}

/// Issue 27: over HTTP too, the spill budget bounds what answers in files hold across
/// calls. With 45 MiB and a 20 MB result held, a 30 MB answer (a JSON body, an event) is
/// refused while it arrives: its call fails at once with the typed error, the session goes
/// on, and once the held result is dropped the next large answer arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_past_the_spill_budget_fail_their_calls_and_the_session_goes_on() {
    const MIB: u64 = 1024 * 1024;
    for flags in [&["--json-response"][..], &[]] {
        let server = HttpServer::start(flags);
        let budget = SpillBudget::new(45 * MIB);
        let (manager, reachability) =
            connect_spilling("web", &server.url, &std::env::temp_dir(), budget.clone()).await;
        assert_eq!(reachability, Reachability::Reachable);
        let held = call_large(&manager, 20_000_000).await;
        assert_eq!(held.spilled.len(), 1, "{flags:?}");
        assert_eq!(
            budget.in_use(),
            20_000_000,
            "{flags:?}: the held text, exactly"
        );
        let error = fails_at_once(&manager, "large", json!({"bytes": 30_000_000})).await;
        assert!(
            matches!(&error, McpError::SpillBudget { call, held, others, limit, .. }
                if call == "tools/call large" && *held > 0 && *others == 20_000_000
                    && *limit == 45 * MIB),
            "{flags:?}: {error:?}"
        );
        assert_eq!(
            budget.in_use(),
            20_000_000,
            "{flags:?}: the refused answer holds nothing"
        );
        assert_eq!(echo(&manager, "web", "still here").await, "still here");
        drop(held);
        assert_eq!(budget.in_use(), 0, "{flags:?}");
        let again = call_large(&manager, 20_000_000).await;
        assert_eq!(again.spilled[0].text.len(), 20_000_000, "{flags:?}");
        drop(again);
        assert_eq!(budget.in_use(), 0, "{flags:?}");
        manager.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_whose_schema_no_provider_takes_are_set_aside_by_name() {
    let catalog = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("http-faults-odd-{}.json", std::process::id()));
    std::fs::write(
        &catalog,
        json!({"tools": [
            {"name": "string_schema", "inputSchema": {"type": "string"}},
            {"name": "listed_properties",
             "inputSchema": {"type": "object", "properties": ["path", "mode"]}},
            {"name": "fine", "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}},
        ]})
        .to_string(),
    )
    .unwrap();
    let server = HttpServer::start(&["--catalog", catalog.to_str().unwrap(), "--page-size", "10"]);
    let (manager, reachability) = connect("web", &server.url).await;
    assert_eq!(reachability, Reachability::Reachable);
    let listing = manager.list(&id("web")).await.unwrap();
    assert!(listing.tools.iter().any(|t| t.name.as_str() == "fine"));
    let refused: Vec<String> = listing
        .malformed
        .iter()
        .map(|m| format!("{} (page {}): {}", m.name, m.page, m.reason))
        .collect();
    assert_eq!(
        refused,
        [
            r#"string_schema (page 2): inputSchema has type "string", not "object""#,
            r#"listed_properties (page 2): inputSchema's "properties" is an array, not an object of schemas"#,
        ]
    );
    manager.shutdown().await;
}
