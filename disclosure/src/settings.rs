//! The knobs of resolution, with their measured defaults, validated in
//! [`SettingsBuilder::build`].

use crate::SettingsError;

/// The largest page size a listing may use: a page of this many one-line summaries stays
/// far under the ceiling a tool result should have.
pub const MAX_PAGE_SIZE: usize = 200;

/// The number of meta tools present whenever a server is deferred.
pub(crate) const META_TOOL_COUNT: usize = 3;

/// A token budget, as an absolute number or as a share of the model's context window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Budget {
    /// This many estimated tokens.
    Tokens(u64),
    /// `percent` percent of a window of `window_tokens` tokens.
    WindowShare {
        /// The model's context window, in tokens.
        window_tokens: u64,
        /// The share, 1 to 100.
        percent: u8,
    },
}

impl Budget {
    /// The budget in estimated tokens.
    pub fn tokens(&self) -> u64 {
        match *self {
            Budget::Tokens(tokens) => tokens,
            Budget::WindowShare {
                window_tokens,
                percent,
            } => window_tokens.saturating_mul(u64::from(percent)) / 100,
        }
    }
}

/// What a server's cost as direct tools counts, for the auto budget and the direct tier.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CostBasis {
    /// Each tool's name, description and input schema: what prompt assembly renders for a
    /// provider (an MCP definition's other fields never reach the model). The default.
    #[default]
    ModelFields,
    /// Each tool's whole MCP definition as a `tools/list` result carries it (title, output
    /// schema, annotations, icons, `_meta` as well): what the client of an MCP gateway
    /// receives for a direct tool, on every request whether or not its model sees it all.
    Definition,
}

/// How a turn's Surface is shaped. Build with [`Settings::builder`]; [`Settings::default`]
/// is the documented defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub(crate) auto_budget: Budget,
    pub(crate) direct_max_tools: usize,
    pub(crate) direct_max_tokens: u64,
    pub(crate) facade_max_index_tokens: u64,
    pub(crate) tool_cap: usize,
    pub(crate) reserved_tools: usize,
    pub(crate) page_size: usize,
    pub(crate) orientation_tool: bool,
    pub(crate) cost_basis: CostBasis,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            auto_budget: Budget::WindowShare {
                window_tokens: 200_000,
                percent: 5,
            },
            direct_max_tools: 32,
            direct_max_tokens: 10_000,
            facade_max_index_tokens: 1_000,
            tool_cap: 128,
            reserved_tools: 0,
            page_size: 50,
            orientation_tool: true,
            cost_basis: CostBasis::ModelFields,
        }
    }
}

impl Settings {
    /// A builder starting from the defaults.
    pub fn builder() -> SettingsBuilder {
        SettingsBuilder {
            settings: Settings::default(),
        }
    }

    /// The budget the [`Auto`](psych_types::Preload::Auto) servers' direct, facade and
    /// search tools share: smallest first, each is kept (at its size tier) while the kept
    /// ones' costs as direct tools sum to at most this; the rest are deferred. Pinned
    /// servers take no share of it.
    pub fn auto_budget(&self) -> Budget {
        self.auto_budget
    }

    /// The most tools a server may expose one by one.
    pub fn direct_max_tools(&self) -> usize {
        self.direct_max_tools
    }

    /// The most estimated tokens a server's direct tools may cost.
    pub fn direct_max_tokens(&self) -> u64 {
        self.direct_max_tokens
    }

    /// The most estimated tokens a facade's index line may cost.
    pub fn facade_max_index_tokens(&self) -> u64 {
        self.facade_max_index_tokens
    }

    /// The most tools a request may carry: the Surface's and the
    /// [`reserved_tools`](Self::reserved_tools) together.
    pub fn tool_cap(&self) -> usize {
        self.tool_cap
    }

    /// The slots of the [`tool_cap`](Self::tool_cap) kept for tools the caller adds to the
    /// Surface's after resolution (`read_tool_output`, a search tool of its own).
    pub fn reserved_tools(&self) -> usize {
        self.reserved_tools
    }

    /// The most tools a Surface exposes: the [`tool_cap`](Self::tool_cap) less the
    /// [`reserved_tools`](Self::reserved_tools).
    pub fn surface_cap(&self) -> usize {
        self.tool_cap.saturating_sub(self.reserved_tools)
    }

    /// A builder starting from these settings, to change some knobs of settings built
    /// elsewhere (checked again by [`build`](SettingsBuilder::build)).
    pub fn to_builder(&self) -> SettingsBuilder {
        SettingsBuilder {
            settings: self.clone(),
        }
    }

    /// Tools per page of a listing.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Whether the Surface carries the orientation tool.
    pub fn orientation_tool(&self) -> bool {
        self.orientation_tool
    }

    /// What a server's cost as direct tools counts.
    pub fn cost_basis(&self) -> CostBasis {
        self.cost_basis
    }

    /// How many fixed tools a Surface may carry with these settings.
    pub(crate) fn fixed_tools(&self) -> usize {
        META_TOOL_COUNT + usize::from(self.orientation_tool)
    }
}

/// Builds [`Settings`]; every knob starts at its default.
#[derive(Debug, Clone)]
pub struct SettingsBuilder {
    settings: Settings,
}

impl SettingsBuilder {
    /// The budget the [`Auto`](psych_types::Preload::Auto) servers' direct, facade and
    /// search tools share, over the whole Surface. The Auto servers are taken in ascending
    /// order of their permitted tools' cost as direct tools (ties by server id); each is
    /// kept at its size tier while the kept ones' costs sum to at most the budget, and the
    /// rest are deferred ([`Why::OverBudget`](crate::Why::OverBudget)). Servers whose
    /// preload is pinned ([`Eager`](psych_types::Preload::Eager),
    /// [`Deferred`](psych_types::Preload::Deferred)) neither count against it nor are
    /// deferred by it. `Budget::Tokens(0)` defers every Auto server. Default: 5% of a
    /// 200,000-token window (10,000 tokens).
    #[must_use]
    pub fn auto_budget(mut self, budget: Budget) -> Self {
        self.settings.auto_budget = budget;
        self
    }

    /// A server that is not deferred exposes one tool per remote tool when it has at most
    /// this many permitted tools (and they cost at most
    /// [`direct_max_tokens`](Self::direct_max_tokens)). Default: 32.
    #[must_use]
    pub fn direct_max_tools(mut self, tools: usize) -> Self {
        self.settings.direct_max_tools = tools;
        self
    }

    /// The most estimated tokens a server's direct tools may cost. Default: 10,000.
    #[must_use]
    pub fn direct_max_tokens(mut self, tokens: u64) -> Self {
        self.settings.direct_max_tokens = tokens;
        self
    }

    /// A server too large for direct tools gets a facade when the facade's index line (every
    /// permitted name) costs at most this many estimated tokens, else a search pair.
    /// Default: 1,000.
    #[must_use]
    pub fn facade_max_index_tokens(mut self, tokens: u64) -> Self {
        self.settings.facade_max_index_tokens = tokens;
        self
    }

    /// The most tools a request may carry (OpenAI accepts 128): the Surface keeps to it
    /// less the [`reserved_tools`](Self::reserved_tools). Default: 128.
    #[must_use]
    pub fn tool_cap(mut self, cap: usize) -> Self {
        self.settings.tool_cap = cap;
        self
    }

    /// Keeps `tools` slots of the [`tool_cap`](Self::tool_cap) for tools the caller sends
    /// beside the Surface's, added after resolution (`read_tool_output`, a search tool of
    /// its own): the Surface then exposes at most `tool_cap - tools`, so the request stays
    /// within the cap. Default: 0. (psych-runtime's Run reserves the tools it adds itself.)
    #[must_use]
    pub fn reserved_tools(mut self, tools: usize) -> Self {
        self.settings.reserved_tools = tools;
        self
    }

    /// Tools per page of a deferred server's listing. Default: 50.
    #[must_use]
    pub fn page_size(mut self, size: usize) -> Self {
        self.settings.page_size = size;
        self
    }

    /// Whether the Surface carries the orientation tool. Default: on.
    #[must_use]
    pub fn orientation_tool(mut self, on: bool) -> Self {
        self.settings.orientation_tool = on;
        self
    }

    /// What a server's cost as direct tools counts, against the auto budget and the direct
    /// tier's [`direct_max_tokens`](Self::direct_max_tokens). Default:
    /// [`CostBasis::ModelFields`], what a model is sent; an MCP gateway, whose client
    /// receives every field of a direct tool, counts [`CostBasis::Definition`].
    #[must_use]
    pub fn cost_basis(mut self, basis: CostBasis) -> Self {
        self.settings.cost_basis = basis;
        self
    }

    /// Checks the knobs together and returns the settings.
    ///
    /// # Errors
    ///
    /// [`SettingsError`] when the cap cannot hold the fixed tools (and the reserved ones),
    /// the page size is out of range, or a window share is not a share.
    pub fn build(self) -> Result<Settings, SettingsError> {
        let settings = self.settings;
        if settings.tool_cap < settings.fixed_tools() {
            return Err(SettingsError::CapBelowFixedTools {
                cap: settings.tool_cap,
                fixed: settings.fixed_tools(),
            });
        }
        if settings.surface_cap() < settings.fixed_tools() {
            return Err(SettingsError::ReservedOverCap {
                cap: settings.tool_cap,
                reserved: settings.reserved_tools,
                fixed: settings.fixed_tools(),
            });
        }
        if settings.page_size == 0 || settings.page_size > MAX_PAGE_SIZE {
            return Err(SettingsError::PageSize(settings.page_size));
        }
        if let Budget::WindowShare {
            window_tokens,
            percent,
        } = settings.auto_budget
            && (window_tokens == 0 || percent == 0 || percent > 100)
        {
            return Err(SettingsError::WindowShare {
                window_tokens,
                percent,
            });
        }
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_build() {
        assert_eq!(Settings::builder().build().unwrap(), Settings::default());
        assert_eq!(Settings::default().auto_budget().tokens(), 10_000);
        assert_eq!(Settings::default().cost_basis(), CostBasis::ModelFields);
    }

    #[test]
    fn build_refuses_what_cannot_work() {
        assert_eq!(
            Settings::builder().tool_cap(3).build(),
            Err(SettingsError::CapBelowFixedTools { cap: 3, fixed: 4 })
        );
        assert!(
            Settings::builder()
                .tool_cap(3)
                .orientation_tool(false)
                .build()
                .is_ok()
        );
        assert_eq!(
            Settings::builder().page_size(0).build(),
            Err(SettingsError::PageSize(0))
        );
        assert!(
            Settings::builder()
                .page_size(MAX_PAGE_SIZE + 1)
                .build()
                .is_err()
        );
        let share = Budget::WindowShare {
            window_tokens: 1_000,
            percent: 101,
        };
        assert!(Settings::builder().auto_budget(share).build().is_err());
        assert_eq!(Budget::Tokens(7).tokens(), 7);
    }

    #[test]
    fn reserved_tools_come_out_of_the_surface_cap() {
        let settings = Settings::builder().reserved_tools(1).build().unwrap();
        assert_eq!((settings.tool_cap(), settings.surface_cap()), (128, 127));
        assert_eq!(Settings::default().surface_cap(), 128);
        assert_eq!(
            Settings::builder().tool_cap(5).reserved_tools(2).build(),
            Err(SettingsError::ReservedOverCap {
                cap: 5,
                reserved: 2,
                fixed: 4
            })
        );
        let again = settings.to_builder().reserved_tools(3).build().unwrap();
        assert_eq!((again.tool_cap(), again.surface_cap()), (128, 125));
    }
}
