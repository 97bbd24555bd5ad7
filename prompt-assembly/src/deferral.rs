//! Provider-native deferral: deferred servers' permitted tools sent with
//! `defer_loading: true` (their schemas are not loaded into the model's context until a
//! search finds them) plus a search tool, instead of Psych's meta tools.
//!
//! The caller chooses the mode per Run ([`DeferralMode`]) and falls back to the meta tools
//! where the provider has no native deferral or the deferred set is over its documented
//! limit ([`choose_deferral`]). In [`DeferralMode::Native`] the renderers are given a
//! [`NativeDeferral`] through their options:
//!
//! - Anthropic Messages: the deferred tools follow the surface's tools (each sorted by
//!   name), after the search tool, each as `{"name","description","input_schema",
//!   "defer_loading":true}`. The search tool is a client tool Psych executes
//!   ([`SearchTool::Client`]), answered by a `tool_result` whose content is
//!   `{"type":"tool_reference","tool_name":…}` blocks, or Anthropic's server-side search
//!   tool ([`SearchTool::AnthropicRegex`], [`SearchTool::AnthropicBm25`]).
//! - OpenAI Responses: the deferred tools as function tools with `"defer_loading":true`,
//!   and `{"type":"tool_search","execution":"client","description","parameters"}`; a call of
//!   the search tool answered by references is sent as a `tool_search_call` item and its
//!   result as a `tool_search_output` item whose `tools` are the referenced deferred
//!   tools' definitions; one answered by text (an error such as a refused `limit`, a note
//!   that nothing matched, an elided preview) or not answered is sent as a
//!   `function_call` and a `function_call_output` holding that text, since a
//!   `tool_search_output` has no place for it.
//! - OpenAI Chat Completions has no native deferral: a request given one is a
//!   [`RenderError::NativeDeferralUnsupported`](crate::RenderError::NativeDeferralUnsupported).
//!
//! A search answer is logged as an ordinary [`ToolOutput`] whose content blocks are
//! `{"type":"tool_reference","tool_name":…}` objects (kept by psych-types as
//! [`ContentBlock::Unknown`]), made by [`search_answer`] from disclosure's ranking. The
//! renderers emit a reference only for a tool in the request's deferred set: a reference to
//! any other name (not permitted, or no longer deferred) is left out, never sent. A search
//! result whose view is a projection (an elided preview), or that is text (an error, a
//! note), is sent as that text.
//!
//! Calls to a natively loaded tool arrive under its qualified name like any direct call,
//! and go through disclosure's guard at call time like every other call.

use std::sync::Arc;

use psych_types::{ContentBlock, JsonObject, ToolDefinition, ToolName, ToolOutput, ToolResult};

use crate::Provider;

/// The most deferred tools Anthropic's tool search takes: "Maximum tools: 10,000 tools in
/// your catalog", section "Limits and best practices › Limits" of Anthropic's "Tool search
/// tool" page (<https://platform.claude.com/docs/en/agents-and-tools/tool-use/tool-search-tool>,
/// read in December 2026; the same section gives 3-5 tools per search and 200 characters
/// per regex pattern; the Agent SDK's "Tool search" page states the same maximum). OpenAI
/// documents no limit for deferred tools in the Responses API that we found; Psych applies
/// the same figure there.
pub const MAX_DEFERRED_TOOLS: usize = 10_000;

/// The content block type of a reference to a deferred tool in a search answer.
pub const TOOL_REFERENCE: &str = "tool_reference";

/// The text of a search answer that references no tool: what [`search_answer`] logs when
/// no ranked name is a deferred tool, and what a `tool_result` shows when every reference
/// of an answer was left out.
pub const NO_MATCH: &str = "No deferred tool matched the query.";

/// The name of the client search tool [`SearchTool::client`] declares
/// ([`psych_types::TOOL_SEARCH`], which no exposed tool takes).
pub const SEARCH_TOOL_NAME: &str = psych_types::TOOL_SEARCH;

/// How many tools a search loads when its call does not say ([`SearchTool::client`]'s
/// schema documents it).
pub const DEFAULT_SEARCH_LIMIT: usize = 5;

/// The most tools one search loads ([`SearchTool::client`]'s schema says so too).
pub const MAX_SEARCH_LIMIT: usize = 10;

/// How deferred servers' tools reach the model, chosen by the caller per Run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum DeferralMode {
    /// Psych's meta tools (list, describe, call): every provider, every MCP client.
    #[default]
    MetaTools,
    /// The provider's own deferral: deferred tools sent with `defer_loading: true` and a
    /// search tool.
    Native,
}

/// The mode a request is rendered in: `requested`, unless it is [`DeferralMode::Native`]
/// and the provider has no native deferral (Chat Completions) or `deferred_tools` is over
/// [`MAX_DEFERRED_TOOLS`]: then the meta tools.
pub fn choose_deferral(
    requested: DeferralMode,
    provider: Provider,
    deferred_tools: usize,
) -> DeferralMode {
    match (requested, provider) {
        (DeferralMode::Native, Provider::Anthropic | Provider::OpenAiResponses)
            if deferred_tools <= MAX_DEFERRED_TOOLS =>
        {
            DeferralMode::Native
        }
        _ => DeferralMode::MetaTools,
    }
}

/// The search tool of a request in native deferral.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SearchTool {
    /// A search tool Psych executes (ranked by disclosure's search): an ordinary client tool
    /// for Anthropic, `tool_search` with `execution: "client"` for Responses (which takes
    /// its description and parameters; the name there is always `tool_search`).
    Client {
        /// The tool's name (Anthropic).
        name: ToolName,
        /// What the model reads about it.
        description: String,
        /// Its input schema.
        input_schema: JsonObject,
    },
    /// Anthropic's server-side regex search, `tool_search_tool_regex_20251119`.
    AnthropicRegex,
    /// Anthropic's server-side BM25 search, `tool_search_tool_bm25_20251119`.
    AnthropicBm25,
}

impl SearchTool {
    /// The client search tool Psych declares by default: [`SEARCH_TOOL_NAME`], a `query`
    /// and an optional `limit` (1 to [`MAX_SEARCH_LIMIT`], [`DEFAULT_SEARCH_LIMIT`] when
    /// not given). [`SearchArguments::parse`] reads its calls.
    pub fn client() -> Self {
        let schema = serde_json::json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What the tool should do, in words."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_LIMIT,
                          "description": format!(
                              "How many tools to load (default {DEFAULT_SEARCH_LIMIT})."
                          )}
            },
            "required": ["query"],
            "additionalProperties": false
        });
        let input_schema = match schema {
            serde_json::Value::Object(map) => map.into_iter().collect(),
            _ => JsonObject::new(),
        };
        #[allow(
            clippy::expect_used,
            reason = "SEARCH_TOOL_NAME matches the name rule (the_search_tool_name_is_valid)"
        )]
        let name = ToolName::new(SEARCH_TOOL_NAME).expect("a valid constant tool name");
        Self::Client {
            name,
            description: "Search the deferred tools by what they do and load the best \
                          matches, which can then be called like any other tool."
                .to_owned(),
            input_schema,
        }
    }

    /// The name calls of this tool carry in the log (Responses: always `tool_search`).
    pub fn name(&self) -> &str {
        match self {
            SearchTool::Client { name, .. } => name.as_str(),
            SearchTool::AnthropicRegex => psych_types::ANTHROPIC_TOOL_SEARCHES[0],
            SearchTool::AnthropicBm25 => psych_types::ANTHROPIC_TOOL_SEARCHES[1],
        }
    }
}

/// The arguments of a call of the client search tool ([`SearchTool::client`]), checked
/// against its schema: what the caller's executor ranks the deferred tools by (disclosure's
/// search) before answering with [`search_answer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SearchArguments<'a> {
    /// What the model is looking for, in words.
    pub query: &'a str,
    /// How many tools to load: 1 to [`MAX_SEARCH_LIMIT`], [`DEFAULT_SEARCH_LIMIT`] when the
    /// call does not say.
    pub limit: usize,
}

impl<'a> SearchArguments<'a> {
    /// Reads a call's arguments as [`SearchTool::client`]'s schema declares them: an object
    /// with a string `query` and an optional integer `limit`, nothing else.
    ///
    /// # Errors
    ///
    /// [`SearchArgumentsError`], saying where (a JSON pointer) and what is wrong, for the
    /// model to read as the call's failed result.
    pub fn parse(arguments: &'a serde_json::Value) -> Result<Self, SearchArgumentsError> {
        use serde_json::Value;
        let refuse = |problem: String| Err(SearchArgumentsError(problem));
        let Some(object) = arguments.as_object() else {
            return refuse("the arguments must be a JSON object".into());
        };
        if let Some(key) = object.keys().find(|k| *k != "query" && *k != "limit") {
            return refuse(format!(
                "/{key}: unknown property; expected \"query\" and \"limit\""
            ));
        }
        let query = match object.get("query") {
            Some(Value::String(query)) => query.as_str(),
            Some(_) => return refuse("/query: must be a string".into()),
            None => return refuse("/query: is required".into()),
        };
        let limit = match object.get("limit") {
            None => DEFAULT_SEARCH_LIMIT,
            Some(value) => {
                match psych_types::json_whole(value).and_then(|n| usize::try_from(n).ok()) {
                    Some(n) if (1..=MAX_SEARCH_LIMIT).contains(&n) => n,
                    _ => {
                        return refuse(format!(
                            "/limit: must be an integer from 1 to {MAX_SEARCH_LIMIT}"
                        ));
                    }
                }
            }
        };
        Ok(Self { query, limit })
    }
}

/// Why [`SearchArguments::parse`] refused a search call's arguments: where and what, said
/// for the model (the call is answered with a failed result, not an error of the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SearchArgumentsError(String);

/// What a request in native deferral sends besides the surface: the deferred tools and the
/// search tool.
#[derive(Debug, Clone, PartialEq)]
pub struct NativeDeferral {
    deferred: Arc<[ToolDefinition]>,
    search: SearchTool,
}

impl NativeDeferral {
    /// The deferred servers' permitted tools, under their qualified names (disclosure's
    /// exposed names), and the search tool. The tools are kept sorted by name, so the bytes
    /// do not depend on the order given.
    pub fn new(mut deferred: Vec<ToolDefinition>, search: SearchTool) -> Self {
        deferred.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        Self {
            deferred: deferred.into(),
            search,
        }
    }

    /// The deferred tools, sorted by name.
    pub fn tools(&self) -> &[ToolDefinition] {
        &self.deferred
    }

    /// The search tool.
    pub fn search(&self) -> &SearchTool {
        &self.search
    }

    /// The deferred tool named `name`, if any.
    pub fn tool(&self, name: &str) -> Option<&ToolDefinition> {
        self.deferred
            .binary_search_by(|tool| tool.name.as_str().cmp(name))
            .ok()
            .and_then(|i| self.deferred.get(i))
    }
}

/// The answer to a call of the search tool, as it is logged: one `tool_reference` block per
/// name of `ranked` (disclosure's ranking, best first) that is a deferred tool of
/// `deferral`, at most `limit`, in ranking order; or, when none is, one text block saying
/// nothing matched. Names outside the deferred set (not permitted, or not deferred) are
/// never referenced.
pub fn search_answer<'n>(
    ranked: impl IntoIterator<Item = &'n str>,
    deferral: &NativeDeferral,
    limit: usize,
) -> ToolOutput {
    let mut seen = std::collections::BTreeSet::new();
    let content: Vec<ContentBlock> = ranked
        .into_iter()
        .filter(|name| deferral.tool(name).is_some() && seen.insert(*name))
        .take(limit)
        .map(|name| {
            ContentBlock::Unknown(JsonObject::from_iter([
                ("type".to_owned(), TOOL_REFERENCE.into()),
                ("tool_name".to_owned(), name.into()),
            ]))
        })
        .collect();
    if content.is_empty() {
        return ToolOutput::text(NO_MATCH);
    }
    ToolOutput {
        content,
        ..ToolOutput::text("")
    }
}

/// The deferred tools `result` references, in order, when it is the answer of
/// `deferral`'s search tool: `None` for another tool's result (an upstream may send any
/// block type, `tool_reference` too) and when any block is something else than a
/// `tool_reference`. References to tools outside `deferral` are left out.
pub(crate) fn references<'a>(
    result: &'a ToolResult,
    deferral: &'a NativeDeferral,
) -> Option<Vec<&'a ToolDefinition>> {
    let output = &result.output;
    if result.name != deferral.search().name() || output.content.is_empty() {
        return None;
    }
    let mut tools = Vec::new();
    for block in &output.content {
        let ContentBlock::Unknown(map) = block else {
            return None;
        };
        if map.get("type").and_then(|t| t.as_str()) != Some(TOOL_REFERENCE) {
            return None;
        }
        let name = map.get("tool_name").and_then(|n| n.as_str())?;
        if let Some(tool) = deferral.tool(name) {
            tools.push(tool);
        }
    }
    Some(tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> ToolDefinition {
        ToolDefinition::new(
            ToolName::new(name).unwrap(),
            "d",
            JsonObject::from_iter([("type".to_owned(), "object".into())]),
        )
    }

    #[test]
    fn search_arguments_are_checked_against_the_schema() {
        use serde_json::json;
        let parse = |value: serde_json::Value| {
            SearchArguments::parse(&value)
                .map(|a| (a.query.to_owned(), a.limit))
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse(json!({"query": "q"})), Ok(("q".into(), 5)));
        assert_eq!(
            parse(json!({"query": "q", "limit": 10})),
            Ok(("q".into(), 10))
        );
        assert_eq!(
            parse(json!({"query": "q", "limit": 11})),
            Err("/limit: must be an integer from 1 to 10".into())
        );
        assert!(parse(json!({"query": "q", "limit": 0})).is_err());
        assert_eq!(
            parse(json!({"query": 3})),
            Err("/query: must be a string".into())
        );
        assert_eq!(parse(json!({})), Err("/query: is required".into()));
        assert!(parse(json!({"query": "q", "k": 1})).is_err());
        assert!(parse(json!("q")).is_err());
        // The schema the model reads says the same limits.
        let SearchTool::Client { input_schema, .. } = SearchTool::client() else {
            unreachable!("client() is a client tool")
        };
        let limit = &input_schema["properties"]["limit"];
        assert_eq!(limit["maximum"], json!(MAX_SEARCH_LIMIT));
        assert_eq!(limit["description"], "How many tools to load (default 5).");
    }

    #[test]
    fn the_search_tool_name_is_valid() {
        assert_eq!(SearchTool::client().name(), SEARCH_TOOL_NAME);
    }

    #[test]
    fn native_falls_back_where_the_provider_cannot() {
        use DeferralMode::*;
        assert_eq!(choose_deferral(Native, Provider::Anthropic, 10_000), Native);
        assert_eq!(
            choose_deferral(Native, Provider::Anthropic, 10_001),
            MetaTools
        );
        assert_eq!(
            choose_deferral(Native, Provider::OpenAiResponses, 1),
            Native
        );
        assert_eq!(choose_deferral(Native, Provider::OpenAi, 1), MetaTools);
        assert_eq!(
            choose_deferral(MetaTools, Provider::Anthropic, 1),
            MetaTools
        );
    }

    #[test]
    fn answers_reference_only_deferred_tools_in_ranking_order() {
        let deferral = NativeDeferral::new(
            vec![tool("gh__b"), tool("gh__a"), tool("gh__c")],
            SearchTool::client(),
        );
        assert_eq!(
            deferral
                .tools()
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>(),
            ["gh__a", "gh__b", "gh__c"]
        );
        let answer = search_answer(
            ["gh__c", "secret__x", "gh__a", "gh__c", "gh__b"],
            &deferral,
            2,
        );
        // As logged: the result of a call of the search tool.
        let logged = |output: &ToolOutput, name: &str| ToolResult {
            target: None,
            call_id: psych_types::ToolCallId::new("c").unwrap(),
            name: name.into(),
            output: output.clone(),
        };
        let search = deferral.search().name().to_owned();
        let answered = logged(&answer, &search);
        let names: Vec<&str> = references(&answered, &deferral)
            .unwrap()
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(names, ["gh__c", "gh__a"]);
        let json = serde_json::to_string(&answer).unwrap();
        assert!(
            json.contains(r#"{"tool_name":"gh__c","type":"tool_reference"}"#),
            "{json}"
        );
        // Nothing permitted matched: a text answer, which is no reference.
        let none = search_answer(["secret__x"], &deferral, 5);
        assert_eq!(references(&logged(&none, &search), &deferral), None);
        // The same blocks in another tool's result are that tool's output.
        assert_eq!(references(&logged(&answer, "read_file"), &deferral), None);
        assert!(!none.is_error);
    }
}
