//! The store on the real fixture catalogues: refresh diffs, history, health, reopening, the
//! layout check, the storage bound of unchanged refreshes, and readers racing a writer.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use crate::common;

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use psych_catalog::{Catalog, CatalogError, Diff, OpenError};
use psych_types::{CatalogVersion, Reachability, ServerId, SyncFailure, SyncStamp, ToolDefinition};

fn server(name: &str) -> ServerId {
    ServerId::new(name).unwrap()
}

/// A catalogue whose clock reads 1000, 2000, 3000, … one step per reading.
fn ticking() -> Catalog {
    let tick = Arc::new(AtomicU64::new(0));
    Catalog::builder()
        .clock(move || (tick.fetch_add(1, Ordering::Relaxed) + 1) * 1000)
        .in_memory()
        .unwrap()
}

fn names(tools: &[ToolDefinition]) -> Vec<&str> {
    tools.iter().map(|t| t.name.as_str()).collect()
}

fn sorted(mut tools: Vec<ToolDefinition>) -> Vec<ToolDefinition> {
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    tools
}

fn render(diff: &Diff) -> String {
    let list = |names: &[psych_types::ToolName]| {
        names
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(",")
    };
    format!(
        "+{} ~{} -{} ={} | added [{}] changed [{}] removed [{}]",
        diff.added.len(),
        diff.changed.len(),
        diff.removed.len(),
        diff.unchanged.len(),
        list(&diff.added),
        list(&diff.changed),
        list(&diff.removed),
    )
}

/// A scripted history of one server, built from the playwright catalogue: every refresh's
/// version and diff, then the stats, then the diff between each pair of versions.
#[test]
fn a_history_of_refreshes_reads_back_at_every_version() {
    let catalog = ticking();
    let fs = server("playwright");
    let full = common::catalogue("playwright.tools.json");
    let mut changed = full.clone();
    changed[3].description = Some("A new description.".into());
    let steps: Vec<(&str, Vec<ToolDefinition>)> = vec![
        ("first sync", full[..20].to_vec()),
        ("identical", full[..20].to_vec()),
        ("five added", full.clone()),
        ("one changed", changed.clone()),
        ("two removed", changed[2..].to_vec()),
        ("empty", Vec::new()),
        ("back after empty", changed[2..].to_vec()),
        ("identical again", changed[2..].to_vec()),
    ];
    let mut out = String::new();
    let mut versions = Vec::new();
    for (label, tools) in &steps {
        let refresh = catalog.refresh(&fs, tools).unwrap();
        writeln!(
            out,
            "{label}: {} {}",
            refresh.version,
            render(&refresh.diff)
        )
        .unwrap();
        let live = catalog.live(&fs).unwrap();
        assert_eq!(
            *live.tools,
            sorted(tools.clone()),
            "{label}: live is the list"
        );
        assert_eq!(live.version, refresh.version);
        versions.push((refresh.version, sorted(tools.clone())));
    }
    // Every version reads as it was.
    for (version, tools) in &versions {
        assert_eq!(
            &catalog.tools_at(&fs, *version).unwrap(),
            tools,
            "{version}"
        );
    }
    let stats = catalog.stats().unwrap();
    writeln!(
        out,
        "rows {} live {} servers {} version {}",
        stats.rows, stats.live_rows, stats.servers, stats.version
    )
    .unwrap();
    for (a, b) in [(1, 2), (2, 3), (1, 5), (5, 1), (3, 5), (0, 5), (2, 2)] {
        let diff = catalog
            .diff(&fs, CatalogVersion(a), CatalogVersion(b))
            .unwrap();
        writeln!(out, "diff v{a}..v{b}: {}", render(&diff)).unwrap();
    }
    insta::assert_snapshot!("history", out);
}

#[test]
fn unchanged_refreshes_write_no_rows_and_keep_the_version() {
    let catalog = ticking();
    let gh = server("github");
    let tools = common::catalogue("github.tools.json");
    let first = catalog.refresh(&gh, &tools).unwrap();
    assert_eq!(first.version, CatalogVersion(1));
    assert_eq!(first.diff.added.len(), 117);
    let rows = catalog.stats().unwrap().rows;
    // The same tools in another order are the same list.
    let mut reversed = tools.clone();
    reversed.reverse();
    for _ in 0..5 {
        let again = catalog.refresh(&gh, &reversed).unwrap();
        assert!(again.diff.is_empty());
        assert_eq!(again.version, CatalogVersion(1));
        assert_eq!(again.diff.unchanged.len(), 117);
    }
    let stats = catalog.stats().unwrap();
    assert_eq!((stats.rows, stats.version), (rows, CatalogVersion(1)));
    // The sync stamp moved; its version did not.
    let health = catalog.health(&gh).unwrap();
    let stamp = health.last_sync.unwrap();
    assert_eq!(stamp.version, CatalogVersion(1));
    assert!(stamp.at > 1000, "the stamp moves with each sync: {stamp:?}");
}

#[test]
fn failures_keep_the_tools_and_show_in_health_until_the_next_sync() {
    let catalog = ticking();
    let mem = server("memory");
    let tools = common::catalogue("server-memory.tools.json");
    catalog.refresh(&mem, &tools).unwrap();
    catalog
        .record_failure(&mem, "tools/list timed out")
        .unwrap();
    let live = catalog.live(&mem).unwrap();
    assert_eq!(live.tools.len(), 9, "a failure never empties a server");
    assert_eq!(
        live.health.last_sync,
        Some(SyncStamp {
            version: CatalogVersion(1),
            at: 1000
        })
    );
    assert_eq!(
        live.health.last_error,
        Some(SyncFailure {
            at: 2000,
            message: "tools/list timed out".into()
        })
    );
    catalog.refresh(&mem, &tools).unwrap();
    assert_eq!(catalog.health(&mem).unwrap().last_error, None);

    // A duplicate name refuses the listing whole.
    let mut twice = tools.clone();
    twice.push(tools[0].clone());
    let err = catalog.refresh(&mem, &twice).unwrap_err();
    assert!(
        matches!(&err, CatalogError::DuplicateTool { name, .. } if name == &tools[0].name),
        "{err}"
    );
    assert_eq!(catalog.live(&mem).unwrap().tools.len(), 9);
}

#[test]
fn every_known_server_is_listed_with_its_state() {
    let catalog = ticking();
    let (fs, down, never) = (server("fs"), server("down"), server("never-listed"));
    catalog
        .refresh(&fs, &common::catalogue("server-filesystem.tools.json"))
        .unwrap();
    catalog.record_failure(&down, "connection refused").unwrap();
    catalog.set_reachability(
        &down,
        Reachability::Unreachable {
            reason: "exited with status 1".into(),
        },
    );
    catalog.set_reachability(&never, Reachability::Reachable);
    let all = catalog.live_all().unwrap();
    let summary: Vec<(String, usize, bool, Reachability)> = all
        .iter()
        .map(|s| {
            (
                s.server.to_string(),
                s.tools.len(),
                s.health.last_error.is_some(),
                s.health.reachability.clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "down".into(),
                0,
                true,
                Reachability::Unreachable {
                    reason: "exited with status 1".into()
                }
            ),
            ("fs".into(), 14, false, Reachability::Unknown),
            ("never-listed".into(), 0, false, Reachability::Reachable),
        ]
    );
    assert_eq!(
        catalog.servers().unwrap(),
        vec![down.clone(), fs.clone(), never.clone()]
    );
}

#[test]
fn servers_do_not_see_each_others_tools() {
    let catalog = ticking();
    // Names collide across real servers (`search_code` is in github and elsewhere).
    let (a, b) = (server("a"), server("a-b"));
    let gh = common::catalogue("github.tools.json");
    catalog.refresh(&a, &gh[..10]).unwrap();
    catalog.refresh(&b, &gh[5..15]).unwrap();
    catalog.refresh(&a, &[]).unwrap();
    assert!(catalog.live(&a).unwrap().tools.is_empty());
    assert_eq!(
        names(&catalog.live(&b).unwrap().tools),
        names(&sorted(gh[5..15].to_vec()))
    );
}

#[test]
fn a_version_not_reached_yet_is_an_error() {
    let catalog = ticking();
    let s = server("s");
    catalog
        .refresh(&s, &common::catalogue("server-memory.tools.json"))
        .unwrap();
    let err = catalog.tools_at(&s, CatalogVersion(2)).unwrap_err();
    assert!(
        matches!(err, CatalogError::VersionAhead { asked, current }
            if asked == CatalogVersion(2) && current == CatalogVersion(1)),
        "{err}"
    );
    assert!(
        catalog
            .diff(&s, CatalogVersion(0), CatalogVersion(9))
            .is_err()
    );
    assert!(catalog.tools_at(&s, CatalogVersion(0)).unwrap().is_empty());
}

#[test]
fn versions_and_tools_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("catalog.redb");
    let s = server("notion");
    let tools = common::catalogue("notion.tools.json");
    {
        let catalog = Catalog::open(&path).unwrap();
        catalog.refresh(&s, &tools[..10]).unwrap();
        catalog.refresh(&s, &tools).unwrap();
    }
    let catalog = Catalog::open(&path).unwrap();
    assert_eq!(catalog.version().unwrap(), CatalogVersion(2));
    assert_eq!(*catalog.live(&s).unwrap().tools, sorted(tools.clone()));
    assert_eq!(
        catalog.tools_at(&s, CatalogVersion(1)).unwrap(),
        sorted(tools[..10].to_vec())
    );
    let next = catalog.refresh(&s, &tools[1..]).unwrap();
    assert_eq!(next.version, CatalogVersion(3), "versions keep growing");
}

#[test]
fn a_newer_layout_or_a_foreign_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("catalog.redb");
    drop(Catalog::open(&path).unwrap());
    {
        // A later build wrote layout 2.
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(redb::TableDefinition::<&str, u64>::new("meta"))
            .unwrap()
            .insert("layout", 2)
            .unwrap();
        txn.commit().unwrap();
    }
    let err = Catalog::open(&path).unwrap_err();
    assert!(
        matches!(&err, OpenError::NewerLayout { found: 2, supported: 1, path: p } if p == &path),
        "{err}"
    );
    assert!(err.to_string().contains("catalog.redb"), "{err}");

    // A redb file of something else.
    let other = dir.path().join("other.redb");
    {
        let db = redb::Database::create(&other).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(redb::TableDefinition::<u64, u64>::new("records"))
            .unwrap()
            .insert(1, 1)
            .unwrap();
        txn.commit().unwrap();
    }
    let err = Catalog::open(&other).unwrap_err();
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err}");

    // Not a redb file at all.
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello, this is not a database".repeat(200)).unwrap();
    let err = Catalog::open(&text).unwrap_err();
    assert!(matches!(err, OpenError::Storage { .. }), "{err}");
}

#[test]
fn a_second_open_in_the_same_process_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held.redb");
    let _held = Catalog::open(&path).unwrap();
    let err = Catalog::open(&path).unwrap_err();
    assert!(
        matches!(&err, OpenError::Locked { path: p } if p == &path),
        "{err}"
    );
}

/// The storage bound: unchanged refreshes write only the server's sync row, and redb reuses
/// the pages each commit frees, so the file stays within a few pages of its size after the
/// first refresh (measured: no growth at all over 10,000, `cargo bench -p psych-catalog`).
#[test]
fn unchanged_refreshes_do_not_grow_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("catalog.redb");
    let catalog = Catalog::open(&path).unwrap();
    let s = server("big");
    let tools = common::tools(500);
    catalog.refresh(&s, &tools).unwrap();
    // A couple of refreshes to let redb's free lists settle into their steady state.
    for _ in 0..3 {
        catalog.refresh(&s, &tools).unwrap();
    }
    let after_first = std::fs::metadata(&path).unwrap().len();
    // 150 here, to keep a debug test run short; the benchmark runs the 10,000.
    for _ in 0..150 {
        assert!(catalog.refresh(&s, &tools).unwrap().diff.is_empty());
    }
    let after = std::fs::metadata(&path).unwrap().len();
    let pages = after.saturating_sub(after_first).div_ceil(4096);
    assert!(
        pages <= 4,
        "grew {pages} pages: {after_first} -> {after} bytes"
    );
}

/// Readers run while a writer alternates a server between two real catalogues: every read
/// is one whole list, never a mix, it is the list of the version it reports (through the
/// cache of decoded sets too), and versions only grow.
#[test]
fn readers_never_see_half_a_refresh() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Catalog::open(dir.path().join("catalog.redb")).unwrap();
    let s = server("flip");
    let a = sorted(common::catalogue("github.tools.json"));
    let b = sorted(common::catalogue("notion.tools.json"));
    catalog.refresh(&s, &a).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (catalog, s, a, b, done) = (
                catalog.clone(),
                s.clone(),
                a.clone(),
                b.clone(),
                Arc::clone(&done),
            );
            std::thread::spawn(move || {
                let mut reads = 0u32;
                let mut last = CatalogVersion(0);
                while !done.load(Ordering::Relaxed) || reads < 10 {
                    let live = catalog.live(&s).unwrap();
                    assert!(
                        *live.tools == a || *live.tools == b,
                        "a half refresh was seen"
                    );
                    // Odd versions hold `a`, even ones `b`: the tools are those of the
                    // version read (a cached set is never paired with another version).
                    let expected = if live.version.0 % 2 == 1 { &a } else { &b };
                    assert!(*live.tools == **expected, "tools of another version");
                    assert!(live.version >= last, "versions went back");
                    last = live.version;
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for i in 0..40 {
        catalog
            .refresh(&s, if i % 2 == 0 { &b } else { &a })
            .unwrap();
    }
    done.store(true, Ordering::Relaxed);
    for reader in readers {
        assert!(reader.join().unwrap() >= 10);
    }
    assert_eq!(catalog.version().unwrap(), CatalogVersion(41));
}
