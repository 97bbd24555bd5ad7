//! Native deferral against the meta tools, for Anthropic and the OpenAI Responses API, at
//! the renderer: a turn where a deferred tool is searched, loaded and called, the rule
//! checker and the within-turn prefix property on every step in both modes, a reference to
//! a tool outside the deferred set never sent, the fallback above the documented limit.
//! The snapshots of complete requests from a real Surface and a real Run, and the
//! comparison table, are in the workspace's `tests/tests/native_deferral.rs` (this crate's
//! tests may not depend on disclosure).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_test_support::prompts as common;

use std::path::PathBuf;

use common::*;
use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CurrentTime, DeferralMode, DynamicTail, MAX_DEFERRED_TOOLS,
    NativeDeferral, OpenAiOptions, Provider, RenderError, RenderedRequest, SearchTool,
    StaticSections, Transient, choose_deferral, search_answer,
};
use psych_types::{
    LoggedRecord, Record, RecordHandle, RunId, ToolDefinition, ToolList, ToolName, ToolOutput,
};
use serde_json::{Value, json};

fn catalogs_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PSYCH_FIXTURES") {
        return PathBuf::from(dir).join("catalogs");
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .map(|dir| dir.join("shared/fixtures/catalogs"))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| panic!("no shared/fixtures/catalogs above {}", manifest.display()))
}

/// A fixture catalogue's tools under qualified names `server__tool`, as disclosure names
/// them.
fn qualified(file: &str, server: &str) -> Vec<ToolDefinition> {
    let text = std::fs::read_to_string(catalogs_dir().join(file)).unwrap();
    let list: ToolList = serde_json::from_str(&text).unwrap();
    list.tools
        .into_iter()
        .map(|mut tool| {
            tool.name = ToolName::new(format!("{server}__{}", tool.name)).unwrap();
            tool
        })
        .collect()
}

fn object(value: Value) -> psych_types::JsonObject {
    serde_json::from_value(value).unwrap()
}

/// Psych's three meta tools, as disclosure defines them (names and schemas).
fn meta_tools() -> Vec<ToolDefinition> {
    let def = |name: &str, description: &str, schema: Value| {
        ToolDefinition::new(ToolName::new(name).unwrap(), description, object(schema))
    };
    vec![
        def(
            "psych_list_tools",
            "List the permitted tools of a deferred server, 50 a page.",
            json!({"type": "object", "properties": {"server": {"type": "string"},
                   "page": {"type": "integer", "minimum": 1}},
                   "required": ["server"], "additionalProperties": false}),
        ),
        def(
            "psych_describe_tool",
            "Read one deferred tool's description and input schema.",
            json!({"type": "object", "properties": {"server": {"type": "string"},
                   "tool": {"type": "string"}},
                   "required": ["server", "tool"], "additionalProperties": false}),
        ),
        def(
            "psych_call_tool",
            "Call one tool of a deferred server with its arguments.",
            json!({"type": "object", "properties": {"server": {"type": "string"},
                   "tool": {"type": "string"}, "arguments": {"type": "object"}},
                   "required": ["server", "tool"], "additionalProperties": false}),
        ),
    ]
}

fn zone1_deferred() -> StaticSections {
    StaticSections::new("You are a careful engineering assistant.").capability_note(
        "Server `github` is connected and deferred (117 tools): repositories, issues, pull \
         requests, actions.",
    )
}

/// A small deferred set for the snapshots: three of GitHub's real tools.
fn small_deferral(search: SearchTool) -> NativeDeferral {
    let tools = qualified("github.tools.json", "github")
        .into_iter()
        .filter(|t| {
            matches!(
                t.name.as_str(),
                "github__create_issue" | "github__get_me" | "github__search_issues"
            )
        })
        .collect();
    NativeDeferral::new(tools, search)
}

fn read_file() -> ToolDefinition {
    ToolDefinition::new(
        ToolName::new("read_file").unwrap(),
        "Read a file",
        object(
            json!({"type": "object", "properties": {"path": {"type": "string"}},
                      "required": ["path"]}),
        ),
    )
}

/// The native session: a search, the loaded tool called, the answer; each prefix of it is
/// one step's history.
fn native_history(deferral: &NativeDeferral) -> Vec<Record> {
    let issue = json!({"owner": "acme", "repo": "app", "title": "Flaky test: cache_bill"});
    vec![
        user("Open an issue about the flaky cache_bill test in acme/app."),
        assistant(
            "",
            &[(
                "call_s1",
                "tool_search",
                json!({"query": "create a github issue"}),
            )],
        ),
        result_of(
            "call_s1",
            "tool_search",
            // Disclosure's ranking, with a name outside the deferred set in it: never sent.
            search_answer(
                [
                    "github__create_issue",
                    "secret__delete_repo",
                    "github__search_issues",
                ],
                deferral,
                5,
            ),
        ),
        assistant("", &[("call_c1", "github__create_issue", issue)]),
        result_of(
            "call_c1",
            "github__create_issue",
            ToolOutput::text("Created issue #42."),
        ),
        assistant("Filed acme/app#42.", &[]),
    ]
}

/// The same task through the meta tools: describe, then call through.
fn meta_history() -> Vec<Record> {
    let issue = json!({"owner": "acme", "repo": "app", "title": "Flaky test: cache_bill"});
    vec![
        user("Open an issue about the flaky cache_bill test in acme/app."),
        assistant(
            "",
            &[(
                "call_d1",
                "psych_describe_tool",
                json!({"server": "github", "tool": "create_issue"}),
            )],
        ),
        result_of(
            "call_d1",
            "psych_describe_tool",
            ToolOutput::text(
                "create_issue: Create a new issue in a GitHub repository. Input: {owner, repo, title, body?, labels?, assignees?}",
            ),
        ),
        assistant(
            "",
            &[(
                "call_c1",
                "psych_call_tool",
                json!({"server": "github", "tool": "create_issue", "arguments": issue}),
            )],
        ),
        result_of(
            "call_c1",
            "psych_call_tool",
            ToolOutput::text("Created issue #42."),
        ),
        assistant("Filed acme/app#42.", &[]),
    ]
}

fn logged(records: &[Record]) -> Vec<LoggedRecord> {
    let run = RunId::new("run-native").unwrap();
    records
        .iter()
        .enumerate()
        .map(|(i, record)| LoggedRecord {
            handle: RecordHandle::new(run.clone(), i as u64),
            record: record.clone(),
        })
        .collect()
}

/// Renders every step (each prefix ending before an assistant record, plus the whole) with
/// `render`, checking each body and the prefix property; returns the last body.
fn steps(
    history: &[LoggedRecord],
    tools: &[ToolDefinition],
    render: &dyn Fn(&psych_prompt_assembly::Prompt<'_>) -> RenderedRequest,
    check: fn(&str) -> Result<(), String>,
) -> Vec<RenderedRequest> {
    let zone1 = zone1_deferred();
    let tail = DynamicTail::new();
    let transient = Transient::at(CurrentTime::utc(1_796_041_497).unwrap());
    let ends: Vec<usize> = (1..=history.len())
        .filter(|&n| n == history.len() || matches!(history[n].record, Record::Assistant(_)))
        .collect();
    let rendered: Vec<RenderedRequest> = ends
        .iter()
        .map(|&n| {
            let prompt = Assembler::new(&zone1, &tail, tools)
                .assemble(&history[..n], &Whole, &transient)
                .unwrap();
            render(&prompt)
        })
        .collect();
    for (k, request) in rendered.iter().enumerate() {
        assert_eq!(check(request.body()), Ok(()), "step {k}");
        if k > 0 {
            assert!(
                request
                    .cache_stream()
                    .starts_with(&cacheable(&rendered[k - 1])),
                "step {k} breaks the prefix"
            );
        }
    }
    rendered
}

fn anthropic_check(body: &str) -> Result<(), String> {
    check_anthropic_body(body, true)
}

#[test]
fn a_deferred_tool_searched_loaded_and_called_both_modes_both_providers() {
    let deferral = small_deferral(SearchTool::client());
    let native_log = logged(&native_history(&deferral));
    let meta_log = logged(&meta_history());
    let native_tools = [read_file()];
    let mut meta_tools = meta_tools();
    meta_tools.push(read_file());

    let anthropic_native =
        AnthropicOptions::new("claude-sonnet-4-5", 1024).native_deferral(deferral.clone());
    let responses_native = OpenAiOptions::new("gpt-5.1")
        .prompt_cache_key("run-native")
        .native_deferral(deferral.clone());
    let anthropic_meta = AnthropicOptions::new("claude-sonnet-4-5", 1024);
    let responses_meta = OpenAiOptions::new("gpt-5.1").prompt_cache_key("run-native");

    let a_native = steps(
        &native_log,
        &native_tools,
        &|p| p.render_anthropic(&anthropic_native).unwrap(),
        anthropic_check,
    );
    let r_native = steps(
        &native_log,
        &native_tools,
        &|p| p.render_responses(&responses_native).unwrap(),
        check_responses_body,
    );
    let a_meta = steps(
        &meta_log,
        &meta_tools,
        &|p| p.render_anthropic(&anthropic_meta).unwrap(),
        anthropic_check,
    );
    let r_meta = steps(
        &meta_log,
        &meta_tools,
        &|p| p.render_responses(&responses_meta).unwrap(),
        check_responses_body,
    );
    // The reference outside the deferred set is never sent, in either format.
    for request in a_native.iter().chain(&r_native) {
        assert!(!request.body().contains("secret__delete_repo"));
    }
    // Each mode's last request has every kind of item: the search and its answer, the
    // loaded tool's call and result (or the meta tools' calls).
    for (native, requests) in [
        (true, &a_native),
        (true, &r_native),
        (false, &a_meta),
        (false, &r_meta),
    ] {
        let last = requests.last().unwrap().body();
        assert_eq!(last.contains(r#""defer_loading":true"#), native);
        assert!(last.contains("Created issue #42."));
    }
}

/// Only the client search tool's own result is read as references: another tool whose
/// output has blocks of that shape (an upstream may send any block type) keeps its output.
#[test]
fn blocks_shaped_as_references_in_another_tools_result_are_its_output() {
    let deferral = small_deferral(SearchTool::client());
    let reference = ToolOutput {
        content: vec![psych_types::ContentBlock::from_object(object(json!({
            "type": "tool_reference", "tool_name": "github__create_issue"
        })))],
        ..ToolOutput::text("")
    };
    let search = deferral.search().name().to_owned();
    let log = logged(&[
        user("Find the issue tool, then read the file."),
        assistant(
            "",
            &[
                ("c1", search.as_str(), json!({"query": "issue"})),
                ("c2", "read_file", json!({"path": "a"})),
            ],
        ),
        result_of("c1", &search, reference.clone()),
        result_of("c2", "read_file", reference),
    ]);
    let zone1 = zone1_deferred();
    let tail = DynamicTail::new();
    let transient = Transient::new();
    let tools = [read_file()];
    let prompt = Assembler::new(&zone1, &tail, &tools)
        .assemble(&log, &Whole, &transient)
        .unwrap();
    let body = prompt
        .render_anthropic(&AnthropicOptions::new("m", 64).native_deferral(deferral))
        .unwrap();
    let body: Value = serde_json::from_str(body.body()).unwrap();
    let results = &body["messages"][2]["content"];
    assert_eq!(
        results[0]["content"][0]["type"], "tool_reference",
        "{results}"
    );
    assert_ne!(
        results[1]["content"][0]["type"], "tool_reference",
        "{results}"
    );
}

/// A search answered by text (a refused argument, a note that nothing matched), by
/// references to no tool of the request's deferred set, or not answered at all is sent to
/// Responses as a function call and its output holding the text,
/// so the model reads why; only a search answered by references is a `tool_search_call`
/// with its `tool_search_output`. Every step's body keeps the rules and the prefix.
#[test]
fn a_search_answered_by_text_reaches_the_model_as_that_text() {
    let deferral = small_deferral(SearchTool::client());
    let search = deferral.search().name().to_owned();
    let refused = "invalid arguments for tool_search: /limit: must be an integer from 1 to 10";
    let revoked = ToolOutput {
        content: vec![psych_types::ContentBlock::from_object(object(json!({
            "type": "tool_reference", "tool_name": "secret__delete_repo"
        })))],
        ..ToolOutput::text("")
    };
    let log = logged(&[
        user("Open an issue about the flaky test."),
        assistant(
            "",
            &[(
                "s1",
                search.as_str(),
                json!({"query": "issue", "limit": 20}),
            )],
        ),
        result_of("s1", &search, ToolOutput::error(refused)),
        assistant("", &[("s2", search.as_str(), json!({"query": "zzz"}))]),
        result_of("s2", &search, ToolOutput::text("No tool matches zzz.")),
        assistant(
            "",
            &[("s3", search.as_str(), json!({"query": "create issue"}))],
        ),
        result_of(
            "s3",
            &search,
            search_answer(["github__create_issue"], &deferral, 5),
        ),
        // References to no tool of this request's deferred set (one since revoked).
        assistant("", &[("s5", search.as_str(), json!({"query": "delete"}))]),
        result_of("s5", &search, revoked),
        assistant("", &[("s4", search.as_str(), json!({"query": "late"}))]),
    ]);
    let options = OpenAiOptions::new("gpt-5.1").native_deferral(deferral.clone());
    let requests = steps(
        &log,
        &[read_file()],
        &|p| p.render_responses(&options).unwrap(),
        check_responses_body,
    );
    let body: Value = serde_json::from_str(requests.last().unwrap().body()).unwrap();
    let items: Vec<&Value> = body["input"].as_array().unwrap().iter().collect();
    let kinds: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message",
            "function_call",
            "function_call_output",
            "function_call",
            "function_call_output",
            "tool_search_call",
            "tool_search_output",
            "function_call",
            "function_call_output",
            "function_call",
            "function_call_output",
            "message",
        ],
        "{body}"
    );
    assert_eq!(items[1]["name"], search.as_str());
    assert_eq!(items[2]["output"], format!("Error: {refused}"));
    assert_eq!(items[4]["output"], "No tool matches zzz.");
    assert_eq!(items[6]["tools"][0]["name"], "github__create_issue");
    assert_eq!(items[8]["output"], psych_prompt_assembly::NO_MATCH);
    assert_eq!(
        items[10]["output"],
        format!("Error: {}", psych_prompt_assembly::MISSING_RESULT)
    );
}

#[test]
fn anthropic_server_search_and_typed_refusals() {
    let deferral = small_deferral(SearchTool::AnthropicBm25);
    let log = logged(&[user("What issues mention the cache?")]);
    let zone1 = zone1_deferred();
    let tail = DynamicTail::new();
    let transient = Transient::new();
    let tools = [read_file()];
    let prompt = Assembler::new(&zone1, &tail, &tools)
        .assemble(&log, &Whole, &transient)
        .unwrap();
    let body = prompt
        .render_anthropic(&AnthropicOptions::new("m", 64).native_deferral(deferral.clone()))
        .unwrap();
    assert_eq!(check_anthropic_body(body.body(), false), Ok(()));
    assert!(
        body.body().contains(
            r#"{"type":"tool_search_tool_bm25_20251119","name":"tool_search_tool_bm25"}"#
        )
    );
    // The server-side search is Anthropic's; Chat Completions has no deferral at all.
    assert!(matches!(
        prompt.render_responses(&OpenAiOptions::new("m").native_deferral(deferral.clone())),
        Err(RenderError::NativeDeferralUnsupported { .. })
    ));
    assert!(matches!(
        prompt.render_openai(&OpenAiOptions::new("m").native_deferral(deferral)),
        Err(RenderError::NativeDeferralUnsupported { .. })
    ));
    // A deferred tool named like a surface tool is two tools of one name.
    let clash = NativeDeferral::new(vec![read_file()], SearchTool::client());
    assert_eq!(
        prompt.render_anthropic(&AnthropicOptions::new("m", 64).native_deferral(clash)),
        Err(RenderError::DuplicateTool {
            name: "read_file".into()
        })
    );
    assert_eq!(
        choose_deferral(
            DeferralMode::Native,
            Provider::Anthropic,
            MAX_DEFERRED_TOOLS + 1
        ),
        DeferralMode::MetaTools
    );
}
