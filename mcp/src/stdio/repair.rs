//! A second reading of a line serde_json refused, for two faults real servers commit: bytes
//! that are not UTF-8 inside a string, and lone surrogate escapes (`"\ud83d"`, which
//! Python's `json.dumps` and JavaScript's `JSON.stringify` write for a string cut inside an
//! emoji). Both are replaced by U+FFFD, and the fact is said in words, for
//! [`LOSSY_META_KEY`]. Run only after a first parse failed: the common path costs nothing.

use serde_json::Value;

use crate::spill::Lossy;

/// The key, in the `_meta` of a result psych-mcp had to repair, that says what was replaced
/// (e.g. `"invalid UTF-8 replaced by U+FFFD at 2 places"`). Namespaced `psych/` as MCP's
/// `_meta` naming rules ask.
pub(crate) const LOSSY_META_KEY: &str = "psych/lossy";

/// The line read again with invalid UTF-8 and lone surrogate escapes replaced, and what was
/// replaced; `None` if there was nothing to replace or the line still does not parse.
pub(crate) fn repair(line: &[u8]) -> Option<(Value, String)> {
    let (value, lossy) = repair_counted(line)?;
    Some((value, lossy.note()?))
}

/// [`repair`], saying what was replaced in counts (the spilled path adds those of the texts
/// it decoded into files).
pub(crate) fn repair_counted(line: &[u8]) -> Option<(Value, Lossy)> {
    let mut lossy = Lossy::default();
    let mut text = match std::str::from_utf8(line) {
        Ok(text) => text.to_owned(),
        Err(_) => {
            let mut text = String::with_capacity(line.len() + 16);
            for chunk in line.utf8_chunks() {
                text.push_str(chunk.valid());
                if !chunk.invalid().is_empty() {
                    text.push(char::REPLACEMENT_CHARACTER);
                    lossy.invalid_utf8 += 1;
                }
            }
            text
        }
    };
    lossy.lone_surrogates = replace_lone_surrogates(&mut text);
    lossy.note()?;
    let value = serde_json::from_str(&text).ok()?;
    Some((value, lossy))
}

/// `bytes` parsed as JSON, or, if that fails, [repaired](repair) with the note
/// [recorded](record) in it; says whether it was repaired. Serde's error when even the
/// repair does not parse.
pub(crate) fn parse_or_repair(bytes: &[u8]) -> Result<(Value, bool), serde_json::Error> {
    match serde_json::from_slice(bytes) {
        Ok(value) => Ok((value, false)),
        Err(error) => match repair(bytes) {
            Some((mut value, note)) => {
                record(&mut value, &note);
                Ok((value, true))
            }
            None => Err(error),
        },
    }
}

/// Puts a note in `message`'s `result._meta` under [`LOSSY_META_KEY`] (when the result is
/// an object whose `_meta`, if any, is one).
pub(crate) fn record(message: &mut Value, note: &str) {
    let Some(result) = message.get_mut("result").and_then(Value::as_object_mut) else {
        return;
    };
    let meta = result
        .entry("_meta")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if let Some(meta) = meta.as_object_mut() {
        meta.insert(LOSSY_META_KEY.to_owned(), Value::String(note.to_owned()));
    }
}

/// A `\uXXXX` escape's code unit at `at` (the backslash), if `text` has one there.
fn escape_at(text: &[u8], at: usize) -> Option<u16> {
    let hex = text.get(at..at + 6)?;
    if hex[0] != b'\\' || hex[1] != b'u' {
        return None;
    }
    let hex = std::str::from_utf8(&hex[2..]).ok()?;
    u16::from_str_radix(hex, 16).ok()
}

/// Replaces every `\uD800`–`\uDFFF` escape that is not half of a pair by `\ufffd` (the same
/// length, so in place); returns how many.
fn replace_lone_surrogates(text: &mut String) -> usize {
    let lead = |unit: u16| (0xD800..0xDC00).contains(&unit);
    let trail = |unit: u16| (0xDC00..0xE000).contains(&unit);
    let mut lone = Vec::new();
    {
        let bytes = text.as_bytes();
        let mut i = 0;
        while let Some(found) = memchr::memchr(b'\\', &bytes[i..]) {
            let at = i + found;
            match escape_at(bytes, at) {
                Some(unit) if lead(unit) => match escape_at(bytes, at + 6) {
                    Some(next) if trail(next) => i = at + 12,
                    _ => {
                        lone.push(at);
                        i = at + 6;
                    }
                },
                Some(unit) if trail(unit) => {
                    lone.push(at);
                    i = at + 6;
                }
                Some(_) => i = at + 6,
                // `\\`, `\"`, …: the escaped character is never the start of an escape.
                None => i = at + 2,
            }
            if i >= bytes.len() {
                break;
            }
        }
    }
    for &at in &lone {
        text.replace_range(at..at + 6, "\\ufffd");
    }
    lone.len()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test fails loudly on bad data")]

    use serde_json::json;

    use super::*;

    #[test]
    fn invalid_utf8_is_replaced_and_counted() {
        let line = b"{\"id\":1,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"caf\xC3 \xFF\xFEok\"}]}}";
        assert!(serde_json::from_slice::<Value>(line).is_err());
        let (value, note) = repair(line).unwrap();
        assert_eq!(
            value["result"]["content"][0]["text"],
            "caf\u{FFFD} \u{FFFD}\u{FFFD}ok"
        );
        assert_eq!(note, "invalid UTF-8 replaced by U+FFFD at 3 places");
    }

    #[test]
    fn lone_surrogates_are_replaced_and_pairs_and_escaped_backslashes_kept() {
        let line = br#"{"a":"cut \ud83d","b":"\ud83d\ude00","c":"\\ud800","d":"\udc00\ud800x","e":"\\\ud800"}"#;
        assert!(serde_json::from_slice::<Value>(line).is_err());
        let (value, note) = repair(line).unwrap();
        assert_eq!(
            value,
            json!({"a": "cut \u{FFFD}", "b": "\u{1F600}", "c": "\\ud800",
                   "d": "\u{FFFD}\u{FFFD}x", "e": "\\\u{FFFD}"})
        );
        assert_eq!(
            note,
            "lone surrogate escapes replaced by U+FFFD at 4 places"
        );
    }

    #[test]
    fn a_line_with_nothing_to_repair_or_still_broken_is_left() {
        assert!(repair(br#"{"id":1,"result":{"text":"cut here"#).is_none());
        assert!(repair(br#"{"id":1,"result":{}}"#).is_none());
        assert!(repair(b"{\"id\":1,\"result\":\xFF}").is_none());
    }

    #[test]
    fn the_note_goes_in_the_results_meta() {
        let mut message = json!({"id": 1, "result": {"content": [], "_meta": {"k": 1}}});
        record(&mut message, "n");
        assert_eq!(
            message["result"]["_meta"],
            json!({"k": 1, "psych/lossy": "n"})
        );
        let mut bare = json!({"id": 1, "result": {"content": []}});
        record(&mut bare, "n");
        assert_eq!(bare["result"]["_meta"], json!({"psych/lossy": "n"}));
    }
}
