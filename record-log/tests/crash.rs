//! A writer killed with SIGKILL mid-append, again and again: every handle it acknowledged
//! reads back identical, and the log always reopens. Once with one writer thread
//! (`RecordLog`, per-append fsync and buffered), once with several threads sharing a
//! `SharedRecordLog` under group commit.
//!
//! Each test re-executes its own binary (`std::env::current_exe()`) with
//! `PSYCH_RECORD_LOG_CHILD` set to a directory: in that mode the same test function appends
//! records forever and prints `ack <handle> …` after each acknowledged one. The parent kills
//! it after a random short delay, reopens the log and checks.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use psych_record_log::{RecordLog, SharedRecordLog, SyncPolicy};
use psych_types::{RecordHandle, RecordSource};

const CHILD_ENV: &str = "PSYCH_RECORD_LOG_CHILD";
const POLICY_ENV: &str = "PSYCH_RECORD_LOG_CHILD_POLICY";
const ROUND_ENV: &str = "PSYCH_RECORD_LOG_CHILD_ROUND";
const TEST_NAME: &str = "a_killed_writer_loses_no_acknowledged_record";
const GROUP_TEST_NAME: &str = "killed_group_committers_lose_no_acknowledged_record";
/// `name`'s path in this test binary, as `--exact` matches it: the module path without the
/// crate's name (the file is a module of the crate's one integration-test binary).
fn test_path(name: &str) -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_owned(),
    }
}
/// Appender threads of the group-commit child.
const GROUP_THREADS: u64 = 4;

/// Child mode: append numbered records until killed, acknowledging each on stdout.
fn child(dir: &str) -> ! {
    let policy = match std::env::var(POLICY_ENV).as_deref() {
        Ok("buffered") => SyncPolicy::OsBuffered,
        _ => SyncPolicy::EveryAppend,
    };
    let (mut log, _) = RecordLog::open(dir, &common::run("crash"), policy).unwrap();
    let mut out = std::io::stdout().lock();
    // libtest's "test … " has no newline yet: start on a line of our own.
    writeln!(out, "\nready").unwrap();
    out.flush().unwrap();
    loop {
        let seq = log.len();
        let handles = if seq % 5 == 4 {
            let batch: Vec<_> = (seq..seq + 3).map(common::numbered).collect();
            log.append_batch(&batch).unwrap()
        } else {
            vec![log.append(&common::numbered(seq)).unwrap()]
        };
        for handle in handles {
            writeln!(out, "ack {handle}").unwrap();
        }
        out.flush().unwrap();
    }
}

/// Waits for the child's `ready`, lets it append for `delay`, kills it (SIGKILL) and returns
/// the whole lines it printed after `ready`. A child that dies before `ready` fails the test
/// with its exit status and what it wrote to `stderr` (a file, so a chatty child never
/// blocks on a full pipe).
fn kill_after(mut child: Child, delay: Duration, stderr: &std::path::Path) -> String {
    // The delay counts from the child's log being open, so the kill lands in appends.
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while line.trim_end() != "ready" {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            let status = child.wait().unwrap();
            let said = std::fs::read_to_string(stderr).unwrap_or_default();
            panic!("the child died before opening ({status}); its stderr:\n{said}");
        }
    }
    std::thread::sleep(delay);
    child.kill().unwrap();
    child.wait().unwrap();
    let mut stdout = Vec::new();
    reader.read_to_end(&mut stdout).unwrap();
    let mut stdout = String::from_utf8(stdout).unwrap();
    // Only whole lines count: the piece after the last newline was cut by the kill.
    stdout.truncate(stdout.rfind('\n').map_or(0, |at| at + 1));
    stdout
}

/// A small xorshift, seeded from the clock: the delays differ from run to run.
fn delays(seed: u64) -> impl Iterator<Item = Duration> {
    let mut state = seed | 1;
    std::iter::repeat_with(move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        Duration::from_micros(200 + state % 60_000)
    })
}

#[test]
fn a_killed_writer_loses_no_acknowledged_record() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
    let dir = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let stderr = scratch.path().join("child.stderr");
    let run = common::run("crash");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("delay seed {seed}");
    let mut acknowledged: Vec<RecordHandle> = Vec::new();
    let mut torn = 0;
    let mut expected = Vec::new();
    let started = Instant::now();
    for (round, delay) in delays(seed).enumerate().take(30) {
        let policy = if round % 2 == 0 { "fsync" } else { "buffered" };
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                test_path(TEST_NAME).as_str(),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .env(POLICY_ENV, policy)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let stdout = kill_after(child, delay, &stderr);
        let before = acknowledged.len();
        for line in stdout.lines() {
            if let Some(handle) = line.strip_prefix("ack ") {
                acknowledged.push(handle.parse().unwrap());
            }
        }
        eprintln!(
            "round {round} ({policy}, {delay:?}): {} acknowledged",
            acknowledged.len() - before
        );

        let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend)
            .unwrap_or_else(|err| panic!("round {round}: reopen failed: {err}"));
        if let Some(tail) = &recovery.tail {
            torn += 1;
            assert!(tail.bytes > 0 && !tail.left_in_place, "{tail}");
        }
        assert!(
            log.len() >= acknowledged.len() as u64,
            "round {round}: {} records on disk, {} acknowledged",
            log.len(),
            acknowledged.len()
        );
        expected.extend((expected.len() as u64..log.len()).map(common::numbered));
        for (i, handle) in acknowledged.iter().enumerate() {
            assert_eq!(handle.seq, i as u64, "handles are issued in order");
            let record = log.record(handle).unwrap();
            assert_eq!(
                record.as_ref(),
                Some(&expected[i]),
                "round {round}: {handle}"
            );
        }
        // Records beyond the acknowledged ones (written, not yet acknowledged) are whole too.
        for seq in acknowledged.len() as u64..log.len() {
            let handle = log.handle(seq).unwrap();
            assert_eq!(
                log.record(&handle).unwrap().as_ref(),
                Some(&expected[seq as usize])
            );
        }
        // Continue from what is on disk: the next child appends after it.
        acknowledged.extend((acknowledged.len() as u64..log.len()).map(|s| log.handle(s).unwrap()));
        drop(log);
    }
    eprintln!(
        "{} records acknowledged over 30 kills, {torn} torn tails cut, {:?}",
        acknowledged.len(),
        started.elapsed()
    );
    assert!(!acknowledged.is_empty(), "the children never got to append");
}

/// Group-commit child mode: `GROUP_THREADS` threads share one log and append
/// [`common::tagged`] records forever, each printing `ack <handle> <thread> <i>` once its
/// append is acknowledged.
fn group_child(dir: &str) -> ! {
    let round: u64 = std::env::var(ROUND_ENV).unwrap().parse().unwrap();
    let policy = common::group_commit(Duration::from_millis(1), 8, 1 << 20);
    let (log, _) = SharedRecordLog::open(dir, &common::run("group"), policy).unwrap();
    let log = Arc::new(log);
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "\nready").unwrap();
        out.flush().unwrap();
    }
    let threads: Vec<_> = (0..GROUP_THREADS)
        .map(|thread| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for i in 0.. {
                    let handle = log.append(&common::tagged(round, thread, i)).unwrap();
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "ack {handle} {thread} {i}").unwrap();
                    out.flush().unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    unreachable!("the appenders never stop")
}

#[test]
fn killed_group_committers_lose_no_acknowledged_record() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        group_child(&dir);
    }
    let dir = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let stderr = scratch.path().join("child.stderr");
    let run = common::run("group");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("delay seed {seed}");
    let (mut total_acked, mut torn, mut records_before) = (0, 0, 0u64);
    for (round, delay) in delays(seed).enumerate().take(12) {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                test_path(GROUP_TEST_NAME).as_str(),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .env(ROUND_ENV, round.to_string())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let stdout = kill_after(child, delay, &stderr);
        // (thread, i) -> handle, for this round's acknowledged appends.
        let mut acked = BTreeMap::new();
        for line in stdout.lines() {
            let Some(rest) = line.strip_prefix("ack ") else {
                continue;
            };
            let fields: Vec<&str> = rest.split(' ').collect();
            let handle: RecordHandle = fields[0].parse().unwrap();
            let key: (u64, u64) = (fields[1].parse().unwrap(), fields[2].parse().unwrap());
            assert!(acked.insert(key, handle).is_none(), "acknowledged twice");
        }

        let (log, recovery) = RecordLog::open(dir.path(), &run, SyncPolicy::EveryAppend)
            .unwrap_or_else(|err| panic!("round {round}: reopen failed: {err}"));
        if let Some(tail) = &recovery.tail {
            torn += 1;
            assert!(tail.bytes > 0 && !tail.left_in_place, "{tail}");
        }
        // Every record this round left on disk, acknowledged or not, is whole and is some
        // thread's next append: each thread's records appear in its own order, no gaps.
        let mut next_i = vec![0u64; GROUP_THREADS as usize];
        let mut on_disk = BTreeMap::new();
        for seq in records_before..log.len() {
            let handle = log.handle(seq).unwrap();
            let record = log.record(&handle).unwrap().unwrap();
            let (r, thread, i) = common::tag_of(&record)
                .unwrap_or_else(|| panic!("round {round}: {handle} is not a tagged record"));
            assert_eq!(r, round as u64, "{handle} belongs to round {r}");
            assert_eq!(
                record,
                common::tagged(r, thread, i),
                "{handle} reads back changed"
            );
            assert_eq!(
                i, next_i[thread as usize],
                "thread {thread}'s appends out of order"
            );
            next_i[thread as usize] += 1;
            on_disk.insert((thread, i), handle);
        }
        for (key, handle) in &acked {
            assert_eq!(
                on_disk.get(key),
                Some(handle),
                "round {round}: acknowledged {key:?} at {handle} is not there"
            );
        }
        eprintln!(
            "round {round} ({delay:?}): {} acknowledged, {} on disk",
            acked.len(),
            log.len() - records_before
        );
        total_acked += acked.len();
        records_before = log.len();
    }
    eprintln!(
        "{total_acked} group-committed records acknowledged over 12 kills, {torn} torn tails cut"
    );
    assert!(total_acked > 0, "the children never got to append");
}
