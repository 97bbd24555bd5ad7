//! What provider-native deferral needs from a Surface: the deferred tools under their
//! qualified names (for `defer_loading`), the tools to send beside them, and the search
//! ranking that answers the model's search over them.
//!
//! A deferred tool's qualified name is assigned with every other name of the Surface
//! ([`Exposed::Deferred`]), so it is unique across the meta tools, the orientation tool
//! and the direct tools, ignoring ASCII case; its call goes through [`Surface::guard`]
//! like a direct one (permission re-checked now, arguments validated). A tool that is not
//! permitted has no name, no definition here and no place in a search answer.

use std::collections::HashMap;

use psych_types::{ToolDefinition, ToolName, ToolRef};

use crate::guard::tool_named;
use crate::names::Exposed;
use crate::{Live, SearchIndex, Surface};

impl Surface {
    /// Every deferred tool's qualified name and the pair it calls, sorted by name: the
    /// permitted tools of each deferred server, less those injected as direct tools.
    pub fn deferred_names(&self) -> impl Iterator<Item = (&str, &ToolRef)> {
        self.deferred
            .iter()
            .filter_map(|(name, exposed)| match exposed {
                Exposed::Deferred { target } => Some((name.as_str(), target)),
                _ => None,
            })
    }

    /// The deferred tools' definitions under their qualified names, sorted by name: what a
    /// provider that defers natively is sent with `defer_loading: true` (each tool's
    /// description and schemas as its server lists them). Built on each call from the
    /// catalogues the Surface was resolved from; empty when no server is deferred.
    pub fn deferred_tools(&self) -> Vec<ToolDefinition> {
        self.deferred_names()
            .filter_map(|(name, target)| {
                let tools = &self.deferred_catalogs.get(&target.server)?.0;
                let mut tool = tool_named(tools, target.tool.as_str())?.clone();
                // The name was checked provider-safe when it was assigned.
                tool.name = ToolName::new(name).ok()?;
                Some(tool)
            })
            .collect()
    }

    /// The tools to send beside the deferred tools when a provider defers natively:
    /// [`Surface::tools`] less the meta tools, whose listing, description and call-through
    /// the provider's search and the loaded tools replace. Sorted by name.
    pub fn native_tools(&self) -> Vec<ToolDefinition> {
        self.tools()
            .iter()
            .filter(|tool| !matches!(self.exposed(tool.name.as_str()), Some(Exposed::Meta { .. })))
            .cloned()
            .collect()
    }

    /// The qualified names of the deferred tools that best match `query`, best first, at
    /// most `limit`: disclosure's keyword search ([`SearchIndex`]) over the deferred tools
    /// permitted *now* (the grant and catalogues of `live`), so a tool revoked or gone
    /// since resolution is never named. An empty list when nothing matches.
    pub fn search_deferred<'a>(
        &'a self,
        query: &str,
        live: &Live<'a>,
        limit: usize,
    ) -> Vec<&'a str> {
        let mut by_pair: HashMap<ToolRef, &'a str> = HashMap::new();
        let mut indexed = Vec::new();
        for (name, target) in self.deferred_names() {
            let Ok(server) = self.live_server(target.server.as_str(), live) else {
                continue;
            };
            let Ok(tool) = server.tool(target.tool.as_str()) else {
                continue;
            };
            indexed.push((server.server, tool));
            by_pair.insert(target.clone(), name);
        }
        SearchIndex::new(indexed)
            .search(query, limit)
            .into_iter()
            .filter_map(|hit| by_pair.get(&hit).copied())
            .collect()
    }
}
