//! Provider-native deferral's search, executed by Psych.
//!
//! In [`DeferralMode::Native`](psych_prompt_assembly::DeferralMode::Native) a request
//! carries the deferred tools with `defer_loading` and Psych's client search tool
//! ([`SearchTool::Client`]). A call of that tool is answered here: disclosure ranks the
//! deferred tools permitted now ([`Surface::search_deferred`]) and prompt-assembly's
//! [`search_answer`] turns the ranking into the logged answer (`tool_reference` blocks,
//! rendered as such for Anthropic and as a `tool_search_output` for Responses), naming only
//! tools of the request's deferred set. The tools it loads are then called by their
//! qualified names, through the guard like any direct call.

use psych_disclosure::{Live, Surface};
use psych_prompt_assembly::{NativeDeferral, SearchTool, search_answer};
use psych_types::{ToolCall, ToolOutput};
use serde_json::Value;

/// How many tools a search loads when the call does not say (the search tool's documented
/// default).
pub const DEFAULT_SEARCH_LIMIT: usize = 5;

/// The most tools one search loads (the search tool's schema says so too).
pub const MAX_SEARCH_LIMIT: usize = 10;

/// The answer to `call` when it is a call of `deferral`'s client search tool, else `None`
/// (Anthropic's server-side search tools are run by Anthropic, never by the caller).
pub(crate) fn answer(
    surface: &Surface,
    live: &Live<'_>,
    deferral: &NativeDeferral,
    call: &ToolCall,
) -> Option<ToolOutput> {
    let SearchTool::Client { name, .. } = deferral.search() else {
        return None;
    };
    if call.name != name.as_str() {
        return None;
    }
    Some(match arguments(&call.arguments) {
        Ok((query, limit)) => {
            // Ranked past the limit, so tools the request does not defer (added to a
            // catalogue since the turn began) do not crowd out the ones it does.
            let ranked = surface.search_deferred(query, live, 2 * MAX_SEARCH_LIMIT);
            search_answer(ranked, deferral, limit)
        }
        Err(problem) => {
            ToolOutput::error(format!("invalid arguments for {}: {problem}", call.name))
        }
    })
}

/// The query and the limit of a search call, or what is wrong with them.
fn arguments(arguments: &Value) -> Result<(&str, usize), String> {
    let Some(object) = arguments.as_object() else {
        return Err("the arguments must be a JSON object".into());
    };
    if let Some(key) = object.keys().find(|k| *k != "query" && *k != "limit") {
        return Err(format!(
            "/{key}: unknown property; expected \"query\" and \"limit\""
        ));
    }
    let query = match object.get("query") {
        Some(Value::String(query)) => query.as_str(),
        Some(_) => return Err("/query: must be a string".into()),
        None => return Err("/query: is required".into()),
    };
    let limit = match object.get("limit") {
        None => DEFAULT_SEARCH_LIMIT,
        Some(value) => match value.as_u64().and_then(|n| usize::try_from(n).ok()) {
            Some(n) if (1..=MAX_SEARCH_LIMIT).contains(&n) => n,
            _ => {
                return Err(format!(
                    "/limit: must be an integer from 1 to {MAX_SEARCH_LIMIT}"
                ));
            }
        },
    };
    Ok((query, limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_are_checked() {
        assert_eq!(arguments(&json!({"query": "q"})), Ok(("q", 5)));
        assert_eq!(
            arguments(&json!({"query": "q", "limit": 10})),
            Ok(("q", 10))
        );
        assert!(arguments(&json!({"query": "q", "limit": 11})).is_err());
        assert!(arguments(&json!({"query": "q", "limit": 0})).is_err());
        assert!(arguments(&json!({"query": 3})).is_err());
        assert!(arguments(&json!({})).is_err());
        assert!(arguments(&json!({"query": "q", "k": 1})).is_err());
        assert!(arguments(&json!("q")).is_err());
    }
}
