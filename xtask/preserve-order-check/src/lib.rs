//! psych-types built with serde_json's `preserve_order` on: the JSON text view of a tool
//! result (`render_json`, `ToolOutput::readable_text`) and the canonical compact writer give
//! the bytes of the sorted-key form, exactly as in the workspace's own build, where maps are
//! sorted. Run by `cargo xtask ci` with its own target folder.

#[cfg(test)]
mod tests {
    use psych_types::{ToolOutput, json, render_json};
    use serde_json::{Map, Value};

    /// `value` with every object rebuilt in sorted key order: under `preserve_order`,
    /// serde_json then writes it sorted, which makes serde_json itself the reference.
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&map[k]))).collect())
            }
            other => other.clone(),
        }
    }

    /// A small deterministic generator of JSON values with unsorted keys.
    fn generate(seed: &mut u64, depth: u32) -> Value {
        *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let pick = (*seed >> 33) % if depth == 0 { 5 } else { 7 };
        match pick {
            0 => Value::Null,
            1 => Value::from(*seed % 3 == 0),
            2 => Value::from((*seed >> 7) as i64 % 100_000 - 50_000),
            3 => Value::from(((*seed >> 11) as f64) / 7.0e6),
            4 => Value::from(format!("s{}\n\"é\u{1}", *seed % 97)),
            5 => Value::Array((0..(*seed % 4)).map(|_| generate(seed, depth - 1)).collect()),
            _ => {
                let mut map = Map::new();
                for i in 0..(*seed % 5) {
                    // Inserted in descending order: unsorted under preserve_order.
                    let key = format!("k{}", 9 - i);
                    map.insert(key, generate(seed, depth - 1));
                }
                Value::Object(map)
            }
        }
    }

    #[test]
    fn preserve_order_is_really_on_here() {
        let value: Value = serde_json::from_str(r#"{"b":1,"a":[true]}"#).unwrap();
        assert_eq!(serde_json::to_string(&value).unwrap(), r#"{"b":1,"a":[true]}"#);
    }

    #[test]
    fn the_text_view_is_the_sorted_form() {
        let value: Value = serde_json::from_str(r#"{"b":1,"a":[true]}"#).unwrap();
        let expected = "{\n  \"a\": [\n    true\n  ],\n  \"b\": 1\n}";
        assert_eq!(render_json(&value), expected);
        let output = ToolOutput::json(value.clone());
        assert_eq!(output.readable_text(), expected);
        assert_eq!(&*psych_types::readable_bytes(&output), expected.as_bytes());
        assert_eq!(json::to_compact(&value), r#"{"a":[true],"b":1}"#);
    }

    #[test]
    fn generated_values_render_as_their_sorted_form() {
        let mut seed = 7;
        for _ in 0..2_000 {
            let value = generate(&mut seed, 4);
            let reference = sorted(&value);
            assert_eq!(json::to_compact(&value), serde_json::to_string(&reference).unwrap());
            assert_eq!(render_json(&value), serde_json::to_string_pretty(&reference).unwrap());
        }
    }
}
