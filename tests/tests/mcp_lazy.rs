//! Issue 30, psych-mcp's part: servers started when they are needed
//! ([`McpManager::add_lazy_server`]), against real processes. A wrapper shell appends a
//! line to a file each time the server's process starts, so starts are counted exactly;
//! the process table says whether a stopped server's process group is gone.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use psych_mcp::{
    Backoff, ChangeCause, McpConfig, McpError, McpEvent, McpManager, ServerConfig, Timeouts,
    Transport,
};
use psych_types::{ConnectionSpec, JsonObject, Reachability, ServerId, ToolHost, ToolRef};
use serde_json::json;

use crate::mcp_common::SERVER;

fn id(name: &str) -> ServerId {
    ServerId::new(name).unwrap()
}

/// The test server behind `sh`, which first appends a line to `starts`.
fn counted_server(name: &str, starts: &Path) -> ServerConfig {
    shell(
        name,
        &format!("echo started >> '{}'; exec '{SERVER}'", starts.display()),
    )
}

fn shell(name: &str, script: &str) -> ServerConfig {
    stdio(name, "sh", &["-c", script])
}

fn stdio(name: &str, command: &str, args: &[&str]) -> ServerConfig {
    ServerConfig {
        transport: Transport::Stdio {
            command: command.to_owned(),
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
            env: BTreeMap::new(),
            cwd: None,
        },
        connection: ConnectionSpec::new(id(name)),
        extra: JsonObject::new(),
    }
}

fn manager() -> McpManager {
    let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap();
    McpManager::builder(config)
        .timeouts(
            Timeouts::uniform(Duration::from_secs(20))
                .with_shutdown_grace(Duration::from_millis(500)),
        )
        .backoff(Backoff::new(
            Duration::from_millis(50),
            Duration::from_millis(200),
        ))
        .build()
        .unwrap()
}

fn starts(file: &Path) -> usize {
    std::fs::read_to_string(file).map_or(0, |text| text.lines().count())
}

/// Calls `server`'s `echo` (a hang guard only: 30 s).
async fn echo(manager: &McpManager, server: &str, text: &str) -> Result<String, McpError> {
    let mut arguments = JsonObject::new();
    arguments.insert("text".into(), json!(text));
    let tool = ToolRef::parse(server, "echo").unwrap();
    let call = manager.call_tool(&tool, arguments);
    let output = tokio::time::timeout(Duration::from_secs(30), call)
        .await
        .expect("the call came back")?;
    Ok(serde_json::to_value(&output).unwrap()["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned())
}

/// A manager with one lazy server `lazy` of idle time `idle`, its starts counted in a file
/// of a new folder, and a subscriber to its events from before it was added.
async fn one_lazy(
    idle: Duration,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    McpManager,
    psych_mcp::McpEvents,
) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("starts");
    let manager = manager();
    let events = manager.events();
    manager
        .add_lazy_server(id("lazy"), counted_server("lazy", &file), idle)
        .await
        .unwrap();
    (dir, file, manager, events)
}

/// Whether any process of process group `pgid` is alive (the process table's own word).
fn group_alive(pgid: i32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|entry| {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // pid (comm) state ppid pgrp ...: the fields after the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields.get(2).and_then(|pgrp| pgrp.parse::<i32>().ok()) == Some(pgid)
            && fields.first() != Some(&"Z")
    })
}

/// Waits (generously) until `done` holds.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(30), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_server_starts_once_for_concurrent_first_calls_and_stops_when_idle() {
    let (_dir, file, manager, events) = one_lazy(Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(starts(&file), 0, "nothing started before a call");
    assert!(events.try_next().is_none(), "adding it reports nothing");
    assert_eq!(manager.is_running(&id("lazy")), Some(false));

    // Eight first calls at once: one start.
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let manager = manager.clone();
            tokio::spawn(async move { echo(&manager, "lazy", &format!("call {i}")).await })
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap().unwrap(), format!("call {i}"));
    }
    assert_eq!(starts(&file), 1, "one start for concurrent first calls");
    assert_eq!(manager.is_running(&id("lazy")), Some(true));
    // A start is reported as a first connection is.
    assert!(matches!(
        events.try_next(),
        Some(McpEvent::Reachability {
            reachability: Reachability::Reachable,
            ..
        })
    ));
    assert!(matches!(
        events.try_next(),
        Some(McpEvent::ToolsChanged {
            cause: ChangeCause::Connected,
            ..
        })
    ));
    let pgid = manager.process_group(&id("lazy")).expect("a stdio server");
    assert!(group_alive(pgid));

    // Used again within its idle time: still the same process.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(echo(&manager, "lazy", "again").await.unwrap(), "again");
    assert_eq!(starts(&file), 1);

    // Idle: stopped, its whole process group gone.
    eventually("the idle server stopped", || {
        manager.is_running(&id("lazy")) == Some(false)
    })
    .await;
    eventually("its process group gone", || !group_alive(pgid)).await;
    assert!(events.try_next().is_none(), "an idle stop reports nothing");

    // The next call starts it again.
    assert_eq!(echo(&manager, "lazy", "back").await.unwrap(), "back");
    assert_eq!(starts(&file), 2);
    let pgid = manager.process_group(&id("lazy")).expect("running again");
    manager.shutdown().await;
    assert!(!group_alive(pgid), "shutdown stops a running lazy server");
}

/// A call held in flight longer than the idle time keeps the server running; it is
/// stopped only once the call has ended and the idle time has passed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_server_is_never_stopped_under_a_call_in_flight() {
    let (_dir, file, manager, _) = one_lazy(Duration::from_millis(200)).await;
    let mut arguments = JsonObject::new();
    arguments.insert("ms".into(), json!(1500));
    let output = manager
        .call_tool(&ToolRef::parse("lazy", "sleep").unwrap(), arguments)
        .await
        .unwrap();
    assert!(!output.is_error, "{output:?}");
    assert_eq!(starts(&file), 1);
    eventually("stopped after the call", || {
        manager.is_running(&id("lazy")) == Some(false)
    })
    .await;
    manager.shutdown().await;
}

/// A lazy server that cannot start fails the call that needed it with why, at once; the
/// other servers are untouched, and the next call tries again. `list` starts a lazy server
/// as a call does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_server_that_fails_to_start_fails_the_call_with_why_and_others_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let broken_starts = dir.path().join("broken");
    let good_starts = dir.path().join("good");
    let manager = manager();
    let script = format!(
        "echo started >> '{}'; echo 'no credentials for the API' >&2; exit 3",
        broken_starts.display()
    );
    manager
        .add_lazy_server(
            id("broken"),
            shell("broken", &script),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    manager
        .add_lazy_server(
            id("good"),
            counted_server("good", &good_starts),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let error = echo(&manager, "broken", "x").await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "at once");
    let said = error.to_string();
    // The start's own error, kept whole: the process's exit and its stderr.
    let McpError::StartFailed { source, .. } = &error else {
        panic!("not the start's failure: {error:?}");
    };
    assert!(
        matches!(&**source, McpError::Exited { stderr, .. }
            if stderr.contains("no credentials for the API")),
        "{source:?}"
    );
    assert_eq!(said, source.to_string(), "said as the start said it");
    assert!(
        std::error::Error::source(&error).is_some(),
        "the start's error is the source"
    );
    assert_eq!(starts(&good_starts), 0, "the other server was not started");
    let listing = manager.list(&id("good")).await.unwrap();
    assert!(
        listing
            .tools
            .iter()
            .any(|tool| tool.name.as_str() == "echo")
    );
    assert_eq!(starts(&good_starts), 1, "a listing starts it");
    assert_eq!(echo(&manager, "good", "fine").await.unwrap(), "fine");
    assert_eq!(starts(&good_starts), 1);
    // The next call to the broken one tries again, and says why again.
    let again = echo(&manager, "broken", "y").await.unwrap_err();
    assert!(
        matches!(&again, McpError::StartFailed { source, .. }
            if source.to_string().contains("no credentials for the API")),
        "{again}"
    );
    assert_eq!(starts(&broken_starts), 2);
    // A command that is not there: the spawn's own error, which a caller can tell from a
    // server that failed.
    manager
        .add_lazy_server(
            id("missing"),
            stdio("missing", "/nonexistent/psych-no-such-server", &[]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let missing = echo(&manager, "missing", "z").await.unwrap_err();
    assert!(
        matches!(&missing, McpError::StartFailed { source, .. }
            if matches!(&**source, McpError::Spawn { source, .. }
                if source.kind() == std::io::ErrorKind::NotFound)),
        "{missing:?}"
    );
    manager.shutdown().await;
}

/// A server that exits right after its first listing (each start answers `initialize` and
/// `tools/list`, then ends): the calls that needed it fail, having started it once, rather
/// than starting it again and again without an answer; the next calls try once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_server_that_exits_right_after_starting_fails_the_call_after_one_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("starts");
    // `server/discover` refused, `initialize` answered, the listing answered, then the end;
    // a pause first, so that the test's eight first polls come before the start can end
    // on however loaded a machine.
    let script = format!(
        r#"echo started >> '{}'
        sleep 0.5
        answer() {{ read -r line; id=$(printf '%s' "$line" | sed 's/.*"id":\([0-9]*\).*/\1/'); }}
        answer
        printf '{{"jsonrpc":"2.0","id":%s,"error":{{"code":-32601,"message":"Method not found"}}}}
' "$id"
        answer
        printf '{{"jsonrpc":"2.0","id":%s,"result":{{"protocolVersion":"2025-11-25","capabilities":{{"tools":{{}}}},"serverInfo":{{"name":"brief","version":"1"}}}}}}
' "$id"
        read -r initialized
        answer
        printf '{{"jsonrpc":"2.0","id":%s,"result":{{"tools":[{{"name":"echo","inputSchema":{{"type":"object"}}}}]}}}}
' "$id"
        "#,
        file.display()
    );
    let manager = manager();
    manager
        .add_lazy_server(
            id("brief"),
            shell("brief", &script),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    for round in 1..=2 {
        // Eight calls, each polled once (each asks for the start: the way to the wait does
        // not await) before any is driven on: all wait for the one start, and those driven
        // after its process ended find its session lost.
        let mut calls: Vec<_> = (0..8)
            .map(|_| Box::pin(echo(&manager, "brief", "x")))
            .collect();
        for call in &mut calls {
            let pending =
                std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx).is_pending())).await;
            assert!(pending, "a call ended before it waited for the start");
        }
        for call in calls {
            let error = call.await.unwrap_err();
            // Either it took the session before the exit was seen (the call then finds the
            // process gone), or it found the session lost at once.
            assert!(
                error.is_connection_lost() || matches!(&error, McpError::Unreachable { .. }),
                "{error:?}"
            );
        }
        assert_eq!(
            starts(&file),
            round,
            "one start for the calls of each round"
        );
    }
    manager.shutdown().await;
}

/// With an idle time of zero, a request that asked for a start but has not yet run when
/// the start ends still gets that start's session: the server is not stopped for idleness
/// under a request waiting to take it (else it would ask for a second start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_idle_time_a_request_not_yet_run_keeps_the_start_it_asked_for() {
    let (_dir, file, manager, events) = one_lazy(Duration::ZERO).await;
    let mut request = std::pin::pin!(echo(&manager, "lazy", "late"));
    // Polled once: it asks for the start and waits (see the removal test below).
    let pending =
        std::future::poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx).is_pending())).await;
    assert!(pending, "the request ended before it waited for the start");
    // The start is reported before the request could run (it is not polled).
    let started = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let McpEvent::ToolsChanged { .. } = events.next().await {
                break;
            }
        }
    });
    started.await.expect("the server started");
    // Many idle checks (every 10 ms) while the request is not run.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        manager.is_running(&id("lazy")),
        Some(true),
        "stopped under a request waiting for it"
    );
    assert_eq!(request.await.unwrap(), "late");
    assert_eq!(starts(&file), 1, "one start");
    eventually("stopped once nothing is in flight", || {
        manager.is_running(&id("lazy")) == Some(false)
    })
    .await;
    manager.shutdown().await;
}

/// A server that never answers `initialize`, written by `script` (a `sh -c` script that
/// writes `ready` once it is up), removed while it starts under a grace of 10 s (one no
/// loaded machine comes near): how long the removal took. The request waiting for it
/// fails as for a server removed.
async fn removed_while_it_starts(script: &str, ready: &std::path::Path) -> Duration {
    let config = McpConfig::parse(r#"{"mcpServers": {}}"#, |_| None).unwrap();
    let manager = McpManager::builder(config)
        .timeouts(
            Timeouts::uniform(Duration::from_secs(20)).with_shutdown_grace(Duration::from_secs(10)),
        )
        .build()
        .unwrap();
    manager
        .add_lazy_server(id("slow"), shell("slow", script), Duration::from_secs(30))
        .await
        .unwrap();
    let request = tokio::spawn({
        let manager = manager.clone();
        async move { echo(&manager, "slow", "x").await }
    });
    eventually("the server started", || ready.exists()).await;
    let removing = Instant::now();
    manager.remove_server(&id("slow")).await;
    let took = removing.elapsed();
    let error = request.await.unwrap().unwrap_err();
    assert!(matches!(error, McpError::UnknownServer { .. }), "{error}");
    manager.shutdown().await;
    took
}

/// A server removed while it starts is stopped as a running one is: SIGTERM first, with
/// the grace to end its own way (a server behind `docker run` stops its container), not
/// killed outright.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_removed_while_it_starts_is_given_its_grace() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let bye = dir.path().join("bye");
    // Says when it is up, and on SIGTERM leaves a note at once.
    let script = format!(
        r#"trap "echo bye > '{}'; exit 0" TERM; echo up > '{}'; while :; do sleep 0.05; done"#,
        bye.display(),
        ready.display()
    );
    removed_while_it_starts(&script, &ready).await;
    assert!(bye.exists(), "the server was killed without its SIGTERM");
}

/// The grace is the whole group's, not only its first process's: behind a wrapper that
/// exits at SIGTERM at once (`sh -c 'server; echo done'` keeps the shell as the group's
/// leader), the server it runs still gets its grace to clean up before anything is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_processes_a_server_leaves_behind_get_the_grace_too() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let bye = dir.path().join("bye");
    // The server cleans up for 0.3 s on SIGTERM before it leaves its note; the shell
    // around it, with a command after it, stays its group's leader and ends at once.
    let server = format!(
        r#"trap "sleep 0.3; echo bye > '{}'; exit 0" TERM; echo up > '{}'; while :; do sleep 0.05; done"#,
        bye.display(),
        ready.display()
    );
    let script = format!("sh -c '{}'; echo done", server.replace('\'', r#"'\''"#));
    let took = removed_while_it_starts(&script, &ready).await;
    assert!(
        bye.exists(),
        "the server was killed in its cleanup, when its wrapper exited"
    );
    assert!(took < Duration::from_secs(5), "not the whole grace");
}

/// A lazy server whose process dies under a call: that call fails, and the next request
/// starts it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_server_lost_while_running_is_started_again_by_the_next_call() {
    let (_dir, file, manager, _) = one_lazy(Duration::from_secs(30)).await;
    let crashed = manager
        .call_tool(&ToolRef::parse("lazy", "crash").unwrap(), JsonObject::new())
        .await
        .unwrap_err();
    assert!(crashed.is_connection_lost(), "{crashed}");
    assert_eq!(echo(&manager, "lazy", "back").await.unwrap(), "back");
    assert_eq!(starts(&file), 2);
    manager.shutdown().await;
}

/// Requests waiting for a start that never ends (the server never answers `initialize`)
/// end at once when the server is removed, refused as unknown (the manager is not shut
/// down), as a later request to it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_for_a_start_end_when_the_server_is_removed() {
    let manager = manager();
    let config = stdio("stuck", SERVER, &["--hang-initialize"]);
    manager
        .add_lazy_server(id("stuck"), config, Duration::from_secs(30))
        .await
        .unwrap();
    // Each request is polled once before it is left to run, and says so: the way from a
    // call to its wait for the start does not await (the request asks for a start under
    // the slot's lock, then waits), so a request still pending after its first poll is
    // waiting for the start, and the removal below finds all three waiting.
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let manager = manager.clone();
        let (polled, first) = tokio::sync::oneshot::channel();
        waiting.push(tokio::spawn(async move {
            let mut request = std::pin::pin!(echo(&manager, "stuck", "x"));
            let pending =
                std::future::poll_fn(|cx| Poll::Ready(request.as_mut().poll(cx).is_pending()))
                    .await;
            let _ = polled.send(pending);
            request.await
        }));
        assert!(
            first.await.unwrap(),
            "a request ended before it waited for the start"
        );
    }
    let started = Instant::now();
    manager.remove_server(&id("stuck")).await;
    for request in waiting {
        let error = request.await.unwrap().unwrap_err();
        assert!(matches!(error, McpError::UnknownServer { .. }), "{error}");
    }
    assert!(started.elapsed() < Duration::from_secs(10), "at once");
    let error = echo(&manager, "stuck", "y").await.unwrap_err();
    assert!(matches!(error, McpError::UnknownServer { .. }), "{error}");
    manager.shutdown().await;
}

/// Issue 30 in the runtime, with a real process: a manager whose configuration makes a
/// server lazy ([`psych_mcp::McpManagerBuilder::lazy`]) connects without starting it, the
/// catalogue's kept listing serves a Run's first turn, and the Run's call (through
/// [`psych_runtime::LazyStarts`]) starts it once and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_starts_a_lazy_server_at_its_first_call() {
    use psych_catalog::{Catalog, FreshenerConfig};
    use psych_runtime::{CatalogSync, LazyStarts, Run, ScriptedModel, Step};
    use psych_types::{PermissionGrant, RunId};

    let dir = tempfile::tempdir().unwrap();
    let starts_file = dir.path().join("starts");
    let script = format!(
        "echo started >> '{}'; exec '{SERVER}'",
        starts_file.display()
    );
    let config = McpConfig::parse(
        &json!({"mcpServers": {"lazy": {"command": "sh", "args": ["-c", script]}}}).to_string(),
        |_| None,
    )
    .unwrap();
    // The listing a first (eager) connection kept.
    let catalog = Catalog::open(dir.path().join("catalog.redb")).unwrap();
    {
        let manager = McpManager::builder(config.clone()).build().unwrap();
        let connected = CatalogSync::connect(
            &manager,
            catalog.clone(),
            FreshenerConfig::builder().build().unwrap(),
        )
        .await
        .unwrap();
        assert!(connected.failures.is_empty());
        connected.sync.stop().await;
        connected.freshener.shutdown().await;
        manager.shutdown().await;
    }
    assert_eq!(starts(&starts_file), 1);

    let manager = McpManager::builder(config)
        .lazy(id("lazy"), Duration::from_secs(60))
        .build()
        .unwrap();
    let connected = CatalogSync::connect(
        &manager,
        catalog.clone(),
        FreshenerConfig::builder().build().unwrap(),
    )
    .await
    .unwrap();
    assert!(connected.failures.is_empty());
    assert_eq!(manager.is_lazy(&id("lazy")), Some(true));
    assert_eq!(manager.is_running(&id("lazy")), Some(false));
    assert_eq!(
        starts(&starts_file),
        1,
        "connecting a lazy server starts nothing"
    );
    let on_demand = Arc::new(LazyStarts::new(
        manager.clone(),
        Arc::clone(&connected.freshener),
    ));
    let target = psych_runtime::Target::Anthropic(psych_prompt_assembly::AnthropicOptions::new(
        "claude-sonnet-4-5",
        4096,
    ));
    let mut run = Run::builder(
        dir.path(),
        RunId::new("run-1").unwrap(),
        catalog,
        Arc::new(manager.clone()),
        target,
    )
    .connections([{
        let mut spec = ConnectionSpec::new(id("lazy"));
        spec.preload = psych_types::Preload::Eager;
        spec
    }])
    .grant(PermissionGrant::none().allow_server(id("lazy")))
    .on_demand(on_demand)
    .open()
    .await
    .unwrap();
    let mut model = ScriptedModel::new([
        Step::call("lazy__echo", json!({"text": "woken"})),
        Step::say("done"),
    ]);
    let request = run.user("go").await.unwrap();
    assert!(
        request.body().contains("lazy"),
        "the kept listing serves the turn"
    );
    assert_eq!(starts(&starts_file), 1);
    let psych_runtime::Next::Request(second) = run.reply(model.reply(&request)).await.unwrap()
    else {
        panic!("the model called a tool");
    };
    assert!(second.body().contains("woken"), "{}", second.body());
    assert_eq!(starts(&starts_file), 2);
    // The start changed nothing of the prefix: the tools and the system prompt are the
    // same bytes.
    let prefix = |body: &str| {
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        (body["tools"].to_string(), body["system"].to_string())
    };
    assert_eq!(prefix(second.body()), prefix(request.body()));
    assert_eq!(manager.is_running(&id("lazy")), Some(true));
    connected.sync.stop().await;
    connected.freshener.shutdown().await;
    manager.shutdown().await;
}
