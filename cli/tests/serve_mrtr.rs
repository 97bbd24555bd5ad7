//! MCP 2026-07-28's multi-round-trip calls (MRTR) through `psych serve --http --tokens` as
//! a process, in front of a test server that speaks 2026-07-28 only (`psych serve-embedded
//! --modern-only`, a real process) and whose `confirm` tool asks for an elicitation first:
//!
//! - a client of 2026-07-28 gets the upstream's `inputRequests` unchanged with the
//!   gateway's sealed `requestState`, retries with its answer and gets the final result;
//!   rmcp's own client drives the rounds alone, directly and through `psych_call_tool`;
//! - a forged state, a state retried with other arguments, another identity's state, and
//!   answers sent without a state are JSON-RPC -32602, and nothing runs;
//! - a client that declares no elicitation gets the upstream's -32021;
//! - only the final results are logged;
//! - a client of 2025-11-25 (a session) gets a tool error saying it needs 2026-07-28;
//! - over stdio, a client of 2026-07-28 drives the rounds the same way;
//! - underneath, psych-mcp's `ToolHost` against the same server: a round answers the
//!   upstream's result raw (its state byte for byte), the retry completes, a round without
//!   the capability is -32021 typed, and a plain call (`psych run`'s) is an error, never an
//!   empty result.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::path::Path;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientCapabilities, ClientConfig, ElicitRequestParams,
    ElicitResult, ElicitationAction, ErrorCode, ErrorData, Implementation, InputRequest,
    ProtocolVersion,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceError};
use serde_json::{Value, json};

use crate::support::{Gateway, PSYCH, listening, text, token};

/// Writes the MCP config of two test servers of 2026-07-28 only under `dir`: `up`, whose
/// tools are listed, and `later`, deferred (reached through the meta tools).
fn config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("mcp.json");
    let upstream = |preload: bool| {
        json!({
            "command": PSYCH,
            "args": ["serve-embedded", "--tools", "3", "--modern-only"],
            "preload": preload,
        })
    };
    let servers = json!({"mcpServers": {"up": upstream(true), "later": upstream(false)}});
    std::fs::write(&config, servers.to_string()).unwrap();
    config
}

/// Starts `psych serve --http --tokens` in front of a test server of 2026-07-28 only,
/// logging under `dir`: the gateway and its URL.
async fn start(dir: &Path) -> (Gateway, String) {
    start_with(dir, &[]).await
}

/// [`start`] with more arguments.
async fn start_with(dir: &Path, more: &[&str]) -> (Gateway, String) {
    let config = config(dir);
    let mut command = tokio::process::Command::new(PSYCH);
    command
        .args(["serve", "--http", "127.0.0.1:0", "--tokens"])
        .arg(dir.join("tokens.json"))
        .arg("--config")
        .arg(&config)
        .arg("--dir")
        .arg(dir)
        .args(more);
    listening(command).await
}

/// A client that answers every elicitation with `accept` and its name, declaring
/// `capabilities`.
struct Person {
    name: &'static str,
    capabilities: ClientCapabilities,
    version: ProtocolVersion,
}

impl ClientHandler for Person {
    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"name": self.name})))
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(self.capabilities.clone(), Implementation::new("t", "0"))
            .with_protocol_version(self.version.clone())
    }
}

type Session = RunningService<RoleClient, Person>;

/// Waits until both upstreams are listed: the gateway connects them in the background
/// (a deferred one is "not listed yet" until then).
async fn listed(session: &Session) {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let tools = session.list_all_tools().await.unwrap();
            let text = serde_json::to_string(&tools).unwrap();
            if tools.iter().any(|t| t.name == "up__confirm") && !text.contains("not listed yet") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the upstreams are listed");
}

/// The capabilities of a client that can answer elicitations (`true`) or nothing.
fn capabilities(elicitation: bool) -> ClientCapabilities {
    let declared = if elicitation {
        json!({"elicitation": {"form": {}}})
    } else {
        json!({})
    };
    serde_json::from_value(declared).unwrap()
}

/// A client of 2026-07-28 (no session) presenting `token`, as `name`.
async fn modern(url: &str, token: &str, name: &'static str, elicitation: bool) -> Session {
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token);
    Person {
        name,
        capabilities: capabilities(elicitation),
        version: ProtocolVersion::V_2026_07_28,
    }
    .serve_with_lifecycle(
        StreamableHttpClientTransport::from_config(config),
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .unwrap()
}

/// A session of 2025-11-25 (`initialize`) presenting `token`, declaring elicitation.
async fn legacy(url: &str, token: &str) -> Session {
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token);
    let session = Person {
        name: "legacy",
        capabilities: capabilities(true),
        version: ProtocolVersion::V_2025_11_25,
    }
    .serve_with_lifecycle(
        StreamableHttpClientTransport::from_config(config),
        ClientLifecycleMode::Initialize,
    )
    .await
    .unwrap();
    let version = session.peer_info().unwrap().protocol_version.clone();
    assert_eq!(version, ProtocolVersion::V_2025_11_25);
    session
}

fn params(name: &str, arguments: Value) -> CallToolRequestParams {
    let Value::Object(arguments) = arguments else {
        panic!("arguments are an object");
    };
    CallToolRequestParams::new(name.to_owned()).with_arguments(arguments)
}

/// The JSON-RPC error of a failed call.
/// A retry of `up__confirm` with `arguments`: alice's answer to its `confirm` request and
/// the round's `state`.
fn retry(arguments: Value, state: &str) -> CallToolRequestParams {
    let mut retry = params("up__confirm", arguments);
    retry.input_responses = Some(
        [(
            "confirm".to_owned(),
            json!({"action": "accept", "content": {"name": "alice"}}),
        )]
        .into_iter()
        .collect(),
    );
    retry.request_state = Some(state.to_owned());
    retry
}

fn rpc_error(error: ServiceError) -> ErrorData {
    match error {
        ServiceError::McpError(data) => data,
        other => panic!("a JSON-RPC error, not {other:?}"),
    }
}

/// The tool results of every log of `identity` under `dir`: (tool name, readable text).
fn logged(dir: &Path, identity: &str) -> Vec<(String, String)> {
    crate::support::logged_in(&dir.join("serve").join(identity))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_required_rounds_pass_through_the_gateway_sealed_to_their_call() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, alice_digest) = token("alice");
    let (bob, bob_digest) = token("bob");
    std::fs::write(
        dir.path().join("tokens.json"),
        json!({"identities": {
            "alice": {"tokens": [alice_digest]},
            "bob": {"tokens": [bob_digest]},
        }})
        .to_string(),
    )
    .unwrap();
    let (_gateway, url) = start(dir.path()).await;
    let session = modern(&url, &alice, "alice", true).await;
    listed(&session).await;

    // Round one: the upstream's input requests as it sent them, the gateway's state.
    let asked = params("up__confirm", json!({"text": "ship it"}));
    let CallToolResponse::InputRequired(round) =
        session.call_tool_once(asked.clone()).await.unwrap()
    else {
        panic!("input required");
    };
    let expected: InputRequest = serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {"mode": "form", "message": "Confirm \"ship it\"?", "requestedSchema": {
            "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    }))
    .unwrap();
    assert_eq!(
        serde_json::to_value(&round.input_requests).unwrap(),
        json!({"confirm": serde_json::to_value(&expected).unwrap()})
    );
    let state = round.request_state.clone().expect("a sealed state");
    assert!(state.starts_with("psy1."), "{state}");
    // The gateway's own state (the upstream's inside it), not the upstream's as it is.
    assert!(
        !state.contains("confirm:"),
        "the upstream's state is wrapped: {state}"
    );

    // Forged (one digit of the MAC changed), retried under other arguments, or by another
    // identity: -32602 before anything runs.
    let last = state.chars().last().unwrap();
    let forged = format!(
        "{}{}",
        &state[..state.len() - 1],
        if last == '0' { '1' } else { '0' }
    );
    let refused = rpc_error(
        session
            .call_tool_once(retry(json!({"text": "ship it"}), &forged))
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, ErrorCode::INVALID_PARAMS, "{refused:?}");
    assert!(
        refused.message.contains("not issued by this gateway"),
        "{refused:?}"
    );
    let refused = rpc_error(
        session
            .call_tool_once(retry(json!({"text": "ship everything"}), &state))
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, ErrorCode::INVALID_PARAMS, "{refused:?}");
    assert!(refused.message.contains("another call"), "{refused:?}");
    let other = modern(&url, &bob, "bob", true).await;
    let refused = rpc_error(
        other
            .call_tool_once(retry(json!({"text": "ship it"}), &state))
            .await
            .unwrap_err(),
    );
    assert_eq!(refused.code, ErrorCode::INVALID_PARAMS, "{refused:?}");
    assert!(refused.message.contains("another identity"), "{refused:?}");
    // Answers without the state of the round they answer: nothing to check them by.
    let mut unbound = retry(json!({"text": "ship it"}), &state);
    unbound.request_state = None;
    let refused = rpc_error(session.call_tool_once(unbound).await.unwrap_err());
    assert_eq!(refused.code, ErrorCode::INVALID_PARAMS, "{refused:?}");
    assert!(
        refused.message.contains("without requestState"),
        "{refused:?}"
    );

    // Retried with the answer and the state: the final result.
    let CallToolResponse::Complete(done) = session
        .call_tool_once(retry(json!({"text": "ship it"}), &state))
        .await
        .unwrap()
    else {
        panic!("complete");
    };
    assert_eq!(text(&done), "confirmed ship it by alice");
    assert_ne!(done.is_error, Some(true));

    // rmcp's client drives the rounds itself through its elicitation handler, directly and
    // through the meta tool to the deferred server (the state binds the name called and
    // its arguments).
    let auto = session
        .call_tool(params("up__confirm", json!({"text": "auto"})))
        .await
        .unwrap();
    assert_eq!(text(&auto), "confirmed auto by alice");
    let meta = session
        .call_tool(params(
            "psych_call_tool",
            json!({"server": "later", "tool": "confirm", "arguments": {"text": "meta"}}),
        ))
        .await
        .unwrap();
    assert_eq!(text(&meta), "confirmed meta by alice", "{meta:?}");

    // A client that cannot answer an elicitation gets the upstream's -32021.
    let mute = modern(&url, &alice, "mute", false).await;
    let refused = mute
        .call_tool_once(params("up__confirm", json!({"text": "mute"})))
        .await
        .unwrap_err();
    let refused = format!("{refused:?}");
    assert!(refused.contains("-32021"), "{refused}");

    // A client of 2025-11-25 gets a tool error that says what to do.
    let old = legacy(&url, &alice).await;
    let answered = old
        .call_tool(params("up__confirm", json!({"text": "old"})))
        .await
        .unwrap();
    assert_eq!(answered.is_error, Some(true));
    let said = text(&answered);
    assert!(
        said.contains("up/confirm") && said.contains("2026-07-28") && said.contains("2025-11-25"),
        "{said}"
    );

    // Only the final results were logged: no round, no refusal, no legacy error.
    let results = logged(dir.path(), "alice");
    assert_eq!(
        results,
        vec![
            (
                "up__confirm".to_owned(),
                "confirmed ship it by alice".to_owned()
            ),
            (
                "up__confirm".to_owned(),
                "confirmed auto by alice".to_owned()
            ),
            (
                "psych_call_tool".to_owned(),
                "confirmed meta by alice".to_owned()
            ),
        ]
    );
    assert!(logged_or_none(dir.path(), "bob").is_empty());
    for client in [session, other, mute, old] {
        client.cancel().await.unwrap();
    }
}

/// [`logged`], or nothing when the identity has no folder (it never logged a call).
fn logged_or_none(dir: &Path, identity: &str) -> Vec<(String, String)> {
    if dir.join("serve").join(identity).is_dir() {
        logged(dir, identity)
    } else {
        Vec::new()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_stdio_a_client_of_2026_07_28_answers_the_upstreams_elicitation() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let transport = crate::support::stdio_gateway(&config, dir.path(), &[]);
    let session = Person {
        name: "stdio",
        capabilities: capabilities(true),
        version: ProtocolVersion::V_2026_07_28,
    }
    .serve_with_lifecycle(
        transport,
        ClientLifecycleMode::Discover {
            preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        },
    )
    .await
    .unwrap();
    listed(&session).await;
    let CallToolResponse::InputRequired(round) = session
        .call_tool_once(params("up__confirm", json!({"text": "piped"})))
        .await
        .unwrap()
    else {
        panic!("input required");
    };
    let state = round.request_state.unwrap();
    let mut forged = params("up__confirm", json!({"text": "piped"}));
    forged.request_state = Some(state.replace("psy1.", "psy1.00"));
    let refused = rpc_error(session.call_tool_once(forged).await.unwrap_err());
    assert_eq!(refused.code, ErrorCode::INVALID_PARAMS, "{refused:?}");
    let done = session
        .call_tool(params("up__confirm", json!({"text": "piped"})))
        .await
        .unwrap();
    assert_eq!(text(&done), "confirmed piped by stdio");
    assert_eq!(
        logged(dir.path(), "stdio"),
        vec![(
            "up__confirm".to_owned(),
            "confirmed piped by stdio".to_owned()
        )]
    );
    session.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psych_mcp_reads_an_input_required_answer_raw_and_retries_it() {
    use psych_mcp::{McpConfig, McpError, McpManager};
    use psych_types::{HostAnswer, InputRound, ProgressSink, Reachability, ToolHost, ToolRef};

    let config = json!({"mcpServers": {"up": {
        "command": PSYCH,
        "args": ["serve-embedded", "--tools", "1", "--modern-only"],
    }}});
    let config = McpConfig::parse(&config.to_string(), |_| None).unwrap();
    let manager = McpManager::builder(config).build().unwrap();
    let reached = manager.connect_all().await;
    assert!(
        reached
            .values()
            .all(|r| matches!(r, Ok(Reachability::Reachable))),
        "{reached:?}"
    );
    let tool = ToolRef::parse("up", "confirm").unwrap();
    let arguments = json!({"text": "x"}).as_object().unwrap().clone();
    let sink = || ProgressSink::new(|_| {});

    // A plain call cannot answer: an error saying so, not an empty result.
    let plain = manager
        .call_tool(&tool, arguments.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(plain, McpError::MissingCapability { .. }),
        "{plain}"
    );

    // A round declaring elicitation: the upstream's answer as it sent it.
    let first = InputRound {
        client_capabilities: Some(json!({"elicitation": {}}).as_object().unwrap().clone()),
        ..InputRound::default()
    };
    let answer = manager
        .call_tool_round(&tool, arguments.clone(), first.clone(), sink())
        .await
        .unwrap();
    let HostAnswer::InputRequired(raw) = answer else {
        panic!("input required: {answer:?}");
    };
    assert_eq!(raw["resultType"], "input_required");
    assert_eq!(
        raw["requestState"],
        json!(psych_test_server::confirm_state("x"))
    );
    assert_eq!(
        raw["inputRequests"]["confirm"]["method"],
        "elicitation/create"
    );

    // The retry, with the state byte for byte: the final result.
    let retry = InputRound {
        input_responses: Some(
            json!({"confirm": {"action": "accept", "content": {"name": "mcp"}}})
                .as_object()
                .unwrap()
                .clone(),
        ),
        request_state: Some(psych_test_server::confirm_state("x")),
        ..first
    };
    let done = manager
        .call_tool_round(&tool, arguments.clone(), retry, sink())
        .await
        .unwrap();
    let HostAnswer::Complete(output) = done else {
        panic!("complete: {done:?}");
    };
    assert_eq!(output.readable_text(), "confirmed x by mcp");

    // Without the capability: the upstream's -32021, typed.
    let refused = manager
        .call_tool_round(&tool, arguments, InputRound::default(), sink())
        .await
        .unwrap();
    assert!(
        matches!(refused, HostAnswer::MissingCapability { .. }),
        "{refused:?}"
    );
    manager.shutdown().await;
}

/// An upstream `requestState` too long for the gateway's sealed state (over about 500 KiB:
/// hex doubles it, and a state over 1 MiB is refused when it comes back) fails the call at
/// once, naming the upstream and the bound. (Before, the gateway handed out a state it
/// would refuse on the retry, as "over the 1048576 a state of this gateway can be".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_state_too_long_to_seal_fails_the_call_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, alice_digest) = token("alice");
    std::fs::write(
        dir.path().join("tokens.json"),
        json!({"identities": {"alice": {"tokens": [alice_digest]}}}).to_string(),
    )
    .unwrap();
    let (_gateway, url) = start(dir.path()).await;
    let session = modern(&url, &alice, "alice", true).await;
    listed(&session).await;
    // The confirm tool's state holds its text.
    let huge = "x".repeat(600 << 10);
    // (Not `unwrap_err`: a state handed out would be printed whole, 1 MiB.)
    let Err(refused) = session
        .call_tool_once(params("up__confirm", json!({"text": huge})))
        .await
    else {
        panic!("refused at once, not handed a state it cannot read back");
    };
    let refused = rpc_error(refused);
    assert_eq!(refused.code, ErrorCode::INTERNAL_ERROR, "{refused:?}");
    assert!(
        refused.message.starts_with(
            "up/confirm answered input_required with a requestState of 614412 bytes: sealed"
        ),
        "{}",
        refused.message
    );
    // A state it can seal still goes through, a large one too (sealed, then opened on its
    // retry, on a blocking thread), and its round completes.
    let long = "y".repeat(200 << 10);
    let CallToolResponse::InputRequired(round) = session
        .call_tool_once(params("up__confirm", json!({"text": long})))
        .await
        .unwrap()
    else {
        panic!("input required");
    };
    let state = round.request_state.expect("a sealed state");
    assert!(state.len() > 400 << 10, "{}", state.len());
    let answered = retry(json!({"text": long}), &state);
    let CallToolResponse::Complete(done) = session.call_tool_once(answered).await.unwrap() else {
        panic!("complete");
    };
    let said = text(&done);
    assert!(
        said.starts_with("confirmed yyy"),
        "{}",
        &said[..said.len().min(300)]
    );
    assert_ne!(done.is_error, Some(true));
}

/// Replicas on one store (`--store`) seal rounds with the key the store holds for them: a
/// round answered by one replica is retried on the other and completes, as a client behind
/// a load balancer retries; a gateway with a key of its own refuses it as not its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_one_store_complete_each_others_rounds() {
    let schema = psych_store_conformance::pg::Schema::fresh("replica_rounds");
    let store = schema.url();
    let (alice, digest) = token("alice");
    let dirs = [(); 3].map(|()| tempfile::tempdir().unwrap());
    for dir in &dirs {
        std::fs::write(
            dir.path().join("tokens.json"),
            json!({"identities": {"alice": {"tokens": [digest]}}}).to_string(),
        )
        .unwrap();
    }
    let (_a, url_a) = start_with(dirs[0].path(), &["--store", &store]).await;
    let (_b, url_b) = start_with(dirs[1].path(), &["--store", &store]).await;
    let (_alone, url_alone) = start(dirs[2].path()).await;
    let on_a = modern(&url_a, &alice, "alice", true).await;
    listed(&on_a).await;
    let asked = params("up__confirm", json!({"text": "ship it"}));
    let CallToolResponse::InputRequired(round) = on_a.call_tool_once(asked).await.unwrap() else {
        panic!("input required");
    };
    let state = round.request_state.expect("a sealed state");
    let retry = retry(json!({"text": "ship it"}), &state);
    let alone = modern(&url_alone, &alice, "alice", true).await;
    listed(&alone).await;
    let refused = rpc_error(alone.call_tool_once(retry.clone()).await.unwrap_err());
    assert_eq!(refused.code, ErrorCode::INVALID_PARAMS, "{refused:?}");
    assert!(
        refused.message.contains("not issued by this gateway"),
        "{refused:?}"
    );
    let on_b = modern(&url_b, &alice, "alice", true).await;
    listed(&on_b).await;
    let CallToolResponse::Complete(done) = on_b.call_tool_once(retry).await.unwrap() else {
        panic!("complete");
    };
    assert_eq!(text(&done), "confirmed ship it by alice");
}
