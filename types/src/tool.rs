//! The MCP tool definition, as a server returns it from `tools/list` (MCP 2025-11-25).
//!
//! Every field of the specification has a typed home, and every field a server sends that
//! the specification does not name (yet) is kept in an `extra` map, so a definition
//! round-trips through serde without losing anything.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ToolName;

/// A JSON object, as used for schemas, `_meta` and tool arguments.
pub type JsonObject = Map<String, Value>;

/// One tool as declared by an MCP server.
///
/// Field names follow the wire format (`inputSchema`, `outputSchema`, `_meta`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolDefinition {
    /// The programmatic name, unique within its server.
    pub name: ToolName,
    /// A human-readable display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the tool does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of the arguments. The specification requires an object schema; it
    /// is kept verbatim.
    pub input_schema: JsonObject,
    /// The JSON Schema of `structuredContent` in results, when the tool declares one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<JsonObject>,
    /// Behaviour hints. Untrusted unless the server is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<ToolAnnotations>,
    /// Execution properties (task support).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<ToolExecution>,
    /// Icons a client may show.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icons: Option<Vec<Icon>>,
    /// Protocol-reserved metadata, kept verbatim.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
    /// Fields the specification does not name, kept verbatim so nothing is lost.
    #[serde(flatten)]
    pub extra: JsonObject,
}

impl ToolDefinition {
    /// A definition with a name, a description and an input schema, every other field absent.
    pub fn new(name: ToolName, description: impl Into<String>, input_schema: JsonObject) -> Self {
        Self {
            name,
            title: None,
            description: Some(description.into()),
            input_schema,
            output_schema: None,
            annotations: None,
            execution: None,
            icons: None,
            meta: None,
            extra: JsonObject::new(),
        }
    }

    /// The description, or the empty string when the server gave none.
    pub fn description_or_empty(&self) -> &str {
        self.description.as_deref().unwrap_or("")
    }
}

/// Hints about a tool's behaviour (`ToolAnnotations` in the specification).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolAnnotations {
    /// A human-readable title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The tool does not modify its environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    /// The tool may perform destructive updates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    /// Repeating a call with the same arguments has no further effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    /// The tool interacts with an open world of external entities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
    /// Fields the specification does not name.
    #[serde(flatten)]
    pub extra: JsonObject,
}

/// Execution properties of a tool (`ToolExecution` in the specification).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolExecution {
    /// Whether the tool may be invoked as a task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_support: Option<TaskSupport>,
    /// Fields the specification does not name.
    #[serde(flatten)]
    pub extra: JsonObject,
}

/// Whether a tool supports task-augmented execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskSupport {
    /// The tool must not be invoked as a task.
    Forbidden,
    /// The tool may be invoked as a task or not.
    Optional,
    /// The tool must be invoked as a task.
    Required,
}

/// An icon a client may display for a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Icon {
    /// A URI (often a `data:` URI) for the image.
    pub src: String,
    /// The image's MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Sizes such as `"48x48"` or `"any"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizes: Option<Vec<String>>,
    /// The theme the icon is made for (`"light"` or `"dark"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub theme: Option<String>,
    /// Fields the specification does not name.
    #[serde(flatten)]
    pub extra: JsonObject,
}

/// The `result` of a `tools/list` call: one page of tools and the cursor of the next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolList {
    /// The tools on this page.
    pub tools: Vec<ToolDefinition>,
    /// The cursor for the next page, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
    /// Fields the specification does not name (`_meta`, …).
    #[serde(flatten)]
    pub extra: JsonObject,
}
