//! A Run whose records are in PostgreSQL (`RunBuilder::records_in`, the machine's
//! PostgreSQL, a schema of the test's own): a worker runs a turn whose result is elided
//! behind a handle; another worker (another store, as on another machine) opens the same
//! Run of the same identity, finds its history, reads the handle and goes on, and a call
//! left unanswered is closed as interrupted in the store; another identity's Run of the
//! same name is a Run of its own.

use std::sync::Arc;

use psych_catalog::Catalog;
use psych_runtime::{INTERRUPTED, Run, ScriptedModel, Step};
use psych_store_conformance::pg::Schema;
use psych_store_postgres::PgBlocking;
use psych_types::{
    AssistantMessage, ConnectionSpec, JsonObject, PermissionGrant, Record, RecordStore,
    RecordStores, RunId, ServerId, ToolCall, ToolCallId, ToolDefinition, ToolHost, ToolLister,
    ToolName, ToolOutput, ToolRef, UserMessage,
};
use serde_json::json;

/// `big` answers 200 kB of numbered lines.
struct Host;

impl ToolLister for Host {
    type Error = std::io::Error;

    async fn list_tools(&self, _: &ServerId) -> Result<Vec<ToolDefinition>, Self::Error> {
        let schema = serde_json::from_value(json!({"type": "object"})).unwrap();
        Ok(vec![ToolDefinition::new(
            ToolName::new("big").unwrap(),
            "Answers 200 kB of numbered lines",
            schema,
        )])
    }
}

impl ToolHost for Host {
    async fn call_tool(&self, _: &ToolRef, _: JsonObject) -> Result<ToolOutput, Self::Error> {
        Ok(ToolOutput::text(lines()))
    }
}

fn lines() -> String {
    (0..4_000)
        .map(|i| format!("line {i:06}: the quick brown fox jumps over the lazy dog\n"))
        .collect()
}

fn server() -> ServerId {
    ServerId::new("svc").unwrap()
}

/// A worker's Run `run` of `identity` on its own connection to the store.
async fn open(url: &str, identity: &str, run: &str) -> Run<Host> {
    let url = url.to_owned();
    let stores: Arc<dyn RecordStores> = Arc::new(
        tokio::task::spawn_blocking(move || PgBlocking::open(&url).unwrap())
            .await
            .unwrap(),
    );
    let catalog = Catalog::in_memory().unwrap();
    catalog
        .refresh(&server(), &Host.list_tools(&server()).await.unwrap())
        .unwrap();
    let options = psych_prompt_assembly::AnthropicOptions::new("claude-sonnet-4-5", 4096);
    let scratch = std::env::temp_dir().join("psych-runtime-store-unused");
    Run::builder(
        scratch,
        RunId::new(run).unwrap(),
        catalog,
        Arc::new(Host),
        psych_runtime::Target::Anthropic(options),
    )
    .records_in(stores, identity)
    .connections([ConnectionSpec::new(server())])
    .grant(PermissionGrant::none().allow_server(server()))
    .clock(|| 1_796_041_497)
    .open()
    .await
    .unwrap()
}

/// The results of `run`, read whole from its store: (call id, text).
fn results(run: &Run<Host>) -> Vec<(String, String)> {
    run.records(0)
        .unwrap()
        .into_iter()
        .filter_map(|logged| match logged.record {
            Record::ToolResult(r) => {
                Some((r.call_id.to_string(), r.output.readable_text().into_owned()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_in_postgres_resumes_on_another_worker_with_its_handles() {
    let schema = Schema::fresh("runtime_store");
    let url = schema.url();

    // Worker one: a turn whose result is too large to show whole.
    let mut first = open(&url, "team-a", "run-pg").await;
    assert!(first.log().is_none(), "no record log file");
    let mut model = ScriptedModel::new([Step::call("svc__big", json!({})), Step::say("seen")]);
    let transcript = model.turn(&mut first, "read the logs").await.unwrap();
    assert_eq!(transcript.text, "seen");
    let logged = first.records(0).unwrap();
    let handle = logged
        .iter()
        .find(|l| matches!(l.record, Record::ToolResult(_)))
        .map(|l| l.handle.to_string())
        .unwrap();
    let count = logged.len();
    drop(first);

    // Worker two, its own store connection: the same Run resumes with its history, and the
    // model reads the handle the first worker minted.
    let mut second = open(&url, "team-a", "run-pg").await;
    assert_eq!(second.recovery().records, count as u64);
    assert_eq!(second.records(0).unwrap(), logged);
    let mut model = ScriptedModel::new([
        Step::call(
            "read_tool_output",
            json!({"handle": handle, "grep": "line 001234:"}),
        ),
        Step::say("found it"),
    ])
    .first_call(10);
    let transcript = model.turn(&mut second, "find line 1234").await.unwrap();
    assert_eq!(transcript.text, "found it");
    // Behind the new turn's boundary, the first turn's result is a preview with its handle.
    let body = transcript.requests[0].body();
    assert!(
        body.contains(&handle),
        "the result is elided behind {handle}"
    );
    assert!(!body.contains("line 002000:"), "not sent whole");
    let read = results(&second).pop().unwrap().1;
    assert!(read.contains("line 001234: the quick brown fox"), "{read}");

    // A call left without a result (a worker killed mid-step) is answered as interrupted
    // by the next worker, in the store.
    let store = second.store().clone();
    drop(second);
    tokio::task::spawn_blocking(move || {
        store
            .append(&Record::User(UserMessage {
                text: "again".into(),
            }))
            .unwrap();
        store
            .append(&Record::Assistant(AssistantMessage {
                text: String::new(),
                tool_calls: vec![ToolCall {
                    id: ToolCallId::new("lost").unwrap(),
                    name: "svc__big".into(),
                    arguments: json!({}),
                }],
            }))
            .unwrap();
    })
    .await
    .unwrap();
    let mut third = open(&url, "team-a", "run-pg").await;
    third.request().await.unwrap();
    let (call, text) = results(&third).pop().unwrap();
    assert_eq!((call.as_str(), text.as_str()), ("lost", INTERRUPTED));

    // Another identity's Run of the same name is empty: a Run of its own.
    let other = open(&url, "team-b", "run-pg").await;
    assert!(other.records(0).unwrap().is_empty());
}
