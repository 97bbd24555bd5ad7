//! Gateway replicas on one PostgreSQL store (`psych serve --http --store postgres://…`, the
//! machine's PostgreSQL, a schema of the test's own): a handle one replica minted is read
//! through the other for the same identity and refused to another identity; killed with
//! SIGKILL, a replica loses nothing the other reads. And the figure of calls per second
//! through one replica and through two.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use serde_json::json;

use crate::serve_identities::{LINE, call, call_when_listed, connect, large_handle, read, start};
use crate::support::{handle_in, text, token};
use psych_store_conformance::pg::Schema;

/// `N` gateways' folders, each with the same tokens file naming `identities`, and the
/// identities' bearer tokens, in order.
fn folders<const N: usize, const I: usize>(
    identities: [&str; I],
) -> ([tempfile::TempDir; N], [String; I]) {
    let minted = identities.map(token);
    let named: serde_json::Map<String, serde_json::Value> = identities
        .iter()
        .zip(&minted)
        .map(|(name, (_, digest))| ((*name).to_owned(), json!({"tokens": [digest]})))
        .collect();
    let tokens = json!({ "identities": named }).to_string();
    let dirs = [(); N].map(|()| tempfile::tempdir().unwrap());
    for dir in &dirs {
        std::fs::write(dir.path().join("tokens.json"), &tokens).unwrap();
    }
    (dirs, minted.map(|(token, _)| token))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_store_read_each_others_handles() {
    let schema = Schema::fresh("replicas");
    let store = schema.url();
    // Two replicas as on two machines: a folder each (catalogue, spill files), one store.
    let ([dir_a, dir_b], [alice, bob]) = folders(["alice", "bob"]);
    let (replica_a, url_a) = start(dir_a.path(), &["--store", &store]).await;
    let (replica_b, url_b) = start(dir_b.path(), &["--store", &store]).await;

    // Minted on replica A, read through replica B by the same identity.
    let on_a = connect(&url_a, &alice).await;
    let handle = large_handle(&on_a).await;
    let on_b = connect(&url_b, &alice).await;
    call_when_listed(&on_b, "up__echo", json!({"text": "b is up"})).await;
    let read_b = read(&on_b, &handle).await.unwrap();
    assert!(text(&read_b).contains(LINE), "{}", text(&read_b));
    // And the other way round.
    let minted_b = large_handle(&on_b).await;
    assert_ne!(
        minted_b.split(':').next(),
        handle.split(':').next(),
        "a Run per replica"
    );
    let read_a = read(&on_a, &minted_b).await.unwrap();
    assert!(text(&read_a).contains(LINE), "{}", text(&read_a));

    // Another identity is refused the handle on either replica, as one never minted is.
    for url in [&url_a, &url_b] {
        let other = connect(url, &bob).await;
        let refused = read(&other, &handle).await.unwrap_err();
        assert!(refused.contains("invalid_deferred_handle"), "{refused}");
        other.cancel().await.unwrap();
    }
    // Nothing of it is in either replica's folder: the records are in the store.
    assert!(!dir_a.path().join("serve/alice").exists());
    assert!(!dir_b.path().join("serve/alice").exists());

    // Replica A killed outright: what it logged still reads through B.
    on_a.cancel().await.unwrap();
    let mut replica_a = replica_a;
    replica_a.0.start_kill().unwrap(); // SIGKILL
    replica_a.0.wait().await.unwrap();
    let after = read(&on_b, &handle).await.unwrap();
    assert!(text(&after).contains(LINE), "{}", text(&after));
    on_b.cancel().await.unwrap();
    replica_b.stop().await;
}

/// Retention on the store: a Run past `--retain-days` since its last write, held by no
/// replica (its writer's lease lapsed), is deleted by the next replica to start, and its
/// handle then answers that it expired, as a deleted segment's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_retention_is_deleted_and_its_handle_expired() {
    let schema = Schema::fresh("replica_retention");
    let store = schema.url();
    let ([dir_a, dir_b], [alice]) = folders(["alice"]);
    let (replica_a, url_a) = start(dir_a.path(), &["--store", &store]).await;
    let on_a = connect(&url_a, &alice).await;
    let handle = large_handle(&on_a).await;
    on_a.cancel().await.unwrap();
    replica_a.stop().await;
    // Ten days since the Run was written, and its writer gone (its lease lapsed).
    psych_store_conformance::pg::psql(&format!(
        "update {}.runs set last_write_at = last_write_at - 864000000, lease_until = 0",
        schema.name()
    ));
    let (replica_b, url_b) = start(dir_b.path(), &["--store", &store, "--retain-days", "7"]).await;
    let on_b = connect(&url_b, &alice).await;
    call_when_listed(&on_b, "up__echo", json!({"text": "b is up"})).await;
    // B sweeps the store in the background from its start: the handle reads until then.
    let expired = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            let answer = read(&on_b, &handle).await.unwrap();
            if answer.is_error == Some(true) {
                return answer;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("B's first sweep deletes the Run");
    assert!(text(&expired).contains("has expired"), "{}", text(&expired));
    // A fresh result of B's reads as ever.
    let fresh = large_handle(&on_b).await;
    assert!(text(&read(&on_b, &fresh).await.unwrap()).contains(LINE));
    on_b.cancel().await.unwrap();
    replica_b.stop().await;
}

/// A client that forwards each `tools/list_changed` to a channel.
struct Watching(tokio::sync::mpsc::UnboundedSender<()>);

impl rmcp::ClientHandler for Watching {
    async fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        let _ = self.0.send(());
    }
}

/// The names `session` lists, sorted.
async fn names<S: rmcp::service::Service<rmcp::RoleClient>>(
    session: &rmcp::service::RunningService<rmcp::RoleClient, S>,
) -> Vec<String> {
    let mut names: Vec<String> = session
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|tool| tool.name.into_owned())
        .collect();
    names.sort();
    names
}

/// Replicas on one store share its catalogue: both list the same tools, none keeps a
/// catalogue file, and a tool the upstream adds, listed by replica A when its upstream says
/// so, reaches replica B's client as `list_changed` and is in B's listing (B's own
/// upstream never changed: the listing A stored is every replica's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_store_share_the_catalogue_and_its_changes() {
    use rmcp::ServiceExt as _;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let schema = Schema::fresh("replica_catalog");
    let store = schema.url();
    let ([dir_a, dir_b], [alice]) = folders(["alice"]);
    let (replica_a, url_a) = start(dir_a.path(), &["--store", &store]).await;
    let (replica_b, url_b) = start(dir_b.path(), &["--store", &store]).await;
    let on_a = connect(&url_a, &alice).await;
    let (changed, mut changes) = tokio::sync::mpsc::unbounded_channel();
    let config =
        StreamableHttpClientTransportConfig::with_uri(url_b.clone()).auth_header(alice.clone());
    let on_b = Watching(changed)
        .serve(StreamableHttpClientTransport::from_config(config))
        .await
        .unwrap();
    call_when_listed(&on_a, "up__echo", json!({"text": "a is up"})).await;
    call_when_listed(&on_b, "up__echo", json!({"text": "b is up"})).await;
    let listed = names(&on_a).await;
    assert!(listed.contains(&"up__echo".to_owned()), "{listed:?}");
    assert_eq!(names(&on_b).await, listed, "one catalogue, one listing");
    for dir in [&dir_a, &dir_b] {
        assert!(
            !dir.path().join("catalog.redb").exists(),
            "the catalogue is the store's"
        );
    }

    while changes.try_recv().is_ok() {}
    let added = call(&on_a, "up__add_tool", json!({"name": "fresh"}))
        .await
        .unwrap();
    assert_ne!(added.is_error, Some(true), "{}", text(&added));
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            changes.recv().await.expect("b's session is open");
            if names(&on_b).await.contains(&"up__fresh".to_owned()) {
                break;
            }
        }
    })
    .await
    .expect("A's listing reaches B's client as list_changed");
    on_a.cancel().await.unwrap();
    on_b.cancel().await.unwrap();
    replica_a.stop().await;
    replica_b.stop().await;
}

/// Issue 31's replica figure, printed (`cargo test -p psych-cli --test it
/// serve_replicas::figures -- --nocapture`): calls per second from one client keeping 32
/// calls of `up__echo` in flight, through one replica and through two (the calls spread
/// over both), each replica's records on one PostgreSQL schema, and, for comparison,
/// through one gateway logging to files. It asserts only that every call answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figures() {
    use std::sync::Arc;
    use std::time::Instant;

    const IN_FLIGHT: usize = 32;
    const CALLS: usize = 1_200;

    /// Calls per second over `sessions`, `IN_FLIGHT` calls in flight, spread round-robin.
    async fn rate(sessions: &[Arc<crate::serve_identities::Session>], calls: usize) -> f64 {
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..IN_FLIGHT {
            let session = Arc::clone(&sessions[worker % sessions.len()]);
            let next = Arc::clone(&next);
            tasks.spawn(async move {
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < calls {
                    let echoed = crate::serve_identities::call(
                        &session,
                        "up__echo",
                        json!({"text": "a short result, logged"}),
                    )
                    .await
                    .unwrap();
                    assert_ne!(echoed.is_error, Some(true), "{}", text(&echoed));
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        calls as f64 / started.elapsed().as_secs_f64()
    }

    let schema = Schema::fresh("replica_figures");
    let store = schema.url();
    let (dirs, [alice]) = folders::<3, 1>(["alice"]);
    let (_a, url_a) = start(dirs[0].path(), &["--store", &store]).await;
    let (_b, url_b) = start(dirs[1].path(), &["--store", &store]).await;
    let (_files, url_files) = start(dirs[2].path(), &[]).await;
    let mut sessions = Vec::new();
    for url in [&url_a, &url_b, &url_files] {
        let session = connect(url, &alice).await;
        call_when_listed(&session, "up__echo", json!({"text": "up"})).await;
        sessions.push(Arc::new(session));
    }
    // Warm: every session's first calls (segments opened, statements prepared).
    for session in &sessions {
        rate(std::slice::from_ref(session), 4 * IN_FLIGHT).await;
    }
    for round in 1..=2 {
        let one = rate(&sessions[..1], CALLS).await;
        let two = rate(&sessions[..2], CALLS).await;
        let files = rate(&sessions[2..], CALLS).await;
        eprintln!(
            "round {round}: {IN_FLIGHT} in flight, {CALLS} calls: one replica {one:.0} calls/s, \
             two replicas {two:.0} calls/s ({:.2}x), one gateway on files {files:.0} calls/s",
            two / one
        );
    }
}

/// `psych budget --store postgres://…` lists into the catalogue replicas share: the same
/// tools as into a file, stored in the schema (read back through the store), and the
/// report names the schema and host, never the URL's user.
#[test]
fn budget_lists_into_the_replicas_catalogue() {
    use psych_types::{CatalogStore as _, ServerId};

    let schema = Schema::fresh("budget_store");
    let dir = tempfile::tempdir().unwrap();
    let server = env!("CARGO_BIN_EXE_psych");
    let config = dir.path().join("mcp.json");
    let servers = json!({"mcpServers": {
        "one": {"command": server, "args": ["serve-embedded", "--tools", "30"]},
        "two": {"command": server, "args": ["serve-embedded", "--tools", "5"]},
    }});
    std::fs::write(&config, servers.to_string()).unwrap();
    let budget = |store: &str| {
        let out = std::process::Command::new(server)
            .args(["budget", "--json", "--config"])
            .arg(&config)
            .args(["--store", store])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let into_store: serde_json::Value = serde_json::from_str(&budget(&schema.url())).unwrap();
    let into_file: serde_json::Value = serde_json::from_str(&budget("catalog.redb")).unwrap();
    let without_start = |report: &serde_json::Value| {
        let mut servers = report["servers"].clone();
        for server in servers.as_array_mut().unwrap() {
            server.as_object_mut().unwrap().remove("start");
        }
        servers
    };
    assert_eq!(without_start(&into_store), without_start(&into_file));
    assert_eq!(
        into_store["servers"][0]["start"],
        "unknown (each replica decides from its own folder)"
    );
    assert_eq!(into_store["totals"], into_file["totals"]);
    let shown = into_store.to_string();
    assert!(
        shown.contains(&format!("the PostgreSQL schema {}", schema.name())),
        "{shown}"
    );
    assert!(!shown.contains("postgres@"), "no user shown: {shown}");
    let catalog = psych_store_postgres::PgCatalog::open(&schema.url()).unwrap();
    assert_eq!(
        catalog.servers().unwrap(),
        [ServerId::new("one").unwrap(), ServerId::new("two").unwrap()]
    );
    let one = catalog.live(&ServerId::new("one").unwrap()).unwrap();
    assert!(one.tools.len() >= 30, "{}", one.tools.len());
}

/// Issue 31's crash: replica A killed with SIGKILL while a client keeps 16 calls in flight
/// through it, each a 200 kB result elided behind a handle: every call A answered before it
/// died reads through replica B whole, B lists the same tools A listed, and the client's
/// next request, to B, goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_calls_loses_no_answered_result() {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    const IN_FLIGHT: usize = 16;

    let schema = Schema::fresh("replica_kill");
    let store = schema.url();
    let ([dir_a, dir_b], [alice]) = folders(["alice"]);
    let (replica_a, url_a) = start(dir_a.path(), &["--store", &store]).await;
    let (replica_b, url_b) = start(dir_b.path(), &["--store", &store]).await;
    let on_a = Arc::new(connect(&url_a, &alice).await);
    call_when_listed(on_a.as_ref(), "up__echo", json!({"text": "a is up"})).await;
    let listed = names(on_a.as_ref()).await;

    // Calls in flight through A until it dies; each answered call's handle kept.
    let answered = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (session, answered) = (Arc::clone(&on_a), Arc::clone(&answered));
        tasks.spawn(async move {
            loop {
                let called = call(session.as_ref(), "up__large", json!({"bytes": 200_000}));
                let Ok(Ok(result)) = tokio::time::timeout(Duration::from_secs(30), called).await
                else {
                    return;
                };
                let shown = text(&result);
                let Some(handle) = handle_in(&shown) else {
                    return;
                };
                answered.lock().unwrap().push(handle.to_owned());
            }
        });
    }
    tokio::time::timeout(Duration::from_secs(120), async {
        while answered.lock().unwrap().len() < 48 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("A answers calls");
    let mut replica_a = replica_a;
    replica_a.0.start_kill().unwrap(); // SIGKILL, calls in flight
    replica_a.0.wait().await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while tasks.join_next().await.is_some() {}
    })
    .await
    .expect("the calls in flight end once A is gone");
    let answered = answered.lock().unwrap().clone();
    assert!(answered.len() >= 48, "{}", answered.len());

    // The client's next requests go to B: the same tools, every answered result whole.
    let on_b = connect(&url_b, &alice).await;
    call_when_listed(&on_b, "up__echo", json!({"text": "b is up"})).await;
    assert_eq!(names(&on_b).await, listed, "B lists what A listed");
    for handle in &answered {
        let read_b = read(&on_b, handle).await.unwrap();
        assert!(text(&read_b).contains(LINE), "{handle}: {}", text(&read_b));
    }
    on_b.cancel().await.unwrap();
    replica_b.stop().await;
}
