//! `psych serve --http` as a process, driven by rmcp's streamable HTTP client, in front of a
//! test server (`psych serve-embedded`, a real process): the listing, a call, a large result
//! elided and read back by handle, an upstream result with unmodelled fields and block types
//! passed through whole (the same raw JSON as over stdio), an upstream `list_changed`
//! reaching the client, and a client of the 2026-07-28 revision served per request.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, CustomResult,
    ServerResult,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support::{Gateway, PSYCH, expect_handle, handle_in, listening, text};

/// A client that forwards each `tools/list_changed` to a channel.
struct Client {
    changed: mpsc::UnboundedSender<()>,
}

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.changed.send(());
    }
}

/// Starts `psych serve --http` in front of one test server, logging under `dir`: the
/// gateway and its URL.
async fn start(dir: &std::path::Path) -> (Gateway, String) {
    start_with(dir, &[]).await
}

/// [`start`] with `flags` for the test server.
async fn start_with(dir: &std::path::Path, flags: &[&str]) -> (Gateway, String) {
    start_serving(dir, flags, &[]).await
}

/// [`start`] with `flags` for the test server and `serving` for `psych serve`.
async fn start_serving(
    dir: &std::path::Path,
    flags: &[&str],
    serving: &[&str],
) -> (Gateway, String) {
    let config = dir.join("mcp.json");
    let mut args = vec!["serve-embedded", "--tools", "3"];
    args.extend_from_slice(flags);
    // Pinned direct: with the control tools it is over `psych serve`'s default auto budget.
    let upstream = json!({
        "command": PSYCH,
        "args": args,
        "preload": true,
    });
    std::fs::write(&config, json!({"mcpServers": {"up": upstream}}).to_string()).unwrap();
    let mut command = tokio::process::Command::new(PSYCH);
    command
        .arg("serve")
        .arg("--http")
        .arg("127.0.0.1:0")
        .arg("--config")
        .arg(&config)
        .arg("--dir")
        .arg(dir)
        .args(serving);
    listening(command).await
}

/// Waits until the upstream has been listed: `psych serve` answers `initialize` at once,
/// and the upstream reaches the client through `list_changed` as it connects (its
/// deferred line says "not listed yet" until then).
async fn ready<S: rmcp::Service<RoleClient>>(
    session: &RunningService<RoleClient, S>,
    changed: &mut mpsc::UnboundedReceiver<()>,
) {
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
    .expect("the upstream is listed");
}

/// The result of `up__exotic`, read raw (rmcp's typed result would drop the unknown
/// fields and refuse the unknown block type).
async fn exotic<S: rmcp::Service<RoleClient>>(session: &RunningService<RoleClient, S>) -> Value {
    let raw = session
        .peer()
        .send_request(ClientRequest::CallToolRequest(CallToolRequest::new(
            CallToolRequestParams::new("up__exotic"),
        )))
        .await
        .unwrap();
    let ServerResult::CustomResult(CustomResult(raw)) = raw else {
        panic!("the exotic result arrives raw: {raw:?}");
    };
    raw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psych_serve_over_streamable_http() {
    let dir = tempfile::tempdir().unwrap();
    let (_gateway, url) = start(dir.path()).await;

    let (changed, mut receiver) = mpsc::unbounded_channel();
    let session = Client { changed }
        .serve(StreamableHttpClientTransport::from_uri(url))
        .await
        .unwrap();
    ready(&session, &mut receiver).await;
    let call = async |name: &str, arguments: Value| -> CallToolResult {
        let Value::Object(arguments) = arguments else {
            panic!("arguments are an object");
        };
        session
            .call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(arguments))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };

    // The listing and a call.
    let tools = session.list_all_tools().await.unwrap();
    let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    for name in [
        "up__echo",
        "up__large",
        "psych_orientation",
        "read_tool_output",
    ] {
        assert!(names.iter().any(|n| n == name), "{name}: {names:?}");
    }
    let echoed = call("up__echo", json!({"text": "over http"})).await;
    assert_eq!(text(&echoed), "over http");

    // A large result elided, then read back by handle with grep.
    let large = call("up__large", json!({"bytes": 200_000})).await;
    let shown = text(&large);
    assert!(shown.len() < 10_000, "elided: {} bytes shown", shown.len());
    let handle = expect_handle(&shown);
    let read = call(
        "read_tool_output",
        json!({"handle": handle, "grep": "line 002345:"}),
    )
    .await;
    assert!(
        text(&read).contains("line 002345: the quick brown fox jumps over the lazy dog"),
        "{}",
        text(&read)
    );

    // An upstream result passes through whole, as over stdio.
    assert_eq!(exotic(&session).await, psych_test_server::exotic_result());

    // An upstream list_changed reaches the client.
    while receiver.try_recv().is_ok() {}
    let added = call("up__add_tool", json!({"name": "fresh_tool"})).await;
    assert_ne!(added.is_error, Some(true), "{}", text(&added));
    tokio::time::timeout(Duration::from_secs(20), receiver.recv())
        .await
        .expect("list_changed reaches the client")
        .unwrap();
    let after = session.list_all_tools().await.unwrap();
    assert!(after.iter().any(|t| t.name == "up__fresh_tool"));

    session.cancel().await.unwrap();
}

/// An upstream that speaks only 2026-07-28 (no `initialize`) is served like any other:
/// listed, called, its results passed through, and its tool changes (which it announces
/// only on a `subscriptions/listen` stream) reaching the gateway's client as `list_changed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_of_2026_07_28_only_is_served_like_any() {
    let dir = tempfile::tempdir().unwrap();
    let (_gateway, url) = start_with(dir.path(), &["--modern-only"]).await;
    let (changed, mut receiver) = mpsc::unbounded_channel();
    let session = Client { changed }
        .serve(StreamableHttpClientTransport::from_uri(url))
        .await
        .unwrap();
    ready(&session, &mut receiver).await;
    let echoed = session
        .call_tool(
            CallToolRequestParams::new("up__echo")
                .with_arguments(json!({"text": "modern"}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_eq!(text(&echoed), "modern");
    // A tool added upstream reaches the client through `list_changed`. (rmcp's server
    // acknowledges a listen stream before it watches, so a change in that instant can be
    // missed: one more is added each second until one arrives.)
    tokio::time::timeout(Duration::from_secs(30), async {
        for n in 0.. {
            let name = format!("fresh_{n}");
            let added = session
                .call_tool(
                    CallToolRequestParams::new("up__add_tool")
                        .with_arguments(json!({"name": name}).as_object().unwrap().clone()),
                )
                .await
                .unwrap();
            assert_ne!(added.is_error, Some(true), "{}", text(&added));
            if tokio::time::timeout(Duration::from_secs(1), receiver.recv())
                .await
                .is_ok()
            {
                let tools = session.list_all_tools().await.unwrap();
                if tools.iter().any(|t| t.name.starts_with("up__fresh_")) {
                    return;
                }
            }
        }
    })
    .await
    .expect("the upstream's change reaches the client");
    session.cancel().await.unwrap();
}

/// A client of 2026-07-28 (rmcp's `Auto` lifecycle: `server/discover` first) is served
/// per request, without a session: an upstream result passes through whole with the
/// revision's `resultType`, and its handles read back on its next request (a handle is
/// its identity's, not a session's). A bare per-request POST gets the same; one naming a
/// version the gateway does not speak is -32022 with the versions it does, and one whose
/// `Mcp-Name` header disagrees with its body is -32020, both HTTP 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_2026_07_28_is_served_per_request_with_results_whole() {
    use rmcp::model::ProtocolVersion;
    use rmcp::service::{ClientLifecycleMode, ClientServiceExt};

    let dir = tempfile::tempdir().unwrap();
    let (_gateway, url) = start(dir.path()).await;
    let modern = vec![ProtocolVersion::V_2026_07_28];
    let (changed, _receiver) = mpsc::unbounded_channel();
    let session = Client { changed }
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_uri(url.clone()),
            ClientLifecycleMode::Discover {
                preferred_versions: modern,
            },
        )
        .await
        .unwrap();
    let version = session.peer_info().unwrap().protocol_version.clone();
    assert_eq!(version, ProtocolVersion::V_2026_07_28);
    // The upstream connects in the background: its tools appear once it is listed.
    tokio::time::timeout(Duration::from_secs(60), async {
        while !session
            .list_all_tools()
            .await
            .unwrap()
            .iter()
            .any(|t| t.name == "up__exotic")
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the upstream is listed");
    let mut expected = psych_test_server::exotic_result();
    expected["resultType"] = json!("complete");
    let got = exotic(&session).await;
    assert_eq!(got, expected);
    // Its handles read back on its next request.
    let large = session
        .call_tool(
            CallToolRequestParams::new("up__large")
                .with_arguments(json!({"bytes": 200_000}).as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    let shown = text(&large);
    let handle = handle_in(&shown).unwrap_or_else(|| panic!("a handle in {shown}"));
    let read = session
        .call_tool(
            CallToolRequestParams::new("read_tool_output").with_arguments(
                json!({"handle": handle, "grep": "line 000777:"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
        )
        .await
        .unwrap();
    assert!(
        text(&read).contains("line 000777: the quick"),
        "{}",
        text(&read)
    );
    // The elided result links the whole one, which resources/read serves per request too.
    let uri = large
        .content
        .iter()
        .find_map(|block| match block {
            rmcp::model::ContentBlock::ResourceLink(link) => Some(link.uri.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("a resource link in {large:?}"));
    let whole = session
        .read_resource(rmcp::model::ReadResourceRequestParams::new(uri))
        .await
        .unwrap();
    match whole.contents.as_slice() {
        [rmcp::model::ResourceContents::TextResourceContents { text, .. }] => {
            assert_eq!(text, &psych_test_server::large_text(200_000));
        }
        other => panic!("one text in {other:?}"),
    }
    session.cancel().await.unwrap();

    let call = |version: &str| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "up__echo",
            "arguments": {"text": "per request"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": version,
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        }})
        .to_string()
    };
    let answer = post(&url, &call("2026-07-28"), "2026-07-28", "up__echo").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains(r#""text":"per request""#) && answer.contains(r#""resultType":"complete""#),
        "{answer}"
    );
    let answer = post(&url, &call("1900-01-01"), "1900-01-01", "up__echo").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("-32022") && answer.contains("2026-07-28"),
        "{answer}"
    );
    let answer = post(&url, &call("2026-07-28"), "2026-07-28", "up__other").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("-32020"), "{answer}");
    assert!(!answer.contains("per request\""), "not served: {answer}");
}

/// One JSON-RPC POST of `body` (a `tools/call`) to `url` (`http://host:port/path`) over a
/// bare TCP stream, with the headers a client of 2026-07-28 sends (`version` and the tool
/// `name`): the whole HTTP answer as text.
async fn post(url: &str, body: &str, version: &str, name: &str) -> String {
    tokio::time::timeout(
        Duration::from_secs(30),
        post_unbounded(url, body, version, name),
    )
    .await
    .expect("the gateway answers")
}

/// [`post`] waiting as long as the answer takes.
async fn post_unbounded(url: &str, body: &str, version: &str, name: &str) -> String {
    let headers = format!(
        "MCP-Protocol-Version: {version}\r\nMcp-Method: tools/call\r\nMcp-Name: {name}\r\n"
    );
    post_with(url, body, &headers).await
}

/// A POST of `body` (MCP 2026-07-28) with `headers` (each ending in CRLF) besides the
/// revision's: the whole HTTP answer, within 30 s.
async fn post_as(url: &str, body: &str, headers: &str) -> String {
    let headers = format!("MCP-Protocol-Version: 2026-07-28\r\n{headers}");
    tokio::time::timeout(Duration::from_secs(30), post_with(url, body, &headers))
        .await
        .expect("the gateway answers")
}

/// A POST of `body` with the MCP headers `headers` (each ending in CRLF): the whole HTTP
/// answer, waiting as long as it takes.
async fn post_with(url: &str, body: &str, headers: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json, text/event-stream\r\n\
         Content-Type: application/json\r\n{headers}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

/// Waits until a 2026-07-28 call of `up__echo` is served: the upstream connects in the
/// background, and a session slot may be freed later.
async fn until_served(url: &str) {
    let echo = modern_call("up__echo", json!({"text": "through"}));
    tokio::time::timeout(Duration::from_secs(60), async {
        while !post(url, &echo, "2026-07-28", "up__echo")
            .await
            .contains(r#""text":"through""#)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the call is served");
}

/// One per-request `tools/call` of `tool` (MCP 2026-07-28) with `arguments`.
fn modern_call(tool: &str, arguments: Value) -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": tool,
        "arguments": arguments,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        },
    }})
    .to_string()
}

/// A POST whose body holds more brackets, braces, commas and colons than
/// `MAX_REQUEST_STRUCTURAL_BYTES` is answered 413 with error -32600 for its id, unparsed and
/// nothing called; one at the bound is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_past_the_structural_bound_is_answered_413() {
    let dir = tempfile::tempdir().unwrap();
    let (gateway, url) = start(dir.path()).await;
    until_served(&url).await;
    let max = psych_gateway::MAX_REQUEST_STRUCTURAL_BYTES;
    // A call of `up__echo` with `zeros` zeros in its `_meta`, where no schema looks.
    let call = |zeros: u64| {
        let zeros = vec!["0"; usize::try_from(zeros).unwrap()].join(",");
        format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"up__echo","arguments":{{"text":"through"}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}},"pad":[{zeros}]}}}}}}"#
        )
    };
    let structure = |json: &str| {
        let mut structure = psych_mcp::wire::Structure::default();
        structure.feed(json.as_bytes(), u64::MAX);
        structure.count()
    };
    // Each zero past the first adds a comma.
    let at = call(max - structure(&call(1)) + 1);
    assert_eq!(structure(&at), max);
    let answer = post(&url, &at, "2026-07-28", "up__echo").await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "{}",
        &answer[..answer.len().min(500)]
    );
    assert!(answer.contains(r#""text":"through""#));
    // With 1 MiB of blanks after it, which the gateway reads and drops (admit's unit test
    // checks it reads to the end; on loopback the answer arrives either way).
    let over = call(max - structure(&call(1)) + 2) + &" ".repeat(1 << 20);
    let answer = post(&url, &over, "2026-07-28", "up__echo").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["id"], json!(7), "{body}");
    assert_eq!(body["error"]["code"], json!(-32600), "{body}");
    assert_eq!(
        body["error"]["data"]["maxStructuralBytes"],
        json!(max),
        "{body}"
    );
    drop(gateway);
}

/// A POST whose body is over 4 MiB (a call's long padding, and 1 MiB of blanks after it)
/// is answered 413 with error -32600 for its id, nothing called; its rest is read (up to
/// 4 MiB more), so the answer is not lost to a connection reset by bytes left unread. One
/// of 4 MiB is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_over_4_mib_is_answered_413_for_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let (gateway, url) = start(dir.path()).await;
    until_served(&url).await;
    // A call of `up__echo` with `len` bytes of padding in its `_meta`, where no schema
    // looks.
    let call = |len: usize| {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "up__echo",
            "arguments": {"text": "through"},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "pad": "p".repeat(len),
            },
        }})
        .to_string()
    };
    let max = 4 << 20;
    let at = call(max - call(0).len());
    assert_eq!(at.len(), max);
    let answer = post(&url, &at, "2026-07-28", "up__echo").await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains(r#""text":"through""#),
        "{}",
        &answer[..answer.len().min(500)]
    );
    let over = call(max - call(0).len() + 1) + &" ".repeat(1 << 20);
    let answer = post(&url, &over, "2026-07-28", "up__echo").await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["id"], json!(1), "{body}");
    assert_eq!(body["error"]["code"], json!(-32600), "{body}");
    assert_eq!(body["error"]["data"]["maxBodyBytes"], json!(max), "{body}");
    drop(gateway);
}

/// POSTs in flight are bounded across clients: with `MAX_REQUESTS` calls held upstream,
/// one more POST is answered at once with 429 and a JSON-RPC error saying why, and the
/// held calls are not disturbed; a notification still passes the bound. (Each per-request call holds a session
/// slot while it runs, so the session cap is raised past the bound.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_past_the_bound_in_flight_is_answered_429() {
    let dir = tempfile::tempdir().unwrap();
    let sessions = (2 * psych_gateway::MAX_REQUESTS).to_string();
    let (gateway, url) = start_serving(dir.path(), &[], &["--max-sessions", &sessions]).await;
    until_served(&url).await;
    let echo = modern_call("up__echo", json!({"text": "through"}));
    let mut held = tokio::task::JoinSet::new();
    for _ in 0..psych_gateway::MAX_REQUESTS {
        let url = url.clone();
        // A call refused while a probe held a place (or a session slot) is sent again:
        // each ends held.
        held.spawn(async move {
            let hang = modern_call("up__hang", json!({}));
            loop {
                let answer = post_unbounded(&url, &hang, "2026-07-28", "up__hang").await;
                let refused = ["HTTP/1.1 429", "HTTP/1.1 503"];
                assert!(refused.iter().any(|r| answer.starts_with(r)), "{answer}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    // A probe is answered as usual until every held call has its place, then refused.
    let refused = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let answer = post(&url, &echo, "2026-07-28", "up__echo").await;
            if answer.starts_with("HTTP/1.1 429") {
                return answer;
            }
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the bound is reached");
    assert!(
        refused
            .to_ascii_lowercase()
            .contains("\r\nretry-after: 1\r\n"),
        "{refused}"
    );
    let body: Value = serde_json::from_str(refused.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"jsonrpc": "2.0", "error": {"code": -32000, "message":
            "too many requests in flight: the gateway handles 256 at once",
            "data": {"inFlight": 256}}})
    );
    // At the bound, a notification still passes (202: taken; per request, as here, rmcp
    // ignores it, but in a session a cancellation would end what holds the places).
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {
        "requestId": 1,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"},
    }})
    .to_string();
    let answer = post_as(&url, &cancel, "Mcp-Method: notifications/cancelled\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    assert!(
        held.try_join_next().is_none(),
        "the held calls are still held"
    );
    drop(gateway);
    held.abort_all();
}

/// A request of MCP 2026-07-28 runs in a session of its own, in one of the gateway's
/// session slots: with every slot taken (the one, by a legacy session), it is answered 503
/// with `Retry-After` and a JSON-RPC error for its id naming the cap, not rmcp's 500 for a
/// session it could not make, and rmcp's client of 2026-07-28 gives its caller that error;
/// a client probing with `server/discover` gets a bare 503, not an error that would make
/// it fall back to `initialize`; once the legacy session is deleted, calls are served
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_the_session_cap_is_answered_503() {
    use rmcp::model::ProtocolVersion;
    use rmcp::service::{ClientLifecycleMode, ClientServiceExt};

    let dir = tempfile::tempdir().unwrap();
    let (gateway, url) = start_serving(dir.path(), &[], &["--max-sessions", "1"]).await;
    until_served(&url).await;
    let echo = modern_call("up__echo", json!({"text": "through"}));
    // A client of 2026-07-28 (its `server/discover` holds the slot a moment, as a call).
    let modern = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let (changed, _) = mpsc::unbounded_channel();
            let lifecycle = ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            };
            if let Ok(session) = (Client { changed })
                .serve_with_lifecycle(
                    StreamableHttpClientTransport::from_uri(url.clone()),
                    lifecycle,
                )
                .await
            {
                break session;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the client of 2026-07-28 starts");
    // The last call's session may still be closing: the legacy one opens once it has.
    let legacy = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let (changed, _) = mpsc::unbounded_channel();
            if let Ok(session) = (Client { changed })
                .serve(StreamableHttpClientTransport::from_uri(url.clone()))
                .await
            {
                break session;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the legacy session opens");
    let refused = post(&url, &echo, "2026-07-28", "up__echo").await;
    let (head, body) = refused.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{refused}"
    );
    let head = head.to_ascii_lowercase();
    assert!(head.contains("\r\nretry-after: 1\r\n"), "{refused}");
    assert!(
        head.contains("\r\ncontent-type: application/json\r\n"),
        "{refused}"
    );
    let body: Value = serde_json::from_str(body).unwrap();
    let cap = "the gateway: 1 session is open, the most it allows (psych serve: --max-sessions)";
    assert_eq!(body["id"], 1, "{body}");
    assert_eq!(body["error"]["code"], -32000, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with(cap), "{message}");
    // rmcp's client gives its caller the error, at once.
    let call = CallToolRequestParams::new("up__echo")
        .with_arguments(json!({"text": "through"}).as_object().unwrap().clone());
    let error = tokio::time::timeout(Duration::from_secs(30), modern.call_tool(call))
        .await
        .expect("answered at once")
        .unwrap_err();
    assert!(error.to_string().contains(cap), "{error}");
    // A client probing with `server/discover` gets the bare 503: an HTTP error, not an
    // answer saying the gateway is of an earlier revision.
    let (changed, _) = mpsc::unbounded_channel();
    let auto = (Client { changed })
        .serve_with_lifecycle(
            StreamableHttpClientTransport::from_uri(url.clone()),
            ClientLifecycleMode::Auto {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                legacy_version: None,
            },
        )
        .await;
    let error = format!("{:?}", auto.err().expect("refused while full"));
    assert!(error.contains("503"), "{error}");
    assert!(!error.contains("both failed"), "{error}");
    // The legacy session is served meanwhile; deleted, it frees the slot.
    assert!(!legacy.list_all_tools().await.unwrap().is_empty());
    legacy.cancel().await.unwrap();
    until_served(&url).await;
    drop(modern);
    drop(gateway);
}

/// A POST of `body` in the legacy session `session` (2025-06-18; none if empty), its answer
/// read until it holds `until` (or ends): the connection, still open, and what was read.
async fn in_session(
    url: &str,
    session: &str,
    body: &Value,
    until: &str,
) -> (tokio::net::TcpStream, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let body = body.to_string();
    // No session header on the request that opens one.
    let session = if session.is_empty() {
        String::new()
    } else {
        format!("Mcp-Session-Id: {session}\r\nMCP-Protocol-Version: 2025-06-18\r\n")
    };
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json, text/event-stream\r\n\
         Content-Type: application/json\r\n{session}Content-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut read = Vec::new();
    let mut chunk = vec![0; 64 * 1024];
    tokio::time::timeout(Duration::from_secs(30), async {
        while !String::from_utf8_lossy(&read).contains(until) {
            let n = stream.read(&mut chunk).await.unwrap();
            if n == 0 {
                break;
            }
            read.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("the gateway answers");
    (stream, String::from_utf8_lossy(&read).into_owned())
}

/// A session stays open while a call runs longer than `--session-idle-secs` with nothing
/// to report (no message either way), and is closed once it has been idle that long after
/// its answer. (Before, rmcp's keep-alive counted messages only: the session ended mid-call
/// and the call was cancelled.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_longer_than_the_idle_limit_keeps_its_session() {
    let dir = tempfile::tempdir().unwrap();
    // 3 s: each step before the long call (a message every few milliseconds, or a new
    // connection per call while the upstream starts) comes well within it, on a loaded
    // machine too.
    let (_gateway, url) = start_serving(dir.path(), &[], &["--session-idle-secs", "3"]).await;
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    }});
    let (_, opened) = in_session(&url, "", &initialize, "serverInfo").await;
    let session = crate::support::session_id(&opened);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (_, accepted) = in_session(&url, &session, &initialized, "\r\n\r\n").await;
    assert!(accepted.starts_with("HTTP/1.1 202"), "{accepted}");
    let sleep = |id: u64, ms: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "up__sleep", "arguments": {"ms": ms, "tag": "slept"}}})
    };
    // The upstream connects in the background (a short call until it is listed).
    tokio::time::timeout(Duration::from_secs(60), async {
        for id in 1000.. {
            let (_, answer) = in_session(&url, &session, &sleep(id, 1), "}}").await;
            if answer.contains("slept") {
                return;
            }
            assert!(
                !answer.starts_with("HTTP/1.1 404"),
                "closed while idle: {answer}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the upstream is listed");
    let (_, answer) = in_session(&url, &session, &sleep(1, 6_000), "}}").await;
    assert!(answer.contains("slept"), "{answer}");
    // Idle after it: closed (404 for its id) within a few of its seconds.
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
            let (_, answer) = in_session(&url, &session, &list, "\r\n\r\n").await;
            if answer.starts_with("HTTP/1.1 404") {
                return;
            }
            // (A listing is a message: the session's idle time starts again.)
            tokio::time::sleep(Duration::from_millis(3_500)).await;
        }
    })
    .await
    .expect("the idle session is closed");
}

/// In a session, a request goes on in the session's worker when its client goes away, so
/// the POST's place is not what bounds it: the session's transport counts its requests
/// in flight, and with 64 calls held upstream whose clients left, the next call in the
/// session is answered at once with -32000 rather than started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_bounds_the_calls_its_clients_left_behind() {
    let dir = tempfile::tempdir().unwrap();
    let (_gateway, url) = start_with(dir.path(), &["--announce-hang"]).await;
    // The session, opened by hand to keep its id.
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    }});
    let (_, opened) = in_session(&url, "", &initialize, "serverInfo").await;
    let session = crate::support::session_id(&opened);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (_, accepted) = in_session(&url, &session, &initialized, "\r\n\r\n").await;
    assert!(accepted.starts_with("HTTP/1.1 202"), "{accepted}");
    let echo = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "up__echo", "arguments": {"text": "through"}}})
    };
    // The upstream connects in the background.
    tokio::time::timeout(Duration::from_secs(60), async {
        for id in 1000.. {
            let (_, answer) = in_session(&url, &session, &echo(id), "\"through\"").await;
            if answer.contains("\"text\":\"through\"") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the upstream is listed");
    // Each call says it reached the upstream (progress "hanging"), then its client leaves.
    for id in 0..psych_gateway::MAX_REQUESTS_PER_SESSION as u64 {
        let hang = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "up__hang", "arguments": {}, "_meta": {"progressToken": format!("p{id}")},
        }});
        // (Refused with 429 while the gateway has not yet seen an earlier client go.)
        loop {
            let (stream, answer) = in_session(&url, &session, &hang, "hanging").await;
            if answer.starts_with("HTTP/1.1 429") {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            assert!(answer.contains("hanging"), "call {id}: {answer}");
            drop(stream);
            break;
        }
    }
    // Once the gateway has seen the clients go (their POSTs' places are given back; a 429
    // until then), the next call is refused by the session.
    let refused = tokio::time::timeout(Duration::from_secs(60), async {
        let mut id = 2000;
        loop {
            let (_, answer) = in_session(&url, &session, &echo(id), "}}").await;
            if !answer.starts_with("HTTP/1.1 429") {
                return answer;
            }
            id += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the clients' places are given back");
    assert!(
        refused.contains(
            r#""error":{"code":-32000,"message":"too many requests in flight: a session may have 64 at once","data":{"inFlight":64}}"#
        ),
        "{refused}"
    );
}

/// A client that asks for a large answer and reads nothing is cut at the write deadline
/// (`WRITE_WITHIN`, 30 s), as `serve_http` wires it: a `resources/read` of a 16 MB result,
/// sent over a bare TCP stream that then reads nothing for 40 s, gets only what the
/// sockets' buffers held (a few MB) and the end of the connection, where without the
/// deadline it would get the whole answer once it reads. (The deadline itself is tested
/// against hyper's connection in `psych-gateway`'s `admit` module.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_is_cut_at_the_write_deadline() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let dir = tempfile::tempdir().unwrap();
    let (gateway, url) = start(dir.path()).await;
    until_served(&url).await;
    const BYTES: u64 = 16_000_000;
    let large = modern_call("up__large", json!({"bytes": BYTES}));
    let answer = post(&url, &large, "2026-07-28", "up__large").await;
    let answer: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let shown = answer["result"]["content"][0]["text"].as_str().unwrap();
    let handle: psych_types::RecordHandle = expect_handle(shown).parse().unwrap();
    let uri = psych_gateway::result_uri(&handle);
    let body = json!({"jsonrpc": "2.0", "id": 2, "method": "resources/read", "params": {
        "uri": uri,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        },
    }})
    .to_string();
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    // A receive buffer of its own size (64 KiB): the kernel does not grow it, so what the
    // sockets hold stays a few MB whatever the host's `tcp_rmem` allows.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(64 << 10).unwrap();
    let mut stream = socket.connect(host.parse().unwrap()).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json, text/event-stream\r\n\
         Content-Type: application/json\r\nMCP-Protocol-Version: 2026-07-28\r\n\
         Mcp-Method: resources/read\r\nMcp-Name: {uri}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    // The answer's first bytes (it is built and being written), then nothing read for
    // longer than the deadline.
    let mut got = Vec::new();
    let mut buffer = vec![0; 1 << 20];
    let first = tokio::time::timeout(Duration::from_secs(60), stream.read(&mut buffer))
        .await
        .expect("the answer begins")
        .unwrap();
    got.extend_from_slice(&buffer[..first]);
    tokio::time::sleep(Duration::from_secs(40)).await;
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the connection was not ended");
    let head = String::from_utf8_lossy(&got[..got.len().min(200)]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        (got.len() as u64) < BYTES * 3 / 4,
        "{} bytes of a {BYTES}-byte text came: the connection was not cut",
        got.len()
    );
    drop(gateway);
}
