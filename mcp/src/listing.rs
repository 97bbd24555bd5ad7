//! Reading `tools/list` pages raw and validating each tool on its own.
//!
//! rmcp 3.11 fails a whole page (`Unexpected response type`) when one tool lacks an
//! `inputSchema`, and checks no names at all. Here a page is read as plain JSON and each
//! tool is validated into a [`ToolDefinition`] by itself: a malformed tool is reported by
//! name and the good tools around it are kept. A tool whose `inputSchema` is not an object
//! schema a provider takes (`{"type":"string"}`, `properties` as a list) is malformed too,
//! by psych-types' [`check_input_schema`](psych_types::check_input_schema), the rule
//! disclosure holds its calls to.

use std::collections::HashSet;
use std::fmt;

use psych_types::ToolDefinition;
use serde_json::Value;

/// The most one server's listing may hold, all its pages together, by default: 64 MiB
/// (the largest real catalogues are a few MB; one page may be as large as a whole line,
/// `64 MiB`, too). Set per manager by
/// [`McpManagerBuilder::max_listing_bytes`](crate::McpManagerBuilder::max_listing_bytes).
/// Counted tool by tool as each page is read, as what its tools cost in memory, roughly:
/// their compact JSON, [`NODE_COST`] more for each object and array in them and
/// [`ENTRY_COST`] for each element or member, and [`MALFORMED_COST`] more for each tool
/// set aside (its name and reason counted too), and its cursor; a listing past it ends at
/// the tool that passed it with
/// [`McpError::ListingTooLarge`](crate::McpError::ListingTooLarge) instead of growing
/// until its deadline. What the listing holds is then within a small multiple of this
/// (the page being read, parsed whole by the transport, is bounded by the line's limit).
pub const DEFAULT_MAX_LISTING_BYTES: u64 = 64 * 1024 * 1024;

/// What an object or array of a listed tool costs beyond its JSON (a map or vector and
/// its allocation), in a listing's count: 64 bytes.
pub const NODE_COST: u64 = 64;

/// What an element of an array or a member of an object of a listed tool costs beyond its
/// JSON (its slot, a map entry), in a listing's count: 32 bytes.
pub const ENTRY_COST: u64 = 32;

/// What a tool set aside as malformed costs beyond its name and reason (its record in
/// [`Listing::malformed`]), in a listing's count: 128 bytes. A page of `[0, 0, …]` is
/// charged this per tool, not the two bytes it took to send.
pub const MALFORMED_COST: u64 = 128;

/// The most `tools/list` pages one listing follows: 10,000 (a 3,000-tool server at five
/// tools a page takes 600). Past it the listing ends with
/// [`ListingBound::Pages`].
pub const MAX_LISTING_PAGES: usize = 10_000;

/// The longest `nextCursor` followed, in bytes: 4 KiB. Cursors are opaque but short (an
/// offset, a key, a token of some tens of bytes); a longer one ends the listing with
/// [`ListingBound::Cursor`], so that no error message or request quotes a huge one.
pub const MAX_CURSOR_BYTES: usize = 4096;

/// Which bound a listing went past ([`McpError::ListingTooLarge`](crate::McpError::ListingTooLarge)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListingBound {
    /// Its pages cost more than the manager's listing limit
    /// ([`DEFAULT_MAX_LISTING_BYTES`] says how they are counted).
    Bytes {
        /// The cost counted so far, to the tool that passed the limit.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// It went on past [`MAX_LISTING_PAGES`].
    Pages {
        /// The limit.
        limit: usize,
    },
    /// A page's `nextCursor` was longer than [`MAX_CURSOR_BYTES`].
    Cursor {
        /// The cursor's length in bytes.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

impl fmt::Display for ListingBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bytes { bytes, limit } => write!(
                f,
                "the listing holds about {bytes} bytes, over its limit of {limit}"
            ),
            Self::Pages { limit } => write!(f, "the listing goes on past {limit} pages"),
            Self::Cursor { bytes, limit } => write!(
                f,
                "its nextCursor is {bytes} bytes long, over the limit of {limit}"
            ),
        }
    }
}

/// What `value` costs in a listing's count: its compact JSON length, [`NODE_COST`] for each object
/// and array in it and [`ENTRY_COST`] for each of their elements and members. Walks the
/// value once, allocating nothing.
pub(crate) fn cost(value: &Value) -> u64 {
    measure(value, NODE_COST, ENTRY_COST)
}

/// The length of `value` as compact JSON, counting each string's bytes unescaped (so at
/// most the length serde_json writes). Walks the value once, allocating nothing.
#[cfg(test)]
pub(crate) fn json_len(value: &Value) -> u64 {
    measure(value, 0, 0)
}

/// `value`'s compact JSON length, plus `node` for each object and array and `entry` for
/// each of their elements and members.
fn measure(value: &Value, node: u64, entry: u64) -> u64 {
    fn string(text: &str) -> u64 {
        text.len() as u64 + 2
    }
    match value {
        Value::Null => 4,
        Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        // A number's digits are not counted exactly: at least one.
        Value::Number(_) => 1,
        Value::String(text) => string(text),
        Value::Array(items) => {
            let n = items.len() as u64;
            let inner: u64 = items.iter().map(|v| measure(v, node, entry)).sum();
            2 + n.saturating_sub(1) + node + entry * n + inner
        }
        Value::Object(members) => {
            let n = members.len() as u64;
            let inner: u64 = members
                .iter()
                .map(|(key, v)| string(key) + 1 + measure(v, node, entry))
                .sum();
            2 + n.saturating_sub(1) + node + entry * n + inner
        }
    }
}

/// Every tool of one server, read to the last page.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Listing {
    /// The valid tools, in the server's order.
    pub tools: Vec<ToolDefinition>,
    /// The tools that were refused, with the reason for each.
    pub malformed: Vec<MalformedTool>,
}

/// A tool a server declared that cannot be used as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedTool {
    /// Its `name` as sent, or `#N` (its position on the page) when it has no string name.
    pub name: String,
    /// The page it was on, from 1.
    pub page: usize,
    /// What is wrong with it.
    pub reason: String,
}

/// One page after validation.
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) next_cursor: Option<String>,
    /// What the page's tools and cursor cost ([`cost`], and [`MALFORMED_COST`] with the
    /// name and reason of each tool set aside), what the listing's limit counts.
    pub(crate) bytes: u64,
}

/// Validates one raw `tools/list` result into `listing`; `seen` holds the names of the
/// listing so far, to refuse duplicates. Stops at the tool whose cost passes `left` (the
/// page's cost then says so). `Err` is for a page that is not a listing at all.
pub(crate) fn read_page(
    raw: Value,
    page: usize,
    seen: &mut HashSet<String>,
    listing: &mut Listing,
    left: u64,
) -> Result<Page, String> {
    let Value::Object(mut result) = raw else {
        return Err(format!(
            "page {page} is not a JSON object but {}",
            psych_types::json_kind(&raw)
        ));
    };
    let mut bytes = 0;
    let next_cursor = match result.remove("nextCursor") {
        None | Some(Value::Null) => None,
        Some(Value::String(cursor)) => {
            bytes += cursor.len() as u64 + 2;
            Some(cursor)
        }
        Some(other) => {
            return Err(format!(
                "page {page}: nextCursor is {}, not a string",
                psych_types::json_kind(&other)
            ));
        }
    };
    let tools = match result.remove("tools") {
        Some(Value::Array(tools)) => tools,
        Some(other) => {
            return Err(format!(
                "page {page}: \"tools\" is {}, not an array",
                psych_types::json_kind(&other)
            ));
        }
        None => return Err(format!("page {page} has no \"tools\" array")),
    };
    // The records of tools set aside, counted as they are made.
    let record = |m: &MalformedTool| MALFORMED_COST + m.name.len() as u64 + m.reason.len() as u64;
    let mut counted = listing.malformed.len();
    for (i, tool) in tools.into_iter().enumerate() {
        bytes += listing.malformed[counted..].iter().map(record).sum::<u64>();
        counted = listing.malformed.len();
        bytes += cost(&tool) + 1;
        if bytes > left {
            break;
        }
        let name = match tool.get("name") {
            Some(Value::String(name)) => name.clone(),
            _ => format!("#{}", i + 1),
        };
        let refuse = |reason: String| MalformedTool {
            name: name.clone(),
            page,
            reason,
        };
        if !tool.is_object() {
            listing.malformed.push(refuse(format!(
                "is {}, not an object",
                psych_types::json_kind(&tool)
            )));
            continue;
        }
        match serde_json::from_value::<ToolDefinition>(tool) {
            Ok(definition) => {
                // Listed to a client, a tool no provider takes (or whose arguments nothing
                // could match) would be refused at every call: set it aside instead, by
                // the same rule disclosure's guard holds.
                if let Err(unusable) = definition.check_input_schema() {
                    listing.malformed.push(refuse(unusable.to_string()));
                } else if seen.insert(definition.name.as_str().to_owned()) {
                    listing.tools.push(definition);
                } else {
                    listing.malformed.push(refuse(
                        "duplicate name: an earlier tool of this server has it".into(),
                    ));
                }
            }
            Err(error) => listing.malformed.push(refuse(error.to_string())),
        }
    }
    bytes += listing.malformed[counted..].iter().map(record).sum::<u64>();
    Ok(Page { next_cursor, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(raw: Value) -> (Listing, Result<Page, String>) {
        let mut listing = Listing::default();
        let page = read_page(raw, 1, &mut HashSet::new(), &mut listing, u64::MAX);
        (listing, page)
    }

    #[test]
    fn a_malformed_tool_is_reported_by_name_and_the_rest_kept() {
        let (listing, page) = read(json!({
            "tools": [
                {"name": "good", "inputSchema": {"type": "object"}, "x-vendor": 1},
                {"name": "no_schema"},
                {"name": "list schema", "inputSchema": []},
                {"name": "bad name", "inputSchema": {"type": "object"}},
                {"inputSchema": {"type": "object"}},
                "not a tool",
                {"name": "good", "inputSchema": {"type": "object"}},
                {"name": "string_schema", "inputSchema": {"type": "string"}},
                {"name": "listed_properties", "inputSchema": {"type": "object", "properties": ["path"]}},
            ],
            "nextCursor": "c2",
        }));
        assert_eq!(page.unwrap().next_cursor.as_deref(), Some("c2"));
        let names: Vec<_> = listing.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["good"]);
        assert_eq!(
            listing.tools[0].extra["x-vendor"], 1,
            "unknown fields are kept"
        );
        let refused: Vec<_> = listing
            .malformed
            .iter()
            .map(|m| format!("{}: {}", m.name, m.reason))
            .collect();
        assert_eq!(refused.len(), 8, "{refused:#?}");
        assert!(refused[0].starts_with("no_schema: missing field `inputSchema`"));
        assert!(refused[1].starts_with("list schema: "));
        assert!(refused[2].contains("has ' ' at byte 3"), "{}", refused[2]);
        assert!(refused[3].starts_with("#5: missing field `name`"));
        assert_eq!(refused[4], "#6: is a string, not an object");
        assert!(refused[5].starts_with("good: duplicate name"));
        assert_eq!(
            refused[6],
            r#"string_schema: inputSchema has type "string", not "object""#
        );
        assert_eq!(
            refused[7],
            r#"listed_properties: inputSchema's "properties" is an array, not an object of schemas"#
        );
    }

    #[test]
    fn a_page_counts_its_tools_and_cursor_as_what_they_cost() {
        let tools = json!([
            {"name": "a", "inputSchema": {"type": "object"}, "n": 7, "b": [true, null]},
            {"name": "no_schema", "x": false},
        ]);
        let exact = serde_json::to_string(&tools).unwrap().len() as u64;
        assert_eq!(json_len(&tools), exact);
        // Three objects and arrays in the first tool, with seven members and elements;
        // one object in the second, with two members.
        assert_eq!(
            cost(&tools[0]),
            json_len(&tools[0]) + 3 * NODE_COST + 7 * ENTRY_COST
        );
        assert_eq!(
            cost(&tools[1]),
            json_len(&tools[1]) + NODE_COST + 2 * ENTRY_COST
        );
        let (listing, page) = read(json!({"tools": tools.clone(), "nextCursor": "abc"}));
        // Each tool with a comma after it, the one set aside with its record, and the
        // quoted cursor.
        let each: u64 = tools.as_array().unwrap().iter().map(|t| cost(t) + 1).sum();
        let refused = &listing.malformed[0];
        let record = MALFORMED_COST + refused.name.len() as u64 + refused.reason.len() as u64;
        assert_eq!(page.unwrap().bytes, each + record + 5);
        // A page of tools that are not objects costs their records, not their bytes.
        let (listing, page) = read(json!({"tools": vec![0; 1000]}));
        assert_eq!(listing.malformed.len(), 1000);
        assert!(page.unwrap().bytes > 1000 * MALFORMED_COST);
        // With little left, the page stops at the tool that passes it: no more records.
        let mut stopped = Listing::default();
        let left = 10 * (MALFORMED_COST + 20);
        let page = read_page(
            json!({"tools": vec![0; 1000]}),
            1,
            &mut HashSet::new(),
            &mut stopped,
            left,
        )
        .unwrap();
        assert!(page.bytes > left);
        assert!(stopped.malformed.len() < 20, "{}", stopped.malformed.len());
        // Escapes are not counted: at most what serde_json writes.
        let quoted = json!({"q\"": "line\nbreak"});
        assert!(json_len(&quoted) < serde_json::to_string(&quoted).unwrap().len() as u64);
    }

    #[test]
    fn a_page_that_is_not_a_listing_is_an_error() {
        assert_eq!(
            read(json!([1])).1.unwrap_err(),
            "page 1 is not a JSON object but an array"
        );
        assert_eq!(
            read(json!({})).1.unwrap_err(),
            "page 1 has no \"tools\" array"
        );
        assert_eq!(
            read(json!({"tools": [], "nextCursor": 3})).1.unwrap_err(),
            "page 1: nextCursor is a number, not a string"
        );
    }

    #[test]
    fn every_fixture_catalogue_reads_whole() {
        let dir = std::env::var_os("PSYCH_FIXTURES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures")
            })
            .join("catalogs");
        let mut files = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let raw: Value = serde_json::from_str(&text).unwrap();
            let count = raw["tools"].as_array().unwrap().len();
            let (listing, page) = read(raw.clone());
            assert!(page.unwrap().next_cursor.is_none());
            assert!(
                listing.malformed.is_empty(),
                "{path:?}: {:?}",
                listing.malformed
            );
            assert_eq!(listing.tools.len(), count);
            // Lossless: the validated tools serialize back to the tools as sent.
            let back = serde_json::to_value(&listing.tools).unwrap();
            assert_eq!(back, raw["tools"], "{path:?}");
            files += 1;
        }
        assert!(files >= 6, "fixtures not found in {dir:?}");
    }
}
