//! Byte-stable prompt snapshots: the complete requests psych-prompt-assembly renders for a
//! realistic three-turn conversation, for both providers, with the real elision projector
//! (`psych_elision::Elider`) plugged into the assembler through `ResultProjector`.
//!
//! The conversation has a deferred server (its capability line in zone 1 and the three meta
//! tools among the tools, with the real `read_tool_output` definition of psych-reader-tool), a large result from turn 1 that is elided by turn 3, a failed
//! call in turn 2 that is truncated, a memory added between turns 2 and 3, and two parallel
//! calls in turn 3 (one returning an image) whose results are sent in full. Reviewing these
//! snapshot diffs is how changes to prompt assembly are judged: the bodies are shown
//! pretty-printed with their key order and content exactly as sent.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CacheReport, CacheRules, CurrentTime, DynamicTail, OpenAiOptions,
    RenderedRequest, StaticSections, Transient,
};
use psych_types::{
    ContentBlock, LoggedRecord, Record, RecordHandle, RunId, ToolDefinition, ToolName, ToolOutput,
};
use serde_json::{Value, json};

use crate::common;
use crate::common::{fixture_tools, small_elider};

use psych_test_support::rules;

/// Three real filesystem tools, the deferred-server meta tools and the real reader tool
/// (`psych_reader_tool::tool_definition`).
fn tools() -> Vec<ToolDefinition> {
    let mut tools: Vec<ToolDefinition> = fixture_tools("server-filesystem.tools.json")
        .into_iter()
        .filter(|t| {
            ["list_directory", "read_media_file", "read_text_file"].contains(&t.name.as_str())
        })
        .collect();
    assert_eq!(tools.len(), 3);
    let meta = |name: &str, description: &str, schema: Value| {
        let Value::Object(schema) = schema else {
            unreachable!()
        };
        ToolDefinition::new(ToolName::new(name).unwrap(), description, schema)
    };
    let server = json!({"type": "string", "description": "The deferred server's name."});
    tools.push(meta(
        "deferred_list_tools",
        "List the tools you may call on a deferred server.",
        json!({"type": "object", "properties": {"server": server}, "required": ["server"]}),
    ));
    tools.push(meta(
        "deferred_describe_tool",
        "Read one deferred tool's description and input schema.",
        json!({"type": "object", "properties": {"server": server, "tool": {"type": "string"}}, "required": ["server", "tool"]}),
    ));
    tools.push(meta(
        "deferred_call_tool",
        "Call one tool of a deferred server by (server, tool).",
        json!({"type": "object", "properties": {"server": server, "tool": {"type": "string"}, "arguments": {"type": "object"}}, "required": ["server", "tool", "arguments"]}),
    ));
    // The reader's own definition, as the runtime discloses it.
    tools.push(psych_reader_tool::tool_definition(
        &psych_reader_tool::Limits::default(),
    ));
    tools
}

fn zone1() -> StaticSections {
    StaticSections::new(
        "You are Psych, a careful assistant for a Rust repository. Prefer reading files over guessing.",
    )
    .skill("changelog", "Write a changelog entry in the project's format")
    .skill("release-notes", "Turn merged pull requests into release notes")
    .subagent("reviewer", "Reviews a diff and reports problems")
    .capability_note(
        "github (deferred, 117 tools): GitHub's MCP server: issues, pull requests, code search. \
         Reach it with deferred_list_tools, deferred_describe_tool and deferred_call_tool.",
    )
}

/// A 1x1 PNG.
const PNG: [u8; 67] = [
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0a, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x00, 0x01, 0x00, 0x00,
    0x05, 0x00, 0x01, 0x0d, 0x0a, 0x2d, 0xb4, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae,
    0x42, 0x60, 0x82,
];

struct Log {
    run: RunId,
    records: Vec<LoggedRecord>,
}

impl Log {
    fn push(&mut self, record: Record) {
        let handle = RecordHandle::new(self.run.clone(), self.records.len() as u64);
        self.records.push(LoggedRecord { handle, record });
    }

    fn user(&mut self, text: &str) {
        self.push(common::user(text));
    }

    fn assistant(&mut self, text: &str, calls: &[(&str, &str, Value)]) {
        self.push(common::assistant(text, calls));
    }

    fn result(&mut self, id: &str, name: &str, output: ToolOutput) {
        self.push(common::result(id, name, output));
    }
}

fn changelog() -> String {
    (0..120)
        .rev()
        .map(|i| {
            format!(
                "## 0.{i}.0\n- Fixed issue #{} in the record log.\n",
                1000 + i
            )
        })
        .collect()
}

/// The conversation, and the model calls made along it: (history length, memories, time).
fn conversation() -> (Vec<LoggedRecord>, Vec<(usize, DynamicTail, CurrentTime)>) {
    let mut log = Log {
        run: RunId::new("run-2026-11-30").unwrap(),
        records: Vec::new(),
    };
    let mut calls = Vec::new();
    let memory = DynamicTail::new().memory("The repository is psych, a Rust workspace.");
    let mut clock = 1_796_041_497;
    let mut call = |log: &Log, tail: &DynamicTail, calls: &mut Vec<_>| {
        clock += 13;
        calls.push((
            log.records.len(),
            tail.clone(),
            CurrentTime::utc(clock).unwrap(),
        ));
    };

    // Turn 1: a large result.
    log.user("Summarise CHANGELOG.md for me.");
    call(&log, &memory, &mut calls);
    log.assistant(
        "I'll read the changelog.",
        &[(
            "toolu_01",
            "read_text_file",
            json!({"path": "CHANGELOG.md"}),
        )],
    );
    log.result("toolu_01", "read_text_file", ToolOutput::text(changelog()));
    call(&log, &memory, &mut calls);
    log.assistant("It lists 120 releases; most fix the record log.", &[]);

    // Turn 2: the deferred server, and a call that fails.
    log.user("Is there an open issue about flaky tests on GitHub?");
    call(&log, &memory, &mut calls);
    log.assistant(
        "",
        &[(
            "toolu_02",
            "deferred_list_tools",
            json!({"server": "github"}),
        )],
    );
    log.result(
        "toolu_02",
        "deferred_list_tools",
        ToolOutput::text("search_issues\nget_issue\nlist_issues\nsearch_pull_requests"),
    );
    call(&log, &memory, &mut calls);
    log.assistant(
        "",
        &[(
            "toolu_03",
            "deferred_call_tool",
            json!({"server": "github", "tool": "search_issues", "arguments": {"query": "flaky tests is:open"}}),
        )],
    );
    let trace: String = (0..30)
        .map(|i| format!("\n    at github::client::request (client.rs:{})", 100 + i))
        .collect();
    log.result(
        "toolu_03",
        "deferred_call_tool",
        ToolOutput::error(format!("GitHub API error 401: Bad credentials{trace}")),
    );
    call(&log, &memory, &mut calls);
    log.assistant("I couldn't search GitHub: it refused the credentials.", &[]);

    // Turn 3: a new memory, two parallel calls, one returning an image.
    let memory = memory.memory("The user wants file paths in answers.");
    log.user("Fine. List tests/ and look at the failing screenshot.");
    call(&log, &memory, &mut calls);
    log.assistant(
        "",
        &[
            ("toolu_04", "list_directory", json!({"path": "tests"})),
            (
                "toolu_05",
                "read_media_file",
                json!({"path": "tests/failure.png"}),
            ),
        ],
    );
    log.result(
        "toolu_05",
        "read_media_file",
        ToolOutput::from_blocks(vec![ContentBlock::image("image/png", PNG.to_vec())]),
    );
    log.result(
        "toolu_04",
        "list_directory",
        ToolOutput::text("[FILE] failure.png\n[FILE] prompt_snapshots.rs\n[DIR] snapshots"),
    );
    call(&log, &memory, &mut calls);
    (log.records, calls)
}

/// Renders every call of the conversation.
fn render_all() -> Vec<(RenderedRequest, RenderedRequest)> {
    let (history, calls) = conversation();
    let tools = tools();
    let zone1 = zone1();
    let projector = small_elider();
    calls
        .iter()
        .map(|(len, tail, now)| {
            let transient = Transient::at(*now);
            let prompt = Assembler::new(&zone1, tail, &tools)
                .assemble(&history[..*len], &projector, &transient)
                .unwrap();
            (
                prompt
                    .render_anthropic(&AnthropicOptions::new("claude-sonnet-4-5", 2048))
                    .unwrap(),
                prompt
                    .render_openai(
                        &OpenAiOptions::new("gpt-4.1").prompt_cache_key("run-2026-11-30"),
                    )
                    .unwrap(),
            )
        })
        .collect()
}

/// The rule checker on an Anthropic body (the last message is the transient one).
fn check_anthropic(body: &Value) {
    assert_eq!(rules::check_anthropic_body(&body.to_string(), true), Ok(()));
}

/// The rule checker on an OpenAI body.
fn check_openai(body: &Value) {
    assert_eq!(rules::check_openai_body(&body.to_string()), Ok(()));
}

#[test]
fn three_turn_conversation_requests() {
    let rendered = render_all();
    let (anthropic, openai) = rendered.last().unwrap();
    let anthropic_body: Value = serde_json::from_str(anthropic.body()).unwrap();
    let openai_body: Value = serde_json::from_str(openai.body()).unwrap();
    check_anthropic(&anthropic_body);
    check_openai(&openai_body);

    // What the snapshots must show, asserted so a bad update cannot be accepted blindly.
    let a = anthropic.body();
    assert!(
        a.contains("read_tool_output with handle \\\"run-2026-11-30:2\\\""),
        "turn 1's result is elided"
    );
    assert!(
        !a.contains("## 0.60.0"),
        "the middle of the changelog is not sent"
    );
    assert!(a.contains("\"is_error\":true"));
    assert!(!a.contains("client.rs:129"), "the failure is truncated");
    assert!(
        a.contains("\"type\":\"image\""),
        "the current turn's image is sent whole"
    );
    assert!(a.contains("The user wants file paths in answers."));
    assert_eq!(anthropic.breakpoint_blocks().len(), 3);
    // OpenAI: the placeholder in the tool message, the image in a user message after it.
    let o = openai.body();
    assert!(o.contains("\"content\":\"[content block #0: image, image/png, 67 bytes]\""));
    assert!(o.contains("\"image_url\":{\"url\":\"data:image/png;base64,iVBORw0KGgo"));
    // The reader tool is the reader crate's own definition, under its one name.
    let reader = psych_reader_tool::tool_definition(&psych_reader_tool::Limits::default());
    assert_eq!(reader.name.as_str(), psych_types::READ_TOOL_OUTPUT);
    assert!(a.contains(&format!(
        "\"description\":{}",
        serde_json::to_string(reader.description_or_empty()).unwrap()
    )));

    insta::assert_snapshot!("anthropic_turn3", anthropic.pretty_body());
    insta::assert_snapshot!("openai_turn3", openai.pretty_body());

    // The whole conversation's cache report, per provider.
    // Estimated tokens as each provider bills them (psych-elision's estimator; OpenAI's
    // cached input at 0.25x, gpt-4.1's price).
    let estimator = psych_elision::Estimator::new();
    let report = |pick: fn(&(RenderedRequest, RenderedRequest)) -> &RenderedRequest,
                  rules: CacheRules| {
        CacheReport::new(
            &rendered.iter().map(|r| pick(r).clone()).collect::<Vec<_>>(),
            &estimator,
            rules,
        )
    };
    let anthropic_report = report(|r| &r.0, CacheRules::anthropic(1024));
    let openai_report = report(|r| &r.1, CacheRules::openai(0.25));
    insta::assert_snapshot!(
        "cache_report",
        format!("anthropic\n{anthropic_report}\n\nopenai\n{openai_report}")
    );
}

#[test]
fn every_request_of_the_conversation_is_well_formed_and_stable() {
    let rendered = render_all();
    for (anthropic, openai) in &rendered {
        check_anthropic(&serde_json::from_str(anthropic.body()).unwrap());
        check_openai(&serde_json::from_str(openai.body()).unwrap());
    }
    // Rendering again gives the same bytes.
    let again = render_all();
    for (a, b) in rendered.iter().zip(&again) {
        assert_eq!(a.0.body(), b.0.body());
        assert_eq!(a.1.body(), b.1.body());
    }
}

/// A history of MCP results as servers return them: in turn 1 a browser screenshot whose
/// long text comes with a real PNG (elided by turn 2: its placeholders are kept) and a
/// result that is only `structuredContent`; in turn 2 a text + real PNG + text result, sent
/// whole. Snapshotted for both providers.
#[test]
fn mcp_results_requests() {
    let mut log = Log {
        run: RunId::new("run-mcp").unwrap(),
        records: Vec::new(),
    };
    let png = rules::images::png(4, 3, 9);
    log.user("Open the jobs page and tell me what is wrong.");
    log.assistant(
        "",
        &[
            ("toolu_11", "read_media_file", json!({"path": "jobs.png"})),
            ("toolu_12", "get_file_info", json!({"path": "jobs.png"})),
        ],
    );
    let console: String = (0..60)
        .map(|i| format!("console.error: job {i} failed to render (TypeError)\n"))
        .collect();
    log.result(
        "toolu_11",
        "read_media_file",
        ToolOutput::from_blocks(vec![
            ContentBlock::text(format!("Console output:\n{console}")),
            ContentBlock::image("image/png", png.clone()),
            ContentBlock::text("Page title: Jobs"),
        ]),
    );
    log.result(
        "toolu_12",
        "get_file_info",
        ToolOutput::json(json!({"size": png.len(), "type": "file", "permissions": "644"})),
    );
    log.assistant("Every job fails to render with a TypeError.", &[]);
    log.user("Take another screenshot now.");
    log.assistant(
        "",
        &[(
            "toolu_13",
            "read_media_file",
            json!({"path": "jobs-now.png"}),
        )],
    );
    log.result(
        "toolu_13",
        "read_media_file",
        ToolOutput::from_blocks(vec![
            ContentBlock::text("Screenshot of http://localhost:8080/jobs:"),
            ContentBlock::image("image/png", png),
            ContentBlock::text("Page title: Jobs (3 errors)"),
        ]),
    );
    let history = log.records;
    let (tools, zone1, tail) = (tools(), zone1(), DynamicTail::new());
    let transient = Transient::at(CurrentTime::utc(1_796_041_497).unwrap());
    let prompt = Assembler::new(&zone1, &tail, &tools)
        .assemble(&history, &small_elider(), &transient)
        .unwrap();
    let anthropic = prompt
        .render_anthropic(&AnthropicOptions::new("claude-sonnet-4-5", 2048))
        .unwrap();
    let openai = prompt
        .render_openai(&OpenAiOptions::new("gpt-4.1"))
        .unwrap();
    check_anthropic(&serde_json::from_str(anthropic.body()).unwrap());
    check_openai(&serde_json::from_str(openai.body()).unwrap());
    let (a, o) = (anthropic.body(), openai.body());
    // The elided mixed result keeps its placeholder; only the current turn's image is sent.
    assert!(
        a.contains("read_tool_output with handle \\\"run-mcp:2\\\""),
        "{a}"
    );
    assert!(
        a.contains("[content block #1: image, image/png, 107 bytes]"),
        "{a}"
    );
    assert_eq!(a.matches("\"type\":\"image\"").count(), 1);
    assert_eq!(o.matches("\"type\":\"image_url\"").count(), 1);
    // The structuredContent-only result is its JSON text view.
    assert!(
        a.contains("\"text\":\"{\\n  \\\"permissions\\\": \\\"644\\\""),
        "{a}"
    );
    // The snapshots cut the system prompt and the tools, which the conversation above shows.
    let messages = |request: &RenderedRequest| {
        let body = request.pretty_body();
        let at = body.find("\"messages\": [").unwrap();
        body[at..].to_owned()
    };
    insta::assert_snapshot!("mcp_results_anthropic", messages(&anthropic));
    insta::assert_snapshot!("mcp_results_openai", messages(&openai));
}
