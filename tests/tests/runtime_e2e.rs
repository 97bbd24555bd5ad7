//! A Run end to end against real MCP server processes (`psych-e2e-child server`, psych-mcp's
//! test server): a small eager server, a large one that `auto` defers, one over streamable
//! HTTP, and one added mid-Run; a scripted multi-turn session with parallel calls, a result
//! elided the next turn and read back by handle with grep, a mixed text + image result, a
//! failing call, a permission revoked mid-turn, a `list_changed` that adds a tool used the
//! next turn, and a deferred tool reached through list → describe → call. Every request
//! passes the rule checker; the last request of the session is pinned for both providers;
//! the log holds every result byte for byte. Then the faults, and a `kill -9` mid-step.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use psych_catalog::{Catalog, Freshener, FreshenerConfig};
use psych_disclosure::pinning::{PinSettings, PinWhy, ToolUsage};
use psych_elision::{Elider, Thresholds};
use psych_mcp::{Backoff, McpConfig, McpManager, ServerConfig, Timeouts};
use psych_prompt_assembly::{AnthropicOptions, OpenAiOptions, RenderedRequest};
use psych_record_log::{RecordLog, SyncPolicy};
use psych_runtime::{
    CatalogSync, Connected, INTERRUPTED, Next, Run, RunBuilder, ScriptedModel, Step, Target,
};
use psych_test_server::large_text;
use psych_types::{
    ConnectionSpec, ContentBlock, PermissionGrant, Record, RecordHandle, RunId, ServerId,
    ToolOutput,
};
use serde_json::{Value, json};

use psych_test_support::rules;

const CHILD: &str = env!("CARGO_BIN_EXE_psych-e2e-child");
const NOW: i64 = 1_796_041_497;

fn id(name: &str) -> ServerId {
    ServerId::new(name).unwrap()
}

/// An HTTP test server process, killed when dropped.
struct HttpServer {
    child: Child,
    url: String,
}

impl HttpServer {
    fn start() -> Self {
        let mut child = Command::new(CHILD)
            .args(["server", "--http", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .expect("the server says where it listens")
            .to_owned();
        Self { child, url }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The servers, the catalogue kept fresh from their events, and the host.
struct World {
    manager: McpManager,
    freshener: Arc<Freshener<McpManager>>,
    sync: Option<CatalogSync>,
    config: McpConfig,
}

fn config(servers: Value) -> McpConfig {
    McpConfig::parse(&json!({ "mcpServers": servers }).to_string(), |_| None).unwrap()
}

fn stdio(args: &[&str], extra: Value) -> Value {
    let mut server = json!({"command": CHILD, "args": ["server"]});
    for arg in args {
        server["args"].as_array_mut().unwrap().push(json!(arg));
    }
    if let Value::Object(extra) = extra {
        server.as_object_mut().unwrap().extend(extra);
    }
    server
}

impl World {
    async fn start(config: McpConfig, call: Duration) -> Self {
        let manager = McpManager::builder(config.clone())
            .timeouts(
                Timeouts::uniform(Duration::from_secs(10))
                    .with_call(call)
                    .with_shutdown_grace(Duration::from_millis(300)),
            )
            .backoff(Backoff::new(
                Duration::from_millis(100),
                Duration::from_secs(1),
            ))
            .build()
            .unwrap();
        // A server that fails its first listing is what some tests are about.
        let Connected {
            sync, freshener, ..
        } = CatalogSync::connect(
            &manager,
            Catalog::in_memory().unwrap(),
            FreshenerConfig::builder().build().unwrap(),
        )
        .await
        .unwrap();
        Self {
            manager,
            freshener,
            sync: Some(sync),
            config,
        }
    }

    fn catalog(&self) -> Catalog {
        self.freshener.catalog().clone()
    }

    fn connections(&self) -> Vec<ConnectionSpec> {
        self.config
            .servers
            .values()
            .map(|s| s.connection.clone())
            .collect()
    }

    fn grant(&self) -> PermissionGrant {
        self.config
            .servers
            .keys()
            .fold(PermissionGrant::none(), |g, s| g.allow_server(s.clone()))
    }

    /// Connects `name` mid-Run and syncs its catalogue.
    async fn add(&mut self, name: &str, server: Value) -> ServerConfig {
        let entry = config(json!({ name: server }))
            .servers
            .remove(&id(name))
            .unwrap();
        self.manager
            .add_server(id(name), entry.clone())
            .await
            .unwrap();
        self.freshener.refresh(&id(name)).await.unwrap();
        entry
    }

    async fn run(&self, dir: &Path, target: Target) -> Run<McpManager> {
        self.run_named(dir, "run-e2e", target).await
    }

    async fn run_named(&self, dir: &Path, run: &str, target: Target) -> Run<McpManager> {
        self.builder(dir, run, target).open().await.unwrap()
    }

    /// The builder of the tests' Runs, to open as they are or with more.
    fn builder(&self, dir: &Path, run: &str, target: Target) -> RunBuilder<McpManager> {
        Run::builder(
            dir,
            RunId::new(run).unwrap(),
            self.catalog(),
            Arc::new(self.manager.clone()),
            target,
        )
        .connections(self.connections())
        .grant(self.grant())
        .output_limits(self.config.output_limits().unwrap())
        .instructions("You are the end-to-end test's assistant.")
        .elider(
            Elider::builder()
                .thresholds(
                    Thresholds::builder()
                        .per_result(2_000)
                        .per_batch(8_000)
                        .build()
                        .unwrap(),
                )
                .build(),
        )
        .call_timeout(Duration::from_secs(20))
        .clock(|| NOW)
    }

    async fn stop(mut self) {
        if let Some(sync) = self.sync.take() {
            sync.stop().await;
        }
        self.freshener.shutdown().await;
        self.manager.shutdown().await;
    }
}

/// Every request a Run produces passes the provider's rules.
fn check(request: &RenderedRequest, target: &Target) {
    let verdict = match target {
        Target::Anthropic(_) => rules::check_anthropic_body(request.body(), true),
        _ => rules::check_openai_body(request.body()),
    };
    assert_eq!(verdict, Ok(()), "a request breaks the provider's rules");
}

/// Drives one turn from `user` with `steps`, checking every request; returns them.
async fn turn(
    run: &mut Run<McpManager>,
    model: &mut ScriptedModel,
    user: &str,
    target: &Target,
) -> Vec<RenderedRequest> {
    let transcript = model.turn(run, user).await.unwrap();
    for request in &transcript.requests {
        check(request, target);
    }
    transcript.requests
}

/// The result of call `call`, read whole from the Run's log.
fn result_of(run: &Run<McpManager>, call: &str) -> (RecordHandle, ToolOutput) {
    run.records(0)
        .unwrap()
        .into_iter()
        .find_map(|l| match l.record {
            Record::ToolResult(r) if r.call_id.as_str() == call => Some((l.handle, r.output)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no result for {call}"))
}

/// The Run's lazy history is the log's records summarized, each result with the elider's
/// estimate stored when it was appended.
fn assert_history_is_the_logs(run: &Run<McpManager>, logged: &[psych_types::LoggedRecord]) {
    let estimator = psych_elision::Estimator::new();
    assert_eq!(
        run.history(),
        &psych_types::History::from_records(logged, Some(&estimator))
    );
}

fn text(run: &Run<McpManager>, call: &str) -> String {
    result_of(run, call).1.readable_text().into_owned()
}

/// The names of the tools a request offers.
fn tool_names(request: &RenderedRequest) -> Vec<String> {
    let body: Value = serde_json::from_str(request.body()).unwrap();
    body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t["name"]
                .as_str()
                .or_else(|| t["function"]["name"].as_str())
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// The scripted session, for one provider; returns the tools of each turn's first request
/// and the session's last request.
async fn session(target: Target) -> (Vec<Vec<String>>, RenderedRequest) {
    let dir = tempfile::tempdir().unwrap();
    let http = HttpServer::start();
    let mut world = World::start(
        config(json!({
            "small": stdio(&[], json!({"preload": true, "description": "Small control server."})),
            "large": stdio(&["--tools", "400"], json!({"description": "A large generated catalogue."})),
            "web": {"type": "http", "url": http.url, "description": "The same server over HTTP."},
        })),
        Duration::from_secs(10),
    )
    .await;
    let mut run = world.run(dir.path(), target.clone()).await;
    let mut tools = Vec::new();

    // Turn 1: parallel calls, a large result, text + image, a failure, the orientation.
    let mut model = ScriptedModel::new([
        Step::call("psych_orientation", json!({}))
            .and_call("small__large", json!({"bytes": 60_000}))
            .and_call("small__mixed", json!({}))
            .and_call("small__fail", json!({"message": "the disk is full"}))
            .and_call("web__echo", json!({"text": "over http"}))
            .saying("Looking around."),
        Step::say("I have looked around."),
    ]);
    let requests = turn(&mut run, &mut model, "Look around.", &target).await;
    tools.push(tool_names(&requests[0]));
    assert!(text(&run, "call_1").contains("\"servers\""));
    assert_eq!(text(&run, "call_2"), large_text(60_000));
    let mixed = result_of(&run, "call_3").1;
    assert!(matches!(mixed.content[1], ContentBlock::Image(_)));
    assert!(result_of(&run, "call_4").1.is_error());
    assert_eq!(text(&run, "call_5"), "over http");
    // The current turn's results go whole: the image is sent as an image.
    assert!(requests[1].body().contains("iVBORw0KGgo"));

    // Turn 2: the large result is elided now; read it back by handle with grep. A tool is
    // added (list_changed).
    let (large, _) = result_of(&run, "call_2");
    let large = large.to_string();
    let mut model = ScriptedModel::new([
        Step::call(
            "read_tool_output",
            json!({"handle": large, "grep": "line 000420"}),
        )
        .and_call("small__add_tool", json!({"name": "fresh_tool"})),
        Step::say("Found it."),
    ])
    .first_call(6);
    let requests = turn(
        &mut run,
        &mut model,
        "Find line 420 of that result.",
        &target,
    )
    .await;
    tools.push(tool_names(&requests[0]));
    assert!(
        requests[0]
            .body()
            .contains(&format!("read_tool_output with handle \\\"{large}\\\""))
    );
    assert!(
        !requests[0].body().contains("line 000420"),
        "the large result is elided"
    );
    let found = text(&run, "call_6");
    assert!(
        found.contains("line 000420: the quick brown fox"),
        "{found}"
    );

    // The list_changed reaches the catalogue through the freshener.
    let small = id("small");
    for _ in 0..100 {
        if world
            .catalog()
            .live(&small)
            .unwrap()
            .tools
            .iter()
            .any(|t| t.name.as_str() == "fresh_tool")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A server connected mid-Run.
    let late = world
        .add("late", stdio(&[], json!({"preload": true})))
        .await;
    run.add_connection(late.connection.clone());
    run.set_grant(run.grant().clone().allow_server(id("late")));

    // Turn 3: the added tool and the new server, a deferred tool through list → describe →
    // call, and the HTTP server's permission revoked between two steps.
    let mut model = ScriptedModel::new([
        Step::call("small__fresh_tool", json!({}))
            .and_call("late__echo", json!({"text": "new server"}))
            .and_call("psych_list_tools", json!({"server": "large"})),
        Step::call(
            "psych_describe_tool",
            json!({"server": "large", "tool": "echo"}),
        ),
        Step::call(
            "psych_call_tool",
            json!({"server": "large", "tool": "echo", "arguments": {"text": "deferred"}}),
        ),
        Step::call("web__echo", json!({"text": "still allowed?"})),
        Step::say("Done with the new tools."),
    ])
    .first_call(8);
    let first = run.user("Use the new tools.").await.unwrap();
    check(&first, &target);
    tools.push(tool_names(&first));
    let mut request = first;
    loop {
        if model.remaining() == 2 {
            let revoked = world
                .config
                .servers
                .keys()
                .filter(|s| s.as_str() != "web")
                .fold(PermissionGrant::none().allow_server(id("late")), |g, s| {
                    g.allow_server(s.clone())
                });
            run.set_grant(revoked);
        }
        match run.reply(model.reply(&request)).await.unwrap() {
            Next::Request(next) => {
                check(&next, &target);
                request = next;
            }
            Next::Done { .. } => break,
            _ => unreachable!(),
        }
    }
    assert!(
        !result_of(&run, "call_8").1.is_error(),
        "{}",
        text(&run, "call_8")
    );
    assert_eq!(text(&run, "call_9"), "new server");
    let listing = text(&run, "call_10");
    assert!(
        listing.contains("add_tool") && listing.contains("page"),
        "{listing}"
    );
    assert!(text(&run, "call_11").contains("\"text\""));
    assert_eq!(text(&run, "call_12"), "deferred");
    assert!(result_of(&run, "call_13").1.is_error());
    assert_eq!(text(&run, "call_13"), "unknown server \"web\"");

    // Spent figures are the usage records, one per model call.
    assert_eq!(run.spent().calls, 2 + 2 + 5);
    let last = request;
    let history = run.records(0).unwrap();
    assert_history_is_the_logs(&run, &history);
    drop(run);
    // The log holds every result byte for byte: reopened, it reads back as the Run saw it.
    let (log, recovery) = RecordLog::open(
        dir.path(),
        &RunId::new("run-e2e").unwrap(),
        SyncPolicy::EveryAppend,
    )
    .unwrap();
    assert!(recovery.is_clean());
    let logged: Vec<_> = log.iter().map(|r| r.unwrap()).collect();
    assert_eq!(logged, history);
    // And the large result's stored bytes are the server's text, whole.
    let handle: RecordHandle = large.parse().unwrap();
    let mut stored = vec![0u8; 70_000];
    let n = psych_types::RecordSource::read_output(&log, &handle, 0, &mut stored).unwrap();
    assert_eq!(&stored[..n], large_text(60_000).as_bytes());
    let mixed_png = match &mixed.content[1] {
        ContentBlock::Image(image) => image.data.clone(),
        _ => unreachable!(),
    };
    assert_eq!(&mixed_png[..8], b"\x89PNG\r\n\x1a\n");
    drop(log);

    world.stop().await;
    drop(http);
    (tools, last)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_session_against_real_servers_anthropic() {
    let target = Target::Anthropic(AnthropicOptions::new("claude-sonnet-4-5", 4096));
    let (tools, last) = session(target).await;
    insta::assert_snapshot!("e2e_tools_per_turn", format!("{tools:#?}"));
    insta::assert_snapshot!("e2e_last_request_anthropic", last.pretty_body());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_session_against_real_servers_openai() {
    let target = Target::OpenAi(OpenAiOptions::new("gpt-4.1").prompt_cache_key("run-e2e"));
    let (_, last) = session(target).await;
    insta::assert_snapshot!("e2e_last_request_openai", last.pretty_body());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_are_clear_tool_errors_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut http = HttpServer::start();
    let world = World::start(
        config(json!({
            "small": stdio(&["--garbage-at-start", "5"], json!({"preload": true})),
            "crashy": stdio(&[], json!({"preload": true})),
            "dead": stdio(&["--exit-at-once", "3"], json!({"preload": true})),
            "web": {"type": "http", "url": http.url},
        })),
        Duration::from_secs(1),
    )
    .await;
    let target = Target::Anthropic(AnthropicOptions::new("claude-sonnet-4-5", 4096));
    let mut run = world.run(dir.path(), target.clone()).await;
    http.kill();
    let mut model = ScriptedModel::new([
        Step::call("crashy__crash", json!({}))
            .and_call("small__hang", json!({}))
            .and_call(
                "psych_call_tool",
                json!({"server": "dead", "tool": "echo", "arguments": {"text": "x"}}),
            )
            .and_call("small__garbage", json!({"lines": 3}))
            .and_call("web__echo", json!({"text": "is anyone there?"}))
            .and_call("small__echo", json!({"text": "still fine"})),
        Step::say("Some tools failed; I can say why."),
    ]);
    let requests = turn(&mut run, &mut model, "Try everything.", &target).await;
    let crash = text(&run, "call_1");
    assert!(result_of(&run, "call_1").1.is_error());
    assert!(
        crash.starts_with("the call to crashy/crash failed: "),
        "{crash}"
    );
    assert!(
        crash.contains("crashing on request"),
        "the server's stderr is quoted: {crash}"
    );
    let hang = text(&run, "call_2");
    assert!(result_of(&run, "call_2").1.is_error());
    assert!(
        hang.starts_with("the call to small/hang failed: "),
        "{hang}"
    );
    assert!(
        hang.contains("1s") || hang.contains("1000 ms") || hang.contains("deadline"),
        "{hang}"
    );
    let dead = text(&run, "call_3");
    assert!(result_of(&run, "call_3").1.is_error());
    assert!(dead.contains("dead"), "{dead}");
    assert!(
        !result_of(&run, "call_4").1.is_error(),
        "{}",
        text(&run, "call_4")
    );
    let gone = text(&run, "call_5");
    assert!(result_of(&run, "call_5").1.is_error());
    assert!(gone.contains("web"), "{gone}");
    assert_eq!(text(&run, "call_6"), "still fine");
    // The model sees each error in the next request.
    for error in [&crash, &hang, &gone] {
        let quoted = serde_json::to_string(error).unwrap();
        assert!(
            requests[1].body().contains(&quoted[1..quoted.len() - 1]),
            "{error}"
        );
    }
    // Nothing logged is lost.
    let history = run.records(0).unwrap();
    assert_history_is_the_logs(&run, &history);
    drop(run);
    let (log, recovery) = RecordLog::open(
        dir.path(),
        &RunId::new("run-e2e").unwrap(),
        SyncPolicy::EveryAppend,
    )
    .unwrap();
    assert!(recovery.is_clean());
    assert_eq!(log.iter().map(|r| r.unwrap()).collect::<Vec<_>>(), history);
    drop(log);
    world.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_mid_step_resumes_with_its_log_intact() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(CHILD)
        .arg("run")
        .arg(dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while line.trim() != "calling" {
        line.clear();
        assert_ne!(
            stderr.read_line(&mut line).unwrap(),
            0,
            "the child ended before its step"
        );
    }
    // Once the step's reply is logged (the user's message, its usage, the reply with its
    // calls: read from the log as it is written, not guessed from a pause), kill -9.
    let run_id = RunId::new("run-crash").unwrap();
    let logged =
        |dir: &Path| RecordLog::open_read_only(dir, &run_id).map_or(0, |(log, _)| log.len());
    for _ in 0..600 {
        if logged(dir.path()) >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(logged(dir.path()) >= 3, "the child logged its step's reply");
    child.kill().unwrap();
    child.wait().unwrap();

    let world = World::start(
        config(json!({"svc": stdio(&[], json!({}))})),
        Duration::from_secs(5),
    )
    .await;
    let target = Target::OpenAi(OpenAiOptions::new("gpt-4.1"));
    let mut run = world
        .run_named(dir.path(), "run-crash", target.clone())
        .await;
    let logged = run.records(0).unwrap();
    assert_history_is_the_logs(&run, &logged);
    let kinds: Vec<String> = logged
        .iter()
        .map(|l| match &l.record {
            Record::User(u) => format!("user {}", u.text),
            Record::Usage(_) => "usage".to_owned(),
            Record::Assistant(a) => format!("assistant with {} calls", a.tool_calls.len()),
            Record::ToolResult(r) => format!("{} {}", r.call_id, r.output.readable_text()),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "user Start, then die.".to_owned(),
            "usage".to_owned(),
            "assistant with 2 calls".to_owned(),
            format!("call_1 {INTERRUPTED}"),
            format!("call_2 {INTERRUPTED}"),
        ]
    );
    // The next request is valid, and the turn goes on.
    let request = run.request().await.unwrap();
    check(&request, &target);
    let mut model = ScriptedModel::new([
        Step::call("svc__echo", json!({"text": "again"})),
        Step::say("Recovered."),
    ])
    .first_call(3);
    let transcript = model.continue_turn(&mut run, request).await.unwrap();
    for request in &transcript.requests {
        check(request, &target);
    }
    assert_eq!(transcript.text, "Recovered.");
    assert_eq!(text(&run, "call_3"), "again");
    drop(run);
    world.stop().await;
}

/// Issue 34: a 2 MB result handed to another tool by reference reaches the upstream as a
/// call carrying it would, the log keeping the reference only; a reference the guard finds
/// of the wrong type, a malformed one, and another Run's handle are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_passes_to_another_tool_by_reference() {
    let dir = tempfile::tempdir().unwrap();
    let world = World::start(
        config(json!({"small": stdio(&[], json!({"preload": true}))})),
        Duration::from_secs(20),
    )
    .await;
    let target = Target::Anthropic(AnthropicOptions::new("claude-sonnet-4-5", 4096));
    let mut run = world.run(dir.path(), target.clone()).await;
    let mut model = ScriptedModel::new([
        Step::call("small__large", json!({"bytes": 2_000_000}))
            .and_call("small__echo", json!({"text": "5"})),
        Step::say("Fetched."),
    ]);
    turn(&mut run, &mut model, "Fetch the big file.", &target).await;
    let (handle, fetched) = result_of(&run, "call_1");
    let big = fetched.readable_text().into_owned();
    assert_eq!(big, large_text(2_000_000));
    let (five, _) = result_of(&run, "call_2");

    let reference = json!({"$psych_result": handle.to_string()});
    let mut model = ScriptedModel::new([
        Step::call("small__fingerprint", json!({"text": reference}))
            .and_call("small__fingerprint", json!({"text": big}))
            .and_call(
                "small__fingerprint",
                json!({"text": {"$psych_result": handle.to_string(), "offset": 2, "limit": 3}}),
            )
            .and_call("small__large", json!({"bytes": reference}))
            .and_call("small__fingerprint", json!({"text": {"$psych_result": 7}}))
            .and_call(
                "small__large",
                json!({"bytes": {"$psych_result": five.to_string(), "pointer": ""}}),
            ),
        Step::say("Compared."),
    ])
    .first_call(3);
    let requests = turn(&mut run, &mut model, "Hand it on.", &target).await;
    let by_reference = text(&run, "call_3");
    assert!(!result_of(&run, "call_3").1.is_error(), "{by_reference}");
    assert_eq!(
        by_reference,
        text(&run, "call_4"),
        "the upstream got the bytes a call carrying them sends"
    );
    let lines: String = big.split_inclusive('\n').skip(2).take(3).collect();
    let sliced = text(&run, "call_5");
    assert!(
        sliced.contains(&format!("text {} bytes", lines.len())),
        "{sliced}"
    );
    // The guard checks the replaced arguments: a text is not the integer `bytes` must be,
    // and the JSON value 5 a pointer names is (the reference object itself would not be).
    assert!(
        !result_of(&run, "call_8").1.is_error(),
        "{}",
        text(&run, "call_8")
    );
    assert_eq!(text(&run, "call_8").len(), 5);
    assert!(result_of(&run, "call_6").1.is_error());
    assert!(
        text(&run, "call_6").contains("bytes"),
        "{}",
        text(&run, "call_6")
    );
    let malformed = text(&run, "call_7");
    assert!(result_of(&run, "call_7").1.is_error());
    assert!(
        malformed.contains("nothing was sent") && malformed.contains("/text"),
        "{malformed}"
    );

    // Logged once: the step's call holds the reference, not the 2 MB.
    let calls: Vec<psych_types::ToolCall> = run
        .records(0)
        .unwrap()
        .into_iter()
        .filter_map(|l| match l.record {
            Record::Assistant(message) => Some(message.tool_calls),
            _ => None,
        })
        .flatten()
        .collect();
    let passed = calls.iter().find(|c| c.id.as_str() == "call_3").unwrap();
    assert_eq!(passed.arguments, json!({"text": reference}));
    // The model's next request shows the reference as it wrote it, and the saving.
    use psych_types::TokenEstimator as _;
    let estimator = psych_elision::Estimator::new();
    let carried = estimator.estimate_text(&serde_json::to_string(&json!({"text": big})).unwrap());
    let referred =
        estimator.estimate_text(&serde_json::to_string(&json!({"text": reference})).unwrap());
    assert!(requests[1].body().contains("$psych_result"));
    eprintln!(
        "result passing: the model wrote {referred} estimated tokens instead of {carried} \
         ({} bytes passed by reference)",
        big.len()
    );

    // Another Run's handle is refused as a read of it would be: the step ends with the
    // error and nothing is forwarded.
    let mut model = ScriptedModel::new([Step::call(
        "small__fingerprint",
        json!({"text": {"$psych_result": "run-other:1"}}),
    )])
    .first_call(9);
    let refused = model
        .turn(&mut run, "Use another run's result.")
        .await
        .unwrap_err();
    assert!(
        psych_types::error_chain(&refused).contains("invalid_deferred_handle"),
        "{refused}"
    );
    // The call is logged as refused, saying where and that nothing ran (not left for the
    // next request to call interrupted).
    let last = run.records(0).unwrap().into_iter().last().map(|l| l.record);
    let Some(Record::ToolResult(result)) = last else {
        panic!("no result last: {last:?}");
    };
    assert!(result.output.is_error);
    let text = result.output.readable_text();
    assert!(
        text.starts_with(
            "small__fingerprint: refused, nothing was run: the argument at \"/text\": \
             invalid_deferred_handle: "
        ),
        "{text}"
    );
    drop(run);
    world.stop().await;
}

/// A step calling each of `tools` of the deferred server `large`: directly where the Run
/// pinned it, else through `psych_call_tool` after reading its description, as a model
/// that has not seen its schema must. Returns the steps.
fn use_tools(run: &Run<McpManager>, tools: &[&str]) -> Vec<Step> {
    let pinned = |tool: &str| {
        run.pins()
            .pinned()
            .any(|t| t.server.as_str() == "large" && t.tool.as_str() == tool)
    };
    let arguments = |tool: &str| match tool {
        "large" => json!({"bytes": 100}),
        _ => json!({"text": format!("for {tool}")}),
    };
    let mut describe = Step::default();
    let mut call = Step::default();
    for tool in tools {
        if pinned(tool) {
            call = call.and_call(format!("large__{tool}"), arguments(tool));
        } else {
            describe = describe.and_call(
                "psych_describe_tool",
                json!({"server": "large", "tool": tool}),
            );
            call = call.and_call(
                "psych_call_tool",
                json!({"server": "large", "tool": tool, "arguments": arguments(tool)}),
            );
        }
    }
    let mut steps = Vec::new();
    if describe != Step::default() {
        steps.push(describe);
    }
    steps.push(call);
    steps.push(Step::say("Done."));
    steps
}

/// Learned pinning (issue 34): the tools of the deferred server that a scripted history of
/// Runs called most are direct tools of the next Run, chosen once when it opens, so its
/// tool prefix is the same in every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learned_pinning_keeps_the_most_used_deferred_tools_direct() {
    let dir = tempfile::tempdir().unwrap();
    let world = World::start(
        config(json!({
            "small": stdio(&[], json!({"preload": true})),
            "large": stdio(&["--tools", "400"], json!({})),
        })),
        Duration::from_secs(20),
    )
    .await;
    let target = Target::Anthropic(AnthropicOptions::new("claude-sonnet-4-5", 4096));
    let history: [&[&str]; 3] = [
        &["echo", "fingerprint"],
        &["echo", "fingerprint", "large"],
        &["echo"],
    ];
    for (i, tools) in history.iter().enumerate() {
        let mut run = world
            .run_named(dir.path(), &format!("run-h{i}"), target.clone())
            .await;
        assert_eq!(run.pins().choices, [], "no pinning asked");
        let mut model = ScriptedModel::new(use_tools(&run, tools));
        turn(&mut run, &mut model, "Do the usual.", &target).await;
    }

    let usage = psych_runtime::usage_in_logs(&[dir.path().to_path_buf()], 20, &[]);
    assert_eq!(usage.runs(), 3);
    let mut run = world
        .builder(dir.path(), "run-pinned", target.clone())
        .learned_pinning(usage, PinSettings::default())
        .open()
        .await
        .unwrap();
    let decided: Vec<(String, PinWhy)> = run
        .pins()
        .choices
        .iter()
        .map(|c| (format!("{}/{}", c.tool.server, c.tool.tool), c.why))
        .collect();
    assert_eq!(
        decided,
        [
            ("large/echo".to_owned(), PinWhy::Pinned),
            ("large/fingerprint".to_owned(), PinWhy::Pinned),
            ("large/large".to_owned(), PinWhy::Rare),
        ]
    );
    let mut requests = Vec::new();
    for (i, user) in ["Do the usual.", "Again."].into_iter().enumerate() {
        let mut model = ScriptedModel::new(use_tools(&run, &["echo", "fingerprint"]))
            .first_call(1 + 2 * i as u64);
        requests.extend(turn(&mut run, &mut model, user, &target).await);
    }
    let names = tool_names(&requests[0]);
    assert!(
        names.contains(&"large__echo".to_owned())
            && names.contains(&"large__fingerprint".to_owned()),
        "{names:?}"
    );
    assert!(!names.contains(&"large__large".to_owned()), "{names:?}");
    // One tool prefix for the whole Run.
    let tools = |request: &RenderedRequest| {
        serde_json::from_str::<Value>(request.body()).unwrap()["tools"].clone()
    };
    for request in &requests {
        assert_eq!(tools(request), tools(&requests[0]));
    }
    // The direct calls reached the server, and their results record where they went.
    assert_eq!(text(&run, "call_1"), "for echo");
    let targets: Vec<String> = run
        .history()
        .entries
        .iter()
        .filter_map(|e| match &e.item {
            psych_types::HistoryItem::Result(stored) => stored.target.as_ref(),
            _ => None,
        })
        .map(|t| format!("{}/{}", t.server, t.tool))
        .collect();
    assert_eq!(
        targets,
        [
            "large/echo",
            "large/fingerprint",
            "large/echo",
            "large/fingerprint"
        ]
    );
    // Resumed, the Run keeps its pins whatever the usage is now, and so its tool prefix.
    let pins = run.pins().clone();
    drop(run);
    let mut run = world
        .builder(dir.path(), "run-pinned", target.clone())
        .learned_pinning(ToolUsage::new(), PinSettings::default())
        .open()
        .await
        .unwrap();
    assert_eq!(run.pins(), &pins);
    let mut model = ScriptedModel::new([Step::say("Still here.")]);
    let resumed = turn(&mut run, &mut model, "Once more.", &target).await;
    assert_eq!(tools(&resumed[0]), tools(&requests[0]));
    drop(run);
    // Even without learned pinning asked: the tools the Run had are its tools.
    let mut run = world
        .run_named(dir.path(), "run-pinned", target.clone())
        .await;
    assert_eq!(run.pins(), &pins);
    let mut model = ScriptedModel::new([Step::say("And again.")]);
    let resumed = turn(&mut run, &mut model, "Once more.", &target).await;
    assert_eq!(tools(&resumed[0]), tools(&requests[0]));
    drop(run);
    world.stop().await;
}

/// The saving of learned pinning on a scripted history (issue 34): ten sessions, each using
/// the same two deferred tools (and a third now and then), run without pinning and with it
/// (each session pinning from the ones before it). Counted: model round trips and the input
/// tokens the scripted model was billed (the request's bytes / 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learned_pinning_saves_round_trips_and_tokens_over_a_scripted_history() {
    let world = World::start(
        config(json!({
            "small": stdio(&[], json!({"preload": true})),
            "large": stdio(&["--tools", "400"], json!({})),
        })),
        Duration::from_secs(20),
    )
    .await;
    let target = Target::Anthropic(AnthropicOptions::new("claude-sonnet-4-5", 4096));
    let mut arms = Vec::new();
    for pinning in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (mut calls, mut input) = (0, 0);
        for session in 0..10 {
            let mut builder = world.builder(dir.path(), &format!("run-s{session}"), target.clone());
            if pinning {
                let usage = psych_runtime::usage_in_logs(&[dir.path().to_path_buf()], 20, &[]);
                builder = builder.learned_pinning(usage, PinSettings::default());
            }
            let mut run = builder.open().await.unwrap();
            let tools: &[&str] = if session % 3 == 2 {
                &["echo", "fingerprint", "large"]
            } else {
                &["echo", "fingerprint"]
            };
            let mut model = ScriptedModel::new(use_tools(&run, tools));
            turn(&mut run, &mut model, "Do the usual.", &target).await;
            calls += run.spent().calls;
            input += run.spent().usage.input;
        }
        arms.push((calls, input));
    }
    let [(calls_without, input_without), (calls_with, input_with)] = arms[..] else {
        unreachable!()
    };
    eprintln!(
        "learned pinning over 10 scripted sessions: {calls_without} model round trips and \
         {input_without} input tokens without it, {calls_with} and {input_with} with it \
         ({} round trips and {} tokens saved, {:.1}%)",
        calls_without - calls_with,
        input_without - input_with,
        100.0 * (input_without - input_with) as f64 / input_without as f64
    );
    assert!(calls_with < calls_without);
    assert!(input_with < input_without);
    world.stop().await;
}

/// Output limits users set (issue 34): per tool from the `mcpServers` file, and the hint a
/// server declares (`anthropic/maxResultSizeChars`), the user's setting winning. The Run's
/// elider is 2,000 tokens per result, 8,000 per batch; results are projected the turn after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_limits_elide_each_tool_at_its_own_size() {
    let dir = tempfile::tempdir().unwrap();
    let world = World::start(
        config(json!({
            "limited": stdio(&[], json!({"preload": true, "output": {
                "tools": {"echo": {"perResultTokens": 500, "headChars": 40, "tailChars": 20}}
            }})),
            "hinted": stdio(&["--hint-max-chars", "40000"], json!({"preload": true})),
            "overruled": stdio(&["--hint-max-chars", "40000"], json!({"preload": true, "output": {
                "perResultTokens": 1000
            }})),
            "plain": stdio(&[], json!({"preload": true})),
        })),
        Duration::from_secs(20),
    )
    .await;
    let target = Target::Anthropic(AnthropicOptions::new("claude-sonnet-4-5", 4096));
    let mut run = world.run(dir.path(), target.clone()).await;
    let mut model = ScriptedModel::new([
        Step::call("limited__echo", json!({"text": "sword ".repeat(700)}))
            .and_call("plain__echo", json!({"text": "oword ".repeat(700)}))
            .and_call("hinted__large", json!({"bytes": 20_000}))
            .and_call("plain__large", json!({"bytes": 20_000}))
            .and_call("overruled__large", json!({"bytes": 6_000})),
        Step::say("Fetched."),
    ]);
    turn(&mut run, &mut model, "Fetch them.", &target).await;
    let mut model = ScriptedModel::new([Step::say("Seen.")]).first_call(6);
    let requests = turn(&mut run, &mut model, "And now?", &target).await;
    let body: Value = serde_json::from_str(requests[0].body()).unwrap();
    // What the model is shown of call `call`'s result.
    let shown = |call: &str| -> String {
        body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .find(|block| block["type"] == "tool_result" && block["tool_use_id"] == call)
            .map(|block| match &block["content"] {
                Value::String(text) => text.clone(),
                Value::Array(blocks) => blocks.iter().filter_map(|b| b["text"].as_str()).collect(),
                _ => String::new(),
            })
            .unwrap_or_else(|| panic!("no result for {call}"))
    };
    let elided = |call: &str| shown(call).contains("[Elided tool result");
    use psych_types::TokenEstimator as _;
    let estimate = |text: &str| psych_elision::Estimator::new().estimate_text(text);
    // Over its tool's 500, under the default 2,000.
    assert!((500..2_000).contains(&estimate(&"sword ".repeat(700))));
    assert!(elided("call_1"), "the limited tool's result is elided");
    let head = shown("call_1");
    assert!(
        head.starts_with("sword sword") && !head.contains(&"sword ".repeat(12)),
        "{head}"
    );
    assert!(
        !elided("call_2"),
        "the same size from another tool is whole"
    );
    // The two kept whole fit the batch's 8,000 together (else the batch rule elides one).
    assert!(estimate(&"oword ".repeat(700)) + estimate(&large_text(20_000)) < 8_000);
    // Over the default 2,000, under the hint's 10,000 (clamped to 8,000).
    assert!((2_000..8_000).contains(&estimate(&large_text(20_000))));
    assert!(!elided("call_3"), "the hint raises the threshold");
    assert!(elided("call_4"), "no hint, the default");
    // Under the default and the hint, over the user's 1,000.
    assert!((1_000..2_000).contains(&estimate(&large_text(6_000))));
    assert!(elided("call_5"), "the user's setting beats the hint");
    drop(run);

    // A per-result threshold over the batch's is refused when the Run opens, by name.
    let over = config(json!({"s": stdio(&[], json!({"output": {"perResultTokens": 9000}}))}));
    let refused = world
        .builder(dir.path(), "run-over", target.clone())
        .output_limits(over.output_limits().unwrap())
        .open()
        .await
        .unwrap_err();
    let message = psych_types::error_chain(&refused);
    assert!(
        message.contains("perResultTokens 9000") && message.contains("of s:"),
        "{message}"
    );
    world.stop().await;
}
