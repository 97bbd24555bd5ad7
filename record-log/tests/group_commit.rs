//! Group commit through `SharedRecordLog`: concurrent appenders each get a handle that reads
//! back identical after reopening, handles follow file order, and the window's bounds hold
//! (`max_records` caps a group, `max_bytes` too, a lone appender waits about `max_wait` and
//! no longer, a full window closes at once). Policies out of bounds are refused on open.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use psych_record_log::{MAX_GROUP_WAIT, RecordLog, SharedRecordLog, SyncPolicy};
use psych_types::{Record, RecordHandle, RecordSource, ToolOutput};

/// Record `i` of thread `t`: distinct per thread and position, of varied size and kind.
fn tagged(t: usize, i: usize) -> Record {
    let body = format!("t{t} i{i} ") + &"x".repeat((t * 131 + i * 17) % 3000);
    match (t + i) % 3 {
        0 => common::user(&body),
        1 => common::result(&format!("call_{t}_{i}"), ToolOutput::text(body)),
        _ => common::result(&format!("call_{t}_{i}"), common::with_binary(body)),
    }
}

/// The `(t, i)` of a [`tagged`] record, from the start of its text.
fn tag_of(record: &Record) -> (usize, usize) {
    let bytes = match record {
        Record::User(user) => user.text.clone().into_bytes(),
        Record::ToolResult(result) => psych_types::readable_bytes(&result.output).into_owned(),
        Record::Assistant(_) | Record::Usage(_) => panic!("not a tagged record"),
    };
    let text = String::from_utf8(bytes).unwrap();
    let mut parts = text.split(' ');
    let t = parts
        .next()
        .unwrap()
        .strip_prefix('t')
        .unwrap()
        .parse()
        .unwrap();
    let i = parts
        .next()
        .unwrap()
        .strip_prefix('i')
        .unwrap()
        .parse()
        .unwrap();
    (t, i)
}

/// Starts `threads` appenders at once on `log`; each appends `per_thread` records (one
/// call each, or `append_batch` of two every fifth time) and returns its handles and
/// records in the order it appended them.
fn run_appenders(
    log: &Arc<SharedRecordLog>,
    threads: usize,
    per_thread: usize,
) -> Vec<Vec<(RecordHandle, Record)>> {
    let barrier = Arc::new(Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (log, barrier) = (Arc::clone(log), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let mut mine = Vec::new();
                let mut i = 0;
                while i < per_thread {
                    if i % 5 == 4 && i + 1 < per_thread {
                        let batch = [tagged(t, i), tagged(t, i + 1)];
                        let handles = log.append_batch(&batch).unwrap();
                        assert_eq!(handles[1].seq, handles[0].seq + 1, "a batch is contiguous");
                        mine.extend(handles.into_iter().zip(batch));
                        i += 2;
                    } else {
                        let record = tagged(t, i);
                        mine.push((log.append(&record).unwrap(), record));
                        i += 1;
                    }
                }
                mine
            })
        })
        .collect();
    workers.into_iter().map(|w| w.join().unwrap()).collect()
}

#[test]
fn concurrent_appends_read_back_identical_after_reopen() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let run = common::run("shared");
    let policy = common::group_commit(Duration::from_millis(2), 16, 1 << 20);
    let (log, _) = SharedRecordLog::open(dir.path(), &run, policy).unwrap();
    let log = Arc::new(log);
    // A reader going on meanwhile sees only whole, acknowledged records.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (log, stop, run) = (Arc::clone(&log), Arc::clone(&stop), run.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let len = log.len();
                if len > 0 {
                    let handle = RecordHandle::new(run.clone(), len - 1);
                    let record = log.record(&handle).unwrap().expect("an indexed record");
                    let (t, i) = tag_of(&record);
                    assert_eq!(record, tagged(t, i), "{handle} read back changed");
                    reads += 1;
                }
                let unissued = RecordHandle::new(run.clone(), log.len() + 1000);
                assert_eq!(log.record(&unissued).unwrap(), None);
            }
            reads
        })
    };
    let acknowledged = run_appenders(&log, THREADS, PER_THREAD);
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0, "the reader never saw a record");

    let total = (THREADS * PER_THREAD) as u64;
    let stats = log.stats();
    assert_eq!(stats.records, total, "{stats:?}");
    assert!(stats.largest_group <= 16, "{stats:?}");
    assert!(
        stats.groups < total,
        "concurrent appends never shared a sync: {stats:?}"
    );
    let mut seqs: Vec<u64> = acknowledged.iter().flatten().map(|(h, _)| h.seq).collect();
    for mine in &acknowledged {
        assert!(
            mine.windows(2).all(|w| w[0].0.seq < w[1].0.seq),
            "one thread's appends are in file order"
        );
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (0..total).collect::<Vec<_>>(), "every position once");
    // Readable through the shared log while it is open.
    for (handle, record) in acknowledged.iter().flatten() {
        assert_eq!(log.record(handle).unwrap().as_ref(), Some(record));
    }
    drop(log);

    let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    assert_eq!(log.len(), total);
    for (handle, record) in acknowledged.iter().flatten() {
        assert_eq!(
            log.record(handle).unwrap().as_ref(),
            Some(record),
            "{handle}"
        );
    }
}

#[test]
fn max_records_caps_every_group() {
    const THREADS: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    // A long window: only the size bound can close a group early.
    let policy = common::group_commit(Duration::from_millis(300), 3, u64::MAX);
    let (log, _) = SharedRecordLog::open(dir.path(), &common::run("cap"), policy).unwrap();
    let log = Arc::new(log);
    run_appenders(&log, THREADS, 3);
    let stats = log.stats();
    assert_eq!(stats.records, (THREADS * 3) as u64);
    assert!(stats.largest_group <= 3, "{stats:?}");
    assert!(stats.groups >= (THREADS * 3 / 3) as u64, "{stats:?}");
    // With twelve threads queued behind each leader, groups do fill up to the cap.
    assert!(stats.largest_group > 1, "{stats:?}");
}

#[test]
fn max_bytes_caps_a_group() {
    const THREADS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    // Each frame is well over 1000 bytes and under 2000: two never fit in one group.
    let policy = common::group_commit(Duration::from_millis(50), 100, 2000);
    let (log, _) = SharedRecordLog::open(dir.path(), &common::run("bytes"), policy).unwrap();
    let log = Arc::new(log);
    let barrier = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (log, barrier) = (Arc::clone(&log), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                log.append(&common::text_result(&"b".repeat(1200 + t)))
                    .unwrap()
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let stats = log.stats();
    assert_eq!(
        (stats.groups, stats.largest_group),
        (THREADS as u64, 1),
        "{stats:?}"
    );
}

#[test]
fn a_lone_appender_waits_about_max_wait() {
    let dir = tempfile::tempdir().unwrap();
    let max_wait = Duration::from_millis(60);
    let policy = common::group_commit(max_wait, 64, u64::MAX);
    let (log, _) = SharedRecordLog::open(dir.path(), &common::run("lone"), policy).unwrap();
    for i in 0..3 {
        let started = Instant::now();
        log.append(&common::user(&format!("alone {i}"))).unwrap();
        assert!(started.elapsed() >= max_wait, "closed early");
    }
    // It kept each window open for company, then went alone once the wait was over: the
    // window's own time, not the disk's sync, which a loaded machine may stretch (a
    // generous half second for a thread's wake-up).
    let stats = log.stats();
    assert_eq!((stats.groups, stats.full_groups), (3, 0), "{stats:?}");
    assert!(stats.longest_window >= max_wait, "{stats:?}");
    assert!(
        stats.longest_window < max_wait + Duration::from_millis(500),
        "{stats:?}"
    );
}

#[test]
fn a_full_window_does_not_wait() {
    let dir = tempfile::tempdir().unwrap();
    // The longest wait allowed, but one record fills the group.
    let policy = common::group_commit(MAX_GROUP_WAIT, 1, u64::MAX);
    let (log, _) = SharedRecordLog::open(dir.path(), &common::run("full"), policy).unwrap();
    for i in 0..5 {
        log.append(&common::user(&format!("r{i}"))).unwrap();
    }
    // Each window closed full, at once: none waited for company (whatever the syncs took).
    let stats = log.stats();
    assert_eq!((stats.groups, stats.full_groups), (5, 5), "{stats:?}");
    assert!(stats.longest_window < MAX_GROUP_WAIT / 2, "{stats:?}");
}

#[test]
fn every_append_and_buffered_policies_work_shared() {
    for policy in [SyncPolicy::EveryAppend, SyncPolicy::OsBuffered] {
        let dir = tempfile::tempdir().unwrap();
        let run = common::run("other");
        let (log, _) = SharedRecordLog::open(dir.path(), &run, policy).unwrap();
        let log = Arc::new(log);
        let acknowledged = run_appenders(&log, 4, 10);
        if policy == SyncPolicy::EveryAppend {
            // Each call alone: single records and batches of two.
            assert!(log.stats().largest_group <= 2, "{:?}", log.stats());
        }
        log.sync().unwrap();
        let log = Arc::into_inner(log).unwrap().into_inner();
        drop(log);
        let (log, _) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend).unwrap();
        assert_eq!(log.len(), 40);
        for (handle, record) in acknowledged.iter().flatten() {
            assert_eq!(log.record(handle).unwrap().as_ref(), Some(record));
        }
    }
}
