//! Output limits users set, through `psych serve` (issue 34): a tool's `output` entry in the
//! `mcpServers` file elides its results at its own size with its own preview, a server's
//! `anthropic/maxResultSizeChars` hint raises its tool's threshold, and a threshold over the
//! per-batch one is refused at start, by name. A real client (rmcp's) over stdio.

use std::path::Path;

use serde_json::{Value, json};

use crate::support::{PSYCH, call_ok, expect_handle, listed_session, serve_output};

fn embedded(args: &[&str], extra: Value) -> Value {
    let mut all = vec!["serve-embedded", "--tools", "0"];
    all.extend_from_slice(args);
    let mut server = json!({"command": PSYCH, "args": all, "preload": true});
    server
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap());
    server
}

fn write(dir: &Path, servers: Value) -> std::path::PathBuf {
    let path = dir.join("mcp.json");
    std::fs::write(&path, json!({ "mcpServers": servers }).to_string()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tool_is_elided_at_its_own_size() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        json!({
            "limited": embedded(&[], json!({"output": {"tools": {"echo": {
                "perResultTokens": 500, "headChars": 40, "tailChars": 20
            }}}})),
            "hinted": embedded(&["--hint-max-chars", "200000"], json!({})),
            "overruled": embedded(&["--hint-max-chars", "200000"], json!({"output": {
                "perResultTokens": 5000
            }})),
            "plain": embedded(&[], json!({})),
        }),
    );
    let session = listed_session(&config, dir.path(), &[]).await;
    let call = async |name: &str, arguments: Value| call_ok(&session, name, arguments).await;
    let elided = |shown: &str| shown.contains("[Elided tool result");
    // ~800 estimated tokens: over the echo's 500, under the default 10,000.
    let limited = call("limited__echo", json!({"text": "sword ".repeat(700)})).await;
    assert!(elided(&limited), "{limited}");
    assert!(
        limited.starts_with("sword sword") && !limited.contains(&"sword ".repeat(12)),
        "a 40-character head: {limited}"
    );
    let plain = call("plain__echo", json!({"text": "sword ".repeat(700)})).await;
    assert!(
        !elided(&plain),
        "another tool's result of the same size is whole"
    );
    // ~14,600 tokens: over the default 10,000, under the hint's 50,000 (clamped to the
    // per-batch 30,000).
    let hinted = call("hinted__large", json!({"bytes": 60_000})).await;
    assert!(!elided(&hinted), "the hint raises the threshold");
    assert_eq!(hinted.len(), 60_000);
    let plain = call("plain__large", json!({"bytes": 60_000})).await;
    assert!(elided(&plain), "without a hint, the default elides it");
    // ~7,300 tokens: under the default and the hint, over the user's 5,000.
    let overruled = call("overruled__large", json!({"bytes": 30_000})).await;
    assert!(elided(&overruled), "the user's setting beats the hint");
    session.cancel().await.unwrap();
}

#[test]
fn a_threshold_over_the_batch_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        json!({"s": embedded(&[], json!({"output": {"tools": {"echo": {"perResultTokens": 40000}}}}))}),
    );
    let out = serve_output(&config, dir.path(), &[]);
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("s/echo") && stderr.contains("perResultTokens 40000"),
        "{stderr}"
    );
}

/// Passed results share one budget per process (`--passing-budget-mib`): with a budget of
/// one call's bound, concurrent calls passing results take turns, and all of them go
/// through; a budget below one call's bound is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passed_results_share_one_budget() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), json!({"up": embedded(&[], json!({}))}));
    let flags = ["--max-passed-mib", "1", "--passing-budget-mib", "1"];
    let session = listed_session(&config, dir.path(), &flags).await;
    let call = async |name: &str, arguments: Value| call_ok(&session, name, arguments).await;
    let shown = call("up__large", json!({"bytes": 600_000})).await;
    let handle = expect_handle(&shown);
    let reference = json!({"text": {"$psych_result": handle}});
    let direct = call(
        "up__fingerprint",
        json!({"text": psych_test_server::large_text(600_000)}),
    )
    .await;
    // Four at once, each reserving the whole 1 MiB budget and holding 600 KB of it while
    // its upstream call sleeps 300 ms: they take turns (four sleeps one after another, not
    // side by side), and none is refused.
    let sleeping = json!({"ms": 300, "tag": {"$psych_result": handle}});
    let started = std::time::Instant::now();
    let slept = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        tokio::join!(
            call("up__sleep", sleeping.clone()),
            call("up__sleep", sleeping.clone()),
            call("up__sleep", sleeping.clone()),
            call("up__sleep", sleeping.clone()),
        )
    })
    .await
    .expect("no call waits for ever");
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1_200),
        "one at a time: {:?}",
        started.elapsed()
    );
    assert!(slept.0.contains("[Elided tool result"), "{}", slept.0);
    // And each reaches the upstream with the bytes a direct call sends.
    let passed = tokio::join!(
        call("up__fingerprint", reference.clone()),
        call("up__fingerprint", reference.clone()),
    );
    assert_eq!([passed.0, passed.1], [direct.clone(), direct]);
    session.cancel().await.unwrap();

    let out = serve_output(
        &config,
        dir.path(),
        &["--max-passed-mib", "16", "--passing-budget-mib", "8"],
    );
    // Flags that cannot go together: bad arguments (2), refused before anything starts.
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("passing budget"), "{stderr}");
    for flags in [
        &["--http", "0.0.0.0:0"][..],
        &["--store", "mysql://localhost/psych"][..],
    ] {
        let out = serve_output(&config, dir.path(), flags);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {out:?}");
    }
}
