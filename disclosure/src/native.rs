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
use std::sync::Arc;

use psych_types::{ServerId, ToolDefinition, ToolName, ToolRef};

use crate::guard::tool_named;
use crate::names::Exposed;
use crate::search::Part;
use crate::{Live, SearchIndex, Shape, Surface};

impl Surface {
    /// Every deferred tool's qualified name and the pair it calls, sorted by name: the
    /// permitted tools of each deferred server, less those injected as direct tools.
    pub fn deferred_names(&self) -> impl Iterator<Item = (&str, &ToolRef)> {
        // Each server's names are sorted; merged, they are sorted across servers (a hashed
        // name need not sort beside its server's others).
        let mut heads: Vec<_> = self
            .deferred
            .values()
            .map(|names| names.iter().peekable())
            .collect();
        std::iter::from_fn(move || {
            let mut first: Option<(usize, &String)> = None;
            for (i, head) in heads.iter_mut().enumerate() {
                if let Some(&(name, _)) = head.peek()
                    && first.is_none_or(|(_, least)| name < least)
                {
                    first = Some((i, name));
                }
            }
            heads.get_mut(first?.0)?.next()
        })
        .filter_map(|(name, exposed)| deferred_target(name, exposed))
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
    ///
    /// Each deferred server's index is built once per catalogue version and shared
    /// ([`Surface::prepare_search`] builds them ahead); a server whose catalogue or grant
    /// scope changed since resolution, or that has eagerly injected tools, is indexed for
    /// this call alone.
    pub fn search_deferred<'a>(
        &'a self,
        query: &str,
        live: &Live<'a>,
        limit: usize,
    ) -> Vec<&'a str> {
        self.search_deferred_noted(query, live, limit).0
    }

    /// [`Surface::search_deferred`] with the note of a weak answer ([`Ranking::note`]:
    /// nothing matched, or only weakly, and the deferred servers closest to the query), or
    /// `None` when the answer is not weak.
    ///
    /// [`Ranking::note`]: crate::Ranking::note
    pub fn search_deferred_noted<'a>(
        &'a self,
        query: &str,
        live: &Live<'a>,
        limit: usize,
    ) -> (Vec<&'a str>, Option<String>) {
        let mut by_pair: HashMap<ToolRef, &'a str> = HashMap::new();
        let mut parts = Vec::new();
        let mut indexed = Vec::new();
        for view in self.servers() {
            if view.shape != Shape::Deferred || view.permitted == 0 {
                continue;
            }
            let Ok(server) = self.live_server(view.server.as_str(), live) else {
                continue;
            };
            if view.eager.is_empty()
                && let Some(part) = self.cached_part(&server)
            {
                parts.push(part);
                continue;
            }
            for (name, target) in self.deferred_names_of(&view.server) {
                let Ok(tool) = server.tool(target.tool.as_str()) else {
                    continue;
                };
                indexed.push((server.server, tool));
                by_pair.insert(target.clone(), name);
            }
        }
        if !indexed.is_empty() {
            parts.push(Arc::new(Part::new(indexed)));
        }
        let ranking = SearchIndex::combine(parts).rank(query, limit);
        let note = ranking.note(query);
        let names = ranking
            .hits
            .into_iter()
            .filter_map(|(hit, _)| {
                by_pair
                    .get(&hit)
                    .copied()
                    .or_else(|| self.deferred_name(&hit))
            })
            .collect();
        (names, note)
    }

    /// The deferred names of one server's tools.
    fn deferred_names_of<'a>(
        &'a self,
        server: &'a ServerId,
    ) -> impl Iterator<Item = (&'a str, &'a ToolRef)> {
        self.deferred
            .get(server)
            .into_iter()
            .flat_map(|names| names.iter())
            .filter_map(|(name, exposed)| deferred_target(name, exposed))
    }

    /// The qualified name of a deferred pair: its natural name when it has it, else found
    /// by a scan of its server's names (a hashed name).
    fn deferred_name(&self, pair: &ToolRef) -> Option<&str> {
        let names = self.deferred.get(&pair.server)?;
        let natural = format!("{}__{}", pair.server, pair.tool);
        if let Some((name, Exposed::Deferred { target })) = names.get_key_value(&natural)
            && target == pair
        {
            return Some(name.as_str());
        }
        names
            .iter()
            .find(|(_, exposed)| matches!(exposed, Exposed::Deferred { target } if target == pair))
            .map(|(name, _)| name.as_str())
    }

    /// Builds, ahead of the first search, the keyword index of every server a search may
    /// read: each deferred server's without eager tools for [`Surface::search_deferred`],
    /// and, when the Surface has a search pair, every server with permitted tools (a weak
    /// answer of the pair's search tool searches them all for the servers that come
    /// closest). Each is built once per catalogue version and shared by the Surfaces a
    /// [`SurfaceCache`](crate::SurfaceCache) composes from the same server part, so this
    /// costs nothing for the servers indexed before.
    ///
    /// Blocks: CPU work that grows with the tools not indexed yet (milliseconds per
    /// thousand tools). Call it where resolution is called, off an async worker, so that
    /// no search indexes inline.
    pub fn prepare_search(&self) {
        let pair = self
            .servers()
            .iter()
            .any(|view| view.shape == Shape::SearchPair);
        for view in self.servers() {
            let searched = pair || (view.shape == Shape::Deferred && view.eager.is_empty());
            if searched
                && view.permitted > 0
                && let Some(part) = self.parts.get(&view.server)
            {
                part.0.search_part(&view.server);
            }
        }
    }

    /// Whether `server`'s keyword index is built.
    #[cfg(test)]
    pub(crate) fn search_built(&self, server: &ServerId) -> bool {
        self.parts
            .get(server)
            .is_some_and(|part| part.0.search_built())
    }
}

/// A deferred name's target (every entry of a Surface's deferred names is one).
fn deferred_target<'a>(name: &'a str, exposed: &'a Exposed) -> Option<(&'a str, &'a ToolRef)> {
    match exposed {
        Exposed::Deferred { target } => Some((name, target)),
        _ => None,
    }
}
