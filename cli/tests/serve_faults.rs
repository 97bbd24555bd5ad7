//! `psych serve` under faults, as a process in front of real upstream processes
//! (`psych serve-embedded`): SIGTERM and SIGINT over stdio and `--http` with a call in
//! flight (a clean exit within the bound, nothing of the upstreams' process groups left,
//! the session log intact with a result for the call), `initialize` answered at once with
//! upstreams that never answer (the others' tools arriving through `list_changed`), and the
//! cap on HTTP sessions.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::model::ProgressNotificationParam;
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use crate::support::announced_hang;

const PSYCH: &str = env!("CARGO_BIN_EXE_psych");

/// `psych serve`'s bound on a graceful shutdown (`SHUTDOWN_WITHIN` in the gateway).
const SHUTDOWN_WITHIN: Duration = Duration::from_secs(10);

/// How a call cut short by the shutdown is logged (`CANCELLED_BY_SHUTDOWN`).
const CANCELLED_BY_SHUTDOWN: &str = "cancelled: the gateway shut down";

fn embedded(tools: usize, flags: &[&str], extra: Value) -> Value {
    let mut args = vec![
        json!("serve-embedded"),
        json!("--tools"),
        json!(tools.to_string()),
    ];
    args.extend(flags.iter().map(|f| json!(f)));
    let mut server = json!({ "command": PSYCH, "args": args });
    if let Value::Object(extra) = extra {
        server.as_object_mut().unwrap().extend(extra);
    }
    server
}

fn write_config(dir: &Path, servers: Value) -> std::path::PathBuf {
    let path = dir.join("mcp.json");
    std::fs::write(&path, json!({ "mcpServers": servers }).to_string()).unwrap();
    path
}

/// Whether this test process runs with SIGHUP ignored (`nohup cargo test`): `psych`
/// inherits that and keeps it ignored, so the tests that send SIGHUP skip it.
fn hangup_ignored_here() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let mask = status
                .lines()
                .find_map(|line| line.strip_prefix("SigIgn:"))?
                .trim()
                .to_owned();
            u64::from_str_radix(&mask, 16).ok()
        })
        .is_some_and(|mask| mask & 1 == 1)
}

/// The signals the tests send: SIGHUP too unless it is ignored here.
fn stop_signals<T: Copy>(all: &[(&'static str, T)]) -> Vec<(&'static str, T)> {
    all.iter()
        .copied()
        .filter(|(signal, _)| {
            let skip = *signal == "-HUP" && hangup_ignored_here();
            if skip {
                eprintln!("SIGHUP is ignored in this process (nohup?): not sent");
            }
            !skip
        })
        .collect()
}

/// The live (not zombie) members of process group `pgid`, from /proc.
fn live_members(pgid: i32) -> Vec<i32> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command name in parentheses: state, ppid, pgrp, …
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" {
            members.push(pid);
        }
    }
    members
}

/// The process groups of `parent`'s live children (each upstream is its own group).
fn child_groups(parent: u32) -> Vec<i32> {
    let mut groups = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[1] == parent.to_string() && fields[0] != "Z" {
            groups.push(fields[2].parse().unwrap());
        }
    }
    groups.sort_unstable();
    groups.dedup();
    groups
}

/// Stops `gateway` as a process manager would (SIGTERM) and waits for it: a gateway
/// killed outright cannot stop its upstreams, and one that never answered its
/// `initialize` would outlive the test.
async fn stop(mut gateway: tokio::process::Child) {
    let pid = gateway.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = tokio::time::timeout(SHUTDOWN_WITHIN + Duration::from_secs(20), gateway.wait())
        .await
        .expect("the gateway exits")
        .unwrap();
    assert!(exited.success(), "{exited}");
}

/// The tool results of every log under `<dir>/serve/` (a folder per identity: `stdio`,
/// `loopback` over HTTP), each log opened (and so checked whole) by psych-record-log:
/// (tool name, readable text).
fn logged_results(dir: &Path) -> Vec<(String, String)> {
    let mut results = Vec::new();
    for identity in std::fs::read_dir(dir.join("serve")).unwrap() {
        results.extend(crate::support::logged_in(&identity.unwrap().path()));
    }
    results
}

/// A JSON-RPC client of `psych serve` over stdio, reading every message in order.
struct RawClient {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl RawClient {
    /// Starts `psych serve` (not yet initialized).
    fn spawn(config: &Path, dir: &Path) -> Self {
        let mut child = tokio::process::Command::new(PSYCH)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            stdin,
            lines,
        }
    }

    async fn send(&mut self, message: Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin.write_all(line.as_bytes()).await.unwrap();
    }

    async fn next(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
            .await
            .expect("the gateway answers")
            .unwrap()
            .expect("the gateway is running");
        serde_json::from_str(&line).unwrap()
    }

    /// The initialize handshake: the initialize result, and how long it took.
    async fn initialize(&mut self) -> (Value, Duration) {
        let asked = Instant::now();
        self.send(
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            }}),
        )
        .await;
        let result = loop {
            let message = self.next().await;
            if message.get("id") == Some(&json!(0)) {
                break message["result"].clone();
            }
        };
        let took = asked.elapsed();
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        (result, took)
    }

    /// The listed tool names (request `id`); counts the `list_changed` seen meanwhile.
    async fn list(&mut self, id: u64, changed: &mut usize) -> Vec<String> {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"}))
            .await;
        loop {
            let message = self.next().await;
            if message["method"] == "notifications/tools/list_changed" {
                *changed += 1;
            } else if message.get("id") == Some(&json!(id)) {
                return message["result"]["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["name"].as_str().unwrap().to_owned())
                    .collect();
            }
        }
    }

    /// Waits for the next `notifications/tools/list_changed`.
    async fn list_changed(&mut self) {
        while self.next().await["method"] != "notifications/tools/list_changed" {}
    }
}

/// Lists until `tool` is there, waiting for a `list_changed` between tries (request ids
/// from `id` on).
async fn wait_listed(client: &mut RawClient, tool: &str, id: &mut u64) {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            *id += 1;
            let mut changed = 0;
            let tools = client.list(*id, &mut changed).await;
            if tools.iter().any(|n| n == tool) {
                return;
            }
            if changed == 0 {
                client.list_changed().await;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{tool} is listed"));
}

/// Lists until `tool` is there, waiting for a `list_changed` between tries.
async fn wait_listed_http(
    session: &HttpSession,
    changed: &mut mpsc::UnboundedReceiver<()>,
    tool: &str,
) {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let tools = session.list_all_tools().await.unwrap();
            if tools.iter().any(|t| t.name == tool) {
                return;
            }
            changed.recv().await.unwrap();
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{tool} is listed"));
}

/// The upstreams: `busy` (its `hang` tool is the call in flight, and it leaves a `sleep`
/// grandchild in its group) and `idle`.
fn shutdown_config(dir: &Path) -> std::path::PathBuf {
    write_config(
        dir,
        json!({
            "busy": embedded(3, &["--grandchild", "--announce-hang"], json!({"preload": true})),
            "idle": embedded(2, &[], json!({"preload": true})),
        }),
    )
}

/// After the signal: the gateway exits by itself, successfully, within the bound; no
/// member of any upstream's group is left; the session log opens intact and holds the
/// in-flight call's result, logged as cut short by the shutdown.
async fn check_stopped(
    mut gateway: tokio::process::Child,
    signal: &str,
    groups: &[i32],
    dir: &Path,
) {
    let pid = gateway.id().unwrap();
    let signalled = Instant::now();
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = tokio::time::timeout(SHUTDOWN_WITHIN + Duration::from_secs(20), gateway.wait())
        .await
        .unwrap_or_else(|_| panic!("{signal}: the gateway exits"))
        .unwrap();
    let took = signalled.elapsed();
    eprintln!("{signal}: exited {exited} in {took:?}");
    for &group in groups {
        assert_eq!(
            live_members(group),
            Vec::<i32>::new(),
            "{signal}: nothing of upstream group {group} is left"
        );
    }
    assert!(exited.success(), "{signal}: a clean exit: {exited}");
    assert!(
        took < SHUTDOWN_WITHIN,
        "{signal}: within the bound: {took:?}"
    );
    let results = logged_results(dir);
    let hung: Vec<&String> = results
        .iter()
        .filter(|(name, _)| name == "busy__hang")
        .map(|(_, text)| text)
        .collect();
    assert_eq!(
        hung.len(),
        1,
        "{signal}: one result for the call: {results:?}"
    );
    assert!(
        hung[0].starts_with(CANCELLED_BY_SHUTDOWN),
        "{signal}: {:?}",
        hung[0]
    );
}

/// SIGTERM and SIGINT over stdio, with a call hanging upstream: the gateway cancels it
/// upstream, logs it, stops every upstream process group (the grandchild too) and exits
/// cleanly within its bound. (Before, SIGTERM killed it at once: the upstream groups were
/// left running and the call had no result in the log.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_stops_the_stdio_gateway_cleanly_with_a_call_in_flight() {
    // SIGHUP too: a gateway started from a terminal or SSH session that closes.
    for (signal, ()) in stop_signals(&[("-TERM", ()), ("-INT", ()), ("-HUP", ())]) {
        let dir = tempfile::tempdir().unwrap();
        let config = shutdown_config(dir.path());
        let mut client = RawClient::spawn(&config, dir.path());
        client.initialize().await;
        let mut id = 0;
        wait_listed(&mut client, "busy__hang", &mut id).await;
        wait_listed(&mut client, "idle__echo", &mut id).await;
        let groups = child_groups(client.child.id().unwrap());
        assert_eq!(groups.len(), 2, "{signal}: two upstream groups: {groups:?}");
        assert!(
            groups.iter().any(|&g| live_members(g).len() >= 2),
            "{signal}: busy's grandchild runs in its group"
        );
        // The call in flight: hanging upstream once its progress says so.
        client
            .send(
                json!({"jsonrpc": "2.0", "id": 1000, "method": "tools/call", "params": {
                    "name": "busy__hang",
                    "arguments": {},
                    "_meta": {"progressToken": "hang"},
                }}),
            )
            .await;
        while client.next().await["method"] != "notifications/progress" {}
        let RawClient { child, stdin, .. } = client;
        // The client stays connected (its stdin open) while the gateway is signalled.
        check_stopped(child, signal, &groups, dir.path()).await;
        drop(stdin);
    }
}

/// How a call the client cancelled is logged (`CANCELLED_BY_CLIENT`).
const CANCELLED_BY_CLIENT: &str = "cancelled by the client";

/// A client whose first lines are a notification (a cancellation of a request it gave up
/// on, a progress report) and an answer is served all the same: they are dropped, and its
/// `initialize` is answered. (Before, rmcp's handshake took anything but a request for an
/// error and the gateway exited with status 3.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_before_initialize_does_not_end_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        json!({"small": embedded(3, &[], json!({"preload": true}))}),
    );
    let mut client = RawClient::spawn(&config, dir.path());
    client
        .send(
            json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                     "params": {"requestId": 99, "reason": "gave up"}}),
        )
        .await;
    client
        .send(json!({"jsonrpc": "2.0", "id": 98, "result": {}}))
        .await;
    let (result, _) = client.initialize().await;
    assert!(result.get("serverInfo").is_some(), "{result}");
    let mut id = 0;
    wait_listed(&mut client, "small__echo", &mut id).await;
}

/// A client that sends a call with a progress token and closes stdin at once (`printf …
/// | psych serve`) still reads the call's answer: rmcp sends no notification once the
/// input has ended, so the call's progress is dropped rather than hold the answer. (Before,
/// the relay's first report waited for rmcp's loop to end, the answer waited for the relay,
/// and rmcp cancelled the call after its 5 s: the answer, logged, never came.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_progress_is_answered_after_the_client_closes_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        json!({"small": embedded(3, &[], json!({"preload": true}))}),
    );
    let mut client = RawClient::spawn(&config, dir.path());
    client.initialize().await;
    let mut id = 0;
    wait_listed(&mut client, "small__progress", &mut id).await;
    client
        .send(
            json!({"jsonrpc": "2.0", "id": 1000, "method": "tools/call", "params": {
                "name": "small__progress",
                "arguments": {"steps": 3},
                "_meta": {"progressToken": "p"},
            }}),
        )
        .await;
    let RawClient {
        child: _child,
        stdin,
        mut lines,
    } = client;
    drop(stdin);
    let answer = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            let message: Value = serde_json::from_str(&line).unwrap();
            if message.get("id") == Some(&json!(1000)) {
                return Some(message);
            }
        }
        None
    })
    .await
    .expect("the gateway ends");
    let answer = answer.expect("the call is answered before the gateway ends");
    assert!(answer.to_string().contains("3 steps reported"), "{answer}");
}

/// A second signal exits at once, and still leaves no upstream running: twelve servers
/// that ignore SIGTERM, stopped by the first signal's shutdown when the second comes, are
/// all gone once the gateway has exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_and_leaves_no_upstream() {
    const SERVERS: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let stubborn = json!({
        "command": "sh",
        "args": ["-c", "trap '' HUP INT TERM; exec sleep 600"],
        "preload": true,
    });
    let servers: serde_json::Map<String, Value> = (0..SERVERS)
        .map(|n| (format!("s{n}"), stubborn.clone()))
        .collect();
    let config = write_config(dir.path(), Value::Object(servers));
    let mut gateway = tokio::process::Command::new(PSYCH)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--dir")
        .arg(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = gateway.id().unwrap();
    let groups = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let groups = child_groups(pid);
            if groups.len() == SERVERS {
                return groups;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("every upstream started");
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    signal("-INT");
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal("-INT");
    let exited = tokio::time::timeout(Duration::from_secs(10), gateway.wait())
        .await
        .expect("the gateway exits at once")
        .unwrap();
    assert!(!exited.success(), "{exited}");
    // A SIGKILL is sent by the time the gateway exits; its delivery is the kernel's.
    let left = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let left: Vec<i32> = groups.iter().flat_map(|&g| live_members(g)).collect();
            if left.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let still: Vec<i32> = groups.iter().flat_map(|&g| live_members(g)).collect();
    for &pid in &still {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    assert!(left.is_ok(), "upstream processes left running: {still:?}");
}

/// A client that closes stdin with calls hanging upstream (what clients commonly do when
/// they quit): the gateway exits cleanly, stops every upstream group, and the session log
/// opens intact with a result for every call, saying the client cancelled it. (Before, the
/// gateway returned as soon as rmcp's loop ended, without waiting for the calls to log
/// their results, and a call cut short when the client left was logged as cut short by a
/// shutdown.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_closing_stdin_with_calls_in_flight_finds_them_logged_as_cancelled_by_it() {
    const CALLS: u64 = 4;
    let dir = tempfile::tempdir().unwrap();
    let config = shutdown_config(dir.path());
    let mut client = RawClient::spawn(&config, dir.path());
    client.initialize().await;
    let mut id = 0;
    wait_listed(&mut client, "busy__hang", &mut id).await;
    wait_listed(&mut client, "idle__echo", &mut id).await;
    let groups = child_groups(client.child.id().unwrap());
    assert_eq!(groups.len(), 2, "two upstream groups: {groups:?}");
    for n in 0..CALLS {
        client
            .send(
                json!({"jsonrpc": "2.0", "id": 1000 + n, "method": "tools/call", "params": {
                    "name": "busy__hang",
                    "arguments": {},
                    "_meta": {"progressToken": format!("hang-{n}")},
                }}),
            )
            .await;
    }
    // Every call hangs upstream once its progress says so.
    let mut hanging = 0;
    while hanging < CALLS {
        if client.next().await["method"] == "notifications/progress" {
            hanging += 1;
        }
    }
    let RawClient {
        mut child,
        stdin,
        lines,
    } = client;
    drop(stdin);
    // rmcp waits up to 5 s for the answers of calls in flight when its input ends, then
    // cancels them; the shutdown that follows is bounded by SHUTDOWN_WITHIN.
    let exited = tokio::time::timeout(
        Duration::from_secs(5) + SHUTDOWN_WITHIN + Duration::from_secs(20),
        child.wait(),
    )
    .await
    .expect("the gateway exits when its client leaves")
    .unwrap();
    drop(lines);
    assert!(exited.success(), "a clean exit: {exited}");
    for &group in &groups {
        assert_eq!(
            live_members(group),
            Vec::<i32>::new(),
            "nothing of upstream group {group} is left"
        );
    }
    let results = logged_results(dir.path());
    let hung: Vec<&String> = results
        .iter()
        .filter(|(name, _)| name == "busy__hang")
        .map(|(_, text)| text)
        .collect();
    assert_eq!(
        hung.len(),
        CALLS as usize,
        "a result for every call: {results:?}"
    );
    for text in hung {
        assert!(text.starts_with(CANCELLED_BY_CLIENT), "{text:?}");
    }
}

/// A client that forwards each `tools/list_changed` and each progress notification.
struct Client {
    changed: mpsc::UnboundedSender<()>,
    progress: mpsc::UnboundedSender<ProgressNotificationParam>,
}

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.changed.send(());
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let _ = self.progress.send(params);
    }
}

/// Starts `psych serve --http` with `flags`: the gateway and its URL.
async fn start_http(config: &Path, dir: &Path, flags: &[&str]) -> (tokio::process::Child, String) {
    let mut command = tokio::process::Command::new(PSYCH);
    command
        .arg("serve")
        .arg("--http")
        .arg("127.0.0.1:0")
        .arg("--config")
        .arg(config)
        .arg("--dir")
        .arg(dir)
        .args(flags);
    crate::support::spawn_listening(command).await
}

type HttpSession = RunningService<RoleClient, Client>;

async fn http_session(
    url: &str,
) -> (
    HttpSession,
    mpsc::UnboundedReceiver<()>,
    mpsc::UnboundedReceiver<ProgressNotificationParam>,
) {
    let (changed, changed_rx) = mpsc::unbounded_channel();
    let (progress, progress_rx) = mpsc::unbounded_channel();
    let session = Client { changed, progress }
        .serve(StreamableHttpClientTransport::from_uri(url.to_owned()))
        .await
        .unwrap();
    (session, changed_rx, progress_rx)
}

/// SIGTERM and SIGINT over `--http`, with a call hanging upstream: as over stdio.
/// (Before, SIGTERM killed it at once, and SIGINT left the call without a result.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_stops_the_http_gateway_cleanly_with_a_call_in_flight() {
    for signal in ["-TERM", "-INT"] {
        let dir = tempfile::tempdir().unwrap();
        let config = shutdown_config(dir.path());
        let (gateway, url) = start_http(&config, dir.path(), &[]).await;
        let (session, mut changed, mut progress) = http_session(&url).await;
        for tool in ["busy__hang", "idle__echo"] {
            wait_listed_http(&session, &mut changed, tool).await;
        }
        let groups = child_groups(gateway.id().unwrap());
        assert_eq!(groups.len(), 2, "{signal}: two upstream groups: {groups:?}");
        let (call, note) = announced_hang(session.peer(), &mut progress, "busy__hang").await;
        assert_eq!(note.progress_token, call.progress_token);
        check_stopped(gateway, signal, &groups, dir.path()).await;
        // The call was answered, with its cancellation, before the session ended.
        let answer = tokio::time::timeout(Duration::from_secs(10), call.await_response())
            .await
            .expect("the call's answer came before the gateway ended");
        let answer = format!("{answer:?}");
        assert!(
            answer.contains(psych_gateway::CANCELLED_BY_SHUTDOWN),
            "{signal}: {answer}"
        );
        drop(session);
    }
}

/// The bound on `initialize`'s answer with upstreams that never answer (see
/// [`initialize_is_answered_at_once_and_late_servers_arrive_through_list_changed`]).
const INITIALIZE_WITHIN: Duration = Duration::from_secs(15);

/// A TCP listener that accepts connections and never answers (an HTTP upstream that
/// hangs): its URL, and the task holding it.
async fn deaf_listener() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    (format!("http://{addr}/mcp"), task)
}

/// `initialize` is answered at once while one stdio upstream never answers its initialize
/// and one HTTP upstream accepts and never answers; a good upstream that starts only once
/// the client has listed (it waits for a file the test creates then) reaches the client
/// through `list_changed`. (Before, `initialize` waited for every upstream's first
/// attempt: 30 s, the connect deadline.)
///
/// `initialize` is timed from the request to its answer, sent once the gateway is up (its
/// upstream processes started), and bounded at [`INITIALIZE_WITHIN`]: a debug binary on a
/// loaded 2-core machine cannot promise the issue's 1 s, but 15 s still tells "answered at
/// once" from the old 30 s, with room for a machine stalled by the tests beside it. The
/// figure is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_is_answered_at_once_and_late_servers_arrive_through_list_changed() {
    let dir = tempfile::tempdir().unwrap();
    let (deaf, _held) = deaf_listener().await;
    let gate = dir.path().join("late-may-start");
    let late = json!({
        "command": "sh",
        "args": [
            "-c",
            "while [ ! -e \"$1\" ]; do sleep 0.05; done; exec \"$0\" serve-embedded --tools 3",
            PSYCH,
            gate,
        ],
        "preload": true,
    });
    let config = write_config(
        dir.path(),
        json!({
            "mute": embedded(3, &["--hang-initialize"], json!({"preload": true})),
            "deaf": {"url": deaf, "preload": true},
            "late": late,
        }),
    );
    let mut client = RawClient::spawn(&config, dir.path());
    // The gateway is up once it has started its stdio upstreams (mute, and late's shell).
    let gateway = client.child.id().unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while child_groups(gateway).len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the gateway starts its upstreams");
    let (info, took) = client.initialize().await;
    eprintln!("initialize answered in {took:?}");
    assert!(took < INITIALIZE_WITHIN, "initialize took {took:?}");
    let instructions = info["instructions"].as_str().unwrap_or_default();
    for server in ["mute", "deaf", "late"] {
        assert!(
            instructions.contains(&format!(
                "- {server}: deferred MCP server, no tools (not listed yet)"
            )),
            "{server} is shown connecting: {instructions}"
        );
    }
    let mut changed = 0;
    let first = client.list(1, &mut changed).await;
    assert!(
        !first.iter().any(|n| n.starts_with("late__")),
        "late is still starting: {first:?}"
    );
    assert!(first.iter().any(|n| n == "psych_list_tools"), "{first:?}");
    std::fs::write(&gate, b"").unwrap();
    let mut id = 1;
    wait_listed(&mut client, "late__echo", &mut id).await;
    // The silent ones are still connecting, and nothing of them is listed.
    let now = client.list(id + 1, &mut changed).await;
    assert!(
        !now.iter()
            .any(|n| n.starts_with("mute__") || n.starts_with("deaf__")),
        "{now:?}"
    );
    // Stopped while the mute upstream still waits in its initialize: nothing is left.
    let groups = child_groups(client.child.id().unwrap());
    let RawClient { child, stdin, .. } = client;
    stop(child).await;
    drop(stdin);
    for group in groups {
        assert_eq!(live_members(group), Vec::<i32>::new(), "group {group}");
    }
}

/// One raw JSON-RPC `initialize` POST to `url`: the whole HTTP answer as text.
async fn post_initialize(url: &str) -> String {
    use tokio::io::AsyncReadExt;
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    }})
    .to_string();
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json, text/event-stream\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // An accepted session streams: read what comes within a moment; a refusal closes.
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// More HTTP sessions than `--max-sessions`: the one past the cap is refused (503, with
/// `Retry-After`) with an error naming the cap, the open ones keep working, and a session
/// a client deletes frees its slot. (Before, there was no cap: the flag did not exist.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sessions_past_the_cap_are_refused_and_closed_ones_are_released() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        json!({"up": embedded(3, &[], json!({"preload": true}))}),
    );
    let (gateway, url) = start_http(&config, dir.path(), &["--max-sessions", "2"]).await;
    let (first, ..) = http_session(&url).await;
    let (second, ..) = http_session(&url).await;
    let (changed, _) = mpsc::unbounded_channel();
    let (progress, _) = mpsc::unbounded_channel();
    let third = Client { changed, progress }
        .serve(StreamableHttpClientTransport::from_uri(url.clone()))
        .await;
    assert!(third.is_err(), "a third session is refused");
    let refused = post_initialize(&url).await;
    assert!(
        refused.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{refused}"
    );
    assert!(refused.contains("\r\nretry-after: 1\r\n"), "{refused}");
    // An error for the initialize's id, which rmcp's client shows as the handshake's.
    assert!(
        refused.contains("\r\ncontent-type: application/json\r\n"),
        "{refused}"
    );
    assert!(refused.contains(r#""id":1"#), "{refused}");
    assert!(
        refused.contains("2 sessions are open, the most it allows (psych serve: --max-sessions)"),
        "{refused}"
    );
    // The open sessions are served.
    for session in [&first, &second] {
        assert!(!session.list_all_tools().await.unwrap().is_empty());
    }
    // A session the client closes (rmcp's client deletes it) frees its slot.
    first.cancel().await.unwrap();
    let reopened = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let (changed, _) = mpsc::unbounded_channel();
            let (progress, _) = mpsc::unbounded_channel();
            if let Ok(session) = (Client { changed, progress })
                .serve(StreamableHttpClientTransport::from_uri(url.clone()))
                .await
            {
                break session;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the deleted session's slot is freed");
    assert!(!reopened.list_all_tools().await.unwrap().is_empty());
    reopened.cancel().await.unwrap();
    second.cancel().await.unwrap();
    stop(gateway).await;
}

/// `psych budget` on `config`, its catalogue in `dir`, started by `program` (`psych`
/// itself, or `nohup` in front of it), its output dropped.
fn budget_command(program: &str, config: &Path, dir: &Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    if program != PSYCH {
        command.arg(PSYCH);
    }
    command
        .arg("budget")
        .arg("--config")
        .arg(config)
        .arg("--store")
        .arg(dir.join("catalog.redb"))
        .stdout(Stdio::null())
        .kill_on_drop(true);
    command
}

/// A terminal's Ctrl-C (SIGINT, sent to `psych` alone: each upstream runs in its own process
/// group) or SIGTERM or SIGHUP, while `psych budget` waits on a server whose listing hangs:
/// `psych` stops at once, with 128 + the signal's number, and leaves nothing of the
/// server's group running (its grandchild included). (Before, the signal killed `psych`
/// outright: no destructor ran, and the server and its grandchild were left running.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_stops_psych_budget_and_every_server_it_started() {
    for (signal, status) in stop_signals(&[("-INT", 130), ("-TERM", 143), ("-HUP", 129)]) {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(
            dir.path(),
            json!({"stuck": embedded(3, &["--grandchild", "--hang-listing"], json!({}))}),
        );
        let mut budget = budget_command(PSYCH, &config, dir.path())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = budget.id().unwrap();
        // The server runs, its grandchild with it, and its listing hangs.
        let group = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                if let Some(&group) = child_groups(pid)
                    .iter()
                    .find(|&&g| live_members(g).len() >= 2)
                {
                    break group;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the server and its grandchild start");
        let sent = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let mut stderr = budget.stderr.take().unwrap();
        let exited = tokio::time::timeout(Duration::from_secs(20), budget.wait())
            .await
            .unwrap_or_else(|_| panic!("{signal}: psych budget exits"))
            .unwrap();
        let mut said = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut said)
            .await
            .unwrap();
        assert_eq!(exited.code(), Some(status), "{signal}: {exited}; {said}");
        assert!(
            said.contains(": stopped; the servers it started were stopped"),
            "{said}"
        );
        // Killed as the runtime dropped its tasks: gone within a moment.
        let gone = tokio::time::timeout(Duration::from_secs(10), async {
            while !live_members(group).is_empty() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(
            gone.is_ok(),
            "{signal}: nothing of the server's group is left: {:?}",
            live_members(group)
        );
    }
}

/// `psych budget` beside a `psych serve` on the same folder: the gateway holds the
/// catalogue's file, so the command lists into memory, says so on stderr, and its report
/// names memory, not the file. (Before, the report said the listings were synced into the
/// file the gateway held.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_beside_a_gateway_reports_its_listings_kept_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        json!({"up": embedded(3, &[], json!({"preload": true}))}),
    );
    let mut client = RawClient::spawn(&config, dir.path());
    client.initialize().await;
    let mut id = 0;
    wait_listed(&mut client, "up__echo", &mut id).await;
    let out = tokio::process::Command::new(PSYCH)
        .args(["budget", "--json", "--config"])
        .arg(&config)
        .arg("--store")
        .arg(dir.path().join("catalog.redb"))
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("is held by another process"), "{stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let store = report["store"].as_str().unwrap();
    assert!(
        store.starts_with("memory only (")
            && store.ends_with("catalog.redb is held by another process)"),
        "{store}"
    );
    let RawClient { child, stdin, .. } = client;
    stop(child).await;
    drop(stdin);
}

/// Started with SIGHUP ignored (`nohup`), `psych budget` keeps it ignored: a hangup leaves
/// it waiting on its stuck server, and SIGINT still stops it. (Before the fix, handling
/// SIGHUP would have overridden `nohup`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_nohup_a_hangup_stays_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        json!({"stuck": embedded(3, &["--hang-listing"], json!({}))}),
    );
    let mut command = budget_command("nohup", &config, dir.path());
    let mut budget = command.stderr(Stdio::null()).spawn().unwrap();
    let pid = budget.id().unwrap();
    // `nohup` becomes psych (exec): its child is the server.
    tokio::time::timeout(Duration::from_secs(60), async {
        while child_groups(pid).is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the server starts");
    let kill = |signal: &str| {
        let sent = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
    };
    kill("-HUP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(budget.try_wait().unwrap().is_none(), "a hangup is ignored");
    kill("-INT");
    let exited = tokio::time::timeout(Duration::from_secs(20), budget.wait())
        .await
        .expect("psych budget exits")
        .unwrap();
    assert_eq!(exited.code(), Some(130), "{exited}");
}

/// A call whose progress token is longer than a request id may be (every progress
/// notification would echo it) is refused as invalid, and nothing is called; one at the
/// bound is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_an_over_long_progress_token_is_refused_as_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        json!({"idle": embedded(2, &[], json!({"preload": true}))}),
    );
    let mut client = RawClient::spawn(&config, dir.path());
    client.initialize().await;
    let mut id = 0;
    wait_listed(&mut client, "idle__echo", &mut id).await;
    for (call, bytes) in [
        (1000, psych_mcp::MAX_REQUEST_ID_BYTES + 1),
        (1001, psych_mcp::MAX_REQUEST_ID_BYTES),
    ] {
        client
            .send(
                json!({"jsonrpc": "2.0", "id": call, "method": "tools/call", "params": {
                    "name": "idle__echo",
                    "arguments": {"text": "through"},
                    "_meta": {"progressToken": "p".repeat(bytes)},
                }}),
            )
            .await;
    }
    let mut answers = BTreeMap::new();
    while answers.len() < 2 {
        let message = client.next().await;
        if let Some(call @ (1000 | 1001)) = message.get("id").and_then(Value::as_u64) {
            answers.insert(call, message);
        }
    }
    let refused = &answers[&1000]["error"];
    assert_eq!(refused["code"], json!(-32602), "{refused}");
    let message = refused["message"].as_str().unwrap();
    assert!(
        message.contains("a progress token may be at most 256 bytes"),
        "{message}"
    );
    let served = &answers[&1001]["result"];
    assert_eq!(served["content"][0]["text"], json!("through"), "{served}");
    drop(client);
    let results = logged_results(dir.path());
    assert_eq!(
        results.len(),
        1,
        "only the call served is logged: {results:?}"
    );
}
