//! Real second processes: a catalogue held by another process is a typed error naming the
//! file, and a process killed in the middle of refreshes leaves a file whose live set is one
//! whole listing and whose every version still reads.
//!
//! The test binary re-executes itself as the other process (`PSYCH_CATALOG_CHILD`), so it
//! has its own `main` (`harness = false` in `Cargo.toml`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use psych_catalog::{Catalog, OpenError};
use psych_types::{CatalogVersion, ServerId, ToolDefinition};

const CHILD: &str = "PSYCH_CATALOG_CHILD";

fn server() -> ServerId {
    ServerId::new("churn").unwrap()
}

/// The two listings the churning child alternates between: 2,000 tools, then the first
/// 1,000 of them with new descriptions (so every refresh rewrites or retires every tool).
fn lists() -> (Vec<ToolDefinition>, Vec<ToolDefinition>) {
    let mut a = common::tools(2_000);
    a.sort_by(|x, y| x.name.cmp(&y.name));
    let b = a[..1_000]
        .iter()
        .map(|t| {
            let mut t = t.clone();
            t.description = Some(format!("{} (rewritten)", t.description_or_empty()));
            t
        })
        .collect();
    (a, b)
}

fn spawn(mode: &str, path: &Path) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD, mode)
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdout)
}

fn wait_for_line(stdout: &mut BufReader<std::process::ChildStdout>, expected: &str) {
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), expected, "the child said {line:?}");
}

fn a_second_process_gets_a_typed_error_naming_the_file(dir: &Path) {
    let path = dir.join("held.redb");
    let (mut child, mut stdout) = spawn("hold", &path);
    wait_for_line(&mut stdout, "holding");
    let err = Catalog::open(&path).unwrap_err();
    assert!(
        matches!(&err, OpenError::Locked { path: p } if p == &path),
        "{err:?}"
    );
    assert!(err.to_string().contains("held.redb"), "{err}");
    // Once the holder exits, the file opens.
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let catalog = Catalog::open(&path).unwrap();
    assert_eq!(catalog.live(&server()).unwrap().tools.len(), 9);
    println!("a_second_process_gets_a_typed_error_naming_the_file ... ok");
}

fn a_kill_mid_refresh_leaves_whole_listings(dir: &Path) {
    let (a, b) = lists();
    // Round r kills the child r commits after its first, a moment into the next refresh
    // (each takes well over the moment: thousands of rows and an fsync).
    for (round, wait_ms) in [5u64, 20, 40].into_iter().enumerate() {
        let path = dir.join(format!("churn-{round}.redb"));
        let (mut child, mut stdout) = spawn("churn", &path);
        wait_for_line(&mut stdout, "churning");
        for _ in 0..round {
            wait_for_line(&mut stdout, "committed");
        }
        std::thread::sleep(Duration::from_millis(wait_ms));
        child.kill().unwrap(); // SIGKILL: no destructor, no commit finishing
        child.wait().unwrap();
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();

        let catalog = Catalog::open(&path).unwrap();
        let version = catalog.version().unwrap();
        assert!(version.0 > round as u64, "round {round}: {version}");
        let live = catalog.live(&server()).unwrap();
        let expected = if version.0 % 2 == 1 { &a } else { &b };
        assert!(
            *live.tools == **expected,
            "round {round}: live is one whole listing"
        );
        for v in 1..=version.0 {
            let tools = catalog.tools_at(&server(), CatalogVersion(v)).unwrap();
            assert!(
                tools == if v % 2 == 1 { a.clone() } else { b.clone() },
                "round {round}: v{v} reads as it was"
            );
        }
        // The file still takes refreshes.
        catalog.refresh(&server(), &a[..10]).unwrap();
        println!("a_kill_mid_refresh_leaves_whole_listings round {round}: {version} ... ok");
    }
}

fn child(mode: &str) {
    let path = PathBuf::from(std::env::args_os().nth(1).unwrap());
    let catalog = Catalog::open(&path).unwrap();
    match mode {
        "hold" => {
            catalog
                .refresh(&server(), &common::catalogue("server-memory.tools.json"))
                .unwrap();
            println!("holding");
            // Hold the file until the parent closes our stdin.
            let mut sink = Vec::new();
            std::io::stdin().read_to_end(&mut sink).unwrap();
        }
        "churn" => {
            let (a, b) = lists();
            catalog.refresh(&server(), &a).unwrap();
            println!("churning");
            for i in 0u64.. {
                catalog
                    .refresh(&server(), if i % 2 == 0 { &b } else { &a })
                    .unwrap();
                println!("committed");
            }
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn main() {
    if let Ok(mode) = std::env::var(CHILD) {
        child(&mode);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    a_second_process_gets_a_typed_error_naming_the_file(dir.path());
    a_kill_mid_refresh_leaves_whole_listings(dir.path());
}
