//! Streamable HTTP with the raw results kept: rmcp's streamable HTTP client transport over
//! a [`TappedClient`], which is rmcp's own reqwest client with the [`Tap`] looking at each
//! request it posts and each message the server writes back.
//!
//! rmcp parses the events of a POST's (or the GET stream's) `text/event-stream` answer
//! after the client hands them over, so the tap sees the JSON exactly as the server wrote
//! it, as over stdio. A server may instead answer a POST with one `application/json` body,
//! which rmcp's reqwest client would parse itself (dropping the unknown fields of known
//! blocks); so the requests whose answers the tap keeps (`tools/list`, `tools/call`) are
//! posted by [`post`](crate::post), rmcp's POST with the JSON body offered to the tap
//! first, and every other message by rmcp's client. Progress notifications go to their
//! call's channel as the tap reads them, before rmcp sees the call's response.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use psych_types::ServerId;
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse, StreamableHttpResponseLimits,
};
use serde_json::Value;

use crate::McpError;
use crate::tap::Tap;

/// How many same-origin redirects a request follows.
const MAX_REDIRECTS: usize = 10;

/// rmcp's reqwest client, with the tap.
#[derive(Clone)]
pub(crate) struct TappedClient {
    inner: reqwest::Client,
    tap: Arc<Tap>,
}

/// rmcp's streamable HTTP client transport to `url` with the configured headers, over a
/// [`TappedClient`] feeding `tap`.
pub(crate) fn transport(
    server: &ServerId,
    url: &str,
    headers: &std::collections::BTreeMap<String, String>,
    tap: Arc<Tap>,
) -> Result<StreamableHttpClientTransport<TappedClient>, McpError> {
    let mut map = HashMap::new();
    for (name, value) in headers {
        let bad = |what: String| McpError::Protocol {
            server: server.clone(),
            call: "connect".into(),
            message: format!("header {name:?} cannot be sent: {what}"),
        };
        let header_name = HeaderName::try_from(name.as_str()).map_err(|e| bad(e.to_string()))?;
        let header_value = HeaderValue::try_from(value.as_str()).map_err(|e| bad(e.to_string()))?;
        map.insert(header_name, header_value);
    }
    // As rmcp's default client: no idle connections kept (a reused connection whose last
    // answer was not read to the end stalls ~40 ms on delayed ACKs), same-origin 307/308
    // redirects only.
    let inner = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .redirect(same_origin_redirects())
        .build()
        .map_err(|e| McpError::Protocol {
            server: server.clone(),
            call: "connect".into(),
            message: format!("the HTTP client cannot be set up: {e}"),
        })?;
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(map);
    Ok(StreamableHttpClientTransport::with_client(
        TappedClient { inner, tap },
        config,
    ))
}

/// rmcp's redirect policy for its default client: a 301, 302 or 303 would turn the POST
/// into a bodyless GET and lose the message, and a cross-origin redirect would replay the
/// session id and the configured headers (credentials) to another host, so only
/// same-origin 307 and 308 are followed; anything else comes back as the redirect answer.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_body = matches!(
            attempt.status(),
            reqwest::StatusCode::TEMPORARY_REDIRECT | reqwest::StatusCode::PERMANENT_REDIRECT
        );
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !keeps_body || !same_origin {
            attempt.stop()
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    })
}

type Events = BoxStream<'static, Result<sse_stream::Sse, SseError>>;

impl TappedClient {
    /// The events, each offered to the tap: an answer it waits for is kept raw (and a
    /// stand-in goes to rmcp), progress goes to its call's channel.
    fn tapped(&self, events: Events) -> Events {
        let tap = Arc::clone(&self.tap);
        Box::pin(events.map(move |event| {
            event.map(|mut event| {
                if let Some(data) = event.data.as_mut() {
                    keep(&tap, data);
                }
                event
            })
        }))
    }
}

/// Offers one event's data to the tap, rewriting it with the stand-in if it was kept.
fn keep(tap: &Tap, data: &mut String) {
    if !tap.wants(data.as_bytes()) {
        return;
    }
    let Ok(mut message) = serde_json::from_str::<Value>(data) else {
        return;
    };
    if tap.offer(&mut message)
        && let Ok(rewritten) = serde_json::to_string(&message)
    {
        *data = rewritten;
    }
}

impl StreamableHttpClient for TappedClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            StreamableHttpResponseLimits::default(),
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post_message_with_response_limits(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let response = if self.tap.want_request(&message) {
            crate::post::post_request(
                &self.inner,
                &self.tap,
                &uri,
                &message,
                session_id,
                auth_header,
                custom_headers,
                limits,
            )
            .await?
        } else {
            self.inner
                .post_message_with_response_limits(
                    uri,
                    message,
                    session_id,
                    auth_header,
                    custom_headers,
                    limits,
                )
                .await?
        };
        Ok(match response {
            StreamableHttpPostResponse::Sse(events, session_id) => {
                StreamableHttpPostResponse::Sse(self.tapped(events), session_id)
            }
            other => other,
        })
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<Events, StreamableHttpError<Self::Error>> {
        let events = self
            .inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await?;
        Ok(self.tapped(events))
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<Events, StreamableHttpError<Self::Error>> {
        let events = self
            .inner
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await?;
        Ok(self.tapped(events))
    }
}

/// `reason` followed by why reqwest failed, in parentheses: reqwest's own message says only
/// "error sending request for url (…)", and neither rmcp's transport error nor its
/// `StreamableHttpError::Client` links reqwest's error as a source, so the causes
/// (connection refused, a TLS handshake that failed, a certificate not trusted) would be
/// lost. Causes already in `reason` are not repeated.
pub(crate) fn with_causes(mut reason: String, error: &(dyn std::error::Error + 'static)) -> String {
    let mut node = Some(error);
    while let Some(current) = node {
        if let Some(StreamableHttpError::Client(client)) =
            current.downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            let mut causes: Vec<String> = Vec::new();
            let mut cause = std::error::Error::source(client);
            while let Some(next) = cause {
                let message = next.to_string();
                if !reason.contains(&message) && !causes.iter().any(|c| c.contains(&message)) {
                    causes.push(message);
                }
                cause = next.source();
            }
            if !causes.is_empty() {
                reason.push_str(" (");
                reason.push_str(&causes.join(": "));
                reason.push(')');
            }
            break;
        }
        node = current.source();
    }
    reason
}
