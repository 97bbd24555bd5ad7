//! Rendering edge cases, data-driven through one `check` helper that renders a small history
//! for both providers (or reports the typed error) and snapshots the result: empty and
//! whitespace-only texts, model mistakes and interrupted calls (rendered with substitutes),
//! binary and JSON outputs, failures, extra options, and every error.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_test_support::prompts as common;

use common::{assistant, check_anthropic_body, check_openai_body, result, user};
use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CurrentTime, DynamicTail, EMPTY_USER_MESSAGE, MISSING_RESULT,
    OpenAiOptions, Part, StaticSections, Transient,
};
use psych_types::{
    ContentBlock, LoggedRecord, Record, RecordHandle, RunId, ToolDefinition, ToolName, ToolOutput,
};
use serde_json::{Value, json};

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
    let prompt = match Assembler::new(&case.zone1, &tail, &case.tools).assemble(
        &history,
        &common::Whole,
        &case.transient,
    ) {
        Ok(prompt) => prompt,
        Err(err) => return format!("assemble error: {err}"),
    };
    let anthropic = match prompt.render_anthropic(&case.anthropic) {
        Ok(request) => match check_anthropic_body(
            request.body(),
            request.spans().iter().any(|s| s.part == Part::Transient),
        ) {
            Ok(()) => request.pretty_body(),
            Err(problem) => format!("check failed: {problem}\n{}", request.pretty_body()),
        },
        Err(err) => format!("error: {err}"),
    };
    let openai = match prompt.render_openai(&case.openai) {
        Ok(request) => match check_openai_body(request.body()) {
            Ok(()) => request.pretty_body(),
            Err(problem) => format!("check failed: {problem}\n{}", request.pretty_body()),
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

/// Asserts a case rendered for both providers and passed their body checks.
fn assert_renders(out: &str) {
    assert!(
        !out.contains("error: ") && !out.contains("check failed"),
        "{out}"
    );
}

#[test]
fn whitespace_only_texts_are_left_out() {
    let out = check(Case {
        records: vec![
            user(" "),
            assistant("\n\n", &[("c1", "t", json!({}))]),
            result("c1", ToolOutput::text("\n")),
            assistant("  \t", &[]),
            user("\r\n"),
            assistant("Done.", &[("c2", "t", json!({}))]),
            result("c2", ToolOutput::error(" ")),
        ],
        zone1: StaticSections::new(" \n "),
        transient: Transient::new().note("  "),
        ..Case::default()
    });
    assert_renders(&out);
    // Both user messages read as the placeholder, for both providers.
    assert_eq!(out.matches(EMPTY_USER_MESSAGE).count(), 4, "{out}");
    assert!(!out.contains("\"system\""), "{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn model_mistakes_and_interrupted_calls_render_as_substitutes() {
    let long = format!("{}.tool", "n".repeat(70));
    let out = check(Case {
        records: vec![
            user("Find the flaky-test issue."),
            assistant(
                "Searching.",
                &[
                    ("c1", "github.list_issues", json!({"q": "flaky"})),
                    ("c2", "t", json!("{\"q\": \"flaky\"")),
                    ("c3", "multi_tool_use.parallel", json!([1, {"b": null}])),
                    ("c4", &long, json!({})),
                ],
            ),
            result("c2", ToolOutput::error("arguments are not valid JSON")),
            result("c1", ToolOutput::error("unknown tool github.list_issues")),
            // c3 and c4 were never answered: the process stopped here.
            user("Are you there?"),
            assistant("", &[("c5", "t", json!({}))]),
            // Killed again before c5's result was logged.
        ],
        ..Case::default()
    });
    assert_renders(&out);
    for expected in [
        "\"name\": \"invalid_github_list_issues\"",
        "\"name\": \"invalid_multi_tool_use_parallel\"",
        &format!("\"name\": \"invalid_{}\"", "n".repeat(56)),
        // Both providers wrap non-object arguments (OpenAI as the text of the object).
        "\"_raw_arguments\": \"{\\\"q\\\": \\\"flaky\\\"\"",
        "\"_raw_arguments\": \"[1,{\\\"b\\\":null}]\"",
        "\"arguments\": \"{\\\"_raw_arguments\\\":\\\"{\\\\\\\"q\\\\\\\": \\\\\\\"flaky\\\\\\\"\\\"}\"",
    ] {
        assert!(out.contains(expected), "{expected} missing from\n{out}");
    }
    // c3, c4 and c5 are answered by the fixed failed result, for both providers.
    assert_eq!(out.matches(MISSING_RESULT).count(), 6, "{out}");
    insta::assert_snapshot!(out);
}

#[test]
fn binary_json_and_failed_outputs() {
    let out = check(Case {
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
                ToolOutput::json(json!({"z": 1, "a": {"y": "\u{1}", "b": 2}})),
            ),
            result(
                "c2",
                ToolOutput::from_blocks(vec![block(json!({"type": "resource", "resource": {
                    "uri": "file:///logo.svg", "mimeType": "image/svg+xml", "blob": "PHN2Zy8+"
                }}))]),
            ),
            // Declared WebP, but three bytes are no image: a placeholder, never an image.
            result(
                "c1",
                ToolOutput::from_blocks(vec![ContentBlock::image("image/webp", vec![1, 2, 3])]),
            ),
        ],
        ..Case::default()
    });
    assert_renders(&out);
    assert!(
        out.contains("[content block #0: resource file:///logo.svg, image/svg+xml, 6 bytes]"),
        "{out}"
    );
    assert!(
        out.contains("[content block #0: image, image/webp, 3 bytes]"),
        "{out}"
    );
    assert!(!out.contains("\"type\": \"image\""), "{out}");
    assert!(!out.contains("record r:"), "{out}");
    insta::assert_snapshot!(out);
}

fn block(value: Value) -> ContentBlock {
    ContentBlock::from_object(value.as_object().cloned().unwrap())
}

/// A text + real PNG + text result; a PNG declared as JPEG (sent with the type its bytes
/// say); a PNG over 5 MB of base64 and one over 8000 px (placeholders); a GIF (an image for
/// Anthropic, a placeholder for OpenAI).
#[test]
fn images_are_sniffed_and_limited() {
    let png = common::rules::images::png(3, 2, 7);
    let mut huge = common::rules::images::png(1, 1, 0);
    huge.resize(4 * 1024 * 1024, 0);
    let out = check(Case {
        records: vec![
            user("look"),
            assistant(
                "",
                &[
                    ("c1", "t", json!({})),
                    ("c2", "t", json!({})),
                    ("c3", "t", json!({})),
                ],
            ),
            result(
                "c1",
                ToolOutput::from_blocks(vec![
                    ContentBlock::text("before"),
                    ContentBlock::image("image/png", png.clone()),
                    ContentBlock::text("after"),
                ]),
            ),
            result(
                "c2",
                ToolOutput::from_blocks(vec![
                    ContentBlock::image("image/jpeg", png.clone()),
                    ContentBlock::image("image/png", huge),
                    ContentBlock::image("image/png", common::rules::images::png_header(9000, 10)),
                ]),
            ),
            result(
                "c3",
                ToolOutput::from_blocks(vec![ContentBlock::image(
                    "image/gif",
                    common::rules::images::gif(),
                )]),
            ),
        ],
        ..Case::default()
    });
    assert_renders(&out);
    let (anthropic, openai) = out.split_once("\nopenai: ").unwrap();
    assert_eq!(
        anthropic.matches("\"type\": \"image\"").count(),
        3,
        "{anthropic}"
    );
    assert!(
        !anthropic.contains("image/jpeg"),
        "sent with its sniffed type"
    );
    assert!(anthropic.contains("[content block #1: image, image/png, 4194304 bytes]"));
    assert!(
        anthropic.contains("[content block #2: image, image/png, 72 bytes]"),
        "{anthropic}"
    );
    // OpenAI: placeholders in the tool messages, the images in one user message after them.
    assert_eq!(
        openai.matches("\"type\": \"image_url\"").count(),
        2,
        "{openai}"
    );
    let images_at = openai
        .find(psych_prompt_assembly::TOOL_IMAGES_INTRO)
        .unwrap();
    let last_tool = openai.rfind("\"role\": \"tool\"").unwrap();
    assert!(images_at > last_tool, "the images follow the tool messages");
    assert!(openai.contains("[content block #0: image, image/gif, 35 bytes]"));
    // The pretty bodies are long with base64: snapshot them without it.
    let short: String = out
        .lines()
        .map(|line| match line.find("base64,") {
            Some(at) => format!("{}base64,…", &line[..at]),
            None if line.trim_start().starts_with("\"data\": ") => {
                format!(
                    "{}\"data\": …",
                    &line[..line.len() - line.trim_start().len()]
                )
            }
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    insta::assert_snapshot!(short);
}

/// What else a provider refuses and the log may hold: a log that starts with an assistant
/// record, assistant text ending in whitespace as the last message, a whitespace-only
/// failure, and a history with calls rendered for an empty tool surface.
#[test]
fn requests_follow_each_providers_message_rules() {
    let records = vec![
        assistant("Hello! How can I help?  \n", &[]),
        user("list files"),
        assistant("Listing.\n", &[("c1", "t", json!({"path": "/"}))]),
        result("c1", ToolOutput::error(" \n\t ")),
        assistant("Nothing there.   ", &[]),
    ];
    let out = check(Case {
        records: records.clone(),
        transient: Transient::new(),
        ..Case::default()
    });
    assert_renders(&out);
    assert!(
        out.contains(psych_prompt_assembly::CONVERSATION_START),
        "{out}"
    );
    assert!(out.contains("\"text\": \"Nothing there.\""), "{out}");
    insta::assert_snapshot!("message_rules", out);
    let out = check(Case {
        records,
        tools: vec![],
        transient: Transient::new(),
        ..Case::default()
    });
    assert_renders(&out);
    assert!(!out.contains("tool_use"), "{out}");
    insta::assert_snapshot!("no_tools", out);
}

/// OpenAI: 200 tools is a typed error; a call id over 40 characters is sent as its short
/// form in the call and in its tool message, and maps back.
#[test]
fn openai_limits() {
    let tools: Vec<ToolDefinition> = (0..200).map(|i| tool(&format!("t{i:03}"))).collect();
    let out = check(Case {
        records: vec![user("x")],
        tools,
        ..Case::default()
    });
    assert!(
        out.contains(
            "openai: error: the tool surface has 200 tools; the provider accepts at most 128"
        ),
        "{out}"
    );
    assert!(!out.contains("anthropic: error"), "{out}");

    let long = format!("toolu_{}", "x".repeat(60));
    let records = vec![
        user("x"),
        assistant(
            "",
            &[(long.as_str(), "t", json!({})), ("short", "t", json!({}))],
        ),
        result(&long, ToolOutput::text("a")),
        result("short", ToolOutput::text("b")),
    ];
    let run = RunId::new("r").unwrap();
    let history: Vec<LoggedRecord> = records
        .into_iter()
        .enumerate()
        .map(|(i, record)| LoggedRecord {
            handle: RecordHandle::new(run.clone(), i as u64),
            record,
        })
        .collect();
    let (zone1, tail, transient) = (
        StaticSections::new("x"),
        DynamicTail::new(),
        Transient::new(),
    );
    let tools = [tool("t")];
    let prompt = Assembler::new(&zone1, &tail, &tools)
        .assemble(&history, &common::Whole, &transient)
        .unwrap();
    let request = prompt.render_openai(&OpenAiOptions::new("m")).unwrap();
    check_openai_body(request.body()).unwrap();
    let [(sent, logged)] = request.replaced_call_ids() else {
        panic!("{:?}", request.replaced_call_ids())
    };
    assert_eq!(sent.len(), 40);
    assert_eq!(logged.as_str(), long);
    assert_eq!(request.logged_call_id(sent), long);
    assert_eq!(request.logged_call_id("short"), "short");
    assert_eq!(
        request.body().matches(sent.as_str()).count(),
        2,
        "call and tool message"
    );
    assert!(!request.body().contains(&long));
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

/// Only what no real log holds is an error: tool names of our own surface, duplicate tools,
/// reserved options, an orphan result, a reused call id, a request with no message.
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
            anthropic: AnthropicOptions::new("m", 1).option("messages", json!([])),
            openai: OpenAiOptions::new("m").option("prompt_cache_key", json!("k")),
            ..Case::default()
        },
        Case {
            records: vec![user("x"), result("c1", ToolOutput::text("orphan"))],
            ..Case::default()
        },
        Case {
            records: vec![
                user("x"),
                assistant("", &[("c1", "t", json!({}))]),
                result("c1", ToolOutput::text("one")),
                assistant("", &[("c1", "t", json!({}))]),
            ],
            ..Case::default()
        },
        Case {
            records: vec![],
            transient: Transient::new().note(" "),
            ..Case::default()
        },
        // Not even system text: Chat Completions' `"messages":[]` is refused too.
        Case {
            records: vec![],
            zone1: StaticSections::default(),
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
