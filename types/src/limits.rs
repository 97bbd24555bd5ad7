//! Output limits set per server and per tool: when a tool's successful result is elided,
//! and how much of it its preview shows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{ServerCatalog, ServerId, ToolRef};

/// The characters a declared hint ([`MAX_RESULT_SIZE_CHARS`]) counts as one token.
pub const HINT_CHARS_PER_TOKEN: u64 = 4;

/// The key of a tool's `_meta` by which a server declares how many characters of its
/// results a client should show before it cuts or persists them (Claude Code's).
pub const MAX_RESULT_SIZE_CHARS: &str = "anthropic/maxResultSizeChars";

/// What is set for one tool's (or one server's) results; each part unset falls back to the
/// next level: a tool's to its server's, a server's to the elider's defaults (for the
/// per-result threshold, raised by the server's declared hint: [`OutputLimits::per_result`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutputLimit {
    /// A successful result of this many estimated tokens or more is elided (shown as a
    /// preview with its handle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_result_tokens: Option<u64>,
    /// Characters an elided result's preview shows from its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_chars: Option<usize>,
    /// Characters an elided result's preview shows from its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_chars: Option<usize>,
}

impl OutputLimit {
    /// Each part of `self`, or `fallback`'s where `self` has none.
    #[must_use]
    pub fn or(self, fallback: OutputLimit) -> OutputLimit {
        OutputLimit {
            per_result_tokens: self.per_result_tokens.or(fallback.per_result_tokens),
            head_chars: self.head_chars.or(fallback.head_chars),
            tail_chars: self.tail_chars.or(fallback.tail_chars),
        }
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == OutputLimit::default()
    }
}

/// Why a set of [`OutputLimits`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// A per-result threshold is 0 (every result would be elided) or over the per-batch
    /// threshold (a result the batch cannot hold would not be elided on its own).
    #[error(
        "the output limit of {scope}: perResultTokens {per_result} must be from 1 to the per-batch threshold, {per_batch} tokens"
    )]
    PerResult {
        /// `server` or `server/tool`.
        scope: String,
        /// The threshold set.
        per_result: u64,
        /// The per-batch threshold it must not pass.
        per_batch: u64,
    },
}

/// Output limits by server and by tool, with the hints servers declare: what an elider
/// applies per result ([`OutputLimits::for_tool`], [`OutputLimits::hint`]).
///
/// Precedence, for each part separately: the tool's own setting, then its server's, then
/// (for the per-result threshold only) the server's declared hint
/// ([`MAX_RESULT_SIZE_CHARS`] in the tool's `_meta`: [`with_hints`](Self::with_hints)),
/// which can only raise the default threshold (a server declaring how large its results
/// may be asks that they be shown whole up to there, never that smaller ones be cut), then
/// the elider's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputLimits {
    servers: BTreeMap<ServerId, OutputLimit>,
    tools: BTreeMap<ToolRef, OutputLimit>,
    hints: BTreeMap<ToolRef, u64>,
}

impl OutputLimits {
    /// No limit set: every result gets the defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `server`'s limits (for each of its tools without its own).
    #[must_use]
    pub fn server(mut self, server: ServerId, limit: OutputLimit) -> Self {
        self.servers.insert(server, limit);
        self
    }

    /// Sets one tool's limits.
    #[must_use]
    pub fn tool(mut self, tool: ToolRef, limit: OutputLimit) -> Self {
        self.tools.insert(tool, limit);
        self
    }

    /// Takes the hints `catalogs` declare: each tool whose `_meta` has a positive integer
    /// [`MAX_RESULT_SIZE_CHARS`] gets a hinted per-result threshold of `tokens(chars)`
    /// ([`hint`](Self::hint); [`per_result`](Self::per_result) decides what it counts for:
    /// never over the user's setting). Replaces the hints taken before for the servers of
    /// `catalogs`.
    #[must_use]
    pub fn with_hints(mut self, catalogs: &[ServerCatalog], tokens: impl Fn(u64) -> u64) -> Self {
        for catalog in catalogs {
            self.hints.retain(|tool, _| tool.server != catalog.server);
            for tool in catalog.tools.iter() {
                if let Some(chars) = Self::declared_chars(tool) {
                    let at = ToolRef::new(catalog.server.clone(), tool.name.clone());
                    self.hints.insert(at, tokens(chars).max(1));
                }
            }
        }
        self
    }

    /// The characters `tool` declares its results may be ([`MAX_RESULT_SIZE_CHARS`] in its
    /// `_meta`, a positive integer), if it does.
    pub fn declared_chars(tool: &crate::ToolDefinition) -> Option<u64> {
        tool.meta
            .as_ref()
            .and_then(|meta| meta.get(MAX_RESULT_SIZE_CHARS))
            .and_then(serde_json::Value::as_u64)
            .filter(|&chars| chars > 0)
    }

    /// [`declared_chars`](Self::declared_chars) at [`HINT_CHARS_PER_TOKEN`] characters a
    /// token: the hinted threshold the runtime and `psych serve` take.
    pub fn declared_tokens(tool: &crate::ToolDefinition) -> Option<u64> {
        Self::declared_chars(tool).map(|chars| chars.div_ceil(HINT_CHARS_PER_TOKEN))
    }

    /// [`with_hints`](Self::with_hints) at [`HINT_CHARS_PER_TOKEN`] characters a token: what
    /// the runtime and `psych serve` take.
    #[must_use]
    pub fn with_declared_hints(self, catalogs: &[ServerCatalog]) -> Self {
        self.with_hints(catalogs, |chars| chars.div_ceil(HINT_CHARS_PER_TOKEN))
    }

    /// Every hint taken, by tool.
    pub fn hints(&self) -> impl Iterator<Item = (&ToolRef, u64)> {
        self.hints.iter().map(|(tool, tokens)| (tool, *tokens))
    }

    /// Sets `tool`'s hinted per-result threshold (a hint kept from an earlier read of the
    /// catalogues).
    #[must_use]
    pub fn hinted(mut self, tool: ToolRef, tokens: u64) -> Self {
        self.hints.insert(tool, tokens.max(1));
        self
    }

    /// The limits the user set for `tool`'s results, each part from the tool's setting or
    /// else its server's (hints aside: [`hint`](Self::hint)).
    pub fn for_tool(&self, tool: &ToolRef) -> OutputLimit {
        let own = self.tools.get(tool).copied().unwrap_or_default();
        let server = self.servers.get(&tool.server).copied().unwrap_or_default();
        own.or(server)
    }

    /// The per-result threshold, in tokens, `tool`'s server declared for it
    /// ([`with_hints`](Self::with_hints)), if any.
    pub fn hint(&self, tool: &ToolRef) -> Option<u64> {
        self.hints.get(tool).copied()
    }

    /// The per-result threshold of `tool`'s results, given the default one and the
    /// per-batch threshold: the user's (tool's, else server's) if set; else the larger of
    /// the default and the server's hint; each at least 1 and at most `per_batch`.
    pub fn per_result(&self, tool: &ToolRef, default: u64, per_batch: u64) -> u64 {
        let chosen = match self.for_tool(tool).per_result_tokens {
            Some(tokens) => tokens,
            None => self.hint(tool).map_or(default, |hint| hint.max(default)),
        };
        chosen.clamp(1, per_batch.max(1))
    }

    /// Whether nothing is set and no hint taken.
    pub fn is_empty(&self) -> bool {
        self.servers.values().all(OutputLimit::is_empty)
            && self.tools.values().all(OutputLimit::is_empty)
            && self.hints.is_empty()
    }

    /// Checks every per-result threshold the user set against `per_batch` (checked at
    /// load, like every threshold). A hint is never refused: it is clamped where it is
    /// applied.
    ///
    /// # Errors
    ///
    /// [`LimitError::PerResult`] for the first (in server, then tool order) that is 0 or
    /// over `per_batch`, naming it.
    pub fn check(&self, per_batch: u64) -> Result<(), LimitError> {
        let scoped = self
            .servers
            .iter()
            .map(|(server, limit)| (server.to_string(), limit))
            .chain(
                self.tools
                    .iter()
                    .map(|(tool, limit)| (format!("{}/{}", tool.server, tool.tool), limit)),
            );
        for (scope, limit) in scoped {
            if let Some(per_result) = limit.per_result_tokens
                && (per_result == 0 || per_result > per_batch)
            {
                return Err(LimitError::PerResult {
                    scope,
                    per_result,
                    per_batch,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CatalogVersion, ServerHealth, ToolDefinition, ToolName};

    fn tool(server: &str, name: &str) -> ToolRef {
        ToolRef::new(ServerId::new(server).unwrap(), ToolName::new(name).unwrap())
    }

    fn tokens(n: u64) -> OutputLimit {
        OutputLimit {
            per_result_tokens: Some(n),
            ..OutputLimit::default()
        }
    }

    #[test]
    fn a_tool_beats_its_server_which_beats_a_hint() {
        let hinted = |name: &str, chars: u64| {
            let mut definition =
                ToolDefinition::new(ToolName::new(name).unwrap(), "", serde_json::Map::new());
            definition.meta = serde_json::json!({ MAX_RESULT_SIZE_CHARS: chars })
                .as_object()
                .cloned();
            definition
        };
        let catalog = |server: &str| ServerCatalog {
            server: ServerId::new(server).unwrap(),
            version: CatalogVersion(1),
            tools: vec![hinted("a", 400), hinted("b", 800)].into(),
            health: ServerHealth::default(),
        };
        let limits = OutputLimits::new()
            .server(
                ServerId::new("s").unwrap(),
                OutputLimit {
                    head_chars: Some(10),
                    ..OutputLimit::default()
                },
            )
            .tool(tool("s", "a"), tokens(7))
            .server(ServerId::new("t").unwrap(), tokens(9))
            .with_hints(&[catalog("s"), catalog("t")], |chars| chars / 4);
        assert_eq!(
            limits.for_tool(&tool("s", "a")),
            OutputLimit {
                per_result_tokens: Some(7),
                head_chars: Some(10),
                tail_chars: None
            }
        );
        assert_eq!(limits.per_result(&tool("s", "a"), 100, 1_000), 7);
        // The hint where the user set no threshold, when it raises the default; the
        // user's where they set one; clamped to the batch's.
        assert_eq!(limits.hint(&tool("s", "b")), Some(200));
        assert_eq!(limits.per_result(&tool("s", "b"), 100, 1_000), 200);
        assert_eq!(limits.per_result(&tool("s", "b"), 300, 1_000), 300);
        assert_eq!(limits.per_result(&tool("s", "b"), 100, 150), 150);
        assert_eq!(limits.per_result(&tool("t", "b"), 100, 1_000), 9);
        assert_eq!(limits.for_tool(&tool("u", "b")), OutputLimit::default());
        assert_eq!(limits.per_result(&tool("u", "b"), 100, 1_000), 100);
        assert!(!limits.is_empty() && OutputLimits::new().is_empty());
    }

    #[test]
    fn a_threshold_of_zero_or_over_the_batch_is_refused_by_name() {
        let limits = OutputLimits::new().tool(tool("s", "a"), tokens(5_000));
        assert_eq!(limits.check(5_000), Ok(()));
        let error = limits.check(4_999).unwrap_err();
        assert!(error.to_string().contains("s/a"), "{error}");
        let zero = OutputLimits::new().server(ServerId::new("s").unwrap(), tokens(0));
        assert!(zero.check(10).unwrap_err().to_string().contains("of s:"));
    }
}
