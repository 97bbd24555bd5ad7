//! Issue 30 through `psych serve` as a process, with real upstream processes (`psych
//! serve-embedded` behind `sh`, which appends a line to a file at each start, so starts are
//! counted exactly): a server whose listing the gateway kept from an earlier run is known
//! without being started (listing, orientation), started by its first call and stopped
//! after its idle time (its processes gone from the process table), started again by the
//! next call; the tool listing's bytes are the same before and after each start and stop; a
//! listing that changed while the server was stopped (a tool removed, a schema changed) is
//! caught at the first call and reaches the client as `list_changed`; a server that cannot
//! start answers its call with a tool error naming why while the others answer; `--eager`
//! starts every server at once, and a call that reaches one still starting waits for it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::support::{PSYCH, stdio_gateway, text};

/// A client that forwards each `tools/list_changed` to a channel.
struct Client(mpsc::UnboundedSender<()>);

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.0.send(());
    }
}

type Session = RunningService<RoleClient, Client>;

/// An upstream entry: `psych serve-embedded` serving the tools of `catalog` (and the
/// control tools), behind `sh`, which first appends a line to `starts` (every attempt is
/// counted) and, when `refuse` exists, says why on stderr and exits instead; when `refuse`
/// with the extension `slow` exists, it starts 2 s late.
fn counted(starts: &Path, catalog: &Path, refuse: &Path, extra: Value) -> Value {
    let script = format!(
        "echo started >> '{starts}'; \
         if [ -e '{refuse}' ]; then echo 'licence server unreachable' >&2; exit 3; fi; \
         if [ -e '{slow}' ]; then sleep 2; fi; \
         exec '{PSYCH}' serve-embedded --catalog '{catalog}'",
        refuse = refuse.display(),
        slow = refuse.with_extension("slow").display(),
        starts = starts.display(),
        catalog = catalog.display(),
    );
    let mut entry = json!({"command": "sh", "args": ["-c", script], "preload": false});
    if let Value::Object(extra) = extra {
        entry.as_object_mut().unwrap().extend(extra);
    }
    entry
}

/// A `tools/list` result with `alpha` (taking `schema`) and, when `beta`, `beta`.
fn catalog(path: &Path, schema: Value, beta: bool) {
    let mut tools = vec![json!({
        "name": "alpha",
        "description": "Alpha: files an alpha report.",
        "inputSchema": schema,
    })];
    if beta {
        tools.push(json!({
            "name": "beta",
            "description": "Beta: files a beta report.",
            "inputSchema": {"type": "object"},
        }));
    }
    std::fs::write(path, json!({ "tools": tools }).to_string()).unwrap();
}

fn starts(file: &Path) -> usize {
    std::fs::read_to_string(file).map_or(0, |text| text.lines().count())
}

/// The processes whose command line holds `marker`.
fn processes_with(marker: &str) -> usize {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|cmdline| {
            String::from_utf8_lossy(cmdline)
                .replace('\0', " ")
                .contains(marker)
        })
        .count()
}

/// Waits (20 s at most) until no process's command line holds `marker`.
async fn gone(marker: &str) {
    let waited = tokio::time::timeout(Duration::from_secs(20), async {
        while processes_with(marker) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "processes with {marker} still run");
}

async fn connect(
    config: &Path,
    dir: &Path,
    flags: &[&str],
) -> (Session, mpsc::UnboundedReceiver<()>) {
    let (changed, changed_rx) = mpsc::unbounded_channel();
    let session = Client(changed)
        .serve(stdio_gateway(config, dir, flags))
        .await
        .unwrap();
    (session, changed_rx)
}

/// Ends the session and waits for the gateway (whose command line names `dir`) to exit,
/// so the next one on `dir` has its catalogue.
async fn close(session: Session, dir: &Path) {
    drop(session.cancel().await);
    gone(&dir.display().to_string()).await;
}

/// The listing's bytes once no server reads "not listed yet".
async fn listing(session: &Session) -> String {
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let tools = serde_json::to_string(&session.list_all_tools().await.unwrap()).unwrap();
            if !tools.contains("not listed yet") {
                return tools;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    waited.expect("every server is listed")
}

async fn call(session: &Session, server: &str, tool: &str, arguments: Value) -> CallToolResult {
    let params = CallToolRequestParams::new("psych_call_tool").with_arguments(
        json!({"server": server, "tool": tool, "arguments": arguments})
            .as_object()
            .unwrap()
            .clone(),
    );
    tokio::time::timeout(Duration::from_secs(60), session.call_tool(params))
        .await
        .expect("the call is answered")
        .unwrap()
}

async fn orientation(session: &Session) -> Value {
    let params = CallToolRequestParams::new("psych_orientation");
    let result = session.call_tool(params).await.unwrap();
    serde_json::from_str(&text(&result)).unwrap()
}

fn state_of(orientation: &Value, server: &str) -> String {
    orientation["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["server"] == server)
        .unwrap_or_else(|| panic!("{server} in {orientation}"))["state"]
        .as_str()
        .unwrap()
        .to_owned()
}

struct Setup {
    _dir: tempfile::TempDir,
    config: PathBuf,
    logs: PathBuf,
    /// Per server: its starts file, its catalogue, its refusal flag.
    files: Vec<(PathBuf, PathBuf, PathBuf)>,
}

/// Two counted servers, `steady` and `changing`, each with `alpha` and `beta`; `steady`
/// stops after 2 s idle, `changing` after 5 minutes (the tests never wait for it).
fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let mut servers = serde_json::Map::new();
    let mut files = Vec::new();
    for (name, extra) in [
        ("changing", json!({"idleSecs": 300})),
        ("steady", json!({"idleSecs": 2})),
    ] {
        let starts = dir.path().join(format!("{name}.starts"));
        let tools = dir.path().join(format!("{name}-tools.json"));
        let refuse = dir.path().join(format!("{name}.refuse"));
        catalog(
            &tools,
            json!({"type": "object", "properties": {"x": {"type": "string"}}}),
            true,
        );
        servers.insert(name.to_owned(), counted(&starts, &tools, &refuse, extra));
        files.push((starts, tools, refuse));
    }
    let config = dir.path().join("mcp.json");
    std::fs::write(&config, json!({ "mcpServers": servers }).to_string()).unwrap();
    let logs = dir.path().join("psych");
    Setup {
        config,
        logs,
        files,
        _dir: dir,
    }
}

/// The first run lists every server (nothing is kept yet), and keeps the listings.
async fn first_run(setup: &Setup) {
    let (session, _) = connect(&setup.config, &setup.logs, &[]).await;
    listing(&session).await;
    for (starts_file, ..) in &setup.files {
        assert_eq!(starts(starts_file), 1, "{}", starts_file.display());
    }
    close(session, &setup.logs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_server_starts_at_its_first_call_and_the_listing_never_moves() {
    let setup = setup();
    first_run(&setup).await;
    let (changing, steady) = (&setup.files[0], &setup.files[1]);

    let (session, mut changed) = connect(&setup.config, &setup.logs, &[]).await;
    let before = listing(&session).await;
    assert!(
        before.contains("steady") && before.contains("changing"),
        "{before}"
    );
    // Known from the kept listing: listed, described and oriented with nothing started.
    let oriented = orientation(&session).await;
    for server in ["steady", "changing"] {
        let state = state_of(&oriented, server);
        assert!(
            state.starts_with("known (listed ")
                && state.ends_with("not started: starts at its first call"),
            "{state}"
        );
    }
    let params = CallToolRequestParams::new("psych_describe_tool").with_arguments(
        json!({"server": "steady", "tool": "alpha"})
            .as_object()
            .unwrap()
            .clone(),
    );
    let described = text(&session.call_tool(params).await.unwrap());
    assert!(described.contains("files an alpha report"), "{described}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!((starts(&changing.0), starts(&steady.0)), (1, 1));

    // Started by its first calls, once for two that arrive together; the listing's bytes
    // unchanged.
    let (first, second) = tokio::join!(
        call(&session, "steady", "echo", json!({"text": "hi"})),
        call(&session, "steady", "echo", json!({"text": "there"})),
    );
    assert_eq!((text(&first), text(&second)), ("hi".into(), "there".into()));
    assert_eq!(starts(&steady.0), 2);
    assert_eq!(
        state_of(&orientation(&session).await, "steady"),
        "started (on demand)"
    );
    assert_eq!(listing(&session).await, before);
    // Stopped after its idle second: its processes are gone, the listing the same.
    gone(&steady.1.display().to_string()).await;
    assert_eq!(listing(&session).await, before);
    let state = state_of(&orientation(&session).await, "steady");
    assert!(state.starts_with("known (listed "), "{state}");
    // Started again by the next call.
    let answered = call(&session, "steady", "echo", json!({"text": "again"})).await;
    assert_eq!(text(&answered), "again");
    assert_eq!(starts(&steady.0), 3);
    assert_eq!(listing(&session).await, before);
    assert_eq!(
        starts(&changing.0),
        1,
        "a call to one server starts no other"
    );
    while changed.try_recv().is_ok() {}

    // `changing`'s tools change while it is stopped: beta removed, alpha's schema changed.
    catalog(
        &changing.1,
        json!({"type": "object", "properties": {"y": {"type": "integer"}}, "required": ["y"]}),
        false,
    );
    let refused = call(&session, "changing", "beta", json!({})).await;
    assert_eq!(refused.is_error, Some(true));
    assert!(
        text(&refused).contains("tool \"beta\" is not available on server changing"),
        "{}",
        text(&refused)
    );
    assert_eq!(starts(&changing.0), 2, "the call started it to check it");
    tokio::time::timeout(Duration::from_secs(20), changed.recv())
        .await
        .expect("the client hears list_changed")
        .unwrap();
    let after = listing(&session).await;
    assert_ne!(after, before, "the changed listing is listed");
    // The old schema's arguments are checked against the new one; the new one's pass.
    let invalid = call(&session, "changing", "alpha", json!({"x": "old"})).await;
    assert_eq!(invalid.is_error, Some(true));
    assert!(
        text(&invalid).contains("invalid arguments"),
        "{}",
        text(&invalid)
    );
    let valid = call(&session, "changing", "alpha", json!({"y": 7})).await;
    assert_ne!(valid.is_error, Some(true), "{}", text(&valid));
    assert_eq!(starts(&changing.0), 2);
    close(session, &setup.logs).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_start_answers_why_and_the_others_go_on() {
    let setup = setup();
    first_run(&setup).await;
    let (changing, steady) = (&setup.files[0], &setup.files[1]);
    std::fs::write(&changing.2, "").unwrap();

    let (session, _) = connect(&setup.config, &setup.logs, &[]).await;
    let before = listing(&session).await;
    let failed = call(&session, "changing", "echo", json!({"text": "hi"})).await;
    assert_eq!(failed.is_error, Some(true));
    let why = text(&failed);
    assert!(
        why.contains("could not be started") && why.contains("licence server unreachable"),
        "{why}"
    );
    let attempts = starts(&changing.0);
    let answered = call(&session, "steady", "echo", json!({"text": "fine"})).await;
    assert_eq!(text(&answered), "fine");
    // Nothing tries to start it again until a call does (no retry loop), and the listing
    // is what it was.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(starts(&changing.0), attempts, "started again with no call");
    assert_eq!(listing(&session).await, before);
    // A second call's failure is its own, with this start's reason.
    let failed = call(&session, "changing", "echo", json!({"text": "hi"})).await;
    assert!(
        text(&failed).contains("could not be started"),
        "{}",
        text(&failed)
    );
    // The next call tries again, and the server answers once it can start.
    std::fs::remove_file(&changing.2).unwrap();
    let answered = call(&session, "changing", "echo", json!({"text": "back"})).await;
    assert_eq!(text(&answered), "back", "{answered:?}");
    let state = state_of(&orientation(&session).await, "changing");
    assert_eq!(state, "started (on demand)");
    assert_eq!(listing(&session).await, before);
    close(session, &setup.logs).await;

    // A server configured otherwise than when it was listed starts at once; the other
    // still waits for its first call.
    let text_now = std::fs::read_to_string(&setup.config).unwrap();
    let mut config: Value = serde_json::from_str(&text_now).unwrap();
    config["mcpServers"]["steady"]["env"] = json!({"REGION": "eu"});
    std::fs::write(&setup.config, config.to_string()).unwrap();
    let (before_changing, before_steady) = (starts(&changing.0), starts(&steady.0));
    let (session, _) = connect(&setup.config, &setup.logs, &[]).await;
    listing(&session).await;
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while starts(&steady.0) == before_steady {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the reconfigured server started at once");
    assert_eq!(starts(&changing.0), before_changing);
    close(session, &setup.logs).await;

    // `--eager` starts every server at once, kept listings or not.
    let (before_changing, before_steady) = (starts(&changing.0), starts(&steady.0));
    let (session, _) = connect(&setup.config, &setup.logs, &["--eager"]).await;
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while starts(&changing.0) == before_changing || starts(&steady.0) == before_steady {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "--eager started both servers");
    close(session, &setup.logs).await;
}

/// A call that reaches a server still starting waits for the start and is answered, never
/// "not connected yet": psych serve answers from the kept listing while its servers
/// connect (with `--eager`, or for a server that must start at once). The TypeScript SDK's
/// modern stdio client meets this every time: it first spawns a disposable gateway to ask
/// `server/discover`, and the gateway it then talks to finds that one's listing kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_while_its_server_still_starts_waits_for_the_start() {
    let setup = setup();
    first_run(&setup).await;
    let (starts_file, _, refuse) = &setup.files[1];
    std::fs::write(refuse.with_extension("slow"), "").unwrap();
    let before = starts(starts_file);
    let (session, _) = connect(&setup.config, &setup.logs, &["--eager"]).await;
    // The kept listing is answered at once, the server still starting.
    listing(&session).await;
    let result = call(&session, "steady", "alpha", json!({"x": "waited"})).await;
    assert_ne!(result.is_error, Some(true), "{}", text(&result));
    assert!(text(&result).contains("waited"), "{}", text(&result));
    assert_eq!(starts(starts_file), before + 1);
    close(session, &setup.logs).await;
}

/// The resident memory, in KiB, of every process whose command line holds `marker`.
fn rss_kib_with(marker: &str) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|cmdline| {
                String::from_utf8_lossy(&cmdline)
                    .replace('\0', " ")
                    .contains(marker)
            })
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .sum()
}

/// Issue 30's figures, side by side in one run (`cargo test -p psych-cli --test it
/// serve_lazy::figures -- --nocapture`): `psych serve` over 10 servers (the
/// embedded kinds, twice: 1,288 tools), started three ways, three rounds each, alternating:
/// every server at once with nothing kept (as before the kept catalogue), every server at
/// once with the listings kept (`--eager`), and on demand (the default). Per way: the time
/// from starting the gateway to its first complete `tools/list` answer, and the resident
/// memory of the gateway and all its children 2 s later; then the latency of a first call
/// to a lazy server (its start, handshake and listing) against the next call. Times are
/// printed, not asserted (a loaded machine moves them); the memory a lazy start saves is
/// asserted: under half of an eager start's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figures() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker.json");
    std::fs::write(&marker, r#"{"tools": []}"#).unwrap();
    let mut servers = serde_json::Map::new();
    for round in 1..=2 {
        for (kind, tools) in [
            ("notes", 9),
            ("files", 14),
            ("wiki", 24),
            ("forge", 117),
            ("suite", 480),
        ] {
            servers.insert(
                format!("{kind}{round}"),
                json!({"command": PSYCH, "args": ["serve-embedded", "--kind", kind,
                    "--tools", tools.to_string(), "--catalog", marker]}),
            );
        }
    }
    let config = dir.path().join("mcp.json");
    std::fs::write(&config, json!({ "mcpServers": servers }).to_string()).unwrap();
    let marker = marker.display().to_string();
    let kept = dir.path().join("kept");
    // Keep every listing once.
    let (session, _) = connect(&config, &kept, &[]).await;
    listing(&session).await;
    close(session, &kept).await;

    let mut rows: Vec<(&str, Vec<f64>, Vec<u64>)> = vec![
        ("every server at once, nothing kept", Vec::new(), Vec::new()),
        (
            "every server at once, listings kept (--eager)",
            Vec::new(),
            Vec::new(),
        ),
        ("on demand (the default)", Vec::new(), Vec::new()),
    ];
    for round in 0..3 {
        for (way, row) in rows.iter_mut().enumerate() {
            let fresh = dir.path().join(format!("fresh-{round}"));
            let (logs, flags): (&Path, &[&str]) = match way {
                0 => (&fresh, &["--eager"]),
                1 => (&kept, &["--eager"]),
                _ => (&kept, &[]),
            };
            let started = std::time::Instant::now();
            let (session, _) = connect(&config, logs, flags).await;
            let tools = listing(&session).await;
            row.1.push(started.elapsed().as_secs_f64() * 1000.0);
            assert!(tools.contains("suite2"), "{tools}");
            tokio::time::sleep(Duration::from_secs(2)).await;
            row.2
                .push(rss_kib_with(&marker) + rss_kib_with(&logs.display().to_string()));
            close(session, logs).await;
            gone(&marker).await;
        }
    }
    println!(
        "| psych serve over 10 servers | first complete tools/list (ms, 3 rounds) | resident memory with children (MiB) |"
    );
    println!("|---|---|---|");
    for (way, times, rss) in &rows {
        let times: Vec<String> = times.iter().map(|t| format!("{t:.0}")).collect();
        let rss: Vec<String> = rss
            .iter()
            .map(|r| format!("{:.1}", *r as f64 / 1024.0))
            .collect();
        println!("| {way} | {} | {} |", times.join(", "), rss.join(", "));
    }

    for round in 0..3 {
        assert!(
            rows[2].2[round] * 2 < rows[1].2[round],
            "a lazy start holds under half of an eager start's memory: {:?}",
            rows.iter().map(|r| &r.2).collect::<Vec<_>>()
        );
    }

    // A first call to a lazy server, then the next one, five times (each after its stop).
    let idle = json!({"mcpServers": {"wiki": {"command": PSYCH, "args": ["serve-embedded",
        "--kind", "wiki", "--tools", "24", "--catalog", marker], "idleSecs": 1}}});
    let one = dir.path().join("one.json");
    std::fs::write(&one, idle.to_string()).unwrap();
    let logs = dir.path().join("one");
    let (session, _) = connect(&one, &logs, &[]).await;
    listing(&session).await;
    close(session, &logs).await;
    let (session, _) = connect(&one, &logs, &[]).await;
    listing(&session).await;
    let (mut first, mut next) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        gone(&marker).await;
        let started = std::time::Instant::now();
        assert_eq!(
            text(&call(&session, "wiki", "echo", json!({"text": "a"})).await),
            "a"
        );
        first.push(started.elapsed().as_secs_f64() * 1000.0);
        let started = std::time::Instant::now();
        assert_eq!(
            text(&call(&session, "wiki", "echo", json!({"text": "b"})).await),
            "b"
        );
        next.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let show = |v: &[f64]| {
        v.iter()
            .map(|t| format!("{t:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("first call to a stopped lazy server (ms): {}", show(&first));
    println!("the next call, server running (ms): {}", show(&next));
    close(session, &logs).await;
}
