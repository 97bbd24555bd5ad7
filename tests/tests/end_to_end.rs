//! The real cross-crate path of a large tool result: records appended to a real
//! `psych_record_log::RecordLog` on disk, read back as the history, assembled with the real
//! `psych_elision::Elider` as the projector through psych-prompt-assembly, and every elided
//! preview in the rendered requests read back in full with `psych_reader_tool` over the
//! same log, by the handle the preview shows. The same handle presented to another Run's
//! log is the typed `invalid_deferred_handle` error.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::collections::BTreeSet;

use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CurrentTime, DynamicTail, OpenAiOptions, StaticSections, Transient,
};
use psych_reader_tool::{Answer, CallError, Limits, Reader};
use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{LoggedRecord, Projection, Record, RecordHandle, RecordSource, ToolOutput};
use serde_json::{Value, json};

use crate::common::{assistant, open, preview_handles, read_back, result, small_elider, user};

/// A log file of 600 lines, one of them flagged, without a final line break.
fn server_log() -> String {
    (0..600)
        .map(|i| {
            let level = if i == 417 { "ERROR" } else { "INFO" };
            format!(
                "2026-11-30T12:{:02}:{:02}Z {level} request {i} served in {} ms",
                i / 60 % 60,
                i % 60,
                3 + i % 17
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Three turns, each with large results, so the first two are elided at the third.
fn records() -> Vec<Record> {
    let listing: String = (0..300)
        .map(|i| format!("[FILE] src/module_{i:03}.rs\n"))
        .collect();
    let issues: Vec<Value> = (0..80)
        .map(|i| json!({"number": 4000 + i, "title": format!("Flaky test number {i} in the record log"), "labels": ["flaky", "tests"], "open": i % 3 != 0}))
        .collect();
    vec![
        user("Why did the server fail last night?"),
        assistant(
            "Reading the log and the source tree.",
            &[
                ("toolu_01", "read_text_file", json!({"path": "server.log"})),
                ("toolu_02", "list_directory", json!({"path": "src"})),
            ],
        ),
        result("toolu_02", "list_directory", ToolOutput::text(listing)),
        result("toolu_01", "read_text_file", ToolOutput::text(server_log())),
        assistant("Request 417 failed.", &[]),
        user("Is there an issue about it?"),
        assistant(
            "",
            &[(
                "toolu_03",
                "deferred_call_tool",
                json!({"server": "github", "tool": "search_issues", "arguments": {"query": "flaky"}}),
            )],
        ),
        result(
            "toolu_03",
            "deferred_call_tool",
            ToolOutput::json(json!({"total": 80, "items": issues})),
        ),
        result(
            "toolu_03",
            "deferred_call_tool",
            ToolOutput::text("a second result is left out"),
        ),
        assistant("There are 80 flaky-test issues.", &[]),
        user("Thanks. Which one is the oldest?"),
    ]
}

/// Reads a whole text result back through the reader, as text.
fn text_back(log: &RecordLog, handle: &str, limit: u32) -> String {
    String::from_utf8(read_back(&Reader::new(log), handle, limit).unwrap()).unwrap()
}

#[test]
fn every_elided_preview_reads_back_in_full_from_the_record_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), "run-e2e", SyncPolicy::EveryAppend);
    let appended: Vec<RecordHandle> = records()
        .iter()
        .map(|record| log.append(record).unwrap())
        .collect();
    let history: Vec<LoggedRecord> = log.iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(
        history.iter().map(|l| l.handle.clone()).collect::<Vec<_>>(),
        appended
    );
    assert_eq!(
        history.iter().map(|l| l.record.clone()).collect::<Vec<_>>(),
        records(),
        "the log gives back what was appended"
    );

    let zone1 = StaticSections::new("You are a careful operations assistant.");
    let tail = DynamicTail::new().memory("The user runs the server on Linux.");
    let tools = vec![psych_reader_tool::tool_definition(&Limits::default())];
    let transient = Transient::at(CurrentTime::utc(1_796_041_497).unwrap());
    let projector = small_elider();
    let prompt = Assembler::new(&zone1, &tail, &tools)
        .assemble(&history, &projector, &transient)
        .unwrap();

    // What elision replaced with a preview (successes; failures carry no handle).
    let elided: BTreeSet<String> = prompt
        .result_views()
        .filter(|(_, view)| matches!(view, Projection::Replaced(_)))
        .map(|(handle, _)| handle.to_string())
        .collect();
    let expected: BTreeSet<String> = ["run-e2e:2", "run-e2e:3", "run-e2e:7"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(
        elided, expected,
        "both earlier turns' large results are elided"
    );

    let bodies = [
        prompt
            .render_anthropic(&AnthropicOptions::new("claude-sonnet-4-5", 2048))
            .unwrap()
            .into_body(),
        prompt
            .render_openai(&OpenAiOptions::new("gpt-4.1").prompt_cache_key("run-e2e"))
            .unwrap()
            .into_body(),
    ];
    for body in &bodies {
        let handles = preview_handles(body).unwrap();
        assert_eq!(
            handles.iter().cloned().collect::<BTreeSet<_>>(),
            expected,
            "every elided result shows its handle once: {handles:?}"
        );
        assert_eq!(handles.len(), expected.len());
        for handle in &handles {
            let parsed: RecordHandle = handle.parse().unwrap();
            let Some(Record::ToolResult(stored)) = log.record(&parsed).unwrap() else {
                panic!("{handle} is not a tool result in the log");
            };
            let full = stored.output.readable_text().into_owned();
            let escaped = serde_json::to_string(&full).unwrap();
            assert!(
                !body.contains(&escaped[1..escaped.len() - 1]),
                "{handle} is not sent whole"
            );
            // Small pages and the largest page both rebuild the stored text exactly.
            assert_eq!(text_back(&log, handle, 37), full, "{handle}");
            assert_eq!(text_back(&log, handle, 1000), full, "{handle}");
        }
    }

    // The log on disk serves the same bytes after a reopen.
    drop(log);
    let reopened = open(dir.path(), "run-e2e", SyncPolicy::EveryAppend);
    assert_eq!(text_back(&reopened, "run-e2e:3", 200), server_log());

    // The same handles presented to another Run's log: the typed corruption error, never
    // that Run's data, even where that Run has a tool result at the same position.
    let mut other = open(dir.path(), "run-other", SyncPolicy::EveryAppend);
    for record in records() {
        other.append(&record).unwrap();
    }
    let reader = Reader::new(&other);
    for handle in &expected {
        let err = reader.call(&json!({"handle": handle})).unwrap_err();
        assert_eq!(err.code(), "invalid_deferred_handle", "{handle}");
        assert!(
            matches!(err, CallError::InvalidDeferredHandle(_)),
            "{err:?}"
        );
        // The grep path refuses it the same way.
        let err = reader
            .call(&json!({"handle": handle, "grep": "ERROR"}))
            .unwrap_err();
        assert_eq!(err.code(), "invalid_deferred_handle");
    }
    // While in its own Run the grep finds the flagged line.
    let own = Reader::new(&reopened);
    let Answer::Page(page) = own
        .call(&json!({"handle": "run-e2e:3", "grep": "ERROR"}))
        .unwrap()
    else {
        panic!("a text result reads as a page")
    };
    assert_eq!(page.lines.len(), 1);
    assert_eq!(page.lines[0].number, 418);
}
