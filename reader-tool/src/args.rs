//! The model's arguments to `read_tool_output`, parsed from JSON and checked against the
//! reader's [`Limits`].

use serde_json::Value;

use crate::limits::{Limits, MAX_GREP_BYTES};

/// The arguments of one `read_tool_output` call.
///
/// Built by [`ReadArgs::from_json`] from what the model sent, or directly by a caller.
/// [`Reader::read`](crate::Reader::read) checks them again with [`ReadArgs::validate`], so a
/// hand-built value gets the same answer as JSON would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadArgs {
    /// The handle as given (`<run>:<seq>`). It is parsed when the read resolves it: a handle
    /// that does not parse is a corruption error, not a validation error.
    pub handle: String,
    /// Lines to skip before the first line returned (0-based: line `N` is at offset `N - 1`).
    pub offset: u64,
    /// Bytes of the line at `offset` to skip before showing it (or, with `grep`, searching
    /// it): how a line cut at [`Limits::max_line_bytes`] is read on. 0 reads lines whole.
    pub byte: u64,
    /// Lines to return at most (matching lines with `grep`); `None` is the reader's default.
    pub limit: Option<u32>,
    /// A literal, case-sensitive substring; when set, only lines holding it are returned.
    pub grep: Option<String>,
}

/// The fields the tool takes, in the order the schema lists them.
const FIELDS: [&str; 5] = ["handle", "offset", "byte", "limit", "grep"];

/// Why the model's arguments were refused. The model sees the text as the tool result and
/// can correct itself; it is not a corruption error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgsError {
    /// The arguments are not a JSON object.
    #[error("the arguments must be a JSON object, not {found}")]
    NotAnObject {
        /// The JSON type that was sent.
        found: &'static str,
    },
    /// `handle` is absent (or null).
    #[error("`handle` is required: pass the handle shown with the shortened result")]
    MissingHandle,
    /// A field has the wrong JSON type.
    #[error("`{field}` must be {expected}, not {found}")]
    WrongType {
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
        /// The JSON type (or kind of number) that was sent.
        found: &'static str,
    },
    /// `offset` is negative.
    #[error("`offset` must be 0 or more, not {0}")]
    NegativeOffset(i64),
    /// `byte` is negative.
    #[error("`byte` must be 0 or more, not {0}")]
    NegativeByte(i64),
    /// `limit` is 0 or over the maximum.
    #[error("`limit` must be from 1 to {max}, not {value}")]
    Limit {
        /// The refused value, as sent.
        value: String,
        /// The largest accepted.
        max: u32,
    },
    /// A field the tool does not take.
    #[error("unknown field {0:?}; the fields are handle, offset, byte, limit and grep")]
    UnknownField(String),
    /// `grep` is the empty string.
    #[error("`grep` must not be empty; leave it out to read lines")]
    EmptyGrep,
    /// `grep` holds a line break; it matches within one line.
    #[error("`grep` must not contain a line break; it matches within one line")]
    GrepLineBreak,
    /// `grep` is longer than [`MAX_GREP_BYTES`].
    #[error("`grep` is {0} bytes long; at most {MAX_GREP_BYTES} are allowed")]
    GrepTooLong(usize),
}

impl ArgsError {
    /// The text of the tool result the model sees: what was wrong, then the call's shape.
    pub fn tool_text(&self) -> String {
        format!(
            "read_tool_output: invalid arguments: {self}.\nExpected {{\"handle\": \
             \"<run>:<seq>\", \"offset\": integer >= 0, \"byte\": integer >= 0, \"limit\": \
             integer >= 1, \"grep\": \"literal text\"}}; only handle is required."
        )
    }
}

/// The JSON type name of a value, for messages.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a fractional number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Cuts a field name the model made up to a printable length.
fn shorten(name: &str) -> String {
    const MAX: usize = 64;
    if name.len() <= MAX {
        return name.to_owned();
    }
    let mut cut = MAX;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…", &name[..cut])
}

impl ReadArgs {
    /// Arguments reading `handle` from its first line with the default limit.
    pub fn new(handle: impl Into<String>) -> Self {
        Self {
            handle: handle.into(),
            offset: 0,
            byte: 0,
            limit: None,
            grep: None,
        }
    }

    /// Parses the model's arguments and checks them against `limits`.
    ///
    /// A `null` optional field counts as absent. Numbers must be whole, as JSON Schema
    /// reads `integer` ([`psych_types::json_whole`]: `2.0` is taken as 2; `2.5` and `"2"`
    /// are refused).
    ///
    /// # Errors
    ///
    /// [`ArgsError`] for the first problem found, in the order: not an object, unknown
    /// field, handle, offset, byte, limit, grep.
    pub fn from_json(arguments: &Value, limits: &Limits) -> Result<Self, ArgsError> {
        let Value::Object(map) = arguments else {
            return Err(ArgsError::NotAnObject {
                found: type_name(arguments),
            });
        };
        // Sorted so the error names the same field whatever the map's order.
        let mut unknown: Vec<&String> = map
            .keys()
            .filter(|key| !FIELDS.contains(&key.as_str()))
            .collect();
        unknown.sort();
        if let Some(name) = unknown.first() {
            return Err(ArgsError::UnknownField(shorten(name)));
        }
        let present = |field: &str| map.get(field).filter(|value| !value.is_null());
        let handle = match present("handle") {
            None => return Err(ArgsError::MissingHandle),
            Some(Value::String(handle)) => handle.clone(),
            Some(other) => {
                return Err(ArgsError::WrongType {
                    field: "handle",
                    expected: "a string",
                    found: type_name(other),
                });
            }
        };
        let whole = |field: &'static str, negative: fn(i64) -> ArgsError| match present(field) {
            None => Ok(0),
            Some(value) => match (psych_types::json_whole(value), value.as_i64()) {
                (Some(n), _) => Ok(n),
                (None, Some(n)) => Err(negative(n)),
                (None, None) => Err(ArgsError::WrongType {
                    field,
                    expected: "an integer",
                    found: type_name(value),
                }),
            },
        };
        let offset = whole("offset", ArgsError::NegativeOffset)?;
        let byte = whole("byte", ArgsError::NegativeByte)?;
        let limit = match present("limit") {
            None => None,
            Some(value @ Value::Number(n))
                if !n.is_f64() || psych_types::json_whole(value).is_some() =>
            {
                Some(
                    psych_types::json_whole(value)
                        .and_then(|limit| u32::try_from(limit).ok())
                        .filter(|&limit| limit >= 1 && limit <= limits.max_limit)
                        .ok_or_else(|| ArgsError::Limit {
                            value: value.to_string(),
                            max: limits.max_limit,
                        })?,
                )
            }
            Some(value) => {
                return Err(ArgsError::WrongType {
                    field: "limit",
                    expected: "an integer",
                    found: type_name(value),
                });
            }
        };
        let grep = match present("grep") {
            None => None,
            Some(Value::String(grep)) => Some(grep.clone()),
            Some(value) => {
                return Err(ArgsError::WrongType {
                    field: "grep",
                    expected: "a string",
                    found: type_name(value),
                });
            }
        };
        let args = Self {
            handle,
            offset,
            byte,
            limit,
            grep,
        };
        args.validate(limits)?;
        Ok(args)
    }

    /// Checks the values against `limits` (the types are already right).
    ///
    /// # Errors
    ///
    /// [`ArgsError::Limit`] for a limit of 0 or over the maximum, and the `grep` variants
    /// for an empty, multi-line or over-long `grep`.
    pub fn validate(&self, limits: &Limits) -> Result<(), ArgsError> {
        if let Some(limit) = self.limit
            && (limit == 0 || limit > limits.max_limit)
        {
            return Err(ArgsError::Limit {
                value: limit.to_string(),
                max: limits.max_limit,
            });
        }
        if let Some(grep) = &self.grep {
            if grep.is_empty() {
                return Err(ArgsError::EmptyGrep);
            }
            if grep.contains(['\n', '\r']) {
                return Err(ArgsError::GrepLineBreak);
            }
            if grep.len() > MAX_GREP_BYTES {
                return Err(ArgsError::GrepTooLong(grep.len()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(value: Value) -> Result<ReadArgs, ArgsError> {
        ReadArgs::from_json(&value, &Limits::default())
    }

    #[test]
    fn full_and_minimal_arguments_parse() {
        assert_eq!(parse(json!({"handle": "r:1"})), Ok(ReadArgs::new("r:1")));
        assert_eq!(
            parse(json!({"handle": "r:1", "offset": 10, "byte": 7, "limit": 5, "grep": "ERR"})),
            Ok(ReadArgs {
                handle: "r:1".into(),
                offset: 10,
                byte: 7,
                limit: Some(5),
                grep: Some("ERR".into()),
            })
        );
        assert_eq!(
            parse(
                json!({"handle": "r:1", "offset": null, "byte": null, "limit": null, "grep": null})
            ),
            Ok(ReadArgs::new("r:1")),
            "null is absent"
        );
    }

    #[test]
    fn a_handle_that_will_not_parse_is_still_valid_arguments() {
        // Parsing the handle is the reader's job: a bad one is corruption, not validation.
        assert_eq!(parse(json!({"handle": "zzz"})), Ok(ReadArgs::new("zzz")));
    }

    #[test]
    fn each_malformation_has_its_own_error() {
        let cases = [
            (
                json!([1]),
                "the arguments must be a JSON object, not an array",
            ),
            (
                json!({}),
                "`handle` is required: pass the handle shown with the shortened result",
            ),
            (
                json!({"handle": 3}),
                "`handle` must be a string, not an integer",
            ),
            (
                json!({"handle": "r:1", "offset": -3}),
                "`offset` must be 0 or more, not -3",
            ),
            (
                json!({"handle": "r:1", "offset": 1.5}),
                "`offset` must be an integer, not a fractional number",
            ),
            (
                json!({"handle": "r:1", "offset": "4"}),
                "`offset` must be an integer, not a string",
            ),
            (
                json!({"handle": "r:1", "byte": -1}),
                "`byte` must be 0 or more, not -1",
            ),
            (
                json!({"handle": "r:1", "byte": "2000"}),
                "`byte` must be an integer, not a string",
            ),
            (
                json!({"handle": "r:1", "limit": 0}),
                "`limit` must be from 1 to 1000, not 0",
            ),
            (
                json!({"handle": "r:1", "limit": 1001}),
                "`limit` must be from 1 to 1000, not 1001",
            ),
            (
                json!({"handle": "r:1", "limit": -1}),
                "`limit` must be from 1 to 1000, not -1",
            ),
            (
                json!({"handle": "r:1", "limit": 2.5}),
                "`limit` must be an integer, not a fractional number",
            ),
            (
                json!({"handle": "r:1", "limit": true}),
                "`limit` must be an integer, not a boolean",
            ),
            (
                json!({"handle": "r:1", "grep": ""}),
                "`grep` must not be empty; leave it out to read lines",
            ),
            (
                json!({"handle": "r:1", "grep": "a\nb"}),
                "`grep` must not contain a line break; it matches within one line",
            ),
            (
                json!({"handle": "r:1", "grep": ["a"]}),
                "`grep` must be a string, not an array",
            ),
            (
                json!({"handle": "r:1", "path": "x"}),
                "unknown field \"path\"; the fields are handle, offset, byte, limit and grep",
            ),
        ];
        for (value, expected) in cases {
            let err = parse(value.clone()).unwrap_err();
            assert_eq!(err.to_string(), expected, "{value}");
        }
        // A whole number written as a float is an integer, as JSON Schema reads it.
        let read = parse(json!({"handle": "r:1", "offset": 3.0, "limit": 2.0})).unwrap();
        assert_eq!((read.offset, read.limit), (3, Some(2)));
        let long = "x".repeat(MAX_GREP_BYTES + 1);
        assert_eq!(
            parse(json!({"handle": "r:1", "grep": long})),
            Err(ArgsError::GrepTooLong(MAX_GREP_BYTES + 1))
        );
    }

    #[test]
    fn unknown_fields_are_reported_in_sorted_order_and_shortened() {
        let err = parse(json!({"zeta": 1, "alpha": 2, "handle": "r:1"})).unwrap_err();
        assert_eq!(err, ArgsError::UnknownField("alpha".into()));
        let long = "é".repeat(100);
        let ArgsError::UnknownField(shown) = parse(json!({ long: 1 })).unwrap_err() else {
            panic!("expected an unknown field");
        };
        assert!(shown.len() <= 64 + '…'.len_utf8(), "{shown}");
    }

    #[test]
    fn tool_text_says_what_and_how() {
        let text = ArgsError::MissingHandle.tool_text();
        assert!(text.starts_with("read_tool_output: invalid arguments: `handle` is required"));
        assert!(text.contains("only handle is required"));
    }
}
