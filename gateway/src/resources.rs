//! A logged result as an MCP resource: the `resource_link` an elided result's preview
//! carries, and `resources/read` of it, under the same identity rules as
//! `read_tool_output`.
//!
//! A result's URI is `psych://result/<handle>` (a client filling in the template may send
//! the handle's `:` as `%3A`: percent-escapes are decoded); `?offset=N&limit=M` (lines, as
//! `read_tool_output`'s) asks for a page of it. One answer holds at most
//! [`Limits::max_passed_bytes`](psych_reader_tool::Limits::max_passed_bytes) of text (16 MiB
//! by default): a larger result is read in pages. A page that stops before the result's
//! end says where the next starts in its `_meta` (`psych/nextOffset`); an offset at the end
//! is an empty page. The link is added for clients of MCP 2025-06-18 and later (the
//! revision that brought `resource_link`).
//!
//! A page's text counts in the process's budget of passed results from before it is read
//! until the transport's send of its answer ends (the transport keeps the reservation
//! with the request: [`AnswerHold`]), not only until the handler returns: rmcp serializes
//! and writes the answer after that. Over stdio the send ends when the line is written.
//! In an HTTP session it ends when rmcp's session has queued the answer for the request's
//! stream, which rmcp serializes as the response is read: there the page leaves the
//! budget before it is written, and what the gateway holds of pages is bounded by the
//! requests in flight ([`MAX_REQUESTS`](crate::admit::MAX_REQUESTS) times the page bound).
//! A stateless request (no transport of ours) gives it back when the handler returns.
//! Holding it over HTTP until the response is written was built and taken out: a client
//! reading its answers just fast enough that each write proceeds within
//! [`WRITE_WITHIN`](crate::WRITE_WITHIN) could hold, for as long as it liked, the budget
//! every identity shares (over stdio the one client only holds its own).

use psych_mcp::AnswerHold;
use psych_reader_tool::passing::{PassError, ReferenceError, Referenced};
use psych_reader_tool::{CallError, ResultReference};
use psych_types::{ContentBlock, RecordHandle, ResourceLink};
use rmcp::RoleServer;
use rmcp::model::{
    ErrorData, MetaObject, ReadResourceRequestParams, ReadResourceResult, ResourceContents,
    ResourceTemplate,
};
use rmcp::service::RequestContext;
use serde_json::{Value, json};

use crate::{INVALID_DEFERRED_HANDLE, Session};

/// The scheme and path before a handle in a result's URI.
pub const RESULT_URI_PREFIX: &str = "psych://result/";

/// The URI of the result at `handle`.
pub fn result_uri(handle: &RecordHandle) -> String {
    format!("{RESULT_URI_PREFIX}{handle}")
}

/// Whether the client of `context` knows `resource_link` blocks (MCP 2025-06-18 on).
pub(crate) fn links_known(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| version.as_str() >= "2025-06-18")
}

/// The `resource_link` to the whole result at `handle`, `len` bytes of text, of which one
/// `resources/read` answers at most `max` (a larger one is read in pages).
pub(crate) fn link(handle: &RecordHandle, len: u64, max: u64) -> ContentBlock {
    let description = if len > max {
        format!(
            "The whole tool result this preview shortens, as Psych logged it: {len} bytes, \
             read in pages of at most {max} bytes (?offset=N&limit=M, lines)."
        )
    } else {
        "The whole tool result this preview shortens, as Psych logged it.".to_owned()
    };
    ContentBlock::ResourceLink(ResourceLink {
        uri: result_uri(handle),
        name: format!("tool result {handle}"),
        description: Some(description),
        mime_type: Some("text/plain".to_owned()),
        size: Some(len),
        ..ResourceLink::default()
    })
}

/// The one resource template the gateway lists: every logged result.
pub(crate) fn template() -> ResourceTemplate {
    let mut template =
        ResourceTemplate::new(format!("{RESULT_URI_PREFIX}{{handle}}"), "tool result");
    template.description = Some(
        "A tool result Psych logged whole, by the handle its shortened preview gave; add \
         ?offset=N&limit=M for lines N+1 to N+M."
            .to_owned(),
    );
    template.mime_type = Some("text/plain".to_owned());
    template
}

/// `uri` as a reference to a result (or a page of it).
fn parse(uri: &str) -> Result<ResultReference, ErrorData> {
    let not_ours = || {
        ErrorData::resource_not_found(
            format!("{uri:?} is not a resource of psych serve (psych://result/<handle>)"),
            Some(json!({"uri": uri})),
        )
    };
    let rest = uri.strip_prefix(RESULT_URI_PREFIX).ok_or_else(not_ours)?;
    // A fragment is the client's own, never the server's.
    let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
    let (handle, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut reference = ResultReference {
        handle: decoded(handle),
        offset: 0,
        limit: None,
        pointer: None,
    };
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let number = decoded(value).parse::<u64>().ok();
        match (decoded(key).as_str(), number) {
            ("offset", Some(offset)) => reference.offset = offset,
            ("limit", Some(limit)) if limit > 0 => reference.limit = Some(limit),
            _ => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "{pair:?} in {uri:?}: the query takes offset (0 or more) and limit \
                         (1 or more), lines as read_tool_output's"
                    ),
                    None,
                ));
            }
        }
    }
    Ok(reference)
}

/// `text` with its `%XX` escapes decoded (a malformed one is kept as it is; bytes that do
/// not form UTF-8 are replaced, and such a handle then names nothing).
fn decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(high), Some(low)) => {
                out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Session {
    /// `resources/read` of a result's URI: its text, or the page the query asks for, read
    /// as `read_tool_output` would for this identity (its Run, or its earlier ones).
    pub(crate) async fn read_result(
        &self,
        request: ReadResourceRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<ReadResourceResult, ErrorData> {
        let reference = parse(&request.uri)?;
        let tenant = self.tenant(context)?;
        let log = tenant.executor(&self.shared).await?;
        let executor = log.serving()?;
        let max = executor.passing_bound();
        // Counted in the process's budget while the text is read and the answer built. A
        // request the client cancels stops waiting for its place: rmcp drops its answer
        // but not the handler, so a wait left running would hold the request (and count
        // nowhere) for as long as the budget stays full.
        let reserved = tokio::select! {
            reserved = executor.reserve_passed(max) => reserved,
            () = context.ct.cancelled() => {
                return Err(ErrorData::internal_error(
                    format!("{}: cancelled by the client", request.uri),
                    None,
                ));
            }
        };
        let Some(held) = reserved else {
            return Err(ErrorData::internal_error(
                format!(
                    "{}: the results other requests are passing filled this process's budget \
                     of passed results too long; read it again, or a smaller page",
                    request.uri
                ),
                None,
            ));
        };
        // A page that stops before the end stopped at its limit: the next starts after it.
        let after = reference
            .offset
            .saturating_add(reference.limit.unwrap_or(0));
        let read = executor.read_reference(reference, max, &held).await;
        let (text, next) = match read {
            Ok(Referenced { value, more, bytes }) => {
                held.keep(bytes);
                let text = match value {
                    Value::String(text) => text,
                    other => other.to_string(),
                };
                (text, more.then_some(after))
            }
            // The end of the result: an empty page, as `read_tool_output` answers there.
            Err(PassError::Reference(ReferenceError::OffsetPastEnd { offset, lines }))
                if offset == lines =>
            {
                (String::new(), None)
            }
            Err(PassError::Call(CallError::InvalidDeferredHandle(error))) => {
                return Err(ErrorData::resource_not_found(
                    format!("{INVALID_DEFERRED_HANDLE}: {error}"),
                    Some(json!({ "code": INVALID_DEFERRED_HANDLE, "uri": request.uri })),
                ));
            }
            Err(PassError::Reference(ReferenceError::Gone(why))) => {
                return Err(ErrorData::resource_not_found(
                    why,
                    Some(json!({ "uri": request.uri })),
                ));
            }
            Err(PassError::Reference(ReferenceError::TooLarge { needed, .. })) => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "{}: at least {needed} bytes asked, over the {max} bytes one answer \
                         holds: read it in pages, adding ?offset=N&limit=M (lines)",
                        request.uri
                    ),
                    None,
                ));
            }
            Err(PassError::Reference(error @ ReferenceError::OffsetPastEnd { .. })) => {
                return Err(ErrorData::invalid_params(
                    format!("{}: {error}", request.uri),
                    None,
                ));
            }
            Err(error) => {
                return Err(ErrorData::internal_error(
                    format!(
                        "reading {}: {}",
                        request.uri,
                        psych_types::error_chain(&error)
                    ),
                    None,
                ));
            }
        };
        let meta = next.map(|next| {
            let mut meta = serde_json::Map::new();
            meta.insert("psych/nextOffset".to_owned(), json!(next));
            MetaObject(meta)
        });
        // The text stays counted in the budget until the answer's send ends, kept with the
        // request by its transport: over stdio when the line is written, in an HTTP session
        // when rmcp has queued it (the module docs say why). Without a transport of ours
        // counting the request, or once it is forgotten (cancelled), it is given back here.
        if let Some(hold) = context.extensions.get::<AnswerHold>() {
            drop(hold.keep(Box::new(held)));
        }
        Ok(ReadResourceResult::new(vec![
            ResourceContents::TextResourceContents {
                uri: request.uri,
                mime_type: Some("text/plain".to_owned()),
                text,
                meta,
            },
        ]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_results_uri_and_its_pages_parse_back() {
        let handle: RecordHandle = "hrun7:42".parse().unwrap();
        let uri = result_uri(&handle);
        assert_eq!(uri, "psych://result/hrun7:42");
        assert_eq!(parse(&uri).unwrap().handle, "hrun7:42");
        let page = parse(&format!("{uri}?offset=10&limit=5")).unwrap();
        assert_eq!((page.offset, page.limit), (10, Some(5)));
        for bad in ["file:///x", "psych://other/h:1"] {
            assert_eq!(
                parse(bad).unwrap_err().code,
                rmcp::model::ErrorCode::RESOURCE_NOT_FOUND
            );
        }
        // A client filling in the template escapes the handle's colon.
        assert_eq!(
            parse("psych://result/hrun7%3A42?offset=%31")
                .unwrap()
                .handle,
            "hrun7:42"
        );
        assert_eq!(
            parse("psych://result/hrun7%3a42?offset=%31")
                .unwrap()
                .offset,
            1
        );
        assert_eq!(decoded("100%"), "100%");
        assert_eq!(decoded("caf%C3%A9"), "café");
        let fragment = parse(&format!("{uri}?%6Fffset=2#top")).unwrap();
        assert_eq!((fragment.handle.as_str(), fragment.offset), ("hrun7:42", 2));
        assert_eq!(decoded("%zz%4"), "%zz%4");
        for bad in ["?limit=0", "?offset=-1", "?grep=x", "?offset"] {
            assert!(parse(&format!("{uri}{bad}")).is_err(), "{bad}");
        }
    }
}
