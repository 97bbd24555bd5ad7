//! A streaming scanner that finds the top-level `id` of a JSON-RPC message as its bytes pass,
//! without keeping them: for a line too large to hold (or one that does not parse), it says
//! which request the line answers, so that request fails at once instead of waiting out its
//! deadline.
//!
//! The `id` may come first (`{"jsonrpc":"2.0","id":5,"result":…}`, as rmcp and the Python
//! SDK write) or last (`{"result":…,"jsonrpc":"2.0","id":5}`, as the TypeScript SDK does):
//! the scanner follows nesting depth, strings and escapes, and captures the value of the
//! key `id` at depth 1 only (an `"id"` inside the result, or inside a string, is not it). It
//! keeps about a KiB whatever the line's size, so a later spill of an oversized answer
//! to a file can feed it the same chunks it writes.

/// The longest `id` value captured (raw JSON text): a peer's string id may be 256 bytes
/// ([`MAX_REQUEST_ID_BYTES`](crate::MAX_REQUEST_ID_BYTES)), each written as a `\u00XX`
/// escape at worst, with its quotes.
const MAX_ID: usize = 6 * crate::MAX_REQUEST_ID_BYTES + 2;
/// The longest top-level key remembered (`"jsonrpc"`, `"method"` are the longest we need).
const MAX_KEY: usize = 8;

/// Where the scanner is relative to the top-level object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum At {
    /// Before the first non-blank byte.
    #[default]
    Start,
    /// Inside the top-level object, expecting a key (after `{` or `,`).
    Key,
    /// Inside a top-level key's string.
    InKey,
    /// After a key, expecting `:`.
    Colon,
    /// After `:`, expecting a value.
    Value,
    /// Inside a scalar value (number, `true`, `null`…) at depth 1.
    Scalar,
    /// Inside a string value at depth 1.
    StringValue,
    /// Inside a nested object or array (depth 2 and more), or after a value at depth 1.
    Nested,
    /// After the top-level object, or the line is not an object: nothing more to find.
    Done,
}

/// What the scanner found in a line so far. Feed it chunks with [`IdScanner::feed`].
#[derive(Debug, Default)]
pub(crate) struct IdScanner {
    at: At,
    /// Nesting depth below the top-level object (`Nested` only).
    depth: u64,
    /// Inside a string at depth 2 or more.
    in_string: bool,
    /// The previous byte was a backslash inside a string.
    escape: bool,
    key: Vec<u8>,
    key_long: bool,
    /// Whether the value being read is the top-level `id`'s.
    capturing: bool,
    id: Vec<u8>,
    id_long: bool,
    id_done: bool,
    /// Whether a top-level `id` key was seen, whatever its value.
    id_key: bool,
    method: bool,
}

/// The `id` (JSON text) of the request a whole message `line` answers: its top-level `id`
/// when it has no `method`.
pub(crate) fn answer_id(line: &[u8]) -> Option<String> {
    let mut scanner = IdScanner::default();
    scanner.feed(line);
    scanner.id().filter(|_| !scanner.has_method())
}

impl IdScanner {
    /// Reads the next bytes of the line.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        while let Some((&byte, rest)) = bytes.split_first() {
            if self.at == At::Done {
                return;
            }
            // Long strings (where large results live) are skipped with memchr.
            if (self.in_string || self.at == At::StringValue) && !self.escape && !self.capturing {
                match memchr::memchr2(b'"', b'\\', bytes) {
                    Some(i) => {
                        bytes = &bytes[i..];
                        let (&byte, rest) = (&bytes[0], &bytes[1..]);
                        self.step(byte);
                        bytes = rest;
                    }
                    None => return,
                }
                continue;
            }
            self.step(byte);
            bytes = rest;
        }
    }

    /// The top-level `id` as JSON text (`5`, `"req-1"`), normalized through serde, if the
    /// line had one of a request id's shape (a number or a string).
    pub(crate) fn id(&self) -> Option<String> {
        if !self.id_done || self.id_long {
            return None;
        }
        match serde_json::from_slice::<serde_json::Value>(&self.id).ok()? {
            value @ (serde_json::Value::Number(_) | serde_json::Value::String(_)) => {
                Some(value.to_string())
            }
            _ => None,
        }
    }

    /// Whether the line has a top-level `method` (a request or notification, not an answer).
    pub(crate) fn has_method(&self) -> bool {
        self.method
    }

    /// Whether the line has a top-level `id` key, whatever its value (one [`id`](Self::id)
    /// cannot give: `null`, an object, one too long).
    pub(crate) fn has_id_key(&self) -> bool {
        self.id_key
    }

    fn step(&mut self, byte: u8) {
        match self.at {
            At::Start => match byte {
                b'{' => self.at = At::Key,
                b' ' | b'\t' | b'\r' | b'\n' => {}
                _ => self.at = At::Done,
            },
            At::Key => match byte {
                b'"' => {
                    self.key.clear();
                    self.key_long = false;
                    self.at = At::InKey;
                }
                b'}' => self.at = At::Done,
                _ => {}
            },
            At::InKey => {
                if self.escape {
                    self.escape = false;
                    self.push_key(byte);
                } else if byte == b'\\' {
                    self.escape = true;
                    self.push_key(byte);
                } else if byte == b'"' {
                    self.at = At::Colon;
                } else {
                    self.push_key(byte);
                }
            }
            At::Colon => {
                if byte == b':' {
                    let key = (!self.key_long).then_some(self.key.as_slice());
                    self.capturing = key == Some(b"id");
                    self.id_key |= self.capturing;
                    if key == Some(b"method") {
                        self.method = true;
                    }
                    if self.capturing {
                        self.id.clear();
                        self.id_long = false;
                        self.id_done = false;
                    }
                    self.at = At::Value;
                }
            }
            At::Value => match byte {
                b' ' | b'\t' | b'\r' | b'\n' => {}
                b'"' => {
                    self.capture(byte);
                    self.at = At::StringValue;
                }
                b'{' | b'[' => {
                    self.end_capture();
                    self.depth = 1;
                    self.at = At::Nested;
                }
                _ => {
                    self.capture(byte);
                    self.at = At::Scalar;
                }
            },
            At::Scalar => match byte {
                b',' => {
                    self.end_capture();
                    self.at = At::Key;
                }
                b'}' => {
                    self.end_capture();
                    self.at = At::Done;
                }
                b' ' | b'\t' | b'\r' | b'\n' => {
                    self.end_capture();
                    self.depth = 0;
                    self.at = At::Nested;
                }
                _ => self.capture(byte),
            },
            At::StringValue => {
                self.capture(byte);
                if self.escape {
                    self.escape = false;
                } else if byte == b'\\' {
                    self.escape = true;
                } else if byte == b'"' {
                    self.end_capture();
                    self.depth = 0;
                    self.at = At::Nested;
                }
            }
            At::Nested => self.nested(byte),
            At::Done => {}
        }
    }

    /// Inside a nested value (`depth` > 0), or between a depth-1 value and what follows it
    /// (`depth` 0).
    fn nested(&mut self, byte: u8) {
        if self.in_string {
            if self.escape {
                self.escape = false;
            } else if byte == b'\\' {
                self.escape = true;
            } else if byte == b'"' {
                self.in_string = false;
            }
            return;
        }
        match (byte, self.depth) {
            (b'"', _) => self.in_string = true,
            (b'{' | b'[', _) => self.depth += 1,
            (b'}' | b']', 0) => self.at = At::Done,
            (b'}' | b']', _) => self.depth -= 1,
            (b',', 0) => self.at = At::Key,
            _ => {}
        }
    }

    fn push_key(&mut self, byte: u8) {
        if self.key.len() < MAX_KEY {
            self.key.push(byte);
        } else {
            self.key_long = true;
        }
    }

    fn capture(&mut self, byte: u8) {
        if !self.capturing {
            return;
        }
        if self.id.len() < MAX_ID {
            self.id.push(byte);
        } else {
            self.id_long = true;
        }
    }

    fn end_capture(&mut self) {
        if self.capturing {
            self.capturing = false;
            self.id_done = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(line: &[u8]) -> (Option<String>, bool) {
        let mut whole = IdScanner::default();
        whole.feed(line);
        // The same bytes split at every position, and one by one, find the same.
        for split in 0..=line.len() {
            let mut parts = IdScanner::default();
            parts.feed(&line[..split]);
            parts.feed(&line[split..]);
            assert_eq!(
                (parts.id(), parts.has_method()),
                (whole.id(), whole.has_method()),
                "split at {split}"
            );
        }
        let mut bytes = IdScanner::default();
        for byte in line {
            bytes.feed(std::slice::from_ref(byte));
        }
        assert_eq!(bytes.id(), whole.id(), "byte by byte");
        (whole.id(), whole.has_method())
    }

    #[test]
    fn the_top_level_id_is_found_first_or_last() {
        let first =
            br#"{"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"text","text":"x"}]}}"#;
        assert_eq!(scan(first), (Some("5".into()), false));
        let last =
            br#"{"result":{"id":9,"content":[{"text":"\"id\":7"}]},"jsonrpc":"2.0","id":12}"#;
        assert_eq!(scan(last), (Some("12".into()), false));
        let spaced = b"  { \"result\" : [1, {\"id\": 3}] , \"id\" : \"req-\\\"1\" }";
        assert_eq!(scan(spaced), (Some(r#""req-\"1""#.into()), false));
        let request = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        assert_eq!(scan(request), (Some("1".into()), true));
    }

    #[test]
    fn no_id_is_made_up() {
        for line in [
            &br#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"id":4}}"#[..],
            br#"{"result":"id","x":{"id":1}}"#,
            br#"[{"id":1}]"#,
            br#"not json "id":1"#,
            br#"{"id":{"nested":1},"result":{}}"#,
            br#"{"id":null,"error":{}}"#,
            br#"{"idx":2,"result":{}}"#,
            br#"{"result":{"content":[{"text":"cut here"#,
        ] {
            assert_eq!(scan(line).0, None, "{}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn an_id_is_found_in_a_line_cut_after_it() {
        assert_eq!(
            scan(br#"{"jsonrpc":"2.0","id":41,"result":{"content":[{"text":"cut"#).0,
            Some("41".into())
        );
        // Cut inside the id itself: not an id.
        assert_eq!(scan(br#"{"jsonrpc":"2.0","id":41"#).0, None);
    }
}
