//! Learned pinning's inputs and its one choosing path: which remote tools the recent Runs
//! of a folder of record logs reached, and the pins a set of connections gets from them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use psych_disclosure::pinning::{PinSettings, Pins, ToolUsage};
use psych_disclosure::{Inputs, Settings};
use psych_record_log::RecordLog;
use psych_types::{
    ConnectionSpec, PermissionGrant, RecordHandle, RunId, ServerCatalog, TokenEstimator, ToolRef,
};

use crate::RunError;

/// The usage of the `recent` most recently written Runs whose logs (`<run>.plog`) are in
/// `dirs`, taken together, `skip` left out (the Run about to open): each tool result's
/// metadata read with one positional read, one at a time (no content, no history held:
/// memory is one count per tool whatever a log's length).
///
/// Blocking (directory listings and log reads): call it off the async workers. Usage is
/// advice, so a log that does not open or read (removed meanwhile, damaged) is passed over
/// for the next most recent one, and a folder that does not exist has none;
/// [`ToolUsage::runs`] says how many were read.
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
    for (_, path, run) in logs {
        if usage.runs() >= recent as u64 {
            break;
        }
        if let Some(calls) = path.parent().and_then(|dir| targets_of(dir, &run)) {
            usage.add_counted_run(calls);
        }
    }
    usage
}

/// How many results of `dir`'s log of `run` reached each remote tool, if the log opens and
/// every result's metadata reads.
fn targets_of(dir: &Path, run: &RunId) -> Option<BTreeMap<ToolRef, u64>> {
    let (log, _) = RecordLog::open_read_only(dir, run).ok()?;
    let mut calls: BTreeMap<ToolRef, u64> = BTreeMap::new();
    for seq in 0..log.len() {
        let stored = log
            .stored_result(&RecordHandle::new(run.clone(), seq))
            .ok()?;
        if let Some(target) = stored.and_then(|stored| stored.target) {
            *calls.entry(target).or_default() += 1;
        }
    }
    Some(calls)
}

/// The pins `connections` get from `usage`: the Surface they resolve to with `catalogs`
/// (their live catalogues, read once by the caller), `grant` and `settings`, without
/// learned pins, then [`psych_disclosure::pinning::choose`] on it with the same catalogues.
///
/// CPU work (resolution): off the async workers. The one choosing path of a Run
/// ([`RunBuilder::learned_pinning`](crate::RunBuilder::learned_pinning)) and of `psych
/// serve`.
///
/// # Errors
///
/// Disclosure's [`ResolveError`](psych_disclosure::ResolveError) when it refuses the
/// inputs.
pub fn choose_pins(
    catalogs: &[ServerCatalog],
    connections: &[ConnectionSpec],
    grant: &PermissionGrant,
    settings: &Settings,
    estimator: &dyn TokenEstimator,
    usage: &ToolUsage,
    pinning: &PinSettings,
) -> Result<Pins, psych_disclosure::ResolveError> {
    let inputs = Inputs {
        connections,
        catalogs,
        grant,
    };
    let surface = psych_disclosure::resolve(&inputs, settings, estimator)?;
    Ok(psych_disclosure::pinning::choose(
        usage, &surface, catalogs, estimator, pinning,
    ))
}

/// What a Run fixes when it first opens ([`Run`](crate::Run)'s `settle`), kept beside its
/// log so that a resume keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Opened {
    /// The learned pins, when the Run was opened with learned pinning.
    #[serde(default)]
    pub(crate) pins: Option<Pins>,
    /// The output-limit hints its servers' catalogues declared, in tokens.
    #[serde(default)]
    pub(crate) hints: Vec<(psych_types::ToolRef, u64)>,
}

impl Opened {
    /// Whether there is nothing to keep.
    pub(crate) fn is_empty(&self) -> bool {
        self.pins.is_none() && self.hints.is_empty()
    }
}

/// Where it is kept: `<dir>/<run>.opened.json`, beside the Run's log.
pub(crate) fn opened_path(dir: &Path, run: &RunId) -> PathBuf {
    dir.join(format!("{run}.opened.json"))
}

/// What was kept for a Run at `path`, if it has a file. Blocking.
pub(crate) fn kept_opened(path: &Path) -> Result<Option<Opened>, RunError> {
    let io = |source| RunError::Pins {
        path: path.to_owned(),
        source,
    };
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(e)),
    }
}

/// Keeps `opened` at `path`, whole or not at all (written aside, synced, renamed, the
/// folder synced; the folder is made if need be: a Run whose records are in a store has
/// no log there). Blocking.
pub(crate) fn keep_opened(path: &Path, opened: &Opened) -> Result<(), RunError> {
    let io = |source| RunError::Pins {
        path: path.to_owned(),
        source,
    };
    let bytes = serde_json::to_vec(opened)
        .map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io)?;
    crate::files::replace_file(path, &bytes).map_err(io)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use psych_record_log::SyncPolicy;
    use psych_types::{Record, ServerId, ToolCallId, ToolName, ToolOutput, ToolRef, ToolResult};

    use super::*;

    /// A log of `run` in `dir` whose calls reached `targets`, written `age` seconds ago.
    fn log(dir: &Path, run: &str, targets: &[&str], age: u64) {
        let run = RunId::new(run).unwrap();
        let (mut log, _) = RecordLog::open(dir, &run, SyncPolicy::EveryAppend).unwrap();
        for (i, tool) in targets.iter().enumerate() {
            log.append(&Record::ToolResult(ToolResult {
                call_id: ToolCallId::new(format!("c{i}")).unwrap(),
                name: "psych_call_tool".into(),
                output: ToolOutput::text("ok"),
                target: Some(tool_ref(tool)),
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
        drop(log);
        let written = SystemTime::now() - Duration::from_secs(age);
        std::fs::File::options()
            .write(true)
            .open(RecordLog::path_for(dir, &run))
            .unwrap()
            .set_modified(written)
            .unwrap();
    }

    fn tool_ref(name: &str) -> ToolRef {
        ToolRef::new(ServerId::new("s").unwrap(), ToolName::new(name).unwrap())
    }

    #[test]
    fn the_most_recent_readable_runs_of_every_folder_are_counted() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        log(a.path(), "r1", &["x", "x", "y"], 300);
        log(a.path(), "r2", &["x"], 200);
        log(b.path(), "r3", &["y"], 100);
        std::fs::write(a.path().join("notes.txt"), "not a log").unwrap();
        // The newest file of all, and no log: passed over for the next one.
        std::fs::write(a.path().join("bad.plog"), "not a log either").unwrap();
        let dirs = [a.path().to_path_buf(), b.path().to_path_buf()];

        let usage = usage_in_logs(&dirs, 10, &[RunId::new("r2").unwrap()]);
        assert_eq!(usage.runs(), 2);
        assert_eq!(usage.of(&tool_ref("x")).runs, 1);
        assert_eq!(usage.of(&tool_ref("x")).calls, 2);
        assert_eq!(usage.of(&tool_ref("y")).runs, 2);
        // The two most recent readable: r3 and r2, not r1.
        let recent = usage_in_logs(&dirs, 2, &[]);
        assert_eq!(recent.runs(), 2);
        assert_eq!(
            recent.of(&tool_ref("x")),
            psych_disclosure::pinning::ToolUse { runs: 1, calls: 1 }
        );
        assert_eq!(usage_in_logs(&[a.path().join("none")], 10, &[]).runs(), 0);
    }

    #[test]
    fn what_a_run_fixed_reads_back_and_a_missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunId::new("r").unwrap();
        // In a folder not made yet (a Run whose records are in a store).
        let path = opened_path(&dir.path().join("logs"), &run);
        assert!(kept_opened(&path).unwrap().is_none());
        let mut usage = ToolUsage::new();
        usage.add_run([&tool_ref("x")]);
        let pins = Pins {
            runs: 1,
            budget: 10,
            choices: vec![psych_disclosure::pinning::PinChoice {
                tool: tool_ref("x"),
                used: usage.of(&tool_ref("x")),
                tokens: Some(5),
                why: psych_disclosure::pinning::PinWhy::Pinned,
            }],
        };
        let opened = Opened {
            pins: Some(pins),
            hints: vec![(tool_ref("y"), 7)],
        };
        keep_opened(&path, &opened).unwrap();
        assert_eq!(kept_opened(&path).unwrap(), Some(opened));
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(kept_opened(&path), Err(RunError::Pins { .. })));
    }
}
