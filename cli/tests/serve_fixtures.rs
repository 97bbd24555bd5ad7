//! What `psych serve` saves a client, measured end to end: the five real catalogues of
//! `../shared/fixtures/catalogs/` (github, notion, playwright, server-filesystem,
//! server-memory: 189 tools) each served by its own upstream process (`psych serve-embedded
//! --catalog FILE --no-control-tools`), listed by a real MCP client (rmcp) once by connecting
//! every server directly and once through `psych serve` as a process: by default (preload
//! `auto`, the gateway's auto budget of 1,000 tokens shared by the servers), with
//! `--auto-budget 10000` (5% of a 200,000-token window, what the runtime gives), and with
//! every server `"preload": false`. Bytes are the `tools/list` results as the client holds
//! them, serialized the same way on both sides; tokens are psych-elision's estimate of
//! those bytes. The default must be at least 30x smaller than connecting every server
//! directly, in bytes and in tokens. The figures are printed with
//! `cargo test -p psych-cli --test it serve_fixtures -- --nocapture`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use psych_elision::Estimator;
use psych_types::TokenEstimator;
use rmcp::model::Tool;
use rmcp::service::NotificationContext;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

const PSYCH: &str = env!("CARGO_BIN_EXE_psych");

/// (server name, fixture file).
const FIXTURES: [(&str, &str); 5] = [
    ("github", "github.tools.full.json"),
    ("notion", "notion.tools.json"),
    ("playwright", "playwright.tools.json"),
    ("filesystem", "server-filesystem.tools.json"),
    ("memory", "server-memory.tools.json"),
];

fn catalogs() -> PathBuf {
    match std::env::var_os("PSYCH_FIXTURES") {
        Some(dir) => PathBuf::from(dir).join("catalogs"),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .map(|dir| dir.join("shared/fixtures/catalogs"))
            .find(|dir| dir.is_dir())
            .expect("../shared/fixtures/catalogs"),
    }
}

/// The arguments that make `psych serve-embedded` serve `file` and nothing else.
fn upstream_args(file: &str) -> Vec<String> {
    vec![
        "serve-embedded".to_owned(),
        "--catalog".to_owned(),
        catalogs().join(file).display().to_string(),
        "--no-control-tools".to_owned(),
    ]
}

/// A client that forwards each `tools/list_changed` to a channel.
struct Client(mpsc::UnboundedSender<()>);

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.0.send(());
    }
}

/// Lists every tool of the MCP server `command args` as a client does; returns them.
/// Through `psych serve`, which answers `initialize` before its upstreams are listed, the
/// listing is taken once every upstream is (none says "not listed yet"), each arriving
/// through `list_changed`.
async fn list(args: &[String], dir: Option<&Path>) -> Vec<Tool> {
    let transport = TokioChildProcess::new(tokio::process::Command::new(PSYCH).configure(|c| {
        c.args(args).stderr(std::process::Stdio::null());
        if let Some(dir) = dir {
            c.current_dir(dir);
        }
    }))
    .unwrap();
    let (changed, mut changes) = mpsc::unbounded_channel();
    let client = Client(changed).serve(transport).await.unwrap();
    let tools = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let tools = client.list_all_tools().await.unwrap();
            if !serde_json::to_string(&tools)
                .unwrap()
                .contains("not listed yet")
            {
                return tools;
            }
            changes.recv().await.unwrap();
        }
    })
    .await
    .expect("every upstream is listed");
    client.cancel().await.unwrap();
    tools
}

/// The `tools/list` result's text as the client holds it, and its estimated tokens.
fn measure(tools: &[Tool]) -> (usize, u64) {
    let text = json!({ "tools": tools }).to_string();
    (text.len(), Estimator::new().estimate_text(&text))
}

/// `psych serve` over the five fixture servers with `flags`, `extra` merged into each
/// server's entry.
async fn through_serve(dir: &Path, flags: &[&str], extra: &Value) -> Vec<Tool> {
    let mut servers = serde_json::Map::new();
    for (server, file) in FIXTURES {
        let mut entry = json!({ "command": PSYCH, "args": upstream_args(file) });
        if let (Value::Object(entry), Value::Object(extra)) = (&mut entry, extra) {
            entry.extend(extra.clone());
        }
        servers.insert(server.to_owned(), entry);
    }
    let config = dir.join("mcp.json");
    std::fs::write(&config, json!({ "mcpServers": servers }).to_string()).unwrap();
    let mut args = vec![
        "serve".to_owned(),
        "--config".to_owned(),
        config.display().to_string(),
        "--dir".to_owned(),
        dir.display().to_string(),
    ];
    args.extend(flags.iter().map(|flag| (*flag).to_owned()));
    list(&args, Some(dir)).await
}

/// Whether `name` is one of Psych's own tools rather than an upstream server's.
fn psych_own(name: &str) -> bool {
    name.starts_with("psych_") || name == "read_tool_output"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fixture_catalogues_through_serve_against_every_server_directly() {
    let mut direct_tools = 0;
    let (mut direct_bytes, mut direct_tokens) = (0, 0);
    for (_, file) in FIXTURES {
        let tools = list(&upstream_args(file), None).await;
        let (bytes, tokens) = measure(&tools);
        direct_tools += tools.len();
        direct_bytes += bytes;
        direct_tokens += tokens;
    }
    assert_eq!(direct_tools, 189, "every fixture tool is served upstream");
    eprintln!(
        "every server directly: {direct_tools} tools, {direct_bytes} B, ~{direct_tokens} tokens"
    );

    let dir = tempfile::tempdir().unwrap();
    let mut ratios = Vec::new();
    for (label, flags, extra) in [
        ("by default", &[][..], json!({})),
        (
            "--auto-budget 10000",
            &["--auto-budget", "10000"][..],
            json!({}),
        ),
        (
            "every server \"preload\": false",
            &[][..],
            json!({ "preload": false }),
        ),
    ] {
        let tools = through_serve(dir.path(), flags, &extra).await;
        let (bytes, tokens) = measure(&tools);
        let upstream: Vec<Tool> = tools
            .iter()
            .filter(|t| !psych_own(&t.name))
            .cloned()
            .collect();
        let (upstream_bytes, upstream_tokens) = measure(&upstream);
        let ratio = direct_bytes as f64 / bytes as f64;
        let token_ratio = direct_tokens as f64 / tokens as f64;
        eprintln!(
            "psych serve, {label}: {} tools, {bytes} B, ~{tokens} tokens: {ratio:.1}x smaller \
             in bytes, {token_ratio:.1}x in tokens; of which {} upstream tools, \
             {upstream_bytes} B, ~{upstream_tokens} tokens",
            tools.len(),
            upstream.len(),
        );
        assert!(
            tools.iter().any(|t| t.name == "psych_orientation"),
            "the gateway answered the listing"
        );
        ratios.push((ratio, token_ratio, upstream.len(), upstream_tokens));
    }
    // The goal, by default: at least 30x smaller than every server connected directly.
    // The servers kept out of deferral share 1,000 tokens of whole definitions: here none
    // fits (server-memory's 9 tools are about 2,300 tokens as a client receives them).
    assert!(ratios[0].0 >= 30.0 && ratios[0].1 >= 30.0, "{ratios:?}");
    assert!(ratios[0].3 <= 1_000, "{ratios:?}");
    // 10,000 tokens keeps the three small servers (memory 9, filesystem 14, playwright 25
    // tools) direct: the trade of a larger listing for no round trip to them.
    assert_eq!(ratios[1].2, 48, "{ratios:?}");
    assert!(ratios[1].3 <= 10_000, "{ratios:?}");
    // Every server deferred: the meta tools, the orientation tool and the reader.
    assert!(ratios[2].0 >= 30.0 && ratios[2].1 >= 30.0, "{ratios:?}");
    assert_eq!(ratios[2].2, 0, "{ratios:?}");
}
