//! Assembly time for a 1,000-record history against plain serde_json serialization of the
//! same request (the request parsed into a `serde_json::Value` and written back with
//! `serde_json::to_vec`), side by side in one group per provider. Target: assembly at most
//! twice the serialization time.
//!
//! Run with `cargo bench -p psych-prompt-assembly -- --warm-up-time 1 --measurement-time 3`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark fails loudly on bad data"
)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CurrentTime, DynamicTail, OpenAiOptions, StaticSections, Transient,
};
use psych_types::{
    AssistantMessage, LoggedRecord, Projection, Record, RecordHandle, ResultProjector, ResultRef,
    RunId, ToolCall, ToolCallId, ToolDefinition, ToolName, ToolOutput, ToolResult, UserMessage,
};

/// Elides results over 4 KiB to a head and tail, like the real projector would.
struct Preview;

impl ResultProjector for Preview {
    fn project(&self, batch: &[ResultRef<'_>]) -> Vec<Projection> {
        batch
            .iter()
            .map(|result| {
                let text = result.output.readable_text();
                if text.len() <= 4096 {
                    return Projection::Full;
                }
                let head: String = text.chars().take(200).collect();
                Projection::Replaced(format!(
                    "{head}\n[... elided; read_tool_output(\"{}\") ...]",
                    result.handle
                ))
            })
            .collect()
    }
}

/// 1,000 records: turns of a user message, an assistant message with two calls, their two
/// results (one of 1.5 KB, every third a 12 KB one), and a final assistant reply.
fn history() -> Vec<LoggedRecord> {
    let run = RunId::new("bench-run").unwrap();
    let mut records = Vec::with_capacity(1000);
    let mut turn = 0;
    while records.len() < 1000 {
        let ids = [format!("toolu_{turn}_a"), format!("toolu_{turn}_b")];
        records.push(Record::User(UserMessage {
            text: format!("Turn {turn}: please look at module {turn} and tell me what it does."),
        }));
        records.push(Record::Assistant(AssistantMessage {
            text: "Let me read the files.".into(),
            tool_calls: ids
                .iter()
                .map(|id| ToolCall {
                    id: ToolCallId::new(id.clone()).unwrap(),
                    name: "read_file".into(),
                    arguments: serde_json::json!({"path": format!("src/{id}.rs"), "limit": 400}),
                })
                .collect(),
        }));
        for (i, id) in ids.iter().enumerate() {
            let len = if i == 1 && turn % 3 == 0 {
                12_000
            } else {
                1_500
            };
            records.push(Record::ToolResult(ToolResult {
                target: None,
                call_id: ToolCallId::new(id.clone()).unwrap(),
                name: "read_file".into(),
                output: ToolOutput::text(
                    "fn main() { println!(\"hello\\tworld\"); }\n".repeat(len / 40),
                ),
            }));
        }
        records.push(Record::Assistant(AssistantMessage {
            text: format!("Module {turn} prints a greeting; nothing else."),
            tool_calls: vec![],
        }));
        turn += 1;
    }
    records.truncate(1000);
    // End on a complete step: drop a trailing assistant message with unanswered calls.
    while matches!(records.last(), Some(Record::Assistant(m)) if !m.tool_calls.is_empty()) {
        records.pop();
    }
    records
        .into_iter()
        .enumerate()
        .map(|(i, record)| LoggedRecord {
            handle: RecordHandle::new(run.clone(), i as u64),
            record,
        })
        .collect()
}

fn tools() -> Vec<ToolDefinition> {
    (0..20)
        .map(|i| {
            ToolDefinition::new(
                ToolName::new(format!("tool_{i:02}")).unwrap(),
                "A tool with a realistic schema.",
                serde_json::from_str(
                    r#"{"type":"object","properties":{"path":{"type":"string","description":"A path"},"limit":{"type":"integer","minimum":1}},"required":["path"]}"#,
                )
                .unwrap(),
            )
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let history = history();
    let tools = tools();
    let zone1 = StaticSections::new("You are a careful assistant. ".repeat(40))
        .skill("pdf", "Read PDFs")
        .subagent("reviewer", "Reviews diffs");
    let zone2 = DynamicTail::new().memory("The user prefers short answers.");
    let transient = Transient::at(CurrentTime::utc(1_796_041_497).unwrap());
    let assembler = Assembler::new(&zone1, &zone2, &tools);
    let anthropic = AnthropicOptions::new("claude-sonnet-4-5", 4096);
    let openai = OpenAiOptions::new("gpt-4.1").prompt_cache_key("bench-run");

    let prompt = assembler.assemble(&history, &Preview, &transient).unwrap();
    let bodies = [
        (
            "anthropic",
            prompt.render_anthropic(&anthropic).unwrap().into_body(),
        ),
        ("openai", prompt.render_openai(&openai).unwrap().into_body()),
    ];
    for (provider, body) in bodies {
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        let mut group = c.benchmark_group(format!("request_1000_records_{provider}"));
        group.bench_function("psych_assemble_and_render", |b| {
            b.iter(|| {
                let prompt = assembler
                    .assemble(black_box(&history), &Preview, &transient)
                    .unwrap();
                let request = if provider == "anthropic" {
                    prompt.render_anthropic(&anthropic)
                } else {
                    prompt.render_openai(&openai)
                };
                black_box(request.unwrap().into_body())
            })
        });
        group.bench_function("serde_json_to_vec_same_request", |b| {
            b.iter(|| black_box(serde_json::to_vec(black_box(&value)).unwrap()))
        });
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
