//! A writer killed with SIGKILL mid-append, again and again: every handle it acknowledged
//! reads back identical, and the log always reopens.
//!
//! The test re-executes its own binary (`std::env::current_exe()`) with
//! `PSYCH_RECORD_LOG_CHILD` set to a directory: in that mode the same test function appends
//! [`common::numbered`] records forever and prints `ack <handle>` after each acknowledged
//! one. The parent kills it after a random short delay, reopens the log and checks.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{RecordHandle, RecordSource};

const CHILD_ENV: &str = "PSYCH_RECORD_LOG_CHILD";
const POLICY_ENV: &str = "PSYCH_RECORD_LOG_CHILD_POLICY";
const TEST_NAME: &str = "a_killed_writer_loses_no_acknowledged_record";

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
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .env(POLICY_ENV, policy)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The delay counts from the child's log being open, so the kill lands in appends.
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while line.trim_end() != "ready" {
            line.clear();
            assert!(
                reader.read_line(&mut line).unwrap() > 0,
                "the child died before opening"
            );
        }
        std::thread::sleep(delay);
        child.kill().unwrap();
        child.wait().unwrap();
        let mut stdout = Vec::new();
        reader.read_to_end(&mut stdout).unwrap();
        let stdout = String::from_utf8(stdout).unwrap();
        // Only whole lines count: the piece after the last newline was cut by the kill.
        let mut lines: Vec<&str> = stdout.split('\n').collect();
        lines.pop();
        let before = acknowledged.len();
        for line in lines {
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
            assert!(tail.bytes > 0 && !tail.reason.is_empty());
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
