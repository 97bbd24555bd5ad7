//! Records of a Run's log (user messages, assistant messages with tool calls, tool results,
//! the usage a provider reported for each model call) and the handles that name them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{IdError, RunId, ToolCallId, ToolOutput};

/// The printable name of one record: its Run and its position in that Run's log.
///
/// Its text form is `<run>:<seq>` (for example `run-7:42`), the form the model is shown and
/// passes back to `read_tool_output`. It names a Run so that a handle carried into another
/// Run is recognised as foreign rather than resolved there.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordHandle {
    /// The Run the record belongs to.
    pub run: RunId,
    /// The record's position in its Run's log, counting from 0.
    pub seq: u64,
}

impl RecordHandle {
    /// Names record `seq` of `run`.
    pub fn new(run: RunId, seq: u64) -> Self {
        Self { run, seq }
    }
}

impl fmt::Display for RecordHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.run, self.seq)
    }
}

/// Why a string is not a record handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandleParseError {
    /// There is no `:` separating the Run from the position.
    #[error("handle {0:?} is not of the form <run>:<seq>")]
    MissingSeparator(String),
    /// The Run part is not a valid Run id.
    #[error("handle {handle:?} names an invalid run: {source}")]
    Run {
        /// The refused handle.
        handle: String,
        /// Why the Run part was refused.
        source: IdError,
    },
    /// The position is not a decimal number without sign or leading zeros.
    #[error("handle {0:?} has an invalid record position")]
    Seq(String),
}

impl FromStr for RecordHandle {
    type Err = HandleParseError;

    fn from_str(text: &str) -> Result<Self, HandleParseError> {
        let (run, seq) = text
            .rsplit_once(':')
            .ok_or_else(|| HandleParseError::MissingSeparator(text.to_owned()))?;
        let run = RunId::new(run).map_err(|source| HandleParseError::Run {
            handle: text.to_owned(),
            source,
        })?;
        // One spelling per handle: digits only, no sign, no leading zero.
        let canonical = !seq.is_empty()
            && seq.bytes().all(|b| b.is_ascii_digit())
            && (seq == "0" || !seq.starts_with('0'));
        let seq = canonical
            .then(|| seq.parse::<u64>().ok())
            .flatten()
            .ok_or_else(|| HandleParseError::Seq(text.to_owned()))?;
        Ok(Self { run, seq })
    }
}

impl Serialize for RecordHandle {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RecordHandle {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One entry of a Run's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// A message from the user; it starts a turn.
    User(UserMessage),
    /// What the model said in one step, with the tool calls it made.
    Assistant(AssistantMessage),
    /// The full result of one tool call.
    ToolResult(ToolResult),
    /// The token usage the provider reported for one model call. It is bookkeeping, not
    /// conversation: prompt assembly renders nothing for it.
    Usage(Usage),
}

/// A message from the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserMessage {
    /// The message text.
    pub text: String,
}

/// What the model said in one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// The text the model wrote (may be empty when it only called tools).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub text: String,
    /// The tool calls of this step, in the order the model made them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One tool call as the model made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call.
    pub id: ToolCallId,
    /// The tool name the model used, exactly as given: an exposed tool, a meta tool, or a
    /// name that does not exist (the log keeps what happened).
    pub name: String,
    /// The arguments as the model gave them: normally a JSON object. When the model's
    /// arguments did not parse as JSON, this is a [`Value::String`] holding their raw text,
    /// so the log keeps what was said; renderers decide what a provider accepts.
    pub arguments: Value,
}

/// The full result of one tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The call this answers.
    pub call_id: ToolCallId,
    /// The tool name of that call, as the model gave it.
    pub name: String,
    /// The output, whole.
    pub output: ToolOutput,
    /// The remote tool the call reached, when it was forwarded to one: what the model's
    /// name (an exposed name, `psych_call_tool`, a facade) meant at that step. `None` for a
    /// call Psych answered itself (a read, a meta tool's listing, a refusal) and in records
    /// written before it was stored. What learned pinning counts and per-tool output
    /// limits look up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<crate::ToolRef>,
}

/// The token counts a provider reported for one model call, as it reported them: every
/// token figure reported as spent is a sum of these, never an estimate.
///
/// The four counts are disjoint, so the tokens the request was billed for are their sum
/// ([`Usage::total`]). `input` is the input neither read from nor written to the prompt
/// cache, as Anthropic reports `input_tokens`; OpenAI's `prompt_tokens` includes its cached
/// tokens, so for OpenAI `input` is `prompt_tokens - cached_tokens`, `cache_read` is
/// `cached_tokens` and `cache_write` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens not read from or written to the cache.
    pub input: u64,
    /// Input tokens read from the prompt cache.
    #[serde(default)]
    pub cache_read: u64,
    /// Input tokens written to the prompt cache.
    #[serde(default)]
    pub cache_write: u64,
    /// Output tokens the model generated.
    pub output: u64,
}

impl Usage {
    /// All four counts added up, saturating.
    pub fn total(&self) -> u64 {
        self.input
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write)
            .saturating_add(self.output)
    }

    /// These counts plus `other`'s, each saturating: the usage of two model calls.
    #[must_use]
    pub fn plus(&self, other: &Usage) -> Usage {
        Usage {
            input: self.input.saturating_add(other.input),
            cache_read: self.cache_read.saturating_add(other.cache_read),
            cache_write: self.cache_write.saturating_add(other.cache_write),
            output: self.output.saturating_add(other.output),
        }
    }
}

/// A record together with the handle the log gave it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoggedRecord {
    /// Where the record lives.
    pub handle: RecordHandle,
    /// The record.
    pub record: Record,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_records_round_trip_and_add_up() {
        let usage = Usage {
            input: 1_200,
            cache_read: 30_000,
            cache_write: 512,
            output: 87,
        };
        let record = Record::Usage(usage);
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type": "usage", "input": 1_200, "cache_read": 30_000,
                "cache_write": 512, "output": 87})
        );
        assert_eq!(serde_json::from_value::<Record>(json).unwrap(), record);
        assert_eq!(usage.total(), 31_799);
        let twice = usage.plus(&usage);
        assert_eq!(twice.total(), 2 * 31_799);
        let full = Usage {
            input: u64::MAX,
            ..Usage::default()
        };
        assert_eq!(full.plus(&usage).input, u64::MAX);
        let sparse: Usage =
            serde_json::from_value(serde_json::json!({"input": 5, "output": 2})).unwrap();
        assert_eq!(sparse.total(), 7);
    }

    #[test]
    fn handles_print_and_parse() {
        let handle = RecordHandle::new(RunId::new("run-7").unwrap(), 42);
        assert_eq!(handle.to_string(), "run-7:42");
        assert_eq!("run-7:42".parse::<RecordHandle>().unwrap(), handle);
    }

    #[test]
    fn malformed_handles_are_typed_errors() {
        for text in [
            "",
            "run-7",
            "run-7:",
            ":3",
            "run 7:3",
            "run-7:-1",
            "run-7:+1",
            "run-7:01",
            "run-7:99999999999999999999",
            "run-7:4x",
        ] {
            assert!(text.parse::<RecordHandle>().is_err(), "{text:?} parsed");
        }
        assert!(matches!(
            "run-7".parse::<RecordHandle>(),
            Err(HandleParseError::MissingSeparator(_))
        ));
        assert!(matches!(
            "a:b:3".parse::<RecordHandle>(),
            Err(HandleParseError::Run { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn handles_round_trip(run in "[A-Za-z0-9_-]{1,64}", seq in proptest::num::u64::ANY) {
            let handle = RecordHandle::new(RunId::new(run).unwrap(), seq);
            proptest::prop_assert_eq!(handle.to_string().parse::<RecordHandle>().unwrap(), handle);
        }

        /// One spelling per handle: whatever text parses is exactly its handle's printed
        /// form, so two texts never name one record. The texts are near-handles (a sign,
        /// leading zeros, spaces, non-ASCII digits, overflow, colons) and arbitrary text.
        #[test]
        fn a_handle_has_one_spelling(text in near_handle()) {
            proptest::prop_assert_eq!(one_spelling(&text, |t| t.parse().ok()), Ok(()));
        }
    }

    /// Texts near the handle grammar: about half of them parse.
    fn near_handle() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let run = prop_oneof![
            4 => "[A-Za-z0-9_-]{1,8}",
            1 => "[A-Za-z0-9_: .-]{0,8}",
        ];
        let seq = prop_oneof![
            4 => "(0|[1-9][0-9]{0,5})",
            1 => "[+-]?0{0,3}[0-9]{0,4}",
            1 => " ?[0-9]{1,3} ?",
            1 => "[\u{660}-\u{669}\u{FF10}-\u{FF19}]{1,2}",
            1 => "1844674407370955161[0-9]",
        ];
        prop_oneof![
            8 => (run, seq).prop_map(|(run, seq)| format!("{run}:{seq}")),
            1 => ".{0,40}",
        ]
    }

    /// `Err` naming `text` when `parse` accepts it as a handle that prints otherwise.
    fn one_spelling(
        text: &str,
        parse: impl Fn(&str) -> Option<RecordHandle>,
    ) -> Result<(), String> {
        match parse(text) {
            Some(handle) if handle.to_string() != text => {
                Err(format!("{text:?} parses as {handle}, printed otherwise"))
            }
            _ => Ok(()),
        }
    }

    #[test]
    fn the_one_spelling_check_fails_a_lenient_parser() {
        // A parser that takes what `u64::from_str` takes ("+7", "007") gives a record two
        // spellings; the check must say so, or the property above proves nothing.
        let lenient = |text: &str| {
            let (run, seq) = text.rsplit_once(':')?;
            Some(RecordHandle::new(RunId::new(run).ok()?, seq.parse().ok()?))
        };
        for text in ["run-7:007", "run-7:+7"] {
            assert!(one_spelling(text, lenient).is_err(), "{text:?}");
            assert!(text.parse::<RecordHandle>().is_err(), "{text:?}");
        }
        assert_eq!(one_spelling("run-7:7", lenient), Ok(()));
        // The strategy reaches both answers.
        let runner = &mut proptest::test_runner::TestRunner::deterministic();
        let texts: Vec<String> = (0..200)
            .map(|_| {
                proptest::strategy::ValueTree::current(
                    &proptest::strategy::Strategy::new_tree(&near_handle(), runner).unwrap(),
                )
            })
            .collect();
        let parsed = texts
            .iter()
            .filter(|t| t.parse::<RecordHandle>().is_ok())
            .count();
        assert!((40..160).contains(&parsed), "{parsed} of 200 parsed");
    }
}
