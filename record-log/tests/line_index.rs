//! The line index a tool result stores with it (`docs/format.md`, "Metadata"): a log
//! written before it existed still opens and reads, its results marked from their start,
//! while results appended now are marked within a stride of the line.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::path::Path;

use crate::common::{run, text_result};
use psych_record_log::{RecordLog, SharedRecordLog, SyncPolicy};
use psych_types::{LineMark, RecordHandle, RecordSource, count_line_breaks};

/// Written by the build before the line index (commit cfdae35): record 0 a user message,
/// record 1 `fixture_text()` as a text result, the preallocated zeros cut off after the
/// end mark.
const FIXTURE: &str = "tests/fixtures/before-line-index.plog";

/// The text of the fixture's tool result: 3,000 lines, 151,563 bytes (more than the
/// 128 KiB stride, so a build with the index stores one for it).
fn fixture_text() -> String {
    (1..=3000)
        .map(|i| {
            format!(
                "{i:05} build step {i} compiled crate-{:03} in {} ms\n",
                i % 97,
                (i * 37) % 1000
            )
        })
        .collect()
}

/// The byte offset where line `line` (0-based) of `text` starts.
fn line_start(text: &str, line: u64) -> u64 {
    if line == 0 {
        return 0;
    }
    memchr::memchr_iter(b'\n', text.as_bytes())
        .nth(line as usize - 1)
        .map_or(text.len() as u64, |at| at as u64 + 1)
}

fn read_all(log: &impl RecordSource, handle: &RecordHandle, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    assert_eq!(log.read_output(handle, 0, &mut buf).unwrap(), buf.len());
    buf
}

/// Copies the fixture into `dir` under its Run's file name.
fn install_fixture(dir: &Path) {
    let run = run("before-line-index");
    std::fs::copy(FIXTURE, RecordLog::path_for(dir, &run)).unwrap();
}

#[test]
fn a_log_written_before_the_line_index_reads_and_its_results_are_marked_from_the_start() {
    let text = fixture_text();
    assert_eq!(text.len(), 151_563);
    let dir = tempfile::tempdir().unwrap();
    install_fixture(dir.path());
    let run = run("before-line-index");
    let (mut log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(recovery.records, 2);
    let old = log.handle(1).unwrap();
    let info = log.output_info(&old).unwrap().unwrap();
    assert_eq!(info.len, text.len() as u64);
    assert_eq!(read_all(&log, &old, info.len), text.as_bytes());
    for line in [0, 1, 2000, 2999, 3000, 5000] {
        assert_eq!(
            log.line_mark(&old, line).unwrap(),
            LineMark::START,
            "{line}"
        );
    }

    // The same text appended by this build: marked within a stride before each line.
    let new = log.append(&text_result(&text)).unwrap();
    let check_new = |log: &dyn Fn(u64) -> LineMark| {
        for line in [1, 2000, 2597, 2598, 2999, 3000, 5000] {
            let mark = log(line);
            let start = line_start(&text, line);
            assert!(
                mark.at <= start && start - mark.at <= 128 << 10,
                "{line}: {mark:?}"
            );
            assert_eq!(
                mark.breaks_before,
                count_line_breaks(&text.as_bytes()[..mark.at as usize])
            );
            assert!(mark.breaks_before < line);
        }
        assert_eq!(
            log(2999),
            LineMark {
                at: 128 << 10,
                breaks_before: 2597
            }
        );
    };
    check_new(&|line| log.line_mark(&new, line).unwrap());
    assert_eq!(log.line_mark(&new, 0).unwrap(), LineMark::START);
    assert_eq!(log.line_mark(&old, 2999).unwrap(), LineMark::START);
    drop(log);

    // Reopened, shared: the old result still from the start, the new one from its index.
    let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    let shared = SharedRecordLog::new(log);
    assert_eq!(shared.line_mark(&old, 2999).unwrap(), LineMark::START);
    check_new(&|line| shared.line_mark(&new, line).unwrap());
    // A user message, a record of another Run, a record never written: the start.
    let user = RecordHandle::new(run.clone(), 0);
    let foreign = RecordHandle::new(common::run("other"), 2);
    let unwritten = RecordHandle::new(run.clone(), 9);
    for handle in [user, foreign, unwritten] {
        assert_eq!(shared.line_mark(&handle, 2999).unwrap(), LineMark::START);
    }
    drop(shared);

    // Read-only, as `psych read` opens it: the same.
    let (log, _) = RecordLog::open_read_only(dir.path(), &run).unwrap();
    assert_eq!(log.line_mark(&old, 2999).unwrap(), LineMark::START);
    check_new(&|line| log.line_mark(&new, line).unwrap());
}
