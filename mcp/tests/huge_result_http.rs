//! Issue 27 over streamable HTTP: a 200 MiB tool result sent as one `application/json`
//! body reaches `call_tool` with its text kept in a file (spilled), not refused, and costs
//! psych-mcp memory far below its size. A test binary of its own, so that the process's
//! peak memory is this test's alone (the test server, another process, holds the result in
//! memory to serve it: rmcp's server side makes the body whole).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use psych_mcp::{Backoff, McpConfig, McpManager, ServerConfig, Timeouts, Transport};
use psych_types::{ConnectionSpec, JsonObject, Reachability, ServerId, ToolHost, ToolRef};

mod common;
use common::HttpServer;

/// The result's size.
const BYTES: usize = 200 * 1024 * 1024;
/// What the result may add to the process's peak memory: the 16 MiB body read into
/// memory before it goes to a file (up to 32 MiB of capacity as it grows), two 1 MiB
/// chunks, the split's buffers, a runtime's and an HTTP client's noise.
const ALLOWED_GROWTH: u64 = 64 * 1024 * 1024;

/// The last `len` bytes of `large_text(bytes)`, made line by line without holding it.
fn large_tail(bytes: usize, len: usize) -> String {
    let mut lines = VecDeque::new();
    let (mut total, mut kept, mut n) = (0usize, 0usize, 0u64);
    while total < bytes {
        n += 1;
        let line = format!("line {n:06}: the quick brown fox jumps over the lazy dog\n");
        total += line.len();
        kept += line.len();
        lines.push_back(line);
        while kept - lines.front().map_or(0, String::len) >= len + 64 {
            kept -= lines.pop_front().map_or(0, |l| l.len());
        }
    }
    let mut tail: String = lines.into_iter().collect();
    tail.truncate(tail.len() - (total - bytes));
    tail[tail.len() - len..].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mib_json_body_arrives_in_a_file_with_bounded_memory() {
    let tail = large_tail(BYTES, 4096);
    let server = HttpServer::start(&["--json-response"]);
    let before = common::peak_memory();
    let name = ServerId::new("web").unwrap();
    let config = ServerConfig {
        transport: Transport::Http {
            url: server.url.clone(),
            headers: BTreeMap::new(),
        },
        connection: ConnectionSpec::new(name.clone()),
        extra: JsonObject::new(),
    };
    let manager = McpManager::builder(McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap())
        .timeouts(Timeouts::uniform(Duration::from_secs(600)))
        .backoff(Backoff::new(
            Duration::from_secs(600),
            Duration::from_secs(600),
        ))
        .build()
        .unwrap();
    let reachability = manager.add_server(name, config).await.unwrap();
    assert_eq!(reachability, Reachability::Reachable);
    let mut arguments = JsonObject::new();
    arguments.insert("bytes".into(), BYTES.into());
    let started = Instant::now();
    let output = manager
        .call_tool(&ToolRef::parse("web", "large").unwrap(), arguments)
        .await
        .unwrap();
    let took = started.elapsed();
    let peak = common::peak_memory();
    assert_eq!(output.spilled.len(), 1, "{output:?}");
    let text = &output.spilled[0].text;
    assert_eq!(text.len(), BYTES as u64);
    let mut end = vec![0; 4096];
    assert_eq!(text.read_at(BYTES as u64 - 4096, &mut end).unwrap(), 4096);
    assert!(end == tail.as_bytes(), "the text's end differs");
    let mut start = vec![0; 12];
    text.read_at(0, &mut start).unwrap();
    assert_eq!(start, b"line 000001:");
    manager.shutdown().await;
    let growth = peak.saturating_sub(before);
    println!(
        "a {} MiB JSON body: spilled in {took:?}; peak RSS {} MiB (from {} MiB before, \
         growth {} MiB)",
        BYTES >> 20,
        peak >> 20,
        before >> 20,
        growth >> 20
    );
    assert!(
        growth < ALLOWED_GROWTH,
        "peak memory grew by {growth} bytes for a {BYTES} byte body"
    );
}
