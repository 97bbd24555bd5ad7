//! `read_tool_output` through an [`Archive`]: a handle of an earlier Run the archive holds is
//! read from that Run's log, one it says is gone is a failed result saying why, and one it
//! does not know stays `invalid_deferred_handle`, as it is without an archive.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::path::PathBuf;
use std::sync::Arc;

use psych_disclosure::{Inputs, Live, Settings, resolve};
use psych_elision::Estimator;
use psych_record_log::{RecordLog, SharedRecordLog, SyncPolicy};
use psych_runtime::{Archive, Archived, ExecuteError, Executor};
use psych_types::{
    JsonObject, PermissionGrant, Record, RecordHandle, RunId, ServerId, ToolCall, ToolCallId,
    ToolDefinition, ToolHost, ToolLister, ToolOutput, ToolRef, ToolResult,
};
use serde_json::json;

/// A host with no tools: every call here is a read.
struct Nothing;

impl ToolLister for Nothing {
    type Error = std::io::Error;

    async fn list_tools(&self, _: &ServerId) -> Result<Vec<ToolDefinition>, Self::Error> {
        Ok(Vec::new())
    }
}

impl ToolHost for Nothing {
    async fn call_tool(&self, _: &ToolRef, _: JsonObject) -> Result<ToolOutput, Self::Error> {
        Ok(ToolOutput::text("unused"))
    }
}

/// Keeps the logs of `dir` for the Run `kept`, and says `gone` is gone.
struct Dir {
    dir: PathBuf,
    kept: RunId,
    gone: RunId,
}

impl Archive for Dir {
    fn find(&self, handle: &RecordHandle) -> Archived {
        if handle.run == self.kept {
            match RecordLog::open_read_only(&self.dir, &handle.run) {
                Ok((log, _)) => Archived::Log(Arc::new(log)),
                Err(error) => Archived::Failed(error),
            }
        } else if handle.run == self.gone {
            Archived::Gone {
                why: format!("handle {handle} expired"),
            }
        } else {
            Archived::Unknown
        }
    }
}

/// A Run `run` in `dir` whose one record is a tool result of `text`: its handle.
fn logged_earlier(dir: &std::path::Path, run: &RunId, text: &str) -> RecordHandle {
    let (mut log, _) = RecordLog::open(dir, run, SyncPolicy::OsBuffered).unwrap();
    log.append(&Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new("call_0").unwrap(),
        name: "fetch".into(),
        output: ToolOutput::text(text),
    }))
    .unwrap()
}

/// The Surface of no server: every call here is Psych's own.
fn no_servers(grant: &PermissionGrant) -> psych_disclosure::Surface {
    let inputs = Inputs {
        connections: &[],
        catalogs: &[],
        grant,
    };
    resolve(&inputs, &Settings::default(), &Estimator::new()).unwrap()
}

fn read(handle: &str) -> ToolCall {
    ToolCall {
        id: ToolCallId::new("call_1").unwrap(),
        name: "read_tool_output".to_owned(),
        arguments: json!({"handle": handle, "grep": "needle"}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_of_an_earlier_run_is_read_from_the_archive_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let earlier = RunId::new("earlier").unwrap();
    let handle = logged_earlier(dir.path(), &earlier, "hay\nhay\nthe needle\nhay\n");

    let grant = PermissionGrant::none();
    let surface = no_servers(&grant);
    let live = Live {
        grant: &grant,
        catalogs: &[],
    };
    let now = RunId::new("now").unwrap();
    let open_now = || {
        let (log, _) = RecordLog::open(dir.path(), &now, SyncPolicy::OsBuffered).unwrap();
        Arc::new(SharedRecordLog::new(log))
    };

    // Without an archive, another Run's handle is refused.
    let plain = Executor::new(Arc::new(Nothing), open_now());
    let refused = plain
        .execute(&surface, &live, &[read(&handle.to_string())])
        .await
        .unwrap_err();
    assert!(matches!(refused, ExecuteError::InvalidDeferredHandle(_)));
    drop(plain);

    let archive = Dir {
        dir: dir.path().to_path_buf(),
        kept: earlier.clone(),
        gone: RunId::new("swept").unwrap(),
    };
    let executor = Executor::new(Arc::new(Nothing), open_now()).archive(Arc::new(archive));

    let logged = executor
        .execute(&surface, &live, &[read(&handle.to_string())])
        .await
        .unwrap();
    let Record::ToolResult(result) = &logged[0].record else {
        panic!("a result")
    };
    assert!(!result.output.is_error(), "{result:?}");
    assert!(
        result.output.readable_text().contains("3\tthe needle"),
        "{}",
        result.output.readable_text()
    );

    let logged = executor
        .execute(&surface, &live, &[read("swept:0")])
        .await
        .unwrap();
    let Record::ToolResult(result) = &logged[0].record else {
        panic!("a result")
    };
    assert!(result.output.is_error());
    assert_eq!(result.output.readable_text(), "handle swept:0 expired");

    let unknown = executor
        .execute(&surface, &live, &[read("never:0")])
        .await
        .unwrap_err();
    assert!(matches!(unknown, ExecuteError::InvalidDeferredHandle(_)));
}

/// Result references go through the archive as reads do: an earlier Run's result is read
/// (the call then goes on to the guard, which refuses this Surface's unknown tool), a gone
/// Run's is a failed result saying it expired, an unknown Run's is
/// `invalid_deferred_handle`. Cancel safety: an execution dropped at any point logs
/// nothing half and nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_references_read_through_the_archive_and_a_dropped_one_logs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let earlier = RunId::new("earlier").unwrap();
    let handle = logged_earlier(dir.path(), &earlier, &"x".repeat(1 << 20));
    let grant = PermissionGrant::none();
    let surface = no_servers(&grant);
    let live = Live {
        grant: &grant,
        catalogs: &[],
    };
    let (log, _) = RecordLog::open(
        dir.path(),
        &RunId::new("now").unwrap(),
        SyncPolicy::OsBuffered,
    )
    .unwrap();
    let log = Arc::new(SharedRecordLog::new(log));
    let archive = Dir {
        dir: dir.path().to_path_buf(),
        kept: earlier.clone(),
        gone: RunId::new("swept").unwrap(),
    };
    // A budget of two executions' bounds: every reservation a dropped execution made comes
    // back, once the reads it started have ended.
    let budget = psych_runtime::PassingBudget::new(2 * psych_reader_tool::DEFAULT_MAX_PASSED_BYTES);
    let executor = Executor::new(Arc::new(Nothing), Arc::clone(&log))
        .archive(Arc::new(archive))
        .passing_budget(budget.clone());
    let passing = |handle: &str| ToolCall {
        id: ToolCallId::new("call_1").unwrap(),
        name: "svc__write".to_owned(),
        arguments: json!({"text": {"$psych_result": handle}}),
    };
    let text = |logged: &[psych_types::LoggedRecord]| match &logged[0].record {
        Record::ToolResult(result) => result.output.readable_text().into_owned(),
        other => panic!("a result, not {other:?}"),
    };

    let read = executor
        .execute(&surface, &live, &[passing(&handle.to_string())])
        .await
        .unwrap();
    assert!(!text(&read).contains("expired"), "{}", text(&read));
    let gone = executor
        .execute(&surface, &live, &[passing("swept:0")])
        .await
        .unwrap();
    assert!(
        text(&gone).contains("nothing was sent") && text(&gone).contains("handle swept:0 expired"),
        "{}",
        text(&gone)
    );
    let unknown = executor
        .execute(&surface, &live, &[passing("never:0")])
        .await
        .unwrap_err();
    assert!(matches!(unknown, ExecuteError::InvalidDeferredHandle(_)));

    // Dropped at points spread over the read of the 1 MiB result and the call after it:
    // nothing forwarded or logged half. A drop once the result is handed to the log (its
    // append runs on the blocking pool and finishes) leaves that one whole result; the
    // next execution goes on as ever.
    let mut before = log.len();
    for micros in [0, 10, 50, 100, 200, 400, 800, 1_600, 3_200] {
        let cut = tokio::time::timeout(
            std::time::Duration::from_micros(micros),
            executor.execute(&surface, &live, &[passing(&handle.to_string())]),
        )
        .await;
        // An append the dropped execution handed to the blocking pool has run.
        executor.settled().await;
        let after = log.len();
        assert!(
            after == before || after == before + 1,
            "dropped at {micros} µs"
        );
        if after == before + 1 {
            let last = log.iter_from(before).last().unwrap().unwrap();
            let Record::ToolResult(result) = last.record else {
                panic!("a result")
            };
            assert_eq!(result.call_id.as_str(), "call_1");
        }
        if let Ok(done) = cut {
            assert_eq!(done.unwrap().len(), 1);
        }
        let waited = std::time::Instant::now();
        while budget.available() < budget.bytes() && waited.elapsed().as_secs() < 10 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(budget.available(), budget.bytes(), "dropped at {micros} µs");
        before = after;
    }
    let logged = executor
        .execute(&surface, &live, &[passing(&handle.to_string())])
        .await
        .unwrap();
    assert_eq!(logged.len(), 1);
    assert_eq!(log.len(), before + 1);
}
