//! A message written as one line of JSON without long CPU work on an async worker: a
//! message of up to [`JSON_ON_WORKER`] bytes is serialized where it is sent (about a
//! millisecond at most), a longer one (a passed result, a resource page: up to tens of MiB)
//! on a blocking thread. Its size is learnt by serializing it into a buffer that refuses
//! to grow past the bound, so nothing is measured twice but that first MiB.

use std::io;

use serde::Serialize;

/// The most bytes of JSON parsed or serialized on an async worker: 1 MiB, about a
/// millisecond. Past it, psych-mcp's transports and the gateway's stdio transport parse a
/// line or body, and serialize a message, on a blocking thread.
pub const JSON_ON_WORKER: usize = 1024 * 1024;

/// The most structural bytes (`[`, `{`, `,` and `:` outside strings) a server's message may
/// hold for psych-mcp to parse it: 2,097,152.
///
/// What a message takes once parsed grows with its values, not its bytes: a 64 MiB array of
/// `0`s parses to 1 GiB as a `serde_json::Value` (32 bytes a value), and rmcp's typed
/// messages, whose untagged enums buffer the whole input first, take about four times that.
/// Measured at this bound (release build, peak resident memory less the input): an array
/// of 2.1 million zeros takes 65 MiB as a `Value` and 256 MiB as rmcp's typed message; an
/// object of 1 million short distinct keys 133 MiB and 261 MiB. So one message's parse
/// stays within about 270 MiB plus the bytes of its strings. A message past the bound is
/// not parsed: an answer fails its request with
/// [`McpError::AnswerTooComplex`](crate::McpError::AnswerTooComplex), anything else is
/// dropped (an HTTP body rmcp parses itself is held to this many bytes instead:
/// [`MAX_JSON_BODY_BYTES`](crate::MAX_JSON_BODY_BYTES)). Real listings hold far fewer: 23
/// bytes a structural byte in a captured 1,223-tool catalogue of 2 MB, so a page would
/// pass it at about 46 MiB. A message of at most this many bytes is never counted (it
/// cannot pass it); a longer one is counted first (about 1 ms a MiB, on the thread that
/// parses it).
pub const MAX_JSON_STRUCTURAL_BYTES: u64 = 2 * 1024 * 1024;

/// Whether `json` holds more structural bytes than [`MAX_JSON_STRUCTURAL_BYTES`] (counting
/// stops at the first past it).
pub(crate) fn too_complex(json: &[u8]) -> bool {
    structure_past(json, MAX_JSON_STRUCTURAL_BYTES)
}

/// Whether `json` holds more than `bound` structural bytes (`[`, `{`, `,` and `:` outside
/// strings; counting stops at the first past it). JSON of at most `bound` bytes is not
/// read. See [`Structure`].
pub fn structure_past(json: &[u8], bound: u64) -> bool {
    json.len() as u64 > bound && Structure::default().feed(json, bound)
}

/// A count of the structural bytes (`[`, `{`, `,` and `:` outside strings) of JSON read in
/// pieces, as it streams: what bounds the memory its parse takes (about 32 bytes a
/// structural byte as a `serde_json::Value`, see [`MAX_JSON_STRUCTURAL_BYTES`]) before it
/// is parsed. Strings are followed, escapes included, across pieces, so brackets and
/// commas in text are not counted; an unterminated string ends the count (the parse then
/// fails). It keeps three words whatever it reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Structure {
    count: u64,
    in_string: bool,
    escaped: bool,
}

impl Structure {
    /// Reads the next piece of the JSON; whether the count is now past `bound` (then it
    /// stops reading, at the first byte past it).
    pub fn feed(&mut self, bytes: &[u8], bound: u64) -> bool {
        let mut at = 0;
        while at < bytes.len() {
            if self.escaped {
                self.escaped = false;
                at += 1;
                continue;
            }
            if self.in_string {
                // To the closing quote: the next quote not escaped. Long strings (where
                // texts live) are skipped with memchr.
                match memchr::memchr2(b'"', b'\\', &bytes[at..]) {
                    Some(found) => {
                        self.escaped = bytes[at + found] == b'\\';
                        self.in_string = self.escaped;
                        at += found + 1;
                    }
                    None => return false,
                }
                continue;
            }
            match bytes[at] {
                b'"' => self.in_string = true,
                b'[' | b'{' | b',' | b':' => {
                    self.count += 1;
                    if self.count > bound {
                        return true;
                    }
                }
                _ => {}
            }
            at += 1;
        }
        false
    }

    /// The structural bytes counted so far.
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// What a JSON-RPC message is, read without parsing it ([`message_shape`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageShape {
    /// Its top-level `id` as JSON text (`5`, `"req-1"`), when it has one of a request id's
    /// shape (a number or a string) of at most 1 KiB of JSON.
    pub id: Option<String>,
    /// Whether it has a top-level `method` (a request or a notification, not an answer).
    pub has_method: bool,
    /// Whether it has a top-level `id` key, whatever its value (`id` may still be `None`:
    /// `null`, an object, one too long).
    pub has_id_key: bool,
}

impl MessageShape {
    /// The id to answer it by: its `id` if it is a request (an answer or a notification
    /// is never answered).
    pub fn request_id(&self) -> Option<&str> {
        self.id.as_deref().filter(|_| self.has_method)
    }

    /// Whether it is a notification: a `method` and no `id` key.
    pub fn is_notification(&self) -> bool {
        self.has_method && !self.has_id_key
    }
}

/// The shape of the JSON-RPC message `json`, whole or its first bytes, found without
/// parsing it: the scanner follows nesting, strings and escapes and keeps about a KiB, so
/// a message refused unparsed (too large, too complex) can still be answered by its id.
pub fn message_shape(json: &[u8]) -> MessageShape {
    let mut scanner = ShapeScanner::default();
    scanner.feed(json);
    scanner.shape()
}

/// [`message_shape`] of a message whose bytes go by in pieces and are not kept (a line
/// read past because it is too long to hold): feed each piece in order, then ask for the
/// shape. It keeps about a KiB whatever the message's size, and finds a top-level `id`
/// written first or last.
#[derive(Debug, Default)]
pub struct ShapeScanner(crate::stdio::scan::IdScanner);

impl ShapeScanner {
    /// Reads the message's next bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.0.feed(bytes);
    }

    /// What the bytes read so far show.
    pub fn shape(&self) -> MessageShape {
        MessageShape {
            id: self.0.id(),
            has_method: self.0.has_method(),
            has_id_key: self.0.has_id_key(),
        }
    }
}

/// A message as a line (its JSON and `\n`), or the message back when its JSON is longer
/// than [`JSON_ON_WORKER`] (then [`line_off_worker`] makes it).
///
/// # Errors
///
/// The message cannot be serialized (a map with keys that are not strings, say).
pub fn line_on_worker<T: Serialize>(message: T) -> Result<Result<Vec<u8>, T>, io::Error> {
    let mut capped = Capped::new(Vec::new());
    match serde_json::to_writer(&mut capped, &message) {
        Ok(()) => {
            let mut line = capped.inner;
            line.push(b'\n');
            Ok(Ok(line))
        }
        Err(error) if error.is_io() => Ok(Err(message)),
        Err(error) => Err(io::Error::other(error)),
    }
}

/// A message as a line, serialized on a blocking thread.
///
/// # Errors
///
/// The message cannot be serialized, or the thread's task failed (a panic, the runtime
/// ending).
pub async fn line_off_worker<T: Serialize + Send + 'static>(message: T) -> io::Result<Vec<u8>> {
    tokio::task::spawn_blocking(move || {
        let mut line = serde_json::to_vec(&message).map_err(io::Error::other)?;
        line.push(b'\n');
        Ok(line)
    })
    .await
    .map_err(io::Error::other)?
}

/// Runs `parse` of `bytes` bytes of an answer where its size says: inline up to
/// [`JSON_ON_WORKER`], on a blocking thread past it (the remote transports' bodies and
/// events; a stdio line keeps its parse's handle across dropped receives instead). `Err`
/// only when that thread's task failed (a panic, the runtime's end).
pub(crate) async fn parse_by_size<T: Send + 'static>(
    bytes: usize,
    parse: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    off_worker_if(bytes > JSON_ON_WORKER, parse).await
}

/// Runs `work` on a blocking thread when it is `large` (past [`JSON_ON_WORKER`]'s worth of
/// JSON: [`value_past_worker_bound`] says so of a parsed value), else here. `Err` only
/// when that thread's task failed (a panic, the runtime's end).
pub async fn off_worker_if<T: Send + 'static>(
    large: bool,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if large {
        tokio::task::spawn_blocking(work).await
    } else {
        Ok(work())
    }
}

/// Whether `value` (parsed already) would take more than [`JSON_ON_WORKER`] bytes as JSON,
/// roughly: its strings' and keys' bytes and a few bytes a value. The walk stops as soon
/// as it knows (an array or object is counted before its items are visited), so it
/// visits at most the bound's worth of values (well under a millisecond); a value past
/// it is typed, or freed, on a blocking thread.
pub fn value_past_worker_bound(value: &serde_json::Value) -> bool {
    value_past(value, JSON_ON_WORKER)
}

/// Whether `value` would take more than `bound` bytes as JSON, roughly, as
/// [`value_past_worker_bound`] measures it (visiting at most the bound's worth of values).
pub fn value_past(value: &serde_json::Value, bound: usize) -> bool {
    use serde_json::Value;
    /// What a value counts at least, beside its text.
    const PER_VALUE: usize = 4;
    let mut bytes = PER_VALUE;
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::String(text) => bytes = bytes.saturating_add(text.len()),
            Value::Array(items) => {
                bytes = bytes.saturating_add(PER_VALUE.saturating_mul(items.len()));
                if bytes > bound {
                    return true;
                }
                stack.extend(items);
            }
            Value::Object(object) => {
                bytes = bytes.saturating_add(PER_VALUE.saturating_mul(object.len()));
                if bytes > bound {
                    return true;
                }
                for (key, item) in object {
                    bytes = bytes.saturating_add(key.len());
                    stack.push(item);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
        if bytes > bound {
            return true;
        }
    }
    false
}

/// Whether `value` takes more than [`JSON_ON_WORKER`] bytes as JSON: it is serialized into
/// a count that stops at the bound, so this costs that first MiB's serializing (about a
/// millisecond), plus whatever one value's `Serialize` builds whole before writing it (a
/// binary block's base64 string: measure those apart first). Everything serde writes
/// counts (`_meta`, unknown fields). A value that cannot be serialized is not past it
/// (its encoding fails anyway).
pub fn serialized_past_worker_bound<T: Serialize + ?Sized>(value: &T) -> bool {
    let mut counted = Capped::new(io::sink());
    serde_json::to_writer(&mut counted, value).is_err_and(|error| error.is_io())
}

/// A writer (a buffer, or a sink to count) that refuses to take more than
/// [`JSON_ON_WORKER`] bytes.
struct Capped<W> {
    inner: W,
    written: usize,
}

impl<W> Capped<W> {
    fn new(inner: W) -> Self {
        Self { inner, written: 0 }
    }
}

impl<W: io::Write> io::Write for Capped<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.written.saturating_add(bytes.len()) > JSON_ON_WORKER {
            return Err(io::Error::other(
                "over the bound of serializing on a worker",
            ));
        }
        self.inner.write_all(bytes)?;
        self.written += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        reason = "a test fails loudly on bad data"
    )]

    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    /// A parsed answer of over a MiB of text, or of many small values, is known to be
    /// past the bound; a usual one is not.
    #[test]
    fn a_parsed_value_is_measured_against_the_worker_bound() {
        let text = |n: usize| json!({"content": [{"type": "text", "text": "x".repeat(n)}]});
        assert!(!value_past_worker_bound(&text(1000)));
        assert!(!value_past_worker_bound(&text(JSON_ON_WORKER - 100)));
        assert!(value_past_worker_bound(&text(JSON_ON_WORKER)));
        // An array counts 4 bytes for itself and 4 for each item: at the bound, then past it.
        let zeros = |n: usize| serde_json::Value::Array(vec![json!(0); n]);
        assert!(!value_past_worker_bound(&zeros(JSON_ON_WORKER / 4 - 1)));
        assert!(value_past_worker_bound(&zeros(JSON_ON_WORKER / 4)));
        let wide = json!({"structuredContent": zeros(JSON_ON_WORKER / 4 + 1)});
        assert!(value_past_worker_bound(&wide));
        let keys: serde_json::Map<String, serde_json::Value> = (0..100_000)
            .map(|n| (format!("key-{n}"), json!(null)))
            .collect();
        assert!(value_past_worker_bound(&serde_json::Value::Object(keys)));
    }

    #[test]
    fn structural_bytes_are_counted_outside_strings_only() {
        let max = usize::try_from(MAX_JSON_STRUCTURAL_BYTES).unwrap();
        // At the bound, and one past it.
        let zeros = |n: usize| {
            let mut json = b"[".to_vec();
            json.extend(std::iter::repeat_n(&b"0,"[..], n).flatten());
            json.extend_from_slice(b"0]");
            json
        };
        assert!(!too_complex(&zeros(max - 1)));
        assert!(too_complex(&zeros(max)));
        let keys = |n: usize| {
            let mut json = b"{".to_vec();
            for i in 0..n {
                json.extend_from_slice(format!("\"{i}\":0,").as_bytes());
            }
            json.extend_from_slice(b"\"z\":0}");
            json
        };
        assert!(!too_complex(&keys(max / 2 - 1)));
        assert!(too_complex(&keys(max / 2)));
        // Text full of brackets, commas and escaped quotes is one string.
        let text = format!(
            "{{\"text\":\"{}\",\"a\":[1,2]}}",
            "[{,:\\\"\\\\".repeat(max / 4)
        );
        assert!(text.len() > max);
        assert!(!too_complex(text.as_bytes()));
        // Bytes that are not UTF-8 are counted past like any other (only ASCII is read).
        let mut raw = b"[\"\xff\xfe\",".to_vec();
        raw.extend_from_slice(&zeros(max)[1..]);
        assert!(too_complex(&raw));
        // A short message is not counted at all; an unterminated string, or one ending in
        // a backslash, ends the count.
        assert!(!too_complex(b"[,,,,]"));
        let open = format!("[\"{}", ",".repeat(max + 10));
        assert!(!too_complex(open.as_bytes()));
        let escaped_end = format!("{}[\"\\", ",".repeat(max + 10));
        assert!(too_complex(escaped_end.as_bytes()));
        let escaped_end = format!("[\"{}\\", "x".repeat(max + 10));
        assert!(!too_complex(escaped_end.as_bytes()));
        // Read in pieces of every size, split anywhere (inside an escape too), the count
        // is the same as at once.
        let json = br#"{"a":[1,{"b":"x\\\",[{:"}],"c":"\u005b,"}"#;
        let whole = {
            let mut structure = Structure::default();
            assert!(!structure.feed(json, u64::MAX));
            structure.count()
        };
        assert_eq!(whole, 8);
        for size in 1..json.len() {
            let mut structure = Structure::default();
            for piece in json.chunks(size) {
                assert!(!structure.feed(piece, u64::MAX));
            }
            assert_eq!(structure.count(), whole, "pieces of {size}");
        }
        assert!(structure_past(json, 7));
        assert!(!structure_past(json, 8));
    }

    #[test]
    fn a_serialized_value_is_measured_against_the_worker_bound() {
        let text = |n: usize| json!({"text": "x".repeat(n)});
        // `{"text":""}` is 11 bytes.
        assert!(!serialized_past_worker_bound(&text(JSON_ON_WORKER - 11)));
        assert!(serialized_past_worker_bound(&text(JSON_ON_WORKER - 10)));
    }

    #[test]
    fn a_message_shape_is_found_without_parsing() {
        let request =
            message_shape(br#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"id":9}}"#);
        assert_eq!(request.request_id(), Some("5"));
        let late =
            message_shape(br#"{"params":{"id":9,"x":"\"id\":3"},"method":"m","id":"req-1"}"#);
        assert_eq!(late.request_id(), Some("\"req-1\""));
        let answer = message_shape(br#"{"jsonrpc":"2.0","id":5,"result":{}}"#);
        assert_eq!(answer.id.as_deref(), Some("5"));
        assert_eq!(answer.request_id(), None, "an answer is not answered");
        assert!(!answer.is_notification());
        let notification = message_shape(br#"{"method":"notifications/x"}"#);
        assert!(notification.is_notification());
        assert_eq!(notification.request_id(), None);
        assert_eq!(
            message_shape(br#"[{"id":1,"method":"m"}]"#).request_id(),
            None
        );
        // A string id of 256 bytes, the longest a request's may be, is found, escaped too.
        let long = format!(r#"{{"id":"{}","method":"m"}}"#, "\\u0069".repeat(256));
        assert!(message_shape(long.as_bytes()).request_id().is_some());
        // One longer is not kept (the scanner holds at most that much), yet is a request.
        let longer = format!(r#"{{"id":"{}","method":"m"}}"#, "\\u0069".repeat(257));
        let shape = message_shape(longer.as_bytes());
        assert_eq!(shape.request_id(), None);
        assert!(!shape.is_notification());
        // A request whose id cannot be given back is still not a notification.
        for odd in [
            r#"{"id":null,"method":"m"}"#,
            r#"{"method":"m","id":{"a":1}}"#,
        ] {
            let shape = message_shape(odd.as_bytes());
            assert_eq!(shape.request_id(), None, "{odd}");
            assert!(!shape.is_notification(), "{odd}");
        }
    }

    #[tokio::test]
    async fn a_long_message_is_given_back_and_made_off_the_worker() {
        let short = json!({"text": "a".repeat(JSON_ON_WORKER - 20)});
        let made = line_on_worker(&short).unwrap().unwrap();
        assert_eq!(made.len(), JSON_ON_WORKER - 20 + 12);
        assert_eq!(made.last(), Some(&b'\n'));
        let long = json!({"text": "a".repeat(JSON_ON_WORKER)});
        let given_back = line_on_worker(long.clone()).unwrap().unwrap_err();
        assert_eq!(given_back, long);
        let made = line_off_worker(long.clone()).await.unwrap();
        let mut want = serde_json::to_vec(&long).unwrap();
        want.push(b'\n');
        assert_eq!(made, want);
        // Not serializable at all: an error, whatever its size.
        let bad: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(line_on_worker(&bad).is_err());
        assert!(line_off_worker(bad).await.is_err());
    }
}
