//! Zone 3 and the elision boundary: turning the record log's records into provider-neutral
//! messages, with tool results before the last user message projected turn by turn.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::ops::Range;

use psych_types::{
    AssistantMessage, LoggedRecord, Projection, Record, RecordHandle, ResultProjector, ResultRef,
    ToolCall, ToolCallId, ToolDefinition, ToolResult,
};

use crate::render::provider_name_ok;
use crate::{DynamicTail, RenderError, StaticSections, Transient};

/// Why a history cannot be assembled into a request the providers accept.
///
/// Only logs no real Run can produce are refused. What a model or a crash can leave in a
/// log is rendered with a fixed substitute instead, because the log is never rewritten and
/// a refusal would make every later request of the Run fail: a call without a result gets
/// the failed result [`MISSING_RESULT`](crate::MISSING_RESULT); a second result for an
/// answered call, or a result logged after its call's message was closed (by a later user
/// or assistant record), is left out of the request (the first result in place wins; the
/// log still holds every one). What stays an error: a call id used twice (providers issue
/// unique ids, so two calls sharing one come from a broken writer, and their results could
/// not be told apart) and a result for a call no earlier record made (a runtime logs a
/// result only for a call it executed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssembleError {
    /// A tool result names a call id that no assistant record before it made.
    #[error("tool result {result} answers no call made before it ({call_id})")]
    UnexpectedResult {
        /// The tool result record.
        result: RecordHandle,
        /// The call id it names.
        call_id: ToolCallId,
    },
    /// Two tool calls of the history share an id.
    #[error("tool call id {call_id} is used twice (again in record {assistant})")]
    DuplicateCallId {
        /// The assistant record with the second use.
        assistant: RecordHandle,
        /// The repeated id.
        call_id: ToolCallId,
    },
    /// Lazy assembly ([`StepHistory::load`](crate::StepHistory::load)) could not read a
    /// stored tool result (the store failed, or the handle names no result of it).
    #[error("tool result {result} could not be read: {reason}")]
    Unreadable {
        /// The tool result record.
        result: RecordHandle,
        /// The store's error, as text.
        reason: String,
    },
}

/// The prompt assembler: the fixed inputs of zones 1 and 2 and the tool surface, applied to
/// a history to give a [`Prompt`].
///
/// Assembly is pure: it reads the records and never changes them, calls the projector only
/// for tool results strictly before the last user message, and has no clock (the time comes
/// in through [`Transient`]).
#[derive(Debug, Clone, Copy)]
pub struct Assembler<'a> {
    static_sections: &'a StaticSections,
    dynamic_tail: &'a DynamicTail,
    tools: &'a [ToolDefinition],
}

impl<'a> Assembler<'a> {
    /// An assembler for these system zones and this tool surface (the tools disclosure chose
    /// for this turn, in any order: they are rendered sorted by name).
    pub fn new(
        static_sections: &'a StaticSections,
        dynamic_tail: &'a DynamicTail,
        tools: &'a [ToolDefinition],
    ) -> Self {
        Self {
            static_sections,
            dynamic_tail,
            tools,
        }
    }

    /// Assembles the four zones for one model call.
    ///
    /// The elision boundary is the last [`Record::User`] of `history`: every tool result
    /// before it goes through `projector`, one call per turn (a turn starts at a user
    /// message; results before the first user message form one batch of their own); every
    /// result at or after it is sent in full.
    ///
    /// # Errors
    ///
    /// [`AssembleError`] for a call id used twice or a result for a call never made.
    pub fn assemble(
        &self,
        history: &'a [LoggedRecord],
        projector: &dyn ResultProjector,
        transient: &'a Transient,
    ) -> Result<Prompt<'a>, AssembleError> {
        let boundary = history
            .iter()
            .rposition(|logged| matches!(logged.record, Record::User(_)));
        let messages = group(history)?;
        // Only results that are sent are projected: a duplicate or late result the
        // grouping left out must not take a share of its turn's elision budget.
        let sent = sent_flags(&messages, history.len());
        let mut views = vec![Projection::Full; history.len()];
        if let Some(boundary) = boundary {
            project_prior_turns(
                &history[..boundary],
                &sent[..boundary],
                projector,
                &mut views[..boundary],
            );
        }
        Ok(self.prompt(history, boundary, views.into(), messages, transient))
    }

    /// The prompt over `history` whose results' views are already decided.
    pub(crate) fn assemble_with_views(
        &self,
        history: &'a [LoggedRecord],
        views: &'a [Projection],
        transient: &'a Transient,
    ) -> Result<Prompt<'a>, AssembleError> {
        let boundary = history
            .iter()
            .rposition(|logged| matches!(logged.record, Record::User(_)));
        let messages = group(history)?;
        Ok(self.prompt(history, boundary, views.into(), messages, transient))
    }

    fn prompt(
        &self,
        history: &'a [LoggedRecord],
        boundary: Option<usize>,
        views: Cow<'a, [Projection]>,
        messages: Vec<Message<'a>>,
        transient: &'a Transient,
    ) -> Prompt<'a> {
        let mut tools: Vec<&ToolDefinition> = self.tools.iter().collect();
        tools.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        let surface = check_surface(&tools);
        Prompt {
            static_sections: self.static_sections,
            dynamic_tail: self.dynamic_tail,
            tools,
            surface,
            history,
            boundary,
            views,
            messages,
            transient,
        }
    }
}

/// Checks the tool surface (sorted by name) the way every provider needs it: no name twice,
/// every name in `^[a-zA-Z0-9_-]{1,64}$`. These names come from our own disclosure, so a bad
/// one is a typed error; call names in the history come from the model and are sanitised
/// instead (see the renderers). Run once per assembly; each renderer returns its answer.
fn check_surface(tools: &[&ToolDefinition]) -> Result<(), RenderError> {
    for pair in tools.windows(2) {
        if pair[0].name == pair[1].name {
            return Err(RenderError::DuplicateTool {
                name: pair[0].name.to_string(),
            });
        }
    }
    match tools
        .iter()
        .find(|tool| !provider_name_ok(tool.name.as_str()))
    {
        Some(tool) => Err(RenderError::ToolName {
            name: tool.name.to_string(),
        }),
        None => Ok(()),
    }
}

/// Which of `len` records the grouped `messages` send (a duplicate or late result the
/// grouping left out is not sent).
pub(crate) fn sent_flags(messages: &[Message<'_>], len: usize) -> Vec<bool> {
    let mut sent = vec![false; len];
    for message in messages {
        if let Message::Results { items, .. } = message {
            for item in items {
                if let Answer::Logged(index, _) = item {
                    sent[*index] = true;
                }
            }
        }
    }
    sent
}

/// The turns of records `0..len`, in order: each starts at a user record (`is_user`), but
/// the first starts at 0 (records before the first user message form a turn of their own).
pub(crate) fn turns(
    len: usize,
    is_user: impl Fn(usize) -> bool,
) -> impl Iterator<Item = Range<usize>> {
    let mut start = 0;
    std::iter::from_fn(move || {
        (start < len).then(|| {
            let end = (start + 1..len).find(|&i| is_user(i)).unwrap_or(len);
            let turn = start..end;
            start = end;
            turn
        })
    })
}

/// Calls the projector once per turn of `prior` (the records before the last user message),
/// with the results of that turn that are sent (`sent[i]`).
fn project_prior_turns(
    prior: &[LoggedRecord],
    sent: &[bool],
    projector: &dyn ResultProjector,
    views: &mut [Projection],
) {
    for turn in turns(prior.len(), |i| matches!(prior[i].record, Record::User(_))) {
        let indices: Vec<usize> = turn
            .filter(|&i| sent[i] && matches!(prior[i].record, Record::ToolResult(_)))
            .collect();
        if indices.is_empty() {
            continue;
        }
        let batch: Vec<ResultRef<'_>> = indices
            .iter()
            .filter_map(|&i| match &prior[i].record {
                Record::ToolResult(result) => Some(ResultRef {
                    handle: &prior[i].handle,
                    output: &result.output,
                    target: result.target.as_ref(),
                }),
                _ => None,
            })
            .collect();
        // A result the projector gives no view for stays whole (see `ResultProjector`).
        for (&i, projection) in indices.iter().zip(projector.project(&batch)) {
            views[i] = projection;
        }
    }
}

/// One provider-neutral message of zone 3.
#[derive(Debug, Clone)]
pub(crate) enum Message<'a> {
    /// A user record.
    User { index: usize, text: &'a str },
    /// An assistant record.
    Assistant {
        index: usize,
        message: &'a AssistantMessage,
    },
    /// The results answering the assistant message before, one per call, in call order.
    Results {
        records: Range<usize>,
        items: Vec<Answer<'a>>,
    },
}

/// What answers one call in a [`Message::Results`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Answer<'a> {
    /// The logged result at this history index.
    Logged(usize, &'a ToolResult),
    /// No result was logged: the renderers send [`MISSING_RESULT`](crate::MISSING_RESULT).
    Missing(&'a ToolCall),
}

impl Answer<'_> {
    /// The id of the call answered.
    pub(crate) fn call_id(&self) -> &ToolCallId {
        match self {
            Answer::Logged(_, result) => &result.call_id,
            Answer::Missing(call) => &call.id,
        }
    }
}

impl Message<'_> {
    /// Whether the message renders as nothing in any format: an assistant message with
    /// blank text and no call, or a run of results answering no call.
    pub(crate) fn renders_empty(&self) -> bool {
        match self {
            Message::User { .. } => false,
            Message::Assistant { message, .. } => {
                crate::render::is_blank(&message.text) && message.tool_calls.is_empty()
            }
            Message::Results { items, .. } => items.is_empty(),
        }
    }

    /// The history records this message renders (empty for results that are all
    /// substitutes).
    pub(crate) fn records(&self) -> Range<usize> {
        match self {
            Message::User { index, .. } | Message::Assistant { index, .. } => *index..*index + 1,
            Message::Results { records, .. } => records.clone(),
        }
    }
}

/// The open assistant record (its index) and, per call, the result found so far.
type Pending<'a> = Option<(usize, Vec<Option<(usize, &'a ToolResult)>>)>;

/// Closes the open assistant message: its results, in call order, with a substitute for
/// each call that has none.
fn close<'a>(
    history: &'a [LoggedRecord],
    pending: &mut Pending<'a>,
    messages: &mut Vec<Message<'a>>,
) {
    let Some((assistant, slots)) = pending.take() else {
        return;
    };
    let Record::Assistant(message) = &history[assistant].record else {
        return;
    };
    let items: Vec<Answer<'a>> = slots
        .into_iter()
        .zip(&message.tool_calls)
        .map(|(slot, call)| match slot {
            Some((index, result)) => Answer::Logged(index, result),
            None => Answer::Missing(call),
        })
        .collect();
    let end = items
        .iter()
        .filter_map(|item| match item {
            Answer::Logged(index, _) => Some(index + 1),
            Answer::Missing(_) => None,
        })
        .max()
        .unwrap_or(assistant + 1);
    if !items.is_empty() {
        messages.push(Message::Results {
            records: assistant + 1..end,
            items,
        });
    }
}

/// Groups records into messages, pairing each call with its result (see [`AssembleError`]
/// for what is substituted, left out or refused).
pub(crate) fn group(history: &[LoggedRecord]) -> Result<Vec<Message<'_>>, AssembleError> {
    let mut messages = Vec::with_capacity(history.len());
    let mut seen_ids: BTreeSet<&ToolCallId> = BTreeSet::new();
    let mut pending: Pending<'_> = None;

    for (index, logged) in history.iter().enumerate() {
        match &logged.record {
            Record::User(user) => {
                close(history, &mut pending, &mut messages);
                messages.push(Message::User {
                    index,
                    text: &user.text,
                });
            }
            Record::Assistant(message) => {
                close(history, &mut pending, &mut messages);
                for call in &message.tool_calls {
                    if !seen_ids.insert(&call.id) {
                        return Err(AssembleError::DuplicateCallId {
                            assistant: logged.handle.clone(),
                            call_id: call.id.clone(),
                        });
                    }
                }
                messages.push(Message::Assistant { index, message });
                if !message.tool_calls.is_empty() {
                    pending = Some((index, vec![None; message.tool_calls.len()]));
                }
            }
            Record::ToolResult(result) => {
                if !seen_ids.contains(&result.call_id) {
                    return Err(AssembleError::UnexpectedResult {
                        result: logged.handle.clone(),
                        call_id: result.call_id.clone(),
                    });
                }
                let slot = pending.as_mut().and_then(|(assistant, slots)| {
                    let Record::Assistant(message) = &history[*assistant].record else {
                        return None;
                    };
                    let position = message
                        .tool_calls
                        .iter()
                        .position(|call| call.id == result.call_id)?;
                    slots.get_mut(position).filter(|slot| slot.is_none())
                });
                // A second result, or one for a call whose message is closed, is left out.
                if let Some(slot) = slot {
                    *slot = Some((index, result));
                }
                let complete = pending
                    .as_ref()
                    .is_some_and(|(_, slots)| slots.iter().all(Option::is_some));
                if complete {
                    close(history, &mut pending, &mut messages);
                }
            }
            // Bookkeeping, not conversation: wherever it sits, it renders as nothing and
            // leaves an open call message open.
            Record::Usage(_) => {}
        }
    }
    close(history, &mut pending, &mut messages);
    Ok(messages)
}

/// One call's assembled prompt: the four zones, provider-neutral, ready to render with
/// [`Prompt::render_anthropic`] or [`Prompt::render_openai`].
#[derive(Debug, Clone)]
pub struct Prompt<'a> {
    pub(crate) static_sections: &'a StaticSections,
    pub(crate) dynamic_tail: &'a DynamicTail,
    pub(crate) tools: Vec<&'a ToolDefinition>,
    /// The provider-independent check of `tools`, made once when the prompt is assembled.
    pub(crate) surface: Result<(), RenderError>,
    pub(crate) history: &'a [LoggedRecord],
    pub(crate) boundary: Option<usize>,
    /// Each record's view: owned when projected for this prompt, borrowed from a
    /// [`StepHistory`](crate::StepHistory) that holds them.
    pub(crate) views: Cow<'a, [Projection]>,
    pub(crate) messages: Vec<Message<'a>>,
    pub(crate) transient: &'a Transient,
}

impl<'a> Prompt<'a> {
    /// The index in the history of the last user message (the elision boundary), if any.
    pub fn boundary(&self) -> Option<usize> {
        self.boundary
    }

    /// The model's view of each tool result of the history, in history order:
    /// [`Projection::Full`] for results at or after the boundary and for those the
    /// projector left whole.
    pub fn result_views(&self) -> impl Iterator<Item = (&'a RecordHandle, &Projection)> + '_ {
        self.history
            .iter()
            .zip(self.views.iter())
            .filter(|(logged, _)| matches!(logged.record, Record::ToolResult(_)))
            .map(|(logged, view)| (&logged.handle, view))
    }

    /// The tools in the order they are rendered (sorted by name).
    pub fn tools(&self) -> &[&'a ToolDefinition] {
        &self.tools
    }

    /// The answer of the tool-surface check made at assembly (see `check_surface`): every
    /// renderer returns it before writing anything.
    pub(crate) fn surface_check(&self) -> Result<(), RenderError> {
        self.surface.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psych_types::{RunId, ToolOutput, UserMessage};

    fn log(records: Vec<Record>) -> Vec<LoggedRecord> {
        let run = RunId::new("r").unwrap();
        records
            .into_iter()
            .enumerate()
            .map(|(i, record)| LoggedRecord {
                handle: RecordHandle::new(run.clone(), i as u64),
                record,
            })
            .collect()
    }

    fn user(text: &str) -> Record {
        Record::User(UserMessage { text: text.into() })
    }

    fn calls(ids: &[&str]) -> Record {
        Record::Assistant(AssistantMessage {
            text: String::new(),
            tool_calls: ids
                .iter()
                .map(|id| ToolCall {
                    id: ToolCallId::new(*id).unwrap(),
                    name: "t".into(),
                    arguments: serde_json::json!({}),
                })
                .collect(),
        })
    }

    fn result(id: &str, text: &str) -> Record {
        Record::ToolResult(ToolResult {
            target: None,
            call_id: ToolCallId::new(id).unwrap(),
            name: "t".into(),
            output: ToolOutput::text(text),
        })
    }

    /// Replaces every result with its length, and records each batch it saw.
    struct Counting(std::cell::RefCell<Vec<Vec<u64>>>);

    impl ResultProjector for Counting {
        fn project(&self, batch: &[ResultRef<'_>]) -> Vec<Projection> {
            self.0
                .borrow_mut()
                .push(batch.iter().map(|r| r.handle.seq).collect());
            vec![Projection::Replaced("elided".into()); batch.len()]
        }
    }

    #[test]
    fn batches_are_prior_turns_and_the_current_turn_is_full() {
        let history = log(vec![
            user("one"),
            calls(&["a", "b"]),
            result("b", "B"),
            result("a", "A"),
            Record::Assistant(AssistantMessage {
                text: "done".into(),
                tool_calls: vec![],
            }),
            user("two"),
            calls(&["c"]),
            result("c", "C"),
            user("three"),
            calls(&["d"]),
            result("d", "D"),
        ]);
        let projector = Counting(Default::default());
        let (zone1, zone2, transient) = Default::default();
        let prompt = Assembler::new(&zone1, &zone2, &[])
            .assemble(&history, &projector, &transient)
            .unwrap();
        assert_eq!(prompt.boundary(), Some(8));
        assert_eq!(*projector.0.borrow(), vec![vec![2, 3], vec![7]]);
        let views: Vec<(u64, bool)> = prompt
            .result_views()
            .map(|(h, v)| (h.seq, *v == Projection::Full))
            .collect();
        assert_eq!(views, vec![(2, false), (3, false), (7, false), (10, true)]);
        // Results come back in call order, whatever order they were logged in.
        let Message::Results { items, records } = &prompt.messages[2] else {
            panic!("{:?}", prompt.messages[2]);
        };
        assert_eq!(records, &(2..4));
        let ids: Vec<&str> = items.iter().map(|item| item.call_id().as_str()).collect();
        assert_eq!(ids, vec!["a", "b"]);
    }

    /// Replaces the first `.0` results of each batch, giving exactly `.0` views whatever
    /// the batch's length: too few or too many.
    struct Answers(usize);

    impl ResultProjector for Answers {
        fn project(&self, _batch: &[ResultRef<'_>]) -> Vec<Projection> {
            vec![Projection::Replaced("elided".into()); self.0]
        }
    }

    #[test]
    fn a_projector_giving_too_few_or_too_many_views_never_fails_assembly() {
        let mut store = psych_types::MemoryRecords::new(RunId::new("r").unwrap());
        for record in [
            user("one"),
            calls(&["a", "b", "c"]),
            result("a", "A"),
            result("b", "B"),
            result("c", "C"),
            user("two"),
        ] {
            store.push(record);
        }
        let history = store.records();
        let lazy_history = psych_types::History::from_records(&history, None);
        let (zone1, zone2, transient) = Default::default();
        let assembler = Assembler::new(&zone1, &zone2, &[]);
        // The records whose view is not the whole result.
        let replaced_in = |prompt: Prompt<'_>| -> Vec<u64> {
            prompt
                .result_views()
                .filter(|(_, view)| **view != Projection::Full)
                .map(|(handle, _)| handle.seq)
                .collect()
        };
        for (answers, replaced) in [(0, vec![]), (2, vec![2, 3]), (5, vec![2, 3, 4])] {
            let projector = Answers(answers);
            let prompt = assembler
                .assemble(&history, &projector, &transient)
                .unwrap();
            assert_eq!(
                replaced_in(prompt),
                replaced,
                "{answers} views, whole records"
            );
            let mut cache = crate::ProjectionCache::default();
            let step =
                crate::StepHistory::load(&lazy_history, &store, &projector, &mut cache).unwrap();
            let prompt = assembler.assemble_history(&step, &transient).unwrap();
            assert_eq!(
                replaced_in(prompt),
                replaced,
                "{answers} views, stored history"
            );
        }
    }

    #[test]
    fn the_tool_surface_is_checked_once_at_assembly_for_every_renderer() {
        let tool = |name: &str| {
            ToolDefinition::new(
                psych_types::ToolName::new(name).unwrap(),
                "d",
                serde_json::Map::new(),
            )
        };
        let history = log(vec![user("hi")]);
        let (zone1, zone2, transient) = Default::default();
        for (tools, error) in [
            (vec![tool("b"), tool("a")], None),
            (
                vec![tool("b"), tool("a"), tool("b")],
                Some(RenderError::DuplicateTool { name: "b".into() }),
            ),
            (
                vec![tool("fs.read"), tool("a")],
                Some(RenderError::ToolName {
                    name: "fs.read".into(),
                }),
            ),
        ] {
            let prompt = Assembler::new(&zone1, &zone2, &tools)
                .assemble(&history, &Counting(Default::default()), &transient)
                .unwrap();
            let expected = error.clone().map_or(Ok(()), Err);
            assert_eq!(prompt.surface, expected, "decided at assembly");
            let anthropic = prompt.render_anthropic(&crate::AnthropicOptions::new("m", 1));
            let openai = prompt.render_openai(&crate::OpenAiOptions::new("m"));
            let responses = prompt.render_responses(&crate::OpenAiOptions::new("m"));
            for (provider, rendered) in [
                ("anthropic", anthropic),
                ("openai", openai),
                ("responses", responses),
            ] {
                assert_eq!(rendered.err(), error, "{provider}");
            }
        }
    }

    #[test]
    fn results_left_out_are_not_in_the_elision_batch() {
        // A duplicate result (a retry after a crash) and a late one (logged after the next
        // assistant message closed its call) are not sent, so they take no share of the
        // turn's budget and get no view.
        let history = log(vec![
            user("one"),
            calls(&["a", "b"]),
            result("a", "A"),
            result("a", "A again"),
            result("b", "B"),
            calls(&["c"]),
            Record::Assistant(AssistantMessage {
                text: "moving on".into(),
                tool_calls: vec![],
            }),
            result("c", "C, too late"),
            user("two"),
        ]);
        let projector = Counting(Default::default());
        let (zone1, zone2, transient) = Default::default();
        let prompt = Assembler::new(&zone1, &zone2, &[])
            .assemble(&history, &projector, &transient)
            .unwrap();
        assert_eq!(*projector.0.borrow(), vec![vec![2, 4]]);
        let replaced: Vec<u64> = prompt
            .result_views()
            .filter(|(_, view)| **view != Projection::Full)
            .map(|(handle, _)| handle.seq)
            .collect();
        assert_eq!(replaced, vec![2, 4]);
    }

    #[test]
    fn pairing_errors_are_typed() {
        let projector = Counting(Default::default());
        let (zone1, zone2, transient) = Default::default();
        let assembler = Assembler::new(&zone1, &zone2, &[]);
        let cases = [
            (
                vec![user("x"), result("a", "A")],
                "tool result r:1 answers no call made before it (a)",
            ),
            (
                vec![user("x"), result("a", "A"), calls(&["a"])],
                "tool result r:1 answers no call made before it (a)",
            ),
            (
                vec![user("x"), calls(&["a"]), result("a", "A"), calls(&["a"])],
                "tool call id a is used twice (again in record r:3)",
            ),
            (
                vec![user("x"), calls(&["a", "a"])],
                "tool call id a is used twice (again in record r:1)",
            ),
        ];
        for (records, message) in cases {
            let history = log(records);
            let err = assembler
                .assemble(&history, &projector, &transient)
                .unwrap_err();
            assert_eq!(err.to_string(), message);
        }
    }

    /// The answers of each results message: the logged record's index, or `None` for a
    /// substitute.
    fn answers(records: Vec<Record>) -> Vec<Vec<(String, Option<usize>)>> {
        let history = log(records);
        let projector = Counting(Default::default());
        let (zone1, zone2, transient) = Default::default();
        let prompt = Assembler::new(&zone1, &zone2, &[])
            .assemble(&history, &projector, &transient)
            .unwrap();
        prompt
            .messages
            .iter()
            .filter_map(|message| match message {
                Message::Results { items, .. } => Some(
                    items
                        .iter()
                        .map(|item| {
                            let index = match item {
                                Answer::Logged(index, _) => Some(*index),
                                Answer::Missing(_) => None,
                            };
                            (item.call_id().to_string(), index)
                        })
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn usage_records_render_as_nothing_wherever_they_sit() {
        let usage = || {
            Record::Usage(psych_types::Usage {
                input: 10,
                cache_read: 20,
                cache_write: 30,
                output: 40,
            })
        };
        let plain = vec![
            user("x"),
            calls(&["a", "b"]),
            result("a", "A"),
            result("b", "B"),
            Record::Assistant(AssistantMessage {
                text: "done".into(),
                tool_calls: Vec::new(),
            }),
            user("y"),
        ];
        let with_usage = vec![
            user("x"),
            calls(&["a", "b"]),
            usage(),
            result("a", "A"),
            usage(),
            result("b", "B"),
            Record::Assistant(AssistantMessage {
                text: "done".into(),
                tool_calls: Vec::new(),
            }),
            usage(),
            user("y"),
            usage(),
        ];
        // The calls still pair with their results across the usage records.
        assert_eq!(
            answers(with_usage.clone()),
            vec![vec![("a".to_owned(), Some(3)), ("b".to_owned(), Some(5))]]
        );
        let render = |records: Vec<Record>| {
            let history = log(records);
            let projector = Counting(Default::default());
            let (zone1, zone2, transient) = Default::default();
            let prompt = Assembler::new(&zone1, &zone2, &[])
                .assemble(&history, &projector, &transient)
                .unwrap();
            (
                prompt
                    .render_anthropic(&crate::AnthropicOptions::new("m", 100))
                    .unwrap()
                    .body()
                    .to_owned(),
                prompt
                    .render_openai(&crate::OpenAiOptions::new("m"))
                    .unwrap()
                    .body()
                    .to_owned(),
            )
        };
        assert_eq!(render(with_usage), render(plain));
    }

    #[test]
    fn what_a_crash_leaves_in_a_log_is_substituted_or_left_out() {
        let some = |id: &str, i| (id.to_owned(), Some(i));
        let none = |id: &str| (id.to_owned(), None);
        // A call with no result at the end of the history, or before a user record.
        assert_eq!(
            answers(vec![user("x"), calls(&["a"])]),
            vec![vec![none("a")]]
        );
        assert_eq!(
            answers(vec![
                user("x"),
                calls(&["a", "b"]),
                result("b", "B"),
                user("y")
            ]),
            vec![vec![none("a"), some("b", 2)]]
        );
        // Before the next assistant record.
        assert_eq!(
            answers(vec![
                user("x"),
                calls(&["a"]),
                calls(&["b"]),
                result("b", "B")
            ]),
            vec![vec![none("a")], vec![some("b", 3)]]
        );
        // A second result, and a result after its message was closed, are left out.
        assert_eq!(
            answers(vec![
                user("x"),
                calls(&["a"]),
                result("a", "A"),
                result("a", "again"),
                user("y"),
                result("a", "late"),
            ]),
            vec![vec![some("a", 2)]]
        );
        assert_eq!(
            answers(vec![
                user("x"),
                calls(&["a"]),
                user("y"),
                result("a", "late")
            ]),
            vec![vec![none("a")]]
        );
    }
}
