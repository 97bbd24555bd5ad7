//! What the renderers share, one job a module: the public request types
//! ([`RenderedRequest`], [`RenderError`], [`Provider`], [`Part`], [`Span`]), the writer a
//! request is written with, the substitution rules for what a log may hold but a provider
//! refuses, and the model's view of one tool result.

mod request;
mod substitute;
mod view;
mod writer;

pub use request::{Part, Provider, RenderError, RenderedRequest, Span};
pub(crate) use substitute::{
    CallIds, call_name, fnv1a, is_blank, provider_name_ok, trim_end, write_arguments,
};
pub use substitute::{EMPTY_USER_MESSAGE, MISSING_RESULT, OPENAI_MAX_CALL_ID, RAW_ARGUMENTS_KEY};
pub(crate) use view::{Piece, pieces};
pub(crate) use writer::{Out, check_extra, write_extra};
