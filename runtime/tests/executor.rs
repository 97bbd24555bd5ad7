//! The Run and its executor over an in-process host: parallel calls and call order, the
//! per-call deadline, a grant revoked mid-Run, a read by a handle never emitted, resume
//! after a crash that left calls unanswered, spent tokens from usage records only, a Run
//! whose catalogue fills the tool cap, repeated call ids, and JSON nested past what the log
//! reads back.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::sync::Arc;
use std::time::Duration;

use psych_catalog::Catalog;
use psych_record_log::{RecordLog, SyncPolicy};
use psych_runtime::{
    ExecuteError, INTERRUPTED, Next, Run, RunBuilder, RunError, ScriptedModel, Step, TurnState,
};
use psych_types::{
    AssistantMessage, ConnectionSpec, JsonObject, PermissionGrant, Record, RunId, ServerId,
    ToolCall, ToolCallId, ToolDefinition, ToolHost, ToolLister, ToolName, ToolOutput, ToolRef,
    UserMessage,
};
use serde_json::json;

/// `sleep {ms, tag}` answers `tag` after `ms` (and panics, a host bug, for the tag
/// `panic`), first meeting the other calls given `"meet": true` when there is one
/// ([`MEET`]: they answer their tags only if they run together); `hang` never answers.
struct Host;

/// Where the calls of [`parallel_calls_run_together_and_log_in_call_order`] meet: the three
/// get past it only together, so calls run one after another would time out waiting for
/// the others (a timed-out wait still counts as arrived: the last would pass) and answer
/// errors, not their tags.
static MEET: std::sync::LazyLock<tokio::sync::Barrier> =
    std::sync::LazyLock::new(|| tokio::sync::Barrier::new(3));

impl ToolLister for Host {
    type Error = std::io::Error;

    async fn list_tools(&self, _: &ServerId) -> Result<Vec<ToolDefinition>, Self::Error> {
        let schema = |s: serde_json::Value| serde_json::from_value(s).unwrap();
        Ok(vec![
            ToolDefinition::new(
                ToolName::new("sleep").unwrap(),
                "Answers tag after ms",
                schema(
                    json!({"type": "object", "properties": {"ms": {"type": "integer"}, "tag": {"type": "string"}, "meet": {"type": "boolean"}}, "required": ["ms", "tag"]}),
                ),
            ),
            ToolDefinition::new(
                ToolName::new("hang").unwrap(),
                "Never answers",
                schema(json!({"type": "object"})),
            ),
        ])
    }
}

impl ToolHost for Host {
    async fn call_tool(&self, tool: &ToolRef, args: JsonObject) -> Result<ToolOutput, Self::Error> {
        if tool.tool.as_str() == "hang" {
            std::future::pending::<()>().await;
        }
        if args.get("meet").is_some_and(|meet| meet == true) {
            MEET.wait().await;
        }
        tokio::time::sleep(Duration::from_millis(args["ms"].as_u64().unwrap_or(0))).await;
        assert_ne!(args["tag"], "panic", "the host's bug");
        match args["tag"].as_str() {
            Some(tag @ ("spilled" | "spilled_into_an_image")) => Ok(spilled(tag)),
            // Structured content as deep as serde_json parses.
            Some("deep") => Ok(ToolOutput::text("deep").with_structured_content(nested(127))),
            tag => Ok(ToolOutput::text(tag.unwrap_or_default())),
        }
    }
}

/// JSON nested `depth` levels: arrays in arrays around one object.
fn nested(depth: usize) -> serde_json::Value {
    (1..depth).fold(json!({"deepest": true}), |inner, _| json!([inner]))
}

/// The text a spilled result of the host holds in its file.
fn spilled_text() -> String {
    (0..20_000).map(|i| format!("line {i}\n")).collect()
}

/// A result whose text is in a file, as psych-mcp hands on an answer too large to hold in
/// memory; for `spilled_into_an_image`, one whose spilled block is wrongly an image (the
/// log refuses to store it).
fn spilled(tag: &str) -> ToolOutput {
    use std::io::Write as _;
    let text = spilled_text();
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(text.as_bytes()).unwrap();
    let spilled = Arc::new(psych_types::SpilledText::new(file, text.len() as u64));
    let block = if tag == "spilled" {
        psych_types::ContentBlock::text(spilled.placeholder())
    } else {
        psych_types::ContentBlock::Image(psych_types::MediaContent {
            data: vec![1, 2, 3],
            mime_type: "image/png".into(),
            ..Default::default()
        })
    };
    let mut output = ToolOutput::from_blocks(vec![block]);
    output.spilled = vec![psych_types::SpilledBlock {
        block: 0,
        text: spilled,
    }];
    output
}

/// The provider every Run of these tests renders for.
fn target() -> psych_runtime::Target {
    let options = psych_prompt_assembly::AnthropicOptions::new("claude-sonnet-4-5", 4096);
    psych_runtime::Target::Anthropic(options)
}

fn server() -> ServerId {
    ServerId::new("svc").unwrap()
}

async fn open(dir: &std::path::Path) -> Run<Host> {
    open_with(dir, Duration::from_millis(300)).await
}

async fn open_with(dir: &std::path::Path, timeout: Duration) -> Run<Host> {
    builder(dir)
        .await
        .call_timeout(timeout)
        .open()
        .await
        .unwrap()
}

/// The Run `run-1` under `dir` over the host's one server, granted whole, at a fixed clock.
async fn builder(dir: &std::path::Path) -> RunBuilder<Host> {
    let catalog = Catalog::in_memory().unwrap();
    catalog
        .refresh(&server(), &Host.list_tools(&server()).await.unwrap())
        .unwrap();
    over(dir, catalog)
}

/// [`builder`] reading the server's tools from `catalog`.
fn over(dir: &std::path::Path, catalog: Catalog) -> RunBuilder<Host> {
    Run::builder(
        dir,
        RunId::new("run-1").unwrap(),
        catalog,
        Arc::new(Host),
        target(),
    )
    .connections([ConnectionSpec::new(server())])
    .grant(PermissionGrant::none().allow_server(server()))
    .clock(|| 1_796_041_497)
}

/// Each result's call id and text, read whole from the Run's log.
fn texts(run: &Run<Host>) -> Vec<(String, String)> {
    results(run)
        .into_iter()
        .map(|(id, out)| (id, out.readable_text().into_owned()))
        .collect()
}

/// The Run's results, read whole from its log.
fn results(run: &Run<Host>) -> Vec<(String, ToolOutput)> {
    run.records(0)
        .unwrap()
        .into_iter()
        .filter_map(|l| match l.record {
            Record::ToolResult(r) => Some((r.call_id.to_string(), r.output)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_calls_run_together_and_log_in_call_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = open_with(dir.path(), Duration::from_secs(10)).await;
    // The three meet before answering (calls run one after another would time out, and
    // answer errors, not their tags), then finish out of call order.
    let mut model = ScriptedModel::new([
        Step::call(
            "svc__sleep",
            json!({"ms": 800, "tag": "slow", "meet": true}),
        )
        .and_call("svc__sleep", json!({"ms": 10, "tag": "fast", "meet": true}))
        .and_call(
            "svc__sleep",
            json!({"ms": 700, "tag": "middle", "meet": true}),
        ),
        Step::say("done"),
    ]);
    let transcript = model.turn(&mut run, "go").await.unwrap();
    assert_eq!(transcript.text, "done");
    assert_eq!(
        texts(&run),
        [
            ("call_1".into(), "slow".into()),
            ("call_2".into(), "fast".into()),
            ("call_3".into(), "middle".into())
        ]
    );
    // The log holds the same, in the same order, after a reopen.
    drop(run);
    let (log, _) = RecordLog::open(
        dir.path(),
        &RunId::new("run-1").unwrap(),
        SyncPolicy::EveryAppend,
    )
    .unwrap();
    let logged: Vec<_> = log.iter().map(|r| r.unwrap().record).collect();
    let kinds: Vec<&str> = logged
        .iter()
        .map(|r| match r {
            Record::User(_) => "user",
            Record::Assistant(_) => "assistant",
            Record::ToolResult(_) => "result",
            Record::Usage(_) => "usage",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "user",
            "usage",
            "assistant",
            "result",
            "result",
            "result",
            "usage",
            "assistant"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_id_used_before_is_answered_under_a_fresh_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = open(dir.path()).await;
    // A model that numbers its calls from 1 in every turn (as some OpenAI-compatible
    // servers do in every response), and repeats an id within one reply.
    let first = ScriptedModel::new([
        Step::call("svc__sleep", json!({"ms": 0, "tag": "one"})),
        Step::say("done"),
    ])
    .turn(&mut run, "go")
    .await
    .unwrap();
    assert_eq!(first.text, "done");
    let mut again = ScriptedModel::new([
        Step::call("svc__sleep", json!({"ms": 0, "tag": "two"})),
        Step::say("done again"),
    ]);
    let request = run.user("once more").await.unwrap();
    let mut reply = again.reply(&request);
    let mut twin = reply.tool_calls[0].clone();
    twin.arguments = json!({"ms": 0, "tag": "three"});
    reply.tool_calls.push(twin);
    assert_eq!(reply.tool_calls[0].id.as_str(), "call_1");
    assert_eq!(reply.tool_calls[1].id.as_str(), "call_1");
    let Next::Request(request) = run.reply(reply).await.unwrap() else {
        panic!("the calls' results go to the model");
    };
    let transcript = again.continue_turn(&mut run, request).await.unwrap();
    assert_eq!(transcript.text, "done again");
    assert_eq!(
        texts(&run),
        [
            ("call_1".into(), "one".into()),
            ("call_1_2".into(), "two".into()),
            ("call_1_3".into(), "three".into())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_nested_past_what_the_log_reads_back_never_stops_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = open(dir.path()).await;
    let mut model = ScriptedModel::new([
        Step::call("svc__sleep", json!({"ms": 0, "tag": "deep"}))
            .and_call("svc__sleep", json!({"ms": 0, "tag": "kept"}))
            .and_call(
                "svc__sleep",
                json!({"ms": 0, "tag": "x", "more": nested(125)}),
            ),
        Step::say("done"),
    ]);
    let transcript = model.turn(&mut run, "go").await.unwrap();
    assert_eq!(transcript.text, "done");
    let results = results(&run);
    let texts: Vec<_> = results
        .iter()
        .map(|(_, output)| (output.is_error, output.readable_text().into_owned()))
        .collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    // The result too deep to keep is said to be so; the others are as they were.
    assert!(
        texts[0].0 && texts[0].1.contains("could not be stored"),
        "{texts:?}"
    );
    assert_eq!(texts[1], (false, "kept".to_owned()));
    // Arguments too deep to keep are kept as their text, which is not an object.
    assert!(texts[2].0, "{texts:?}");
    let calls: Vec<_> = run
        .records(0)
        .unwrap()
        .into_iter()
        .filter_map(|logged| match logged.record {
            Record::Assistant(message) => Some(message.tool_calls),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(calls[2].arguments.is_string());
    // The log reads back whole after a reopen.
    drop(run);
    let run = open(dir.path()).await;
    assert_eq!(run.records(0).unwrap().len(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_the_steps_cap_are_answered_without_running() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = builder(dir.path())
        .await
        .max_calls_per_step(2)
        .open()
        .await
        .unwrap();
    // Five calls, two of which run: the others would hang the step if they were sent, and
    // a read past the cap is not read either (its handle was never emitted: read, it would
    // end the step as `invalid_deferred_handle`).
    let mut model = ScriptedModel::new([
        Step::call("svc__sleep", json!({"ms": 1, "tag": "first"}))
            .and_call("svc__sleep", json!({"ms": 1, "tag": "second"}))
            .and_call("svc__hang", json!({}))
            .and_call("read_tool_output", json!({"handle": "run-9:1"}))
            .and_call("svc__hang", json!({})),
        Step::say("done"),
    ]);
    let transcript = model.turn(&mut run, "go").await.unwrap();
    assert_eq!(transcript.text, "done");
    let results = results(&run);
    let texts: Vec<String> = results
        .iter()
        .map(|(_, out)| out.readable_text().into_owned())
        .collect();
    assert_eq!(texts[..2], ["first", "second"]);
    assert_eq!(results.len(), 5, "every call has its result: {texts:?}");
    for ((id, output), name) in
        results[2..]
            .iter()
            .zip(["svc__hang", "read_tool_output", "svc__hang"])
    {
        assert!(output.is_error, "{id}");
        assert_eq!(
            output.readable_text(),
            format!(
                "{name}: not run: this step made 5 tool calls and at most 2 of a step run; \
                 nothing of this call was sent. Make it again in a later step."
            )
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_past_the_deadline_is_a_clear_tool_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = open(dir.path()).await;
    let mut model = ScriptedModel::new([
        Step::call("svc__hang", json!({})).and_call("svc__sleep", json!({"ms": 1, "tag": "ok"})),
        Step::say("done"),
    ]);
    let transcript = model.turn(&mut run, "go").await.unwrap();
    let results = results(&run);
    assert!(results[0].1.is_error());
    assert_eq!(
        results[0].1.readable_text(),
        "the call to svc/hang timed out after 300 ms; it was cancelled"
    );
    assert_eq!(results[1].1.readable_text(), "ok");
    assert!(
        transcript.requests[1]
            .body()
            .contains("timed out after 300 ms")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_revoked_mid_turn_holds_at_the_next_call() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = open(dir.path()).await;
    let mut model = ScriptedModel::new([
        Step::call("svc__sleep", json!({"ms": 1, "tag": "allowed"})),
        Step::call("svc__sleep", json!({"ms": 1, "tag": "revoked"})),
        Step::say("done"),
    ]);
    let first = run.user("go").await.unwrap();
    let Next::Request(second) = run.reply(model.reply(&first)).await.unwrap() else {
        panic!("a request")
    };
    run.set_grant(PermissionGrant::none());
    let Next::Request(_) = run.reply(model.reply(&second)).await.unwrap() else {
        panic!("a request")
    };
    let results = results(&run);
    assert_eq!(results[0].1.readable_text(), "allowed");
    assert!(results[1].1.is_error());
    assert_eq!(results[1].1.readable_text(), "unknown server \"svc\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_by_a_foreign_handle_is_the_typed_error_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = open(dir.path()).await;
    let mut model = ScriptedModel::new([Step::call(
        "read_tool_output",
        json!({"handle": "run-2:0"}),
    )
    .and_call("svc__sleep", json!({"ms": 1, "tag": "kept"}))]);
    let first = run.user("go").await.unwrap();
    let error = run.reply(model.reply(&first)).await.unwrap_err();
    let RunError::Execute(ExecuteError::InvalidDeferredHandle(invalid)) = error else {
        panic!("not the handle error: {error}")
    };
    assert_eq!(invalid.handle, "run-2:0");
    // Both are logged in call order, the read as refused: nothing ran, not "interrupted"
    // (which would say it may have taken effect).
    let logged = results(&run);
    assert_eq!(logged[0].0, "call_1");
    assert_eq!(logged[1].0, "call_2");
    let refused = logged[0].1.readable_text();
    assert!(
        refused.starts_with(
            "read_tool_output: refused, nothing was run: invalid_deferred_handle: \"run-2:0\""
        ),
        "{refused}"
    );
    assert!(logged[0].1.is_error);
    let request = run.request().await.unwrap();
    assert_eq!(results(&run).len(), 2, "nothing left to close");
    assert!(request.body().contains("refused, nothing was run"));
    assert!(!request.body().contains(INTERRUPTED));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_answers_unanswered_calls_before_assembling() {
    let dir = tempfile::tempdir().unwrap();
    let run_id = RunId::new("run-1").unwrap();
    {
        // What a crash mid-step leaves: the assistant's calls, one result of two.
        let (mut log, _) = RecordLog::open(dir.path(), &run_id, SyncPolicy::EveryAppend).unwrap();
        let call = |id: &str| ToolCall {
            id: ToolCallId::new(id).unwrap(),
            name: "svc__sleep".into(),
            arguments: json!({"ms": 1, "tag": id}),
        };
        log.append(&Record::User(UserMessage { text: "go".into() }))
            .unwrap();
        log.append(&Record::Assistant(AssistantMessage {
            text: String::new(),
            tool_calls: vec![call("a"), call("b")],
        }))
        .unwrap();
        log.append(&Record::ToolResult(psych_types::ToolResult {
            target: None,
            call_id: ToolCallId::new("b").unwrap(),
            name: "svc__sleep".into(),
            output: ToolOutput::text("b"),
        }))
        .unwrap();
    }
    let mut run = open(dir.path()).await;
    let results_now = results(&run);
    assert_eq!(results_now.len(), 2);
    assert_eq!(results_now[1].0, "a");
    assert_eq!(results_now[1].1.readable_text(), INTERRUPTED);
    // The turn goes on from where it stopped.
    let request = run.request().await.unwrap();
    assert!(request.body().contains(INTERRUPTED));
    let mut model = ScriptedModel::new([Step::say("resumed")]).first_call(10);
    let transcript = model.continue_turn(&mut run, request).await.unwrap();
    assert_eq!(transcript.text, "resumed");
    // Reopening again repairs nothing more.
    drop(run);
    let run = open(dir.path()).await;
    assert_eq!(results(&run).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spent_comes_from_usage_records_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = open(dir.path()).await;
    let first = run.user("x".repeat(10_000)).await.unwrap();
    let reply = psych_runtime::ModelReply {
        text: "fine".into(),
        tool_calls: Vec::new(),
        usage: Some(psych_types::Usage {
            input: 12,
            cache_read: 3_000,
            cache_write: 0,
            output: 4,
        }),
    };
    assert_eq!(
        run.reply(reply).await.unwrap(),
        Next::Done {
            text: "fine".into()
        }
    );
    let spent = run.spent();
    assert_eq!((spent.calls, spent.total()), (1, 3_016));
    drop(first);
    // A reply with no usage reported adds nothing.
    let _ = run.user("again").await.unwrap();
    // A user message while the request's reply is awaited is out of turn, and says so.
    assert!(matches!(
        run.user("too soon").await,
        Err(RunError::OutOfTurn(TurnState::AwaitingReply))
    ));
    run.reply(psych_runtime::ModelReply {
        text: "ok".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(run.spent().total(), 3_016);
    // Out of turn is a typed error.
    assert!(matches!(
        run.reply(psych_runtime::ModelReply::default()).await,
        Err(RunError::OutOfTurn(TurnState::NoRequestWaiting))
    ));
    // Reopened, the Run tallies the same from its log's usage records.
    drop(run);
    let run = open(dir.path()).await;
    assert_eq!((run.spent().calls, run.spent().total()), (1, 3_016));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_panics_is_logged_as_failed_with_every_other_result_of_its_step() {
    // Before, the panic returned from the step before anything was logged: the results of
    // the calls that ran were lost.
    let dir = tempfile::tempdir().unwrap();
    let mut run = open_with(dir.path(), Duration::from_secs(10)).await;
    let mut model = ScriptedModel::new([Step::call(
        "svc__sleep",
        json!({"ms": 50, "tag": "before"}),
    )
    .and_call("svc__sleep", json!({"ms": 1, "tag": "panic"}))
    .and_call("svc__sleep", json!({"ms": 1, "tag": "after"}))]);
    let first = run.user("go").await.unwrap();
    let error = run.reply(model.reply(&first)).await.unwrap_err();
    let RunError::Execute(ExecuteError::Panicked { call, name, source }) = &error else {
        panic!("not the panic: {error}")
    };
    assert_eq!((call.as_str(), name.as_str()), ("call_2", "svc__sleep"));
    assert!(source.is_panic());
    let results = results(&run);
    let texts: Vec<_> = results
        .iter()
        .map(|(id, out)| (id.as_str(), out.is_error(), out.readable_text()))
        .collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert_eq!(texts[0], ("call_1", false, "before".into()));
    assert_eq!((texts[1].0, texts[1].1), ("call_2", true));
    assert!(
        texts[1]
            .2
            .starts_with("the call call_2 (svc__sleep) did not finish: task ")
            && texts[1].2.contains("panicked"),
        "{}",
        texts[1].2
    );
    assert_eq!(texts[2], ("call_3", false, "after".into()));
    // Every call is answered: the Run goes on.
    let request = run.request().await.unwrap();
    assert!(request.body().contains("did not finish"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failed_call_of_a_step_is_reported_in_call_order() {
    // Before, only the last refused read was reported.
    let dir = tempfile::tempdir().unwrap();
    let mut run = open_with(dir.path(), Duration::from_secs(10)).await;
    let mut model = ScriptedModel::new([Step::call(
        "read_tool_output",
        json!({"handle": "run-2:0"}),
    )
    .and_call("svc__sleep", json!({"ms": 1, "tag": "panic"}))
    .and_call("svc__sleep", json!({"ms": 1, "tag": "kept"}))
    .and_call("read_tool_output", json!({"handle": "run-3:0"}))]);
    let first = run.user("go").await.unwrap();
    let error = run.reply(model.reply(&first)).await.unwrap_err();
    let RunError::Execute(ExecuteError::Calls(errors)) = &error else {
        panic!("not every failure: {error}")
    };
    let seen: Vec<String> = errors
        .iter()
        .map(|e| match e {
            ExecuteError::InvalidDeferredHandle(invalid) => invalid.handle.clone(),
            ExecuteError::Panicked { call, .. } => call.to_string(),
            other => panic!("{other}"),
        })
        .collect();
    assert_eq!(seen, ["run-2:0", "call_2", "run-3:0"]);
    assert!(
        error
            .to_string()
            .starts_with("3 calls of the step failed: "),
        "{error}"
    );
    // Every call is logged in call order: the refused reads saying so, the panicked call
    // and the good one.
    let logged: Vec<_> = results(&run)
        .into_iter()
        .map(|(id, output)| {
            (
                id,
                output.readable_text().contains("refused, nothing was run"),
            )
        })
        .collect();
    assert_eq!(
        logged,
        [
            ("call_1".into(), true),
            ("call_2".into(), false),
            ("call_3".into(), false),
            ("call_4".into(), true)
        ]
    );
    run.request().await.unwrap();
    assert_eq!(results(&run).len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spilled_result_is_logged_whole_and_one_the_log_refuses_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = open_with(dir.path(), Duration::from_secs(10)).await;
    let mut model = ScriptedModel::new([
        Step::call("svc__sleep", json!({"ms": 0, "tag": "spilled"}))
            .and_call(
                "svc__sleep",
                json!({"ms": 0, "tag": "spilled_into_an_image"}),
            )
            .and_call("svc__sleep", json!({"ms": 0, "tag": "plain"})),
        Step::say("done"),
    ]);
    model.turn(&mut run, "go").await.unwrap();
    let results = results(&run);
    assert_eq!(results.len(), 3);
    // The spilled text is in the log, not its placeholder.
    assert!(
        results[0].1.readable_text() == spilled_text(),
        "the spilled text is logged whole"
    );
    assert!(!results[0].1.is_error);
    // The one the log refused is an error result saying why; the others are kept.
    assert!(results[1].1.is_error, "{:?}", results[1].1);
    assert!(
        results[1].1.readable_text().contains("could not be stored"),
        "{}",
        results[1].1.readable_text()
    );
    assert_eq!(results[2].1.readable_text(), "plain");
}

/// A catalogue that fills disclosure's default tool cap exactly (four servers of 32, 32,
/// 32 and 31 tools, all direct, and the orientation tool: 128) still renders for OpenAI,
/// which refuses more than 128 tools: the Run reserves `read_tool_output`'s slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_at_the_tool_cap_renders_for_openai() {
    use psych_disclosure::{Inputs, Settings, Why};
    use psych_prompt_assembly::{OPENAI_MAX_TOOLS, OpenAiOptions};
    use psych_runtime::{EXECUTOR_TOOLS, Target};

    let catalog = Catalog::in_memory().unwrap();
    let mut connections = Vec::new();
    for (i, n) in [32, 32, 32, 31].into_iter().enumerate() {
        let server = ServerId::new(format!("s{i}")).unwrap();
        let tools: Vec<_> = (0..n)
            .map(|t| {
                let name = ToolName::new(format!("t{t}")).unwrap();
                ToolDefinition::new(name, "Does one thing", Default::default())
            })
            .collect();
        catalog.refresh(&server, &tools).unwrap();
        connections.push(ConnectionSpec::new(server));
    }
    let grant = connections
        .iter()
        .fold(PermissionGrant::none(), |grant, c| {
            grant.allow_server(c.server.clone())
        });
    // Resolved with nothing reserved, the Surface is exactly at the cap.
    let catalogs: Vec<_> = connections
        .iter()
        .map(|c| catalog.live(&c.server).unwrap())
        .collect();
    let inputs = Inputs {
        connections: &connections,
        catalogs: &catalogs,
        grant: &grant,
    };
    let estimator = psych_elision::Estimator::new();
    let full = psych_disclosure::resolve(&inputs, &Settings::default(), &estimator).unwrap();
    assert_eq!(full.tools().len(), OPENAI_MAX_TOOLS);

    let dir = tempfile::tempdir().unwrap();
    let target = Target::OpenAi(OpenAiOptions::new("gpt-test"));
    let run = Run::builder(
        dir.path(),
        RunId::new("cap").unwrap(),
        catalog,
        Arc::new(Host),
        target,
    );
    let mut run = run
        .connections(connections)
        .grant(grant)
        .clock(|| 1_796_041_497)
        .open()
        .await
        .unwrap();
    let request = run.user("Use any tool.").await.unwrap();
    let body: serde_json::Value = serde_json::from_str(request.body()).unwrap();
    let tools = body["tools"].as_array().unwrap();
    assert!(tools.len() <= OPENAI_MAX_TOOLS, "{} tools", tools.len());
    assert!(
        tools
            .iter()
            .any(|t| t["function"]["name"] == psych_types::READ_TOOL_OUTPUT)
    );
    let surface = run.surface().unwrap();
    assert_eq!(
        surface.settings().surface_cap(),
        OPENAI_MAX_TOOLS - EXECUTOR_TOOLS
    );
    assert!(surface.tools().len() + EXECUTOR_TOOLS <= OPENAI_MAX_TOOLS);
    assert!(
        surface.servers().iter().any(|s| s.why == Why::ToolCap),
        "a server stepped down for the reserved slot"
    );
}

/// Counts one token per byte: four times or so what psych-elision's estimator says of
/// English text.
struct PerByte;

impl psych_types::TokenEstimator for PerByte {
    fn estimate_text(&self, text: &str) -> u64 {
        text.len() as u64
    }

    fn estimate_binary(&self, _: &str, len: u64) -> u64 {
        len
    }
}

/// One estimator set on the builder reaches disclosure's costs, the log's stored
/// estimates and elision: a 20,000-byte result that psych-elision's own estimator keeps
/// whole is elided in the next turn when the Run counts a token per byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_estimator_reaches_disclosure_the_log_and_elision() {
    use psych_disclosure::{Inputs, Settings};
    use psych_elision::{Estimator, Thresholds};
    use psych_types::{HistoryItem, TokenEstimator};

    let text: String = (0..2_000).map(|i| format!("word{:05} ", i * 7)).collect();
    assert_eq!(text.len(), 20_000);
    // psych-elision's estimator keeps it whole; one token per byte does not.
    assert!(Estimator::new().estimate_text(&text) < Thresholds::DEFAULT_PER_RESULT);
    assert!(PerByte.estimate_text(&text) > Thresholds::DEFAULT_PER_RESULT);

    // Returns the Run's cost of `svc`, the estimate stored with the result, and whether
    // the next turn's request carries the result whole.
    let drive = async |estimator: Option<PerByte>| {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::in_memory().unwrap();
        catalog
            .refresh(&server(), &Host.list_tools(&server()).await.unwrap())
            .unwrap();
        let run_id = RunId::new("est").unwrap();
        let builder = Run::builder(dir.path(), run_id, catalog, Arc::new(Host), target())
            .connections([ConnectionSpec::new(server())])
            .grant(PermissionGrant::none().allow_server(server()))
            .clock(|| 1_796_041_497);
        let builder = match estimator {
            Some(estimator) => builder.estimator(estimator),
            None => builder,
        };
        let mut run = builder.open().await.unwrap();
        let mut model = ScriptedModel::new([
            Step::call("svc__sleep", json!({"ms": 0, "tag": text})),
            Step::say("done"),
        ]);
        model.turn(&mut run, "Fetch it.").await.unwrap();
        let stored = run
            .history()
            .entries
            .iter()
            .find_map(|entry| match &entry.item {
                HistoryItem::Result(stored) => stored.estimate,
                _ => None,
            })
            .unwrap();
        let next = run.user("And now?").await.unwrap();
        let cost = run.surface().unwrap().server("svc").unwrap().cost;
        // Once in the call's arguments; a second time if the result is sent whole.
        (cost, stored, next.body().matches(&text).count() == 2)
    };

    // The same catalogue resolved by disclosure alone with each estimator.
    let catalog = Catalog::in_memory().unwrap();
    catalog
        .refresh(&server(), &Host.list_tools(&server()).await.unwrap())
        .unwrap();
    let connections = [ConnectionSpec::new(server())];
    let catalogs = [catalog.live(&server()).unwrap()];
    let grant = PermissionGrant::none().allow_server(server());
    let inputs = Inputs {
        connections: &connections,
        catalogs: &catalogs,
        grant: &grant,
    };
    let cost_with = |estimator: &dyn TokenEstimator| {
        psych_disclosure::resolve(&inputs, &Settings::default(), estimator)
            .unwrap()
            .server("svc")
            .unwrap()
            .cost
    };
    assert_ne!(cost_with(&PerByte), cost_with(&Estimator::new()));

    let (cost, stored, whole) = drive(None).await;
    assert_eq!(cost, cost_with(&Estimator::new()));
    assert_eq!(stored, Estimator::new().estimate_text(&text));
    assert!(whole, "the default estimator keeps the result whole");

    let (cost, stored, whole) = drive(Some(PerByte)).await;
    assert_eq!(cost, cost_with(&PerByte), "disclosure's cost");
    assert_eq!(stored, 20_000, "the log's stored estimate");
    assert!(!whole, "elision sized the result with it and elided it");
}

/// A server started only when a call needs it, as the executor sees one: not running until
/// its first start; a start lists [`Host`] into the catalogue (so a tool the kept listing
/// had and the host no longer has is gone), or fails with `why` when set. Counts starts.
struct Stopped {
    catalog: Catalog,
    running: std::sync::atomic::AtomicBool,
    starts: std::sync::atomic::AtomicUsize,
    why: Option<&'static str>,
    delay: Duration,
}

impl psych_runtime::OnDemand for Stopped {
    fn needs_start(&self, _: &ServerId) -> bool {
        !self.running.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn start<'a>(&'a self, server: &'a ServerId) -> psych_runtime::StartFuture<'a> {
        Box::pin(async move {
            self.starts
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            if let Some(why) = self.why {
                return Err(std::io::Error::other(why).into());
            }
            self.catalog
                .refresh(server, &Host.list_tools(server).await?)?;
            self.running
                .store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(self.catalog.live(server)?)
        })
    }

    fn state(&self, _: &ServerId, _: Option<&psych_types::ServerHealth>) -> Option<String> {
        Some(
            if self.needs_start(&server()) {
                "stopped"
            } else {
                "started"
            }
            .to_owned(),
        )
    }
}

/// A Run whose catalogue kept a listing of `svc` with a tool (`gone`) the server no longer
/// has, its server started on demand by `stopped`'s rules.
async fn open_stopped(
    dir: &std::path::Path,
    why: Option<&'static str>,
    delay: Duration,
) -> (Run<Host>, Arc<Stopped>) {
    let catalog = Catalog::in_memory().unwrap();
    let mut kept = Host.list_tools(&server()).await.unwrap();
    kept.push(ToolDefinition::new(
        ToolName::new("gone").unwrap(),
        "A tool the server had",
        serde_json::from_value(json!({"type": "object"})).unwrap(),
    ));
    catalog.refresh(&server(), &kept).unwrap();
    let stopped = Arc::new(Stopped {
        catalog: catalog.clone(),
        running: false.into(),
        starts: 0.into(),
        why,
        delay,
    });
    let run = over(dir, catalog)
        .on_demand(Arc::clone(&stopped) as Arc<dyn psych_runtime::OnDemand>)
        .open()
        .await
        .unwrap();
    (run, stopped)
}

/// Issue 30 in the runtime: a step's calls to a stopped server start it once, and are
/// guarded against the listing the start stored: the removed tool refused as removed, the
/// others forwarded; the next step starts nothing; the orientation says its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_stopped_server_start_it_once_and_meet_its_fresh_listing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut run, stopped) = open_stopped(dir.path(), None, Duration::ZERO).await;
    let mut model = ScriptedModel::new([
        Step::call("psych_orientation", json!({})),
        Step::call("svc__gone", json!({}))
            .and_call("svc__sleep", json!({"ms": 1, "tag": "one"}))
            .and_call("svc__sleep", json!({"ms": 1, "tag": "two"})),
        Step::call("svc__sleep", json!({"ms": 1, "tag": "three"}))
            .and_call("psych_orientation", json!({})),
        Step::say("done"),
    ]);
    model.turn(&mut run, "go").await.unwrap();
    let texts: Vec<String> = results(&run)
        .into_iter()
        .map(|(_, out)| out.readable_text().into_owned())
        .collect();
    assert!(texts[0].contains(r#""state": "stopped""#), "{}", texts[0]);
    assert_eq!(stopped.starts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(texts[1], "tool \"gone\" is not available on server svc");
    assert_eq!(&texts[2..4], ["one", "two"]);
    assert_eq!(texts[4], "three");
    assert!(texts[5].contains(r#""state": "started""#), "{}", texts[5]);
}

/// A connection removed mid-turn is not started for a call the turn's Surface still
/// offers (as a running server's call is refused, the removed one's is): removing a
/// connection revokes it at once, even for a stopped on-demand server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_removed_mid_turn_is_not_started_for_a_call() {
    let dir = tempfile::tempdir().unwrap();
    let (mut run, stopped) = open_stopped(dir.path(), None, Duration::ZERO).await;
    let mut model = ScriptedModel::new([
        Step::call("svc__sleep", json!({"ms": 1, "tag": "one"})),
        Step::say("done"),
    ]);
    let first = run.user("go").await.unwrap();
    run.remove_connection(&server());
    let Next::Request(_) = run.reply(model.reply(&first)).await.unwrap() else {
        panic!("the call is answered");
    };
    assert_eq!(stopped.starts.load(std::sync::atomic::Ordering::SeqCst), 0);
    let texts: Vec<String> = results(&run)
        .into_iter()
        .map(|(_, out)| out.readable_text().into_owned())
        .collect();
    assert_eq!(texts.len(), 1);
    assert_ne!(texts[0], "one", "the removed server's call was forwarded");
}

/// A server that cannot start answers each of its calls with why, and is tried again at
/// the next step; a step dropped while its server starts logs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_start_answers_why_each_time_it_is_called() {
    let dir = tempfile::tempdir().unwrap();
    let (mut run, stopped) = open_stopped(
        dir.path(),
        Some("licence server unreachable"),
        Duration::ZERO,
    )
    .await;
    let mut model = ScriptedModel::new([
        Step::call("svc__sleep", json!({"ms": 1, "tag": "one"})),
        Step::call("svc__sleep", json!({"ms": 1, "tag": "two"})),
        Step::say("done"),
    ]);
    model.turn(&mut run, "go").await.unwrap();
    let results = results(&run);
    assert_eq!(results.len(), 2);
    for (_, output) in &results {
        assert!(output.is_error());
        assert_eq!(
            output.readable_text(),
            "svc__sleep was not called: MCP server svc is started when a call needs it, and \
             it could not be started: licence server unreachable"
        );
    }
    assert_eq!(stopped.starts.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// Cancel safety: an execution dropped while its server starts has logged nothing, and the
/// next execution of the same calls starts it and answers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_dropped_while_its_server_starts_logs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (run, stopped) = open_stopped(dir.path(), None, Duration::from_millis(200)).await;
    let executor = psych_runtime::Executor::new(Arc::new(Host), Arc::clone(run.log().unwrap()))
        .on_demand(Arc::clone(&stopped) as Arc<dyn psych_runtime::OnDemand>);
    let catalogs = vec![stopped.catalog.live(&server()).unwrap()];
    let grant = PermissionGrant::none().allow_server(server());
    let inputs = psych_disclosure::Inputs {
        connections: &[ConnectionSpec::new(server())],
        catalogs: &catalogs,
        grant: &grant,
    };
    let surface = psych_disclosure::resolve(
        &inputs,
        &psych_disclosure::Settings::default(),
        &psych_elision::Estimator::new(),
    )
    .unwrap();
    let live = psych_disclosure::Live {
        grant: &grant,
        catalogs: &catalogs,
    };
    let calls = [ToolCall {
        id: ToolCallId::new("c1").unwrap(),
        name: "svc__sleep".into(),
        arguments: json!({"ms": 1, "tag": "late"}),
    }];
    let before = run.records(0).unwrap().len();
    let cut = tokio::time::timeout(
        Duration::from_millis(50),
        executor.execute(&surface, &live, &calls),
    )
    .await;
    assert!(cut.is_err(), "dropped while the server started");
    assert_eq!(run.records(0).unwrap().len(), before);
    let logged = executor.execute(&surface, &live, &calls).await.unwrap();
    assert_eq!(logged.len(), 1);
    assert_eq!(run.records(0).unwrap().len(), before + 1);
    assert_eq!(stopped.starts.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// What a Run must hold after any call: its history is the log's records (each result's
/// summary as the log stored it), its spent tokens the log's usage records, and every call
/// the log holds has exactly one result.
fn assert_the_run_is_its_log(run: &Run<Host>, context: &str) {
    let logged = run.records(0).unwrap();
    let estimator = psych_elision::Estimator::new();
    assert!(
        run.history() == &psych_types::History::from_records(&logged, Some(&estimator)),
        "{context}: the history is not the log's"
    );
    assert_eq!(
        run.spent(),
        psych_runtime::spent(&logged),
        "{context}: spent is not the log's"
    );
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for logged in &logged {
        match &logged.record {
            Record::Assistant(AssistantMessage { tool_calls, .. }) => {
                calls.extend(tool_calls.iter().map(|call| call.id.as_str().to_owned()));
            }
            Record::ToolResult(result) => results.push(result.call_id.as_str().to_owned()),
            _ => {}
        }
    }
    calls.sort();
    results.sort();
    assert_eq!(calls, results, "{context}: not one result per call");
}

/// Runs `call` to its end, or drops it at `point`: an even point after `point / 2 + 1`
/// polls, each followed by a yield (so the blocking pool moves on between them: the drops
/// land inside and between the appends and reads a call hands it), an odd one after
/// `2 × point²` microseconds.
async fn cut_at<T>(point: u64, call: impl std::future::Future<Output = T>) -> Option<T> {
    use std::task::Poll;
    if point % 2 == 1 {
        let after = Duration::from_micros(2 * point * point);
        return tokio::time::timeout(after, call).await.ok();
    }
    let mut call = std::pin::pin!(call);
    for _ in 0..=point / 2 {
        let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
        if let Poll::Ready(out) = polled {
            return Some(out);
        }
        tokio::task::yield_now().await;
    }
    None
}

/// `user`, `reply` and `request` dropped at many points (a caller's timeout or `select!`),
/// the call after a dropped one too: what they logged stays logged, and the next call reads
/// the Run back as its log says (the history, the spent tokens), closing the calls a
/// dropped reply left without a result, so the next request carries every call with its
/// one result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_at_any_point_leaves_the_run_as_its_log_says() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = open_with(dir.path(), Duration::from_secs(20)).await;
    let mut model = ScriptedModel::new(std::iter::empty());
    let mut dropped = 0;
    for point in 0..80u64 {
        let request = run.user(format!("turn {point}")).await.unwrap();
        let step = Step::call(
            "svc__sleep",
            json!({"ms": point % 3, "tag": format!("t{point}")}),
        )
        .and_call("svc__sleep", json!({"ms": 0, "tag": "second"}));
        let mut script = ScriptedModel::new([step]).first_call(point * 10);
        let reply = script.reply(&request);
        match cut_at(point, run.reply(reply)).await {
            Some(next) => assert!(matches!(next.unwrap(), Next::Request(_))),
            None => dropped += 1,
        }
        // The call after it dropped too (its recovery from the first drop included).
        if cut_at(point / 2, run.request()).await.is_none() {
            dropped += 1;
        }
        let continued = run.request().await.unwrap();
        assert_the_run_is_its_log(&run, &format!("reply dropped at {point}"));
        assert!(continued.body().contains(&format!("turn {point}")));
        // A turn's first call dropped; the next request carries its message only if it was
        // logged.
        if cut_at(point, run.user(format!("again {point}")))
            .await
            .is_none()
        {
            dropped += 1;
        }
        run.request().await.unwrap();
        assert_the_run_is_its_log(&run, &format!("user dropped at {point}"));
        // The turn ends, so the next `user` is in turn.
        let reply = model.reply(&run.request().await.unwrap());
        assert!(matches!(run.reply(reply).await.unwrap(), Next::Done { .. }));
        assert_the_run_is_its_log(&run, "after a whole step");
    }
    assert!(dropped > 0, "no call was dropped");
}
