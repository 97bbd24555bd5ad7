//! Progress from the client forwarded to the upstream call, and back.
//!
//! A client asks for progress by putting a `progressToken` in a call's `_meta`. The call goes
//! through the runtime's executor, which sees only `(server, tool, arguments)`; so before
//! executing, the session works out (with disclosure's guard, the same pure check the
//! executor makes) which upstream call the executor will forward, and tells the
//! [`GatewayHost`] to expect it. When the executor forwards that call, the host makes it with
//! psych-mcp's own progress token and relays each upstream `notifications/progress` to the
//! client under the client's token, all before the call's result is returned.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use psych_mcp::{McpError, McpManager};
use psych_types::{
    JsonObject, ServerId, ToolDefinition, ToolHost, ToolLister, ToolOutput, ToolRef,
};
use rmcp::RoleServer;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::Peer;

/// Where one client call's progress goes: its session's peer and the client's token.
#[derive(Clone)]
pub(super) struct ClientProgress {
    /// The client.
    pub(super) peer: Peer<RoleServer>,
    /// The token the client sent with the call.
    pub(super) token: ProgressToken,
}

/// An upstream call the host expects, with where its progress goes.
struct Expected {
    id: u64,
    target: ToolRef,
    arguments: JsonObject,
    client: ClientProgress,
}

/// The session's [`ToolHost`]: psych-mcp's manager, relaying the progress of the calls it
/// was told to expect.
pub(super) struct GatewayHost {
    manager: McpManager,
    next: AtomicU64,
    expected: Mutex<Vec<Expected>>,
}

/// Forgets an expectation when dropped (the call was forwarded, refused, or cancelled).
pub(super) struct Expectation {
    id: u64,
    host: Arc<GatewayHost>,
}

impl Drop for Expectation {
    fn drop(&mut self) {
        self.host
            .expected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|e| e.id != self.id);
    }
}

impl GatewayHost {
    /// A host forwarding to `manager`.
    pub(super) fn new(manager: McpManager) -> Self {
        Self {
            manager,
            next: AtomicU64::new(0),
            expected: Mutex::new(Vec::new()),
        }
    }

    /// Expects a call of `target` with `arguments`, whose progress goes to `client`, for as
    /// long as the returned [`Expectation`] lives.
    pub(super) fn expect(
        self: &Arc<Self>,
        target: ToolRef,
        arguments: JsonObject,
        client: ClientProgress,
    ) -> Expectation {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.expected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Expected {
                id,
                target,
                arguments,
                client,
            });
        Expectation {
            id,
            host: Arc::clone(self),
        }
    }

    /// The progress target of an expected call of `target` with `arguments`, taken (the
    /// oldest first when identical calls are in flight).
    fn take(&self, target: &ToolRef, arguments: &JsonObject) -> Option<ClientProgress> {
        let mut expected = self.expected.lock().unwrap_or_else(PoisonError::into_inner);
        let at = expected
            .iter()
            .position(|e| e.target == *target && e.arguments == *arguments)?;
        Some(expected.remove(at).client)
    }
}

impl ToolLister for GatewayHost {
    type Error = McpError;

    async fn list_tools(&self, server: &ServerId) -> Result<Vec<ToolDefinition>, McpError> {
        self.manager.list_tools(server).await
    }
}

impl ToolHost for GatewayHost {
    async fn call_tool(
        &self,
        tool: &ToolRef,
        arguments: JsonObject,
    ) -> Result<ToolOutput, McpError> {
        let Some(client) = self.take(tool, &arguments) else {
            return self.manager.call_tool(tool, arguments).await;
        };
        let (sink, mut notes) = tokio::sync::mpsc::unbounded_channel::<psych_mcp::Progress>();
        let relay = async move {
            // Ends when the call ends: psych-mcp closes the channel with the call.
            while let Some(progress) = notes.recv().await {
                let mut note =
                    ProgressNotificationParam::new(client.token.clone(), progress.progress);
                note.total = progress.total;
                note.message = progress.message;
                if client.peer.notify_progress(note).await.is_err() {
                    break;
                }
            }
        };
        let call = self.manager.call_tool_with_progress(tool, arguments, sink);
        let (result, ()) = tokio::join!(call, relay);
        result
    }
}
