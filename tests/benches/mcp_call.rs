//! A `tools/call` round trip through psych-mcp (`McpManager::call_tool_raw`: deadline,
//! cancel-on-drop guard, our stdio transport) against the same call made directly with
//! rmcp (`Peer::call_tool` over rmcp's own `TokioChildProcess`), each against its own
//! `psych-test-server` process, side by side in one group. Target: psych-mcp ≤ 1.2× rmcp.
//!
//! A second group does the same over streamable HTTP against one `psych-test-server
//! --json-response` process (each answer one `application/json` body): psych-mcp's
//! `ToolHost::call_tool` (its own POST, the raw body kept by the tap and read into
//! `ToolOutput`) against rmcp's `StreamableHttpClientTransport` and `Peer::call_tool`,
//! both asking for protocol 2025-11-25.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad setup"
)]

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use psych_mcp::{McpConfig, McpManager, ServerConfig, Transport};
use psych_types::{ConnectionSpec, JsonObject, ServerId, ToolHost, ToolRef};
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::json;

#[path = "../tests/mcp_common/mod.rs"]
mod common;
use common::{HttpServer, SERVER};

fn arguments() -> JsonObject {
    match json!({"text": "hello from the benchmark"}) {
        serde_json::Value::Object(map) => map,
        _ => unreachable!(),
    }
}

/// The runtime every round trip is driven on.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A manager with one server, `bench`, reached over `transport`.
async fn manager(transport: Transport) -> McpManager {
    let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap();
    let manager = McpManager::builder(config).build().unwrap();
    let server = ServerId::new("bench").unwrap();
    let config = ServerConfig {
        transport,
        connection: ConnectionSpec::new(server.clone()),
        extra: JsonObject::new(),
    };
    manager.add_server(server, config).await.unwrap();
    manager
}

fn round_trip(c: &mut Criterion) {
    let runtime = runtime();

    let manager = runtime.block_on(manager(Transport::Stdio {
        command: SERVER.to_owned(),
        args: Vec::new(),
        env: BTreeMap::new(),
        cwd: None,
    }));
    let direct = runtime.block_on(async {
        let transport = TokioChildProcess::new(tokio::process::Command::new(SERVER)).unwrap();
        ().serve(transport).await.unwrap()
    });

    let tool = ToolRef::parse("bench", "echo").unwrap();
    let mut group = c.benchmark_group("tools_call_round_trip");
    group.bench_function("rmcp_direct", |b| {
        b.iter(|| {
            let params = CallToolRequestParams::new("echo").with_arguments(arguments());
            black_box(runtime.block_on(direct.peer().call_tool(params)).unwrap())
        });
    });
    group.bench_function("psych_mcp", |b| {
        b.iter(|| {
            black_box(
                runtime
                    .block_on(manager.call_tool_raw(&tool, arguments()))
                    .unwrap(),
            )
        });
    });
    group.finish();

    runtime.block_on(async {
        manager.shutdown().await;
        let _ = direct.cancel().await;
    });
}

fn round_trip_http(c: &mut Criterion) {
    let runtime = runtime();
    // Killed when dropped, after the manager and the direct client.
    let server = HttpServer::start(&["--json-response"]);

    let manager = runtime.block_on(manager(Transport::Http {
        url: server.url.clone(),
        headers: BTreeMap::new(),
    }));
    let direct = runtime.block_on(async {
        let transport = StreamableHttpClientTransport::from_uri(server.url.as_str());
        let client = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("bench", "0"),
        )
        .with_protocol_version(ProtocolVersion::V_2025_11_25);
        client.serve(transport).await.unwrap()
    });

    let tool = ToolRef::parse("bench", "echo").unwrap();
    let mut group = c.benchmark_group("tools_call_round_trip_http_json");
    group.bench_function("rmcp_direct", |b| {
        b.iter(|| {
            let params = CallToolRequestParams::new("echo").with_arguments(arguments());
            black_box(runtime.block_on(direct.peer().call_tool(params)).unwrap())
        });
    });
    group.bench_function("psych_mcp", |b| {
        b.iter(|| {
            black_box(
                runtime
                    .block_on(ToolHost::call_tool(&manager, &tool, arguments()))
                    .unwrap(),
            )
        });
    });
    group.finish();

    runtime.block_on(async {
        manager.shutdown().await;
        let _ = direct.cancel().await;
    });
}

criterion_group!(benches, round_trip, round_trip_http);
criterion_main!(benches);
