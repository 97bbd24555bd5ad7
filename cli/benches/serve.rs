//! A `tools/call` through `psych serve` (rmcp client → the gateway process: guard, executor,
//! the session's record log with its sync, elision's projection → the upstream) against the
//! same call made directly to the upstream (rmcp client → `psych serve-embedded`), side by
//! side in one group. Goal: proxied ≤ 1.2× direct + 1 ms.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad setup"
)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use serde_json::json;

const PSYCH: &str = env!("CARGO_BIN_EXE_psych");

fn arguments() -> psych_types::JsonObject {
    match json!({"text": "hello from the benchmark"}) {
        serde_json::Value::Object(map) => map,
        _ => unreachable!(),
    }
}

fn proxied_against_direct(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("mcp.json");
    // Pinned direct (`up__echo`): with the control tools it is over `psych serve`'s default
    // auto budget.
    let upstream = json!({
        "command": PSYCH,
        "args": ["serve-embedded", "--tools", "3"],
        "preload": true,
    });
    std::fs::write(&config, json!({"mcpServers": {"up": upstream}}).to_string()).unwrap();

    let (direct, proxied) = runtime.block_on(async {
        let direct = TokioChildProcess::new(tokio::process::Command::new(PSYCH).configure(|c| {
            c.args(["serve-embedded", "--tools", "3"]);
        }))
        .unwrap();
        let gateway = TokioChildProcess::new(tokio::process::Command::new(PSYCH).configure(|c| {
            c.arg("serve")
                .arg("--config")
                .arg(&config)
                .arg("--dir")
                .arg(dir.path())
                .stderr(std::process::Stdio::null());
        }))
        .unwrap();
        let direct = ().serve(direct).await.unwrap();
        let proxied = ().serve(gateway).await.unwrap();
        // `psych serve` answers `initialize` before its upstream is listed: measure calls
        // once `up__echo` is there.
        while !proxied
            .list_all_tools()
            .await
            .unwrap()
            .iter()
            .any(|t| t.name == "up__echo")
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        (direct, proxied)
    });

    let mut group = c.benchmark_group("serve_tools_call");
    group.bench_function("direct", |b| {
        b.iter(|| {
            let params = CallToolRequestParams::new("echo").with_arguments(arguments());
            black_box(runtime.block_on(direct.peer().call_tool(params)).unwrap())
        });
    });
    group.bench_function("psych_serve", |b| {
        b.iter(|| {
            let params = CallToolRequestParams::new("up__echo").with_arguments(arguments());
            black_box(runtime.block_on(proxied.peer().call_tool(params)).unwrap())
        });
    });
    group.finish();

    runtime.block_on(async {
        let _ = direct.cancel().await;
        let _ = proxied.cancel().await;
    });
}

criterion_group!(benches, proxied_against_direct);
criterion_main!(benches);
