//! The workspace's canonical JSON writer: compact or pretty, object keys in sorted byte
//! order, the same bytes in every build.
//!
//! serde_json writes a map in the map's own order, which is sorted only while no crate in the
//! build turns on serde_json's `preserve_order` feature (and one often does, through some
//! other dependency). These functions sort keys themselves, escape strings exactly as
//! serde_json does and print numbers with serde_json's own `Number` formatting (itoa for
//! integers, the shortest round-tripping form for floats), so the same value gives the same
//! bytes whatever map type serde_json was built with. Everything the workspace shows a model
//! or stores as text (the JSON text view of a tool result, rendered requests) goes through
//! here.

use serde_json::{Map, Value};

/// `value` as canonical compact JSON: equal to `serde_json::to_string` of the same value
/// with every object's keys in sorted byte order.
pub fn to_compact(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

/// `value` as canonical pretty JSON: two-space indent, one member or element a line, `": "`
/// after keys, empty objects and arrays as `{}` and `[]`, keys in sorted byte order. Equal to
/// `serde_json::to_string_pretty` of the same value with sorted keys.
pub fn to_pretty(value: &Value) -> String {
    indent(&to_compact(value))
}

/// Appends `text` as a JSON string literal (with quotes), escaped as serde_json does.
pub fn write_str(out: &mut String, text: &str) {
    out.push('"');
    write_str_body(out, text);
    out.push('"');
}

/// How each byte is written inside a JSON string: 0 as is, `u` as `\u00XX`, any other
/// value as a backslash and that character (the table serde_json uses).
const ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        table[i] = b'u';
        i += 1;
    }
    table[0x08] = b'b';
    table[0x09] = b't';
    table[0x0a] = b'n';
    table[0x0c] = b'f';
    table[0x0d] = b'r';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// Appends the escaped body of a JSON string literal, without quotes.
pub fn write_str_body(out: &mut String, text: &str) {
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let escape = ESCAPE[usize::from(bytes[i])];
        if escape == 0 {
            i += 1;
            continue;
        }
        // Every escaped byte is ASCII, so `start` and `i` are char boundaries.
        if start < i {
            out.push_str(&text[start..i]);
        }
        if escape == b'u' {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(char::from(HEX[usize::from(bytes[i] >> 4)]));
            out.push(char::from(HEX[usize::from(bytes[i] & 0xf)]));
        } else {
            out.push('\\');
            out.push(char::from(escape));
        }
        i += 1;
        start = i;
    }
    if start < bytes.len() {
        out.push_str(&text[start..]);
    }
}

/// Appends `value` as canonical compact JSON.
pub fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => {
            use std::fmt::Write as _;
            // Writing to a `String` cannot fail.
            let _ = write!(out, "{number}");
        }
        Value::String(text) => write_str(out, text),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => write_object(out, map),
    }
}

/// Appends `map` as a canonical compact JSON object (keys in sorted byte order).
pub fn write_object(out: &mut String, map: &Map<String, Value>) {
    out.push('{');
    let sorted = map
        .keys()
        .zip(map.keys().skip(1))
        .all(|(a, b)| a.as_bytes() < b.as_bytes());
    if sorted {
        write_members(out, map.iter());
    } else {
        let mut members: Vec<(&String, &Value)> = map.iter().collect();
        members.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        write_members(out, members.into_iter());
    }
    out.push('}');
}

fn write_members<'v>(out: &mut String, members: impl Iterator<Item = (&'v String, &'v Value)>) {
    for (i, (key, value)) in members.enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_str(out, key);
        out.push(':');
        write_value(out, value);
    }
}

/// Indents compact JSON (no white space outside strings) two spaces a level, one member or
/// element a line, without reordering or re-encoding anything; empty objects and arrays stay
/// `{}` and `[]`.
pub fn indent(json: &str) -> String {
    let mut out = String::with_capacity(json.len() * 2);
    let mut depth = 0usize;
    let (mut in_string, mut escaped) = (false, false);
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    };
    let mut chars = json.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                out.push(c);
                match chars.next_if(|next| matches!(next, '}' | ']')) {
                    Some(close) => out.push(close),
                    None => {
                        depth += 1;
                        newline(&mut out, depth);
                    }
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            _ => out.push(c),
        }
    }
    out
}

/// The deepest nesting of arrays and objects serde_json parses: its recursion limit (128)
/// less one. JSON nested deeper is refused when it is read, whatever wrote it, so a store
/// checks what it encodes against this ([`depth`]) before it acknowledges a record: a record
/// it kept and could not read back would be lost, and would stop every read of its Run's
/// history.
pub const MAX_DEPTH: usize = 127;

/// How deeply the arrays and objects of `json`, a JSON text, nest (`1` for `[1]` or `{}`,
/// `0` for a scalar). Brackets inside strings are skipped, escapes included. Not a
/// validator: the answer is meant for JSON a serializer wrote. One pass, no allocation.
pub fn depth(json: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in json {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// `json`'s [`depth`] when it is past [`MAX_DEPTH`] (JSON serde_json would refuse to read
/// back), `None` when it reads back: the check a store makes of what it encodes before it
/// acknowledges a record.
pub fn past_max_depth(json: &[u8]) -> Option<usize> {
    Some(depth(json)).filter(|&depth| depth > MAX_DEPTH)
}

/// Whether `value`'s arrays and objects nest deeper than `max` (as [`depth`] counts them in
/// its JSON text), found without writing it: a walk that stops at the first value past
/// `max` and visits no value below it.
pub fn nests_deeper(value: &Value, max: usize) -> bool {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 0)];
    while let Some((value, above)) = stack.pop() {
        let level = above + 1;
        match value {
            Value::Array(_) | Value::Object(_) if level > max => return true,
            Value::Array(items) => stack.extend(items.iter().map(|item| (item, level))),
            Value::Object(map) => stack.extend(map.values().map(|item| (item, level))),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn escapes_like_serde_json() {
        let text = "a\"b\\c\n\r\t\u{8}\u{c}\u{1}\u{1f}\u{7f}é😀/";
        let mut out = String::new();
        write_str(&mut out, text);
        assert_eq!(out, serde_json::to_string(text).unwrap());
    }

    #[test]
    fn numbers_print_like_serde_json() {
        for value in [
            serde_json::json!(0),
            serde_json::json!(-17),
            serde_json::json!(u64::MAX),
            serde_json::json!(1.5),
            serde_json::json!(1e300),
            serde_json::json!(-0.000001),
        ] {
            assert_eq!(to_compact(&value), serde_json::to_string(&value).unwrap());
        }
    }

    #[test]
    fn keys_are_sorted_whatever_the_map_order() {
        // The map iterates unsorted only when preserve_order is on; either way the output
        // is sorted.
        let mut map = Map::new();
        map.insert("b".into(), Value::from(1));
        map.insert("a".into(), Value::from(2));
        map.insert("B".into(), Value::from(3));
        let value = Value::Object(map);
        assert_eq!(to_compact(&value), r#"{"B":3,"a":2,"b":1}"#);
        assert_eq!(
            to_pretty(&value),
            "{\n  \"B\": 3,\n  \"a\": 2,\n  \"b\": 1\n}"
        );
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            ".{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 40, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((".{0,6}", inner), 0..6)
                    .prop_map(|pairs| Value::Object(pairs.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        // In this build serde_json's maps are sorted (tidy refuses preserve_order), so
        // serde_json itself is the reference; the build with preserve_order on is checked by
        // `cargo xtask canonical-json` (see xtask).
        #[test]
        fn equals_serde_json_with_sorted_maps(value in arb_json()) {
            prop_assert_eq!(to_compact(&value), serde_json::to_string(&value).unwrap());
            prop_assert_eq!(to_pretty(&value), serde_json::to_string_pretty(&value).unwrap());
        }

        #[test]
        fn indent_only_adds_white_space_outside_strings(value in arb_json()) {
            let compact = to_compact(&value);
            let indented = indent(&compact);
            let back: Value = serde_json::from_str(&indented).unwrap();
            prop_assert_eq!(&back, &value);
            let strip = |text: &str| -> String {
                text.chars().filter(|c| !c.is_whitespace()).collect()
            };
            prop_assert_eq!(strip(&indented), strip(&compact));
        }
    }

    #[test]
    fn depth_counts_brackets_outside_strings() {
        assert_eq!(depth(b"1"), 0);
        assert_eq!(depth(b"{}"), 1);
        assert_eq!(depth(br#"[{"a":[1,{"b":[]}]},[]]"#), 5);
        assert_eq!(depth(br#"{"k":"[[{{\"\\"}"#), 1);
        assert_eq!(depth(br#"["\\",["#), 2);
    }

    #[test]
    fn nests_deeper_agrees_with_the_depth_of_the_text() {
        for text in [
            r#"1"#,
            r#"{}"#,
            r#"[{"a":[1,{"b":[]}]},[]]"#,
            r#"{"k":"[[{{"}"#,
        ] {
            let value: Value = serde_json::from_str(text).unwrap();
            let deep = depth(text.as_bytes());
            assert!(!nests_deeper(&value, deep), "{text}");
            if deep > 0 {
                assert!(nests_deeper(&value, deep - 1), "{text}");
            }
        }
    }

    #[test]
    fn max_depth_is_what_serde_json_reads_back() {
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        let at = nested(MAX_DEPTH);
        assert_eq!(depth(at.as_bytes()), MAX_DEPTH);
        assert!(serde_json::from_str::<Value>(&at).is_ok());
        let past = nested(MAX_DEPTH + 1);
        assert!(serde_json::from_str::<Value>(&past).is_err());
        assert_eq!(past_max_depth(at.as_bytes()), None);
        assert_eq!(past_max_depth(past.as_bytes()), Some(MAX_DEPTH + 1));
    }
}
