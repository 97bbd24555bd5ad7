//! The usage learned pinning reads: which remote tools the recent Runs of a folder of
//! record logs reached.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use psych_disclosure::pinning::ToolUsage;
use psych_record_log::RecordLog;
use psych_types::RunId;

/// The usage of the `recent` most recently written Runs whose logs (`<run>.plog`) are in
/// `dirs`, taken together, `skip` left out (the Run about to open, resumed): each log's
/// history read without result contents ([`ToolUsage::add_history`]).
///
/// Blocking (directory listings and log reads): call it off the async workers. ToolUsage is
/// advice, so a log that does not open or read (removed meanwhile, damaged) is left out,
/// and a folder that does not exist has none; the answer says how many were read.
pub fn usage_in_logs(dirs: &[PathBuf], recent: usize, skip: &[RunId]) -> ToolUsage {
    let mut logs: Vec<(SystemTime, PathBuf, RunId)> = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|ext| ext != "plog") {
                continue;
            }
            let Some(run) = path
                .file_stem()
                .and_then(|stem| stem.to_str())
                .and_then(|stem| RunId::new(stem).ok())
            else {
                continue;
            };
            if skip.contains(&run) {
                continue;
            }
            let written = entry
                .metadata()
                .and_then(|meta| meta.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            logs.push((written, path, run));
        }
    }
    // Newest first; ties by path, so the same folder gives the same Runs.
    logs.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut usage = ToolUsage::new();
    for (_, path, run) in logs.into_iter().take(recent) {
        let Some(dir) = path.parent() else {
            continue;
        };
        if let Some(history) = history_of(dir, &run) {
            usage.add_history(&history);
        }
    }
    usage
}

/// The history of `dir`'s log of `run`, if it opens and reads.
fn history_of(dir: &Path, run: &RunId) -> Option<psych_types::History> {
    let (log, _) = RecordLog::open_read_only(dir, run).ok()?;
    log.history().ok()
}

#[cfg(test)]
mod tests {
    use psych_record_log::SyncPolicy;
    use psych_types::{Record, ServerId, ToolCallId, ToolName, ToolOutput, ToolRef, ToolResult};

    use super::*;

    fn log(dir: &Path, run: &str, targets: &[&str]) {
        let run = RunId::new(run).unwrap();
        let (mut log, _) = RecordLog::open(dir, &run, SyncPolicy::EveryAppend).unwrap();
        for (i, tool) in targets.iter().enumerate() {
            log.append(&Record::ToolResult(ToolResult {
                call_id: ToolCallId::new(format!("c{i}")).unwrap(),
                name: "psych_call_tool".into(),
                output: ToolOutput::text("ok"),
                target: Some(ToolRef::new(
                    ServerId::new("s").unwrap(),
                    ToolName::new(*tool).unwrap(),
                )),
            }))
            .unwrap();
        }
        // One result Psych answered itself: no target, nothing counted.
        log.append(&Record::ToolResult(ToolResult {
            call_id: ToolCallId::new("read").unwrap(),
            name: "read_tool_output".into(),
            output: ToolOutput::text("ok"),
            target: None,
        }))
        .unwrap();
    }

    fn tool(name: &str) -> ToolRef {
        ToolRef::new(ServerId::new("s").unwrap(), ToolName::new(name).unwrap())
    }

    #[test]
    fn the_recent_runs_of_every_folder_are_counted_and_the_skipped_one_is_not() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        log(a.path(), "r1", &["x", "x", "y"]);
        log(a.path(), "r2", &["x"]);
        log(b.path(), "r3", &["y"]);
        std::fs::write(a.path().join("notes.txt"), "not a log").unwrap();
        std::fs::write(a.path().join("bad.plog"), "not a log either").unwrap();
        let dirs = [a.path().to_path_buf(), b.path().to_path_buf()];
        let missing = a.path().join("none");

        let usage = usage_in_logs(&dirs, 10, &[RunId::new("r2").unwrap()]);
        // r1 and r3 (and the damaged log, counted as nothing: it does not open).
        assert_eq!(usage.runs(), 2);
        assert_eq!(usage.of(&tool("x")).runs, 1);
        assert_eq!(usage.of(&tool("x")).calls, 2);
        assert_eq!(usage.of(&tool("y")).runs, 2);
        assert_eq!(usage_in_logs(&[missing], 10, &[]).runs(), 0);
        assert!(usage_in_logs(&dirs, 1, &[]).runs() <= 1);
    }
}
