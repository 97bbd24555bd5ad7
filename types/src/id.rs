//! Validated identifiers: servers, tools, Runs, tool calls, and the `(server, tool)` pair.
//!
//! Every id is a newtype over `String` whose constructor checks the allowed alphabet and
//! length, so a bad name is an [`IdError`] at the boundary where it enters (config, a
//! `tools/list` reply, a model's tool call) rather than a surprise later. Serde goes through
//! the same check (`try_from = "String"`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a string was refused as an id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdError {
    /// The string was empty.
    #[error("{kind} must not be empty")]
    Empty {
        /// Which kind of id was being built (`"tool name"`, `"server id"`, …).
        kind: &'static str,
    },
    /// The string was longer than the kind allows.
    #[error("{kind} is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// Which kind of id was being built.
        kind: &'static str,
        /// The length that was given, in bytes.
        len: usize,
        /// The maximum length for this kind.
        max: usize,
    },
    /// The string held a character outside the kind's alphabet.
    #[error("{kind} {value:?} has {found:?} at byte {at}; allowed characters are {allowed}")]
    BadChar {
        /// Which kind of id was being built.
        kind: &'static str,
        /// The refused string.
        value: String,
        /// The first refused character.
        found: char,
        /// Its byte offset.
        at: usize,
        /// A human-readable statement of the alphabet.
        allowed: &'static str,
    },
}

/// Checks `value` against an alphabet and a length bound.
fn validate(
    kind: &'static str,
    value: &str,
    max: usize,
    allowed: &'static str,
    ok: fn(char) -> bool,
) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { kind });
    }
    if let Some((at, found)) = value.char_indices().find(|&(_, c)| !ok(c)) {
        return Err(IdError::BadChar {
            kind,
            value: value.to_owned(),
            found,
            at,
            allowed,
        });
    }
    if value.len() > max {
        return Err(IdError::TooLong {
            kind,
            len: value.len(),
            max,
        });
    }
    Ok(())
}

fn word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

fn mcp_name_char(c: char) -> bool {
    word_char(c) || c == '.'
}

/// Defines a validated string newtype with the shared conversions.
macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:literal, $allowed:literal, $ok:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The longest value accepted, in bytes.
            pub const MAX_LEN: usize = $max;

            /// Validates and wraps `value`.
            ///
            /// # Errors
            ///
            /// [`IdError`] when `value` is empty, too long, or has a character outside
            #[doc = concat!("`", $allowed, "`.")]
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                validate($kind, &value, $max, $allowed, $ok)?;
                Ok(Self(value))
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = IdError;
            fn try_from(value: &str) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(value: &str) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(
    /// An MCP tool name as a server declares it: `[A-Za-z0-9_.-]{1,128}`, case-sensitive, the
    /// naming rule of the MCP 2025-11-25 specification.
    ToolName,
    "tool name",
    128,
    "[A-Za-z0-9_.-]",
    mcp_name_char
);

id_type!(
    /// The name of one MCP server connection (the key of an `mcpServers` entry):
    /// `[A-Za-z0-9_-]{1,64}`.
    ///
    /// Dots are refused (unlike tool names) so that a qualified `server.tool` rendering is
    /// always unambiguous, and the alphabet is a subset of what every provider accepts in a
    /// tool name.
    ServerId,
    "server id",
    64,
    "[A-Za-z0-9_-]",
    word_char
);

id_type!(
    /// The id of one Run (one agent conversation): `[A-Za-z0-9_-]{1,64}`.
    ///
    /// Runs isolate record logs from each other; the id is part of every record handle.
    RunId,
    "run id",
    64,
    "[A-Za-z0-9_-]",
    word_char
);

id_type!(
    /// The id a provider gave one tool call (`toolu_…`, `call_…`): `[A-Za-z0-9_-]{1,128}`.
    ///
    /// A tool result names the call it answers by this id; providers require the pairing to
    /// be exact.
    ToolCallId,
    "tool call id",
    128,
    "[A-Za-z0-9_-]",
    word_char
);

/// A tool addressed as a plain `(server, tool)` pair: the only way Psych addresses a remote
/// tool. There is no opaque per-call token.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ToolRef {
    /// The server connection that hosts the tool.
    pub server: ServerId,
    /// The tool's name on that server.
    pub tool: ToolName,
}

impl ToolRef {
    /// Pairs a server and a tool name.
    pub fn new(server: ServerId, tool: ToolName) -> Self {
        Self { server, tool }
    }

    /// Validates both halves from strings.
    ///
    /// # Errors
    ///
    /// [`IdError`] from whichever half is invalid (the server is checked first).
    pub fn parse(server: &str, tool: &str) -> Result<Self, IdError> {
        Ok(Self::new(ServerId::new(server)?, ToolName::new(tool)?))
    }
}

impl fmt::Display for ToolRef {
    /// `server/tool`, for messages and logs. Not a wire format.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.server, self.tool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_follow_the_mcp_alphabet() {
        assert!(ToolName::new("API-get-user").is_ok());
        assert!(ToolName::new("browser.navigate_back").is_ok());
        assert!(ToolName::new("a".repeat(128)).is_ok());
        assert_eq!(
            ToolName::new("a".repeat(129)),
            Err(IdError::TooLong {
                kind: "tool name",
                len: 129,
                max: 128
            })
        );
        assert_eq!(ToolName::new(""), Err(IdError::Empty { kind: "tool name" }));
        let err = ToolName::new("get user").unwrap_err();
        assert!(
            matches!(
                err,
                IdError::BadChar {
                    found: ' ',
                    at: 3,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(ToolName::new("tööl").is_err());
    }

    #[test]
    fn server_ids_refuse_dots() {
        assert!(ServerId::new("server-filesystem").is_ok());
        assert!(matches!(
            ServerId::new("a.b"),
            Err(IdError::BadChar { found: '.', .. })
        ));
    }

    #[test]
    fn serde_validates_at_the_boundary() {
        let ok: ToolName = serde_json::from_str("\"list_issues\"").unwrap();
        assert_eq!(ok.as_str(), "list_issues");
        let err = serde_json::from_str::<ToolName>("\"list issues\"").unwrap_err();
        assert!(err.to_string().contains("tool name"), "{err}");
        assert_eq!(serde_json::to_string(&ok).unwrap(), "\"list_issues\"");
    }

    #[test]
    fn error_messages_say_what_is_allowed() {
        let err = ServerId::new("git hub").unwrap_err();
        assert_eq!(
            err.to_string(),
            "server id \"git hub\" has ' ' at byte 3; allowed characters are [A-Za-z0-9_-]"
        );
    }

    proptest::proptest! {
        #[test]
        fn valid_names_round_trip(name in "[A-Za-z0-9_.-]{1,128}") {
            let parsed = ToolName::new(name.clone()).unwrap();
            let json = serde_json::to_string(&parsed).unwrap();
            let back: ToolName = serde_json::from_str(&json).unwrap();
            proptest::prop_assert_eq!(back.as_str(), name.as_str());
        }

        #[test]
        fn any_string_is_accepted_or_refused_without_panic(name in ".{0,140}") {
            let expected = !name.is_empty()
                && name.len() <= 128
                && name.chars().all(mcp_name_char);
            proptest::prop_assert_eq!(ToolName::new(name).is_ok(), expected);
        }
    }
}
