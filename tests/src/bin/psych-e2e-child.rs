//! The child process of the runtime's end-to-end tests (`tests/runtime_e2e.rs`):
//!
//! - `psych-e2e-child server [FLAGS]`: psych-test-server's server (the flags of
//!   `psych-test-server`), so the tests start real MCP server processes without needing
//!   another package's binary;
//! - `psych-e2e-child run DIR`: a Run over one stdio test server (this executable) whose turn
//!   calls `echo` and a `sleep` of a minute in parallel; it prints `calling` on stderr just
//!   before handing the model's reply over, and is meant to be killed (`kill -9`) mid-step.

use std::sync::Arc;
use std::time::Duration;

use psych_catalog::Catalog;
use psych_mcp::{McpConfig, McpManager, Timeouts};
use psych_prompt_assembly::AnthropicOptions;
use psych_runtime::{Run, ScriptedModel, Step, Target};
use psych_test_server::Scenario;
use psych_types::{PermissionGrant, RunId, ServerId, ToolLister};
use serde_json::json;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    let result = match args.next().as_deref() {
        Some("server") => serve(args.collect()).await,
        Some("run") => match args.next() {
            Some(dir) => run(&dir).await,
            None => Err("run needs a folder".to_owned()),
        },
        _ => Err("usage: psych-e2e-child server [FLAGS] | run DIR".to_owned()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("psych-e2e-child: {message}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(args: Vec<String>) -> Result<(), String> {
    let (scenario, mode) = Scenario::from_args(args)?;
    scenario.serve(mode).await.map_err(|e| e.to_string())
}

/// A Run killed mid-step by the test: the reply's calls are in flight when it dies.
async fn run(dir: &str) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let text = json!({"mcpServers": {"svc": {"command": exe, "args": ["server"]}}}).to_string();
    let config = McpConfig::parse(&text, |_| None).map_err(|e| e.to_string())?;
    let manager = McpManager::builder(config)
        .timeouts(Timeouts::uniform(Duration::from_secs(120)))
        .build()
        .map_err(|e| e.to_string())?;
    manager.connect_all().await;
    let svc = ServerId::new("svc").map_err(|e| e.to_string())?;
    let catalog = Catalog::in_memory().map_err(|e| e.to_string())?;
    let tools = manager.list_tools(&svc).await.map_err(|e| e.to_string())?;
    catalog.refresh(&svc, &tools).map_err(|e| e.to_string())?;
    let run_id = RunId::new("run-crash").map_err(|e| e.to_string())?;
    let target = Target::Anthropic(AnthropicOptions::new("claude-sonnet-4-5", 4096));
    let mut run = Run::builder(dir, run_id, catalog, Arc::new(manager), target)
        .instructions("You are a helpful assistant.")
        .connections([psych_types::ConnectionSpec::new(svc.clone())])
        .grant(PermissionGrant::none().allow_server(svc))
        .clock(|| 1_796_041_497)
        .open()
        .await
        .map_err(|e| e.to_string())?;
    let mut model = ScriptedModel::new([Step::call(
        "svc__echo",
        json!({"text": "before the crash"}),
    )
    .and_call("svc__sleep", json!({"ms": 60_000, "tag": "never"}))]);
    let request = run
        .user("Start, then die.")
        .await
        .map_err(|e| e.to_string())?;
    let reply = model.reply(&request);
    eprintln!("calling");
    run.reply(reply).await.map_err(|e| e.to_string())?;
    Err("the step ended, but this process should have been killed".to_owned())
}
