//! What a tool call returned: text, JSON or binary content, and whether it failed.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The result of one tool call, whole.
///
/// The record log stores it exactly; what the model sees of it (a preview, a truncated
/// failure) is a projection made at prompt assembly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The content.
    pub body: OutputBody,
    /// Whether the tool reported a failure (MCP `isError`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_error: bool,
}

impl ToolOutput {
    /// A successful text result.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            body: OutputBody::Text { text: text.into() },
            is_error: false,
        }
    }

    /// A successful JSON result.
    pub fn json(value: Value) -> Self {
        Self {
            body: OutputBody::Json { value },
            is_error: false,
        }
    }

    /// A successful binary result.
    pub fn binary(mime_type: impl Into<String>, data: Vec<u8>) -> Self {
        Self {
            body: OutputBody::Binary {
                mime_type: mime_type.into(),
                data,
            },
            is_error: false,
        }
    }

    /// A failed call with its error text.
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            body: OutputBody::Text { text: text.into() },
            is_error: true,
        }
    }

    /// The content as the model reads it, or `None` for binary content.
    ///
    /// See [`OutputBody::text_view`].
    pub fn text_view(&self) -> Option<Cow<'_, str>> {
        self.body.text_view()
    }
}

/// The content of a tool output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OutputBody {
    /// UTF-8 text.
    Text {
        /// The text.
        text: String,
    },
    /// A JSON value (MCP `structuredContent`).
    Json {
        /// The value.
        value: Value,
    },
    /// Bytes that are not text, with their MIME type.
    Binary {
        /// The MIME type, such as `image/png`.
        mime_type: String,
        /// The bytes. Serialized as standard padded base64.
        #[serde(with = "crate::base64")]
        data: Vec<u8>,
    },
}

impl OutputBody {
    /// The content as the model reads it: text as is, JSON pretty-printed (two-space
    /// indent, keys in sorted order, so the same value always gives the same bytes and
    /// the reader can page it by lines), and `None` for binary content.
    pub fn text_view(&self) -> Option<Cow<'_, str>> {
        match self {
            OutputBody::Text { text } => Some(Cow::Borrowed(text)),
            OutputBody::Json { value } => Some(Cow::Owned(render_json(value))),
            OutputBody::Binary { .. } => None,
        }
    }

    /// The kind of content, without the content.
    pub fn kind(&self) -> OutputKind {
        match self {
            OutputBody::Text { .. } => OutputKind::Text,
            OutputBody::Json { .. } => OutputKind::Json,
            OutputBody::Binary { mime_type, .. } => OutputKind::Binary {
                mime_type: mime_type.clone(),
            },
        }
    }
}

/// Renders a JSON value the way [`OutputBody::text_view`] does.
pub fn render_json(value: &Value) -> String {
    // Serializing a `Value` to a `String` cannot fail: its map keys are strings and a
    // `Value` holds no non-finite floats. Fall back to compact form rather than panic.
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// What kind of content an output holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OutputKind {
    /// UTF-8 text.
    Text,
    /// JSON, read as its pretty-printed text.
    Json,
    /// Binary content.
    Binary {
        /// The MIME type.
        mime_type: String,
    },
}

impl OutputKind {
    /// Whether the content reads as text ([`OutputKind::Text`] or [`OutputKind::Json`]).
    pub fn is_text(&self) -> bool {
        !matches!(self, OutputKind::Binary { .. })
    }
}
