//! The crate's umbrella error.

use crate::{AssembleError, RenderError, TimeError};

/// Any error of this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The history could not be assembled (see [`AssembleError`]).
    #[error(transparent)]
    Assemble(#[from] AssembleError),
    /// The prompt could not be rendered (see [`RenderError`]).
    #[error(transparent)]
    Render(#[from] RenderError),
    /// A time could not be represented (see [`TimeError`]).
    #[error(transparent)]
    Time(#[from] TimeError),
}
