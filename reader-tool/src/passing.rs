//! Result passing: a tool call's argument that names a logged result instead of carrying
//! it, replaced by the result's content before the call goes upstream.
//!
//! An argument (at any depth of the call's arguments) whose value is an object with the key
//! [`RESULT_KEY`] is a [`ResultReference`]:
//!
//! ```json
//! {"$psych_result": "run-7:42"}
//! {"$psych_result": "run-7:42", "offset": 10, "limit": 50}
//! {"$psych_result": "run-7:42", "pointer": "/items/0/id"}
//! ```
//!
//! The first is replaced by the result's readable text, as a JSON string (the bytes
//! `read_tool_output` serves, without its line numbers). `offset` and `limit` are lines, as
//! in `read_tool_output` (skip `offset` lines, then at most `limit`; each line keeps its
//! line break). `pointer` is a JSON pointer (RFC 6901) into a result whose text is JSON, and
//! the value there replaces the reference whatever its JSON type (`""`: the whole document).
//!
//! The key starts with `$` and names Psych, so it does not meet a real tool's argument; an
//! object holding it is always a reference, and a malformed one is refused, never sent on.
//! Every reference of one call together may read at most [`Limits::max_passed_bytes`]
//! bytes of stored text (a Run's executor shares it across one step's calls): a call past
//! it is refused before anything is forwarded. A pointer parses its document whole, which
//! takes several times its text in memory (up to ~20x for an array of small numbers), so a
//! pointer's document may be at most a quarter of the bound. The replaced arguments are
//! sent as JSON, where escaping may grow a text with control characters up to 6x.
//!
//! There is no escape: an argument that must carry a literal object with the key cannot be
//! sent through Psych (a tool writing these docs, say); no real tool schema is known to use
//! the key.

use psych_types::{LineMark, RecordHandle, RecordSource, count_line_breaks};
use serde_json::{Map, Value};

#[cfg(doc)]
use crate::Limits;
use crate::scan::{checked_mark, nth_line_break, read_exact};
use crate::{CallError, Reader};

/// The key that makes an argument object a [`ResultReference`].
pub const RESULT_KEY: &str = "$psych_result";

/// A reference to a logged result (or a slice of it), parsed from an argument object
/// holding [`RESULT_KEY`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultReference {
    /// The handle as given (`<run>:<seq>`), resolved by the same rules as
    /// `read_tool_output`'s.
    pub handle: String,
    /// Lines to skip before the first line passed (0-based, as `read_tool_output`'s).
    pub offset: u64,
    /// Lines to pass at most; `None`: to the end.
    pub limit: Option<u64>,
    /// A JSON pointer into a JSON result; `None`: the text is passed.
    pub pointer: Option<String>,
}

/// What is wrong with a reference or with what it asks for: the model's to fix, so it is
/// answered as a failed tool result and nothing is forwarded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReferenceError {
    /// `$psych_result` is not a string.
    #[error("`{RESULT_KEY}` must be a handle string such as \"run-7:42\", not {found}")]
    HandleNotString {
        /// The JSON type that was sent.
        found: &'static str,
    },
    /// A key other than `$psych_result`, `offset`, `limit` and `pointer`.
    #[error("unknown field {0:?} beside `{RESULT_KEY}`; the fields are offset, limit and pointer")]
    UnknownField(String),
    /// `offset` or `limit` is not a whole number in range, or `pointer` not a string.
    #[error("`{field}` must be {expected}")]
    WrongType {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// `pointer` was given with `offset` or `limit`.
    #[error("`pointer` takes no `offset` or `limit`: it names a value of a JSON result")]
    PointerWithLines,
    /// `pointer` is not empty and does not start with `/`.
    #[error("`pointer` must be \"\" or start with \"/\" (a JSON pointer), not {0:?}")]
    BadPointer(String),
    /// The references of one call would read more than the bound.
    #[error(
        "the reference needs at least {needed} bytes, over what may still be passed here \
         ({max} bytes allowed here, {used} already passed by this call's earlier \
         references); pass a part with offset and limit"
    )]
    TooLarge {
        /// Bytes this reference would read (at least: a slice stops counting past the
        /// bound).
        needed: u64,
        /// What could be passed in all ([`Limits::max_passed_bytes`], or what a Run's step
        /// had left of it).
        max: u64,
        /// Bytes earlier references of the call passed.
        used: u64,
    },
    /// `pointer` was given and the result is larger than a pointer may parse (a quarter of
    /// the bound: a parsed document takes several times its text in memory).
    #[error(
        "the result is {len} bytes; a pointer parses at most {max} bytes of JSON: pass a \
         part with offset and limit instead"
    )]
    DocumentTooLarge {
        /// The result's length.
        len: u64,
        /// The most a pointer parses.
        max: u64,
    },
    /// The result's Run is no longer kept (retention removed it): the store's words.
    #[error("{0}")]
    Gone(String),
    /// `offset` is past the result's last line.
    #[error("`offset` {offset} is past the end of the result ({lines} lines)")]
    OffsetPastEnd {
        /// The offset asked for.
        offset: u64,
        /// The result's lines.
        lines: u64,
    },
    /// `pointer` was given and the result's text is not JSON.
    #[error("the result is not JSON, so `pointer` cannot be used: {0}")]
    NotJson(#[source] serde_json::Error),
    /// `pointer` names nothing in the result.
    #[error("the pointer {0:?} names nothing in the result")]
    NoSuchValue(String),
}

/// Why a reference was not replaced.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PassError<E> {
    /// The reference is malformed or asks for what cannot be passed: the model's to fix.
    #[error(transparent)]
    Reference(#[from] ReferenceError),
    /// The handle is `invalid_deferred_handle`, or the source failed: as a read's.
    #[error(transparent)]
    Call(#[from] CallError<E>),
}

/// A [`PassError`] at one argument of the call.
#[derive(Debug, thiserror::Error)]
#[error("the argument at {at:?}")]
pub struct Misplaced<E: std::error::Error + 'static> {
    /// Where the reference is in the call's arguments, as a JSON pointer.
    pub at: String,
    /// What went wrong.
    #[source]
    pub error: PassError<E>,
}

/// What a reference was replaced by ([`Reader::referenced`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Referenced {
    /// The text (a JSON string), or the JSON value a pointer named.
    pub value: Value,
    /// Bytes of stored text read for it (counted against the bound).
    pub bytes: u64,
    /// Whether the result goes on past the lines passed (`limit` stopped the slice).
    pub more: bool,
}

/// What [`substitute`] replaced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Passed {
    /// References replaced.
    pub references: usize,
    /// Bytes of stored text they read.
    pub bytes: u64,
}

impl ResultReference {
    /// The reference an argument object is, `None` when it holds no [`RESULT_KEY`].
    ///
    /// # Errors
    ///
    /// [`ReferenceError`] for an object holding the key that is not a valid reference.
    pub fn from_object(object: &Map<String, Value>) -> Option<Result<Self, ReferenceError>> {
        let handle = object.get(RESULT_KEY)?;
        Some(Self::parse(handle, object))
    }

    fn parse(handle: &Value, object: &Map<String, Value>) -> Result<Self, ReferenceError> {
        let Value::String(handle) = handle else {
            return Err(ReferenceError::HandleNotString {
                found: psych_types::json_kind(handle),
            });
        };
        let mut reference = ResultReference {
            handle: handle.clone(),
            offset: 0,
            limit: None,
            pointer: None,
        };
        let whole = |field, expected| {
            move |value: &Value| {
                psych_types::json_whole(value).ok_or(ReferenceError::WrongType { field, expected })
            }
        };
        for (key, value) in object {
            match key.as_str() {
                RESULT_KEY => {}
                "offset" => reference.offset = whole("offset", "a whole number, 0 or more")(value)?,
                "limit" => {
                    let limit = whole("limit", "a whole number, 1 or more")(value)?;
                    if limit == 0 {
                        return Err(ReferenceError::WrongType {
                            field: "limit",
                            expected: "a whole number, 1 or more",
                        });
                    }
                    reference.limit = Some(limit);
                }
                "pointer" => {
                    let Value::String(pointer) = value else {
                        return Err(ReferenceError::WrongType {
                            field: "pointer",
                            expected: "a string (a JSON pointer)",
                        });
                    };
                    if !pointer.is_empty() && !pointer.starts_with('/') {
                        return Err(ReferenceError::BadPointer(pointer.clone()));
                    }
                    reference.pointer = Some(pointer.clone());
                }
                other => return Err(ReferenceError::UnknownField(other.to_owned())),
            }
        }
        // `"offset": 0` is the default a model may well fill in; anything else is a slice.
        if reference.pointer.is_some() && (reference.offset > 0 || reference.limit.is_some()) {
            return Err(ReferenceError::PointerWithLines);
        }
        Ok(reference)
    }
}

/// Whether `arguments` hold a reference anywhere (cheap: no store is asked).
pub fn has_reference(arguments: &Value) -> bool {
    match arguments {
        Value::Object(object) => {
            object.contains_key(RESULT_KEY) || object.values().any(has_reference)
        }
        Value::Array(items) => items.iter().any(has_reference),
        _ => false,
    }
}

/// Replaces every reference in `arguments` by what it names, resolved by `resolve` (given
/// the reference and the bytes still allowed; it answers the value and the bytes it read),
/// in document order, the references together reading at most `max_bytes`.
///
/// On an error `arguments` may be partly replaced; the caller forwards nothing then.
///
/// # Errors
///
/// The first reference that fails, with where it is (boxed: an error is rare and large).
pub fn substitute<E: std::error::Error + 'static>(
    arguments: &mut Value,
    max_bytes: u64,
    mut resolve: impl FnMut(&ResultReference, u64) -> Result<Referenced, PassError<E>>,
) -> Result<Passed, Box<Misplaced<E>>> {
    let mut passed = Passed::default();
    let mut path = Vec::new();
    walk(arguments, max_bytes, &mut resolve, &mut passed, &mut path)?;
    Ok(passed)
}

fn walk<E: std::error::Error + 'static>(
    value: &mut Value,
    max_bytes: u64,
    resolve: &mut impl FnMut(&ResultReference, u64) -> Result<Referenced, PassError<E>>,
    passed: &mut Passed,
    path: &mut Vec<String>,
) -> Result<(), Box<Misplaced<E>>> {
    let misplaced = |path: &[String], error| {
        Box::new(Misplaced {
            at: pointer_of(path),
            error,
        })
    };
    match value {
        Value::Object(object) => {
            if let Some(reference) = ResultReference::from_object(object) {
                let reference = reference.map_err(|e| misplaced(path, PassError::Reference(e)))?;
                let room = max_bytes.saturating_sub(passed.bytes);
                let referenced = resolve(&reference, room).map_err(|e| match e {
                    PassError::Reference(ReferenceError::TooLarge { needed, .. }) => misplaced(
                        path,
                        PassError::Reference(ReferenceError::TooLarge {
                            needed,
                            max: max_bytes,
                            used: passed.bytes,
                        }),
                    ),
                    other => misplaced(path, other),
                })?;
                passed.references += 1;
                passed.bytes += referenced.bytes;
                *value = referenced.value;
                return Ok(());
            }
            for (key, item) in object.iter_mut() {
                path.push(key.clone());
                walk(item, max_bytes, resolve, passed, path)?;
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                path.push(i.to_string());
                walk(item, max_bytes, resolve, passed, path)?;
                path.pop();
            }
        }
        _ => {}
    }
    Ok(())
}

fn pointer_of(path: &[String]) -> String {
    path.iter()
        .map(|segment| format!("/{}", segment.replace('~', "~0").replace('/', "~1")))
        .collect()
}

impl<S: RecordSource> Reader<S> {
    /// What `reference` names in this reader's Run, reading at most `room` bytes of stored
    /// text, and the bytes it read. The handle is resolved as by [`Reader::resolve`].
    ///
    /// # Errors
    ///
    /// [`PassError::Call`] as [`Reader::read`]'s errors; [`PassError::Reference`] when the
    /// slice is past the end, larger than `room`, or the pointer does not apply.
    pub fn referenced(
        &self,
        reference: &ResultReference,
        room: u64,
    ) -> Result<Referenced, PassError<S::Error>> {
        let info = self.resolve(&reference.handle)?;
        let too_large = |needed| ReferenceError::TooLarge {
            needed,
            max: room,
            used: 0,
        };
        if let Some(pointer) = &reference.pointer {
            let most = self.limits().max_passed_bytes() / 4;
            if info.len > most {
                return Err(ReferenceError::DocumentTooLarge {
                    len: info.len,
                    max: most,
                }
                .into());
            }
            if info.len > room {
                return Err(too_large(info.len).into());
            }
            let text = self.text(&info.handle, 0, info.len, info.len)?;
            let document: Value = serde_json::from_slice(&text).map_err(ReferenceError::NotJson)?;
            let value = document
                .pointer(pointer)
                .cloned()
                .ok_or_else(|| ReferenceError::NoSuchValue(pointer.clone()))?;
            return Ok(Referenced {
                value,
                bytes: info.len,
                more: false,
            });
        }
        let start = self.line_start(&info.handle, reference.offset, info.len)?;
        let end = match reference.limit {
            None => info.len,
            Some(lines) => self.lines_end(&info.handle, start, lines, info.len, room)?,
        };
        let needed = end - start;
        if needed > room {
            return Err(too_large(needed).into());
        }
        let text = self.text(&info.handle, start, end, info.len)?;
        // Whole lines of valid UTF-8 text (a line break is one byte, never inside a
        // character), so this is the text's own bytes; a source serving broken text is
        // passed with its bad bytes replaced rather than failing the call.
        let text = String::from_utf8(text)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        Ok(Referenced {
            value: Value::String(text),
            bytes: needed,
            more: end < info.len,
        })
    }

    /// Bytes `start..end` of the result's readable text.
    fn text(
        &self,
        handle: &RecordHandle,
        start: u64,
        end: u64,
        len: u64,
    ) -> Result<Vec<u8>, CallError<S::Error>> {
        let mut bytes = vec![0; usize::try_from(end - start).unwrap_or(usize::MAX)];
        read_exact(self.source(), handle, start, &mut bytes, len)?;
        Ok(bytes)
    }

    /// Calls `each` with the text from `from` in chunks until it answers `Some`, or the
    /// text ends (`None`).
    fn scan_from<T>(
        &self,
        handle: &RecordHandle,
        from: u64,
        len: u64,
        mut each: impl FnMut(u64, &[u8]) -> Option<T>,
    ) -> Result<Option<T>, CallError<S::Error>> {
        let chunk = self.limits().chunk_bytes().max(1);
        let mut buf = vec![0; chunk.min(usize::try_from(len - from).unwrap_or(chunk))];
        let mut at = from;
        while at < len {
            let want = buf
                .len()
                .min(usize::try_from(len - at).unwrap_or(usize::MAX));
            read_exact(self.source(), handle, at, &mut buf[..want], len)?;
            if let Some(found) = each(at, &buf[..want]) {
                return Ok(Some(found));
            }
            at += want as u64;
        }
        Ok(None)
    }

    /// The byte where line `offset` (0-based) starts.
    fn line_start(
        &self,
        handle: &RecordHandle,
        offset: u64,
        len: u64,
    ) -> Result<u64, PassError<S::Error>> {
        if offset == 0 {
            return Ok(0);
        }
        let mark = self
            .source()
            .line_mark(handle, offset)
            .map_err(CallError::Source)?;
        let mark: LineMark = checked_mark(mark, offset, len);
        let mut breaks = mark.breaks_before;
        // `breaks < offset` throughout: a checked mark has fewer breaks before it than
        // `offset`, and the scan stops at the `offset`-th.
        let found = self.scan_from(handle, mark.at, len, |at, chunk| {
            match nth_line_break(chunk, offset - breaks) {
                Some(i) => {
                    breaks = offset;
                    Some(at + i as u64 + 1)
                }
                None => {
                    breaks += count_line_breaks(chunk);
                    None
                }
            }
        })?;
        match found {
            // A line starts after the break, unless the text ends there.
            Some(start) if start < len => Ok(start),
            _ => {
                let unended = len > 0 && !ends_at_break(self, handle, len)?;
                Err(ReferenceError::OffsetPastEnd {
                    offset,
                    lines: breaks + u64::from(unended),
                }
                .into())
            }
        }
    }

    /// The byte after `lines` lines from `start` (each with its break), or the text's end;
    /// stops counting once past `start + room` (the caller refuses that slice).
    fn lines_end(
        &self,
        handle: &RecordHandle,
        start: u64,
        lines: u64,
        len: u64,
        room: u64,
    ) -> Result<u64, CallError<S::Error>> {
        let mut seen = 0;
        let found = self.scan_from(handle, start, len, |at, chunk| {
            if let Some(i) = nth_line_break(chunk, lines.saturating_sub(seen)) {
                return Some(at + i as u64 + 1);
            }
            seen += count_line_breaks(chunk);
            let end = at + chunk.len() as u64;
            (end - start > room).then_some(end)
        })?;
        Ok(found.unwrap_or(len))
    }
}

/// Whether the result's text ends with a line break (so its last break ends its last line).
fn ends_at_break<S: RecordSource>(
    reader: &Reader<S>,
    handle: &RecordHandle,
    len: u64,
) -> Result<bool, CallError<S::Error>> {
    let last = reader.text(handle, len - 1, len, len)?;
    Ok(last == b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_reference_is_an_object_holding_the_key() {
        let parse = |v: Value| match v {
            Value::Object(o) => ResultReference::from_object(&o),
            _ => None,
        };
        assert!(parse(json!({"handle": "r:1"})).is_none());
        let r = parse(json!({"$psych_result": "r:1", "offset": 2, "limit": 3}))
            .unwrap()
            .unwrap();
        assert_eq!((r.handle.as_str(), r.offset, r.limit), ("r:1", 2, Some(3)));
        let refused = |v: Value| parse(v).unwrap().unwrap_err().to_string();
        assert!(refused(json!({"$psych_result": 5})).contains("handle string"));
        assert!(refused(json!({"$psych_result": "r:1", "lines": 5})).contains("unknown field"));
        assert!(refused(json!({"$psych_result": "r:1", "limit": 0})).contains("1 or more"));
        assert!(refused(json!({"$psych_result": "r:1", "offset": -1})).contains("0 or more"));
        assert!(
            refused(json!({"$psych_result": "r:1", "pointer": "/a", "offset": 1}))
                .contains("no `offset`")
        );
        // The default offset a model fills in is no slice.
        assert!(
            parse(json!({"$psych_result": "r:1", "pointer": "/a", "offset": 0}))
                .unwrap()
                .is_ok()
        );
        assert!(refused(json!({"$psych_result": "r:1", "pointer": "a"})).contains("JSON pointer"));
    }

    #[test]
    fn substitution_walks_every_depth_and_says_where_it_failed() {
        let mut args =
            json!({"a": [1, {"$psych_result": "r:1"}], "b": {"c/d": {"$psych_result": "r:2"}}});
        assert!(has_reference(&args));
        assert!(!has_reference(&json!({"a": [1, {"b": "r:1"}]})));
        let passed = substitute::<std::io::Error>(&mut args, 100, |r, _| {
            Ok(Referenced {
                value: Value::String(format!("<{}>", r.handle)),
                bytes: 10,
                more: false,
            })
        })
        .unwrap();
        assert_eq!(args, json!({"a": [1, "<r:1>"], "b": {"c/d": "<r:2>"}}));
        assert_eq!(
            passed,
            Passed {
                references: 2,
                bytes: 20
            }
        );

        let mut args = json!({"x": {"y": [{"$psych_result": "r:1"}, {"$psych_result": "r:2"}]}});
        let failed = substitute::<std::io::Error>(&mut args, 15, |_, room| {
            if room < 10 {
                Err(ReferenceError::TooLarge {
                    needed: 10,
                    max: room,
                    used: 0,
                }
                .into())
            } else {
                Ok(Referenced {
                    value: Value::Null,
                    bytes: 10,
                    more: false,
                })
            }
        })
        .unwrap_err();
        assert_eq!(failed.at, "/x/y/1");
        assert!(
            failed.error.to_string().contains("15 bytes allowed here")
                && failed.error.to_string().contains("10 already"),
            "{}",
            failed.error
        );
    }
}
