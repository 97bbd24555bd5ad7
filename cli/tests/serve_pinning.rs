//! Learned pinning through `psych serve` (issue 34): three stdio sessions (three gateway
//! processes, as a stdio client starts one per session) reach tools of a deferred server
//! through `psych_call_tool`; `psych budget --serve --pin-budget` then shows what would be
//! pinned and why, and the next `psych serve --pin-budget` lists the two tools every or
//! most sessions used as direct tools, the same listing all session long, and forwards a
//! direct call of one. The same with the sessions kept in a PostgreSQL store, as replicas
//! keep them.

use std::path::{Path, PathBuf};

use rmcp::RoleClient;
use rmcp::service::RunningService;
use serde_json::{Value, json};

use crate::support::{PSYCH, call_ok, listed_session};

type Session = RunningService<RoleClient, ()>;

fn write_config(dir: &Path) -> PathBuf {
    let embedded = |tools: usize, extra: Value| {
        let mut server = json!({
            "command": PSYCH,
            "args": ["serve-embedded", "--tools", tools.to_string()],
        });
        server
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().cloned().unwrap());
        server
    };
    let config = json!({"mcpServers": {
        "big": embedded(117, json!({"description": "A forge sized like github."})),
        "small": embedded(3, json!({"preload": true})),
    }});
    let path = dir.join("mcp.json");
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

async fn connect(config: &Path, dir: &Path, flags: &[&str]) -> Session {
    listed_session(config, dir, flags).await
}

async fn call(session: &Session, name: &str, arguments: Value) -> String {
    call_ok(session, name, arguments).await
}

async fn tool_names(session: &Session) -> Vec<String> {
    let mut names: Vec<String> = session
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.into_owned())
        .collect();
    names.sort();
    names
}

fn arguments(tool: &str) -> Value {
    match tool {
        "large" => json!({"bytes": 100}),
        _ => json!({"text": format!("for {tool}")}),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_earlier_sessions_used_most_are_listed_directly() {
    learns_from_earlier_sessions(None).await;
}

/// The same with the sessions kept in a PostgreSQL store (`--store`, a schema of the
/// test's own): what replicas learn from, whichever of them served the sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_learn_from_the_sessions_kept_in_the_store() {
    let schema = psych_store_conformance::pg::Schema::fresh("serve_pinning");
    learns_from_earlier_sessions(Some(&schema.url())).await;
}

/// Three sessions, then what `psych budget` says would be pinned and a session of a
/// gateway pinning it, with the records in `store` (a `postgres://` URL) or in files.
async fn learns_from_earlier_sessions(store: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let mut flags: Vec<&str> = store.map_or_else(Vec::new, |url| vec!["--store", url]);
    let history: [&[&str]; 3] = [
        &["echo", "fingerprint"],
        &["echo", "fingerprint", "large"],
        &["echo"],
    ];
    for tools in history {
        let session = connect(&config, dir.path(), &flags).await;
        assert!(!tool_names(&session).await.contains(&"big__echo".to_owned()));
        for tool in tools {
            call(
                &session,
                "psych_call_tool",
                json!({"server": "big", "tool": tool, "arguments": arguments(tool)}),
            )
            .await;
        }
        session.cancel().await.unwrap();
    }
    if store.is_some() {
        assert!(
            !dir.path().join("serve").exists(),
            "the sessions are in the store"
        );
    }

    // What it would pin, and why: `psych budget --serve --pin-budget` on the gateway's
    // folder and catalogue (or its store), with `extra` flags; its standard output.
    let catalog = store.map_or_else(|| dir.path().join("catalog.redb"), PathBuf::from);
    let budget = |extra: &[&str]| {
        let out = std::process::Command::new(PSYCH)
            .args(["budget", "--serve", "--pin-budget", "2000", "--config"])
            .arg(&config)
            .arg("--dir")
            .arg(dir.path())
            .arg("--store")
            .arg(&catalog)
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let report: Value = serde_json::from_str(&budget(&["--json"])).unwrap();
    let pins = &report["pins"];
    assert_eq!(pins["runs"], 3, "{pins}");
    let decided: Vec<(String, String, u64)> = pins["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                format!(
                    "{}/{}",
                    c["tool"]["server"].as_str().unwrap(),
                    c["tool"]["tool"].as_str().unwrap()
                ),
                c["why"].as_str().unwrap().to_owned(),
                c["used"]["runs"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        decided,
        [
            ("big/echo".to_owned(), "pinned".to_owned(), 3),
            ("big/fingerprint".to_owned(), "pinned".to_owned(), 2),
            ("big/large".to_owned(), "rare".to_owned(), 1),
        ]
    );
    let table = budget(&[]);
    assert!(
        table.contains("Learned pinning")
            && table.contains("big/echo: 3 sessions, 3 calls")
            && table.contains("big/large: 1 session, 1 call,"),
        "{table}"
    );

    // The next session lists them directly, all session long, and a direct call goes through.
    let unpinned = flags.clone();
    flags.extend(["--pin-budget", "2000"]);
    let session = connect(&config, dir.path(), &flags).await;
    let listed = tool_names(&session).await;
    assert!(
        listed.contains(&"big__echo".to_owned()) && listed.contains(&"big__fingerprint".to_owned()),
        "{listed:?}"
    );
    assert!(!listed.contains(&"big__large".to_owned()), "{listed:?}");
    assert!(
        listed.contains(&"psych_call_tool".to_owned()),
        "big stays deferred: {listed:?}"
    );
    assert_eq!(
        call(&session, "big__echo", arguments("echo")).await,
        "for echo"
    );
    assert_eq!(tool_names(&session).await, listed);
    session.cancel().await.unwrap();

    // Without the flag, nothing is pinned.
    let session = connect(&config, dir.path(), &unpinned).await;
    assert!(!tool_names(&session).await.contains(&"big__echo".to_owned()));
    session.cancel().await.unwrap();
}
