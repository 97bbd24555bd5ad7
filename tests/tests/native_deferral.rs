//! Provider-native deferral against Psych's meta tools, from a real Surface (disclosure's
//! `resolve` over the fixture catalogues):
//!
//! - a Run (psych-runtime, a scripted model, an in-process host serving the real
//!   server-memory catalogue, deferred) where a deferred tool is searched, loaded and
//!   called, then called again the next turn, in both modes for Anthropic Messages and the
//!   OpenAI Responses API: every request through the provider's rule checker, the
//!   within-turn prefix property, the search answered by the executor from disclosure's
//!   ranking, the loaded tool's call forwarded through the guard to the host, a tool
//!   outside the grant never sent; the last request of each pinned (read by
//!   `cargo xtask sdk-check`);
//! - the comparison table (request bytes, estimated tokens, the tokens the provider bills,
//!   cache reads) over prompt-assembly's scripted 20-turn session with GitHub's 117 tools
//!   deferred, in both modes and for both providers, printed and pinned.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_test_support::prompts as pa;

use std::sync::{Arc, Mutex};

use crate::common::fixture_tools;
use pa::*;
use psych_catalog::Catalog;
use psych_disclosure::{Inputs, Settings, Surface, resolve};
use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CacheReport, CacheRules, DeferralMode, MAX_DEFERRED_TOOLS,
    NativeDeferral, OpenAiOptions, Provider, RenderedRequest, SearchTool, StaticSections,
    Transient,
};
use psych_runtime::{Next, Run, ScriptedModel, Step, Target};
use psych_types::{
    CatalogVersion, ConnectionSpec, JsonObject, PermissionGrant, Preload, Record, RunId,
    ServerCatalog, ServerHealth, ServerId, TokenEstimator, ToolDefinition, ToolHost, ToolLister,
    ToolOutput, ToolRef,
};
use serde_json::{Value, json};

/// An in-process MCP server: lists the fixture catalogue it was given and answers every
/// call with what it was called with, remembering each.
struct Host {
    tools: Vec<ToolDefinition>,
    calls: Mutex<Vec<String>>,
}

impl ToolLister for Host {
    type Error = std::io::Error;

    async fn list_tools(&self, _server: &ServerId) -> Result<Vec<ToolDefinition>, Self::Error> {
        Ok(self.tools.clone())
    }
}

impl ToolHost for Host {
    async fn call_tool(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
    ) -> Result<ToolOutput, Self::Error> {
        let line = format!("{tool} {}", serde_json::to_string(&arguments).unwrap());
        self.calls.lock().unwrap().push(line.clone());
        Ok(ToolOutput::text(format!(
            "{{\"entities\":[],\"called\":{line:?}}}"
        )))
    }
}

/// The tools of server-memory the grant leaves out: never sent, never referenced.
const NOT_PERMITTED: [&str; 3] = ["delete_entities", "delete_observations", "delete_relations"];

struct Played {
    /// (turn, request) in order.
    requests: Vec<(usize, RenderedRequest)>,
    host: Arc<Host>,
    records: Vec<Record>,
}

/// Two turns of a Run over server-memory, deferred, in `mode`, rendered for `target`.
async fn play_run(mode: DeferralMode, target: Target, turns: [Vec<Step>; 2]) -> Played {
    let memory = ServerId::new("memory").unwrap();
    let host = Arc::new(Host {
        tools: fixture_tools("server-memory.tools.json"),
        calls: Mutex::new(Vec::new()),
    });
    let catalog = Catalog::in_memory().unwrap();
    catalog
        .refresh(&memory, &host.list_tools(&memory).await.unwrap())
        .unwrap();
    let grant = host
        .tools
        .iter()
        .filter(|t| !NOT_PERMITTED.contains(&t.name.as_str()))
        .fold(PermissionGrant::none(), |grant, t| {
            grant.allow_tool(ToolRef::new(memory.clone(), t.name.clone()))
        });
    let dir = tempfile::tempdir().unwrap();
    let mut run = Run::builder(
        dir.path(),
        RunId::new("run-native").unwrap(),
        catalog,
        Arc::clone(&host),
        target,
    )
    .connections([ConnectionSpec::new(memory.clone())
        .with_preload(Preload::Deferred)
        .with_description("The user's notes, as a knowledge graph of entities.")])
    .grant(grant)
    .instructions("You are a careful assistant.")
    .deferral(mode)
    .clock(|| 1_796_041_497)
    .open()
    .await
    .unwrap();
    let mut requests = Vec::new();
    for (turn, (user, steps)) in ["What did I note about ACME?", "And about Globex?"]
        .into_iter()
        .zip(turns)
        .enumerate()
    {
        let mut model = ScriptedModel::new(steps).first_call(10 * turn as u64 + 1);
        let mut request = run.user(user).await.unwrap();
        loop {
            requests.push((turn, request.clone()));
            match run.reply(model.reply(&request)).await.unwrap() {
                Next::Request(next) => request = next,
                _ => break,
            }
        }
    }
    let records = run
        .records(0)
        .unwrap()
        .into_iter()
        .map(|logged| logged.record)
        .collect();
    Played {
        requests,
        host,
        records,
    }
}

fn native_turns() -> [Vec<Step>; 2] {
    [
        vec![
            Step::call(
                "tool_search",
                json!({"query": "search the knowledge graph for nodes"}),
            )
            .saying("I will find the tool that searches your notes."),
            Step::call("memory__search_nodes", json!({"query": "ACME"})),
            Step::say("Nothing about ACME yet."),
        ],
        // Loaded last turn, the tool is called straight away.
        vec![
            Step::call("memory__search_nodes", json!({"query": "Globex"})),
            Step::say("Nothing about Globex either."),
        ],
    ]
}

fn meta_turns() -> [Vec<Step>; 2] {
    let call = |query: &str| {
        Step::call(
            "psych_call_tool",
            json!({"server": "memory", "tool": "search_nodes", "arguments": {"query": query}}),
        )
    };
    [
        vec![
            Step::call(
                "psych_describe_tool",
                json!({"server": "memory", "tool": "search_nodes"}),
            )
            .saying("I will read how the notes are searched."),
            call("ACME"),
            Step::say("Nothing about ACME yet."),
        ],
        vec![call("Globex"), Step::say("Nothing about Globex either.")],
    ]
}

/// Every request passes the provider's rules; within a turn each extends the last.
fn check(played: &Played, provider: Provider) {
    for (k, (turn, request)) in played.requests.iter().enumerate() {
        let verdict = match provider {
            Provider::Anthropic => check_anthropic_body(request.body(), true),
            _ => check_responses_body(request.body()),
        };
        assert_eq!(verdict, Ok(()), "request {k}");
        if k > 0 && played.requests[k - 1].0 == *turn {
            assert!(
                request
                    .cache_stream()
                    .starts_with(&cacheable(&played.requests[k - 1].1)),
                "request {k} breaks the prefix"
            );
        }
        for tool in NOT_PERMITTED {
            assert!(!request.body().contains(tool), "{tool} sent in request {k}");
        }
    }
    assert_eq!(
        *played.host.calls.lock().unwrap(),
        [
            r#"memory/search_nodes {"query":"ACME"}"#,
            r#"memory/search_nodes {"query":"Globex"}"#
        ]
    );
}

#[tokio::test]
async fn a_deferred_tool_searched_loaded_and_called_through_a_run() {
    let anthropic = || Target::Anthropic(AnthropicOptions::new("claude-sonnet-4-5", 1024));
    let responses =
        || Target::Responses(OpenAiOptions::new("gpt-5.1").prompt_cache_key("run-native"));
    let cases = [
        ("anthropic_native", DeferralMode::Native, anthropic()),
        ("responses_native", DeferralMode::Native, responses()),
        ("anthropic_meta", DeferralMode::MetaTools, anthropic()),
        ("responses_meta", DeferralMode::MetaTools, responses()),
    ];
    for (label, mode, target) in cases {
        let provider = target.provider();
        let turns = match mode {
            DeferralMode::Native => native_turns(),
            _ => meta_turns(),
        };
        let played = play_run(mode, target, turns).await;
        check(&played, provider);
        let first = played.requests[0].1.body();
        if mode == DeferralMode::Native {
            // The search was answered by the executor from disclosure's ranking: a
            // reference to the permitted deferred tool, logged like any result.
            let search = played
                .records
                .iter()
                .find_map(|r| match r {
                    Record::ToolResult(result) if result.name == "tool_search" => Some(result),
                    _ => None,
                })
                .expect("the search's result is logged");
            let answer = serde_json::to_string(&search.output).unwrap();
            assert!(
                answer.contains(r#"{"tool_name":"memory__search_nodes","type":"tool_reference"}"#),
                "{answer}"
            );
            assert!(first.contains(r#""defer_loading":true"#));
            assert!(!first.contains("psych_call_tool"));
        } else {
            assert!(!first.contains("defer_loading"));
            assert!(first.contains("psych_call_tool"));
        }
        let prefix = match provider {
            Provider::Anthropic => "anthropic",
            _ => "responses",
        };
        let last = &played.requests.last().unwrap().1;
        insta::assert_snapshot!(
            format!("run_{label}"),
            format!("{prefix}: {}", last.pretty_body())
        );
    }
}

#[tokio::test]
async fn chat_completions_falls_back_to_the_meta_tools() {
    let played = play_run(
        DeferralMode::Native,
        Target::OpenAi(OpenAiOptions::new("gpt-4.1")),
        meta_turns(),
    )
    .await;
    for (_, request) in &played.requests {
        assert_eq!(check_openai_body(request.body()), Ok(()));
        assert!(!request.body().contains("defer_loading"));
        assert!(request.body().contains("psych_call_tool"));
    }
}

/// About four bytes a token.
struct Bytes4;

impl TokenEstimator for Bytes4 {
    fn estimate_text(&self, text: &str) -> u64 {
        text.len().div_ceil(4) as u64
    }

    fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
        len.div_ceil(3)
    }
}

/// The Surface disclosure resolves for `servers` (name, fixture file), each deferred, all
/// granted.
fn deferred_surface(servers: &[(String, &str)]) -> Surface {
    let connections: Vec<ConnectionSpec> = servers
        .iter()
        .map(|(name, _)| {
            ConnectionSpec::new(ServerId::new(name.as_str()).unwrap())
                .with_preload(Preload::Deferred)
        })
        .collect();
    let catalogs: Vec<ServerCatalog> = servers
        .iter()
        .map(|(name, file)| {
            let mut tools = fixture_tools(file);
            tools.sort_by(|a, b| a.name.cmp(&b.name));
            ServerCatalog {
                server: ServerId::new(name.as_str()).unwrap(),
                version: CatalogVersion(1),
                tools: tools.into(),
                health: ServerHealth::default(),
            }
        })
        .collect();
    let grant = connections.iter().fold(PermissionGrant::none(), |g, c| {
        g.allow_server(c.server.clone())
    });
    let inputs = Inputs {
        connections: &connections,
        catalogs: &catalogs,
        grant: &grant,
    };
    resolve(&inputs, &Settings::default(), &Bytes4).unwrap()
}

/// Estimated tokens of the deferred tools' definitions as a request carries them: what
/// the provider does not bill until a search loads them.
fn deferred_tokens(request: &RenderedRequest) -> u64 {
    let body: Value = serde_json::from_str(request.body()).unwrap();
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|tool| tool["defer_loading"] == true)
        .map(|tool| Bytes4.estimate_text(&tool.to_string()))
        .sum()
}

#[test]
fn comparison_over_the_scripted_session() {
    let session = play(&twenty_turns());
    let surface = deferred_surface(&[("github".to_owned(), "github.tools.json")]);
    let deferral = NativeDeferral::new(surface.deferred_tools(), SearchTool::client());
    // The session's own tools, plus the Surface's: the meta tools and the orientation tool,
    // or natively the orientation tool beside the deferred tools and the search tool.
    let mut with_meta = tools();
    with_meta.extend(surface.tools().iter().cloned());
    let mut native_tools = tools();
    native_tools.extend(surface.native_tools());
    let zone1 = surface.deferred_lines().iter().fold(
        StaticSections::new("You are a careful engineering assistant."),
        |zone, line| zone.capability_note(line.clone()),
    );
    let projector = TestProjector::default();
    let mut table = format!(
        "20-turn session, {} requests, GitHub's {} tools deferred (estimated tokens: bytes/4)\n\
         (billed: without the deferred definitions; cache read and cost of the billed tokens)\n\
         mode/provider          bytes/request   est. tokens   billed est.   cache read   cost\n",
        session.calls.len(),
        deferral.tools().len()
    );
    let mut figures = Vec::new();
    for (label, native, provider) in [
        ("meta tools, anthropic", false, Provider::Anthropic),
        ("native, anthropic", true, Provider::Anthropic),
        ("meta tools, responses", false, Provider::OpenAiResponses),
        ("native, responses", true, Provider::OpenAiResponses),
    ] {
        let tools = if native { &native_tools } else { &with_meta };
        let requests: Vec<RenderedRequest> = session
            .calls
            .iter()
            .map(|call| {
                let transient = Transient::at(call.time);
                let prompt = Assembler::new(&zone1, &call.tail, tools)
                    .assemble(&session.history[..call.history_len], &projector, &transient)
                    .unwrap();
                match (provider, native) {
                    (Provider::Anthropic, true) => {
                        prompt.render_anthropic(&anthropic().native_deferral(deferral.clone()))
                    }
                    (Provider::Anthropic, false) => prompt.render_anthropic(&anthropic()),
                    (_, true) => {
                        prompt.render_responses(&openai().native_deferral(deferral.clone()))
                    }
                    (_, false) => prompt.render_responses(&openai()),
                }
                .unwrap()
            })
            .collect();
        for request in &requests {
            let ok = match provider {
                Provider::Anthropic => check_anthropic_body(request.body(), true),
                _ => check_responses_body(request.body()),
            };
            assert_eq!(ok, Ok(()));
        }
        for k in 1..requests.len() {
            if session.calls[k].turn == session.calls[k - 1].turn {
                assert!(
                    requests[k]
                        .cache_stream()
                        .starts_with(&cacheable(&requests[k - 1])),
                    "{label}: request {k} breaks the prefix"
                );
            }
        }
        let rules = match provider {
            Provider::Anthropic => CacheRules::anthropic(1024),
            _ => CacheRules::openai(0.1),
        };
        let report = CacheReport::new(&requests, &Bytes4, rules);
        let bytes: usize = requests.iter().map(|r| r.body().len()).sum();
        // The billed view: the deferred definitions are not input until loaded, so they come
        // out of each request's tokens, out of its cache read when the read covers them (the
        // read prefix always spans the tool list), else out of its cache write.
        let (read_price, write_price) = match provider {
            Provider::Anthropic => (0.1, 1.25),
            _ => (0.1, 1.0),
        };
        let (mut total, mut read, mut written) = (0u64, 0u64, 0u64);
        for (request, row) in requests.iter().zip(report.rows()) {
            let d = if native { deferred_tokens(request) } else { 0 };
            total += row.tokens - d;
            read += row.read.saturating_sub(d);
            written += row.written.saturating_sub(d - d.min(row.read));
        }
        let plain = total - read - written;
        let cost =
            (read as f64 * read_price + written as f64 * write_price + plain as f64) / total as f64;
        let n = requests.len() as u64;
        table.push_str(&format!(
            "{label:<22} {:>13} {:>13} {:>13} {:>11.1}% {:>6.3}x\n",
            bytes as u64 / n,
            report.total_tokens() / n,
            total / n,
            read as f64 / total as f64 * 100.0,
            cost,
        ));
        figures.push((bytes, total));
    }
    // What a request carries at 1,000+ deferred tools: the six fixture catalogues, served
    // under 24 server names (1,224 tools), every one deferred, sent in full on every request.
    let mut servers = Vec::new();
    for copy in 0..4 {
        for (file, server) in [
            ("github.tools.json", "github"),
            ("notion.tools.json", "notion"),
            ("playwright.tools.json", "playwright"),
            ("server-filesystem.tools.json", "files"),
            ("server-memory.tools.json", "memory"),
            ("github.tools.full.json", "ghfull"),
        ] {
            servers.push((format!("{server}{copy}"), file));
        }
    }
    let many = deferred_surface(&servers);
    let big = NativeDeferral::new(many.deferred_tools(), SearchTool::client());
    let first = &session.calls[0];
    let transient = Transient::at(first.time);
    let mut big_tools = tools();
    big_tools.extend(many.native_tools());
    let big_zone1 = many.deferred_lines().iter().fold(
        StaticSections::new("You are a careful engineering assistant."),
        |zone, line| zone.capability_note(line.clone()),
    );
    let prompt = Assembler::new(&big_zone1, &first.tail, &big_tools)
        .assemble(
            &session.history[..first.history_len],
            &projector,
            &transient,
        )
        .unwrap();
    let request = prompt
        .render_anthropic(&anthropic().native_deferral(big.clone()))
        .unwrap();
    assert_eq!(check_anthropic_body(request.body(), true), Ok(()));
    table.push_str(&format!(
        "at {} deferred tools: {} bytes a request ({} est. tokens of deferred schemas, not billed \
         until loaded; Anthropic's limit is {MAX_DEFERRED_TOOLS} tools)\n",
        big.tools().len(),
        request.body().len(),
        deferred_tokens(&request),
    ));
    println!("{table}");
    insta::assert_snapshot!("comparison", table);
    // Native mode sends more bytes (every deferred schema) but bills fewer tokens than the
    // meta tools, whose definitions are always loaded.
    assert!(figures[1].0 > figures[0].0 && figures[3].0 > figures[2].0);
    assert!(figures[1].1 < figures[0].1 && figures[3].1 < figures[2].1);
}
