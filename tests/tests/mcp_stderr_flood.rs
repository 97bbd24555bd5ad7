//! Issue 27, finding 3: a stdio server that writes a quarter gigabyte to stderr without a
//! line break (a `\r` progress bar, a runaway log) costs psych-mcp bounded memory, and the
//! server still works. A test binary of its own, so that the process's peak memory is this
//! test's alone.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod mcp_common;

use std::collections::BTreeMap;
use std::time::Duration;

use psych_mcp::{Backoff, McpConfig, McpError, McpManager, ServerConfig, Timeouts, Transport};
use psych_types::{ConnectionSpec, JsonObject, Reachability, ServerId, ToolRef};

/// The flood: far more than every stderr bound together (8 KiB read buffer, a 400-byte
/// line preview, 8 KiB of kept lines).
const FLOOD: u64 = 256 * 1024 * 1024;
/// What the flood may add to the process's peak memory: the bounds above plus the noise
/// of a tokio runtime and a connection, far below the flood.
const ALLOWED_GROWTH: u64 = 48 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarter_gigabyte_of_stderr_without_a_line_break_costs_bounded_memory() {
    let before = mcp_common::peak_memory();
    let server = ServerId::new("flood").unwrap();
    let config = ServerConfig {
        transport: Transport::Stdio {
            command: env!("CARGO_BIN_EXE_psych-test-server").to_owned(),
            args: vec!["--stderr-flood".into(), FLOOD.to_string()],
            env: BTreeMap::new(),
            cwd: None,
        },
        connection: ConnectionSpec::new(server.clone()),
        extra: JsonObject::new(),
    };
    let manager = McpManager::builder(McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap())
        // Generous: the flood is written before the server answers `initialize`.
        .timeouts(Timeouts::uniform(Duration::from_secs(120)))
        .backoff(Backoff::new(
            Duration::from_secs(600),
            Duration::from_secs(600),
        ))
        .build()
        .unwrap();
    let reachability = manager.add_server(server.clone(), config).await.unwrap();
    assert_eq!(reachability, Reachability::Reachable);
    let mut arguments = JsonObject::new();
    arguments.insert("text".into(), "after the flood".into());
    let echo = manager
        .call_tool_raw(&ToolRef::parse("flood", "echo").unwrap(), arguments)
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&echo.content).unwrap()[0]["text"],
        "after the flood"
    );
    let error = manager
        .call_tool_raw(
            &ToolRef::parse("flood", "crash").unwrap(),
            JsonObject::new(),
        )
        .await
        .unwrap_err();
    let McpError::Exited { stderr, .. } = &error else {
        panic!("{error}");
    };
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        3,
        "the flood's preview, its end, the crash: {stderr:?}"
    );
    assert!(
        lines[0].starts_with("####") && lines[0].ends_with('…') && lines[0].len() < 420,
        "{}",
        lines[0]
    );
    assert_eq!(lines[1], "psych-test-server: stderr flood done");
    assert_eq!(lines[2], "psych-test-server: crashing on request");
    manager.shutdown().await;
    let growth = mcp_common::peak_memory().saturating_sub(before);
    eprintln!(
        "peak memory before {} MiB, growth over a {} MiB stderr flood: {} MiB",
        before >> 20,
        FLOOD >> 20,
        growth >> 20
    );
    assert!(
        growth < ALLOWED_GROWTH,
        "peak memory grew by {} MiB over a {} MiB stderr flood",
        growth >> 20,
        FLOOD >> 20
    );
}
