//! The serde formats of the shared types, pinned byte for byte. Other crates and other
//! processes exchange these as JSON, so a change here is a change of wire format: review the
//! snapshot diff like code.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_types::{
    AssistantMessage, ConnectionSpec, ContentBlock, LoggedRecord, PermissionGrant, Preload, Record,
    RecordHandle, RunId, ServerId, ToolCall, ToolCallId, ToolDefinition, ToolName, ToolOutput,
    ToolRef, ToolResult, UserMessage,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Serializes `value` pretty, checks it reads back equal, and returns the text to snapshot.
fn check<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: &T) -> String {
    let text = serde_json::to_string_pretty(value).unwrap();
    let back: T = serde_json::from_str(&text).unwrap();
    assert_eq!(&back, value);
    text
}

fn run() -> RunId {
    RunId::new("run-7").unwrap()
}

#[test]
fn tool_ref() {
    insta::assert_snapshot!(check(&ToolRef::parse("github", "list_issues").unwrap()));
}

#[test]
fn tool_definition_minimal() {
    let schema = serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}});
    let tool = ToolDefinition::new(
        ToolName::new("read_file").unwrap(),
        "Read a file",
        schema.as_object().unwrap().clone(),
    );
    insta::assert_snapshot!(check(&tool));
}

#[test]
fn connection_spec() {
    let deferred = ConnectionSpec::new(ServerId::new("github").unwrap())
        .with_description("GitHub issues, pull requests and code search")
        .with_preload(Preload::Deferred)
        .with_eager_tool(ToolName::new("search_code").unwrap());
    insta::assert_snapshot!("connection_spec_deferred", check(&deferred));
    let auto = ConnectionSpec::new(ServerId::new("fs").unwrap());
    insta::assert_snapshot!("connection_spec_auto", check(&auto));
    let parsed: ConnectionSpec = serde_json::from_str(r#"{"server":"fs"}"#).unwrap();
    assert_eq!(parsed, auto, "every field but the server has a default");
}

#[test]
fn permission_grant() {
    let grant = PermissionGrant::none()
        .allow_server(ServerId::new("fs").unwrap())
        .allow_tool(ToolRef::parse("github", "list_issues").unwrap())
        .allow_tool(ToolRef::parse("github", "get_issue").unwrap());
    insta::assert_snapshot!(check(&grant));
}

#[test]
fn tool_outputs() {
    insta::assert_snapshot!(
        "output_text",
        check(&ToolOutput::text("line one\nline two"))
    );
    insta::assert_snapshot!(
        "output_json",
        check(&ToolOutput::json(
            serde_json::json!({"total_count": 2, "items": [1, 2]})
        ))
    );
    insta::assert_snapshot!(
        "output_blocks",
        check(
            &ToolOutput::from_blocks(vec![
                ContentBlock::text("Screenshot of the page:"),
                ContentBlock::image("image/png", vec![0x89, b'P', b'N', b'G', 0, 255]),
                ContentBlock::text("done"),
            ])
            .with_structured_content(serde_json::json!({"width": 1, "height": 1}))
        )
    );
    insta::assert_snapshot!(
        "output_error",
        check(&ToolOutput::error("ENOENT: no such file"))
    );
}

#[test]
fn records() {
    let call_id = ToolCallId::new("toolu_01A").unwrap();
    let records = vec![
        LoggedRecord {
            handle: RecordHandle::new(run(), 0),
            record: Record::User(UserMessage {
                text: "List my open issues".into(),
            }),
        },
        LoggedRecord {
            handle: RecordHandle::new(run(), 1),
            record: Record::Assistant(AssistantMessage {
                text: String::new(),
                tool_calls: vec![ToolCall {
                    id: call_id.clone(),
                    name: "github__list_issues".into(),
                    arguments: serde_json::json!({"owner": "psych", "repo": "psych"}),
                }],
            }),
        },
        LoggedRecord {
            handle: RecordHandle::new(run(), 2),
            record: Record::ToolResult(ToolResult {
                target: None,
                call_id,
                name: "github__list_issues".into(),
                output: ToolOutput::text("[]"),
            }),
        },
    ];
    insta::assert_snapshot!(check(&records));
}

#[test]
fn invalid_ids_in_json_are_errors_naming_the_field() {
    let err = serde_json::from_str::<ToolRef>(r#"{"server":"git hub","tool":"x"}"#).unwrap_err();
    insta::assert_snapshot!(err.to_string());
    let err = serde_json::from_str::<LoggedRecord>(
        r#"{"handle":"run-7","record":{"type":"user","text":""}}"#,
    )
    .unwrap_err();
    insta::assert_snapshot!("bad_handle", err.to_string());
}
