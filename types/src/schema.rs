//! What makes a tool's `inputSchema` usable: the one definition the MCP listing (which sets
//! an unusable tool aside) and disclosure (which never exposes or forwards one) share, so a
//! tool a client is shown is a tool the guard lets through.
//!
//! Providers take a tool's parameters as an object schema (Anthropic's `input_schema`,
//! OpenAI's `parameters`), and a call's arguments are always a JSON object, so a schema is
//! usable when:
//!
//! - its `type`, when present, is `"object"` (a `{"type":"string"}` schema could accept no
//!   call's arguments at all, and providers refuse the request that carries it);
//! - its `properties`, when present, is an object whose every value is a schema (an object
//!   or a boolean), not a list of names;
//! - its `required`, when present, is a list of strings.
//!
//! An absent `type` is accepted: the arguments are checked to be an object anyway, and a
//! schema that declares nothing else (`{}`) takes any object. Whether the rest of the
//! schema compiles is not asked here: a schema that does not compile (a `$ref` to another
//! document) leaves its tool usable, its calls forwarded unchecked (disclosure's
//! `Validation::Unchecked`).

use serde_json::Value;

use crate::{JsonObject, ToolDefinition};

/// Why a tool's input schema cannot be used: the provider would refuse the tool, or no
/// call's arguments could ever match it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InputSchemaError {
    /// `type` is something other than `"object"` (another type name, a list of types, not
    /// a string at all).
    #[error("inputSchema has type {found}, not \"object\"")]
    NotAnObjectType {
        /// What `type` holds, as JSON.
        found: String,
    },
    /// `properties` is not an object (a list of names, say).
    #[error("inputSchema's \"properties\" is {found}, not an object of schemas")]
    PropertiesNotAnObject {
        /// What kind of JSON value it is (`an array`, `a string`…).
        found: &'static str,
    },
    /// One property's schema is neither an object nor a boolean.
    #[error("inputSchema's property {name:?} is {found}, not a schema")]
    PropertyNotASchema {
        /// The property.
        name: String,
        /// What kind of JSON value its schema is.
        found: &'static str,
    },
    /// `required` is not a list of strings.
    #[error("inputSchema's \"required\" is not a list of property names")]
    RequiredNotNames,
}

/// Checks that `schema` is a usable input schema: its `type`, when present, is `"object"`;
/// its `properties`, when present, an object of schemas (objects or booleans); its
/// `required`, when present, a list of strings. An absent `type` is accepted, and whether
/// the rest compiles is not asked (a tool whose schema does not compile stays usable,
/// its calls forwarded unchecked).
///
/// # Errors
///
/// The first [`InputSchemaError`] found.
pub fn check_input_schema(schema: &JsonObject) -> Result<(), InputSchemaError> {
    match schema.get("type") {
        None => {}
        Some(Value::String(kind)) if kind == "object" => {}
        Some(other) => {
            return Err(InputSchemaError::NotAnObjectType {
                found: other.to_string(),
            });
        }
    }
    match schema.get("properties") {
        None => {}
        Some(Value::Object(properties)) => {
            if let Some((name, bad)) = properties
                .iter()
                .find(|(_, schema)| !matches!(schema, Value::Object(_) | Value::Bool(_)))
            {
                return Err(InputSchemaError::PropertyNotASchema {
                    name: name.clone(),
                    found: json_kind(bad),
                });
            }
        }
        Some(other) => {
            return Err(InputSchemaError::PropertiesNotAnObject {
                found: json_kind(other),
            });
        }
    }
    match schema.get("required") {
        None => Ok(()),
        Some(Value::Array(names)) if names.iter().all(Value::is_string) => Ok(()),
        Some(_) => Err(InputSchemaError::RequiredNotNames),
    }
}

impl ToolDefinition {
    /// Whether this tool's input schema is usable ([`check_input_schema`]).
    ///
    /// # Errors
    ///
    /// The first [`InputSchemaError`] found.
    pub fn check_input_schema(&self) -> Result<(), InputSchemaError> {
        check_input_schema(&self.input_schema)
    }
}

/// What kind of JSON value `value` is, with its article, for messages: `"an object"`,
/// `"a string"`, `"null"`.
pub fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `value` as a whole number of 0 or more, as JSON Schema's `integer` reads it: `2` and
/// `2.0` alike (a number whose fractional part is zero is an integer), `None` for a
/// fraction, a negative number, one past `u64::MAX`, or another type. The tools' own
/// argument checks read `integer` properties with it, so that what their schemas admit
/// they take.
///
/// ```
/// use psych_types::json_whole;
/// use serde_json::json;
/// assert_eq!(json_whole(&json!(2)), Some(2));
/// assert_eq!(json_whole(&json!(2.0)), Some(2));
/// assert_eq!(json_whole(&json!(2.5)), None);
/// assert_eq!(json_whole(&json!(-1)), None);
/// assert_eq!(json_whole(&json!("2")), None);
/// ```
pub fn json_whole(value: &Value) -> Option<u64> {
    let number = value.as_number()?;
    if let Some(whole) = number.as_u64() {
        return Some(whole);
    }
    // 2^64 as a float: every whole float below it converts exactly.
    const PAST_U64: f64 = 18_446_744_073_709_551_616.0;
    let float = number.as_f64()?;
    let whole = float.fract() == 0.0 && (0.0..PAST_U64).contains(&float);
    // A whole, non-negative float below 2^64 converts without loss (`as` saturates, so
    // the value of any other is never used and never undefined).
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "used only when whole, non-negative and below 2^64"
    )]
    let converted = float as u64;
    whole.then_some(converted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn whole_numbers_as_json_schema_reads_integers() {
        for (value, whole) in [
            (json!(0), Some(0)),
            (json!(7), Some(7)),
            (json!(7.0), Some(7)),
            (json!(-0.0), Some(0)),
            (json!(u64::MAX), Some(u64::MAX)),
            (json!(1e300), None),
            (json!(7.5), None),
            (json!(-3), None),
            (json!(-3.0), None),
            (json!(null), None),
            (json!(true), None),
        ] {
            assert_eq!(json_whole(&value), whole, "{value}");
        }
    }

    fn check(schema: Value) -> Result<(), String> {
        let Value::Object(schema) = schema else {
            panic!("an object")
        };
        check_input_schema(&schema).map_err(|e| e.to_string())
    }

    #[test]
    fn object_schemas_are_usable() {
        assert_eq!(check(json!({})), Ok(()));
        assert_eq!(check(json!({"type": "object"})), Ok(()));
        assert_eq!(
            check(
                json!({"type": "object", "properties": {"a": {"type": "string"}, "b": true},
                         "required": ["a"], "$ref": "https://example.com/s.json"})
            ),
            Ok(())
        );
    }

    #[test]
    fn schemas_no_provider_takes_are_named() {
        assert_eq!(
            check(json!({"type": "string"})),
            Err(r#"inputSchema has type "string", not "object""#.into())
        );
        assert_eq!(
            check(json!({"type": ["object", "null"]})),
            Err(r#"inputSchema has type ["object","null"], not "object""#.into())
        );
        assert_eq!(
            check(json!({"type": "object", "properties": ["path", "mode"]})),
            Err(r#"inputSchema's "properties" is an array, not an object of schemas"#.into())
        );
        assert_eq!(
            check(json!({"type": "object", "properties": {"path": "string"}})),
            Err(r#"inputSchema's property "path" is a string, not a schema"#.into())
        );
        assert_eq!(
            check(json!({"type": "object", "required": "path"})),
            Err(r#"inputSchema's "required" is not a list of property names"#.into())
        );
    }
}
