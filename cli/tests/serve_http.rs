//! `psych serve --http` as a process, driven by rmcp's streamable HTTP client, in front of a
//! test server (`psych serve-embedded`, a real process): the listing, a call, a large result
//! elided and read back by handle, an upstream result with unmodelled fields and block types
//! passed through whole (the same raw JSON as over stdio), and an upstream `list_changed`
//! reaching the client.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::process::Stdio;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, CustomResult,
    ServerResult,
};
use rmcp::service::NotificationContext;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;

const PSYCH: &str = env!("CARGO_BIN_EXE_psych");

/// A client that forwards each `tools/list_changed` to a channel.
struct Client {
    changed: mpsc::UnboundedSender<()>,
}

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.changed.send(());
    }
}

/// The result's text blocks.
fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

/// Stops the gateway as Ctrl-C would (it then stops its upstream servers), and reaps it.
struct Gateway(tokio::process::Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(pid) = self.0.id() {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psych_serve_over_streamable_http() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mcp.json");
    let upstream = json!({"command": PSYCH, "args": ["serve-embedded", "--tools", "3"]});
    std::fs::write(&config, json!({"mcpServers": {"up": upstream}}).to_string()).unwrap();
    let mut child = tokio::process::Command::new(PSYCH)
        .arg("serve")
        .arg("--http")
        .arg("127.0.0.1:0")
        .arg("--config")
        .arg(&config)
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _gateway = Gateway(child);
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the gateway says where it listens")
        .unwrap()
        .unwrap();
    let url = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_owned();

    let (changed, mut receiver) = mpsc::unbounded_channel();
    let session = Client { changed }
        .serve(StreamableHttpClientTransport::from_uri(url))
        .await
        .unwrap();
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
    let handle = shown
        .split("handle \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("a handle in {shown}"))
        .to_owned();
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

    // An upstream result passes through whole, as over stdio: rmcp's typed result would
    // drop the unknown fields and refuse the unknown block type, so it is read raw.
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
    assert_eq!(raw, psych_mcp::test_server::exotic_result());

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
