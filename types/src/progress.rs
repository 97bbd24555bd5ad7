//! Progress of a running tool call: what a [`ToolHost`](crate::ToolHost) reports while a
//! call runs (MCP's `notifications/progress`), and the [`ProgressSink`] a caller hands in
//! with the call to receive it.

use std::sync::Arc;

/// The most bytes of a progress report's message kept ([`ToolProgress::with_message`],
/// [`ToolProgress::cut_message`]): a server's line may be tens of MiB, and a progress
/// message is a line of status.
pub const MAX_PROGRESS_MESSAGE_BYTES: usize = 4096;

/// One progress report of a running tool call, as MCP's `notifications/progress` carries it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ToolProgress {
    /// The progress so far; it increases with each report of a call.
    pub progress: f64,
    /// The total, when the server knows it.
    pub total: Option<f64>,
    /// What the server says it is doing.
    pub message: Option<String>,
}

impl ToolProgress {
    /// A report of `progress`, with no total and no message.
    pub fn new(progress: f64) -> Self {
        Self {
            progress,
            total: None,
            message: None,
        }
    }

    /// The report with its total.
    pub fn with_total(mut self, total: Option<f64>) -> Self {
        self.total = total;
        self
    }

    /// The report with its message, cut to [`MAX_PROGRESS_MESSAGE_BYTES`]
    /// ([`cut_message`](Self::cut_message)).
    pub fn with_message(mut self, message: Option<String>) -> Self {
        self.message = message;
        self.cut_message();
        self
    }

    /// Cuts the message to at most [`MAX_PROGRESS_MESSAGE_BYTES`], at a character boundary,
    /// ending with `…`, into a string of its own size (so a message cut from a huge line
    /// does not keep the line's allocation). Nothing changes for a message within the bound.
    pub fn cut_message(&mut self) {
        let Some(message) = self.message.as_mut() else {
            return;
        };
        if message.len() <= MAX_PROGRESS_MESSAGE_BYTES {
            return;
        }
        let end = message.floor_char_boundary(MAX_PROGRESS_MESSAGE_BYTES - '…'.len_utf8());
        let mut cut = String::with_capacity(end + '…'.len_utf8());
        cut.push_str(&message[..end]);
        cut.push('…');
        *message = cut;
    }
}

/// Where one tool call's progress goes: a callback the caller gives with the call
/// ([`ToolHost::call_tool_with_progress`](crate::ToolHost::call_tool_with_progress)).
///
/// Cloning is cheap (the callback is shared). The callback runs on the host's task for
/// each report, in the order the host received them, so it must not block: a caller that
/// forwards reports to async work sends them into a channel.
///
/// Whoever carries a sink drops it (every clone) once its call can report no more: a host
/// when the call ends, a caller's router when it decides the call is not forwarded. A
/// caller that needs to know when its call's reports are over watches for that drop (the
/// receiving end of a channel the callback sends into closes).
#[derive(Clone)]
pub struct ProgressSink {
    report: Arc<dyn Fn(ToolProgress) + Send + Sync>,
}

impl ProgressSink {
    /// A sink calling `report` with each progress report of its call.
    pub fn new(report: impl Fn(ToolProgress) + Send + Sync + 'static) -> Self {
        Self {
            report: Arc::new(report),
        }
    }

    /// Hands one report of the call to the sink's callback.
    pub fn report(&self, progress: ToolProgress) {
        (self.report)(progress);
    }
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressSink").finish_non_exhaustive()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A sink whose callback holds a clone of `held`, so `Arc::strong_count(held)` tells
    /// whether the callback (every clone of the sink) is still alive.
    pub(crate) fn holding(held: &Arc<()>) -> ProgressSink {
        let inside = Arc::clone(held);
        ProgressSink::new(move |_| {
            let _ = &inside;
        })
    }

    /// A message past the bound is cut at a character boundary into a string of its own
    /// size; one within it is kept as it is.
    #[test]
    fn a_long_message_is_cut_and_lets_its_allocation_go() {
        let long = "é".repeat(1 << 20);
        let report = ToolProgress::new(1.0).with_message(Some(long));
        let message = report.message.unwrap();
        assert!(
            message.len() <= MAX_PROGRESS_MESSAGE_BYTES,
            "{}",
            message.len()
        );
        assert!(message.capacity() <= MAX_PROGRESS_MESSAGE_BYTES);
        assert!(message.ends_with('…'));
        assert!(message.trim_end_matches('…').chars().all(|c| c == 'é'));
        let short = ToolProgress::new(1.0).with_message(Some("step 1 of 3".into()));
        assert_eq!(short.message.as_deref(), Some("step 1 of 3"));
    }

    #[test]
    fn a_sink_hands_each_report_to_its_callback_in_order_and_is_shared_by_its_clones() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&seen);
        let sink = ProgressSink::new(move |p| kept.lock().unwrap().push(p));
        let clone = sink.clone();
        sink.report(ToolProgress::new(1.0).with_total(Some(2.0)));
        clone.report(ToolProgress::new(2.0).with_message(Some("done".into())));
        let seen = seen.lock().unwrap();
        assert_eq!(
            *seen,
            vec![
                ToolProgress {
                    progress: 1.0,
                    total: Some(2.0),
                    message: None
                },
                ToolProgress {
                    progress: 2.0,
                    total: None,
                    message: Some("done".into())
                },
            ]
        );
        assert_eq!(format!("{sink:?}"), "ProgressSink { .. }");
    }

    #[test]
    fn dropping_every_clone_drops_the_callback_and_what_it_holds() {
        let held = Arc::new(());
        let sink = holding(&held);
        let clone = sink.clone();
        drop(sink);
        assert_eq!(
            Arc::strong_count(&held),
            2,
            "a clone still holds the callback"
        );
        drop(clone);
        assert_eq!(
            Arc::strong_count(&held),
            1,
            "the callback is gone with the last clone"
        );
    }
}
