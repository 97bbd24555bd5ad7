//! A PostgreSQL restart under the store (`pg_ctlcluster … restart`, where this machine lets
//! the test run it: root, with the cluster serving the test database found by
//! `pg_lsclusters`; elsewhere every other connection to the database is terminated, and the
//! test says so in its output). Its own test binary, so no other test's connections are cut
//! (cargo runs test binaries one after another).
//!
//! A writer appends throughout: each append is acknowledged or fails as `Unavailable` (or,
//! when the commit's answer was lost and the database could not be asked, `InDoubt`), none
//! otherwise; after the restart the store goes on, every acknowledged record reads back,
//! handles stay dense, the catalogue refreshes again, and its change feed, reconnected,
//! wakes its watcher.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use psych_store_conformance::pg::{database, psql};
use psych_store_postgres::{PgBlocking, RecordError};
use psych_types::{
    CatalogStore, Record, RecordFailure, RecordHandle, RecordSource, RecordStore, RunId, ServerId,
    ToolCallId, ToolDefinition, ToolName, ToolOutput, ToolResult,
};

fn text_result(text: &str) -> Record {
    Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new("c").unwrap(),
        name: "read".into(),
        output: ToolOutput::text(text),
    })
}

/// Restarts the cluster serving the test database's port when this process may (root, and
/// `pg_lsclusters` names it); otherwise cuts every other connection to the database.
/// Returns what was done.
fn restart_database() -> String {
    let port = database()
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next().map(str::to_owned))
        .unwrap_or_else(|| "5432".to_owned());
    let cluster = Command::new("pg_lsclusters")
        .arg("--no-header")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    (fields.get(2) == Some(&port.as_str()))
                        .then(|| (fields[0].to_owned(), fields[1].to_owned()))
                })
        });
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0");
    match cluster {
        Some((version, name)) if root => {
            let status = Command::new("pg_ctlcluster")
                .args([&version, &name, "restart"])
                .status()
                .expect("pg_ctlcluster runs");
            assert!(status.success(), "pg_ctlcluster {version} {name} restart");
            format!("restarted cluster {version}/{name}")
        }
        _ => {
            psql(
                "select count(pg_terminate_backend(pid)) from pg_stat_activity \
                 where datname = current_database() and pid <> pg_backend_pid()",
            );
            "not root or no cluster found: terminated every other connection instead".to_owned()
        }
    }
}

#[test]
fn a_database_restart_is_unavailable_then_the_store_goes_on() {
    let schema = format!("t_restart_{}", std::process::id());
    psql(&format!("drop schema if exists {schema} cascade"));
    let store = PgBlocking::open(&format!("{}?schema={schema}", database())).unwrap();
    let run = RunId::new("restart").unwrap();
    let records = store.records("tenant", &run).unwrap();
    let catalog = store.catalog();
    let (woken, wakes) = std::sync::mpsc::channel();
    catalog.watch(Arc::new(move || {
        let _ = woken.send(());
    }));
    let server = ServerId::new("s").unwrap();
    let tools = |d: &str| {
        vec![ToolDefinition::new(
            ToolName::new("t").unwrap(),
            d,
            Default::default(),
        )]
    };
    catalog.refresh(&server, &tools("before")).unwrap();
    wakes
        .recv_timeout(Duration::from_secs(10))
        .expect("the feed listens");

    let stop = AtomicBool::new(false);
    let acked = AtomicUsize::new(0);
    let (acknowledged, failures, what) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut acknowledged = Vec::new();
            let mut failures = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::Acquire) {
                let text = format!("record {n}");
                match records.append(&text_result(&text)) {
                    Ok(handle) => {
                        acknowledged.push((handle.seq, text));
                        acked.fetch_add(1, Ordering::Release);
                    }
                    Err(error) => {
                        failures.push(format!("{:?}: {error}", records.failure(&error)));
                        let typed = records.failure(&error) == RecordFailure::Unavailable
                            || matches!(error, RecordError::InDoubt { .. });
                        assert!(typed, "a restart is Unavailable or InDoubt: {error:?}");
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                n += 1;
            }
            (acknowledged, failures)
        });
        std::thread::sleep(Duration::from_millis(300));
        let what = restart_database();
        // Until the writer is acknowledged again after the restart (10 more appends).
        let (restarted, before) = (Instant::now(), acked.load(Ordering::Acquire));
        while acked.load(Ordering::Acquire) < before + 10 {
            assert!(
                restarted.elapsed() < Duration::from_secs(60),
                "no append acknowledged within 60 s of the restart"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Release);
        let (acknowledged, failures) = writer.join().unwrap();
        (acknowledged, failures, what)
    });
    println!(
        "{what}: {} appends acknowledged, {} failed: {:?}",
        acknowledged.len(),
        failures.len(),
        failures.iter().take(3).collect::<Vec<_>>()
    );

    // Every acknowledged record reads back, and the next handle follows the last stored.
    let next = records.append(&text_result("after")).unwrap();
    assert!(acknowledged.iter().all(|(seq, _)| *seq < next.seq));
    for (seq, text) in &acknowledged {
        let handle = RecordHandle::new(run.clone(), *seq);
        assert_eq!(records.record(&handle).unwrap(), Some(text_result(text)));
    }
    for seq in 0..next.seq {
        let handle = RecordHandle::new(run.clone(), seq);
        assert!(records.record(&handle).unwrap().is_some(), "dense: {seq}");
    }
    let reopened = store.records("tenant", &run).unwrap();
    assert_eq!(reopened.len(), next.seq + 1);

    // The catalogue refreshes again, and its feed, reconnected, woke the watcher.
    let refreshed = catalog.refresh(&server, &tools("after")).unwrap();
    assert_eq!(refreshed.diff.changed.len(), 1);
    wakes
        .recv_timeout(Duration::from_secs(30))
        .expect("the reconnected feed wakes the watcher");
    drop((records, reopened, catalog, store));
    psql(&format!("drop schema if exists {schema} cascade"));
}
