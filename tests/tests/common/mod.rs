//! Helpers shared by the cross-crate tests: record builders, the fixture catalogues, the
//! elider of the scripted conversations, opening a Run's log, finding the handles elided
//! previews show, and reading a result back through the reader page by page.

#![allow(
    dead_code,
    reason = "each test binary uses the helpers it needs; the rest are unused there"
)]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use std::path::{Path, PathBuf};

use psych_disclosure::Surface;
use psych_elision::{Elider, PreviewConfig, Thresholds};
use psych_prompt_assembly::{
    AnthropicOptions, Assembler, CurrentTime, DynamicTail, OpenAiOptions, StaticSections, Transient,
};
use psych_reader_tool::{Answer, Reader};
use psych_record_log::{RecordLog, SyncPolicy};
use psych_types::{
    AssistantMessage, LoggedRecord, Projection, Record, RecordHandle, RecordSource,
    ResultProjector, ResultRef, RunId, ToolCall, ToolCallId, ToolDefinition, ToolList, ToolOutput,
    ToolResult, UserMessage,
};
use serde_json::{Value, json};

/// A user record.
pub(crate) fn user(text: &str) -> Record {
    Record::User(UserMessage { text: text.into() })
}

/// An assistant record with `text` and `calls`, each `(id, name, arguments)`.
pub(crate) fn assistant(text: &str, calls: &[(&str, &str, Value)]) -> Record {
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

/// The result of call `id` of the tool `name`.
pub(crate) fn result(id: &str, name: &str, output: ToolOutput) -> Record {
    Record::ToolResult(ToolResult {
        target: None,
        call_id: ToolCallId::new(id).unwrap(),
        name: name.into(),
        output,
    })
}

/// The text before the handle in elision's guidance.
pub(crate) const HANDLE_MARK: &str = "read_tool_output with handle \"";

/// The elider of the scripted conversations: small thresholds and previews, so a few
/// realistic results cross them.
pub(crate) fn small_elider() -> Elider {
    Elider::builder()
        .thresholds(
            Thresholds::builder()
                .per_result(800)
                .per_batch(2_000)
                .build()
                .unwrap(),
        )
        .preview(
            PreviewConfig::builder()
                .head_chars(200)
                .tail_chars(120)
                .failure_chars(160)
                .build(),
        )
        .build()
}

/// Opens `run`'s log in `dir`, which must open clean.
pub(crate) fn open(dir: &Path, run: &str, policy: SyncPolicy) -> RecordLog {
    let (log, recovery) = RecordLog::open(dir, &RunId::new(run).unwrap(), policy).unwrap();
    assert!(recovery.is_clean(), "{recovery}");
    log
}

/// Every string of a JSON value, depth first.
pub(crate) fn strings<'v>(value: &'v Value, out: &mut Vec<&'v str>) {
    match value {
        Value::String(text) => out.push(text),
        Value::Array(items) => items.iter().for_each(|item| strings(item, out)),
        Value::Object(map) => map.values().for_each(|item| strings(item, out)),
        _ => {}
    }
}

/// The handles elided previews show in a rendered body, in order of appearance.
pub(crate) fn preview_handles(body: &str) -> Result<Vec<String>, String> {
    let value: Value = serde_json::from_str(body).map_err(|e| e.to_string())?;
    let mut texts = Vec::new();
    strings(&value["messages"], &mut texts);
    let mut handles = Vec::new();
    for text in texts {
        let mut rest = text;
        while let Some(at) = rest.find(HANDLE_MARK) {
            rest = &rest[at + HANDLE_MARK.len()..];
            let end = rest.find('"').ok_or("an unquoted handle")?;
            handles.push(rest[..end].to_owned());
            rest = &rest[end..];
        }
    }
    Ok(handles)
}

/// Reads a whole text result through the reader, page by page by `next_offset`, and
/// rebuilds its bytes from the lines; every line must be whole and numbered in order, and
/// the last page must say the scan reached the end.
pub(crate) fn read_back<S: RecordSource>(
    reader: &Reader<S>,
    handle: &str,
    limit: u32,
) -> Result<Vec<u8>, String>
where
    S::Error: std::fmt::Debug,
{
    let mut bytes = Vec::new();
    let mut offset = 0u64;
    for _ in 0..100_000 {
        let answer = reader
            .call(&json!({"handle": handle, "offset": offset, "limit": limit}))
            .map_err(|e| format!("{handle}: {e:?}"))?;
        let Answer::Page(page) = answer else {
            return Err(format!("{handle} is text, read as {answer:?}"));
        };
        for (k, line) in page.lines.iter().enumerate() {
            if !line.is_whole() || line.number != offset + 1 + k as u64 {
                return Err(format!(
                    "{handle}: line {} cut or out of order",
                    line.number
                ));
            }
            bytes.extend_from_slice(&line.shown);
            bytes.push(b'\n');
        }
        match page.next_offset {
            Some(next) if next > offset => offset = next,
            Some(_) => return Err(format!("{handle}: paging does not move forward")),
            None => {
                if page.ends_without_newline {
                    bytes.pop();
                }
                if page.stopped_at != page.result.len {
                    return Err(format!("{handle}: the last page stopped before the end"));
                }
                return Ok(bytes);
            }
        }
    }
    Err(format!("{handle}: paging does not end"))
}

/// The `shared/fixtures/catalogs` folder beside the checkout (or `$PSYCH_FIXTURES/catalogs`).
pub(crate) fn catalogs_dir() -> PathBuf {
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

/// A fixture catalogue's tools (`file` under [`catalogs_dir`]), as its server lists them.
pub(crate) fn fixture_tools(file: &str) -> Vec<ToolDefinition> {
    let text = std::fs::read_to_string(catalogs_dir().join(file)).unwrap();
    serde_json::from_str::<ToolList>(&text).unwrap().tools
}

/// Leaves every result whole: the request has no tool results anyway.
pub(crate) struct Whole;
impl ResultProjector for Whole {
    fn project(&self, batch: &[ResultRef<'_>]) -> Vec<Projection> {
        vec![Projection::Full; batch.len()]
    }
}

/// The Anthropic and OpenAI request bodies of a one-message conversation (the user says
/// `user`) over `surface`, its deferred lines in zone 1 as capability notes.
pub(crate) fn render(surface: &Surface, user: &str) -> (String, String) {
    let mut zone1 = StaticSections::new("You are a careful assistant.");
    for line in surface.deferred_lines() {
        zone1 = zone1.capability_note(line.clone());
    }
    let zone2 = DynamicTail::new();
    let history = vec![LoggedRecord {
        handle: RecordHandle::new(RunId::new("run-1").unwrap(), 0),
        record: Record::User(UserMessage { text: user.into() }),
    }];
    let now = Transient::at(CurrentTime::utc(1_796_041_497).unwrap());
    let prompt = Assembler::new(&zone1, &zone2, surface.tools())
        .assemble(&history, &Whole, &now)
        .unwrap();
    let anthropic = prompt
        .render_anthropic(&AnthropicOptions::new("claude-sonnet-4-5", 1024))
        .unwrap();
    let openai = prompt
        .render_openai(&OpenAiOptions::new("gpt-4.1"))
        .unwrap();
    (anthropic.body().to_owned(), openai.body().to_owned())
}
