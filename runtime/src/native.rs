//! Provider-native deferral's search, executed by Psych.
//!
//! In [`DeferralMode::Native`](psych_prompt_assembly::DeferralMode::Native) a request
//! carries the deferred tools with `defer_loading` and Psych's client search tool
//! ([`SearchTool::Client`]). A call of that tool is routed here: prompt-assembly, which
//! declares the tool, reads its arguments ([`SearchArguments::parse`]); disclosure ranks
//! the deferred tools permitted now ([`Surface::search_deferred`]); prompt-assembly's
//! [`search_answer`] turns the ranking into the logged answer (`tool_reference` blocks,
//! rendered as such for Anthropic and as a `tool_search_output` for Responses), naming only
//! tools of the request's deferred set; when nothing matches, the answer is disclosure's
//! note instead (nothing matched; try other words). The tools it loads are then called by
//! their qualified names, through the guard like any direct call.

use psych_disclosure::{Live, Surface};
use psych_prompt_assembly::{
    MAX_SEARCH_LIMIT, NativeDeferral, SearchArguments, SearchTool, search_answer,
};
use psych_types::{ToolCall, ToolOutput};

/// Whether `call` is a call of `deferral`'s client-side search tool (answered by
/// [`answer`], never forwarded).
pub(crate) fn is_search(deferral: &NativeDeferral, call: &ToolCall) -> bool {
    matches!(deferral.search(), SearchTool::Client { name, .. } if call.name == name.as_str())
}

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
    Some(match SearchArguments::parse(&call.arguments) {
        Ok(search) => {
            // Ranked past the limit, so tools the request does not defer (added to a
            // catalogue since the turn began) do not crowd out the ones it does.
            let (ranked, note) =
                surface.search_deferred_noted(search.query, live, 2 * MAX_SEARCH_LIMIT);
            match note {
                // Nothing matched: the text says so. (A weak answer with hits stays
                // references only: the providers render a search answer's references and
                // nothing beside them.)
                Some(note) if ranked.is_empty() => ToolOutput::text(note),
                _ => search_answer(ranked, deferral, search.limit),
            }
        }
        Err(problem) => {
            ToolOutput::error(format!("invalid arguments for {}: {problem}", call.name))
        }
    })
}
