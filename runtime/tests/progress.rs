//! Progress through the executor: each forwarded call's sink reaches the host with that call
//! (two identical calls in one step keep their own reports), a call without a sink is made
//! plainly, and every sink is dropped by the time the step's results are logged.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use psych_catalog::Catalog;
use psych_disclosure::{Inputs, Live, Settings, resolve};
use psych_elision::Estimator;
use psych_record_log::{RecordLog, SharedRecordLog, SyncPolicy};
use psych_runtime::Executor;
use psych_types::{
    ConnectionSpec, JsonObject, PermissionGrant, ProgressSink, Record, RunId, ServerId, ToolCall,
    ToolCallId, ToolDefinition, ToolHost, ToolLister, ToolName, ToolOutput, ToolProgress, ToolRef,
};
use serde_json::json;
use tokio::sync::mpsc;

/// `report {steps}` reports `steps` times, each report naming the host call it belongs to
/// (`call N`), then answers with that name; without a sink it answers `plain`.
#[derive(Default)]
struct Host {
    calls: AtomicU64,
}

impl ToolLister for Host {
    type Error = std::io::Error;

    async fn list_tools(&self, _: &ServerId) -> Result<Vec<ToolDefinition>, Self::Error> {
        let schema = json!({"type": "object", "properties": {"steps": {"type": "integer"}}});
        Ok(vec![ToolDefinition::new(
            ToolName::new("report").unwrap(),
            "Reports progress steps times",
            serde_json::from_value(schema).unwrap(),
        )])
    }
}

impl ToolHost for Host {
    async fn call_tool(&self, _: &ToolRef, _: JsonObject) -> Result<ToolOutput, Self::Error> {
        Ok(ToolOutput::text("plain"))
    }

    async fn call_tool_with_progress(
        &self,
        _: &ToolRef,
        arguments: JsonObject,
        progress: ProgressSink,
    ) -> Result<ToolOutput, Self::Error> {
        let call = format!("call {}", self.calls.fetch_add(1, Ordering::SeqCst));
        let steps = arguments["steps"].as_u64().unwrap_or(1);
        for step in 1..=steps {
            // Let the other calls of the step run in between.
            tokio::task::yield_now().await;
            progress.report(ToolProgress::new(step as f64).with_message(Some(call.clone())));
        }
        Ok(ToolOutput::text(call))
    }
}

/// A sink sending each report's message to the returned channel.
fn sink() -> (ProgressSink, mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let sink = ProgressSink::new(move |p: ToolProgress| {
        let _ = tx.send(p.message.unwrap_or_default());
    });
    (sink, rx)
}

fn call(n: usize, name: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall {
        id: ToolCallId::new(format!("call_{n}")).unwrap(),
        name: name.to_owned(),
        arguments,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_forwarded_call_reports_to_its_own_sink_and_every_sink_is_dropped_at_the_end() {
    let server = ServerId::new("svc").unwrap();
    let host = Arc::new(Host::default());
    let catalog = Catalog::in_memory().unwrap();
    catalog
        .refresh(&server, &host.list_tools(&server).await.unwrap())
        .unwrap();
    let catalogs = vec![catalog.live(&server).unwrap()];
    let connections = vec![ConnectionSpec::new(server.clone())];
    let grant = PermissionGrant::none().allow_server(server);
    let inputs = Inputs {
        connections: &connections,
        catalogs: &catalogs,
        grant: &grant,
    };
    let surface = resolve(&inputs, &Settings::default(), &Estimator::new()).unwrap();
    let live = Live {
        grant: &grant,
        catalogs: &catalogs,
    };
    let dir = tempfile::tempdir().unwrap();
    let run = RunId::new("run-1").unwrap();
    let (log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::OsBuffered).unwrap();
    let executor = Executor::new(Arc::clone(&host), Arc::new(SharedRecordLog::new(log)));

    let steps = json!({"steps": 20});
    let calls = [
        call(1, "svc__report", steps.clone()),
        call(2, "svc__report", steps.clone()),
        call(3, "svc__report", steps.clone()),
        call(4, "svc__missing", json!({})),
    ];
    let (first, mut first_rx) = sink();
    let (second, mut second_rx) = sink();
    let (refused, mut refused_rx) = sink();
    let (extra, mut extra_rx) = sink();
    let logged = executor
        .execute_with_progress(
            &surface,
            &live,
            &calls,
            vec![Some(first), Some(second), None, Some(refused), Some(extra)],
        )
        .await
        .unwrap();

    let answers: Vec<String> = logged
        .iter()
        .map(|l| match &l.record {
            Record::ToolResult(r) => r.output.readable_text().into_owned(),
            other => panic!("a result: {other:?}"),
        })
        .collect();
    assert_eq!(answers[2], "plain", "a call without a sink is made plainly");
    for (index, rx) in [(0, &mut first_rx), (1, &mut second_rx)] {
        let mut reports = Vec::new();
        // Every sink is gone once the step is logged: the channel is closed and drained.
        while let Some(message) = rx.recv().await {
            reports.push(message);
        }
        assert_eq!(reports.len(), 20, "call {index}: {reports:?}");
        assert!(
            reports.iter().all(|m| *m == answers[index]),
            "call {index} gets the reports of its own host call ({}) only: {reports:?}",
            answers[index]
        );
    }
    assert_ne!(answers[0], answers[1], "two host calls");
    assert_eq!(
        refused_rx.recv().await,
        None,
        "a refused call reports nothing"
    );
    assert_eq!(
        extra_rx.recv().await,
        None,
        "a sink past the calls is dropped"
    );
}
