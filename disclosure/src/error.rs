//! The crate's errors: refused settings and refused resolution inputs.
//!
//! A model's bad call is not an error here: the guard answers it with a
//! [`Refusal`](crate::Refusal) that becomes a failed tool result, because a model getting a
//! name or an argument wrong is ordinary.

use psych_types::{ServerId, ToolName};

/// Why [`SettingsBuilder::build`](crate::SettingsBuilder::build) refused the settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// The tool cap leaves no room for the fixed tools (the three meta tools, and the
    /// orientation tool when it is on), so no Surface could respect it.
    #[error("tool cap {cap} is below the {fixed} fixed tools the Surface may need")]
    CapBelowFixedTools {
        /// The cap that was asked for.
        cap: usize,
        /// How many fixed tools a Surface may carry with these settings.
        fixed: usize,
    },
    /// The tool cap less the reserved tools leaves no room for the fixed tools, so no
    /// Surface could leave the reserved slots free.
    #[error(
        "tool cap {cap} less {reserved} reserved tools is below the {fixed} fixed tools the \
         Surface may need"
    )]
    ReservedOverCap {
        /// The cap that was asked for.
        cap: usize,
        /// The tools reserved for the caller.
        reserved: usize,
        /// How many fixed tools a Surface may carry with these settings.
        fixed: usize,
    },
    /// A listing page size of zero, or above [`MAX_PAGE_SIZE`](crate::MAX_PAGE_SIZE), was
    /// asked for.
    #[error("page size {0} is outside 1..={max}", max = crate::MAX_PAGE_SIZE)]
    PageSize(usize),
    /// A window share of zero percent or above 100 percent, or a window of zero tokens.
    #[error("a budget of {percent}% of a {window_tokens}-token window is not a share of a window")]
    WindowShare {
        /// The window the share was taken of.
        window_tokens: u64,
        /// The share that was asked for, in percent.
        percent: u8,
    },
}

/// Why [`resolve`](crate::resolve) refused its inputs. Each is a caller's mistake that would
/// make the Surface depend on input order, so it is refused instead of guessed at.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    /// Two connections name the same server.
    #[error("server {0} has two connections")]
    DuplicateConnection(ServerId),
    /// Two catalogues are given for the same server.
    #[error("server {0} has two catalogues")]
    DuplicateCatalog(ServerId),
    /// One catalogue lists the same tool name twice.
    #[error("the catalogue of server {server} lists tool {tool} twice")]
    DuplicateTool {
        /// The server whose catalogue is inconsistent.
        server: ServerId,
        /// The repeated name.
        tool: ToolName,
    },
}
