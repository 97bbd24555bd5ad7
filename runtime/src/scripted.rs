//! [`ScriptedModel`]: a stand-in for the model that answers from a script, so a Run can be
//! driven deterministically (tests, `psych demo`).

use std::collections::VecDeque;

use psych_prompt_assembly::RenderedRequest;
use psych_types::{ToolCall, ToolCallId, ToolHost, Usage};
use serde_json::Value;

use crate::{ModelReply, Next, Run, RunError};

/// What the scripted model answers to one request: some text, and the tool calls to make
/// (none ends the turn).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    text: String,
    calls: Vec<(String, Value)>,
}

impl Step {
    /// A step that answers `text` and makes no call: the turn's last.
    pub fn say(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            calls: Vec::new(),
        }
    }

    /// A step that calls `name` (an exposed tool, a meta tool, `read_tool_output`) with
    /// `arguments`.
    pub fn call(name: impl Into<String>, arguments: Value) -> Self {
        Self::default().and_call(name, arguments)
    }

    /// One more call in the same step: the calls of a step run in parallel.
    #[must_use]
    pub fn and_call(mut self, name: impl Into<String>, arguments: Value) -> Self {
        self.calls.push((name.into(), arguments));
        self
    }

    /// Text the model writes along with its calls.
    #[must_use]
    pub fn saying(mut self, text: impl Into<String>) -> Self {
        self.text = text.into();
        self
    }
}

/// A model that answers each request with the next [`Step`] of its script.
///
/// Call ids are `call_1`, `call_2`… in script order (start elsewhere with
/// [`first_call`](Self::first_call), e.g. when a resumed Run's log already holds some: a
/// Run answers a repeated id under a fresh one, [`Run::reply`](crate::Run::reply)).
/// Usage is reported as a provider would, but made up deterministically: `input` is the
/// request body's bytes / 4 and `output` the reply's bytes / 4 (no cache counts). When the
/// script runs out, the model answers [`ScriptedModel::EXHAUSTED`] with no call, so a Run
/// always ends its turn.
#[derive(Debug, Clone, Default)]
pub struct ScriptedModel {
    steps: VecDeque<Step>,
    next_call: u64,
}

/// One turn driven by a [`ScriptedModel`]: every request the Run produced and the model's
/// final text.
#[derive(Debug, Clone)]
pub struct Transcript {
    /// The requests of the turn, in order (the first from the user message).
    pub requests: Vec<RenderedRequest>,
    /// The text the model ended the turn with.
    pub text: String,
}

impl ScriptedModel {
    /// What the model says once its script is exhausted.
    pub const EXHAUSTED: &'static str = "(the script has no more steps)";

    /// A model that will answer with `steps`, in order.
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Self {
            steps: steps.into_iter().collect(),
            next_call: 1,
        }
    }

    /// Numbers call ids from `n`.
    #[must_use]
    pub fn first_call(mut self, n: u64) -> Self {
        self.next_call = n;
        self
    }

    /// Steps not answered yet.
    pub fn remaining(&self) -> usize {
        self.steps.len()
    }

    /// The reply to `request`: the next step of the script.
    pub fn reply(&mut self, request: &RenderedRequest) -> ModelReply {
        let step = self
            .steps
            .pop_front()
            .unwrap_or_else(|| Step::say(Self::EXHAUSTED));
        let mut reply_bytes = step.text.len();
        let mut tool_calls = Vec::with_capacity(step.calls.len());
        for (name, arguments) in step.calls {
            let id = format!("call_{}", self.next_call);
            self.next_call += 1;
            reply_bytes += name.len() + arguments.to_string().len();
            // `call_` and digits are always a valid id.
            let Ok(id) = ToolCallId::new(id) else {
                continue;
            };
            tool_calls.push(ToolCall {
                id,
                name,
                arguments,
            });
        }
        ModelReply {
            text: step.text,
            tool_calls,
            usage: Some(Usage {
                input: (request.body().len() as u64).div_ceil(4),
                cache_read: 0,
                cache_write: 0,
                output: (reply_bytes as u64).div_ceil(4),
            }),
        }
    }

    /// Drives one turn of `run`: the user says `text`, then the script answers every request
    /// until a step makes no call.
    ///
    /// # Errors
    ///
    /// What [`Run::user`] and [`Run::reply`] return.
    pub async fn turn<H: ToolHost + 'static>(
        &mut self,
        run: &mut Run<H>,
        text: &str,
    ) -> Result<Transcript, RunError> {
        let first = run.user(text).await?;
        self.continue_turn(run, first).await
    }

    /// Drives `run` from `request` (one it just returned) to the end of the turn.
    ///
    /// # Errors
    ///
    /// What [`Run::reply`] returns.
    pub async fn continue_turn<H: ToolHost + 'static>(
        &mut self,
        run: &mut Run<H>,
        request: RenderedRequest,
    ) -> Result<Transcript, RunError> {
        let mut requests = Vec::new();
        let mut request = request;
        loop {
            let reply = self.reply(&request);
            requests.push(request);
            match run.reply(reply).await? {
                Next::Request(next) => request = next,
                Next::Done { text } => return Ok(Transcript { requests, text }),
            }
        }
    }
}
