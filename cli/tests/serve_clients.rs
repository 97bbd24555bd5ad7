//! `psych serve` driven by real MCP clients: the official Python SDK (`mcp==2.3.0`) and
//! TypeScript SDK (`@modelcontextprotocol/client@2.4.0`), each running its scenario script
//! (`tests/clients/py/scenario.py`, `tests/clients/ts/scenario.mjs`) over stdio (the script
//! spawns `psych serve` itself) and over streamable HTTP (`psych serve --http`), in front
//! of two test servers (`psych serve-embedded`): `up`, pinned direct, and `deferred`,
//! reached through the meta tools. Each script lists the tools, calls a direct tool, goes
//! list → describe → call through the deferred server, makes a large call whose result is
//! elided (printing its handle), reads it whole through its `resource_link` and hands a
//! line of it to another tool by reference, and waits for `list_changed` after the test
//! server adds a tool. Then a second run of the script, a later connection (over stdio a new `psych
//! serve` on the same `--dir`), reads the handle back.
//!
//! The clients come from `cargo xtask clients` (`target/mcp-venv`, `tests/clients/ts/
//! node_modules`); without them these tests fail saying so. Every script run is bounded in
//! time, so a hang fails.
//!
//! Each SDK runs the scenario in both eras: `--mode legacy` (2025-11-25: `initialize` and a
//! session) and `--mode modern` (2026-07-28, pinned: per-request `_meta`, no session,
//! `subscriptions/listen`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const PSYCH: &str = env!("CARGO_BIN_EXE_psych");

/// How long one scenario run may take: it waits up to 60 s for the upstreams to be listed
/// and 10 s for `list_changed`; the rest is a few calls.
const SCENARIO_WITHIN: Duration = Duration::from_secs(150);
/// How long a `--read` run may take.
const READ_WITHIN: Duration = Duration::from_secs(90);

/// The workspace's root (this crate's parent folder).
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[derive(Clone, Copy, Debug)]
enum Sdk {
    Python,
    TypeScript,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The 2025 era: `initialize` and a session.
    Legacy,
    /// 2026-07-28, pinned: per-request `_meta`, no session, `subscriptions/listen`.
    Modern,
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    Stdio,
    Http,
}

impl Mode {
    fn flag(self) -> &'static str {
        match self {
            Mode::Legacy => "legacy",
            Mode::Modern => "modern",
        }
    }
}

impl Transport {
    fn flag(self) -> &'static str {
        match self {
            Transport::Stdio => "stdio",
            Transport::Http => "http",
        }
    }
}

impl Sdk {
    /// The command that runs this SDK's scenario script, or a panic naming `cargo xtask
    /// clients` when the SDK is not installed.
    fn command(self) -> Command {
        let root = workspace();
        let (program, script, installed) = match self {
            Sdk::Python => (
                root.join("target/mcp-venv/bin/python"),
                root.join("tests/clients/py/scenario.py"),
                // Written by the xtask once `mcp` is installed.
                root.join("target/mcp-venv/xtask-installed"),
            ),
            Sdk::TypeScript => (
                PathBuf::from("node"),
                root.join("tests/clients/ts/scenario.mjs"),
                root.join(
                    "tests/clients/ts/node_modules/@modelcontextprotocol/client/package.json",
                ),
            ),
        };
        assert!(
            installed.exists(),
            "the {self:?} MCP client is not installed ({} is missing): run `cargo xtask clients` \
             first (it makes target/mcp-venv and runs npm ci in tests/clients/ts)",
            installed.display()
        );
        let mut command = Command::new(program);
        command.arg(script).current_dir(&root);
        command
    }
}

/// Writes the gateway's configuration in `dir`: `up` (three generated tools and the control
/// tools, pinned direct) and `deferred` (the same, pinned deferred: only the meta tools
/// reach it).
fn write_config(dir: &Path) -> PathBuf {
    let embedded = |preload: bool| {
        json!({
            "command": PSYCH,
            "args": ["serve-embedded", "--tools", "3"],
            "preload": preload,
            "description": "A test server reached through the meta tools.",
        })
    };
    let config = json!({"mcpServers": {"up": embedded(true), "deferred": embedded(false)}});
    let path = dir.join("mcp.json");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// `psych serve --http 127.0.0.1:0`, stopped as Ctrl-C would and reaped when dropped.
struct HttpGateway {
    child: Child,
    url: String,
    log: PathBuf,
}

impl HttpGateway {
    /// Starts the gateway for `config`, logging under `dir` (its stderr in
    /// `dir/gateway.log`), and waits for its `listening on URL` line.
    fn start(config: &Path, dir: &Path) -> Self {
        let log = dir.join("gateway.log");
        let mut child = Command::new(PSYCH)
            .arg("serve")
            .arg("--http")
            .arg("127.0.0.1:0")
            .arg("--config")
            .arg(config)
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (line_tx, line_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = line_tx.send(line);
        });
        let mut gateway = Self {
            child,
            url: String::new(),
            log,
        };
        let line = line_rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the gateway says where it listens: {}", gateway.stderr()));
        gateway.url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("{line:?}: {}", gateway.stderr()))
            .to_owned();
        gateway
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for HttpGateway {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What one run of a scenario script did.
struct Run {
    /// The exit status's code (`None`: killed, or timed out).
    code: Option<i32>,
    timed_out: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The JSON summary: the last line on stdout.
    fn summary(&self) -> Value {
        let last = self.stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|_| panic!("no JSON summary: {self}"))
    }

    fn succeeded(&self) -> bool {
        self.code == Some(0) && self.summary()["ok"] == json!(true)
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}{}\n--- stdout\n{}\n--- stderr\n{}",
            self.code,
            if self.timed_out { " (timed out)" } else { "" },
            self.stdout,
            self.stderr
        )
    }
}

/// Runs `command` in `dir` for at most `within`, its output in files there (so that what a
/// hung run printed is still shown).
fn run_bounded(mut command: Command, dir: &Path, name: &str, within: Duration) -> Run {
    let (out, err) = (
        dir.join(format!("{name}.out")),
        dir.join(format!("{name}.err")),
    );
    let mut child = command
        .stdin(Stdio::null())
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    let deadline = Instant::now() + within;
    let (code, timed_out) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status.code(), false);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Run {
        code,
        timed_out,
        stdout: std::fs::read_to_string(&out).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err).unwrap_or_default(),
    }
}

/// The scenario of `sdk` in `mode` over `transport` against a fresh gateway, then a later
/// connection reading the handle of the elided result back. Asserts, in order: the
/// scenario's five steps passed (with the protocol version `mode` asks for), and the later
/// connection read the handle's text.
fn real_client_scenario(sdk: Sdk, mode: Mode, transport: Transport) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let gateway = match transport {
        Transport::Http => Some(HttpGateway::start(&config, dir.path())),
        Transport::Stdio => None,
    };
    // How the script reaches the gateway: its URL, or the command that starts one.
    let target: Vec<OsString> = match &gateway {
        Some(gateway) => vec!["--url".into(), gateway.url.clone().into()],
        None => vec![
            "--command".into(),
            PSYCH.into(),
            "serve".into(),
            "--config".into(),
            config.clone().into(),
            "--dir".into(),
            dir.path().into(),
        ],
    };
    let script = |extra: &[&str]| {
        let mut command = sdk.command();
        command
            .args(["--transport", transport.flag(), "--mode", mode.flag()])
            .args(extra)
            .args(&target);
        command
    };
    let gateway_log = || {
        gateway
            .as_ref()
            .map(|g| format!("\n--- gateway stderr\n{}", g.stderr()))
            .unwrap_or_default()
    };
    let what = format!("{sdk:?} {mode:?} over {transport:?}");

    let run = run_bounded(script(&[]), dir.path(), "scenario", SCENARIO_WITHIN);
    assert!(
        run.succeeded(),
        "{what}: the scenario failed: {run}{}",
        gateway_log()
    );
    let summary = run.summary();
    let steps: Vec<&str> = summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        ["list", "direct", "deferred", "elided", "list_changed"],
        "{what}: {summary}"
    );
    // The elided result read whole through its resource link, and a line of it passed to
    // another tool by reference (`{"$psych_result": ...}`), by both SDKs.
    let elided = &summary["steps"][3];
    assert_eq!(
        elided["resource_chars"],
        json!(200_000),
        "{what}: {summary}"
    );
    assert!(
        elided["passed"]
            .as_str()
            .is_some_and(|line| line.starts_with("line 002345: the quick brown fox")),
        "{what}: {summary}"
    );
    let version = summary["protocol_version"].as_str().unwrap_or_default();
    match mode {
        Mode::Legacy => assert!(version < "2026", "{what}: a 2025 session: {summary}"),
        Mode::Modern => assert_eq!(version, "2026-07-28", "{what}: {summary}"),
    }
    let handle = summary["handle"].as_str().unwrap().to_owned();
    // The handle was printed as its own line as soon as the script had it.
    assert!(
        run.stdout
            .lines()
            .any(|line| serde_json::from_str::<Value>(line).ok() == Some(json!({"handle": handle}))),
        "{what}: {run}"
    );

    // A later connection (over stdio, a new gateway process on the same --dir) reads the
    // handle of the first one.
    let read = run_bounded(
        script(&[
            "--read",
            &handle,
            "--grep",
            "line 002345:",
            "--expect-prefix",
            "line 002345: the quick brown fox jumps over the lazy dog",
        ]),
        dir.path(),
        "read",
        READ_WITHIN,
    );
    assert!(
        read.succeeded(),
        "{what}: a later connection cannot read the handle {handle}: {read}{}",
        gateway_log()
    );
}

#[test]
fn python_sdk_legacy_over_stdio() {
    real_client_scenario(Sdk::Python, Mode::Legacy, Transport::Stdio);
}

#[test]
fn python_sdk_legacy_over_http() {
    real_client_scenario(Sdk::Python, Mode::Legacy, Transport::Http);
}

#[test]
fn typescript_sdk_legacy_over_stdio() {
    real_client_scenario(Sdk::TypeScript, Mode::Legacy, Transport::Stdio);
}

#[test]
fn typescript_sdk_legacy_over_http() {
    real_client_scenario(Sdk::TypeScript, Mode::Legacy, Transport::Http);
}

#[test]
fn python_sdk_modern_over_stdio() {
    real_client_scenario(Sdk::Python, Mode::Modern, Transport::Stdio);
}

#[test]
fn python_sdk_modern_over_http() {
    real_client_scenario(Sdk::Python, Mode::Modern, Transport::Http);
}

#[test]
fn typescript_sdk_modern_over_stdio() {
    real_client_scenario(Sdk::TypeScript, Mode::Modern, Transport::Stdio);
}

#[test]
fn typescript_sdk_modern_over_http() {
    real_client_scenario(Sdk::TypeScript, Mode::Modern, Transport::Http);
}
