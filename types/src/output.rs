//! What a tool call returned, as MCP returns it (`CallToolResult`, protocol 2025-11-25): an
//! ordered list of content blocks, optional structured content, whether it failed, and
//! `_meta`; and the one readable text of a result that the log, the reader and elision
//! share.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::ops::Range;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::{JsonObject, SpilledBlock};

/// The result of one tool call, whole: MCP's `CallToolResult`.
///
/// Its serde form is MCP's (`content`, `structuredContent`, `isError`, `_meta`), so a
/// `tools/call` result deserializes into it directly. The record log stores it exactly; what
/// the model sees of it (a preview, a truncated failure) is a projection made at prompt
/// assembly. [`ToolOutput::readable_text`] is its one text form.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ToolOutput {
    /// The content blocks, in the order the server sent them.
    #[serde(default)]
    pub content: Vec<ContentBlock>,
    /// MCP `structuredContent`: a JSON value matching the tool's output schema, if any.
    #[serde(
        rename = "structuredContent",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub structured_content: Option<Value>,
    /// Whether the tool reported a failure (MCP `isError`).
    #[serde(
        rename = "isError",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub is_error: bool,
    /// MCP `_meta` of the result.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
    /// Text blocks whose text is too large to hold in memory and is kept in a file
    /// ([`SpilledBlock`]), in block order, each naming a distinct text block of `content`;
    /// empty for every result that fits in memory. Such a block's in-memory `text` is the
    /// spilled text's [placeholder](crate::SpilledText::placeholder), so
    /// [`readable_text`](Self::readable_text) and the serde form show the placeholder; the
    /// record log stores the file's text in its place, so the logged result, read back, is
    /// whole and has no spilled blocks. Not serialized.
    #[serde(skip)]
    pub spilled: Vec<SpilledBlock>,
}

impl ToolOutput {
    /// A successful result of one text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self::from_blocks(vec![ContentBlock::text(text)])
    }

    /// A successful result that is only structured content (no content block): the model
    /// reads its JSON text view.
    pub fn json(value: Value) -> Self {
        Self {
            structured_content: Some(value),
            ..Self::default()
        }
    }

    /// A failed call with its error text (one text block, `is_error` set).
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            is_error: true,
            ..Self::text(text)
        }
    }

    /// A successful result of these blocks.
    pub fn from_blocks(content: Vec<ContentBlock>) -> Self {
        Self {
            content,
            ..Self::default()
        }
    }

    /// The same result with structured content added.
    #[must_use]
    pub fn with_structured_content(mut self, value: Value) -> Self {
        self.structured_content = Some(value);
        self
    }

    /// Whether some of its text is in files rather than in memory (see
    /// [`spilled`](Self::spilled)).
    pub fn is_spilled(&self) -> bool {
        !self.spilled.is_empty()
    }

    /// Whether the tool reported a failure.
    pub fn is_error(&self) -> bool {
        self.is_error
    }

    /// Whether the model is shown the structured content (its JSON text view): only when
    /// there is no content block.
    pub fn shows_structured_content(&self) -> bool {
        self.content.is_empty() && self.structured_content.is_some()
    }

    /// The result's one readable text: what the reader pages and greps, what the token
    /// estimator measures, and what the record log stores as the readable bytes.
    ///
    /// - With no content block, the JSON text view of `structuredContent`
    ///   ([`render_json`]), or the empty text when there is none.
    /// - A result of exactly one text block is that text, as is.
    /// - Otherwise one segment per block, in order, joined by `"\n"`: a text block's text;
    ///   an embedded text resource as its [`placeholder`](ContentBlock::placeholder) line
    ///   (naming its URI) followed by `"\n"` and its text; every other block as its
    ///   one-line placeholder, naming its kind, MIME type, size and position, such as
    ///   `[content block #1: image, image/png, 5120 bytes]`.
    pub fn readable_text(&self) -> Cow<'_, str> {
        self.readable_text_spans().0
    }

    /// The [readable text](ToolOutput::readable_text) and, for each content block, the byte
    /// range its own text takes in it: a text block's text, an embedded text resource's text
    /// (after its placeholder line); `None` for every other block. A store can keep the
    /// readable text once and rebuild each block's text from its range.
    pub fn readable_text_spans(&self) -> (Cow<'_, str>, Vec<Option<Range<usize>>>) {
        match self.content.as_slice() {
            [] => match &self.structured_content {
                Some(value) => (Cow::Owned(render_json(value)), Vec::new()),
                None => (Cow::Borrowed(""), Vec::new()),
            },
            [ContentBlock::Text(text)] => {
                (Cow::Borrowed(&text.text), vec![Some(0..text.text.len())])
            }
            blocks => {
                let mut out = String::new();
                let mut spans = Vec::with_capacity(blocks.len());
                for (i, block) in blocks.iter().enumerate() {
                    if i > 0 {
                        out.push('\n');
                    }
                    spans.push(block.write_segment(i, &mut out));
                }
                (Cow::Owned(out), spans)
            }
        }
    }

    /// Each spilled block ([`spilled`](Self::spilled)) with its placeholder's span in the
    /// in-memory readable text (`spans`, as [`readable_text_spans`](Self::readable_text_spans)
    /// gives them), in block order: what a store writes the spilled texts in place of.
    ///
    /// # Errors
    ///
    /// The first spilled block that names no text block, or names blocks out of order or
    /// twice: a result no store can take.
    pub fn spill_places<'s>(
        &'s self,
        spans: &[Option<Range<usize>>],
    ) -> Result<Vec<(&'s SpilledBlock, Range<usize>)>, &'s SpilledBlock> {
        let mut places = Vec::with_capacity(self.spilled.len());
        let mut previous = None;
        for spilled in &self.spilled {
            let block = spilled.block;
            let is_text = matches!(self.content.get(block), Some(ContentBlock::Text(_)));
            if !is_text || previous.is_some_and(|previous| previous >= block) {
                return Err(spilled);
            }
            previous = Some(block);
            let span = spans.get(block).cloned().flatten().ok_or(spilled)?;
            places.push((spilled, span));
        }
        Ok(places)
    }

    /// The blocks whose data is binary (images, audio, blob resources), with their
    /// positions.
    pub fn binary_blocks(&self) -> impl Iterator<Item = (usize, BinaryRef<'_>)> + '_ {
        self.content
            .iter()
            .enumerate()
            .filter_map(|(i, block)| block.binary().map(|b| (i, b)))
    }
}

/// Renders a JSON value as the text view of structured content: pretty (two-space indent),
/// keys in sorted byte order, the same bytes in every build (see [`crate::json`]).
pub fn render_json(value: &Value) -> String {
    crate::json::to_pretty(value)
}

/// The binary data of one content block, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BinaryRef<'a> {
    /// The block's kind, as its MCP `type` (`image`, `audio`, `resource`).
    pub kind: &'static str,
    /// The declared MIME type (`application/octet-stream` for a blob resource without one).
    pub mime_type: &'a str,
    /// The bytes.
    pub data: &'a [u8],
}

/// MCP annotations of a content block or resource: hints for the client.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Annotations {
    /// Who the content is for (`"user"`, `"assistant"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<Vec<String>>,
    /// Importance from 0 (least) to 1 (most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<f64>,
    /// When the content was last modified (ISO 8601).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_modified: Option<String>,
    /// Fields the specification does not name.
    #[serde(flatten)]
    pub extra: JsonObject,
}

/// A text block (MCP `TextContent`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct TextContent {
    /// The text.
    pub text: String,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
    /// Fields the specification does not name.
    #[serde(flatten)]
    pub extra: JsonObject,
}

/// An image or audio block (MCP `ImageContent` / `AudioContent`): bytes with a MIME type.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MediaContent {
    /// The bytes. Serialized as standard padded base64 (MCP `data`).
    #[serde(with = "crate::base64")]
    pub data: Vec<u8>,
    /// The declared MIME type, such as `image/png`. Declared by the server, not checked.
    pub mime_type: String,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
    /// Fields the specification does not name.
    #[serde(flatten)]
    pub extra: JsonObject,
}

/// A link to a resource the client may read (MCP `ResourceLink`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceLink {
    /// The resource's URI.
    pub uri: String,
    /// Its programmatic name.
    pub name: String,
    /// A display title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Its size in bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Icons a client may display.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icons: Option<Vec<crate::Icon>>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
    /// Fields the specification does not name.
    #[serde(flatten)]
    pub extra: JsonObject,
}

/// A resource embedded in the result (MCP `EmbeddedResource`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddedResource {
    /// The resource's contents: text or a blob.
    pub resource: ResourceContents,
    /// Annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Annotations>,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
    /// Fields the specification does not name.
    #[serde(flatten)]
    pub extra: JsonObject,
}

/// The contents of an embedded resource (MCP `TextResourceContents` or
/// `BlobResourceContents`, told apart by `text` or `blob`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ResourceContents {
    /// Text contents.
    Text(TextResource),
    /// Binary contents.
    Blob(BlobResource),
}

/// MCP `TextResourceContents`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TextResource {
    /// The resource's URI.
    pub uri: String,
    /// Its MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// The text.
    pub text: String,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
    /// Fields the specification does not name.
    #[serde(flatten)]
    pub extra: JsonObject,
}

/// MCP `BlobResourceContents`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlobResource {
    /// The resource's URI.
    pub uri: String,
    /// Its MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// The bytes. Serialized as standard padded base64 (MCP `blob`).
    #[serde(with = "crate::base64")]
    pub blob: Vec<u8>,
    /// MCP `_meta`.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<JsonObject>,
    /// Fields the specification does not name.
    #[serde(flatten)]
    pub extra: JsonObject,
}

/// One content block of a tool result, faithful to its MCP type.
///
/// Serialized as MCP writes it, with its `type` member. A block whose `type` is not one of
/// the five below, or that does not parse as its type (say an image whose `data` is not
/// base64), is kept whole as [`ContentBlock::Unknown`]: a block is never dropped and never
/// fails a result.
#[derive(Debug, Clone, PartialEq)]
pub enum ContentBlock {
    /// `type: "text"`.
    Text(TextContent),
    /// `type: "image"`.
    Image(MediaContent),
    /// `type: "audio"`.
    Audio(MediaContent),
    /// `type: "resource_link"`.
    ResourceLink(ResourceLink),
    /// `type: "resource"`.
    Resource(EmbeddedResource),
    /// Any other block, kept as the JSON object it came as (`type` included).
    Unknown(JsonObject),
}

/// The longest URI, name or type a placeholder line shows, in characters.
const PLACEHOLDER_FIELD: usize = 120;

/// `text` on one line (control characters as spaces), cut to [`PLACEHOLDER_FIELD`]
/// characters with `…`.
fn one_line(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == PLACEHOLDER_FIELD {
            out.push('…');
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}

impl ContentBlock {
    /// A plain text block.
    pub fn text(text: impl Into<String>) -> Self {
        ContentBlock::Text(TextContent {
            text: text.into(),
            ..TextContent::default()
        })
    }

    /// An image block of these bytes with this declared MIME type.
    pub fn image(mime_type: impl Into<String>, data: Vec<u8>) -> Self {
        ContentBlock::Image(MediaContent {
            data,
            mime_type: mime_type.into(),
            ..MediaContent::default()
        })
    }

    /// An audio block of these bytes with this declared MIME type.
    pub fn audio(mime_type: impl Into<String>, data: Vec<u8>) -> Self {
        ContentBlock::Audio(MediaContent {
            data,
            mime_type: mime_type.into(),
            ..MediaContent::default()
        })
    }

    /// The block's MCP `type`.
    pub fn kind(&self) -> &str {
        match self {
            ContentBlock::Text(_) => "text",
            ContentBlock::Image(_) => "image",
            ContentBlock::Audio(_) => "audio",
            ContentBlock::ResourceLink(_) => "resource_link",
            ContentBlock::Resource(_) => "resource",
            ContentBlock::Unknown(map) => map.get("type").and_then(Value::as_str).unwrap_or(""),
        }
    }

    /// The block's binary data, if it is an image, audio or a blob resource.
    pub fn binary(&self) -> Option<BinaryRef<'_>> {
        match self {
            ContentBlock::Image(media) => Some(BinaryRef {
                kind: "image",
                mime_type: &media.mime_type,
                data: &media.data,
            }),
            ContentBlock::Audio(media) => Some(BinaryRef {
                kind: "audio",
                mime_type: &media.mime_type,
                data: &media.data,
            }),
            ContentBlock::Resource(EmbeddedResource {
                resource: ResourceContents::Blob(blob),
                ..
            }) => Some(BinaryRef {
                kind: "resource",
                mime_type: blob
                    .mime_type
                    .as_deref()
                    .unwrap_or("application/octet-stream"),
                data: &blob.blob,
            }),
            _ => None,
        }
    }

    /// The one-line placeholder that stands for this block, at `position` in its result, in
    /// the readable text (`None` for a text block, which is its own text). For an embedded
    /// text resource it is the line before the resource's text.
    ///
    /// Forms (URIs, names and types on one line, cut to 120 characters):
    /// - `[content block #2: image, image/png, 5120 bytes]` (also `audio`)
    /// - `[content block #2: resource file:///a.bin, application/pdf, 5120 bytes]`
    /// - `[content block #2: resource file:///a.txt, text/plain, 31 bytes of text follow]`
    /// - `[content block #2: resource link file:///a.txt, name "a.txt", text/plain, 31 bytes]`
    ///   (MIME type and size when the link gives them)
    /// - `[content block #2: unknown block type "video", 512 bytes of JSON]`
    pub fn placeholder(&self, position: usize) -> Option<String> {
        self.placeholder_sized(position, None)
    }

    /// [`ContentBlock::placeholder`] with the bulk's length given (the data's, the blob's
    /// or the text resource's text's, in bytes) in place of the block's own, for a block
    /// kept without its bulk (a store's skeleton); `None` measures the block's own.
    pub fn placeholder_sized(&self, position: usize, bulk_len: Option<u64>) -> Option<String> {
        let bulk = |own: usize| bulk_len.unwrap_or(own as u64);
        let mut out = format!("[content block #{position}: ");
        match self {
            ContentBlock::Text(_) => return None,
            ContentBlock::Image(media) | ContentBlock::Audio(media) => {
                let _ = write!(
                    out,
                    "{}, {}, {} bytes",
                    self.kind(),
                    one_line(&media.mime_type),
                    bulk(media.data.len())
                );
            }
            ContentBlock::Resource(embedded) => match &embedded.resource {
                ResourceContents::Text(text) => {
                    let _ = write!(out, "resource {}", one_line(&text.uri));
                    if let Some(mime) = &text.mime_type {
                        let _ = write!(out, ", {}", one_line(mime));
                    }
                    let _ = write!(out, ", {} bytes of text follow", bulk(text.text.len()));
                }
                ResourceContents::Blob(blob) => {
                    let _ = write!(out, "resource {}", one_line(&blob.uri));
                    if let Some(mime) = &blob.mime_type {
                        let _ = write!(out, ", {}", one_line(mime));
                    }
                    let _ = write!(out, ", {} bytes", bulk(blob.blob.len()));
                }
            },
            ContentBlock::ResourceLink(link) => {
                let _ = write!(
                    out,
                    "resource link {}, name \"{}\"",
                    one_line(&link.uri),
                    one_line(&link.name)
                );
                if let Some(mime) = &link.mime_type {
                    let _ = write!(out, ", {}", one_line(mime));
                }
                if let Some(size) = link.size {
                    let _ = write!(out, ", {size} bytes");
                }
            }
            ContentBlock::Unknown(map) => {
                let len = crate::json::to_compact(&Value::Object(map.clone())).len();
                let _ = write!(
                    out,
                    "unknown block type \"{}\", {len} bytes of JSON",
                    one_line(self.kind())
                );
            }
        }
        out.push(']');
        Some(out)
    }

    /// This block's segment of the [readable text](ToolOutput::readable_text) of a result
    /// with more than one block, at `position`: a text block's text, an embedded text
    /// resource's placeholder line, `"\n"` and its text, any other block's placeholder line.
    pub fn readable_segment(&self, position: usize) -> Cow<'_, str> {
        match self {
            ContentBlock::Text(text) => Cow::Borrowed(&text.text),
            other => {
                let mut out = String::new();
                other.write_segment(position, &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// Appends this block's segment of the readable text; returns where the block's own
    /// text went, if it has any.
    fn write_segment(&self, position: usize, out: &mut String) -> Option<Range<usize>> {
        let own = |out: &mut String, text: &str| {
            let start = out.len();
            out.push_str(text);
            Some(start..out.len())
        };
        match self {
            ContentBlock::Text(text) => own(out, &text.text),
            other => {
                if let Some(line) = other.placeholder(position) {
                    out.push_str(&line);
                }
                if let ContentBlock::Resource(EmbeddedResource {
                    resource: ResourceContents::Text(text),
                    ..
                }) = other
                {
                    out.push('\n');
                    own(out, &text.text)
                } else {
                    None
                }
            }
        }
    }
}

/// A known block with its `type` member, for serialization.
#[derive(Serialize)]
struct Tagged<'a, T> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    inner: &'a T,
}

impl Serialize for ContentBlock {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ContentBlock::Text(inner) => Tagged {
                kind: "text",
                inner,
            }
            .serialize(serializer),
            ContentBlock::Image(inner) => Tagged {
                kind: "image",
                inner,
            }
            .serialize(serializer),
            ContentBlock::Audio(inner) => Tagged {
                kind: "audio",
                inner,
            }
            .serialize(serializer),
            ContentBlock::ResourceLink(inner) => Tagged {
                kind: "resource_link",
                inner,
            }
            .serialize(serializer),
            ContentBlock::Resource(inner) => Tagged {
                kind: "resource",
                inner,
            }
            .serialize(serializer),
            ContentBlock::Unknown(map) => map.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = JsonObject::deserialize(deserializer)?;
        Ok(ContentBlock::from_object(map))
    }
}

impl ContentBlock {
    /// The block a JSON object stands for: its known type when it parses as one, else
    /// [`ContentBlock::Unknown`] holding the object unchanged.
    pub fn from_object(mut map: JsonObject) -> Self {
        let kind = match map.get("type") {
            Some(Value::String(kind)) => kind.clone(),
            _ => return ContentBlock::Unknown(map),
        };
        let Some(tag) = map.remove("type") else {
            return ContentBlock::Unknown(map);
        };
        let value = Value::Object(map);
        let parsed = match kind.as_str() {
            "text" => TextContent::deserialize(&value)
                .ok()
                .map(ContentBlock::Text),
            "image" => MediaContent::deserialize(&value)
                .ok()
                .map(ContentBlock::Image),
            "audio" => MediaContent::deserialize(&value)
                .ok()
                .map(ContentBlock::Audio),
            "resource_link" => ResourceLink::deserialize(&value)
                .ok()
                .map(ContentBlock::ResourceLink),
            "resource" => EmbeddedResource::deserialize(&value)
                .ok()
                .map(ContentBlock::Resource),
            _ => None,
        };
        parsed.unwrap_or_else(|| match value {
            Value::Object(mut map) => {
                map.insert("type".into(), tag);
                ContentBlock::Unknown(map)
            }
            // Built as an object above; kept total rather than panic.
            other => ContentBlock::Unknown(JsonObject::from_iter([("type".into(), other)])),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn block(value: Value) -> ContentBlock {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn blocks_parse_as_their_mcp_types_and_serialize_back() {
        let cases = [
            json!({"type": "text", "text": "hi", "annotations": {"audience": ["user"], "priority": 0.5}, "_meta": {"k": 1}}),
            json!({"type": "image", "data": "iVBORw==", "mimeType": "image/png"}),
            json!({"type": "audio", "data": "AAEC", "mimeType": "audio/wav", "x-extra": true}),
            json!({"type": "resource_link", "uri": "file:///a.txt", "name": "a.txt", "mimeType": "text/plain", "size": 31}),
            json!({"type": "resource", "resource": {"uri": "file:///a.txt", "text": "abc", "mimeType": "text/plain"}}),
            json!({"type": "resource", "resource": {"uri": "file:///a.bin", "blob": "AAEC"}}),
            json!({"type": "video", "url": "x"}),
            json!({"type": "image", "data": "not base64!", "mimeType": "image/png"}),
            json!({"no_type": 1}),
        ];
        let kinds: Vec<&str> = vec![
            "Text",
            "Image",
            "Audio",
            "ResourceLink",
            "Resource",
            "Resource",
            "Unknown",
            "Unknown",
            "Unknown",
        ];
        for (value, kind) in cases.iter().zip(kinds) {
            let parsed = block(value.clone());
            assert!(
                format!("{parsed:?}").starts_with(kind),
                "{value} -> {parsed:?}"
            );
            assert_eq!(&serde_json::to_value(&parsed).unwrap(), value);
        }
    }

    #[test]
    fn readable_text_of_each_shape() {
        assert_eq!(ToolOutput::text("a\nb").readable_text(), "a\nb");
        assert_eq!(ToolOutput::default().readable_text(), "");
        assert_eq!(
            ToolOutput::json(json!({"b": 1, "a": [true]})).readable_text(),
            "{\n  \"a\": [\n    true\n  ],\n  \"b\": 1\n}"
        );
        // Structured content is shown only when there is no block.
        let both = ToolOutput::text("summary").with_structured_content(json!({"k": 1}));
        assert_eq!(both.readable_text(), "summary");
        let mixed = ToolOutput::from_blocks(vec![
            ContentBlock::text("before"),
            ContentBlock::image("image/png", vec![1; 10]),
            block(
                json!({"type": "resource", "resource": {"uri": "file:///n.txt", "text": "note\n", "mimeType": "text/plain"}}),
            ),
            block(json!({"type": "resource_link", "uri": "https://x/y\nz", "name": "y"})),
            block(json!({"type": "resource", "resource": {"uri": "mem://b", "blob": "AAEC"}})),
            ContentBlock::audio("audio/wav", vec![0; 3]),
            block(json!({"type": "video", "url": "x"})),
            ContentBlock::text("after"),
        ]);
        insta::assert_snapshot!(mixed.readable_text(), @r#"
        before
        [content block #1: image, image/png, 10 bytes]
        [content block #2: resource file:///n.txt, text/plain, 5 bytes of text follow]
        note

        [content block #3: resource link https://x/y z, name "y"]
        [content block #4: resource mem://b, 3 bytes]
        [content block #5: audio, audio/wav, 3 bytes]
        [content block #6: unknown block type "video", 26 bytes of JSON]
        after
        "#);
        let joined: Vec<String> = mixed
            .content
            .iter()
            .enumerate()
            .map(|(i, b)| b.readable_segment(i).into_owned())
            .collect();
        assert_eq!(joined.join("\n"), mixed.readable_text());
        let (text, spans) = mixed.readable_text_spans();
        let owned: Vec<Option<&str>> = spans.iter().map(|s| s.clone().map(|r| &text[r])).collect();
        assert_eq!(
            owned,
            [
                Some("before"),
                None,
                Some("note\n"),
                None,
                None,
                None,
                None,
                Some("after")
            ]
        );
        let binaries: Vec<(usize, &str)> = mixed
            .binary_blocks()
            .map(|(i, b)| (i, b.mime_type))
            .collect();
        assert_eq!(
            binaries,
            [
                (1, "image/png"),
                (4, "application/octet-stream"),
                (5, "audio/wav")
            ]
        );
    }

    #[test]
    fn placeholder_fields_are_one_short_line() {
        let long = format!("file:///{}", "d/".repeat(200));
        let link = block(json!({"type": "resource_link", "uri": long, "name": "a\r\nb"}));
        let line = link.placeholder(0).unwrap();
        assert!(!line.contains('\n') && !line.contains('\r'));
        assert!(line.chars().count() < 2 * PLACEHOLDER_FIELD + 60, "{line}");
    }

    #[test]
    fn a_call_tool_result_deserializes_whole() {
        let raw = json!({
            "content": [{"type": "text", "text": "ok"}],
            "structuredContent": {"n": 1},
            "isError": true,
            "_meta": {"trace": "t"}
        });
        let output: ToolOutput = serde_json::from_value(raw.clone()).unwrap();
        assert!(output.is_error());
        assert_eq!(output.structured_content, Some(json!({"n": 1})));
        assert_eq!(serde_json::to_value(&output).unwrap(), raw);
    }
}
