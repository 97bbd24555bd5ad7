//! Rendering edge cases, data-driven through one `check` helper that renders a small history
//! for both providers (or reports the typed error) and snapshots the result: empty texts,
//! binary and JSON outputs, failures, extra options, and every render error.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

mod common;

use common::{check_anthropic_body, check_openai_body, pretty};
use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CurrentTime, DynamicTail, OpenAiOptions, StaticSections, Transient,
};
use psych_types::{
    AssistantMessage, LoggedRecord, Record, RecordHandle, RunId, ToolCall, ToolCallId,
    ToolDefinition, ToolName, ToolOutput, ToolResult, UserMessage,
};
use serde_json::{Value, json};

fn user(text: &str) -> Record {
    Record::User(UserMessage { text: text.into() })
}

fn assistant(text: &str, calls: &[(&str, &str, Value)]) -> Record {
    Record::Assistant(AssistantMessage {
        text: text.into(),
        tool_calls: calls
            .iter()
            .map(|(id, name, arguments)| ToolCall {
                id: ToolCallId::new(*id).unwrap(),
                name: (*name).into(),
                arguments: arguments.clone(),
            })
            .collect(),
    })
}

fn result(id: &str, output: ToolOutput) -> Record {
    Record::ToolResult(ToolResult {
        call_id: ToolCallId::new(id).unwrap(),
        name: "t".into(),
        output,
    })
}

fn tool(name: &str) -> ToolDefinition {
    let mut tool = ToolDefinition::new(
        ToolName::new(name).unwrap(),
        "",
        serde_json::from_str(r#"{"type":"object"}"#).unwrap(),
    );
    tool.description = None;
    tool
}

struct Case<'a> {
    records: Vec<Record>,
    tools: Vec<ToolDefinition>,
    zone1: StaticSections,
    anthropic: AnthropicOptions,
    openai: OpenAiOptions,
    transient: Transient,
    _marker: std::marker::PhantomData<&'a ()>,
}

impl Default for Case<'_> {
    fn default() -> Self {
        Self {
            records: Vec::new(),
            tools: vec![tool("t")],
            zone1: StaticSections::new("Be brief."),
            anthropic: AnthropicOptions::new("claude-sonnet-4-5", 512),
            openai: OpenAiOptions::new("gpt-4.1"),
            transient: Transient::at(CurrentTime::utc(0).unwrap()),
            _marker: std::marker::PhantomData,
        }
    }
}

/// Renders a case for both providers: each body pretty-printed, or its error.
fn check(case: Case<'_>) -> String {
    let run = RunId::new("r").unwrap();
    let history: Vec<LoggedRecord> = case
        .records
        .into_iter()
        .enumerate()
        .map(|(i, record)| LoggedRecord {
            handle: RecordHandle::new(run.clone(), i as u64),
            record,
        })
        .collect();
    let tail = DynamicTail::new();
    let has_transient = case.transient != Transient::new();
    let prompt = match Assembler::new(&case.zone1, &tail, &case.tools).assemble(
        &history,
        &common::Whole,
        &case.transient,
    ) {
        Ok(prompt) => prompt,
        Err(err) => return format!("assemble error: {err}"),
    };
    let anthropic = match prompt.render_anthropic(&case.anthropic) {
        Ok(request) => match check_anthropic_body(request.body(), has_transient) {
            Ok(()) => pretty(request.body()),
            Err(problem) => format!("check failed: {problem}\n{}", pretty(request.body())),
        },
        Err(err) => format!("error: {err}"),
    };
    let openai = match prompt.render_openai(&case.openai) {
        Ok(request) => match check_openai_body(request.body()) {
            Ok(()) => pretty(request.body()),
            Err(problem) => format!("check failed: {problem}\n{}", pretty(request.body())),
        },
        Err(err) => format!("error: {err}"),
    };
    format!("anthropic: {anthropic}\nopenai: {openai}")
}

#[test]
fn empty_texts_are_left_out() {
    insta::assert_snapshot!(check(Case {
        records: vec![
            user(""),
            assistant("", &[]),
            user("hi"),
            assistant("", &[("c1", "t", json!({}))]),
            result("c1", ToolOutput::text("")),
        ],
        zone1: StaticSections::default(),
        transient: Transient::new(),
        ..Case::default()
    }));
}

#[test]
fn binary_json_and_failed_outputs() {
    insta::assert_snapshot!(check(Case {
        records: vec![
            user("show me"),
            assistant(
                "Reading.",
                &[
                    ("c1", "t", json!({"n": 1})),
                    ("c2", "t", json!({"n": 2})),
                    ("c3", "t", json!({"n": 3})),
                    ("c4", "t", json!({"n": 4.5, "b": [true, null]})),
                ],
            ),
            result("c4", ToolOutput::error("boom\n\tat line 3")),
            result(
                "c3",
                ToolOutput::json(json!({"z": 1, "a": {"y": "\u{1}", "b": 2}}))
            ),
            result(
                "c2",
                ToolOutput::binary("image/svg+xml", b"<svg/>".to_vec())
            ),
            result("c1", ToolOutput::binary("image/webp", vec![1, 2, 3])),
        ],
        ..Case::default()
    }));
}

#[test]
fn extra_options_are_written_in_key_order() {
    insta::assert_snapshot!(check(Case {
        records: vec![user("hi")],
        tools: vec![],
        anthropic: AnthropicOptions::new("claude-sonnet-4-5", 512)
            .option("temperature", json!(0.2))
            .option("metadata", json!({"user_id": "u-1"})),
        openai: OpenAiOptions::new("gpt-4.1")
            .option("temperature", json!(0.2))
            .option("max_completion_tokens", json!(512)),
        ..Case::default()
    }));
}

#[test]
fn render_errors_are_typed() {
    let dotted = ToolDefinition::new(
        ToolName::new("browser.navigate").unwrap(),
        "An MCP name with a dot",
        serde_json::from_str(r#"{"type":"object"}"#).unwrap(),
    );
    let long = tool(&"a".repeat(65));
    let cases = [
        Case {
            tools: vec![dotted],
            ..Case::default()
        },
        Case {
            tools: vec![long],
            ..Case::default()
        },
        Case {
            tools: vec![tool("t"), tool("t")],
            ..Case::default()
        },
        Case {
            records: vec![
                user("x"),
                assistant("", &[("c1", "multi_tool_use.parallel", json!({}))]),
                result("c1", ToolOutput::error("no such tool")),
            ],
            ..Case::default()
        },
        Case {
            records: vec![
                user("x"),
                assistant("", &[("c1", "t", json!("{not json"))]),
                result("c1", ToolOutput::error("bad arguments")),
            ],
            ..Case::default()
        },
        Case {
            anthropic: AnthropicOptions::new("m", 1).option("messages", json!([])),
            openai: OpenAiOptions::new("m").option("prompt_cache_key", json!("k")),
            ..Case::default()
        },
        Case {
            records: vec![user("x"), assistant("", &[("c1", "t", json!({}))])],
            ..Case::default()
        },
        Case {
            records: vec![user("")],
            transient: Transient::new(),
            ..Case::default()
        },
    ];
    let report: Vec<String> = cases
        .into_iter()
        .map(|case| {
            let out = check(case);
            // Error cases render short: keep only the error lines.
            out.lines()
                .filter(|l| {
                    l.contains("error") || l.contains("arguments") || l.contains("\"messages\": []")
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    insta::assert_snapshot!(report.join("\n\n"));
}
