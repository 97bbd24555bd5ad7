//! The tool's definition for the prompt: name, description and JSON input schema.

use psych_types::{JsonObject, READ_TOOL_OUTPUT, ToolDefinition, ToolName};
use serde_json::json;

use crate::Limits;
use crate::limits::MAX_GREP_BYTES;

/// The definition of `read_tool_output` (named by
/// [`psych_types::READ_TOOL_OUTPUT`]) under `limits` (the limit's default and maximum and
/// the line cap appear in it). The same limits always give the same bytes.
pub fn tool_definition(limits: &Limits) -> ToolDefinition {
    let description = format!(
        "Read a tool result that was shown shortened, using the handle given with it; the \
         whole result is kept. Without grep, returns up to `limit` lines starting at `offset`, \
         each after its line number. With grep, returns the lines that contain the grep text \
         (literal and case-sensitive, not a regex) from `offset` on, up to `limit` of them, \
         each after its line number. The answer starts with the result's size, the lines \
         returned and, when more follows, the offset to pass next. An offset past the end or \
         a grep without a match returns no lines; that is not an error. Lines over {} bytes \
         are cut, marked […N bytes]; with grep the part around the match is shown; a cut \
         line's end names the offset and byte to read on from. Binary results (images, \
         audio) are described, not shown. To pass a kept result, or part of it, as another \
         tool's argument without copying it, write {{\"$psych_result\": \"<handle>\"}} there, \
         with offset and limit (lines) or pointer (a JSON pointer) for a part; it is replaced \
         before the call.",
        limits.max_line_bytes
    );
    let schema = json!({
        "type": "object",
        "properties": {
            "handle": {
                "type": "string",
                "description": "The handle shown with the shortened result, such as \"run-7:42\"."
            },
            "offset": {
                "type": "integer",
                "minimum": 0,
                "default": 0,
                "description": "Lines to skip before the first line returned, counting from 0: line N is at offset N-1. With grep, the search starts there."
            },
            "byte": {
                "type": "integer",
                "minimum": 0,
                "default": 0,
                "description": "Bytes of the line at offset to skip first, to read on in a cut line; with grep, the search starts there."
            },
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": limits.max_limit,
                "default": limits.default_limit,
                "description": "At most this many lines, or matching lines with grep."
            },
            "grep": {
                "type": "string",
                "minLength": 1,
                // JSON Schema counts characters; the parser counts UTF-8 bytes. A quarter of
                // the byte bound in characters is never over it, so nothing the schema
                // allows is refused.
                "maxLength": MAX_GREP_BYTES / 4,
                "description": "Literal text to search for (case-sensitive, one line, at most 64 characters); only lines containing it are returned."
            }
        },
        "required": ["handle"],
        "additionalProperties": false
    });
    let input_schema: JsonObject = match schema {
        serde_json::Value::Object(map) => map,
        _ => JsonObject::new(),
    };
    // READ_TOOL_OUTPUT is the constant "read_tool_output": 16 bytes of [a-z_], inside the tool-name
    // alphabet `[A-Za-z0-9_.-]{1,128}`, so `new` cannot refuse it (a test builds it too).
    #[allow(
        clippy::expect_used,
        reason = "a constant inside the alphabet, proved above"
    )]
    let name = ToolName::new(READ_TOOL_OUTPUT).expect("READ_TOOL_OUTPUT is a valid tool name");
    ToolDefinition::new(name, description, input_schema)
}
