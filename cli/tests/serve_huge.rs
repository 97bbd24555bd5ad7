//! Results larger than `psych serve` holds in memory, as issue 27 asks: a 200 MiB and a
//! 1 GiB tool result from a real upstream process (the test server's `raw_huge`, written to
//! its stdout as one line without ever being held) reach the client as a preview with a
//! handle; `read_tool_output` reads the end of each back from the session's record log (an
//! offset read at the last line, a grep from near the end); the log holds each whole; and
//! the gateway's peak resident memory (`VmHWM`) stays well under the result's size. So
//! does a result of two 100 MiB texts around an image, whose preview names the image.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use psych_test_server::{huge_end, huge_lines};
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::support::{PSYCH, expect_handle, stdio_gateway, text};

/// How much the gateway's peak resident memory may grow over its peak at start while it
/// takes a huge result: a third of the smaller result, a sixteenth of the larger.
const GROWTH_BOUND_MIB: u64 = 64;

/// A hang guard only: a call that takes this long has failed the test.
const CALL_GUARD: Duration = Duration::from_secs(600);

fn write_config(dir: &Path) -> std::path::PathBuf {
    let config = json!({"mcpServers": {
        "up": {
            "command": PSYCH,
            "args": ["serve-embedded", "--tools", "1", "--list-raw-tools"],
            "preload": true,
        },
    }});
    let path = dir.join("mcp.json");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// A `kB` figure of `/proc/PID/status`: `VmHWM` (the peak resident set) or `VmRSS` (now).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn params(name: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else {
        panic!("arguments are an object")
    };
    CallToolRequestParams::new(name.to_owned()).with_arguments(arguments)
}

/// The text of a call of `name` that succeeds within [`CALL_GUARD`].
async fn call(session: &RunningService<RoleClient, ()>, name: &str, arguments: Value) -> String {
    let result = tokio::time::timeout(CALL_GUARD, session.call_tool(params(name, arguments)))
        .await
        .expect("the call came back")
        .unwrap();
    assert_ne!(result.is_error, Some(true), "{name}: {result:?}");
    text(&result)
}

/// One huge result of `mib` MiB through the gateway, read back at its end.
async fn one_huge_result(session: &RunningService<RoleClient, ()>, mib: u64) {
    let started = Instant::now();
    let preview = call(session, "up__raw_huge", json!({ "mib": mib })).await;
    let took = started.elapsed();
    assert!(
        preview.len() < 64 * 1024,
        "{mib} MiB: the client got a preview, not the result ({} bytes)",
        preview.len()
    );
    assert!(
        preview.starts_with("line 00000001 "),
        "{mib} MiB: the preview's head: {}",
        &preview[..200.min(preview.len())]
    );
    let handle = expect_handle(&preview);
    let lines = huge_lines(mib);
    let last = huge_end(lines);
    assert!(
        preview.contains(&last),
        "{mib} MiB: the preview's tail holds the last line"
    );

    // An offset read at the last line, and a grep from near the end.
    let page = call(
        session,
        "read_tool_output",
        json!({ "handle": handle, "offset": lines, "limit": 5 }),
    )
    .await;
    assert!(
        page.contains(&last),
        "{mib} MiB: the offset read at the end: {page}"
    );
    let wanted = format!("line {:08} ", lines - 3);
    let grep = call(
        session,
        "read_tool_output",
        json!({ "handle": handle, "offset": lines - 100, "grep": wanted.clone() }),
    )
    .await;
    assert!(
        grep.contains(&wanted),
        "{mib} MiB: the grep near the end: {grep}"
    );
    eprintln!("{mib} MiB: answered in {took:.1?}, read back at its end");
}

/// Two texts of 100 MiB with an image between them (issue 27: a preview of such a result
/// read it whole, for the image's line): previewed from the log's windows, the image named
/// as not shown. Its memory is bounded with the others' below.
async fn mixed_huge_result(session: &RunningService<RoleClient, ()>) {
    let preview = call(
        session,
        "up__raw_huge",
        json!({ "mib": 100, "second_mib": 100, "image": true }),
    )
    .await;
    assert!(
        preview.len() < 64 * 1024,
        "a preview: {} bytes",
        preview.len()
    );
    assert!(preview.starts_with("line 00000001 "), "{}", &preview[..200]);
    assert!(preview.contains(&huge_end(huge_lines(100))), "the tail");
    assert!(
        preview.ends_with(
            "Content blocks of this result not in the preview:\n\
             [content block #1: image, image/png, 8 bytes]\n"
        ),
        "{}",
        &preview[preview.len().saturating_sub(600)..]
    );
}

/// `psych serve` over stdio on the upstream of [`write_config`] in `dir`, with `flags`, once
/// the upstream's tools are listed: the session and the gateway's pid.
async fn serve(dir: &Path, flags: &[&str]) -> (RunningService<RoleClient, ()>, u32) {
    let config = write_config(dir);
    let transport = stdio_gateway(&config, dir, flags);
    let pid = transport.id().unwrap();
    let session: RunningService<RoleClient, ()> = ().serve(transport).await.unwrap();
    let started = Instant::now();
    while !session
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .any(|t| t.name == "up__raw_huge")
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the upstream never appeared"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (session, pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_of_200_mib_and_1_gib_are_previewed_logged_whole_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    // Room for both results: past the default 1 GiB per identity, retention would delete
    // the older one's segment once the live one rotates.
    let (session, pid) = serve(dir.path(), &["--retain-mib", "4096"]).await;
    let base = status_kib(pid, "VmHWM") / 1024;

    let mut peaks = Vec::new();
    mixed_huge_result(&session).await;
    let peak = status_kib(pid, "VmHWM") / 1024;
    eprintln!(
        "after the mixed 200 MiB result: the gateway's peak resident memory {peak} MiB (at start {base} MiB)"
    );
    peaks.push((200, peak));
    for mib in [200, 1024] {
        one_huge_result(&session, mib).await;
        let peak = status_kib(pid, "VmHWM") / 1024;
        eprintln!(
            "after the {mib} MiB result: the gateway's peak resident memory {peak} MiB (at start {base} MiB)"
        );
        peaks.push((mib, peak));
    }

    // The identity's log holds both whole: its file is larger than the two texts together.
    let logged: u64 = std::fs::read_dir(dir.path().join("serve/stdio"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "plog"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(
        logged > (200 + 1024) << 20,
        "the session log holds both results whole ({logged} bytes)"
    );
    session.cancel().await.unwrap();

    // Well under the result's size: what the gateway grew by while taking each result is
    // a bounded few buffers (measured about 20 and 30 MiB), not the result.
    for (mib, peak) in peaks {
        assert!(
            peak.saturating_sub(base) < GROWTH_BOUND_MIB,
            "the gateway grew from {base} to {peak} MiB with the {mib} MiB result"
        );
    }
}

/// Issue 27: `--spill-budget-mib` bounds what results too large for memory hold on disk at
/// once. A 50 MiB result past a 40 MiB budget is a tool error naming the budget, at once;
/// the upstream and the session go on, and a 17 MiB result (over the 16 MiB held in
/// memory, so kept in files: its answer and its text, 34 MiB together) arrives as a
/// preview with a handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_past_the_spill_budget_is_a_tool_error_and_the_next_one_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let (session, _) = serve(dir.path(), &["--spill-budget-mib", "40"]).await;
    let started = Instant::now();
    let refused = tokio::time::timeout(
        CALL_GUARD,
        session.call_tool(params("up__raw_huge", json!({"mib": 50}))),
    )
    .await
    .expect("the call came back")
    .unwrap();
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    let said = text(&refused);
    assert!(
        said.contains("spill budget of 41943040 bytes"),
        "the error names the budget: {said}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "at once");

    let preview = call(&session, "up__raw_huge", json!({"mib": 17})).await;
    assert!(preview.starts_with("line 00000001 "), "{preview}");
    assert!(!expect_handle(&preview).is_empty());
    session.cancel().await.unwrap();
}
