//! `psych read` opens the log read-only: it reads a log another process holds open for
//! appending, and leaves a log with a torn tail exactly as it found it.

#![allow(clippy::unwrap_used, reason = "a test fails loudly on bad data")]

use std::process::Command;

use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{Record, RunId, ToolCallId, ToolOutput, ToolResult};

fn read(dir: &std::path::Path, handle: &str) -> (String, String, Option<i32>) {
    let out = Command::new(env!("CARGO_BIN_EXE_psych"))
        .args(["read", "run-3.plog", handle])
        .current_dir(dir)
        .output()
        .unwrap();
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
        out.status.code(),
    )
}

#[test]
fn read_serves_a_log_held_by_a_writer_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = RunId::new("run-3").unwrap();
    let (mut writer, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    let handle = writer
        .append(&Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new("call_1").unwrap(),
            name: "fetch_logs".into(),
            output: ToolOutput::text("first line\nsecond line\n"),
        }))
        .unwrap()
        .to_string();

    // The writer still holds the log (and its lock).
    let (stdout, stderr, code) = read(dir.path(), &handle);
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(stdout.contains("second line"), "{stdout}");

    // A torn frame after the last whole one: read serves the record and cuts nothing.
    let end = writer.size_bytes();
    drop(writer);
    let path = RecordLog::path_for(dir.path(), &run);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(usize::try_from(end).unwrap());
    bytes.extend_from_slice(b"PSRF torn frame bytes");
    std::fs::write(&path, &bytes).unwrap();
    let (stdout, stderr, code) = read(dir.path(), &handle);
    assert_eq!(code, Some(0), "stderr: {stderr}");
    assert!(stdout.contains("first line"), "{stdout}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}
