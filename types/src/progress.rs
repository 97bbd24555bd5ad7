//! Progress of a running tool call: what a [`ToolHost`](crate::ToolHost) reports while a
//! call runs (MCP's `notifications/progress`), and the [`ProgressSink`] a caller hands in
//! with the call to receive it.

use std::sync::Arc;

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

    /// The report with its message.
    pub fn with_message(mut self, message: Option<String>) -> Self {
        self.message = message;
        self
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
