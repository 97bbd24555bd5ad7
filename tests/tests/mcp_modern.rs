//! psych-mcp against servers of MCP 2026-07-28 only (no `initialize`: `server/discover`,
//! per-request `_meta`, `list_changed` on a `subscriptions/listen` stream) and against a
//! server from before it, each a real `psych-test-server` process, over stdio and
//! streamable HTTP: connect, list, call, a large result, a tool change announced, and a
//! listen stream that ends and is reopened (the catalogue lists again).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::collections::BTreeMap;
use std::time::Duration;

use psych_mcp::rmcp::model::{CallToolResult, ResultType};
use psych_mcp::{
    Backoff, ChangeCause, McpConfig, McpEvent, McpEvents, McpManager, ServerConfig, Timeouts,
    Transport,
};
use psych_types::{ConnectionSpec, JsonObject, Reachability, ServerId, ToolLister, ToolRef};
use serde_json::{Value, json};

use crate::mcp_common::{HttpServer, SERVER};

/// The size of the large result: past what one read of a stdio line or an HTTP body
/// usually holds, well within what stays in memory.
const LARGE: usize = 4 * 1024 * 1024;

fn id(name: &str) -> ServerId {
    ServerId::new(name).unwrap()
}

fn config(name: &str, transport: Transport) -> ServerConfig {
    ServerConfig {
        transport,
        connection: ConnectionSpec::new(id(name)),
        extra: JsonObject::new(),
    }
}

fn stdio(name: &str, args: &[&str]) -> ServerConfig {
    config(
        name,
        Transport::Stdio {
            command: SERVER.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: BTreeMap::new(),
            cwd: None,
        },
    )
}

fn http(name: &str, url: &str) -> ServerConfig {
    config(
        name,
        Transport::Http {
            url: url.to_owned(),
            headers: BTreeMap::new(),
        },
    )
}

/// Deadlines generous enough for a loaded machine: they only decide how long a failing
/// test takes.
fn timeouts() -> Timeouts {
    Timeouts::uniform(Duration::from_secs(20)).with_shutdown_grace(Duration::from_millis(500))
}

fn args(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        _ => panic!("not an object"),
    }
}

fn texts(result: &CallToolResult) -> Vec<String> {
    serde_json::to_value(&result.content)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|block| block["text"].as_str().map(str::to_owned))
        .collect()
}

/// Waits for the next `ToolsChanged` of `server`, skipping reachabilities; returns its cause.
async fn tools_changed(events: &McpEvents, server: &str) -> ChangeCause {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let McpEvent::ToolsChanged { server: s, cause } = events.next().await
                && s == id(server)
            {
                return cause;
            }
        }
    })
    .await
    .expect("no ToolsChanged came")
}

async fn call(manager: &McpManager, server: &str, tool: &str, arguments: Value) -> CallToolResult {
    manager
        .call_tool_raw(&ToolRef::parse(server, tool).unwrap(), args(arguments))
        .await
        .unwrap()
}

async fn has_tool(manager: &McpManager, server: &str, name: &str) -> bool {
    manager
        .list_tools(&id(server))
        .await
        .unwrap()
        .iter()
        .any(|tool| tool.name.as_str() == name)
}

/// Waits until the server has `want` listen streams watching for changes (rmcp's server
/// acknowledges a stream before its handler watches: see the test server's `listen`).
async fn listening(manager: &McpManager, server: &str, want: u64) {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let open = call(manager, server, "subscriptions", json!({})).await;
            if texts(&open)[0].parse::<u64>().unwrap() == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{server}: {want} listen streams never open"));
}

/// Connects to `server` and checks it end to end, as a server of `version`: the revision
/// agreed, a listing, a call, a large result, a tool added announced as a legacy
/// `list_changed` is, and (2026-07-28) a listen stream ended by the server reopened with a
/// change announced, after which changes still arrive.
async fn check(name: &str, server: ServerConfig, version: &str) {
    let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap();
    let manager = McpManager::builder(config)
        .timeouts(timeouts())
        .backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_millis(200),
        ))
        .build()
        .unwrap();
    let events = manager.events();
    let reachability = manager.add_server(id(name), server).await.unwrap();
    assert_eq!(reachability, Reachability::Reachable, "{name}");
    assert_eq!(tools_changed(&events, name).await, ChangeCause::Connected);

    let info = call(&manager, name, "client_info", json!({})).await;
    let info: Value = serde_json::from_str(&texts(&info)[0]).unwrap();
    assert_eq!(info["protocolVersion"], version, "{name}: {info}");

    assert!(has_tool(&manager, name, "echo").await);
    let echo = call(&manager, name, "echo", json!({"text": "hello"})).await;
    assert_eq!(texts(&echo), ["hello"]);
    // The raw answer keeps the field of its revision: `resultType` in 2026-07-28, none
    // before.
    let result_type = (version == "2026-07-28").then_some(ResultType::COMPLETE);
    assert_eq!(echo.result_type, result_type, "{name}");

    let large = call(&manager, name, "large", json!({"bytes": LARGE})).await;
    let text = &texts(&large)[0];
    assert_eq!(text.len(), LARGE);
    assert_eq!(*text, psych_test_server::large_text(LARGE));

    if version == "2026-07-28" {
        listening(&manager, name, 1).await;
    }
    call(&manager, name, "add_tool", json!({"name": "fresh_tool"})).await;
    assert_eq!(tools_changed(&events, name).await, ChangeCause::Notified);
    assert!(has_tool(&manager, name, "fresh_tool").await);
    let fresh = call(&manager, name, "fresh_tool", json!({"x": 1})).await;
    assert_eq!(texts(&fresh), ["fresh_tool called with {\"x\":1}"]);

    if version == "2026-07-28" {
        // The server ends the listen stream: psych-mcp opens it again and says to list
        // again (a change made meanwhile would have been missed)…
        call(&manager, name, "end_subscriptions", json!({})).await;
        assert_eq!(
            tools_changed(&events, name).await,
            ChangeCause::Resubscribed
        );
        // …and the new stream carries the next change.
        listening(&manager, name, 1).await;
        call(&manager, name, "remove_tool", json!({"name": "fresh_tool"})).await;
        assert_eq!(tools_changed(&events, name).await, ChangeCause::Notified);
        assert!(!has_tool(&manager, name, "fresh_tool").await);
    }
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_server_of_2026_07_28_only_is_listed_called_and_followed() {
    let server = HttpServer::start(&["--modern-only", "--tools", "5"]);
    check(
        "modern_http",
        http("modern_http", &server.url),
        "2026-07-28",
    )
    .await;
}

/// The same with answers as single `application/json` bodies (which psych-mcp reads
/// itself, not rmcp); the listen stream stays an event stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_with_json_bodies_a_server_of_2026_07_28_only_is_followed_too() {
    let server = HttpServer::start(&["--modern-only", "--json-response"]);
    check(
        "modern_json",
        http("modern_json", &server.url),
        "2026-07-28",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_stdio_a_server_of_2026_07_28_only_is_listed_called_and_followed() {
    check(
        "modern_stdio",
        stdio("modern_stdio", &["--modern-only", "--tools", "5"]),
        "2026-07-28",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_a_server_from_before_2026_07_28_still_gets_initialize() {
    let server = HttpServer::start(&["--tools", "5"]);
    check(
        "legacy_http",
        http("legacy_http", &server.url),
        "2025-11-25",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_stdio_a_server_from_before_2026_07_28_still_gets_initialize() {
    check(
        "legacy_stdio",
        stdio("legacy_stdio", &["--tools", "5"]),
        "2025-11-25",
    )
    .await;
}

/// What the `Auto` lifecycle costs with a server from before 2026-07-28 that reads
/// `server/discover` and never answers it (rather than answering an error, as the test
/// server and rmcp's do): rmcp waits 10 s for it, then sends `initialize` on the same
/// connection, which works. (A connect deadline under 10 s would end first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_ignores_server_discover_gets_initialize_after_ten_seconds() {
    let script = r#"
        id_of() { printf '%s' "$1" | sed 's/.*"id":\([0-9]*\).*/\1/'; }
        read -r discover
        read -r line
        printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"mute","version":"1"}}}\n' "$(id_of "$line")"
        read -r initialized
        read -r line
        printf '{"jsonrpc":"2.0","id":%s,"result":{"tools":[{"name":"only","inputSchema":{"type":"object"}}]}}\n' "$(id_of "$line")"
        while read -r line; do :; done
    "#;
    let server = config(
        "mute",
        Transport::Stdio {
            command: "sh".to_owned(),
            args: vec!["-c".to_owned(), script.to_owned()],
            env: BTreeMap::new(),
            cwd: None,
        },
    );
    let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap();
    let manager = McpManager::builder(config)
        .timeouts(Timeouts::uniform(Duration::from_secs(30)))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let reachability = manager.add_server(id("mute"), server).await.unwrap();
    let took = started.elapsed();
    assert_eq!(reachability, Reachability::Reachable);
    // Reachable means listed too: the first listing is part of connecting.
    assert!(took >= Duration::from_secs(10), "{took:?}");
    manager.shutdown().await;
}

/// The listen stream belongs to its session: a client that shuts down (or drops its
/// manager) ends its stream on the server, and another client's stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_stream_ends_with_its_session() {
    let server = HttpServer::start(&["--modern-only"]);
    let manager = |name: &str| {
        let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap();
        let manager = McpManager::builder(config)
            .timeouts(timeouts())
            .build()
            .unwrap();
        let events = manager.events();
        let name = name.to_owned();
        let url = server.url.clone();
        async move {
            let reachability = manager
                .add_server(id(&name), http(&name, &url))
                .await
                .unwrap();
            assert_eq!(reachability, Reachability::Reachable);
            (manager, events)
        }
    };
    let (first, _first_events) = manager("first").await;
    listening(&first, "first", 1).await;
    let (second, _second_events) = manager("second").await;
    listening(&second, "second", 2).await;
    first.shutdown().await;
    listening(&second, "second", 1).await;
    second.shutdown().await;
}
