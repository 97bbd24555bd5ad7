//! The OpenAI Responses API renderer: complete requests as snapshots (read by the SDK
//! check, `cargo xtask sdk-check`, under `responses: `), every body of the scripted sessions
//! accepted by the rule checker, the within-turn prefix property, determinism, and the same
//! cache figures as the Chat Completions body.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_test_support::prompts as common;

use common::*;
use psych_prompt_assembly::{
    Assembler, CacheReport, CacheRules, CurrentTime, DynamicTail, OpenAiOptions, Provider,
    RenderError, RenderedRequest, StaticSections, Transient,
};
use psych_types::{
    ContentBlock, LoggedRecord, Record, RecordHandle, RunId, ToolDefinition, ToolName, ToolOutput,
};
use serde_json::json;

fn tool(name: &str, description: &str) -> ToolDefinition {
    ToolDefinition::new(
        ToolName::new(name).unwrap(),
        description,
        serde_json::from_str(r#"{"type":"object","properties":{"path":{"type":"string"}}}"#)
            .unwrap(),
    )
}

/// Renders `records` for the Responses API and checks the body with the rule checker.
fn check(records: Vec<Record>, tools: &[ToolDefinition], options: &OpenAiOptions) -> String {
    let run = RunId::new("r").unwrap();
    let history: Vec<LoggedRecord> = records
        .into_iter()
        .enumerate()
        .map(|(i, record)| LoggedRecord {
            handle: RecordHandle::new(run.clone(), i as u64),
            record,
        })
        .collect();
    let zone1 = StaticSections::new("Be brief.").skill("pdf", "Read PDF forms");
    let tail = DynamicTail::new().memory("The user prefers metric units.");
    let transient = Transient::at(CurrentTime::utc(1_796_041_497).unwrap());
    let prompt = Assembler::new(&zone1, &tail, tools)
        .assemble(&history, &Whole, &transient)
        .unwrap();
    match prompt.render_responses(options) {
        Ok(request) => {
            assert_eq!(request.provider(), Provider::OpenAiResponses);
            match check_responses_body(request.body()) {
                Ok(()) => format!("responses: {}", request.pretty_body()),
                Err(problem) => format!("check failed: {problem}\n{}", request.pretty_body()),
            }
        }
        Err(err) => format!("error: {err}"),
    }
}

#[test]
fn a_turn_with_calls_results_images_and_substitutes() {
    let png = common::rules::images::png(3, 2, 1);
    let long_id = format!("call_{}", "x".repeat(50));
    let records = vec![
        user("Read notes.txt and show me the chart."),
        assistant(
            "Reading both.  ",
            &[
                ("call_1", "read_file", json!({"path": "notes.txt"})),
                ("call_2", "read_file", json!({"path": "chart.png"})),
                (&long_id, "github.search", json!("not an object")),
                ("call_4", "read_file", json!({"path": "missing"})),
            ],
        ),
        result("call_1", ToolOutput::text("line 1\nline 2")),
        result(
            "call_2",
            ToolOutput {
                content: vec![
                    ContentBlock::text("Chart:"),
                    ContentBlock::image("image/png", png),
                    ContentBlock::text("(3x2)"),
                ],
                ..ToolOutput::text("")
            },
        ),
        result(&long_id, ToolOutput::error("no such tool")),
        assistant("", &[]),
        user(""),
    ];
    let tools = [
        tool("read_file", "Read a file"),
        tool("list_dir", "List a folder"),
    ];
    let options = OpenAiOptions::new("gpt-5.1")
        .prompt_cache_key("run-1")
        .option("max_output_tokens", json!(1024))
        .option("store", json!(false));
    insta::assert_snapshot!(check(records, &tools, &options));
}

#[test]
fn errors_are_typed() {
    let many: Vec<ToolDefinition> = (0..129).map(|i| tool(&format!("t{i}"), "")).collect();
    assert_eq!(
        check(vec![user("hi")], &many, &OpenAiOptions::new("m")),
        format!(
            "error: {}",
            RenderError::TooManyTools {
                count: 129,
                max: 128
            }
        )
    );
    let reserved = OpenAiOptions::new("m").option("input", json!([]));
    assert!(check(vec![user("hi")], &[], &reserved).starts_with("error: request option \"input\""));
    let dotted = [tool("a", ""), {
        let mut t = tool("a", "");
        t.name = ToolName::new("a.b").unwrap();
        t
    }];
    assert!(
        check(vec![user("hi")], &dotted, &OpenAiOptions::new("m")).starts_with("error: tool name")
    );
}

fn responses_session(turns: &[Turn]) -> (Session, Vec<RenderedRequest>) {
    let session = play(turns);
    let rendered = render_session_responses(&session, &zone1());
    (session, rendered)
}

#[test]
fn scripted_sessions_are_accepted_stable_and_prefix_preserving() {
    for turns in [twenty_turns(), wide_turns()] {
        let (session, rendered) = responses_session(&turns);
        for request in &rendered {
            assert_eq!(check_responses_body(request.body()), Ok(()));
        }
        // Within a turn, step k's cacheable prefix is a prefix of step k+1's cache stream.
        for k in 1..session.calls.len() {
            if session.calls[k].turn != session.calls[k - 1].turn {
                continue;
            }
            let prev = cacheable(&rendered[k - 1]);
            assert!(
                rendered[k].cache_stream().starts_with(&prev),
                "turn {} step {}",
                session.calls[k].turn,
                session.calls[k].step
            );
        }
        // The same inputs give the same bytes.
        let again = render_session_responses(&session, &zone1());
        for (a, b) in rendered.iter().zip(&again) {
            assert_eq!(a.body(), b.body());
        }
        // The clock is only in the transient message, after the history.
        for request in &rendered {
            let transient = request.spans().last().unwrap();
            assert_eq!(transient.part, psych_prompt_assembly::Part::Transient);
            assert!(request.cacheable_len() <= transient.range.start);
        }
    }
}

#[test]
fn responses_caches_as_well_as_chat_completions() {
    let session = play(&twenty_turns());
    let responses = render_session_responses(&session, &zone1());
    let chat: Vec<RenderedRequest> = render_session(&session, &zone1())
        .into_iter()
        .map(|r| r.openai)
        .collect();
    let estimator = Bytes4;
    let rules = CacheRules::openai(0.25);
    let a = CacheReport::new(&responses, &estimator, rules);
    let b = CacheReport::new(&chat, &estimator, rules);
    println!(
        "20-turn, OpenAI automatic caching: responses {:.1}% read of {} tokens, chat {:.1}% of {}",
        a.read_share() * 100.0,
        a.total_tokens(),
        b.read_share() * 100.0,
        b.total_tokens()
    );
    assert!(a.read_share() > 0.75, "{}", a.read_share());
    assert!((a.read_share() - b.read_share()).abs() < 0.03);
}

/// About four bytes a token.
struct Bytes4;

impl psych_types::TokenEstimator for Bytes4 {
    fn estimate_text(&self, text: &str) -> u64 {
        text.len().div_ceil(4) as u64
    }

    fn estimate_binary(&self, _mime_type: &str, len: u64) -> u64 {
        len.div_ceil(3)
    }
}
