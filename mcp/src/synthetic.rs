//! A realistic tool catalogue of any size, generated: `verb_noun` names as real servers
//! have them (`list_issues`, `create_pull_request`), prefixed by an area once the plain
//! names run out, with descriptions and nested input schemas (objects in arrays in objects,
//! enums, bounds, `required`) of the size real catalogues have. Deterministic: the same
//! size always gives the same tools, so prompts built from it can be snapshotted.

use psych_types::{JsonObject, ToolDefinition, ToolName};
use serde_json::{Value, json};

const VERBS: [&str; 10] = [
    "list", "get", "create", "update", "delete", "search", "archive", "export", "sync", "validate",
];
const NOUNS: [&str; 20] = [
    "issues",
    "pull_request",
    "repository",
    "branch",
    "commit",
    "workflow_run",
    "deployment",
    "invoice",
    "customer",
    "contact",
    "ticket",
    "calendar_event",
    "document",
    "folder",
    "page",
    "comment",
    "label",
    "milestone",
    "project",
    "team_member",
];
const AREAS: [&str; 12] = [
    "crm",
    "billing",
    "support",
    "docs",
    "ci",
    "hr",
    "analytics",
    "storage",
    "mail",
    "chat",
    "wiki",
    "ops",
];

/// `count` tools named and shaped like a real server's. Names are unique and valid MCP tool
/// names; after 200 plain names an area prefix (`crm_`, `billing_`, …) and then a number
/// keep them unique.
pub fn synthetic_tools(count: usize) -> Vec<ToolDefinition> {
    (0..count).map(tool).collect()
}

fn name(i: usize) -> String {
    let plain = VERBS.len() * NOUNS.len();
    let verb = VERBS[i % VERBS.len()];
    let noun = NOUNS[(i / VERBS.len()) % NOUNS.len()];
    if i < plain {
        return format!("{verb}_{noun}");
    }
    let round = i / plain - 1;
    let area = AREAS[round % AREAS.len()];
    match round / AREAS.len() {
        0 => format!("{area}_{verb}_{noun}"),
        n => format!("{area}{n}_{verb}_{noun}"),
    }
}

fn tool(i: usize) -> ToolDefinition {
    let name = name(i);
    let noun = NOUNS[(i / VERBS.len()) % NOUNS.len()].replace('_', " ");
    let verb = VERBS[i % VERBS.len()];
    let description = format!(
        "{} {noun} in the workspace. Use this when the user asks to {verb} {noun}; results are \
         paginated and sorted by last update. Returns the {noun} with its id, title, state, \
         owner and timestamps.",
        capitalized(verb)
    );
    let mut properties = JsonObject::new();
    properties.insert(
        "workspace_id".into(),
        json!({"type": "string", "description": "The workspace, as returned by list_workspaces.", "pattern": "^[a-z0-9-]{3,40}$"}),
    );
    properties.insert(
        "filters".into(),
        json!({
            "type": "array",
            "description": format!("Conditions the {noun} must all meet."),
            "items": {
                "type": "object",
                "properties": {
                    "field": {"type": "string", "enum": ["state", "owner", "label", "created_at", "updated_at"]},
                    "op": {"type": "string", "enum": ["eq", "ne", "lt", "gt", "contains"]},
                    "value": {"type": ["string", "number", "boolean"]}
                },
                "required": ["field", "op", "value"],
                "additionalProperties": false
            },
            "maxItems": 10
        }),
    );
    properties.insert(
        "page".into(),
        json!({
            "type": "object",
            "properties": {
                "cursor": {"type": "string", "description": "From the previous response's next_cursor."},
                "per_page": {"type": "integer", "minimum": 1, "maximum": 100, "default": 30}
            }
        }),
    );
    // Every third tool takes a nested body, as create/update tools do.
    if i % 3 == 2 {
        properties.insert(
            "body".into(),
            json!({
                "type": "object",
                "description": format!("The fields of the {noun} to write."),
                "properties": {
                    "title": {"type": "string", "maxLength": 256},
                    "text": {"type": "string", "description": "Markdown."},
                    "assignees": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
                    "metadata": {
                        "type": "object",
                        "additionalProperties": {"type": "string"},
                        "description": "Free-form key/value pairs."
                    }
                },
                "required": ["title"]
            }),
        );
    }
    let mut schema = JsonObject::new();
    schema.insert("type".into(), Value::from("object"));
    schema.insert("properties".into(), Value::Object(properties));
    schema.insert("required".into(), json!(["workspace_id"]));
    // `name(i)` joins words of [a-z_] and a number, under 40 bytes: always a valid name
    // (the test below checks 3,000 of them).
    #[allow(
        clippy::expect_used,
        reason = "the invariant is proved on the line above"
    )]
    let name = ToolName::new(name).expect("generated names are valid tool names");
    ToolDefinition::new(name, description, schema)
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_valid_and_stable() {
        let tools = synthetic_tools(3_000);
        let names: HashSet<_> = tools.iter().map(|t| t.name.as_str().to_owned()).collect();
        assert_eq!(names.len(), 3_000);
        assert_eq!(tools[0].name.as_str(), "list_issues");
        assert_eq!(tools[11].name.as_str(), "get_pull_request");
        assert_eq!(tools[200].name.as_str(), "crm_list_issues");
        assert_eq!(tools[2_600].name.as_str(), "crm1_list_issues");
        assert_eq!(synthetic_tools(5), synthetic_tools(5));
    }

    #[test]
    fn tools_are_the_size_of_real_ones() {
        let tools = synthetic_tools(120);
        let bytes = serde_json::to_vec(&tools).unwrap().len();
        // The real github catalogue: 117 tools in 125,935 bytes, about 1,076 per tool.
        let per_tool = bytes / tools.len();
        assert!(
            (700..=2_000).contains(&per_tool),
            "{per_tool} bytes per tool"
        );
    }
}
