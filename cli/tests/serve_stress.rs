//! `psych serve` under load, as issue 27 asks: three upstream servers (real processes, their
//! listings served page by page), one client keeping 32 calls in flight for 2,000 calls
//! whose results run from 1 KiB to 8 MiB (some with an image, some with bytes that are not
//! UTF-8), while the client lists the
//! tools again and again and an upstream changes its tools (`list_changed`) in the same
//! window. Every call must come back (no error, no timeout), every result must be in the
//! session's record log whole, and the gateway's peak memory (its `VmHWM`) must stay under a
//! stated bound.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::support::{PSYCH, stdio_gateway, text};

/// Calls made in all.
const CALLS: usize = 2_000;
/// Calls kept in flight.
const IN_FLIGHT: usize = 32;
/// The smallest and the largest `large` result.
const SMALLEST: usize = 1024;
const LARGEST: usize = 8 * 1024 * 1024;
/// The bound on the gateway's peak resident memory. The gateway holds at most the results
/// in flight (32 × 8 MiB at worst, parsed: a few times that) on top of its own ~30 MiB; the
/// bound says the memory does not grow with the number of calls (2,000 results add up to
/// about 2 GB).
const PEAK_BOUND_MIB: u64 = 1_024;
/// How much the gateway's resident memory may grow between the 500th call and the last:
/// memory that grew with the calls (a result kept per call) would add over 1 GB here.
const GROWTH_BOUND_MIB: u64 = 256;
/// When the resident memory is first sampled.
const WARM_CALLS: usize = 500;
/// A hang guard only: a call that takes this long has failed the test.
const CALL_GUARD: Duration = Duration::from_secs(300);

/// The test server's control tools (the rest of its tools are generated).
const CONTROL_TOOLS: [&str; 17] = [
    "add_tool",
    "binary",
    "cancellations",
    "client_info",
    "crash",
    "echo",
    "exotic",
    "fail",
    "fingerprint",
    "garbage",
    "hang",
    "large",
    "mixed",
    "progress",
    "remove_tool",
    "sleep",
    "structured",
];

/// Counts the `list_changed` notifications the client receives.
#[derive(Clone, Default)]
struct Client {
    changed: Arc<AtomicUsize>,
}

impl ClientHandler for Client {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.changed.fetch_add(1, Ordering::SeqCst);
    }
}

/// A small deterministic generator (xorshift), so the run is the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A size between [`SMALLEST`] and [`LARGEST`], log-uniform (as many results near
    /// 1 KiB as near 8 MiB, per doubling).
    fn size(&mut self) -> usize {
        let span = (LARGEST as f64 / SMALLEST as f64).ln();
        let unit = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        ((SMALLEST as f64) * (unit * span).exp()) as usize
    }
}

/// One planned call.
#[derive(Debug, Clone)]
enum Planned {
    /// `large {bytes}` on the server.
    Large { server: &'static str, bytes: usize },
    /// `mixed` (text, a PNG, text) on the server.
    Mixed { server: &'static str },
    /// `raw_bad_utf8 {bytes}`: a text with bytes that are not UTF-8, written raw.
    BadUtf8 { server: &'static str, bytes: usize },
}

impl Planned {
    fn params(&self) -> CallToolRequestParams {
        match self {
            Self::Large { server, bytes } => {
                let Value::Object(arguments) = json!({"bytes": bytes}) else {
                    unreachable!("an object");
                };
                CallToolRequestParams::new(format!("{server}__large")).with_arguments(arguments)
            }
            Self::Mixed { server } => CallToolRequestParams::new(format!("{server}__mixed")),
            Self::BadUtf8 { server, bytes } => {
                let Value::Object(arguments) = json!({"bytes": bytes}) else {
                    unreachable!("an object");
                };
                CallToolRequestParams::new(format!("{server}__raw_bad_utf8"))
                    .with_arguments(arguments)
            }
        }
    }
}

fn plan() -> Vec<Planned> {
    let servers = ["alpha", "beta", "gamma"];
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    (0..CALLS)
        .map(|i| {
            let server = servers[i % servers.len()];
            let kind = rng.next() % 20;
            if kind < 2 {
                Planned::Mixed { server }
            } else if kind == 2 {
                Planned::BadUtf8 {
                    server,
                    bytes: rng.size(),
                }
            } else {
                Planned::Large {
                    server,
                    bytes: rng.size(),
                }
            }
        })
        .collect()
}

fn write_config(dir: &Path) -> std::path::PathBuf {
    let upstream = |tools: usize, page: usize| {
        json!({
            "command": PSYCH,
            "args": ["serve-embedded", "--tools", tools.to_string(), "--page-size", page.to_string(),
                "--list-raw-tools"],
            "preload": true,
        })
    };
    let config = json!({"mcpServers": {
        "alpha": upstream(3, 5),
        "beta": upstream(1, 3),
        "gamma": upstream(6, 2),
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

/// Checks what the client got for one call: the whole result, or a preview with a handle.
fn check_answer(planned: &Planned, result: &CallToolResult) {
    assert_ne!(result.is_error, Some(true), "{planned:?}: {result:?}");
    let text = text(result);
    match planned {
        Planned::Large { bytes, .. } => {
            let whole = text.len() == *bytes;
            let elided = text.contains("read_tool_output") && text.contains("handle");
            assert!(
                whole || elided,
                "{planned:?}: neither whole nor a preview: {}",
                &text[..text.len().min(300)]
            );
        }
        Planned::Mixed { .. } => {
            assert!(
                result.content.iter().any(|c| c.as_image().is_some()),
                "{planned:?}: the image arrives: {result:?}"
            );
        }
        Planned::BadUtf8 { .. } => {
            let whole = text.starts_with("caf\u{FFFD} and \u{FFFD}\u{FFFD}, then fine\n");
            let elided = text.contains("read_tool_output") && text.contains("handle");
            assert!(
                whole || elided,
                "{planned:?}: neither the lossy text nor a preview: {}",
                &text[..text.len().min(300)]
            );
        }
    }
}

/// What the log holds for `raw_bad_utf8 {bytes}`: the text with each byte that is not
/// UTF-8 replaced by U+FFFD.
fn lossy(bytes: usize) -> String {
    let raw = psych_test_server::bad_utf8_text(bytes);
    String::from_utf8_lossy(&raw).replace("\\n", "\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_calls_32_in_flight_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    // Room for every result (some 1.2 GB): past the default 1 GiB per identity, retention
    // deletes the oldest segment when a new one opens.
    let transport = stdio_gateway(&config, dir.path(), &["--retain-mib", "4096"]);
    let pid = transport.id().unwrap();
    let client = Client::default();
    let changed = Arc::clone(&client.changed);
    let session: RunningService<RoleClient, Client> = client.serve(transport).await.unwrap();

    // Wait for every upstream's tools (a gateway may answer initialize before its upstreams
    // are listed, and announce them with list_changed).
    let started = Instant::now();
    loop {
        let tools = session.list_all_tools().await.unwrap();
        let ready = ["alpha", "beta", "gamma"].iter().all(|s| {
            ["large", "mixed", "raw_bad_utf8"]
                .iter()
                .all(|tool| tools.iter().any(|t| t.name == format!("{s}__{tool}")))
        });
        if ready {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the upstreams never appeared"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Each upstream is callable before the load starts: the gateway announces servers as
    // they arrive, and a listing taken while the last one arrives may be resolved again
    // (how many tries it took is printed; a refusal after this point fails the test).
    let mut warm_refusals = 0usize;
    for server in ["alpha", "beta", "gamma"] {
        let mut tries = 0;
        loop {
            tries += 1;
            let probe = Planned::BadUtf8 { server, bytes: 10 };
            let result = session.call_tool(probe.params()).await.unwrap();
            if result.is_error != Some(true) {
                break;
            }
            assert!(tries < 100, "{server} never became callable: {result:?}");
            warm_refusals += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if tries > 1 {
            eprintln!("{server}: callable after {tries} tries");
        }
    }
    // gamma's generated tools (not its control tools), removed one by one during the load:
    // each removal is an upstream list_changed and a change of the gateway's listing.
    // (Removing keeps gamma's tier: adding tools could move it from direct tools to a facade.)
    let mut removable: Vec<String> = session
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .filter_map(|t| t.name.strip_prefix("gamma__").map(str::to_owned))
        .filter(|name| !CONTROL_TOOLS.contains(&name.as_str()) && !name.starts_with("raw_"))
        .collect();
    assert_eq!(removable.len(), 6, "{removable:?}");
    let plan = Arc::new(plan());
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let begun = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let peer = session.peer().clone();
        let plan = Arc::clone(&plan);
        let next = Arc::clone(&next);
        let done = Arc::clone(&done);
        workers.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(planned) = plan.get(i) else {
                    return;
                };
                let result = tokio::time::timeout(CALL_GUARD, peer.call_tool(planned.params()))
                    .await
                    .unwrap_or_else(|_| panic!("call {i} {planned:?} hung"))
                    .unwrap_or_else(|e| panic!("call {i} {planned:?}: {e}"));
                check_answer(planned, &result);
                done.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    // In the same window: paged listings again and again, and an upstream adding tools
    // (each a list_changed through the gateway).
    let mut listings = 0usize;
    let mut removed = 0usize;
    let mut warm_rss: Option<u64> = None;
    while done.load(Ordering::SeqCst) < CALLS && !workers.is_empty() {
        if let Some(joined) = workers.try_join_next() {
            joined.unwrap();
            continue;
        }
        if warm_rss.is_none() && done.load(Ordering::SeqCst) >= WARM_CALLS {
            warm_rss = Some(status_kib(pid, "VmRSS") / 1024);
        }
        let tools = session.list_all_tools().await.unwrap();
        assert!(tools.iter().any(|t| t.name == "gamma__large"));
        listings += 1;
        if listings.is_multiple_of(10)
            && let Some(name) = removable.pop()
        {
            let Value::Object(arguments) = json!({"name": name}) else {
                unreachable!("an object");
            };
            let result = session
                .call_tool(
                    CallToolRequestParams::new("gamma__remove_tool").with_arguments(arguments),
                )
                .await
                .unwrap();
            assert_ne!(result.is_error, Some(true), "{result:?}");
            removed += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    while let Some(joined) = workers.join_next().await {
        joined.unwrap();
    }
    let elapsed = begun.elapsed();
    assert_eq!(done.load(Ordering::SeqCst), CALLS);
    let peak = status_kib(pid, "VmHWM") / 1024;
    let rss = status_kib(pid, "VmRSS") / 1024;
    let warm = warm_rss.expect("sampled after the first calls");
    eprintln!(
        "{CALLS} calls, {IN_FLIGHT} in flight: {elapsed:.1?}; {listings} listings, {removed} tools \
         removed, {} list_changed received; the gateway's peak resident memory {peak} MiB, \
         resident {warm} MiB after {WARM_CALLS} calls and {rss} MiB at the end",
        changed.load(Ordering::SeqCst)
    );
    assert!(removed > 0, "the window saw a tools change");
    assert!(
        changed.load(Ordering::SeqCst) > 0,
        "list_changed reached the client"
    );
    assert!(
        peak < PEAK_BOUND_MIB,
        "the gateway's peak memory {peak} MiB is over {PEAK_BOUND_MIB} MiB"
    );
    assert!(
        rss <= warm + GROWTH_BOUND_MIB,
        "the gateway's memory grew with the calls: {warm} MiB after {WARM_CALLS}, {rss} MiB \
         after {CALLS}"
    );
    session.cancel().await.unwrap();

    // Every result is in the stdio identity's log, whole: in one segment or more (a
    // segment rotates at an eighth of the retention limit, 128 MiB by default).
    let serve = dir.path().join("serve/stdio");
    let segments: Vec<psych_record_log::RecordLog> = std::fs::read_dir(&serve)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|path| path.extension().is_some_and(|x| x == "plog"))
        .map(|path| {
            let run = psych_types::RunId::new(path.file_stem().unwrap().to_str().unwrap()).unwrap();
            psych_record_log::RecordLog::open_read_only(&serve, &run)
                .unwrap()
                .0
        })
        .collect();
    assert!(!segments.is_empty(), "the identity's log is there");
    let mut logged: BTreeMap<usize, usize> = BTreeMap::new();
    let mut mixed = 0usize;
    let mut bad_utf8: BTreeMap<usize, usize> = BTreeMap::new();
    let mut refused = 0usize;
    for record in segments.iter().flat_map(|log| log.iter()) {
        let psych_types::Record::ToolResult(result) = record.unwrap().record else {
            continue;
        };
        if result.name.ends_with("__large") {
            let text = result.output.readable_text();
            assert_eq!(
                *text,
                psych_test_server::large_text(text.len()),
                "a logged result is the upstream's whole text"
            );
            *logged.entry(text.len()).or_default() += 1;
        } else if result.name.ends_with("__mixed") {
            assert!(
                result.output.content.len() == 3,
                "the mixed result is whole: {:?}",
                result.name
            );
            mixed += 1;
        } else if result.name.ends_with("__raw_bad_utf8") {
            if result.output.is_error {
                refused += 1;
                continue;
            }
            let text = result.output.readable_text();
            let bytes = psych_test_server::bad_utf8_text(0).len();
            let lines = text.matches('\n').count();
            assert_eq!(
                *text,
                lossy(lines * bytes),
                "the logged text is the lossy text"
            );
            let said = result
                .output
                .meta
                .as_ref()
                .and_then(|meta| meta.get("psych/lossy"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            assert!(
                said.contains("invalid UTF-8"),
                "the log says the text was repaired: {:?}",
                result.output.meta
            );
            *bad_utf8.entry(lines).or_default() += 1;
        }
    }
    let mut wanted: BTreeMap<usize, usize> = BTreeMap::new();
    let mut wanted_mixed = 0usize;
    // The three warm-up calls: one line each.
    let mut wanted_bad: BTreeMap<usize, usize> = BTreeMap::from([(1, 3)]);
    let line = psych_test_server::bad_utf8_text(0).len();
    for planned in plan.iter() {
        match planned {
            Planned::Large { bytes, .. } => *wanted.entry(*bytes).or_default() += 1,
            Planned::Mixed { .. } => wanted_mixed += 1,
            Planned::BadUtf8 { bytes, .. } => {
                let lines = psych_test_server::bad_utf8_text(*bytes).len() / line;
                *wanted_bad.entry(lines).or_default() += 1;
            }
        }
    }
    assert_eq!(logged, wanted, "every large result is logged whole");
    assert_eq!(mixed, wanted_mixed, "every mixed result is logged");
    assert_eq!(
        bad_utf8, wanted_bad,
        "every result with bad UTF-8 is logged, repaired"
    );
    assert_eq!(
        refused, warm_refusals,
        "the only refusals were before the load"
    );
}
