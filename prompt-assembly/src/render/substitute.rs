//! The substitution rules: what the renderers send in place of what a provider would refuse
//! in a log that is never rewritten (call names outside the provider alphabet, arguments
//! that are not an object, a call without a result, blank text, call ids too long for
//! OpenAI), and the provider name rule itself.

use std::borrow::Cow;

use psych_types::{ToolCall, ToolCallId, json};

/// Whether `name` matches `^[a-zA-Z0-9_-]{1,64}$`.
pub(crate) fn provider_name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The longest tool name both providers accept, in bytes.
const MAX_NAME: usize = 64;

/// The prefix of a sanitised call name (see [`call_name`]).
pub(crate) const INVALID_NAME_PREFIX: &str = "invalid_";

/// The name a logged tool call is rendered with: the name as the model gave it when it
/// matches `^[a-zA-Z0-9_-]{1,64}$`, else `invalid_` followed by that name with every
/// character outside `[a-zA-Z0-9_-]` replaced by `_`, cut to 64 bytes. So
/// `github.list_issues` is sent as `invalid_github_list_issues`: the prefix keeps a
/// sanitised name from reading as a real tool of the surface (`github_list_issues` may
/// exist, and the model would then see it fail). A call's name is what the model said,
/// not a tool we declare: a model that invents a name must not make its Run
/// unrenderable. Calls and results pair by id, never by name, so a sanitised call still
/// pairs with its result.
pub(crate) fn call_name(name: &str) -> Cow<'_, str> {
    if provider_name_ok(name) {
        return Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(INVALID_NAME_PREFIX.len() + name.len());
    out.push_str(INVALID_NAME_PREFIX);
    out.extend(name.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
            c
        } else {
            '_'
        }
    }));
    // Every character is ASCII now, so any byte length is a char boundary.
    out.truncate(MAX_NAME);
    Cow::Owned(out)
}

/// The key under which both renderers send arguments that are not a JSON object.
///
/// Anthropic's `tool_use.input` must be an object, and OpenAI's `function.arguments` must
/// be the text of one (the API refuses text that does not parse). The log keeps arguments
/// that did not parse as a JSON string of their raw text (see
/// [`ToolCall`](psych_types::ToolCall)), and a model may send valid JSON that is not an
/// object; either is sent as the object `{"_raw_arguments": <text>}` (for OpenAI, that
/// object's compact JSON text), the text being the raw string, or the canonical compact JSON
/// of any other value.
pub const RAW_ARGUMENTS_KEY: &str = "_raw_arguments";

/// The text of the error result rendered for a tool call that has no result in the log.
///
/// A Run whose process stopped between logging a call and logging its result has such a
/// call forever (the log is never rewritten), and both providers refuse a call without a
/// result. The renderers send this text as that call's failed result, in the place the
/// result belongs (Anthropic: a `tool_result` with `is_error` in the next user message;
/// OpenAI: a `tool` message whose content starts `Error: `).
///
/// A result logged for such a call *after* a request rendered it missing would change that
/// request's bytes where the substitute stood, breaking the cached prefix. So a runtime
/// resuming a Run logs a failed [`ToolResult`](psych_types::ToolResult) for every call left
/// open before it assembles; a result arriving later is then a duplicate, and duplicates
/// are left out.
pub const MISSING_RESULT: &str = "No result was recorded for this call (the run was interrupted).";

/// The text a user message is rendered with when its text is empty or only whitespace.
///
/// Anthropic refuses text blocks without non-whitespace text and messages without content;
/// dropping the message instead would merge the turns around it and could leave the
/// conversation starting with an assistant message. Both renderers use it, so a Run reads
/// the same to either model.
pub const EMPTY_USER_MESSAGE: &str = "[empty message]";

/// Whether `text` has nothing but whitespace, the empty text included: such text is
/// treated as absent (Anthropic refuses it in a text block). Whitespace is Unicode
/// `White_Space` plus the information separators U+001C–U+001F (which Python's
/// `str.isspace`, a likely server-side check, also counts) and U+FEFF, so nothing a
/// provider may call blank is sent as a text block.
pub(crate) fn is_blank(text: &str) -> bool {
    text.chars()
        .all(|c| c.is_whitespace() || matches!(c, '\u{1C}'..='\u{1F}' | '\u{FEFF}'))
}

/// The text of non-object call arguments: the raw text when the log holds a string, the
/// canonical compact JSON of any other value.
pub(crate) fn raw_arguments(call: &ToolCall) -> Cow<'_, str> {
    match &call.arguments {
        serde_json::Value::String(raw) => Cow::Borrowed(raw),
        other => {
            let mut text = String::new();
            json::write_value(&mut text, other);
            Cow::Owned(text)
        }
    }
}

/// Writes a call's arguments as a JSON object: the arguments when they are one, else
/// `{"_raw_arguments": <text>}` (see [`RAW_ARGUMENTS_KEY`] and [`raw_arguments`]). Anthropic
/// sends these bytes as `input`, OpenAI as the text of `arguments`.
pub(crate) fn write_arguments(out: &mut String, call: &ToolCall) {
    if call.arguments.is_object() {
        json::write_value(out, &call.arguments);
    } else {
        out.push('{');
        json::write_str(out, RAW_ARGUMENTS_KEY);
        out.push(':');
        json::write_str(out, &raw_arguments(call));
        out.push('}');
    }
}

/// `text` without trailing whitespace (the characters [`is_blank`] counts).
pub(crate) fn trim_end(text: &str) -> &str {
    text.trim_end_matches(|c: char| {
        c.is_whitespace() || matches!(c, '\u{1C}'..='\u{1F}' | '\u{FEFF}')
    })
}

/// The longest tool call id OpenAI accepts, in characters.
pub const OPENAI_MAX_CALL_ID: usize = 40;

pub(crate) use psych_types::fnv1a;

/// Call ids as sent to OpenAI: each logged id as it is when it has at most
/// [`OPENAI_MAX_CALL_ID`] characters, else its first 23 characters, `_` and 16 hex digits of
/// a hash of the whole id (40 characters). Ids are given in history order; an id's sent
/// form depends only on the ids before it, so a prefix renders the same whatever follows.
/// A sent id equal to one already taken (a hash collision, or a logged short id of the same
/// shape) is hashed again with the next salt until it is unique, so two logged ids never
/// share a sent one;
/// [`RenderedRequest::logged_call_id`](super::RenderedRequest::logged_call_id) maps a sent
/// id back.
#[derive(Debug, Default)]
pub(crate) struct CallIds {
    taken: std::collections::BTreeMap<String, ToolCallId>,
    by_logged: std::collections::BTreeMap<ToolCallId, String>,
    pub(crate) replaced: Vec<(String, ToolCallId)>,
}

impl CallIds {
    /// The sent form of `id`.
    pub(crate) fn sent(&mut self, id: &ToolCallId) -> String {
        if let Some(sent) = self.by_logged.get(id) {
            return sent.clone();
        }
        let text = id.as_str();
        let mut sent = text.to_owned();
        let mut salt = 0u64;
        let fits = text.chars().count() <= OPENAI_MAX_CALL_ID;
        while (!fits && salt == 0) || self.taken.contains_key(&sent) {
            let head: String = text.chars().take(OPENAI_MAX_CALL_ID - 17).collect();
            sent = format!("{head}_{:016x}", fnv1a(text.as_bytes(), salt));
            salt += 1;
        }
        if sent != text {
            self.replaced.push((sent.clone(), id.clone()));
        }
        self.taken.insert(sent.clone(), id.clone());
        self.by_logged.insert(id.clone(), sent.clone());
        sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_names() {
        assert!(provider_name_ok("API-get-user"));
        assert!(provider_name_ok(&"a".repeat(64)));
        assert!(!provider_name_ok(&"a".repeat(65)));
        assert!(!provider_name_ok(""));
        assert!(!provider_name_ok("browser.navigate"));
        assert!(!provider_name_ok("tööl"));
    }

    #[test]
    fn call_names_are_sanitised_into_the_provider_alphabet() {
        for (name, sent) in [
            ("read_file", "read_file".to_owned()),
            (
                "github.list_issues",
                "invalid_github_list_issues".to_owned(),
            ),
            (
                "multi_tool_use.parallel",
                "invalid_multi_tool_use_parallel".to_owned(),
            ),
            ("tööl", "invalid_t__l".to_owned()),
            ("a b/c:d", "invalid_a_b_c_d".to_owned()),
            ("", "invalid_".to_owned()),
            (&"x.".repeat(40), format!("invalid_{}", "x_".repeat(28))),
        ] {
            let out = call_name(name);
            assert_eq!(out, sent, "{name:?}");
            assert!(provider_name_ok(&out), "{out:?}");
        }
    }

    #[test]
    fn long_call_ids_map_to_unique_short_ones_and_back() {
        let id = |text: &str| ToolCallId::new(text).unwrap();
        let long = id(&format!("call_{}", "a".repeat(60)));
        let mut ids = CallIds::default();
        let sent = ids.sent(&long);
        assert_eq!(sent.chars().count(), OPENAI_MAX_CALL_ID);
        assert!(sent.starts_with("call_aaaa"), "{sent}");
        assert_eq!(ids.sent(&long), sent, "the same id maps the same way");
        assert_eq!(ids.sent(&id("short_1")), "short_1", "short ids are kept");
        // A logged short id equal to a sent form already taken is mapped too.
        let clash = id(&sent);
        let other = ids.sent(&clash);
        assert_ne!(other, sent);
        assert_eq!(other.chars().count(), OPENAI_MAX_CALL_ID);
        // Two long ids with the same first 23 characters differ by their hash.
        let twin = id(&format!("call_{}b", "a".repeat(59)));
        assert_ne!(ids.sent(&twin), sent);
        let pairs: Vec<(String, String)> = ids
            .replaced
            .iter()
            .map(|(s, l)| (s.clone(), l.to_string()))
            .collect();
        assert_eq!(pairs.len(), 3, "{pairs:?}");
        let unique: std::collections::BTreeSet<&String> = pairs.iter().map(|(s, _)| s).collect();
        assert_eq!(unique.len(), 3);
        // Deterministic across runs: FNV-1a is fixed by its definition.
        let mut again = CallIds::default();
        assert_eq!(again.sent(&long), sent);
    }

    #[test]
    fn blank_is_empty_or_whitespace() {
        for text in [
            "",
            " ",
            "\n\n",
            "\t\r\n",
            "\u{a0}\u{2003}",
            "\u{1c}\u{1f}",
            "\u{feff}",
        ] {
            assert!(is_blank(text), "{text:?}");
        }
        for text in ["a", " .", "\n\nx"] {
            assert!(!is_blank(text), "{text:?}");
        }
    }
}
