//! The tool definitions Psych writes itself: the meta tools, the orientation tool, a
//! server's facade and its search pair. Their bytes depend only on their inputs (the
//! server, its description, its permitted names), never on the clock or on health.

use psych_types::{JsonObject, ServerId, ToolDefinition, ToolName};
use serde_json::{Value, json};

use crate::names::{CALL_TOOL, DESCRIBE_TOOL, LIST_TOOLS, ORIENTATION};
use crate::text::{TRUNCATION_MARKER, cap_chars, first_line};

/// How many hits a search answers with.
pub const SEARCH_HITS: usize = 10;

/// The longest server description a facade or search tool repeats.
const DESCRIPTION_CHARS: usize = 200;

fn object(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        // Every caller passes an object literal.
        _ => JsonObject::new(),
    }
}

/// A definition whose name is already a valid MCP name.
fn definition(name: &str, description: String, schema: Value) -> Option<ToolDefinition> {
    let name = ToolName::new(name).ok()?;
    Some(ToolDefinition::new(name, description, object(schema)))
}

fn server_and_tool() -> Value {
    json!({
        "server": {"type": "string", "description": "The server's name, as listed."},
        "tool": {"type": "string", "description": "The tool's name on that server, as listed."}
    })
}

/// The three meta tools, in name order.
pub(crate) fn meta_tools() -> Vec<ToolDefinition> {
    let mut call_props = server_and_tool();
    if let Value::Object(map) = &mut call_props {
        map.insert(
            "arguments".into(),
            json!({"type": "object", "description": "The tool's arguments, matching its input schema. Default: {}."}),
        );
    }
    [
        definition(
            CALL_TOOL,
            "Call one tool of an MCP server by its (server, tool) pair. Read its input schema \
             first with psych_describe_tool; arguments that do not match it come back as a \
             validation error naming the failing path."
                .into(),
            json!({
                "type": "object",
                "properties": call_props,
                "required": ["server", "tool"],
                "additionalProperties": false
            }),
        ),
        definition(
            DESCRIBE_TOOL,
            "Read one tool's description, input schema and output schema, by its (server, \
             tool) pair."
                .into(),
            json!({
                "type": "object",
                "properties": server_and_tool(),
                "required": ["server", "tool"],
                "additionalProperties": false
            }),
        ),
        definition(
            LIST_TOOLS,
            "List the tools of one MCP server, deferred servers included (each is named in \
             the system prompt): names with one-line summaries, one page at a time. The \
             answer says which page to ask for next."
                .into(),
            json!({
                "type": "object",
                "properties": {
                    "server": {"type": "string", "description": "The server's name, as listed."},
                    "page": {"type": "integer", "minimum": 1, "description": "Which page, from 1. Default: 1."}
                },
                "required": ["server"],
                "additionalProperties": false
            }),
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The orientation tool.
pub(crate) fn orientation_tool() -> Option<ToolDefinition> {
    definition(
        ORIENTATION,
        "Call this first: who and where you are working for, the conventions to follow, and \
         the shape of the toolkit (tool categories with counts, servers and how to reach \
         them). verbose: true adds the full tool map."
            .into(),
        json!({
            "type": "object",
            "properties": {
                "verbose": {"type": "boolean", "description": "Add the full tool map and uncut text. Default: false."}
            },
            "additionalProperties": false
        }),
    )
}

/// The first line of a facade's description: every permitted name.
pub(crate) fn facade_index(server: &ServerId, names: &[&ToolName]) -> String {
    let mut line = format!("Tools of MCP server {server} ({}): ", names.len());
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            line.push_str(", ");
        }
        line.push_str(name.as_str());
    }
    line
}

fn about(description: Option<&str>) -> String {
    description
        .map(first_line)
        .filter(|line| !line.is_empty())
        .map(|line| {
            format!(
                "{}\n",
                cap_chars(&line, DESCRIPTION_CHARS, TRUNCATION_MARKER)
            )
        })
        .unwrap_or_default()
}

fn tool_and_input(what: &str) -> Value {
    json!({
        "type": "object",
        "properties": {
            "tool": {"type": "string", "description": what},
            "input": {"type": "object", "description": "The tool's arguments. Leave out to read the tool's description and input schema instead of calling it."}
        },
        "required": ["tool"],
        "additionalProperties": false
    })
}

/// A server's facade: one tool whose first line indexes every permitted name.
pub(crate) fn facade(
    exposed: &str,
    server: &ServerId,
    description: Option<&str>,
    index: &str,
) -> Option<ToolDefinition> {
    definition(
        exposed,
        format!(
            "{index}\n{}Call with {{\"tool\"}} alone to read that tool's description and \
             input schema, with {{\"tool\", \"input\"}} to run it.",
            about(description)
        ),
        tool_and_input(&format!("One of the tools of {server} named above.")),
    )
}

/// The search half of a search pair.
pub(crate) fn search(
    exposed: &str,
    server: &ServerId,
    description: Option<&str>,
    count: usize,
    call_name: &str,
) -> Option<ToolDefinition> {
    definition(
        exposed,
        format!(
            "Search the {count} tools of MCP server {server} by what you want to do (matches \
             names, titles, descriptions and parameter names); answers the best \
             {SEARCH_HITS} with one-line summaries. Then use {call_name}.\n{}",
            about(description)
        )
        .trim_end()
        .to_owned(),
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "description": "Keywords or a short task description."}
            },
            "required": ["query"],
            "additionalProperties": false
        }),
    )
}

/// The call half of a search pair.
pub(crate) fn search_call(
    exposed: &str,
    server: &ServerId,
    search_name: &str,
) -> Option<ToolDefinition> {
    definition(
        exposed,
        format!(
            "Call one tool of MCP server {server} by name, as found with {search_name}. Call \
             with {{\"tool\"}} alone to read its description and input schema, with \
             {{\"tool\", \"input\"}} to run it."
        ),
        tool_and_input(&format!(
            "A tool name of {server}, as {search_name} found it."
        )),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixed_definition_builds() {
        assert_eq!(meta_tools().len(), crate::settings::META_TOOL_COUNT);
        assert!(orientation_tool().is_some());
        let server = ServerId::new("github").unwrap();
        assert!(facade("github", &server, None, "x").is_some());
        assert!(
            search(
                "github__search_tools",
                &server,
                None,
                3,
                "github__call_tool"
            )
            .is_some()
        );
        assert!(search_call("github__call_tool", &server, "github__search_tools").is_some());
    }
}
