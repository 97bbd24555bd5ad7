//! Faults of a stdio server that rmcp's server side cannot commit, for the client's tests:
//!
//! - tools (stdio only; unlisted unless `--list-raw-tools`) whose answer line is written
//!   raw: `raw_bad_utf8 {bytes}` (a text with bytes that are not UTF-8, about `bytes` long
//!   when given: [`bad_utf8_text`]), `raw_lone_surrogate` (a text cut inside an emoji, as
//!   Python's `json.dumps` writes it: `"\ud83d"`), `raw_oversize {bytes, id_last}` (a text
//!   of `bytes` bytes; with `id_last`, the `id` written last, as the TypeScript SDK does),
//!   `raw_unparseable` (a line cut in the middle of the result), `raw_forged_error` (a
//!   JSON-RPC error of the server's own in the shape of the one psych-mcp's transport
//!   makes up for an answer over its cap: [`FORGED_ERROR_MESSAGE`]), `raw_huge {mib,
//!   second_mib, lone_surrogate, bad_utf8, image, pause_ms}` (a text result of `mib` MiB written
//!   as it is made, never held: [`Huge`]; with `image`, an image block of 8 bytes after the
//!   first text; with `pause_ms`, a pause after each MiB, as over a slow link),
//!   `raw_many_values {count}` (a result whose `structuredContent.values` is an array of
//!   `count` zeros: two bytes a value, the densest JSON there is). The handler answers them with a marker and
//!   [`raw_line`] writes the line in its place (the writer task writes a huge one);
//! - at start: `--stderr-flood BYTES` writes that many bytes to stderr without a line
//!   break (then one), and `--setsid-grandchild PIDFILE` starts a `sleep` in a session of
//!   its own (`setsid`), out of the server's process group, holding its stdout and stderr,
//!   and writes its pid to the file.

use std::io::Write;
use std::path::Path;

use rmcp::RoleServer;
use rmcp::model::{ClientRequest, CustomResult, JsonRpcMessage, ServerResult};
use rmcp::service::TxJsonRpcMessage;
use serde_json::{Value, json};

/// The key of the marker answer of a raw tool.
const MARKER: &str = "psych-test-server/raw";
/// The message of the error `raw_forged_error` answers.
pub const FORGED_ERROR_MESSAGE: &str = "a server error that looks like psych's own";

/// The marker answer of a raw tool, if `request` calls one.
pub(super) fn marker(request: &ClientRequest) -> Option<ServerResult> {
    let ClientRequest::CallToolRequest(call) = request else {
        return None;
    };
    let name = call.params.name.as_ref();
    let kind = name.strip_prefix("raw_")?;
    if !matches!(
        kind,
        "bad_utf8"
            | "lone_surrogate"
            | "oversize"
            | "unparseable"
            | "forged_error"
            | "huge"
            | "many_values"
    ) {
        return None;
    }
    let args = call.params.arguments.clone().unwrap_or_default();
    let flag = |name: &str| args.get(name).and_then(Value::as_bool).unwrap_or(false);
    let number = |name: &str| args.get(name).and_then(Value::as_u64).unwrap_or(0);
    Some(ServerResult::CustomResult(CustomResult(json!({
        MARKER: kind,
        "bytes": number("bytes"),
        "count": number("count"),
        "id_last": flag("id_last"),
        "mib": number("mib"),
        "second_mib": number("second_mib"),
        "lone_surrogate": flag("lone_surrogate"),
        "bad_utf8": flag("bad_utf8"),
        "image": flag("image"),
        "pause_ms": number("pause_ms"),
    }))))
}

/// The raw line (with its `\n`) that replaces a marker answer, if `item` is one.
pub(super) fn raw_line(item: &TxJsonRpcMessage<RoleServer>) -> Option<Vec<u8>> {
    let JsonRpcMessage::Response(response) = item else {
        return None;
    };
    let ServerResult::CustomResult(CustomResult(marker)) = &response.result else {
        return None;
    };
    let kind = marker.get(MARKER)?.as_str()?;
    let id = serde_json::to_string(&response.id).ok()?;
    let text = |text: &[u8], id_last: bool| {
        let mut line = Vec::with_capacity(text.len() + 128);
        if !id_last {
            line.extend_from_slice(format!(r#"{{"jsonrpc":"2.0","id":{id},"#).as_bytes());
        } else {
            line.push(b'{');
        }
        line.extend_from_slice(br#""result":{"content":[{"type":"text","text":""#);
        line.extend_from_slice(text);
        line.extend_from_slice(br#""}]}"#);
        if id_last {
            line.extend_from_slice(format!(r#","jsonrpc":"2.0","id":{id}"#).as_bytes());
        }
        line.extend_from_slice(b"}\n");
        line
    };
    Some(match kind {
        "bad_utf8" => {
            let bytes = marker["bytes"]
                .as_u64()
                .and_then(|b| usize::try_from(b).ok())
                .unwrap_or(0);
            text(&bad_utf8_text(bytes), false)
        }
        "lone_surrogate" => text(br"cut inside an emoji: \ud83d", true),
        "oversize" if marker["image"] == true => {
            let bytes = marker["bytes"]
                .as_u64()
                .and_then(|b| usize::try_from(b).ok())?;
            let mut line = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"image","mimeType":"image/png","data":""#
            )
            .into_bytes();
            line.resize(line.len() + bytes, b'A');
            line.extend_from_slice(b"\"}]}}\n");
            line
        }
        "oversize" => {
            let bytes = marker["bytes"]
                .as_u64()
                .and_then(|b| usize::try_from(b).ok())?;
            text(&vec![b'x'; bytes], marker["id_last"] == true)
        }
        "unparseable" => format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[{{\"text\":\"cut he\n"
        )
        .into_bytes(),
        "forged_error" => forged_error(&id),
        "many_values" => {
            let count = marker["count"]
                .as_u64()
                .and_then(|c| usize::try_from(c).ok())?;
            let mut line = many_values_answer(&id, count);
            line.push(b'\n');
            line
        }
        _ => return None,
    })
}

/// The answer (JSON text) of `raw_many_values {count}` to request `id` (JSON text), over
/// stdio and HTTP: a text block and a `structuredContent` of `count` zeros, two bytes each.
pub fn many_values_answer(id: &str, count: usize) -> Vec<u8> {
    let mut answer = format!(
        r#"{{"jsonrpc":"2.0","id":{id},"result":{{"content":[{{"type":"text","text":"{count} values"}}],"structuredContent":{{"values":["#
    )
    .into_bytes();
    push_zeros(&mut answer, count);
    answer.extend_from_slice(b"]}}}");
    answer
}

/// Appends `count` zeros separated by commas to `out`: two bytes a value, the densest JSON.
pub(super) fn push_zeros(out: &mut Vec<u8>, count: usize) {
    out.reserve(2 * count);
    for i in 0..count {
        out.extend_from_slice(if i == 0 { b"0" } else { b",0" });
    }
}

/// The line `raw_forged_error` answers request `id` (JSON text) with: a parse error whose
/// `data` has the keys of the errors psych-mcp's transports make up (`psych/answer`, as
/// for an answer over the line cap, and `psych-mcp/transport`), but not their nonce.
fn forged_error(id: &str) -> Vec<u8> {
    let error = json!({"code": -32700, "message": FORGED_ERROR_MESSAGE, "data": {
        "psych/answer": {"bytes": 70_000_000u64, "limit": 1024, "nonce": "forged"},
        "psych-mcp/transport": true,
    }});
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{error}}}\n").into_bytes()
}

/// The text `raw_bad_utf8 {bytes}` answers: lines with bytes that are not UTF-8 (a cut
/// two-byte sequence, `FF FE`), at least one line and about `bytes` long; JSON-safe as it
/// stands (no quote, backslash or control byte but the escaped line breaks).
pub fn bad_utf8_text(bytes: usize) -> Vec<u8> {
    let line: &[u8] = b"caf\xC3 and \xFF\xFE, then fine\\n";
    let mut text = Vec::with_capacity(bytes + line.len());
    loop {
        text.extend_from_slice(line);
        if text.len() >= bytes {
            return text;
        }
    }
}

/// The definitions of the raw tools, for `--list-raw-tools`.
pub(super) fn raw_tools() -> Vec<Value> {
    let object = |properties: Value| json!({"type": "object", "properties": properties});
    vec![
        json!({"name": "raw_bad_utf8", "description": "A text with bytes that are not UTF-8.",
            "inputSchema": object(json!({"bytes": {"type": "integer", "minimum": 0}}))}),
        json!({"name": "raw_lone_surrogate", "description": "A text cut inside an emoji.",
            "inputSchema": object(json!({}))}),
        json!({"name": "raw_oversize", "description": "A text of `bytes` bytes, written raw \
            (an image block of `bytes` bytes of base64 data instead with `image`).",
            "inputSchema": object(json!({"bytes": {"type": "integer", "minimum": 0},
                "id_last": {"type": "boolean"}, "image": {"type": "boolean"}}))}),
        json!({"name": "raw_huge", "description": HUGE_DESCRIPTION,
            "inputSchema": object(json!({"mib": {"type": "integer", "minimum": 0},
                "second_mib": {"type": "integer", "minimum": 0},
                "lone_surrogate": {"type": "boolean"}, "bad_utf8": {"type": "boolean"},
                "image": {"type": "boolean"}, "pause_ms": {"type": "integer", "minimum": 0}}))}),
        json!({"name": "raw_unparseable", "description": "A line cut inside the result.",
            "inputSchema": object(json!({}))}),
        json!({"name": "raw_forged_error", "description": "An error in the shape of psych's.",
            "inputSchema": object(json!({}))}),
        json!({"name": "raw_many_values", "description": "A structured result of `count` zeros.",
            "inputSchema": object(json!({"count": {"type": "integer", "minimum": 0}}))}),
    ]
}

/// Writes `bytes` bytes of `#` to stderr without a line break, then one.
pub(super) fn flood_stderr(bytes: u64) -> std::io::Result<()> {
    let chunk = vec![b'#'; 1024 * 1024];
    let mut stderr = std::io::stderr().lock();
    let mut left = bytes;
    while left > 0 {
        let n = usize::try_from(left.min(chunk.len() as u64)).unwrap_or(chunk.len());
        stderr.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    stderr.write_all(b"\npsych-test-server: stderr flood done\n")?;
    stderr.flush()
}

/// Starts `setsid sleep 1000` (a new session and process group, holding the server's
/// stdout and stderr open, as a daemon that forgot to close them does) and writes its pid
/// to `pidfile`; it is left running on purpose.
pub(super) fn setsid_grandchild(pidfile: &Path) -> std::io::Result<()> {
    let child = std::process::Command::new("setsid")
        .args(["sleep", "1000"])
        .stdin(std::process::Stdio::null())
        .spawn()?;
    std::fs::write(pidfile, child.id().to_string())
}

/// What `raw_huge` does, in its description.
const HUGE_DESCRIPTION: &str = "raw_huge {mib, second_mib, lone_surrogate, bad_utf8, image, \
    pause_ms}: a \
    text result of `mib` MiB written to stdout as it is made (never held): `mib` × 16384 \
    lines of 64 bytes, `line 00000001 ` (the line's number from 1, 8 digits) then dots \
    then `\\n`, and a last line `THE END after N lines` with no line break. With \
    `lone_surrogate`, a lone `\\ud83d` escape after line N/2; with `bad_utf8`, a byte \
    0xFF there (each read as U+FFFD, 3 bytes). With `second_mib` > 0, a second text block \
    made the same way of that many MiB (without those faults). With `image`, an image block \
    of 8 bytes after the first text block; with `pause_ms`, a pause of that many \
    milliseconds after each MiB written (a slow link).";

/// One line of a `raw_huge` text, decoded: 64 bytes.
const HUGE_LINE: usize = 64;

/// Line `i` of a `raw_huge` text as written in JSON (its `\n` escaped: 65 bytes).
pub fn huge_line(i: u64) -> String {
    let head = format!("line {i:08} ");
    format!("{head}{}\\n", ".".repeat(HUGE_LINE - 1 - head.len()))
}

/// The last line of a `raw_huge` text of `lines` lines.
pub fn huge_end(lines: u64) -> String {
    format!("THE END after {lines} lines")
}

/// How many numbered lines a `raw_huge` text of `mib` MiB has.
pub fn huge_lines(mib: u64) -> u64 {
    mib * 1024 * 1024 / HUGE_LINE as u64
}

/// What goes to the stdio server's stdout: bytes, or a huge answer written as it is made.
pub(crate) enum Out {
    Bytes(Vec<u8>),
    Huge(Huge),
}

/// A `raw_huge` answer to write.
pub(crate) struct Huge {
    id: String,
    mib: u64,
    second_mib: u64,
    lone_surrogate: bool,
    bad_utf8: bool,
    /// A pause after each MiB written (a slow link), in milliseconds.
    pause_ms: u64,
    /// An image block (8 bytes of data) after the first text block.
    image: bool,
}

/// The huge answer `item` stands for, if it is a `raw_huge` marker.
pub(super) fn huge(item: &TxJsonRpcMessage<RoleServer>) -> Option<Huge> {
    let JsonRpcMessage::Response(response) = item else {
        return None;
    };
    let ServerResult::CustomResult(CustomResult(marker)) = &response.result else {
        return None;
    };
    if marker.get(MARKER)?.as_str()? != "huge" {
        return None;
    }
    Some(Huge {
        id: serde_json::to_string(&response.id).ok()?,
        mib: marker["mib"].as_u64().unwrap_or(0),
        second_mib: marker["second_mib"].as_u64().unwrap_or(0),
        lone_surrogate: marker["lone_surrogate"] == true,
        bad_utf8: marker["bad_utf8"] == true,
        pause_ms: marker["pause_ms"].as_u64().unwrap_or(0),
        image: marker["image"] == true,
    })
}

impl Huge {
    /// Writes the answer's line, a MiB or so at a time.
    pub(crate) async fn write(
        &self,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
    ) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        out.write_all(
            format!(
                r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":["#,
                self.id
            )
            .as_bytes(),
        )
        .await?;
        self.block(out, self.mib, true).await?;
        if self.image {
            out.write_all(br#",{"type":"image","mimeType":"image/png","data":"AAECAwQFBgc="}"#)
                .await?;
        }
        if self.second_mib > 0 {
            out.write_all(b",").await?;
            self.block(out, self.second_mib, false).await?;
        }
        out.write_all(b"]}}\n").await
    }

    async fn block(
        &self,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
        mib: u64,
        faults: bool,
    ) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        out.write_all(br#"{"type":"text","text":""#).await?;
        let lines = huge_lines(mib);
        let mut chunk = Vec::with_capacity(1024 * 1024 + 1024);
        for i in 1..=lines {
            chunk.extend_from_slice(huge_line(i).as_bytes());
            if faults && i == lines / 2 {
                if self.lone_surrogate {
                    chunk.extend_from_slice(br"\ud83d");
                }
                if self.bad_utf8 {
                    chunk.push(0xFF);
                }
            }
            if chunk.len() >= 1024 * 1024 {
                out.write_all(&chunk).await?;
                chunk.clear();
                if self.pause_ms > 0 {
                    out.flush().await?;
                    tokio::time::sleep(std::time::Duration::from_millis(self.pause_ms)).await;
                }
            }
        }
        chunk.extend_from_slice(huge_end(lines).as_bytes());
        chunk.extend_from_slice(b"\"}");
        out.write_all(&chunk).await
    }
}
