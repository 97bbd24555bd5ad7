//! Identities and handles that outlive a connection, through `psych serve --http --tokens`
//! as a process in front of a test server: a request without a known token is 401; a
//! handle minted on one session reads back on a later session of the same identity and
//! after the gateway restarts on the same `--dir`; another identity's handle is
//! `invalid_deferred_handle`; a handle whose segment retention deleted answers that it
//! expired; an identity whose entry narrows its grant lists and calls only what it allows;
//! `psych serve-token` makes a token the file accepts.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::path::Path;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};

use crate::support::{Gateway, PSYCH, expect_handle, listening, session_id, text, token};

/// Starts `psych serve --http --tokens` in front of one test server, logging under `dir`,
/// with `extra` flags: the gateway and its URL.
pub(crate) async fn start(dir: &Path, extra: &[&str]) -> (Gateway, String) {
    let config = dir.join("mcp.json");
    let upstream = json!({
        "command": PSYCH,
        "args": ["serve-embedded", "--tools", "3"],
        "preload": true,
    });
    std::fs::write(&config, json!({"mcpServers": {"up": upstream}}).to_string()).unwrap();
    let mut command = tokio::process::Command::new(PSYCH);
    command
        .args(["serve", "--http", "127.0.0.1:0", "--tokens"])
        .arg(dir.join("tokens.json"))
        .arg("--config")
        .arg(&config)
        .arg("--dir")
        .arg(dir)
        .args(extra);
    listening(command).await
}

pub(crate) type Session = RunningService<RoleClient, ()>;

/// A session presenting `token`.
pub(crate) async fn connect(url: &str, token: &str) -> Session {
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token);
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .unwrap()
}

pub(crate) async fn call<S: rmcp::service::Service<RoleClient>>(
    session: &RunningService<RoleClient, S>,
    name: &str,
    arguments: Value,
) -> Result<CallToolResult, String> {
    let Value::Object(arguments) = arguments else {
        panic!("arguments are an object");
    };
    session
        .call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(arguments))
        .await
        .map_err(|e| e.to_string())
}

/// Calls `name` until it answers without failing: the gateway answers before its
/// upstreams connect, so right after a start the upstream's tools are not there yet.
pub(crate) async fn call_when_listed<S: rmcp::service::Service<RoleClient>>(
    session: &RunningService<RoleClient, S>,
    name: &str,
    arguments: Value,
) -> CallToolResult {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match call(session, name, arguments.clone()).await {
                Ok(result) if result.is_error != Some(true) => return result,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await
    .expect("the upstream is listed")
}

/// Calls `up__large` once the upstream is listed and returns the elided result's handle.
pub(crate) async fn large_handle(session: &Session) -> String {
    elided_handle(session, 200_000).await
}

/// Calls `up__large` for `bytes` once the upstream is listed and returns the elided
/// result's handle.
pub(crate) async fn elided_handle(session: &Session, bytes: u64) -> String {
    let shown = text(&call_when_listed(session, "up__large", json!({"bytes": bytes})).await);
    expect_handle(&shown)
}

pub(crate) async fn read(session: &Session, handle: &str) -> Result<CallToolResult, String> {
    call(
        session,
        "read_tool_output",
        json!({"handle": handle, "grep": "line 002345:"}),
    )
    .await
}

/// Two identities in `dir`'s tokens file, alice and bob: their tokens.
fn alice_and_bob(dir: &Path) -> (String, String) {
    let (alice, alice_digest) = token("alice");
    let (bob, bob_digest) = token("bob");
    std::fs::write(
        dir.join("tokens.json"),
        json!({"identities": {
            "alice": {"tokens": [alice_digest]},
            "bob": {"tokens": [bob_digest]},
        }})
        .to_string(),
    )
    .unwrap();
    (alice, bob)
}

/// One `initialize` POST to `url` over a bare TCP stream, with `authorization` when given:
/// the HTTP answer's head as text (with the body of a refusal).
async fn initialize(url: &str, authorization: Option<&str>) -> String {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}})
    .to_string();
    raw_request(url, "POST", authorization, None, &body).await
}

/// One `method` request to `url` over a bare TCP stream, with `authorization` and the
/// session id `session` when given: the HTTP answer's head as text, with its body when it
/// is not a 2xx (an event stream stays open; a refusal closes).
async fn raw_request(
    url: &str,
    method: &str,
    authorization: Option<&str>,
    session: Option<&str>,
    body: &str,
) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let authorization = authorization
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    let session = session
        .map(|value| format!("Mcp-Session-Id: {value}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json, text/event-stream\r\n\
         Content-Type: application/json\r\n{authorization}{session}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        // Up to the end of the headers: a 200 starts an event stream that stays open.
        let mut byte = [0u8; 1];
        while !answer.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap() == 1 {
            answer.push(byte[0]);
        }
        if !answer.starts_with(b"HTTP/1.1 2") {
            stream.read_to_end(&mut answer).await.unwrap();
        }
    })
    .await
    .expect("the gateway answers");
    String::from_utf8_lossy(&answer).into_owned()
}

pub(crate) const LINE: &str = "line 002345: the quick brown fox jumps over the lazy dog";

/// Opens an event stream (a GET) in `session` presenting `token`: the connection, kept
/// open, and the answer's head (with the body of a refusal).
async fn event_stream(url: &str, token: &str, session: &str) -> (tokio::net::TcpStream, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\
         Authorization: Bearer {token}\r\nMcp-Session-Id: {session}\r\n\
         MCP-Protocol-Version: 2025-11-25\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        let mut byte = [0u8; 1];
        while !answer.ends_with(b"\r\n\r\n") && stream.read(&mut byte).await.unwrap() == 1 {
            answer.push(byte[0]);
        }
        if !answer.starts_with(b"HTTP/1.1 2") {
            let mut body = vec![0u8; 4096];
            let n = stream.read(&mut body).await.unwrap();
            answer.extend_from_slice(&body[..n]);
        }
    })
    .await
    .expect("the gateway answers");
    (stream, String::from_utf8_lossy(&answer).into_owned())
}

/// A legacy session opened by hand for `token`: its id.
async fn legacy_session(url: &str, token: &str) -> String {
    let bearer = format!("Bearer {token}");
    let session = crate::support::session_id(&initialize(url, Some(&bearer)).await);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let answer = raw_request(
        url,
        "POST",
        Some(&bearer),
        Some(&session),
        &initialized.to_string(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    session
}

/// One session holds at most `MAX_LISTENS` event streams (GETs), and one identity two per
/// session it may hold (at least `MAX_LISTENS`), all its sessions together: one more is
/// answered 429, another identity still opens its own, and one closed gives its place
/// back. (Before, rmcp kept up to 33 per session, and one identity could hold every
/// connection place with them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_holds_at_most_its_share_of_the_event_streams() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = alice_and_bob(dir.path());
    // Two sessions an identity: 4 streams for it, raised to MAX_LISTENS (8).
    let (gateway, url) = start(dir.path(), &["--max-sessions-per-identity", "2"]).await;
    let bobs = legacy_session(&url, &bob).await;
    let mut bobs_streams = Vec::new();
    for n in 0..psych_gateway::MAX_LISTENS {
        let (stream, head) = event_stream(&url, &bob, &bobs).await;
        assert!(head.starts_with("HTTP/1.1 200"), "stream {n}: {head}");
        bobs_streams.push(stream);
    }
    let (_, refused) = event_stream(&url, &bob, &bobs).await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(
        refused.contains("a session may have 8 at once"),
        "{refused}"
    );
    drop(bobs_streams);
    let sessions = [
        legacy_session(&url, &alice).await,
        legacy_session(&url, &alice).await,
    ];
    let mut open = Vec::new();
    for n in 0..psych_gateway::MAX_LISTENS {
        let (stream, head) = event_stream(&url, &alice, &sessions[n % 2]).await;
        assert!(head.starts_with("HTTP/1.1 200"), "stream {n}: {head}");
        open.push(stream);
    }
    let (_, refused) = event_stream(&url, &alice, &sessions[0]).await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    assert!(
        refused.contains("an identity may have 8 at once"),
        "{refused}"
    );
    // Bob's streams were given back as his connections closed.
    let (_bobs_stream, _) = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let (stream, head) = event_stream(&url, &bob, &bobs).await;
            if head.starts_with("HTTP/1.1 200") {
                return (stream, head);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("bob's closed streams are given back");
    drop(open.pop());
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let (stream, head) = event_stream(&url, &alice, &sessions[1]).await;
            if head.starts_with("HTTP/1.1 200") {
                return stream;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the closed stream's place is given back");
    gateway.stop().await;
}

/// A request without a known token is answered 401 and its connection closed, so that
/// such requests hold no connection place (before, one every few seconds per connection
/// held all of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_token_closes_its_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    alice_and_bob(dir.path());
    let (gateway, url) = start(dir.path(), &[]).await;
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    // Keep-alive asked for: the gateway closes it all the same.
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("the connection is closed")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(answer.contains("\r\nconnection: close\r\n"), "{answer}");
    gateway.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_is_its_identitys_on_any_connection_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, alice_digest) = token("alice");
    let (bob, bob_digest) = token("bob");
    let (carol, carol_digest) = token("carol");
    std::fs::write(
        dir.path().join("tokens.json"),
        json!({"identities": {
            "alice": {"tokens": [alice_digest]},
            "bob": {"tokens": [bob_digest]},
            "carol": {"tokens": [carol_digest], "allowTools": {"up": ["echo"]}},
        }})
        .to_string(),
    )
    .unwrap();
    let (gateway, url) = start(dir.path(), &[]).await;

    // No token, an unknown one, or a token without its scheme: 401, nothing served.
    for authorization in [None, Some("Bearer psy_not_a_token"), Some(alice.as_str())] {
        let answer = initialize(&url, authorization).await;
        assert!(
            answer.starts_with("HTTP/1.1 401"),
            "{authorization:?}: {answer}"
        );
        assert!(
            answer
                .to_ascii_lowercase()
                .contains("www-authenticate: bearer realm=\"psych\""),
            "{answer}"
        );
    }
    let bearer = format!("Bearer {alice}");
    let answer = initialize(&url, Some(&bearer)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Alice's session is hers: another identity naming it (to delete it, say) is answered
    // as if it did not exist, and it is still alice's to delete.
    let session = crate::support::session_id(&answer);
    let bobs = format!("Bearer {bob}");
    let answer = raw_request(&url, "DELETE", Some(&bobs), Some(&session), "").await;
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    let answer = raw_request(&url, "DELETE", Some(&bearer), Some(&session), "").await;
    assert!(answer.starts_with("HTTP/1.1 20"), "{answer}");

    // Minted on one session, read on a later one of the same identity.
    let first = connect(&url, &alice).await;
    let handle = large_handle(&first).await;
    let listed = serde_json::to_string(&first.list_all_tools().await.unwrap()).unwrap();
    first.cancel().await.unwrap();
    let later = connect(&url, &alice).await;
    assert_eq!(
        serde_json::to_string(&later.list_all_tools().await.unwrap()).unwrap(),
        listed,
        "one identity's listing is the same on every connection"
    );
    let again = read(&later, &handle).await.unwrap();
    assert!(text(&again).contains(LINE), "{}", text(&again));

    // An identity whose entry narrows its grant lists only what it may call, and is
    // refused the rest at call time.
    let narrow = connect(&url, &carol).await;
    let names = |tools: &[rmcp::model::Tool]| -> Vec<String> {
        tools.iter().map(|t| t.name.to_string()).collect()
    };
    let carols = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let listed = names(&narrow.list_all_tools().await.unwrap());
            if listed.iter().any(|n| n == "up__echo") {
                return listed;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("carol's upstream is listed");
    assert!(!carols.iter().any(|n| n == "up__large"), "{carols:?}");
    let refused = call(&narrow, "up__large", json!({"bytes": 10}))
        .await
        .unwrap();
    assert_eq!(refused.is_error, Some(true), "{}", text(&refused));
    let echoed = call(&narrow, "up__echo", json!({"text": "narrow"}))
        .await
        .unwrap();
    assert_eq!(text(&echoed), "narrow");
    assert!(
        names(&later.list_all_tools().await.unwrap())
            .iter()
            .any(|n| n == "up__large")
    );
    narrow.cancel().await.unwrap();

    // Another identity's handle is refused, as one never minted is.
    let other = connect(&url, &bob).await;
    let refused = read(&other, &handle).await.unwrap_err();
    assert!(refused.contains("invalid_deferred_handle"), "{refused}");
    let guessed = read(&later, "hzzzzzzzzzzzzzzzzzzzzzzzzzz:0")
        .await
        .unwrap_err();
    assert!(guessed.contains("invalid_deferred_handle"), "{guessed}");
    // Bob's own results are his: in his own folder.
    let bobs = large_handle(&other).await;
    assert!(read(&other, &bobs).await.unwrap().is_error != Some(true));
    assert!(dir.path().join("serve/bob").is_dir());
    later.cancel().await.unwrap();
    other.cancel().await.unwrap();

    // After a restart on the same --dir, the handle still reads.
    gateway.stop().await;
    let (gateway, url) = start(dir.path(), &[]).await;
    let restarted = connect(&url, &alice).await;
    let after = read(&restarted, &handle).await.unwrap();
    assert!(text(&after).contains(LINE), "{}", text(&after));
    restarted.cancel().await.unwrap();
    gateway.stop().await;

    // A gateway keeping 1 MiB per identity deletes the oldest segments at start until
    // alice's fit (her segments hold more: a 2 MB result besides): the handle answers
    // that it expired, as a failed result the model can act on.
    let (gateway, url) = start(dir.path(), &[]).await;
    let more = connect(&url, &alice).await;
    // Right after the start: waits for the upstream to be listed (it failed under load
    // when called at once).
    call_when_listed(&more, "up__large", json!({"bytes": 2_000_000})).await;
    more.cancel().await.unwrap();
    gateway.stop().await;
    let (_gateway, url) = start(dir.path(), &["--retain-mib", "1"]).await;
    let swept = connect(&url, &alice).await;
    let expired = read(&swept, &handle).await.unwrap();
    assert_eq!(expired.is_error, Some(true));
    assert!(text(&expired).contains("has expired"), "{}", text(&expired));
    swept.cancel().await.unwrap();
}

#[test]
fn beyond_loopback_without_tokens_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(PSYCH)
        .args(["serve", "--http", "0.0.0.0:0", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("--tokens"), "{stderr}");
}

/// One identity holds at most `--max-sessions-per-identity` sessions: one more is refused
/// (503, `Retry-After`, an error naming the bound), while another identity still opens
/// its own, and one the identity closes frees its place. (Before, one identity could take
/// every slot of `--max-sessions`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_holds_at_most_its_share_of_the_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = alice_and_bob(dir.path());
    let (gateway, url) = start(
        dir.path(),
        &["--max-sessions", "5", "--max-sessions-per-identity", "2"],
    )
    .await;
    // The whole answer to an `initialize` presenting `token` (a refusal's body included).
    let refused = async |token: &str| initialize(&url, Some(&format!("Bearer {token}"))).await;
    let first = connect(&url, &alice).await;
    let second = connect(&url, &alice).await;
    let answer = refused(&alice).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("\r\nretry-after: 1\r\n"), "{answer}");
    assert!(
        answer.contains(
            "this identity has 2 sessions open, the most it allows one identity (psych serve: \
             --max-sessions-per-identity)"
        ),
        "{answer}"
    );
    // Bob's place is his, and his third is refused the same way.
    let bobs = [connect(&url, &bob).await, connect(&url, &bob).await];
    let answer = refused(&bob).await;
    assert!(
        answer.contains("this identity has 2 sessions open"),
        "{answer}"
    );
    // The open sessions are served; one alice closes frees her place, not bob's.
    for session in [&first, &second, &bobs[0], &bobs[1]] {
        session.list_all_tools().await.unwrap();
    }
    first.cancel().await.unwrap();
    let again = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let config = StreamableHttpClientTransportConfig::with_uri(url.clone())
                .auth_header(alice.clone());
            if let Ok(session) = ().serve(StreamableHttpClientTransport::from_config(config)).await
            {
                break session;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the closed session's place is freed");
    again.list_all_tools().await.unwrap();
    let answer = refused(&bob).await;
    assert!(
        answer.contains("this identity has 2 sessions open"),
        "{answer}"
    );
    for session in [again, second] {
        session.cancel().await.unwrap();
    }
    for session in bobs {
        session.cancel().await.unwrap();
    }
    gateway.stop().await;
}

/// Issue 34 through `psych serve`: a 2 MB result passed to another tool by reference
/// (`{"$psych_result": handle}`) reaches the upstream as the same call carrying it does, on
/// a later connection of the same identity too; another identity's reference is
/// `invalid_deferred_handle` and nothing is forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_passes_by_reference_within_its_identity_only() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = alice_and_bob(dir.path());
    let (gateway, url) = start(dir.path(), &[]).await;
    let first = connect(&url, &alice).await;
    let handle = elided_handle(&first, 2_000_000).await;
    first.cancel().await.unwrap();
    // After a restart: the handle is of an earlier Run, read through the identity's archive.
    gateway.stop().await;
    let (gateway, url) = start(dir.path(), &[]).await;

    let later = connect(&url, &alice).await;
    let reference = json!({"$psych_result": handle});
    let by_reference = call(&later, "up__fingerprint", json!({"text": reference}))
        .await
        .unwrap();
    assert_ne!(by_reference.is_error, Some(true), "{}", text(&by_reference));
    let big = psych_test_server::large_text(2_000_000);
    let direct = call(&later, "up__fingerprint", json!({"text": big}))
        .await
        .unwrap();
    assert_eq!(
        text(&by_reference),
        text(&direct),
        "the upstream got the bytes a call carrying them sends"
    );
    assert!(
        text(&direct).contains("text 2000000 bytes"),
        "{}",
        text(&direct)
    );
    // A slice of it: two lines.
    let sliced = call(
        &later,
        "up__fingerprint",
        json!({"text": {"$psych_result": handle, "offset": 10, "limit": 2}}),
    )
    .await
    .unwrap();
    let two: String = big.split_inclusive('\n').skip(10).take(2).collect();
    assert!(
        text(&sliced).contains(&format!("text {} bytes", two.len())),
        "{}",
        text(&sliced)
    );
    // Past the bound of one call: a failed result saying so, nothing forwarded.
    let more = vec![reference.clone(); 8];
    let twice = call(
        &later,
        "up__fingerprint",
        json!({"text": reference, "more": more}),
    )
    .await
    .unwrap();
    assert_eq!(twice.is_error, Some(true));
    assert!(
        text(&twice).contains("16777216 bytes allowed here"),
        "{}",
        text(&twice)
    );
    later.cancel().await.unwrap();

    let other = connect(&url, &bob).await;
    call_when_listed(&other, "up__echo", json!({"text": "ready"})).await;
    let refused = call(&other, "up__fingerprint", json!({"text": reference}))
        .await
        .unwrap_err();
    assert!(refused.contains("invalid_deferred_handle"), "{refused}");
    // The refusal is in bob's log as the call's result, saying nothing was run (not left
    // for a later request to answer as interrupted).
    let bobs = crate::support::logged_in(&dir.path().join("serve").join("bob"));
    let refusal = "up__fingerprint: refused, nothing was run: the argument at \"/text\": ";
    assert!(
        bobs.iter().any(|(name, text)| name == "up__fingerprint"
            && text.starts_with(refusal)
            && text.contains("invalid_deferred_handle")),
        "{bobs:?}"
    );
    other.cancel().await.unwrap();

    // The bound is the user's: with --max-passed-mib 1 the 2 MB result is not passed.
    gateway.stop().await;
    let (_gateway, url) = start(dir.path(), &["--max-passed-mib", "1"]).await;
    let bounded = connect(&url, &alice).await;
    call_when_listed(&bounded, "up__echo", json!({"text": "ready"})).await;
    let over = call(&bounded, "up__fingerprint", json!({"text": reference}))
        .await
        .unwrap();
    assert_eq!(over.is_error, Some(true));
    assert!(
        text(&over).contains("1048576 bytes allowed here"),
        "{}",
        text(&over)
    );
    bounded.cancel().await.unwrap();
}

/// With `--max-passed-mib 0` no `resources/read` can answer a page: an elided result's
/// preview carries no `resource_link` (before, one whose every read was refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_resource_link_is_offered_when_no_read_could_answer() {
    use rmcp::model::ContentBlock;
    let dir = tempfile::tempdir().unwrap();
    let (alice, _) = alice_and_bob(dir.path());
    let (gateway, url) = start(dir.path(), &["--max-passed-mib", "0"]).await;
    let session = connect(&url, &alice).await;
    let shown = call_when_listed(&session, "up__large", json!({"bytes": 300_000})).await;
    assert!(
        !shown
            .content
            .iter()
            .any(|block| matches!(block, ContentBlock::ResourceLink(_))),
        "{shown:?}"
    );
    assert!(
        text(&shown).contains("read_tool_output"),
        "{}",
        text(&shown)
    );
    session.cancel().await.unwrap();
    gateway.stop().await;
}

/// Issue 34 through `psych serve`: an elided result's preview carries a `resource_link` to
/// the whole result, and `resources/read` of it answers the whole text (or the page its
/// query asks for) on any connection of the identity, and `invalid_deferred_handle` to
/// another identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elided_result_is_a_resource_of_its_identity() {
    use rmcp::model::{ContentBlock, ReadResourceRequestParams, ResourceContents};
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = alice_and_bob(dir.path());
    let (gateway, url) = start(dir.path(), &[]).await;
    let first = connect(&url, &alice).await;
    let templates = first.list_all_resource_templates().await.unwrap();
    assert_eq!(templates.len(), 1, "{templates:?}");
    assert_eq!(templates[0].uri_template, "psych://result/{handle}");
    let shown = call_when_listed(&first, "up__large", json!({"bytes": 300_000})).await;
    let link = shown
        .content
        .iter()
        .find_map(|block| match block {
            ContentBlock::ResourceLink(link) => Some(link.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("a resource link in {shown:?}"));
    assert!(link.uri.starts_with("psych://result/"), "{}", link.uri);
    assert_eq!(link.size, Some(300_000));
    assert!(text(&shown).contains(&link.uri["psych://result/".len()..]));
    // A small result is shown whole, with no link.
    let small = call(&first, "up__echo", json!({"text": "hi"}))
        .await
        .unwrap();
    assert_eq!(small.content.len(), 1);
    first.cancel().await.unwrap();
    // After a restart: the result is of an earlier Run, read through the identity's archive.
    gateway.stop().await;
    let (gateway, url) = start(dir.path(), &[]).await;

    let body = |read: rmcp::model::ReadResourceResult| match read.contents.as_slice() {
        [ResourceContents::TextResourceContents { text, meta, .. }] => (
            text.clone(),
            meta.as_ref()
                .and_then(|m| m.0.get("psych/nextOffset").cloned()),
        ),
        other => panic!("one text in {other:?}"),
    };
    let later = connect(&url, &alice).await;
    let whole = later
        .read_resource(ReadResourceRequestParams::new(link.uri.clone()))
        .await
        .unwrap();
    let big = psych_test_server::large_text(300_000);
    assert_eq!(body(whole), (big.clone(), None));
    // A page, with its handle's colon escaped as a client filling in the template sends it.
    let escaped = link
        .uri
        .replace(':', "%3A")
        .replacen("psych%3A", "psych:", 1);
    let page = later
        .read_resource(ReadResourceRequestParams::new(format!(
            "{escaped}?offset=3&limit=2"
        )))
        .await
        .unwrap();
    let two: String = big.split_inclusive('\n').skip(3).take(2).collect();
    assert_eq!(body(page), (two, Some(json!(5))));
    // The last page says nothing follows; the end itself is an empty page.
    let lines = big.split_inclusive('\n').count();
    let last = later
        .read_resource(ReadResourceRequestParams::new(format!(
            "{}?offset={}&limit=5",
            link.uri,
            lines - 1
        )))
        .await
        .unwrap();
    assert_eq!(body(last).1, None);
    let end = later
        .read_resource(ReadResourceRequestParams::new(format!(
            "{}?offset={lines}",
            link.uri
        )))
        .await
        .unwrap();
    assert_eq!(body(end), (String::new(), None));
    later.cancel().await.unwrap();

    let other = connect(&url, &bob).await;
    let refused = other
        .read_resource(ReadResourceRequestParams::new(link.uri.clone()))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("invalid_deferred_handle"), "{refused}");
    other.cancel().await.unwrap();

    // One answer holds at most the bound: past it the whole is refused, saying to page.
    gateway.stop().await;
    let (_gateway, url) = start(dir.path(), &["--max-passed-mib", "0"]).await;
    let bounded = connect(&url, &alice).await;
    let over = bounded
        .read_resource(ReadResourceRequestParams::new(link.uri.clone()))
        .await
        .unwrap_err()
        .to_string();
    assert!(over.contains("read it in pages"), "{over}");
    bounded.cancel().await.unwrap();
}

/// An open session stays its identity's however many sessions are made after it: here 257
/// more, each left open. (Before, the gateway remembered the owners of the last 256
/// sessions made, open or not, and forgot older ones: the first session then answered 404,
/// although it was open and held its slot. rmcp's client hides a 404 by opening a new
/// session, so the session is used here over bare HTTP.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_session_is_served_however_many_sessions_were_made_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, _) = alice_and_bob(dir.path());
    let (gateway, url) = start(
        dir.path(),
        &[
            "--max-sessions",
            "300",
            "--max-sessions-per-identity",
            "300",
        ],
    )
    .await;
    let bearer = format!("Bearer {alice}");
    let first = session_id(&initialize(&url, Some(&bearer)).await);
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string();
    let answer = raw_request(&url, "POST", Some(&bearer), Some(&first), &initialized).await;
    assert!(answer.starts_with("HTTP/1.1 202"), "{answer}");
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).to_string();
    let answer = raw_request(&url, "POST", Some(&bearer), Some(&first), &list).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    for n in 0..257 {
        let answer = initialize(&url, Some(&bearer)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "session {n}: {answer}");
    }
    let answer = raw_request(&url, "POST", Some(&bearer), Some(&first), &list).await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "the first session is served: {answer}"
    );
    gateway.stop().await;
}

/// With a tokens file naming several identities, one identity's calls passing results hold
/// at most half the process's budget (`--passing-budget-mib 2`, calls of 1 MiB at most):
/// bob's second call passing a 600 KB result waits for his first, and alice's, made after
/// both, goes through beside his first rather than after it (one budget for all, bob's two
/// would hold 1.2 MB of the 2 MiB and alice's 1 MiB would wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_identity_holds_at_most_its_share_of_the_passing_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, bob) = alice_and_bob(dir.path());
    let flags = ["--max-passed-mib", "1", "--passing-budget-mib", "2"];
    let (gateway, url) = start(dir.path(), &flags).await;
    let (on_alice, on_bob) = (connect(&url, &alice).await, connect(&url, &bob).await);
    let (alices, bobs) = (
        elided_handle(&on_alice, 600_000).await,
        elided_handle(&on_bob, 600_000).await,
    );
    let sleeping = |handle: &str| json!({"ms": 1500, "tag": {"$psych_result": handle}});
    let started = std::time::Instant::now();
    let ended = async |session: &Session, handle: &str, after: u64| {
        tokio::time::sleep(Duration::from_millis(after)).await;
        let result = call(session, "up__sleep", sleeping(handle)).await.unwrap();
        assert_ne!(result.is_error, Some(true), "{}", text(&result));
        started.elapsed()
    };
    let (first, second, hers) = tokio::join!(
        ended(&on_bob, &bobs, 0),
        ended(&on_bob, &bobs, 0),
        ended(&on_alice, &alices, 300),
    );
    let (bobs_first, bobs_last) = (first.min(second), first.max(second));
    assert!(
        bobs_last >= bobs_first + Duration::from_millis(1_000),
        "bob's calls took turns: {bobs_first:?}, {bobs_last:?}"
    );
    assert!(
        hers < bobs_last,
        "alice's call ended before bob's second: {hers:?}, {bobs_last:?}"
    );
    on_alice.cancel().await.unwrap();
    on_bob.cancel().await.unwrap();
    gateway.stop().await;
}
