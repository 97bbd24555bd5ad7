//! Issue 27, finding 2's last part: a 200 MiB tool result through a real stdio server
//! reaches `call_tool` as a `ToolOutput` whose text is kept in files (spilled), not
//! dropped, and costs psych-mcp memory far below its size. A test binary of its own, so
//! that the process's peak memory is this test's alone. `PSYCH_HUGE_MIB` sets the size
//! (the 1 GiB run is made by hand with it).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod mcp_common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use psych_mcp::{Backoff, McpConfig, McpManager, ServerConfig, Timeouts, Transport};
use psych_test_server::{huge_end, huge_line, huge_lines};
use psych_types::{
    ConnectionSpec, ContentBlock, JsonObject, Reachability, ServerId, ToolHost, ToolRef,
};
use serde_json::json;

/// The result's first text block, in MiB.
const MIB: u64 = 200;
/// What the result may add to the process's peak memory: the 16 MiB a line is read into
/// memory before it is written to a file, two 1 MiB write chunks, the split's buffers and
/// what stays in memory, plus a runtime and a connection's noise; far below the result.
const ALLOWED_GROWTH: u64 = 64 * 1024 * 1024;

/// The bytes of `text` from `offset`, `len` of them.
fn read(text: &psych_types::SpilledText, offset: u64, len: usize) -> String {
    let mut buf = vec![0; len];
    let n = text.read_at(offset, &mut buf).unwrap();
    buf.truncate(n);
    String::from_utf8(buf).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_200_mib_result_arrives_in_files_with_bounded_memory() {
    let mib = std::env::var("PSYCH_HUGE_MIB")
        .ok()
        .and_then(|mib| mib.parse().ok())
        .unwrap_or(MIB);
    let before = mcp_common::peak_memory();
    let server = ServerId::new("huge").unwrap();
    let config = ServerConfig {
        transport: Transport::Stdio {
            command: env!("CARGO_BIN_EXE_psych-test-server").to_owned(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
        },
        connection: ConnectionSpec::new(server.clone()),
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
    let reachability = manager.add_server(server.clone(), config).await.unwrap();
    assert_eq!(reachability, Reachability::Reachable);
    let arguments = json!({"mib": mib, "second_mib": 1, "lone_surrogate": true, "bad_utf8": true});
    let serde_json::Value::Object(arguments) = arguments else {
        unreachable!()
    };
    let started = Instant::now();
    let output = manager
        .call_tool(&ToolRef::parse("huge", "raw_huge").unwrap(), arguments)
        .await
        .unwrap();
    let took = started.elapsed();
    let peak = mcp_common::peak_memory();

    assert_eq!(output.spilled.len(), 2, "{output:?}");
    let lines = huge_lines(mib);
    let end = huge_end(lines);
    // Two U+FFFD (3 bytes each) midway: the lone surrogate and the byte that is not UTF-8.
    let len = lines * 64 + end.len() as u64 + 6;
    let first = &output.spilled[0];
    assert_eq!((first.block, first.text.len()), (0, len));
    assert_eq!(read(&first.text, 0, 14), "line 00000001 ");
    assert_eq!(read(&first.text, len - end.len() as u64, 4096), end);
    let last_line = huge_line(lines).replace("\\n", "\n");
    assert_eq!(
        read(&first.text, len - end.len() as u64 - 64, 64),
        last_line
    );
    let middle = lines / 2 * 64;
    assert_eq!(
        read(&first.text, middle, 6 + 14),
        format!("\u{FFFD}\u{FFFD}line {:08} ", lines / 2 + 1)
    );
    let ContentBlock::Text(block) = &output.content[0] else {
        panic!("not a text block: {:?}", output.content[0]);
    };
    assert_eq!(block.text, first.text.placeholder());
    let second = &output.spilled[1];
    let second_end = huge_end(huge_lines(1));
    assert_eq!(second.block, 1);
    assert_eq!(
        second.text.len(),
        huge_lines(1) * 64 + second_end.len() as u64
    );
    assert_eq!(
        output.meta.as_ref().unwrap()["psych/lossy"],
        "invalid UTF-8 replaced by U+FFFD at 1 places; lone surrogate escapes replaced by \
         U+FFFD at 1 place"
    );

    // The connection is still usable.
    let mut echo = JsonObject::new();
    echo.insert("text".into(), "after the huge result".into());
    let after = manager
        .call_tool(&ToolRef::parse("huge", "echo").unwrap(), echo)
        .await
        .unwrap();
    assert_eq!(after.readable_text(), "after the huge result");
    manager.shutdown().await;

    let growth = peak.saturating_sub(before);
    println!(
        "a {mib} MiB result: {} bytes spilled in {took:?}; peak RSS {} MiB (from {} MiB \
         before, growth {} MiB)",
        len,
        peak >> 20,
        before >> 20,
        growth >> 20
    );
    assert!(
        growth < ALLOWED_GROWTH,
        "peak memory grew by {growth} bytes for a {mib} MiB result"
    );
}
