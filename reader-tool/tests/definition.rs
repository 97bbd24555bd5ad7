//! The tool's definition, exactly as the prompt carries it, and its agreement with the
//! argument parser.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails loudly on bad data"
)]

use psych_reader_tool::{Limits, MAX_GREP_BYTES, ReadArgs, tool_definition};
use psych_types::READ_TOOL_OUTPUT;
use serde_json::json;

#[test]
fn the_definition_is_byte_stable() {
    let definition = tool_definition(&Limits::default());
    assert_eq!(definition.name.as_str(), READ_TOOL_OUTPUT);
    insta::assert_json_snapshot!("definition", definition);
    assert_eq!(
        serde_json::to_string(&definition).unwrap(),
        serde_json::to_string(&tool_definition(&Limits::default())).unwrap()
    );
}

#[test]
fn the_schema_follows_the_limits() {
    let limits = Limits::builder()
        .default_limit(50)
        .max_limit(300)
        .build()
        .unwrap();
    let definition = tool_definition(&limits);
    let limit = &definition.input_schema["properties"]["limit"];
    assert_eq!(
        (limit["default"].clone(), limit["maximum"].clone()),
        (json!(50), json!(300))
    );
    let max_chars = definition.input_schema["properties"]["grep"]["maxLength"]
        .as_u64()
        .unwrap() as usize;
    assert_eq!(max_chars * 4, MAX_GREP_BYTES);
    // What the schema allows at its bounds, the parser accepts, even in 4-byte characters.
    for grep in ["x".repeat(max_chars), "\u{1D11E}".repeat(max_chars)] {
        let ok = json!({"handle": "r:1", "offset": 0, "limit": 300, "grep": grep});
        assert!(ReadArgs::from_json(&ok, &limits).is_ok(), "{grep}");
    }
    assert!(ReadArgs::from_json(&json!({"handle": "r:1", "limit": 301}), &limits).is_err());
    assert!(ReadArgs::from_json(&json!({"handle": "r:1", "extra": 1}), &limits).is_err());
}

#[test]
fn every_schema_property_is_a_field_the_parser_takes() {
    let definition = tool_definition(&Limits::default());
    let properties = definition.input_schema["properties"].as_object().unwrap();
    let names: Vec<&str> = properties.keys().map(String::as_str).collect();
    assert_eq!(names, ["byte", "grep", "handle", "limit", "offset"]);
    assert_eq!(definition.input_schema["required"], json!(["handle"]));
    assert_eq!(
        definition.input_schema["additionalProperties"],
        json!(false)
    );
}
